"""lab/stats.py: Student's t against known values and the paired test."""

import math

import pytest

from lab import stats


@pytest.mark.parametrize("t", [-7.5, -1.3, 0.0, 0.4, 2.0, 12.0])
def test_t_cdf_matches_the_closed_forms_for_one_and_two_degrees_of_freedom(t):
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-10)  # Cauchy
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), abs=1e-10)


@pytest.mark.parametrize("df, q", [(2, 4.302652730), (4, 2.776445105), (10, 2.228138852), (30, 2.042272456)])
def test_t_quantile_matches_published_critical_values(df, q):
    assert stats.t_quantile(0.975, df) == pytest.approx(q, abs=1e-7)
    assert stats.t_quantile(0.025, df) == pytest.approx(-q, abs=1e-7)


def test_paired_test_p_and_interval_agree_with_the_t_distribution():
    diffs = [0.031, 0.012, 0.024]
    r = stats.paired_test(diffs)
    mean = sum(diffs) / 3
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2 / 3)
    t = mean / se
    assert r["t"] == pytest.approx(t) and r["p"] == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-9)  # df = 2
    # a 95% interval holds exactly the shifts that a two-sided test would not reject at p = 0.05
    for end in r["ci"]:
        assert stats.paired_test([d - end for d in diffs])["p"] == pytest.approx(0.05, abs=1e-9)
    assert stats.paired_test([0.5])["ci"] is None
