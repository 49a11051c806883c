"""Retrieval by distance, shared by the lab's tools: the recall probe (data/recall.py writes its windows, this
module scores them) into cells of whole answers by window length and needle-to-query distance, the
effective context window k_max read from them, the slot check for the elimination shortcut, the cells of
several seeds as one (`shares`), and the plots that show them.

The effective window is the PI paper's passkey measure (Chen et al. 2023, "Extending Context Window of Large
Language Models via Positional Interpolation", the passkey retrieval of its Table 4): a needle-to-query *distance*,
the largest k such that the passkey is retrieved in at least 20% of the trials at every distance up to k, the
distances spread evenly across the target context with several trials each. `reach` computes it at PI's 20%
and, beside it, at our stricter 90% (`THRESHOLDS`), from each distance's cell.

The readout that measures the model rather than its trial count reads a seed's cells, {str(k): {"trials", "hits",
"blind"}} by distance (`Probe.counts`, JSON as results.json keeps them): a cell holds the queries whose needle lies
k - width < distance <= k from the query (`cell_width`). A cell's "blind" is {copier: the share of its trials a model
reading no key answers right by copying one needle}, counted on the probe's own windows (exact), for each copier
that scores: the needle of recency rank r ("r", how many needles stand between it and the query; the window's
edges are ranks 0 and pairs - 1) and the needle nearest distance x from the query ("dx", in a window of fixed
length the same as the needle nearest a fixed place). Its floor, the best of them, is the best score of any such
strategy (for a pool of cells, each cell's best weighted by its trials: an upper bound, `floor_of`). The probe
keeps only the cells whose floor is at most MAX_FLOOR times chance (1 / pairs): near the query few ranks fit (at
distance 7 only ranks 0 and 1), and near the window's start few do too, so a cell of few distances there would be
dropped; cells of `cell_width` distances keep every cell of the configs' windows. So every reading holds against a
floor near chance:
- a cell (of `per` pooled cells) is read only where a near-perfect reader clears its floor more often than
  not: the interval of floor(GOOD x trials) hits (the hits a reader right GOOD of the time gets at least half the
  time) lies above the floor. The others neither pass nor fail.
- a read cell passes a threshold when its accuracy reaches the threshold, as PI and RULER compare the accuracy itself
  with theirs, and its 95% interval lies wholly above its floor; k_max is the longest distance up to which every
  read cell passes. A copier of any rank or place, scoring its recorded share, reaches nothing (its share is at most
  the floor, which its interval then holds). With 10 needles (the configs' probe_pairs) every floor lies below 20%,
  so where a model lies above both, PI's 20% rule and this one agree (`papers_reach`).
- the effective length is k_max at one reference fixed for every compared arm before they are read (as RULER reads
  every model against Llama-2-7B's 85.6% at 4K), never at a model's own accuracy: the better a model retrieves
  inside L0, the more such a reference would ask of it past L0. The reports pass it.
- a band's accuracy is stated beside its floor; error_rates' false pass is the best copier's (at the floor).

  cell_width(L0, pairs)               the distances a cell spans
  interval(hits, trials)              the cell's 95% Clopper-Pearson interval
  floor_of(cells), read(trials, floor) the best key-blind score over cells, and whether a cell of it is read
  pooled(cells, per)                  `per` consecutive cells pooled, each pool keyed by its last
  band(cells, lo, hi), bands(...)     accuracy over the distances in (lo, hi] with its interval and floor; the BANDS
                                      inside L0, L0 to s L0 and s L0 to 2s L0 that retrieval claims test
  reach(cells, threshold, per)        k_max: every read cell up to it above its floor and reaching threshold
  papers_reach(cells, threshold)      k_max by PI's words alone: every cell up to it reaching threshold
  effective_length(cells, reference)  RULER's effective length: reach at one fixed reference
  readout(cells, L0, s, reference)    a seed's bands, reach at each of THRESHOLDS and effective length at once
  pass_rate(...), error_rates(...)    what such a reading gets wrong, exactly (binomial), at given trials and floors;
  readout_errors(cells, per)          error_rates at each of THRESHOLDS over a window's read cells
  shares(seeds)                       {str(k): share of whole answers} over the cells of several seeds

scipy (the optional lab extra) is imported where a statistic needs it, so that importing this module for its
settings (bench.py does) needs no scipy.
"""

import bisect
import copy
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

import scalings
from config import POSITIVE, opt, validate
from data.recall import LAYOUT, NEEDLE, Recall, query_keys
from data.tokenizer import tokenizer_from_meta
from generate import KVCache
from lab.grid import numbers

THRESHOLDS = {"pi": 0.2, "strict": 0.9}  # PI's success rate for a distance to count, and ours
BANDS = ("inside L0", "L0 to sL0", "sL0 to 2sL0")  # the bands retrieval claims test (`bands`), in order
CONFIDENCE = 0.95  # of each cell's and band's interval
GOOD = 0.97  # the near-perfect reader whose false-fail rate a readout states
MAX_FLOOR = 2  # a probed cell's floor is at most this many times chance: the cells past it are not probed
CELLS_IN_L0 = 16  # at most, so that a long L0 is read in cells of many distances (L0 = 4,096: 256)
CELL_QUERIES = 320  # about, in a cell every slot reaches: the block's places step by pairs x width / CELL_QUERIES
PROBE_SEED = 4321  # the probe's windows, the same for every model scored
DISTANCE, SLOT = 0, 1  # the probe's random streams


@dataclass
class ProbeWindows:
    """The probe's windows: what a Probe is built from (bench.py times one with these settings alone)."""

    probe_lengths: str = opt("0.5,1,2,4,8", "retrieval probe windows as multiples of L0, the trained length")
    probe_trials: int = opt(
        1,
        "probe windows per place a block of needles fits in a window (every place at L0 up to 256, every few "
        "places past it): each asks every needle of its block, so that at 1 a cell every slot reaches holds about 320 "
        "queries (PI's passkey test spreads its distances alike over the window)",
    )
    probe_slots: int = opt(512, "windows of the slot check at L0 (every query slot asked once in each)")
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
        for name in ("probe_trials", "probe_slots"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")


@dataclass
class ProbeSettings(ProbeWindows):
    """The probe's settings, which every lab tool that scores retrieval takes (its settings class inherits them):
    its windows and how their cells are read."""

    probe_pool: int = opt(
        4,
        "consecutive probed cells pooled into one when k_max and the effective length are read, so that no single "
        "cell's trials decide them",
        check=POSITIVE,
    )


def probe_generator(stream, W, k=0):
    """A generator seeded by the probe's coordinates, so every model is scored on the same windows."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([PROBE_SEED, stream, W, k]).generate_state(1)[0]))


def cell_width(L0, pairs):
    """The distances a cell spans: the smallest divisor of L0 at least 3 pairs and L0 / CELLS_IN_L0, so that cells
    tile the bands at multiples of L0 and no copier scores more than twice chance. In a block of needles side by
    side, the copier of the needle nearest a fixed distance x is right where the asked needle is that one: within the
    block, NEEDLE of the cell's distances (NEEDLE / width of its queries), and where the whole block lies past x, the
    queries of the block's edge slot (1 / pairs of them): at most 2 / pairs in all once the width reaches 3 pairs
    (NEEDLE = 3)."""
    width = next((w for w in range(max(NEEDLE * pairs, L0 // CELLS_IN_L0), L0 + 1) if L0 % w == 0), None)
    if width is None:
        raise ValueError(
            f"probe_pairs={pairs} needs cells of at least {NEEDLE * pairs} distances, more than L0={L0}: use fewer "
            "probe_pairs or a longer block_size"
        )
    return width


class Probe:
    """The recall probe: at each probed length W (a multiple of L0), windows of W tokens whose block of needles
    starts at every place it fits (`probe_trials` windows each), each needle asked by a query alone at the window's
    end, scored as whole answers by cells of distances; and the slot check at L0. Every window is built once, here.

    A window is a context (data/recall.py's block_windows: filler and a block of pairs needles) and one query: the
    context asks each of its needles in a window of its own, so that no query sees another (no earlier answer to
    copy, no needle eliminated), and a model that takes a KV cache (`forks`) reads the context once, each query then
    extending a copy of its keys and values alone: the logits of the window of W tokens, from one forward of the
    context for its pairs answers. A model that does not (a dynamic scaling, whose frequencies change with the
    length a cache grows through; a hand-written one) reads each window whole, the same logits.

    What is scored and its floor: whole answers (V and W both the argmax) of the query; a model that copies one
    needle without reading the key (by its rank or by its distance) answers right the share of a cell's queries
    that `blind` records, counted on these very windows (exact); the best of them is the cell's floor (the module's
    docstring says how every reading holds against it), and passes a threshold by luck with the probability
    `error_rates` states as "false_pass", which the reports print beside k_max. A window keeps the cells whose floor
    is at most MAX_FLOOR times chance (`distances`: each kept cell by its upper edge, (j + 1) width)."""

    def __init__(self, meta, L0, settings, pairs, tokens_per_forward, device, lengths=None):
        """Windows at each of settings.probe_lengths x L0, or at the given lengths (tokens)."""
        self.recall = Recall(tokenizer_from_meta(meta), pairs)
        self.settings, self.tokens_per_forward, self.device = settings, tokens_per_forward, device
        self.width = cell_width(L0, pairs)
        self.lengths = sorted(
            lengths
            or {round(m * L0) for m in numbers("probe_lengths", settings.probe_lengths, float, 0, "0.5,1,2,4,8")}
        )
        self.windows, self.distances, self.blind, self.trials = {}, {}, {}, {}
        stride = max(1, pairs * self.width // CELL_QUERIES)  # 1 at L0 = 64 and 256: every place
        for W in self.lengths:
            try:
                contexts, needles, distance = self.recall.block_windows(
                    W, settings.probe_trials, probe_generator(DISTANCE, W), stride
                )
            except ValueError as e:
                raise ValueError(f"probe length {W} (L0 = {L0}): {e}") from None
            cells = (distance - 1) // self.width  # (n, pairs): cell j holds distances j w < k <= (j + 1) w
            blind = self.copiers(distance, cells)
            kept = [j for j, by in sorted(blind.items()) if max(by.values()) <= MAX_FLOOR * self.chance]
            if not kept:
                raise ValueError(
                    f"probe length {W} (L0 = {L0}) holds no cell of {self.width} distances whose floor is at most "
                    f"{MAX_FLOOR} x chance with {pairs} needles; use longer windows or fewer probe_pairs"
                )
            index = torch.full((int(cells.max()) + 1,), -1)
            index[kept] = torch.arange(len(kept))
            # {W: (contexts, needles, asked: the index in distances[W] of the cell each needle is asked in, -1 where
            # it lies in no kept cell)}
            self.windows[W] = (contexts, needles, index[cells])
            self.distances[W] = [(j + 1) * self.width for j in kept]
            self.blind[W] = {(j + 1) * self.width: listed(blind[j]) for j in kept}
            self.trials[W] = {(j + 1) * self.width: int((cells == j).sum()) for j in kept}
        # the slot probe's windows, built once (at L0, too short for the slot check: fails now): every base stage
        # asks for them
        self.slots = {L0: self.recall.slot_windows(L0, settings.probe_slots, probe_generator(SLOT, L0))}

    def copiers(self, distance, cells):
        """{cell j: {copier: share of its queries the copier answers right}} of windows whose needles (n, pairs) lie
        at distance from the query and are asked in cells, for each copier that scores: the needle of recency rank r
        (str(r): slot pairs - 1 - r of the block) and the needle nearest distance x ("dx")."""
        n, pairs = distance.shape
        X, size = int(distance.max()) + 1, int(cells.max()) + 1
        by_place = torch.zeros(size * X, dtype=torch.long)
        for xs in torch.arange(X).split(1024):  # (n, 1024) at a time: windows of 16,384 tokens stay in memory
            # the block's slots lie NEEDLE apart from slot 0's distance down: the nearest to x is the slot
            # (distance[0] - x) / NEEDLE rounds to, within the block (no x lies halfway between two keys)
            nearest = ((distance[:, :1] - xs) / NEEDLE).round().long().clamp(0, pairs - 1)  # (n, len(xs))
            # the copier of x is right on the query of the needle it copies: count it in that query's cell
            by_place += torch.bincount((cells.gather(1, nearest) * X + xs).flatten(), minlength=size * X)
        by_place = by_place.view(size, X)
        out = {}
        for j in cells.unique().tolist():
            mine = cells == j  # (n, pairs)
            trials = int(mine.sum())
            by_rank = mine.sum(0).flip(0)  # slot pairs - 1 - r holds rank r
            out[j] = {str(r): c / trials for r, c in enumerate(by_rank.tolist()) if c} | {
                f"d{x}": c / trials for x, c in enumerate(by_place[j].tolist()) if c
            }
        return out

    @property
    def made_with(self):
        """The settings its windows at a length are made from: what a score of it records (lab/grid.evaluated)."""
        s = self.settings
        return {
            "probe_trials": s.probe_trials,
            "probe_slots": s.probe_slots,
            "probe_pairs": self.recall.pairs,
            "probe_layout": LAYOUT,
        }

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

    def counts(self, model, W, runtime):
        """A seed's readout in windows of W tokens, as JSON: `cells` of its hits."""
        return self.cells(W, self.hits(model, W, runtime))

    def cells(self, W, hits):
        """{"cells": {str(k): {"trials", "hits", "blind"}}} of hits {k: whole answers} in windows of W tokens."""
        return {
            "cells": {
                str(k): {"trials": self.trials[W][k], "hits": got, "blind": self.blind[W][k]} for k, got in hits.items()
            }
        }

    def hits(self, model, W, runtime, whole=None):
        """{k: whole answers} in each probed cell of windows of W tokens (a probed length); whole: read each
        query's window whole (default: where the model does not fork, `forks`), the same answers at up to pairs
        times the forwards (bench.py times both)."""
        assert W in self.windows, f"W={W} is not a probed length ({self.lengths})"
        contexts, needles, asked = self.windows[W]
        owner, which = (asked >= 0).nonzero(as_tuple=True)  # (m,) each query's context and needle
        queries = needles[owner, which]  # (m, 3)
        if whole is None:
            whole = not forks(model)
        if whole:  # each query's window: its context with the query in the query's place
            rows = contexts[owner].clone()
            rows[:, -NEEDLE:] = queries
            right = self.whole_answers(model, rows, query_keys(W + 1, 1), runtime)[:, 0]
        else:
            right = self.forked_answers(model, contexts, owner, queries, runtime)
        at = asked[owner, which]  # (m,) the cell each query is asked in, as an index
        return {k: int(right[at == i].sum()) for i, k in enumerate(self.distances[W])}

    @torch.no_grad()
    def forked_answers(self, model, contexts, owner, queries, runtime):
        """(m,) bools: whether each query (m, 3) is answered whole at the end of its context contexts[owner] (n, W+1)
        (the query's key and V read after the context's first W - 2 tokens): each context's forward once, into a KV
        cache copied for each of its queries, which then extend their copies alone. The keys a query attends to are
        those of its own window, at the same positions: the logits of whole_answers on that window."""
        W, config = contexts.shape[1] - 1, model.config
        start = query_keys(W + 1, 1)[0]  # the query's key: the context's tokens before it are read once
        per_forward = max(1, self.tokens_per_forward // W)
        right = []
        for first in range(0, len(contexts), per_forward):
            context = contexts[first : first + per_forward, :start].to(self.device)
            mine = ((owner >= first) & (owner < first + per_forward)).nonzero().flatten()
            cache = KVCache(config, len(context), W, self.device, runtime.dtype)
            with runtime.autocast():
                model(context, cache=cache)
            cache.advance(start)
            # each query's own copy of its context's keys and values, taken by indexing (no zeroed cache to fill)
            rows, fork = (owner[mine] - first).to(self.device), copy.copy(cache)
            fork.k, fork.v = ([t[rows] for t in kv] for kv in (cache.k, cache.v))
            fork.ids = cache.ids[rows]
            q = queries[mine]
            with runtime.autocast():
                logits = model(q[:, :2].to(self.device), q[:, 1:].to(self.device), cache=fork)[0]  # (b, 2, vocab)
            right.append((logits.argmax(-1).cpu() == q[:, 1:]).all(-1))
        return torch.cat(right)

    def by_slot(self, model, W, runtime):
        """{str(j): share of whole answers} at query slot j = 1..pairs of windows of W = L0 tokens whose needles are
        all queried once, in a random order (as many windows as the distance probe has at a length)."""
        assert W in self.slots, f"W={W} is not the slot probe's length ({list(self.slots)})"
        right = self.whole_answers(model, self.slots[W], query_keys(W + 1, self.recall.pairs), runtime)  # (n, pairs)
        return {str(j + 1): share.item() for j, share in enumerate(right.float().mean(0))}

    @torch.no_grad()
    def whole_answers(self, model, rows, keys, runtime):
        """(n, queries) bools: for each row (n, W+1) and each query key position in keys, whether both answer
        tokens after it are the argmax given the tokens before (teacher-forced: exactly when greedy decoding would
        give them)."""
        at = torch.tensor(keys)[:, None] + torch.arange(2)  # (queries, 2): logits at the key, then at V
        x, y = rows[:, :-1], rows[:, 1:]
        per_forward = max(1, self.tokens_per_forward // x.shape[1])
        right = []
        for xs, ys in zip(x.split(per_forward), y.split(per_forward), strict=True):
            with runtime.autocast():
                logits = model(xs.to(self.device), ys.to(self.device))[0]  # (b, W, vocab)
            guess = logits[:, at].argmax(-1).cpu()  # (b, queries, 2)
            right.append((guess == ys[:, at]).all(-1))
        return torch.cat(right)


def forks(model):
    """Whether the probe reads a context once for all its queries (Probe.forked_answers): a model that takes a KV
    cache and whose positions mean the same at every length it grows through (not a dynamic scaling)."""
    config = model.config
    return hasattr(config, "rope_scaling") and not scalings.scaling_of(config).dynamic


@functools.cache  # a readout asks for the same few (hits, trials) many times
def interval(hits, trials):
    """(low, high): the 95% Clopper-Pearson interval of a share of hits in trials. Clopper-Pearson rather than
    Wilson: its coverage is at least 95% at every true accuracy, near 0 and 1 too, where the probe's cells lie; so
    an interval wholly below a threshold rejects "accuracy >= threshold" at 2.5% or less."""
    from scipy import stats  # here, not at the top: see the module's docstring (cached, so imported rarely)

    ci = stats.binomtest(hits, trials).proportion_ci(CONFIDENCE, method="exact")
    return float(ci.low), float(ci.high)


def listed(blind):
    """The copiers a cell records: every rank, and the places that score more than the best rank (the others, nearly
    every place of a long window, score no more than the floor)."""
    ranks = max(v for c, v in blind.items() if not c.startswith("d"))
    return {c: v for c, v in blind.items() if not c.startswith("d") or v > ranks}


def floor_of(cells):
    """The best whole answers of a strategy that reads no key over cells [{"trials", "blind"}]: each cell's best
    copier, weighted by its trials. Exact for one cell; for several, no lower than the best single copier's (one
    copier cannot be every cell's best at once), so a pool or band read above it is read above every copier (at
    L0 = 64 a band's is 18%, where the best single copier scores 13% over the band inside L0)."""
    return sum(c["trials"] * max(c["blind"].values()) for c in cells) / sum(c["trials"] for c in cells)


def read(trials, floor):
    """Whether a cell of trials with this floor is read: a reader right GOOD of the time clears the floor more often
    than not (floor(GOOD x trials) hits, which it gets at least half the time, give an interval above the floor).
    A cell no such reader can be shown above its floor in says nothing of retrieval."""
    return interval(math.floor(GOOD * trials), trials)[0] > floor


def above_floor(bands):
    """Whether bands (one per seed, over the same windows: {"hits", "trials", "floor"}) retrieve at all: their hits
    pooled have a 95% interval wholly above the floor. A difference between two arms of which neither does is one
    between copiers, which says nothing of what either reads."""
    return passes(sum(b["hits"] for b in bands), sum(b["trials"] for b in bands), bands[0]["floor"], 0.0)


def passes(hits, trials, floor, threshold):
    """A read cell passes threshold: its accuracy reaches the threshold (the papers' rule: PI counts a distance
    whose passkey accuracy is at least 20%, RULER a length whose score is at least its reference) and its 95%
    interval lies wholly above its floor (no model reading no key passes but by the false-pass rate)."""
    return hits >= threshold * trials and interval(hits, trials)[0] > floor


def pooled(cells, per=1):
    """[(k, trials, hits, floor)] by distance: the cells {str(k): {"trials", "hits", "blind"}} pooled `per`
    consecutive cells at a time (the last pool may hold fewer), each keyed by its last cell's."""
    ks = sorted(cells, key=int)
    return [
        (
            int(group[-1]),
            sum(cells[k]["trials"] for k in group),
            sum(cells[k]["hits"] for k in group),
            floor_of([cells[k] for k in group]),
        )
        for group in (ks[i : i + per] for i in range(0, len(ks), per))
    ]


def read_pools(cells, per=1):
    """pooled's cells that are read (`read`), in order."""
    return [p for p in pooled(cells, per) if read(p[1], p[3])]


def band(cells, lo, hi):
    """{"trials", "hits", "accuracy", "ci", "floor"} over the cells at distances in (lo, hi]; None where there are
    none. The floor is what a model reading no key scores over them at best, for the accuracy to be read against.
    The interval treats the band's trials as one binomial: where accuracy varies with distance the true spread is
    smaller, so the interval is conservative."""
    inside = [c for k, c in cells.items() if lo < int(k) <= hi]
    trials, hits = sum(c["trials"] for c in inside), sum(c["hits"] for c in inside)
    if not trials:
        return None
    return {
        "trials": trials,
        "hits": hits,
        "accuracy": hits / trials,
        "ci": list(interval(hits, trials)),
        "floor": floor_of(inside),
    }


def bands(cells, L0, s):
    """{"inside L0", "L0 to sL0", "sL0 to 2sL0": band} at L0 and a factor s: the bands retrieval claims test."""
    return dict(zip(BANDS, (band(cells, 0, L0), band(cells, L0, s * L0), band(cells, s * L0, 2 * s * L0)), strict=True))


def reach(cells, threshold, per=1):
    """k_max with a rule neither one unlucky cell nor a model reading no key can decide: the longest distance k such
    that every read cell (of `per` pooled distances) up to k passes (`passes`: above its floor, reaching threshold);
    0 where the first read cell fails, or none is read; None where there are no cells (past a scheme's reach)."""
    if not cells:
        return None
    longest = 0
    for k, trials, hits, lowest in read_pools(cells, per):
        if not passes(hits, trials, lowest, threshold):
            break
        longest = k
    return longest


def papers_reach(cells, threshold):
    """k_max by the paper's words alone (PI: "the maximum k such that, for all k' <= k, the model has a success rate
    of at least 20% on k'"): the longest distance up to which every cell's accuracy reaches threshold, no floor
    read. Where every floor lies below the threshold, it and `reach` differ only where a cell's interval touches its
    floor."""
    longest = 0
    for k, c in sorted(cells.items(), key=lambda item: int(item[0])):
        if c["hits"] < threshold * c["trials"]:
            break
        longest = int(k)
    return longest


def effective_length(cells, reference, per=1):
    """RULER's effective length (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context
    Language Models?", which reads every model against one score, Llama-2-7B's 85.6% at its trained 4K):
    {"reference", "length": reach at that reference}, the reference fixed for every compared arm before they are
    read (the reports say which); None without cells or without a reference. A model reading no key reaches no
    distance whatever the reference: each read cell must lie above its floor."""
    if not cells or reference is None:
        return None
    return {"reference": reference, "length": reach(cells, reference, per)}


def readout(cells, L0, s, reference, per=1):
    """A seed's readout of one window's cells, the one computation every report reads: {"bands": bands at L0 and
    s, "reach": {name: reach at each of THRESHOLDS, `per` distances pooled}, "effective_length" at reference}."""
    return {
        "bands": bands(cells, L0, s),
        "reach": {name: reach(cells, th, per) for name, th in THRESHOLDS.items()},
        "effective_length": effective_length(cells, reference, per),
    }


def pass_rate(accuracy, trials, threshold, floor):
    """The chance that a read cell of `trials` trials and this floor passes threshold (`passes`) for a reader of
    true accuracy: the binomial tail from the fewest hits that pass (more hits pass whatever fewer do)."""
    from scipy import stats  # here, not at the top: see the module's docstring

    fewest = bisect.bisect_left(range(trials + 1), True, key=lambda h: passes(h, trials, floor, threshold))
    return float(stats.binom.sf(fewest - 1, trials, accuracy))


def error_rates(cells, threshold, good=GOOD):
    """What `reach` gets wrong over read cells [(trials, floor)] (a window's, pooled, in order; the last pool may
    hold fewer): "false_fail", the chance that a reader of accuracy good misses the whole window (some cell fails),
    and "false_pass", the chance that the best model reading no key (the first cell's best copier, right as often
    as its floor) reaches any distance (its first cell passes); both 0 where a window reads no cell. The false pass
    is exact for a copier whose rate is the same at each distance of the cell and bounds one whose rate varies: its
    hits are then less spread than one binomial at their mean (Hoeffding 1956, Theorem 4)."""
    return {
        "false_fail": 1 - math.prod(pass_rate(good, n, threshold, f) for n, f in cells),
        "false_pass": pass_rate(cells[0][1], cells[0][0], threshold, cells[0][1]) if cells else 0.0,
    }


def readout_errors(cells, per):
    """What `reach` gets wrong over a window's cells ({str(k): {"trials", "hits", "blind"}}, hits unused), `per`
    distances pooled: {"trials": its first cell's, "cells": how many are read, "floor": the first read cell's (None
    where none is), name: error_rates at each of THRESHOLDS}."""
    pools = pooled(cells, per)
    read_ones = [(n, f) for _, n, _, f in pools if read(n, f)]
    return {
        "trials": pools[0][1] if pools else 0,
        "cells": len(read_ones),
        "floor": read_ones[0][1] if read_ones else None,
    } | {name: error_rates(read_ones, th) for name, th in THRESHOLDS.items()}


def shares(seeds):
    """{str(k): share of whole answers} over the cells of several seeds: their
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
