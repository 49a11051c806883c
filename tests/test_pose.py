"""data/pose.py: PoSE's ids skip ahead in chunks to the target and cover every distance below it."""

import pytest
import torch

from data.pose import PoSE


@pytest.mark.slow
def test_pose_ids_skip_ahead_in_chunks_to_the_target_and_cover_every_distance():
    L0, factor, n = 16, 4, 512
    ids = torch.cat([PoSE(factor, 2).ids(n, L0, seed) for seed in range(4)])  # (4n, L0)
    steps = ids[:, 1:] - ids[:, :-1]
    assert (steps >= 1).all() and ids[:, 0].eq(0).all()  # increasing, the first chunk from 0 (u_0 = 0)
    assert ((steps > 1).sum(1) <= 1).all()  # two chunks: at most one skip a row, inside each chunk +1
    assert ids.max() == factor * L0 - 1  # the ids reach L_t - 1
    covered = {int(d) for row in ids for d in (row[:, None] - row[None, :]).flatten() if d > 0}
    assert covered == set(range(1, factor * L0))  # every relative distance below L_t, across the batch
    three = PoSE(factor, 3).ids(n, L0, 0)
    assert (((three[:, 1:] - three[:, :-1]) > 1).sum(1) <= 2).all() and three.max() <= factor * L0 - 1
    assert torch.equal(PoSE(1, 2).ids(8, L0, 0), torch.arange(L0).expand(8, L0))  # no room: the plain ids
    assert torch.equal(PoSE(factor, 2).ids(8, L0, 5), PoSE(factor, 2).ids(8, L0, 5))  # a function of its seed
