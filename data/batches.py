"""What a run's training batches carry beyond the corpus's text, chosen from its settings: the associative-recall
task written into a share of the rows (data/recall.py), and PoSE's skipped position ids. train.py asks for its
batches here and knows neither."""

from dataclasses import dataclass

import torch

from config import POSITIVE, SHARE, opt, validate
from data.loader import Batches
from data.tokenizer import tokenizer_from_meta

# PoSE's ids reach pose_factor x block_size - 1: past 2^24, float32 (the precision of the scores the distances enter)
# no longer tells a position from its neighbour, so a longer target would train positions the model cannot tell apart
POSE_MOST_POSITIONS = 1 << 24


@dataclass
class BatchConfig:
    recall_share: float = opt(
        0.0, "share of training sequences that carry the associative-recall task (data/recall.py)", check=SHARE
    )
    recall_pairs: int = opt(
        4,
        "needles in a sequence that carries the recall task",
        check=("lie in [1, 13]: each needle has a key letter and two capitals of its own", lambda v: 1 <= v <= 13),
    )
    recall_queries: int | None = opt(
        None,
        "queries at the end of a recall sequence, each a needle drawn with replacement (default recall_pairs)",
        check=POSITIVE,
    )
    recall_fewest: int | None = opt(
        None,
        "fewest needles in a recall sequence: each draws its count from recall_fewest "
        "to recall_pairs, so that rows ask every slot a probe of recall_pairs "
        "needles asks (default recall_pairs: every row holds that many)",
        check=POSITIVE,
    )
    pose_factor: float | None = opt(
        None,
        "PoSE (Zhu et al. 2024): rows of block_size tokens whose position ids skip "
        "ahead in chunks, so that they reach pose_factor x block_size - 1 (off: "
        "0..block_size-1)",
        check=("be a finite number >= 1", lambda v: 1 <= v < float("inf")),
    )
    pose_chunks: int = opt(2, "PoSE's chunks a row is cut into (the paper's N = 2)", check=POSITIVE)

    def __post_init__(self):
        validate(self)
        if self.pose_chunks != 2 and self.pose_factor is None:
            raise ValueError(f"pose_chunks={self.pose_chunks} does nothing without a pose_factor")
        if self.recall_fewest is not None and self.recall_fewest > self.recall_pairs:
            raise ValueError(f"recall_fewest={self.recall_fewest} must lie in [1, recall_pairs={self.recall_pairs}]")

    def check_model(self, gcfg, scheme):
        """Refuse PoSE where the model in force (gcfg, its positional scheme class `scheme`) cannot act on it."""
        if self.pose_factor is None:
            return
        target = round(self.pose_factor * gcfg.block_size)  # L_t: the ids reach L_t - 1
        if not scheme.reads_positions:
            raise ValueError(
                f"pose_factor={self.pose_factor:g} does nothing for pos_emb={gcfg.pos_emb!r}: it reads no "
                "position ids, which are all PoSE changes; use a scheme that does (e.g. rope)"
            )
        if not scheme.extrapolates and target > gcfg.block_size:
            raise ValueError(
                f"pose_factor={self.pose_factor:g} puts position ids up to {target - 1}, past "
                f"pos_emb={gcfg.pos_emb!r}'s table of block_size={gcfg.block_size} positions; PoSE "
                "needs a scheme that reads positions past block_size (e.g. rope)"
            )
        if target > POSE_MOST_POSITIONS:
            raise ValueError(
                f"pose_factor={self.pose_factor:g} x block_size={gcfg.block_size} asks for "
                f"{target:.4g} positions, past 2^24 = {POSE_MOST_POSITIONS:,}, beyond which float32 (the "
                "scores' precision) cannot tell a position from its neighbour; use pose_factor <= "
                f"{POSE_MOST_POSITIONS // gcfg.block_size:,}"
            )


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


def make_batches(bc, dataset_dir, meta, block_size, batch_size, seed, device, eval_iters):
    """The Batches of a run: text, with the recall task in a share of the training rows and PoSE's ids as bc says."""
    task = None
    if bc.recall_share:
        from data.recall import Recall  # a lab task: imported where one is asked for, so a plain run reads none of it

        task = Recall(tokenizer_from_meta(meta), bc.recall_pairs, bc.recall_queries, bc.recall_fewest)
        task.insert(torch.zeros(1, block_size + 1, dtype=torch.long), 1.0, 0)  # a row too short fails now
    pose = None
    if bc.pose_factor is not None:
        # here, not in check_model: it needs block_size alone, and every caller passes here (lab/extend.py does not
        # call check_model)
        if bc.pose_chunks > block_size:
            raise ValueError(f"pose_chunks={bc.pose_chunks} exceeds block_size={block_size}: each chunk holds a token")
        pose = PoSE(bc.pose_factor, bc.pose_chunks)
    return Batches(dataset_dir, meta, block_size, batch_size, seed, device, eval_iters, task, bc.recall_share, pose)
