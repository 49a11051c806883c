"""lab/stats.py: our use of scipy.stats against closed forms of Student's t (df = 1 and 2) and exact sign-test
values, Holm's step-down by hand, the Holm family of a table, the verdicts and the detectable effect; the power
analysis against textbook sample sizes and a seeded simulation of the test it plans."""

import math
import statistics

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lab import stats


def t_cdf(t, df):
    """Student's t CDF in closed form, the reference the scipy-based tests are held to."""
    return {1: 0.5 + math.atan(t) / math.pi, 2: 0.5 + t / (2 * math.sqrt(t * t + 2))}[df]  # df = 1: Cauchy


def t_quantile_df2(p):
    """The inverse of t_cdf(t, 2)."""
    return (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))


def mean_se(diffs):
    n = len(diffs)
    return sum(diffs) / n, statistics.stdev(diffs) / math.sqrt(n)


def test_mean_std_uses_n_minus_one_and_has_no_spread_for_one_value():
    assert stats.mean_std([1.0, 2.0, 4.0]) == {
        "mean": pytest.approx(7 / 3),
        "std": pytest.approx(math.sqrt(7 / 3)),
        "values": [1.0, 2.0, 4.0],
    }
    assert stats.mean_std([3.0])["std"] is None


@pytest.mark.parametrize("diffs", [[0.031, 0.012], [0.031, 0.012, 0.024], [-0.2, 0.05, -0.1]])
def test_paired_t_p_matches_the_closed_form_of_its_degrees_of_freedom(diffs):
    r = stats.paired_test(diffs)
    mean, se = mean_se(diffs)
    t = mean / se
    assert r["test"] == "paired t" and r["n"] == len(diffs) and r["mean"] == pytest.approx(mean)
    assert r["t"] == pytest.approx(t) and r["p"] == pytest.approx(2 * t_cdf(-abs(t), len(diffs) - 1), abs=1e-12)


def test_the_interval_holds_exactly_the_shifts_a_test_at_005_would_not_reject():
    diffs = [0.031, 0.012, 0.024]
    r = stats.paired_test(diffs)
    mean, se = mean_se(diffs)
    q = t_quantile_df2(0.975)
    assert r["ci"] == pytest.approx([mean - q * se, mean + q * se], abs=1e-12)
    for end in r["ci"]:
        assert stats.paired_test([d - end for d in diffs])["p"] == pytest.approx(0.05, abs=1e-9)


@pytest.mark.filterwarnings("ignore:Precision loss")  # scipy's warning on the nearly constant case, made on purpose
def test_no_spread_takes_the_exact_sign_test_and_no_p_is_zero():
    r = stats.paired_test([0.25] * 5)  # every seed moved by the same amount, as in a capped window
    assert r == {"test": "sign (exact)", "n": 5, "mean": 0.25, "ci": None, "t": None, "p": 0.0625}  # 2 / 2**5
    assert stats.paired_test([-3.0] * 3)["p"] == 0.25
    assert stats.paired_test([0.0] * 4)["p"] == 1.0 and stats.paired_test([0.0] * 4)["test"] == "sign (exact)"
    for diffs in ([1e9] * 12, [1.0, 1.0 + 1e-15, 1.0], [5.0, 5.1, 5.05, 5.02]):
        assert stats.paired_test(diffs)["p"] > 0
        assert stats.equivalence_test(diffs, 1e12) > 0


def test_one_seed_allows_no_test_and_none_is_an_error():
    assert stats.paired_test([0.5]) == {"test": None, "n": 1, "mean": 0.5, "ci": None, "t": None, "p": None}
    assert stats.equivalence_test([0.5], 1.0) is None
    with pytest.raises(ValueError, match="diffs"):
        stats.paired_test([])


@pytest.mark.parametrize(
    "diffs, margin", [([0.001, -0.002, 0.0015], 0.01), ([0.004, 0.012], 0.02), ([0.001, -0.002, 0.0015], 0.001)]
)
def test_equivalence_is_the_larger_one_sided_p_of_the_closed_form(diffs, margin):
    mean, se = mean_se(diffs)
    df = len(diffs) - 1
    above, below = 1 - t_cdf((mean + margin) / se, df), t_cdf((mean - margin) / se, df)
    assert stats.equivalence_test(diffs, margin) == pytest.approx(max(above, below), abs=1e-12)


def test_equivalence_without_spread_is_the_exact_sign_version():
    assert stats.equivalence_test([0.001] * 4, 0.01) == 0.0625  # both one-sided sign tests: 0.5**4
    assert stats.equivalence_test([-0.02] * 4, 0.01) == 1.0
    assert stats.equivalence_test([0.01] * 4, 0.01) == 1.0  # on the margin is not inside it
    with pytest.raises(ValueError, match="margin=0"):
        stats.equivalence_test([0.1, 0.2], 0)


@pytest.mark.parametrize(
    "diffs, margin", [([0.031, 0.025, 0.036], 0.02), ([-0.3, -0.1, -0.2], 0.05), ([0.031, 0.029, 0.0305], 0.02)]
)
def test_beyond_the_margin_is_twice_the_one_sided_p_against_the_edge_on_the_means_side(diffs, margin):
    mean, se = mean_se(diffs)
    df, edge = len(diffs) - 1, math.copysign(margin, mean)
    one_sided = 1 - t_cdf((mean - edge) / se, df) if mean > 0 else t_cdf((mean - edge) / se, df)
    assert stats.beyond_test(diffs, margin) == pytest.approx(min(1, 2 * one_sided), abs=1e-12)
    # p < 0.05 exactly where the 95% interval lies wholly beyond the margin's edge
    lo, hi = stats.paired_test(diffs)["ci"]
    assert (stats.beyond_test(diffs, margin) < 0.05) == (lo > margin or hi < -margin)


def test_beyond_the_margin_inside_it_or_without_spread():
    assert stats.beyond_test([0.001, -0.002, 0.0015], 0.01) == 1.0  # mean inside: the one-sided p is above 1/2
    assert stats.beyond_test([0.03] * 5, 0.02) == 2 * 0.5**5  # every seed beyond the edge: the sign test
    assert stats.beyond_test([0.01] * 5, 0.02) == 1.0
    assert stats.beyond_test([0.03], 0.02) is None
    with pytest.raises(ValueError, match="margin=0"):
        stats.beyond_test([0.1, 0.2], 0)


def test_holm_matches_its_step_down_rule_and_keeps_none():
    adjusted = stats.holm([0.01, None, 0.04, 0.03, 0.005])
    # sorted: 0.005 x 4, 0.01 x 3, 0.03 x 2, 0.04 x 1, each at least the one before
    assert adjusted == pytest.approx([0.03, None, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == [pytest.approx(1.0), pytest.approx(1.0)]  # capped at 1
    assert stats.holm([0.02]) == [0.02]


WIN, LOSS, NOISE = [-0.10, -0.12, -0.11], [0.10, 0.12, 0.11], [-0.02, 0.03, -0.01]
FLAT = [0.001, -0.001, 0.0005, -0.0005, 0.0002]  # well within +-0.01


def test_the_holm_family_is_every_deciding_test_of_the_table():
    claims = [
        {"diffs": WIN, "expect": "lower"},
        {"diffs": LOSS, "expect": "higher", "margin": None},
        {"diffs": NOISE, "expect": "lower"},
        {"diffs": FLAT, "expect": "lower", "margin": 0.01},  # its difference test and its equivalence test
        {"diffs": FLAT, "expect": "same", "margin": 0.01},  # its equivalence test and its test of lying beyond
        {"diffs": [-0.5], "expect": "lower"},  # one seed: no test, not counted
        {"diffs": WIN, "expect": "same", "margin": 0.01, "tost": False},  # its test of lying beyond alone
    ]
    out = stats.verdicts(claims)
    assert [c["family"] for c in out] == [8] * 7
    ps = [c["test"]["p"] for c in out[:4]] + [out[3]["equivalence_p"], out[4]["equivalence_p"]]
    ps += [out[4]["beyond_p"], out[6]["beyond_p"]]
    adjusted = stats.holm(ps)
    assert [c["p_holm"] for c in out] == pytest.approx(adjusted[:4] + [None] * 3)
    assert [c["equivalence_p_holm"] for c in out] == pytest.approx([None] * 3 + adjusted[4:6] + [None] * 2)
    assert [c["beyond_p_holm"] for c in out] == pytest.approx([None] * 4 + [adjusted[6], None, adjusted[7]])
    assert out[6]["equivalence_p"] is None and out[3]["beyond_p"] is None
    every = [p for c in out for p in (c["p_holm"], c["equivalence_p_holm"], c["beyond_p_holm"]) if p is not None]
    assert min(every) == pytest.approx(8 * min(ps))  # the smallest p pays for the whole family
    assert out[4]["test"]["p"] is not None  # a "same" claim's paired test is shown, not judged
    assert [c["detectable"] for c in out] == [stats.detectable(c["diffs"], 8) for c in claims]  # in this family


def test_each_verdict_branch():
    claims = [
        ({"diffs": WIN, "expect": "lower"}, "holds"),
        ({"diffs": LOSS, "expect": "higher"}, "holds"),
        ({"diffs": LOSS, "expect": "lower"}, "does not hold"),  # the other side
        ({"diffs": NOISE, "expect": "lower"}, "inconclusive"),
        ({"diffs": FLAT, "expect": "lower", "margin": 0.01}, "does not hold"),  # equivalence where a gap was expected
        ({"diffs": FLAT, "expect": "higher", "margin": 0.001}, "inconclusive"),  # too tight a margin to show
        ({"diffs": FLAT, "expect": "same", "margin": 0.01}, "holds"),
        ({"diffs": WIN, "expect": "same", "margin": 0.01}, "does not hold"),  # shown to lie beyond the margin
        ({"diffs": NOISE, "expect": "same", "margin": 0.01}, "inconclusive"),  # neither inside nor beyond shown
    ]
    out = stats.verdicts([c for c, _ in claims])
    assert [c["verdict"] for c in out] == [v for _, v in claims]
    assert all(c["p_holm"] >= c["test"]["p"] for c in out if c["p_holm"] is not None)


def test_verdicts_reject_an_unknown_side_and_a_same_claim_without_margin():
    with pytest.raises(ValueError, match="expect='below'"):
        stats.verdicts([{"diffs": WIN, "expect": "below"}])
    with pytest.raises(ValueError, match="margin"):
        stats.verdicts([{"diffs": FLAT, "expect": "same"}])


def test_detectable_is_the_effect_at_holms_strictest_step():
    diffs, family, alpha = [0.031, 0.012, 0.024], 2, 0.04  # alpha / family = 0.02: the 0.99 quantile, df = 2
    _, se = mean_se(diffs)
    d = stats.detectable(diffs, family, alpha)
    assert d == pytest.approx(t_quantile_df2(0.99) * se, abs=1e-12)
    mean = sum(diffs) / 3
    assert stats.paired_test([x - mean + d for x in diffs])["p"] == pytest.approx(alpha / family, abs=1e-9)


def test_detectable_without_spread_asks_whether_the_sign_test_can_settle_anything():
    assert stats.detectable([0.1] * 5, 1) is None  # the smallest p is 0.0625 > 0.05
    assert stats.detectable([0.1] * 6, 1) == 0.0  # 0.03125 < 0.05
    assert stats.detectable([0.1] * 6, 2) is None  # 0.03125 > 0.025
    assert stats.detectable([0.1], 1) is None
    with pytest.raises(ValueError, match="family=0"):
        stats.detectable([0.1, 0.2], 0)


@pytest.mark.parametrize("effect, n", [(0.5, 34), (0.8, 15), (1.0, 10)])
def test_seeds_needed_matches_the_textbook_sample_sizes_of_the_t_test(effect, n):
    # Cohen's d of 0.5, 0.8 and 1 at two-sided 0.05 and 80% power: 34, 15 and 10 (G*Power's one-sample t-test)
    assert stats.seeds_needed(effect, 1.0) == n
    assert stats.power(effect, 1.0, n) >= 0.8 > stats.power(effect, 1.0, n - 1)


@pytest.mark.parametrize("effect, sd, n, family", [(0.05, 0.03, 6, 3), (0.02, 0.03, 12, 9), (0.3, 0.1, 3, 1)])
def test_power_is_the_rejection_rate_of_the_paired_t_test_on_simulated_seeds(effect, sd, n, family):
    """The noncentral t against the paired t-test itself, run on seeded normal differences at Holm's strictest step."""
    rng, runs = np.random.default_rng(0), 4000
    p = scipy_stats.ttest_1samp(rng.normal(effect, sd, (runs, n)), 0.0, axis=1).pvalue
    expected = stats.power(effect, sd, n, family)
    assert abs((p < stats.ALPHA / family).mean() - expected) < 4 * math.sqrt(expected * (1 - expected) / runs)


def test_the_smallest_effect_at_n_seeds_is_where_their_power_reaches_80_percent():
    for n, sd, family in [(2, 1.0, 22), (6, 0.03, 9), (20, 0.05, 1)]:
        effect = stats.smallest_effect(n, sd, family)
        assert stats.power(effect, sd, n, family) == pytest.approx(stats.POWER, abs=1e-9)
        assert stats.seeds_needed(effect * 1.001, sd, family) == n  # just above it, n seeds suffice; not n - 1
    assert stats.smallest_effect(6, 0.06, 9) == pytest.approx(2 * stats.smallest_effect(6, 0.03, 9))  # scales with sd


def test_an_equivalence_test_can_pass_only_below_the_spread_its_seeds_allow():
    # 3 seeds, a margin of 0.02 and a family of 9: TOST at a mean of exactly 0 passes only if the spread is below
    # 0.02 sqrt(3) / t_{2, 1 - 0.05 / 9}
    limit = stats.equivalence_spread(3, 0.02, 9)
    assert limit == pytest.approx(0.02 * math.sqrt(3) / t_quantile_df2(1 - 0.05 / 9)) and 0.0036 < limit < 0.0037
    for sd in (0.99 * limit, 1.01 * limit):  # differences -sd, 0, sd: mean 0, spread sd
        p = stats.equivalence_test([-sd, 0.0, sd], 0.02)
        assert (p * 9 < 0.05) == stats.equivalence_can_pass(3, sd, 0.02, 9) == (sd < limit)
    assert not stats.equivalence_can_pass(3, 0.016, 0.02, 22) and stats.equivalence_can_pass(12, 0.016, 0.02, 22)


def test_planning_refuses_what_has_no_plan():
    for call, match in [
        (lambda: stats.power(0.1, 0.1, 1), "n=1 must be an integer >= 2"),
        (lambda: stats.power(0.1, 0.0, 5), "sd=0.0 must be > 0"),
        (lambda: stats.seeds_needed(0.0, 0.1), "effect=0.0 must be > 0"),
        (lambda: stats.smallest_effect(5, 0.1, 0), "family=0 must be an integer >= 1"),
        (lambda: stats.equivalence_spread(5, -0.02), "margin=-0.02 must be > 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
