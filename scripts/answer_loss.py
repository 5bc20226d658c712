"""Teacher-forced loss of a checkpoint on the answers of RULER task files: the first answer token (the
lookup: where the needle is must be known) apart from the rest (copying: the value's first token is in
the context). Greedy RULER scores say whether a model retrieves; this says which half of retrieval fails.

    longctx ruler prepare --tokenizer CKPT --lengths 1k --tasks niah_single_1 --samples 50 -o /tmp/tasks
    .venv/bin/python scripts/answer_loss.py CKPT /tmp/tasks/1024/niah_single_1.jsonl [--samples 50]

Prints one line: mean loss in nats of the first answer token and its top-1 accuracy, and the mean loss of
the later answer tokens (whitespace-only tokens skipped), over the first N samples of the file.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import longctx.models  # noqa: F401  (registers the gated architecture with transformers)


def answer_losses(model, tok, sample: dict) -> tuple[list[float], bool]:
    """Per-token losses of the first reference answer after RULER's prompt (input + answer prefix), and
    whether the first answer token was the model's top-1."""
    prompt = sample["input"] + sample.get("answer_prefix", "")
    prompt_ids = tok(prompt)["input_ids"]
    ids = tok(prompt + " " + sample["outputs"][0])["input_ids"]
    if ids[:len(prompt_ids)] != prompt_ids:
        raise ValueError("the prompt's tokens are not a prefix of prompt + answer")
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    answer = [i for i in range(len(prompt_ids), len(ids)) if tok.decode([ids[i]]).strip()]
    return [-logp[i - 1, ids[i]].item() for i in answer], logp[answer[0] - 1].argmax().item() == ids[answer[0]]


def fail(message: str) -> None:
    print(f"Error: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("tasks", help="a RULER task file (<length>/<task>.jsonl from `longctx ruler prepare`)")
    ap.add_argument("--samples", type=int, default=50, help="the first N samples of the file (default 50)")
    args = ap.parse_args()
    try:
        with open(args.tasks, encoding="utf-8") as f:
            rows = [json.loads(line) for _, line in zip(range(args.samples), f)]
    except (OSError, ValueError) as e:
        fail(f"cannot read task file {args.tasks}: {e}")
    if not rows:
        fail(f"task file {args.tasks} has no samples (make one with `longctx ruler prepare`)")
    if not (Path(args.checkpoint) / "config.json").is_file():
        fail(f"checkpoint {args.checkpoint} has no config.json (give a local transformers checkpoint directory)")
    tok = AutoTokenizer.from_pretrained(args.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    first, rest, top1 = [], [], 0
    for row in rows:
        losses, hit = answer_losses(model, tok, row)
        first.append(losses[0])
        rest += losses[1:]
        top1 += hit
    print(f"{args.checkpoint}: first answer token {sum(first) / len(first):.2f} nats (top-1 {top1}/{len(rows)}), "
          f"later tokens {sum(rest) / max(1, len(rest)):.2f} nats, {len(rows)} samples")


if __name__ == "__main__":
    main()
