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
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import config
from config import opt
from data.tokenizer import bytes_per_token, load_meta, open_split
from model import GPT, GPTConfig

EVAL_SEED = 1234  # validation batches are the same for every run and seed, so val losses compare
BATCH, DROPOUT = 0, 1  # the two random streams of a micro-step
DTYPES = ("auto", "float32", "bfloat16", "float16")


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
    dtype: str = opt("auto", "auto (CUDA: bfloat16 if supported, else float16; CPU: bfloat16 where it multiplies "
                             "bf16 natively, else float32; mps: float32), float32, bfloat16, float16")
    compile: bool | None = opt(None, "torch.compile the model (default: on for CUDA only)")
    seed: int = opt(1337, "seed for initialisation, batches and dropout")
    progress: bool = opt(True, "show a progress bar")

    def __post_init__(self):
        for name in ("batch_size", "gradient_accumulation_steps", "max_iters", "lr_decay_iters", "eval_interval",
                     "eval_iters", "log_interval"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name}={value} must be a positive integer")
        for name in ("warmup_iters", "weight_decay", "grad_clip", "min_lr", "seed"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < math.inf:
                raise ValueError(f"{name}={value} must be a finite number >= 0")
        if not 0 < self.learning_rate < math.inf:
            raise ValueError(f"learning_rate={self.learning_rate} must be a finite number > 0")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must lie in [0, 1)")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is unknown; choose {', '.join(DTYPES)}")


class Divergence(RuntimeError):
    """A non-finite loss; every process of a run raises it at the same step."""


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
    reason = "as requested"
    if requested == "auto":
        if not torch.cuda.is_available():
            return ("mps", "Apple MPS is available, CUDA is not") if has_mps else ("cpu", "no CUDA or MPS device found")
        requested, reason = "cuda", "CUDA is available"
    kind, _, index = requested.partition(":")
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": has_mps}
    if kind not in available or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"device={requested!r} is unknown; choose auto, cpu, cuda, cuda:N or mps")
    if not available[kind]:
        here = ", ".join(k for k, ok in available.items() if ok)
        raise ValueError(f"device={requested!r} is not available on this machine; available: {here}")
    if kind == "cuda":  # a bare "cuda" means this process's own GPU under torchrun
        index, count = int(index or local_rank), torch.cuda.device_count()
        if index >= count:
            raise ValueError(f"device cuda:{index} does not exist: this machine has {count} CUDA device(s), cuda:0 "
                             f"to cuda:{count - 1} (under torchrun, run at most that many processes per node)")
        requested = f"cuda:{index}"
    return requested, reason


def pick_dtype(requested, device_type):
    if requested != "auto":
        return getattr(torch, requested)
    if device_type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device_type == "cpu":
        # with AVX512-BF16 or AMX, bf16 matmuls run ~2.5x float32's (bench.py); without, bf16 is emulated
        # and slower than float32
        caps = torch.cpu.get_capabilities()
        return torch.bfloat16 if caps.get("avx512_bf16") or caps.get("amx_bf16") else torch.float32
    return torch.float32


def decode_autocast(device_type, dtype):
    """Autocast for generation: on CUDA only; batch-1 decoding on CPU gains nothing from bf16."""
    return torch.autocast(device_type, dtype=dtype, enabled=device_type == "cuda")


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
    if world > 1 and (":" in tc.device or tc.device == "mps"):
        raise ValueError(f"device={tc.device!r} cannot serve {world} processes: under torchrun each takes its own GPU "
                         "(device=auto or cuda gives cuda:LOCAL_RANK), or all share the CPU (device=cpu)")
    if tc.gradient_accumulation_steps % world:
        raise ValueError(f"gradient_accumulation_steps={tc.gradient_accumulation_steps} must be divisible by the "
                         f"number of processes ({world}), which share its micro-batches")
    device, reason = pick_device(tc.device, local_rank)
    device_type = device.partition(":")[0]
    rt = Runtime(device, pick_dtype(tc.dtype, device_type), check_compile(tc.compile, device_type), rank, local_rank,
                 world)
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


def any_rank(flag, rt):
    """True on every process if it is True on any: one collective, so all take the same branch."""
    t = torch.tensor(float(flag), device=rt.device)
    if rt.world_size > 1:
        dist.all_reduce(t)
    return t.item() > 0


# ----------------------------------------------------------------------------- data

def micro_seed(seed, step, micro, stream):
    """A seed fixed by a micro-step's coordinates in the global batch, one per random stream."""
    return int(np.random.SeedSequence([seed, step, micro, stream]).generate_state(1)[0])


class Batches:
    """Training batches drawn by (seed, step, micro-step) and a fixed validation set.

    Each batch's generator is seeded from its coordinates, not from global RNG state, so a
    resumed run, every positional scheme of an ablation, and every DDP layout see the same
    sequences in the same order: the iteration is the sampler's whole position.
    """

    def __init__(self, dataset_dir, meta, block_size, batch_size, seed, device, eval_iters):
        self.meta, self.block_size, self.batch_size, self.seed, self.device = meta, block_size, batch_size, seed, device
        self.dataset_dir = dataset_dir
        self.lengths = {split: len(open_split(dataset_dir, split, meta)) for split in ("train", "val")}
        for split, n in self.lengths.items():
            if n <= block_size:
                raise ValueError(f"block_size={block_size} is too large for the {split} split ({n} tokens); "
                                 f"use a block_size below {n}")
        g = torch.Generator().manual_seed(EVAL_SEED)
        self.eval_starts = {s: self._starts(s, eval_iters * batch_size, g) for s in ("train", "val")}

    def _starts(self, split, n, generator):
        high = self.lengths[split] - self.block_size
        return torch.randint(high, (n,), generator=generator)

    def _load(self, split, starts):
        # a fresh memmap per batch: numpy keeps pages of a long-lived one resident (nanoGPT's leak fix)
        data = open_split(self.dataset_dir, split, self.meta)
        rows = torch.from_numpy(data[starts.numpy()[:, None] + np.arange(self.block_size + 1)].astype(np.int64))  # (B, T+1)
        if self.device.startswith("cuda"):
            rows = rows.pin_memory().to(self.device, non_blocking=True)
        else:
            rows = rows.to(self.device)
        return rows[:, :-1], rows[:, 1:]

    def train(self, step, micro):
        g = torch.Generator().manual_seed(micro_seed(self.seed, step, micro, BATCH))
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
    out["val_bpb"] = out["val_loss"] / math.log(2) / bytes_per_token(batches.meta)
    model.train()
    return out


# ----------------------------------------------------------------------------- optimisation

def make_optimizer(model, tc, device_type):
    """AdamW; matrices decay, vectors (biases, norm gains) do not. The fused kernel (one pass over each
    parameter instead of a dozen foreach ops) on CUDA and on CPU, where it saves ~1 ms of a ~33 ms CPU-config step."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": tc.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tc.learning_rate, betas=(tc.beta1, tc.beta2),
                             fused=device_type in ("cuda", "cpu") or None)


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


def set_lr(optimizer, it, tc):
    lr = lr_at(it, tc)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def apply_gradients(raw_model, optimizer, scaler, grad_clip):
    """The end of every step: unscale, clip the global norm (0 = off), step, clear. Returns the norm."""
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip or math.inf)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


# ----------------------------------------------------------------------------- checkpoints

RESUME_KEYS = ("model", "optimizer", "scaler", "iter", "best_val_loss", "rng", "tokenizer")


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


def atomic_write(path, write):
    """write(file) to path through a temporary file in the same folder, flushed, fsynced and renamed over
    path: a crash at any moment leaves either the old file or the new one, whole."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")  # one fixed name, so a killed write leaves no pile of them
    try:
        with open(tmp, "wb") as f:
            write(f)
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


def save_checkpoint(obj, path):
    atomic_write(path, lambda f: torch.save(obj, f))


def load_checkpoint(path, device="cpu"):
    """A checkpoint dict, loaded with weights_only=True so a foreign pickle can never run code."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {str(path)!r}; train first (python train.py ...) or pass the right out_dir")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about the pickle protocol of files it then refuses
            ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # arbitrary bytes make torch.load fail in arbitrary ways; each means "not loadable"
        code = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if code:
            raise ValueError(f"refused to load {str(path)!r}: it asks to call {code[1]}, not just to hold tensors and "
                             "plain data; weights_only loading never runs such code (use checkpoints you trust)") from None
        why = next((line.strip() for line in str(e).splitlines() if "Unsupported" in line), str(e).partition(". ")[0])
        raise ValueError(f"{str(path)!r} is not a readable checkpoint, it is truncated or corrupt "
                         f"({type(e).__name__}: {why[:120]})") from None
    if not isinstance(ckpt, dict) or not {"model", "model_config"} <= ckpt.keys():
        raise ValueError(f"{str(path)!r} is not a nanorope checkpoint (it lacks the model and model_config entries)")
    return ckpt


def model_from_checkpoint(ckpt, device="cpu", path="the checkpoint"):
    """The GPT a load_checkpoint dict describes; one whose config or weights are another model's is refused."""
    try:
        model = GPT(GPTConfig(**ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
    except (TypeError, RuntimeError) as e:  # config keys or weight shapes of another model
        raise ValueError(f"{str(path)!r} does not fit nanorope's model: {str(e).splitlines()[0][:200]}") from None
    return model.to(device)


def resumable_checkpoint(path, config, meta, tc):
    """ckpt.pt, loaded to the CPU (RNG states must stay there), or a refusal naming every field that differs."""
    ckpt = load_checkpoint(path)
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing:
        raise ValueError(f"cannot resume from {str(path)!r}: it lacks {', '.join(missing)} (it holds weights only); "
                         "start a new run in another out_dir")
    saved = ckpt["model_config"]
    diff = [f"{k}: checkpoint {saved[k]!r}, now {v!r}" for k, v in config.asdict().items()
            if k in saved and saved[k] != v and k not in ("dropout", "rope_scaling", "rope_scaling_factor")]
    if any(ckpt["tokenizer"].get(k) != meta.get(k) for k in ("tokenizer", "chars", "eot", "bpe_ranks")):
        diff.append(f"tokenizer: dataset {meta['dataset']!r} has another vocabulary")
    if diff:
        raise ValueError("cannot resume: this run's model differs from the checkpoint's (" + "; ".join(diff) +
                         f"); pass the settings in {str(path.parent / 'config.json')!r} or use a new out_dir")
    if ckpt["iter"] >= tc.max_iters:
        raise ValueError(f"nothing to do: the checkpoint is at iteration {ckpt['iter']} and max_iters={tc.max_iters}; "
                         "raise max_iters to train on")
    return ckpt


def trim_log(path, upto):
    """Keep the log lines of iterations up to upto: the resumed run logs the later ones again."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        with contextlib.suppress(ValueError):  # a line torn by a crash is dropped
            if json.loads(line)["iter"] <= upto:
                kept.append(line)
    atomic_write(path, lambda f: f.write("".join(kept).encode()))


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


def train(gcfg, tc, argv=None):
    """Train; argv (the command's arguments) only shapes the resume hint printed on a stop."""
    rt = setup_runtime(tc)
    dataset_dir = Path(tc.data_dir) / tc.dataset
    meta = load_meta(dataset_dir)
    gcfg.vocab_size = meta["vocab_size"]
    micro_steps = tc.gradient_accumulation_steps // rt.world_size
    batches = Batches(dataset_dir, meta, gcfg.block_size, tc.batch_size, tc.seed, rt.device, tc.eval_iters)
    out = check_out_dir(tc) if rt.master else Path(tc.out_dir)

    torch.manual_seed(tc.seed)  # the same initial weights on every rank
    raw_model = GPT(gcfg).to(rt.device)
    ckpt = resumable_checkpoint(out / "ckpt.pt", gcfg, meta, tc) if tc.resume else None  # fail before the slow setup
    optimizer = make_optimizer(raw_model, tc, rt.device_type)
    scaler = torch.amp.GradScaler(rt.device_type, enabled=rt.dtype == torch.float16)
    start_iter, best_val, elapsed, saved_at = 0, float("inf"), 0.0, None
    if ckpt:
        raw_model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt["scaler"]:
            scaler.load_state_dict(ckpt["scaler"])
        start_iter = saved_at = ckpt["iter"]
        best_val, elapsed = ckpt["best_val_loss"], ckpt.get("elapsed_s", 0.0)
        set_rng_state(ckpt["rng"])
        del ckpt

    # evaluate with this one, never the DDP wrapper: its forward may talk to the ranks that are not evaluating
    compiled = torch.compile(raw_model) if rt.compile else raw_model
    model = compiled if rt.world_size == 1 else DDP(compiled, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)
    record = {"model": gcfg.asdict(), "train": asdict(tc), **run_record(), "world_size": rt.world_size}
    tokens_per_step = tc.batch_size * gcfg.block_size * tc.gradient_accumulation_steps
    if rt.master:
        out.mkdir(parents=True, exist_ok=True)
        if tc.resume:
            trim_log(out / "metrics.jsonl", start_iter)
            print(f"resuming from {out / 'ckpt.pt'} at iteration {start_iter}")
        atomic_write(out / "config.json", lambda f: f.write((json.dumps(record, indent=2) + "\n").encode()))
        print(f"model: {raw_model.num_params() / 1e6:.2f}M parameters, pos_emb={gcfg.pos_emb}; "
              f"tokens per step: {tokens_per_step:,}")

    def checkpoint(path):
        save_checkpoint({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scaler": scaler.state_dict() if scaler.is_enabled() else {}, "iter": done,
                         "best_val_loss": best_val, "rng": rng_state(), "elapsed_s": time.perf_counter() - t_start,
                         "model_config": gcfg.asdict(), "train_config": asdict(tc), "tokenizer": meta,
                         "record": record}, path)

    def diverged(what):
        kept = (f"the last checkpoint, {out / 'ckpt.pt'} (iteration {saved_at}), is untouched" if saved_at is not None
                else "no checkpoint had been written yet")
        return (f"{what} at iteration {done}: training diverged. Likely causes: learning_rate={tc.learning_rate} too "
                f"high (lower it or raise warmup_iters), or {str(rt.dtype).removeprefix('torch.')} overflowing "
                f"(try dtype=bfloat16 or float32); {kept}")

    flops_per_step = raw_model.flops_per_token(gcfg.block_size) * tokens_per_step
    t_start, step_time, step_count = time.perf_counter() - elapsed, 0.0, 0
    with (StopFlag(quit_on_repeat=rt.world_size == 1) as stop,
          tqdm(total=tc.max_iters, initial=start_iter, disable=not (rt.master and tc.progress), dynamic_ncols=True) as bar,
          open(out / "metrics.jsonl", "a") if rt.master else contextlib.nullcontext() as metrics):
        for it in range(start_iter, tc.max_iters):
            done = it + 1
            t0 = time.perf_counter()
            lr = set_lr(optimizer, it, tc)
            loss_sum = torch.zeros((), device=rt.device)
            for j in range(micro_steps):
                micro = rt.rank * micro_steps + j  # place in the global batch: its data and dropout masks
                x, y = batches.train(it, micro)
                torch.manual_seed(micro_seed(tc.seed, it, micro, DROPOUT))
                # DDP all-reduces (averages) gradients on the last micro-step only
                sync = contextlib.nullcontext() if j == micro_steps - 1 or rt.world_size == 1 else model.no_sync()
                with sync, rt.autocast():
                    loss = model(x, y)[1] / micro_steps
                scaler.scale(loss).backward()
                loss_sum += loss.detach()
            if rt.world_size == 1:
                train_loss, stop_now = loss_sum.item(), stop.requested
            else:  # one collective carries the loss (for the log) and every rank's stop request: all stop together
                status = torch.stack([loss_sum, torch.tensor(float(stop.requested), device=rt.device)])
                dist.all_reduce(status)
                loss_total, requests = status.tolist()
                train_loss, stop_now = loss_total / rt.world_size, requests > 0
            if not math.isfinite(train_loss):
                raise Divergence(diverged(f"the training loss is {train_loss}"))
            grad_norm = apply_gradients(raw_model, optimizer, scaler, tc.grad_clip)
            step_time += time.perf_counter() - t0
            step_count += 1
            tokens_per_s = tokens_per_step * step_count / step_time
            bar.update(1)
            bar.set_postfix(loss=f"{train_loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)

            eval_due = done % tc.eval_interval == 0 or done == tc.max_iters or stop_now
            line = None
            if rt.master and (eval_due or done % tc.log_interval == 0):
                line = {"iter": done, "train_loss": train_loss, "grad_norm": grad_norm.item(), "lr": lr,
                        "tokens_per_s": tokens_per_s}
                if rt.device_type == "cuda":
                    line["mfu"] = flops_per_step * step_count / step_time / peak_flops(rt)
            if rt.master and stop_now:
                bar.write(f"stop requested: finishing at iteration {done} with a checkpoint"
                          + (" (Ctrl-C again to quit at once)" if stop.quit_on_repeat else ""))
            if eval_due:
                ev = evaluate(compiled, batches, rt) if rt.master else {}
                # rank 0's verdict goes to every rank, so a divergence seen in evaluation stops all of them
                if any_rank(not all(map(math.isfinite, ev.values())), rt):
                    raise Divergence(diverged("evaluation gave a non-finite loss"))
                if rt.master:  # train_loss stays the step's: the evaluation's is on its fixed batches
                    line |= {"eval_train_loss": ev["train_loss"], "val_loss": ev["val_loss"], "val_bpb": ev["val_bpb"]}
                    bar.write(f"iter {done}: train {ev['train_loss']:.4f}, val {ev['val_loss']:.4f} "
                              f"({ev['val_bpb']:.3f} bits/byte), {tokens_per_s:,.0f} tokens/s")
                    if ev["val_loss"] < best_val:
                        best_val = ev["val_loss"]
                        checkpoint(out / "best.pt")
                    checkpoint(out / "ckpt.pt")
                saved_at = done
            if line is not None:  # tokens/s is measured afresh over each logging window
                line["elapsed_s"] = time.perf_counter() - t_start
                metrics.write(json.dumps(line) + "\n")
                metrics.flush()
                step_time, step_count = 0.0, 0
            if stop_now:
                break
    if rt.master:
        if stop_now:
            print(f"stopped at iteration {done}; checkpoint written to {out / 'ckpt.pt'}. "
                  f"To continue: {resume_command(argv, rt)}")
        else:
            print(f"done: {done} iterations in {time.perf_counter() - t_start:.1f}s, best val loss {best_val:.4f}")
    return best_val


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
