"""Figures over seeds, the papers' claims with their verdicts, tables and plots of the context-extension lab
(lab/extend.py). Statistics are lab/stats.py's, output formats lab/report.py's; this module knows nothing of
training."""

import math

from lab.report import Plots, dress, md_table, pm
from lab.retrieval import at_length, grid_mean, heatmaps, window
from lab.stats import mean_std, verdicts
from rope import NO_SCALING

DIRECT = NO_SCALING  # direct fine-tuning: at the new length with no scaling
SAME_MARGIN = 0.05  # nats: PI's cost at L0 "small", as the claim states it, against direct fine-tuning


def key(b, scaling, s):
    return f"rope-b{b:g}-{scaling}-x{s:g}"


def regime(b, head_dim, L0):
    """RoPE's longest wavelength 2 pi b^((d-2)/d) against the trained context, and the pairs that turn less than
    once within it: the dimensionless ratios a small model must match to stand in for a large one."""
    longest = 2 * math.pi * b ** ((head_dim - 2) / head_dim)
    slow = sum(2 * math.pi * b ** (2 * i / head_dim) > L0 for i in range(head_dim // 2))
    return {"base": b, "longest_wavelength": longest, "ratio_to_L0": longest / L0, "slow_pairs": slow,
            "pairs": head_dim // 2}


def lab_results(lab, done, seeds):
    """results.json's figures and claims; done maps (kind, name, s, seed) to that run's figures."""
    L0, th = lab.gcfg.block_size, lab.ec.retrieval_threshold
    base = {}
    for name in lab.models():
        runs = [done["base", name, None, seed] for seed in (seeds["base"] if name.startswith("rope")
                                                              else lab.seeds[:lab.ec.scheme_seeds])]
        base[name] = {"final_val_loss": mean_std(r["final_val_loss"] for r in runs),
                      "curve": {st: grid_mean([r["curve"][st] for r in runs]) for st in runs[0]["curve"]},
                      "retrieval": {sc: grid_mean([r["retrieval"][sc] for r in runs]) for sc in runs[0]["retrieval"]}}
    finetune = {}
    for b in lab.bases:
        for s in lab.factors:
            for sc in lab.scalings:
                runs = [done["finetune", (b, sc), s, seed] for seed in seeds["finetune"]]
                finetune[key(b, sc, s)] = {
                    "base": b, "scaling": sc, "factor": s,
                    "loss": {st: {L: mean_std(r[st]["loss"][L] for r in runs) for L in runs[0][st]["loss"]}
                             for st in runs[0]},
                    "window": {st: mean_std(window(r[st]["retrieval"], th, L0) for r in runs) for st in runs[0]},
                    "retrieval": {st: grid_mean([r[st]["retrieval"] for r in runs]) for st in runs[0]}}
    results = {"block_size": L0, "seeds": seeds, "steps": lab.steps, "factors": lab.factors, "bases": lab.bases,
               "scalings": lab.scalings, "stages": lab.stages, "depths": lab.probe.depths, "threshold": th,
               "regime": [regime(b, lab.gcfg.head_dim, L0) for b in lab.bases], "base": base, "finetune": finetune}
    results["claims"] = verdicts(claims(results))
    return results


# ----------------------------------------------------------------------------- the papers' claims at this scale

def claims(r):
    """The papers' claims for every base and factor, each as per-seed differences A - B with the side expected:
    stats.verdicts judges them together. A claim whose scalings the lab did not run is left out."""
    L0, steps, out = r["block_size"], r["steps"], []
    first, last = str(steps[1]), str(steps[-1])

    def values(b, sc, s, what, st, L=None):
        run = r["finetune"].get(key(b, sc, s))
        if run is None:
            return None
        return (run["loss"][st][L] if what == "loss" else run["window"][st])["values"]

    def claim(text, a, b, expect, margin=None):
        if a is not None and b is not None:
            out.append({"claim": text, "diffs": [x - y for x, y in zip(a, b)], "expect": expect, "margin": margin})

    for b in r["bases"]:
        for s in r["factors"]:
            near, far, at = str(round(s * L0)), str(round(2 * s * L0)), f"(base {b:g}, s = {s:g})"
            for other, name in (("ntk", "NTK"), ("yarn", "YaRN")):
                claim(f"(a) without fine-tuning, {name} has a lower loss than PI at {near} tokens {at}",
                      values(b, other, s, "loss", "0", near), values(b, "linear", s, "loss", "0", near), "lower")
            claim(f"(b) after {last} steps, PI has a lower loss than direct fine-tuning at {near} tokens {at}",
                  values(b, "linear", s, "loss", last, near), values(b, DIRECT, s, "loss", last, near), "lower")
            claim(f"(c) after {first} steps, YaRN has a lower loss than PI at {near} tokens (it needs fewer steps) "
                  f"{at}", values(b, "yarn", s, "loss", first, near), values(b, "linear", s, "loss", first, near),
                  "lower")
            claim(f"(d) fine-tuned at {near}, YaRN holds a lower loss than PI at {far} tokens {at}",
                  values(b, "yarn", s, "loss", last, far), values(b, "linear", s, "loss", last, far), "lower")
            claim(f"(e) PI's loss at L0 = {L0} is within {SAME_MARGIN} of direct fine-tuning's after {last} steps "
                  f"{at}", values(b, "linear", s, "loss", last, str(L0)), values(b, DIRECT, s, "loss", last, str(L0)),
                  "same", SAME_MARGIN)
            claim(f"(f) after {first} steps, PI's effective window is longer than direct fine-tuning's {at}",
                  values(b, "linear", s, "window", first), values(b, DIRECT, s, "window", first), "higher")
            claim(f"(g) after {last} steps, YaRN's effective window is longer than PI's {at}",
                  values(b, "yarn", s, "window", last), values(b, "linear", s, "window", last), "higher")
    return out


# ----------------------------------------------------------------------------- results.md

def answer(by_depth):
    """'mean over depths / worst depth' of whole answers, in %; N/A past a scheme's reach."""
    if by_depth is None:
        return "N/A"
    return f"{100 * at_length(by_depth):.0f} / {100 * min(d['answer'] for d in by_depth.values()):.0f}"


def markdown(r, plots):
    L0, steps, th = r["block_size"], r["steps"], r["threshold"]
    ec = r["settings"]["extend"]
    others = f" (the other schemes: the first {ec['scheme_seeds']})" if any(
        not m.startswith("rope") for m in r["base"]) else ""
    parts = [f"# Context extension\n\nTrained at L0 = {L0} tokens; seeds {', '.join(map(str, r['seeds']['finetune']))} "
             f"for RoPE{others}; mean ± std over seeds. Compute: {r['train_s'] / 60:.1f} min training summed over "
             f"the runs ({ec['workers']} at a time), evaluation besides; this command's wall time "
             f"{r['wall_s'] / 60:.1f} min (runs finished earlier are reused). Device "
             f"{r['device']} ({r['settings']['train']['dtype']}), torch {r['environment']['torch']}, code "
             f"{r['environment']['code_version']}."]
    parts.append("## The regime: RoPE's wavelengths against the context\n\nA small model stands in for a large one "
                 "only with the dimensionless ratios matched. LLaMA-2 (head size 128, base 10,000, L0 = 4,096): "
                 "longest wavelength / L0 ≈ 13.\n\n" + md_table(
                     ["RoPE base", "longest wavelength (tokens)", "ratio to L0", "pairs turning less than once in L0"],
                     [[f"{g['base']:g}", f"{g['longest_wavelength']:,.0f}", f"{g['ratio_to_L0']:.1f}",
                       f"{g['slow_pairs']} of {g['pairs']}"] for g in r["regime"]]))
    depths = r["depths"]
    rows = [[name, st, *(pct(x["curve"][st][str(L0)][str(d)]["answer"]) for d in depths),
             pct(min(x["curve"][st][str(L0)][str(d)]["first"] for d in depths))]
            for name, x in r["base"].items() for st in x["curve"]]
    parts.append(f"## Retrieval is learned first: RoPE at L0 during training\n\nWhole answers retrieved at L0 = {L0} "
                 f"by the needle's depth (0: the window's start), and the worst depth's first answer token "
                 f"chance-corrected ((accuracy - 1/26) / (1 - 1/26)); mean over seeds.\n\n"
                 + md_table(["model", "step", *(f"depth {d:g}" for d in depths), "first token, worst depth"], rows,
                            text_columns=2))
    widths = sorted({W for x in r["base"].values() for W in x["retrieval"][NO_SCALING]}, key=int)
    rows = [[name, sc, pm(x["final_val_loss"]) if sc == NO_SCALING else "", *(answer(g.get(W)) if W in g else "—"
                                                                        for W in widths)]
            for name, x in r["base"].items() for sc, g in x["retrieval"].items()]
    parts.append("## Base models: loss at L0 and retrieval by length\n\nWhole answers retrieved, mean over depths / "
                 "the worst depth (%), mean over seeds; RoPE also with each scaling by the factor W/L0 past L0 "
                 "(—: at or below L0 it would be 1). N/A: learned positions stop at L0.\n\n"
                 + md_table(["model", "scaling", "val loss at L0", *(f"{W} ({int(W) / L0:g}x)" for W in widths)], rows,
                            text_columns=2))
    rows = [[f"{x['base']:g}", f"{x['factor']:g}", x["scaling"], *(pm(x["window"][str(st)], ".0f") for st in steps)]
            for x in r["finetune"].values()]
    parts.append(f"## The effective context window against fine-tuning steps\n\nThe longest probed length up to which "
                 f"every length from L0 = {L0} retrieves at least {th:.0%} of whole answers (mean over depths; 0: not "
                 f"even L0), mean ± std over seeds; the PI paper's Table 4 question. Shorter windows are in the "
                 f"heatmaps.\n\n"
                 + md_table(["base", "s", "scaling", *(f"step {st}" for st in steps)], rows, text_columns=3))
    rows = [[f"{x['base']:g}", f"{x['factor']:g}", x["scaling"], L, *(pm(x["loss"][str(st)][L], ".3f") for st in steps)]
            for x in r["finetune"].values() for L in x["loss"][str(steps[-1])]]
    parts.append("## Fine-tuning: val loss against steps at L0, s L0 and 2s L0\n\n"
                 + md_table(["base", "s", "scaling", "length", *(f"step {st}" for st in steps)], rows, text_columns=4))
    parts.append(md_claims(r["claims"]))
    parts.append(plots.section())
    return "\n\n".join(parts) + "\n"


def pct(x):
    return f"{100 * x:.0f}%"


def md_claims(claims):
    rows = []
    for c in claims:
        t = c["test"]
        ci = "—" if t["ci"] is None else f"[{t['ci'][0]:+.3f}, {t['ci'][1]:+.3f}]"
        p = "—" if t["p"] is None else f"{t['p']:.2g}"
        holm = "—" if c["p_holm"] is None else f"{c['p_holm']:.2g}"
        eq = "" if c["equivalence_p_holm"] is None else f"; within ±{c['margin']}: p (Holm) {c['equivalence_p_holm']:.2g}"
        rows.append([c["claim"], f"{t['mean']:+.3f}", ci, p, holm + eq, f"**{c['verdict']}**", len(c["diffs"])])
    return ("## The papers' claims at this scale\n\nEach claim as per-seed differences A − B (loss in nats, windows in "
            "tokens): their mean, 95% CI, the paired t-test's p, and p Holm-adjusted over every test of the table; "
            "\"holds\" and \"does not hold\" need p (Holm) < 0.05 on a side, \"inconclusive\" is neither, and \"same\" "
            "claims are judged by an equivalence test within the stated margin.\n\n"
            + md_table(["claim", "mean A − B", "95% CI", "p", "p (Holm)", "verdict", "seeds"], rows, text_columns=1))


# ----------------------------------------------------------------------------- plots

def write_plots(r, out):
    """The PNG plots in out (report.Plots: none without matplotlib): retrieval heatmaps (depth x length) of the
    base models and the fine-tuned ones, the effective window and the loss against fine-tuning steps."""
    plots = Plots(out)
    if (plt := plots.plt) is None:
        return plots
    L0, last = r["block_size"], str(r["steps"][-1])

    heatmaps(plots, [(name, x["retrieval"][NO_SCALING]) for name, x in r["base"].items()], L0, "retrieval_base.png",
             f"Base models: whole answers retrieved by depth (rows) and length (x L0 = {L0})")
    for b in r["bases"]:
        runs = [x for x in r["finetune"].values() if x["base"] == b]
        heatmaps(plots, [(f"{x['scaling']} x{x['factor']:g}", x["retrieval"][last]) for x in runs], L0,
                 f"retrieval_finetuned_b{b:g}.png",
                 f"RoPE base {b:g} after {last} fine-tuning steps: whole answers by depth and length")
        fig, axes = plt.subplots(1, len(r["factors"]), figsize=(6 * len(r["factors"]), 4), squeeze=False)
        for ax, s in zip(axes[0], r["factors"]):
            for x in (x for x in runs if x["factor"] == s):
                steps = [int(st) for st in x["window"]]
                ax.errorbar([max(st, 1) for st in steps], [x["window"][st]["mean"] for st in x["window"]],
                            yerr=[x["window"][st]["std"] or 0 for st in x["window"]], marker="o", capsize=2,
                            label=x["scaling"])
            ax.axhline(s * L0, color="gray", linestyle=":")
            ax.set(xscale="log")
            dress(ax, f"s = {s:g} (dotted: s L0)", "fine-tuning step (0 drawn at 1)", "effective window (tokens)",
                  legend="inside")
        title = f"RoPE base {b:g}: the effective context window against fine-tuning steps"
        fig.suptitle(title)
        plots.save(fig, f"window_b{b:g}.png", title)
    return plots
