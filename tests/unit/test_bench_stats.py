"""The benchmarks' statistics (bench/stats.py) against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from bench.stats import bootstrap, ranks, spearman, spread, t_interval


def test_ranks_share_the_mean_rank_on_ties():
    assert ranks([10.0, 30.0, 20.0, 20.0]) == [1.0, 4.0, 2.5, 2.5]


def test_spearman_is_one_for_any_increasing_map_and_minus_one_reversed():
    x = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    assert spearman(x, [v ** 3 + 7 for v in x]) == pytest.approx(1.0)
    assert spearman(x, [-v for v in x]) == pytest.approx(-1.0)


def test_spearman_matches_the_formula_without_ties():
    x, y = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 5.0]
    d2 = sum((a - b) ** 2 for a, b in zip(ranks(x), ranks(y), strict=True))
    assert spearman(x, y) == pytest.approx(1 - 6 * d2 / (5 * (25 - 1)))  # 0.8


def test_t_interval_uses_students_t_not_the_normal():
    mean, low, high = t_interval([1.0, 2.0, 3.0])  # sd 1, n 3, t(2) = 4.303
    assert mean == 2.0
    assert high - mean == pytest.approx(4.303 / math.sqrt(3))
    assert mean - low == pytest.approx(high - mean)


def test_bootstrap_interval_brackets_the_statistic_and_is_reproducible():
    data = [float(v) for v in range(20)]
    stat = lambda idx: sum(data[i] for i in idx) / len(idx)  # noqa: E731
    low, high = bootstrap(stat, len(data), seed=3)
    assert low < 9.5 < high
    assert (low, high) == bootstrap(stat, len(data), seed=3)
    assert high - low < 10


def test_spread_is_the_median_with_the_range_when_there_is_one():
    assert spread([3.0, 1.0, 2.0, 10.0]) == "2.50 [1.00-10.00]"
    assert spread([1234.5], ",.0f") == "1,234"
    assert spread([]) == "-"
