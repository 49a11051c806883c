"""lab/grid.py and lab/slurm.py: the parsing of grid entries, the fixed evaluation sets and the per-position losses;
launching a grid's runs here, in worker processes or as Slurm jobs (submitit's local executor stands in for Slurm),
and stopping them: signals, a killed worker or job, damaged run files."""

import contextlib
import json
import operator
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

import config
import train
from checkpoint import load_checkpoint
from config import opt
from conftest import ONE_THREAD, ROOT, TINY, last_logged, same_tensors, wait_for
from data.batches import BatchConfig
from data.tokenizer import load_meta
from lab import ablate, evaluation, grid, launch, pool, sweep
from model import GPT, GPTConfig
from runtime import Runtime

KEYS = (
    grid.field_types(GPTConfig, ("rope_base", "rope_fraction", "rope_layout"))
    | grid.field_types(ablate.DroPE, ("drop_rope_at",)),
)


def test_changes_parse_into_typed_overrides():
    assert grid.parse_changes(" b500: rope_base=500 ; half:rope_fraction=0.5, rope_layout=half", *KEYS) == [
        ("b500", {"rope_base": 500.0}),
        ("half", {"rope_fraction": 0.5, "rope_layout": "half"}),
    ]
    assert grid.parse_changes("drope: drop_rope_at=800", *KEYS) == [("drope", {"drop_rope_at": 800})]
    with pytest.raises(ValueError, match="rope_base"):
        grid.parse_changes("b: rope_base=ten", *KEYS)
    with pytest.raises(ValueError, match="^recipe 'rope_base=500' should look like 'name: key=value"):
        grid.parse_changes("rope_base=500", *KEYS, what="recipe")
    with pytest.raises(ValueError, match="key=value, the key one of rope_base"):
        grid.parse_changes("b: n_layer=3", *KEYS)


def test_numbers_are_sorted_distinct_and_bounded():
    assert grid.numbers("factors", "4, 2,2", float, 1.0, "2,4") == [2.0, 4.0]
    with pytest.raises(ValueError, match=r"factors='0.5' must list finite numbers >= 1.0, e.g. 2,4"):
        grid.numbers("factors", "0.5", float, 1.0, "2,4")


def test_a_run_folder_from_before_tasks_were_named_is_checked_as_the_task_it_trained(tmp_path):
    settings = grid.train_settings(GPTConfig(), train.TrainConfig(), BatchConfig.chosen("recall")(recall_share=0.5))
    saved = json.loads(json.dumps(settings))  # as its config.json records them
    del saved["batches"]["task"]  # recorded before the setting: its recall_share says it trained the task
    grid.check_same_settings(tmp_path, settings, saved)
    saved["batches"]["recall_share"] = 0.0  # text alone
    with pytest.raises(ValueError, match="batches.task: 'text' there, 'recall' now"):
        grid.check_same_settings(tmp_path, settings, saved)


def scored(data_dir):
    """(batches of 12-token validation windows, 48 tokens in all, 2 a forward; a tiny model; a float32 runtime; the
    windows' (x, y), (4, 12) each)."""
    meta = load_meta(data_dir / "shakespeare_char")
    (batches,) = evaluation.eval_sets(data_dir / "shakespeare_char", meta, [12], 48, 24, "cpu").values()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=meta["vocab_size"])).eval()
    x, y = map(torch.cat, zip(*batches.eval_batches("val"), strict=True))
    return batches, model, Runtime("cpu", torch.float32, False), x, y


def test_position_losses_match_the_model_loss_on_each_prefix(data_dir):
    # the loss at position p is the model's mean loss on prefixes of length p+1, times p+1, minus that of length p:
    # an independent route (causality + the model's own loss) to check the per-position bookkeeping
    batches, model, runtime, x, y = scored(data_dir)
    curve = evaluation.position_losses(model, batches, runtime)
    assert len(x) == 4
    with torch.no_grad():
        prefix = [0.0] + [model(x[:, :p], y[:, :p])[1].item() * p for p in range(1, 13)]
    torch.testing.assert_close(curve, torch.tensor(prefix).diff().double(), atol=1e-5, rtol=1e-5)
    # the same windows for every model and every call: drawn from the evaluation seed alone
    assert torch.equal(scored(data_dir)[0].eval_starts["val"], batches.eval_starts["val"])


def test_the_worth_of_context_reads_the_same_last_tokens_from_L0_and_from_the_whole_window(data_dir):
    # an independent route: each window's last L0 // 4 = 2 tokens scored one at a time, from the window's last L0 = 8
    # tokens (positions 4 on) and from the whole prefix, with the model's own loss
    batches, model, runtime, x, y = scored(data_dir)
    worth = evaluation.context_value(model, batches, 8, runtime)
    with torch.no_grad():
        short = [model(x[:, 4 : p + 1], y[:, 4 : p + 1], reduction="none")[1][:, -1] for p in (10, 11)]
        whole = [model(x[:, : p + 1], y[:, : p + 1], reduction="none")[1][:, -1] for p in (10, 11)]
    assert worth["L0"] == pytest.approx(torch.stack(short).double().mean().item(), abs=1e-6)
    assert worth["whole"] == pytest.approx(torch.stack(whole).double().mean().item(), abs=1e-6)
    assert worth["L0"] != worth["whole"]  # the longer context changes what the model predicts


def test_a_cached_evaluation_follows_the_settings_it_read_and_where_its_model_is_gone_names_them(tmp_path):
    path, calls = tmp_path / "run" / "step2.json", []

    def compute(value):
        def work():
            calls.append(value)
            return {"hits": value}

        return work

    def gone():
        raise grid.Gone("the model it scores, at iteration 2, is gone")

    assert grid.evaluated(path, compute(1), {"probe_trials": 2, "windows": (64,)}) == {"hits": 1}
    assert grid.evaluated(path, compute(9), {"probe_trials": 2, "windows": [64]}) == {"hits": 1}  # as recorded
    assert json.loads(path.read_text()) == {"hits": 1, grid.MADE_WITH: {"probe_trials": 2, "windows": [64]}}
    assert grid.evaluated(path, compute(3), {"probe_trials": 3, "windows": [64]}) == {"hits": 3}  # made again
    assert calls == [1, 3] and json.loads(path.read_text())[grid.MADE_WITH]["probe_trials"] == 3
    with pytest.raises(ValueError) as refused:
        grid.evaluated(path, gone, {"probe_trials": 4, "windows": [64]})
    assert str(refused.value) == (
        f"{path} was made with other settings (probe_trials: 3 there, 4 now) and cannot be made again: the model it "
        f"scores, at iteration 2, is gone; use another out_dir, or delete {path.parent} to redo that run"
    )
    assert json.loads(path.read_text())["hits"] == 3  # left as it was
    path.write_text(json.dumps({"hits": 5}))  # made before copies recorded their settings: kept where it must be
    assert grid.evaluated(path, gone, {"probe_trials": 4}) == {"hits": 5}
    assert grid.evaluated(path, compute(6), {"probe_trials": 4}) == {"hits": 6}  # and made again where it can be


def test_a_run_folder_that_moved_with_its_source_is_the_same_and_another_source_is_refused(tmp_path):
    def settings(lab, source, data="/data"):
        train_cfg = train.TrainConfig(out_dir=str(lab / "sweep" / "ft"), init_from=str(source), data_dir=data)
        return grid.train_settings(GPTConfig(), train_cfg)

    old, new = tmp_path / "scratch" / "lab", tmp_path / "archive" / "lab"
    saved = settings(old, old / "base" / "b1")
    saved["train"]["out_dir"] = str(old / "sweep" / "ft")  # as train.py records it: where the folder was
    out = new / "sweep" / "ft"
    out.mkdir(parents=True)
    grid.write_json(out / "config.json", saved)
    grid.check_run(out, settings(new, new / "base" / "b1"))  # moved with its base
    grid.check_run(out, settings(new, old / "base" / "b1"))  # the base where it was, named by that path
    for source, data, named in [(new / "base" / "b2", "/data", "init_from"), (new / "base" / "b1", "/d", "data_dir")]:
        with pytest.raises(ValueError, match=f"was made with other settings \\(train.{named}: '[^;]*' now\\);"):
            grid.check_run(out, settings(new, source, data))


# ----------------------------------------------------------------------------- launching: a toy lab tool


@dataclass
class Toy(launch.LaunchSettings):
    runs: str = opt("a,b", "the toy grid's runs, at seed 1; ft-X fine-tunes run X; bad fails (no such dataset)")


def toy_run(context, job):
    """A tiny run of the toy grid: its summary, computed once (summary.json) as the lab tools do."""
    model_cfg, train_cfg = context
    name, seed = job
    out = Path(train_cfg.out_dir) / name
    train_cfg = replace(
        train_cfg,
        seed=seed,
        dataset="nowhere" if name == "bad" else train_cfg.dataset,
        init_from=str(Path(train_cfg.out_dir) / name[3:]) if name.startswith("ft-") else "",
    )
    return grid.evaluated(out / "summary.json", lambda: grid.train_run(name, model_cfg, train_cfg, out), {})


def toy_needs(job):
    name, seed = job
    return (name.removeprefix("ft-"), seed) if name.startswith("ft-") else None


def toy_label(job):
    return f"{job[0]} seed {job[1]}"


def toy_context(model_cfg, train_cfg):
    return model_cfg, train_cfg


def toy(settings, model_cfg, train_cfg, batch_cfg=None):  # launch.command hands a BatchConfig too: plain text here
    jobs = [(name, 1) for name in grid.split_list(settings.runs)]
    return launch.run_jobs(
        jobs,
        toy_run,
        (model_cfg, train_cfg),
        (toy_context, (model_cfg, train_cfg)),
        settings,
        needs=toy_needs,
        pending=lambda job: not (Path(train_cfg.out_dir) / job[0] / "summary.json").is_file(),
        label=toy_label,
        progress=False,
    )


def toy_main(argv=None):
    launch.command(argv, "the toy grid of tests/test_grid.py\n", Toy, toy)


def toy_args(data_dir, out, *more):
    return [*TINY, f"--data_dir={data_dir}", f"--out_dir={out}", *more]


def toy_results(data_dir, out, *more):
    """toy()'s results, here and now."""
    return toy(*config.parse(toy_args(data_dir, out, *more), Toy, GPTConfig, train.TrainConfig))


def comparable(summary):
    """A run summary less its timings and its settings (whose init_from names the grid's folder)."""
    return {k: v for k, v in summary.items() if k not in ("train_s", "tokens_per_s", "settings")}


def test_launch_settings_are_checked_in_one_line():
    for bad, named in (
        ({"launcher": "pbs"}, "launcher='pbs' must be one of local, slurm"),
        ({"workers": 0}, "workers=0 must be a positive integer"),
        ({"slurm_gpus": -1}, "slurm_gpus=-1 must be a finite number >= 0"),
        ({"slurm_time": 0}, "slurm_time=0 must be a positive integer"),
    ):
        with pytest.raises(ValueError, match=named):
            launch.LaunchSettings(**bad)


def test_a_dry_run_prints_the_arrays_it_would_submit(data_dir, tmp_path, capsys):
    toy_results(data_dir, tmp_path, "--runs=a", "--max_iters=2", "--eval_interval=2")  # finished: read, not submitted
    toy_main(
        toy_args(
            data_dir,
            tmp_path,
            "--runs=a,b,ft-b",
            "--launcher=slurm",
            "--dry_run",
            "--slurm_partition=gpu",
            "--slurm_gpus=2",
            "--slurm_cpus=4",
            "--slurm_time=30",
            "--slurm_array_parallelism=5",
            f"--slurm_folder={tmp_path / 'logs'}",
            "--max_iters=2",
            "--eval_interval=2",
        )
    )
    assert capsys.readouterr().out.splitlines() == [
        "dry run: Slurm jobs named 'runs', each 2 GPU(s), 4 CPUs, the partition's default memory and 30 min on "
        f"partition gpu, at most 5 of an array at once; logs in {tmp_path / 'logs'}/",
        "2 jobs (1 of the 3 runs finished already)",
        "  array 1, submitted at once, 1 jobs: b seed 1",
        "  array 2, each submitted once the run it needs is done, 1 jobs: ft-b seed 1",
        "in all at most 2 jobs of 30 min: 2 GPU-hours and 4 CPU-hours requested (a job requeued requests its time "
        "again)",
    ]
    assert not (tmp_path / "b").exists() and not (tmp_path / "logs").exists()


def test_a_damaged_run_file_is_redone_or_named_with_the_command_that_redoes_it(data_dir, tmp_path, capsys, monkeypatch):
    first = toy_results(data_dir, tmp_path, "--runs=a", "--max_iters=2", "--eval_interval=2")
    summary = tmp_path / "a" / "summary.json"
    summary.write_text(summary.read_text()[:100])  # truncated, as a full device leaves a file written in place
    assert toy_results(data_dir, tmp_path, "--runs=a", "--max_iters=2", "--eval_interval=2") == first
    assert f"{summary} cannot be read (" in capsys.readouterr().err  # and computed again from the checkpoint
    summary.write_text("{")
    monkeypatch.setattr(sys, "argv", ["lab/toy.py", "--runs=a"])
    with pytest.raises(SystemExit) as stop:
        launch.command(None, "", Toy, lambda *_: grid.read_json(summary, delete=summary.parent))
    assert stop.value.code == 1
    assert capsys.readouterr().err == (
        f"error: {summary} cannot be read (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
        f"; delete {summary.parent} and rerun the same command to redo that run (python lab/toy.py --runs=a)\n"
    )


def test_a_damaged_metrics_log_is_named_not_a_traceback(data_dir, tmp_path):
    toy_results(data_dir, tmp_path, "--runs=a", "--max_iters=4", "--eval_interval=2")
    (tmp_path / "a" / "summary.json").unlink()  # so that the summary is made again from the log
    log = tmp_path / "a" / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:2] + ['{"garbage": true}'] + lines[3:]) + "\n")  # a line in the middle
    with pytest.raises(ValueError, match=f"^{log} is damaged: line 3 is not a metrics line"):
        toy_results(data_dir, tmp_path, "--runs=a", "--max_iters=4", "--eval_interval=2")
    log.write_text("\n".join(line.replace('"val_loss"', '"lost"') for line in lines) + "\n")  # an edited value
    with pytest.raises(pool.Failed, match=f"^{log} is damaged .*; delete {tmp_path / 'a'} and rerun"):
        toy_results(data_dir, tmp_path, "--runs=a", "--max_iters=4", "--eval_interval=2")


def test_a_broken_submitit_is_one_line(data_dir, tmp_path, monkeypatch, capsys):
    broken = tmp_path / "site" / "submitit"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('half-installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "submitit", raising=False)
    monkeypatch.delitem(sys.modules, "lab.slurm", raising=False)
    with pytest.raises(SystemExit) as stop:
        toy_main(toy_args(data_dir, tmp_path, "--runs=a", "--launcher=slurm", "--max_iters=2", "--eval_interval=2"))
    assert stop.value.code == 1 and capsys.readouterr().err == (
        "error: launcher=slurm needs the submitit package, which is installed but fails to import (RuntimeError: "
        "half-installed); reinstall it: pip install submitit\n"
    )


class Bar:
    """What the launchers ask of their tqdm bar, counting the results."""

    total, n = 0, 0

    def update(self, k=1):
        self.n += k

    def set_postfix_str(self, text):
        pass


def launch_growing(workers, more):
    """Jobs 1 and 2, then what more(done) asks for, each job running operator.add(0, job): here with 1 worker, else
    in worker processes. ({job: result}, the bar)."""
    bar = Bar()
    if workers == 1:
        return pool.in_process([1, 2], operator.add, 0, str, bar, more), bar
    return pool.in_workers([1, 2], operator.add, (int, (0,)), workers, lambda job: None, str, bar, more), bar


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.slow
def test_a_launch_grows_with_the_jobs_its_results_call_for_each_run_once(workers):
    asked = []

    def more(done):
        asked.append(sorted(done))
        return [1, 2, *([3] if 1 in done else []), *([4] if 3 in done else [])]

    done, bar = launch_growing(workers, more)
    assert done == {1: 1, 2: 2, 3: 3, 4: 4} and asked[-1] == [1, 2, 3, 4]
    assert bar.n == 4 and bar.total == 4  # no job ran twice
    if workers == 1:  # in workers, two results may arrive in one look, and are then asked about together
        assert asked == [[1], [1, 2], [1, 2, 3], [1, 2, 3, 4]]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.slow
def test_an_error_in_what_a_launch_asks_for_next_is_raised(workers):
    def more(done):
        raise ValueError("1 of the 3 test seeds screened (screen_most) passed the gate")

    with pytest.raises(ValueError, match="screen_most"):
        launch_growing(workers, more)


# ----------------------------------------------------------------------------- local workers: stopping them


def descendants(pid):
    """The process ids under pid (its workers, multiprocessing's resource tracker), from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rpartition(")")[2].split()[1])
    found, todo = [], [pid]
    while todo:
        pid = todo.pop()
        kids = [p for p, parent in parents.items() if parent == pid]
        found += kids
        todo += kids
    return found


def running(pid):
    """Whether pid is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def holder(out):
    """The process that a run folder's lock names; None while a new holder writes it."""
    with contextlib.suppress(ValueError):
        return json.loads((out / ".lock").read_text())["pid"]


def none_left(pids, timeout=10):
    deadline = time.monotonic() + timeout
    while any(map(running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if running(p)]


@pytest.fixture
def toy_tool(tmp_path):
    """toy_main as a script of its own (its workers re-import it, as they do a lab tool)."""
    script = tmp_path / "toy.py"
    script.write_text(
        f"import sys\nsys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]\nimport test_grid\n\n"
        "if __name__ == '__main__':\n    test_grid.toy_main()\n"
    )
    return script


def start_toy(script, data_dir, out, *more):
    return subprocess.Popen(
        [sys.executable, script, *toy_args(data_dir, out, "--workers=2", *more)],
        cwd=ROOT,
        env=ONE_THREAD,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def both_training(proc, out, runs=("a", "b")):
    wait_for(lambda: all(last_logged(out / r) >= 10 for r in runs), proc)
    return descendants(proc.pid)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.slow
def test_a_signal_to_the_main_process_stops_every_worker_at_a_checkpoint(data_dir, tmp_path, toy_tool, sig):
    out = tmp_path / "grid"
    proc = start_toy(toy_tool, data_dir, out, "--max_iters=2000", "--eval_interval=2000")
    children = both_training(proc, out)
    assert len(children) >= 2  # two workers (and the resource tracker)
    proc.send_signal(sig)  # to the main process alone, as kill PID or a scheduler sends it
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.endswith(
        f"\ninterrupted: {sig.name}: a seed 1, b seed 1 stopped at a checkpoint; rerun the same command "
        f"to resume (python {toy_tool} {' '.join(toy_args(data_dir, out, '--workers=2'))} "
        f"--max_iters=2000 --eval_interval=2000)\n"
    ), err
    assert not none_left(children)
    for run in ("a", "b"):  # each at the step it was on
        assert 10 <= load_checkpoint(out / run / "ckpt.pt")["iter"] < 2000


@pytest.mark.slow
def test_a_worker_that_dies_is_named_and_a_rerun_redoes_its_run(data_dir, tmp_path, toy_tool):
    out, more = tmp_path / "grid", ["--max_iters=200", "--eval_interval=100"]
    proc = start_toy(toy_tool, data_dir, out, *more)
    children = both_training(proc, out)
    os.kill(holder(out / "a"), signal.SIGKILL)  # as the OOM killer does
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith(
        "error: the worker running a seed 1 died (SIGKILL); b seed 1 stopped at a checkpoint; rerun "
        f"the same command to redo that run (python {toy_tool} "
    ), err
    assert not none_left(children)
    killed = out / "a" / "ckpt.pt"  # written only if a reached its step-100 evaluation before the kill
    assert (out / "b" / "ckpt.pt").exists() and (not killed.exists() or load_checkpoint(killed)["iter"] < 200)
    # the rerun (here, one run at a time: the runs' results do not depend on it) redoes a and resumes b
    again = toy_results(data_dir, out, *more)
    assert [again[r, 1]["val_curve"] for r in "ab"] == [again["a", 1]["val_curve"]] * 2


# ----------------------------------------------------------------------------- Slurm, through submitit's local executor


@pytest.fixture
def local_slurm(monkeypatch, tmp_path):
    """launcher=slurm on submitit's local executor: each job a process here, with Slurm's signals and requeue."""
    submitit = pytest.importorskip("submitit")
    from lab import slurm

    monkeypatch.setattr(slurm, "CLUSTER", "local")
    monkeypatch.setattr(submitit.core.core.Job, "_results_timeout_s", 0)  # no shared filesystem to wait for here
    monkeypatch.setattr(slurm, "POLL_S", 0.1)  # the jobs are processes here: a look costs nothing
    return ["--launcher=slurm", "--slurm_gpus=0", "--slurm_cpus=1", f"--slurm_folder={tmp_path / 'logs'}"]


@pytest.mark.slow
def test_a_slurm_grid_gives_what_a_local_run_gives(data_dir, tmp_path, local_slurm):
    grid_args = ["--max_iters=20", "--eval_interval=10"]
    toy_results(data_dir, tmp_path / "slurm", "--runs=a", *grid_args, *local_slurm)
    # a is read from its folder, the fine-tune submitted: its base is done
    on_slurm = toy_results(data_dir, tmp_path / "slurm", "--runs=a,ft-a", *grid_args, *local_slurm)
    here = toy_results(data_dir, tmp_path / "here", "--runs=a,ft-a", *grid_args)
    assert list(on_slurm) == list(here) == [("a", 1), ("ft-a", 1)]
    assert {j: comparable(s) for j, s in on_slurm.items()} == {j: comparable(s) for j, s in here.items()}
    for run in ("a", "ft-a"):
        assert same_tensors(
            load_checkpoint(tmp_path / "slurm" / run / "ckpt.pt")["model"],
            load_checkpoint(tmp_path / "here" / run / "ckpt.pt")["model"],
        )


@pytest.mark.slow
def test_a_slurm_launch_grows_in_rounds(tmp_path, local_slurm):
    """With Slurm, more(done) is asked after each round of jobs, each job once."""
    asked = []

    def more(done):
        asked.append(sorted(done))
        return [1, 2, *([3] if 1 in done else []), *([4] if 3 in done else [])]

    settings = config.parse(local_slurm, launch.LaunchSettings)[0]
    done = launch.run_jobs([1, 2], operator.add, 0, (int, (0,)), settings, more=more, progress=False)
    assert done == {1: 1, 2: 2, 3: 3, 4: 4} and asked == [[1, 2], [1, 2, 3], [1, 2, 3, 4]]


@pytest.mark.slow
def test_a_failed_slurm_job_is_named_with_its_log(data_dir, tmp_path, local_slurm):
    with pytest.raises(pool.Failed) as failed:
        toy_results(data_dir, tmp_path, "--runs=bad,ft-bad", "--max_iters=2", "--eval_interval=2", *local_slurm)
    first, second, last = str(failed.value).splitlines()
    assert first.startswith("run bad seed 1 failed: ValueError: no prepared dataset at ") and "; its log: " in first
    assert Path(first.partition("; its log: ")[2]).is_file()
    assert second == "run ft-bad seed 1 was not submitted: it needs bad seed 1"
    assert last == "rerun the same command to redo them"


SLURM_RUN = ["--max_iters=200", "--eval_interval=50"]


@pytest.fixture(scope="module")
def uninterrupted(data_dir, tmp_path_factory):
    """The weights of the toy's run a, 200 steps, trained here without a stop."""
    out = tmp_path_factory.mktemp("uninterrupted")
    toy_results(data_dir, out, "--runs=a", *SLURM_RUN)
    return load_checkpoint(out / "a" / "ckpt.pt")["model"]


class SignalWhen(threading.Thread):
    """Sends signals to the process training out once ready() holds; join() returns that pid."""

    def __init__(self, ready, out, *signals):
        super().__init__(daemon=True)
        self.ready, self.out, self.signals, self.pid = ready, out, signals, None
        self.start()

    def run(self):
        deadline = time.monotonic() + 120
        while not self.ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.pid = holder(self.out)
        for sig in self.signals:
            os.kill(self.pid, sig)

    def join(self):
        super().join()
        assert self.pid is not None, "no signal sent"
        return self.pid


@pytest.mark.slow
def test_a_killed_slurm_job_is_resumed_by_the_next_submission_and_a_preempted_one_requeued(
    data_dir, tmp_path, local_slurm, uninterrupted
):
    from lab import slurm

    a, args = tmp_path / "a", ["--runs=a", *SLURM_RUN, *local_slurm]
    # killed as a node failure or the OOM killer kills it, a checkpoint at iteration 50 written
    killer = SignalWhen(lambda: last_logged(a) >= 60, a, signal.SIGKILL)
    with pytest.raises(
        pool.Failed,
        match=r"^run a seed 1 failed: it ended without a result \(state .*\); its log: "
        r"\S+_log.err\nrerun the same command to redo them$",
    ):
        toy_results(data_dir, tmp_path, *args)
    killed, left = killer.join(), last_logged(a)
    assert 50 <= load_checkpoint(a / "ckpt.pt")["iter"] < 200
    # resubmitted, it resumes and is preempted: SIGTERM, then submitit's signal, as Slurm sends them (the log, trimmed
    # back to the checkpoint on resuming, grows past where the killed job left it)
    preempter = SignalWhen(
        lambda: holder(a) not in (None, killed) and last_logged(a) > left + 10, a, signal.SIGTERM, slurm.PREEMPT
    )
    results = toy_results(data_dir, tmp_path, *args)  # the same submission: the job is requeued within it
    preempter.join()
    log = (a / "train.log").read_text()
    stopped = int(log.partition("stop requested: finishing at iteration ")[2].split()[0])
    assert left + 10 < stopped < 200 and f"resuming from {a / 'ckpt.pt'} at iteration {stopped}" in log
    assert results[("a", 1)]["val_curve"][-1] == [200, results[("a", 1)]["final_val_loss"]]
    assert same_tensors(load_checkpoint(a / "ckpt.pt")["model"], uninterrupted)


def test_the_slurm_settings_reach_the_sbatch_script(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    from lab import slurm

    settings = launch.LaunchSettings(
        launcher="slurm",
        slurm_partition="gpu",
        slurm_gpus=2,
        slurm_cpus=4,
        slurm_time=30,
        slurm_array_parallelism=2,
        slurm_folder=str(tmp_path / "logs"),
    )
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    if shutil.which("sbatch") is None:  # no Slurm here: launcher=slurm says so
        with pytest.raises(ValueError, match="^launcher=slurm needs Slurm's sbatch and srun, not on PATH here; "):
            slurm.executor(settings, "toy")
    # stand-ins for Slurm's commands: sbatch keeps the script it is given and answers as Slurm does
    for name, text in (("sbatch", 'cp "$1" "$SBATCH_COPY"; echo "Submitted batch job 4242"'), ("srun", "")):
        (fake_bin / name).write_text(f"#!/bin/sh\n{text}\n")
        (fake_bin / name).chmod(0o755)
    monkeypatch.setenv("SBATCH_COPY", str(tmp_path / "sbatch.sh"))
    jobs = slurm.submit(
        slurm.executor(settings, "toy"), [slurm.Task(toy_run, (toy_context, ()), (r, 1), 4) for r in "abc"]
    )
    assert [job.job_id for job in jobs] == ["4242_0", "4242_1", "4242_2"]
    flags = {
        line.split()[1] for line in (tmp_path / "sbatch.sh").read_text().splitlines() if line.startswith("#SBATCH")
    }
    assert {
        "--partition=gpu",
        "--gpus-per-node=2",
        "--cpus-per-task=4",
        "--time=30",
        "--array=0-2%2",
        "--nodes=1",
        "--job-name=toy",
        f"--signal={slurm.PREEMPT.name.removeprefix('SIG')}@90",
    } <= flags, flags
    (fake_bin / "sbatch").write_text('#!/bin/sh\necho "sbatch: error: invalid partition specified: gpu" >&2; exit 1\n')
    with pytest.raises(ValueError, match="^sbatch refused the jobs: sbatch: error: invalid partition specified: gpu$"):
        slurm.submit(slurm.executor(settings, "toy"), [slurm.Task(toy_run, (toy_context, ()), ("a", 1), 4)])


def test_a_sweep_widens_past_the_edge_its_best_lies_on_and_stops_at_its_most():
    assert sweep.widen([0.5, 1, 2], 2, 5) == 4.0 and sweep.widen([0.5, 1, 2], 0.5, 5) == 0.25
    assert sweep.widen([0.5, 1, 2], 1, 5) is None  # the best inside: nothing to widen
    assert sweep.widen([0.25, 0.5, 1, 2, 4], 4, 5) is None and sweep.widen([1], 1, 5) is None
    assert sweep.widen([1e-3, 3e-3, 9e-3], 9e-3, 5) == 0.027  # named as its run folder will be


def test_the_resume_hint_retypes_a_module_run_as_python_dash_m(monkeypatch):
    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name="lab.ablate")
    monkeypatch.setattr(sys, "argv", ["/repo/lab/ablate.py", "configs/ablate_cpu.toml", "--out_dir=a b"])
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert launch.this_command() == "python -m lab.ablate configs/ablate_cpu.toml '--out_dir=a b'"
    main.__spec__ = None  # run as a script: its path stays
    assert launch.this_command() == "python /repo/lab/ablate.py configs/ablate_cpu.toml '--out_dir=a b'"


def test_results_record_paths_relative_to_the_project_and_no_committed_file_names_a_machine(tmp_path):
    settings = {"train": {"data_dir": str(grid.PROJECT / "data"), "init_from": "hf:gpt2", "seed": 1}, "model": {}}
    assert grid.portable(settings) == {"train": {"data_dir": "data", "init_from": "hf:gpt2", "seed": 1}, "model": {}}
    elsewhere = grid.portable({"train": {"data_dir": str(tmp_path), "init_from": ""}})["train"]
    assert not os.path.isabs(elsewhere["data_dir"]) and os.path.samefile(grid.PROJECT / elsewhere["data_dir"], tmp_path)
    assert settings["train"]["data_dir"] == str(grid.PROJECT / "data")  # the settings given are not changed
    for path in ROOT.glob("docs/*/results.json"):
        train_settings = json.loads(path.read_text())["settings"]["train"]
        assert not any(os.path.isabs(str(train_settings.get(key) or "")) for key in ("data_dir", "init_from")), path
