"""Context extension: fine-tune RoPE past its trained length (PI, NTK, YaRN, PoSE) until it levels off, and ask the
papers' questions of loss and of retrieval by distance, over seeds fixed before the run, with the verdicts their
tests allow.

    python -m lab.extend configs/extend_cpu.toml [--key=value ...]

1. Base models: RoPE (each of `rope_bases`) trained at L0 = block_size for each seed, recall_share of the sequences
   carrying the associative-recall task (data/recall.py), probed at L0 every `base_check` steps: the learning curve
   of retrieval by distance and by query slot. A base model trains until every query slot retrieves at least
   `base_gate` of whole answers (the task learned without the elimination shortcut), max_iters at the most.
2. Fine-tuning at s x L0 for each s in `factors` and each of `methods`: none (direct fine-tuning at the new
   length), linear (Position Interpolation, PI), ntk, yarn, and PoSE (L0-long rows whose position ids skip ahead
   to s x L0, with linear scaling: `pose` at PI's steps and rows, `pose-tokens` at PI's tokens). The tokens per step
   are kept (batch_size / s rows of s x L0), the optimizer restarts (train.py's init_from), the rate warms up for
   `finetune_warmup` steps and then stays constant. A fine-tune runs until its L0 loss levels off (fell by less than
   `plateau_tol` over the last `plateau_span` steps, measured every `finetune_eval` steps), `finetune_max` steps at
   the most (the PI paper's 1,000); it is scored at each of `finetune_scored` below that and at its plateau: loss at
   L0, s L0 and 2s L0, and retrieval by distance in windows of s L0 (the target), at the plateau also of 2s L0.
   Step 0 is the base model with the scaling alone.
3. Rates: each method and factor fine-tunes the selection seed (`selection_seed`, in no test) at each of
   `finetune_lrs`, widened by one more rate where the best is at the sweep's edge; its lowest loss at s L0 at the
   plateau sets the rate of every test seed.
4. Claims: the papers' claims as paired tests over the test seeds (lab/stats.py), one Holm family for the table.

out_dir receives base/, sweep/ and finetune/ run folders (one train.py run each, with its evaluations),
results.json, results.md and, with matplotlib, the plots. Rerunning the same command resumes. Settings:
ExtendConfig (here, with the probe's and the launcher's), GPTConfig, TrainConfig and BatchConfig; `python -m
lab.extend --help` lists them all.
"""

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

import config
import rope
from checkpoint import load_checkpoint, model_from_checkpoint
from config import NON_NEGATIVE, POSITIVE, RATE, opt
from data.batches import make_batches
from files import RunLock
from lab import extend_report
from lab.evaluation import position_losses
from lab.grid import (check_records, check_run, evaluated, number_list, numbers, split_list, train_run,
                      train_settings)
from lab.retrieval import Probe, ProbeSettings, kmax
from lab.sweep import Plan, SweepSettings, tool_main
from model import GPT
from runtime import run_record

# method -> (the RoPE scaling it fine-tunes with, whether its rows are PoSE's, whether PoSE keeps PI's tokens)
METHODS = {"none": (rope.NO_SCALING, False, False), "linear": ("linear", False, False), "ntk": ("ntk", False, False),
           "yarn": ("yarn", False, False), "pose": ("linear", True, False), "pose-tokens": ("linear", True, True)}


@dataclass
class ExtendConfig(ProbeSettings, SweepSettings):
    rope_bases: str = opt("200", "RoPE's bases: base models and fine-tunes for each (200 puts L0 = 64 at LLaMA-2's "
                                 "longest-wavelength-to-context ratio with head size 32)",
                          check=number_list(float, 1.0, "200,10000"))
    methods: str = opt("none,linear,ntk,yarn", "fine-tuning methods: " + ", ".join(METHODS) + " (none: direct "
                                               "fine-tuning; linear: PI)")
    factors: str = opt("2,4", "extension factors s: fine-tune at s x block_size, comma-separated",
                       check=number_list(float, 1.0, "2,4"))
    base_check: int = opt(500, "base models are probed at L0 every this many steps (their learning curve)",
                          check=POSITIVE)
    base_gate: float = opt(0.9, "a base model stops once every query slot retrieves at least this share of whole "
                                "answers at L0 (max_iters at the most)", check=config.SHARE)
    finetune_lrs: str = opt("3e-4,1e-3,3e-3", "fine-tuning peak rates swept on the selection seed (Muon's, where "
                                              "it trains, scaled alike from its pre-training peak)",
                             check=number_list(float, 1e-12, "3e-4,1e-3,3e-3"))
    finetune_warmup: int = opt(20, "fine-tuning's linear warmup steps (the PI paper's 20); the rate then stays "
                                   "constant", check=NON_NEGATIVE)
    finetune_eval: int = opt(50, "a fine-tune's L0 loss is measured every this many steps", check=POSITIVE)
    plateau_span: int = opt(100, "a fine-tune has levelled off when its L0 loss fell by less than plateau_tol over "
                                 "the last this many steps", check=POSITIVE)
    plateau_tol: float = opt(0.01, "see plateau_span (nats)", check=RATE)
    finetune_max: int = opt(1000, "a fine-tune's most steps (the PI paper fine-tunes 1,000)", check=POSITIVE)
    finetune_scored: str = opt("0,50,200", "fine-tuning steps scored in full below the plateau, which is too; 0 is "
                                           "the base model with the scaling alone",
                                check=number_list(int, 0, "0,50,200"))
    early_step: int = opt(50, "the early fine-tuning step the claims are also read at (the PI paper's Table 4 "
                              "reads k_max at steps from 200)", check=POSITIVE)

    def __post_init__(self):
        ProbeSettings.__post_init__(self)
        config.validate(self)
        if self.plateau_span % self.finetune_eval or self.finetune_max % self.finetune_eval:
            raise ValueError(f"plateau_span={self.plateau_span} and finetune_max={self.finetune_max} must be "
                             f"multiples of finetune_eval={self.finetune_eval}, the steps the L0 loss is measured at")


@dataclass
class Lab(Plan):
    """lab/sweep.py's plan, with the context-extension lab's: a job is ("base", b, seed) or ("finetune", b, method,
    s, seed, lr), an arm (b, method, s)."""
    bases: list
    methods: list
    factors: list
    lrs: list
    scored: list
    probe: Probe  # retrieval at L0 and at each fine-tune's s L0 and 2s L0

    desc = "extend"

    @classmethod
    def make(cls, ec, gcfg, tc, bc):
        if not gcfg.takes("rope_scaling"):
            raise ValueError(f"pos_emb={gcfg.pos_emb!r}: the lab fine-tunes RoPE with its scalings; use pos_emb=rope")
        methods = split_list(ec.methods)
        for m in methods:
            if m not in METHODS:
                raise ValueError(f"methods: {m!r} is unknown; choose from {', '.join(METHODS)}")
        if not bc.recall_share:
            raise ValueError("recall_share=0: the lab's retrieval probe needs the task in training; set recall_share, "
                             "e.g. 0.75")
        scored = numbers("finetune_scored", ec.finetune_scored, int, 0, "0,50,200")
        if (scored[0] != 0 or scored[-1] >= ec.finetune_max or ec.early_step not in scored
                or any(st % ec.finetune_eval for st in scored)):
            raise ValueError(f"finetune_scored={ec.finetune_scored!r} must start at 0 (the base model), end below "
                             f"finetune_max={ec.finetune_max}, hold early_step={ec.early_step} and be multiples of "
                             f"finetune_eval={ec.finetune_eval}")
        factors, L0 = numbers("factors", ec.factors, float, 1.0, "2,4"), gcfg.block_size
        common = cls.common(ec, gcfg, tc, bc, sorted({L0} | {round(m * L0) for s in factors for m in (s, 2 * s)}))
        probe = Probe(common["meta"], L0, ec, ec.probe_pairs, tc.batch_size * L0, common["rt"].device,
                      lengths=[L0] + [round(m * s * L0) for s in factors for m in (1, 2)])
        lab = cls(**common, bases=numbers("rope_bases", ec.rope_bases, float, 1.0, "200,10000"), methods=methods,
                  factors=factors, lrs=numbers("finetune_lrs", ec.finetune_lrs, float, 1e-12, "3e-4,1e-3,3e-3"),
                  scored=scored, probe=probe)
        for method in methods:  # a bad setting fails now, not after the base models trained
            lab.finetune(lab.bases[0], method, factors[0], tc.seed, lab.lrs[0])
        return lab

    @property
    def L0(self):
        return self.gcfg.block_size

    def base(self, b, seed, max_iters=None):
        """(out, model config, train config) of the base run of RoPE base b (up to max_iters, its stage)."""
        tc = replace(self.tc, seed=seed, max_iters=max_iters or self.tc.max_iters, lr_decay_iters=self.tc.max_iters)
        return self.out / "base" / f"rope-b{b:g}-seed{seed}", replace(self.gcfg, rope_base=float(b)), tc

    def finetune(self, b, method, s, seed, lr, steps=None):
        """(out, model config, train config, batch config) of a fine-tune of RoPE base b, up to steps (default its
        ceiling); sweep runs (the selection seed) in sweep/, test runs in finetune/."""
        scaling, pose, pose_tokens = METHODS[method]
        base_out, base_cfg, _ = self.base(b, seed)
        L0 = self.L0
        gcfg = replace(base_cfg, block_size=L0 if pose else round(s * L0), rope_scaling=scaling,
                       rope_scaling_factor=float(s) if scaling != rope.NO_SCALING else 1.0, original_len=L0)
        rows = self.tc.batch_size if pose_tokens else max(1, round(self.tc.batch_size / s))
        tc = replace(self.tc, seed=seed, init_from=str(base_out), learning_rate=lr, min_lr=lr,
                     muon_lr=self.tc.muon_lr * lr / self.tc.learning_rate, warmup_iters=self.settings.finetune_warmup,
                     max_iters=steps or self.settings.finetune_max, lr_decay_iters=None,
                     eval_interval=self.settings.finetune_eval, batch_size=rows)
        bc = replace(self.bc, pose_factor=float(s)) if pose else self.bc
        kind = "sweep" if seed == self.settings.selection_seed else "finetune"
        return self.out / kind / f"rope-b{b:g}-{method}-x{s:g}-lr{lr:g}-seed{seed}", gcfg, tc, bc

    def run(self, job):
        """The figures of one run, kept in its folder's result.json once it is complete, so a rerun reads them."""
        work = (lambda: base_run(self, *job[1:])) if job[0] == "base" else lambda: finetune_run(self, *job[1:])
        return evaluated(self.folder(job) / "result.json", work)

    def folder(self, job):
        return self.base(*job[1:])[0] if job[0] == "base" else self.finetune(*job[1:])[0]

    def check(self, job):
        """A run folder made with other settings, or with a record that cannot be read (a result.json is made
        again), is refused, max_iters aside: runs grow stage by stage."""
        out, gcfg, tc, *bc = self.base(*job[1:]) if job[0] == "base" else self.finetune(*job[1:])
        check_run(out, train_settings(gcfg, tc, *bc or [self.bc]), staged=True)
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

    def loss(self, run, arm):
        """A fine-tune's loss at s L0 at its plateau."""
        return run["scores"][str(run["plateau"])]["loss"][str(round(arm[2] * self.L0))]


# ----------------------------------------------------------------------------- evaluation

def loss_at(model, lab, L):
    return position_losses(model, lab.windows[L], lab.rt).mean().item()


def retrieval(model, lab, W):
    """{"distance": {k: share}, "kmax": {threshold name: k}} in windows of W tokens."""
    by_k = lab.probe.by_distance(model, W, lab.rt)
    return {"distance": by_k, "kmax": {name: kmax(by_k, th) for name, th in extend_report.THRESHOLDS.items()}}


def activation_bytes(gcfg, tc, bc, lab):
    """Bytes autograd saves for backward in one micro-batch of a run's shape: what a longer row costs in memory, the
    measure PoSE's claim is about (it keeps L0-long rows), the same on any device."""
    torch.manual_seed(0)
    model = GPT(replace(gcfg, dropout=0.0)).to(lab.rt.device)
    batches = make_batches(bc, Path(tc.data_dir) / tc.dataset, lab.meta, gcfg.block_size, tc.batch_size, 0,
                           lab.rt.device, 1)
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
    """Train a base model in stages of base_check steps, probed at L0 after each, until every query slot retrieves
    base_gate of whole answers (max_iters at the most): {"curve": {step: scores}, "steps", "learned", "train_s"}."""
    out, gcfg, tc = lab.base(b, seed)
    curve, learned, stage = {}, False, 0
    while stage < tc.max_iters and not learned:
        stage = min(stage + lab.settings.base_check, tc.max_iters)
        train_run("base", gcfg, lab.base(b, seed, stage)[2], out, lab.bc)
        curve[str(stage)] = evaluated(out / f"curve{stage}.json", lambda: probed(lab, out, stage))
        learned = min(curve[str(stage)]["slot"].values()) >= lab.settings.base_gate
    return {"curve": curve, "steps": stage, "learned": learned, "train_s": trained_seconds(out)}


def probed(lab, out, step):
    """A base model's scores at L0 after step: retrieval by query slot and by distance, and its loss."""
    model = checked_model(out, lab.rt, step)
    return {"slot": lab.probe.by_slot(model, lab.L0, lab.rt), **retrieval(model, lab, lab.L0),
            "loss": loss_at(model, lab, lab.L0)}


def checked_model(out, rt, step=None, **changes):
    """The model of out's checkpoint, at iteration step where given: a figure is never filed under another step."""
    ckpt = load_checkpoint(out / "ckpt.pt", rt.device)
    assert step is None or ckpt["iter"] == step, f"{out / 'ckpt.pt'} is at iteration {ckpt['iter']}, not {step}"
    model = model_from_checkpoint(ckpt, rt.device).eval()
    return model.reconfigure(**changes) if changes else model


def trained_seconds(out):
    """The training seconds of a run folder, from its checkpoint (a resumed run's clock runs on)."""
    return load_checkpoint(out / "ckpt.pt")["elapsed_s"]


def finetune_run(lab, b, method, s, seed, lr):
    """Fine-tune in stages of finetune_eval steps (a resume is exact, so the stages add up to one run) until the L0
    loss levels off or finetune_max, scored at step 0 (the base model with the scaling alone), at each of
    finetune_scored it passes, and at its plateau: {"l0_curve": {step: loss}, "plateau", "scores": {step: ...}}."""
    out, gcfg, tc, bc = lab.finetune(b, method, s, seed, lr)
    base_out, L0, ec = lab.base(b, seed)[0], lab.L0, lab.settings
    lengths = [L0, round(s * L0), round(2 * s * L0)]

    def scores(where, step=None, past=False, **changes):
        """Loss at L0, s L0 and 2s L0; retrieval by distance in windows of the target s L0 (PI's passkey test spreads
        its distances over the target window), and at the plateau past it, in windows of 2s L0."""
        model = checked_model(where, lab.rt, step, **changes)
        found = {"target": retrieval(model, lab, lengths[1])} | ({"past": retrieval(model, lab, lengths[2])} if past
                                                                  else {})
        return {"loss": {str(L): loss_at(model, lab, L) for L in lengths}, "retrieval": found}
    scaled = {"rope_scaling": gcfg.rope_scaling, "rope_scaling_factor": gcfg.rope_scaling_factor}
    done = {"0": evaluated(out / "step0.json", lambda: scores(base_out, **scaled))}
    l0_curve, step = {"0": done["0"]["loss"][str(L0)]}, 0
    while step < ec.finetune_max and not plateaued(l0_curve, ec):
        step += ec.finetune_eval
        train_run(method, gcfg, replace(tc, max_iters=step), out, bc)
        l0_curve[str(step)] = evaluated(out / f"l0-{step}.json", lambda: {
            "loss": loss_at(checked_model(out, lab.rt, step), lab, L0)})["loss"]
        if step in lab.scored:
            done[str(step)] = evaluated(out / f"step{step}.json", lambda: scores(out, step))
    done[str(step)] = evaluated(out / f"plateau{step}.json", lambda: scores(out, step, past=True))  # the plateau
    return {"l0_curve": l0_curve, "plateau": step, "scores": done, "lr": lr, "train_s": trained_seconds(out),
            "tokens": step * tc.batch_size * gcfg.block_size}


def plateaued(l0_curve, ec):
    """Whether the L0 loss fell by less than plateau_tol over the last plateau_span steps."""
    last = max(map(int, l0_curve))
    return last >= ec.plateau_span and l0_curve[str(last - ec.plateau_span)] - l0_curve[str(last)] < ec.plateau_tol


# ----------------------------------------------------------------------------- the lab

def run_lab(lab):
    t0 = time.perf_counter()
    sel = lab.settings.selection_seed
    arms = [(b, m, s) for b in lab.bases for s in lab.factors for m in lab.methods]
    sweeps = {arm: list(lab.lrs) for arm in arms}
    # the selection seed's bases first, then its sweeps as each base is done, the test bases meanwhile
    bases = [("base", b, sel) for b in lab.bases], [("base", b, seed) for b in lab.bases for seed in lab.seeds]
    if lab.settings.dry_run:
        lab.dry_run(sweeps, *bases)
    with RunLock(lab.out, "context-extension lab"):
        done, sweeps, rates = lab.sweep_and_test(arms, sweeps, *bases)
        memory = {f"{m} x{s:g}": activation_bytes(*lab.finetune(lab.bases[0], m, s, sel, lab.lrs[0])[1:], lab)
                  for s in lab.factors for m in lab.methods}
        results = extend_report.lab_results(lab, done, sweeps, rates) | {
            "memory": memory, "settings": {"extend": asdict(lab.settings), **train_settings(lab.gcfg, lab.tc, lab.bc)},
            "device": lab.rt.device, "environment": run_record()}
        lab.write_results(results, extend_report.write_plots(results, lab.out), extend_report.markdown, t0)


main = tool_main(__doc__, ExtendConfig, Lab.make, run_lab)


if __name__ == "__main__":
    main()
