"""The fast token counts equal a full tokenization (`len(tokenizer.tokenize(text))`, as RULER's
scripts/data/tokenizer.py `hf` type counts) for every tokenizer family they accelerate."""

from __future__ import annotations

import random

import pytest

from ruler_tasks.counting import TokenCounter
from ruler_tasks.text import Join, NumberedList, render, truncate

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
WORDS = ["alpha", "beta", "x-ray", "naïve", "café", "don't", "e.g.", "U.S.", "1234567", "...", "—", "tab\tbed",
         "", " ", "  ", "a  b", "end.", "Mr.", "\u00a0", "emoji😀", "{brace}", "VAR ABC = 12345", "日本"]


def _random_parts(r: random.Random):
    parts = []
    for _ in range(r.randint(1, 5)):
        t = r.random()
        if t < 0.35:
            parts.append(r.choice(WORDS + ["\n", "Question: what?", " Answer:", "x\n\ny", "\n "]))
        elif t < 0.8:
            sep = r.choice(["\n", " ", "\n\n", ", ", "  "])
            items = [r.choice(WORDS + [NOISE, NOISE]) for _ in range(r.randint(0, 12))]
            parts.append(Join(sep, items, r.random() < 0.3))
        else:
            parts.append(NumberedList([r.choice([w for w in WORDS if w] + ["ab"]) for _ in range(r.randint(0, 15))]))
    return parts


def _check(counter: TokenCounter, tok, trials: int, seed: int):
    r = random.Random(seed)
    for _ in range(trials):
        parts = _random_parts(r)
        text = render(parts)
        assert counter.count(parts) == len(tok.tokenize(text)), (counter.strategy, parts)
        n = r.randint(0, len(text))
        assert counter.count_prefix(parts, n) == len(tok.tokenize(text[:n])), (parts, n)


@pytest.fixture(scope="module")
def ref_tok(reference_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(reference_tokenizer_dir)


@pytest.mark.slow
def test_metaspace_strategy_selected(ref_tok):
    c = TokenCounter(ref_tok)
    assert c.strategy == "metaspace"
    assert c._anchor == "\n"  # no Mistral vocabulary token contains a newline


def test_metaspace_counts_equal_full_tokenization(ref_tok):
    _check(TokenCounter(ref_tok), ref_tok, 600, seed=1)


@pytest.mark.slow
def test_metaspace_noise_haystack_and_special_tokens(ref_tok):
    c = TokenCounter(ref_tok)
    parts = ["A special magic number is hidden.\n", Join("\n", [NOISE] * 3000 + ["One of the x-y is: 1."]),
             "\nWhat is it? The answer is"]
    assert c.count(parts) == len(ref_tok.tokenize(render(parts)))
    # added tokens in the text (chat wrappers) fall back to full tokenization
    parts = ["<s>[INST] hi", Join(" ", ["a", "</s>", "b"] * 5), " [/INST]"]
    assert c.count(parts) == len(ref_tok.tokenize(render(parts)))


def test_legacy_sentencepiece_normalizer(ref_tok):
    """Older Llama/Mistral tokenizer.json: Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer."""
    from tokenizers import Tokenizer, normalizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(ref_tok.backend_tokenizer.to_str())
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    c = TokenCounter(tok)
    assert c.strategy == "metaspace"
    _check(c, tok, 300, seed=2)


def _byte_level_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [NOISE, "One of the special magic numbers for x-y is: 1234567."] + WORDS
    tk.train_from_iterator(corpus * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk)


def test_byte_level_bpe_counts_equal_full_tokenization():
    tok = _byte_level_bpe()
    c = TokenCounter(tok)
    assert c.strategy == "pretoken"
    _check(c, tok, 400, seed=3)


def test_unknown_model_falls_back_to_full(ref_tok):
    c = TokenCounter(ref_tok, strategy="full")
    _check(c, ref_tok, 50, seed=4)


def test_verify_mode_catches_a_wrong_count(ref_tok, monkeypatch):
    monkeypatch.setenv("RULER_TASKS_VERIFY_COUNTS", "1")
    c = TokenCounter(ref_tok)
    c._joined[" "] = {"beta": 99}  # poison the cache: the check must notice
    with pytest.raises(AssertionError):
        c.count(["x", Join(" ", ["alpha", "beta", "beta", "gamma"])])


def test_truncate_matches_string_slicing():
    r = random.Random(5)
    for _ in range(500):
        parts = _random_parts(r)
        s = render(parts)
        for n in {0, 1, len(s) // 2, len(s) - 1, len(s), len(s) + 3}:
            assert render(truncate(parts, max(n, 0))) == s[:max(n, 0)]


# --- word-level and bulk paths (`_c_words`, `_c_sum`, `Rows`) -----------------------------------------
# Strings that exercise every cut rule: digits (made "0"), cut chars with and without unsafe neighbours
# ("tam-o'-shanter", " -x", "--", "'s"), non-ASCII text (slow `str.translate` path), double spaces and
# a literal "▁" before a space (both fall back), a leading space, newlines and tabs (barriers).
TRICKY = ["fluffy-cat", "tam-o'-shanter", "jalapeño-dip", "3f2a1b4c-9d8e-4a7b-8c6d-5e4f3a2b1c0d", "1234567",
          "a - b", "x--y", "it's", "(a)", "e.g.", "U.S.", "a  b", "▁ x", " lead", "tab\tbed", "line\nnext",
          "0", "9.5%", "", "x", "{k}", "a->b", "naïve café", "日本-語", "emoji😀-1"]


def _rand_field(r: random.Random) -> str:
    k = r.random()
    if k < 0.5:
        return r.choice(TRICKY)
    if k < 0.75:
        return str(r.randint(10**6, 10**7 - 1))
    return "".join(r.choice("0123456789abcdef-") for _ in range(r.randint(1, 12)))


@pytest.mark.slow
def test_bulk_and_word_counts_equal_full_tokenization(ref_tok):
    c = TokenCounter(ref_tok)
    assert c._cut_all is not None and c._zero is not None  # the Mistral vocabulary allows both
    r = random.Random(11)
    nl = len(ref_tok.tokenize("\n"))
    for _ in range(300):
        strings = [(" " if r.random() < 0.8 else "") + _rand_field(r) for _ in range(r.randint(1, 30))]
        # not at the text start: after a newline (no vocabulary token contains one, so it is cut off
        # exactly; the whole-text checks below do not rely on that)
        want = [len(ref_tok.tokenize("\n" + s)) - nl for s in strings]
        assert [c._c_words(s) for s in strings] == want, strings
        assert c._c_sum(strings) == sum(want), strings
        parts = ["Head:", Join("\n", strings + ["end"])]
        assert c.count(parts) == len(ref_tok.tokenize(render(parts))), strings


def test_rows_count_equal_full_tokenization(ref_tok):
    from ruler_tasks.constants import NEEDLE
    from ruler_tasks.text import Rows

    r = random.Random(12)
    lits = [tuple(NEEDLE.replace("{type_needle_v}", "numbers").replace("{key}", "{value}").split("{value}")),
            ("A ", " b ", "."), ("", " x ", ""), ("k=", " v=", ";"), ("The ", " and ", " !")]
    c = TokenCounter(ref_tok)
    for trial in range(250):
        lit = r.choice(lits)
        rows = [(_rand_field(r), _rand_field(r)) for _ in range(r.randint(0, 40))]
        sep = r.choice(["\n", " ", "\n\n", "-"])
        parts = [r.choice(["", "Head:", "x\n"]), Rows(sep, lit, rows), r.choice(["", "\nTail?", " t"])]
        text = render(parts)
        assert c.count(parts) == len(ref_tok.tokenize(text)), (lit, rows, sep)
        n = r.randint(0, len(text))
        assert render(truncate(parts, n)) == text[:n]
        assert c.count_prefix(parts, n) == len(ref_tok.tokenize(text[:n])), (lit, rows, sep, n)


@pytest.mark.slow
def test_rows_with_other_tokenizer_families(ref_tok):
    from ruler_tasks.text import Rows

    parts = ["Q:\n", Rows("\n", ("One of the keys for ", " is: ", "."), [("a-b", "123"), ("tam-o'-shanter", "9")] * 20)]
    tok = _byte_level_bpe()
    assert TokenCounter(tok).count(parts) == len(tok.tokenize(render(parts)))
    assert TokenCounter(ref_tok, strategy="full").count(parts) == len(ref_tok.tokenize(render(parts)))


def test_bulk_count_wrong_piece_is_caught(ref_tok, monkeypatch):
    """The bulk path really uses the piece cache: a poisoned piece count changes the result."""
    c = TokenCounter(ref_tok)
    strings = [" fluffy-cat", " 1234567"]
    right = c._c_sum(strings)
    c._word["-"] += 5
    assert c._c_sum(strings) == right + 5


@pytest.mark.slow
def test_rows_digit_columns_and_bulk_paths_equal_full_tokenization(ref_tok):
    """The Rows digit-column shortcut (ASCII digits only), digits cut out in `_c_sum`, and the
    `clean` rest after strings with an unsafe pair around a cut char: all against full tokenization."""
    from ruler_tasks.rng import uuid4_strs
    from ruler_tasks.text import Rows

    c = TokenCounter(ref_tok)
    r = random.Random(13)
    lit = ("One of the special magic numbers for ", " is: ", ".")
    for trial in range(120):
        n = r.randint(2, 60)
        keys = [r.choice(["fluffy-cat", "tam-o'-shanter", "jalapeño-dip", "x-ray", "a'-b", "e-book"])
                for _ in range(n)]
        kind = trial % 4
        if kind == 0:
            vals = [str(r.randint(10**6, 10**7 - 1)) for _ in range(n)]
        elif kind == 1:
            vals = [str(r.randint(0, 10**r.randint(1, 12))) for _ in range(n)]
        elif kind == 2:  # not ASCII digits: no shortcut, still exact
            vals = [str(r.randint(0, 99)) + r.choice(["", "²", "٣"]) for _ in range(n)]
        else:
            keys, vals = uuid4_strs(r, n), uuid4_strs(r, n)
        parts = ["Head:\n", Rows("\n", lit, list(zip(keys, vals))), "\nTail"]
        text = render(parts)
        assert c.count(parts) == len(ref_tok.tokenize(text)), (keys, vals)
        k = r.randint(0, len(text))
        assert c.count_prefix(parts, k) == len(ref_tok.tokenize(text[:k]))
        strings = [" " + x for x in keys + vals]
        nl = len(ref_tok.tokenize("\n"))
        assert c._c_sum(strings) == len(ref_tok.tokenize("\n" + "".join(strings))) - nl


@pytest.mark.slow
def test_digit_column_shortcut_is_used(ref_tok):
    """A column of ASCII-digit fields never reaches `_c_sum` (the shortcut is really taken)."""
    from ruler_tasks.text import Rows

    c = TokenCounter(ref_tok)
    seen = []
    bulk = c._c_sum
    c._c_sum = lambda strings, clean=False: seen.extend(strings) or bulk(strings, clean)
    parts = ["H:", Rows("\n", ("k ", " v ", "."), [("ab", "123"), ("cd", "4567")])]
    assert c.count(parts) == len(ref_tok.tokenize(render(parts)))
    assert seen == [" ab", " cd"]


@pytest.mark.slow
def test_rows_prefix_reuses_block_sums_exactly(ref_tok):
    """`count_prefix` of a large Rows just counted reuses its block sums (`_rows_fields`): every cut
    point, and rows that only look like a prefix (same length, one field changed), match full tokenization."""
    from ruler_tasks.counting import _ROWS_BLOCK
    from ruler_tasks.rng import uuid4_strs
    from ruler_tasks.text import Rows

    c = TokenCounter(ref_tok)
    r = random.Random(14)
    lit = ("One of the special magic uuids for ", " is: ", ".")
    for trial in range(4):
        n = 2 * _ROWS_BLOCK + r.randint(0, 3 * _ROWS_BLOCK)
        if trial % 2:
            rows = list(zip(uuid4_strs(r, n), uuid4_strs(r, n)))
        else:
            rows = [(r.choice(["fluffy-cat", "x-ray", "jalapeño-dip"]), str(r.randint(10**6, 10**7 - 1)))
                    for _ in range(n)]
        parts = ["Head:\n", Rows("\n", lit, rows), "\nTail"]
        text = render(parts)
        assert c.count(parts) == len(ref_tok.tokenize(text))
        assert c._rows_last is not None and c._rows_last[0] == rows
        for k in [r.randint(0, len(text)) for _ in range(6)] + [len(text) - 1, len(text)]:
            assert c.count_prefix(parts, k) == len(ref_tok.tokenize(text[:k])), k
        # a different last field in a prefix-length list: its block sums must not be reused wrongly
        m = r.randint(_ROWS_BLOCK + 1, n)
        other = rows[: m - 1] + [(rows[m - 1][0], rows[m - 1][1] + "ab9")]
        p2 = ["Head:\n", Rows("\n", lit, other)]
        assert c.count(p2) == len(ref_tok.tokenize(render(p2)))
        # the caller changing its list after counting does not change what is reused
        c.count(parts)
        rows[0] = ("changed-key", rows[0][1])
        p3 = ["Head:\n", Rows("\n", lit, rows[:m])]
        assert c.count(p3) == len(ref_tok.tokenize(render(p3)))


def test_rows_prefix_block_sums_are_used(ref_tok):
    """The reuse really happens: a poisoned block sum shows up in the prefix count."""
    from ruler_tasks.counting import _ROWS_BLOCK
    from ruler_tasks.text import Rows

    c = TokenCounter(ref_tok)
    rows = [("key-%d" % i, "v%d" % i) for i in range(3 * _ROWS_BLOCK)]
    parts = ["H:\n", Rows("\n", ("k ", " v ", "."), rows)]
    text = render(parts)
    c.count(parts)
    k = len(render(["H:\n", Rows("\n", ("k ", " v ", "."), rows[: 2 * _ROWS_BLOCK + 5])]))
    right = len(ref_tok.tokenize(text[:k]))
    assert c.count_prefix(parts, k) == right
    c._rows_last[1][2] += 7
    assert c.count_prefix(parts, k) == right + 7


def test_choices_strs_equal_per_call_draws():
    """`choices_strs` (bulk `random()` values from `getrandbits`) gives `rng.choices`' strings and state."""
    import string

    from ruler_tasks.rng import _choices_match, choices_strs

    assert _choices_match()
    for seed, k, n in [(0, 6, 2621), (1, 1, 1), (2, 3, 7), (3, 10, 500), (4, 6, 0)]:
        r1, r2 = random.Random(seed), random.Random(seed)
        r1.random(), r2.random()  # not at a fresh state
        want = ["".join(r1.choices(string.ascii_lowercase, k=k)) for _ in range(n)]
        assert choices_strs(r2, string.ascii_lowercase, k, n) == want
        assert r1.getstate() == r2.getstate()
        assert r1.random() == r2.random()


@pytest.mark.parametrize("lead", [False, True])
def test_joins_with_empty_items_equal_full_tokenization(ref_tok, lead):
    """NIAH's essay haystack has an empty chunk where a needle sits at depth 0 or two share a depth: it is counted
    item by item like the rest, and still exactly."""
    sentences = ["The essay goes on.", "It says (something) again!", "Numbers 1234567 and uuids 4f1b-9c2e.",
                 "Quotes: \"yes.\"", "Last one."] * 30
    rng = random.Random(5)
    c = TokenCounter(ref_tok)
    for _ in range(15):
        items = list(sentences)
        for _ in range(rng.randrange(1, 6)):
            items.insert(rng.randrange(len(items) + 1), "")
        if rng.random() < 0.3:
            items[0] = ""
        for sep in (" ", "\n", " | "):
            parts = ["Before.", Join(sep, items, lead=lead), "After."]
            assert c.count(parts) == len(ref_tok(render(parts), add_special_tokens=False).input_ids)
