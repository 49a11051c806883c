"""What a run's training batches carry beyond the corpus's text, chosen from its settings: a task written into a share
of the rows, and PoSE's skipped position ids. train.py asks for its batches here and knows neither.

A task is to the batches what a positional scheme is to the model: a class that declares its own settings (`settings`,
as positions.py's schemes do), chosen by one setting, `task`. Its settings join BatchConfig's, as flat keys, only
when it is chosen (`BatchConfig.chosen`), so that a run takes them, and --help lists them, only then; its module is
imported only then, so a plain run reads none of it. Besides its settings a task class gives `check(batch_cfg)`, the
rules
between them, and `writer(batch_cfg, tokenizer, block_size)`, what writes its rows and the share of rows it takes.
"""

import functools
import importlib
from dataclasses import asdict, dataclass, field, make_dataclass

from config import AT_LEAST_1, POSITIVE, one_of, opt, validate
from data.loader import Batches
from data.tokenizer import tokenizer_from_meta

TASKS = {"text": None, "recall": "data.recall.Recall"}  # task name -> its class, by path (None: text alone)

# PoSE's ids reach pose_factor x block_size - 1: past 2^24, float32 (the precision of the scores the distances enter)
# no longer tells a position from its neighbour, so a longer target would train positions the model cannot tell apart
POSE_MOST_POSITIONS = 1 << 24


@dataclass
class BatchConfig:
    task: str = opt(
        "text",
        "what the training rows carry: text alone, or recall (data/recall.py: the associative-recall task in a share "
        "of them); --help with --task=NAME lists the task's settings",
        check=one_of(tuple(TASKS)),
        # a run recorded before tasks were chosen by name trained the recall task where it gave it a share
        older=lambda record: "recall" if record.get("recall_share") else "text",
    )
    pose_factor: float | None = opt(
        None,
        "PoSE (Zhu et al. 2024): rows of block_size tokens whose position ids skip "
        "ahead in chunks, so that they reach pose_factor x block_size - 1 (off: "
        "0..block_size-1)",
        check=AT_LEAST_1,
    )
    pose_chunks: int = opt(2, "PoSE's chunks a row is cut into (the paper's N = 2)", check=POSITIVE)

    # config.py's parsing asks chosen(the task typed) for the class that holds its settings
    chooser, choices = "task", tuple(TASKS)
    task_class = None  # the chosen task's class: none for text alone

    def __post_init__(self):
        validate(self)
        assert type(self) is self.chosen(self.task), f"task={self.task!r}: make it with BatchConfig.chosen"
        if self.pose_chunks != 2 and self.pose_factor is None:
            raise ValueError(f"pose_chunks={self.pose_chunks} does nothing without a pose_factor")
        if self.task_class:
            self.task_class.check(self)

    def check_model(self, model_cfg, scheme):
        """Refuse PoSE where the model in force (model_cfg, its positional scheme class `scheme`) cannot act on it."""
        if self.pose_factor is None:
            return
        target = round(self.pose_factor * model_cfg.block_size)  # L_t: the ids reach L_t - 1
        if not scheme.reads_positions:
            raise ValueError(
                f"pose_factor={self.pose_factor:g} does nothing for pos_emb={model_cfg.pos_emb!r}: it reads no "
                "position ids, which are all PoSE changes; use a scheme that does (e.g. rope)"
            )
        if not scheme.extrapolates and target > model_cfg.block_size:
            raise ValueError(
                f"pose_factor={self.pose_factor:g} puts position ids up to {target - 1}, past "
                f"pos_emb={model_cfg.pos_emb!r}'s table of block_size={model_cfg.block_size} positions; PoSE "
                "needs a scheme that reads positions past block_size (e.g. rope)"
            )
        if target > POSE_MOST_POSITIONS:
            raise ValueError(
                f"pose_factor={self.pose_factor:g} x block_size={model_cfg.block_size} asks for "
                f"{target:.4g} positions, past 2^24 = {POSE_MOST_POSITIONS:,}, beyond which float32 (the "
                "scores' precision) cannot tell a position from its neighbour; use pose_factor <= "
                f"{POSE_MOST_POSITIONS // model_cfg.block_size:,}"
            )

    @classmethod
    def chosen(cls, task):
        """The settings class of task: BatchConfig with the task's own settings as fields."""
        if not isinstance(task, str) or task not in TASKS:
            raise ValueError(f"task={task!r} is unknown; choose one of {', '.join(TASKS)}")
        return with_task(task)

    def __reduce__(self):  # a class made by with_task pickles (to a lab's spawned workers) by its task's name
        return rebuild, (self.task, asdict(self))


@functools.cache
def with_task(task):
    """BatchConfig with the settings of task (a name in TASKS) as fields of its own, flat keys as GPTConfig gathers
    each scheme's, its task defaulting to the name: made once, when the task is first chosen."""
    if TASKS[task] is None:
        return BatchConfig
    module, _, name = TASKS[task].rpartition(".")
    task_class = getattr(importlib.import_module(module), name)
    chooser = BatchConfig.__dataclass_fields__["task"]
    own = [(key, type_, f) for key, (type_, f) in task_class.settings.items()]
    return make_dataclass(
        "BatchConfig",
        [("task", str, field(default=task, metadata=chooser.metadata)), *own],
        bases=(BatchConfig,),
        namespace={"__module__": __name__, "task_class": task_class},
    )


def rebuild(task, settings):
    return BatchConfig.chosen(task)(**settings)


def make_batches(batch_cfg, dataset_dir, meta, block_size, batch_size, seed, device, eval_iters):
    """The Batches of a run: text, with batch_cfg's task in a share of the training rows, and PoSE's ids if it asks."""
    task, share = (
        batch_cfg.task_class.writer(batch_cfg, tokenizer_from_meta(meta), block_size)
        if batch_cfg.task_class
        else (None, 0.0)
    )
    pose = None
    if batch_cfg.pose_factor is not None:
        # here, not in check_model: it needs block_size alone, and every caller passes here (lab/extend.py does not
        # call check_model)
        if batch_cfg.pose_chunks > block_size:
            raise ValueError(
                f"pose_chunks={batch_cfg.pose_chunks} exceeds block_size={block_size}: each chunk holds a token"
            )
        from data.pose import PoSE  # read only where a run asks for it

        pose = PoSE(batch_cfg.pose_factor, batch_cfg.pose_chunks)
    return Batches(dataset_dir, meta, block_size, batch_size, seed, device, eval_iters, task, share, pose)
