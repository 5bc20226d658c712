"""Word lists and sentence splitting equal what upstream RULER builds
(niah.py: sorted(set(adj-noun)); nltk sent_tokenize with punkt_tab English)."""

from __future__ import annotations

import json
import random
import re

import pytest
from ruler_helpers import FIXTURE_DATA

from ruler_tasks.punkt import sent_tokenize
from ruler_tasks.rng import fixed_permutation, fixed_shuffle
from ruler_tasks.words import AdjNounKeys, niah_keys, wonderwords_lists


@pytest.mark.slow
def test_adj_noun_keys_equal_materialised_list():
    nouns, adjs, _ = wonderwords_lists()
    full = sorted(set(f"{a}-{n}" for a in adjs for n in nouns))
    keys = niah_keys()
    assert len(keys) == len(full) == 6171620  # wonderwords 3.0.1
    assert all(keys[i] == full[i] for i in range(len(full)))


def test_adj_noun_keys_interleaving_small():
    adjs = ["blue", "blue-eyed", "blue green", "old", "old-fashioned", "x"]
    nouns = ["cat", "eyed-cat", "dog", "a b", "fashioned-dog"]
    keys = AdjNounKeys(adjs, nouns)
    full = sorted(set(f"{a}-{n}" for a in adjs for n in nouns))
    assert list(keys) == full
    rng1, rng2 = random.Random(3), random.Random(3)
    assert [rng1.choice(keys) for _ in range(50)] == [rng2.choice(full) for _ in range(50)]


def test_fixed_shuffle_equals_random_shuffle():
    for n in (0, 1, 2, 7, 1000):
        x = [f"w{i}" for i in range(n)]
        y = list(x)
        random.Random(42).shuffle(y)
        assert fixed_shuffle(42, x) == y
    assert fixed_permutation(1, 5) != fixed_permutation(2, 5)


def test_punkt_offline_ignores_nltk_data(tmp_path, monkeypatch):
    monkeypatch.setenv("NLTK_DATA", str(tmp_path))  # empty: nothing to find there
    text = "Mr. Smith went to Washington. He arrived at 5 p.m. on Jan. 3. It rained! Did it? Yes."
    assert sent_tokenize(text) == ["Mr. Smith went to Washington.", "He arrived at 5 p.m. on Jan. 3.",
                                   "It rained!", "Did it?", "Yes."]


def test_punkt_on_essay_fixture_is_stable():
    essay = json.loads((FIXTURE_DATA / "essay.json").read_text())["text"]
    text = " ".join(re.sub(r"\s+", " ", essay).split(" ")[:3000]).strip()
    sents = sent_tokenize(text)
    assert " ".join(sents) == text  # punkt only splits at spaces here
    assert 200 < len(sents) < 400


def test_fast_draws_equal_random_draws():
    import random
    import uuid

    from ruler_tasks.rng import choice_draw, randint_draw, uuid4_str

    keys = niah_keys()
    a, b = random.Random(3), random.Random(3)
    num, key = randint_draw(b, 10**6, 10**7 - 1), choice_draw(b, keys)
    for _ in range(2000):
        assert a.randint(10**6, 10**7 - 1) == num()
        assert a.choice(keys) == key()
    assert a.getstate() == b.getstate()
    for _ in range(2000):
        bits = a.getrandbits(128)
        assert uuid4_str(bits) == str(uuid.UUID(int=bits, version=4))


def test_bulk_uuid_draws_equal_per_call_draws():
    """`uuid4_strs(rng, n)`: the strings and the RNG state of n calls of `uuid.UUID(int=getrandbits(128))`."""
    import random
    import uuid

    from ruler_tasks.rng import uuid4_strs

    for n in (0, 1, 2, 3, 17, 1000):
        a, b = random.Random(n), random.Random(n)
        a.random()  # any position in the stream
        b.random()
        want = [str(uuid.UUID(int=a.getrandbits(128), version=4)) for _ in range(n)]
        assert uuid4_strs(b, n) == want
        assert a.getstate() == b.getstate()
        assert a.random() == b.random()


def test_bulk_interleaved_draws_equal_per_call_draws():
    """`below_rounds` (niah_multikey_2's haystack rows in bulk): the values and RNG state of per-call
    `rng.choice(keys)` / `rng.randint(10**6, 10**7 - 1)` draws, interleaved key then value, as upstream."""
    import random

    import numpy as np

    from ruler_tasks.rng import below_rounds

    keys = niah_keys()
    for seed, rounds in [(0, 1), (1, 2), (2, 37), (3, 5300)]:
        a, b = random.Random(seed), random.Random(seed)
        a.random(), b.random()  # any position in the stream
        want = [(a.choice(keys), a.randint(10**6, 10**7 - 1)) for _ in range(rounds)]
        k, v = below_rounds(b, (len(keys), 9 * 10**6), rounds)
        assert list(zip(keys.take(k), (v + 10**6).tolist())) == want
        assert a.getstate() == b.getstate()
        assert a.random() == b.random()
    # sizes with rare acceptance (n just above a power of two), 1, and near 2**32; three draws per round
    for seed in range(5):
        ns = (2**20 + 1, 1, 2**32 - 3)
        a, b = random.Random(seed), random.Random(seed)
        want = [[a.randrange(n) for n in ns] for _ in range(300)]
        got = below_rounds(b, ns, 300)
        assert np.array_equal(np.stack(got, axis=1), np.array(want))
        assert a.getstate() == b.getstate()
