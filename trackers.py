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

    def __init__(self, out, train_cfg, runtime, start_iter, tokens_per_step, record, flops_per_token=None):
        self.bar = tqdm(
            total=train_cfg.max_iters,
            initial=start_iter,
            disable=not (runtime.master and train_cfg.progress),
            dynamic_ncols=True,
        )
        self.metrics = open_log(out / "metrics.jsonl") if runtime.master else None
        self.tracker = open_tracker(train_cfg.log if runtime.master else "none", out, record, train_cfg.resume)
        self.tokens_per_step, self.seconds, self.steps = tokens_per_step, 0.0, 0
        self.master, self.log_interval, self.flops_per_token = runtime.master, train_cfg.log_interval, flops_per_token
        # model FLOPs utilisation against the device's peak, where it has a known one (CUDA)
        self.peak_flops = runtime.peak_flops() if runtime.device_type == "cuda" else None

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

    def stopping(self, it, quit_on_repeat):
        """A signal's stop, told above the bar."""
        if self.master:
            self.bar.write(
                f"stop requested: finishing at iteration {it} with a checkpoint"
                + (" (Ctrl-C again to quit at once)" if quit_on_repeat else "")
            )

    def log_step(self, it, train_loss, grad_norm, lr, tokens_per_s, scores, elapsed_s):
        """Step it's line in metrics.jsonl (the master's, every log_interval steps and at each evaluation), with the
        evaluation's scores (train.evaluate's) where there was one, told above the bar too."""
        if not self.master or (scores is None and it % self.log_interval):
            return
        line = dict(iter=it, train_loss=train_loss, grad_norm=grad_norm.item(), lr=lr, tokens_per_s=tokens_per_s)
        if self.peak_flops:
            line["mfu"] = self.flops_per_token * tokens_per_s / self.peak_flops
        if scores is not None:  # train_loss stays the step's: the evaluation's is on its fixed batches
            line |= {"eval_train_loss": scores["train_loss"]} | {k: scores[k] for k in ("val_loss", "val_bpb")}
            self.evaluated(it, scores, tokens_per_s)
        self.log(line | {"elapsed_s": elapsed_s})

    def evaluated(self, it, scores, tokens_per_s):
        """An evaluation's line above the bar: its losses (train.evaluate's scores) and the window's tokens/s."""
        self.bar.write(
            f"iter {it}: train {scores['train_loss']:.4f}, val {scores['val_loss']:.4f} "
            f"({scores['val_bpb']:.3f} bits/byte), {tokens_per_s:,.0f} tokens/s"
        )

    def log(self, line):
        append_line(self.metrics, json.dumps(line))
        self.tracker.log(line)
        self.seconds, self.steps = 0.0, 0
