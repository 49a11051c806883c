"""Where a training run's metrics go: the progress bar, out_dir/metrics.jsonl and, for people who watch runs there,
Weights & Biases or TensorBoard (train.py's --log). Each tracker gets every line metrics.jsonl gets, at its
iteration; each package is optional and imported here alone, and one that cannot start fails before a run writes
anything.
"""

import json
import os
import uuid
from pathlib import Path

from tqdm import tqdm

from config import optional_package
from files import append_line, atomic_write, open_log

TRACKERS = ("none", "wandb", "tensorboard")


class WandB:
    """A Weights & Biases run in out_dir/wandb, named after out_dir; a resumed training run continues the same one
    (its id kept in out_dir/wandb_id). WANDB_MODE=offline keeps it on this machine."""

    def __init__(self, out, config, resume):
        wandb = optional_package("wandb", "log=wandb")
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


class NoTracker:
    def log(self, line):
        pass

    def close(self):
        pass


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
    return {"wandb": WandB, "tensorboard": TensorBoard}[log](out, config, resume) if log != "none" else NoTracker()


class Progress:
    """The progress bar, out_dir/metrics.jsonl and any tracker (--log; the master process alone writes), and
    tokens/s, measured afresh over each logging window."""

    def __init__(self, out, tc, rt, start_iter, tokens_per_step, record):
        self.bar = tqdm(
            total=tc.max_iters, initial=start_iter, disable=not (rt.master and tc.progress), dynamic_ncols=True
        )
        self.metrics = open_log(out / "metrics.jsonl") if rt.master else None
        self.tracker = open_tracker(tc.log if rt.master else "none", out, record, tc.resume)
        self.tokens_per_step, self.seconds, self.steps = tokens_per_step, 0.0, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()
        self.tracker.close()
        if self.metrics:
            self.metrics.close()

    def step(self, seconds, train_loss):
        """Count a step that took seconds (evaluation excluded); the window's tokens/s."""
        self.seconds += seconds
        self.steps += 1
        tokens_per_s = self.tokens_per_step * self.steps / self.seconds
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{train_loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
        return tokens_per_s

    def evaluated(self, it, ev, tokens_per_s):
        """An evaluation's line above the bar: its losses (train.evaluate's ev) and the window's tokens/s."""
        self.bar.write(
            f"iter {it}: train {ev['train_loss']:.4f}, val {ev['val_loss']:.4f} "
            f"({ev['val_bpb']:.3f} bits/byte), {tokens_per_s:,.0f} tokens/s"
        )

    def log(self, line):
        append_line(self.metrics, json.dumps(line))
        self.tracker.log(line)
        self.seconds, self.steps = 0.0, 0
