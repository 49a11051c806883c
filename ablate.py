"""Compare positional schemes fairly: a grid of schemes x seeds, length extrapolation, tables and plots.

    python ablate.py configs/ablate_cpu.toml [--key=value ...]
    python ablate.py configs/ablate_cpu.toml --dry_run=true      print the grid and its estimated time

Every run of a seed sees the same batches in the same order (data.loader.Batches draws them from
(seed, step), not from global RNG state) and the same token budget, so differences between
schemes are paired by seed. After training at context L0 = block_size each model is scored on
fixed validation windows at multiples of L0; RoPE models also with inference-time scaling
(factor L/L0) beyond L0. out_dir receives runs/<scheme>-seed<S>/ (one train.py run each),
results.md, results.json, results.csv and PNG plots (when matplotlib is installed).
Rerunning the same command skips finished runs and resumes an interrupted one.

Settings: AblateConfig (here), GPTConfig (model.py) and TrainConfig (train.py) together;
the TOML file may set any of them. `python ablate.py --help` lists them all.
"""

import contextlib
import csv
import functools
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

import config
import positions
import rope
import train
from checkpoint import atomic_write, load_checkpoint, model_from_checkpoint
from config import opt
from data.loader import Batches
from data.tokenizer import load_meta, tokenizer_from_meta
from generate import generate
from model import GPT, GPTConfig
from runtime import Runtime, decode_autocast, pick_device, pick_dtype, run_record

REFERENCE = "rope"  # the scheme every other one is compared against, seed by seed
VARIANT_KEYS = ("rope_base", "rope_fraction", "rope_layout")  # what a RoPE variant may change
NOT_SETTINGS = ("out_dir", "resume", "progress")  # train fields that do not change a run's result


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
        for name in ("seeds", "eval_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.sample_tokens < 0:
            raise ValueError(f"sample_tokens={self.sample_tokens} must be >= 0 (0 means no samples)")
        if self.sample_temperature < 0:
            raise ValueError(f"sample_temperature={self.sample_temperature} must be >= 0 (0 is greedy)")


class Interrupted(Exception):
    """A run stopped before max_iters (Ctrl-C, SIGTERM); rerunning the command resumes it."""


# ----------------------------------------------------------------------------- the grid

def split_list(text):
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_variants(text):
    """'name: key=value, key=value; name: ...' -> [(name, {key: value})], values typed as GPTConfig's fields."""
    types = {f: GPTConfig.__dataclass_fields__[f].type for f in VARIANT_KEYS}
    out = []
    for part in filter(str.strip, text.split(";")):
        name, colon, body = (s.strip() for s in part.partition(":"))
        if not colon or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"variant {part.strip()!r} should look like 'name: key=value, ...', the name made of "
                             f"letters, digits, '-', '_' and '.'")
        overrides = {}
        for item in split_list(body):
            key, eq, value = (s.strip() for s in item.partition("="))
            if key not in types or not eq:
                raise ValueError(f"variant {name!r}: {item!r} should be key=value, the key one of "
                                 f"{', '.join(VARIANT_KEYS)}")
            overrides[key] = config.coerce(key, value, types[key])
        if not overrides:
            raise ValueError(f"variant {name!r} changes nothing; give at least one key=value")
        out.append((name, overrides))
    return out


def make_grid(ac, gcfg):
    """{scheme name: its GPTConfig}, in the order of the tables."""
    for s in split_list(ac.schemes):
        if s not in positions.SCHEMES:
            raise ValueError(f"schemes: {s!r} is not a positional scheme; choose from {', '.join(positions.SCHEMES)}")
    entries = [(s, {"pos_emb": s}) for s in split_list(ac.schemes)]
    entries += [(name, {"pos_emb": "rope", **o}) for name, o in parse_variants(ac.variants)]
    names = [name for name, _ in entries]
    if not names:
        raise ValueError("schemes and variants are both empty; name at least one scheme, e.g. schemes=rope")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"each scheme and variant needs its own name; repeated: {', '.join(repeated)}")
    grid = {}
    for name, o in entries:
        try:
            grid[name] = replace(gcfg, **o)
        except ValueError as e:
            raise ValueError(f"scheme {name!r}: {e}") from None
    return grid


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


def changes(cfg, gcfg):
    """What a variant changes beyond its pos_emb, {key: value}."""
    plain = replace(gcfg, pos_emb=cfg.pos_emb)
    return {k: v for k, v in cfg.asdict().items() if getattr(plain, k) != v}


def run_dir(tc, name, seed):
    return Path(tc.out_dir) / "runs" / f"{name}-seed{seed}"


def train_settings(gcfg, tc):
    """What determines a run's result: the resolved model and training settings."""
    return {"model": gcfg.asdict(), "train": {k: v for k, v in asdict(tc).items() if k not in NOT_SETTINGS}}


def check_same_settings(path, settings, saved):
    diff = [f"{group}.{k}: {saved[group].get(k)!r} there, {v!r} now" for group in settings
            for k, v in settings[group].items() if saved.get(group, {}).get(k) != v]
    if diff:
        raise ValueError(f"{path} was made with other settings ({'; '.join(diff[:4])}); use another out_dir, "
                         f"or delete that run folder to redo it")


# ----------------------------------------------------------------------------- one run

def train_run(name, gcfg, tc, out):
    """Train (or resume) one run into out; its summary. Raises Interrupted when training stopped early."""
    ckpt_path = out / "ckpt.pt"
    at = load_checkpoint(ckpt_path)["iter"] if ckpt_path.is_file() else 0
    if at < tc.max_iters:  # else training ended and only the summary is missing
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "train.log", "a") as log, contextlib.redirect_stdout(log):
            # a copy of gcfg: train sets vocab_size on the one it gets
            train.train(replace(gcfg), replace(tc, out_dir=str(out), resume=at > 0, progress=False))
        at = load_checkpoint(ckpt_path)["iter"]
    if at < tc.max_iters:
        raise Interrupted(f"run {out.name} stopped at iteration {at} of {tc.max_iters}")
    # a resumed run's log was trimmed back to its checkpoint and its elapsed_s continues: one line per iteration
    metrics = {m["iter"]: m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    final = metrics[tc.max_iters]
    return {"scheme": name, "seed": tc.seed, "settings": train_settings(gcfg, tc), "final_val_loss": final["val_loss"],
            "val_bpb": final["val_bpb"], "train_s": final["elapsed_s"],
            "tokens_per_s": statistics.median(m["tokens_per_s"] for m in metrics.values()),
            # the scheduled evaluations only: a stop and its resume add one at the stop
            "val_curve": [[it, m["val_loss"]] for it, m in sorted(metrics.items())
                          if it % tc.eval_interval == 0 or it == tc.max_iters]}


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
        new = [t.item() for t in generate(model, idx, ac.sample_tokens, ac.sample_temperature, generator=g)]
    return ac.sample_prompt + tok.decode(new)


def write_json(path, obj):
    """Write atomically: these files mark a finished step, so a half-written one must never exist."""
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=1) + "\n").encode()))


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


# ----------------------------------------------------------------------------- statistics

def t_cdf(t, df, steps=1000):
    """P(T <= t) for Student's t with df degrees of freedom.

    x = sqrt(df) tan(u) turns the density Gamma((df+1)/2) / (sqrt(df pi) Gamma(df/2)) (1 + x^2/df)^(-(df+1)/2) dx
    into Gamma((df+1)/2) / (sqrt(pi) Gamma(df/2)) cos(u)^(df-1) du, bounded and smooth on [0, pi/2], so
    Simpson's rule over [0, atan(|t|/sqrt(df))] integrates it to ~1e-10 with no special functions."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    h = math.atan(abs(t) / math.sqrt(df)) / steps  # steps is even, as Simpson's rule needs
    weights = (1 if i in (0, steps) else 4 if i % 2 else 2 for i in range(steps + 1))
    area = c * h / 3 * sum(w * math.cos(i * h) ** (df - 1) for i, w in enumerate(weights))
    return 0.5 + math.copysign(area, t)


@functools.lru_cache  # every comparison of a grid asks for the same one
def t_quantile(p, df):
    """The t with t_cdf(t, df) = p, by bisection (the CDF increases)."""
    assert 0 < p < 1, f"p={p} must lie in (0, 1)"
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(60):  # 2^-60 of the bracket: far below float noise in the CDF
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def mean_std(values):
    """Mean and sample standard deviation (n - 1; None for a single value) of values."""
    values = list(values)
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "values": values}


def paired_test(diffs, level=0.95):
    """Paired t-test of per-seed differences: their mean, a `level` confidence interval, t and the
    two-sided p-value (None where one seed gives no spread to measure)."""
    n, mean = len(diffs), statistics.fmean(diffs)
    out = {"n": n, "mean": mean, "ci": None, "t": None, "p": None}
    if n < 2:
        return out
    se = statistics.stdev(diffs) / math.sqrt(n)
    if se == 0:  # every seed moved by exactly the same amount
        return out | {"ci": [mean, mean], "p": 1.0 if mean == 0 else 0.0}
    t, q = mean / se, t_quantile(0.5 + level / 2, n - 1)
    return out | {"ci": [mean - q * se, mean + q * se], "t": t, "p": 2 * t_cdf(-abs(t), n - 1)}


def summarize(plan, done):
    """Per scheme, statistics over seeds; done maps (scheme, seed) to that run's (summary, eval)."""
    schemes = {}
    for name, cfg in plan.grid.items():
        runs, evals = zip(*(done[name, s] for s in plan.seeds))
        curves = np.array([[loss for _, loss in r["val_curve"]] for r in runs])  # (seeds, evaluations)
        schemes[name] = {
            "pos_emb": cfg.pos_emb, "changes": changes(cfg, plan.gcfg), "params": plan.params[name],
            **{key: mean_std(r[key] for r in runs) for key in ("final_val_loss", "val_bpb", "tokens_per_s")},
            "train_s": sum(r["train_s"] for r in runs), "eval_s": sum(e["eval_s"] for e in evals),
            "val_curve": {"iters": [it for it, _ in runs[0]["val_curve"]], "mean": curves.mean(0).tolist(),
                          "min": curves.min(0).tolist(), "max": curves.max(0).tolist()},
            "loss_by_length": {sc: {L: None if by_len[L] is None else mean_std(e["loss"][sc][L] for e in evals)
                                    for L in by_len} for sc, by_len in evals[0]["loss"].items()},
            "loss_by_position": {sc: np.mean([e["position"][sc] for e in evals], axis=0).tolist()
                                 for sc in evals[0]["position"]},
            "sample": evals[0]["sample"]}
    ref = schemes.get(REFERENCE)
    for name, s in schemes.items():
        if ref is not None and name != REFERENCE:
            s["params_delta"] = s["params"] - ref["params"]
            s["vs_reference"] = paired_test([a - b for a, b in zip(s["final_val_loss"]["values"],
                                                                   ref["final_val_loss"]["values"])])
    return {"reference": REFERENCE if ref is not None else None, "block_size": plan.gcfg.block_size,
            "lengths": plan.lengths, "windows": {str(L): n_windows(b) for L, b in plan.windows.items()},
            "seeds": plan.seeds, "tokens_per_run": tokens_per_run(plan.gcfg, plan.tc),
            "settings": {"ablate": asdict(plan.ac), **train_settings(plan.gcfg, plan.tc)},
            "device": plan.rt.device, "environment": run_record(), "schemes": schemes}


def n_windows(batches):
    return len(batches.eval_starts["val"])


def tokens_per_run(gcfg, tc):
    return tc.max_iters * tc.gradient_accumulation_steps * tc.batch_size * gcfg.block_size


# ----------------------------------------------------------------------------- outputs

def write_csv(path, plan, done):
    """One row per run: its figures and its loss at every length and scaling (empty where N/A)."""
    def column(scaling, L):
        return f"loss_{L}" + ("" if scaling == "none" else f"_{scaling}")

    columns = [column(sc, L) for sc in ["none", *plan.scalings] for L in plan.lengths]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scheme", "pos_emb", "seed", "params", "final_val_loss", "val_bpb", "tokens_per_s", "train_s",
                    "eval_s", *columns])
        for (name, seed), (r, e) in done.items():
            losses = {column(sc, L): v for sc, by_len in e["loss"].items() for L, v in by_len.items()}
            w.writerow([name, plan.grid[name].pos_emb, seed, plan.params[name], r["final_val_loss"], r["val_bpb"],
                        r["tokens_per_s"], r["train_s"], e["eval_s"],
                        *("" if losses.get(c) is None else losses[c] for c in columns)])


def pm(stat, spec=".4f"):
    """'mean ± std' of a mean_std dict; N/A for None."""
    if stat is None:
        return "N/A"
    return format(stat["mean"], spec) + ("" if stat["std"] is None else f" ± {stat['std']:{spec}}")


def segments(curve, L0):
    """Mean of the curve over each L0-long stretch of positions: [(first, last, mean)]."""
    return [(a, min(a + L0, len(curve)) - 1, statistics.fmean(curve[a:a + L0])) for a in range(0, len(curve), L0)]


def markdown(results, plots):
    """results.md: how the grid was run, then one section per table, the plots and the samples."""
    parts = [md_setup(results), md_final(results), md_paired(results), md_lengths(results), md_positions(results),
             "## Plots\n\n" + ("\n".join(f"![{title}]({file})" for file, title in plots) if plots else NO_PLOTS),
             md_samples(results)]
    return "\n\n".join(p for p in parts if p) + "\n"


def md_table(header, rows, text_columns=1):
    """A markdown table: the first text_columns columns left-aligned, the numbers right-aligned."""
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|",
                      *("| " + " | ".join(map(str, r)) + " |" for r in rows)])


def md_setup(r):
    m, t, env, schemes = r["settings"]["model"], r["settings"]["train"], r["environment"], r["schemes"]
    train_min, eval_min = (sum(x[k] for x in schemes.values()) / 60 for k in ("train_s", "eval_s"))
    return (f"# Positional-scheme ablation\n\n{len(schemes)} schemes x {len(r['seeds'])} seeds "
            f"({', '.join(map(str, r['seeds']))}) on `{t['dataset']}`: {m['n_layer']} layers, {m['n_head']} heads, "
            f"width {m['n_embd']}, trained at context L0 = {r['block_size']}. Each run: {t['max_iters']} steps, "
            f"{r['tokens_per_run']:,} tokens; every scheme of a seed sees the same batches in the same order.\n\n"
            f"Compute: {train_min:.1f} min training + {eval_min:.1f} min evaluation, summed over runs; this command's "
            f"wall time {r['wall_s'] / 60:.1f} min (runs finished earlier are reused). Device {r['device']}, "
            f"{env['cpu_threads']} CPU threads, torch {env['torch']}, code {env['code_version']}.")


def md_final(r):
    ref = r["reference"]
    schemes = r["schemes"]
    rows = [(name, f"{x['params']:,}", "—" if x.get("params_delta") is None else f"{x['params_delta']:+,}",
             pm(x["final_val_loss"]), pm(x["val_bpb"]), pm(x["tokens_per_s"], ",.0f")) for name, x in schemes.items()]
    differ = any(x.get("params_delta") for x in schemes.values())
    note = ("\n\nParameter differences come from the schemes themselves: learned positions add a block_size x "
            "n_embd table; the others add no trained parameters." if differ else "")
    return (f"## Validation loss after {r['settings']['train']['max_iters']} steps\n\nMean ± std over "
            f"{len(r['seeds'])} seeds. Bits per byte = loss / ln 2 x tokens per byte of the val split (for a "
            f"char-level dataset, bits per character). Tokens/s: median of the training log's windows.\n\n"
            + md_table(["scheme", "params", f"Δ params vs {ref or '—'}", "val loss", "bits/byte", "tokens/s"], rows)
            + note)


def md_paired(r):
    ref, n = r["reference"], len(r["seeds"])
    if ref is None or len(r["schemes"]) < 2:
        return ""
    rows = []
    for name, x in r["schemes"].items():
        if name != ref:
            v = x["vs_reference"]
            ci = "—" if v["ci"] is None else f"[{v['ci'][0]:+.4f}, {v['ci'][1]:+.4f}]"
            rows.append((name, f"{v['mean']:+.4f}", ci, "—" if v["t"] is None else f"{v['t']:.2f}",
                         "—" if v["p"] is None else f"{v['p']:.3g}"))
    return (f"## Paired comparison against {ref}\n\nPer seed, the scheme's val loss minus {ref}'s (same batches, same "
            f"initial seed), then a paired t-test over the {n} seeds: mean difference, 95% confidence interval "
            f"(Student t, df = {n - 1}) and two-sided p. Negative means lower loss than {ref}.\n\n"
            + md_table(["scheme", "Δ val loss", "95% CI", "t", "p"], rows))


def md_lengths(r):
    L0, lengths = r["block_size"], r["lengths"]
    rows = [(name, sc, *(pm(by_len[str(L)]) if str(L) in by_len else "—" for L in lengths))
            for name, x in r["schemes"].items() for sc, by_len in x["loss_by_length"].items()]
    windows = ", ".join(f"{w} of {L}" for L, w in r["windows"].items())
    return (f"## Length extrapolation\n\nValidation loss averaged over every position of fixed windows, the same "
            f"for every model ({windows} tokens), mean ± std over seeds. RoPE models are also scored with "
            f"inference-time scaling by the factor L/L0 beyond L0 (—: at or below L0 the factor would be 1). N/A: "
            f"learned positions have no embedding past L0.\n\n"
            + md_table(["scheme", "scaling", *(f"{L} ({L / L0:g}x)" for L in lengths)], rows, text_columns=2))


def md_positions(r):
    L0, longest = r["block_size"], max(r["lengths"])
    curves = [(name, sc, c) for name, x in r["schemes"].items() for sc, c in x["loss_by_position"].items()]
    if longest <= L0 or not curves:
        return ""
    missing = [name for name, x in r["schemes"].items() if not x["loss_by_position"]]
    return (f"## Loss by position within the {longest}-token windows\n\nMean loss over each L0-long stretch of "
            f"positions, mean over seeds; positions from {L0} on were never seen in training"
            + (f" ({', '.join(missing)}: N/A past L0)" if missing else "") + ".\n\n"
            + md_table(["scheme", "scaling", *(f"{a}–{b}" for a, b, _ in segments(curves[0][2], L0))],
                       [(name, sc, *(f"{v:.3f}" for _, _, v in segments(c, L0))) for name, sc, c in curves],
                       text_columns=2))


def md_samples(r):
    a, seed = r["settings"]["ablate"], r["seeds"][0]
    samples = [(name, x["sample"]) for name, x in r["schemes"].items() if x["sample"] is not None]
    if not samples:
        return ""
    return (f"## Samples\n\nPrompt {a['sample_prompt']!r}, {a['sample_tokens']} tokens at temperature "
            f"{a['sample_temperature']}, generator seed {seed}, from each scheme's seed-{seed} run.\n\n"
            + "\n\n".join(f"**{name}**\n\n```text\n{text}\n```" for name, text in samples))


NO_PLOTS = "Plots skipped: matplotlib is not installed (`pip install matplotlib` or `pip install -e .[plots]`)."


def write_plots(results, out):
    """PNG plots in out as [(file, title)], or None when matplotlib (an optional extra) is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    L0, schemes = results["block_size"], results["schemes"]
    colors = dict(zip(schemes, plt.rcParams["axes.prop_cycle"].by_key()["color"] * len(schemes)))
    dashes = dict(zip(["none", *results["settings"]["ablate"]["rope_scalings"].split(",")],
                      ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3))]))
    plots = []

    def save(fig, ax, file, title, xlabel, ylabel):
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes, never over a line
        fig.tight_layout()
        fig.savefig(out / file, dpi=110)
        plt.close(fig)
        plots.append((file, title))

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name, x in schemes.items():
        c = x["val_curve"]
        ax.plot(c["iters"], c["mean"], color=colors[name], label=name)
        ax.fill_between(c["iters"], c["min"], c["max"], color=colors[name], alpha=0.2)
    save(fig, ax, "val_loss.png", "Validation loss during training (band: min-max over seeds)", "step", "val loss")

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name, x in schemes.items():
        for sc, by_len in x["loss_by_length"].items():
            if sc != "none" and str(L0) in x["loss_by_length"]["none"]:  # at L0 the factor is 1: start from plain
                by_len = {str(L0): x["loss_by_length"]["none"][str(L0)], **by_len}
            pts = [(int(L), v["mean"], v["std"] or 0.0) for L, v in by_len.items() if v is not None]
            if pts:
                Ls, means, stds = zip(*pts)
                ax.errorbar(Ls, means, yerr=stds, color=colors[name], linestyle=dashes.get(sc, "-"), marker="o",
                            markersize=3, capsize=2, label=name if sc == "none" else f"{name} + {sc}")
    ax.axvline(L0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(results["lengths"], [str(L) for L in results["lengths"]])
    save(fig, ax, "loss_vs_length.png", f"Loss vs evaluation context (trained at L0 = {L0})", "context length (tokens)",
         "val loss")

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    longest = max(results["lengths"])
    width = max(1, longest // 32)  # 32 buckets: one position's mean over a few dozen windows is too noisy to read
    for name, x in schemes.items():
        for sc, curve in x["loss_by_position"].items():
            buckets = np.array(curve[: len(curve) // width * width]).reshape(-1, width).mean(1)  # (n_buckets,)
            ax.plot((np.arange(len(buckets)) + 0.5) * width, buckets, color=colors[name],
                    linestyle=dashes.get(sc, "-"), label=name if sc == "none" else f"{name} + {sc}")
    ax.axvline(L0, color="grey", linewidth=0.8)
    save(fig, ax, "loss_vs_position.png", f"Loss by position in {longest}-token windows ({width}-position means)",
         "position in window", "val loss")
    return plots


# ----------------------------------------------------------------------------- plan, estimate, main

@dataclass
class Plan:
    """Everything fixed for the whole grid, resolved and checked before anything trains."""
    ac: AblateConfig
    gcfg: GPTConfig
    tc: train.TrainConfig
    grid: dict
    seeds: list
    lengths: list
    scalings: list
    meta: dict
    rt: Runtime
    windows: dict  # {L: Batches holding the fixed validation windows of length L}
    params: dict  # {scheme: parameter count}


def make_plan(ac, gcfg, tc):
    dataset_dir = Path(tc.data_dir) / tc.dataset
    meta = load_meta(dataset_dir)
    gcfg = replace(gcfg, vocab_size=meta["vocab_size"])
    if ac.sample_tokens:
        if not ac.sample_prompt:
            raise ValueError("sample_prompt is empty; give a prompt, or sample_tokens=0 for no samples")
        tokenizer_from_meta(meta).encode(ac.sample_prompt)  # an unknown character fails now, not after training
    device, _ = pick_device(tc.device)
    rt = Runtime(device, pick_dtype(tc.dtype, device.split(":")[0]), compile=False)
    lengths = eval_lengths(ac, gcfg.block_size)
    windows = eval_sets(dataset_dir, meta, lengths, ac.eval_tokens, tc.batch_size * gcfg.block_size, device)
    grid = make_grid(ac, gcfg)
    return Plan(ac, gcfg, tc, grid, [tc.seed + i for i in range(ac.seeds)], lengths, rope_scalings(ac), meta, rt,
                windows, param_counts(grid))


def calibrate(plan):
    """Training FLOP/s reached here and now: the median of a few timed steps of the first scheme on random tokens."""
    cfg, tc, rt = next(iter(plan.grid.values())), plan.tc, plan.rt
    torch.manual_seed(0)
    state = train.TrainState(GPT(cfg).to(rt.device), tc, rt)
    x = torch.randint(cfg.vocab_size, (tc.batch_size, cfg.block_size), device=rt.device)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        train.train_step(state.model, state, [(x, x, None)], tc.learning_rate, tc.grad_clip, rt)[0].item()
        times.append(time.perf_counter() - t0)
    return state.model.flops_per_token(cfg.block_size) * x.numel() / statistics.median(times[3:])  # the first warm up


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
    settings = train_settings(plan.grid[name], replace(plan.tc, seed=seed))
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
              + ", ".join(f"{k}={v}" for k, v in changes(cfg, g).items()))
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
    statuses = {(name, seed): status(plan, name, seed) for seed in plan.seeds for name in plan.grid}
    print_plan(plan, statuses)
    if plan.ac.dry_run:
        print_estimate(plan, statuses)
        return
    done = {}
    with tqdm(statuses, desc="ablate", unit="run", dynamic_ncols=True, disable=not plan.tc.progress) as bar:
        for name, seed in bar:
            bar.set_postfix_str(f"{name} seed {seed} ({statuses[name, seed]})")
            done[name, seed] = finish_run(name, plan.grid[name], replace(plan.tc, seed=seed), plan)
    results = summarize(plan, done)
    plots = write_plots(results, out)
    results["wall_s"] = time.perf_counter() - t0
    write_json(out / "results.json", results)
    write_csv(out / "results.csv", plan, done)
    (out / "results.md").write_text(markdown(results, plots))
    if plots is None:
        print(NO_PLOTS)
    print(f"results: {out / 'results.md'}, results.json, results.csv" + "".join(f", {f}" for f, _ in plots or []))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(__doc__ + config.help_text(AblateConfig, GPTConfig, train.TrainConfig))
        return
    try:
        ablate(make_plan(*config.parse(argv, AblateConfig, GPTConfig, train.TrainConfig)))
    except (ValueError, train.Divergence) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except (Interrupted, KeyboardInterrupt) as e:
        print(f"\ninterrupted{': ' + str(e) if str(e) else ''}; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
