"""Train a GPT on a prepared dataset.

    python train.py [CONFIG.toml] [--key=value ...]      one process (CPU, one GPU, MPS)
    torchrun --standalone --nproc_per_node=N train.py ...  data-parallel (DDP) on N devices

Settings come from the GPTConfig (model.py) and TrainConfig (here) defaults, then the
TOML file, then --key=value; `python train.py --help` lists them all.
"""

import contextlib
import json
import math
import os
import pickle
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import config
from config import opt
from data.tokenizer import load_meta, open_split
from model import GPT, GPTConfig

EVAL_SEED = 1234  # validation batches are the same for every run and seed, so val losses compare


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
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 = off)")
    eval_interval: int = opt(250, "evaluate and checkpoint every this many steps (and at the end)")
    eval_iters: int = opt(20, "validation batches per evaluation (a fixed set)")
    log_interval: int = opt(10, "write a train line to metrics.jsonl every this many steps")
    device: str = opt("auto", "auto, cpu, cuda, cuda:N or mps")
    dtype: str = opt("auto", "auto (bfloat16 on CUDA if supported, else float16; float32 elsewhere), float32, bfloat16, float16")
    compile: bool | None = opt(None, "torch.compile the model (default: on for CUDA only)")
    seed: int = opt(1337, "seed for initialisation, batches and dropout")
    progress: bool = opt(True, "show a progress bar")

    def __post_init__(self):
        for name in ("batch_size", "gradient_accumulation_steps", "max_iters", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        for name in ("warmup_iters", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate={self.learning_rate} must be > 0")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={self.dtype!r} is unknown; choose auto, float32, bfloat16 or float16")


# ----------------------------------------------------------------------------- runtime

@dataclass
class Runtime:
    """Where and how this process computes: device, precision and its place in a DDP group."""
    device: str
    dtype: torch.dtype
    compile: bool
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def device_type(self):
        return self.device.split(":")[0]

    @property
    def master(self):
        return self.rank == 0

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)


def pick_device(requested, local_rank=0):
    """The device to use and the reason, checked against what this machine has."""
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if requested == "auto":
        if torch.cuda.is_available():
            return f"cuda:{local_rank}", "CUDA is available"
        if has_mps:
            return "mps", "Apple MPS is available, CUDA is not"
        return "cpu", "no CUDA or MPS device found"
    kind, _, index = requested.partition(":")
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": has_mps}
    if kind not in available or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"device={requested!r} is unknown; choose auto, cpu, cuda, cuda:N or mps")
    if not available[kind]:
        here = ", ".join(k for k, ok in available.items() if ok)
        raise ValueError(f"device={requested!r} is not available on this machine; available: {here}")
    if kind == "cuda" and not index:
        requested = f"cuda:{local_rank}"
    return requested, "as requested"


def pick_dtype(requested, device_type):
    if requested != "auto":
        return getattr(torch, requested)
    if device_type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def check_compile(wanted, device_type):
    """Whether to torch.compile: on by default for CUDA; refuse where it cannot work."""
    if wanted is None:
        return device_type == "cuda"
    if wanted and device_type == "mps":
        raise ValueError("compile=True is not supported on mps; use --compile=False")
    if wanted and device_type == "cpu" and not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        raise ValueError("compile=True on CPU needs a C++ compiler on PATH (none found); install one or use --compile=False")
    return wanted


def setup_runtime(tc):
    """Device, precision, compile and (under torchrun) the process group, printed with reasons."""
    rank, local_rank, world = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
    device, reason = pick_device(tc.device, local_rank)
    rt = Runtime(device, pick_dtype(tc.dtype, device.split(":")[0]), False, rank, local_rank, world)
    rt.compile = check_compile(tc.compile, rt.device_type)
    if "RANK" in os.environ:
        dist.init_process_group(backend="nccl" if rt.device_type == "cuda" else "gloo")
    if rt.device_type == "cuda":
        torch.cuda.set_device(rt.device)
        # TF32 matmuls: ~8x the float32 tensor-core rate, precision ample for training
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if rt.master:
        print(f"device: {rt.device} ({reason}); dtype: {str(rt.dtype).removeprefix('torch.')}; "
              f"compile: {rt.compile}; processes: {world}")
    return rt


# ----------------------------------------------------------------------------- data

class Batches:
    """Training batches drawn by (seed, step, micro-step) and a fixed validation set.

    Each batch's generator is seeded from its coordinates, not from global RNG state, so a
    resumed run, every positional scheme of an ablation, and every DDP layout see the same
    sequences in the same order.
    """

    def __init__(self, dataset_dir, meta, block_size, batch_size, seed, device, eval_iters):
        self.meta, self.block_size, self.batch_size, self.seed, self.device = meta, block_size, batch_size, seed, device
        self.dataset_dir = dataset_dir
        for split in ("train", "val"):
            n = len(open_split(dataset_dir, split, meta))
            if n <= block_size:
                raise ValueError(f"block_size={block_size} is too large for the {split} split ({n} tokens); "
                                 f"use a block_size below {n}")
        g = torch.Generator().manual_seed(EVAL_SEED)
        self.eval_starts = {s: self._starts(s, eval_iters * batch_size, g) for s in ("train", "val")}

    def _starts(self, split, n, generator):
        high = len(open_split(self.dataset_dir, split, self.meta)) - self.block_size
        return torch.randint(high, (n,), generator=generator)

    def _load(self, split, starts, block_size=None):
        # a fresh memmap per batch: numpy keeps pages of a long-lived one resident (nanoGPT's leak fix)
        data = open_split(self.dataset_dir, split, self.meta)
        T = block_size or self.block_size
        rows = torch.from_numpy(data[starts.numpy()[:, None] + np.arange(T + 1)].astype(np.int64))  # (B, T+1)
        if self.device.startswith("cuda"):
            rows = rows.pin_memory().to(self.device, non_blocking=True)
        else:
            rows = rows.to(self.device)
        return rows[:, :-1], rows[:, 1:]

    def train(self, step, micro):
        seed = np.random.SeedSequence([self.seed, step, micro]).generate_state(1)[0]
        g = torch.Generator().manual_seed(int(seed))
        return self._load("train", self._starts("train", self.batch_size, g))

    def eval_batches(self, split):
        for chunk in self.eval_starts[split].split(self.batch_size):
            yield self._load(split, chunk)


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
    meta = batches.meta
    out["val_bpb"] = out["val_loss"] / math.log(2) * meta["val_tokens"] / meta["val_bytes"]
    model.train()
    return out


# ----------------------------------------------------------------------------- optimisation

def make_optimizer(model, tc, device_type):
    """AdamW; matrices decay, vectors (biases, norm gains) do not. Fused kernel on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2),
                             fused=device_type == "cuda" or None)


def lr_at(it, tc):
    """Linear warmup to learning_rate, then cosine decay to min_lr at lr_decay_iters."""
    min_lr = tc.learning_rate / 10 if tc.min_lr is None else tc.min_lr
    decay_end = tc.lr_decay_iters or tc.max_iters
    if it < tc.warmup_iters:
        return tc.learning_rate * (it + 1) / (tc.warmup_iters + 1)
    if it >= decay_end:
        return min_lr
    progress = (it - tc.warmup_iters) / max(1, decay_end - tc.warmup_iters)
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (tc.learning_rate - min_lr)


# ----------------------------------------------------------------------------- checkpoints

def rng_state():
    np_state = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            # numpy's key array is stored as a tensor: weights_only loading accepts no numpy objects
            "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:])}


def set_rng_state(state):
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def save_checkpoint(obj, path):
    """Write atomically: a crash at any moment leaves either the old file or the new one, whole."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load_checkpoint(path, device="cpu"):
    """A checkpoint dict, loaded with weights_only=True so a foreign pickle can never run code."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {str(path)!r}; train first (python train.py ...) or pass the right out_dir")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as e:
        why = next((line.strip() for line in str(e).splitlines() if "Unsupported" in line), "")
        raise ValueError(f"refused to load {str(path)!r}: it holds objects other than tensors and plain data, "
                         f"which weights_only loading never runs ({why[:200]})") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ValueError(f"{str(path)!r} is not a readable checkpoint (truncated or corrupt): "
                         f"{str(e).splitlines()[0][:200]}") from None
    if not isinstance(ckpt, dict) or not {"model", "model_config"} <= ckpt.keys():
        raise ValueError(f"{str(path)!r} is not a nanorope checkpoint (it lacks the model and model_config entries)")
    return ckpt


def model_from_checkpoint(ckpt, device="cpu"):
    model = GPT(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    return model.to(device)


def check_resume_shape(saved, config):
    """Name every model field that differs between the checkpoint and this run."""
    diff = [f"{k}: checkpoint {saved[k]!r}, now {v!r}" for k, v in config.asdict().items()
            if k in saved and saved[k] != v and k not in ("dropout", "rope_scaling", "rope_scaling_factor")]
    if diff:
        raise ValueError("cannot resume: the model differs from the checkpoint's (" + "; ".join(diff) + ")")


def run_record():
    """Code version and environment, saved with every run."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return {"code_version": rev or "unknown", "python": platform.python_version(), "torch": str(torch.__version__),
            "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------- the loop

class StopFlag:
    """SIGINT/SIGTERM ask the loop to finish its step, checkpoint and exit; a second Ctrl-C exits at once."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True


def prepare_out_dir(out_dir):
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out_dir={out_dir!r} is a file; give a folder path")
    path.mkdir(parents=True, exist_ok=True)
    return path


def train(gcfg, tc):
    rt = setup_runtime(tc)
    dataset_dir = Path(tc.data_dir) / tc.dataset
    meta = load_meta(dataset_dir)
    gcfg.vocab_size = meta["vocab_size"]
    out = prepare_out_dir(tc.out_dir) if rt.master else Path(tc.out_dir)
    if tc.gradient_accumulation_steps % rt.world_size:
        raise ValueError(f"gradient_accumulation_steps={tc.gradient_accumulation_steps} must be divisible by the "
                         f"number of processes ({rt.world_size})")
    micro_steps = tc.gradient_accumulation_steps // rt.world_size
    batches = Batches(dataset_dir, meta, gcfg.block_size, tc.batch_size, tc.seed, rt.device, tc.eval_iters)

    torch.manual_seed(tc.seed + rt.rank)  # same init everywhere (DDP broadcasts rank 0's), own dropout per rank
    raw_model = GPT(gcfg).to(rt.device)
    optimizer = make_optimizer(raw_model, tc, rt.device_type)
    scaler = torch.amp.GradScaler(rt.device_type, enabled=rt.dtype == torch.float16)
    start_iter, best_val = 0, float("inf")
    if tc.resume:
        ckpt = load_checkpoint(out / "ckpt.pt", rt.device)
        check_resume_shape(ckpt["model_config"], gcfg)
        raw_model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt["scaler"]:
            scaler.load_state_dict(ckpt["scaler"])
        start_iter, best_val = ckpt["iter"], ckpt["best_val_loss"]
        set_rng_state(ckpt["rng"])
        if rt.master:
            print(f"resuming from {out / 'ckpt.pt'} at iteration {start_iter}")
    if start_iter >= tc.max_iters:
        raise ValueError(f"nothing to do: the checkpoint is at iteration {start_iter} and max_iters={tc.max_iters}")

    model = torch.compile(raw_model) if rt.compile else raw_model
    if rt.world_size > 1:
        model = DDP(model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)
    record = {"model": gcfg.asdict(), "train": asdict(tc), **run_record(), "world_size": rt.world_size}
    if rt.master:
        (out / "config.json").write_text(json.dumps(record, indent=2) + "\n")
        print(f"model: {raw_model.num_params() / 1e6:.2f}M parameters, pos_emb={gcfg.pos_emb}; "
              f"tokens per step: {tc.batch_size * gcfg.block_size * tc.gradient_accumulation_steps:,}")

    def checkpoint(it, path):
        save_checkpoint({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scaler": scaler.state_dict() if scaler.is_enabled() else {}, "iter": it,
                         "best_val_loss": best_val, "rng": rng_state(), "model_config": gcfg.asdict(),
                         "train_config": asdict(tc), "tokenizer": meta, "record": record}, path)

    metrics = open(out / "metrics.jsonl", "a") if rt.master else None
    tokens_per_step = tc.batch_size * gcfg.block_size * tc.gradient_accumulation_steps
    flops_per_step = raw_model.flops_per_token(gcfg.block_size) * tokens_per_step
    stop = StopFlag()
    bar = tqdm(total=tc.max_iters, initial=start_iter, disable=not (rt.master and tc.progress), dynamic_ncols=True)
    t_start, step_time, step_count = time.perf_counter(), 0.0, 0
    for it in range(start_iter, tc.max_iters):
        t0 = time.perf_counter()
        lr = lr_at(it, tc)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=rt.device)
        for j in range(micro_steps):
            x, y = batches.train(it, rt.rank * micro_steps + j)
            # DDP all-reduces gradients on the last micro-step only
            sync = contextlib.nullcontext() if j == micro_steps - 1 or rt.world_size == 1 else model.no_sync()
            with sync, rt.autocast():
                loss = model(x, y)[1] / tc.gradient_accumulation_steps
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        # one collective carries the loss (for the log) and every rank's stop request, so all stop together
        status = torch.stack([loss_sum, torch.tensor(float(stop.requested), device=rt.device)])
        if rt.world_size > 1:
            dist.all_reduce(status)
        train_loss, stop_now = status[0].item(), status[1].item() > 0
        if not math.isfinite(train_loss):
            raise Divergence(f"loss is {train_loss} at iteration {it}: training diverged. Likely causes: learning_rate="
                             f"{tc.learning_rate} too high, or {str(rt.dtype).removeprefix('torch.')} precision "
                             f"overflowing (try dtype=bfloat16 or float32). The last good checkpoint in {out} is untouched.")
        if tc.grad_clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), tc.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        done = it + 1
        step_time += time.perf_counter() - t0
        step_count += 1
        tokens_per_s = tokens_per_step * step_count / step_time
        bar.update(1)
        bar.set_postfix(loss=f"{train_loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
        line = None
        if rt.master and (done % tc.log_interval == 0 or done == tc.max_iters):
            line = {"iter": done, "train_loss": train_loss, "lr": lr, "tokens_per_s": tokens_per_s}
            if rt.device_type == "cuda":
                line["mfu"] = flops_per_step * step_count / step_time / peak_flops(rt)
        if rt.master and (done % tc.eval_interval == 0 or done == tc.max_iters or stop_now):
            ev = evaluate(raw_model, batches, rt)
            line = {"iter": done, "train_loss": train_loss, "lr": lr, "tokens_per_s": tokens_per_s, **ev}
            bar.write(f"iter {done}: train {ev['train_loss']:.4f}, val {ev['val_loss']:.4f} "
                      f"({ev['val_bpb']:.3f} bits/byte), {tokens_per_s:,.0f} tokens/s")
            if ev["val_loss"] < best_val:
                best_val = ev["val_loss"]
                checkpoint(done, out / "best.pt")
            checkpoint(done, out / "ckpt.pt")
        if line is not None:  # tokens/s is measured afresh over each logging window
            line["elapsed_s"] = time.perf_counter() - t_start
            metrics.write(json.dumps(line) + "\n")
            metrics.flush()
            step_time, step_count = 0.0, 0
        if stop_now:
            break
    bar.close()
    if rt.master:
        metrics.close()
        if stop_now:
            print(f"stopped at iteration {done}; checkpoint written to {out / 'ckpt.pt'}. "
                  f"Resume with: python train.py {' '.join(sys.argv[1:])} --resume=true")
        else:
            print(f"done: {done} iterations in {time.perf_counter() - t_start:.1f}s, best val loss {best_val:.4f}")
    return best_val


def peak_flops(rt):
    """Dense bf16 peak of the GPU, for MFU; an assumed H100/A100-class figure when the name is unknown."""
    name = torch.cuda.get_device_name(rt.device)
    table = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "4090": 165e12, "3090": 71e12}
    return next((v for k, v in table.items() if k in name), 312e12)


class Divergence(RuntimeError):
    pass


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(__doc__ + config.help_text(GPTConfig, TrainConfig))
        return
    try:
        train(*config.parse(argv, GPTConfig, TrainConfig))
    except (ValueError, Divergence) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
