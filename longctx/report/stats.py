"""Uncertainty of RULER scores: standard errors, bootstrap intervals and paired differences over samples.

A RULER score at one length is the mean over tasks of each task's mean per-sample score (0-100). Its
uncertainty comes from the samples: each task's samples are a draw from that task's generator, so

- the standard error is the analytic one of that mean of means: a task's sample standard deviation
  (ddof 1) over the square root of its sample count, combined over tasks as sqrt(sum se_t^2) / tasks;
- the 95% interval is a percentile bootstrap that resamples each task's samples with replacement,
  independently per task (stratified), `RESAMPLES` times from `numpy.random.default_rng(SEED)`;
- two runs on the same prompts are compared sample by sample: the mean of the per-sample differences
  (weighted like the score, so it equals the difference of the two scores), a paired-bootstrap interval
  (the pairs resampled together) and a two-sided sign-flip permutation p-value (under "no difference" each
  paired difference is as likely to have either sign): exact over all 2^n sign patterns when at most
  `EXACT_FLIPS` differences are non-zero, else `FLIPS` random patterns with p = (1 + hits) / (1 + FLIPS).
  Each difference enters with its weight in the score, so for 0/1 tasks this is the exact McNemar test on the
  discordant pairs only when every pair has the same weight (one length, as many pairs in every task).
  A difference is significant when its interval excludes 0 and (paired) p < 0.05.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
FLIPS = 20000
EXACT_FLIPS = 16
SEED = 0
LEVEL = 0.95
METHOD = {"standard_error": "analytic: sample std (ddof 1) / sqrt(n) per task, sqrt(sum se^2) / tasks for a mean",
          "interval": f"{LEVEL:.0%} percentile bootstrap over samples, resampled within each task",
          "resamples": RESAMPLES, "seed": SEED,
          "paired": "mean per-sample difference, paired bootstrap interval, two-sided sign-flip permutation p "
                    f"(exact up to {EXACT_FLIPS} non-zero differences, else {FLIPS} random sign patterns)"}

Groups = Sequence[Sequence[float]]  # per task, its per-sample scores (one length)


@dataclass(frozen=True)
class Interval:
    mean: float
    se: float
    lo: float
    hi: float

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def as_dict(self) -> dict[str, float]:
        return {"se": round(self.se, 4), "lo": round(self.lo, 4), "hi": round(self.hi, 4)}


@dataclass(frozen=True)
class Difference:
    mean: float  # a - b
    lo: float
    hi: float
    p: float | None  # None: unpaired (different prompts), no test
    pairs: int
    paired: bool

    @property
    def significant(self) -> bool:
        """The interval excludes 0 and, for a paired difference, the test agrees (p < 1 - LEVEL): with a handful
        of samples a bootstrap interval can shrink to a point that excludes 0 while p cannot be small."""
        return (self.lo > 0 or self.hi < 0) and (self.p is None or self.p < 1 - LEVEL)

    def as_dict(self) -> dict:
        return {"mean": round(self.mean, 4), "lo": round(self.lo, 4), "hi": round(self.hi, 4),
                "p": None if self.p is None else float(f"{self.p:.4g}"), "pairs": self.pairs, "paired": self.paired,
                "significant": self.significant}


def _arrays(groups: Groups) -> list[np.ndarray]:
    out = [np.asarray(g, dtype=np.float64) for g in groups]
    if not out or any(a.size == 0 for a in out):
        raise ValueError("every task needs at least one sample")
    return out


def _bootstrap_means(arrays: list[np.ndarray], rng: np.random.Generator, resamples: int) -> np.ndarray:
    """`resamples` bootstrap draws of the mean of task means, each task resampled on its own."""
    total = np.zeros(resamples)
    for a in arrays:
        idx = rng.integers(0, a.size, size=(resamples, a.size))
        total += a[idx].mean(axis=1)
    return total / len(arrays)


def _percentiles(draws: np.ndarray) -> tuple[float, float]:
    tail = (1 - LEVEL) / 2 * 100
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return float(lo), float(hi)


def interval(groups: Groups, resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """The mean of task means of `groups` (one task: its mean), its standard error and 95% bootstrap interval."""
    arrays = _arrays(groups)
    mean = float(np.mean([a.mean() for a in arrays]))
    se = math.sqrt(sum((a.std(ddof=1) ** 2 / a.size) if a.size > 1 else 0.0 for a in arrays)) / len(arrays)
    lo, hi = _percentiles(_bootstrap_means(arrays, np.random.default_rng(seed), resamples))
    return Interval(mean, se, min(lo, mean), max(hi, mean))


def paired_difference(a: Sequence[Groups], b: Sequence[Groups], resamples: int = RESAMPLES, flips: int = FLIPS,
                      seed: int = SEED) -> Difference:
    """`a` - `b` over paired samples: `a[k][t][i]` and `b[k][t][i]` are the scores of the same prompt (length k,
    task t, sample i). The statistic is the mean over lengths of the mean over tasks of the mean difference
    (one length: the difference of the two scores)."""
    diffs = [[np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64) for x, y in zip(ka, kb)]
             for ka, kb in zip(a, b)]
    # each sample's weight in the statistic: 1 / (lengths * tasks at its length * samples of its task)
    weights = np.concatenate([np.full(d.size, 1.0 / (len(diffs) * len(k) * d.size)) for k in diffs for d in k])
    flat = np.concatenate([d for k in diffs for d in k])
    observed = float(weights @ flat)
    rng = np.random.default_rng(seed)
    draws = np.zeros(resamples)
    for k in diffs:
        for d in k:
            idx = rng.integers(0, d.size, size=(resamples, d.size))
            draws += d[idx].mean(axis=1) / (len(diffs) * len(k))
    lo, hi = _percentiles(draws)
    return Difference(observed, min(lo, observed), max(hi, observed), _sign_flip_p(weights * flat, observed, flips,
                                                                                    rng), int(flat.size), True)


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


def unpaired_difference(a: Sequence[Groups], b: Sequence[Groups], resamples: int = RESAMPLES,
                        seed: int = SEED) -> Difference:
    """`a` - `b` when the runs were scored on different prompts: the difference of their statistics (as in
    `paired_difference`) with an interval from independent bootstraps of each run; no test."""
    rng = np.random.default_rng(seed)

    def stat_and_draws(run: Sequence[Groups]) -> tuple[float, np.ndarray]:
        arrays = [_arrays(k) for k in run]
        stat = float(np.mean([np.mean([x.mean() for x in k]) for k in arrays]))
        return stat, np.mean([_bootstrap_means(k, rng, resamples) for k in arrays], axis=0)

    sa, da = stat_and_draws(a)
    sb, db = stat_and_draws(b)
    lo, hi = _percentiles(da - db)
    n = sum(len(g) for k in a for g in k)
    return Difference(sa - sb, min(lo, sa - sb), max(hi, sa - sb), None, n, False)
