"""Variable tracking (RULER `scripts/data/synthetic/variable_tracking.py` @ c3f5e3b).

Two passes like upstream: first a one-shot example is generated in a 500-token budget (3-letter names,
value 12345, no model wrapper); then every sample gets that example with its answer names and value
re-randomised (`str.replace`, as upstream) inserted before the task text.
"""

from __future__ import annotations

import string

from ruler_tasks._common import GenContext, binary_search, fit_sample, record
from ruler_tasks.constants import NOISE_HAYSTACK, TASK_TEMPLATES
from ruler_tasks.templates import split_format
from ruler_tasks.text import Join, render

_T = TASK_TEMPLATES["variable_tracking"]
_UPPER = string.ascii_uppercase


def generate(ctx: GenContext):
    a = ctx.args
    if a.get("type_haystack", "noise") != "noise":
        raise ValueError("only the noise haystack (RULER's vt task) is implemented")
    num_chains, num_hops = a.get("num_chains", 1), a.get("num_hops", 4)
    rng, nprng = ctx.rng, ctx.nprng
    orig_max = ctx.max_seq_length  # upstream's args.max_seq_length
    base_template = _T["template"] + _T["answer_prefix"]
    template = ctx.template.compose(_T["template"], _T["answer_prefix"])

    def chains_for(is_icl: bool):
        k = 5 if not is_icl else 3
        hops = num_hops if not is_icl else min(10, num_hops)
        vars_all = ["".join(rng.choices(_UPPER, k=k)).upper() for _ in range((hops + 1) * num_chains)]
        while len(set(vars_all)) < num_chains * (hops + 1):
            vars_all.append("".join(rng.choices(_UPPER, k=k)).upper())
        vars_ret, chains_ret = [], []
        for i in range(0, len(vars_all), hops + 1):
            this_vars = vars_all[i:i + hops + 1]
            vars_ret.append(this_vars)
            if is_icl:
                chain = [f"VAR {this_vars[0]} = 12345"]
            else:
                chain = [f"VAR {this_vars[0]} = {nprng.randint(10000, 99999)!s}"]
            for j in range(hops):
                chain.append(f"VAR {this_vars[j + 1]} = VAR {this_vars[j]} ")
            chains_ret.append(chain)
        return vars_ret, chains_ret, hops

    def build(num_noises: int, is_icl: bool):
        vars_, chains, hops = chains_for(is_icl)
        value = chains[0][0].split("=")[-1].strip()
        lines = [NOISE_HAYSTACK] * num_noises
        for chain in chains:
            positions = sorted(rng.sample(range(len(lines)), len(chain)))
            for insert_pi, j in zip(positions, range(len(chain))):
                lines.insert(insert_pi + j, chain[j])
        if any(s.endswith(". ") for s in set(lines[:-1])):
            context = "\n".join(lines).replace(". \n", ".\n")
        else:
            context = Join("\n", lines)
        t = template
        if is_icl and t != base_template:
            t = base_template  # upstream drops the model wrapper from the one-shot example
        head, tail = split_format(t, query=value, num_v=hops + 1)
        return [head, context, tail], vars_[0]

    def randomize_icl(icl: str) -> str:
        targets = icl.strip().split()[-num_hops - 1:]
        for item in targets:
            new_item = "".join(rng.choices(_UPPER, k=len(item))).upper()
            icl = icl.replace(item, new_item)
        return icl.replace("12345", str(nprng.randint(10000, 99999)))

    def run(num_samples, max_len, icl_example, final):
        ttg = ctx.tokens_to_generate if icl_example is not None else 0
        if icl_example:
            incremental = 10
            if orig_max < 4096:
                incremental = 5
        else:
            incremental = 5
        is_icl = icl_example is None
        example_tokens = 0
        if icl_example is not None:
            icl_example = icl_example["input"] + " " + " ".join(icl_example["outputs"]) + "\n"
            example_tokens = ctx.count([icl_example])
        limit = max_len - ctx.model_template_token
        parts, _ = build(incremental, is_icl)
        per = ctx.count(parts) / incremental
        estimated = int((limit / per) * 3)
        saved = ctx.max_seq_length
        ctx.max_seq_length = max_len  # binary_search / fit_sample compare against this budget
        saved_ttg = ctx.tokens_to_generate
        ctx.tokens_to_generate = ttg
        try:
            size = binary_search(ctx, lambda mid: ctx.count(build(mid, is_icl)[0]) + example_tokens + ttg,
                                 incremental, max(estimated, incremental * 2), incremental)
            ctx.stats.setdefault("sizes", []).append(size)

            def build_sample(used):
                parts, answer = build(used, is_icl)
                if icl_example is not None:
                    head = parts[0]
                    cut = head.find(_T["template"][:20])
                    if cut < 0:
                        text = render(parts)
                        cut = text.index(_T["template"][:20])
                        parts = [text[:cut] + randomize_icl(icl_example) + "\n" + text[cut:]]
                    else:
                        parts = [head[:cut] + randomize_icl(icl_example) + "\n" + head[cut:]] + parts[1:]
                return parts, answer

            for index in range(num_samples):
                (parts, answer), length = fit_sample(ctx, build_sample, size, incremental)
                text = render(parts)
                if final:
                    yield record(index, text, answer, length, ctx, _T["answer_prefix"])
                else:
                    yield {"index": index, "input": text, "outputs": answer, "length": length}
        finally:
            ctx.max_seq_length = saved
            ctx.tokens_to_generate = saved_ttg

    icl = list(run(1, 500, None, False))[0]  # noqa: RUF015 - run to its end: it restores the context last
    yield from run(ctx.num_samples, ctx.max_seq_length, icl, True)
