"""PoSE's position ids (Zhu et al. 2024): rows of block_size tokens whose ids skip ahead, so that a model trained at
block_size sees the relative distances of a longer target. data/batches.py hands them to a run that sets pose_factor.
"""

import torch


class PoSE:
    """Positional Skip-wise training (Zhu et al. 2024, section 3.2, eq. 3-4): a row's L_c = block_size tokens are cut
    into `chunks` chunks of random lengths l_i (each at least 1), chunk i keeping contiguous ids st_i .. st_i + l_i - 1
    (st_i the lengths before it) shifted by a skip u_i ~ U{u_(i-1), ..., L_t - L_c}, u_0 = 0, so its ids reach up to
    L_t - 1 for the target L_t = factor x L_c and the relative distances up to L_t - 1 are all trained. The text stays
    the row's contiguous tokens (the paper's v_i = 0, which it finds makes little difference). With factor 1 there is
    no room to skip: the ids are 0..L_c-1."""

    def __init__(self, factor, chunks):
        self.factor, self.chunks = factor, chunks

    def ids(self, n, length, seed):
        """(n, length) position ids, drawn from seed."""
        g = torch.Generator().manual_seed(seed)
        room = round(self.factor * length) - length  # L_t - L_c
        cuts = torch.rand(n, length - 1, generator=g).argsort(-1)[:, : self.chunks - 1].sort(-1).values + 1  # (n, N-1)
        u = [torch.zeros(n, dtype=torch.long)]  # u_0 = 0, then each drawn from u_(i-1) up to L_t - L_c
        for _ in range(self.chunks - 1):
            u.append(u[-1] + (torch.rand(n, generator=g) * (room - u[-1] + 1)).long())
        chunk = (torch.arange(length)[None, :, None] >= cuts[:, None, :]).sum(-1)  # (n, length): each token's chunk
        return torch.arange(length)[None, :] + torch.stack(u, 1).gather(1, chunk)  # (n, length)
