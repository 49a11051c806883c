"""A grid's runs as Slurm jobs through submitit: run_jobs with launcher=slurm (lab/launch.py) calls run_jobs here.

Each run is one job that builds its context and runs its job as a local worker would; the jobs go in job arrays,
submitted as runs become ready (a fine-tune once its base model is done), and the launcher waits for them and
returns their results, so a tool builds its summary from the run folders as after a local run.

A job on SIGTERM (a preemption, scancel) or submitit's signal (USR2: 90 s before the time limit, and at a preemption
on clusters that send it after the SIGTERM) stops its run at the next step with a checkpoint, as train.py does on
SIGTERM. With submitit's signal, submitit then requeues the job: the same job, which resumes from the run folder;
without it the job ends without a result (Slurm requeues a preempted job itself where the cluster says so). Whatever
stopped a job, rerunning the command submits every run that is not finished, and each continues from its folder.
"""

import os
import pickle
import shutil
import signal
import sys
import time

import submitit
import torch

from lab.pool import Failed, Interrupted, interrupt

CLUSTER = "slurm"  # submitit's executor; the tests use its "local" one, which runs each job as a process here
POLL_S = 1  # between looks at the jobs' result files: a job takes minutes, a look almost nothing
PREEMPT = getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)  # submitit's: USR2 unless its variable says
# at a preemption Slurm sends SIGTERM, then PREEMPT where the cluster is set up to (preempt_send_user_signal)
PREEMPT_WAIT_S = 10


class Task(submitit.helpers.Checkpointable):
    """One run as a Slurm job: run(make(*settings), job) there, on `threads` CPU threads. Its checkpoint (called by
    submitit on PREEMPT) resubmits it unchanged: the run folder holds the progress."""

    def __init__(self, run, rebuild, job, threads):
        self.run, self.rebuild, self.job, self.threads = run, rebuild, job, threads

    def __call__(self):
        requeue = signal.getsignal(PREEMPT)  # submitit's handler: it calls checkpoint(), requeues the job and exits
        preempted = []

        def stop_at_checkpoint(signum, frame):
            preempted.append(signum)
            signal.signal(signum, signal.SIG_IGN)
            signal.raise_signal(signal.SIGTERM)  # train's loop stops at a checkpoint on it; elsewhere it raises

        signal.signal(PREEMPT, stop_at_checkpoint)
        signal.signal(signal.SIGTERM, interrupt)  # submitit's own only logs it
        torch.set_num_threads(self.threads)
        make, settings = self.rebuild
        try:
            return self.run(make(*settings), self.job)
        except Interrupted as e:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the run has stopped at its checkpoint already
            if arrives(preempted):
                requeue(PREEMPT, None)
            # no result, so the launcher goes by the job's state: Slurm may requeue it itself (a preemption)
            raise SystemExit(f"stopped at a checkpoint: {e}") from None


def arrives(signals):
    """Whether signals (which a handler appends to) holds one, or does within PREEMPT_WAIT_S."""
    deadline = time.monotonic() + PREEMPT_WAIT_S
    while not signals and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(signals)


def executor(launch, desc):
    """submitit's executor for the jobs of launch (LaunchSettings), named desc."""
    missing = [c for c in ("sbatch", "srun") if shutil.which(c) is None] if CLUSTER == "slurm" else []
    if missing:
        raise ValueError(
            f"launcher=slurm needs Slurm's {' and '.join(missing)}, not on PATH here; run the command on "
            "the cluster's login node, or use launcher=local"
        )
    ex = submitit.AutoExecutor(folder=launch.slurm_folder, cluster=CLUSTER)
    ex.update_parameters(
        name=desc,
        timeout_min=launch.slurm_time,
        nodes=1,
        tasks_per_node=1,
        cpus_per_task=launch.slurm_cpus,
        gpus_per_node=launch.slurm_gpus,
        slurm_partition=launch.slurm_partition or None,
        slurm_array_parallelism=launch.slurm_array_parallelism,
    )
    return ex


def submit(ex, tasks):
    """The submitted jobs of tasks, one array. A job imports what this process imported: the repository's modules
    are found through sys.path, not installed, so the job gets it as PYTHONPATH (sbatch passes the environment on)."""
    try:
        with submitit.helpers.environment_variables(PYTHONPATH=os.pathsep.join(p for p in sys.path if p)):
            return ex.submit_array(tasks)
    except submitit.core.utils.FailedJobError as e:  # sbatch's own error, e.g. a partition the cluster lacks
        raise ValueError(f"sbatch refused the jobs: {str(e).strip().splitlines()[-1]}") from None


def run_jobs(jobs, run, rebuild, launch, needs, label, desc, bar):
    """{job: result} of every job, each a Slurm job; at each look, an array of those whose need is done (or finished
    before: not among jobs). SIGINT or SIGTERM cancels the jobs (each stops at a checkpoint) and raises Interrupted;
    jobs that fail raise Failed, naming each run with its log, once the others are done."""
    ex = executor(launch, desc)
    done, failed, running, waiting = {}, {}, {}, list(jobs)
    previous = signal.signal(signal.SIGTERM, interrupt)  # SIGINT raises KeyboardInterrupt already
    try:
        while True:
            ready = [job for job in waiting if needs(job) not in jobs or needs(job) in done]
            if ready:
                submitted = submit(ex, [Task(run, rebuild, job, launch.slurm_cpus) for job in ready])
                running |= dict(zip(submitted, ready, strict=True))
                waiting = [job for job in waiting if job not in ready]
            if not running:
                break
            bar.set_postfix_str(f"{len(running)} Slurm jobs: {', '.join(map(label, running.values()))}")
            time.sleep(POLL_S)
            collect(running, done, failed, bar)
    except BaseException as e:  # whatever ends the launcher ends its jobs, each at a checkpoint
        for sjob in running:
            sjob.cancel(check=False)
        if not isinstance(e, (Interrupted, KeyboardInterrupt)):
            raise
        raise Interrupted(
            f"{str(e) or 'SIGINT'}: {len(running)} Slurm jobs cancelled, each stopping at a checkpoint "
            f"({', '.join(map(label, running.values()))})"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:
        lines = [f"run {label(job)} failed: {why(sjob)}; its log: {sjob.paths.stderr}" for job, sjob in failed.items()]
        lines += [f"run {label(job)} was not submitted: it needs {label(needs(job))}" for job in waiting]
        raise Failed("\n".join(lines + ["rerun the same command to redo them"]))
    return done


def collect(running, done, failed, bar):
    """Move each job of running that has ended into done (its result) or failed (its Slurm job)."""
    for sjob in [s for s in running if s.done()]:
        job = running.pop(sjob)
        try:
            done[job] = sjob.result()
            bar.update()
        except submitit.core.utils.UncompletedJobError:  # and FailedJobError: no result, or the job's error
            failed[job] = sjob


def why(sjob):
    """Why a job gave no result: the last line of its traceback, or (killed, cancelled, out of time) its state."""
    if sjob.paths.result_pickle.is_file():
        _, trace = pickle.loads(sjob.paths.result_pickle.read_bytes())  # ("error", the traceback's text)
        return trace.strip().splitlines()[-1]
    return f"it ended without a result (state {sjob.state})"
