"""`longctx ruler`: prediction backends (vllm, openai-compatible, hf), the resumable runner, scoring.

Data flows one way: task files (ruler_tasks) -> predictions (`pred/<length>/<task>.jsonl`) ->
scores (`scores.json`); `longctx.report` turns scores into results.json, tables and plots.
"""
