"""The frame of a lab tool that chooses each arm's rate on a selection seed and then trains the test seeds at it
(ablate, extend): its settings, the plan it resolves before anything trains, the launch that grows as results come
in (each run folder checked before it trains), the sweep and its widening, the whole plan of a dry run, and the
results files. A tool's plan subclasses Plan and says what its jobs are; the tool keeps only its experiment.
"""

import bisect
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

import config
import train
from config import opt
from data.batches import BatchConfig
from data.loader import Batch
from data.tokenizer import load_meta
from files import atomic_write
from lab.evaluation import eval_runtime, eval_sets
from lab.grid import SeedSettings, write_json
from lab.launch import DryRun, Launch, LaunchSettings, command, launch_plan, run_jobs
from lab.pool import worker_threads
from lab.report import NO_PLOTS
from model import GPT, GPTConfig
from optim import make_optimizer
from runtime import Runtime

MORE_RATES = 2  # rates a sweep may add beyond its edges, where its best keeps landing there


@dataclass
class SweepSettings(SeedSettings, LaunchSettings):
    """The seeds and evaluation every sweeping lab tool shares; its settings class inherits them."""

    selection_seed: int = opt(
        1000,
        "the first seed each arm's rate sweep runs on, the sweep choosing the rate its test seeds train at; no "
        "selection seed is in a test",
        check=config.NON_NEGATIVE,
    )
    selection_seeds: int = opt(
        2,
        "seeds each arm's rate sweep runs on, from selection_seed on: the rate with the lowest loss averaged over "
        "them is chosen, so that no single seed decides it",
        check=config.POSITIVE,
    )
    eval_tokens: int = opt(
        16384, "validation tokens per context length, in fixed windows of that length", check=config.POSITIVE
    )
    parts: int = opt(1, "machines the test seeds are dealt out to, seed by seed in turn", check=config.POSITIVE)
    part: int = opt(
        0,
        "the part this machine runs, 1 to parts, each with the selection seeds; its run folders stay in out_dir: "
        "copied from every part into one out_dir, the command rerun there without part trains what no part did "
        "(a seed the inclusion rule reads that no part screened) and writes the report (0: every seed, and the report)",
        check=config.NON_NEGATIVE,
    )
    keep_checkpoints: bool = opt(
        True, "keep each finished run's checkpoints (false: its JSON records alone, what the report reads)"
    )

    def __post_init__(self):
        super().__post_init__()
        if self.part > self.parts:
            raise ValueError(f"part={self.part} is past parts={self.parts}; choose 1 to {self.parts}, or 0 for all")

    def part_seeds(self, seeds, part=None):
        """The seeds of a part (default this machine's): every parts-th from its place; part 0: all."""
        part = self.part if part is None else part
        return seeds[part - 1 :: self.parts] if part else seeds

    def selection(self):
        """The seeds each arm's sweep runs on."""
        return [self.selection_seed + i for i in range(self.selection_seeds)]

    def test_seeds(self, train_cfg, sweeping=True):
        seeds = super().test_seeds(train_cfg)
        if sweeping and (shared := sorted(set(self.selection()) & set(seeds))):
            raise ValueError(
                f"selection_seed={self.selection_seed}, selection_seeds={self.selection_seeds}: seeds "
                f"{', '.join(map(str, shared))} are also test seeds {seeds}; a rate chosen on a seed must not be "
                "tested on it"
            )
        return seeds


@dataclass
class Plan:
    """Everything fixed for the whole lab, resolved and checked before anything trains. A tool's plan adds its own
    fields and defines make (its plan from the parsed settings), run, folder, check, label and loss; needs where a
    job waits for another."""

    settings: SweepSettings  # the tool's own
    model_cfg: GPTConfig
    train_cfg: train.TrainConfig
    batch_cfg: BatchConfig
    seeds: list  # the test seeds
    meta: dict  # the dataset's
    runtime: Runtime
    windows: dict  # {L: Batches holding the fixed validation windows of L tokens}

    desc = "lab"  # the progress bar's and the Slurm jobs' name
    marker = "result.json"  # the file of a run folder that says its job is done
    unswept = 1  # the rate of an arm that does not sweep

    @staticmethod
    def common(settings, model_cfg, train_cfg, batch_cfg, lengths, sweeping=True):
        """The fields every plan resolves alike, as keywords: the dataset's vocabulary, the test seeds, the evaluation
        device and the fixed windows at each of lengths."""
        dataset_dir = Path(train_cfg.data_dir) / train_cfg.dataset
        meta = load_meta(dataset_dir)
        runtime = eval_runtime(train_cfg)
        per_forward = train_cfg.batch_size * model_cfg.block_size
        windows = eval_sets(dataset_dir, meta, lengths, settings.eval_tokens, per_forward, runtime.device)
        return dict(
            settings=settings,
            model_cfg=replace(model_cfg, vocab_size=meta["vocab_size"]),
            train_cfg=train_cfg,
            batch_cfg=batch_cfg,
            seeds=settings.test_seeds(train_cfg, sweeping),
            meta=meta,
            runtime=runtime,
            windows=windows,
        )

    @property
    def out(self):
        return Path(self.train_cfg.out_dir)

    @property
    def parsed(self):
        """What make builds this plan from, so a worker process can build its own."""
        return self.settings, self.model_cfg, self.train_cfg, self.batch_cfg

    def needs(self, job):
        """The job that job starts from (None: none)."""
        return None

    def launch(self, wanted):
        """{job: result} of every job wanted(done) lists (in the order to run them) as results come in, until it lists
        none left to run; each run folder is checked before it trains."""
        checked = set()

        def todo(done):
            jobs = [job for job in dict.fromkeys(wanted(done)) if job not in done]
            for job in jobs:
                if job not in checked:
                    self.check(job)
                    checked.add(job)
            return jobs

        return run_jobs(
            todo({}),
            type(self).run,
            self,
            (type(self).make, self.parsed),
            self.settings,
            needs=self.needs,
            pending=self.pending,
            label=self.label,
            desc=self.desc,
            progress=self.train_cfg.progress,
            more=todo,
        )

    def pending(self, job):
        return not (self.folder(job) / self.marker).is_file()

    def first_launch(self, sweeps, after=()):
        """Each arm's sweep on the selection seeds, then the jobs after."""
        sels = self.settings.selection()
        return [self.job(a, rate, sel) for a, rates in sweeps.items() for rate in rates for sel in sels] + [*after]

    def sweep_and_test(self, arms, sweeps, after=(), screen=None):
        """Everything in one launch that grows as results come in, so that no worker waits for a round to end: each
        arm of sweeps ({arm: its rates}) trained on the selection seeds at each rate, and where its best rate (`pick`)
        lies at an edge the rule widens one more rate beyond it (MORE_RATES at the most), as
        soon as the arm's runs so far are done; the jobs after; each arm of arms training every test seed at its best
        rate (unswept where it does not sweep) once that rate is chosen. screen(done), where given, decides the seeds
        as results come in: (the jobs it wants first, the selection seeds (None while undecided), the test seeds
        admitted so far); by default the plan's own. (done {job: result}, sweeps as widened, {arm: its rate})."""
        screen = screen or (lambda done: ([], self.settings.selection(), self.seeds))
        sweeps = {a: sorted(rates) for a, rates in sweeps.items()}
        most = max(map(len, sweeps.values()), default=0) + MORE_RATES
        rates = {a: self.unswept for a in arms if a not in sweeps}

        def wanted(done):
            jobs, sels, seeds = screen(done)
            for a, tried in sweeps.items() if sels is not None else ():  # no sweep before its seeds passed
                runs = {rate: [self.job(a, rate, sel) for sel in sels] for rate in tried}
                if a not in rates and all(job in done for each in runs.values() for job in each):
                    best, widens = self.pick(
                        a, tried, {rate: {j: done[j] for j in js} for rate, js in runs.items()}, done
                    )
                    if widens and (beyond := widen(tried, best, most)):
                        bisect.insort(tried, beyond)
                    else:
                        rates[a] = best
                jobs = [*jobs, *(self.job(a, rate, sel) for rate in tried for sel in sels)]
            return [*jobs, *after, *(self.job(a, rates[a], seed) for a in arms if a in rates for seed in seeds)]

        return self.launch(wanted), sweeps, rates

    def pick(self, arm, tried, runs, done):
        """The rate arm's sweep chooses from its selection seeds' runs ({rate: {job: result}}, tried in order; done
        holds every result so far), and whether the sweep widens past the edge it lies on: (rate, widens). Here the
        rule every tool states: the lowest loss averaged over the seeds, widened wherever it lies at an edge."""
        return min(tried, key=lambda rate: statistics.fmean(self.loss(r, arm) for r in runs[rate].values())), True

    def dry_run(self, sweeps, after=(), screening=(), arms=None):
        """Print every launch sweep_and_test would make, each with its job count and what it waits for, after the
        launches of screening (Launch records) where a screen decides the seeds, and raise DryRun. arms: those that
        train the test seeds (default the swept ones)."""
        arms = list(sweeps) if arms is None else arms
        sels, jobs, seeds = self.settings.selection(), self.first_launch(sweeps, after), self.seeds
        for job in jobs:
            self.check(job)
        widening = sum(len(rates) > 1 for rates in sweeps.values())  # the arms whose sweep may widen
        # what the test seeds' runs wait for: their arm's rate where it is swept, their seed where a screen decides it
        events = []
        if sweeps:
            events.append("each arm's sweep chooses its rate")
        if screening:
            events.append("each test seed passes the screening")
        launches = [
            *screening,
            Launch("launch 1", jobs, when="once the selection seeds passed the screening" if screening else ""),
            Launch(
                f"up to {MORE_RATES} more rates on selection seeds {', '.join(map(str, sels))} for each arm whose "
                "best rate lies at an edge of its sweep",
                most=MORE_RATES * widening * len(sels),
                when="as each arm's sweep finishes",
            ),
            Launch(
                f"test seeds {', '.join(map(str, seeds))} of {len(arms)} arms, each at its arm's rate (none that "
                "launch 1 holds already)",
                most=len(arms) * len(seeds),
                when="as " + " and ".join(events) if events else "",
            ),
        ]
        launches = [each for each in launches if each.jobs or each.most]
        print(launch_plan(launches, self.settings, self.needs, self.pending, self.label, self.desc))
        raise DryRun

    def release(self, job):
        """Delete job's checkpoints where keep_checkpoints is false: its JSON records hold all the report reads."""
        if not self.settings.keep_checkpoints:
            for name in ("ckpt.pt", "best.pt"):
                (self.folder(job) / name).unlink(missing_ok=True)

    def part_done(self, seeds, folders):
        """Say that this machine's part is done and how the parts become one report."""
        settings = self.settings
        print(
            f"part {settings.part} of {settings.parts} done, test seeds {', '.join(map(str, seeds))}: copy every "
            f"part's {', '.join(str(self.out / f) for f in folders)} into one out_dir and run this command there "
            "without part: it trains what no part did, if anything, and writes the report"
        )

    def calibrate(self, model_cfg):
        """Training FLOP/s reached here and now by one of the workers: the median of a few timed steps of a model of
        model_cfg on random tokens, on the threads each worker gets (what a dry run's estimate divides by)."""
        train_cfg, runtime = self.train_cfg, self.runtime
        torch.manual_seed(0)
        model = GPT(model_cfg).to(runtime.device)
        optimizer, scaler = make_optimizer(model, train_cfg, runtime)
        x = torch.randint(model_cfg.vocab_size, (train_cfg.batch_size, model_cfg.block_size), device=runtime.device)
        times, threads = [], torch.get_num_threads()
        torch.set_num_threads(worker_threads(self.settings.workers))
        try:
            for _ in range(10):
                t0 = time.perf_counter()
                train.train_step(
                    model, optimizer, scaler, [Batch(x, x)], train_cfg.learning_rate, train_cfg.grad_clip, runtime
                )[0].item()
                times.append(time.perf_counter() - t0)
        finally:
            torch.set_num_threads(threads)
        return model.flops_per_token(model_cfg.block_size) * x.numel() / statistics.median(times[3:])  # 3 warm up

    def write_results(self, results, plots, markdown, t0, also=()):
        """Write results.json (with the command's wall seconds since t0) and results.md (markdown(results, plots)),
        and print the files written, those also names (written already) and the plots among them."""
        results["wall_s"] = time.perf_counter() - t0
        write_json(self.out / "results.json", results)
        atomic_write(self.out / "results.md", lambda f: f.write(markdown(results, plots).encode()))
        if plots.plt is None:
            print(NO_PLOTS)
        print(
            f"results: {self.out / 'results.md'}, results.json"
            + "".join(f", {f}" for f in [*also, *(f for f, _ in plots.written)])
        )


def tool_main(doc, settings, make, conduct):
    """A sweeping tool's main(argv=None): conduct(make(*the parsed settings)), settings being the tool's class, on
    lab/launch.py's command frame."""

    def main(argv=None):
        command(argv, doc, settings, lambda *parsed: conduct(make(*parsed)))

    return main


def widen(values, best, most):
    """The next value of the geometric sweep values beyond the edge that best (the sweep's pick) lies on, at the
    ratio of the two values there; None where best lies inside, or the sweep already holds `most` values."""
    values = sorted(values)
    if len(values) < 2 or len(values) >= most or values[0] < best < values[-1]:
        return None
    beyond = values[0] ** 2 / values[1] if best == values[0] else values[-1] ** 2 / values[-2]
    return float(f"{beyond:.3g}")  # 0.009 ** 2 / 0.003 is 0.026999999999999996: the run folders name it 0.027
