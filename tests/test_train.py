"""train.py's reliability: exact resume, graceful stop, checkpoints that survive kills, the
divergence guard, and a battery of user mistakes, each answered in one line with nothing destroyed."""

import itertools
import json
import os
import random
import re
import shlex
import shutil
import signal

import numpy as np
import pytest
import torch

import config
import files
import run_setup
import runtime
import scalings
import train
from checkpoint import RESUME_KEYS, load_checkpoint, model_from_checkpoint
from conftest import (
    ONE_THREAD,
    TINY,
    FullDevice,
    Payload,
    flags,
    last_logged,
    log,
    run,
    same_tensors,
    trainer,
    wait_for,
)
from data import prepare
from data.recall import Recall
from data.tokenizer import load_meta

pytestmark = pytest.mark.usefixtures("one_thread")


def one_error_line(capsys, prefix="error: "):
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), err
    return lines[0]


# ----------------------------------------------------------------------------- exact resume

# dropout and two micro-steps, so the resumed run must also replay dropout masks and accumulation
RESUMABLE = [
    "--max_iters=8",
    "--lr_decay_iters=8",
    "--warmup_iters=2",
    "--gradient_accumulation_steps=2",
    "--dropout=0.1",
    "--log_interval=1",
    "--eval_interval=3",
]


@pytest.mark.parametrize("optimizer", train.OPTIMIZERS)
@pytest.mark.slow
def test_stopped_by_a_signal_and_resumed_is_bit_identical_to_straight(
    data_dir, tmp_path, monkeypatch, capsys, optimizer
):
    straight, split = tmp_path / "straight", tmp_path / "split"
    resumable = [*RESUMABLE, f"--optimizer={optimizer}"]
    train.main(flags(data_dir, straight, *resumable))

    def lr(self, it):  # SIGTERM arrives during the step to iteration 4
        if it == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_lr(self, it)

    real_lr = train.Schedule.lr
    monkeypatch.setattr(train.Schedule, "lr", lr)
    argv = flags(data_dir, split, *resumable)
    train.main(argv)
    monkeypatch.setattr(train.Schedule, "lr", real_lr)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored after the run
    said = capsys.readouterr().out
    assert "stop requested: finishing at iteration 4" in said
    command = re.search(r"stopped at iteration 4; checkpoint written to .*ckpt.pt\. To continue: (.*)", said)[1]
    assert command == "python train.py " + shlex.join(argv + ["--resume=true"])
    assert torch.load(split / "ckpt.pt", weights_only=True)["iter"] == 4

    # the log may hold lines past the checkpoint (steps taken before a crash) and a torn last line
    with open(split / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"iter": 5, "train_loss": 9.9}) + "\n" + '{"iter": 6, "tra')
    saved_rng = torch.load(split / "ckpt.pt", weights_only=True)["rng"]
    random.seed(99)
    np.random.seed(99)
    train.main(shlex.split(command)[2:])  # the printed command, as the user would run it
    # the loop draws nothing from python's or numpy's generators: they hold what the resume restored
    assert random.getstate() == saved_rng["python"]
    assert np.array_equal(np.random.get_state()[1], saved_rng["numpy"][1].numpy())

    a, b = log(straight), log(split)
    assert [m["iter"] for m in b] == list(range(1, 9))
    for key in ("train_loss", "grad_norm", "lr"):
        assert [m[key] for m in a] == [m[key] for m in b], key
    assert [m["val_loss"] for m in a if "val_loss" in m] == [b[i - 1]["val_loss"] for i in (3, 6, 8)]
    assert b[4]["elapsed_s"] > b[3]["elapsed_s"]  # the clock runs on from the checkpoint's
    ca, cb = (torch.load(d / "ckpt.pt", weights_only=True) for d in (straight, split))
    assert ca["iter"] == cb["iter"] == 8 and ca["best_val_loss"] == cb["best_val_loss"]
    assert same_tensors(ca["model"], cb["model"]) and same_tensors(ca["optimizer"], cb["optimizer"])


def test_checkpoint_holds_everything_a_resume_needs(data_dir, tmp_path):
    out = tmp_path / "run"
    train.main(flags(data_dir, out, "--max_iters=2", "--seed=7"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert set(RESUME_KEYS) | {"model_config", "train_config", "record", "elapsed_s"} <= ckpt.keys()
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])
    assert ckpt["iter"] == 2 and ckpt["train_config"]["seed"] == 7 and ckpt["model_config"]["n_embd"] == 32
    assert ckpt["tokenizer"] == load_meta(data_dir / "shakespeare_char")
    assert ckpt["rng"].keys() == {"python", "numpy", "torch", "cuda"} and ckpt["optimizer"]["state"]
    assert ckpt["record"]["code_version"] and ckpt["record"]["world_size"] == 1
    end = log(out)[-1]  # tiny Shakespeare is ASCII: one token per byte, so bits per byte = nats / ln 2
    assert end["val_bpb"] == pytest.approx(end["val_loss"] / np.log(2))


def test_a_checkpoint_from_before_the_recipe_options_loads_and_resumes(data_dir, tmp_path):
    out = tmp_path / "run"
    train.main(flags(data_dir, out, "--max_iters=2"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    new = ("qk_norm", "mlp_act", "tie_embeddings", "logit_softcap", "zero_init_proj")
    ckpt["model_config"] = {k: v for k, v in ckpt["model_config"].items() if k not in new}
    ckpt["train_config"] = {k: v for k, v in ckpt["train_config"].items() if not k.startswith(("optimizer", "muon"))}
    torch.save(ckpt, out / "ckpt.pt")
    assert model_from_checkpoint(load_checkpoint(out / "ckpt.pt")).config.tie_embeddings  # defaults fill in
    train.main(flags(data_dir, out, "--max_iters=3", "--resume"))
    assert load_checkpoint(out / "ckpt.pt")["iter"] == 3


def test_lr_warms_up_linearly_then_follows_half_a_cosine_to_the_floor():
    train_cfg = train.TrainConfig(learning_rate=1.0, min_lr=0.1, warmup_iters=4, lr_decay_iters=24, max_iters=30)
    lrs = [train.Schedule(train_cfg).lr(it) for it in range(30)]
    assert lrs[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8])  # (it + 1) / (warmup + 1) of the peak
    assert lrs[4] == 1.0 and lrs[14] == pytest.approx(0.55) and lrs[24:] == [0.1] * 6  # peak, halfway, floor
    assert lrs[9] == pytest.approx(0.1 + 0.9 * np.cos(np.pi / 8) ** 2)  # a quarter of the way: cos^2 form
    assert all(a > b for a, b in itertools.pairwise(lrs[4:25]))
    assert train.Schedule(train.TrainConfig(learning_rate=1.0, warmup_iters=0, max_iters=10)).lr(10) == pytest.approx(
        0.1
    )


# ----------------------------------------------------------------------------- signals and kills


@pytest.mark.slow
def test_ctrl_c_finishes_the_step_writes_a_checkpoint_and_exits_0(data_dir, tmp_path):
    out = tmp_path / "run"
    proc = trainer(flags(data_dir, out, "--max_iters=1000000", "--log_interval=1", "--eval_interval=1000000"))
    wait_for(lambda: last_logged(out) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    done = int(re.search(r"stopped at iteration (\d+); checkpoint written to (.*)ckpt.pt", stdout)[1])
    assert f"To continue: python train.py {shlex.join(TINY)}" in stdout and stdout.rstrip().endswith("--resume=true")
    assert load_checkpoint(out / "ckpt.pt")["iter"] == done == log(out)[-1]["iter"]
    assert "val_loss" in log(out)[-1]  # the stop's evaluation is on record


def test_a_second_ctrl_c_quits_at_once_and_leaves_the_last_checkpoint(data_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    train.main(flags(data_dir, out, "--max_iters=2"))
    before = (out / "ckpt.pt").read_bytes()
    handler = signal.getsignal(signal.SIGINT)

    def lr(self, it):  # the first Ctrl-C, during the step to iteration 4
        if it == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real_lr(self, it)

    def evaluate(*args):  # the second, while the stop's evaluation runs
        os.kill(os.getpid(), signal.SIGINT)
        return real_evaluate(*args)

    real_lr, real_evaluate = train.Schedule.lr, train.evaluate
    monkeypatch.setattr(train.Schedule, "lr", lr)
    monkeypatch.setattr(train, "evaluate", evaluate)
    with pytest.raises(SystemExit) as e:
        train.main(flags(data_dir, out, "--resume", "--max_iters=100"))
    assert e.value.code == 130
    assert "quit at once, without a new checkpoint" in one_error_line(capsys, prefix="interrupted: ")
    assert (out / "ckpt.pt").read_bytes() == before and sorted(p.name for p in out.iterdir()) == [
        ".lock",
        "best.pt",
        "ckpt.pt",
        "config.json",
        "metrics.jsonl",
    ]  # the lock file holds no lock once the run ends
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_repeated_signal_under_torchrun_only_asks_again():
    with runtime.StopFlag(quit_on_repeat=False) as flag:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the terminal's Ctrl-C and torchrun's forwarded copy
        assert flag.requested
    with pytest.raises(KeyboardInterrupt), runtime.StopFlag() as flag:
        os.kill(os.getpid(), signal.SIGTERM)  # SIGTERM asks; a Ctrl-C after it quits
        assert flag.requested
        os.kill(os.getpid(), signal.SIGINT)


# train.py in a child that SIGKILLs itself inside its nth write of one checkpoint file: "partial" once half
# the temporary file is on disk, before the rename; "renamed" just after the rename, before the folder's fsync
KILLED_IN_A_WRITE = """
import io, os, signal, sys
from pathlib import Path
import torch
import train

name, nth, point, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
watched = f".{name}.tmp" if point == "partial" else name  # atomic_write's temporary, or the file itself
real_save, real_replace, seen = torch.save, os.replace, 0

def nth_write(path):
    global seen
    seen += Path(path).name == watched
    return Path(path).name == watched and seen == nth

def save(obj, f):
    if not nth_write(getattr(f, "name", f)):
        return real_save(obj, f)
    whole = io.BytesIO()
    real_save(obj, whole)
    f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
    f.flush()
    os.fsync(f.fileno())  # the torn half reaches the disk, as a crash mid-write would leave it
    os.kill(os.getpid(), signal.SIGKILL)

def replace(src, dst):
    real_replace(src, dst)
    if nth_write(dst):
        os.kill(os.getpid(), signal.SIGKILL)

torch.save, os.replace = (save, real_replace) if point == "partial" else (real_save, replace)
train.main(argv)
"""

# (file, kill point, what stays on disk); eval_interval=1 writes ckpt.pt at every step and best.pt, first,
# whenever val improves, so the second write of either comes after a whole ckpt.pt of iteration 1
KILLS = [
    ("ckpt.pt", "partial", "the ckpt.pt of iteration 1 beside a torn temporary"),
    ("ckpt.pt", "renamed", "the new ckpt.pt of iteration 2"),
    ("best.pt", "renamed", "a best.pt one iteration ahead of ckpt.pt, whose write never began"),
]


@pytest.mark.parametrize("name, point, left", KILLS, ids=[f"{name} {point}" for name, point, _ in KILLS])
@pytest.mark.slow
def test_sigkill_inside_a_checkpoint_write_leaves_whole_checkpoints_that_resume(data_dir, tmp_path, name, point, left):
    out, straight = tmp_path / "run", tmp_path / "straight"
    args = ["--max_iters=4", "--warmup_iters=0", "--eval_interval=1", "--eval_iters=1", "--log_interval=1"]
    proc = run("-c", KILLED_IN_A_WRITE, name, 2, point, *flags(data_dir, out, *args), check=False, env=ONE_THREAD)
    assert proc.returncode == -signal.SIGKILL, f"not killed in the write ({left}):\n{proc.stderr}"
    ckpt, best = load_checkpoint(out / "ckpt.pt"), load_checkpoint(out / "best.pt")  # both whole
    temporary = out / ".ckpt.pt.tmp"
    if point == "partial":
        assert ckpt["iter"] == 1
        with pytest.raises(ValueError, match="truncated or corrupt"):
            load_checkpoint(temporary)
    else:
        assert not temporary.exists() and not (out / ".best.pt.tmp").exists()
    if name == "best.pt":
        assert best["iter"] == ckpt["iter"] + 1
    elif point == "renamed":
        assert ckpt["iter"] == 2

    train.main(flags(data_dir, out, *args, "--resume"))
    train.main(flags(data_dir, straight, *args))
    assert not list(out.glob(".*.tmp"))  # the torn temporary was written over and renamed away
    assert [m["iter"] for m in log(out)] == [1, 2, 3, 4]  # no line lost or repeated
    for file in ("ckpt.pt", "best.pt"):  # the resumed run ends where an uninterrupted one does
        a, b = load_checkpoint(out / file), load_checkpoint(straight / file)
        assert a["iter"] == b["iter"] and a["best_val_loss"] == b["best_val_loss"], file
        assert same_tensors(a["model"], b["model"]) and same_tensors(a["optimizer"], b["optimizer"]), file


# ----------------------------------------------------------------------------- a full disk, a second run


def test_a_full_disk_stops_the_run_with_one_line_and_the_last_checkpoint_intact(
    data_dir, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    args = flags(data_dir, out, "--max_iters=6", "--eval_interval=2", "--warmup_iters=0")
    monkeypatch.setattr(files, "open", FullDevice(".ckpt.pt.tmp", nth=2, room=4096), raising=False)
    with pytest.raises(SystemExit) as e:
        train.main(args)
    assert e.value.code == 1
    line = one_error_line(capsys)
    assert re.fullmatch(
        rf"error: cannot write {out}/(best|ckpt)\.pt: the device is full \(No space left on device; "
        rf"it needs [\d.]+ KiB, [\d.]+ \w+ free there\); the last checkpoint, {out}/ckpt\.pt "
        r"\(iteration 2\), is untouched; once there is room: python train\.py .* --resume=true",
        line,
    )
    assert load_checkpoint(out / "ckpt.pt")["iter"] == 2 and not list(out.glob(".*.tmp"))
    monkeypatch.undo()
    train.main(shlex.split(line.rpartition("once there is room: ")[2])[2:])  # the printed command resumes
    assert [m["iter"] for m in log(out) if "val_loss" in m] == [2, 4, 6]


@pytest.mark.slow
def test_a_second_run_in_a_training_out_dir_is_refused_until_the_first_dies(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    first = trainer(flags(data_dir, out, "--max_iters=1000000", "--log_interval=1", "--eval_interval=1000000"))
    try:
        wait_for(lambda: last_logged(out) >= 1, first)  # training, and no checkpoint yet
        with pytest.raises(SystemExit) as second:  # in this process: another pid than the first's
            train.main(flags(data_dir, out, "--max_iters=5"))
        line = one_error_line(capsys)
        assert second.value.code == 1
        assert re.fullmatch(
            rf"error: {out} is in use by another training run \(pid {first.pid}, started .*: "
            r"train\.py .*\); wait for it to finish, stop it, or use another folder",
            line,
        )
    finally:
        first.kill()
        first.communicate()
    train.main(flags(data_dir, out, "--max_iters=2"))  # the killed run left no stale lock
    assert [m["iter"] for m in log(out)] == [2]  # a fresh run's log starts empty, without the killed run's lines


# ----------------------------------------------------------------------------- divergence


def test_a_diverging_run_stops_naming_the_iteration_and_causes(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:  # the first update throws the weights to ~1e30: the next loss overflows
        train.main(flags(data_dir, out, "--learning_rate=1e30", "--warmup_iters=0", "--max_iters=5"))
    assert e.value.code == 1
    err = one_error_line(capsys)
    assert re.search(r"the training loss is (nan|inf) at iteration 2: training diverged", err), err
    assert "learning_rate=1e+30 too high" in err and "float32 overflowing" in err
    assert "no checkpoint had been written yet" in err and not (out / "ckpt.pt").exists()


class Spike(train.Schedule):
    """The plain schedule but a learning rate of 1e30 at step 3: its training loss is fine, the weights it leaves
    are not."""

    def lr(self, it):
        return 1e30 if it == 2 else super().lr(it)


def test_divergence_found_by_evaluation_leaves_the_last_good_checkpoint(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    model_cfg, train_cfg, batch_cfg = config.parse(
        flags(data_dir, out, "--max_iters=3", "--eval_interval=2"), *train.SETTINGS
    )
    with pytest.raises(run_setup.Divergence) as e:
        train.train(model_cfg, train_cfg, batch_cfg, Spike(train_cfg))
    assert "evaluation gave a non-finite loss at iteration 3" in str(e.value)
    assert f"the last checkpoint, {out / 'ckpt.pt'} (iteration 2), is untouched" in str(e.value)
    assert load_checkpoint(out / "ckpt.pt")["iter"] == 2
    train.main(flags(data_dir, out, "--resume"))  # and it resumes
    assert load_checkpoint(out / "ckpt.pt")["iter"] == 3


# ----------------------------------------------------------------------------- what a run loads and resumes

LOADED = (
    "import sys, train; train.main(sys.argv[1:]); "
    "print([m for m in ('data.recall', 'hf', 'transformers', 'wandb', 'scipy') if m in sys.modules])"
)


@pytest.mark.parametrize(
    "task, loaded",
    [([], []), (["--task=recall", "--recall_share=0.5", "--recall_pairs=2"], ["data.recall"])],
    ids=["plain", "recall task"],
)
@pytest.mark.slow
def test_a_run_imports_the_recall_task_only_when_asked_and_never_the_interop(data_dir, tmp_path, task, loaded):
    # a process of its own: the test session's imports must not count
    proc = run("-c", LOADED, *flags(data_dir, tmp_path / "run", "--max_iters=1", *task), env=ONE_THREAD)
    assert proc.stdout.splitlines()[-1] == str(loaded)


def test_a_resume_takes_the_runs_own_settings_and_only_a_resumable_one_may_change(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    train.main(flags(data_dir, out, "--pos_emb=sinusoidal", "--n_layer=1", "--seed=7", "--max_iters=2"))
    train.main([f"--out_dir={out}", "--resume", "--max_iters=3", "--log_interval=1"])  # nothing else given
    record = json.loads((out / "config.json").read_text())
    assert (record["model"]["pos_emb"], record["model"]["n_layer"], record["train"]["seed"]) == ("sinusoidal", 1, 7)
    assert (record["train"]["max_iters"], record["train"]["log_interval"]) == (3, 1)
    assert load_checkpoint(out / "ckpt.pt")["iter"] == 3
    for typed, named in (
        ("--seed=8", "seed: the run has 7, now 8"),
        ("--pos_emb=rope", "pos_emb: the run has 'sinusoidal', now 'rope'"),
    ):
        with pytest.raises(SystemExit):
            train.main([f"--out_dir={out}", "--resume", "--max_iters=4", typed])
        assert named in one_error_line(capsys)
    train.main([f"--out_dir={out}", "--resume", "--max_iters=4", "--seed=7", "--n_layer=1"])  # typed as the run's
    assert load_checkpoint(out / "ckpt.pt")["iter"] == 4


def test_a_resume_reads_a_setting_its_config_json_records_under_an_older_name(data_dir, tmp_path):
    out = tmp_path / "run"
    train.main(flags(data_dir, out, "--original_len=16", "--max_iters=2"))
    record = json.loads((out / "config.json").read_text())
    record["model"]["rope_original_len"] = record["model"].pop("original_len")  # as a run from before the rename
    (out / "config.json").write_text(json.dumps(record))
    train.main([f"--out_dir={out}", "--resume", "--max_iters=3"])
    assert json.loads((out / "config.json").read_text())["model"]["original_len"] == 16
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert (ckpt["iter"], ckpt["model_config"]["original_len"]) == (3, 16)
    train.main([f"--out_dir={out}", "--resume", "--max_iters=4", "--original_len=16"])  # typed as the run's: no clash
    assert load_checkpoint(out / "ckpt.pt")["iter"] == 4


def test_a_resume_of_a_run_recorded_before_tasks_were_named_keeps_its_recall_task(data_dir, tmp_path):
    out = tmp_path / "run"
    train.main(flags(data_dir, out, "--task=recall", "--recall_share=0.5", "--recall_pairs=2", "--max_iters=2"))
    record = json.loads((out / "config.json").read_text())
    del record["batches"]["task"]  # as a run from before the setting: its recall_share said it trained the task
    (out / "config.json").write_text(json.dumps(record))
    train.main([f"--out_dir={out}", "--resume", "--max_iters=3"])
    batches = json.loads((out / "config.json").read_text())["batches"]
    assert (batches["task"], batches["recall_share"], batches["recall_pairs"]) == ("recall", 0.5, 2)


def test_help_lists_a_tasks_settings_only_where_the_task_is_chosen(capsys):
    train.main(["--help"])
    plain = capsys.readouterr().out
    train.main(["--help", "--task=recall"])
    recall = capsys.readouterr().out
    assert "--task=text" in plain and "--recall_" not in plain and "--probe_" not in plain
    assert "--task=recall" in recall and all(f"--{key}=" in recall for key in Recall.settings)


# ----------------------------------------------------------------------------- bad input battery


@pytest.fixture(scope="module")
def world(data_dir, tmp_path_factory):
    """A trained run and, beside it, every broken thing a user might point train.py at."""
    root = tmp_path_factory.mktemp("battery")
    train.main(flags(data_dir, root / "run", "--max_iters=2"))
    good = (root / "run" / "ckpt.pt").read_bytes()
    ckpt = torch.load(root / "run" / "ckpt.pt", weights_only=True)
    for name in ("corrupt", "truncated", "evil", "weights_only", "empty", "damaged"):
        (root / name).mkdir()
    (root / "damaged" / "config.json").write_text('{"model": {"n_layer": 2}, "train": [')
    shutil.copytree(root / "run", root / "badlog")
    logged = (root / "badlog" / "metrics.jsonl").read_text()
    (root / "badlog" / "metrics.jsonl").write_text("{garbage\n" + logged)
    (root / "corrupt" / "ckpt.pt").write_bytes(random.Random(0).randbytes(4000))
    (root / "truncated" / "ckpt.pt").write_bytes(good[: len(good) // 2])
    torch.save({"model": Payload(root / "pwned"), "model_config": {}}, root / "evil" / "ckpt.pt")
    torch.save({k: ckpt[k] for k in ("model", "model_config")}, root / "weights_only" / "ckpt.pt")
    (root / "afile").write_text("a file, not a folder\n")
    (root / "bad.toml").write_text("n_layer = = 3\n")
    (root / "data" / "notrain").mkdir(parents=True)
    for name in ("meta.json", "val.bin"):
        shutil.copy(data_dir / "shakespeare_char" / name, root / "data" / "notrain")
    (root / "small.txt").write_text("abc ab\nca " * 500)  # a corpus with a five-character vocabulary
    assert (
        prepare.main(["--input", str(root / "small.txt"), "--data_dir", str(root / "data"), "--dataset", "small"]) == 0
    )
    train.main(flags(root / "data", root / "smallrun", "--dataset=small", "--block_size=16", "--max_iters=1"))
    train.main(flags(data_dir, root / "learned", "--pos_emb=learned", "--max_iters=1"))
    train.main(flags(data_dir, root / "muon", "--optimizer=muon", "--max_iters=1"))
    return root


# (case, arguments after the base command, what the one-line message must say); the base command
# resumes the trained run in {root}/run, so every case also checks that nothing there changes; a case that checks a
# fresh run's settings starts one in a new folder instead (a resume refuses any change of those first)
FRESH = ["--resume=false", "--out_dir={root}/fresh"]
BATTERY = [
    ("unknown key", ["--n_layers=3"], "unknown config key 'n_layers'; did you mean 'n_layer'?"),
    ("wrong type", ["--max_iters=ten"], "max_iters='ten' is not a valid int"),
    ("not a bool", ["--resume=maybe"], "resume='maybe' is not a valid bool; use true or false"),
    ("bare non-bool flag", ["--max_iters"], "argument '--max_iters' should look like --key=value"),
    ("unknown pos_emb", ["--pos_emb=rotary"], "pos_emb='rotary' is unknown; choose one of rope, sinusoidal, learned"),
    ("n_embd % n_head", ["--n_embd=30", "--n_head=4"], "n_embd=30 is not divisible by n_head=4"),
    (
        "odd RoPE head size",
        ["--n_embd=6", "--n_head=2"],
        "head size n_embd/n_head=3 times rope_fraction=1.0 gives 3 rotated dims; choose them so this is even",
    ),
    (
        "odd rope_fraction width",
        ["--rope_fraction=0.2"],
        "head size n_embd/n_head=16 times rope_fraction=0.2 gives 3 rotated dims; choose them so this is even",
    ),
    ("dropout out of range", ["--dropout=1"], "dropout=1.0 must lie in [0, 1)"),
    ("block_size > val split", [*FRESH, "--block_size=200000"], "block_size=200000 is too large for the val split"),
    (
        "dataset not prepared",
        [*FRESH, "--dataset=nope"],
        "(meta.json is missing); create it with `python -m data.prepare",
    ),
    (
        "train.bin missing",
        [*FRESH, "--data_dir={root}/data", "--dataset=notrain"],
        "train.bin is missing; create it with",
    ),
    ("max_iters <= 0", ["--max_iters=0"], "max_iters=0 must be a positive integer"),
    ("negative learning rate", ["--learning_rate=-1e-3"], "learning_rate=-0.001 must be a finite number > 0"),
    ("batch size 0", ["--batch_size=0"], "batch_size=0 must be a positive integer"),
    ("beta2 >= 1", ["--beta2=1"], "beta2=1.0 must lie in [0, 1)"),
    ("unknown dtype", ["--dtype=float8"], "dtype='float8' must be one of auto, float32, bfloat16, float16"),
    ("unknown device", ["--device=tpu"], "device='tpu' is unknown; choose auto, cpu, cuda, cuda:N or mps"),
    ("cuda without CUDA", ["--device=cuda"], "device='cuda' is not available on this machine; available: cpu"),
    ("compile without compiler", ["--compile=true", "--device=cpu"], "compile=True on CPU needs a C++ compiler"),
    ("out_dir is a file", ["--out_dir={root}/afile"], "out_dir='{root}/afile' is a file; give a folder path"),
    (
        "fresh run over a checkpoint",
        ["--resume=false"],
        "already holds a run's ckpt.pt; continue it with --resume=true",
    ),
    ("resume without checkpoint", ["--out_dir={root}/empty"], "no checkpoint at '{root}/empty/ckpt.pt'; train first"),
    ("corrupt checkpoint", ["--out_dir={root}/corrupt"], "is not a readable checkpoint, it is truncated or corrupt"),
    (
        "truncated checkpoint",
        ["--out_dir={root}/truncated"],
        "truncated or corrupt (RuntimeError: PytorchStreamReader failed reading zip archive: "
        "failed finding central directory)",
    ),
    ("checkpoint carrying code", ["--out_dir={root}/evil"], "refused to load '{root}/evil/ckpt.pt': it asks to call"),
    ("weights-only checkpoint", ["--out_dir={root}/weights_only"], "lacks optimizer, scaler, iter, best_val_loss, rng"),
    (
        "resume, other model shape",
        ["--n_layer=3", "--n_embd=64"],
        "cannot resume: this command contradicts the run in {root}/run/config.json (n_layer: the run has 2, now 3; "
        "n_embd: the run has 32, now 64); leave them out",
    ),
    (
        "resume, other dataset",
        ["--data_dir={root}/data", "--dataset=small"],
        "dataset: the run has 'shakespeare_char', now 'small'",
    ),
    ("resume, nothing to do", ["--max_iters=2"], "nothing to do: the checkpoint is at iteration 2 and max_iters=2"),
    (
        "resume, other RoPE scaling",
        ["--rope_scaling=linear", "--rope_scaling_factor=2"],
        "rope_scaling: the run has 'none', now 'linear'; rope_scaling_factor: the run has 1.0, now 2.0",
    ),
    ("recall_share out of range", ["--task=recall", "--recall_share=1.5"], "recall_share=1.5 must lie in (0, 1]"),
    ("recall setting without its task", ["--recall_pairs=2"], "recall_pairs'; it is a setting of task=recall: give"),
    (
        "recall in a short block",
        [*FRESH, "--task=recall", "--recall_share=0.5", "--recall_pairs=5", "--block_size=24"],
        "block_size=24 cannot hold 5 needles and their queries (30 tokens)",
    ),
    ("unknown optimizer", ["--optimizer=sgd"], "optimizer='sgd' must be one of adamw, muon"),
    ("no Newton-Schulz steps", ["--optimizer=muon", "--muon_ns_steps=0"], "muon_ns_steps=0 must be a positive integer"),
    ("muon_momentum >= 1", ["--optimizer=muon", "--muon_momentum=1"], "muon_momentum=1.0 must lie in [0, 1)"),
    ("resume, other optimizer", ["--optimizer=muon"], "optimizer: the run has 'adamw', now 'muon'"),
    (
        "resume muon as adamw",
        ["--out_dir={root}/muon", "--optimizer=adamw"],
        "optimizer: the run has 'muon', now 'adamw'",
    ),
    ("resume, other recipe option", ["--qk_norm"], "qk_norm: the run has False, now True"),
    (
        "resume, damaged metrics log",
        ["--out_dir={root}/badlog"],
        "{root}/badlog/metrics.jsonl is damaged: line 1 is not a metrics line ('{{garbage'); delete that line",
    ),
    (
        "resume, damaged config.json",
        ["--out_dir={root}/damaged"],
        "cannot resume: {root}/damaged/config.json is damaged",
    ),
    (
        "init_from another shape",
        ["--resume=false", "--out_dir={root}/ft", "--init_from={root}/run", "--n_embd=64"],
        "init_from={root}/run is another model (n_embd: init_from={root}/run has 32, this run 64); "
        "a fine-tune keeps its architecture and may change only block_size, dropout, original_len, rope_scaling, "
        "rope_scaling_factor",
    ),
    (
        "init_from learned, longer",
        ["--resume=false", "--out_dir={root}/ft", "--init_from={root}/learned", "--pos_emb=learned", "--block_size=64"],
        "block_size=64 is past init_from={root}/learned's learned position table (32 positions)",
    ),
    (
        "init_from missing",
        ["--resume=false", "--out_dir={root}/ft", "--init_from={root}/nowhere"],
        "init_from={root}/nowhere: no such run folder or checkpoint file",
    ),
    (
        "gas not divisible by ranks",
        [*FRESH, "--gradient_accumulation_steps=3", "WORLD_SIZE=2"],
        "gradient_accumulation_steps=3 must be divisible by the number of processes (2)",
    ),
    ("one GPU named for all ranks", ["--device=cuda:1", "WORLD_SIZE=2"], "device='cuda:1' cannot serve 2 processes"),
]
CONFIG_FILE_BATTERY = [  # a first argument that should be a TOML file
    ("unreadable TOML", "{root}/bad.toml", "is not valid TOML: Invalid value (at line 1, column 11)"),
    ("nonexistent config file", "{root}/nope.toml", "config file '{root}/nope.toml' does not exist (configs/ lists"),
    (
        "key=value without --",
        "max_iters=10",
        "config file 'max_iters=10' does not exist; settings go as --max_iters=10",
    ),
]


def snapshot(root):
    """Every file's bytes, but the run locks': who last held one is no part of a run."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != files.LOCK_FILE}


def run_battery_case(world, argv, monkeypatch, capsys):
    for arg in [a for a in argv if a.startswith("WORLD_SIZE=")]:  # a torchrun worker's environment, before any group
        monkeypatch.setenv(*arg.split("="))
        argv.remove(arg)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # as on a machine without a C++ compiler
    if torch.cuda.is_available() and "--device=cuda" in argv:
        pytest.skip("this machine has CUDA")
    before = snapshot(world)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train.main([a.format(root=world) for a in argv])
    assert e.value.code == 1
    message = one_error_line(capsys, prefix="[rank 0] error: " if os.environ.get("WORLD_SIZE") else "error: ")
    assert snapshot(world) == before and not (world / "pwned").exists()
    return message


@pytest.mark.parametrize("case, args, expected", BATTERY, ids=[c[0] for c in BATTERY])
def test_battery(world, data_dir, case, args, expected, monkeypatch, capsys):
    base = flags(data_dir, world / "run", "--resume=true", "--max_iters=4")
    assert expected.format(root=world) in run_battery_case(world, base + args, monkeypatch, capsys)


@pytest.mark.parametrize("case, first, expected", CONFIG_FILE_BATTERY, ids=[c[0] for c in CONFIG_FILE_BATTERY])
def test_battery_config_files(world, data_dir, case, first, expected, monkeypatch, capsys):
    base = flags(data_dir, world / "run", "--resume=true", "--max_iters=4")
    assert expected.format(root=world) in run_battery_case(world, [first, *base], monkeypatch, capsys)


# as real commands: exit status, one stderr line, no traceback (python -m data.prepare and sample.py too)
COMMANDS = [
    ("train: unknown key", ["train.py", "--max_iter=5"], "unknown config key 'max_iter'; did you mean 'max_iters'?"),
    (
        "train: corrupt checkpoint",
        ["train.py", *TINY, "--data_dir={data}", "--out_dir={root}/corrupt", "--resume"],
        "truncated or corrupt",
    ),
    ("prepare: empty corpus", ["-m", "data.prepare", "--input={root}/empty.txt", "--data_dir={root}/data"], "is empty"),
    (
        "prepare: binary corpus",
        ["-m", "data.prepare", "--input={root}/binary.txt", "--data_dir={root}/data"],
        "is not UTF-8 text",
    ),
    (
        "sample: text outside the vocabulary",
        ["sample.py", "--out_dir={root}/smallrun", "--start=ROMEO:"],
        "text contains 5 character(s) outside the vocabulary: 'R', 'O', 'M', 'E', ':'",
    ),
]


@pytest.mark.parametrize("case, args, expected", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.slow
def test_battery_commands(world, data_dir, case, args, expected):
    (world / "empty.txt").write_bytes(b"")
    (world / "binary.txt").write_bytes(bytes(range(256)) * 4)
    before = snapshot(world)
    proc = run(*[a.format(root=world, data=data_dir) for a in args], check=False, env=ONE_THREAD)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expected in lines[0] and "Traceback" not in proc.stderr + proc.stdout
    assert snapshot(world) == before


# ----------------------------------------------------------------------------- fine-tuning keeps L0


def test_a_fine_tune_at_twice_the_context_keeps_every_default_that_is_relative_to_l0(data_dir, tmp_path):
    trained = {}
    for scheme in ("xpos", "rnope", "fire", "rope"):
        train.main(flags(data_dir, tmp_path / scheme, f"--pos_emb={scheme}", "--max_iters=1"))
        yarn = ["--rope_scaling=yarn", "--rope_scaling_factor=2"] if scheme != "fire" else []
        train.main(
            flags(
                data_dir,
                tmp_path / f"{scheme}-ft",
                f"--pos_emb={scheme}",
                "--block_size=64",
                *yarn,
                f"--init_from={tmp_path / scheme}",
                "--max_iters=1",
            )
        )
        trained[scheme] = [
            model_from_checkpoint(load_checkpoint(tmp_path / d / "ckpt.pt")) for d in (scheme, f"{scheme}-ft")
        ]
    for base, tuned in trained.values():
        assert (base.config.block_size, tuned.config.block_size, tuned.config.original_len) == (32, 64, 32)
    (xpos, xpos_ft), (rnope, rnope_ft), (fire, fire_ft), (plain, plain_ft) = trained.values()
    assert xpos.scheme.scale == xpos_ft.scheme.scale == 16  # B = L0 / 2, not block_size / 2
    assert rnope.scheme.window(0) == rnope_ft.scheme.window(0) == 16
    assert fire.scheme.init_threshold == fire_ft.scheme.init_threshold == 8
    at_l0 = scalings.scaled_frequencies(16, 10000.0, "yarn", 2.0, original_len=32)[0].float()
    assert torch.equal(plain_ft.scheme.inv_freq.float(), at_l0)  # YaRN ramps against the L0 the model learned
    assert not torch.equal(at_l0, scalings.scaled_frequencies(16, 10000.0, "yarn", 2.0, original_len=64)[0].float())
    assert torch.equal(
        plain.reconfigure(rope_scaling="yarn", rope_scaling_factor=2.0).scheme.inv_freq,
        plain_ft.scheme.inv_freq,
    )


def test_a_yarn_fine_tune_equals_one_that_set_l0_by_hand_and_another_l0_is_refused(data_dir, tmp_path, capsys):
    train.main(flags(data_dir, tmp_path / "base", "--max_iters=2"))
    tune = [
        "--block_size=64",
        "--rope_scaling=yarn",
        "--rope_scaling_factor=2",
        f"--init_from={tmp_path / 'base'}",
        "--max_iters=2",
    ]
    train.main(flags(data_dir, tmp_path / "kept", *tune))
    train.main(flags(data_dir, tmp_path / "by-hand", *tune, "--original_len=32"))
    kept, by_hand = (load_checkpoint(tmp_path / d / "ckpt.pt") for d in ("kept", "by-hand"))
    assert kept["model_config"] == by_hand["model_config"] and same_tensors(kept["model"], by_hand["model"])
    with pytest.raises(SystemExit):
        train.main(flags(data_dir, tmp_path / "other", *tune, "--original_len=48"))
    assert "original_len=48 contradicts init_from=" in one_error_line(capsys)
