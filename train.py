"""Train a GPT on a prepared dataset.

    python train.py [CONFIG.toml] [--key=value ...]        one process (CPU, one GPU, MPS)
    torchrun --standalone --nproc_per_node=N train.py ...   data-parallel (DDP) on N devices

Settings come from the GPTConfig (model.py) and TrainConfig (here) defaults, then the
TOML file, then --key=value; `python train.py --help` lists them all. Ctrl-C or SIGTERM
finishes the step, writes out_dir/ckpt.pt and exits; `--resume` continues exactly.
"""

import contextlib
import json
import math
import os
import shlex
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import config
import hf
import positions
import trackers
from checkpoint import init_from_checkpoint, resumable_checkpoint, rng_state, save_checkpoint, set_rng_state
from config import opt
from data.loader import DROPOUT, Batches, micro_seed
from data.tokenizer import bytes_per_token, hf_tokenizer_fields, load_meta, tokenizer_from_meta
from files import RunLock, WriteError, append_line, atomic_write, open_log, read_log
from model import GPT, GPTConfig
from optim import OPTIMIZERS, make_optimizer
from data.recall import Recall, RecallBatches
from runtime import DTYPES, any_rank, run_record, setup_runtime


@dataclass
class TrainConfig:
    dataset: str = opt("shakespeare_char", "dataset folder name under data_dir (made by data/prepare.py)")
    data_dir: str = opt("data", "folder holding the prepared datasets")
    out_dir: str = opt("out", "where checkpoints, config.json and metrics.jsonl go")
    resume: bool = opt(False, "continue from out_dir/ckpt.pt")
    batch_size: int = opt(12, "sequences per micro-batch (per process)")
    gradient_accumulation_steps: int = opt(1, "micro-batches per optimizer step, summed over all processes")
    learning_rate: float = opt(6e-4, "peak learning rate")
    min_lr: float | None = opt(None, "final learning rate of the cosine decay (default learning_rate / 10)")
    max_iters: int = opt(5000, "optimizer steps in total")
    warmup_iters: int = opt(100, "steps of linear warmup")
    lr_decay_iters: int | None = opt(None, "step where the cosine decay ends (default max_iters)")
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices (not on biases, norms)")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.95, "AdamW beta2")
    optimizer: str = opt("adamw", "adamw, or muon: Muon on the blocks' weight matrices, AdamW (learning_rate) on the "
                                  "embeddings, head, norms, biases and positional parameters")
    muon_lr: float = opt(0.02, "Muon's peak learning rate, on learning_rate's schedule (0.02: Keller Jordan's Muon, "
                               "nanochat's matrices)")
    muon_momentum: float = opt(0.95, "Muon's (Nesterov) momentum")
    muon_weight_decay: float = opt(0.0, "Muon's decoupled weight decay: weights shrink by muon_lr times it a step")
    muon_ns_steps: int = opt(5, "Newton-Schulz steps of Muon's orthogonalisation")
    muon_split_qkv: bool = opt(False, "Muon orthogonalises q, k and v apart, not their fused projection as one")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 = off)")
    eval_interval: int = opt(250, "evaluate and checkpoint every this many steps (and at the end)")
    eval_iters: int = opt(20, "validation batches per evaluation (a fixed set)")
    log_interval: int = opt(10, "write a train line to metrics.jsonl every this many steps")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N or mps")
    dtype: str = opt("auto", "auto (CUDA: bfloat16 if supported, else float16; CPU: bfloat16 where a probe finds "
                             "its matmuls 1.5x float32's, else float32; mps: float32), float32, bfloat16, float16")
    compile: bool | None = opt(None, "torch.compile the model (default: on for CUDA only)")
    seed: int = opt(1337, "seed for initialisation, batches and dropout")
    progress: bool = opt(True, "show a progress bar")
    log: str = opt("none", "also log what metrics.jsonl gets to wandb or tensorboard (each an optional package)")
    init_from: str = opt("", "start from this checkpoint's weights with a fresh optimizer: a ckpt.pt or a run's out_dir "
                             "(fine-tuning, e.g. at a longer block_size with a rope_scaling), or hf:NAME_OR_PATH, a "
                             "transformers GPT-2 or GPT-NeoX checkpoint (its architecture; your block_size, dropout "
                             "and rope scaling)")
    recall_share: float = opt(0.0, "share of training sequences that carry the associative-recall task (data/recall.py)")
    recall_pairs: int = opt(4, "needles, and queries at the row's end, in a sequence that carries the recall task")
    recalibration_lr: float | None = opt(None, "DroPE: the recalibration's own peak learning rate, reached again by "
                                               "a warmup after the drop (default: the schedule goes on)")
    recalibration_warmup: int = opt(20, "DroPE: warmup steps of the recalibration's schedule")
    drop_rope_at: int | None = opt(None, "DroPE: at this step RoPE is dropped (pos_emb becomes none) and training "
                                         "goes on without positions, a recalibration (Gelberg et al. 2025)")

    def __post_init__(self):
        config.require_positive(self, "batch_size", "gradient_accumulation_steps", "max_iters", "lr_decay_iters",
                                "eval_interval", "eval_iters", "log_interval", "drop_rope_at", "muon_ns_steps", "recall_pairs")
        if self.recalibration_lr is not None and (self.drop_rope_at is None or not 0 < self.recalibration_lr < math.inf):
            raise ValueError(f"recalibration_lr={self.recalibration_lr} is DroPE's: it needs drop_rope_at and a "
                             "finite rate > 0")
        if self.drop_rope_at is not None and self.drop_rope_at >= self.max_iters:
            raise ValueError(f"drop_rope_at={self.drop_rope_at} must come before max_iters={self.max_iters}, "
                             "leaving steps to recalibrate without RoPE")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is unknown; choose one of {', '.join(OPTIMIZERS)}")
        for name in ("warmup_iters", "weight_decay", "grad_clip", "min_lr", "seed", "muon_weight_decay"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < math.inf:
                raise ValueError(f"{name}={value} must be a finite number >= 0")
        if not 0 < self.learning_rate < math.inf:
            raise ValueError(f"learning_rate={self.learning_rate} must be a finite number > 0")
        if not 0 < self.muon_lr < math.inf:
            raise ValueError(f"muon_lr={self.muon_lr} must be a finite number > 0")
        for name in ("beta1", "beta2", "muon_momentum"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must lie in [0, 1)")
        if not 0 <= self.recall_share <= 1:
            raise ValueError(f"recall_share={self.recall_share} must lie in [0, 1]")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is unknown; choose {', '.join(DTYPES)}")
        trackers.check(self.log)


class Divergence(ValueError):
    """A non-finite loss, from settings such as the learning rate or the dtype (its message says which);
    every process of a run raises it at the same step."""


@torch.no_grad()
def evaluate(model, batches, rt):
    """Mean loss on the fixed train and val batches, and val bits per byte."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = []
        for x, y in batches.eval_batches(split):
            with rt.autocast():
                losses.append(model(x, y)[1].item())
        out[f"{split}_loss"] = sum(losses) / len(losses)
    out["val_bpb"] = out["val_loss"] / math.log(2) / bytes_per_token(batches.meta)
    model.train()
    return out


# ----------------------------------------------------------------------------- the optimizer step

def lr_at(it, tc):
    """Linear warmup to learning_rate, then cosine decay to min_lr at lr_decay_iters. DroPE's recalibration with a
    recalibration_lr has a schedule of its own from the drop: warmup to that peak, cosine to a tenth at max_iters."""
    start, peak, warmup, end = 0, tc.learning_rate, tc.warmup_iters, tc.lr_decay_iters or tc.max_iters
    floor = tc.learning_rate / 10 if tc.min_lr is None else tc.min_lr
    if tc.recalibration_lr and it >= tc.drop_rope_at:
        start, peak, warmup, end = tc.drop_rope_at, tc.recalibration_lr, tc.recalibration_warmup, tc.max_iters
        floor = tc.recalibration_lr / 10
    it -= start
    if it < warmup:
        return peak * (it + 1) / (warmup + 1)
    if it >= end - start:
        return floor
    progress = (it - warmup) / max(1, end - start - warmup)
    return floor + 0.5 * (1 + math.cos(math.pi * progress)) * (peak - floor)


class TrainState:
    """What a run's checkpoint holds and its resume restores: weights, optimizer, loss scaler, progress, RNG."""

    def __init__(self, model, tc, rt):
        self.model = model  # unwrapped: saved without any compile or DDP prefix
        self.optimizer, self.scaler = make_optimizer(model, tc, rt)
        self.iter, self.best_val, self.saved_at = 0, float("inf"), None
        self.started = time.perf_counter()  # elapsed_s counts from here, evaluation included

    def elapsed(self):
        return time.perf_counter() - self.started

    def state_dict(self):
        return {"model": self.model.state_dict(), "model_config": self.model.config.asdict(),
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {}, "iter": self.iter,
                "best_val_loss": self.best_val, "rng": rng_state(), "elapsed_s": self.elapsed()}

    def load_state_dict(self, ckpt):
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt["scaler"]:
            self.scaler.load_state_dict(ckpt["scaler"])
        self.iter = self.saved_at = ckpt["iter"]
        self.best_val = ckpt["best_val_loss"]
        self.started = time.perf_counter() - ckpt.get("elapsed_s", 0.0)  # the clock runs on from the checkpoint's
        set_rng_state(ckpt["rng"])


def train_step(model, optimizer, scaler, micro_batches, lr, grad_clip, rt):
    """One optimizer step, the one train.py, bench.py and ablate.py all take: forward and backward over each
    micro-batch (x, y, dropout seed or None) under rt's autocast, then unscale, clip the global gradient norm
    (0 = off), step and clear. model may be wrapped by torch.compile or DDP. Returns the loss summed over
    micro-batches and the gradient norm as tensors: reading them is a device sync, the caller's choice."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # a group with a peak of its own follows the schedule's shape
    loss_sum, n = torch.zeros((), device=rt.device), len(micro_batches)
    for j, (x, y, seed) in enumerate(micro_batches):
        if seed is not None:
            torch.manual_seed(seed)
        # DDP all-reduces (averages) gradients on the last micro-step only
        sync = model.no_sync() if isinstance(model, DDP) and j < n - 1 else contextlib.nullcontext()
        with sync, rt.autocast():
            loss = model(x, y)[1] / n
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def step_batches(batches, it, tc, rt):
    """This process's share of step it's global batch: (x, y, dropout seed), each fixed by its place in it."""
    per_rank = tc.gradient_accumulation_steps // rt.world_size
    places = range(rt.rank * per_rank, (rt.rank + 1) * per_rank)
    return [(*batches.train(it, micro), micro_seed(tc.seed, it, micro, DROPOUT)) for micro in places]


def step_outcome(loss_sum, stop_requested, rt):
    """(the step's mean loss, whether any process asked to stop): one collective under DDP carries both, so
    every rank stops together."""
    if rt.world_size == 1:
        return loss_sum.item(), stop_requested
    status = torch.stack([loss_sum, torch.tensor(float(stop_requested), device=rt.device)])
    dist.all_reduce(status)
    loss_total, requests = status.tolist()
    return loss_total / rt.world_size, requests > 0


# ----------------------------------------------------------------------------- the run

def trim_log(path, upto):
    """Keep the log lines of iterations up to upto (torn ones dropped): the resumed run logs the later ones again."""
    kept = "".join(json.dumps(m) + "\n" for m in read_log(path) if m["iter"] <= upto)
    atomic_write(path, lambda f: f.write(kept.encode()))


class StopFlag:
    """While entered, SIGINT/SIGTERM ask the loop to finish its step, checkpoint and exit; a second
    Ctrl-C exits at once. Under torchrun a worker gets each Ctrl-C twice (from the terminal, and
    forwarded by torchrun), so there a repeat only asks again: torchrun's own timeout is the hard stop."""

    def __init__(self, quit_on_repeat=True):
        self.requested, self.quit_on_repeat, self.previous = False, quit_on_repeat, {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT and self.quit_on_repeat:
            raise KeyboardInterrupt
        self.requested = True


def check_out_dir(tc):
    path = Path(tc.out_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out_dir={tc.out_dir!r} is a file; give a folder path")
    if not tc.resume and (path / "ckpt.pt").exists():
        raise ValueError(f"out_dir={tc.out_dir!r} already holds a run's ckpt.pt; continue it with --resume=true, "
                         "or start afresh in another out_dir (or after deleting that one)")
    return path


def resume_command(argv, rt):
    if argv is None or rt.world_size > 1:
        return "run the same command with --resume=true"
    args = [a for a in argv if not a.startswith("--resume")] + ["--resume=true"]
    return f"python train.py {shlex.join(args)}"


class Progress:
    """The progress bar, out_dir/metrics.jsonl and any tracker (--log; the master process alone writes), and
    tokens/s, measured afresh over each logging window."""

    def __init__(self, out, tc, rt, start_iter, tokens_per_step, record):
        self.bar = tqdm(total=tc.max_iters, initial=start_iter, disable=not (rt.master and tc.progress),
                        dynamic_ncols=True)
        self.metrics = open_log(out / "metrics.jsonl") if rt.master else None
        self.tracker = trackers.open_tracker(tc.log if rt.master else "none", out, record, tc.resume)
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

    def log(self, line):
        append_line(self.metrics, json.dumps(line))
        self.tracker.log(line)
        self.seconds, self.steps = 0.0, 0


def last_checkpoint(state, out):
    if state.saved_at is None:
        return "no checkpoint had been written yet"
    return f"the last checkpoint, {out / 'ckpt.pt'} (iteration {state.saved_at}), is untouched"


def divergence(what, state, tc, rt, out):
    """The error a non-finite loss raises, naming the likely causes and the checkpoint kept."""
    return Divergence(f"{what} at iteration {state.iter}: training diverged. Likely causes: learning_rate="
                      f"{tc.learning_rate} too high (lower it or raise warmup_iters), or {rt.dtype_name} overflowing "
                      f"(try dtype=bfloat16 or float32); {last_checkpoint(state, out)}")


def imported_config(name, gcfg, meta):
    """The model config of init_from=hf:name (hf.import_config), once the dataset is known to be tokenized by the
    checkpoint's own tokenizer."""
    gcfg = hf.import_config(name, gcfg)  # an unknown name or architecture fails first
    if meta.get("hf_tokenizer") != hf_tokenizer_fields(name)["hf_tokenizer"]:
        raise ValueError(f"init_from=hf:{name} reads the ids of its own tokenizer, but dataset {meta['dataset']!r} "
                         f"was prepared with the {meta['tokenizer']} tokenizer"
                         + (f" of {meta['hf_name']}" if meta["tokenizer"] == "hf" else "")
                         + f"; prepare it with python data/prepare.py --tokenizer hf:{name} --input CORPUS "
                         f"--dataset NAME")
    return gcfg


def config_at(gcfg, tc, it):
    """The model config in force from step it on: DroPE's drop (drop_rope_at) leaves pos_emb none."""
    dropped = tc.drop_rope_at is not None and it >= tc.drop_rope_at
    return replace(gcfg, pos_emb=positions.NoPE.name) if dropped else gcfg


@contextlib.contextmanager
def started_run(gcfg, tc):
    """Everything before the first step: the runtime, the data, the model config with the dataset's vocabulary (a
    new one: gcfg is not changed), the out_dir lock, the state (restored on resume) and the run's first files; bad
    settings fail before anything slow or written. The lock is held until exit."""
    rt = setup_runtime(tc.device, tc.dtype, tc.compile)
    if tc.gradient_accumulation_steps % rt.world_size:
        raise ValueError(f"gradient_accumulation_steps={tc.gradient_accumulation_steps} must be divisible by the "
                         f"number of processes ({rt.world_size}), which share its micro-batches")
    dataset_dir = Path(tc.data_dir) / tc.dataset
    meta = load_meta(dataset_dir)
    hf_name = tc.init_from.removeprefix(hf.PREFIX) if tc.init_from.startswith(hf.PREFIX) else None
    gcfg = imported_config(hf_name, gcfg, meta) if hf_name else replace(gcfg, vocab_size=meta["vocab_size"])
    data = (dataset_dir, meta, gcfg.block_size, tc.batch_size, tc.seed, rt.device, tc.eval_iters)
    if tc.recall_share:
        batches = RecallBatches(Recall(tokenizer_from_meta(meta), tc.recall_pairs), tc.recall_share, *data)
    else:
        batches = Batches(*data)
    out = check_out_dir(tc) if rt.master else Path(tc.out_dir)
    if tc.drop_rope_at is not None and not issubclass(positions.scheme(gcfg.pos_emb), positions.RoPE):
        raise ValueError(f"drop_rope_at={tc.drop_rope_at} drops RoPE, but pos_emb={gcfg.pos_emb!r} has none; "
                         "use pos_emb=rope (or a RoPE variant) with it")
    ckpt = resumable_checkpoint(out / "ckpt.pt", gcfg, meta, tc.max_iters, tc.optimizer) if tc.resume else None
    torch.manual_seed(tc.seed)  # the same initial weights on every rank
    state = TrainState(GPT(gcfg).to(rt.device), tc, rt)
    if tc.init_from and not ckpt:  # fine-tuning's start; a resume continues from its own checkpoint instead
        if hf_name:
            hf.load_pretrained(state.model, hf_name)
        else:
            init_from_checkpoint(state.model, tc.init_from, meta)
    with RunLock(out, "training run") if rt.master else contextlib.nullcontext():  # the master writes alone
        if ckpt:
            if config_at(gcfg, tc, ckpt["iter"]) != gcfg:  # resumed past DroPE's drop
                state.model.reconfigure(pos_emb=config_at(gcfg, tc, ckpt["iter"]).pos_emb)
            state.load_state_dict(ckpt)
            del ckpt  # its tensors are copied into the state
        record = {"model": gcfg.asdict(), "train": asdict(tc), **run_record(), "world_size": rt.world_size}
        if rt.master:
            trim_log(out / "metrics.jsonl", state.iter)  # a fresh run's log starts empty, a resumed one's at its step
            if tc.resume:
                print(f"resuming from {out / 'ckpt.pt'} at iteration {state.iter}")
            atomic_write(out / "config.json", lambda f: f.write((json.dumps(record, indent=2) + "\n").encode()))
            print(f"model: {state.model.num_params() / 1e6:.2f}M parameters, pos_emb={gcfg.pos_emb}; "
                  f"tokens per step: {tc.batch_size * gcfg.block_size * tc.gradient_accumulation_steps:,}")
        run_info = {"train_config": asdict(tc), "tokenizer": meta, "record": record}
        yield gcfg, rt, batches, out, state, run_info


def train(gcfg, tc, argv=None):
    """Train; argv (the command's arguments) only shapes the resume hint printed on a stop."""
    with started_run(gcfg, tc) as (gcfg, rt, batches, out, state, run_info):
        try:
            stopped = loop(gcfg, tc, rt, batches, out, state, run_info)
        except WriteError as e:  # a full or read-only device: a stop whose checkpoint could not be written
            again = resume_command(argv, rt) if state.saved_at is not None else "run the same command again"
            raise WriteError(f"{e}; {last_checkpoint(state, out)}; once there is room: {again}") from None
    if rt.master:
        if stopped:
            print(f"stopped at iteration {state.iter}; checkpoint written to {out / 'ckpt.pt'}. "
                  f"To continue: {resume_command(argv, rt)}")
        else:
            print(f"done: {state.iter} iterations in {state.elapsed():.1f}s, best val loss {state.best_val:.4f}; "
                  f"loss curves: python plot.py {out}")
    return state.best_val


def loop(gcfg, tc, rt, batches, out, state, run_info):
    """The steps from state.iter to max_iters, with evaluations, the log and checkpoints; True if a signal
    stopped it early."""
    # evaluate with this one, never the DDP wrapper: its forward may talk to the ranks that are not evaluating
    compiled = torch.compile(state.model) if rt.compile else state.model
    model = compiled if rt.world_size == 1 else DDP(compiled, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)
    tokens_per_step = tc.batch_size * gcfg.block_size * tc.gradient_accumulation_steps
    flops_per_step = state.model.flops_per_token(gcfg.block_size) * tokens_per_step
    with (StopFlag(quit_on_repeat=rt.world_size == 1) as stop,
          Progress(out, tc, rt, state.iter, tokens_per_step, run_info["record"]) as progress):
        for it in range(state.iter, tc.max_iters):
            if it == tc.drop_rope_at:
                state.model.reconfigure(pos_emb=config_at(gcfg, tc, it).pos_emb)  # compiled: recompiles once
                if rt.master:
                    progress.bar.write(f"iteration {it}: RoPE dropped (DroPE), recalibrating without positions")
            t0 = time.perf_counter()
            lr = lr_at(it, tc)
            loss_sum, grad_norm = train_step(model, state.optimizer, state.scaler, step_batches(batches, it, tc, rt), lr,
                                             tc.grad_clip, rt)
            train_loss, stop_now = step_outcome(loss_sum, stop.requested, rt)
            state.iter = done = it + 1
            if not math.isfinite(train_loss):
                raise divergence(f"the training loss is {train_loss}", state, tc, rt, out)
            tokens_per_s = progress.step(time.perf_counter() - t0, train_loss)
            eval_due = done % tc.eval_interval == 0 or done == tc.max_iters or stop_now
            if rt.master and stop_now:
                progress.bar.write(f"stop requested: finishing at iteration {done} with a checkpoint"
                                   + (" (Ctrl-C again to quit at once)" if stop.quit_on_repeat else ""))
            line = None
            if rt.master and (eval_due or done % tc.log_interval == 0):
                line = {"iter": done, "train_loss": train_loss, "grad_norm": grad_norm.item(), "lr": lr,
                        "tokens_per_s": tokens_per_s}
                if rt.device_type == "cuda":
                    line["mfu"] = flops_per_step / tokens_per_step * tokens_per_s / peak_flops(rt)
            if eval_due:
                ev = evaluate(compiled, batches, rt) if rt.master else {}
                # rank 0's verdict goes to every rank, so a divergence seen in evaluation stops all of them
                if any_rank(not all(map(math.isfinite, ev.values())), rt):
                    raise divergence("evaluation gave a non-finite loss", state, tc, rt, out)
                if rt.master:  # train_loss stays the step's: the evaluation's is on its fixed batches
                    line |= {"eval_train_loss": ev["train_loss"], "val_loss": ev["val_loss"], "val_bpb": ev["val_bpb"]}
                    progress.bar.write(f"iter {done}: train {ev['train_loss']:.4f}, val {ev['val_loss']:.4f} "
                                       f"({ev['val_bpb']:.3f} bits/byte), {tokens_per_s:,.0f} tokens/s")
            # the log line before the checkpoint: a kill between them leaves a line past the checkpoint, which
            # the resume trims, rather than a checkpoint whose iteration the log never gets
            if line is not None:
                progress.log(line | {"elapsed_s": state.elapsed()})
            if eval_due:
                if rt.master:
                    save(state, ev["val_loss"], out, run_info)
                state.saved_at = done
            if stop_now:
                return True
    return False


def save(state, val_loss, out, run_info):
    """out_dir/ckpt.pt after every evaluation, and best.pt when val_loss is the run's lowest yet."""
    if val_loss < state.best_val:
        state.best_val = val_loss
        save_checkpoint(state.state_dict() | run_info, out / "best.pt")
    save_checkpoint(state.state_dict() | run_info, out / "ckpt.pt")


def peak_flops(rt):
    """Dense bf16 peak of the GPU, for MFU; an assumed H100/A100-class figure when the name is unknown."""
    name = torch.cuda.get_device_name(rt.device)
    table = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "4090": 165e12, "3090": 71e12}
    return next((v for k, v in table.items() if k in name), 312e12)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "-h" in argv or "--help" in argv:
        print(__doc__ + config.help_text(GPTConfig, TrainConfig))
        return
    rank = int(os.environ.get("RANK", 0))
    who = f"[rank {rank}] " if int(os.environ.get("WORLD_SIZE", 1)) > 1 else ""
    try:
        train(*config.parse(argv, GPTConfig, TrainConfig), argv)
    except Divergence as e:
        if rank == 0:  # every rank raises it together; one message is enough
            print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except ValueError as e:  # may be one rank's alone (a node without the data), so each says it
        print(f"{who}error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{who}interrupted: quit at once, without a new checkpoint; those on disk are whole", file=sys.stderr)
        sys.exit(130)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
