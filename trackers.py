"""Weights & Biases or TensorBoard beside metrics.jsonl, for people who watch runs there (train.py's --log). Each
tracker gets every line metrics.jsonl gets (progress.Progress hands them on), at its iteration; each package is
optional and imported here alone, and one that cannot start fails before a run writes anything. A run without --log
reads none of this.
"""

import os
import uuid
from pathlib import Path

from config import optional_package
from files import atomic_write

TRACKERS = ("none", "wandb", "tensorboard")


class WandB:
    """A Weights & Biases run in out_dir/wandb, named after out_dir; a resumed training run continues the same one
    (its id kept in out_dir/wandb_id). WANDB_MODE=offline keeps it on this machine."""

    def __init__(self, out, config, resume):
        self.wandb = wandb = optional_package("wandb", "log=wandb")
        id_file = Path(out) / "wandb_id"
        if resume and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = uuid.uuid4().hex[:8]  # what wandb's own ids look like
            atomic_write(id_file, lambda f: f.write(run_id.encode()))
        self.run = wandb.init(
            project="nanorope", name=Path(out).name, id=run_id, resume="allow", dir=str(out), config=config
        )

    def log(self, line):
        self.run.log({k: v for k, v in line.items() if k != "iter"}, step=line["iter"])

    def close(self):
        self.run.finish()
        # finish returns before wandb's service has written the run's files (offline, its .wandb log can still be
        # its header alone); teardown waits for the service to end, so the run is whole on disk when train returns
        self.wandb.teardown()


class TensorBoard:
    """TensorBoard event files in out_dir/tensorboard (`tensorboard --logdir out_dir`)."""

    def __init__(self, out, config, resume):
        tensorboard = optional_package("torch.utils.tensorboard", "log=tensorboard", "pip install tensorboard")
        self.writer = tensorboard.SummaryWriter(log_dir=str(Path(out) / "tensorboard"))

    def log(self, line):
        for key, value in line.items():
            if key != "iter":
                self.writer.add_scalar(key, value, line["iter"])

    def close(self):
        self.writer.close()


def check(log):
    """Refuse an unknown tracker, one whose package is missing, or W&B without credentials (outside its offline
    modes), before a run writes anything."""
    if log not in TRACKERS:
        raise ValueError(f"log={log!r} is unknown; choose one of {', '.join(TRACKERS)}")
    if log == "none":
        return
    package = optional_package(log, f"log={log}")  # imported once: W&B's login check below reuses it
    # login is False at once when no API key is set up: no network
    if (
        log == "wandb"
        and os.environ.get("WANDB_MODE") not in ("offline", "disabled", "dryrun")
        and not package.login(prompt=False)
    ):
        raise ValueError(
            "log=wandb: not logged in to Weights & Biases; run `wandb login`, or set "
            "WANDB_MODE=offline to keep the run on this machine"
        )


def open_tracker(log, out, config, resume):
    """The tracker log names (wandb, tensorboard), started for the run in out."""
    return {"wandb": WandB, "tensorboard": TensorBoard}[log](out, config, resume)
