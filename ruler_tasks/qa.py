"""Single/multi-hop QA over SQuAD / HotpotQA (RULER `scripts/data/synthetic/qa.py` @ c3f5e3b)."""

from __future__ import annotations

from longctx.core.errors import ref
from ruler_tasks._common import GenContext, binary_search, fit_sample, record
from ruler_tasks.constants import TASK_TEMPLATES
from ruler_tasks.data import read_hotpotqa, read_squad
from ruler_tasks.errors import RulerInputError
from ruler_tasks.rng import fixed_shuffle
from ruler_tasks.templates import split_format
from ruler_tasks.text import Join, render

_T = TASK_TEMPLATES["qa"]


def usable_questions(dataset: str, obj) -> int:
    """How many questions `read_squad` / `read_hotpotqa` give (answerable SQuAD ones; every HotpotQA one),
    counted without building them."""
    if dataset == "squad":
        return sum(not q["is_impossible"] for d in obj["data"] for p in d["paragraphs"] for q in p["qas"])
    return len(obj)


def check_data(spec, data: dict, samples: int) -> None:
    """What `prepare` runs before it writes anything (`ruler_tasks.registry.Generator`): the task's dataset has
    the questions its samples need (`check_samples`)."""
    dataset = spec.args["dataset"]
    check_samples(spec.name, dataset, data[dataset].obj, samples, spec.args.get("pre_samples", 0))


def check_samples(task: str, dataset: str, obj, num_samples: int, pre_samples: int = 0) -> None:
    """RulerInputError when the data has fewer questions than the samples asked for (`prepare` asks before it
    writes anything)."""
    have = usable_questions(dataset, obj)
    if pre_samples + num_samples > have:
        raise RulerInputError(
            f"{task}: the {dataset} data has {have} usable questions, fewer than the {num_samples} "
            f"samples asked for; lower {ref('samples')} or give the full dataset")


def generate(ctx: GenContext):
    dataset = ctx.args["dataset"]
    pre_samples = ctx.args.get("pre_samples", 0)
    src = ctx.data[dataset]
    check_samples(ctx.task, dataset, src.obj, ctx.num_samples, pre_samples)
    qas, docs = read_squad(src.obj) if dataset == "squad" else read_hotpotqa(src.obj)
    rng, seed = ctx.rng, ctx.seed
    template = ctx.template.compose(_T["template"], _T["answer_prefix"])
    ndocs = len(docs)

    def build(index, num_docs):
        q = qas[index]
        curr_docs, curr_more = q["context"], q.get("more_context", [])
        if num_docs < ndocs:
            if (num_docs - len(curr_docs)) > len(curr_more):
                used = set(curr_docs + curr_more)
                addition = [i for i in range(ndocs) if i not in used]
                all_docs = curr_docs + curr_more + rng.sample(
                    addition, max(0, num_docs - len(curr_docs) - len(curr_more)))
            else:
                all_docs = curr_docs + rng.sample(curr_more, num_docs - len(curr_docs))
            all_docs = [docs[i] for i in all_docs]
        else:
            repeats = (num_docs + ndocs - 1) // ndocs
            all_docs = (docs * repeats)[:num_docs]
        all_docs = fixed_shuffle(seed, all_docs)
        # "\n\n".join(f"Document {i}:\n{d}") == "\n".join(["Document 1:", d1, "", "Document 2:", d2, ...])
        items = []
        for i, d in enumerate(all_docs):
            if i:
                items.append("")
            items.append(f"Document {i + 1}:")
            items.append(d)
        head, tail = split_format(template, query=q["query"])
        return [head, Join("\n", items), tail], q["outputs"]

    incremental = 10
    limit = ctx.max_seq_length - ctx.model_template_token
    ttg = ctx.tokens_to_generate
    parts, _ = build(0, incremental)
    per = ctx.count(parts) / incremental
    estimated = int((limit / per) * 3)
    size = binary_search(ctx, lambda mid: ctx.count(build(0, mid)[0]) + ttg,
                         incremental, max(estimated, incremental * 2), incremental)
    ctx.stats["size"] = size
    for index in range(ctx.num_samples):
        (parts, answer), length = fit_sample(ctx, lambda used, index=index: build(index + pre_samples, used), size,
                                             incremental)
        text = render(parts)
        yield record(index, text, answer, length, ctx, _T["answer_prefix"])
