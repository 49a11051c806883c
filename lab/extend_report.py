"""Figures over seeds, the papers' claims with their verdicts, tables and plots of the context-extension lab
(lab/extend.py). Statistics are lab/stats.py's, output formats lab/report.py's; this module knows nothing of
training."""

import statistics

from lab.report import Plots, dress, md_regime, md_table, pm, regime_rows
from lab.retrieval import THRESHOLDS, distance_plots
from lab.stats import mean_std, verdicts

PLATEAU = "plateau"  # the step key of each run's own plateau
# nats: a "same" claim's margin, the largest change of loss at the original window the PI paper reports: Table 2,
# Proof-pile, 7B extended to 32,768, perplexity 2.77 -> 2.82 at 2,048 tokens (ln 2.82/2.77 = 0.018)
SAME_MARGIN = 0.02


def key(b, method, s):
    return f"rope-b{b:g}-{method}-x{s:g}"


def lab_results(lab, done, sweeps, rates):
    """results.json's figures and claims; done maps each job (lab/extend.py's) to that run's figures."""
    L0, sel = lab.L0, lab.settings.selection_seed
    base = {f"rope-b{b:g}": {str(seed): done["base", b, seed] for seed in [sel, *lab.seeds]} for b in lab.bases}
    finetune = {}
    for b in lab.bases:
        for s in lab.factors:
            for m in lab.methods:
                arm, at = (b, m, s), str(round(s * L0))
                runs = {str(seed): done["finetune", *arm, seed, rates[arm]] for seed in lab.seeds}
                sweep = {f"{lr:g}": value(done["finetune", *arm, sel, lr], PLATEAU, "loss", at) for lr in sweeps[arm]}
                finetune[key(*arm)] = {"base": b, "method": m, "factor": s, "lr": rates[arm], "sweep": sweep,
                                       "runs": runs, "by_step": by_step(runs, lab.scored, s, L0)}
    results = {"block_size": L0, "seeds": lab.seeds, "selection_seed": sel, "bases": lab.bases, "factors": lab.factors,
               "methods": lab.methods, "scored": lab.scored, "early_step": lab.settings.early_step,
               "thresholds": THRESHOLDS, "chance": lab.probe.chance,
               "false_pass": {name: lab.probe.false_pass(th) for name, th in THRESHOLDS.items()},
               "elimination": lab.probe.elimination, "base_gate": lab.settings.base_gate,
               "regime": regime_rows([(f"this config (base {b:g})", lab.gcfg.head_dim, b, L0) for b in lab.bases]),
               "base": base, "finetune": finetune, "train_s": sum(r["train_s"] for r in done.values())}
    results["claims"] = verdicts(claims(results))
    return results


def value(run, step, what, name):
    """A run's figure at a fine-tuning step (PLATEAU: its own plateau; a step past it: the plateau's, where it had
    levelled off): its loss at a length ("loss", "128"), or its k_max at a threshold ("kmax", "pi") in windows of
    the target s L0, or past it in windows of 2s L0 ("kmax_past", at the plateau)."""
    step = run["plateau"] if step == PLATEAU or int(step) > run["plateau"] else int(step)
    scores = run["scores"][str(step)]
    if what == "loss":
        return scores["loss"][name]
    return scores["retrieval"]["past" if what == "kmax_past" else "target"]["kmax"][name]


def by_step(runs, scored, s, L0):
    """{step: {"loss": {L: mean_std}, "kmax": {threshold: mean_std}}} over the seeds at each scored step and the
    plateau (a seed that levelled off before a step counts with its plateau's figures); the plateau's also
    "kmax_past", in windows of 2s L0."""
    lengths = [str(L) for L in (L0, round(s * L0), round(2 * s * L0))]

    def over_seeds(step, what):
        return {n: mean_std(value(r, step, what, n) for r in runs.values()) for n in THRESHOLDS}
    out = {str(st): {"loss": {L: mean_std(value(r, st, "loss", L) for r in runs.values()) for L in lengths},
                     "kmax": over_seeds(st, "kmax")} for st in [*scored, PLATEAU]}
    out[PLATEAU]["kmax_past"] = over_seeds(PLATEAU, "kmax_past")
    return out


# ----------------------------------------------------------------------------- the papers' claims at this scale

def claims(r):
    """The papers' claims for every base and factor, each as per-seed differences A - B with the side expected;
    stats.verdicts judges them together. A claim whose methods the lab did not run is left out."""
    L0, early, out = r["block_size"], str(r["early_step"]), []

    def values(b, m, s, step, what, name):
        arm = r["finetune"].get(key(b, m, s))
        return None if arm is None else [value(run, step, what, name) for run in arm["runs"].values()]

    def claim(text, a, b, expect, margin=None):
        if a is not None and b is not None:
            out.append({"claim": text, "diffs": [x - y for x, y in zip(a, b)], "expect": expect, "margin": margin})

    for b in r["bases"]:
        for s in r["factors"]:
            near, far, at = str(round(s * L0)), str(round(2 * s * L0)), f"(base {b:g}, s = {s:g})"

            def loss(m, step, L=near):
                return values(b, m, s, step, "loss", L)

            def k(m, step):
                return values(b, m, s, step, "kmax", "pi")
            for m, name in (("ntk", "NTK"), ("yarn", "YaRN")):
                claim(f"(a) without fine-tuning, {name} has a lower loss than PI at {near} tokens {at}",
                      loss(m, "0"), loss("linear", "0"), "lower")
            claim(f"(b) at the plateau, PI has a lower loss than direct fine-tuning at {near} tokens {at}",
                  loss("linear", PLATEAU), loss("none", PLATEAU), "lower")
            claim(f"(c) after {early} steps, YaRN has a lower loss than PI at {near} tokens {at}",
                  loss("yarn", early), loss("linear", early), "lower")
            claim(f"(d) at the plateau, YaRN has a lower loss than PI at {far} tokens, past the fine-tuned length {at}",
                  loss("yarn", PLATEAU, far), loss("linear", PLATEAU, far), "lower")
            # direct fine-tuning is the control: at this scale more steps on the same text still lower the loss at L0
            claim(f"(e) at the plateau, PI's loss at L0 = {L0} is within {SAME_MARGIN} nats of direct fine-tuning's {at}",
                  loss("linear", PLATEAU, str(L0)), loss("none", PLATEAU, str(L0)), "same", SAME_MARGIN)
            for step, when in ((early, f"after {early} steps"), (PLATEAU, "at the plateau")):
                claim(f"({'f' if step == early else 'g'}) {when}, PI's k_max at 20% is longer than direct "
                      f"fine-tuning's {at}", k("linear", step), k("none", step), "higher")
            claim(f"(h) at the plateau, YaRN's k_max at 20% in {far}-token windows, past the fine-tuned length, is longer "
                  f"than PI's {at}", values(b, "yarn", s, PLATEAU, "kmax_past", "pi"),
                  values(b, "linear", s, PLATEAU, "kmax_past", "pi"), "higher")
            for m, how in (("pose", "at PI's steps and rows"), ("pose-tokens", "at PI's tokens")):
                claim(f"(i) at the plateau, PoSE {how} has a loss at {near} tokens within {SAME_MARGIN} nats of PI's "
                      f"{at}", loss(m, PLATEAU), loss("linear", PLATEAU), "same", SAME_MARGIN)
    return out


# ----------------------------------------------------------------------------- results.md

def markdown(r, plots):
    L0, ex = r["block_size"], r["settings"]["extend"]
    parts = [f"# Context extension\n\nRoPE trained at L0 = {L0} tokens; test seeds {', '.join(map(str, r['seeds']))}, "
             f"fixed before the run; rates chosen on seed {r['selection_seed']}, in no test. Mean ± std over the test "
             f"seeds. Compute: {r['train_s'] / 60:.1f} min of training summed over the runs ({ex['workers']} at a "
             f"time), evaluation besides; this command's wall time {r['wall_s'] / 60:.1f} min (runs finished earlier "
             f"are reused). Device {r['device']} ({r['settings']['train']['dtype']}), torch "
             f"{r['environment']['torch']}, code {r['environment']['code_version']}.",
             md_regime(r["regime"]), md_probe(r), md_base(r), md_rates(r), md_plateaus(r, ex), md_kmax(r), md_loss(r),
             md_claims(r["claims"]), plots.section()]
    return "\n\n".join(parts) + "\n"


def md_probe(r):
    return (f"## The probe\n\nWhole answers (both capitals of the asked needle's answer, the argmax given the tokens "
            f"before) to one query at the end of a window, its needle k tokens before it, among "
            f"{round(1 / r['chance'])} needles: a model that copies some needle without reading the key scores "
            f"{r['chance']:.0%} (chance). k_max is the PI paper's effective window (section 3.3): the "
            f"largest k such that every probed distance up to k is answered in at least 20% of trials, and beside it "
            f"our stricter 90%. With {r['settings']['extend']['probe_trials']} trials a distance, a model at chance "
            f"passes 20% at one distance with probability {r['false_pass']['pi']:.1%}.")


def md_base(r):
    L0, gate, rows = r["block_size"], r["base_gate"], []
    for name, seeds in r["base"].items():
        for seed, run in seeds.items():
            for st, c in run["curve"].items():
                rows.append([name, seed + (" (selection)" if int(seed) == r["selection_seed"] else ""), st,
                             pct(min(c["slot"].values())), pct(max(c["slot"].values())), c["kmax"]["pi"],
                             c["kmax"]["strict"], f"{c['loss']:.3f}"])
    elim = ", ".join(f"{pct(v)}" for v in r["elimination"].values())
    return (f"## Retrieval is learned first: the base models at L0\n\nEach base model trains until every query slot "
            f"retrieves {gate:.0%} of whole answers at L0 = {L0} (probed after each stage). The slot probe queries every "
            f"needle once in a random order, earlier answers shown: elimination would score {elim} at slots 1 to "
            f"{len(r['elimination'])}, a model that reads the key the same at every slot.\n\n"
            + md_table(["model", "seed", "step", "worst slot", "best slot", "k_max 20%", "k_max 90%", "val loss at L0"],
                       rows, text_columns=2))


def md_rates(r):
    rows = [[f"{x['base']:g}", f"{x['factor']:g}", x["method"],
             ", ".join(f"{lr}: {loss:.4f}" for lr, loss in x["sweep"].items()), f"{x['lr']:g}"]
            for x in r["finetune"].values()]
    return (f"## Fine-tuning rates, chosen on seed {r['selection_seed']}\n\nLoss at s L0 at the plateau of the selection "
            f"seed's fine-tune at each rate (the sweep widened where its best lay at an edge); the lowest sets every "
            f"test seed's rate.\n\n" + md_table(["base", "s", "method", "rate: loss at s L0", "chosen"], rows,
                                                 text_columns=4))


def md_plateaus(r, ex):
    rows = []
    for k, x in r["finetune"].items():
        runs = x["runs"].values()
        memory = r["memory"][f"{x['method']} x{x['factor']:g}"]
        rows.append([f"{x['factor']:g}", x["method"], pm(mean_std(run["plateau"] for run in runs), ".0f"),
                     f"{sum(run['tokens'] for run in runs) / len(runs):,.0f}",
                     pm(mean_std(run["train_s"] for run in runs), ".0f"), f"{memory / 2 ** 20:.1f}"])
    return (f"## Fine-tuning to the plateau\n\nA fine-tune stops when its loss at L0 fell by less than "
            f"{ex['plateau_tol']} nats over the last {ex['plateau_span']} steps (measured every {ex['finetune_eval']}), "
            f"{ex['finetune_max']} steps at the most (the PI paper's 1,000); the rate warms up over "
            f"{ex['finetune_warmup']} steps and stays constant (the PI paper states a 20-step warmup and no schedule "
            f"after it). Memory: the bytes autograd saves for backward in one micro-batch of the run's shape.\n\n"
            + md_table(["s", "method", "plateau step", "tokens", "training seconds", "activation MiB"], rows,
                       text_columns=2))


def md_kmax(r):
    steps = [*map(str, r["scored"]), PLATEAU]

    def cell(k):
        return f"{pm(k['pi'], '.0f')} / {pm(k['strict'], '.0f')}"
    rows = [[f"{x['factor']:g}", x["method"], round(x["factor"] * r["block_size"]),
             *(cell(x["by_step"][st]["kmax"]) for st in steps), cell(x["by_step"][PLATEAU]["kmax_past"])]
            for x in r["finetune"].values()]
    return ("## The effective window k_max against fine-tuning steps\n\nk_max at 20% (PI's) / at 90% (ours), in "
            "tokens, in windows of the target s L0 (as the PI paper spreads its distances over the target window), "
            "mean ± std over the test seeds (a seed past its plateau counts with its plateau's figures); last, at the "
            "plateau in windows of 2s L0, past the fine-tuned length.\n\n"
            + md_table(["s", "method", "s L0", *(f"step {st}" for st in steps), "plateau, 2s L0 windows"], rows,
                       text_columns=2))


def md_loss(r):
    steps = [*map(str, r["scored"]), PLATEAU]
    rows = [[f"{x['factor']:g}", x["method"], L, *(pm(x["by_step"][st]["loss"][L], ".3f") for st in steps)]
            for x in r["finetune"].values() for L in x["by_step"][PLATEAU]["loss"]]
    return ("## Fine-tuning: val loss against steps at L0, s L0 and 2s L0\n\n"
            + md_table(["s", "method", "length", *(f"step {st}" for st in steps)], rows, text_columns=3))


def pct(x):
    return f"{100 * x:.0f}%"


def md_claims(claims):
    rows = []
    for c in claims:
        t, same = c["test"], c["expect"] == "same"
        ci = "—" if t["ci"] is None else f"[{t['ci'][0]:+.3f}, {t['ci'][1]:+.3f}]"
        test, p, holm = ((f"TOST ±{c['margin']:g}", c["equivalence_p"], c["equivalence_p_holm"]) if same
                         else (t["test"] or "—", t["p"], c["p_holm"]))
        settled = "none" if c["detectable"] is None else f"{c['detectable']:.3g}"
        rows.append([c["claim"], f"{t['mean']:+.3f}", ci, test, "—" if p is None else f"{p:.2g}",
                     "—" if holm is None else f"{holm:.2g}", f"**{c['verdict']}**", len(c["diffs"]), settled])
    family = claims[0]["family"] if claims else 0
    return ("## The papers' claims at this scale\n\nEach claim as per-seed differences A − B (loss in nats, k_max in "
            "tokens): their mean, the 95% CI (unadjusted), the test (the paired t-test; the exact sign test where every "
            "seed gives the same difference, where t is undefined; for a \"same\" claim its equivalence test) and its "
            f"p, and p Holm-adjusted over one family of {family} tests: each directional claim's difference test and each \"same\" claim's equivalence test "
            f"(TOST: two one-sided tests within ±{SAME_MARGIN} nats). \"holds\" needs p (Holm) < 0.05 "
            "on the expected side, \"does not hold\" on the other; a \"same\" claim holds when equivalence is shown, "
            "else it is inconclusive. The last column is the smallest mean difference these seeds could settle given "
            "the spread seen (none: an exact test on this many seeds cannot reach Holm's first threshold).\n\n"
            + md_table(["claim", "mean A − B", "95% CI (unadjusted)", "test", "p", "p (Holm)", "verdict", "seeds",
                        "smallest settled"], rows, text_columns=1))


# ----------------------------------------------------------------------------- plots

def write_plots(r, out):
    """The PNG plots in out (report.Plots: none without matplotlib): k_max and the L0 loss against fine-tuning
    steps, retrieval by distance at each plateau, and the base models' learning curve."""
    plots = Plots(out)
    if (plt := plots.plt) is None:
        return plots
    L0, steps = r["block_size"], [*map(str, r["scored"]), PLATEAU]
    for b in r["bases"]:
        arms = [x for x in r["finetune"].values() if x["base"] == b]
        color = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(x["method"] for x in arms))}  # a method's, everywhere
        fig, axes = plt.subplots(2, len(r["factors"]), figsize=(6 * len(r["factors"]), 7), squeeze=False)
        for col, s in enumerate(r["factors"]):
            for x in (x for x in arms if x["factor"] == s):
                plateau = statistics.mean(run["plateau"] for run in x["runs"].values())  # drawn at the seeds' mean
                xs = [max(int(st), 1) for st in steps[:-1]] + [plateau]
                for name, style in (("pi", "o-"), ("strict", "x--")):
                    ys = [x["by_step"][st]["kmax"][name]["mean"] for st in steps]
                    axes[0, col].plot(xs, ys, style, color=color[x["method"]],
                                      label=f"{x['method']} ({THRESHOLDS[name]:.0%})")
                for seed, run in x["runs"].items():
                    curve = sorted((int(st), v) for st, v in run["l0_curve"].items())
                    axes[1, col].plot([max(st, 1) for st, _ in curve], [v for _, v in curve], lw=0.8,
                                      color=color[x["method"]], label=x["method"] if seed == next(iter(x["runs"])) else None)
            axes[0, col].axhline(s * L0, color="gray", linestyle=":")
            axes[0, col].set(xscale="log")
            axes[1, col].set(xscale="log")
            dress(axes[0, col], f"s = {s:g} (dotted: s L0; last point: the plateau)", "fine-tuning step (0 drawn at 1)",
                  "k_max (tokens)", legend="inside")
            dress(axes[1, col], f"s = {s:g}: loss at L0 = {L0} while fine-tuning (each seed)", "fine-tuning step",
                  "val loss at L0", legend="inside")
        title = f"RoPE base {b:g}: k_max (20%, 90%) and the L0 loss while fine-tuning"
        fig.suptitle(title)
        plots.save(fig, f"window_b{b:g}.png", title)
        panels = [(f"{x['method']} x{x['factor']:g}, plateau",
                   {str(round(m * x["factor"] * L0)): mean_distance([run["scores"][str(run["plateau"])] for run in
                                                                     x["runs"].values()], where)
                    for m, where in ((1, "target"), (2, "past"))}) for x in arms]
        distance_plots(plots, panels, L0, r["chance"], f"retrieval_b{b:g}.png",
                       f"RoPE base {b:g}: whole answers by distance at each fine-tune's plateau (mean over seeds)")
        curve = [(f"seed {seed}, step {st}", {str(L0): c["distance"]}) for seed, run in r["base"][f"rope-b{b:g}"].items()
                 for st, c in run["curve"].items()]
        distance_plots(plots, curve, L0, r["chance"], f"learning_b{b:g}.png",
                       f"RoPE base {b:g}: whole answers by distance at L0 during pre-training")
    return plots


def mean_distance(scores, where):
    """The mean over seeds of their retrieval by distance in windows of the target ("target") or past it ("past")."""
    by_k = [s["retrieval"][where]["distance"] for s in scores]
    return {k: sum(d[k] for d in by_k) / len(by_k) for k in by_k[0]}
