"""Frequent words extraction (RULER `scripts/data/synthetic/freq_words_extraction.py` @ c3f5e3b).

HEAD's budget: the prompt may use `max_seq_length - model_template_token - tokens_to_generate` tokens;
the word count starts at budget // 6, grows by budget // 32 while the prompt is shorter than the budget,
then steps back once; every sample draws a new coded vocabulary and steps down while it is too long.
"""

from __future__ import annotations

import string

import numpy as np
from scipy.special import zeta

from ruler_tasks._common import GenContext, record
from ruler_tasks.constants import TASK_TEMPLATES
from ruler_tasks.rng import choices_strs, fixed_shuffle
from ruler_tasks.templates import split_format
from ruler_tasks.text import Join, render

_T = TASK_TEMPLATES["freq_words_extraction"]
_LOWER = string.ascii_lowercase


def generate(ctx: GenContext):
    a = ctx.args
    alpha = float(a.get("alpha", 2.0))
    coded_wordlen = a.get("coded_wordlen", 6)
    vocab_size = a.get("vocab_size", -1)
    rng, seed = ctx.rng, ctx.seed
    template = ctx.template.compose(_T["template"], _T["answer_prefix"])
    head, tail = split_format(template, query="")
    z = zeta(alpha)
    ttg = ctx.tokens_to_generate
    max_len = ctx.max_seq_length - ctx.model_template_token - ttg
    if vocab_size == -1:
        vocab_size = max_len // 50  # HEAD: computed from the reduced budget (checked on the goldens)
    incremental = max_len // 32

    def gen(num_words=-1):
        vocab = choices_strs(rng, _LOWER, coded_wordlen, vocab_size)  # the same draws, in bulk
        while len(set(vocab)) < vocab_size:
            vocab.append("".join(rng.choices(_LOWER, k=coded_wordlen)))
        vocab = fixed_shuffle(seed, sorted(set(vocab)))
        vocab[0] = "..."
        k = np.arange(1, len(vocab) + 1)
        # text(n) draws nothing (its shuffle is a fresh Random(seed)), so upstream's rebuilds of the
        # same n give the same prompt: built and counted once per n (`memo`: n -> (parts, answer, count))
        memo = {}

        def text(n):
            if n not in memo:
                counts = (n * (k ** -alpha) / z).astype(int)
                sampled = [w for w, c in zip(vocab, counts.tolist()) for _ in range(c)]
                parts = [head, Join(" ", fixed_shuffle(seed, sampled)), tail]
                memo[n] = (parts, vocab[1:4], ctx.count(parts))
            return memo[n]

        if num_words > 0:
            while text(num_words)[2] > max_len:
                num_words -= incremental
        else:
            num_words = max_len // coded_wordlen
            while text(num_words)[2] < max_len:
                num_words += incremental
            num_words -= incremental
        return text(num_words) + (num_words,)

    _, _, _, num_example_words = gen()
    ctx.stats["size"] = num_example_words
    for index in range(ctx.num_samples):
        parts, answer, count, _ = gen(num_example_words)
        length = count + ttg
        text = render(parts)
        yield record(index, text, answer, length, ctx, _T["answer_prefix"])
