"""Train a GPT on a prepared dataset.

    python train.py [CONFIG.toml] [--key=value ...]        one process (CPU, one GPU, MPS)
    torchrun --standalone --nproc_per_node=N train.py ...   data-parallel (DDP) on N devices

Settings come from the GPTConfig (model.py) and TrainConfig (here) defaults, then the TOML file, then --key=value;
`python train.py --help` lists them all. Ctrl-C or SIGTERM finishes the step, writes out_dir/ckpt.pt and exits;
`--resume` continues exactly. What comes before the first step (device, data, the out_dir lock, a resume's state, a
fine-tune's source) is run_setup.py's; here are the settings, the step and the loop.
"""

import contextlib
import math
import sys
import time
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel

import checkpoint
import config
from config import FRACTION, NON_NEGATIVE, POSITIVE, RATE, one_of, opt
from data.batches import BatchConfig
from data.loader import DROPOUT, micro_seed
from data.tokenizer import bytes_per_token
from files import WriteError
from model import GPTConfig
from optim import OPTIMIZERS
from run_setup import divergence, follow, start
from runtime import DTYPES, StopFlag, any_rank, error_line, leave_process_group, mean_and_any, rank_prefix


@dataclass
class TrainConfig:
    dataset: str = opt("shakespeare_char", "dataset folder name under data_dir (made by `python -m data.prepare`)")
    data_dir: str = opt("data", "folder holding the prepared datasets", resume=True)
    out_dir: str = opt("out", "where checkpoints, config.json and metrics.jsonl go", resume=True, weights=False)
    resume: bool = opt(
        False,
        "continue from out_dir/ckpt.pt with the run's own settings (its config.json); only those a resume may change "
        "can be given",
        resume=True,
        weights=False,
    )
    batch_size: int = opt(12, "sequences per micro-batch (per process)", check=POSITIVE)
    gradient_accumulation_steps: int = opt(1, "micro-batches per step, summed over all processes", check=POSITIVE)
    learning_rate: float = opt(6e-4, "peak learning rate", check=RATE)
    min_lr: float | None = opt(None, "final rate of the cosine decay (default learning_rate / 10)", check=NON_NEGATIVE)
    max_iters: int = opt(5000, "optimizer steps in total", check=POSITIVE, resume=True)
    warmup_iters: int = opt(100, "steps of linear warmup", check=NON_NEGATIVE)
    lr_decay_iters: int | None = opt(None, "step where the cosine decay ends (default max_iters)", check=POSITIVE)
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices (not on biases, norms)", check=NON_NEGATIVE)
    beta1: float = opt(0.9, "AdamW beta1", check=FRACTION)
    beta2: float = opt(0.95, "AdamW beta2", check=FRACTION)
    optimizer: str = opt(
        "adamw",
        "adamw, or muon: Muon on the blocks' weight matrices, AdamW (learning_rate) on the embeddings, head, norms, "
        "biases and positional parameters",
        check=one_of(OPTIMIZERS),
    )
    muon_lr: float = opt(0.02, "Muon's peak learning rate, on learning_rate's schedule (Keller Jordan's)", check=RATE)
    muon_momentum: float = opt(0.95, "Muon's (Nesterov) momentum", check=FRACTION)
    muon_weight_decay: float = opt(0.0, "Muon's decoupled weight decay (times muon_lr a step)", check=NON_NEGATIVE)
    muon_ns_steps: int = opt(5, "Newton-Schulz steps of Muon's orthogonalisation", check=POSITIVE)
    muon_split_qkv: bool = opt(False, "Muon orthogonalises q, k and v apart, not their fused projection as one")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 = off)", check=NON_NEGATIVE)
    eval_interval: int = opt(250, "evaluate and checkpoint every this many steps", check=POSITIVE, resume=True)
    eval_iters: int = opt(20, "validation batches per evaluation (a fixed set)", check=POSITIVE, resume=True)
    log_interval: int = opt(10, "a train line to metrics.jsonl every this many steps", check=POSITIVE, resume=True)
    device: str = opt("auto", "auto, cpu, cuda, cuda:N or mps", resume=True)
    dtype: str = opt(
        "auto",
        "auto (CUDA: bfloat16 if supported, else float16; CPU: bfloat16 where the CPU runs it natively and faster, "
        "AMX or AMD's AVX512-BF16, else float32; mps: float32), float32, bfloat16, float16; a run records what auto "
        "resolved to and resumes in it",
        check=one_of(DTYPES),
    )
    compile: bool | None = opt(None, "torch.compile the model (default: on for CUDA only)", resume=True)
    seed: int = opt(1337, "seed for initialisation, batches and dropout", check=NON_NEGATIVE)
    progress: bool = opt(True, "show a progress bar", resume=True, weights=False)
    log: str = opt("none", "also log metrics.jsonl's lines to wandb or tensorboard", resume=True, weights=False)
    init_from: str = opt(
        "",
        "start from this model's weights with a fresh optimizer: a run's out_dir or a checkpoint file (fine-tuning, "
        "e.g. at a longer block_size with a context scaling), or hf:NAME_OR_PATH, a transformers GPT-2 or GPT-NeoX "
        "checkpoint: its architecture, with this run's block_size, dropout and scaling, and the L0 it learned",
    )

    def __post_init__(self):
        config.validate(self)
        if self.log != "none":  # a tracker that cannot start fails here, before anything is written
            from trackers import check

            check(self.log)


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

    def __init__(self, train_cfg):
        self.train_cfg = train_cfg

    def lr(self, it):
        train_cfg = self.train_cfg
        floor = train_cfg.learning_rate / 10 if train_cfg.min_lr is None else train_cfg.min_lr
        length = train_cfg.lr_decay_iters or train_cfg.max_iters
        return warmup_cosine(it, train_cfg.learning_rate, train_cfg.warmup_iters, length, floor)

    def model_config(self, it, model_cfg):
        return model_cfg

    def settings(self):
        """What this schedule adds to a run's settings (recorded in config.json): nothing for the plain one."""
        return {}


def train_step(model, optimizer, scaler, micro_batches, lr, grad_clip, runtime):
    """One optimizer step, the one train.py, bench.py and the lab all take: forward and backward over each
    micro-batch (a data.loader.Batch) under the runtime's autocast, then unscale, clip the global gradient norm
    (0 = off), step and clear. model may be wrapped by torch.compile or DDP. Returns the loss summed over micro-batches
    and the gradient norm as tensors: reading them is a device sync, the caller's choice."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # a group with a peak of its own follows the schedule's shape
    loss_sum, n = torch.zeros((), device=runtime.device), len(micro_batches)
    for j, batch in enumerate(micro_batches):
        if batch.seed is not None:
            torch.manual_seed(batch.seed)
        # DDP all-reduces (averages) gradients on the last micro-step only
        last = not isinstance(model, DistributedDataParallel) or j == n - 1
        with contextlib.nullcontext() if last else model.no_sync(), runtime.autocast():
            loss = model(batch.x, batch.y, position_ids=batch.position_ids)[1] / n
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def step_batches(batches, it, train_cfg, runtime):
    """This process's share of step it's micro-batches, each with the dropout seed its place fixes."""
    per_rank = train_cfg.gradient_accumulation_steps // runtime.world_size
    places = range(runtime.rank * per_rank, (runtime.rank + 1) * per_rank)
    return [batches.train(it, micro)._replace(seed=micro_seed(train_cfg.seed, it, micro, DROPOUT)) for micro in places]


@torch.no_grad()
def evaluate(model, batches, runtime):
    """Mean loss on the fixed train and val batches, and val bits per byte."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = []
        for x, y in batches.eval_batches(split):
            with runtime.autocast():
                losses.append(model(x, y)[1].item())
        out[f"{split}_loss"] = sum(losses) / len(losses)
    out["val_bpb"] = out["val_loss"] / math.log(2) / bytes_per_token(batches.meta)
    model.train()
    return out


def evaluate_run(run, model):
    """`evaluate` on the master process ({} elsewhere); a non-finite loss stops every process at once."""
    scores = evaluate(model, run.batches, run.runtime) if run.runtime.master else {}
    if any_rank(not all(map(math.isfinite, scores.values())), run.runtime):  # rank 0's verdict reaches every rank
        raise divergence("evaluation gave a non-finite loss", run)
    return scores


def loop(run):
    """The steps from the state's iteration to max_iters, with evaluations, the log and checkpoints; True if a signal
    stopped it early."""
    train_cfg, runtime, state = run.train_cfg, run.runtime, run.state
    # evaluate with this one, never the DDP wrapper: its forward may talk to the ranks that are not evaluating
    compiled, model = runtime.wrap(state.model)
    with StopFlag(quit_on_repeat=runtime.world_size == 1) as stop, run.progress() as progress:
        for it in range(state.iter, train_cfg.max_iters):
            follow(run, it, progress)  # the model config the schedule has in force at this step
            started, lr = time.perf_counter(), run.schedule.lr(it)
            micro_batches = step_batches(run.batches, it, train_cfg, runtime)
            loss_sum, grad_norm = train_step(
                model, state.optimizer, state.scaler, micro_batches, lr, train_cfg.grad_clip, runtime
            )
            train_loss, stop_now = mean_and_any(loss_sum, stop.requested, runtime)
            state.iter = done = it + 1
            if not math.isfinite(train_loss):
                raise divergence(f"the training loss is {train_loss}", run)
            tokens_per_s = progress.step(time.perf_counter() - started, train_loss)
            if stop_now:
                progress.stopping(done, stop.quit_on_repeat)
            eval_due = done % train_cfg.eval_interval == 0 or done == train_cfg.max_iters or stop_now
            scores = evaluate_run(run, compiled) if eval_due else None
            # the log line before the checkpoint: a kill between them leaves a line past the checkpoint, which
            # the resume trims, rather than a checkpoint whose iteration the log never gets
            progress.log_step(done, train_loss, grad_norm, lr, tokens_per_s, scores, state.elapsed())
            if eval_due:
                if runtime.master:
                    checkpoint.save_run(state, scores["val_loss"], run.out, run.info)
                state.saved_at = done
            if stop_now:
                return True
    return False


def train(model_cfg, train_cfg, batch_cfg=None, schedule=None, argv=None):
    """Train. batch_cfg says what the batches carry beyond text (default: nothing), schedule the learning rate and the
    model config by step (default: Schedule(train_cfg)); argv (the command's arguments) shapes a stop's resume hint."""
    with start(model_cfg, train_cfg, batch_cfg or BatchConfig(), schedule or Schedule(train_cfg)) as run:
        try:
            stopped = loop(run)
        except WriteError as e:  # a full or read-only device: a stop whose checkpoint could not be written
            raise checkpoint.write_failed(e, run.state, run.out, argv, run.runtime.world_size) from None
    state = run.state
    if run.runtime.master and stopped:
        print(
            f"stopped at iteration {state.iter}; checkpoint written to {run.out / 'ckpt.pt'}. "
            f"To continue: {checkpoint.resume_command(argv, run.runtime.world_size)}"
        )
    elif run.runtime.master:
        print(
            f"done: {state.iter} iterations in {state.elapsed():.1f}s, best val loss {state.best_val:.4f}; "
            f"loss curves: python plot.py --runs={run.out}"
        )
    return state.best_val


RECORD = {"model": GPTConfig, "train": TrainConfig, "batches": BatchConfig}  # config.json's parts: their settings
SETTINGS = tuple(RECORD.values())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)

    def run(model_cfg, train_cfg, batch_cfg):
        try:
            train(model_cfg, train_cfg, batch_cfg, argv=argv)
        finally:
            leave_process_group()

    def read(argv):  # a resume's settings are the run's own: checkpoint.py reads them
        return checkpoint.run_settings(argv, RECORD, TrainConfig.out_dir)

    def interrupted(e):
        return f"{rank_prefix()}interrupted: quit at once, without a new checkpoint; those on disk are whole"

    config.main(argv, __doc__, SETTINGS, run, read=read, error=error_line, interrupted=interrupted)


if __name__ == "__main__":
    main()
