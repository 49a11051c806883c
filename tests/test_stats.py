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


def test_holm_matches_its_step_down_rule_and_keeps_none():
    adjusted = stats.holm([0.01, None, 0.04, 0.03, 0.005])
    # sorted: 0.005 x 4, 0.01 x 3, 0.03 x 2, 0.04 x 1, each at least the one before
    assert adjusted == pytest.approx([0.03, None, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == [pytest.approx(1.0), pytest.approx(1.0)]  # capped at 1
    assert stats.holm([0.02]) == [0.02]


def test_equivalence_is_the_larger_one_sided_p_and_needs_the_margin():
    diffs = [0.001, -0.002, 0.0015, 0.0005, -0.001]
    inside, outside = stats.equivalence_test(diffs, 0.01), stats.equivalence_test(diffs, 0.001)
    assert inside < 0.001 < 0.05 < outside  # +-0.01 is shown, +-0.001 is not
    # by hand: the two one-sided t statistics against -margin and +margin
    n, mean = len(diffs), sum(diffs) / len(diffs)
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n)
    lower, upper = 1 - stats.t_cdf((mean + 0.01) / se, n - 1), stats.t_cdf((mean - 0.01) / se, n - 1)
    assert inside == pytest.approx(max(lower, upper))
    assert stats.equivalence_test([0.1, 0.1], 0.5) is None  # no spread: no test


def test_verdicts_follow_the_holm_adjusted_tests():
    claims = [
        {"diffs": [-0.10, -0.12, -0.11], "expect": "lower"},  # a clear win: holds
        {"diffs": [0.10, 0.12, 0.11], "expect": "lower"},  # a clear loss: does not hold
        {"diffs": [-0.02, 0.03, -0.01], "expect": "lower"},  # noise: inconclusive
        {"diffs": [0.001, -0.001, 0.0005, -0.0005, 0.0002], "expect": "same", "margin": 0.01},  # equivalent: holds
        {"diffs": [0.001, -0.001, 0.0005, -0.0005, 0.0002], "expect": "lower", "margin": 0.01},  # no difference
    ]
    out = stats.verdicts(claims)
    assert [c["verdict"] for c in out] == ["holds", "does not hold", "inconclusive", "holds", "does not hold"]
    raw = [c["test"]["p"] for c in out] + [c["equivalence_p"] for c in out]
    assert [c["p_holm"] for c in out] == pytest.approx(stats.holm(raw)[:5])
    assert all(c["p_holm"] >= c["test"]["p"] for c in out)
    # a p between 0.01 and 0.1 on three seeds asks for more
    assert stats.verdicts([{"diffs": [-0.03, -0.02, -0.04], "expect": "lower"}])[0]["more_seeds"]  # p = 0.035
