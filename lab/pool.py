"""The lab's process pool: jobs run here one after another, or side by side in spawned worker processes, each
building its own context once; SIGINT or SIGTERM stops every run at a checkpoint and raises Interrupted, and a worker
that dies raises Failed naming its run. lab/launch.py chooses between this pool and Slurm (lab/slurm.py), which
shares its signals and errors."""

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import traceback

import torch
from tqdm import tqdm

from runtime import Signals

STOP_WAIT_S = 60  # for a worker to finish its step, evaluate and write its checkpoint; then it is killed


class Interrupted(Exception):
    """A run stopped before max_iters (Ctrl-C, SIGTERM); rerunning the command resumes it."""


class Failed(ValueError):
    """Runs that could not finish (a worker that died, a Slurm job that failed, a run file that cannot be read);
    the message names each and ends with what rerunning the same command does."""


def in_process(jobs, run, context, label, bar, more=None):
    """run_jobs here, one job after another; more(done), asked after each result, lists every job wanted by then in
    the order to run them (as in in_workers)."""
    done, waiting = {}, list(jobs)
    # SIGINT raises KeyboardInterrupt already; inside train's loop its StopFlag takes both and checkpoints
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        while waiting:
            job = waiting.pop(0)
            bar.set_postfix_str(label(job))
            done[job] = run(context, job)
            bar.update()
            if more:
                waiting = [j for j in more(done) if j not in done]
                bar.total = len(done) + len(waiting)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return done


def interrupt(signum, frame):
    """A SIGTERM handler for the work outside train's loop (which stops at a checkpoint itself): raise Interrupted,
    once; a repeat is ignored while it unwinds."""
    signal.signal(signum, signal.SIG_IGN)
    raise Interrupted(signal.Signals(signum).name)


def worker_threads(workers):
    """The threads each of workers processes computes on: this process's, shared out."""
    return max(1, torch.get_num_threads() // workers)


def in_workers(jobs, run, rebuild, workers, needs, label, bar, more=None):
    """run_jobs with workers > 1: a worker process per slot, started as a job needs one; each job is sent to an idle
    worker once its need is done. more(done), asked after each look that brought results, lists every job wanted by
    then, in the order to run them: jobs not done and not running are what waits (a job it adds grows jobs and the
    bar). An error it raises stops the runs in progress at a checkpoint, then is raised."""
    # spawn, not fork: a forked copy of a process whose OpenMP threads have started can hang
    mp = multiprocessing.get_context("spawn")
    threads = worker_threads(workers)
    jobs, done, pool = list(jobs), {}, []
    waiting = list(jobs)
    stop = Stop(pool, jobs, label)
    with stop:
        try:
            while True:
                # a need outside jobs (None, or finished before this launch) is met, as in slurm.run_jobs
                for job in [j for j in waiting if needs(j) not in jobs or needs(j) in done]:
                    worker = next((w for w in pool if w.idle()), None)
                    if worker is None and len(pool) < workers and not stop.reason:
                        worker = Worker(mp, run, rebuild, threads)
                        pool.append(worker)
                    if worker is None or stop.reason:  # a signal meanwhile: nothing more starts
                        break
                    waiting.remove(job)
                    worker.start(job)
                busy = [w for w in pool if w.job is not None]
                if not busy:
                    break
                bar.set_postfix_str(", ".join(label(w.job) for w in busy))
                alive = [w for w in pool if w.alive]
                # a timeout, so that a stop's deadline is kept whatever the workers do
                multiprocessing.connection.wait([w.conn for w in alive] + [w.process.sentinel for w in alive], 1)
                finished = len(done)
                for worker in alive:
                    stop.heard(worker, done, bar)
                if more and len(done) > finished and not stop.reason:
                    try:
                        wanted = more(done)
                    except Exception as e:  # e.g. a run folder refused, or too few seeds passing
                        stop.error, wanted = stop.error or e, []
                        stop.begin("the launch could not go on")
                    running = {w.job for w in pool}
                    waiting = [j for j in wanted if j not in done and j not in running]
                    jobs += [j for j in waiting if j not in jobs]
                    bar.total = len(jobs)
                stop.keep_deadline()
        finally:
            shut_down(pool)
    stop.outcome()
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
    try:
        # the main process's request to stop (train's loop takes it first), set inside the try: one that comes
        # before the worker is ready is answered as a stop, not raised past it (exit status 1, which reads as a death)
        signal.signal(signal.SIGTERM, interrupt)
        torch.set_num_threads(threads)
        # a worker draws no progress bar, so tqdm's lock need not be a semaphore, which a killed worker would leave
        # to multiprocessing's resource tracker to clean up, with a warning
        tqdm.set_lock(threading.RLock())
        threading.Thread(target=stop_with_parent, daemon=True).start()
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


class Stop(Signals):
    """How in_workers ends early. SIGINT or SIGTERM to the main process, a worker's stop, failure or death: each busy
    worker is asked once (SIGTERM) to stop at a checkpoint, and killed if it has not within STOP_WAIT_S; a second
    signal kills them at once. outcome() raises what it was."""

    def __init__(self, pool, jobs, label):
        self.pool, self.jobs, self.label = pool, jobs, label
        self.reason, self.deadline, self.signals = None, None, 0
        self.stopped, self.killed, self.died, self.error = [], [], None, None

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
        elif self.reason and value == "SIGTERM":  # the stop's own signal, before the worker had set its handler
            self.stopped.append(job)
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
