"""The ablation's figures over seeds, its tables and plots: what lab/ablate.py's runs mean and how they are shown.

It knows nothing of training or of how the grid ran; ablate.py hands it the runs' summaries and evaluations.
Statistics are lab/stats.py's, the output formats lab/report.py's.
"""

import csv
import io
import statistics

import numpy as np

from files import atomic_write
from lab.report import Plots, dress, md_regime, md_table, palette, pm
from lab.retrieval import THRESHOLDS, distance_plots, grid_mean, kmax
from lab.stats import mean_std, verdicts
from rope import NO_SCALING as AS_TRAINED  # the loss tables' key of a model scored as it was trained

# ----------------------------------------------------------------------------- figures over seeds

def scheme_figures(runs, evals, L0):
    """One scheme's figures over its seeds at one learning rate: runs and evals are its runs' summaries and
    evaluations, seed by seed (the first seed's also hold its attention statistics and score biases). Retrieval:
    the mean grid by distance, each seed's k_max at each threshold in the longest window it reaches, and the worst
    query slot at L0 (the shortcut check)."""
    curves = np.array([[loss for _, loss in r["val_curve"]] for r in runs])  # (seeds, evaluations)
    retrieval = None
    if evals[0].get("retrieval"):
        grids = [e["retrieval"]["distance"] for e in evals]
        longest = max((W for W, by_k in grids[0].items() if by_k is not None), key=int)
        retrieval = {"grid": grid_mean(grids), "longest": longest,
                     "kmax": {name: mean_std(kmax(g[longest], th) for g in grids) for name, th in THRESHOLDS.items()},
                     "kmax_L0": {name: mean_std(kmax(g[str(L0)], th) for g in grids) for name, th in THRESHOLDS.items()}
                     if str(L0) in grids[0] else None,
                     "worst_slot": mean_std(min(e["retrieval"]["slot"].values()) for e in evals)}
    threads = sorted({r.get("threads") for r in runs}, key=str)
    return {
        "seeds": [r["seed"] for r in runs], "threads": threads,
        **{key: mean_std(r[key] for r in runs) for key in ("final_val_loss", "val_bpb", "tokens_per_s")},
        "train_s": sum(r["train_s"] for r in runs), "eval_s": sum(e["eval_s"] for e in evals),
        "val_curve": {"iters": [it for it, _ in runs[0]["val_curve"]], "mean": curves.mean(0).tolist(),
                      "min": curves.min(0).tolist(), "max": curves.max(0).tolist()},
        "loss_by_length": {sc: {L: None if by_len[L] is None else mean_std(e["loss"][sc][L] for e in evals)
                                for L in by_len} for sc, by_len in evals[0]["loss"].items()},
        "loss_by_position": {sc: np.mean([e["position"][sc] for e in evals], axis=0).tolist()
                             for sc in evals[0]["position"]},
        "retrieval": retrieval, "attention": evals[0].get("attention"), "biases": evals[0].get("biases")}


def verdicts_against(schemes, reference, ranking, margin):
    """Each scheme's final val loss minus the reference's, seed by seed over the seeds both ran, in one ranking
    (shared: every scheme at the shared rate; tuned: each at its best): stats.verdicts over the table, "lower"
    expected (negative is better than the reference), "no difference" where an equivalence test puts the
    difference within margin. The Holm family holds both tests of every scheme; each claim carries the smallest
    difference its seeds could settle ("detectable")."""
    ref = schemes.get(reference)
    if ref is None:
        return []
    ref_loss = dict(zip(ref[ranking]["seeds"], ref[ranking]["final_val_loss"]["values"]))
    claims = []
    for name, x in schemes.items():
        if name != reference:
            mine = dict(zip(x[ranking]["seeds"], x[ranking]["final_val_loss"]["values"]))
            common = sorted(mine.keys() & ref_loss.keys())
            claims.append({"scheme": name, "diffs": [mine[s] - ref_loss[s] for s in common], "expect": "lower",
                           "margin": margin})
    return verdicts(claims)


def verdict_words(claim, reference):
    """The verdict as a reader wants it: lower or higher than the reference, no difference, or inconclusive."""
    if claim["verdict"] == "holds":
        return f"lower than {reference}"
    if claim["verdict"] == "does not hold":
        shown_same = claim["equivalence_p_holm"] is not None and claim["equivalence_p_holm"] < 0.05
        return f"no difference (within ±{claim['margin']:g})" if shown_same else f"higher than {reference}"
    return "inconclusive"


# ----------------------------------------------------------------------------- outputs

def write_csv(path, plan, done):
    """One row per run: its figures and its loss at every length and scaling (empty where N/A). plan is ablate's
    (its grid, params, lengths and scalings); done maps (scheme, scale, seed) to that run's (summary, eval)."""
    def column(scaling, L):
        return f"loss_{L}" + ("" if scaling == AS_TRAINED else f"_{scaling}")

    columns = [column(sc, L) for sc in [AS_TRAINED, *plan.scalings] for L in plan.lengths]
    text = io.StringIO()
    w = csv.writer(text)
    w.writerow(["scheme", "pos_emb", "lr_scale", "seed", "params", "final_val_loss", "val_bpb", "tokens_per_s",
                "train_s", "eval_s", *columns])
    for (name, scale, seed), (r, e) in done.items():
        losses = {column(sc, L): v for sc, by_len in e["loss"].items() for L, v in by_len.items()}
        w.writerow([name, plan.grid[name].pos_emb, scale, seed, plan.params[name], r["final_val_loss"], r["val_bpb"],
                    r["tokens_per_s"], r["train_s"], e["eval_s"],
                    *("" if losses.get(c) is None else losses[c] for c in columns)])
    atomic_write(path, lambda f: f.write(text.getvalue().encode()))


def segments(curve, L0):
    """Mean of the curve over each L0-long stretch of positions: [(first, last, mean)]."""
    return [(a, min(a + L0, len(curve)) - 1, statistics.fmean(curve[a:a + L0])) for a in range(0, len(curve), L0)]


def markdown(results, plots):
    """results.md: how the grid was run, then one section per table, the plots and the samples."""
    parts = [md_setup(results), md_regime(results["regime"]) if results["regime"] else "", md_rates(results),
             md_ranking(results, "tuned"), md_ranking(results, "shared"), md_retrieval(results), md_speed(results),
             md_lengths(results), md_positions(results), md_attention(results), plots.section(), md_samples(results)]
    return "\n\n".join(p for p in parts if p) + "\n"


def md_setup(r):
    m, t, env, schemes = r["settings"]["model"], r["settings"]["train"], r["environment"], r["schemes"]
    ranked = [x[rk] for x in schemes.values() for rk in ("shared", "tuned") if rk == "shared" or x["best_scale"] != 1]
    train_min, eval_min = (sum(f[k] for f in ranked) / 60 for k in ("train_s", "eval_s"))
    b, a = r["settings"]["batches"], r["settings"]["ablate"]
    task = f", the recall task in {b['recall_share']:.0%} of the sequences" if b["recall_share"] else ""
    sweep = (f"; each scheme's learning rate chosen on seed {r['selection_seed']}, which is in no test"
             if r["selection_seed"] is not None else "")
    return (f"# Positional-scheme ablation\n\n{len(schemes)} schemes on `{t['dataset']}`, test seeds "
            f"{', '.join(map(str, r['seeds']))} (fixed before the run){sweep}: {m['n_layer']} layers, "
            f"{m['n_head']} heads, width {m['n_embd']}, trained at context L0 = {r['block_size']}. Each run: "
            f"{t['max_iters']} steps, {r['tokens_per_run']:,} tokens, {t['optimizer']}{task}; every scheme of a seed "
            f"sees the same batches in the same order.\n\n"
            f"Compute: {train_min:.1f} min training + {eval_min:.1f} min evaluation, summed over the ranked runs, "
            f"{a['workers']} run(s) at a time; this command's wall time {r['wall_s'] / 60:.1f} min (runs finished "
            f"earlier are reused). Device {r['device']}, {t['dtype']}, {env['cpu_threads']} CPU threads, torch "
            f"{env['torch']}, code {env['code_version']}.")


def md_rates(r):
    if r["selection_seed"] is None:
        return ""
    lr = r["learning_rates"]
    rates = f"learning_rate {lr['learning_rate']:g}" + (f", muon_lr {lr['muon_lr']:g}" if lr["optimizer"] == "muon"
                                                       else "")
    scales = sorted({float(k) for x in r["schemes"].values() for k in x["sweep"]})
    rows = [[name, *(f"{x['sweep'][k]:.4f}" if (k := f"{s:g}") in x["sweep"] else "—" for s in scales),
             f"x{x['best_scale']:g}"] for name, x in r["schemes"].items()]
    return (f"## Each scheme's learning rate\n\nFinal val loss of the selection seed ({r['selection_seed']}, in no "
            f"test) at each multiple of the learning rates ({rates} at x1), widened by one more multiple where the "
            f"best lay at an edge; the lowest is the scheme's own rate, at which it trains every test seed (—: not "
            f"tried; DroPE's variants keep the shared rate, their recalibration rate being their axis).\n\n"
            + md_table(["scheme", *(f"x{s:g}" for s in scales), "chosen"], rows))


def md_ranking(r, ranking):
    ref, schemes = r["reference"], r["schemes"]
    if ranking == "tuned" and r["selection_seed"] is None:
        return ""
    by = {c["scheme"]: c for c in r["verdicts"][ranking]}
    rows = []
    for name, x in sorted(schemes.items(), key=lambda kv: kv[1][ranking]["final_val_loss"]["mean"]):
        f, c = x[ranking], by.get(name)
        test = None if c is None else c["test"]
        diff = "—" if test is None or test["ci"] is None else \
            f"{test['mean']:+.4f} [{test['ci'][0]:+.4f}, {test['ci'][1]:+.4f}]"
        p = "—" if test is None or test["p"] is None else f"{test['p']:.2g}"
        holm = "—" if c is None or c["p_holm"] is None else f"{c['p_holm']:.2g}"
        eq = "—" if c is None or c["equivalence_p_holm"] is None else f"{c['equivalence_p_holm']:.2g}"
        settled = "—" if c is None else "none" if c["detectable"] is None else f"{c['detectable']:.3f}"
        rows.append([name, f"x{f['scale']:g}", pm(f["final_val_loss"]), diff, p, holm, eq,
                     "reference" if c is None else verdict_words(c, ref), settled, len(f["seeds"])])
    title = "each scheme at its own learning rate" if ranking == "tuned" else "every scheme at the shared learning rate"
    a, family = r["settings"]["ablate"], next(iter(by.values()))["family"] if by else 0
    return (f"## Ranking: {title}\n\nFinal val loss, mean ± std over the test seeds; against {ref}, per seed (same "
            f"batches), the mean difference with its 95% CI (unadjusted), the paired t-test's p, and p Holm-adjusted "
            f"over one family of {family} tests: each scheme's difference test and its equivalence test (two one-sided "
            f"tests within ±{a['equivalence_margin']:g} nats). \"lower\" or \"higher\" needs the difference's p (Holm) < "
            f"0.05, \"no difference\" the equivalence's. Smallest settled: the smallest mean difference these seeds "
            f"could settle given the spread seen.\n\n"
            + md_table(["scheme", "lr", "val loss", f"Δ vs {ref} [95% CI]", "p", "p (Holm)", "equivalence p (Holm)",
                        "verdict", "smallest settled", "seeds"], rows))


def md_retrieval(r):
    figures = {n: x["tuned"]["retrieval"] for n, x in r["schemes"].items() if x["tuned"]["retrieval"]}
    if not figures:
        return ""
    L0, probe = r["block_size"], r["probe"]
    rows = [[name, pm(f["worst_slot"], ".2f"), *(pm(f["kmax_L0"][n], ".0f") if f["kmax_L0"] else "N/A"
                                                 for n in THRESHOLDS),
             f"{f['longest']} ({int(f['longest']) / L0:g}x)", *(pm(f["kmax"][n], ".0f") for n in THRESHOLDS)]
            for name, f in figures.items()]
    elim = ", ".join(f"{v:.2f}" for v in probe["elimination"].values())
    return (f"## Retrieval by distance: which schemes learn it at this budget\n\nk_max is the PI paper's effective "
            f"window (section 3.3): the largest needle-to-query distance k such that every probed distance up to k "
            f"is answered in at least 20% of the trials; beside it our stricter 90%. Whole answers to one query among "
            f"{round(1 / probe['chance'])} needles: copying some needle without reading the key scores "
            f"{probe['chance']:.0%}, and passes 20% at one distance with probability "
            f"{probe['false_pass']['pi']:.1%}. Worst slot: the worst query slot's whole answers at L0 when every needle "
            f"is queried once in a random order (elimination would score {elim} at slots 1 onwards; a scheme that "
            f"reads the key scores alike at every slot). Each scheme at its own rate, mean ± std over the test "
            f"seeds.\n\n" + md_table(["scheme", "worst slot at L0", "k_max 20% at L0", "k_max 90% at L0",
                                       "longest window", "k_max 20% there", "k_max 90% there"], rows))


def md_speed(r):
    rows = [[name, pm(x["tuned"]["tokens_per_s"], ",.0f"), ", ".join(map(str, x["tuned"]["threads"]))]
            for name, x in r["schemes"].items()]
    threads = {t for x in r["schemes"].values() for t in x["tuned"]["threads"]}
    note = ("every run on the same thread count, so the figures compare" if len(threads) == 1 else
            "the runs' thread counts differ: compare tokens/s only between rows of the same thread count")
    return ("## Training speed\n\nTokens per second during training, median over the run's logging windows, mean ± "
            f"std over the test seeds, each scheme at its own rate; {note}.\n\n"
            + md_table(["scheme", "tokens/s", "CPU threads"], rows))


def md_attention(r):
    inside = {n: x["tuned"]["attention"] for n, x in r["schemes"].items() if x["tuned"]["attention"]}
    if not inside:
        return ""
    rows = [[name, *(f"{sum(d) / len(d):.1f} / {sum(e) / len(e):.2f}" for d, e in zip(a["distance"], a["entropy"]))]
            for name, a in inside.items()]
    uniform = next(iter(inside.values()))["uniform_entropy"]
    return (f"## Inside: attention distance and entropy\n\nPer layer, the mean over heads of the attention-weighted "
            f"distance (tokens) / the attention's entropy (nats; a uniform causal head has about {uniform:.2f}), over "
            f"fixed validation windows at L0, first seed, each scheme at its own rate; attention.png shows every "
            f"head.\n\n" + md_table(["scheme", *(f"layer {i}" for i in range(len(rows[0]) - 1))], rows))


def md_lengths(r):
    L0, lengths = r["block_size"], r["lengths"]
    rows = [(name, sc, *(pm(by_len[str(L)]) if str(L) in by_len else "—" for L in lengths))
            for name, x in r["schemes"].items() for sc, by_len in x["tuned"]["loss_by_length"].items()]
    windows = ", ".join(f"{w} of {L}" for L, w in r["windows"].items())
    return (f"## Length extrapolation\n\nValidation loss averaged over every position of fixed windows, the same "
            f"for every model ({windows} tokens), mean ± std over seeds, each scheme at its own rate. RoPE models are "
            f"also scored with "
            f"inference-time scaling by the factor L/L0 beyond L0 (—: at or below L0 the factor would be 1). N/A: "
            f"learned positions have no embedding past L0.\n\n"
            + md_table(["scheme", "scaling", *(f"{L} ({L / L0:g}x)" for L in lengths)], rows, text_columns=2))


def md_positions(r):
    L0, longest = r["block_size"], max(r["lengths"])
    curves = [(name, sc, c) for name, x in r["schemes"].items() for sc, c in x["tuned"]["loss_by_position"].items()]
    if longest <= L0 or not curves:
        return ""
    missing = [name for name, x in r["schemes"].items() if not x["tuned"]["loss_by_position"]]
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
    dashes = dict(zip([AS_TRAINED, *results["settings"]["ablate"]["rope_scalings"].split(",")],
                      ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3))]))

    def save(fig, ax, file, title, xlabel, ylabel):
        dress(ax, title, xlabel, ylabel)
        plots.save(fig, file, title)

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name, x in schemes.items():
        c = x["tuned"]["val_curve"]
        ax.plot(c["iters"], c["mean"], color=colors[name], label=name)
        ax.fill_between(c["iters"], c["min"], c["max"], color=colors[name], alpha=0.2)
    save(fig, ax, "val_loss.png", "Validation loss during training (band: min-max over seeds)", "step", "val loss")

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name, x in schemes.items():
        lengths = x["tuned"]["loss_by_length"]
        for sc, by_len in lengths.items():
            if sc != AS_TRAINED and str(L0) in lengths[AS_TRAINED]:  # at L0 the factor is 1: start from plain
                by_len = {str(L0): lengths[AS_TRAINED][str(L0)], **by_len}
            pts = [(int(L), v["mean"], v["std"] or 0.0) for L, v in by_len.items() if v is not None]
            if pts:
                Ls, means, stds = zip(*pts)
                ax.errorbar(Ls, means, yerr=stds, color=colors[name], linestyle=dashes.get(sc, "-"), marker="o",
                            markersize=3, capsize=2, label=name if sc == AS_TRAINED else f"{name} + {sc}")
    ax.axvline(L0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(results["lengths"], [str(L) for L in results["lengths"]])
    save(fig, ax, "loss_vs_length.png", f"Loss vs evaluation context (trained at L0 = {L0})", "context length (tokens)",
         "val loss")

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    longest = max(results["lengths"])
    width = max(1, longest // 32)  # 32 buckets: one position's mean over a few dozen windows is too noisy to read
    for name, x in schemes.items():
        for sc, curve in x["tuned"]["loss_by_position"].items():
            buckets = np.array(curve[: len(curve) // width * width]).reshape(-1, width).mean(1)  # (n_buckets,)
            ax.plot((np.arange(len(buckets)) + 0.5) * width, buckets, color=colors[name],
                    linestyle=dashes.get(sc, "-"), label=name if sc == AS_TRAINED else f"{name} + {sc}")
    ax.axvline(L0, color="grey", linewidth=0.8)
    save(fig, ax, "loss_vs_position.png", f"Loss by position in {longest}-token windows ({width}-position means)",
         "position in window", "val loss")

    grids = [(name, x["tuned"]["retrieval"]["grid"]) for name, x in schemes.items() if x["tuned"]["retrieval"]]
    if grids:
        distance_plots(plots, grids, L0, results["probe"]["chance"], "retrieval.png",
                       f"Whole answers by needle-to-query distance, each window length (L0 = {L0}; mean over seeds)")
    inside = [(name, x["tuned"]["attention"]) for name, x in schemes.items() if x["tuned"]["attention"]]
    if inside:
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        for ax, key, label in zip(axes, ("distance", "entropy"), ("attention distance (tokens)", "entropy (nats)")):
            for name, a in inside:
                heads = np.array(a[key])  # (layers, heads)
                ax.plot(np.arange(heads.size) / heads.shape[1], heads.flatten(), marker="o", markersize=3,
                        linestyle="", color=colors[name], label=name)
            dress(ax, f"{label} of every head", "layer (its heads side by side)", label, legend=None)
        axes[1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        plots.save(fig, "attention.png", "Attention distance and entropy per layer and head, first seed")
    learned = [(name, x["tuned"]["biases"]) for name, x in schemes.items() if x["tuned"]["biases"]]
    if learned:
        fig, axes = plt.subplots(1, len(learned), figsize=(4.5 * len(learned), 3.8), squeeze=False)
        for ax, (name, by_layer) in zip(axes[0], learned):
            for layer, heads in by_layer.items():
                color = plt.get_cmap("viridis")(int(layer) / max(1, len(by_layer) - 1))
                for h, curve in enumerate(heads):
                    ax.plot(curve, color=color, alpha=0.7, label=f"layer {layer}" if h == 0 else None)
            ax.axvline(L0, color="grey", linewidth=0.8)
            dress(ax, name, "distance (tokens; the line: L0)", "score bias", legend="inside")
        plots.save(fig, "biases.png", f"Score biases against distance, each head, from a query at "
                                      f"{max(results['lengths']) - 1}")
    return plots

