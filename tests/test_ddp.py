"""DDP under torchrun on CPU (gloo): the same training as one process, checkpoints that cross over
both ways, and every rank stopping together on a signal or a divergence."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import torch

import train
from checkpoint import load_checkpoint
from conftest import ONE_THREAD, ROOT, flags, last_logged, log, wait_for

pytestmark = pytest.mark.usefixtures("one_thread")

# two micro-batches a step: one per rank under DDP, both in turn in one process; dropout, so the
# masks must follow the micro-batch too; evaluation only at the end or on a stop
COMMON = [
    "--device=cpu",
    "--gradient_accumulation_steps=2",
    "--dropout=0.1",
    "--warmup_iters=2",
    "--lr_decay_iters=1000",
    "--log_interval=1",
    "--eval_interval=1000000",
]


def torchrun(*args):
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "train.py",
        *map(str, args),
    ]


def close(a, b, rel):
    return abs(a - b) <= rel * abs(b)


@pytest.mark.slow
def test_two_processes_train_as_one_and_checkpoints_cross_over(data_dir, tmp_path):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    train.main(flags(data_dir, single, *COMMON, "--max_iters=2"))
    shutil.copytree(single, ddp)
    # DDP resumes the one-process checkpoint and trains until a Ctrl-C reaches the whole process
    # group, as from a terminal: torchrun and both workers
    proc = subprocess.Popen(
        torchrun(*flags(data_dir, ddp, *COMMON, "--max_iters=1000000", "--resume")),
        cwd=ROOT,
        env=ONE_THREAD,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(lambda: last_logged(ddp) >= 4, proc)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stops = re.findall(r"stopped at iteration (\d+); checkpoint written", stdout)
    assert len(stops) == 1 and "error:" not in stderr and "interrupted:" not in stderr, stdout + stderr
    assert stderr.count("Traceback") <= 1  # torchrun's own SignalException, never a worker's
    k = int(stops[0])  # rank 0 alone reports; a worker quitting at once would have said "interrupted:"
    ckpt = load_checkpoint(ddp / "ckpt.pt")
    assert ckpt["iter"] == k and ckpt["record"]["world_size"] == 2

    train.main(flags(data_dir, single, *COMMON, f"--max_iters={k}", "--resume"))  # the same steps in one process
    a, b = log(single), log(ddp)
    assert [m["iter"] for m in a] == [m["iter"] for m in b] == list(range(1, k + 1))
    for x, y in zip(a[2:], b[2:], strict=True):
        assert close(y["train_loss"], x["train_loss"], 1e-5) and close(y["grad_norm"], x["grad_norm"], 1e-4), (x, y)
    assert close(b[-1]["val_loss"], a[-1]["val_loss"], 1e-5)
    ref = torch.load(single / "ckpt.pt", weights_only=True)
    assert ckpt["model"].keys() == ref["model"].keys() and ckpt["optimizer"].keys() == ref["optimizer"].keys()
    assert all(torch.allclose(ckpt["model"][n], t, atol=1e-6, rtol=1e-4) for n, t in ref["model"].items())

    # and the DDP checkpoint resumes in one process
    for out in (single, ddp):
        train.main(flags(data_dir, out, *COMMON, f"--max_iters={k + 1}", "--resume"))
    assert close(log(ddp)[-1]["train_loss"], log(single)[-1]["train_loss"], 1e-5)
    print(
        f"DDP vs one process, iterations 3..{k}: train losses",
        [(x["train_loss"], y["train_loss"]) for x, y in zip(a[2:], b[2:], strict=True)],
    )


@pytest.mark.slow
def test_a_divergence_stops_every_rank_and_keeps_the_checkpoint(data_dir, tmp_path):
    out = tmp_path / "run"
    train.main(flags(data_dir, out, *COMMON, "--max_iters=2"))
    before = (out / "ckpt.pt").read_bytes()
    # the run's learning rate raised in its settings, which a resume takes (a command may not change it): step 3's
    # loss is fine; the weights it leaves make rank 0's evaluation non-finite, and the other rank, which does not
    # evaluate, must learn of it and stop too rather than wait for a next step
    record = json.loads((out / "config.json").read_text())
    record["train"]["learning_rate"] = 1e30
    (out / "config.json").write_text(json.dumps(record))
    proc = subprocess.run(
        torchrun(*flags(data_dir, out, *COMMON, "--resume", "--max_iters=5", "--eval_interval=1")),
        cwd=ROOT,
        env=ONE_THREAD,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in proc.stderr.splitlines() if re.match(r"(\[rank \d\] )?error:", line)]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: evaluation gave a non-finite loss at iteration 3: training diverged")
    # a rank left behind would die in its next collective with a traceback (or hang until SIGKILL);
    # the only traceback here is torchrun's own report of the failure
    assert proc.stderr.count("Traceback") == 1 and "exitcode  : -9" not in proc.stderr, proc.stderr
    assert (out / "ckpt.pt").read_bytes() == before
