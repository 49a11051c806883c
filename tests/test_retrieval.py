"""lab/retrieval.py: the probe has no shortcut (a hand-written model that answers by elimination, never reading the
query's key, scores at chance by distance and 1 / (pairs - j + 1) at slot j; one that copies the latest needle, or
the needle nearest a fixed distance, scores what its cells record, at most its floor, and reaches no distance; every
cell of every window the lab probes has a floor of at most twice chance that no copier of any rank or place beats,
where a perfect reader reaches the whole window and a 97% one too at 90%), an oracle that retrieves up to distance D
gets k_max at the cell that holds D at both thresholds, the windows the same every time, and seeds' cells pooled as
shares; the readout by cells: Clopper-Pearson intervals, floors, bands, the reach neither one unlucky cell nor a
copier can decide and RULER's effective length at a fixed reference, the readout of all three at once, and its error
rates (exact) against a 97% reader and the best copier on the probe's layout."""

import contextlib
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from data.recall import FILLER, KEYS, NEEDLE, VALUES
from data.tokenizer import CharTokenizer
from lab.retrieval import (
    BANDS,
    DISTANCE,
    GOOD,
    MAX_FLOOR,
    SLOT,
    THRESHOLDS,
    Probe,
    ProbeSettings,
    band,
    bands,
    distance_plots,
    effective_length,
    error_rates,
    forks,
    interval,
    papers_reach,
    pass_rate,
    passes,
    pooled,
    probe_generator,
    reach,
    read_pools,
    readout,
    readout_errors,
    shares,
)

TOK = CharTokenizer(sorted(set("\n !',:;?" + FILLER + KEYS + VALUES)))
KEY_IDS, WRONG = {TOK.stoi[k] for k in KEYS}, TOK.stoi["."]
L0, PAIRS = 64, 10


class Runtime:
    dtype = torch.float32

    @staticmethod
    def autocast():
        return contextlib.nullcontext()


class Answerer(torch.nn.Module):
    """GPT's call signature, model(x, y) -> (logits, loss), answering each query (a key seen before) with the
    capitals of the needle pick(needles, queried, key, t) chooses: needles {key: start} so far, the keys queried
    before, the query's key and place; None answers wrong."""

    def __init__(self, pick, pos_emb="rope"):
        super().__init__()
        self.pick = pick
        self.config = SimpleNamespace(L0=L0, block_size=L0, pos_emb=pos_emb)

    def forward(self, x, y=None):
        logits = torch.zeros(*x.shape, len(TOK.chars))  # (B, T, vocab)
        for b, row in enumerate(x.tolist()):
            needles, queried = {}, set()
            for t, c in enumerate(row):
                if c not in KEY_IDS:
                    continue
                if c not in needles:
                    needles[c] = t
                    continue
                s = self.pick(needles, queried, c, t)
                answer = [WRONG, WRONG] if s is None else row[s + 1 : s + 3]
                for d, token in enumerate(answer):
                    if t + d < len(row):
                        logits[b, t + d, token] = 1
                queried.add(c)
        return logits, None


def eliminator(needles, queried, key, t):
    """A needle not queried yet, chosen by its key letter (which says nothing of which is asked): never the key."""
    return needles[min(k for k in needles if k not in queried)]


def latest(needles, queried, key, t):
    return max(needles.values())


def nearest(x):
    """The needle whose key lies nearest distance x before the query's (the one nearer the query on a tie)."""
    return lambda needles, queried, key, t: min(needles.values(), key=lambda s: (abs(t - s - x), t - s > x))


def oracle(D):
    return lambda needles, queried, key, t: needles[key] if t - needles[key] <= D else None


def noisy(accuracy, seed):
    """A reader that reads every key and answers right with probability accuracy, wrong otherwise."""
    rng = np.random.default_rng(seed)
    return lambda needles, queried, key, t: needles[key] if rng.random() < accuracy else None


def probe(lengths="1", trials=1, windows=None, length=L0):
    meta = {"tokenizer": "char", "chars": TOK.chars, "vocab_size": len(TOK.chars)}
    settings = ProbeSettings(probe_lengths=lengths, probe_trials=trials, probe_slots=512 if length == L0 else 8)
    return Probe(meta, length, settings, PAIRS, 4096, "cpu", lengths=windows)


def cell(trials, hits, floor=0.1):
    """A hand-written cell whose best copier is right floor of the time."""
    return {"trials": trials, "hits": hits, "blind": {"0": floor}}


def binomial_tolerance(p, n):
    return 3 * math.sqrt(p * (1 - p) / n)


def test_elimination_scores_chance_by_distance_and_one_in_the_unasked_by_slot():
    p = probe()
    cells = p.counts(Answerer(eliminator), L0, Runtime)["cells"]
    assert p.chance == 1 / PAIRS and list(cells) == ["32", "64"]  # L0 = 64 in cells of 32 distances
    trials = sum(c["trials"] for c in cells.values())
    mean = sum(c["hits"] for c in cells.values()) / trials
    assert abs(mean - p.chance) < binomial_tolerance(p.chance, trials)
    assert reach(cells, THRESHOLDS["pi"]) == 0
    by_slot = p.by_slot(Answerer(eliminator), L0, Runtime)
    assert by_slot[str(PAIRS)] == 1.0 and set(by_slot) == set(p.elimination)  # the last slot: always right
    for j, share in by_slot.items():
        assert abs(share - p.elimination[j]) < binomial_tolerance(p.elimination[j], 512) + 1e-9


def test_the_slot_probe_builds_its_windows_once_the_same_as_built_afresh(monkeypatch):
    p = probe()
    fresh = p.recall.slot_windows(L0, 512, probe_generator(SLOT, L0))  # probe_slots, from the same seed
    assert torch.equal(p.slots[L0], fresh)
    built = []
    monkeypatch.setattr(p.recall, "slot_windows", lambda *args: built.append(args))
    assert p.by_slot(Answerer(eliminator), L0, Runtime) == p.by_slot(Answerer(eliminator), L0, Runtime)
    assert built == []


def test_a_model_reading_keys_scores_alike_at_every_slot_and_distance():
    p = probe()
    assert set(p.by_slot(Answerer(oracle(L0)), L0, Runtime).values()) == {1.0}
    counts = p.counts(Answerer(oracle(L0)), L0, Runtime)
    assert all(c["hits"] == c["trials"] for part in counts.values() for c in part.values())


@pytest.mark.parametrize("D", [32, 64, 96])
def test_an_oracle_retrieving_up_to_distance_D_has_k_max_at_the_cell_that_ends_at_D_at_both_thresholds(D):
    cells = probe("2").counts(Answerer(oracle(D)), 2 * L0, Runtime)["cells"]
    assert list(cells) == ["32", "64", "96", "128"]
    assert all(c["hits"] == (c["trials"] if int(k) <= D else 0) for k, c in cells.items())
    assert {name: reach(cells, th) for name, th in THRESHOLDS.items()} == {"pi": D, "strict": D}


@pytest.mark.parametrize(("copier", "name"), [(latest, "0"), (nearest(10), "d10"), (nearest(100), "d100")])
def test_a_copier_by_rank_or_place_scores_its_counted_share_at_most_its_floor_and_reaches_nothing(copier, name):
    # through the probe's windows: the copier of rank 0 (the latest needle), or of the needle nearest a distance,
    # scores exactly the share of a cell's queries the cell records for it, and no more than the floor
    p = probe("1,2,4")
    for W in [W for W in (64, 128, 256) if name == "0" or int(name[1:]) < W]:  # a place in the window
        cells = p.counts(Answerer(copier), W, Runtime)["cells"]
        _, _, distance = p.recall.block_windows(W, 1, probe_generator(DISTANCE, W))
        every = p.copiers(distance, (distance - 1) // 32)  # every copier, the cells listing the strongest
        for k, c in cells.items():
            share = every[int(k) // 32 - 1][name]
            assert c["hits"] == round(c["trials"] * share) and share <= max(c["blind"].values())
        for b in bands(cells, L0, 2).values():
            assert b is None or b["accuracy"] <= b["floor"] + 1e-9
        assert reach(cells, THRESHOLDS["pi"]) == reach(cells, THRESHOLDS["strict"]) == 0


def test_the_windows_span_the_lengths_and_are_the_same_every_time():
    p = probe("1,2,4")
    assert list(p.windows) == [64, 128, 256] and p.distances[64] == [32, 64] and p.distances[256][-1] == 256
    assert all(torch.equal(a, b) for a, b in zip(p.windows[64], probe("1").windows[64], strict=True))


def test_seeds_cells_pool_into_shares_by_distance():
    a = {"3": {"trials": 4, "hits": 4}, "14": {"trials": 4, "hits": 2}}
    b = {"3": {"trials": 4, "hits": 2}, "14": {"trials": 4, "hits": 0}}
    assert shares([a, b]) == {"3": 0.75, "14": 0.25} and shares([a]) == {"3": 1.0, "14": 0.5}


def test_a_seeds_cells_are_json_each_its_queries_and_the_shares_of_its_copiers():
    p = probe()
    cells = p.counts(Answerer(oracle(30)), L0, Runtime)["cells"]
    assert json.loads(json.dumps(cells)) == cells
    # recounted from the windows: each needle's distance, the cell it falls in (32 distances each)
    _, _, distance = p.recall.block_windows(L0, 1, probe_generator(DISTANCE, L0))
    assert cells == {
        str(k): {
            "trials": int(((distance - 1) // 32 == i).sum()),
            "hits": int(((distance - 1) // 32 == i).logical_and(distance <= 30).sum()),
            "blind": p.blind[L0][k],
        }
        for i, k in enumerate((32, 64))
    }
    for by in p.blind[L0].values():  # each query's needle has one rank: the rank copiers' shares add up to 1
        assert sum(v for c, v in by.items() if not c.startswith("d")) == pytest.approx(1)


def test_the_interval_is_clopper_pearsons_and_a_cells_pass_rate_its_binomial_tail():
    for hits, trials in [(0, 16), (7, 16), (16, 16), (150, 192)]:
        low = stats.beta.ppf(0.025, hits, trials - hits + 1) if hits else 0.0
        high = stats.beta.ppf(0.975, hits + 1, trials - hits) if hits < trials else 1.0
        assert interval(hits, trials) == pytest.approx((low, high))
    for accuracy, trials, threshold, floor in [(0.1, 16, 0.2, 0.1), (0.1, 192, 0.2, 0.1), (0.97, 16, 0.9, 0.45)]:
        tail = sum(
            stats.binom.pmf(h, trials, accuracy)
            for h in range(trials + 1)
            if interval(h, trials)[0] > floor and h / trials >= threshold
        )
        assert pass_rate(accuracy, trials, threshold, floor) == pytest.approx(tail)
    # the best copier passes 20% only where its interval clears its own floor: 5 of 16 hits and more
    assert error_rates([(16, 0.1)] * 8, 0.2)["false_pass"] == pytest.approx(stats.binom.sf(4, 16, 0.1))
    # a window's last pool may hold fewer trials: each cell counts at its own, and a thinner cell fails more often
    uneven = error_rates([(192, 0.1)] * 7 + [(96, 0.1)], 0.9)["false_fail"]
    assert uneven == pytest.approx(1 - pass_rate(0.97, 192, 0.9, 0.1) ** 7 * pass_rate(0.97, 96, 0.9, 0.1))
    assert uneven > error_rates([(192, 0.1)] * 8, 0.9)["false_fail"]
    assert error_rates([], 0.9) == {"false_fail": 0, "false_pass": 0}  # a window with no cell reads nothing


def test_a_cells_floor_is_its_best_copiers_share_and_a_cell_is_read_only_where_a_97_percent_reader_clears_it():
    # one copier for every pooled distance: the best rank over the pool, not the best rank of each distance
    a = {"trials": 48, "hits": 0, "blind": {"0": 0.1, "1": 0.9}}
    b = {"trials": 16, "hits": 0, "blind": {"0": 0.1, "1": 0.45, "2": 0.45}}
    assert pooled({"7": a, "9": b}, 2)[0][3] == pytest.approx((48 * 0.9 + 16 * 0.45) / 64)
    assert read_pools({"7": a}) == []  # 46 of 48 (a 97% reader's, half the time) has an interval from 0.86 < 0.9
    assert [k for k, *_ in read_pools({"7": a}, 1)] == [] and len(read_pools({"7": a, "9": b}, 2)) == 1
    assert passes(16, 16, 0.45, 0.9) and not passes(7, 16, 0.45, 0.2)  # 7 of 16 reaches 20%, not above 45%
    # the accuracy itself must reach the threshold: 14 of 16 (87.5%) does not reach 90%, though its interval does
    assert interval(14, 16)[1] >= 0.9 and not passes(14, 16, 0.1, 0.9) and passes(15, 16, 0.1, 0.9)


def test_one_unlucky_cell_does_not_decide_the_reach_and_pooled_cells_add_their_trials():
    cells = {str(k): cell(16, h) for k, h in [(6, 16), (9, 15), (12, 12), (15, 1), (18, 16)]}
    # the papers' rule: 12 of 16 (75%) does not reach 90% though its interval does, so the reach stops before it
    assert 12 / 16 < 0.9 <= interval(12, 16)[1]
    assert reach(cells, 0.9) == 9 and reach({}, 0.2) is None
    assert reach(cells, 0.2) == 12  # 1 of 16 does not lie above the floor (10%): a copier could score it
    assert pooled(cells, 2) == [(9, 32, 31, 0.1), (15, 32, 13, 0.1), (18, 16, 16, 0.1)]
    assert reach(cells, 0.9, per=2) == 9 and reach(cells, 0.2, per=2) == 18  # 31 of 32 reaches 90%, 13 of 32 20%
    assert band(cells, 6, 15) == {
        "trials": 48,
        "hits": 28,
        "accuracy": 28 / 48,
        "ci": list(interval(28, 48)),
        "floor": pytest.approx(0.1),
    }
    assert band(cells, 15, 40) == {
        "trials": 16,
        "hits": 16,
        "accuracy": 1.0,
        "ci": list(interval(16, 16)),
        "floor": pytest.approx(0.1),
    }
    assert band(cells, 18, 40) is None  # (lo, hi]: distance 18 lies in the band below
    assert list(bands(cells, 8, 1.5)) == ["inside L0", "L0 to sL0", "sL0 to 2sL0"]
    assert bands(cells, 8, 1.5)["L0 to sL0"]["trials"] == 32  # distances 9 and 12 lie in (8, 12]
    assert tuple(bands(cells, 8, 1.5)) == BANDS


def test_the_readout_is_the_bands_the_reach_at_each_threshold_and_the_effective_length():
    cells = {str(k): cell(16, h) for k, h in [(6, 16), (9, 15), (12, 12), (15, 1), (18, 16)]}
    assert readout(cells, 8, 1.5, 0.8, per=2) == {
        "bands": bands(cells, 8, 1.5),
        "reach": {"pi": reach(cells, 0.2, 2), "strict": reach(cells, 0.9, 2)},
        "effective_length": effective_length(cells, 0.8, per=2),
    }
    errors = readout_errors(cells, 2)  # pooled: 32, 32 and 16 trials
    assert errors == {"trials": 32, "cells": 3, "floor": pytest.approx(0.1)} | {
        name: error_rates([(32, 0.1), (32, 0.1), (16, 0.1)], th) for name, th in THRESHOLDS.items()
    }
    assert readout_errors({}, 2) == {"trials": 0, "cells": 0, "floor": None} | {
        name: error_rates([], th) for name, th in THRESHOLDS.items()
    }


def test_pis_rule_in_its_own_words_and_ours_agree_where_a_model_lies_above_both():
    # floors of 18%, below PI's 20%: a cell clearly above both passes both rules, one below 20% fails both
    cells = {"32": cell(165, 50, 0.18), "64": cell(320, 200, 0.18), "96": cell(320, 30, 0.18), "128": cell(165, 90)}
    assert papers_reach(cells, 0.2) == reach(cells, 0.2) == 64
    # they part only where a cell reaches 20% with an interval that touches its floor: 34 of 165 (0.206)
    cells["64"] = cell(165, 34, 0.18)
    assert papers_reach(cells, 0.2) == 64 and reach(cells, 0.2) == 32


def test_the_effective_length_reads_the_reach_at_the_reference_it_is_given():
    cells = {str(k): cell(100, h) for k, h in [(10, 80), (40, 80), (70, 78), (100, 60), (130, 20)]}
    assert effective_length(cells, 0.8) == {"reference": 0.8, "length": 40}  # 78 of 100 falls short of 80%
    assert effective_length(cells, 0.4) == {"reference": 0.4, "length": 100}
    assert effective_length({}, 0.4) is None and effective_length(cells, None) is None


def test_a_model_at_its_floor_has_no_effective_length_whatever_the_reference():
    # 12 of 100 inside L0 (interval [0.064, 0.20] holds the floor 0.1): its own accuracy as a reference would pass
    # every distance; a cell must lie above its floor
    cells = {str(k): cell(100, h) for k, h in [(10, 12), (40, 9), (70, 11), (100, 10)]}
    assert all(effective_length(cells, ref) == {"reference": ref, "length": 0} for ref in (0.12, 0.5, 0.9))
    cells["10"] = cell(100, 30)  # one shown above its floor keeps its reading: 30 of 100 (interval from 0.21)
    assert effective_length(cells, 0.3) == {"reference": 0.3, "length": 10}


# the windows the lab probes: L0 = 64 (configs/extend_cpu.toml at s = 2, extend_wide_cpu.toml at s = 2 and 4, the
# ablation's 1 and 8 x L0) and L0 = 256's at s = 4 (extend_l256_cpu.toml); each at the configs' probe_pairs (10) and
# probe_trials (1), read one cell at a time (probe_pool 1) and two
LAB_WINDOWS = {64: (64, 128, 256, 512), 256: (256, 1024, 2048)}  # {L0: windows}


def lab_probes():
    """{L0: the probe of the lab's windows at that L0}, built once for the tests that read them."""
    return {lab_L0: probe(windows=list(windows), length=lab_L0) for lab_L0, windows in LAB_WINDOWS.items()}


def lab_cells(p, W, share):
    """A window's cells as Probe.cells writes them, a reader right share(k) of each cell's queries."""
    cells = p.cells(W, dict.fromkeys(p.distances[W], 0))["cells"]
    return {k: c | {"hits": round(c["trials"] * share(int(k)))} for k, c in cells.items()}


def test_every_cell_of_every_window_the_lab_probes_has_a_floor_of_at_most_twice_chance_and_none_is_left_out():
    """Issue 60, item 4: no strategy that reads no key, by recency rank, by place (the needle nearest a fixed
    distance, in a window of fixed length the needle nearest a fixed position) or by the window's edges (ranks 0
    and pairs - 1), scores more than twice chance in any cell; and the cells tile the whole window, from the
    needle right before the query to the window's start."""
    for lab_L0, p in lab_probes().items():
        assert p.width == 32
        for W in LAB_WINDOWS[lab_L0]:
            assert p.distances[W] == list(range(32, W + 1, 32))  # every cell kept: none above the floor's bound
            assert len(p.windows[W][0]) == W - 2 - 30 + 1  # the block at every place
            for k, by in p.blind[W].items():
                ranks = {c for c in by if not c.startswith("d")}
                assert ranks == {str(r) for r in range(PAIRS)} and max(by.values()) <= MAX_FLOOR * p.chance, (W, k)


def test_at_the_papers_length_cells_span_more_distances_and_the_block_steps_so_that_a_cell_holds_about_320():
    # L0 = 4,096 (configs/extend_gpu.toml, ablate_gpu.toml): 16 cells inside L0, of 256 distances, the block at every
    # 8th place: 2,045 windows of 16,384 tokens rather than 16,353, every floor still at most twice chance
    p = probe(windows=[16384], length=4096)
    assert p.width == 256 and len(p.windows[16384][0]) == len(range(0, 16384 - 2 - 30 + 1, 8)) == 2045
    assert p.distances[16384] == list(range(256, 16384 + 1, 256))
    assert max(max(by.values()) for by in p.blind[16384].values()) <= MAX_FLOOR * p.chance
    assert 300 <= min(p.trials[16384].values()) <= 320


@pytest.mark.parametrize("per", [1, 2])
def test_each_cell_records_a_floor_no_copier_beats_and_a_near_perfect_reader_reaches_the_whole_window(per):
    """Issue 50, item 3 and issue 60, item 4: copying the needle of a fixed recency rank, or the needle nearest a
    fixed place, never reads a key. In every window the lab probes, each cell's recorded copiers (`listed`: the
    ranks and the places that beat them) hold the best of every copier counted on the windows, so no copier scores
    above the floor a cell is read against, and none can pass (a share at or below the floor has an interval that
    reaches it); a perfect reader reaches the whole window with 1 and 2 cells pooled, a 97% one too at 90% (its
    expected hits, rounded)."""
    for lab_L0, p in lab_probes().items():
        for W in LAB_WINDOWS[lab_L0]:
            _, _, distance = p.recall.block_windows(W, 1, probe_generator(DISTANCE, W))
            every = p.copiers(distance, (distance - 1) // p.width)  # {cell j: every copier's share}
            for k, by in p.blind[W].items():
                assert max(by.values()) == max(every[k // p.width - 1].values()), (W, k)
            for share, names in [(1.0, THRESHOLDS), (GOOD, ["strict"])]:
                cells = lab_cells(p, W, lambda k, share=share: share)
                assert all(reach(cells, THRESHOLDS[n], per) == W for n in names), (W, share)


def test_a_97_percent_reader_reads_the_whole_window_and_the_best_copier_nothing_at_the_rates_computed():
    """On the probe's layout at L0 = 64, s = 2 (windows of 128): 4 cells of 165 to 320 queries; a hand-written
    reader through the probe, then its cells' hits simulated, seeded, against the exact rates: a 97% reader, and
    the copier the first cell favours most."""
    p = probe("2")
    cells = p.counts(Answerer(noisy(GOOD, 0)), 128, Runtime)["cells"]
    assert reach(cells, THRESHOLDS["strict"]) == reach(cells, THRESHOLDS["pi"]) == 128
    errors = readout_errors(cells, 1)
    first = cells["32"]["blind"]
    best = max(first, key=first.get)
    trials = np.array([c["trials"] for c in cells.values()])
    rng, runs = np.random.default_rng(1), 2000
    for accuracy, threshold, good in [
        (np.full(len(cells), GOOD), THRESHOLDS["strict"], True),
        (np.array([c["blind"].get(best, 0.0) for c in cells.values()]), THRESHOLDS["pi"], False),
    ]:
        reads = [
            reach({k: c | {"hits": int(h)} for (k, c), h in zip(cells.items(), hits, strict=True)}, threshold)
            for hits in rng.binomial(trials, accuracy, (runs, len(trials)))
        ]
        name = "strict" if good else "pi"
        rate = errors[name]["false_fail" if good else "false_pass"]
        seen = np.mean([r != 128 for r in reads] if good else [r > 0 for r in reads])
        tolerance = 4 * math.sqrt(rate * (1 - rate) / runs) + 2 / runs
        assert rate <= 0.05 and seen < rate + tolerance, name
        if good:  # exact; the copier's rate bounds it (its rate varies by distance: less spread than at the floor)
            assert seen > rate - tolerance


def test_bad_probe_settings_fail_with_what_is_valid():
    for pairs in (1, 14):  # one needle: chance is 100%; 14 needles: 28 capitals, of 26
        with pytest.raises(ValueError, match=rf"probe_pairs={pairs} must lie in \[2, 13\]"):
            ProbeSettings(probe_pairs=pairs)
    for name in ("probe_trials", "probe_slots"):
        with pytest.raises(ValueError, match=f"{name}=0 must be a positive integer"):
            ProbeSettings(**{name: 0})
    with pytest.raises(ValueError, match=r"probe length 16 \(L0 = 64\): a probe window of W=16 tokens cannot hold"):
        probe("0.25")  # a block of 10 needles is 30 tokens
    with pytest.raises(ValueError, match="probe_pool=0 must be a positive integer"):
        ProbeSettings(probe_pool=0)


def test_the_lab_tools_pool_the_probes_cells_by_one_setting_which_the_probe_bench_does_not_take():
    import bench
    from lab import ablate, extend

    pool = ProbeSettings.__dataclass_fields__["probe_pool"]
    assert ablate.AblateConfig.__dataclass_fields__["probe_pool"] is pool
    assert extend.ExtendConfig.__dataclass_fields__["probe_pool"] is pool
    assert "probe_pool" not in bench.BenchConfig.__dataclass_fields__


def test_the_distance_plots_draw_a_panel_per_grid(tmp_path):
    pytest.importorskip("matplotlib")
    from lab.report import Plots

    plots = Plots(tmp_path)
    grid = {"64": {"3": 1.0, "62": 0.5}, "128": None}
    distance_plots(plots, [("step 500", grid), ("step 1000", grid)], L0, 0.1, "retrieval.png", "by distance")
    assert plots.written == [("retrieval.png", "by distance")] and (tmp_path / "retrieval.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "changes",
    [{}, {"rope_scaling": "yarn", "rope_scaling_factor": 2.0, "original_len": 32}, {"pos_emb": "alibi"}],
)
@pytest.mark.slow
def test_a_context_read_once_gives_each_query_the_logits_of_its_own_whole_window(changes):
    """Probe.forked_answers against whole_answers on each query's window, on a small GPT whose answers are made its
    own greedy ones there (so that a right answer is any logit's doing): all right forked too, and all wrong where
    the second capital is changed. A dynamic scaling (its frequencies change with the length) reads windows whole."""
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=len(TOK.chars), **changes)
    model = GPT(config).eval()
    p, W = probe("2"), 128
    contexts, needles, asked = p.windows[W]
    owner, which = (asked >= 0).nonzero(as_tuple=True)
    rows = contexts[owner].clone()
    rows[:, -NEEDLE:] = needles[owner, which]
    with torch.no_grad():  # the model's own answer: V its argmax after the key, then W its argmax after that V
        for t in (W - 1, W):
            rows[:, t] = model(rows[:, :-1], rows[:, 1:])[0][:, t - 1].argmax(-1)
    queries = rows[:, -NEEDLE:]
    assert forks(model) and p.whole_answers(model, rows, [W - 2], Runtime).all()
    assert p.forked_answers(model, contexts, owner, queries, Runtime).all()
    wrong = queries.clone()
    wrong[:, 2] = (wrong[:, 2] + 1) % len(TOK.chars)
    assert not p.forked_answers(model, contexts, owner, wrong, Runtime).any()
    if config.takes("rope_scaling"):
        dynamic = GPT(GPTConfig(**{**config.asdict(), "rope_scaling": "dynamic", "rope_scaling_factor": 2.0}))
        assert not forks(dynamic)
