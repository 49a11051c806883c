"""Compare positional schemes fairly: a grid of schemes x seeds, length extrapolation, tables and plots.

    python lab/ablate.py configs/ablate_cpu.toml [--key=value ...]
    python lab/ablate.py configs/ablate_cpu.toml --dry_run=true      print the grid and its estimated time

Every run of a seed sees the same batches in the same order (data.loader.Batches draws them from
(seed, step), not from global RNG state) and the same token budget, so differences between
schemes are paired by seed. With lr_scales, each scheme first trains on the selection seed (in no test) at each
multiple of the learning rates, the sweep widened where its best lies at an edge, and its best takes every test
seed: one ranking at the shared rate, one with each scheme at its own (DroPE's variants run at the shared rate:
they are RoPE until the drop, and the recalibration's own rate is their axis). After training at context
L0 = block_size each model is scored on fixed validation windows at multiples of L0 (RoPE models also with
inference-time scaling, factor L/L0, beyond L0), on retrieval by needle-to-query distance (lab/retrieval.py)
where training carries the recall task, and its first seed's attention and score biases are recorded. Each
scheme against the reference is a paired test, one Holm family over the table (lab/stats.py). The runs go
through lab/grid.run_jobs: workers on this machine (each run's thread count is recorded, and tokens/s compared
only between equal counts) or Slurm jobs.
out_dir receives runs/<scheme>[-lr<scale>]-seed<S>/ (one train.py run each), results.json, and from
ablate_report.py results.md, results.csv and PNG plots (when matplotlib is installed).
Rerunning the same command skips finished runs and resumes an interrupted one.

Settings: AblateConfig (here), GPTConfig (model.py) and TrainConfig (train.py) together;
the TOML file may set any of them. `python lab/ablate.py --help` lists them all.
"""

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script, sys.path[0] is lab/
import config  # noqa: E402
import positions  # noqa: E402
import rope  # noqa: E402
import train  # noqa: E402
from checkpoint import load_checkpoint, model_from_checkpoint  # noqa: E402
from config import opt  # noqa: E402
from data.tokenizer import load_meta, tokenizer_from_meta  # noqa: E402
from files import RunLock, atomic_write  # noqa: E402
from generate import Sampling, generate  # noqa: E402
from lab import ablate_report, diagnostics  # noqa: E402
from lab.grid import (LaunchSettings, check_same_settings, command, eval_runtime, eval_sets, evaluated,  # noqa: E402
                      field_types, numbers, parse_changes, position_losses, read_json, run_dir, run_jobs, split_list,
                      train_run, train_settings, widen, write_json)
from lab.report import NO_PLOTS, regime_rows  # noqa: E402
from lab.retrieval import THRESHOLDS, Probe, ProbeSettings  # noqa: E402
from data.batches import BatchConfig  # noqa: E402
from data.loader import Batch  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from optim import make_optimizer  # noqa: E402
from runtime import Runtime, decode_autocast, run_record  # noqa: E402

REFERENCE = "rope"  # the scheme every other one is compared against, seed by seed
MORE_SCALES = 2  # rate multiples a sweep may add beyond its edges, where its best keeps landing there
VARIANT_KEYS = ("rope_base", "rope_fraction", "rope_layout", "rope_p")  # what a RoPE variant may change


@dataclass(frozen=True)
class DroPE:
    """DroPE (Gelberg et al. 2025): RoPE dropped at a step, training going on without positions (a
    recalibration), with a schedule of its own when recalibration_lr is set; a variant's training keys."""
    drop_rope_at: int
    recalibration_lr: float | None = None  # the recalibration's peak, reached again by a warmup after the drop
    recalibration_warmup: int = 20

    def check(self, tc):
        if not 0 < self.drop_rope_at < tc.max_iters:
            raise ValueError(f"drop_rope_at={self.drop_rope_at} must lie between 0 and max_iters={tc.max_iters}, "
                             "leaving steps to recalibrate without RoPE")
        if self.recalibration_lr is not None and not 0 < self.recalibration_lr < math.inf:
            raise ValueError(f"recalibration_lr={self.recalibration_lr} must be a finite rate > 0")


class DropSchedule(train.Schedule):
    """train.Schedule until DroPE's drop; from it pos_emb none, and with a recalibration_lr a warmup to that peak
    and a cosine to a tenth of it at max_iters."""

    def __init__(self, tc, drope):
        super().__init__(tc)
        self.drope = drope

    def lr(self, it):
        d = self.drope
        if d.recalibration_lr is None or it < d.drop_rope_at:
            return super().lr(it)
        return train.warmup_cosine(it - d.drop_rope_at, d.recalibration_lr, d.recalibration_warmup,
                                   self.tc.max_iters - d.drop_rope_at, d.recalibration_lr / 10)

    def model_config(self, it, gcfg):
        return gcfg.with_scheme(positions.NoPE.name) if it >= self.drope.drop_rope_at else gcfg

    def settings(self):
        return asdict(self.drope)


TRAIN_VARIANT_KEYS = tuple(DroPE.__dataclass_fields__)  # what a variant may change of its training


@dataclass
class AblateConfig(ProbeSettings, LaunchSettings):
    schemes: str = opt(",".join(positions.SCHEMES), "positional schemes to compare (pos_emb values), comma-separated")
    variants: str = opt("", "RoPE variants to add: 'name: key=value, ...; name: ...', keys " + ", ".join(VARIANT_KEYS))
    seeds: int = opt(3, "test seeds per scheme: seed, seed+1, ..., fixed before the run", check=config.POSITIVE)
    selection_seed: int = opt(1000, "the seed each scheme's learning-rate sweep runs on (lr_scales); it is in no test",
                              check=config.NON_NEGATIVE)
    lr_scales: str = opt("1", "multiples of the learning rates (learning_rate, min_lr, muon_lr together) each scheme "
                              "tries on the selection seed, widened where its best is at an edge; its best takes "
                              "every test seed (1 alone: one shared rate, no selection runs)")
    equivalence_margin: float = opt(0.01, "nats: a scheme and the reference show no difference when an equivalence "
                                          "test puts their paired difference within this")
    eval_lengths: str = opt("0.5,1,2,4,8", "context lengths to evaluate at, as multiples of block_size")
    eval_tokens: int = opt(16384, "validation tokens per context length, in fixed windows of that length",
                           check=config.POSITIVE)
    rope_scalings: str = opt("linear,ntk,yarn", "inference-time RoPE scalings scored beyond block_size (factor L/L0)")
    sample_prompt: str = opt("ROMEO:", "prompt of the one sample per scheme")
    sample_tokens: int = opt(200, "tokens per sample (0: no samples)")
    sample_temperature: float = opt(0.8, "sampling temperature of the samples")

    def __post_init__(self):
        ProbeSettings.__post_init__(self)
        config.validate(self)
        if not self.equivalence_margin > 0:
            raise ValueError(f"equivalence_margin={self.equivalence_margin} must be > 0")
        if self.sample_tokens < 0:
            raise ValueError(f"sample_tokens={self.sample_tokens} must be >= 0 (0 means no samples)")
        if self.sample_temperature < 0:
            raise ValueError(f"sample_temperature={self.sample_temperature} must be >= 0 (0 is greedy)")


# ----------------------------------------------------------------------------- the grid

def make_grid(ac, gcfg):
    """({scheme name: its GPTConfig}, in the order of the tables; {name: its DroPE, or None})."""
    for s in split_list(ac.schemes):
        if s not in positions.SCHEMES:
            raise ValueError(f"schemes: {s!r} is not a positional scheme; choose from {', '.join(positions.SCHEMES)}")
    entries = [(s, {"pos_emb": s}) for s in split_list(ac.schemes)]
    types = field_types(GPTConfig, VARIANT_KEYS) | field_types(DroPE, TRAIN_VARIANT_KEYS)
    entries += [(name, {"pos_emb": "rope", **o}) for name, o in parse_changes(ac.variants, types)]
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
            grid[name] = replace(gcfg.with_scheme(o.pop("pos_emb")), **o)
        except TypeError:
            raise ValueError(f"variant {name!r}: DroPE's {', '.join(drop)} needs drop_rope_at, the step of the drop") from None
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


def eval_lengths(ac, block_size):
    lengths = []
    for m in split_list(ac.eval_lengths):
        L = round(config.coerce("eval_lengths", m, float) * block_size)
        if L < 1:
            raise ValueError(f"eval_lengths: {m} x block_size={block_size} is under one token; use larger multiples")
        lengths.append(L)
    if not lengths:
        raise ValueError("eval_lengths is empty; give multiples of block_size such as 0.5,1,2,4,8")
    return sorted(set(lengths))


def rope_scalings(ac):
    names, valid = split_list(ac.rope_scalings), [k for k in rope.SCALINGS if k != rope.NO_SCALING]
    for s in names:
        if s not in valid:
            raise ValueError(f"rope_scalings: {s!r} is unknown; choose from {', '.join(valid)}")
    return names


def changes(plan, name):
    """What a scheme or variant changes beyond its pos_emb, in its model or its training, {key: value}."""
    cfg = plan.grid[name]
    plain = plan.gcfg.with_scheme(cfg.pos_emb)
    drop = plan.drops[name]
    return {k: v for k, v in cfg.asdict().items() if getattr(plain, k) != v} | (asdict(drop) if drop else {})


# ----------------------------------------------------------------------------- one run

def extrapolate(model, windows, scalings, rt):
    """{scaling: {L: mean loss or None}} and {scaling: loss by position in the longest window}.
    'none' is the model as trained; each scaling its scheme takes is scored beyond L0 with factor L/L0."""
    cfg = model.config
    scheme = positions.scheme(cfg.pos_emb)
    L0, longest = cfg.block_size, max(windows)
    loss, position = {}, {}
    for scaling in [rope.NO_SCALING] + (scalings if cfg.takes("rope_scaling") else []):
        loss[scaling] = {}
        for L, batches in windows.items():
            if scaling != rope.NO_SCALING and L <= L0:
                continue
            if not scheme.extrapolates and L > L0:
                loss[scaling][str(L)] = None
                continue
            scaled = (model if scaling == rope.NO_SCALING
                      else model.reconfigure(rope_scaling=scaling, rope_scaling_factor=L / L0))
            curve = position_losses(scaled, batches, rt)
            loss[scaling][str(L)] = curve.mean().item()
            if L == longest:
                position[scaling] = curve.tolist()
    return loss, position


def sample_text(model, meta, ac, seed, rt):
    tok = tokenizer_from_meta(meta)
    idx = torch.tensor([tok.encode(ac.sample_prompt)], device=rt.device)
    g = torch.Generator(device=rt.device).manual_seed(seed)
    with decode_autocast(rt.device_type, rt.dtype):  # as sample.py decodes, so the two agree
        new = [t.item() for t in generate(model, idx, ac.sample_tokens, Sampling(ac.sample_temperature), generator=g)]
    return ac.sample_prompt + tok.decode(new)


def arm_name(name, scale):
    """The run folders' name of a scheme at a learning-rate scale (the shared rate keeps the scheme's name)."""
    return name if scale == 1 else f"{name}-lr{scale:g}"


def finish_run(plan, job):
    """Train, evaluate and sample one run (scheme, scale, seed), reusing whatever an earlier invocation finished;
    (summary, eval). The summary records the CPU threads it trained on, which its tokens/s depend on."""
    name, scale, seed = job
    gcfg, tc = plan.grid[name], plan.run_tc(name, seed, scale)
    out = run_dir(tc, arm_name(name, scale), seed)
    summary = evaluated(out / "summary.json", lambda: train_run(name, gcfg, tc, out, plan.bc, plan.schedule(name, tc))
                        | {"threads": torch.get_num_threads()})
    ac, device, first = plan.ac, plan.rt.device, seed == plan.seeds[0]
    sampled = ac.sample_tokens > 0 and first  # one sample per scheme
    settings = {"lengths": plan.lengths, "eval_tokens": ac.eval_tokens, "scalings": plan.scalings,
                "sample": [ac.sample_prompt, ac.sample_tokens, ac.sample_temperature] if sampled else None,
                "probe": None if plan.probe is None else [ac.probe_lengths, ac.probe_distances, ac.probe_trials]}
    ev = read_json(out / "eval.json", out / "eval.json") if (out / "eval.json").is_file() else None
    if ev is None or ev["settings"] != settings:
        t0 = time.perf_counter()
        model = model_from_checkpoint(load_checkpoint(out / "ckpt.pt", device), device).eval()
        # sample and look inside first: extrapolate leaves the model reconfigured with its last scaling
        sample = sample_text(model, plan.meta, ac, seed, plan.rt) if sampled else None
        inside = {"attention": diagnostics.attention_stats(model, plan.windows[gcfg.block_size], plan.rt),
                  "biases": diagnostics.bias_curves(model, max(plan.lengths))} if first else {}
        retrieval = None
        if plan.probe:  # by distance at each probed length, and the shortcut check by query slot at L0
            retrieval = {"distance": plan.probe.grid(model, plan.rt),
                         "slot": plan.probe.by_slot(model, gcfg.block_size, plan.rt)}
        loss, position = extrapolate(model, plan.windows, plan.scalings, plan.rt)
        ev = {"settings": settings, "loss": loss, "position": position, "sample": sample, "retrieval": retrieval,
              **inside, "eval_s": time.perf_counter() - t0}
        write_json(out / "eval.json", ev)
    return summary, ev


# ----------------------------------------------------------------------------- results

def summarize(plan, done, sweeps):
    """results.json's content: the grid's settings and, per scheme, the learning-rate sweep on the selection seed
    and its figures over the test seeds at the shared rate and at its own (ablate_report.scheme_figures), and the
    verdicts against the reference; done maps (scheme, scale, seed) to that run's (summary, eval), sweeps each
    scheme to the scales it tried."""
    schemes, sel = {}, plan.ac.selection_seed
    for name, cfg in plan.grid.items():
        sweep = {s: done[name, s, sel][0]["final_val_loss"] for s in sweeps[name]} if len(sweeps[name]) > 1 else {}
        best = min(sweep, key=sweep.get) if sweep else 1
        schemes[name] = {"pos_emb": cfg.pos_emb, "changes": changes(plan, name), "params": plan.params[name],
                         "sweep": {f"{s:g}": v for s, v in sweep.items()}, "best_scale": best,
                         **{ranking: {"scale": s, **ablate_report.scheme_figures(
                             *zip(*(done[name, s, seed] for seed in plan.seeds)), cfg.block_size)}
                            for ranking, s in (("shared", 1), ("tuned", best))},
                         "sample": done[name, 1, plan.seeds[0]][1]["sample"]}
    return {"reference": REFERENCE if REFERENCE in schemes else None, "block_size": plan.gcfg.block_size,
            "lengths": plan.lengths, "windows": {str(L): n_windows(b) for L, b in plan.windows.items()},
            "seeds": plan.seeds, "selection_seed": sel if plan.sweeping else None, "scales": plan.scales,
            "tokens_per_run": tokens_per_run(plan.gcfg, plan.tc),
            "learning_rates": {"learning_rate": plan.tc.learning_rate, "muon_lr": plan.tc.muon_lr,
                               "optimizer": plan.tc.optimizer},
            "settings": {"ablate": asdict(plan.ac), **train_settings(plan.gcfg, plan.tc, plan.bc)},
            "regime": regime_rows([(f"this config (RoPE base {cfg.rope_base:g})", cfg.head_dim, cfg.rope_base,
                                    cfg.block_size) for cfg in {c.rope_base: c for c in plan.grid.values()
                                                               if c.takes("rope_base")}.values()]),
            "probe": None if plan.probe is None else {"chance": plan.probe.chance, "elimination": plan.probe.elimination,
                                                      "false_pass": {n: plan.probe.false_pass(t)
                                                                     for n, t in THRESHOLDS.items()}},
            "device": plan.rt.device, "environment": run_record(), "schemes": schemes,
            "verdicts": {ranking: ablate_report.verdicts_against(schemes, REFERENCE, ranking, plan.ac.equivalence_margin)
                         for ranking in ("shared", "tuned")}}


def n_windows(batches):
    return len(batches.eval_starts["val"])


def tokens_per_run(gcfg, tc):
    return tc.max_iters * tc.gradient_accumulation_steps * tc.batch_size * gcfg.block_size


# ----------------------------------------------------------------------------- plan, estimate, main

@dataclass
class Plan:
    """Everything fixed for the whole grid, resolved and checked before anything trains."""
    ac: AblateConfig
    gcfg: GPTConfig
    tc: train.TrainConfig
    grid: dict
    bc: BatchConfig
    drops: dict  # {scheme: its DroPE, or None}
    seeds: list
    lengths: list
    scalings: list
    meta: dict
    rt: Runtime
    windows: dict  # {L: Batches holding the fixed validation windows of length L}
    params: dict  # {scheme: parameter count}
    scales: list  # the learning-rate multiples each scheme tries
    probe: Probe | None  # retrieval's windows and depths, where training carries the recall task

    @property
    def sweeping(self):
        return len(self.scales) > 1

    @property
    def settings(self):
        """What make_plan builds this plan from, so a worker process can build its own."""
        return self.ac, self.gcfg, self.tc, self.bc

    def scales_of(self, name):
        """The rate multiples scheme name tries first: DroPE's variants keep the shared rate, RoPE's until the drop,
        their recalibration rate (recalibration_lr) being the variants' own axis."""
        return [1] if self.drops[name] else self.scales

    def run_tc(self, name, seed, scale=1):
        """The TrainConfig of scheme name's run with seed, its learning rates scaled by scale."""
        rates = {"learning_rate": self.tc.learning_rate * scale, "muon_lr": self.tc.muon_lr * scale,
                 "min_lr": None if self.tc.min_lr is None else self.tc.min_lr * scale}
        return replace(self.tc, seed=seed, **rates)

    def schedule(self, name, tc):
        """The schedule of scheme name's runs: DroPE's, or train.train's default (None)."""
        return DropSchedule(tc, self.drops[name]) if self.drops[name] else None


def make_plan(ac, gcfg, tc, bc):
    dataset_dir = Path(tc.data_dir) / tc.dataset
    meta = load_meta(dataset_dir)
    gcfg = replace(gcfg, vocab_size=meta["vocab_size"])
    if ac.sample_tokens:
        if not ac.sample_prompt:
            raise ValueError("sample_prompt is empty; give a prompt, or sample_tokens=0 for no samples")
        tokenizer_from_meta(meta).encode(ac.sample_prompt)  # an unknown character fails now, not after training
    rt = eval_runtime(tc)
    lengths = eval_lengths(ac, gcfg.block_size)
    windows = eval_sets(dataset_dir, meta, lengths, ac.eval_tokens, tc.batch_size * gcfg.block_size, rt.device)
    grid, drops = make_grid(ac, gcfg)
    scales = numbers("lr_scales", ac.lr_scales, float, 1e-9, "0.5,1,2")
    if 1 not in scales:
        raise ValueError(f"lr_scales={ac.lr_scales!r} must include 1, the shared rate every scheme is ranked at")
    probe = (Probe(meta, gcfg.block_size, ac, ac.probe_pairs, tc.batch_size * gcfg.block_size, rt.device)
             if bc.recall_share else None)
    seeds = [tc.seed + i for i in range(ac.seeds)]
    if len(scales) > 1 and ac.selection_seed in seeds:
        raise ValueError(f"selection_seed={ac.selection_seed} is one of the test seeds {seeds}; a rate chosen on a "
                         "seed must not be tested on it")
    plan = Plan(ac, gcfg, tc, grid, bc, drops, seeds, lengths, rope_scalings(ac),
                meta, rt, windows, param_counts(grid), scales, probe)
    for name, drop in drops.items():
        try:
            if drop:
                drop.check(tc)  # a bad training change fails now, not after other runs trained
        except ValueError as e:
            raise ValueError(f"scheme {name!r}: {e}") from None
    return plan


def calibrate(plan):
    """Training FLOP/s reached here and now: the median of a few timed steps of the first scheme on random tokens."""
    cfg, tc, rt = next(iter(plan.grid.values())), plan.tc, plan.rt
    torch.manual_seed(0)
    model = GPT(cfg).to(rt.device)
    optimizer, scaler = make_optimizer(model, tc, rt)
    x = torch.randint(cfg.vocab_size, (tc.batch_size, cfg.block_size), device=rt.device)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        train.train_step(model, optimizer, scaler, [Batch(x, x)], tc.learning_rate, tc.grad_clip, rt)[0].item()
        times.append(time.perf_counter() - t0)
    return model.flops_per_token(cfg.block_size) * x.numel() / statistics.median(times[3:])  # the first warm up


def run_flops(cfg, plan):
    """(training, evaluation) FLOPs of one run: its steps, then its in-training and extrapolation evaluations.
    flops_per_token counts forward + backward; a forward alone is a third of it."""
    tc, L0, fpt = plan.tc, cfg.block_size, GPT(cfg).flops_per_token
    scheme = positions.scheme(cfg.pos_emb)
    n_evals = len({*range(tc.eval_interval, tc.max_iters + 1, tc.eval_interval), tc.max_iters})
    in_training = n_evals * 2 * tc.eval_iters * tc.batch_size * L0 * fpt(L0) / 3  # train and val splits
    rescaled = plan.scalings if cfg.takes("rope_scaling") else []
    scored = [(L, 1 + len(rescaled) if L > L0 else 1) for L in plan.lengths if scheme.extrapolates or L <= L0]
    extrapolation = sum(n * n_windows(plan.windows[L]) * L * fpt(L) / 3 for L, n in scored)
    return tokens_per_run(cfg, tc) * fpt(L0), in_training + extrapolation


def status(plan, name, scale, seed):
    """finished, resume or new; a run folder made with other settings is refused before anything runs."""
    out = run_dir(plan.tc, arm_name(name, scale), seed)
    tc = plan.run_tc(name, seed, scale)
    settings = train_settings(plan.grid[name], tc, plan.bc, plan.schedule(name, tc))
    for marker, st in (("summary.json", "finished"), ("config.json", "resume")):
        if (out / marker).is_file():
            saved = read_json(out / marker, out)
            check_same_settings(out, settings, saved.get("settings", saved))  # config.json holds them at its top
            return st if st == "finished" or (out / "ckpt.pt").is_file() else "new"
    return "new"


def print_plan(plan, statuses):
    g, tc = plan.gcfg, plan.tc
    counts = {k: list(statuses.values()).count(k) for k in ("finished", "resume", "new")}
    sweep = (f", each scheme's {len(plan.scales)} learning-rate scales on selection seed {plan.ac.selection_seed}"
             if plan.sweeping else "")
    print(f"grid: {len(plan.grid)} schemes x {len(plan.seeds)} test seeds{sweep}: {len(statuses)} runs to start with "
          f"into {tc.out_dir}: {counts['finished']} finished, {counts['resume']} to resume, {counts['new']} to train")
    print(f"  {'scheme':<16}{'pos_emb':<12}{'params':>10}  changes")
    for name, cfg in plan.grid.items():
        print(f"  {name:<16}{cfg.pos_emb:<12}{plan.params[name]:>10,}  "
              + ", ".join(f"{k}={v}" for k, v in changes(plan, name).items()))
    print(f"test seeds {', '.join(map(str, plan.seeds))}; each run {tc.max_iters} steps, {tokens_per_run(g, tc):,} tokens "
          f"(model {g.n_layer}x{g.n_embd}, {g.n_head} heads, L0 = {g.block_size})")
    windows = ", ".join(str(n_windows(b)) for b in plan.windows.values())
    print(f"evaluation: lengths {', '.join(map(str, plan.lengths))} with {windows} windows; "
          f"RoPE also with {', '.join(plan.scalings) or 'no scaling'} beyond L0")


def print_estimate(plan, statuses):
    """Minutes of training and evaluation left, from FLOPs and a short measurement of this machine as it is now."""
    rate = calibrate(plan)
    flops = {name: run_flops(cfg, plan) for name, cfg in plan.grid.items()}
    left = [flops[name] for (name, _, _), st in statuses.items() if st != "finished"]  # resumed runs counted whole
    train_min, eval_min = (sum(f[i] for f in left) / rate / 60 for i in (0, 1))
    print(f"estimated time: {train_min + eval_min:.1f} min for the {len(left)} runs left (training {train_min:.1f}, "
          f"evaluation {eval_min:.1f}), from their FLOPs at the {rate / 1e9:.1f} GFLOP/s a training step reached "
          f"here just now (resumed runs counted whole)")


def ablate(plan):
    t0 = time.perf_counter()
    out = Path(plan.tc.out_dir)
    sel = plan.ac.selection_seed
    sweeps = {name: plan.scales_of(name) for name in plan.grid}
    jobs = [(name, s, sel) for name, scales in sweeps.items() for s in scales if plan.sweeping and len(scales) > 1]
    jobs += [(name, 1, seed) for seed in plan.seeds for name in plan.grid]  # the shared rate: every test seed
    statuses = {job: status(plan, *job) for job in jobs}
    print_plan(plan, statuses)
    if plan.ac.dry_run:
        print_estimate(plan, statuses)
        return launch(plan, jobs, {})  # run_jobs prints what it would launch, then raises DryRun
    with RunLock(out, "ablation"):  # each run's folder is locked by its training too
        done = launch(plan, jobs, {})
        most = len(plan.scales) + MORE_SCALES
        while more := {n: s for n in plan.grid
                       if len(sweeps[n]) > 1 and (s := widen(sweeps[n], best(done, n, sweeps, sel), most))}:
            for n, s in more.items():  # a best rate at the sweep's edge: one more rate beyond it
                sweeps[n] = sorted(sweeps[n] + [s])
            done = launch(plan, [(n, s, sel) for n, s in more.items()], done)
        done = launch(plan, [(n, best(done, n, sweeps, sel), seed) for n in plan.grid for seed in plan.seeds], done)
        results = summarize(plan, done, sweeps)
        plots = ablate_report.write_plots(results, out)
        results["wall_s"] = time.perf_counter() - t0
        write_json(out / "results.json", results)
        ablate_report.write_csv(out / "results.csv", plan, done)
        atomic_write(out / "results.md", lambda f: f.write(ablate_report.markdown(results, plots).encode()))
    if plots.plt is None:
        print(NO_PLOTS)
    print(f"results: {out / 'results.md'}, results.json, results.csv" + "".join(f", {f}" for f, _ in plots.written))


def best(done, name, sweeps, seed):
    """The rate multiple of scheme name's sweep with the lowest final val loss on the selection seed (1: no sweep)."""
    scales = sweeps[name]
    return 1 if len(scales) < 2 else min(scales, key=lambda s: done[name, s, seed][0]["final_val_loss"])


def launch(plan, jobs, done):
    """done with every job of jobs (scheme, scale, seed) finished too, trained where plan.ac (LaunchSettings) says."""
    todo = list(dict.fromkeys(j for j in jobs if j not in done))
    return done | run_jobs(todo, finish_run, plan, (make_plan, plan.settings), plan.ac, label=label, desc="ablate",
                           pending=lambda j: not (run_folder(plan, j) / "eval.json").is_file(), progress=plan.tc.progress)


def run_folder(plan, job):
    name, scale, seed = job
    return run_dir(plan.tc, arm_name(name, scale), seed)


def label(job):
    name, scale, seed = job
    return f"{arm_name(name, scale)} seed {seed}"


def main(argv=None):
    command(argv, __doc__, AblateConfig, lambda *settings: ablate(make_plan(*settings)))



if __name__ == "__main__":
    main()
