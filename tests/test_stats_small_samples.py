"""Honest intervals and tests on small samples (longctx.report.stats): exact Clopper-Pearson and Korn-Graubard
intervals on 0/1 scores that are never a point, their coverage on simulated Bernoulli data, the bounded interval
for fractions on few samples, and the exact permutation test of unpaired differences (Fisher's on one task)."""

import numpy as np
import pytest
from scipy.stats import binomtest, fisher_exact

from longctx.report import stats
from longctx.report.stats import interval, paired_difference, unpaired_difference


def _ones(k, n):
    return [100.0] * k + [0.0] * (n - k)


def test_none_or_all_of_8_is_the_exact_interval_not_a_point():
    none, every = interval([_ones(0, 8)]), interval([_ones(8, 8)])
    assert (none.lo, round(none.hi, 1), none.method) == (0.0, 36.9, stats.CLOPPER_PEARSON)
    assert (round(every.lo, 1), every.hi) == (63.1, 100.0)


@pytest.mark.parametrize("k,n", [(0, 8), (1, 8), (4, 8), (7, 8), (8, 8), (3, 50), (250, 500), (499, 500)])
def test_one_task_of_0_1_scores_is_clopper_pearson(k, n):
    exact = binomtest(k, n).proportion_ci(confidence_level=stats.LEVEL, method="exact")
    iv = interval([_ones(k, n)])
    assert iv.method == stats.CLOPPER_PEARSON and iv.mean == pytest.approx(100 * k / n)
    assert (iv.lo, iv.hi) == pytest.approx((100 * exact.low, 100 * exact.high), abs=1e-9)


def test_a_mean_of_0_1_tasks_is_korn_graubard_and_never_a_point():
    iv = interval([_ones(0, 8)] * 13)
    # no variance to estimate: Clopper-Pearson at the weights' effective size, 13 tasks x 8 samples
    exact = binomtest(0, 104).proportion_ci(confidence_level=stats.LEVEL, method="exact")
    assert iv.method == stats.KORN_GRAUBARD and (iv.lo, iv.hi) == pytest.approx((0.0, 100 * exact.high))
    mixed = interval([_ones(8, 8), _ones(0, 8)])  # every task certain of itself, the mean is not
    assert mixed.mean == 50.0 and mixed.lo < 40 and mixed.hi > 60


def test_fractions_on_few_samples_or_without_spread_get_the_bounded_interval():
    assert interval([[100 / 3] * 30]).method == stats.BETA_BOUND  # no spread: the bootstrap would be a point
    few = interval([[25.0, 50.0, 75.0, 50.0]])
    assert few.method == stats.BETA_BOUND and few.lo < 50 < few.hi
    # as wide as a 0/1 task of the same mean and size: the largest variance a score in [0, 100] can have
    assert (few.lo, few.hi) == pytest.approx((interval([_ones(2, 4)]).lo, interval([_ones(2, 4)]).hi))
    many = interval([[25.0, 50.0, 75.0, 50.0] * 5])
    assert many.method == stats.BOOTSTRAP and many.hi - many.lo < few.hi - few.lo


def _coverage(make, truth, sims=2000, seed=0):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(sims):
        iv = interval(make(rng))
        hits += iv.lo <= truth <= iv.hi
    return hits / sims


@pytest.mark.parametrize("n", [8, 500])
@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9])
def test_coverage_on_simulated_bernoulli_data(n, p):
    cover = _coverage(lambda rng: [list(rng.binomial(1, p, n) * 100.0)], 100 * p)
    assert cover >= 0.93, cover


@pytest.mark.parametrize("n", [8, 500])
def test_coverage_of_a_mean_of_tasks(n):
    ps = np.array([0.9, 0.6, 0.2, 0.05])
    cover = _coverage(lambda rng: [list(rng.binomial(1, q, n) * 100.0) for q in ps], 100 * ps.mean(), sims=1000)
    assert cover >= 0.93, cover


def test_coverage_of_fractions_on_few_samples():
    # 8 samples of 4 references each, each found with chance 0.7: the score is the share found
    cover = _coverage(lambda rng: [list(rng.binomial(4, 0.7, 8) * 25.0)], 70.0)
    assert cover >= 0.93, cover


def test_an_unpaired_difference_is_fishers_exact_test_on_one_task():
    # 4/8 against 0/8: the bootstrap interval alone would exclude 0; Fisher's exact p is 0.077
    d = unpaired_difference([[_ones(4, 8)]], [[_ones(0, 8)]])
    assert d.p == pytest.approx(fisher_exact([[4, 4], [0, 8]]).pvalue) == pytest.approx(0.0769, abs=1e-4)
    assert not d.significant and d.lo < 0 < d.hi and not d.paired
    for (ka, na), (kb, nb) in [((7, 8), (1, 8)), ((6, 10), (2, 12)), ((3, 5), (3, 9))]:
        got = unpaired_difference([[_ones(ka, na)]], [[_ones(kb, nb)]])
        # both order the tables the same way here (the difference of proportions grows with the table's oddity)
        assert got.p == pytest.approx(fisher_exact([[ka, na - ka], [kb, nb - kb]]).pvalue)


def test_the_exact_and_the_drawn_permutation_test_agree():
    a = [[_ones(5, 12), _ones(9, 12)], [_ones(3, 12)]]
    b = [[_ones(2, 12), _ones(6, 12)], [_ones(1, 12)]]
    exact = unpaired_difference(a, b)
    sa, sb = stats._Strata.of(a), stats._Strata.of(b)
    drawn = stats._drawn_permutation_p(sa, sb, exact.mean, 20000, np.random.default_rng(1))
    assert exact.p == pytest.approx(drawn, abs=0.01)
    # too many outcomes to enumerate: the same test from draws
    big_a, big_b = [[_ones(300, 500)] * 4], [[_ones(280, 500)] * 4]
    assert stats._exact_permutation_p(stats._Strata.of(big_a), stats._Strata.of(big_b), 4.0) is None
    assert 0 < unpaired_difference(big_a, big_b).p < 1


def test_fractions_unpaired_are_tested_by_reassigning_samples():
    a, b = [[[100.0, 75.0, 50.0, 100.0] * 5]], [[[25.0, 0.0, 50.0, 0.0] * 5]]
    d = unpaired_difference(a, b)
    assert d.p == 1 / (1 + stats.FLIPS) and d.significant  # no reassignment is as extreme
    assert unpaired_difference(a, a).p == 1.0


def test_mover_is_newcombes_interval_from_the_exact_ones():
    d = unpaired_difference([[_ones(6, 8)]], [[_ones(2, 8)]])
    (la, ua), (lb, ub) = [(interval([_ones(k, 8)]).lo, interval([_ones(k, 8)]).hi) for k in (6, 2)]
    assert d.lo == pytest.approx(50 - np.hypot(75 - la, ub - 25))
    assert d.hi == pytest.approx(50 + np.hypot(ua - 75, 25 - lb))
    # paired on the same prompts, the same counts: the correlation of the answers narrows it
    same = paired_difference([[_ones(6, 8)]], [[_ones(2, 8)]])
    assert same.lo > d.lo and same.hi < d.hi and same.mean == d.mean


def test_unpaired_difference_coverage_on_0_1_data():
    rng = np.random.default_rng(0)
    hits, sims = 0, 500
    for _ in range(sims):
        a = [list(rng.binomial(1, 0.6, 8) * 100.0), list(rng.binomial(1, 0.2, 8) * 100.0)]
        b = [list(rng.binomial(1, 0.4, 8) * 100.0), list(rng.binomial(1, 0.1, 8) * 100.0)]
        d = unpaired_difference([a], [b], flips=200)
        hits += d.lo <= 15.0 <= d.hi
    assert hits / sims >= 0.93
