"""Where and how a process computes: device, precision, autocast, torch.compile and DDP.

Each choice is made here once, auto-detected unless set, and printed with its reason; train.py,
sample.py, ablate.py and bench.py all take theirs from this module.
"""

import contextlib
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

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
        # with AVX512-BF16 or AMX, bf16 matmuls outrun float32's (bench.py); without, bf16 is emulated
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


def ddp_env():
    """(rank, local_rank, world_size) as torchrun sets them; (0, 0, 1) for a plain process."""
    return tuple(int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))


def setup_runtime(device="auto", dtype="auto", compile=None, quiet=False):
    """Device, precision, compile and (under torchrun) the process group, printed with reasons."""
    rank, local_rank, world = ddp_env()
    if world > 1 and (":" in device or device == "mps"):
        raise ValueError(f"device={device!r} cannot serve {world} processes: under torchrun each takes its own GPU "
                         "(device=auto or cuda gives cuda:LOCAL_RANK), or all share the CPU (device=cpu)")
    device, reason = pick_device(device, local_rank)
    device_type = device.partition(":")[0]
    rt = Runtime(device, pick_dtype(dtype, device_type), check_compile(compile, device_type), rank, local_rank, world)
    if "RANK" in os.environ:
        dist.init_process_group(backend="nccl" if rt.device_type == "cuda" else "gloo")
    if rt.device_type == "cuda":
        torch.cuda.set_device(rt.device)
        # TF32 matmuls: several times the float32 tensor-core rate, precision ample for training
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if rt.master and not quiet:
        print(f"device: {rt.device} ({reason}); dtype: {rt.dtype_name}; compile: {rt.compile}; processes: {world}")
    return rt


def any_rank(flag, rt):
    """True on every process if it is True on any: one collective, so all take the same branch."""
    t = torch.tensor(float(flag), device=rt.device)
    if rt.world_size > 1:
        dist.all_reduce(t)
    return t.item() > 0


def run_record():
    """Code version and environment, saved with every run."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return {"code_version": rev or "unknown", "python": platform.python_version(), "torch": str(torch.__version__),
            "platform": platform.platform(), "cpu_threads": torch.get_num_threads()}
