"""Uncertainty of RULER scores: standard errors, intervals, and differences between runs over samples.

A RULER score at one length is the mean over tasks of each task's mean per-sample score (0-100). Its
uncertainty comes from the samples: each task's samples are a draw from that task's generator. Every statistic
below is over strata (a task at a length), each weighing `w` in the score (1 / tasks; over lengths, 1 / (lengths
* tasks at that length)), each sample 1 / its stratum's sample count within it.

- The standard error is the analytic one of that weighted mean of means: sqrt(sum w^2 s^2 / n), s a stratum's
  sample standard deviation (ddof 1).
- The 95% interval depends on what the samples are:
  - 0/1 data (every per-sample score 0 or 100: `string_match_part`, and `string_match_all` with one reference):
    one task is the exact Clopper-Pearson interval of its proportion; a mean of several is the Korn-Graubard
    interval (Korn & Graubard 1998, Survey Methodology 24(2), "Confidence intervals for proportions with small
    expected number of positive counts estimated from survey data"; R survey's `svyciprop(method = "beta")`):
    Clopper-Pearson at the effective sample size p(1-p) / var, capped at the weights' own effective size
    1 / sum(w^2 / n) and taken at that cap when the variance is 0, so that 0/8 is [0, 36.9] and 8/8 [63.1, 100],
    never a point. For one task the two are the same.
  - other data (fractions of references found), with at least `MIN_BOOTSTRAP_N` samples in every task and some
    spread: a percentile bootstrap that resamples each stratum's samples with replacement (stratified),
    `RESAMPLES` times from `numpy.random.default_rng(SEED)`. Below that minimum the percentile bootstrap is known
    to undercover, and with no spread it is a point; there the Korn-Graubard interval is taken with each task's
    variance bound p(1-p) / n (a score in [0, 1] with mean p varies at most as a 0/1 one does), which is
    conservative ("korn-graubard-bound").
- A difference of two runs is the difference of their scores (the mean over lengths of the mean over tasks of
  the mean per-sample difference). Where neither run's interval is a bootstrap, its interval is MOVER (Zou &
  Donner 2008, Statistics in Medicine 27(10), "Construction of confidence limits about effect measures: a
  general approach"; for one 0/1 task Newcombe's 1998 method with exact intervals) from the two runs' intervals,
  with the correlation of the two scores when the runs are paired and none when they are not; otherwise a
  bootstrap (pairs resampled together when paired, else each run on its own).
- Its p-value is two-sided and exact where it can be:
  - paired (the same prompts): a sign-flip permutation test (under "no difference" each paired difference is as
    likely to have either sign), exact over all 2^n sign patterns when at most `EXACT_FLIPS` differences are
    non-zero, else `FLIPS` random patterns with p = (1 + hits) / (1 + FLIPS). Each difference enters with its
    weight in the score, so for 0/1 tasks this is the exact McNemar test on the discordant pairs only when every
    pair has the same weight (one length, as many pairs in every task).
  - unpaired (different prompts): a permutation test that reassigns the samples of each stratum between the two
    runs (the strata kept apart). On 0/1 data it is exact: the product of each stratum's hypergeometric
    distribution (for one task, Fisher's exact test ordered by the difference), enumerated when that has at most
    `EXACT_PERMUTATIONS` outcomes, else `FLIPS` random draws of it; on other data `FLIPS` random reassignments.
  A difference is significant when its interval excludes 0 and p < 0.05.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import betaincinv, gammaln

RESAMPLES = 2000
FLIPS = 20000
EXACT_FLIPS = 16
EXACT_PERMUTATIONS = 100_000
MIN_BOOTSTRAP_N = 20
SEED = 0
LEVEL = 0.95
CLOPPER_PEARSON = "clopper-pearson"
KORN_GRAUBARD = "korn-graubard"
BETA_BOUND = "korn-graubard-bound"
BOOTSTRAP = "bootstrap"
MOVER = "mover"
METHOD = {"standard_error": "analytic: sqrt(sum over tasks of w^2 s^2 / n), s the sample std (ddof 1), w a task's "
                            "weight in the score",
          "interval": f"{LEVEL:.0%}; each interval's 'method' says which: {CLOPPER_PEARSON} (one task of 0/1 "
                      f"scores, exact), {KORN_GRAUBARD} (a mean of tasks of 0/1 scores: Clopper-Pearson at the "
                      f"effective sample size), {BOOTSTRAP} (other scores, at least {MIN_BOOTSTRAP_N} samples a "
                      f"task and some spread: percentile bootstrap over samples, resampled within each task), "
                      f"{BETA_BOUND} (other scores on fewer samples or with no spread: {KORN_GRAUBARD} with the "
                      "largest variance scores in [0, 100] of those means can have)",
          "resamples": RESAMPLES, "seed": SEED, "min_bootstrap_n": MIN_BOOTSTRAP_N,
          "paired": "mean per-sample difference; interval: MOVER from the two runs' intervals with their "
                    "correlation (where neither is a bootstrap), else a paired bootstrap; two-sided sign-flip "
                    f"permutation p (exact up to {EXACT_FLIPS} non-zero differences, else {FLIPS} random sign flips)",
          "unpaired": "difference of the scores; interval: MOVER from the two runs' intervals (where neither is a "
                      "bootstrap), else independent bootstraps; two-sided permutation p reassigning each task's "
                      f"samples between the runs (0/1 scores: exact, enumerated up to {EXACT_PERMUTATIONS} outcomes, "
                      f"else {FLIPS} draws of it; other scores: random reassignments)"}

INTERVAL_WORDS = (f"{LEVEL:.0%} interval: Clopper-Pearson (exact) for a task of 0/1 scores, Korn-Graubard "
                  "(Clopper-Pearson at the effective sample size) for a mean of such tasks, a percentile bootstrap "
                  f"over samples resampled within each task for other scores from {MIN_BOOTSTRAP_N} samples a task, "
                  "and below that the Korn-Graubard interval with the largest variance a score in [0, 100] can have")

Groups = Sequence[Sequence[float]]  # per task, its per-sample scores (one length)
_TAIL = (1 - LEVEL) / 2


@dataclass(frozen=True)
class Interval:
    mean: float
    se: float
    lo: float
    hi: float
    method: str = BOOTSTRAP  # CLOPPER_PEARSON | KORN_GRAUBARD | BETA_BOUND | BOOTSTRAP

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def as_dict(self) -> dict[str, float | str]:
        return {"se": round(self.se, 4), "lo": round(self.lo, 4), "hi": round(self.hi, 4), "method": self.method}


@dataclass(frozen=True)
class Difference:
    mean: float  # a - b
    lo: float
    hi: float
    p: float
    pairs: int
    paired: bool

    @property
    def significant(self) -> bool:
        """The interval excludes 0 and the test agrees (p < 1 - LEVEL): with a handful of samples an interval can
        exclude 0 while p cannot be small."""
        return (self.lo > 0 or self.hi < 0) and self.p < 1 - LEVEL

    def as_dict(self) -> dict:
        return {"mean": round(self.mean, 4), "lo": round(self.lo, 4), "hi": round(self.hi, 4),
                "p": float(f"{self.p:.4g}"), "pairs": self.pairs, "paired": self.paired,
                "significant": self.significant}


@dataclass(frozen=True)
class _Strata:
    """A score's strata: each one's per-sample scores and its weight in the score (the weights sum to 1)."""

    arrays: list[np.ndarray]
    weights: np.ndarray

    @classmethod
    def of(cls, lengths: Sequence[Groups]) -> _Strata:
        arrays, weights = [], []
        for groups in lengths:
            for g in groups:
                a = np.asarray(g, dtype=np.float64)
                if a.size == 0:
                    raise ValueError("every task needs at least one sample")
                arrays.append(a)
                weights.append(1.0 / (len(lengths) * len(groups)))
        if not arrays:
            raise ValueError("every task needs at least one sample")
        return cls(arrays, np.asarray(weights))

    @property
    def means(self) -> np.ndarray:
        return np.array([a.mean() for a in self.arrays])

    @property
    def sizes(self) -> np.ndarray:
        return np.array([a.size for a in self.arrays], dtype=np.float64)

    @property
    def mean(self) -> float:
        return float(self.weights @ self.means)

    @property
    def binary(self) -> bool:
        return all(bool(np.all((a == 0) | (a == 100))) for a in self.arrays)

    @property
    def interval_method(self) -> str:
        """How this score's interval is computed (the module's docstring says why)."""
        if self.binary:
            return CLOPPER_PEARSON if len(self.arrays) == 1 else KORN_GRAUBARD
        if self.sizes.min() < MIN_BOOTSTRAP_N or all(np.ptp(a) == 0 for a in self.arrays):
            return BETA_BOUND
        return BOOTSTRAP

    def bootstrap(self, rng: np.random.Generator, resamples: int) -> np.ndarray:
        """`resamples` bootstrap draws of the weighted mean, each stratum resampled on its own."""
        total = np.zeros(resamples)
        for w, a in zip(self.weights, self.arrays):
            idx = rng.integers(0, a.size, size=(resamples, a.size))
            total += w * a[idx].mean(axis=1)
        return total

    def variance(self) -> float:
        """The variance of the weighted mean of 0/1 data, each stratum binomial (ddof 0), in 0-1 units; for scores
        in between, the largest variance scores of those means can have."""
        p = self.means / 100
        return float(np.sum(self.weights ** 2 * p * (1 - p) / self.sizes))

    def proportion_bounds(self) -> tuple[float, float]:
        """The Korn-Graubard interval of the weighted proportion (0-100); Clopper-Pearson for one stratum."""
        p = self.mean / 100
        cap = 1.0 / float(np.sum(self.weights ** 2 / self.sizes))
        var = self.variance()
        n_eff = cap if var <= 0 else min(cap, p * (1 - p) / var)
        return _clopper_pearson(p, n_eff)


def _clopper_pearson(p: float, n: float) -> tuple[float, float]:
    """The Clopper-Pearson interval (0-100) of x = p n successes in n trials (n need not be whole)."""
    x = p * n
    lo = 0.0 if p <= 1e-12 else float(betaincinv(x, n - x + 1, _TAIL))
    hi = 1.0 if p >= 1 - 1e-12 else float(betaincinv(x + 1, n - x, 1 - _TAIL))
    return 100 * lo, 100 * hi


def _percentiles(draws: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(draws, [_TAIL * 100, 100 - _TAIL * 100])
    return float(lo), float(hi)


def _standard_error(strata: _Strata) -> float:
    return math.sqrt(sum(w ** 2 * a.std(ddof=1) ** 2 / a.size for w, a in zip(strata.weights, strata.arrays)
                         if a.size > 1))


def interval(groups: Groups, resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """The mean of task means of `groups` (one task: its mean), its standard error and 95% interval."""
    strata = _Strata.of([groups])
    mean, method = strata.mean, strata.interval_method
    if method == BOOTSTRAP:
        lo, hi = _percentiles(strata.bootstrap(np.random.default_rng(seed), resamples))
    else:
        lo, hi = strata.proportion_bounds()
    return Interval(mean, _standard_error(strata), min(lo, mean), max(hi, mean), method)


def _mover(a: _Strata, b: _Strata, correlation: float) -> tuple[float, float]:
    """MOVER bounds of a.mean - b.mean from each one's proportion interval (Zou & Donner 2008, eq. 5 and 6)."""
    (la, ua), (lb, ub) = a.proportion_bounds(), b.proportion_bounds()
    pa, pb = a.mean, b.mean
    d = pa - pb
    lo = d - math.sqrt(max(0.0, (pa - la) ** 2 + (ub - pb) ** 2 - 2 * correlation * (pa - la) * (ub - pb)))
    hi = d + math.sqrt(max(0.0, (ua - pa) ** 2 + (pb - lb) ** 2 - 2 * correlation * (ua - pa) * (pb - lb)))
    return max(lo, -100.0), min(hi, 100.0)


def _correlation(a: _Strata, b: _Strata) -> float:
    """The correlation of two paired scores' estimates (0 when either has no variance)."""
    cov = sum(w ** 2 * float(np.mean((x - x.mean()) * (y - y.mean()))) / x.size / 100 ** 2
              for w, x, y in zip(a.weights, a.arrays, b.arrays))
    va, vb = a.variance(), b.variance()
    return 0.0 if va <= 0 or vb <= 0 else max(-1.0, min(1.0, cov / math.sqrt(va * vb)))


def paired_difference(a: Sequence[Groups], b: Sequence[Groups], resamples: int = RESAMPLES, flips: int = FLIPS,
                      seed: int = SEED) -> Difference:
    """`a` - `b` over paired samples: `a[k][t][i]` and `b[k][t][i]` are the scores of the same prompt (length k,
    task t, sample i). The statistic is the mean over lengths of the mean over tasks of the mean difference
    (one length: the difference of the two scores)."""
    sa, sb = _Strata.of(a), _Strata.of(b)
    diffs = [x - y for x, y in zip(sa.arrays, sb.arrays)]
    per_sample = np.concatenate([np.full(d.size, w / d.size) for w, d in zip(sa.weights, diffs)])
    flat = np.concatenate(diffs)
    observed = float(per_sample @ flat)
    rng = np.random.default_rng(seed)
    if BOOTSTRAP not in (sa.interval_method, sb.interval_method):
        lo, hi = _mover(sa, sb, _correlation(sa, sb))
    else:
        lo, hi = _percentiles(_Strata(diffs, sa.weights).bootstrap(rng, resamples))
    p = _sign_flip_p(per_sample * flat, observed, flips, rng)
    return Difference(observed, min(lo, observed), max(hi, observed), p, int(flat.size), True)


def _sign_flip_p(terms: np.ndarray, observed: float, flips: int, rng: np.random.Generator) -> float:
    """Two-sided p of `observed` = sum(terms) under independent random signs of the terms."""
    terms = terms[terms != 0]
    if terms.size == 0:
        return 1.0
    limit = abs(observed) * (1 - 1e-9)  # a pattern as extreme as the observed one, up to float noise
    if terms.size <= EXACT_FLIPS:
        patterns = ((np.arange(2 ** terms.size)[:, None] >> np.arange(terms.size)) & 1) * 2 - 1
        return float(np.mean(np.abs(patterns @ terms) >= limit))
    hits = 0
    for start in range(0, flips, 2000):
        n = min(2000, flips - start)
        signs = rng.integers(0, 2, size=(n, terms.size)) * 2 - 1
        hits += int(np.count_nonzero(np.abs(signs @ terms) >= limit))
    return (1 + hits) / (1 + flips)


def unpaired_difference(a: Sequence[Groups], b: Sequence[Groups], resamples: int = RESAMPLES, flips: int = FLIPS,
                        seed: int = SEED) -> Difference:
    """`a` - `b` when the runs were scored on different prompts: the difference of their statistics (as in
    `paired_difference`), its interval, and the permutation test of it within each task and length."""
    sa, sb = _Strata.of(a), _Strata.of(b)
    observed = sa.mean - sb.mean
    rng = np.random.default_rng(seed)
    if BOOTSTRAP not in (sa.interval_method, sb.interval_method):
        lo, hi = _mover(sa, sb, 0.0)
    else:
        lo, hi = _percentiles(sa.bootstrap(rng, resamples) - sb.bootstrap(rng, resamples))
    p = _exact_permutation_p(sa, sb, observed) if sa.binary and sb.binary else None
    if p is None:
        p = _drawn_permutation_p(sa, sb, observed, flips, rng)
    n = int(sa.sizes.sum())
    return Difference(observed, min(lo, observed), max(hi, observed), p, n, False)


def _as_extreme(values: np.ndarray, observed: float) -> np.ndarray:
    return np.abs(values) >= abs(observed) - 1e-9 * max(1.0, abs(observed))


def _hypergeometric(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """For 0/1 strata: the possible successes k of `a` when the stratum's samples are reassigned at random, their
    probabilities, and the stratum's successes."""
    s, n_a, n = int(np.count_nonzero(a)) + int(np.count_nonzero(b)), a.size, a.size + b.size
    k = np.arange(max(0, s - b.size), min(s, n_a) + 1)
    log_p = _log_choose(s, k) + _log_choose(n - s, n_a - k) - _log_choose(n, n_a)
    return k, np.exp(log_p), s


def _log_choose(n: float, k: np.ndarray | float) -> np.ndarray:
    return gammaln(n + 1) - gammaln(np.asarray(k) + 1) - gammaln(n - np.asarray(k) + 1)


def _exact_permutation_p(sa: _Strata, sb: _Strata, observed: float) -> float | None:
    """The exact two-sided p on 0/1 strata, or None when the distribution has too many outcomes to enumerate."""
    values, probs = np.zeros(1), np.ones(1)
    for w, a, b in zip(sa.weights, sa.arrays, sb.arrays):
        k, pk, s = _hypergeometric(a, b)
        step = w * 100 * (k / a.size - (s - k) / b.size)
        if values.size * step.size > EXACT_PERMUTATIONS:
            return None
        values = (values[:, None] + step[None, :]).ravel()
        probs = (probs[:, None] * pk[None, :]).ravel()
        # outcomes with the same value merged (rounded far below any difference of scores)
        values, inverse = np.unique(np.round(values, 9), return_inverse=True)
        probs = np.bincount(inverse, weights=probs)
    return float(min(1.0, probs[_as_extreme(values, observed)].sum()))


def _drawn_permutation_p(sa: _Strata, sb: _Strata, observed: float, flips: int, rng: np.random.Generator) -> float:
    """The two-sided p from `flips` random reassignments of each stratum's samples between the runs."""
    hits = 0
    for start in range(0, flips, 2000):
        n = min(2000, flips - start)
        total = np.zeros(n)
        for w, a, b in zip(sa.weights, sa.arrays, sb.arrays):
            pooled = np.concatenate([a, b])
            if np.all((pooled == 0) | (pooled == 100)):
                s = int(np.count_nonzero(pooled))
                k = rng.hypergeometric(s, pooled.size - s, a.size, size=n)
                total += w * 100 * (k / a.size - (s - k) / b.size)
            else:
                shuffled = rng.permuted(np.broadcast_to(pooled, (n, pooled.size)), axis=1)
                total += w * (shuffled[:, :a.size].mean(axis=1) - shuffled[:, a.size:].mean(axis=1))
        hits += int(np.count_nonzero(_as_extreme(total, observed)))
    return (1 + hits) / (1 + flips)
