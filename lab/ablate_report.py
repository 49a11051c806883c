"""The ablation's figures over seeds, its tables and plots: what lab/ablate.py's runs mean and how they are shown.

It knows nothing of training or of how the grid ran; ablate.py hands it the runs' summaries and evaluations.
Statistics are lab/stats.py's, the output formats lab/report.py's.
"""

import csv
import io
import statistics

import numpy as np

from files import atomic_write
from lab.report import Plots, dress, md_table, palette, pm
from lab.stats import mean_std, paired_test

# ----------------------------------------------------------------------------- figures over seeds

def scheme_figures(runs, evals):
    """One scheme's figures over its seeds: runs and evals are its runs' summaries and evaluations, seed by seed."""
    curves = np.array([[loss for _, loss in r["val_curve"]] for r in runs])  # (seeds, evaluations)
    return {
        **{key: mean_std(r[key] for r in runs) for key in ("final_val_loss", "val_bpb", "tokens_per_s")},
        "train_s": sum(r["train_s"] for r in runs), "eval_s": sum(e["eval_s"] for e in evals),
        "val_curve": {"iters": [it for it, _ in runs[0]["val_curve"]], "mean": curves.mean(0).tolist(),
                      "min": curves.min(0).tolist(), "max": curves.max(0).tolist()},
        "loss_by_length": {sc: {L: None if by_len[L] is None else mean_std(e["loss"][sc][L] for e in evals)
                                for L in by_len} for sc, by_len in evals[0]["loss"].items()},
        "loss_by_position": {sc: np.mean([e["position"][sc] for e in evals], axis=0).tolist()
                             for sc in evals[0]["position"]}}


def against_reference(schemes, reference):
    """Add to each scheme but the reference its parameter difference from it and the paired test of its final val
    loss minus the reference's, seed by seed (mean_std keeps the values in seed order). Returns the reference's
    name, or None when schemes lack it."""
    ref = schemes.get(reference)
    if ref is None:
        return None
    for name, s in schemes.items():
        if name != reference:
            s["params_delta"] = s["params"] - ref["params"]
            s["vs_reference"] = paired_test([a - b for a, b in zip(s["final_val_loss"]["values"],
                                                                   ref["final_val_loss"]["values"])])
    return reference


# ----------------------------------------------------------------------------- outputs

def write_csv(path, plan, done):
    """One row per run: its figures and its loss at every length and scaling (empty where N/A). plan is ablate's
    (its grid, params, lengths and scalings); done maps (scheme, seed) to that run's (summary, eval)."""
    def column(scaling, L):
        return f"loss_{L}" + ("" if scaling == "none" else f"_{scaling}")

    columns = [column(sc, L) for sc in ["none", *plan.scalings] for L in plan.lengths]
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow(["scheme", "pos_emb", "seed", "params", "final_val_loss", "val_bpb", "tokens_per_s", "train_s",
                "eval_s", *columns])
    for (name, seed), (r, e) in done.items():
        losses = {column(sc, L): v for sc, by_len in e["loss"].items() for L, v in by_len.items()}
        w.writerow([name, plan.grid[name].pos_emb, seed, plan.params[name], r["final_val_loss"], r["val_bpb"],
                    r["tokens_per_s"], r["train_s"], e["eval_s"],
                    *("" if losses.get(c) is None else losses[c] for c in columns)])
    atomic_write(path, lambda f: f.write(text.getvalue().encode()))


def segments(curve, L0):
    """Mean of the curve over each L0-long stretch of positions: [(first, last, mean)]."""
    return [(a, min(a + L0, len(curve)) - 1, statistics.fmean(curve[a:a + L0])) for a in range(0, len(curve), L0)]


def markdown(results, plots):
    """results.md: how the grid was run, then one section per table, the plots and the samples."""
    parts = [md_setup(results), md_final(results), md_paired(results), md_lengths(results), md_positions(results),
             plots.section(), md_samples(results)]
    return "\n\n".join(p for p in parts if p) + "\n"


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


def write_plots(results, out):
    """The PNG plots in out (report.Plots: none without matplotlib)."""
    plots = Plots(out)
    if (plt := plots.plt) is None:
        return plots
    L0, schemes = results["block_size"], results["schemes"]
    colors = palette(plt, schemes)
    dashes = dict(zip(["none", *results["settings"]["ablate"]["rope_scalings"].split(",")],
                      ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3))]))

    def save(fig, ax, file, title, xlabel, ylabel):
        dress(ax, title, xlabel, ylabel)
        plots.save(fig, file, title)

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
