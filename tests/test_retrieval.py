"""lab/retrieval.py: the probe has no shortcut (a hand-written model that answers by elimination, never reading the
query's key, scores at chance by distance and 1 / (pairs - j + 1) at slot j; one that copies the latest needle
passes only the shortest distances, whatever the window), an oracle that retrieves up to distance D gets
k_max = D at both thresholds, the grid and the mean of seeds' grids, and chance's false-pass rate."""

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

from data.recall import FILLER, KEYS, NEEDLE, VALUES, distances
from data.tokenizer import CharTokenizer
from lab.retrieval import THRESHOLDS, Probe, ProbeSettings, distance_plots, grid_mean, kmax

TOK = CharTokenizer(sorted(set("\n !',:;?" + FILLER + KEYS + VALUES)))
KEY_IDS, WRONG = {TOK.stoi[k] for k in KEYS}, TOK.stoi["."]
L0, PAIRS = 64, 10


class Runtime:
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
        self.config = SimpleNamespace(original_len=L0, block_size=L0, pos_emb=pos_emb)

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
                answer = [WRONG, WRONG] if s is None else row[s + 1:s + 3]
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


def oracle(D):
    return lambda needles, queried, key, t: needles[key] if t - needles[key] <= D else None


def probe(lengths="1", trials=16):
    meta = {"tokenizer": "char", "chars": TOK.chars, "vocab_size": len(TOK.chars)}
    return Probe(meta, L0, ProbeSettings(probe_lengths=lengths, probe_trials=trials), PAIRS, 4096, "cpu")


def binomial_tolerance(p, n):
    return 3 * math.sqrt(p * (1 - p) / n)


def test_elimination_scores_chance_by_distance_and_one_in_the_unasked_by_slot():
    p = probe()
    by_k = p.by_distance(Answerer(eliminator), L0, Runtime)
    assert p.chance == 1 / PAIRS and list(by_k) == [str(k) for k in distances(L0, 32)]
    mean = sum(by_k.values()) / len(by_k)
    assert abs(mean - p.chance) < binomial_tolerance(p.chance, 16 * len(by_k))
    assert kmax(by_k, THRESHOLDS["pi"]) < distances(L0, 32)[2]  # chance passes 20% at a distance now and then
    by_slot = p.by_slot(Answerer(eliminator), L0, Runtime)
    assert by_slot[str(PAIRS)] == 1.0 and set(by_slot) == set(p.elimination)  # the last slot: always right
    for j, share in by_slot.items():
        assert abs(share - p.elimination[j]) < binomial_tolerance(p.elimination[j], 512) + 1e-9


def test_a_model_reading_keys_scores_alike_at_every_slot_and_distance():
    p = probe()
    assert set(p.by_slot(Answerer(oracle(L0)), L0, Runtime).values()) == {1.0}
    assert set(p.by_distance(Answerer(oracle(L0)), L0, Runtime).values()) == {1.0}


@pytest.mark.parametrize("i", [0, 7, 31])
def test_an_oracle_retrieving_up_to_distance_D_has_k_max_D_at_both_thresholds(i):
    D = distances(L0, 32)[i]
    by_k = probe(trials=2).by_distance(Answerer(oracle(D)), L0, Runtime)
    assert {name: kmax(by_k, th) for name, th in THRESHOLDS.items()} == {"pi": D, "strict": D}
    assert kmax(by_k, 0.2) == kmax(by_k, 1.0) == D


def test_copying_the_latest_needle_passes_only_the_shortest_distances_whatever_the_window():
    # with the other needles placed uniformly, the latest needle would be the asked one at every distance that is
    # short against the window: a model reading no key would seem to retrieve up to a sixth of it
    p = probe("1,4")
    for W in (64, 256):
        by_k = p.by_distance(Answerer(latest), W, Runtime)
        assert by_k[str(NEEDLE)] == 1.0 and kmax(by_k, 0.9) < 8 and kmax(by_k, 0.2) < 8 * NEEDLE


def test_k_max_is_the_largest_distance_retrieved_all_the_way_up_to():
    by_k = {"3": 0.95, "10": 0.9, "20": 0.5, "30": 0.95, "40": 0.1}
    assert kmax(by_k, 0.9) == 10 and kmax(by_k, 0.2) == 30 and kmax(by_k, 0.99) == 0 and kmax(None, 0.2) is None


def test_the_grid_spans_the_lengths_with_none_past_a_schemes_reach_and_is_the_same_every_time():
    p, D = probe("1,2,4", trials=2), distances(L0, 32)[20]
    grid = p.grid(Answerer(oracle(D), pos_emb="learned"), Runtime)
    assert list(grid) == ["64", "128", "256"] and grid["128"] is grid["256"] is None  # learned positions stop at L0
    assert kmax(grid["64"], THRESHOLDS["pi"]) == kmax(grid["64"], THRESHOLDS["strict"]) == D
    assert list(grid["64"]) == [str(k) for k in distances(64, 32)]
    assert all(torch.equal(a, b) for a, b in zip(p.windows[64].values(), probe("1", trials=2).windows[64].values()))


def test_grids_of_seeds_average_cell_by_cell_and_keep_what_a_scheme_cannot_reach():
    a, b = {"16": {"3": 1.0, "14": 0.5}, "32": None}, {"16": {"3": 0.5, "14": 0.0}, "32": None}
    assert grid_mean([a, b]) == {"16": {"3": 0.75, "14": 0.25}, "32": None}


def test_chance_passes_20_percent_at_one_distance_as_the_binomial_tail_says():
    p = probe(trials=16)
    tail = sum(math.comb(16, h) * 0.1 ** h * 0.9 ** (16 - h) for h in range(4, 17))  # 4 of 16 reach 20%
    assert p.false_pass(0.2) == pytest.approx(tail) and 0.06 < tail < 0.07
    assert probe(trials=10).false_pass(0.9) == pytest.approx(sum(math.comb(10, h) * 0.1 ** h * 0.9 ** (10 - h)
                                                                 for h in (9, 10)))


def test_bad_probe_settings_fail_with_what_is_valid():
    with pytest.raises(ValueError, match="probe_distances=1 must be >= 2"):
        ProbeSettings(probe_distances=1)
    with pytest.raises(ValueError, match=r"probe length 32 \(L0 = 64\): a probe window of W=32 tokens cannot"):
        probe("0.5")  # 10 needles need 35 tokens


def test_the_distance_plots_draw_a_panel_per_grid(tmp_path):
    pytest.importorskip("matplotlib")
    from lab.report import Plots
    plots = Plots(tmp_path)
    grid = {"64": {"3": 1.0, "62": 0.5}, "128": None}
    distance_plots(plots, [("step 500", grid), ("step 1000", grid)], L0, 0.1, "retrieval.png", "by distance")
    assert plots.written == [("retrieval.png", "by distance")] and (tmp_path / "retrieval.png").stat().st_size > 1000
