"""Where a run's metrics go beside out_dir/metrics.jsonl, for people who watch runs there: Weights & Biases or
TensorBoard (train.py's --log). Each gets every line metrics.jsonl gets, at its iteration; each package is
optional and imported here alone.
"""

import uuid
from pathlib import Path

from files import atomic_write

TRACKERS = ("none", "wandb", "tensorboard")


def package(log, name):
    """The optional package a tracker needs, or one line saying how to install it."""
    try:
        return __import__(name)
    except ImportError:
        raise ValueError(f"log={log} needs the {name} package, which is not installed: pip install {name}") from None


class WandB:
    """A Weights & Biases run in out_dir/wandb, named after out_dir; a resumed training run continues the same one
    (its id kept in out_dir/wandb_id). WANDB_MODE=offline keeps it on this machine."""

    def __init__(self, out, config, resume):
        wandb = package("wandb", "wandb")
        id_file = Path(out) / "wandb_id"
        if resume and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = uuid.uuid4().hex[:8]  # what wandb's own ids look like
            atomic_write(id_file, lambda f: f.write(run_id.encode()))
        self.run = wandb.init(project="nanorope", name=Path(out).name, id=run_id, resume="allow", dir=str(out),
                              config=config)

    def log(self, line):
        self.run.log({k: v for k, v in line.items() if k != "iter"}, step=line["iter"])

    def close(self):
        self.run.finish()


class TensorBoard:
    """TensorBoard event files in out_dir/tensorboard (`tensorboard --logdir out_dir`)."""

    def __init__(self, out, config, resume):
        package("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(log_dir=str(Path(out) / "tensorboard"))

    def log(self, line):
        for key, value in line.items():
            if key != "iter":
                self.writer.add_scalar(key, value, line["iter"])

    def close(self):
        self.writer.close()


class NoTracker:
    def log(self, line):
        pass

    def close(self):
        pass


def check(log):
    """Refuse an unknown tracker, or one whose package is missing, before a run starts."""
    if log not in TRACKERS:
        raise ValueError(f"log={log!r} is unknown; choose one of {', '.join(TRACKERS)}")
    if log != "none":
        package(log, log)


def open_tracker(log, out, config, resume):
    return {"wandb": WandB, "tensorboard": TensorBoard}[log](out, config, resume) if log != "none" else NoTracker()
