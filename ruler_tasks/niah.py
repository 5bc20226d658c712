"""Needle in a haystack (RULER `scripts/data/synthetic/niah.py` @ c3f5e3b), same draws, same text."""

from __future__ import annotations

from ruler_tasks._common import GenContext, binary_search, fit_sample, split_answer_prefix
from ruler_tasks.constants import NEEDLE, NOISE_HAYSTACK, TASK_TEMPLATES
from ruler_tasks.rng import below_rounds, choice_draw, fixed_shuffle, randint_draw, uuid4_str, uuid4_strs
from ruler_tasks.sentences import essay_sentences
from ruler_tasks.templates import split_format
from ruler_tasks.text import Join, Rows, render
from ruler_tasks.words import niah_keys

# np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int), as Python ints
DEPTHS = [0, 3, 5, 8, 10, 13, 15, 18, 21, 23, 26, 28, 31, 33, 36, 38, 41, 44, 46, 49,
          51, 54, 56, 59, 62, 64, 67, 69, 72, 74, 77, 79, 82, 85, 87, 90, 92, 95, 97, 100]

_T = TASK_TEMPLATES["niah"]


def singular(template: str) -> str:
    """RULER's rewrite when num_needle_q * num_needle_v == 1 (raw substring replaces, in this order)."""
    return (template.replace("Some", "A").replace("are all", "is").replace("are", "is")
            .replace("answers", "answer"))


# Key/value kinds drawn as `rng._randbelow(size)`: numbers = randint(10**6, 10**7 - 1), words = choice(keys)
_BELOW = ("numbers", "words")


def _below_size(kind: str) -> int:
    return 9 * 10**6 if kind == "numbers" else len(niah_keys())


def _below_strs(kind: str, draws) -> list[str]:
    """The strings upstream makes from `draws` (NumPy array of `_randbelow` results) of `kind`."""
    if kind == "numbers":
        return list(map(str, (draws + 10**6).tolist()))
    return niah_keys().take(draws)


def generate(ctx: GenContext):
    a = ctx.args
    type_haystack = a["type_haystack"]
    type_k, type_v = a["type_needle_k"], a["type_needle_v"]
    num_v, num_q = a.get("num_needle_v", 1), a.get("num_needle_q", 1)
    num_k = max(a.get("num_needle_k", 1), num_q)
    rng, seed = ctx.rng, ctx.seed

    if type_haystack == "essay":
        sents = essay_sentences(ctx.data["essay"])
    elif type_haystack not in ("noise", "needle"):
        raise ValueError(f"unknown type_haystack {type_haystack!r}")
    keys_list = niah_keys() if "words" in (type_k, type_v) else None

    task_t, prefix_t = _T["template"], _T["answer_prefix"]
    tv = type_v
    if num_q * num_v == 1:
        task_t, prefix_t = singular(task_t), singular(prefix_t)
        tv = type_v[:-1]
    template = ctx.template.compose(task_t, prefix_t)

    def drawer(kind: str):
        """A function drawing one key or value of `kind`, exactly as upstream's draw."""
        if kind == "numbers":  # str(rng.randint(10**6, 10**7 - 1))
            number = randint_draw(rng, 10**6, 10**7 - 1)
            return lambda: str(number())
        if kind == "words":  # rng.choice(keys_list)
            return choice_draw(rng, keys_list)
        if kind == "uuids":  # str(uuid.UUID(int=rng.getrandbits(128), version=4))
            bits = rng.getrandbits
            return lambda: uuid4_str(bits(128))
        raise ValueError(kind)

    draw_k, draw_v = drawer(type_k), drawer(type_v)

    # NEEDLE with this type_needle_v, as the literals around {key} and {value} (for Rows)
    needle_literals = tuple(NEEDLE.replace("{type_needle_v}", type_v).replace("{key}", "{value}").split("{value}"))

    def build(num_haystack: int):
        keys, values, needles, needle_rows = [], [], [], []
        for _ in range(num_k):
            keys.append(draw_k())
            value = []
            for _ in range(num_v):
                value.append(draw_v())
                needles.append(NEEDLE.format(type_needle_v=type_v, key=keys[-1], value=value[-1]))
                needle_rows.append((keys[-1], value[-1]))
            values.append(value)
        needles = fixed_shuffle(seed, needles)
        needle_rows = fixed_shuffle(seed, needle_rows)  # the same permutation (same seed and length)

        if type_haystack == "essay":
            doc = sents.get(num_haystack)
            nd = len(doc)
            pos = [0] + sorted(int(nd * (d / 100)) for d in rng.sample(DEPTHS, len(needles))) + [nd]
            items: list[str] = []
            for i in range(1, len(pos)):
                chunk = doc[pos[i - 1]:pos[i]]
                if chunk:
                    items.extend(chunk)
                else:
                    items.append("")  # " ".join([]) of an empty slice
                if i - 1 < len(needles):
                    items.append(needles[i - 1])
            context = Join(" ", items)
        elif type_haystack == "noise":
            lines = [NOISE_HAYSTACK] * num_haystack
            indexes = sorted(rng.sample(range(num_haystack), len(needles)), reverse=True)
            for index, element in zip(indexes, needles):
                lines.insert(index, element)
            context = Join("\n", lines)
        else:
            # haystack lines are NEEDLE lines too: kept as (key, value) rows, drawn key first as upstream
            if type_k == type_v == "uuids":  # the same 2 * num_haystack draws, in bulk (`uuid4_strs`)
                u = uuid4_strs(rng, 2 * num_haystack)
                rows = list(zip(u[0::2], u[1::2]))
            elif type_k in _BELOW and type_v in _BELOW:  # the same draws, in bulk (`below_rounds`)
                k, v = below_rounds(rng, (_below_size(type_k), _below_size(type_v)), num_haystack)
                rows = list(zip(_below_strs(type_k, k), _below_strs(type_v, v)))
            else:
                rows = [(draw_k(), draw_v()) for _ in range(num_haystack)]
            indexes = sorted(rng.sample(range(num_haystack), len(needles)), reverse=True)
            for index, element in zip(indexes, needle_rows):
                rows.insert(index, element)
            context = Rows("\n", needle_literals, rows)

        indices = rng.sample(range(num_k), num_q)
        queries = [keys[i] for i in indices]
        answers = [x for i in indices for x in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        head, tail = split_format(template, type_needle_v=tv, query=query)
        return [head, context, tail], answers

    if type_haystack == "essay":
        incremental = 500
    else:
        incremental = 25
    if type_haystack != "essay" and ctx.max_seq_length < 4096:
        incremental = 5
    limit = ctx.max_seq_length - ctx.model_template_token
    ttg = ctx.tokens_to_generate

    parts, _ = build(incremental)
    per = ctx.count(parts) / incremental
    estimated = int((limit / per) * 3)
    num_haystack = binary_search(ctx, lambda mid: ctx.count(build(mid)[0]) + ttg,
                                 incremental, max(estimated, incremental * 2), incremental)
    ctx.stats["size"] = num_haystack
    if type_haystack == "essay":
        sents.keep()

    for _ in range(ctx.num_samples):
        (parts, answer), length = fit_sample(ctx, build, num_haystack, incremental)
        text = render(parts)
        inp, prefix = split_answer_prefix(text, _T["answer_prefix"])
        pos = inp.find(answer[0])
        n_prefix = pos if pos >= 0 else len(inp) - 1
        yield {
            "index": pos,
            "input": inp,
            "outputs": answer,
            "length": length,
            "length_w_model_temp": length + ctx.model_template_token,
            "answer_prefix": prefix,
            "token_position_answer": ctx.counter.count_prefix(parts, max(n_prefix, 0)),
        }
    if type_haystack == "essay":  # the sizes the samples stepped down to
        sents.keep()
