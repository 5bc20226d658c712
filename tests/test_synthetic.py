"""The built-in synthetic corpus: deterministic, sized as asked, and every answer really is in its haystack.

The retrievability checks parse each document independently of how it was generated: the needles /
assignments / word counts are read back from the text and the answer is recomputed from them.
"""

from __future__ import annotations

import itertools
import random
import re
import statistics
from collections import Counter

import pytest

from longctx.core.errors import InputError
from longctx.data.synthetic import KINDS, MIN_LENGTH, documents
from longctx.data.synthetic_kinds import approx_tokens


def take(kind, n, seed=0, length_tokens=None):
    return list(itertools.islice(documents(kind, seed, length_tokens=length_tokens), n))


def test_default_kind_is_mixed_and_stream_is_deterministic():
    assert KINDS[0] == "mixed"
    assert take(KINDS[0], 5) == list(itertools.islice(documents(), 5))
    for kind in KINDS:
        assert take(kind, 5, seed=3, length_tokens=512) == take(kind, 5, seed=3, length_tokens=512)
        assert take(kind, 5, seed=3, length_tokens=512) != take(kind, 5, seed=4, length_tokens=512)


def test_kinds_differ():
    firsts = {kind: take(kind, 20, length_tokens=512) for kind in KINDS}
    assert len({tuple(docs) for docs in firsts.values()}) == len(KINDS)
    assert all(kind_of(d) == "vt" for d in firsts["vt"])
    assert all(kind_of(d) == "cwe" for d in firsts["cwe"])
    assert all(kind_of(d) == "fwe" for d in firsts["fwe"])
    assert all(kind_of(d) == "niah" for d in firsts["niah"])
    assert len({kind_of(d) for d in take("mixed", 100, length_tokens=512)}) == 4


@pytest.mark.parametrize("bad", ["passkey", "", "NIAH"])
def test_unknown_kind_is_an_input_error(bad):
    with pytest.raises(InputError, match="unknown synthetic kind .*mixed, niah, vt, cwe, fwe"):
        documents(bad)


@pytest.mark.parametrize("bad", [0, -5, MIN_LENGTH - 1, 1.5, "1k", True])
def test_bad_length_is_an_input_error(bad):
    with pytest.raises(InputError, match="synthetic document length"):
        documents("niah", length_tokens=bad)


def test_length_is_roughly_honoured(reference_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(reference_tokenizer_dir)
    for length in (512, 1024, 4096):
        docs = take("mixed", 40, seed=1, length_tokens=length)
        estimates = [approx_tokens(d) for d in docs]
        assert 0.7 * length <= statistics.mean(estimates) <= length
        real = [len(tok.tokenize(d)) for d in docs]
        # Documents are made to fit a sequence of `length` tokens of the reference tokenizer ...
        assert max(real) <= length
        # ... without being much shorter than asked.
        assert statistics.mean(real) >= 0.5 * length
    # At the shortest length the question and answer alone are most of a document (never cut off).
    shortest = [len(tok.tokenize(d)) for d in take("mixed", 40, seed=1, length_tokens=MIN_LENGTH)]
    assert statistics.mean(shortest) <= 1.5 * MIN_LENGTH and max(shortest) <= 2.5 * MIN_LENGTH
    natural = take("mixed", 20, seed=1)
    assert statistics.mean(approx_tokens(d) for d in natural) > 700  # NATURAL_LENGTH = 1024


# --- reading the answers back from the text ------------------------------------------------------------

def kind_of(doc: str) -> str:
    if re.search(r"^VAR [A-Z]{5} = ", doc, re.M):
        return "vt"
    if "coded" in doc:
        return "fwe"
    if re.search(r"^1\. [a-z]+ 2\. ", doc, re.M):
        return "cwe"
    return "niah"


NEEDLE_FORMS = [  # (regex, group of the key, group of the value)
    (r"One of the special magic \w+ for ([\w-]+) is: ([\w-]+)\.", 1, 2),
    (r"The \w+ for ([\w-]+) is ([\w-]+)\.", 1, 2),
    (r"Note: ([\w-]+) has the \w+ ([\w-]+)\.", 1, 2),
    (r"The secret \w+ of ([\w-]+) is ([\w-]+)\.", 1, 2),
]


def check_niah(doc: str):
    lines = doc.split("\n")
    first_question = next(i for i in range(len(lines)) if all("?" in line for line in lines[i:]))
    body, questions = "\n".join(lines[:first_question]), lines[first_question:]
    needles: dict[str, list[str]] = {}
    for pattern, k, v in NEEDLE_FORMS:
        for m in re.finditer(pattern, body):
            needles.setdefault(m.group(k), []).append(m.group(v))
    assert needles and questions, doc
    for line in questions:
        question, answer = line.split("?", 1)
        asked = [key for key in needles if re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", question)]
        assert asked, line
        for key in needles:
            for value in needles[key]:
                assert (value in answer) == (key in asked), (key, value, line)
        # Several values or queries are answered in order of the queries, then of the text.
        expected = [v for key in sorted(asked, key=question.index) for v in needles[key]]
        assert expected == sorted(expected, key=answer.index)


def check_vt(doc: str):
    assign = dict(re.findall(r"^VAR ([A-Z]{5}) = (\d+|VAR [A-Z]{5})$", doc, re.M))

    def resolve(name):
        src = assign[name]
        return resolve(src[4:]) if src.startswith("VAR ") else src

    value = re.search(r"assigned the value (\d+)|holding (\d+)", doc)
    value = value.group(1) or value.group(2)
    answer = re.findall(r"[A-Z]{5}", doc.rsplit("\n", 1)[1].rsplit(value, 1)[1])
    assert answer and sorted(answer) == sorted(n for n in assign if resolve(n) == value), doc
    # In chain order: each name after the first is assigned from the one before it.
    assert all(assign[b] == f"VAR {a}" for a, b in zip(answer, answer[1:]))


def check_cwe(doc: str):
    _, listing, tail = doc.split("\n")
    counts = Counter(re.findall(r"\d+\. ([a-z]+)", listing))
    assert [int(i) for i in re.findall(r"(\d+)\. ", listing)] == list(range(1, sum(counts.values()) + 1))
    n = int(re.search(r"(\d+) (most common|words are repeated)", tail).group(1))
    answer = re.findall(r"[a-z]+", tail.split(":")[-1] if ":" in tail else tail.split("They are")[-1])
    assert len(answer) == n == len(set(answer))
    others = [c for w, c in counts.items() if w not in answer]
    assert min(counts[w] for w in answer) > max(others, default=0)


def check_fwe(doc: str):
    text, tail = doc.split("\n")
    words = re.findall(r"\b[a-z]{6}\b", text.split("coded words.", 1)[-1].split("coded text.", 1)[-1])
    answer = re.findall(r"\b[a-z]{6}\b", tail.split(" are", 1)[-1].rsplit(":", 1)[-1])
    assert len(answer) == 3
    ranked = Counter(words).most_common()
    assert [w for w, _ in ranked[:3]] == answer
    assert ranked[0][1] > ranked[1][1] > ranked[2][1] > (ranked[3][1] if len(ranked) > 3 else 0)


CHECKS = {"niah": check_niah, "vt": check_vt, "cwe": check_cwe, "fwe": check_fwe}


@pytest.mark.parametrize("length", [MIN_LENGTH, 1024, 3000])
def test_every_answer_is_retrievable_from_its_document(length):
    seen = Counter()
    for doc in take("mixed", 150, seed=7, length_tokens=length):
        kind = kind_of(doc)
        CHECKS[kind](doc)
        seen[kind] += 1
    assert set(seen) == set(CHECKS)


def test_checks_catch_a_wrong_answer():
    """The parsers above can fail: a document whose answer is swapped for another value is rejected."""
    doc = next(d for d in documents("niah", 2, length_tokens=512) if "is: " in d and "numbers" in d
               and d.count("is: ") >= 2)
    values = re.findall(r"is: (\d+)\.", doc)
    body, tail = doc.split("\nWhat is", 1)
    tail = "\nWhat is" + tail
    right = next(v for v in values if v in tail)
    wrong = next(v for v in values if v != right)
    check_niah(doc)
    with pytest.raises(AssertionError):
        check_niah(body + "\n" + tail.replace(right, wrong))


def test_ruler_phrasing_dominates_and_other_phrasings_exist():
    docs = take("niah", 200, seed=5, length_tokens=512)
    ruler = [d for d in docs if "mentioned in the provided text" in d]
    assert 0.6 < len(ruler) / len(docs) < 0.9
    singular = [d for d in ruler if d.startswith("A special magic number is hidden")]
    assert any(re.search(r"mentioned in the provided text is \d{7}\.$", d) for d in singular)
    follow_ups = [d for d in ruler if d.count("?") > 1]
    assert 0.1 < len(follow_ups) / len(docs) < 0.5


# --- dense recall (pretraining from scratch) ------------------------------------------------------------

RECALL_ANSWERS = [  # every line after the needles: a repeated needle or RULER's answer sentence
    r"One of the special magic \w+ for ([\w-]+) is: ([\w-]+)\.",
    r"(?:What is the special magic \w+ for [\w-]+ mentioned in the provided text\? )?"
    r"The special magic \w+ for ([\w-]+) mentioned in the provided text is ([\w-]+)\.",
]


def check_recall(doc: str) -> int:
    """Every answer line gives the value its key's needle gave; returns the number of answers."""
    head, body, *answers = doc.split("\n")
    assert head.startswith("Some special magic") and answers, doc
    needles = dict(re.findall(RECALL_ANSWERS[0], body))
    assert needles and len(needles) == body.count("One of the special magic"), body
    for line in answers:
        match = next(m for m in (re.fullmatch(p, line) for p in RECALL_ANSWERS) if m)
        assert needles[match.group(1)] == match.group(2), line
    assert len({re.fullmatch(RECALL_ANSWERS[0], a) or a for a in answers}) == len(answers)  # each key once
    return len(answers)


@pytest.mark.parametrize("length", [MIN_LENGTH, 256, 1024])
def test_recall_answers_are_retrievable_and_dense(length):
    docs = take("recall", 60, seed=2, length_tokens=length)
    answers = [check_recall(d) for d in docs]
    # Many retrievals per document: about one per 90 estimated tokens, most needles asked about.
    assert statistics.mean(answers) >= length / 128
    needles = sum(d.split("\n")[1].count("is: ") for d in docs)
    assert sum(answers) >= 0.75 * needles
    lines = [line for d in docs for line in d.split("\n")[2:]]
    ruler = [line for line in lines if "mentioned in the provided text is" in line]
    assert 0.3 < len(ruler) / len(lines) < 0.9  # both phrasings are common
    assert any("?" in line for line in ruler) and any("?" not in line for line in ruler)
    assert statistics.mean(approx_tokens(d) for d in docs) <= length


def test_recall_check_catches_a_wrong_answer():
    doc = next(d for d in documents("recall", 3, length_tokens=512) if d.count("is: ") >= 2)
    values = re.findall(r"is: ([\w-]+)\.", doc.split("\n")[1])
    last = doc.rsplit("\n", 1)[1]
    right = next(v for v in values if last.endswith(f" {v}."))
    wrong = next(v for v in values if v != right)
    check_recall(doc)
    with pytest.raises(AssertionError):
        check_recall(doc[: -len(right) - 1] + wrong + ".")


def is_copy(doc: str) -> bool:
    return set(Counter(doc.split("\n")).values()) == {2}


def check_copy(doc: str) -> list[int]:
    """Every line appears exactly twice, the second time after the first; returns the gaps in lines."""
    lines = doc.split("\n")
    first: dict[str, int] = {}
    gaps = []
    for i, line in enumerate(lines):
        if line in first:
            gaps.append(i - first[line] - 1)
        else:
            first[line] = i
    assert Counter(Counter(lines).values()) == {2: len(lines) // 2}, doc
    return gaps


@pytest.mark.parametrize("length", [MIN_LENGTH, 1024])
def test_copy_lines_repeat_once_at_varying_distances_and_lengths(length, reference_tokenizer_dir):
    from transformers import AutoTokenizer

    docs = take("copy", 60, seed=5, length_tokens=length)
    gaps = [g for d in docs for g in check_copy(d)]
    lines = [line for d in docs for line in d.split("\n")]
    sizes = {len(line.split()) for line in lines}
    # Lines of many lengths: with one fixed length a model could predict a repeat by looking a fixed
    # distance back instead of finding the current word earlier (what RULER needs). At 128 tokens a document's
    # budget is 102..128, so a line holds 8..15 items (16 only at a budget of exactly 128): 8 sizes is all of them.
    assert min(sizes) <= 10 and max(sizes) >= min(36, length // 10) and len(sizes) >= 8
    assert any(re.fullmatch(r"\d+", w) for line in lines for w in line.split())  # numbers to copy too
    tok = AutoTokenizer.from_pretrained(reference_tokenizer_dir)
    real = [len(tok.tokenize(d)) for d in docs]
    assert max(real) <= 1.1 * length  # random letters are estimated as about one token per two
    if length >= 1024:
        assert statistics.mean(real) < 400  # mostly short documents, whatever the length asked
        assert 0 in gaps and max(gaps) >= 2  # repeated right away and after other lines
    assert len(set(lines)) == len(lines) // 2  # no line is repeated by chance across documents


def test_copy_check_catches_a_line_not_repeated():
    doc = next(d for d in documents("copy", 6, length_tokens=1024) if d.count("\n") >= 3)
    check_copy(doc)
    with pytest.raises(AssertionError):
        check_copy(doc.rsplit("\n", 1)[0])


def is_copy_far(doc: str) -> bool:
    return bool(re.search(r"^[a-z0-9 ]+$", doc, re.M)) and "special magic" not in doc


def check_copy_far(doc: str) -> int:
    """Random lines in the noise haystack, each exactly twice, far apart; returns the token-ish distance."""
    lines = doc.split("\n")
    copied = [i for i, line in enumerate(lines) if re.fullmatch(r"[a-z0-9 ]+", line)]
    assert copied and all(re.fullmatch(r"([A-Z][a-z ]+\. ?)+", lines[i].strip()) for i in range(len(lines))
                          if i not in copied), doc
    assert set(Counter(lines[i] for i in copied).values()) == {2}, doc
    return max(len(" ".join(lines[i + 1:j]).split()) for i in copied for j in copied
               if j > i and lines[i] == lines[j])


def test_copy_far_puts_repeats_anywhere_in_a_haystack():
    from longctx.data.synthetic_kinds import _copy_far

    rng = random.Random(3)
    spans = [check_copy_far(_copy_far(rng, 1024)) for _ in range(60)]
    assert max(spans) > 300 and min(spans) < 100  # near and across most of a 1k document


def test_pretrain_mixes_copy_and_recall_with_the_ruler_kinds():
    seen = Counter()
    for doc in take("pretrain", 300, seed=4, length_tokens=1024):
        kind = "copy" if is_copy(doc) else "copy_far" if is_copy_far(doc) else kind_of(doc)
        try:  # a few niah documents (several keys, one-line haystack) are also valid recall documents
            check_recall(doc)
            kind = "recall"
        except (AssertionError, StopIteration, KeyError, ValueError):
            {**CHECKS, "copy": check_copy, "copy_far": check_copy_far}[kind](doc)
        seen[kind] += 1
    assert set(seen) == {"copy", "copy_far", "recall", "niah", "vt", "cwe", "fwe"}
    assert 0.2 < seen["copy_far"] / 300 < 0.4 and 0.15 < seen["recall"] / 300 < 0.35
    assert seen["niah"] > seen["copy"] > seen["vt"]


def test_bpe_digit_groups_read_a_number_the_same_wherever_it_stands(tmp_path):
    """`train_bpe_tokenizer(digit_group=n)` cuts numbers into runs of at most n digits before BPE, so a value
    is the same tokens in its needle and in its answer; without it BPE chunks digits as it learnt to."""
    from transformers import AutoTokenizer

    from longctx.init.bpe import train_bpe_tokenizer

    rng = random.Random(0)
    corpus = take("recall", 40, seed=1, length_tokens=512) + [str(rng.randint(10**6, 10**7)) for _ in range(3000)]
    expected = {1: list("4865868"), 2: ["48", "65", "86", "8"], None: None}
    for group, digits_expected in expected.items():
        out = tmp_path / str(group)
        out.mkdir()
        tok = AutoTokenizer.from_pretrained(train_bpe_tokenizer(out, 600, corpus, digit_group=group))
        seen = []
        for text in ("for abundant-pond is: 4865868.", "(4865868)", "text is 4865868"):
            pieces = tok.tokenize(text)
            assert tok.convert_tokens_to_string(pieces) == text
            seen.append([p for p in pieces if any(c.isdigit() for c in p)])
        if digits_expected is None:
            assert list("4865868") not in seen and ["48", "65", "86", "8"] not in seen, seen
        else:
            assert seen == [digits_expected] * 3, seen


def test_backcopy_follows_its_bigram_table_and_copies_after_every_trigger():
    """`backcopy` (Guo et al. 2024's Bigram-Backcopy): every word is a successor of the one before it in the fixed
    table, except right after a trigger, where it is the word before the trigger; the table is the same for every
    seed (held-out documents follow the trained bigrams); most words are not after a trigger."""
    from longctx.data.synthetic_kinds import BACKCOPY_TRIGGERS, BACKCOPY_WORDS, _bigram_table

    table = _bigram_table()
    assert set(table) == set(BACKCOPY_WORDS + BACKCOPY_TRIGGERS) and all(len(set(v)) == 4 for v in table.values())
    copies = words_seen = 0
    for seed in (0, 1):
        for doc in take("backcopy", 5, seed=seed, length_tokens=512):
            words = doc.split(" ")
            assert 0.8 * 512 <= len(words) <= 512 and words[0] in BACKCOPY_WORDS
            for i in range(1, len(words)):
                if words[i - 1] in BACKCOPY_TRIGGERS and i > 1:
                    assert words[i] == words[i - 2], (seed, i)
                    copies += 1
                else:
                    assert words[i] in table[words[i - 1]], (seed, i)
            words_seen += len(words)
    assert 0.02 < copies / words_seen < 0.3


def test_bpe_bos_puts_its_bos_before_every_text(tmp_path):
    """`train_bpe_tokenizer(bos=True)` adds `<s>` to every text as Llama's tokenizer does (what `init --bpe-bos`
    writes); without it the tokenizer adds nothing."""
    from transformers import AutoTokenizer

    from longctx.core.special_tokens import special_tokens_added
    from longctx.init.bpe import train_bpe_tokenizer

    corpus = take("backcopy", 20, length_tokens=256)
    for bos in (False, True):
        tok = AutoTokenizer.from_pretrained(train_bpe_tokenizer(tmp_path / str(bos), 400, corpus, bos=bos))
        ids = tok("cat air").input_ids
        assert special_tokens_added(tok) == int(bos)
        assert (ids[0] == tok.bos_token_id) == bos and tok.bos_token_id == 1
        assert tok.decode(ids, skip_special_tokens=True) == "cat air"
