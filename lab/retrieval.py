"""Retrieval by distance, shared by the lab's tools: the recall probe (data/recall.py writes its windows, this
module scores them) into cells of whole answers by window length and needle-to-query distance, the
effective context window k_max read from them, the slot check for the elimination shortcut, the cells of
several seeds as one (`shares`), and the plots that show them.

The effective window is the PI paper's passkey measure (Chen et al. 2023, "Extending Context Window of Large
Language Models via Positional Interpolation", the passkey retrieval of its Table 4): a needle-to-query *distance*,
the largest k such that the passkey is retrieved in at least 20% of the trials at every distance up to k, the
distances spread evenly across the target context with several trials each. `reach` computes it at PI's 20%
and, beside it, at our stricter 90% (`THRESHOLDS`), from each distance's cell.

The readout that measures the model rather than its trial count reads a seed's cells, {str(k): {"trials", "hits"}}
by distance (`Probe.counts`, JSON as results.json keeps them; the cells whose layout forces the answer kept apart):
  interval(hits, trials)              the cell's 95% Clopper-Pearson interval
  pooled(cells, per)                  cells of `per` consecutive distances each, keyed by their longest
  band(cells, lo, hi), bands(...)     accuracy over the distances in (lo, hi] with its interval; the BANDS inside
                                      L0, L0 to s L0 and s L0 to 2s L0 that retrieval claims test
  reach(cells, threshold, per)        k_max where a cell fails only when its interval lies wholly below threshold
  effective_length(cells, L0, ...)    RULER's effective length: reach at the model's own accuracy inside L0
  readout(cells, L0, s, chance, per)  a seed's bands, reach at each of THRESHOLDS and effective length at once
  pass_rate(...), error_rates(...)    what such a reading gets wrong, exactly (binomial), at given trials;
  readout_errors(cells, per, chance)  error_rates at each of THRESHOLDS over a window's pooled cells
  shares(seeds)                       {str(k): share of whole answers} over the cells of several seeds

scipy (the optional lab extra) is imported where a statistic needs it, so that importing this module for its
settings (bench.py does) needs no scipy.
"""

import bisect
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from config import POSITIVE, opt, validate
from data.recall import Recall, distances, query_keys
from data.tokenizer import tokenizer_from_meta
from lab.grid import numbers

THRESHOLDS = {"pi": 0.2, "strict": 0.9}  # PI's success rate for a distance to count, and ours
BANDS = ("inside L0", "L0 to sL0", "sL0 to 2sL0")  # the bands retrieval claims test (`bands`), in order
CONFIDENCE = 0.95  # of each cell's and band's interval
GOOD = 0.97  # the near-perfect reader whose false-fail rate a readout states
PROBE_SEED = 4321  # the probe's windows, the same for every model scored
DISTANCE, SLOT = 0, 1  # the probe's random streams


@dataclass
class ProbeWindows:
    """The probe's windows: what a Probe is built from (bench.py times one with these settings alone)."""

    probe_lengths: str = opt("0.5,1,2,4,8", "retrieval probe windows as multiples of L0, the trained length")
    probe_distances: int = opt(
        32,
        "needle-to-query distances probed per window, spread evenly from the shortest to "
        "the window's length (PI's passkey test spreads its distances alike)",
    )
    probe_trials: int = opt(16, "probe windows per length and distance")
    probe_pairs: int = opt(
        10,
        "needles in a probe window, the asked one among them: a whole answer by copying some "
        "needle without reading the key is right 1 time in probe_pairs (chance)",
    )

    def __post_init__(self):
        validate(self)  # the checks a subclass's fields declare (probe_pool's)
        if not 2 <= self.probe_pairs <= 13:  # a needle's two capitals are its own: 26 capitals hold 13 needles
            raise ValueError(
                f"probe_pairs={self.probe_pairs} must lie in [2, 13]: chance (1 / probe_pairs) must lie "
                f"below the strict threshold {THRESHOLDS['strict']:.0%} for a reading to tell retrieval "
                f"from copying (PI's {THRESHOLDS['pi']:.0%} needs at least 6), and 13 needles use every "
                "capital"
            )
        if self.probe_trials < 1:
            raise ValueError(f"probe_trials={self.probe_trials} must be a positive integer")
        if self.probe_distances < 2:
            raise ValueError(f"probe_distances={self.probe_distances} must be >= 2: the shortest and the longest")


@dataclass
class ProbeSettings(ProbeWindows):
    """The probe's settings, which every lab tool that scores retrieval takes (its settings class inherits them):
    its windows and how their cells are read."""

    probe_pool: int = opt(
        4,
        "consecutive probed distances pooled into one cell when k_max and the effective length "
        "are read, so that no single distance's trials decide them",
        check=POSITIVE,
    )


def probe_generator(stream, W, k=0):
    """A generator seeded by the probe's coordinates, so every model is scored on the same windows."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([PROBE_SEED, stream, W, k]).generate_state(1)[0]))


class Probe:
    """The recall probe: at each probed length W (a multiple of L0), `probe_trials` windows at each of
    `probe_distances` needle-to-query distances, one query at the window's end (data/recall.py's distance
    windows), scored as whole answers; and the slot check at L0. Every window is built once, here.

    What is scored and its floor: whole answers (V and W both the argmax) of the one query; a model that copies
    some needle's capitals without reading the key scores `chance` = 1/pairs at every distance, and passes a
    threshold by luck with the probability `error_rates` states as "false_pass", which the reports print beside
    k_max. A model that copies the latest (or the earliest) needle is right 1 time in pairs at most, except at the
    distances where the layout forces the answer (`forced`: no room for another needle between the asked one and
    the query, or none before it), which `counts` keeps apart from every summary."""

    def __init__(self, meta, L0, settings, pairs, tokens_per_forward, device, lengths=None):
        """Windows at each of settings.probe_lengths x L0, or at the given lengths (tokens)."""
        self.recall = Recall(tokenizer_from_meta(meta), pairs)
        self.settings, self.tokens_per_forward, self.device = settings, tokens_per_forward, device
        self.lengths = sorted(
            lengths
            or {round(m * L0) for m in numbers("probe_lengths", settings.probe_lengths, float, 0, "0.5,1,2,4,8")}
        )
        self.windows = {}  # {W: {k: (trials, W+1) rows}}
        for W in self.lengths:
            try:
                self.windows[W] = {
                    k: self.recall.distance_windows(W, k, settings.probe_trials, probe_generator(DISTANCE, W, k))
                    for k in distances(W, settings.probe_distances)
                }
            except ValueError as e:
                raise ValueError(f"probe length {W} (L0 = {L0}): {e}") from None
        # the slot probe's windows, built once (at L0, too short for the slot check: fails now): every base stage
        # asks for them
        self.slots = {
            L0: self.recall.slot_windows(
                L0, settings.probe_trials * settings.probe_distances, probe_generator(SLOT, L0)
            )
        }
        self.forced = {W: {k for k in rows if len(self.recall.ranks(W, k)) == 1} for W, rows in self.windows.items()}

    @property
    def made_with(self):
        """The settings its windows at a length are made from: what a score of it records (lab/grid.evaluated)."""
        s = self.settings
        return {"probe_trials": s.probe_trials, "probe_distances": s.probe_distances, "probe_pairs": self.recall.pairs}

    @property
    def chance(self):
        """Whole answers by distance of a model that copies a needle without reading the query's key."""
        return self.recall.chance

    @property
    def elimination(self):
        """{str(slot): whole answers} of the slot probe by a model that answers with a needle not yet queried,
        never reading a key: 1 / (pairs - slot + 1), 1 at the last slot."""
        pairs = self.recall.pairs
        return {str(j): 1 / (pairs - j + 1) for j in range(1, pairs + 1)}

    def counts(self, model, W, rt):
        """A seed's readout in windows of W tokens, as JSON: {"cells": {str(k): {"trials", "hits"}}, "forced": the
        same for the distances whose layout forces the answer (data/recall.py's `ranks`), kept apart from every
        summary}."""
        out = {"cells": {}, "forced": {}}
        for k, hits in self.hits(model, W, rt).items():
            out["forced" if k in self.forced[W] else "cells"][str(k)] = {
                "trials": self.settings.probe_trials,
                "hits": hits,
            }
        return out

    def hits(self, model, W, rt):
        """{k: whole answers} at each probed distance of windows of W tokens (a probed length)."""
        assert W in self.windows, f"W={W} is not a probed length ({self.lengths})"
        rows = self.windows[W]
        right = self.whole_answers(model, torch.cat(list(rows.values())), query_keys(W + 1, 1), rt)  # (n, 1)
        return {k: int(hits.sum()) for k, hits in zip(rows, right.split(self.settings.probe_trials), strict=True)}

    def by_slot(self, model, W, rt):
        """{str(j): share of whole answers} at query slot j = 1..pairs of windows of W = L0 tokens whose needles are
        all queried once, in a random order (as many windows as the distance probe has at a length)."""
        assert W in self.slots, f"W={W} is not the slot probe's length ({list(self.slots)})"
        right = self.whole_answers(model, self.slots[W], query_keys(W + 1, self.recall.pairs), rt)  # (n, pairs)
        return {str(j + 1): share.item() for j, share in enumerate(right.float().mean(0))}

    @torch.no_grad()
    def whole_answers(self, model, rows, keys, rt):
        """(n, queries) bools: for each row (n, W+1) and each query key position in keys, whether both answer
        tokens after it are the argmax given the tokens before (teacher-forced: exactly when greedy decoding would
        give them)."""
        at = torch.tensor(keys)[:, None] + torch.arange(2)  # (queries, 2): logits at the key, then at V
        x, y = rows[:, :-1], rows[:, 1:]
        per_forward = max(1, self.tokens_per_forward // x.shape[1])
        right = []
        for xs, ys in zip(x.split(per_forward), y.split(per_forward), strict=True):
            with rt.autocast():
                logits = model(xs.to(self.device), ys.to(self.device))[0]  # (b, W, vocab)
            guess = logits[:, at].argmax(-1).cpu()  # (b, queries, 2)
            right.append((guess == ys[:, at]).all(-1))
        return torch.cat(right)


@functools.cache  # a readout asks for the same few (hits, trials) many times
def interval(hits, trials):
    """(low, high): the 95% Clopper-Pearson interval of a share of hits in trials. Clopper-Pearson rather than
    Wilson: its coverage is at least 95% at every true accuracy, near 0 and 1 too, where the probe's cells lie; so
    an interval wholly below a threshold rejects "accuracy >= threshold" at 2.5% or less."""
    from scipy import stats  # here, not at the top: see the module's docstring (cached, so imported rarely)

    ci = stats.binomtest(hits, trials).proportion_ci(CONFIDENCE, method="exact")
    return float(ci.low), float(ci.high)


def pooled(cells, per=1):
    """[(k, trials, hits)] by distance: the cells {str(k): {"trials", "hits"}} pooled `per` consecutive distances
    at a time (the last pool may hold fewer), each keyed by its longest distance."""
    ks = sorted(cells, key=int)
    return [
        (int(group[-1]), sum(cells[k]["trials"] for k in group), sum(cells[k]["hits"] for k in group))
        for group in (ks[i : i + per] for i in range(0, len(ks), per))
    ]


def band(cells, lo, hi):
    """{"trials", "hits", "accuracy", "ci"} over the cells at distances in (lo, hi]; None where there are none.
    The interval treats the band's trials as one binomial: where accuracy varies with distance the true spread is
    smaller, so the interval is conservative."""
    inside = [c for k, c in cells.items() if lo < int(k) <= hi]
    trials, hits = sum(c["trials"] for c in inside), sum(c["hits"] for c in inside)
    return (
        {"trials": trials, "hits": hits, "accuracy": hits / trials, "ci": list(interval(hits, trials))}
        if trials
        else None
    )


def bands(cells, L0, s):
    """{"inside L0", "L0 to sL0", "sL0 to 2sL0": band} at L0 and a factor s: the bands retrieval claims test."""
    return dict(zip(BANDS, (band(cells, 0, L0), band(cells, L0, s * L0), band(cells, s * L0, 2 * s * L0)), strict=True))


def reach(cells, threshold, per=1):
    """k_max with a rule one unlucky cell cannot decide: the longest distance k such that no cell (of `per` pooled
    distances) up to k fails, a cell failing only when its 95% interval lies wholly below threshold; 0 where the
    first cell fails; None where there are no cells (past a scheme's reach)."""
    if not cells:
        return None
    longest = 0
    for k, trials, hits in pooled(cells, per):
        if interval(hits, trials)[1] < threshold:
            break
        longest = k
    return longest


def effective_length(cells, L0, chance, fraction=1.0, per=1):
    """RULER's effective length (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
    Language Models?", which reads each length against Llama-2-7B's own score at its trained 4K): {"reference":
    fraction x the model's own accuracy inside L0, "length": reach at that reference}; None without cells inside L0.
    A model not shown above chance inside L0 (its interval there reaches chance) has no retrieval to keep: length 0,
    where a reference at chance would pass every distance and read the whole window."""
    inside = band(cells, 0, L0)
    if inside is None:
        return None
    reference = fraction * inside["accuracy"]
    return {"reference": reference, "length": reach(cells, reference, per) if inside["ci"][0] > chance else 0}


def readout(cells, L0, s, chance, per=1):
    """A seed's readout of one window's cells, the one computation every report reads: {"bands": bands at L0 and
    s, "reach": {name: reach at each of THRESHOLDS, `per` distances pooled}, "effective_length"} (chance: the
    probe's)."""
    return {
        "bands": bands(cells, L0, s),
        "reach": {name: reach(cells, th, per) for name, th in THRESHOLDS.items()},
        "effective_length": effective_length(cells, L0, chance, per=per),
    }


def pass_rate(accuracy, trials, threshold):
    """The chance that a cell of `trials` trials passes threshold (its interval reaches it) for a reader of true
    accuracy: the binomial tail from the fewest hits that pass."""
    from scipy import stats  # here, not at the top: see the module's docstring

    fewest = bisect.bisect_left(range(trials + 1), True, key=lambda h: interval(h, trials)[1] >= threshold)
    return float(stats.binom.sf(fewest - 1, trials, accuracy))


def error_rates(trials, threshold, chance, good=GOOD):
    """What `reach` gets wrong over cells of the given trials each (a window's pooled cells, in order; the last pool
    may hold fewer): "false_fail", the chance that a reader of accuracy good misses the whole window (some cell
    fails), and "false_pass", the chance that a reader at chance reaches any distance (its first cell passes); both
    0 where a window holds no cell."""
    return {
        "false_fail": 1 - math.prod(pass_rate(good, n, threshold) for n in trials),
        "false_pass": pass_rate(chance, trials[0], threshold) if trials else 0.0,
    }


def readout_errors(cells, per, chance):
    """What `reach` gets wrong over a window's cells ({str(k): {"trials", "hits"}}, hits unused), `per` distances
    pooled: {"trials": a (first) pooled cell's, "cells": how many, name: error_rates at each of THRESHOLDS}."""
    trials = [n for _, n, _ in pooled(cells, per)]
    return {"trials": trials[0] if trials else 0, "cells": len(trials)} | {
        name: error_rates(trials, th, chance) for name, th in THRESHOLDS.items()
    }


def shares(seeds):
    """{str(k): share of whole answers} over the cells of several seeds (forced cells are not among them): their
    hits pooled, the seeds' trials alike at each distance."""
    return {k: sum(c[k]["hits"] for c in seeds) / sum(c[k]["trials"] for c in seeds) for k in seeds[0]}


def distance_plots(plots, panels, L0, chance, file, title):
    """One PNG, a panel per (subtitle, grid): whole answers against the needle-to-query distance, a line per
    window length, with the thresholds (dashed), chance (dotted) and L0 (vertical)."""
    plt = plots.plt
    cols = min(4, len(panels))
    n_rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(3.6 * cols, 2.8 * n_rows), squeeze=False, sharey=True)
    axes = list(axes.flat)
    for ax, (sub, grid) in zip(axes[: len(panels)], panels, strict=True):  # the last row may hold fewer panels
        for W, by_k in sorted(grid.items(), key=lambda item: int(item[0])):
            if by_k is not None:
                ax.plot([int(k) for k in by_k], list(by_k.values()), marker=".", lw=1, label=f"{int(W) / L0:g}x")
        for th in THRESHOLDS.values():
            ax.axhline(th, color="gray", linestyle="--", lw=0.8)
        ax.axhline(chance, color="gray", linestyle=":", lw=0.8)
        ax.axvline(L0, color="gray", lw=0.8)
        ax.set(ylim=(0, 1.02), xlabel="needle-to-query distance (tokens)", ylabel="whole answers")
        ax.set_title(sub, fontsize=8)
        ax.legend(fontsize=6, title="window", title_fontsize=6)
    for ax in axes[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title)
    plots.save(fig, file, title)
