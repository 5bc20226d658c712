"""longctx.report.stats on hand-computable cases: standard errors, bootstrap intervals, paired and unpaired
differences, the sign-flip test (exact and Monte-Carlo) and its McNemar reading on 0/1 tasks."""

import math

import numpy as np
import pytest

from longctx.report import stats
from longctx.report.stats import interval, paired_difference, unpaired_difference


def one(*tasks):
    """One length of per-task sample scores, as `paired_difference` takes runs (a list of lengths)."""
    return [list(tasks)]


def test_identical_runs_differ_by_nothing():
    run = one([100, 0, 100, 50] * 5, [0, 0, 100, 25] * 5)  # fractions on 20 samples: the paired bootstrap
    d = paired_difference(run, run)
    assert (d.mean, d.lo, d.hi, d.p, d.pairs, d.paired) == (0.0, 0.0, 0.0, 1.0, 40, True)
    assert not d.significant


def test_winning_every_one_of_8_samples_is_the_exact_sign_flip_p():
    # only the all-plus and the all-minus sign patterns of 2^8 are as extreme as the observed sum
    d = paired_difference(one([100.0] * 8), one([0.0] * 8))
    assert d.mean == 100.0 and d.p == 2 / 2 ** 8 == 0.0078125 and d.significant


def test_winning_20_samples_takes_the_monte_carlo_branch():
    # 20 non-zero differences > EXACT_FLIPS: FLIPS random patterns, each as extreme with chance 2 / 2^20, so none
    # of the 20000 hits (seed 0) and p is the smallest the estimate gives
    assert 20 > stats.EXACT_FLIPS
    d = paired_difference(one([100.0] * 20), one([0.0] * 20))
    assert d.p == 1 / (1 + stats.FLIPS)


def test_standard_error_is_the_sample_std_over_root_n():
    iv = interval([[0, 100, 100, 100]])
    assert iv.mean == 75.0
    assert iv.se == pytest.approx(np.std([0, 100, 100, 100], ddof=1) / 2) == pytest.approx(25.0)
    # a mean of task means: sqrt(sum se_t^2) / tasks
    two = interval([[0, 100, 100, 100], [0, 100]])
    assert two.se == pytest.approx(math.sqrt(25.0 ** 2 + (np.std([0, 100], ddof=1) / math.sqrt(2)) ** 2) / 2)
    assert interval([[40.0]]).se == 0.0  # one sample: no spread to estimate


def test_interval_contains_the_mean_stays_in_range_repeats_and_narrows():
    # fractions of references on 20 samples: the bootstrap
    scores = [0, 100, 50, 0, 100, 100, 25, 0, 100, 100, 75, 10, 60, 30, 20, 90, 45, 35, 0, 100]
    iv = interval([scores])
    assert 0 <= iv.lo <= iv.mean <= iv.hi <= 100 and iv.mean == 52.0 and iv.lo < iv.mean < iv.hi
    assert iv.method == stats.BOOTSTRAP
    assert interval([scores]) == iv and interval([scores], seed=stats.SEED) == iv
    assert interval([scores], seed=1) != iv  # the seed is what makes it repeat
    assert interval([scores * 10]).half_width < iv.half_width
    d = iv.as_dict()
    assert set(d) == {"se", "lo", "hi", "method"} and d["hi"] == round(iv.hi, 4)
    assert stats.METHOD["seed"] == stats.SEED and stats.METHOD["resamples"] == stats.RESAMPLES
    with pytest.raises(ValueError, match="at least one sample"):
        interval([[1.0], []])


def test_paired_difference_is_the_difference_of_the_scores():
    # a score is the mean of task means: tasks of 4 and 2 samples weigh the same
    a = one([100, 100, 0, 100], [100, 0])
    b = one([0, 100, 0, 0], [100, 100])

    def score(run):
        return np.mean([np.mean(t) for t in run[0]])

    d = paired_difference(a, b)
    assert d.mean == pytest.approx(score(a) - score(b)) == pytest.approx((75 - 25 + 50 - 100) / 2)
    assert d.lo <= d.mean <= d.hi and d.pairs == 6
    # over lengths: the mean over lengths of the per-length differences
    two = paired_difference([a[0], [[100, 100]]], [b[0], [[0, 100]]])
    assert two.mean == pytest.approx((0.0 + 50.0) / 2)


def test_unpaired_difference_on_different_sample_counts_is_tested_exactly():
    d = unpaired_difference(one([100, 100, 100, 0]), one([0, 100]))
    assert d.mean == pytest.approx(75 - 50) and not d.paired and d.pairs == 4
    assert d.lo <= d.mean <= d.hi
    # 4 successes among 6 samples, 4 of them a's: P(|difference| >= 25) over the hypergeometric reassignments
    assert d.p == pytest.approx(1.0) and d.as_dict()["p"] == 1.0


def test_a_0_1_task_is_mcnemars_exact_test_on_the_discordant_pairs():
    # 6 prompts a answers and b does not, 30 both answer, 20 neither: the ties carry no sign, so p is that of
    # 6 discordant pairs all one way: 2 / 2^6
    a = [100.0] * 6 + [100.0] * 30 + [0.0] * 20
    b = [0.0] * 6 + [100.0] * 30 + [0.0] * 20
    d = paired_difference(one(a), one(b))
    assert d.p == 2 / 2 ** 6 and d.mean == pytest.approx(600 / 56)
    # 5 one way and 1 the other: patterns with |sum| >= 4 of 6 signs: 2 * (1 + 6) of 64
    b2 = b.copy()
    a2 = a.copy()
    a2[0], b2[0] = 0.0, 100.0
    assert paired_difference(one(a2), one(b2)).p == pytest.approx(14 / 64)
