"""Common words extraction (RULER `scripts/data/synthetic/common_words_extraction.py` @ c3f5e3b)."""

from __future__ import annotations

from ruler_tasks._common import GenContext, binary_search, fit_sample, record
from ruler_tasks.constants import TASK_TEMPLATES
from ruler_tasks.errors import RulerInputError
from ruler_tasks.rng import fixed_shuffle
from ruler_tasks.templates import split_format
from ruler_tasks.text import NumberedList, render
from ruler_tasks.words import cwe_words_sorted

_T = TASK_TEMPLATES["common_words_extraction"]


def generate(ctx: GenContext):
    a = ctx.args
    freq_cw, freq_ucw, num_cw = a.get("freq_cw", 30), a.get("freq_ucw", 3), a.get("num_cw", 10)
    num_fewshot = a.get("num_fewshot", 1)
    rng, seed = ctx.rng, ctx.seed
    words = fixed_shuffle(seed, list(cwe_words_sorted()))
    randle = ctx.english_words
    template = ctx.template.compose(_T["template"], _T["answer_prefix"])
    head, tail = split_format(template, num_cw=num_cw, query="")

    def example(num_words, common_repeats, uncommon_repeats, common_nums):
        if num_words <= len(words):
            full = rng.sample(words, num_words)
        else:
            if randle is None:
                raise RulerInputError(
                    f"cwe at {ctx.max_seq_length} tokens needs more than {len(words)} distinct words: RULER then "
                    "samples json/english_words.json (Git LFS), which was not given")
            full = rng.sample(randle, num_words)
        common, uncommon = full[:common_nums], full[common_nums:]
        word_list = fixed_shuffle(seed, common * int(common_repeats) + uncommon * int(uncommon_repeats))
        return NumberedList(word_list), common

    def build(num_words):
        shots = []
        if ctx.max_seq_length < 4096:
            for _ in range(num_fewshot):
                shots.append(example(20, 3, 1, num_cw))
            ctx_main, answer = example(num_words, 6, 1, num_cw)
        else:
            for _ in range(num_fewshot):
                shots.append(example(40, 10, 3, num_cw))
            ctx_main, answer = example(num_words, freq_cw, freq_ucw, num_cw)
        parts = []
        pending = ""
        for n, (ctx_ex, ans_ex) in enumerate(shots):
            pending += ("\n" if n > 0 else "") + head
            parts += [pending, ctx_ex]
            pending = tail + " " + " ".join([f"{i + 1}. {w}" for i, w in enumerate(ans_ex)])
        parts += [pending + "\n" + head, ctx_main, tail]
        return parts, answer

    incremental = 10
    limit = ctx.max_seq_length - ctx.model_template_token
    ttg = ctx.tokens_to_generate
    parts, _ = build(4096)
    per = ctx.count(parts) / 4096
    estimated = int(limit // per) * 2
    size = binary_search(ctx, lambda mid: ctx.count(build(mid)[0]) + ttg,
                         incremental, max(estimated, incremental * 2), incremental)
    ctx.stats["size"] = size
    for index in range(ctx.num_samples):
        (parts, answer), length = fit_sample(ctx, build, size, incremental)
        text = render(parts)
        yield record(index, text, answer, length, ctx, _T["answer_prefix"])
