"""The batch loader: training batches drawn by (seed, step, micro-step), and fixed evaluation windows."""

from typing import NamedTuple

import numpy as np
import torch

from data.tokenizer import SPLITS, check_ids, open_split

EVAL_SEED = 1234  # validation batches are the same for every run and seed, so val losses compare
BATCH, DROPOUT, RECALL, POSITIONS = 0, 1, 2, 3  # the random streams of a micro-step


class Batch(NamedTuple):
    """A training micro-batch: inputs x and targets y (B, T), each row's own position ids (B, T) where the batches
    give them (else None: 0..T-1), and the seed of its dropout masks (None: the global generator's)."""

    x: torch.Tensor
    y: torch.Tensor
    position_ids: torch.Tensor | None = None
    seed: int | None = None


def micro_seed(seed, step, micro, stream):
    """A seed fixed by a micro-step's coordinates in the global batch, one per random stream."""
    return int(np.random.SeedSequence([seed, step, micro, stream]).generate_state(1)[0])


class Batches:
    """Training batches drawn by (seed, step, micro-step) and a fixed validation set.

    Each batch's generator is seeded from its coordinates, not from global RNG state, so a
    resumed run, every positional scheme of an ablation, and every DDP layout see the same
    sequences in the same order: the iteration is the sampler's whole position. A task (data/recall.py's Recall)
    may write itself into a share of the training rows, and a position scheme (data/batches.py's PoSE) give each
    row position ids of its own; the evaluation windows stay plain text at positions 0..T-1.
    """

    def __init__(
        self, dataset_dir, meta, block_size, batch_size, seed, device, eval_iters, task=None, share=0.0, positions=None
    ):
        self.meta, self.block_size, self.batch_size, self.seed, self.device = meta, block_size, batch_size, seed, device
        self.task, self.share, self.positions = task, share, positions
        self.dataset_dir = dataset_dir
        for split in SPLITS:
            check_ids(dataset_dir, split, meta)
        self.lengths = {split: len(open_split(dataset_dir, split, meta)) for split in SPLITS}
        for split, n in self.lengths.items():
            if n <= block_size:
                raise ValueError(
                    f"block_size={block_size} is too large for the {split} split ({n} tokens); "
                    f"use a block_size below {n}"
                )
        g = torch.Generator().manual_seed(EVAL_SEED)
        self.eval_starts = {s: self._starts(s, eval_iters * batch_size, g) for s in ("train", "val")}

    def _starts(self, split, n, generator):
        high = self.lengths[split] - self.block_size
        return torch.randint(high, (n,), generator=generator)

    def _rows(self, split, starts):
        """(B, T+1) int64 tokens on the CPU from each start: a window and its next token."""
        # a fresh memmap per batch: numpy keeps pages of a long-lived one resident (nanoGPT's leak fix)
        data = open_split(self.dataset_dir, split, self.meta)
        return torch.from_numpy(data[starts.numpy()[:, None] + np.arange(self.block_size + 1)].astype(np.int64))

    def _move(self, *tensors):
        if self.device.startswith("cuda"):
            return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in tensors)
        return tuple(t.to(self.device) for t in tensors)

    def train(self, step, micro):
        """The Batch of micro-step micro of step step: rows of the train split, each token's next as its target, with
        the task written into a share of them and their position ids where the batches carry them."""
        g = torch.Generator().manual_seed(micro_seed(self.seed, step, micro, BATCH))
        rows = self._rows("train", self._starts("train", self.batch_size, g))  # (B, T+1)
        if self.task is None:
            x, y = rows[:, :-1], rows[:, 1:]
        else:
            x, y = self.task.insert(rows, self.share, micro_seed(self.seed, step, micro, RECALL))
        if self.positions is None:
            return Batch(*self._move(x, y))
        ids = self.positions.ids(len(x), self.block_size, micro_seed(self.seed, step, micro, POSITIONS))  # (B, T)
        return Batch(*self._move(x, y, ids))

    def eval_batches(self, split):
        for chunk in self.eval_starts[split].split(self.batch_size):
            rows = self._rows(split, chunk)
            yield self._move(rows[:, :-1], rows[:, 1:])
