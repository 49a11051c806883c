"""data/loader.py: batches as a function of (seed, step, micro-step); validation windows fixed for every seed."""

import torch

from data.loader import Batches, micro_seed
from data.tokenizer import load_meta


def test_micro_steps_draw_distinct_batches_and_seeds(data_dir):
    seeds = {micro_seed(1, step, micro, stream) for step in range(3) for micro in range(3) for stream in (0, 1)}
    assert len(seeds) == 18
    dataset = data_dir / "shakespeare_char"
    meta = load_meta(dataset)
    batches = Batches(dataset, meta, 32, 4, 1, "cpu", 1)
    x, y, ids, seed = batches.train(0, 0)
    assert torch.equal(y[:, :-1], x[:, 1:]) and ids is None and seed is None  # targets: the inputs shifted by one
    assert torch.equal(x, batches.train(0, 0)[0])  # a batch is a function of its coordinates
    assert not torch.equal(x, batches.train(0, 1)[0]) and not torch.equal(x, batches.train(1, 0)[0])
    other_seed = Batches(dataset, meta, 32, 4, 2, "cpu", 1)
    assert not torch.equal(x, other_seed.train(0, 0)[0])
    assert torch.equal(batches.eval_starts["val"], other_seed.eval_starts["val"])  # validation is seed-independent
