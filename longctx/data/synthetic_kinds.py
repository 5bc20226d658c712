"""The document builders of `longctx.data.synthetic`, one per kind, and the pieces they share.

Each builder takes the stream's `random.Random` and a token budget (estimated by `approx_tokens`) and
returns one document; the module docstring of `longctx.data.synthetic` says what each kind holds.
"""

from __future__ import annotations

import functools
import random
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ruler_tasks.words import wonderwords_lists

RULER_STYLE = 0.75  # fraction of documents phrased exactly as RULER phrases its tasks

NOISE_LINE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NOISE_SENTENCES = (
    "The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.",
    "The sea is deep.", "The night is dark.", "The snow is white.", "The road is long.", "The wind is cold.",
    "Birds fly south in winter.", "The river runs to the sea.", "Time goes on.", "All is well.",
)
_TOKEN_PIECES = re.compile(r"[A-Za-z]+|\d|[^\w\s]")


def approx_tokens(text: str) -> int:
    """Rough token count: 0.8 + len/5 per word (long and rare words split into more pieces), 1 per
    digit and per punctuation mark. On these documents the reference 32k SentencePiece tokenizer gives
    0.6-1.0x this (0.8x on average), so documents fit the length they were made for."""
    total = 0.0
    for piece in _TOKEN_PIECES.findall(text):
        total += 0.8 + len(piece) / 5 if piece[0].isalpha() else 1
    return round(total)


@functools.cache
def _words() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(nouns, adjectives, verbs): single lowercase words only, so a key is one `adj-noun` string."""

    simple = re.compile(r"[a-z]+")
    return tuple(tuple(w for w in ws if simple.fullmatch(w)) for ws in wonderwords_lists())


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _word_key(rng: random.Random) -> str:
    nouns, adjs, _ = _words()
    return f"{rng.choice(adjs)}-{rng.choice(nouns)}"


def _distinct(draw: Callable[[], str], n: int, taken: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        v = draw()
        if v not in taken:
            taken.add(v)
            out.append(v)
    return out


def _join_list(items: list[str]) -> str:
    """RULER's query list: `a`, `a and b`, `a, b, and c`."""
    if len(items) == 1:
        return items[0]
    if len(items) == 2:
        return f"{items[0]} and {items[1]}"
    return ", ".join(items[:-1]) + f", and {items[-1]}"


def _word_sentence(rng: random.Random) -> str:
    """A random-word sentence: the essay-like haystack (RULER's essay tasks read prose)."""
    nouns, adjs, verbs = _words()
    n, a, v = rng.choice, rng.choice, rng.choice
    forms = (
        lambda: f"The {a(adjs)} {n(nouns)} will {v(verbs)} the {n(nouns)}.",
        lambda: f"Most of the time the {n(nouns)} and the {n(nouns)} are {a(adjs)} enough.",
        lambda: f"I think we should {v(verbs)} the {n(nouns)} before it starts to {v(verbs)}.",
        lambda: f"It is a {a(adjs)} kind of {n(nouns)}.",
        lambda: f"Nobody knows why the {n(nouns)} is so {a(adjs)}.",
        lambda: f"Every {n(nouns)} should {v(verbs)} at least one {a(adjs)} {n(nouns)}.",
        lambda: f"What a {a(adjs)} {n(nouns)} that was!",
        lambda: f"The {n(nouns)} costs {rng.randint(1, 999)} dollars in most shops.",
    )
    return rng.choice(forms)()


def _fill(rng: random.Random, unit: Callable[[], str], budget: int) -> list[str]:
    """Haystack units until their estimated tokens would pass `budget` (at least one)."""
    out, used = [], 0
    while True:
        u = unit()
        cost = approx_tokens(u) + 1
        if out and used + cost > budget:
            return out
        out.append(u)
        used += cost


def _insert(rng: random.Random, haystack: list[str], needles: list[str]) -> list[str]:
    """Needles at random depths (RULER: sorted random positions), keeping the needles' order."""
    positions = sorted(rng.randint(0, len(haystack)) for _ in needles)
    out, prev = [], 0
    for pos, needle in zip(positions, needles):
        out.extend(haystack[prev:pos])
        out.append(needle)
        prev = pos
    out.extend(haystack[prev:])
    return out


# --- niah ---------------------------------------------------------------------------------------------

# (task sentence, needle, question, answer): {t} the value type, {k}/{v} one needle's key/value,
# {ks}/{vs} the queried keys / their values, {is}/{was}/{does}/{has} agreeing with them.
_ALT_NIAH = (
    ("Remember every {t} that is given below; you will be asked about it.",
     "The {t} for {k} is {v}.", "Which {t} {was} given for {ks}?", "The {t} for {ks} {is} {vs}."),
    ("Read the text and find the hidden {t}.",
     "Note: {k} has the {t} {v}.", "What {t} {does} {ks} have?", "{ks} {has} the {t} {vs}."),
    ("Pay attention to the secret {t} in this text.",
     "The secret {t} of {k} is {v}.", "Question: what {is} the secret {t} of {ks}?",
     "Answer: the secret {t} of {ks} {is} {vs}."),
)


@dataclass(frozen=True)
class _Needles:
    """The key-value pairs a NIAH document hides, and the questions it asks about them."""

    type_v: str  # "numbers", "uuids" or "words"
    num_v: int  # values per key
    keys: list[str]
    pairs: list[tuple[str, str]]  # (key, value) in the text's order
    asks: list[list[int]]  # per question, the indexes in `keys` it asks for


def _niah(rng: random.Random, budget: int) -> str:
    haystack_kind = rng.choices(("noise", "words", "needle"), (0.4, 0.35, 0.25))[0]
    type_k = "uuids" if rng.random() < 0.15 else "words"
    type_v = rng.choices(("numbers", "uuids", "words"), (0.6, 0.2, 0.2))[0]
    draw_k = {"words": lambda: _word_key(rng), "uuids": lambda: _uuid(rng)}[type_k]
    draw_v = {"numbers": lambda: str(rng.randint(10**6, 10**7 - 1)), "uuids": lambda: _uuid(rng),
              "words": lambda: _word_key(rng)}[type_v]
    taken: set[str] = set()  # every key and value drawn, distractors' included: none is drawn twice
    hidden = _niah_needles(rng, budget, type_k, type_v, draw_k, draw_v, taken)
    ruler_style = rng.random() < RULER_STYLE
    alt = rng.choice(_ALT_NIAH)
    head, needle, tail = _niah_phrasing(hidden, ruler_style, alt)
    t = type_v[:-1]
    needles = [needle.format(tp=type_v, t=t, k=k, v=v) for k, v in hidden.pairs]
    room = budget - approx_tokens(head) - approx_tokens(tail) - sum(approx_tokens(n) + 1 for n in needles)
    if haystack_kind == "words":
        body = " ".join(_insert(rng, _fill(rng, lambda: _word_sentence(rng), room), needles))
    elif haystack_kind == "noise":
        line = NOISE_LINE if rng.random() < 0.7 else None
        units = _fill(rng, (lambda: line) if line else (lambda: rng.choice(NOISE_SENTENCES)), room)
        body = ("\n" if line else " ").join(_insert(rng, units, needles))
    else:  # distractors: needles with other keys
        def distractor() -> str:
            return needle.format(tp=type_v, t=t, k=_distinct(draw_k, 1, taken)[0], v=draw_v())

        body = "\n".join(_insert(rng, _fill(rng, distractor, room), needles))
    return "\n".join((head, body, tail))


def _niah_needles(rng: random.Random, budget: int, type_k: str, type_v: str, draw_k: Callable[[], str],
                  draw_v: Callable[[], str], taken: set[str]) -> _Needles:
    """How many keys and values, drawn; the question RULER would ask, then (half the time) follow-up questions
    about the other keys: each answer is one more retrieval to learn from in the same haystack."""
    num_k = 1 if rng.random() < 0.4 else rng.randint(2, 6)
    num_v = 1 if rng.random() < 0.75 else rng.randint(2, 4)
    # Needles take at most a third of a short document.
    per_needle = 14 + (30 if type_k == "uuids" else 4) + {"numbers": 7, "uuids": 30, "words": 4}[type_v]
    while num_k * num_v * per_needle > budget // 3 and num_k * num_v > 1:
        num_v, num_k = (num_v - 1, num_k) if num_v > 1 else (num_v, num_k - 1)
    num_q = 1 if num_k == 1 or rng.random() < 0.7 else rng.randint(2, min(num_k, 4))
    keys = _distinct(draw_k, num_k, taken)
    values = [_distinct(draw_v, num_v, taken) for _ in keys]
    order = rng.sample(range(num_k), num_k)
    asks = [sorted(order[:num_q])]
    if num_k > num_q and rng.random() < 0.5:
        asks += [[i] for i in order[num_q:num_q + rng.randint(1, 4)]]
    pairs = [(k, v) for k, vs in zip(keys, values) for v in vs]
    rng.shuffle(pairs)  # the text's needle order; answers list a key's values in that order
    return _Needles(type_v, num_v, keys, pairs, asks)


def _niah_phrasing(hidden: _Needles, ruler_style: bool, alt: tuple[str, str, str, str]) -> tuple[str, str, str]:
    """(task sentence, needle template, the questions with their answers): RULER's words, or those of `alt`."""
    type_v, t, keys = hidden.type_v, hidden.type_v[:-1], hidden.keys

    def question_and_answer(queried: list[int]) -> str:
        query = _join_list([keys[i] for i in queried])
        answer = _join_list([v for i in queried for k, v in hidden.pairs if k == keys[i]])
        plural = len(queried) * hidden.num_v > 1
        if ruler_style:
            tv = type_v if plural else t
            return (f"{'What are all' if plural else 'What is'} the special magic {tv} for {query} mentioned in "
                    f"the provided text? The special magic {tv} for {query} mentioned in the provided text "
                    f"{'are' if plural else 'is'} {answer}.")
        fmt = {"t": t + ("s" if plural else ""), "ks": query, "vs": answer, "is": "are" if plural else "is",
               "was": "were" if plural else "was", "does": "do" if len(queried) > 1 else "does",
               "has": "have" if len(queried) > 1 else "has"}
        return alt[2].format(**fmt) + " " + alt[3].format(**fmt)

    tail = "\n".join(question_and_answer(q) for q in hidden.asks)
    plural = len(hidden.asks[0]) * hidden.num_v > 1
    if ruler_style:
        tv = type_v if plural else t
        head = (f"Some special magic {tv} are hidden within the following text. Make sure to memorize it. "
                f"I will quiz you about the {tv} afterwards.")
        if not plural:
            head = head.replace("Some", "A").replace("are", "is")
        return head, "One of the special magic {tp} for {k} is: {v}.", tail
    return alt[0].format(t=t + ("s" if plural else "")), alt[1], tail


# --- dense recall -------------------------------------------------------------------------------------

def _recall(rng: random.Random, budget: int) -> str:
    type_v = rng.choices(("numbers", "uuids", "words"), (0.8, 0.05, 0.15))[0]
    draw_v = {"numbers": lambda: str(rng.randint(10**6, 10**7 - 1)), "uuids": lambda: _uuid(rng),
              "words": lambda: _word_key(rng)}[type_v]
    t = type_v[:-1]
    noise = rng.choice((0.0, 0.0, 0.3, 1.0))  # haystack sentences per needle, on average
    ruler_share = rng.choice((0.3, 0.6, 0.9))  # answers in RULER's phrasing; the rest repeat the needle
    needle = "One of the special magic {tp} for {k} is: {v}."
    head = (f"Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
            f"I will quiz you about the {type_v} afterwards.")

    def question(k: str, v: str) -> str:
        if rng.random() < ruler_share:
            # RULER's answer sentence, after its question half the time (the question is 20 tokens).
            answer = f"The special magic {t} for {k} mentioned in the provided text is {v}."
            if rng.random() < 0.5:
                return answer
            return f"What is the special magic {t} for {k} mentioned in the provided text? {answer}"
        return needle.format(tp=type_v, k=k, v=v)

    taken: set[str] = set()
    needles: list[tuple[str, str | None]] = []
    used = approx_tokens(head)
    # Add needles, each asked about (most of them), until the estimate reaches the budget.
    while True:
        k, v = _distinct(lambda: _word_key(rng), 1, taken)[0], _distinct(draw_v, 1, taken)[0]
        line = needle.format(tp=type_v, k=k, v=v)
        asked = question(k, v) if not needles or rng.random() < 0.9 else None
        cost = approx_tokens(line) + 1 + (approx_tokens(asked) + 1 if asked else 0)
        if needles and used + cost > budget:
            break
        needles.append((line, asked))
        used += cost
    room = budget - used
    # About `noise` haystack sentences (~8 tokens) per needle, as the budget allows; `_fill` gives at least one.
    units = _fill(rng, lambda: rng.choice(NOISE_SENTENCES), min(room, round(noise * 8 * len(needles)))) if noise else []
    body = _insert(rng, units, [n for n, _ in needles])
    asks = [q for _, q in needles if q]
    rng.shuffle(asks)
    return "\n".join([head, " ".join(body)] + asks)


# --- variable tracking --------------------------------------------------------------------------------

def _var_name(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))


def _vt(rng: random.Random, budget: int) -> str:
    num_chains = rng.choice((1, 1, 2, 3))
    hops = rng.randint(1, 5)
    # Assignment lines (~9 tokens each) take at most a third of a short document.
    while num_chains * (hops + 1) * 9 > budget // 3 and (num_chains > 1 or hops > 1):
        num_chains, hops = (num_chains - 1, hops) if num_chains > 1 else (num_chains, hops - 1)
    taken: set[str] = set()
    values = _distinct(lambda: str(rng.randint(10000, 99999)), num_chains, set())
    chains = [_distinct(lambda: _var_name(rng), hops + 1, taken) for _ in range(num_chains)]
    asked = rng.randrange(num_chains)
    names = chains[asked]
    query = values[asked]
    if rng.random() < RULER_STYLE:
        head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
        tail = (f"Question: Find all variables that are assigned the value {query} in the text above. Answer: "
                f"According to the chain(s) of variable assignment in the text above, {len(names)} variables are "
                f"assigned the value {query}, they are: {' '.join(names)}")
    else:
        head = "Some variables are assigned below, directly or through other variables. Keep track of them."
        tail = f"Which variables hold the value {query}? The variables holding {query} are {' '.join(names)}."
    # Each chain's assignments in order, chains interleaved at random.
    lines: list[str] = []
    pending = [[f"VAR {c[0]} = {v}"] + [f"VAR {c[i]} = VAR {c[i - 1]}" for i in range(1, len(c))]
               for c, v in zip(chains, values)]
    while any(pending):
        lines.append(rng.choice([p for p in pending if p]).pop(0))
    room = budget - approx_tokens(head) - approx_tokens(tail) - sum(approx_tokens(s) + 1 for s in lines)
    units = _fill(rng, lambda: NOISE_LINE, room)
    return "\n".join((head, "\n".join(_insert(rng, units, lines)), tail))


# --- common words -------------------------------------------------------------------------------------

def _numbered_cost(i: int, word: str) -> int:
    return approx_tokens(f"{i}. {word}") + 1


def _cwe(rng: random.Random, budget: int) -> str:
    nouns, adjs, verbs = _words()
    pool = nouns + adjs + verbs
    # RULER asks for 10 words repeated 30 (>= 4k tokens) or 6 times among words seen 3 or 1 times;
    # short documents ask for fewer so that the common words take at most half of the list.
    shapes = [(c, f) for c in (3, 5, 10) for f in (3, 4, 6) if c * f * 6 <= budget // 2] or [(2, 3)]
    num_common, freq_common = rng.choice(shapes)
    taken: set[str] = set()
    common = _distinct(lambda: rng.choice(pool), num_common, taken)
    ranked = list(common)  # all equally frequent: any order is right, RULER's check ignores order
    if rng.random() < RULER_STYLE:
        head = ("Below is a numbered list of words. In these words, some appear more often than others. "
                "Memorize the ones that appear most often.")
        tail = (f"Question: What are the {num_common} most common words in the above list? Answer: The top "
                f"{num_common} words that appear most often in the list are: "
                + " ".join(f"{i}. {w}" for i, w in enumerate(ranked, 1)))
    else:
        head = "Count the words in the list below."
        tail = f"Which {num_common} words are repeated most? They are: {', '.join(ranked)}."
    room = budget - approx_tokens(head) - approx_tokens(tail)
    words = common * freq_common
    used = sum(_numbered_cost(len(words), w) for w in words)
    # Every other word appears at most freq_common - 2 times, so the common words are the top ones.
    while True:
        w = _distinct(lambda: rng.choice(pool), 1, taken)[0]
        copies = rng.randint(1, max(freq_common - 2, 1))
        cost = copies * _numbered_cost(len(words) + copies, w)
        if used + cost > room:
            break
        words += [w] * copies
        used += cost
    rng.shuffle(words)
    numbered = " ".join(f"{i}. {w}" for i, w in enumerate(words, 1))
    return "\n".join((head, numbered, tail))


# --- frequent (coded) words ---------------------------------------------------------------------------

def _fwe(rng: random.Random, budget: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = _distinct(lambda: "".join(rng.choice(letters) for _ in range(6)), rng.randint(8, 30), set())
    answer = vocab[:3]
    if rng.random() < RULER_STYLE:
        head = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words.")
        tail = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                "most frequently appeared words in the above coded text? Answer: According to the coded text "
                f"above, the three most frequently appeared words are: {' '.join(answer)}")
    else:
        head = "Here is a coded text."
        tail = ("\nIgnoring the dots, which three coded words appear most often? The three most frequent coded "
                f"words are {', '.join(answer)}.")
    room = budget - approx_tokens(head) - approx_tokens(tail)
    # Zipf counts as in RULER (rank 0 is the '...' noise): as many items as the estimate allows.
    alpha = rng.uniform(1.5, 2.5)
    weights = [1 / (k + 1) ** alpha for k in range(len(vocab) + 1)]
    share_dots = weights[0] / sum(weights)
    per_item = share_dots * approx_tokens(" ...") + (1 - share_dots) * (approx_tokens(" " + vocab[0]) + 1)
    n = max(int(room / per_item), 12)
    counts = [max(int(n * w / sum(weights)), 1) for w in weights]
    # Strictly ordered answers above every other coded word, so the answer is unique.
    counts[3] = max(counts[3], max(counts[4:]) + 1)
    counts[2] = max(counts[2], counts[3] + 1)
    counts[1] = max(counts[1], counts[2] + 1)
    tokens = ["..."] * counts[0] + [w for w, c in zip(vocab, counts[1:]) for _ in range(c)]
    rng.shuffle(tokens)
    return head + " " + " ".join(tokens) + tail


# --- copying ----------------------------------------------------------------------------------------

# Half of a copy line's items are numbers: RULER's answers are numbers, and a model that copies letters but
# sees few digits to copy can leave its digit embeddings collapsed together, unable to copy one.
NUMBER_SHARE = 0.5


def _copy_line(rng: random.Random, longest: int) -> tuple[str, int]:
    """A line of 8..`longest` random letter strings and numbers, and its estimated token count.

    Random letters and digits, not words: a model that can learn to spell real words spends itself on
    that; random strings leave nothing to learn but copying. They split into short pieces: about one token
    per two letters, one per digit."""
    items = []
    for _ in range(rng.randint(8, longest)):
        if rng.random() < NUMBER_SHARE:
            items.append(str(rng.randint(0, 10**rng.randint(1, 7) - 1)))
        else:
            items.append("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 7))))
    return " ".join(items), sum(len(w) if w.isdigit() else 1 + len(w) // 2 for w in items) + 1


def _copy(rng: random.Random, budget: int) -> str:
    """Lines of random letter strings and numbers, each line later repeated once, in shuffled order. Nothing but
    the earlier line predicts a repeat, and lines differ in length, so the only way to predict it is to
    find the current word earlier and read on (an induction head), not to look a fixed distance back."""
    # Mostly short documents: a document is all a token attends to, and a tiny model first learns to
    # copy when few tokens compete for its attention (packed sequences keep documents apart).
    budget = min(budget, rng.randint(64, 384))
    lines: list[str] = []
    used = 0
    longest = max(8, min(40, budget // 8))  # an item is about 4 tokens, and each line is written twice
    while True:
        line, cost = _copy_line(rng, longest)
        if lines and used + 2 * cost > budget:
            break
        lines.append(line)
        used += 2 * cost
    # Each line is repeated after a random number of other lines (0 = right after itself).
    order: list[str] = []
    pending: list[str] = []
    for line in lines:
        order.append(line)
        pending.append(line)
        while pending and rng.random() < 0.5:
            order.append(pending.pop(rng.randrange(len(pending))))
    rng.shuffle(pending)
    return "\n".join(order + pending)


def _copy_far(rng: random.Random, budget: int) -> str:
    """One to four random lines in RULER's noise haystack, each repeated once anywhere after itself:
    copying across the whole sequence, as a needle's value is copied into the answer (`pretrain` only)."""
    lines: list[str] = []
    used = 0
    for _ in range(rng.randint(1, 4)):
        line, cost = _copy_line(rng, 24)
        if lines and used + 2 * cost > budget // 2:
            break
        lines.append(line)
        used += 2 * cost
    units = _fill(rng, lambda: rng.choice(NOISE_SENTENCES), budget - used)
    for line in lines:
        first = rng.randrange(len(units) + 1)
        units.insert(first, "\n" + line + "\n")
        units.insert(rng.randint(first + 1, len(units)), "\n" + line + "\n")
    return re.sub(r"\s*\n\s*", "\n", " ".join(units)).strip()


# --- backcopy ------------------------------------------------------------------------------------------

# Guo et al. 2024, "Active-Dormant Attention Heads: Mechanistically Demystifying Extreme-Token Phenomena in
# LLMs" (arXiv 2410.13835), Section 2: the Bigram-Backcopy task, on which a small transformer forms an attention
# sink on the first token (its backcopy head is needed only after a trigger and rests on the sink elsewhere).
# Short nouns, most of them one token in a small BPE, so a word is about one token.
BACKCOPY_WORDS = (
    "act", "air", "ant", "app", "arch", "arm", "art", "ash", "back", "bake", "band", "bar", "bell", "bet", "bid",
    "bill", "black", "blow", "blue", "book", "bow", "brief", "broad", "brush", "bud", "bump", "buy", "camp", "can",
    "cap", "car", "care", "cart", "cast", "cat", "cause", "chart", "cheer", "child", "chop")
BACKCOPY_TRIGGERS = ("alert", "break", "call", "check")  # after one of these comes the word before it
BACKCOPY_SUCCESSORS = 4  # the bigram table: each word is followed by one of this many words, drawn uniformly


@functools.cache
def _bigram_table() -> dict[str, tuple[str, ...]]:
    """The fixed transition table (the same for every seed: held-out documents follow the trained bigrams)."""
    rng = random.Random("longctx.synthetic/backcopy/table")
    words = BACKCOPY_WORDS + BACKCOPY_TRIGGERS
    return {w: tuple(rng.sample(words, BACKCOPY_SUCCESSORS)) for w in words}


def _backcopy(rng: random.Random, budget: int) -> str:
    """Words that follow a fixed bigram table, except that the word after a trigger word repeats the word
    before the trigger. Only that copy needs to look back: at every other position a head that copies has
    nothing to do, which is when a softmax head rests its attention on the first token (Guo et al. 2024)."""
    table = _bigram_table()
    words = [rng.choice(BACKCOPY_WORDS)]
    while len(words) < budget:  # about a token a word
        prev = words[-1]
        words.append(words[-2] if prev in BACKCOPY_TRIGGERS and len(words) > 1 else rng.choice(table[prev]))
    return " ".join(words)


BUILDERS: dict[str, Callable[[random.Random, int], str]] = {"niah": _niah, "vt": _vt, "cwe": _cwe, "fwe": _fwe,
                                                            "recall": _recall, "copy": _copy, "copy_far": _copy_far,
                                                            "backcopy": _backcopy}
