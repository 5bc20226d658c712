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

_PERMS: "OrderedDict[tuple[int, int], tuple[int, ...]]" = OrderedDict()
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
