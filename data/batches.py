"""What a run's training batches carry beyond the corpus's text, chosen from its settings: the associative-recall
task written into a share of the rows (data/recall.py). train.py asks for its batches here and knows no task."""

from dataclasses import dataclass

from config import SHARE, opt, validate
from data.loader import Batches
from data.recall import Recall, RecallBatches
from data.tokenizer import tokenizer_from_meta


@dataclass
class BatchConfig:
    recall_share: float = opt(0.0, "share of training sequences that carry the associative-recall task "
                                   "(data/recall.py)", check=SHARE)
    recall_pairs: int = opt(4, "needles, and queries at the row's end, in a sequence that carries the recall task")

    def __post_init__(self):
        validate(self)
        if not 1 <= self.recall_pairs <= 13:
            raise ValueError(f"recall_pairs={self.recall_pairs} must lie in [1, 13]: each needle has a key letter "
                             "and two capitals of its own")


def make_batches(bc, dataset_dir, meta, block_size, batch_size, seed, device, eval_iters):
    """The Batches of a run: plain text, or with the recall task in a share of the training rows."""
    data = (dataset_dir, meta, block_size, batch_size, seed, device, eval_iters)
    if bc.recall_share:
        return RecallBatches(Recall(tokenizer_from_meta(meta), bc.recall_pairs), bc.recall_share, *data)
    return Batches(*data)
