"""Train a GPT on a prepared dataset.

    python train.py [CONFIG.toml] [--key=value ...]        one process (CPU, one GPU, MPS)
    torchrun --standalone --nproc_per_node=N train.py ...   data-parallel (DDP) on N devices

Settings come from the GPTConfig (model.py) and TrainConfig (here) defaults, then the
TOML file, then --key=value; `python train.py --help` lists them all. Ctrl-C or SIGTERM
finishes the step, writes out_dir/ckpt.pt and exits; `--resume` continues exactly.
"""

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
import config
import positions
import runtime
import trackers
from config import FRACTION, NON_NEGATIVE, POSITIVE, RATE, one_of, opt
from data.batches import BatchConfig, make_batches
from data.loader import DROPOUT, micro_seed
from data.tokenizer import bytes_per_token, load_meta
from files import RunLock, WriteError
from model import GPT, GPTConfig
from optim import OPTIMIZERS, make_optimizer
from trackers import Progress


@dataclass
class TrainConfig:
    dataset: str = opt("shakespeare_char", "dataset folder name under data_dir (made by `python -m data.prepare`)")
    data_dir: str = opt("data", "folder holding the prepared datasets", resume=True)
    out_dir: str = opt("out", "where checkpoints, config.json and metrics.jsonl go", resume=True, weights=False)
    resume: bool = opt(
        False,
        "continue from out_dir/ckpt.pt with the run's own settings (its config.json); only those "
        "a resume may change can be given",
        resume=True,
        weights=False,
    )
    batch_size: int = opt(12, "sequences per micro-batch (per process)", check=POSITIVE)
    gradient_accumulation_steps: int = opt(
        1, "micro-batches per optimizer step, summed over all processes", check=POSITIVE
    )
    learning_rate: float = opt(6e-4, "peak learning rate", check=RATE)
    min_lr: float | None = opt(
        None, "final learning rate of the cosine decay (default learning_rate / 10)", check=NON_NEGATIVE
    )
    max_iters: int = opt(5000, "optimizer steps in total", check=POSITIVE, resume=True)
    warmup_iters: int = opt(100, "steps of linear warmup", check=NON_NEGATIVE)
    lr_decay_iters: int | None = opt(None, "step where the cosine decay ends (default max_iters)", check=POSITIVE)
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices (not on biases, norms)", check=NON_NEGATIVE)
    beta1: float = opt(0.9, "AdamW beta1", check=FRACTION)
    beta2: float = opt(0.95, "AdamW beta2", check=FRACTION)
    optimizer: str = opt(
        "adamw",
        "adamw, or muon: Muon on the blocks' weight matrices, AdamW (learning_rate) on the "
        "embeddings, head, norms, biases and positional parameters",
        check=one_of(OPTIMIZERS),
    )
    muon_lr: float = opt(
        0.02,
        "Muon's peak learning rate, on learning_rate's schedule (0.02: Keller Jordan's Muon, nanochat's matrices)",
        check=RATE,
    )
    muon_momentum: float = opt(0.95, "Muon's (Nesterov) momentum", check=FRACTION)
    muon_weight_decay: float = opt(
        0.0, "Muon's decoupled weight decay: weights shrink by muon_lr times it a step", check=NON_NEGATIVE
    )
    muon_ns_steps: int = opt(5, "Newton-Schulz steps of Muon's orthogonalisation", check=POSITIVE)
    muon_split_qkv: bool = opt(False, "Muon orthogonalises q, k and v apart, not their fused projection as one")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 = off)", check=NON_NEGATIVE)
    eval_interval: int = opt(
        250, "evaluate and checkpoint every this many steps (and at the end)", check=POSITIVE, resume=True
    )
    eval_iters: int = opt(20, "validation batches per evaluation (a fixed set)", check=POSITIVE, resume=True)
    log_interval: int = opt(
        10, "write a train line to metrics.jsonl every this many steps", check=POSITIVE, resume=True
    )
    device: str = opt("auto", "auto, cpu, cuda, cuda:N or mps", resume=True)
    dtype: str = opt(
        "auto",
        "auto (CUDA: bfloat16 if supported, else float16; CPU: bfloat16 where a probe finds "
        "its matmuls 1.5x float32's, else float32; mps: float32), float32, bfloat16, float16",
        check=one_of(runtime.DTYPES),
    )
    compile: bool | None = opt(None, "torch.compile the model (default: on for CUDA only)", resume=True)
    seed: int = opt(1337, "seed for initialisation, batches and dropout", check=NON_NEGATIVE)
    progress: bool = opt(True, "show a progress bar", resume=True, weights=False)
    log: str = opt(
        "none",
        "also log what metrics.jsonl gets to wandb or tensorboard (each an optional package)",
        resume=True,
        weights=False,
    )
    init_from: str = opt(
        "",
        "start from this model's weights with a fresh optimizer: a run's out_dir or a checkpoint "
        "file (fine-tuning, e.g. at a longer block_size with a context scaling), or hf:NAME_OR_PATH, "
        "a transformers GPT-2 or GPT-NeoX checkpoint: its architecture, with this run's block_size, "
        "dropout and scaling, and the L0 it learned",
    )

    def __post_init__(self):
        config.validate(self)
        trackers.check(self.log)  # one that cannot start fails here, before anything is written


class Divergence(runtime.EveryRankError):
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


def warmup_cosine(it, peak, warmup, length, floor):
    """Step it of a schedule of length steps: linear warmup to peak, then cosine decay to floor, then floor."""
    if it < warmup:
        return peak * (it + 1) / (warmup + 1)
    if it >= length:
        return floor
    progress = (it - warmup) / max(1, length - warmup)
    return floor + 0.5 * (1 + math.cos(math.pi * progress)) * (peak - floor)


class Schedule:
    """What the loop asks at each step: the learning rate (warmup, then cosine decay to min_lr at lr_decay_iters)
    and the model config in force. An experiment that changes either over a run hands in a subclass."""

    def __init__(self, tc):
        self.tc = tc

    def lr(self, it):
        tc = self.tc
        floor = tc.learning_rate / 10 if tc.min_lr is None else tc.min_lr
        return warmup_cosine(it, tc.learning_rate, tc.warmup_iters, tc.lr_decay_iters or tc.max_iters, floor)

    def model_config(self, it, gcfg):
        return gcfg

    def settings(self):
        """What this schedule adds to a run's settings (recorded in config.json): nothing for the plain one."""
        return {}


class TrainState:
    """What a run's checkpoint holds and its resume restores: weights, optimizer, loss scaler, progress, RNG."""

    def __init__(self, model, tc, rt):
        self.model = model  # unwrapped: saved without any compile or DDP prefix
        self.optimizer, self.scaler = make_optimizer(model, tc, rt)
        self.iter, self.best_val, self.saved_at = 0, float("inf"), None
        self.started = time.perf_counter()  # elapsed_s counts from here, evaluation included

    def elapsed(self):
        return time.perf_counter() - self.started


def train_step(model, optimizer, scaler, micro_batches, lr, grad_clip, rt):
    """One optimizer step, the one train.py, bench.py and ablate.py all take: forward and backward over each
    micro-batch (a data.loader.Batch) under rt's autocast, then unscale, clip the global gradient norm (0 = off),
    step and clear. model may be wrapped by torch.compile or DDP. Returns the loss summed over micro-batches and
    the gradient norm as tensors: reading them is a device sync, the caller's choice."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # a group with a peak of its own follows the schedule's shape
    loss_sum, n = torch.zeros((), device=rt.device), len(micro_batches)
    for j, batch in enumerate(micro_batches):
        if batch.seed is not None:
            torch.manual_seed(batch.seed)
        # DDP all-reduces (averages) gradients on the last micro-step only
        sync = model.no_sync() if isinstance(model, DDP) and j < n - 1 else contextlib.nullcontext()
        with sync, rt.autocast():
            loss = model(batch.x, batch.y, position_ids=batch.position_ids)[1] / n
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def step_batches(batches, it, tc, rt):
    """This process's share of step it's global batch: Batches with their dropout seeds, each fixed by its place."""
    per_rank = tc.gradient_accumulation_steps // rt.world_size
    places = range(rt.rank * per_rank, (rt.rank + 1) * per_rank)
    return [batches.train(it, micro)._replace(seed=micro_seed(tc.seed, it, micro, DROPOUT)) for micro in places]


# ----------------------------------------------------------------------------- the run


def divergence(what, state, tc, rt, out):
    """The error a non-finite loss raises, naming the likely causes and the checkpoint kept."""
    return Divergence(
        f"{what} at iteration {state.iter}: training diverged. Likely causes: learning_rate="
        f"{tc.learning_rate} too high (lower it or raise warmup_iters), or {rt.dtype_name} overflowing "
        f"(try dtype=bfloat16 or float32); {checkpoint.last_checkpoint(state, out)}"
    )


@dataclass
class Run:
    """A training run ready for its loop, as start() makes it: the model config in force at its start, the
    settings, runtime, batches, out_dir, state, schedule and what every checkpoint records beside the state."""

    gcfg: GPTConfig
    tc: TrainConfig
    rt: runtime.Runtime
    batches: object  # data.loader.Batches, or a subclass that writes a task into them
    out: Path
    state: TrainState
    schedule: Schedule
    info: dict  # the settings, tokenizer and record each checkpoint carries

    def tokens_per_step(self):
        return self.tc.batch_size * self.gcfg.block_size * self.tc.gradient_accumulation_steps


@contextlib.contextmanager
def start(gcfg, tc, bc, schedule):
    """Everything before the first step, bad settings failing before anything slow or written: the runtime, the
    data, the model config (the dataset's vocabulary; a fine-tune's from its source; gcfg is not changed), the
    out_dir lock (held until exit), the state (restored on resume) and the run's first files."""
    rt = runtime.setup_runtime(tc.device, tc.dtype, tc.compile)
    if tc.gradient_accumulation_steps % rt.world_size:
        raise ValueError(
            f"gradient_accumulation_steps={tc.gradient_accumulation_steps} must be divisible by the "
            f"number of processes ({rt.world_size}), which share its micro-batches"
        )
    dataset_dir = Path(tc.data_dir) / tc.dataset
    meta = load_meta(dataset_dir)
    gcfg, source = checkpoint.start_model(tc.init_from, gcfg, meta)
    bc.check_model(gcfg, positions.scheme(gcfg.pos_emb))  # a fine-tune's scheme is its source's
    batches = make_batches(bc, dataset_dir, meta, gcfg.block_size, tc.batch_size, tc.seed, rt.device, tc.eval_iters)
    out = checkpoint.check_out_dir(tc.out_dir, tc.resume) if rt.master else Path(tc.out_dir)
    ckpt = checkpoint.resumable_checkpoint(out, gcfg, meta, tc.max_iters, tc.optimizer) if tc.resume else None
    torch.manual_seed(tc.seed)  # the same initial weights on every rank
    state = TrainState(GPT(gcfg).to(rt.device), tc, rt)
    if source and not ckpt:  # fine-tuning's start; a resume continues from its own checkpoint instead
        source.load_into(state.model)
    with RunLock(out, "training run") if rt.master else contextlib.nullcontext():  # the master writes alone
        if ckpt:
            checkpoint.unpack(state, ckpt)
            del ckpt  # its tensors are copied into the state
        info = checkpoint.run_info(gcfg, tc, bc, schedule, meta, rt.world_size)
        run = Run(gcfg, tc, rt, batches, out, state, schedule, info)
        if rt.master:
            checkpoint.first_files(out, info["record"], state.iter, tc.resume)
            print(
                f"model: {state.model.num_params() / 1e6:.2f}M parameters, pos_emb={gcfg.pos_emb}; "
                f"tokens per step: {run.tokens_per_step():,}"
            )
        yield run


def train(gcfg, tc, bc=None, schedule=None, argv=None):
    """Train. bc says what the batches carry beyond text (default: nothing), schedule the learning rate and the model
    config by step (default: Schedule(tc)); argv (the command's arguments) only shapes the resume hint of a stop."""
    with start(gcfg, tc, bc or BatchConfig(), schedule or Schedule(tc)) as run:
        try:
            stopped = loop(run)
        except WriteError as e:  # a full or read-only device: a stop whose checkpoint could not be written
            raise checkpoint.write_failed(e, run.state, run.out, argv, run.rt.world_size) from None
    state = run.state
    if run.rt.master:
        if stopped:
            print(
                f"stopped at iteration {state.iter}; checkpoint written to {run.out / 'ckpt.pt'}. "
                f"To continue: {checkpoint.resume_command(argv, run.rt.world_size)}"
            )
        else:
            print(
                f"done: {state.iter} iterations in {state.elapsed():.1f}s, best val loss {state.best_val:.4f}; "
                f"loss curves: python plot.py --runs={run.out}"
            )
    return state.best_val


def follow(run, it, progress):
    """The model config the schedule has in force at step it, applied to the model where it differs."""
    model, wanted = run.state.model, run.schedule.model_config(it, run.gcfg)
    if wanted != model.config:
        changes = {
            k: (getattr(model.config, k), v) for k, v in wanted.asdict().items() if getattr(model.config, k) != v
        }
        model.reconfigure(**{k: new for k, (_, new) in changes.items()})  # compiled: recompiles once
        if run.rt.master:
            progress.bar.write(
                f"iteration {it}: the schedule changes the model's "
                + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
            )


def loop(run):
    """The steps from the state's iteration to max_iters, with evaluations, the log and checkpoints; True if a
    signal stopped it early."""
    tc, rt, state = run.tc, run.rt, run.state
    # evaluate with this one, never the DDP wrapper: its forward may talk to the ranks that are not evaluating
    compiled, model = rt.wrap(state.model)
    flops_per_token = state.model.flops_per_token(run.gcfg.block_size)
    with (
        runtime.StopFlag(quit_on_repeat=rt.world_size == 1) as stop,
        Progress(run.out, tc, rt, state.iter, run.tokens_per_step(), run.info["record"]) as progress,
    ):
        for it in range(state.iter, tc.max_iters):
            follow(run, it, progress)
            t0 = time.perf_counter()
            lr = run.schedule.lr(it)
            loss_sum, grad_norm = train_step(
                model, state.optimizer, state.scaler, step_batches(run.batches, it, tc, rt), lr, tc.grad_clip, rt
            )
            train_loss, stop_now = runtime.mean_and_any(loss_sum, stop.requested, rt)
            state.iter = done = it + 1
            if not math.isfinite(train_loss):
                raise divergence(f"the training loss is {train_loss}", state, tc, rt, run.out)
            tokens_per_s = progress.step(time.perf_counter() - t0, train_loss)
            eval_due = done % tc.eval_interval == 0 or done == tc.max_iters or stop_now
            if rt.master and stop_now:
                progress.bar.write(
                    f"stop requested: finishing at iteration {done} with a checkpoint"
                    + (" (Ctrl-C again to quit at once)" if stop.quit_on_repeat else "")
                )
            line = None
            if rt.master and (eval_due or done % tc.log_interval == 0):
                line = dict(
                    iter=done, train_loss=train_loss, grad_norm=grad_norm.item(), lr=lr, tokens_per_s=tokens_per_s
                )
                if rt.device_type == "cuda":
                    line["mfu"] = flops_per_token * tokens_per_s / rt.peak_flops()
            if eval_due:
                ev = evaluate(compiled, run.batches, rt) if rt.master else {}
                # rank 0's verdict goes to every rank, so a divergence seen in evaluation stops all of them
                if runtime.any_rank(not all(map(math.isfinite, ev.values())), rt):
                    raise divergence("evaluation gave a non-finite loss", state, tc, rt, run.out)
                if rt.master:  # train_loss stays the step's: the evaluation's is on its fixed batches
                    line |= {"eval_train_loss": ev["train_loss"], "val_loss": ev["val_loss"], "val_bpb": ev["val_bpb"]}
                    progress.evaluated(done, ev, tokens_per_s)
            # the log line before the checkpoint: a kill between them leaves a line past the checkpoint, which
            # the resume trims, rather than a checkpoint whose iteration the log never gets
            if line is not None:
                progress.log(line | {"elapsed_s": state.elapsed()})
            if eval_due:
                if rt.master:
                    checkpoint.save_run(state, ev["val_loss"], run.out, run.info)
                state.saved_at = done
            if stop_now:
                return True
    return False


RECORD = {"model": GPTConfig, "train": TrainConfig, "batches": BatchConfig}  # config.json's parts: their settings
SETTINGS = tuple(RECORD.values())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)

    def run(gcfg, tc, bc):
        try:
            train(gcfg, tc, bc, argv=argv)
        finally:
            runtime.leave_process_group()

    def read(argv, *classes):  # a resume's settings are the run's own: checkpoint.py reads them
        return checkpoint.run_settings(argv, RECORD, TrainConfig.out_dir)

    def interrupted(e):
        return f"{runtime.rank_prefix()}interrupted: quit at once, without a new checkpoint; those on disk are whole"

    config.main(argv, __doc__, SETTINGS, run, read=read, error=runtime.error_line, interrupted=interrupted)


if __name__ == "__main__":
    main()
