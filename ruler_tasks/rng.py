"""Random-number helpers that reproduce RULER's use of Python's and NumPy's RNGs.

RULER seeds the *global* `random` and `numpy.random` and draws from them; we use private
`random.Random(seed)` / `numpy.random.RandomState(seed)` instances, which give the same streams
without touching the process-global RNGs.

RULER also shuffles many lists with a fresh `random.Random(seed)`: the permutation that applies
depends only on the seed and the list length, so it is computed once and reused.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from operator import itemgetter

_PERMS: OrderedDict[tuple[int, int], tuple[int, ...]] = OrderedDict()
_MAX_PERMS = 64


def fixed_permutation(seed: int, n: int) -> tuple[int, ...]:
    """p such that `random.Random(seed).shuffle(x)` leaves `x` equal to `[x0[j] for j in p]`."""
    key = (seed, n)
    p = _PERMS.get(key)
    if p is None:
        idx = list(range(n))
        random.Random(seed).shuffle(idx)
        p = tuple(idx)
        _PERMS[key] = p
        if len(_PERMS) > _MAX_PERMS:
            _PERMS.popitem(last=False)
    else:
        _PERMS.move_to_end(key)
    return p


def fixed_shuffle(seed: int, items: list) -> list:
    """A new list: `items` shuffled as `random.Random(seed).shuffle` would shuffle it."""
    n = len(items)
    if n < 2:
        return list(items)
    p = fixed_permutation(seed, n)
    return list(itemgetter(*p)(items))


def _below_draw(rng: random.Random, n: int, then=None):
    """A function returning `then(rng._randbelow(n))` (or the bare draw), with CPython's
    `_randbelow_with_getrandbits` inlined: k = n.bit_length() bits per try, retried while >= n."""
    getrandbits, k = rng.getrandbits, n.bit_length()
    if then is None:
        def draw():
            r = getrandbits(k)
            while r >= n:
                r = getrandbits(k)
            return r
    else:
        def draw():
            r = getrandbits(k)
            while r >= n:
                r = getrandbits(k)
            return then(r)
    return draw


def _draws_match() -> bool:
    """Whether `randint(a, b)` is `a + _randbelow(b - a + 1)` and `choice(s)` is `s[_randbelow(len(s))]`,
    with `_randbelow` as `_below_draw` computes it (CPython's `random`); checked on a stream, not assumed."""
    r1, r2 = random.Random(7), random.Random(7)
    seq = range(3, 1000, 7)
    num, pick = _below_draw(r2, 10**7 - 9), _below_draw(r2, len(seq))
    return (type(r1)._randbelow is random.Random._randbelow_with_getrandbits
            and all(r1.randint(10, 10**7) == 10 + num() and r1.choice(seq) == seq[pick()] for _ in range(500))
            and r1.getstate() == r2.getstate())


_FAST_DRAWS = _draws_match()


def randint_draw(rng: random.Random, a: int, b: int):
    """A function making the draw `rng.randint(a, b)` (same value, same RNG state), with less overhead."""
    if not _FAST_DRAWS or type(rng) is not random.Random or b < a:  # pragma: no cover
        return lambda: rng.randint(a, b)
    return _below_draw(rng, b - a + 1, a.__add__)


def choice_draw(rng: random.Random, seq):
    """A function making the draw `rng.choice(seq)` (same value, same RNG state), with less overhead."""
    if not _FAST_DRAWS or type(rng) is not random.Random or not len(seq):  # pragma: no cover
        return lambda: rng.choice(seq)
    return _below_draw(rng, len(seq), getattr(seq, "at", seq.__getitem__))  # `at`: unchecked getitem


def uuid4_str(bits: int) -> str:
    """`str(uuid.UUID(int=bits, version=4))` for a 128-bit `bits`, without building the UUID."""
    bits = (bits & ~(0xC000 << 48)) | (0x8000 << 48)  # variant RFC 4122
    bits = (bits & ~(0xF000 << 64)) | (4 << 76)  # version 4
    h = f"{bits:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_HEX = None


def uuid4_strs(rng: random.Random, n: int) -> list[str]:
    """`[str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]`, same RNG state after.

    Exact because `getrandbits(k)` with k a multiple of 32 fills its result with k/32 fresh 32-bit
    words, lowest word first: `getrandbits(128 * n)` draws the same words, in the same order, as n
    calls of `getrandbits(128)`, and its i-th 128-bit slice (from the low end) is the i-th call's
    value. The slices are formatted in bulk with NumPy (`tests/test_ruler_counting.py` compares with
    the per-call draws and `uuid.UUID`).
    """
    global _HEX
    if n <= 0:
        return []
    if type(rng) is not random.Random:  # pragma: no cover - a subclass may draw differently
        return [uuid4_str(rng.getrandbits(128)) for _ in range(n)]
    import numpy as np

    if _HEX is None:
        _HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    b = np.frombuffer(rng.getrandbits(128 * n).to_bytes(16 * n, "little"), dtype=np.uint8)
    b = b.reshape(n, 16)[:, ::-1].copy()  # each value's bytes, most significant first
    b[:, 6] = (b[:, 6] & 0x0F) | 0x40  # version 4
    b[:, 8] = (b[:, 8] & 0x3F) | 0x80  # variant RFC 4122
    out = np.full((n, 36), ord("-"), dtype=np.uint8)
    hexd = np.empty((n, 32), dtype=np.uint8)
    hexd[:, 0::2] = _HEX[b >> 4]
    hexd[:, 1::2] = _HEX[b & 0x0F]
    out[:, 0:8], out[:, 9:13], out[:, 14:18] = hexd[:, 0:8], hexd[:, 8:12], hexd[:, 12:16]
    out[:, 19:23], out[:, 24:36] = hexd[:, 16:20], hexd[:, 20:32]
    s = out.tobytes().decode("ascii")
    return [s[i:i + 36] for i in range(0, 36 * n, 36)]


def _choices_match() -> bool:
    """Whether `choices(pop, k=k)` is `[pop[floor(random() * len(pop))] ...]` with `random()` built from
    two 32-bit words as `random_words` computes it (CPython's `random`); checked on a stream, not assumed."""
    r1, r2 = random.Random(9), random.Random(9)
    want = [x for _ in range(50) for x in r1.choices(range(26), k=6)]
    got = (np_random_floats(r2, 300) * 26.0).astype(int).tolist()
    return type(r1).random is random.Random.random and want == got and r1.getstate() == r2.getstate()


def np_random_floats(rng: random.Random, n: int):
    """NumPy array of the next n `rng.random()` values (same RNG state after).

    Exact: CPython's `random()` takes two 32-bit words a, b and returns
    `((a >> 5) * 67108864.0 + (b >> 6)) * (1.0 / 9007199254740992.0)`; `getrandbits(64 * n)` draws the
    same 2n words in the same order (lowest first), and NumPy does the same float64 operations.
    """
    import numpy as np

    w = np.frombuffer(rng.getrandbits(64 * n).to_bytes(8 * n, "little"), dtype="<u4").astype(np.float64)
    a, b = np.floor(w[0::2] / 32.0), np.floor(w[1::2] / 64.0)  # a >> 5, b >> 6 (exact in float64)
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)


_FAST_CHOICES = None


def choices_strs(rng: random.Random, population: str, k: int, n: int) -> list[str]:
    """`["".join(rng.choices(population, k=k)) for _ in range(n)]`, same values and RNG state after."""
    global _FAST_CHOICES
    if _FAST_CHOICES is None:
        _FAST_CHOICES = _choices_match()
    if not _FAST_CHOICES or type(rng) is not random.Random or n <= 0 or k <= 0:
        return ["".join(rng.choices(population, k=k)) for _ in range(max(n, 0))]
    idx = (np_random_floats(rng, n * k) * float(len(population))).astype(int)  # floor: values >= 0
    pop = list(population)
    chars = itemgetter(*idx.tolist())(pop) if n * k > 1 else (pop[int(idx[0])],)
    s = "".join(chars)
    return [s[i:i + k] for i in range(0, n * k, k)]


def below_rounds(rng: random.Random, ns: tuple[int, ...], rounds: int):
    """`rounds` rounds of `rng._randbelow(n)` for each n in `ns` in turn, as NumPy arrays (one per n),
    with the same values and RNG state after as the per-call draws (`randint_draw`/`choice_draw`).

    Exact because each try of a draw below n < 2**32 takes one 32-bit word w and yields
    `w >> (32 - n.bit_length())`, accepted when below n; `getrandbits(32 * M)` draws the same words in
    the same order (lowest first). Which word each draw ends on is a chain (a draw starts one word after
    the previous one ended), followed for all rounds at once by pointer doubling. The words are drawn
    from a copy of the state; the real state is then advanced by exactly the words used.
    """
    import numpy as np

    ks = [n.bit_length() for n in ns]
    if not _FAST_DRAWS or type(rng) is not random.Random or rounds <= 0 or not all(0 < n < 2**32 for n in ns):
        draws = [_below_draw(rng, n) for n in ns]  # pragma: no cover - exotic RNGs or sizes
        cols = [[d() for d in draws] for _ in range(max(rounds, 0))]
        return [np.array([c[j] for c in cols], dtype=np.int64) for j in range(len(ns))]
    per_round = sum((1 << k) / n for n, k in zip(ns, ks))  # expected words per round
    m = int(rounds * per_round * 1.1) + 64
    state = rng.getstate()
    while True:
        w = np.frombuffer(rng.getrandbits(32 * m).to_bytes(4 * m, "little"), dtype="<u4").astype(np.int64)
        rng.setstate(state)
        idx = np.arange(m + 2)
        step = idx  # step[p]: the word after the round that starts at word p (m, m + 1: ran out)
        nexts = []
        for n, k in zip(ns, ks):
            ok = np.append((w >> (32 - k)) < n, [True, True])
            # nxt[p] = first accepted word at or after p (m if none before the end)
            nxt = np.minimum.accumulate(np.where(ok, idx, m + 1)[::-1])[::-1]
            nxt = np.minimum(nxt, m)
            nexts.append(nxt)
            step = np.minimum(nxt[step] + 1, m + 1)
        starts = np.zeros(rounds, dtype=np.int64)
        r = np.arange(rounds)
        jump, bit = step, 0
        while (1 << bit) < rounds:
            sel = ((r >> bit) & 1).astype(bool)
            starts[sel] = jump[starts[sel]]
            jump = jump[jump]
            bit += 1
        end = step[starts[-1]]
        if end <= m:
            break
        m *= 2
    out, pos = [], starts
    for k, nxt in zip(ks, nexts):
        at = nxt[pos]
        out.append(w[at] >> (32 - k))
        pos = at + 1
    if end:
        rng.getrandbits(32 * int(end))
    return out
