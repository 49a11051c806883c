"""What the lab's tools share: runs of a grid of settings x seeds, their folders and settings checks, where they
train (LaunchSettings, run_jobs), the fixed evaluation sets, JSON results written atomically and read back with
errors that name the file, and the command-line frame.

A run is one train.py training in its own folder, resumed where an interrupted one stopped; its settings are
checked against the folder's before anything trains, so a rerun never mixes two grids. Independent runs may train
side by side in worker processes, or as Slurm jobs (lab/slurm.py); whichever way, SIGINT or SIGTERM stops every run
at a checkpoint and rerunning the command resumes them. The lab's tools (ablate, extend, recipe) build on this
module and never on each other.
"""

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import shlex
import signal
import statistics
import sys
import threading
import time
import traceback
import typing
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

import config
import train
from checkpoint import load_checkpoint
from data.batches import BatchConfig
from data.loader import Batches
from config import opt
from files import atomic_write, open_log, read_log
from model import GPTConfig
from runtime import Runtime, pick_device, pick_dtype

NOT_SETTINGS = ("out_dir", "resume", "progress", "log")  # train fields that do not change a run's result
LAUNCHERS = ("local", "slurm")
STOP_WAIT_S = 60  # for a worker to finish its step, evaluate and write its checkpoint; then it is killed


class Interrupted(Exception):
    """A run stopped before max_iters (Ctrl-C, SIGTERM); rerunning the command resumes it."""


class Failed(ValueError):
    """Runs that could not finish (a worker that died, a Slurm job that failed, a run file that cannot be read);
    the message names each and ends with what rerunning the same command does."""


class DryRun(Exception):
    """run_jobs was asked only to print what it would launch, and has; command() exits 0."""


@dataclass
class LaunchSettings:
    """Where a grid's runs train; every lab tool's settings class inherits these (as --key=value and TOML keys)."""
    launcher: str = opt("local", "local: on this machine, `workers` at a time; slurm: each run not yet finished as "
                                 "a Slurm job, in job arrays submitted through submitit (the slurm_* settings)",
                        check=config.one_of(LAUNCHERS))
    workers: int = opt(1, "runs trained at a time by the local launcher, each in a process with an equal share of the "
                          "CPU threads (2 on 2 CPU cores, which one small model's run leaves partly idle; 1 on a GPU)",
                       check=config.POSITIVE)
    dry_run: bool = opt(False, "print what would be launched (with slurm: the job arrays and their resources); train "
                               "nothing")
    slurm_partition: str = opt("", "Slurm partition of the jobs (empty: the cluster's default)")
    slurm_gpus: int = opt(1, "GPUs per Slurm job (one run each)", check=config.NON_NEGATIVE)
    slurm_cpus: int = opt(8, "CPUs per Slurm job, which torch's threads use", check=config.POSITIVE)
    slurm_time: int = opt(240, "time limit of a Slurm job in minutes; a run that needs longer stops at a checkpoint "
                               "before it and is requeued, up to 3 times (then rerun the command)",
                          check=config.POSITIVE)
    slurm_array_parallelism: int = opt(64, "Slurm jobs of one array that may run at the same time",
                                       check=config.POSITIVE)
    slurm_folder: str = opt("slurm_logs", "folder of submitit's job files and the jobs' logs")

    def __post_init__(self):
        config.validate(self)


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


def run_jobs(jobs, run, context, rebuild, launch, needs=lambda job: None, pending=lambda job: True, label=str,
             desc="runs", progress=True):
    """{job: run(context, job)} for every job, in list order as far as needs(job) (the job it waits for, earlier in
    jobs; None: none) allows, where launch (LaunchSettings) says:
    - local with 1 worker: here, one after another;
    - local with workers > 1: that many at a time, each in a worker process of its own with its own context,
      make(*settings) for rebuild = (make, settings), and an equal share of this process's CPU threads (a small
      model's matmuls leave cores idle that a second run fills);
    - slurm: each job with work left (pending(job)) as a Slurm job that builds its context the same way
      (lab/slurm.py); the others, whose run folders hold their results, are read here.
    SIGINT or SIGTERM stops every run at a checkpoint and raises Interrupted; a worker that dies or a Slurm job that
    fails raises Failed naming its run. With dry_run it prints what it would launch and raises DryRun."""
    if isinstance(launch, int):  # a bare worker count, as the lab tools passed it before LaunchSettings
        launch = LaunchSettings(workers=launch)
    if launch.dry_run:
        print(launch_plan(jobs, launch, needs, pending, label, desc))
        raise DryRun
    with tqdm(total=len(jobs), desc=desc, unit="run", dynamic_ncols=True, disable=not progress) as bar:
        if launch.launcher == "slurm":
            todo = [job for job in jobs if pending(job)]
            done = in_process([job for job in jobs if job not in todo], run, context, label, bar)
            return done | (slurm_module().run_jobs(todo, run, rebuild, launch, needs, label, desc, bar) if todo else {})
        if launch.workers == 1:
            return in_process(jobs, run, context, label, bar)
        return in_workers(jobs, run, rebuild, launch.workers, needs, label, bar)


def slurm_module():
    """lab/slurm.py, which needs submitit: an optional package, imported only where it is asked for."""
    try:
        from lab import slurm
    except ModuleNotFoundError as e:
        if e.name != "submitit":
            raise
        raise ValueError("launcher=slurm submits through submitit, which is not installed: pip install submitit") \
            from None
    return slurm


def launch_plan(jobs, launch, needs, pending, label, desc):
    """What run_jobs would launch, for dry_run: the runs, and with slurm the job arrays, their resources and logs."""
    if launch.launcher == "local":
        return f"dry run: {len(jobs)} runs here, {launch.workers} at a time: " + ", ".join(map(label, jobs))
    todo = [job for job in jobs if pending(job)]
    depth = {}
    for job in todo:  # needs come earlier in jobs; a need that is finished already waits for nothing
        depth[job] = depth[needs(job)] + 1 if needs(job) in depth else 0
    where = f"partition {launch.slurm_partition}" if launch.slurm_partition else "the default partition"
    lines = [f"dry run: {len(todo)} Slurm jobs named {desc!r} ({len(jobs) - len(todo)} of the {len(jobs)} runs finished "
             f"already), each {launch.slurm_gpus} GPU(s), {launch.slurm_cpus} CPUs and {launch.slurm_time} min on "
             f"{where}, at most {launch.slurm_array_parallelism} of an array at once; logs in {launch.slurm_folder}/"]
    for level in sorted(set(depth.values())):
        group = [label(job) for job in todo if depth[job] == level]
        when = "submitted at once" if level == 0 else "each submitted once the run it needs is done"
        lines.append(f"  array {level + 1}, {when}, {len(group)} jobs: {', '.join(group)}")
    return "\n".join(lines)


def in_process(jobs, run, context, label, bar):
    """run_jobs here, one job after another."""
    done = {}
    # SIGINT raises KeyboardInterrupt already; inside train's loop its StopFlag takes both and checkpoints
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        for job in jobs:
            bar.set_postfix_str(label(job))
            done[job] = run(context, job)
            bar.update()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return done


def interrupt(signum, frame):
    """A SIGTERM handler for the work outside train's loop (which stops at a checkpoint itself): raise Interrupted,
    once; a repeat is ignored while it unwinds."""
    signal.signal(signum, signal.SIG_IGN)
    raise Interrupted(signal.Signals(signum).name)


def in_workers(jobs, run, rebuild, workers, needs, label, bar):
    """run_jobs with workers > 1: a worker process per slot; each job is sent to an idle one once its need is done."""
    # spawn, not fork: a forked copy of a process whose OpenMP threads have started can hang
    mp = multiprocessing.get_context("spawn")
    threads = max(1, torch.get_num_threads() // workers)
    done, waiting, pool = {}, list(jobs), []
    stop = Stop(pool, jobs, label)
    with stop:
        try:
            for _ in range(min(workers, len(jobs))):  # a signal meanwhile: the loop below starts nothing
                pool.append(Worker(mp, run, rebuild, threads))
            while True:
                for worker in [w for w in pool if w.idle() and not stop.reason]:
                    ready = [j for j in waiting if needs(j) is None or needs(j) in done]
                    if ready:
                        waiting.remove(ready[0])
                        worker.start(ready[0])
                busy = [w for w in pool if w.job is not None]
                if not busy:
                    break
                bar.set_postfix_str(", ".join(label(w.job) for w in busy))
                alive = [w for w in pool if w.alive]
                # a timeout, so that a stop's deadline is kept whatever the workers do
                multiprocessing.connection.wait([w.conn for w in alive] + [w.process.sentinel for w in alive], 1)
                for worker in alive:
                    stop.heard(worker, done, bar)
                stop.keep_deadline()
        finally:
            shut_down(pool)
    stop.outcome()
    assert not waiting, f"{len(waiting)} jobs wait for a job that is not among the jobs"
    return done


class Worker:
    """A spawned process of in_workers: it builds its context once, then runs each job sent over its pipe."""

    def __init__(self, mp, run, rebuild, threads):
        self.conn, theirs = mp.Pipe()
        self.process = mp.Process(target=serve, args=(theirs, run, *rebuild, threads))
        # SIG_IGN survives exec: a Ctrl-C cannot kill the worker while it starts up (the main process, which acts
        # on it, may miss one pressed within these milliseconds)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.process.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        theirs.close()
        self.job, self.alive, self.killed = None, True, False

    def idle(self):
        return self.alive and self.job is None

    def start(self, job):
        self.job = job
        self.conn.send(job)

    def send_signal(self, sig):
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)

    def news(self):
        """(kind, value) the worker sent, ("died", how) if it ended without a word, else None."""
        if not self.alive or not self.conn.poll():  # a worker that ended leaves its pipe readable: at its end
            return None
        try:
            kind, value = self.conn.recv()
        except (EOFError, ConnectionResetError):  # the pipe closed with the worker, or was cut as it died
            self.process.join()
            code = self.process.exitcode
            kind, value = "died", signal.Signals(-code).name if code < 0 else f"exit status {code}"
        if kind != "done":
            self.alive = False  # a worker that stopped, failed or died is gone
        return kind, value


def serve(conn, run, make, settings, threads):
    """A worker's life: its context, then job after job from conn (None ends it), each answered ("done", result);
    a stop is answered ("interrupted", text), an error ("failed", the exception), and the worker ends."""
    signal.signal(signal.SIGTERM, interrupt)  # the main process's request to stop; train's loop takes it first
    torch.set_num_threads(threads)
    # a worker draws no progress bar, so tqdm's lock need not be a semaphore, which a killed worker would leave to
    # multiprocessing's resource tracker to clean up, with a warning
    tqdm.set_lock(threading.RLock())
    threading.Thread(target=stop_with_parent, daemon=True).start()
    try:
        context = make(*settings)
        while (job := conn.recv()) is not None:
            result = run(context, job)
            with signal_blocked(signal.SIGTERM):  # a stop now waits for the message to be whole
                conn.send(("done", result))
    except (Interrupted, KeyboardInterrupt) as e:  # KeyboardInterrupt: a second Ctrl-C in train's loop
        reply(conn, ("interrupted", str(e)))
    except Exception as e:
        e.add_note(f"in a worker process of run_jobs:\n{traceback.format_exc()}")
        reply(conn, ("failed", e))
    # the worker's files are closed and its news sent: end without the interpreter's teardown of torch, a second
    # or more that a stop, and the main process, would wait for
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def reply(conn, message):
    """A worker's last message; the main process may be gone (killed), leaving no one to tell."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        conn.send(message)


@contextlib.contextmanager
def signal_blocked(sig):
    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})  # a signal that came meanwhile is handled here


def stop_with_parent():
    """In a worker: stop at a checkpoint, as if asked, when the main process ends without asking (killed itself)."""
    multiprocessing.connection.wait([multiprocessing.parent_process().sentinel])
    signal.raise_signal(signal.SIGTERM)


class Stop:
    """How in_workers ends early. SIGINT or SIGTERM to the main process, a worker's stop, failure or death: each busy
    worker is asked once (SIGTERM) to stop at a checkpoint, and killed if it has not within STOP_WAIT_S; a second
    signal kills them at once. outcome() raises what it was."""

    def __init__(self, pool, jobs, label):
        self.pool, self.jobs, self.label = pool, jobs, label
        self.reason, self.deadline, self.signals, self.previous = None, None, 0, {}
        self.stopped, self.killed, self.died, self.error = [], [], None, None

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self.on_signal)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def on_signal(self, signum, frame):
        self.signals += 1
        self.begin(signal.Signals(signum).name)
        if self.signals > 1:
            self.deadline = 0  # at once

    def begin(self, reason):
        if self.reason is None:
            self.reason, self.deadline = reason, time.monotonic() + STOP_WAIT_S
            for worker in self.pool:
                if worker.job is not None:
                    worker.send_signal(signal.SIGTERM)

    def keep_deadline(self):
        if self.reason and time.monotonic() >= self.deadline:
            for worker in self.pool:
                if worker.job is not None and not worker.killed:
                    worker.killed = True
                    worker.send_signal(signal.SIGKILL)

    def heard(self, worker, done, bar):
        """Take in a worker's news, if any: a result, a stop, an error or its death."""
        news = worker.news()
        if news is None:
            return
        (kind, value), job = news, worker.job
        worker.job = None
        if kind == "done":
            done[job] = value
            bar.update()
        elif kind == "failed":
            self.error = self.error or value
            self.begin("a run failed")
        elif job is None:  # an idle worker: a stop that came just after its result, or a death between runs
            if kind == "died" and not self.reason:
                self.died = f"a worker process died between runs ({value})"
                self.begin(self.died)
        elif kind == "interrupted":
            self.stopped.append(job)
            self.begin(f"the worker running {self.label(job)} was stopped ({value})")
        elif worker.killed:
            self.killed.append(job)
        else:
            self.died = self.died or f"the worker running {self.label(job)} died ({value})"
            self.begin(self.died)

    def runs(self, jobs):
        return ", ".join(self.label(job) for job in sorted(jobs, key=self.jobs.index))

    def outcome(self):
        """Raise what ended the runs early, if anything did."""
        stopped = [f"{self.runs(self.stopped)} stopped at a checkpoint"] if self.stopped else []
        if self.killed:
            why = "at the second signal" if self.signals > 1 else f"after {STOP_WAIT_S} s without stopping"
            stopped.append(f"{self.runs(self.killed)} killed {why} (resumed from its last checkpoint)")
        if self.died:
            raise Failed("; ".join([self.died, *stopped, "rerun the same command to redo that run"]))
        if self.error:
            raise self.error
        if self.reason:
            raise Interrupted(f"{self.reason}: {'; '.join(stopped) or 'no run was in progress'}")


def shut_down(pool):
    """End every worker: an idle one is told to, a busy one (the main process failed) is stopped; any still there
    after STOP_WAIT_S is killed. No process is left behind."""
    for worker in pool:
        if worker.idle():
            with contextlib.suppress(OSError):
                worker.conn.send(None)
        elif worker.job is not None:
            worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for worker in pool:
        worker.process.join(max(0.0, deadline - time.monotonic()))
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
        worker.conn.close()


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
    (its own, GPTConfig, TrainConfig, BatchConfig), else run(*their parsed values); a bad setting, a diverging run or runs that
    failed (Failed) are an error and exit 1, an interruption exit 130 with the hint that rerunning resumes; the hints
    quote the command line where it is this process's."""
    rerun = f" ({shlex.join(['python', *sys.argv])})" if argv is None else ""
    argv = sys.argv[1:] if argv is None else argv
    classes = (settings, GPTConfig, train.TrainConfig, BatchConfig)
    if "-h" in argv or "--help" in argv:
        print(doc + config.help_text(*classes))
        return
    try:
        run(*config.parse(argv, *classes))
    except DryRun:
        pass
    except ValueError as e:  # bad settings, a diverging run (train.Divergence), and Failed, which says to rerun
        print(f"error: {e}{rerun if isinstance(e, Failed) else ''}", file=sys.stderr)
        sys.exit(1)
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"\ninterrupted{': ' + str(e) if str(e) else ''}; rerun the same command to resume{rerun}",
              file=sys.stderr)
        sys.exit(130)


def widen(values, best, most):
    """The next value of the geometric sweep values beyond the edge that best (the sweep's pick) lies on, at the
    ratio of the two values there; None where best lies inside, or the sweep already holds `most` values."""
    values = sorted(values)
    if len(values) < 2 or len(values) >= most or values[0] < best < values[-1]:
        return None
    beyond = values[0] ** 2 / values[1] if best == values[0] else values[-1] ** 2 / values[-2]
    return float(f"{beyond:.3g}")  # 0.009 ** 2 / 0.003 is 0.026999999999999996: the run folders name it 0.027


def numbers(key, text, kind, low, example):
    """A comma-separated list of numbers of kind, each >= low, sorted and distinct."""
    values = sorted({config.coerce(key, v, kind) for v in split_list(text)})
    if not values or values[0] < low:
        raise ValueError(f"{key}={text!r} must list numbers >= {low}, e.g. {example}")
    return values


def read_json(path, delete=None):
    """The JSON at path. One that cannot be read (truncated, not JSON, unreadable) raises Failed naming it and what
    to delete (delete; default: the file) so that rerunning the command redoes that run."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:  # ValueError: JSONDecodeError, UnicodeDecodeError
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise Failed(f"{path} cannot be read ({why}); delete {delete or 'it'} and rerun the same command to redo "
                     f"that run") from None


def evaluated(path, compute):
    """The JSON at path, computed and written (atomically: it marks a finished step) the first time, and again
    in place of a copy that cannot be read (truncated when a device filled, edited), which is named on stderr:
    what compute() makes can be made again."""
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"{path} cannot be read ({e}); computing it again", file=sys.stderr)
    obj = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, obj)
    return read_json(path)


def eval_runtime(tc):
    """The device and precision the lab evaluates in: the training settings', without compile or DDP."""
    device, _ = pick_device(tc.device)
    return Runtime(device, pick_dtype(tc.dtype, device.split(":")[0]), compile=False)
