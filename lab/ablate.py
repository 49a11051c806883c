"""Compare positional schemes fairly: a grid of schemes x seeds, length extrapolation, tables and plots.

    python lab/ablate.py configs/ablate_cpu.toml [--key=value ...]
    python lab/ablate.py configs/ablate_cpu.toml --dry_run=true      print the grid and its estimated time

Every run of a seed sees the same batches in the same order (data.loader.Batches draws them from
(seed, step), not from global RNG state) and the same token budget, so differences between
schemes are paired by seed. After training at context L0 = block_size each model is scored on
fixed validation windows at multiples of L0; RoPE models also with inference-time scaling
(factor L/L0) beyond L0. out_dir receives runs/<scheme>-seed<S>/ (one train.py run each),
results.json, and from ablate_report.py (statistics, tables, plots) results.md, results.csv and PNG plots
(when matplotlib is installed).
Rerunning the same command skips finished runs and resumes an interrupted one.

Settings: AblateConfig (here), GPTConfig (model.py) and TrainConfig (train.py) together;
the TOML file may set any of them. `python lab/ablate.py --help` lists them all.
"""

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

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
from lab import ablate_report  # noqa: E402
from lab.report import NO_PLOTS  # noqa: E402
from lab.grid import (check_same_settings, command, eval_runtime, eval_sets, parse_changes, position_losses,  # noqa: E402
                      run_dir, split_list, train_run, train_settings, write_json)
from model import GPT, GPTConfig  # noqa: E402
from optim import make_optimizer  # noqa: E402
from runtime import Runtime, decode_autocast, run_record  # noqa: E402

REFERENCE = "rope"  # the scheme every other one is compared against, seed by seed
VARIANT_KEYS = ("rope_base", "rope_fraction", "rope_layout", "rope_p")  # what a RoPE variant may change
TRAIN_VARIANT_KEYS = ("drop_rope_at",)  # and of its training: DroPE is RoPE with a schedule


@dataclass
class AblateConfig:
    schemes: str = opt(",".join(positions.SCHEMES), "positional schemes to compare (pos_emb values), comma-separated")
    variants: str = opt("", "RoPE variants to add: 'name: key=value, ...; name: ...', keys " + ", ".join(VARIANT_KEYS))
    seeds: int = opt(3, "seeds per scheme: seed, seed+1, ...")
    eval_lengths: str = opt("0.5,1,2,4,8", "context lengths to evaluate at, as multiples of block_size")
    eval_tokens: int = opt(16384, "validation tokens per context length, in fixed windows of that length")
    rope_scalings: str = opt("linear,ntk,yarn", "inference-time RoPE scalings scored beyond block_size (factor L/L0)")
    sample_prompt: str = opt("ROMEO:", "prompt of the one sample per scheme")
    sample_tokens: int = opt(200, "tokens per sample (0: no samples)")
    sample_temperature: float = opt(0.8, "sampling temperature of the samples")
    dry_run: bool = opt(False, "print the grid and its estimated time; train nothing")

    def __post_init__(self):
        config.require_positive(self, "seeds", "eval_tokens")
        if self.sample_tokens < 0:
            raise ValueError(f"sample_tokens={self.sample_tokens} must be >= 0 (0 means no samples)")
        if self.sample_temperature < 0:
            raise ValueError(f"sample_temperature={self.sample_temperature} must be >= 0 (0 is greedy)")


# ----------------------------------------------------------------------------- the grid

def make_grid(ac, gcfg):
    """({scheme name: its GPTConfig}, in the order of the tables; {variant name: its TrainConfig changes})."""
    for s in split_list(ac.schemes):
        if s not in positions.SCHEMES:
            raise ValueError(f"schemes: {s!r} is not a positional scheme; choose from {', '.join(positions.SCHEMES)}")
    entries = [(s, {"pos_emb": s}) for s in split_list(ac.schemes)]
    entries += [(name, {"pos_emb": "rope", **o}) for name, o in parse_changes(ac.variants, VARIANT_KEYS, TRAIN_VARIANT_KEYS)]
    names = [name for name, _ in entries]
    if not names:
        raise ValueError("schemes and variants are both empty; name at least one scheme, e.g. schemes=rope")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"each scheme and variant needs its own name; repeated: {', '.join(repeated)}")
    grid, train_changes = {}, {}
    for name, o in entries:
        train_changes[name] = {k: o.pop(k) for k in TRAIN_VARIANT_KEYS if k in o}
        try:
            grid[name] = replace(gcfg, **o)
        except ValueError as e:
            raise ValueError(f"scheme {name!r}: {e}") from None
    return grid, train_changes


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
    names, valid = split_list(ac.rope_scalings), [k for k in rope.SCALINGS if k != "none"]
    for s in names:
        if s not in valid:
            raise ValueError(f"rope_scalings: {s!r} is unknown; choose from {', '.join(valid)}")
    return names


def changes(plan, name):
    """What a scheme or variant changes beyond its pos_emb, in its model or its training, {key: value}."""
    cfg = plan.grid[name]
    plain = replace(plan.gcfg, pos_emb=cfg.pos_emb)
    return {k: v for k, v in cfg.asdict().items() if getattr(plain, k) != v} | plan.train_changes[name]


# ----------------------------------------------------------------------------- one run

def extrapolate(model, windows, scalings, rt):
    """{scaling: {L: mean loss or None}} and {scaling: loss by position in the longest window}.
    'none' is the model as trained; each scaling its scheme takes is scored beyond L0 with factor L/L0."""
    cfg = model.config
    scheme = positions.scheme(cfg.pos_emb)
    L0, longest = cfg.block_size, max(windows)
    loss, position = {}, {}
    for scaling in ["none"] + [s for s in scalings if s in scheme.scalings]:
        loss[scaling] = {}
        for L, batches in windows.items():
            if scaling != "none" and L <= L0:
                continue
            if not scheme.extrapolates and L > L0:
                loss[scaling][str(L)] = None
                continue
            scaled = model if scaling == "none" else model.reconfigure(rope_scaling=scaling, rope_scaling_factor=L / L0)
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


def finish_run(name, gcfg, tc, plan):
    """Train, evaluate and sample one run, reusing whatever an earlier invocation finished; (summary, eval)."""
    out = run_dir(tc, name, tc.seed)
    if (out / "summary.json").is_file():  # status() checked its settings
        summary = json.loads((out / "summary.json").read_text())
    else:
        summary = train_run(name, gcfg, tc, out)
        write_json(out / "summary.json", summary)
    ac, device = plan.ac, plan.rt.device
    sampled = ac.sample_tokens > 0 and tc.seed == plan.seeds[0]  # one sample per scheme
    settings = {"lengths": plan.lengths, "eval_tokens": ac.eval_tokens, "scalings": plan.scalings,
                "sample": [ac.sample_prompt, ac.sample_tokens, ac.sample_temperature] if sampled else None}
    ev = json.loads((out / "eval.json").read_text()) if (out / "eval.json").is_file() else None
    if ev is None or ev["settings"] != settings:
        t0 = time.perf_counter()
        model = model_from_checkpoint(load_checkpoint(out / "ckpt.pt", device), device).eval()
        # sample first: extrapolate leaves the model reconfigured with its last scaling
        sample = sample_text(model, plan.meta, ac, tc.seed, plan.rt) if sampled else None
        loss, position = extrapolate(model, plan.windows, plan.scalings, plan.rt)
        ev = {"settings": settings, "loss": loss, "position": position, "sample": sample,
              "eval_s": time.perf_counter() - t0}
        write_json(out / "eval.json", ev)
    return summary, ev


# ----------------------------------------------------------------------------- results

def summarize(plan, done):
    """results.json's content: the grid's settings and, per scheme, its figures over seeds (ablate_report.scheme_figures);
    done maps (scheme, seed) to that run's (summary, eval)."""
    schemes = {}
    for name, cfg in plan.grid.items():
        runs, evals = zip(*(done[name, s] for s in plan.seeds))
        schemes[name] = {"pos_emb": cfg.pos_emb, "changes": changes(plan, name), "params": plan.params[name],
                         **ablate_report.scheme_figures(runs, evals), "sample": evals[0]["sample"]}
    reference = ablate_report.against_reference(schemes, REFERENCE)
    return {"reference": reference, "block_size": plan.gcfg.block_size,
            "lengths": plan.lengths, "windows": {str(L): n_windows(b) for L, b in plan.windows.items()},
            "seeds": plan.seeds, "tokens_per_run": tokens_per_run(plan.gcfg, plan.tc),
            "settings": {"ablate": asdict(plan.ac), **train_settings(plan.gcfg, plan.tc)},
            "device": plan.rt.device, "environment": run_record(), "schemes": schemes}


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
    train_changes: dict  # {scheme: the TrainConfig fields its runs change, e.g. DroPE's drop_rope_at}
    seeds: list
    lengths: list
    scalings: list
    meta: dict
    rt: Runtime
    windows: dict  # {L: Batches holding the fixed validation windows of length L}
    params: dict  # {scheme: parameter count}

    def run_tc(self, name, seed):
        """The TrainConfig of scheme name's run with seed."""
        return replace(self.tc, seed=seed, **self.train_changes[name])


def make_plan(ac, gcfg, tc):
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
    grid, train_changes = make_grid(ac, gcfg)
    plan = Plan(ac, gcfg, tc, grid, train_changes, [tc.seed + i for i in range(ac.seeds)], lengths, rope_scalings(ac),
                meta, rt, windows, param_counts(grid))
    for name in grid:
        try:
            plan.run_tc(name, tc.seed)  # a bad training change fails now, not after other runs trained
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
        train.train_step(model, optimizer, scaler, [(x, x, None)], tc.learning_rate, tc.grad_clip, rt)[0].item()
        times.append(time.perf_counter() - t0)
    return model.flops_per_token(cfg.block_size) * x.numel() / statistics.median(times[3:])  # the first warm up


def run_flops(cfg, plan):
    """(training, evaluation) FLOPs of one run: its steps, then its in-training and extrapolation evaluations.
    flops_per_token counts forward + backward; a forward alone is a third of it."""
    tc, L0, fpt = plan.tc, cfg.block_size, GPT(cfg).flops_per_token
    scheme = positions.scheme(cfg.pos_emb)
    n_evals = len({*range(tc.eval_interval, tc.max_iters + 1, tc.eval_interval), tc.max_iters})
    in_training = n_evals * 2 * tc.eval_iters * tc.batch_size * L0 * fpt(L0) / 3  # train and val splits
    rescaled = [s for s in plan.scalings if s in scheme.scalings]
    scored = [(L, 1 + len(rescaled) if L > L0 else 1) for L in plan.lengths if scheme.extrapolates or L <= L0]
    extrapolation = sum(n * n_windows(plan.windows[L]) * L * fpt(L) / 3 for L, n in scored)
    return tokens_per_run(cfg, tc) * fpt(L0), in_training + extrapolation


def status(plan, name, seed):
    """finished, resume or new; a run folder made with other settings is refused before anything runs."""
    out = run_dir(plan.tc, name, seed)
    settings = train_settings(plan.grid[name], plan.run_tc(name, seed))
    for marker, st in (("summary.json", "finished"), ("config.json", "resume")):
        if (out / marker).is_file():
            saved = json.loads((out / marker).read_text())
            check_same_settings(out, settings, saved.get("settings", saved))  # config.json holds them at its top
            return st if st == "finished" or (out / "ckpt.pt").is_file() else "new"
    return "new"


def print_plan(plan, statuses):
    g, tc = plan.gcfg, plan.tc
    counts = {k: list(statuses.values()).count(k) for k in ("finished", "resume", "new")}
    print(f"grid: {len(plan.grid)} schemes x {len(plan.seeds)} seeds = {len(statuses)} runs into {tc.out_dir}: "
          f"{counts['finished']} finished, {counts['resume']} to resume, {counts['new']} to train")
    print(f"  {'scheme':<16}{'pos_emb':<12}{'params':>10}  changes")
    for name, cfg in plan.grid.items():
        print(f"  {name:<16}{cfg.pos_emb:<12}{plan.params[name]:>10,}  "
              + ", ".join(f"{k}={v}" for k, v in changes(plan, name).items()))
    print(f"seeds {', '.join(map(str, plan.seeds))}; each run {tc.max_iters} steps, {tokens_per_run(g, tc):,} tokens "
          f"(model {g.n_layer}x{g.n_embd}, {g.n_head} heads, L0 = {g.block_size})")
    windows = ", ".join(str(n_windows(b)) for b in plan.windows.values())
    print(f"evaluation: lengths {', '.join(map(str, plan.lengths))} with {windows} windows; "
          f"RoPE also with {', '.join(plan.scalings) or 'no scaling'} beyond L0")


def print_estimate(plan, statuses):
    """Minutes of training and evaluation left, from FLOPs and a short measurement of this machine as it is now."""
    rate = calibrate(plan)
    flops = {name: run_flops(cfg, plan) for name, cfg in plan.grid.items()}
    left = [flops[name] for (name, _), st in statuses.items() if st != "finished"]  # resumed runs counted whole
    train_min, eval_min = (sum(f[i] for f in left) / rate / 60 for i in (0, 1))
    print(f"estimated time: {train_min + eval_min:.1f} min for the {len(left)} runs left (training {train_min:.1f}, "
          f"evaluation {eval_min:.1f}), from their FLOPs at the {rate / 1e9:.1f} GFLOP/s a training step reached "
          f"here just now (resumed runs counted whole)")


def ablate(plan):
    t0 = time.perf_counter()
    out = Path(plan.tc.out_dir)
    if plan.ac.dry_run:
        statuses = run_statuses(plan)
        print_plan(plan, statuses)
        print_estimate(plan, statuses)
        return
    with RunLock(out, "ablation"):  # each run's folder is locked by its training too
        statuses = run_statuses(plan)
        print_plan(plan, statuses)
        done = {}
        with tqdm(statuses, desc="ablate", unit="run", dynamic_ncols=True, disable=not plan.tc.progress) as bar:
            for name, seed in bar:
                bar.set_postfix_str(f"{name} seed {seed} ({statuses[name, seed]})")
                done[name, seed] = finish_run(name, plan.grid[name], plan.run_tc(name, seed), plan)
        results = summarize(plan, done)
        plots = ablate_report.write_plots(results, out)
        results["wall_s"] = time.perf_counter() - t0
        write_json(out / "results.json", results)
        ablate_report.write_csv(out / "results.csv", plan, done)
        atomic_write(out / "results.md", lambda f: f.write(ablate_report.markdown(results, plots).encode()))
    if plots.plt is None:
        print(NO_PLOTS)
    print(f"results: {out / 'results.md'}, results.json, results.csv" + "".join(f", {f}" for f, _ in plots.written))


def run_statuses(plan):
    return {(name, seed): status(plan, name, seed) for seed in plan.seeds for name in plan.grid}


def main(argv=None):
    command(argv, __doc__, AblateConfig, lambda *settings: ablate(make_plan(*settings)))


if __name__ == "__main__":
    main()
