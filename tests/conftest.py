"""Shared fixtures: the tiny Shakespeare corpus, prepared once per session, and tiny model configs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Tiny models run fastest on one thread, and a shared 2-core machine thrashes with more
# (one step went from 3 ms to over a second); subprocesses inherit the variable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

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
    run("data/prepare.py", "--input", corpus, "--data_dir", root)
    return root


# a model small enough to train a few steps in well under a second; float32, which the exactness
# tests assume and auto would not give on a CPU with native bf16
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=2",
        "--progress=false", "--compile=false", "--dtype=float32"]
