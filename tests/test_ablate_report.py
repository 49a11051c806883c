"""lab/ablate_report.py and lab/report.py: the comparison with the reference, the tables."""

import pytest

from lab import ablate_report
from lab.report import md_table, pm
from lab.stats import mean_std


def scheme(params, losses):
    return {"params": params, "final_val_loss": mean_std(losses)}


def test_against_reference_pairs_the_seeds_and_skips_a_missing_reference():
    schemes = {"rope": scheme(100, [3.0, 3.2]), "learned": scheme(164, [3.1, 3.4])}
    assert ablate_report.against_reference(schemes, "rope") == "rope"
    assert "vs_reference" not in schemes["rope"] and schemes["learned"]["params_delta"] == 64
    assert schemes["learned"]["vs_reference"]["mean"] == pytest.approx(0.15)  # (0.1 + 0.2) / 2, seed by seed
    alone = {"alibi": scheme(100, [3.0, 3.2])}
    assert ablate_report.against_reference(alone, "rope") is None and set(alone["alibi"]) == {"params", "final_val_loss"}


def test_segments_cover_every_position_once_and_pm_marks_what_is_missing():
    curve = [float(i) for i in range(10)]
    assert ablate_report.segments(curve, 4) == [(0, 3, 1.5), (4, 7, 5.5), (8, 9, 8.5)]  # the last stretch is short
    assert pm(mean_std([1.0, 3.0])) == "2.0000 ± 1.4142"
    assert pm(mean_std([1.0])) == "1.0000" and pm(None) == "N/A"
    assert md_table(["scheme", "loss"], [("rope", "1.0")]).splitlines()[1] == "|---|---:|"
