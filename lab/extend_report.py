"""Figures over seeds, tables, claims and plots of the context-extension lab (lab/extend.py): what its runs mean and
how they are shown. Statistics are lab/stats.py's, output formats lab/report.py's; this module knows nothing of
training."""

from lab.report import Plots, dress, md_table, pm
from lab.stats import mean_std


def key(scaling, s):
    return f"{scaling}-x{s:g}"


def lab_figures(lab, done):
    """{"base": {scheme: figures}, "finetune": {scaling-xs: figures}}: each figure a report.mean_std over the seeds
    (None where the scheme cannot reach that length); done maps (kind, name, s, seed) to that run's figures."""
    def across(runs, get):
        values = [get(r) for r in runs]
        return None if None in values else mean_std(values)

    def probe(runs, get):  # {"key": mean_std, "token": mean_std}, or None past a scheme's reach
        first = get(runs[0])
        return None if first is None else {m: across(runs, lambda r: get(r)[m]) for m in first}

    base = {}
    for scheme in lab.schemes:
        runs = [done["base", scheme, None, seed] for seed in lab.seeds]
        base[scheme] = {"final_val_loss": across(runs, lambda r: r["final_val_loss"]),
                        "passkey": {sc: {W: probe(runs, lambda r: r["passkey"][sc][W]) for W in by_w}
                                    for sc, by_w in runs[0]["passkey"].items()}}
    finetune = {}
    for s in lab.factors:
        for scaling in lab.scalings:
            runs = [done["finetune", scaling, s, seed] for seed in lab.seeds]
            finetune[key(scaling, s)] = {
                "scaling": scaling, "factor": s,
                "loss": {step: {L: across(runs, lambda r: r["loss"][step][L]) for L in by_len}
                         for step, by_len in runs[0]["loss"].items()},
                "passkey": {W: probe(runs, lambda r: r["passkey"][W]) for W in runs[0]["passkey"]}}
    return {"base": base, "finetune": finetune}


# ----------------------------------------------------------------------------- the papers' claims at this scale

def claims(r, s):
    """[(claim, verdict, the numbers)] for extension factor s, from the means over seeds; a claim whose scalings
    the lab did not run is left out."""
    L0, last = str(r["block_size"]), str(r["steps"][-1])
    near, far = str(round(s * r["block_size"])), str(round(2 * s * r["block_size"]))

    def loss(scaling, step, L):
        run = r["finetune"].get(key(scaling, s))
        return run and run["loss"][step][L]["mean"]

    out = []

    def claim(text, a, b, holds, numbers=None):
        if a is not None and b is not None:
            out.append((text, "holds" if holds(a, b) else "does not hold", numbers or f"{a:.3f} vs {b:.3f}"))

    for other in ("ntk", "yarn"):
        for L in (near, far):
            claim(f"(a) without fine-tuning, {other} beats PI at {L} tokens", loss(other, "0", L),
                  loss("linear", "0", L), lambda a, b: a < b)
    claim(f"(b) after {last} steps at {near} tokens, PI beats direct fine-tuning", loss("linear", last, near),
          loss("none", last, near), lambda a, b: a < b)
    pi = loss("linear", last, near)
    if pi is not None and loss("yarn", last, near) is not None:
        reached = next((st for st in r["steps"] if loss("yarn", str(st), near) <= pi), None)
        out.append((f"(c) YaRN reaches PI's loss after {last} steps ({pi:.3f} at {near} tokens) in fewer steps",
                    "holds" if reached is not None and reached < int(last) else "does not hold",
                    "YaRN never reaches it" if reached is None else f"YaRN reaches it at step {reached}"))
    claim(f"(d) fine-tuned at {near}, YaRN holds at {far} tokens better than PI", loss("yarn", last, far),
          loss("linear", last, far), lambda a, b: a < b)
    # against direct fine-tuning for the same steps: the base model itself is still improving, so training on
    # would lower its loss at L0 whatever the scaling
    a, b = loss("linear", last, L0), loss("none", last, L0)
    if a is not None and b is not None:
        claim(f"(e) PI costs a small regression at L0 = {L0} tokens (against direct fine-tuning, {last} steps each)",
              a, b, lambda a, b: 0 < a - b < 0.05, f"{a:.3f} vs {b:.3f}, {a - b:+.3f} (the base model: "
                                                    f"{loss('none', '0', L0):.3f})")
    return out


# ----------------------------------------------------------------------------- results.md

def markdown(r, plots):
    L0 = r["block_size"]
    parts = [f"# Context extension\n\nTrained at L0 = {L0} tokens, seeds {', '.join(map(str, r['seeds']))}; "
             f"mean ± std over seeds. Wall time {r['wall_s'] / 60:.1f} min on {r['device']} "
             f"({r['settings']['train']['dtype']})."]
    parts.append("## Base models\n\n" + md_table(
        ["scheme", "val loss at L0"], [[name, pm(b["final_val_loss"])] for name, b in r["base"].items()]))
    for s in r["factors"]:
        lengths = [str(L0), str(round(s * L0)), str(round(2 * s * L0))]
        for L in lengths:
            rows = [[x["scaling"], *(pm(x["loss"][step][L], ".3f") for step in x["loss"])]
                    for x in r["finetune"].values() if x["factor"] == s]
            parts.append(f"## Fine-tuning at {round(s * L0)} tokens (s = {s:g}): val loss at {L} tokens\n\n"
                         + md_table(["scaling", *(f"step {st}" for st in r["steps"])], rows))
        parts.append(f"## The papers' claims at this scale (s = {s:g})\n\n"
                     + md_table(["claim", "verdict", "numbers"], claims(r, s), text_columns=3))
    widths = list(r["probe_windows"])
    rows = [[name, sc, "—", *(pct(b["passkey"][sc].get(str(W))) if str(W) in b["passkey"][sc] else "—" for W in widths)]
            for name, b in r["base"].items() for sc in b["passkey"]]
    rows += [["rope", x["scaling"], f"x{x['factor']:g}", *(pct(x["passkey"][str(W)]) for W in widths)]
             for x in r["finetune"].values()]
    parts.append(f"## Passkey retrieval against window length (key at the start, question at the end; "
                 f"{', '.join(f'{n}' for n in r['probe_windows'].values())} windows): whole keys / key tokens "
                 f"retrieved (chance: 0% / 4%)\n\n"
                 + md_table(["scheme", "scaling", "fine-tuned", *(f"{W} ({int(W) / L0:g}x)" for W in widths)], rows,
                            text_columns=3))
    parts.append(plots.section())
    return "\n\n".join(parts) + "\n"


def pct(stat):
    """'key% ± std / token% ± std' of a probe's figures; N/A past the scheme's reach."""
    if stat is None:
        return "N/A"
    return " / ".join(f"{100 * x['mean']:.0f}" + ("" if x["std"] is None else f" ± {100 * x['std']:.0f}") + "%"
                      for x in (stat["key"], stat["token"]))


# ----------------------------------------------------------------------------- plots

def write_plots(r, out):
    """The PNG plots in out (report.Plots: none without matplotlib)."""
    plots = Plots(out)
    if (plt := plots.plt) is None:
        return plots
    L0 = r["block_size"]

    def save(fig, file, title):
        fig.suptitle(title)
        plots.save(fig, file, title)

    for s in r["factors"]:
        lengths = [str(L0), str(round(s * L0)), str(round(2 * s * L0))]
        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        for ax, L in zip(axes, lengths):
            for x in (x for x in r["finetune"].values() if x["factor"] == s):
                steps = [int(st) for st in x["loss"]]
                mean = [x["loss"][st][L]["mean"] for st in x["loss"]]
                std = [x["loss"][st][L]["std"] or 0.0 for st in x["loss"]]
                ax.errorbar([max(st, 1) for st in steps], mean, yerr=std, marker="o", markersize=3, capsize=2,
                            label=x["scaling"])
            ax.set(xscale="log", title=f"val loss at {L} tokens ({int(L) / L0:g}x L0)", xlabel="fine-tuning step "
                   "(step 0 drawn at 1)", ylabel="val loss")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize="small")
        save(fig, f"finetune_x{s:g}.png", f"Fine-tuning at {round(s * L0)} tokens (s = {s:g}), mean ± std over seeds")

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    widths = [int(W) for W in r["probe_windows"]]
    for ax, metric in zip(axes, ("key", "token")):
        def line(by_w, label, style):
            pts = [(W, by_w[str(W)][metric]) for W in widths if by_w.get(str(W)) is not None]
            if pts:
                ax.errorbar([W for W, _ in pts], [100 * v["mean"] for _, v in pts],
                            yerr=[100 * (v["std"] or 0.0) for _, v in pts], linestyle=style, marker="o",
                            markersize=3, capsize=2, label=label)

        for name, b in r["base"].items():
            for sc, by_w in b["passkey"].items():
                line(by_w, name if sc == "none" else f"{name} + {sc}", "-" if sc == "none" else ":")
        for x in r["finetune"].values():
            line(x["passkey"], f"rope fine-tuned x{x['factor']:g} {x['scaling']}", "--")
        ax.axvline(L0, color="grey", linewidth=0.8)
        ax.set(xscale="log", ylim=(-5, 105), xlabel="window length (key at the start, question at the end)",
               ylabel=f"{'whole keys' if metric == 'key' else 'key tokens'} retrieved (%)")
        ax.set_xticks(widths, [str(W) for W in widths])
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, "passkey.png", "Passkey retrieval against distance, mean ± std over seeds")
    return plots

