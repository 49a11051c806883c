"""A training run's plumbing, behind the calls of train.py's loop: everything before the first step (device, data,
the model config a fine-tune or resume starts from, the out_dir lock, the first files), the state a checkpoint holds,
the schedule's changes of the model config, and the error a diverged run stops with.
"""

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

import checkpoint
from data.batches import make_batches
from data.tokenizer import load_meta
from files import RunLock
from model import GPT
from optim import make_optimizer
from progress import Progress
from runtime import EveryRankError, pick_dtype, setup_runtime


class Divergence(EveryRankError):
    """A non-finite loss, from settings such as the learning rate or the dtype (its message says which); every
    process of a run raises it at the same step."""


class TrainState:
    """What a run's checkpoint holds and its resume restores: weights, optimizer, loss scaler, progress, RNG."""

    def __init__(self, model, train_cfg, runtime):
        self.model = model  # unwrapped: saved without any compile or DDP prefix
        self.optimizer, self.scaler = make_optimizer(model, train_cfg, runtime)
        self.iter, self.best_val, self.saved_at = 0, float("inf"), None
        self.started = time.perf_counter()  # elapsed_s counts from here, evaluation included

    def elapsed(self):
        return time.perf_counter() - self.started


@dataclass
class Run:
    """A training run ready for its loop, as start() makes it: the model config in force at its start, the settings,
    runtime, batches, out_dir, state, schedule and what every checkpoint records beside the state."""

    model_cfg: object  # model.GPTConfig
    train_cfg: object  # train.TrainConfig
    runtime: object  # runtime.Runtime
    batches: object  # data.loader.Batches, or a subclass that writes a task into them
    out: Path
    state: TrainState
    schedule: object  # train.Schedule
    info: dict  # the settings, tokenizer and record each checkpoint carries

    def tokens_per_step(self):
        return self.train_cfg.batch_size * self.model_cfg.block_size * self.train_cfg.gradient_accumulation_steps

    def progress(self):
        """The progress bar and the metrics log from the state's iteration on."""
        flops_per_token = self.state.model.flops_per_token(self.model_cfg.block_size)
        return Progress(
            self.out,
            self.train_cfg,
            self.runtime,
            self.state.iter,
            self.tokens_per_step(),
            self.info["record"],
            flops_per_token,
        )


@contextlib.contextmanager
def start(model_cfg, train_cfg, batch_cfg, schedule):
    """Everything before the first step, bad settings failing before anything slow or written: the runtime, the model
    config (the dataset's vocabulary, a fine-tune's source's; model_cfg is not changed), a resume's checkpoint, the
    model and its state, the data, the out_dir lock (held until exit) and the run's first files."""
    runtime = setup_runtime(train_cfg.device, train_cfg.dtype, train_cfg.compile)
    if train_cfg.gradient_accumulation_steps % runtime.world_size:
        raise ValueError(
            f"gradient_accumulation_steps={train_cfg.gradient_accumulation_steps} must be divisible by the number of "
            f"processes ({runtime.world_size}), which share its micro-batches"
        )
    dataset_dir = Path(train_cfg.data_dir) / train_cfg.dataset
    meta = load_meta(dataset_dir)
    out = checkpoint.check_out_dir(train_cfg.out_dir, train_cfg.resume) if runtime.master else Path(train_cfg.out_dir)
    model_cfg, source, ckpt = starting_point(train_cfg, model_cfg, meta, out)
    one_precision(train_cfg, runtime, ckpt)
    torch.manual_seed(train_cfg.seed)  # the same initial weights on every rank
    model = GPT(model_cfg).to(runtime.device)
    batch_cfg.check_model(model_cfg, type(model.scheme))  # a fine-tune's scheme is its source's
    batches = make_batches(
        batch_cfg,
        dataset_dir,
        meta,
        model_cfg.block_size,
        train_cfg.batch_size,
        train_cfg.seed,
        runtime.device,
        train_cfg.eval_iters,
    )
    state = TrainState(model, train_cfg, runtime)
    if source and not ckpt:  # fine-tuning's start; a resume continues from its own checkpoint instead
        source.load_into(state.model)
    with RunLock(out, "training run") if runtime.master else contextlib.nullcontext():  # the master writes alone
        if ckpt:
            checkpoint.unpack(state, ckpt)
            del ckpt  # its tensors are copied into the state
        info = checkpoint.run_info(model_cfg, train_cfg, batch_cfg, schedule, meta, runtime)
        run = Run(model_cfg, train_cfg, runtime, batches, out, state, schedule, info)
        if runtime.master:
            checkpoint.first_files(out, info["record"], state.iter, train_cfg.resume)
            print(
                f"model: {state.model.num_params() / 1e6:.2f}M parameters, pos_emb={model_cfg.pos_emb}; "
                f"tokens per step: {run.tokens_per_step():,}"
            )
        yield run


def starting_point(train_cfg, model_cfg, meta, out):
    """Where a run starts: (its model config on the dataset (meta), the Source of a fine-tune's first weights or None,
    a resume's checkpoint in out or None), each refused where it contradicts the run."""
    if train_cfg.init_from:
        from source import start_model  # read only where a run starts from a model

        model_cfg, source = start_model(train_cfg.init_from, model_cfg, meta)
    else:
        model_cfg, source = replace(model_cfg, vocab_size=meta["vocab_size"]), None
    if not train_cfg.resume:
        return model_cfg, source, None
    ckpt = checkpoint.resumable_checkpoint(out, model_cfg, meta, train_cfg.max_iters, train_cfg.optimizer)
    return model_cfg, source, ckpt


def one_precision(train_cfg, runtime, ckpt):
    """A resume computes in the dtype its run recorded (a fresh run in the one runtime resolved), on whatever device
    it now runs (refused where that device cannot: bf16 on a GPU without it): auto continues in it, another dtype is
    refused. Checkpoints from before the record resolve auto again."""
    saved = ckpt.get("record", {}).get("dtype") if ckpt else None
    if saved is None:
        return
    if train_cfg.dtype not in ("auto", saved):
        raise ValueError(
            f"cannot resume: the run trains in dtype={saved}, and this command asks for dtype={train_cfg.dtype}; "
            f"drop --dtype or pass --dtype={saved}"
        )
    dtype = pick_dtype(saved, runtime.device_type)
    if dtype != runtime.dtype and runtime.master:
        print(f"dtype: {saved} (the run's own, which a resume keeps)")
    runtime.dtype = dtype


def follow(run, it, progress):
    """The model config the schedule has in force at step it, applied to the model where it differs."""
    model, wanted = run.state.model, run.schedule.model_config(it, run.model_cfg)
    if wanted != model.config:
        now = model.config.asdict()
        changes = {k: (now[k], v) for k, v in wanted.asdict().items() if now[k] != v}
        model.reconfigure(**{k: new for k, (_, new) in changes.items()})  # compiled: recompiles once
        if run.runtime.master:
            progress.bar.write(
                f"iteration {it}: the schedule changes the model's "
                + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
            )


def divergence(what, run):
    """The error a non-finite loss raises, naming the likely causes and the checkpoint kept."""
    return Divergence(
        f"{what} at iteration {run.state.iter}: training diverged. Likely causes: learning_rate="
        f"{run.train_cfg.learning_rate} too high (lower it or raise warmup_iters), or {run.runtime.dtype_name} "
        f"overflowing (try dtype=bfloat16 or float32); {checkpoint.last_checkpoint(run.state, run.out)}"
    )
