"""Teacher-forced loss of a checkpoint on the answers of RULER task files: the first answer token (the
lookup: where the needle is must be known) apart from the rest (copying: the value's first token is in
the context). Greedy RULER scores say whether a model retrieves; this says which half of retrieval fails.

    longctx ruler prepare --tokenizer CKPT --lengths 1k --tasks niah_single_1 --samples 50 -o /tmp/tasks
    .venv/bin/python scripts/answer_loss.py CKPT /tmp/tasks/1024/niah_single_1.jsonl [--samples 50]

Prints two lines: how alike the model's input embeddings of the ten digits are (mean pairwise cosine, and
the same for ten letters), then the mean loss in nats of the first answer token and its top-1 accuracy,
and the mean loss of the later answer tokens (whitespace-only tokens skipped), over the first N samples
of the file. A model whose digit embeddings have collapsed together (cosine near 1) cannot copy a number
digit by digit, whatever else it learnt (checkpoints/README.md).
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


def mean_cosine(model, tok, chars: str) -> float | None:
    """Mean pairwise cosine of the input embeddings of single-character tokens; None when the tokenizer
    has no token for one of them alone (e.g. SentencePiece's word-initial pieces)."""
    ids = [tok.convert_tokens_to_ids(c) for c in chars]
    if tok.unk_token_id in ids or None in ids:
        return None
    e = torch.nn.functional.normalize(model.get_input_embeddings().weight[ids].float(), dim=-1)
    return (e @ e.T)[~torch.eye(len(ids), dtype=torch.bool)].mean().item()


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
    cos = {name: mean_cosine(model, tok, chars)
           for name, chars in (("digits", "0123456789"), ("letters", "abcdefghij"))}
    print(f"{args.checkpoint}: embedding cosine between digits {cos['digits']:.2f}, between letters a-j "
          f"{cos['letters']:.2f}" if None not in cos.values() else
          f"{args.checkpoint}: the tokenizer has no single-character digit and letter tokens (no embedding cosine)")
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
