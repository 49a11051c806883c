"""Where and how a process computes: device, precision, autocast, torch.compile and DDP, and the stop signals it obeys.

Each choice is made here once, auto-detected unless set, and printed with its reason; train.py,
sample.py, ablate.py and bench.py all take theirs from this module.
"""

import contextlib
import os
import platform
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

DTYPES = ("auto", "float32", "bfloat16", "float16")


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

    @property
    def dtype_name(self):
        return str(self.dtype).removeprefix("torch.")

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def wrap(self, model):
        """(model compiled if asked, that in DDP under torchrun): one to evaluate on a rank alone, one to train."""
        compiled = torch.compile(model) if self.compile else model
        if self.world_size == 1:
            return compiled, compiled
        return compiled, DDP(compiled, device_ids=[self.local_rank] if self.device_type == "cuda" else None)

    def peak_flops(self):
        """Dense bf16 peak of the GPU, for MFU; an assumed H100/A100-class figure when the name is unknown."""
        name = torch.cuda.get_device_name(self.device)
        table = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "4090": 165e12, "3090": 71e12}
        return next((v for k, v in table.items() if k in name), 312e12)


class Signals:
    """While entered, SIGINT and SIGTERM go to self.on_signal; leaving gives the handlers before back."""

    def __enter__(self):
        self.previous = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class StopFlag(Signals):
    """While entered, SIGINT/SIGTERM ask the loop to finish its step, checkpoint and exit; a second
    Ctrl-C exits at once. Under torchrun a worker gets each Ctrl-C twice (from the terminal, and
    forwarded by torchrun), so there a repeat only asks again: torchrun's own timeout is the hard stop."""

    def __init__(self, quit_on_repeat=True):
        self.requested, self.quit_on_repeat = False, quit_on_repeat

    def on_signal(self, signum, frame):
        if self.requested and signum == signal.SIGINT and self.quit_on_repeat:
            raise KeyboardInterrupt
        self.requested = True


class EveryRankError(ValueError):
    """An error that every process of a run raises at the same step (their verdict shared through a collective)."""


def error_line(e):
    """The line a command that e ends prints on this process, or None where rank 0's says it all."""
    if isinstance(e, EveryRankError):  # every rank raises it at the same step: one message is enough
        return f"error: {e}" if int(os.environ.get("RANK", 0)) == 0 else None
    return f"{rank_prefix()}error: {e}"  # may be one rank's alone (a node without the data), so each says it


def rank_prefix():
    """Whose line it is, "[rank R] ", when several processes print; nothing for one."""
    return f"[rank {os.environ.get('RANK', 0)}] " if int(os.environ.get("WORLD_SIZE", 1)) > 1 else ""


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
            raise ValueError(
                f"device cuda:{index} does not exist: this machine has {count} CUDA device(s), cuda:0 "
                f"to cuda:{count - 1} (under torchrun, run at most that many processes per node)"
            )
        requested = f"cuda:{index}"
    return requested, reason


def pick_dtype(requested, device_type):
    if requested == "bfloat16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"dtype=bfloat16 is not supported by this GPU ({torch.cuda.get_device_name()}); use "
            "dtype=float16 (with its loss scaling), float32 or auto"
        )
    if requested != "auto":
        return getattr(torch, requested)
    if device_type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device_type == "cpu":
        return torch.bfloat16 if cpu_prefers_bf16() else torch.float32
    return torch.float32


def cpu_prefers_bf16():
    """Whether a CPU runs bf16 autocast faster than float32: decided by what the CPU is, never by a timing, so the
    same machine gives the same answer however loaded it is. Without AVX512-BF16 or AMX, bf16 is emulated and many
    times slower. AMX (Intel, Sapphire Rapids on) and AVX512-BF16 on AMD (Zen 4 on) run it natively and faster,
    while an Intel Xeon with AVX512-BF16 but no AMX was measured slower in bf16 than in float32. SSE4a is an AMD
    instruction set, on every AMD CPU and on no Intel one. The CPU's flags are read as they are, so the kernel level
    torch runs at (ATEN_CPU_CAPABILITY may hold it to AVX2, and bf16 then runs emulated) must be AVX512 too."""
    caps = torch.cpu.get_capabilities()
    native = caps.get("amx_bf16") or (caps.get("avx512_bf16") and caps.get("sse4a"))
    return bool(native) and torch.backends.cpu.get_cpu_capability() == "AVX512"


def decode_autocast(device_type, dtype=None):
    """Autocast for generation: on CUDA only, in dtype (default: auto's choice there); batch-1 decoding on CPU
    gains nothing from bf16, so no dtype is picked there."""
    if device_type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=dtype or pick_dtype("auto", "cuda"))


def check_compile(wanted, device_type):
    """Whether to torch.compile: on by default for CUDA; refuse where it cannot work. Off by default on CPU, for long
    runs too: there a small model's step is mostly matmuls already at the core's peak, so compiling gains little (more
    or less with the load from other processes), while a fresh process compiles each new shape for longer than one
    run's steps win back; later models of that shape in the same process compile at once, so a lab whose workers
    train many runs of one shape may choose compile=true (bench.py --only train_step,probe measures both)."""
    if wanted is None:
        return device_type == "cuda"
    if wanted and device_type == "mps":
        raise ValueError("compile=True is not supported on mps; use --compile=False")
    if wanted and device_type == "cpu" and not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        raise ValueError(
            "compile=True on CPU needs a C++ compiler on PATH (none found); install one or use --compile=False"
        )
    return wanted


def ddp_env():
    """(rank, local_rank, world_size) as torchrun sets them; (0, 0, 1) for a plain process."""
    return tuple(int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))


def setup_runtime(device="auto", dtype="auto", compile=None, quiet=False):
    """Device, precision, compile and (under torchrun) the process group, printed with reasons."""
    rank, local_rank, world = ddp_env()
    if world > 1 and (":" in device or device == "mps"):
        raise ValueError(
            f"device={device!r} cannot serve {world} processes: under torchrun each takes its own GPU "
            "(device=auto or cuda gives cuda:LOCAL_RANK), or all share the CPU (device=cpu)"
        )
    device, reason = pick_device(device, local_rank)
    device_type = device.partition(":")[0]
    runtime = Runtime(
        device, pick_dtype(dtype, device_type), check_compile(compile, device_type), rank, local_rank, world
    )
    if "RANK" in os.environ:
        dist.init_process_group(backend="nccl" if runtime.device_type == "cuda" else "gloo")
        if dtype == "auto" and runtime.device_type == "cpu":  # nodes of different CPUs: bf16 only if all chose it
            runtime.dtype = torch.float32 if any_rank(runtime.dtype != torch.bfloat16, runtime) else torch.bfloat16
    if runtime.device_type == "cuda":
        torch.cuda.set_device(runtime.device)
        # TF32 matmuls: several times the float32 tensor-core rate, precision ample for training
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if runtime.master and not quiet:
        print(
            f"device: {runtime.device} ({reason}); dtype: {runtime.dtype_name}; compile: {runtime.compile}; "
            f"processes: {world}"
        )
    return runtime


def leave_process_group():
    """Leave the DDP process group setup_runtime joined, if it did: a command's last act under torchrun."""
    if dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flag, runtime):
    """True on every process if it is True on any: one collective, so all take the same branch."""
    t = torch.tensor(float(flag), device=runtime.device)
    if runtime.world_size > 1:
        dist.all_reduce(t)
    return t.item() > 0


def mean_and_any(loss_sum, stop_requested, runtime):
    """(the step's loss averaged over the processes, whether any asked to stop): one collective under DDP carries
    both, so every rank stops together."""
    if runtime.world_size == 1:
        return loss_sum.item(), stop_requested
    status = torch.stack([loss_sum, torch.tensor(float(stop_requested), device=runtime.device)])
    dist.all_reduce(status)
    loss_total, requests = status.tolist()
    return loss_total / runtime.world_size, requests > 0


def run_record():
    """Code version and environment, saved with every run."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return {
        "code_version": rev or "unknown",
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
    }
