"""What the lab's tools share: runs of a grid of settings x seeds, their folders and settings checks, the fixed
evaluation sets, JSON results written atomically, and the command-line frame.

A run is one train.py training in its own folder, resumed where an interrupted one stopped; its settings are
checked against the folder's before anything trains, so a rerun never mixes two grids; independent runs may train
side by side in worker processes (run_jobs). The lab's tools (ablate, extend, recipe) build on this module and
never on each other.
"""

import contextlib
import json
import multiprocessing
import statistics
import sys
import typing
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

import config
import train
from checkpoint import load_checkpoint
from data.batches import BatchConfig
from data.loader import Batches
from files import atomic_write, open_log, read_log
from model import GPTConfig
from runtime import Runtime, pick_device, pick_dtype

NOT_SETTINGS = ("out_dir", "resume", "progress", "log")  # train fields that do not change a run's result


class Interrupted(Exception):
    """A run stopped before max_iters (Ctrl-C, SIGTERM); rerunning the command resumes it."""


def split_list(text):
    return [s.strip() for s in text.split(",") if s.strip()]


def field_types(cls, names):
    """{name: its type} of the named fields of dataclass cls."""
    hints = typing.get_type_hints(cls)
    return {f: hints[f] for f in names}


def parse_changes(text, types, what="variant"):
    """'name: key=value, key=value; name: ...' -> [(name, {key: value})], the keys those of types ({key: type},
    e.g. field_types of GPTConfig's); what names an entry in errors (a variant, a recipe)."""
    out = []
    for part in filter(str.strip, text.split(";")):
        name, colon, body = (s.strip() for s in part.partition(":"))
        if not colon or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"{what} {part.strip()!r} should look like 'name: key=value, ...', the name made of "
                             f"letters, digits, '-', '_' and '.'")
        overrides = {}
        for item in split_list(body):
            key, eq, value = (s.strip() for s in item.partition("="))
            if key not in types or not eq:
                raise ValueError(f"{what} {name!r}: {item!r} should be key=value, the key one of "
                                 f"{', '.join(types)}")
            overrides[key] = config.coerce(key, value, types[key])
        if not overrides:
            raise ValueError(f"{what} {name!r} changes nothing; give at least one key=value")
        out.append((name, overrides))
    return out


def run_dir(tc, name, seed):
    return Path(tc.out_dir) / "runs" / f"{name}-seed{seed}"


def train_settings(gcfg, tc, bc=None, schedule=None):
    """What determines a run's result: the resolved model, training and batch settings and the schedule's."""
    return {"model": gcfg.asdict(), "train": {k: v for k, v in asdict(tc).items() if k not in NOT_SETTINGS},
            "batches": asdict(bc or BatchConfig()), "schedule": schedule.settings() if schedule else {}}


def check_same_settings(path, settings, saved):
    # a setting newer than the run folder was there at its default (how every option starts)
    defaults = train_settings(GPTConfig(), train.TrainConfig())
    saved = {group: defaults[group] | saved.get(group, {}) for group in settings}
    diff = [f"{group}.{k}: {saved[group].get(k)!r} there, {v!r} now" for group in settings
            for k, v in settings[group].items() if saved[group].get(k) != v]
    if diff:
        raise ValueError(f"{path} was made with other settings ({'; '.join(diff[:4])}); use another out_dir, "
                         f"or delete that run folder to redo it")


def train_run(name, gcfg, tc, out, bc=None, schedule=None):
    """Train (or resume) one run into out, its batches as bc says and on schedule (train.train's defaults: plain
    text, train.Schedule); its summary. Raises Interrupted when training stopped early."""
    ckpt_path = out / "ckpt.pt"
    at = load_checkpoint(ckpt_path)["iter"] if ckpt_path.is_file() else 0
    if at < tc.max_iters:  # else training ended and only the summary is missing
        out.mkdir(parents=True, exist_ok=True)
        with open_log(out / "train.log") as log, contextlib.redirect_stdout(log):
            train.train(gcfg, replace(tc, out_dir=str(out), resume=at > 0, progress=False), bc, schedule)
        at = load_checkpoint(ckpt_path)["iter"]
    if at < tc.max_iters:
        raise Interrupted(f"run {out.name} stopped at iteration {at} of {tc.max_iters}")
    # a resumed run's log was trimmed back to its checkpoint and its elapsed_s continues: one line per iteration
    metrics = {m["iter"]: m for m in read_log(out / "metrics.jsonl")}
    final = metrics[tc.max_iters]
    return {"scheme": name, "seed": tc.seed, "settings": train_settings(gcfg, tc, bc, schedule),
            "final_val_loss": final["val_loss"],
            "val_bpb": final["val_bpb"], "train_s": final["elapsed_s"],
            "tokens_per_s": statistics.median(m["tokens_per_s"] for m in metrics.values()),
            # the scheduled evaluations only: a stop and its resume add one at the stop
            "val_curve": [[it, m["val_loss"]] for it, m in sorted(metrics.items())
                          if it % tc.eval_interval == 0 or it == tc.max_iters]}


_worker = None  # (run, context) in a worker process of run_jobs


def _start_worker(run, make, settings, threads):
    global _worker
    torch.set_num_threads(threads)
    _worker = run, make(*settings)


def _in_worker(job):
    run, context = _worker
    return run(context, job)


def run_jobs(jobs, run, context, rebuild, workers=1, needs=lambda job: None, label=str, desc="runs", progress=True):
    """{job: run(context, job)} for every job, in list order as far as needs(job) (the job it waits for, earlier in
    jobs; None: none) allows. workers > 1 runs that many at a time, each in a process of its own with its own
    context, make(*settings) for rebuild = (make, settings), and an equal share of this process's CPU threads: a
    small model's matmuls leave cores idle that a second run fills."""
    done = {}
    with tqdm(total=len(jobs), desc=desc, unit="run", dynamic_ncols=True, disable=not progress) as bar:
        if workers == 1:
            for job in jobs:
                bar.set_postfix_str(label(job))
                done[job] = run(context, job)
                bar.update()
            return done
        waiting, running = list(jobs), {}
        threads = max(1, torch.get_num_threads() // workers)
        # spawn, not fork: a forked copy of a process whose OpenMP threads have started can hang
        with ProcessPoolExecutor(workers, multiprocessing.get_context("spawn"), _start_worker,
                                 (run, *rebuild, threads)) as pool:
            while waiting or running:
                for job in [j for j in waiting if needs(j) is None or needs(j) in done][:workers - len(running)]:
                    waiting.remove(job)
                    running[pool.submit(_in_worker, job)] = job
                bar.set_postfix_str(", ".join(map(label, running.values())))
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    done[running.pop(future)] = future.result()
                    bar.update()
    return done


def eval_sets(dataset_dir, meta, lengths, n_tokens, tokens_per_forward, device):
    """{L: Batches whose fixed validation set holds about n_tokens in windows of L tokens}. Batches draws
    that set from EVAL_SEED alone, so every model of the grid is scored on the same windows."""
    sets = {}
    for L in lengths:
        rows = max(1, tokens_per_forward // L)  # windows per forward: long ones cost O(L^2) attention memory
        try:  # (seed 0: these Batches' training batches are never drawn)
            sets[L] = Batches(dataset_dir, meta, L, rows, 0, device, eval_iters=max(1, n_tokens // (rows * L)))
        except ValueError as e:  # the window does not fit a split
            raise ValueError(f"eval length {L} does not fit the data: {e}; use smaller eval_lengths") from None
    return sets


@torch.no_grad()
def position_losses(model, batches, rt):
    """(L,) float64 mean loss at each position 0..L-1 over the fixed validation windows of batches."""
    total, n = torch.zeros(batches.block_size, dtype=torch.float64), 0
    for x, y in batches.eval_batches("val"):  # (B, L) each
        with rt.autocast():
            loss = model(x, y, reduction="none")[1]  # (B, L)
        total += loss.sum(0).double().cpu()
        n += len(y)
    return total / n


def write_json(path, obj):
    """Write atomically: these files mark a finished step, so a half-written one must never exist."""
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=1) + "\n").encode()))


def command(argv, doc, settings, run):
    """The main of a tool that trains many runs (ablate.py, extend.py): --help from doc and the settings classes
    (its own, GPTConfig, TrainConfig, BatchConfig), else run(*their parsed values); a bad setting or a diverging
    run is one line and exit 1, an interruption exit 130 with the hint that rerunning resumes."""
    argv = sys.argv[1:] if argv is None else argv
    classes = (settings, GPTConfig, train.TrainConfig, BatchConfig)
    if "-h" in argv or "--help" in argv:
        print(doc + config.help_text(*classes))
        return
    try:
        run(*config.parse(argv, *classes))
    except ValueError as e:  # bad settings, and a diverging run (train.Divergence)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"\ninterrupted{': ' + str(e) if str(e) else ''}; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)


def numbers(key, text, kind, low, example):
    """A comma-separated list of numbers of kind, each >= low, sorted and distinct."""
    values = sorted({config.coerce(key, v, kind) for v in split_list(text)})
    if not values or values[0] < low:
        raise ValueError(f"{key}={text!r} must list numbers >= {low}, e.g. {example}")
    return values


def evaluated(path, compute):
    """The JSON at path, computed and written (atomically: it marks a finished step) the first time."""
    if not path.is_file():
        obj = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, obj)
    return json.loads(path.read_text())


def eval_runtime(tc):
    """The device and precision the lab evaluates in: the training settings', without compile or DDP."""
    device, _ = pick_device(tc.device)
    return Runtime(device, pick_dtype(tc.dtype, device.split(":")[0]), compile=False)
