"""Frequent words extraction (RULER `scripts/data/synthetic/freq_words_extraction.py` @ c3f5e3b).

HEAD's budget: the prompt may use `max_seq_length - model_template_token - tokens_to_generate` tokens;
the word count starts at budget // 6, grows by budget // 32 while the prompt is shorter than the budget,
then steps back once; every sample draws a new coded vocabulary and steps down while it is too long.
"""

from __future__ import annotations

import string

import numpy as np
from scipy.special import zeta

from ruler_tasks._common import GenContext
from ruler_tasks.constants import TASK_TEMPLATES
from ruler_tasks.rng import fixed_shuffle
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
        vocab = ["".join(rng.choices(_LOWER, k=coded_wordlen)) for _ in range(vocab_size)]
        while len(set(vocab)) < vocab_size:
            vocab.append("".join(rng.choices(_LOWER, k=coded_wordlen)))
        vocab = fixed_shuffle(seed, sorted(set(vocab)))
        vocab[0] = "..."
        k = np.arange(1, len(vocab) + 1)

        def text(n):
            counts = (n * (k ** -alpha) / z).astype(int)
            sampled = [w for w, c in zip(vocab, counts.tolist()) for _ in range(c)]
            return [head, Join(" ", fixed_shuffle(seed, sampled)), tail], vocab[1:4]

        if num_words > 0:
            parts, answer = text(num_words)
            while ctx.count(parts) > max_len:
                num_words -= incremental
                parts, answer = text(num_words)
        else:
            num_words = max_len // coded_wordlen
            parts, answer = text(num_words)
            while ctx.count(parts) < max_len:
                num_words += incremental
                parts, answer = text(num_words)
            num_words -= incremental
        parts, answer = text(num_words)
        return parts, answer, num_words

    _, _, num_example_words = gen()
    ctx.stats["size"] = num_example_words
    for index in range(ctx.num_samples):
        parts, answer, _ = gen(num_example_words)
        length = ctx.count(parts) + ttg
        text = render(parts)
        cut = text.rfind(_T["answer_prefix"][:10])
        yield {"index": index, "input": text[:cut], "outputs": answer, "length": length,
               "length_w_model_temp": length + ctx.model_template_token, "answer_prefix": text[cut:]}
