"""Where a grid's runs train and the command line of a lab tool: LaunchSettings, which every lab tool's settings
inherit; run_jobs, which runs jobs in this process, in worker processes (lab/pool.py) or as Slurm jobs
(lab/slurm.py), or prints what it would launch; launch_plan, a dry run's plan of launches on either launcher; and
command, a lab tool's main."""

import shlex
import sys
from dataclasses import dataclass, field

from tqdm import tqdm

import config
import train
from config import opt
from data.batches import BatchConfig
from lab.pool import Failed, Interrupted, in_process, in_workers
from model import GPTConfig

LAUNCHERS = ("local", "slurm")


class DryRun(Exception):
    """A dry run has printed what it would launch; the command exits 0."""


@dataclass
class LaunchSettings:
    """Where a grid's runs train; every lab tool's settings class inherits these (as --key=value and TOML keys)."""

    launcher: str = opt(
        "local",
        "local: on this machine, `workers` at a time; slurm: each run not yet finished as "
        "a Slurm job, in job arrays submitted through submitit (the slurm_* settings)",
        check=config.one_of(LAUNCHERS),
    )
    workers: int = opt(
        1,
        "runs trained at a time by the local launcher, each in a process with an equal share of the "
        "CPU threads (2 on 2 CPU cores, which one small model's run leaves partly idle; 1 on a GPU)",
        check=config.POSITIVE,
    )
    dry_run: bool = opt(
        False,
        "print every launch the command would make, each with its job count (with slurm: the job arrays, each job's "
        "resources and the GPU- and CPU-hours requested in all, at most); train nothing",
    )
    slurm_partition: str = opt("", "Slurm partition of the jobs (empty: the cluster's default)")
    slurm_gpus: int = opt(1, "GPUs per Slurm job (one run each)", check=config.NON_NEGATIVE)
    slurm_cpus: int = opt(8, "CPUs per Slurm job, which torch's threads use", check=config.POSITIVE)
    slurm_time: int = opt(
        240,
        "time limit of a Slurm job in minutes; a run that needs longer stops at a checkpoint "
        "before it and is requeued, up to 3 times (then rerun the command)",
        check=config.POSITIVE,
    )
    slurm_array_parallelism: int = opt(
        64, "Slurm jobs of one array that may run at the same time", check=config.POSITIVE
    )
    slurm_folder: str = opt("slurm_logs", "folder of submitit's job files and the jobs' logs")

    def __post_init__(self):
        config.validate(self)


def run_jobs(
    jobs,
    run,
    context,
    rebuild,
    launch,
    needs=lambda job: None,
    pending=lambda job: True,
    label=str,
    desc="runs",
    progress=True,
    more=None,
):
    """{job: run(context, job)} for every job, in list order as far as needs(job) (the job it waits for, earlier in
    jobs; None, or a job outside jobs (finished before): none) allows, where launch (LaunchSettings) says:
    - local with 1 worker: here, one after another;
    - local with workers > 1: that many at a time, each in a worker process of its own with its own context,
      make(*settings) for rebuild = (make, settings), and an equal share of this process's CPU threads (a small
      model's matmuls leave cores idle that a second run fills);
    - slurm: each job with work left (pending(job)) as a Slurm job that builds its context the same way
      (lab/slurm.py); the others, whose run folders hold their results, are read here.
    more(done), where given, lists every job wanted once those of done have results, in the order to run them (a job
    after its need, or once its need is done): a lab whose next runs depend on results (a sweep widened, seeds
    screened) grows its launch with it. Here and in workers it is asked as results come in, so a worker never waits
    for a round to end; with slurm after each round of Slurm jobs.
    SIGINT or SIGTERM stops every run at a checkpoint and raises Interrupted; a worker that dies or a Slurm job that
    fails raises Failed naming its run. With dry_run it prints what it would launch and raises DryRun."""
    if launch.dry_run:
        print(launch_plan([Launch("", jobs)], launch, needs, pending, label, desc))
        raise DryRun
    with tqdm(total=len(jobs), desc=desc, unit="run", dynamic_ncols=True, disable=not progress) as bar:
        if launch.launcher == "slurm":
            done = {}
            while jobs:
                todo = [job for job in jobs if pending(job)]
                done |= in_process([job for job in jobs if job not in todo], run, context, label, bar)
                done |= slurm_module().run_jobs(todo, run, rebuild, launch, needs, label, desc, bar) if todo else {}
                jobs = [job for job in more(done) if job not in done] if more else []
                bar.total = len(done) + len(jobs)
            return done
        if launch.workers == 1:
            return in_process(jobs, run, context, label, bar, more)
        return in_workers(jobs, run, rebuild, launch.workers, needs, label, bar, more)


def slurm_module():
    """lab/slurm.py, which needs submitit: an optional package, imported only where it is asked for. Not installed,
    or installed but failing to import (a broken install): one line that says which."""
    config.optional_package("submitit", "launcher=slurm")
    from lab import slurm

    return slurm


@dataclass
class Launch:
    """One launch of a lab's plan, for its dry run: its jobs where they are known before anything trains, else at most
    `most` jobs that results choose; `what` names them, `when` says what the launch waits for ("": nothing)."""

    what: str
    jobs: list = field(default_factory=list)
    most: int = 0
    when: str = ""


def launch_plan(launches, launch, needs=lambda job: None, pending=lambda job: True, label=str, desc="runs"):
    """What run_jobs would launch, for dry_run: each of launches (Launch, in order) with its job count and what it
    waits for. Local: the runs of each. Slurm: first the resources each job requests (as executor() in lab/slurm.py
    asks for them), then each launch's jobs not finished yet in their arrays, and in all at most so many GPU- and
    CPU-hours (jobs x time limit x GPUs or CPUs)."""
    slurm, lines = launch.launcher == "slurm", []
    if slurm:
        where = f"partition {launch.slurm_partition}" if launch.slurm_partition else "the default partition"
        lines.append(
            f"dry run: Slurm jobs named {desc!r}, each {launch.slurm_gpus} GPU(s), {launch.slurm_cpus} CPUs, the "
            f"partition's default memory and {launch.slurm_time} min on {where}, at most "
            f"{launch.slurm_array_parallelism} of an array at once; logs in {launch.slurm_folder}/"
        )
    jobs = 0  # Slurm jobs, at most
    for each in launches:
        when = f", {each.when}" if each.when else ""
        if not each.jobs:
            lines.append(f"then at most {each.most} {'jobs' if slurm else 'runs'}{when}: {each.what}")
            jobs += each.most
        elif slurm:
            todo = [job for job in each.jobs if pending(job)]
            finished = f"{len(each.jobs) - len(todo)} of the {len(each.jobs)} runs finished already"
            lines += [f"{each.what + ': ' if each.what else ''}{len(todo)} jobs ({finished})"]
            lines += arrays(todo, needs, label, f"submitted {each.when or 'at once'}")
            jobs += len(todo)
        else:
            named, runs = f", {each.what}" if each.what else "", ", ".join(map(label, each.jobs))
            lines.append(f"dry run{named}: {len(each.jobs)} runs here, {launch.workers} at a time{when}: {runs}")
    if slurm:
        hours = jobs * launch.slurm_time / 60
        lines.append(
            f"in all at most {jobs} jobs of {launch.slurm_time} min: {hours * launch.slurm_gpus:,g} GPU-hours and "
            f"{hours * launch.slurm_cpus:,g} CPU-hours requested (a job requeued requests its time again)"
        )
    return "\n".join(lines)


def arrays(todo, needs, label, first):
    """The lines of the job arrays lab/slurm.py submits todo in: the first one `first` (when it is submitted), each
    next one as the runs it needs, in the array before, are done."""
    depth = {}
    for job in todo:  # needs come earlier in jobs; a need that is finished already waits for nothing
        depth[job] = depth[needs(job)] + 1 if needs(job) in depth else 0
    lines = []
    for level in sorted(set(depth.values())):
        group = [label(job) for job in todo if depth[job] == level]
        when = first if level == 0 else "each submitted once the run it needs is done"
        lines.append(f"  array {level + 1}, {when}, {len(group)} jobs: {', '.join(group)}")
    return lines


def this_command():
    """This process's command line as a user retypes it: `python -m lab.ablate ...` where it ran as a module (its
    argv[0] is then the module's file, which a lab tool refuses as a path), else `python script ...`."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    head = ["-m", spec.name] if spec is not None else sys.argv[:1]
    return shlex.join(["python", *head, *sys.argv[1:]])


def command(argv, doc, settings, run):
    """The main of a lab tool (config.main with the lab's settings classes: its own, GPTConfig, TrainConfig,
    BatchConfig): a dry run exits 0, runs that failed (Failed) exit 1 with the command that redoes them, an
    interruption exits 130 with the hint that rerunning resumes; the hints quote the command line where it is this
    process's."""
    rerun = f" ({this_command()})" if argv is None else ""

    def outcome(*parsed):
        try:
            run(*parsed)
        except DryRun:
            pass
        except Failed as e:
            raise Failed(f"{e}{rerun}") from None
        except (Interrupted, KeyboardInterrupt) as e:
            print(
                f"\ninterrupted{': ' + str(e) if str(e) else ''}; rerun the same command to resume{rerun}",
                file=sys.stderr,
            )
            sys.exit(130)

    config.main(argv, doc, (settings, GPTConfig, train.TrainConfig, BatchConfig), outcome)
