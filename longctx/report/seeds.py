"""Statistics across seeds: one model trained (or extended) with k seeds is measured k times, and what a sweep
supports is about the model, not one seed's run.

A seed's score (RULER, or a sinks value) varies for two reasons: the seed itself (initialisation, data order)
and the samples it was measured on. Their sum is what the k seed scores vary by, so the interval is the one of
a mean of k independent draws of it: the Student t interval mean ± t(k-1) · sd / sqrt(k) on the seed scores
(under normality it is exact for both sources together; with k = 3 its t(2) quantile, 4.30, is what pays for
the sd estimated from three values). On simulated 0/1 scores with three seeds it covers 93.6-95.9% whether the
seed or the samples dominate (tests/test_stats_seeds.py; 97-98% with no seed effect on 8 samples a seed, where
equal seed scores are common and the pooled interval below is taken). Where every seed scored the same (three
scores of 0.00 on a handful of samples), sd is 0 and that interval a point, so there the pooled interval of every
seed's samples together (`longctx.report.stats`, the seeds as strata) is taken instead; `method` says which one
it is. (Taking the wider of the two everywhere would over-cover, 98-99% where the samples dominate.)

The difference of two models is paired by seed (seed s of one against seed s of the other: the same data order
and, where shapes agree, the same initial weights): the mean of the k per-seed differences, its t interval and
the two-sided paired t-test p (k - 1 degrees of freedom); where the per-seed differences do not vary, the pooled
difference of the samples (its interval and p) instead. A sign-flip permutation test across seeds cannot reach
p < 0.25 with three seeds, which is why the t-test is used here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from longctx.report.stats import LEVEL

T_ACROSS_SEEDS = "t-across-seeds"
POOLED = "pooled-samples"
METHOD_WORDS = {
    T_ACROSS_SEEDS: "Student t over the seed scores (mean ± t(k-1)·sd/√k): seed-to-seed and sample-to-sample "
                    "variation together",
    POOLED: "the pooled interval of all seeds' samples, where every seed scored the same (or there is one seed)",
}


@dataclass(frozen=True)
class SeedInterval:
    mean: float  # mean over seeds of the seed scores
    lo: float
    hi: float
    seeds: int
    sd: float  # standard deviation of the seed scores (ddof 1; 0 for one seed)
    method: str  # T_ACROSS_SEEDS or POOLED_FLOOR

    def as_dict(self) -> dict:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "seeds": self.seeds, "sd": self.sd,
                "method": self.method}


@dataclass(frozen=True)
class SeedDifference:
    mean: float  # mean over seeds of the per-seed differences
    lo: float
    hi: float
    p: float  # two-sided
    seeds: int
    method: str

    @property
    def significant(self) -> bool:
        return (self.lo > 0 or self.hi < 0) and self.p < 1 - LEVEL

    def as_dict(self) -> dict:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "p": self.p, "seeds": self.seeds,
                "method": self.method, "significant": self.significant}


def _t_quantile(df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(1 - (1 - LEVEL) / 2, df))


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    k = len(values)
    mean = sum(values) / k
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1)) if k > 1 else 0.0
    return mean, sd


def across_seeds(scores: Sequence[float], pooled: tuple[float, float] | None = None) -> SeedInterval:
    """The mean of `scores` (one per seed) and its interval; `pooled` (lo, hi): the interval of all seeds'
    samples together, taken where the seed scores do not vary (needed then)."""
    if not scores:
        raise ValueError("no seed scores")
    k = len(scores)
    mean, sd = _mean_sd(scores)
    if sd > 0:
        half = _t_quantile(k - 1) * sd / math.sqrt(k)
        return SeedInterval(mean, mean - half, mean + half, k, sd, T_ACROSS_SEEDS)
    if pooled is None:
        raise ValueError("the seed scores do not vary: the pooled interval of their samples is needed")
    return SeedInterval(mean, pooled[0], pooled[1], k, sd, POOLED)


def paired_across_seeds(a: Sequence[float], b: Sequence[float],
                        pooled: tuple[float, float, float] | None = None) -> SeedDifference:
    """a − b paired by seed (`a[s]` and `b[s]` are seed s of each model); `pooled` (lo, hi, p): the difference of
    all seeds' samples together, taken where the per-seed differences do not vary (needed then)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"{len(a)} and {len(b)} seed scores: the difference pairs seed with seed")
    diffs = [x - y for x, y in zip(a, b)]
    k = len(diffs)
    mean, sd = _mean_sd(diffs)
    if sd > 0:
        from scipy.stats import t

        half = _t_quantile(k - 1) * sd / math.sqrt(k)
        p = float(2 * t.sf(abs(mean) / (sd / math.sqrt(k)), k - 1))
        return SeedDifference(mean, mean - half, mean + half, p, k, T_ACROSS_SEEDS)
    if pooled is None:
        raise ValueError("the per-seed differences do not vary: the pooled difference of their samples is needed")
    return SeedDifference(mean, pooled[0], pooled[1], pooled[2], k, POOLED)
