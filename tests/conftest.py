"""Shared fixtures: the tiny Shakespeare corpus, prepared once per session, and tiny model configs."""

import contextlib
import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from model import GPT, GPTConfig

# Tiny models run fastest on one thread, and a shared 2-core machine thrashes with more
# (one step went from 3 ms to over a second); subprocesses inherit the variable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
# no test reaches for the network: huggingface_hub (under transformers, for test_export) reads this at import
os.environ["HF_HUB_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("NANOROPE_CORPUS", ROOT.parent / "shared/data/tinyshakespeare/input.txt"))


def run(*args, check=True, **kw):
    """Run a repo command (python script + args) from the repo root; returns the CompletedProcess."""
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def corpus():
    if not CORPUS.is_file():
        pytest.skip(f"tiny Shakespeare corpus not found at {CORPUS} (set NANOROPE_CORPUS)")
    return CORPUS


@pytest.fixture(scope="session")
def data_dir(corpus, tmp_path_factory):
    """A data root holding shakespeare_char, prepared from the shared corpus."""
    root = tmp_path_factory.mktemp("data")
    run("-m", "data.prepare", "--input", corpus, "--data_dir", root)
    return root


# a model small enough to train a few steps in well under a second; float32, which the exactness
# tests assume and auto would not give on a CPU with native bf16
TINY = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=32",
    "--batch_size=4",
    "--eval_iters=2",
    "--progress=false",
    "--compile=false",
    "--dtype=float32",
]


def tiny_model(pos_emb, **kw):
    """A seeded 2-layer, 32-wide model of an 11-token vocabulary at context 16, in eval mode."""
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=11, pos_emb=pos_emb)
    return GPT(GPTConfig(**(cfg | kw))).eval()


def all_logits(model, idx, **kw):
    return model(idx, targets=idx, **kw)[0]  # targets make the model return every position's logits


# ----------------------------------------------------------------------------- training runs

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models: a second thread only contends for a shared CPU


@pytest.fixture
def one_thread():
    """torch on one thread for the test, restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def flags(data_dir, out, *more):
    return [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", *more]


def log(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def trainer(args):
    """train.py as a child process, for what only a real process shows: signals, kills, exit codes."""
    return subprocess.Popen(
        [sys.executable, "train.py", *map(str, args)],
        cwd=ROOT,
        env=ONE_THREAD,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"trainer exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, "timed out waiting for the trainer"
        time.sleep(0.02)


def last_logged(out):
    """The last iteration in a live run's log (0 before it has one), skipping a line still being written."""
    path, last = out / "metrics.jsonl", 0
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(ValueError):
            last = json.loads(line)["iter"]
    return last


def same_tensors(a, b):
    """Nested dicts/lists of tensors and numbers, bit for bit."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_tensors(x, y) for x, y in zip(a, b, strict=True))
    return a == b


class Payload:
    """Unpickling this creates a file: proof that code in a checkpoint ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


# ----------------------------------------------------------------------------- failing devices


class FullDevice:
    """Stands in for files.open (monkeypatch.setattr(files, "open", FullDevice(...))): opening a file named in
    names (from the nth such opening on) gives a file whose writes fail with ENOSPC once `room` bytes are in,
    as on a device that fills up; every other file opens as usual."""

    def __init__(self, *names, room=0, nth=1, error=errno.ENOSPC):
        self.names, self.room, self.nth, self.error, self.seen = names, room, nth, error, 0

    def __call__(self, path, mode="r", *args, **kw):
        if Path(path).name in self.names and "r" not in mode:
            self.seen += 1
            if self.seen >= self.nth:
                if self.error == errno.EROFS:  # a read-only device refuses the opening itself
                    raise OSError(self.error, os.strerror(self.error), str(path))
                return _Filling(open(path, mode, *args, **kw), self.room)
        return open(path, mode, *args, **kw)


class _Filling:
    def __init__(self, f, room):
        self.f, self.room, self.name = f, room, f.name

    def write(self, data):
        if len(data) > self.room:
            self.f.write(data[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


TIMINGS = ("wall_s", "environment", "train_s", "eval_s", "tokens_per_s")


def untimed(x):
    """results.json without its timings, which no two runs share."""
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if k not in TIMINGS}
    return [untimed(v) for v in x] if isinstance(x, list) else x
