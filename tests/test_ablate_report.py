"""lab/ablate_report.py and lab/report.py: the verdicts against the reference, the tables."""

import json

import pytest

from conftest import ROOT
from lab import ablate_report
from lab.report import md_table, pm
from lab.stats import mean_std


def ranked(seeds, losses):
    return {"shared": {"seeds": seeds, "final_val_loss": mean_std(losses)}}


def test_verdicts_pair_the_seeds_both_ran_and_skip_a_missing_reference():
    schemes = {
        "rope": ranked([1, 2, 3, 4], [3.0, 3.2, 3.1, 3.0]),
        "learned": ranked([1, 2, 3], [3.1, 3.4, 3.15]),
    }  # seed 4: the reference's alone
    (claim,) = ablate_report.verdicts_against(schemes, "rope", "shared", 0.01)
    assert claim["id"] == "learned-loss-vs-rope" and claim["diffs"] == pytest.approx([0.1, 0.2, 0.05])
    assert claim["expect"] == "lower" and claim["margin"] == 0.01 and "verdict" in claim
    assert ablate_report.verdicts_against({"alibi": ranked([1], [3.0])}, "rope", "shared", 0.01) == []


def by_length(seeds, loss_at, scalings=("none",)):
    """A scheme's shared-rate figures whose loss at length L (32 to 256, L0 = 64) under each scaling is loss_at(L,
    scaling, seed); at 128 and past it None where loss_at gives None (learned positions)."""
    table = {
        scaling: {
            str(L): None if loss_at(L, scaling, seeds[0]) is None else mean_std([loss_at(L, scaling, s) for s in seeds])
            for L in (32, 64, 128, 256)
        }
        for scaling in scalings
    }
    return {"shared": {"seeds": seeds, "loss_by_length": table}}


def test_the_loss_past_L0_claim_reads_each_scheme_as_trained_against_rope_under_yarn():
    seeds = [1, 2, 3, 4]
    rope = by_length(seeds, lambda L, sc, s: (2.0 if sc == "yarn" else 4.0) + L / 1000 + s / 100, ("none", "yarn"))
    sinusoidal = by_length(seeds, lambda L, sc, s: 3.0 + L / 1000 + s / 50)
    learned = by_length(seeds, lambda L, sc, s: None if L > 64 else 2.0)  # no position past L0: no claim
    schemes = {"rope": rope, "sinusoidal": sinusoidal, "learned": learned}
    (claim,) = ablate_report.loss_past_against(schemes, "rope", "shared", 0.01, L0=64)
    assert claim["id"] == "sinusoidal-loss-past-L0-vs-rope-yarn" and claim["against"] == "rope under yarn"
    # the mean over 128 and 256 of each, as trained against YaRN's: (3 + s/50) - (2 + s/100) = 1 + s/100
    assert claim["diffs"] == pytest.approx([1 + s / 100 for s in seeds])
    assert claim["verdict"] == "does not hold"  # sinusoidal is higher, on every seed
    unscaled = {"rope": by_length(seeds, lambda L, sc, s: 4.0 + s / 10), "sinusoidal": sinusoidal}
    (claim,) = ablate_report.loss_past_against(unscaled, "rope", "shared", 0.01, L0=64)
    assert claim["id"] == "sinusoidal-loss-past-L0-vs-rope" and claim["verdict"] == "holds"  # YaRN not scored


def test_each_claim_of_who_learns_first_is_named_by_the_scheme_and_the_reference():
    def learning(steps):
        return {"shared": {"seeds": [1, 2], "learning": {"steps": steps, "learned": [True, True]}}}

    schemes = {"rope": learning([4, 4]), "alibi": learning([2, 4]), "learned": learning([6, 6])}
    order = ablate_report.learning_order(schemes, "rope", "shared")
    assert [(c["id"], c["earlier"], c["later"]) for c in order] == [
        ("alibi-learns-first-vs-rope", 1, 0),
        ("learned-learns-first-vs-rope", 0, 2),
    ]


def test_verdict_words_say_which_side_or_that_nothing_was_shown():
    claim = {"margin": 0.01, "equivalence_p_holm": None}
    assert ablate_report.verdict_words(claim | {"verdict": "holds"}, "rope") == "lower than rope"
    assert ablate_report.verdict_words(claim | {"verdict": "does not hold"}, "rope") == "higher than rope"
    same = claim | {"verdict": "does not hold", "equivalence_p_holm": 0.01}
    assert ablate_report.verdict_words(same, "rope") == "no difference (within ±0.01)"
    assert ablate_report.verdict_words(claim | {"verdict": "inconclusive"}, "rope") == "inconclusive"


def test_segments_cover_every_position_once_and_pm_marks_what_is_missing():
    curve = [float(i) for i in range(10)]
    assert ablate_report.segments(curve, 4) == [(0, 3, 1.5), (4, 7, 5.5), (8, 9, 8.5)]  # the last stretch is short
    assert pm(mean_std([1.0, 3.0])) == "2.0000 ± 1.4142"
    assert pm(mean_std([1.0])) == "1.0000" and pm(None) == "N/A"
    assert md_table(["scheme", "loss"], [("rope", "1.0")]).splitlines()[1] == "|---|---:|"


def band(accuracy, trials=200):
    """A band of trials whole answers at accuracy, its key-blind floor 18%."""
    return {"accuracy": accuracy, "hits": round(accuracy * trials), "trials": trials, "floor": 0.18}


def past(seeds, learned, accuracy, deployed=None):
    """A scheme's figures with one 512-token window whose first band past L0 holds accuracy, seed by seed (None:
    the scheme has no band past L0, as learned positions, whose longest window is L0), and where given the same
    window read under the deployed scaling."""
    per_seed = [
        {
            "seed": s,
            "learning": {"learned": ok},
            "windows": {
                "64": {"bands": {"L0 to sL0": None}},
                "512": None if a is None else {"bands": {"L0 to sL0": band(a)}},
                "1024": None,
            },
            "deployed": None if deployed is None else {"512": {"bands": {"L0 to sL0": band(deployed[i])}}},
        }
        for i, (s, ok, a) in enumerate(zip(seeds, learned, accuracy, strict=True))
    ]
    return {"shared": {"seeds": seeds, "learning": {}, "retrieval": {}, "per_seed": per_seed}}


def test_retrieval_past_L0_is_compared_on_the_seeds_where_both_learned_against_a_comparator_that_answers():
    from scipy import stats

    seeds = [1, 2, 3, 4, 5]
    schemes = {
        # as trained, at its floor past L0; under YaRN above it
        "rope": past(seeds, [True, True, True, False, True], [0.01, 0.02, 0.0, 0.9, 0.01], [0.4, 0.5, 0.42, 0.9, 0.41]),
        "alibi": past(seeds, [True, False, True, True, True], [0.80, 0.1, 0.85, 0.1, 0.90]),
        "none": past(seeds, [False] * 5, [0.1] * 5),  # never learned: nothing to compare, no test
        "learned": past(seeds, [True] * 5, [None] * 5),  # learned, but has no window past L0: no test either
        "sinusoidal": past(seeds, [True, False, True, True, True], [0.01, 0.02, 0.0, 0.03, 0.01]),
    }
    claims = ablate_report.retrieval_against(schemes, "rope", "shared")
    assert [c["id"] for c in claims] == [
        f"{name}-retrieves-past-L0-vs-{against}"
        for against in ("rope", "rope-yarn")
        for name in ("alibi", "none", "learned", "sinusoidal")
    ]
    alibi, none, learned, sinusoidal = claims[4:]
    # against RoPE as trained, which reads no key past L0, nothing is tested
    assert all(c["verdict"] is None and "test" not in c for c in claims[:4])
    assert claims[0]["untested"] == claims[3]["untested"] == "the comparator at its floor"
    # seed 2: alibi did not learn; seed 4: rope did not; the rest are paired
    assert alibi["id"] == "alibi-retrieves-past-L0-vs-rope-yarn" and alibi["seeds"] == [1, 3, 5]
    diffs = [0.80 - 0.40, 0.85 - 0.42, 0.90 - 0.41]
    assert alibi["diffs"] == pytest.approx(diffs) and alibi["means"] == pytest.approx([0.85, 0.41])
    assert alibi["test"]["p"] == pytest.approx(stats.ttest_1samp(diffs, 0).pvalue)
    low = [0.01 - 0.40, 0.0 - 0.42, 0.01 - 0.41]
    assert sinusoidal["diffs"] == pytest.approx(low)
    ps = sorted([alibi["test"]["p"], sinusoidal["test"]["p"]])
    holm = {ps[0]: 2 * ps[0], ps[1]: max(2 * ps[0], ps[1])}  # Holm over the family of two, by hand
    assert alibi["family"] == sinusoidal["family"] == 2
    assert alibi["p_holm"] == pytest.approx(holm[alibi["test"]["p"]])
    assert alibi["verdict"] == "holds" and sinusoidal["verdict"] == "does not hold"
    assert none["seeds"] == [] and none["verdict"] is None and "test" not in none
    assert learned["seeds"] == [] and learned["verdict"] is None and "test" not in learned
    # the floor test, against scipy's exact (Clopper-Pearson) interval of the answers pooled over seeds 1, 3, 5

    def pooled_low(accuracies):
        return stats.binomtest(sum(round(a * 200) for a in accuracies), 600).proportion_ci().low

    assert pooled_low([0.01, 0.0, 0.01]) < 0.18 < pooled_low([0.40, 0.42, 0.41])  # rope at its floor, under YaRN above
    words = ablate_report.md_past({"reference": "rope", "retrieval_past_L0": {"shared": claims}})
    assert "| alibi | alibi-retrieves-past-L0-vs-rope-yarn | 1, 3, 5 | 0.85 | 0.41 (rope-yarn) |" in words
    assert "| alibi | alibi-retrieves-past-L0-vs-rope | 1, 3, 5 | 0.85 | 0.01 (rope) |" in words
    assert "no test: the comparator at its floor |" in words
    assert (
        "| none | none-retrieves-past-L0-vs-rope | none | — | — | — | — | — | no test: no seed where both learned |"
        in words
    )
    assert (
        "| learned | learned-retrieves-past-L0-vs-rope | none | — | — | — | — | — | no test: no window past L0 |"
        in words
    )
    assert "retrieves more than rope-yarn" in words and "retrieves less than rope-yarn" in words


def test_the_guides_first_ablation_quotes_its_committed_results():
    """docs/ablation.md's first section cites docs/ablation_quick: its verdict lines are the report's, written again
    from results.json now, and its loss and steps figures are the file's."""
    folder = ROOT / "docs" / "ablation_quick"
    results = json.loads((folder / "results.json").read_text())
    verdicts = ablate_report.md_verdicts(results)
    assert verdicts in (folder / "results.md").read_text()
    guide = (ROOT / "docs" / "ablation.md").read_text().split("\n## ")[1]
    lines = [line for line in verdicts.splitlines() if line.startswith("- ")]
    assert len(lines) == 4 and all(line in guide for line in lines)
    rope, sinusoidal = (results["schemes"][name]["shared"] for name in ("rope", "sinusoidal"))
    past = [
        [v["mean"] for L, v in figures["loss_by_length"][scaling].items() if int(L) > results["block_size"]]
        for figures, scaling in ((rope, "yarn"), (sinusoidal, "none"))
    ]
    cited = " against ".join(f"{min(p):.2f} to {max(p):.2f}" for p in past)
    assert f"({cited} nats" in " ".join(guide.split())
    steps = {s for s, learned in zip(sinusoidal["learning"]["steps"], sinusoidal["learning"]["learned"], strict=True)}
    assert steps == {600} and "at step 600 on" in guide
    learned = [s for s, ok in zip(rope["learning"]["steps"], rope["learning"]["learned"], strict=True) if ok]
    assert f"RoPE at {min(learned)} to {max(learned):,}" in " ".join(guide.split())
