"""Context extension: fine-tune RoPE past its trained length (PI, NTK, YaRN, PoSE) for the same fixed steps, and ask
the papers' questions of loss and of retrieval by distance, over seeds admitted by a rule fixed before the run, with
the verdicts their tests allow.

    python -m lab.extend configs/extend_cpu.toml [--key=value ...]

1. Base models: RoPE (each of `rope_bases`) trained at L0 = block_size, recall_share of the sequences carrying the
   associative-recall task (data/recall.py), the rate warmed up and then held constant while the model is probed at
   L0 every `base_check` steps (its learning curve: retrieval by distance and by query slot). Once every query slot
   retrieves at least `base_gate` of whole answers (the gate: the task learned without the elimination shortcut),
   the rate decays over `base_decay` steps (warmup-stable-decay; the gate's step is recorded in the run's schedule);
   a model that has not passed by max_iters fails.
2. Inclusion, a rule fixed before any method touches a base model: the test seeds are the first `seeds` seeds from
   `seed` on, in order, whose base models (one per RoPE base) pass the gate and still pass it after the decay; where
   rates are swept, the selection seeds are the first `selection_seeds` that pass from `selection_seed` on, and they
   choose each arm's rate (4). Bases are launched only as far as still needed, in
   order, `screen_most` seeds a role at the most (then the lab refuses). Every run starts as soon as a worker is free
   and what it needs is known (the sweeps once every selection seed passed, a test seed's fine-tunes once it is
   included and its arm's rate chosen), so no worker waits for a round to end.
3. Fine-tuning at s x L0 for each s in `factors` and each of `methods`: none (direct fine-tuning at the new
   length), linear (Position Interpolation, PI), ntk, dynamic, yarn, llama3 (each RoPE scaling, by its name), and
   PoSE (L0-long rows whose position ids skip ahead to s x L0, with linear scaling: `pose` at PI's steps and rows,
   `pose-tokens` at PI's tokens); a scaling's name with -2s (yarn-2s) sets it for 2s while it fine-tunes at s x L0,
   YaRN's protocol for reading past the fine-tuned length inside its factor (its s = 32 model fine-tuned at 64k,
   read to 128k). The fine-tunes see text alone, as PI's Table 4 fine-tunes on plain text and asks
   the passkey zero-shot (`finetune_rows = "task"`, our variant, keeps the base's recall rows). The tokens per step
   are kept (batch_size / s rows of s x L0), the optimizer restarts (train.py's init_from), the rate warms up for
   `finetune_warmup` steps and then stays constant. Every fine-tune runs the same `finetune_steps` (the last is
   the step every claim reads) and is scored at step 0 (the base model with the scaling alone) and at each of
   them: loss at L0, s L0 and 2s L0, and the probe's counts (trials, hits by distance) in windows of s L0 (the
   target), at the last also of 2s L0 (past it). Where its L0 loss levelled off (measured every `finetune_eval`
   steps) is a secondary reading.
4. Rates, by a rule fixed before the sweep runs: each method and factor fine-tunes the selection seeds at each of
   `finetune_lrs`, and its test seeds fine-tune at the highest rate at which the selection seeds keep, averaged over
   them, `finetune_keep` of their base models' retrieval inside L0 at every read step (the rate that adapts fastest
   without the forgetting that would turn the zero-shot readings into measures of it); the sweep widens by one
   more rate upward where its highest keeps it, downward where none does. One rate is every arm's, chosen by no
   seed: no selection seed is screened.
5. Claims: the papers' claims as paired tests over the test seeds (lab/stats.py), each once, one Holm family.

A grid may run in parts on machines that share nothing (--parts=N --part=K, its candidates dealt out seed by seed
in turn, each part with the selection seeds): copy the parts' run folders into one out_dir and rerun the command
there without part, which reads the inclusion rule in order as one run does, trains what no part did and reports.
out_dir receives base/, sweep/ and finetune/ run folders (one train.py run each, with its evaluations),
results.json, results.md and, with matplotlib, the plots. Rerunning the same command resumes. Settings:
ExtendConfig (here, with the probe's and the launcher's), GPTConfig, TrainConfig and BatchConfig; `python -m
lab.extend --help` lists them all.
"""

if not __package__:  # typed as a path, the import path holds lab/ and not the project: the imports below would fail
    raise SystemExit("run it as a module, from the project's folder: python -m lab.extend CONFIG [--key=value ...]")

import functools
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

import config
import scalings
import train
from checkpoint import load_checkpoint
from config import NON_NEGATIVE, POSITIVE, RATE, one_of, opt
from data.batches import BatchConfig, make_batches
from data.recall import Recall
from files import RunLock
from lab import extend_report
from lab.evaluation import checked_model, context_value, position_losses
from lab.grid import (
    check_records,
    check_run,
    evaluated,
    number_list,
    numbers,
    portable,
    split_list,
    train_run,
    train_settings,
)
from lab.launch import Launch
from lab.retrieval import Probe, ProbeSettings
from lab.sweep import Plan, SweepSettings, tool_main
from model import GPT
from runtime import run_record

# method -> (the RoPE scaling it fine-tunes with, whether its rows are PoSE's, whether PoSE keeps PI's tokens, the
# scaling's factor over s). Each scaling is a method of its name (none: direct fine-tuning), and with HEADROOM a
# method set for 2s that fine-tunes at s L0 (YaRN's 64k -> 128k). PoSE is no scaling but a way to fill the rows: L0
# long, their position ids skipping ahead to s L0, with PI's scaling as in its paper's main runs, at PI's steps and
# rows or at PI's tokens (the names are extend_report's, whose claims name them too).
METHODS = (
    {name: (name, False, False, 1) for name in scalings.SCALINGS}
    | {
        name + extend_report.HEADROOM: (name, False, False, 2)
        for name in scalings.SCALINGS
        if name != scalings.NO_SCALING
    }
    | {
        extend_report.POSE: (scalings.LINEAR, True, False, 1),
        extend_report.POSE_TOKENS: (scalings.LINEAR, True, True, 1),
    }
)
ROLES = ("selection", "test")  # the seeds screened: those that choose the rates, those the claims test


TEXT_ROWS, TASK_ROWS = "text", "task"  # finetune_rows: PI's protocol, or our variant that keeps the task
FINETUNE_ROWS = (TEXT_ROWS, TASK_ROWS)


@dataclass
class ExtendConfig(ProbeSettings, SweepSettings):
    rope_bases: str = opt(
        "200",
        "RoPE's bases: base models and fine-tunes for each (200 puts L0 = 64 at LLaMA-2's "
        "longest-wavelength-to-context ratio with head size 32)",
        check=number_list(float, 1.0, "200,10000"),
    )
    methods: str = opt(
        ",".join((scalings.NO_SCALING, scalings.LINEAR, scalings.NTK, scalings.YARN)),
        f"fine-tuning methods: {', '.join(METHODS)} ({scalings.NO_SCALING}: direct fine-tuning; {scalings.LINEAR}: PI)",
    )
    factors: str = opt(
        "2,4", "extension factors s: fine-tune at s x block_size, comma-separated", check=number_list(float, 1.0, "2,4")
    )
    base_check: int = opt(
        250,
        "base models are probed at L0 every this many steps (their learning curve and the "
        "gate), the rate held constant until the gate",
        check=POSITIVE,
    )
    base_gate: float = opt(
        0.9,
        "a base model passes once every query slot retrieves at least this share of whole answers at L0, by max_iters",
        check=config.SHARE,
    )
    base_decay: int = opt(
        500,
        "steps of the rate's decay after the gate (cosine to min_lr); 0: the base model "
        "stops at the gate, its rate constant to the end",
        check=NON_NEGATIVE,
    )
    screen_most: int = opt(
        12,
        "seeds screened at the most for the test seeds, and for the selection seeds: the lab "
        "refuses once they are reached with fewer base models passing than it needs",
        check=POSITIVE,
    )
    finetune_lrs: str = opt(
        "3e-4,1e-3,3e-3",
        "fine-tuning peak rates, swept on the selection seeds where there are several, every arm's where there is one "
        "(Muon's, where it trains, scaled alike from its pre-training peak)",
        check=number_list(float, 1e-12, "3e-4,1e-3,3e-3"),
    )
    finetune_keep: float = opt(
        0.9,
        "the rate rule, fixed before the sweep runs: each arm fine-tunes at the highest of finetune_lrs at which the "
        "selection seeds keep, averaged over them, at least this share of their base models' retrieval inside L0 "
        "at every read step (the sweep widening upward where the highest keeps it, downward where none does)",
        check=config.SHARE,
    )
    finetune_rows: str = opt(
        TEXT_ROWS,
        f"what the fine-tunes train on: {TEXT_ROWS} (PI's protocol, its Table 4: plain text, the passkey asked "
        f"zero-shot after fine-tuning) or {TASK_ROWS} (the base models' rows, the recall task in recall_share of them: "
        "a variant of ours, which trains retrieval at the new lengths)",
        check=one_of(FINETUNE_ROWS),
    )
    finetune_warmup: int = opt(
        20, "fine-tuning's linear warmup steps (the PI paper's 20); the rate then stays constant", check=NON_NEGATIVE
    )
    finetune_steps: str = opt(
        "100,200,400",
        "the fine-tuning steps every method is scored at (PI's Table 4 reads "
        "200 to 1,000, YaRN 400); every fine-tune runs to the last, which the "
        "claims and the rate sweep read",
        check=number_list(int, 1, "100,200,400"),
    )
    finetune_eval: int = opt(
        50,
        "a fine-tune's L0 loss is measured every this many steps (where it levelled off: a secondary reading)",
        check=POSITIVE,
    )
    plateau_span: int = opt(
        100,
        "a fine-tune's L0 loss has levelled off where it fell by less than plateau_tol over the last this many steps",
        check=POSITIVE,
    )
    plateau_tol: float = opt(0.01, "see plateau_span (nats)", check=RATE)

    def __post_init__(self):
        ProbeSettings.__post_init__(self)
        SweepSettings.__post_init__(self)
        steps = numbers("finetune_steps", self.finetune_steps, int, 1, "100,200,400")
        if self.plateau_span % self.finetune_eval or any(st % self.finetune_eval for st in steps):
            raise ValueError(
                f"plateau_span={self.plateau_span} and finetune_steps={self.finetune_steps!r} must be "
                f"multiples of finetune_eval={self.finetune_eval}, the steps the L0 loss is measured at"
            )

    def candidates(self, role, train_cfg):
        """The seeds screened for role, in order: screen_most from the role's first."""
        first = self.selection_seed if role == "selection" else train_cfg.seed
        return [first + i for i in range(self.screen_most)]


class GateSchedule(train.Schedule):
    """A base model's rate: linear warmup to the peak, then the peak held until the step the gate passed
    (decay_from; None while it has not), then a cosine over decay_iters to min_lr (default a tenth of the peak):
    warmup-stable-decay, so a late learner trains at the same rate as an early one until it has learned. The steps
    before the gate have one rate whatever the gate's step, so the stages a base model trains in add up to one run
    of this schedule, and its settings record the gate's step."""

    def __init__(self, train_cfg, gate, check_every, decay_iters, decay_from=None):
        super().__init__(train_cfg)
        self.gate, self.check_every, self.decay_iters, self.decay_from = gate, check_every, decay_iters, decay_from

    def lr(self, it):
        train_cfg, peak = self.train_cfg, self.train_cfg.learning_rate
        if self.decay_from is None or it <= self.decay_from:
            return train.warmup_cosine(
                it, peak, train_cfg.warmup_iters, train_cfg.warmup_iters, peak
            )  # its floor: the peak
        floor = peak / 10 if train_cfg.min_lr is None else train_cfg.min_lr
        return train.warmup_cosine(it - self.decay_from, peak, 0, self.decay_iters, floor)

    def settings(self):
        return {
            "held": "to the gate",
            "gate": self.gate,
            "check_every": self.check_every,
            "decay_iters": self.decay_iters,
            "decay_from": self.decay_from,
        }


@dataclass
class Lab(Plan):
    """lab/sweep.py's plan, with the context-extension lab's: a job is ("base", b, seed) or ("finetune", b, method,
    s, seed, lr), an arm (b, method, s)."""

    bases: list
    methods: list
    factors: list
    lrs: list
    steps: list  # the fine-tuning steps every arm is scored at, the last the one claims read
    probe: Probe  # retrieval at L0 and at each fine-tune's s L0 and 2s L0
    chosen_selection: list | None = None  # the selection seeds screening admitted (None: no sweep, or not yet)

    desc = "extend"

    @classmethod
    def make(cls, extend_cfg, model_cfg, train_cfg, batch_cfg):
        if not model_cfg.takes("rope_scaling"):
            raise ValueError(
                f"pos_emb={model_cfg.pos_emb!r}: the lab fine-tunes RoPE with its scalings; use pos_emb=rope"
            )
        methods = split_list(extend_cfg.methods)
        for m in methods:
            if m not in METHODS:
                raise ValueError(f"methods: {m!r} is unknown; choose from {', '.join(METHODS)}")
        if batch_cfg.task_class is not Recall:
            raise ValueError(
                f"task={batch_cfg.task}: the lab's retrieval probe needs the recall task in training; set task=recall"
            )
        selection, test = (extend_cfg.candidates(role, train_cfg) for role in ROLES)
        if set(selection) & set(test):
            raise ValueError(
                f"selection_seed={extend_cfg.selection_seed} and seed={train_cfg.seed}: the "
                f"{extend_cfg.screen_most} seeds "
                f"screened from each (screen_most) overlap; a rate chosen on a seed must not be tested "
                f"on it"
            )
        if extend_cfg.seeds > extend_cfg.screen_most:
            raise ValueError(
                f"seeds={extend_cfg.seeds} must be <= screen_most={extend_cfg.screen_most}, the seeds screened for them"
            )
        factors, L0 = numbers("factors", extend_cfg.factors, float, 1.0, "2,4"), model_cfg.block_size
        common = cls.common(
            extend_cfg,
            model_cfg,
            train_cfg,
            batch_cfg,
            sorted({L0} | {round(m * L0) for s in factors for m in (s, 2 * s)}),
        )
        probe = Probe(
            common["meta"],
            L0,
            extend_cfg,
            extend_cfg.probe_pairs,
            train_cfg.batch_size * L0,
            common["runtime"].device,
            lengths=[L0] + [round(m * s * L0) for s in factors for m in (1, 2)],
        )
        lab = cls(
            **common,
            bases=numbers("rope_bases", extend_cfg.rope_bases, float, 1.0, "200,10000"),
            methods=methods,
            factors=factors,
            lrs=numbers("finetune_lrs", extend_cfg.finetune_lrs, float, 1e-12, "3e-4,1e-3,3e-3"),
            steps=numbers("finetune_steps", extend_cfg.finetune_steps, int, 1, "100,200,400"),
            probe=probe,
        )
        for method in methods:  # a bad setting fails now, not after the base models trained
            lab.finetune(lab.bases[0], method, factors[0], train_cfg.seed, lab.lrs[0])
        return lab

    @property
    def sweeps_rates(self):
        """Whether the arms' rates are chosen on a selection seed: where finetune_lrs names more than one."""
        return len(self.lrs) > 1

    @property
    def unswept(self):
        """Every arm's rate where none is chosen (lab/sweep.py)."""
        return self.lrs[0]

    def included(self, selection, seeds):
        """This plan with the seeds screening admitted: the selection seeds its sweeps ran on, the test seeds."""
        return replace(self, chosen_selection=selection, seeds=seeds)

    @property
    def L0(self):
        return self.model_cfg.block_size

    def base(self, b, seed, max_iters=None):
        """(out, model config, train config) of the base run of RoPE base b (up to max_iters, its stage; by default
        the gate's ceiling)."""
        train_cfg = replace(
            self.train_cfg, seed=seed, max_iters=max_iters or self.train_cfg.max_iters, lr_decay_iters=None
        )
        return self.out / "base" / f"rope-b{b:g}-seed{seed}", replace(self.model_cfg, rope_base=float(b)), train_cfg

    def schedule(self, train_cfg, decay_from=None):
        """A base run's schedule: its rate held until the gate passed at decay_from (None: not yet)."""
        extend_cfg = self.settings
        return GateSchedule(train_cfg, extend_cfg.base_gate, extend_cfg.base_check, extend_cfg.base_decay, decay_from)

    def finetune(self, b, method, s, seed, lr, steps=None):
        """(out, model config, train config, batch config) of a fine-tune of RoPE base b, up to steps (default the
        last read step); sweep runs (the selection seeds) in sweep/, test runs in finetune/."""
        scaling, pose, pose_tokens, headroom = METHODS[method]
        # direct fine-tuning: none, factor 1
        scaling, factor = scalings.scaling_pair(scaling, None, stretch=float(s * headroom))
        base_out, base_cfg, _ = self.base(b, seed)
        L0 = self.L0
        model_cfg = replace(
            base_cfg,
            block_size=L0 if pose else round(s * L0),
            rope_scaling=scaling,
            rope_scaling_factor=factor,
            original_len=L0,
        )
        rows = self.train_cfg.batch_size if pose_tokens else max(1, round(self.train_cfg.batch_size / s))
        train_cfg = replace(
            self.train_cfg,
            seed=seed,
            init_from=str(base_out),
            learning_rate=lr,
            min_lr=lr,
            muon_lr=self.train_cfg.muon_lr * lr / self.train_cfg.learning_rate,
            warmup_iters=self.settings.finetune_warmup,
            max_iters=steps or self.steps[-1],
            lr_decay_iters=None,
            eval_interval=self.settings.finetune_eval,
            batch_size=rows,
        )
        # PI's protocol fine-tunes on text alone, so retrieval past L0 is read zero-shot; the variant keeps the task
        row_cfg = self.batch_cfg if self.settings.finetune_rows == TASK_ROWS else BatchConfig()
        batch_cfg = replace(row_cfg, pose_factor=float(s)) if pose else row_cfg
        kind = "sweep" if self.sweeping(seed) else "finetune"
        return self.out / kind / f"rope-b{b:g}-{method}-x{s:g}-lr{lr:g}-seed{seed}", model_cfg, train_cfg, batch_cfg

    def sweeping(self, seed):
        """Whether seed is a selection seed's (it only chooses rates: its fine-tunes are probed at s L0 alone)."""
        return seed in self.settings.candidates("selection", self.train_cfg)

    def run(self, job):
        """The figures of one run, kept in its folder's result.json once it is complete, so a rerun reads them."""
        if job[0] == "base":  # its checkpoint is released once every fine-tune that starts from it is done
            return evaluated(self.folder(job) / "result.json", lambda: base_run(self, *job[1:]), self.reads(job))
        result = evaluated(self.folder(job) / "result.json", lambda: finetune_run(self, *job[1:]), self.reads(job))
        self.release(job)
        return result

    def reads(self, job):
        """The lab settings the figures of job's run read beyond its run folder's own (lab/grid.evaluated records
        them): its scores', and the steps it reads, which it grows to (check_run takes them as recorded)."""
        if job[0] == "base":
            return scoring(self) | {"max_iters": self.train_cfg.max_iters}
        extend_cfg = self.settings
        return scoring(self) | {
            "finetune_steps": self.steps,
            "plateau_span": extend_cfg.plateau_span,
            "plateau_tol": extend_cfg.plateau_tol,
        }

    def folder(self, job):
        return self.base(*job[1:])[0] if job[0] == "base" else self.finetune(*job[1:])[0]

    def check(self, job):
        """A run folder made with other settings, or with a record that cannot be read (a result.json is made
        again), is refused, what grows stage by stage aside: max_iters, and a base run's gate step."""
        if job[0] == "base":
            out, model_cfg, train_cfg = self.base(*job[1:])
            check_run(
                out,
                train_settings(model_cfg, train_cfg, self.batch_cfg, self.schedule(train_cfg)),
                grown=("train.max_iters", "schedule.decay_from"),
            )
        else:
            out, model_cfg, train_cfg, batch_cfg = self.finetune(*job[1:])
            check_run(out, train_settings(model_cfg, train_cfg, batch_cfg), grown=("train.max_iters",))
            base = Path(train_cfg.init_from)
            if self.pending(job) and (base / self.marker).is_file() and not (base / "ckpt.pt").is_file():
                raise ValueError(
                    f"{out} is left to train and its base model {base} kept no checkpoint (keep_checkpoints=false): "
                    f"delete {base} to train it again here, or rerun the part that trained it"
                )
        check_records(out, rebuilt=[self.marker])

    def needs(self, job):
        """The base run a fine-tune starts from."""
        return ("base", job[1], job[4]) if job[0] == "finetune" else None

    def label(self, job):
        if job[0] == "base":
            return f"rope-b{job[1]:g} seed {job[2]}"
        _, b, method, s, seed, lr = job
        return f"rope-b{b:g} {method} x{s:g} lr {lr:g} seed {seed}"

    def job(self, arm, lr, seed):
        return ("finetune", *arm, seed, lr)

    def pick(self, arm, tried, runs, done):
        """The rate rule (ExtendConfig.finetune_keep): the highest rate kept, widening upward where it is the highest
        tried, downward where none is."""
        kept = [rate for rate in tried if self.kept(runs[rate], done) >= self.settings.finetune_keep]
        return (kept[-1], kept[-1] == tried[-1]) if kept else (tried[0], True)

    def kept(self, runs, done):
        """The least, over the read steps, of the share of their base models' retrieval inside L0 (their runs in
        done) that fine-tunes ({job: result}, one a selection seed) keep, averaged over them."""
        shares = [extend_report.kept(run, done[self.needs(job)], self.L0) for job, run in runs.items()]
        return min(extend_report.mean_kept(shares).values())


# ----------------------------------------------------------------------------- evaluation


def loss_at(model, lab, L):
    return position_losses(model, lab.windows[L], lab.runtime).mean().item()


def scoring(lab, probed=True):
    """The lab settings a score reads beyond its run folder's own (lab/grid.evaluated records them): its loss's
    validation windows', and where it probes retrieval, the probe's."""
    return {"eval_tokens": lab.settings.eval_tokens} | (lab.probe.made_with if probed else {})


def activation_bytes(model_cfg, train_cfg, batch_cfg, lab):
    """Bytes autograd saves for backward in one micro-batch of a run's shape: what a longer row costs in memory, the
    measure PoSE's claim is about (it keeps L0-long rows), the same on any device."""
    torch.manual_seed(0)
    model = GPT(replace(model_cfg, dropout=0.0)).to(lab.runtime.device)
    batches = make_batches(
        batch_cfg,
        Path(train_cfg.data_dir) / train_cfg.dataset,
        lab.meta,
        model_cfg.block_size,
        train_cfg.batch_size,
        0,
        lab.runtime.device,
        1,
    )
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()  # each storage once
        return t

    batch = batches.train(0, 0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(batch.x, batch.y, position_ids=batch.position_ids)[1].backward()
    return sum(saved.values())


# ----------------------------------------------------------------------------- runs


def base_run(lab, b, seed):
    """Train a base model in stages of base_check steps at a constant rate, probed at L0 after each, until every
    query slot retrieves base_gate of whole answers (max_iters at the most); then decay its rate over base_decay
    steps and probe it again: {"curve": {step: scores}, "gate": the step it passed (None: it did not), "steps",
    "passed": the gate passed and still passed after the decay, "train_s"}."""
    out, model_cfg, train_cfg = lab.base(b, seed)
    extend_cfg, curve, gate, stage = lab.settings, {}, None, 0

    def probe_after(step, schedule):
        train_run("base", model_cfg, replace(train_cfg, max_iters=step), out, lab.batch_cfg, schedule)
        curve[str(step)] = evaluated(out / f"curve{step}.json", lambda: probed(lab, out, step), scoring(lab))
        return min(curve[str(step)]["slot"].values()) >= extend_cfg.base_gate

    while gate is None and stage < train_cfg.max_iters:
        stage = min(stage + extend_cfg.base_check, train_cfg.max_iters)
        gate = stage if probe_after(stage, lab.schedule(train_cfg)) else None
    passed = gate is not None and (
        not extend_cfg.base_decay or probe_after(gate + extend_cfg.base_decay, lab.schedule(train_cfg, gate))
    )
    return {
        "curve": curve,
        "gate": gate,
        "steps": max(map(int, curve)),
        "passed": passed,
        "train_s": trained_seconds(out),
    }


def probed(lab, out, step):
    """A base model's scores at L0 after step: retrieval by query slot, the probe's counts by distance, its loss."""
    model = checked_model(out, lab.runtime, step)
    return {
        "slot": lab.probe.by_slot(model, lab.L0, lab.runtime),
        "counts": lab.probe.counts(model, lab.L0, lab.runtime),
        "loss": loss_at(model, lab, lab.L0),
    }


def trained_seconds(out):
    """The training seconds of a run folder, from its checkpoint (a resumed run's clock runs on)."""
    return load_checkpoint(out / "ckpt.pt")["elapsed_s"]


def finetune_run(lab, b, method, s, seed, lr):
    """Fine-tune in stages of finetune_eval steps (a resume is exact, so the stages add up to one run) to the last of
    the read steps, measuring the L0 loss after each stage, scored at step 0 (the base model with the scaling
    alone) and at each read step: {"l0_curve": {step: loss}, "plateau": where the L0 loss levelled off (None: not
    within these steps), "scores": {step: ...}, "lr", "train_s", "tokens"}. The selection seeds' runs, which only
    choose a rate, are probed at s L0 after training alone."""
    out, model_cfg, train_cfg, batch_cfg = lab.finetune(b, method, s, seed, lr)
    base_out, L0, extend_cfg = lab.base(b, seed)[0], lab.L0, lab.settings
    lengths, testing = [L0, round(s * L0), round(2 * s * L0)], not lab.sweeping(seed)

    def windows(step):
        """The probe's windows at step: the target s L0 (PI's passkey test spreads its distances over the target
        window), and at the read step 2s L0 too, past it (the probe's dearest windows, which only claims read); a
        selection seed's, which only the rate rule reads, at s L0 after training alone."""
        if not testing:
            return {"target": lengths[1]} if step else {}
        return {"target": lengths[1]} | ({"past": lengths[2]} if step == lab.steps[-1] else {})

    def scores(where, step=None, **changes):
        """Loss at L0, s L0 and 2s L0; at the read step what context past L0 is worth (in windows of s L0); the
        probe's counts in its windows at step."""
        model = checked_model(where, lab.runtime, step, **changes)
        found = {"retrieval": {name: lab.probe.counts(model, W, lab.runtime) for name, W in windows(step).items()}}
        worth = (
            {"context": context_value(model, lab.windows[lengths[1]], L0, lab.runtime)} if step == lab.steps[-1] else {}
        )
        return {"loss": {str(L): loss_at(model, lab, L) for L in lengths}} | worth | found

    def made_with(step):
        return scoring(lab) | {"windows": windows(step)}

    scaled = {"rope_scaling": model_cfg.rope_scaling, "rope_scaling_factor": model_cfg.rope_scaling_factor}
    done = {"0": evaluated(out / "step0.json", lambda: scores(base_out, **scaled), made_with(None))}
    l0_curve = {"0": done["0"]["loss"][str(L0)]}
    for step in range(extend_cfg.finetune_eval, lab.steps[-1] + 1, extend_cfg.finetune_eval):
        train_run(method, model_cfg, replace(train_cfg, max_iters=step), out, batch_cfg)
        if step in lab.steps:  # scores holds the L0 loss: one load and one L0 loss, not two
            done[str(step)] = evaluated(out / f"step{step}.json", functools.partial(scores, out, step), made_with(step))
            l0_curve[str(step)] = done[str(step)]["loss"][str(L0)]
        else:
            l0_curve[str(step)] = evaluated(
                out / f"l0-{step}.json",
                lambda step=step: {"loss": loss_at(checked_model(out, lab.runtime, step), lab, L0)},
                scoring(lab, probed=False),
            )["loss"]
    return {
        "l0_curve": l0_curve,
        "plateau": plateau(l0_curve, extend_cfg),
        "scores": done,
        "lr": lr,
        "train_s": trained_seconds(out),
        "tokens": lab.steps[-1] * train_cfg.batch_size * model_cfg.block_size,
    }


def plateau(l0_curve, extend_cfg):
    """The first step where the L0 loss had fallen by less than plateau_tol over the last plateau_span steps; None
    where it never had."""
    return next(
        (
            int(st)
            for st in l0_curve
            if int(st) >= extend_cfg.plateau_span
            and l0_curve[str(int(st) - extend_cfg.plateau_span)] - l0_curve[st] < extend_cfg.plateau_tol
        ),
        None,
    )


# ----------------------------------------------------------------------------- the lab


def screening(lab, done):
    """Which seeds the base models in done decide, by the rule fixed in the settings: for each role, {"screened": the
    seeds whose base models are wanted, "passed", "included"}. A role's candidates are screened in order as far as
    still needed (its seeds passed and undecided fewer than it wants); a seed is included once it passed and every
    seed before it is decided. A part (settings.part) screens every parts-th test candidate from its place, for its
    share of the seeds; the parts' runs merged are read in order as one run's, and a seed that no part screened
    before the last one included is screened then. Raises ValueError once screen_most seeds of a role were decided
    with fewer passing than it needs."""
    extend_cfg, found = lab.settings, {}
    wants = {"selection": extend_cfg.selection_seeds if lab.sweeps_rates else 0, "test": extend_cfg.seeds}
    for role, wanted in wants.items():
        candidates = extend_cfg.candidates(role, lab.train_cfg)
        if role == "test":  # every part screens all the selection seeds
            candidates, wanted = extend_cfg.part_seeds(candidates), len(extend_cfg.part_seeds(range(wanted)))
        screened, passed, included, undecided = [], [], [], 0
        for seed in candidates:
            if len(passed) + undecided >= wanted:
                break
            screened.append(seed)
            runs = [done.get(("base", b, seed)) for b in lab.bases]
            if None in runs:
                undecided += 1
            elif all(run["passed"] for run in runs):
                passed.append(seed)
                if not undecided:  # every seed before it decided
                    included.append(seed)
        if len(passed) < wanted and not undecided and len(screened) == len(candidates):
            share = f", part {extend_cfg.part} of {extend_cfg.parts}" if role == "test" and extend_cfg.part else ""
            raise ValueError(
                f"{len(passed)} of the {len(screened)} {role} seeds screened (screen_most{share}) passed the gate "
                f"({', '.join(map(str, screened))}); {wanted} needed: raise screen_most, or max_iters for the base "
                f"models to learn in"
            )
        found[role] = {"screened": screened, "passed": passed, "included": included}
    return found


def screened_jobs(lab, done):
    """sweep_and_test's screen: the base models wanted, the selection seeds once they all passed, the test seeds
    included so far. The selection seeds' fine-tunes start from their bases alone, which no inclusion reads."""
    found = screening(lab, done)
    bases = [("base", b, seed) for role in ROLES for seed in found[role]["screened"] for b in lab.bases]
    return bases, selection_seeds(lab, found), found["test"]["included"]


def selection_seeds(lab, found):
    """The selection seeds screening admitted, once as many as the sweeps run on passed (None before)."""
    included = found["selection"]["included"]
    return included if len(included) == lab.settings.selection_seeds else None


def run_flops(lab, job, base_steps):
    """The FLOPs of job's training and scoring, a base model's trained to base_steps: what a dry run's estimate
    counts (flops_per_token counts a forward and its backward, a forward alone a third)."""
    settings, probe, L0 = lab.settings, lab.probe, lab.L0
    if job[0] == "base":
        _, model_cfg, train_cfg = lab.base(*job[1:])
        fpt = GPT(model_cfg).flops_per_token(L0)
        checks = -(-base_steps // settings.base_check) + bool(settings.base_decay)
        read = (len(probe.windows[L0][0]) + len(probe.slots[L0])) * L0 + settings.eval_tokens
        return (base_steps * train_cfg.batch_size * L0 + checks * read / 3) * fpt
    _, model_cfg, train_cfg, _ = lab.finetune(*job[1:])
    fpt, s, steps = GPT(model_cfg).flops_per_token, job[3], lab.steps
    target, past = round(s * L0), round(2 * s * L0)
    read = (len(steps) + 1) * sum(settings.eval_tokens * fpt(L) for L in (L0, target, past))
    read += steps[-1] // settings.finetune_eval * settings.eval_tokens * fpt(L0)  # the L0 curve
    # the probe, in windows of s L0 at each score and of 2s L0 at the last; a selection seed's at s L0 after training
    testing = not lab.sweeping(job[4])
    read += (len(steps) + testing) * len(probe.windows[target][0]) * target * fpt(target)
    read += testing * len(probe.windows[past][0]) * past * fpt(past)
    return train_cfg.max_iters * train_cfg.batch_size * model_cfg.block_size * fpt(model_cfg.block_size) + read / 3


def print_parts(lab, arms, sweeps):
    """Each part's share of the test seeds and its estimated wall time here, from the FLOP/s a training step reaches
    on a worker's threads: its seeds' base models and fine-tunes, with the selection seeds' and their sweeps, which
    every part runs, from every base model passing at its first check to every one passing at its ceiling."""
    settings, rate = lab.settings, lab.calibrate(replace(lab.model_cfg, rope_base=lab.bases[0]))
    test, sel = lab.train_cfg.seed, settings.selection_seed
    lr = lab.lrs[0]

    def minutes(seeds, base_steps):
        bases = len(lab.bases) * run_flops(lab, ("base", lab.bases[0], test), base_steps)
        tests = seeds * (bases + sum(run_flops(lab, lab.job(arm, lr, test), None) for arm in arms))
        sweeping = sum(len(rates) * run_flops(lab, lab.job(arm, lr, sel), None) for arm, rates in sweeps.items())
        selection = (bases + sweeping) * settings.selection_seeds if sweeps else 0
        return (tests + selection) / rate / 60 / settings.workers

    def rounded(x):
        return f"{x:.0f}" if x >= 10 else f"{x:.3g}"  # 3 digits: a tiny grid's parts differ by a few percent

    first, ceiling = settings.base_check + settings.base_decay, lab.train_cfg.max_iters + settings.base_decay
    candidates = settings.candidates("test", lab.train_cfg)
    for part in range(1, settings.parts + 1):
        seeds = len(settings.part_seeds(range(settings.seeds), part))
        print(
            f"part {part} of {settings.parts} (--part={part}): the first {seeds} of seeds "
            f"{', '.join(map(str, settings.part_seeds(candidates, part)))} whose "
            f"base models pass, about {rounded(minutes(seeds, first))} to {rounded(minutes(seeds, ceiling))} min wall "
            "here, every base "
            "model passing at its first check or at its ceiling (a base model that fails adds its own time), from "
            f"FLOPs at the {rate / 1e9:.1f} GFLOP/s a training step reached here just now"
        )


def run_lab(lab):
    t0 = time.perf_counter()
    arms = [(b, m, s) for b in lab.bases for s in lab.factors for m in lab.methods]
    sweeps = {arm: list(lab.lrs) for arm in arms} if lab.sweeps_rates else {}
    if lab.settings.dry_run:
        bases = screened_jobs(lab, {})[0]
        roles = ROLES if lab.sweeps_rates else ROLES[1:]  # one rate: no selection seed is screened
        candidates = {seed for role in roles for seed in lab.settings.candidates(role, lab.train_cfg)}
        more = Launch(
            f"the next seed's, up to {lab.settings.screen_most} seeds a role",
            most=len(candidates) * len(lab.bases) - len(bases),
            when="as each base model fails the gate",
        )
        if lab.settings.parts > 1:  # the estimate times a training step here: none for one part, which may be a GPU's
            print_parts(lab, arms, sweeps)
        lab.dry_run(sweeps, screening=[Launch("screening", bases), more], arms=arms)
    with RunLock(lab.out, "context-extension lab"):
        done, sweeps, rates = lab.sweep_and_test(arms, sweeps, screen=lambda done: screened_jobs(lab, done))
        for job in done:
            if job[0] == "base":
                lab.release(job)
        found = screening(lab, done)
        if lab.settings.part:
            lab.part_done(found["test"]["included"], ["base", "sweep", "finetune"])
            return
        chosen = lab.included(selection_seeds(lab, found), found["test"]["included"])
        memory = {
            f"{m} x{s:g}": activation_bytes(*lab.finetune(lab.bases[0], m, s, chosen.seeds[0], lab.lrs[0])[1:], lab)
            for s in lab.factors
            for m in lab.methods
        }
        results = extend_report.lab_results(chosen, done, sweeps, rates, found) | {
            "memory": memory,
            "settings": {
                "extend": asdict(lab.settings),
                **portable(train_settings(lab.model_cfg, lab.train_cfg, lab.batch_cfg)),
            },
            "device": lab.runtime.device,
            "environment": run_record(),
        }
        lab.write_results(results, extend_report.write_plots(results, lab.out), extend_report.markdown, t0)


main = tool_main(__doc__, ExtendConfig, Lab.make, run_lab)


if __name__ == "__main__":
    main()
