"""Compare positional schemes fairly: a grid of schemes x seeds, length extrapolation, tables and plots.

    python -m lab.ablate configs/ablate_cpu.toml [--key=value ...]
    python -m lab.ablate configs/ablate_cpu.toml --dry_run=true      print the grid, its launches and estimated time

Every run of a seed sees the same batches in the same order (data.loader.Batches draws them from
(seed, step), not from global RNG state) and the same token budget, so differences between
schemes are paired by seed. With lr_scales, each scheme first trains on the selection seeds (selection_seeds of
them from selection_seed, in no test) at each multiple of the learning rates, the sweep widened where its best (the
lowest loss averaged over those seeds) lies at an edge, and its best takes every test seed: one ranking at the
shared rate, one with each scheme at its own (DroPE's variants run at the shared rate:
they are RoPE until the drop, and the recalibration's own rate is their axis). After training at context
L0 = block_size each model is scored on fixed validation windows at multiples of L0 (RoPE models also with
inference-time scaling, factor L/L0, beyond L0), on retrieval by needle-to-query distance (lab/retrieval.py)
where training carries the recall task, and its first seed's attention and score biases are recorded. Each
scheme against the reference is a paired test, one Holm family over the table (lab/stats.py). The runs go
through lab/launch.run_jobs: workers on this machine (each run's thread count is recorded, and tokens/s compared
only between equal counts) or Slurm jobs.
out_dir receives runs/<scheme>[-lr<scale>]-seed<S>/ (one train.py run each), results.json, and from
ablate_report.py results.md, results.csv and PNG plots (when matplotlib is installed).
Rerunning the same command skips finished runs and resumes an interrupted one.

Settings: AblateConfig (here), GPTConfig (model.py) and TrainConfig (train.py) together;
the TOML file may set any of them. `python -m lab.ablate --help` lists them all.
"""

if not __package__:  # typed as a path, the import path holds lab/ and not the project: the imports below would fail
    raise SystemExit("run it as a module, from the project's folder: python -m lab.ablate CONFIG [--key=value ...]")

import math
import statistics
import time
from dataclasses import asdict, dataclass, fields, replace

import torch

import config
import positions
import scalings
import train
from checkpoint import load_checkpoint
from config import opt
from data.recall import Recall
from data.tokenizer import tokenizer_from_meta
from files import RunLock
from generate import Sampling, generate
from lab import ablate_report, diagnostics
from lab.evaluation import checked_model, position_losses
from lab.grid import (
    check_run,
    evaluated,
    field_types,
    number_list,
    numbers,
    parse_changes,
    portable,
    run_dir,
    split_list,
    train_run,
    train_settings,
)
from lab.pool import Interrupted
from lab.report import regime_rows
from lab.retrieval import GOOD, THRESHOLDS, Probe, ProbeSettings, readout_errors
from lab.sweep import Plan as SweepPlan, SweepSettings, tool_main
from model import GPT, GPTConfig, scheme_class
from runtime import decode_autocast, run_record

REFERENCE = "rope"  # the scheme every other one is compared against, seed by seed
# what a RoPE variant may change: the settings declared to act on RoPE that its weights depend on (a scaling is
# scored at inference, beyond L0)
VARIANT_KEYS = tuple(
    f.name for f in fields(GPTConfig) if f.metadata["applies"] == positions.RoPE.name and f.metadata["weights"]
)


@dataclass(frozen=True)
class DroPE:
    """DroPE (Gelberg et al. 2025): RoPE dropped at a step, training going on without positions (a
    recalibration), with a schedule of its own when recalibration_lr is set; a variant's training keys."""

    drop_rope_at: int
    recalibration_lr: float | None = None  # the recalibration's peak, reached again by a warmup after the drop
    recalibration_warmup: int = 20

    def check(self, train_cfg):
        if not 0 < self.drop_rope_at < train_cfg.max_iters:
            raise ValueError(
                f"drop_rope_at={self.drop_rope_at} must lie between 0 and max_iters={train_cfg.max_iters}, "
                "leaving steps to recalibrate without RoPE"
            )
        if self.recalibration_lr is not None and not 0 < self.recalibration_lr < math.inf:
            raise ValueError(f"recalibration_lr={self.recalibration_lr} must be a finite rate > 0")


class DropSchedule(train.Schedule):
    """train.Schedule until DroPE's drop; from it pos_emb none, and with a recalibration_lr a warmup to that peak
    and a cosine to a tenth of it at max_iters."""

    def __init__(self, train_cfg, drope):
        super().__init__(train_cfg)
        self.drope = drope

    def lr(self, it):
        d = self.drope
        if d.recalibration_lr is None or it < d.drop_rope_at:
            return super().lr(it)
        return train.warmup_cosine(
            it - d.drop_rope_at,
            d.recalibration_lr,
            d.recalibration_warmup,
            self.train_cfg.max_iters - d.drop_rope_at,
            d.recalibration_lr / 10,
        )

    def model_config(self, it, model_cfg):
        return model_cfg.with_scheme("none") if it >= self.drope.drop_rope_at else model_cfg

    def settings(self):
        return asdict(self.drope)


TRAIN_VARIANT_KEYS = tuple(DroPE.__dataclass_fields__)  # what a variant may change of its training


@dataclass
class AblateConfig(ProbeSettings, SweepSettings):
    schemes: str = opt(",".join(positions.NAMES), "positional schemes to compare (pos_emb values), comma-separated")
    variants: str = opt("", "RoPE variants to add: 'name: key=value, ...; name: ...', keys " + ", ".join(VARIANT_KEYS))
    lr_scales: str = opt(
        "1",
        "multiples of the learning rates (learning_rate, min_lr, muon_lr together) each scheme "
        "tries on the selection seed, widened where its best is at an edge; its best takes "
        "every test seed (1 alone: one shared rate, no selection runs)",
        check=number_list(float, 1e-9, "0.5,1,2"),
    )
    equivalence_margin: float = opt(
        0.01,
        "nats: a scheme and the reference show no difference when an equivalence "
        "test puts their paired difference within this (run only where the seeds "
        "let it pass; elsewhere the CI is shown against it)",
        check=config.RATE,
    )
    learn_gate: float = opt(
        0.9,
        "a run has learned retrieval at the first evaluation at which every query slot "
        "retrieves at least this share of whole answers at L0 (steps-to-learn)",
        check=config.SHARE,
    )
    eval_lengths: str = opt("0.5,1,2,4,8", "context lengths to evaluate at, as multiples of block_size")
    rope_scalings: str = opt(
        ",".join((scalings.LINEAR, scalings.NTK, scalings.YARN)),
        "inference-time RoPE scalings scored beyond block_size (factor L/L0)",
    )
    sample_prompt: str = opt("ROMEO:", "prompt of the one sample per scheme")
    sample_tokens: int = opt(200, "tokens per sample (0: no samples)", check=config.NON_NEGATIVE)
    sample_temperature: float = opt(0.8, "sampling temperature of the samples (0: greedy)", check=config.NON_NEGATIVE)

    def __post_init__(self):
        ProbeSettings.__post_init__(self)
        SweepSettings.__post_init__(self)


# ----------------------------------------------------------------------------- the grid


def make_grid(ablate_cfg, model_cfg):
    """({scheme name: its GPTConfig}, in the order of the tables; {name: its DroPE, or None})."""
    for s in split_list(ablate_cfg.schemes):
        if s not in positions.NAMES:
            raise ValueError(f"schemes: {s!r} is not a positional scheme; choose from {', '.join(positions.NAMES)}")
    entries = [(s, {"pos_emb": s}) for s in split_list(ablate_cfg.schemes)]
    types = field_types(GPTConfig, VARIANT_KEYS) | field_types(DroPE, TRAIN_VARIANT_KEYS)
    entries += [(name, {"pos_emb": "rope", **o}) for name, o in parse_changes(ablate_cfg.variants, types)]
    names = [name for name, _ in entries]
    if not names:
        raise ValueError("schemes and variants are both empty; name at least one scheme, e.g. schemes=rope")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"each scheme and variant needs its own name; repeated: {', '.join(repeated)}")
    grid, drops = {}, {}
    for name, o in entries:
        drop = {k: o.pop(k) for k in TRAIN_VARIANT_KEYS if k in o}
        try:
            drops[name] = DroPE(**drop) if drop else None
            grid[name] = replace(model_cfg.with_scheme(o.pop("pos_emb")), **o)
        except TypeError:
            raise ValueError(
                f"variant {name!r}: DroPE's {', '.join(drop)} needs drop_rope_at, the step of the drop"
            ) from None
        except ValueError as e:
            raise ValueError(f"scheme {name!r}: {e}") from None
    return grid, drops


def param_counts(grid):
    """{scheme: parameters}, building each model once: it raises now what training would raise at its start."""
    counts = {}
    for name, cfg in grid.items():
        try:
            counts[name] = GPT(cfg).num_params(non_embedding=False)
        except ValueError as e:
            raise ValueError(f"scheme {name!r}: {e}") from None
    return counts


def eval_lengths(ablate_cfg, block_size):
    lengths = []
    for m in split_list(ablate_cfg.eval_lengths):
        L = round(config.coerce("eval_lengths", m, float) * block_size)
        if L < 1:
            raise ValueError(f"eval_lengths: {m} x block_size={block_size} is under one token; use larger multiples")
        lengths.append(L)
    if not lengths:
        raise ValueError("eval_lengths is empty; give multiples of block_size such as 0.5,1,2,4,8")
    return sorted(set(lengths))


def rope_scalings(ablate_cfg):
    names, valid = split_list(ablate_cfg.rope_scalings), [k for k in scalings.SCALINGS if k != scalings.NO_SCALING]
    for s in names:
        if s not in valid:
            raise ValueError(f"rope_scalings: {s!r} is unknown; choose from {', '.join(valid)}")
    return names


def changes(plan, name):
    """What a scheme or variant changes beyond its pos_emb, in its model or its training, {key: value}."""
    cfg = plan.grid[name]
    plain = plan.model_cfg.with_scheme(cfg.pos_emb)
    drop = plan.drops[name]
    return {k: v for k, v in cfg.asdict().items() if getattr(plain, k) != v} | (asdict(drop) if drop else {})


# ----------------------------------------------------------------------------- one run


def extrapolate(model, windows, rescaled, runtime):
    """{scaling: {L: mean loss or None}} and {scaling: loss by position in the longest window}.
    'none' is the model as trained; each scaling of rescaled that its scheme takes is scored beyond L0 with factor
    L/L0."""
    model_cfg = model.config
    scheme = scheme_class(model_cfg.pos_emb)
    L0, longest = model_cfg.block_size, max(windows)
    loss, position = {}, {}
    for scaling in [scalings.NO_SCALING] + (rescaled if model_cfg.takes("rope_scaling") else []):
        loss[scaling] = {}
        for L, batches in windows.items():
            if scaling != scalings.NO_SCALING and L <= L0:
                continue
            if not scheme.extrapolates and L > L0:
                loss[scaling][str(L)] = None
                continue
            scaled = (
                model
                if scaling == scalings.NO_SCALING
                else model.reconfigure(rope_scaling=scaling, rope_scaling_factor=L / L0)
            )
            curve = position_losses(scaled, batches, runtime)
            loss[scaling][str(L)] = curve.mean().item()
            if L == longest:
                position[scaling] = curve.tolist()
    return loss, position


def sample_text(model, meta, ablate_cfg, seed, runtime):
    tok = tokenizer_from_meta(meta)
    idx = torch.tensor([tok.encode(ablate_cfg.sample_prompt)], device=runtime.device)
    g = torch.Generator(device=runtime.device).manual_seed(seed)
    with decode_autocast(runtime.device_type, runtime.dtype):  # as sample.py decodes, so the two agree
        new = [
            t.item()
            for t in generate(
                model, idx, ablate_cfg.sample_tokens, Sampling(ablate_cfg.sample_temperature), generator=g
            )
        ]
    return ablate_cfg.sample_prompt + tok.decode(new)


def arm_name(name, scale):
    """The run folders' name of a scheme at a learning-rate scale (the shared rate keeps the scheme's name)."""
    return name if scale == 1 else f"{name}-lr{scale:g}"


def staged_training(plan, job):
    """Train one run stage by stage, a stage ending at each of its evaluations (a resume is exact, so the stages add
    up to one run), and probe every query slot at L0 after each: train_run's summary with "slots" {str(step):
    {str(slot): whole answers}}, the curve steps-to-learn reads (empty where training carries no recall task)."""
    name, scale, seed = job
    model_cfg, train_cfg, out = plan.grid[name], plan.run_tc(name, seed, scale), plan.folder(job)
    schedule, slots = plan.schedule(name, train_cfg), {}
    for step in eval_steps(train_cfg) if plan.probe else [train_cfg.max_iters]:
        try:
            summary = train_run(name, model_cfg, replace(train_cfg, max_iters=step), out, plan.batch_cfg, schedule)
        except Interrupted:  # named by the run's length, not the stage's
            at = load_checkpoint(out / "ckpt.pt")["iter"]
            raise Interrupted(f"run {out.name} stopped at iteration {at} of {train_cfg.max_iters}") from None
        if plan.probe:
            slots[str(step)] = evaluated(
                out / f"slots{step}.json",
                lambda step=step: plan.probe.by_slot(
                    checked_model(out, plan.runtime, step), model_cfg.block_size, plan.runtime
                ),
                plan.probe.made_with,
            )
    return summary | {"slots": slots, "threads": torch.get_num_threads()}


def retrieval_counts(plan, model):
    """{str(W): the probe's cells in windows of W tokens (Probe.counts), None past the scheme's reach}, the model as
    trained; and a model that takes a RoPE scaling, where the scalings scored hold the deployed one
    (ablate_report.DEPLOYED), under it past L0 (factor W / L0, read zero-shot), else None: (as trained, deployed)."""
    L0, reaches = model.config.block_size, scheme_class(model.config.pos_emb).extrapolates
    trained = {
        str(W): plan.probe.counts(model, W, plan.runtime) if reaches or W <= L0 else None for W in plan.probe.lengths
    }
    if not (model.config.takes("rope_scaling") and ablate_report.DEPLOYED in plan.scalings):
        return trained, None
    return trained, {
        str(W): plan.probe.counts(
            model.reconfigure(rope_scaling=ablate_report.DEPLOYED, rope_scaling_factor=W / L0), W, plan.runtime
        )
        for W in plan.probe.lengths
        if W > L0
    }


def finish_run(plan, job):
    """Train, evaluate and sample one run (scheme, scale, seed), reusing whatever an earlier invocation finished;
    (summary, eval). The summary records the CPU threads it trained on, which its tokens/s depend on."""
    name, scale, seed = job
    out, probing = plan.folder(job), {} if plan.probe is None else plan.probe.made_with
    summary = evaluated(out / "summary.json", lambda: staged_training(plan, job), probing)
    ablate_cfg, first = plan.settings, seed == plan.seeds[0]
    sampled = ablate_cfg.sample_tokens > 0 and first  # one sample per scheme
    settings = probing | {
        "lengths": plan.lengths,
        "eval_tokens": ablate_cfg.eval_tokens,
        "scalings": plan.scalings,
        "sample": [ablate_cfg.sample_prompt, ablate_cfg.sample_tokens, ablate_cfg.sample_temperature]
        if sampled
        else None,
        "inside": first,
        "probe_lengths": None if plan.probe is None else plan.probe.lengths,
        # what scalings and the probe imply, recorded so that an evaluation made before RoPE was probed under its
        # deployed scaling is made again rather than read without it
        "probe_deployed": plan.probe is not None and ablate_report.DEPLOYED in plan.scalings,
    }
    evaluation = evaluated(out / "eval.json", lambda: evaluate(plan, job, sampled, first), settings)
    plan.release(job)
    return summary, evaluation


def evaluate(plan, job, sampled, first):
    """A run's scores at every length and scaling and on the probe, with its sample where sampled, and what its first
    seed shows inside (attention, biases) where first."""
    name, scale, seed = job
    model_cfg, train_cfg, out = plan.grid[name], plan.run_tc(name, seed, scale), plan.folder(job)
    t0 = time.perf_counter()
    model = checked_model(out, plan.runtime, train_cfg.max_iters)
    # sample and look inside first: extrapolate leaves the model reconfigured with its last scaling
    sample = sample_text(model, plan.meta, plan.settings, seed, plan.runtime) if sampled else None
    inside = (
        {
            "attention": diagnostics.attention_stats(model, plan.windows[model_cfg.block_size], plan.runtime),
            "biases": diagnostics.bias_curves(model, max(plan.lengths)),
        }
        if first
        else {}
    )
    retrieval, deployed = retrieval_counts(plan, model) if plan.probe else (None, None)
    loss, position = extrapolate(model, plan.windows, plan.scalings, plan.runtime)
    return {
        "loss": loss,
        "position": position,
        "sample": sample,
        "retrieval": retrieval,
        "retrieval_deployed": deployed,
        **inside,
        "eval_s": time.perf_counter() - t0,
    }


# ----------------------------------------------------------------------------- results


def summarize(plan, done, sweeps, best):
    """results.json's content: the grid's settings and, per scheme, the learning-rate sweep on the selection seeds
    and its figures over the test seeds at the shared rate and at its own (ablate_report.scheme_figures), and the
    verdicts against the reference; done maps (scheme, scale, seed) to that run's (summary, eval), sweeps each
    scheme that swept to the scales it tried, best each scheme to its own scale."""
    schemes, sels = {}, plan.settings.selection()
    # each scheme at its own rate only where a sweep chose one: otherwise that ranking is the shared one, the same runs
    rankings = {"shared": dict.fromkeys(plan.grid, 1)} | ({"tuned": best} if plan.sweeping else {})
    # the effective length's one score for every scheme, fixed in the config before the run as RULER's is: the gate
    # of steps-to-learn, which every query slot of a model that learned the task reaches at L0
    reference = plan.settings.learn_gate if plan.probe else None
    for name, cfg in plan.grid.items():
        by_seed = {
            sel: {f"{s:g}": done[name, s, sel][0]["final_val_loss"] for s in sweeps.get(name, [])} for sel in sels
        }
        schemes[name] = {
            "pos_emb": cfg.pos_emb,
            "changes": changes(plan, name),
            "params": plan.params[name],
            # each scale's loss averaged over the selection seeds, which chose the best; each seed's beside it
            "sweep": {s: statistics.fmean(seed[s] for seed in by_seed.values()) for s in by_seed[sels[0]]},
            "sweep_by_seed": {str(sel): losses for sel, losses in by_seed.items()},
            "best_scale": best[name],
            **{
                ranking: {
                    "scale": scale[name],
                    **ablate_report.scheme_figures(
                        *zip(*(done[name, scale[name], seed] for seed in plan.seeds), strict=True),
                        cfg.block_size,
                        plan.settings.learn_gate,
                        plan.settings.probe_pool,
                        reference,
                    ),
                }
                for ranking, scale in rankings.items()
            },
            "sample": done[name, 1, plan.seeds[0]][1]["sample"],
        }
    return {
        "reference": REFERENCE if REFERENCE in schemes else None,
        "block_size": plan.model_cfg.block_size,
        "lengths": plan.lengths,
        "windows": {str(L): n_windows(b) for L, b in plan.windows.items()},
        "seeds": plan.seeds,
        "selection_seeds": sels if plan.sweeping else None,
        "scales": plan.scales,
        "tokens_per_run": tokens_per_run(plan.model_cfg, plan.train_cfg),
        "learning_rates": {
            "learning_rate": plan.train_cfg.learning_rate,
            "muon_lr": plan.train_cfg.muon_lr,
            "optimizer": plan.train_cfg.optimizer,
        },
        "settings": {
            "ablate": asdict(plan.settings),
            **portable(train_settings(plan.model_cfg, plan.train_cfg, plan.batch_cfg)),
        },
        "regime": regime_rows(
            [
                (f"this config (RoPE base {cfg.rope_base:g})", cfg.head_dim, cfg.rope_base, cfg.block_size)
                for cfg in {c.rope_base: c for c in plan.grid.values() if c.takes("rope_base")}.values()
            ]
        ),
        "probe": probe_record(plan, reference),
        "device": plan.runtime.device,
        "environment": run_record(),
        "schemes": schemes,
        "verdicts": {
            ranking: ablate_report.verdicts_against(schemes, REFERENCE, ranking, plan.settings.equivalence_margin)
            for ranking in rankings
        },
        "loss_past_L0": {
            ranking: ablate_report.loss_past_against(
                schemes, REFERENCE, ranking, plan.settings.equivalence_margin, plan.model_cfg.block_size
            )
            for ranking in rankings
        },
        "learning_order": {ranking: ablate_report.learning_order(schemes, REFERENCE, ranking) for ranking in rankings},
        "retrieval_past_L0": {
            ranking: ablate_report.retrieval_against(schemes, REFERENCE, ranking) for ranking in rankings
        },
    }


def probe_record(plan, reference):
    """The probe's settings, the reference every scheme's effective length is read at, and what its readout gets
    wrong at the trials used: at each threshold, the chance that the best model reading no key passes a cell and
    that a near-perfect reader (GOOD) misses the longest window."""
    if plan.probe is None:
        return None
    ablate_cfg, probe = plan.settings, plan.probe
    longest = max(probe.lengths)
    errors = readout_errors(
        probe.cells(longest, dict.fromkeys(probe.distances[longest], 0))["cells"], ablate_cfg.probe_pool
    )
    return {
        "chance": probe.chance,
        "reference": reference,
        "elimination": probe.elimination,
        "lengths": probe.lengths,
        "learn_gate": ablate_cfg.learn_gate,
        "per": ablate_cfg.probe_pool,
        "cell_trials": errors["trials"],  # the first pool's: an edge cell holds fewer queries than those inside
        "floor": errors["floor"],
        "cells": errors["cells"],
        "good": GOOD,
        "error_rates": {n: errors[n] for n in THRESHOLDS},
    }


def n_windows(batches):
    return len(batches.eval_starts["val"])


def tokens_per_run(model_cfg, train_cfg):
    return train_cfg.max_iters * train_cfg.gradient_accumulation_steps * train_cfg.batch_size * model_cfg.block_size


# ----------------------------------------------------------------------------- plan, estimate, main


@dataclass
class Plan(SweepPlan):
    """lab/sweep.py's plan, with the ablation's grid: a job is (scheme, learning-rate scale, seed), an arm a scheme."""

    grid: dict  # {scheme: its GPTConfig}
    drops: dict  # {scheme: its DroPE, or None}
    lengths: list
    scalings: list
    params: dict  # {scheme: parameter count}
    scales: list  # the learning-rate multiples each scheme tries
    probe: Probe | None  # retrieval's windows and depths, where training carries the recall task

    desc, marker = "ablate", "eval.json"

    @classmethod
    def make(cls, ablate_cfg, model_cfg, train_cfg, batch_cfg):
        if ablate_cfg.sample_tokens and not ablate_cfg.sample_prompt:
            raise ValueError("sample_prompt is empty; give a prompt, or sample_tokens=0 for no samples")
        scales = numbers("lr_scales", ablate_cfg.lr_scales, float, 1e-9, "0.5,1,2")
        if 1 not in scales:
            raise ValueError(
                f"lr_scales={ablate_cfg.lr_scales!r} must include 1, the shared rate every scheme is ranked at"
            )
        lengths = eval_lengths(ablate_cfg, model_cfg.block_size)
        common = cls.common(ablate_cfg, model_cfg, train_cfg, batch_cfg, lengths, sweeping=len(scales) > 1)
        if ablate_cfg.sample_tokens:
            tokenizer_from_meta(common["meta"]).encode(ablate_cfg.sample_prompt)  # an unknown character fails now
        grid, drops = make_grid(ablate_cfg, common["model_cfg"])
        probe = (
            Probe(
                common["meta"],
                model_cfg.block_size,
                ablate_cfg,
                ablate_cfg.probe_pairs,
                train_cfg.batch_size * model_cfg.block_size,
                common["runtime"].device,
            )
            if batch_cfg.task_class is Recall
            else None
        )
        for name, drop in drops.items():
            try:
                if drop:
                    drop.check(train_cfg)  # a bad training change fails now, not after other runs trained
            except ValueError as e:
                raise ValueError(f"scheme {name!r}: {e}") from None
        return cls(
            **common,
            grid=grid,
            drops=drops,
            lengths=lengths,
            scalings=rope_scalings(ablate_cfg),
            params=param_counts(grid),
            scales=scales,
            probe=probe,
        )

    @property
    def sweeping(self):
        return len(self.scales) > 1

    def scales_of(self, name):
        """The rate multiples scheme name tries first: DroPE's variants keep the shared rate, RoPE's until the drop,
        their recalibration rate (recalibration_lr) being the variants' own axis."""
        return [1] if self.drops[name] else self.scales

    def run_tc(self, name, seed, scale=1):
        """The TrainConfig of scheme name's run with seed, its learning rates scaled by scale, and its rate's decay
        fixed to the whole run, which it trains in stages (staged_training)."""
        rates = {
            "learning_rate": self.train_cfg.learning_rate * scale,
            "muon_lr": self.train_cfg.muon_lr * scale,
            "min_lr": None if self.train_cfg.min_lr is None else self.train_cfg.min_lr * scale,
        }
        return replace(
            self.train_cfg, seed=seed, lr_decay_iters=self.train_cfg.lr_decay_iters or self.train_cfg.max_iters, **rates
        )

    def schedule(self, name, train_cfg):
        """The schedule of scheme name's runs: DroPE's, or train.train's default (None)."""
        return DropSchedule(train_cfg, self.drops[name]) if self.drops[name] else None

    run = finish_run

    def job(self, name, scale, seed):
        return name, scale, seed

    def loss(self, result, name):
        return result[0]["final_val_loss"]

    def folder(self, job):
        name, scale, seed = job
        return run_dir(self.train_cfg, arm_name(name, scale), seed)

    def check(self, job):
        """A run folder made with other settings is refused before anything runs, max_iters aside: a run grows stage
        by stage (its lr_decay_iters, the whole run's length, is checked)."""
        name, scale, seed = job
        train_cfg = self.run_tc(name, seed, scale)
        check_run(
            self.folder(job),
            train_settings(self.grid[name], train_cfg, self.batch_cfg, self.schedule(name, train_cfg)),
            grown=("train.max_iters",),
        )

    def label(self, job):
        name, scale, seed = job
        return f"{arm_name(name, scale)} seed {seed}"


def eval_steps(train_cfg):
    """The steps at which a run evaluates (and ends a stage): every eval_interval, and max_iters."""
    return sorted(
        {*range(train_cfg.eval_interval, train_cfg.max_iters + 1, train_cfg.eval_interval), train_cfg.max_iters}
    )


def run_flops(cfg, plan):
    """(training, evaluation) FLOPs of one run: its steps, then its in-training evaluations and slot probes, its
    extrapolation and its retrieval probe. flops_per_token counts forward + backward; a forward alone is a third."""
    train_cfg, L0, fpt = plan.train_cfg, cfg.block_size, GPT(cfg).flops_per_token
    scheme = scheme_class(cfg.pos_emb)
    n_evals = len(eval_steps(train_cfg))
    in_training = n_evals * 2 * train_cfg.eval_iters * train_cfg.batch_size * L0 * fpt(L0) / 3  # train and val splits
    probes = 0
    if plan.probe:
        slots = plan.settings.probe_slots  # the slot probe's windows
        reached = [W for W in plan.probe.lengths if scheme.extrapolates or W <= L0]
        # the distance probe reads each context once for all its queries (Probe.forked_answers)
        contexts = sum(len(plan.probe.windows[W][0]) * W * fpt(W) for W in reached)
        probes = (slots * n_evals * L0 * fpt(L0) + contexts) / 3
    rescaled = plan.scalings if cfg.takes("rope_scaling") else []
    scored = [(L, 1 + len(rescaled) if L > L0 else 1) for L in plan.lengths if scheme.extrapolates or L <= L0]
    extrapolation = sum(n * n_windows(plan.windows[L]) * L * fpt(L) / 3 for L, n in scored)
    return tokens_per_run(cfg, train_cfg) * fpt(L0), in_training + probes + extrapolation


def status(plan, job):
    """finished, resume or new."""
    out = plan.folder(job)
    if (out / "summary.json").is_file():
        return "finished"
    return "resume" if (out / "config.json").is_file() and (out / "ckpt.pt").is_file() else "new"


def print_plan(plan, statuses):
    g, train_cfg = plan.model_cfg, plan.train_cfg
    counts = {k: list(statuses.values()).count(k) for k in ("finished", "resume", "new")}
    sweep = (
        f", each scheme's {len(plan.scales)} learning-rate scales on selection seeds "
        f"{', '.join(map(str, plan.settings.selection()))}"
        if plan.sweeping
        else ""
    )
    print(
        f"grid: {len(plan.grid)} schemes x {len(plan.seeds)} test seeds{sweep}: {len(statuses)} runs to start with "
        f"into {train_cfg.out_dir}: {counts['finished']} finished, {counts['resume']} to resume, "
        f"{counts['new']} to train"
    )
    print(f"  {'scheme':<16}{'pos_emb':<12}{'params':>10}  changes")
    for name, cfg in plan.grid.items():
        print(
            f"  {name:<16}{cfg.pos_emb:<12}{plan.params[name]:>10,}  "
            + ", ".join(f"{k}={v}" for k, v in changes(plan, name).items())
        )
    print(
        f"test seeds {', '.join(map(str, plan.seeds))}; each run {train_cfg.max_iters} steps, "
        f"{tokens_per_run(g, train_cfg):,} "
        f"tokens (model {g.n_layer}x{g.n_embd}, {g.n_head} heads, L0 = {g.block_size})"
    )
    windows = ", ".join(str(n_windows(b)) for b in plan.windows.values())
    print(
        f"evaluation: lengths {', '.join(map(str, plan.lengths))} with {windows} windows; "
        f"RoPE also with {', '.join(plan.scalings) or 'no scaling'} beyond L0"
    )


def print_estimate(plan, statuses, rate):
    """Minutes of training and evaluation left, from FLOPs and rate, the FLOP/s a worker reached here just now."""
    flops = {name: run_flops(cfg, plan) for name, cfg in plan.grid.items()}
    left = [flops[name] for (name, _, _), st in statuses.items() if st != "finished"]  # resumed runs counted whole
    train_min, eval_min = (sum(f[i] for f in left) / rate / 60 for i in (0, 1))
    print(
        f"estimated time: {train_min + eval_min:.1f} min for the {len(left)} runs left (training {train_min:.1f}, "
        f"evaluation and probes {eval_min:.1f}), about {(train_min + eval_min) / plan.settings.workers:.0f} min "
        f"wall at {plan.settings.workers} run(s) at a time, from their FLOPs at the {rate / 1e9:.1f} GFLOP/s a "
        f"training step reached here just now (resumed runs counted whole)"
    )


def print_parts(plan, sweeps, rate):
    """Each part's test seeds and runs, and its estimated wall time at rate (its selection runs counted whole)."""
    settings = plan.settings
    if settings.parts == 1:
        return
    flops = {name: sum(run_flops(cfg, plan)) for name, cfg in plan.grid.items()}
    selection = sum(flops[name] * len(rates) * settings.selection_seeds for name, rates in sweeps.items())
    for part in range(1, settings.parts + 1):
        seeds = settings.part_seeds(plan.seeds, part)
        minutes = (selection + len(seeds) * sum(flops.values())) / rate / 60 / settings.workers
        print(
            f"part {part} of {settings.parts} (--part={part}): test seeds {', '.join(map(str, seeds))}, "
            f"{len(seeds) * len(plan.grid)} runs and the selection runs: about {minutes:.0f} min wall here"
        )


def ablate(plan):
    t0 = time.perf_counter()
    # a selection run of each scheme that sweeps its rate, and every test seed at the shared rate
    sweeps = {name: plan.scales for name in plan.grid if len(plan.scales_of(name)) > 1}
    settings, seeds = plan.settings, plan.settings.part_seeds(plan.seeds)
    shared = [(name, 1, seed) for seed in seeds for name in plan.grid]
    statuses = {job: status(plan, job) for job in plan.first_launch(sweeps, shared)}
    print_plan(plan, statuses)
    if settings.dry_run:
        rate = plan.calibrate(next(iter(plan.grid.values())))
        print_estimate(plan, statuses, rate)
        print_parts(plan, sweeps, rate)
        plan.dry_run(sweeps, after=shared)
    with RunLock(plan.out, "ablation"):  # each run's folder is locked by its training too
        screen = (lambda done: ([], settings.selection(), seeds)) if settings.part else None
        done, sweeps, best = plan.sweep_and_test(list(plan.grid), sweeps, after=shared, screen=screen)
        if settings.part:
            plan.part_done(seeds, ["runs"])
            return
        results = summarize(plan, done, sweeps, best)
        plots = ablate_report.write_plots(results, plan.out)
        ablate_report.write_csv(plan.out / "results.csv", plan, done)
        plan.write_results(results, plots, ablate_report.markdown, t0, also=["results.csv"])


main = tool_main(__doc__, AblateConfig, Plan.make, ablate)


if __name__ == "__main__":
    main()
