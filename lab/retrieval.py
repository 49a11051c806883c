"""Retrieval by distance, shared by the lab's tools: the recall probe (data/recall.py writes its windows, this
module scores them), a model's grid of whole answers by window length and needle-to-query distance, the
effective context window k_max read from it, the slot check for the elimination shortcut, the grids of
several seeds as one, and the plots that show them.

The effective window is the PI paper's passkey measure (Chen et al. 2023, "Extending Context Window of Large
Language Models via Positional Interpolation", the passkey retrieval of its Table 4): a needle-to-query *distance*,
the largest k such that the passkey is retrieved in at least 20% of the trials at every distance up to k, the
distances spread evenly across the target context with several trials each. `kmax` computes it at PI's 20%
and, beside it, at our stricter 90% (`THRESHOLDS`).
"""

from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from config import opt
from data.recall import Recall, distances, query_keys
from data.tokenizer import tokenizer_from_meta
from lab.grid import numbers

import positions
import rope

THRESHOLDS = {"pi": 0.2, "strict": 0.9}  # PI's success rate for a distance to count, and ours
PROBE_SEED = 4321  # the probe's windows, the same for every model scored
DISTANCE, SLOT = 0, 1  # the probe's random streams


@dataclass
class ProbeSettings:
    """The probe's settings, which every lab tool that scores retrieval takes (its settings class inherits them)."""
    probe_lengths: str = opt("0.5,1,2,4,8", "retrieval probe windows as multiples of L0, the trained length")
    probe_distances: int = opt(32, "needle-to-query distances probed per window, spread evenly from the shortest to "
                                   "the window's length (PI's passkey test spreads its distances alike)")
    probe_trials: int = opt(16, "probe windows per length and distance")
    probe_pairs: int = opt(10, "needles in a probe window, the asked one among them: a whole answer by copying some "
                               "needle without reading the key is right 1 time in probe_pairs (chance)")

    def __post_init__(self):
        if self.probe_trials < 1:
            raise ValueError(f"probe_trials={self.probe_trials} must be a positive integer")
        if self.probe_distances < 2:
            raise ValueError(f"probe_distances={self.probe_distances} must be >= 2: the shortest and the longest")


def probe_generator(stream, W, k=0):
    """A generator seeded by the probe's coordinates, so every model is scored on the same windows."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([PROBE_SEED, stream, W, k]).generate_state(1)[0]))


class Probe:
    """The recall probe: at each probed length W (a multiple of L0), `probe_trials` windows at each of
    `probe_distances` needle-to-query distances, one query at the window's end (data/recall.py's distance
    windows), scored as whole answers; and the slot check at any length that holds every needle's query.

    What is scored and its floor: whole answers (V and W both the argmax) of the one query; a model that copies
    some needle's capitals without reading the key scores `chance` = 1/pairs at every distance, and passes a
    threshold at one distance by luck with probability `false_pass(threshold)`, which the reports print beside
    k_max. A model that copies the latest needle is right in 1 of r + 1 windows at a distance that leaves room for r
    needles between, so it passes 20% up to about five needles' length (r < 5) at any window length: a k_max
    that short is no evidence of retrieval."""

    def __init__(self, meta, L0, settings, pairs, tokens_per_forward, device, lengths=None):
        """Windows at each of settings.probe_lengths x L0, or at the given lengths (tokens)."""
        self.recall = Recall(tokenizer_from_meta(meta), pairs)
        self.settings, self.tokens_per_forward, self.device = settings, tokens_per_forward, device
        self.lengths = sorted(lengths or {round(m * L0) for m in numbers("probe_lengths", settings.probe_lengths,
                                                                         float, 0, "0.5,1,2,4,8")})
        self.windows = {}  # {W: {k: (trials, W+1) rows}}
        for W in self.lengths:
            try:
                self.windows[W] = {k: self.recall.distance_windows(W, k, settings.probe_trials,
                                                                   probe_generator(DISTANCE, W, k))
                                   for k in distances(W, settings.probe_distances)}
            except ValueError as e:
                raise ValueError(f"probe length {W} (L0 = {L0}): {e}") from None
        self.recall.slot_windows(L0, 1, probe_generator(SLOT, L0))  # too short for the slot check: fails now

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

    def false_pass(self, threshold):
        """The chance that a model at chance passes threshold at one distance: the binomial tail of probe_trials
        trials at chance, from the fewest hits whose share reaches threshold."""
        trials = self.settings.probe_trials
        needed = next(h for h in range(trials + 1) if h / trials >= threshold)
        return float(stats.binom.sf(needed - 1, trials, self.chance))

    def by_distance(self, model, W, rt):
        """{str(k): share of whole answers} at each probed distance of windows of W tokens (a probed length)."""
        assert W in self.windows, f"W={W} is not a probed length ({self.lengths})"
        rows = self.windows[W]
        right = self.whole_answers(model, torch.cat(list(rows.values())), query_keys(W + 1, 1), rt)  # (n, 1)
        return {str(k): hits.float().mean().item() for k, hits in zip(rows, right.split(self.settings.probe_trials))}

    def by_slot(self, model, W, rt):
        """{str(j): share of whole answers} at query slot j = 1..pairs of windows of W tokens whose needles are all
        queried once, in a random order (as many windows as the distance probe has at a length)."""
        n = self.settings.probe_trials * self.settings.probe_distances
        rows = self.recall.slot_windows(W, n, probe_generator(SLOT, W))
        right = self.whole_answers(model, rows, query_keys(W + 1, self.recall.pairs), rt)  # (n, pairs)
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
        for xs, ys in zip(x.split(per_forward), y.split(per_forward)):
            with rt.autocast():
                logits = model(xs.to(self.device), ys.to(self.device))[0]  # (b, W, vocab)
            guess = logits[:, at].argmax(-1).cpu()  # (b, queries, 2)
            right.append((guess == ys[:, at]).all(-1))
        return torch.cat(right)

    def grid(self, model, rt, scaling=rope.NO_SCALING):
        """{str(W): {str(k): share}} over the probed lengths: the model as it is, or with a scaling by factor W/L0
        past L0 (lengths at or below L0 left out); None past a scheme's reach."""
        L0, scheme, out = model.config.original_len, positions.scheme(model.config.pos_emb), {}
        for W in self.lengths:
            if scaling != rope.NO_SCALING and W <= L0:
                continue
            if W > model.config.block_size and not scheme.extrapolates:
                out[str(W)] = None
                continue
            if scaling != rope.NO_SCALING:
                model.reconfigure(rope_scaling=scaling, rope_scaling_factor=W / L0)
            out[str(W)] = self.by_distance(model, W, rt)
        return out


def kmax(by_distance, threshold):
    """The effective window of {str(k): share}: the largest probed k such that every probed k' <= k retrieves at
    least threshold; 0 where the shortest does not; None past a scheme's reach."""
    if by_distance is None:
        return None
    longest = 0
    for k in sorted(by_distance, key=int):
        if by_distance[k] < threshold:
            break
        longest = int(k)
    return longest


def grid_mean(grids):
    """The grids of several seeds as one: each (length, distance) cell's share averaged (None past a reach)."""
    return {W: None if by_k is None else {k: sum(g[W][k] for g in grids) / len(grids) for k in by_k}
            for W, by_k in grids[0].items()}


def distance_plots(plots, panels, L0, chance, file, title):
    """One PNG, a panel per (subtitle, grid): whole answers against the needle-to-query distance, a line per
    window length, with the thresholds (dashed), chance (dotted) and L0 (vertical)."""
    plt = plots.plt
    cols = min(4, len(panels))
    n_rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(3.6 * cols, 2.8 * n_rows), squeeze=False, sharey=True)
    for ax, (sub, grid) in zip(axes.flat, panels):
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
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    plots.save(fig, file, title)
