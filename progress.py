"""What a training run shows and keeps of its steps: the progress bar, out_dir/metrics.jsonl and, with --log, a
tracker (trackers.py, imported only then); the master process alone writes."""

import json

from tqdm import tqdm

from files import append_line, open_log


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
        self.tracker = None  # --log's, on the master
        if runtime.master and train_cfg.log != "none":
            from trackers import open_tracker

            self.tracker = open_tracker(train_cfg.log, out, record, train_cfg.resume)
        self.tokens_per_step, self.seconds, self.steps = tokens_per_step, 0.0, 0
        self.master, self.log_interval, self.flops_per_token = runtime.master, train_cfg.log_interval, flops_per_token
        # model FLOPs utilisation against the device's peak, where it has a known one (CUDA)
        self.peak_flops = runtime.peak_flops() if runtime.device_type == "cuda" else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.bar.close()
        if self.tracker:
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
        if self.tracker:
            self.tracker.log(line)
        self.seconds, self.steps = 0.0, 0
