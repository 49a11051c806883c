"""Retrieval over depth x length, shared by the lab's tools: the probe windows, a model's grid of scores
(data/recall.py's probe at each length and depth), the grids of several seeds as one, the effective context
window, and the heatmaps that show a grid."""

import math
from dataclasses import dataclass

from config import opt
from data.loader import Batches
from data.recall import NEEDLE, Recall
from data.tokenizer import tokenizer_from_meta
from lab.grid import numbers

import positions
import rope


@dataclass
class ProbeSettings:
    """The probe's settings, which every lab tool that scores retrieval takes (its settings class inherits them)."""
    probe_lengths: str = opt("0.5,1,2,4,8", "retrieval probe windows as multiples of block_size")
    probe_depths: str = opt("0,0.25,0.5,0.75,1", "where the asked needle sits in a probe window (0: its start, 1: "
                                                 "just before the queries)")
    probe_trials: int = opt(32, "probe windows per length and depth")
    retrieval_threshold: float = opt(0.9, "whole answers retrieved for a length to count in the effective window")

    def __post_init__(self):
        if self.probe_trials < 1:
            raise ValueError(f"probe_trials={self.probe_trials} must be a positive integer")
        if not 0 < self.retrieval_threshold <= 1:
            raise ValueError(f"retrieval_threshold={self.retrieval_threshold} must lie in (0, 1]")


class Probe:
    """The recall probe of one dataset: fixed windows of each length (a multiple of L0), needles at each depth."""

    def __init__(self, dataset_dir, meta, L0, settings, pairs, tokens_per_forward, device):
        self.recall = Recall(tokenizer_from_meta(meta), pairs)
        self.depths = numbers("probe_depths", settings.probe_depths, float, 0.0, "0,0.5,1")
        if self.depths[-1] > 1:
            raise ValueError(f"probe_depths={settings.probe_depths!r} must lie in [0, 1]")
        self.windows = {}
        for m in numbers("probe_lengths", settings.probe_lengths, float, 0, "0.5,1,2,4,8"):
            W = round(m * L0)
            if W + 1 < 2 * pairs * NEEDLE:
                raise ValueError(f"probe_lengths: a window of {W} tokens cannot hold {pairs} needles and their "
                                 f"queries ({2 * pairs * NEEDLE} tokens); use longer lengths or fewer recall_pairs")
            rows = max(1, min(settings.probe_trials, tokens_per_forward // W))
            self.windows[W] = Batches(dataset_dir, meta, W, rows, 0, device,
                                      eval_iters=math.ceil(settings.probe_trials / rows))

    def grid(self, model, rt, scaling=rope.NO_SCALING):
        """{W: {depth: {"answer", "first"}}}: the model as it is, or with a scaling by factor W/L0 past L0 (lengths
        at or below L0 left out); None past a scheme's reach."""
        L0, scheme, out = model.config.original_len, positions.scheme(model.config.pos_emb), {}
        for W, batches in self.windows.items():
            if scaling != rope.NO_SCALING and W <= L0:
                continue
            if W > model.config.block_size and not scheme.extrapolates:
                out[str(W)] = None
                continue
            if scaling != rope.NO_SCALING:
                model.reconfigure(rope_scaling=scaling, rope_scaling_factor=W / L0)
            out[str(W)] = {str(d): self.recall.scores(model, batches, d, rt) for d in self.depths}
        return out


def grid_mean(grids):
    """The grids of several seeds as one: each (length, depth) cell's scores averaged (None past a reach)."""
    first = grids[0]
    return {W: None if by_d is None else {d: {m: sum(g[W][d][m] for g in grids) / len(grids) for m in by_d[d]}
                                          for d in by_d} for W, by_d in first.items()}


def at_length(by_depth):
    """Whole answers at one length, mean over depths; None past a scheme's reach."""
    return None if by_depth is None else sum(d["answer"] for d in by_depth.values()) / len(by_depth)


def window(grid, threshold, L0):
    """The effective context window: the longest probed length from L0 up to which every length retrieves at least
    threshold of whole answers (mean over depths); 0 where L0 itself does not. As the PI paper's Table 4 measures
    it, from the trained length up; shorter windows are in the grid (and the heatmaps), not in this figure."""
    longest = 0
    for W in sorted((W for W in grid if int(W) >= L0), key=int):
        if at_length(grid[W]) is None or at_length(grid[W]) < threshold:
            break
        longest = int(W)
    return longest


def heatmaps(plots, panels, L0, file, title):
    """One PNG of heatmaps, whole answers by depth (rows) and length (columns, as multiples of L0), one panel per
    (subtitle, grid)."""
    plt = plots.plt
    cols = min(4, len(panels))
    n_rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(3.4 * cols, 2.8 * n_rows), squeeze=False)
    for ax, (sub, grid) in zip(axes.flat, panels):
        widths = sorted(grid, key=int)
        depths = sorted({d for g in grid.values() if g for d in g}, key=float)
        cells = [[grid[W][d]["answer"] if grid[W] else float("nan") for W in widths] for d in depths]
        image = ax.imshow(cells, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(widths)), [f"{int(W) / L0:g}x" for W in widths], fontsize=7)
        ax.set_yticks(range(len(depths)), depths, fontsize=7)
        ax.set_title(sub, fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.8, label="whole answers")
    fig.suptitle(title)
    plots.save(fig, file, title, tight=False)
