"""report.py: Student's t against known values, the paired test, the comparison with the reference, the tables."""

import math

import pytest

import report


@pytest.mark.parametrize("t", [-7.5, -1.3, 0.0, 0.4, 2.0, 12.0])
def test_t_cdf_matches_the_closed_forms_for_one_and_two_degrees_of_freedom(t):
    assert report.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-10)  # Cauchy
    assert report.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), abs=1e-10)


@pytest.mark.parametrize("df, q", [(2, 4.302652730), (4, 2.776445105), (10, 2.228138852), (30, 2.042272456)])
def test_t_quantile_matches_published_critical_values(df, q):
    assert report.t_quantile(0.975, df) == pytest.approx(q, abs=1e-7)
    assert report.t_quantile(0.025, df) == pytest.approx(-q, abs=1e-7)


def test_paired_test_p_and_interval_agree_with_the_t_distribution():
    diffs = [0.031, 0.012, 0.024]
    r = report.paired_test(diffs)
    mean = sum(diffs) / 3
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2 / 3)
    t = mean / se
    assert r["t"] == pytest.approx(t) and r["p"] == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-9)  # df = 2
    # a 95% interval holds exactly the shifts that a two-sided test would not reject at p = 0.05
    for end in r["ci"]:
        assert report.paired_test([d - end for d in diffs])["p"] == pytest.approx(0.05, abs=1e-9)
    assert report.paired_test([0.5])["ci"] is None


def scheme(params, losses):
    return {"params": params, "final_val_loss": report.mean_std(losses)}


def test_against_reference_pairs_the_seeds_and_skips_a_missing_reference():
    schemes = {"rope": scheme(100, [3.0, 3.2]), "learned": scheme(164, [3.1, 3.4])}
    assert report.against_reference(schemes, "rope") == "rope"
    assert "vs_reference" not in schemes["rope"] and schemes["learned"]["params_delta"] == 64
    assert schemes["learned"]["vs_reference"]["mean"] == pytest.approx(0.15)  # (0.1 + 0.2) / 2, seed by seed
    alone = {"alibi": scheme(100, [3.0, 3.2])}
    assert report.against_reference(alone, "rope") is None and set(alone["alibi"]) == {"params", "final_val_loss"}


def test_segments_cover_every_position_once_and_pm_marks_what_is_missing():
    curve = [float(i) for i in range(10)]
    assert report.segments(curve, 4) == [(0, 3, 1.5), (4, 7, 5.5), (8, 9, 8.5)]  # the last stretch is short
    assert report.pm(report.mean_std([1.0, 3.0])) == "2.0000 ± 1.4142"
    assert report.pm(report.mean_std([1.0])) == "1.0000" and report.pm(None) == "N/A"
    assert report.md_table(["scheme", "loss"], [("rope", "1.0")]).splitlines()[1] == "|---|---:|"
