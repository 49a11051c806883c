"""The ablation's figures over seeds, its tables and plots: what lab/ablate.py's runs mean and how they are shown.

It knows nothing of training or of how the grid ran; ablate.py hands it the runs' summaries and evaluations.
Statistics are lab/stats.py's, the output formats lab/report.py's.
"""

import csv
import functools
import io
import itertools
import math
import statistics

import numpy as np

from files import atomic_write
from lab.report import Plots, dress, md_regime, md_table, palette, pm
from lab.retrieval import BANDS, THRESHOLDS, above_floor, distance_plots, interval, readout, shares
from lab.stats import ALPHA, equivalence_can_pass, equivalence_spread, holm, mean_std, sign_p, smallest_effect, verdicts
from scalings import (
    NO_SCALING as AS_TRAINED,  # the loss tables' key of a model scored as it was trained
    YARN,
)

# ----------------------------------------------------------------------------- figures over seeds


def scheme_figures(runs, evals, L0, gate, per, reference):
    """One scheme's figures over its seeds at one learning rate: runs and evals are its runs' summaries and
    evaluations, seed by seed (the first seed's also hold its attention statistics and score biases). Each seed's
    own figures under "per_seed" (seed_figures); over the seeds, steps-to-learn with the share that learned by the
    ceiling, and the retrieval readout's mean ± std (the effective length at reference, the same for every
    scheme)."""
    curves = np.array([[loss for _, loss in r["val_curve"]] for r in runs])  # (seeds, evaluations)
    per_seed = [seed_figures(r, e, L0, gate, per, reference) for r, e in zip(runs, evals, strict=True)]
    threads = sorted({r.get("threads") for r in runs}, key=str)
    return {
        "seeds": [r["seed"] for r in runs],
        "threads": threads,
        **{key: mean_std(r[key] for r in runs) for key in ("final_val_loss", "val_bpb", "tokens_per_s")},
        "train_s": sum(r["train_s"] for r in runs),
        "eval_s": sum(e["eval_s"] for e in evals),
        "val_curve": {
            "iters": [it for it, _ in runs[0]["val_curve"]],
            "mean": curves.mean(0).tolist(),
            "min": curves.min(0).tolist(),
            "max": curves.max(0).tolist(),
        },
        "loss_by_length": {
            sc: {L: None if by_len[L] is None else mean_std(e["loss"][sc][L] for e in evals) for L in by_len}
            for sc, by_len in evals[0]["loss"].items()
        },
        "loss_by_position": {
            sc: np.mean([e["position"][sc] for e in evals], axis=0).tolist() for sc in evals[0]["position"]
        },
        "learning": learning_share(per_seed) if per_seed[0]["learning"] else None,
        "retrieval": retrieval_summary(per_seed, L0) if per_seed[0]["windows"] else None,
        "per_seed": per_seed,
        "attention": evals[0].get("attention"),
        "biases": evals[0].get("biases"),
    }


def seed_figures(run, scores, L0, gate, per, reference):
    """One seed's figures: its loss; its slot curve and steps-to-learn (None without the recall task); and in each
    probed window length its cells (trials and hits by cell of distances: every interval and band can
    be recomputed from them), its bands, k_max at each threshold with `per` distances pooled, and its effective
    length at reference (None past the scheme's reach)."""
    slots = run.get("slots") or {}
    windows, deployed = scores.get("retrieval") or {}, scores.get("retrieval_deployed")
    longest = max(map(int, windows), default=0)
    s = longest / (2 * L0)  # the bands inside L0, L0 to s L0 and s L0 to 2s L0 = the longest window

    def read(counts):
        return {**counts, **readout(counts["cells"], L0, s, reference, per)}

    return {
        "seed": run["seed"],
        "final_val_loss": run["final_val_loss"],
        "slots": slots,
        "learning": steps_to_learn(slots, gate) if slots else None,
        "windows": {W: None if c is None else read(c) for W, c in windows.items()},
        # RoPE's windows past L0 under the deployed scaling, read zero-shot: the comparator that answers there
        "deployed": None if deployed is None else {W: read(c) for W, c in deployed.items()},
    }


def steps_to_learn(slots, gate):
    """{"step", "learned"}: the first evaluation step whose slot probe has every query slot at gate or above, or
    the last evaluation (the ceiling, max_iters) with learned False where none has: censored there."""
    steps = sorted(slots, key=int)
    first = next((st for st in steps if min(slots[st].values()) >= gate), None)
    return {"step": int(first or steps[-1]), "learned": first is not None}


def learning_share(per_seed):
    """Steps-to-learn over the seeds: each seed's, and the share that learned by the ceiling with its 95%
    (Clopper-Pearson) interval."""
    learned = sum(f["learning"]["learned"] for f in per_seed)
    return {
        "steps": [f["learning"]["step"] for f in per_seed],
        "learned": [f["learning"]["learned"] for f in per_seed],
        "share": learned / len(per_seed),
        "ci": list(interval(learned, len(per_seed))),
    }


def retrieval_summary(per_seed, L0):
    """Over the seeds, mean ± std: the worst query slot at the last evaluation; inside L0 from the L0 windows (the
    most trials there), the bands past L0, k_max and the effective length from the longest window the scheme
    reaches; and the mean whole answers by distance of each window length (the plots')."""
    windows = per_seed[0]["windows"]
    longest = max((W for W, w in windows.items() if w is not None), key=int)
    at_L0 = str(L0) if windows.get(str(L0)) else longest

    def over(pick):  # None where some seed lacks the figure (no cell in a band)
        values = [pick(f) for f in per_seed]
        return None if None in values else mean_std(values)

    def accuracy(f, W, name):
        b = f["windows"][W]["bands"][name]
        return None if b is None else b["accuracy"]

    def length(f):
        e = f["windows"][longest]["effective_length"]
        return None if e is None else e["length"]

    figures = {
        "longest": longest,
        "worst_slot": over(lambda f: min(f["slots"][max(f["slots"], key=int)].values())),
        "bands": {"inside L0": over(lambda f: accuracy(f, at_L0, "inside L0"))}
        | {b: over(lambda f, b=b: accuracy(f, longest, b)) for b in BEYOND},
        "reach": {n: over(lambda f, n=n: f["windows"][longest]["reach"][n]) for n in THRESHOLDS},
        "effective_length": over(length),
    }
    # each window's shares over the seeds, their hits pooled (every seed has the same trials in a cell)
    grid = {W: None if w is None else shares([f["windows"][W]["cells"] for f in per_seed]) for W, w in windows.items()}
    return figures | {"grid": grid}


BEYOND = BANDS[1:]  # the bands past L0 (retrieval.bands)


def reference_text(reference):
    return (
        "none (no probe)"
        if reference is None
        else f"the learning gate's share of whole answers ({reference:.0%}), fixed in the config before the run"
    )


def own(x):
    """A scheme's figures at its own rate: the tuned ranking where a sweep chose rates, else the shared one (the
    same runs, kept once in results.json)."""
    return x.get("tuned", x["shared"])


def own_words(r):
    """What own() reads, for the tables' captions: each scheme's own rate only where a sweep chose rates."""
    return (
        "each scheme at its own rate"
        if any("tuned" in x for x in r["schemes"].values())
        else "every scheme at the shared rate"
    )


# The ablation's four claims, each made for every scheme against the reference: its final val loss at L0 is lower
# (verdicts_against), its val loss past L0 is lower than the reference's as deployed there (loss_past_against: RoPE
# under YaRN where YaRN was scored), which of the two learns retrieval first (learning_order), and, on the seeds where
# both learned it, which retrieves more past L0 (retrieval_against). A claim's id names the scheme and the reference,
# e.g. "alibi-loss-vs-rope"; results.json, results.md, tests and the guide name it by that id.
LOSS_CLAIM = "{scheme}-loss-vs-{reference}"
LOSS_PAST_CLAIM = "{scheme}-loss-past-L0-vs-{reference}"
ORDER_CLAIM = "{scheme}-learns-first-vs-{reference}"
PAST_CLAIM = "{scheme}-retrieves-past-L0-vs-{reference}"
DEPLOYED = YARN  # the scaling RoPE is read under past L0 where it was scored: the one deployed models use


def final_loss(figures):
    """{seed: final val loss at L0} of a scheme's figures in one ranking."""
    return dict(zip(figures["seeds"], figures["final_val_loss"]["values"], strict=True))


def scored_past(figures, L0, scaling=AS_TRAINED):
    """The lengths past L0 at which a scheme's figures hold a loss under scaling (default as trained)."""
    by_length = figures["loss_by_length"].get(scaling) or {}
    return [L for L, v in by_length.items() if int(L) > L0 and v is not None]


def loss_past(figures, lengths, scaling=AS_TRAINED):
    """{seed: val loss averaged over lengths} under scaling (default as trained), or {} where one of them has no
    score (learned positions end at L0, or that scaling was not scored): both arms of a claim average the same ones."""
    by_length = figures["loss_by_length"].get(scaling) or {}
    if not lengths or any(by_length.get(L) is None for L in lengths):
        return {}
    return {
        seed: statistics.fmean(by_length[L]["values"][i] for L in lengths) for i, seed in enumerate(figures["seeds"])
    }


def verdicts_against(
    schemes, reference, ranking, margin, values=final_loss, deployed=None, claim=LOSS_CLAIM, scaling=AS_TRAINED
):
    """Each scheme's loss (values: {seed: loss} of its figures, default the final val loss at L0) minus the
    reference's (deployed: its values, default values), seed by seed over the seeds both ran, in one ranking (shared:
    every scheme at the shared rate; tuned: each at its best): stats.verdicts over the table, "lower" expected
    (negative is better than the reference). scaling: the one the reference is read under, named in the claim's id
    and its "against" (as trained: neither). A scheme without values (no loss past L0) makes no claim. An equivalence
    test within margin runs only where it can pass at these seeds and spread in the largest family the table could
    have (both tests of every scheme): elsewhere the difference's CI is shown against margin. Each claim carries
    "margin", "equivalence" (whether its test ran) and "detectable_80", the smallest difference its seeds detect with
    80% power in the family (stats)."""
    ref = schemes.get(reference)
    ref_loss = {} if ref is None else (deployed or values)(ref[ranking])
    if not ref_loss:
        return []
    claims = []
    for scheme, x in schemes.items():
        mine = values(x[ranking])
        if scheme != reference and mine:
            common = sorted(mine.keys() & ref_loss.keys())
            claims.append(
                {
                    "id": claim.format(
                        scheme=scheme, reference=reference if scaling == AS_TRAINED else f"{reference}-{scaling}"
                    ),
                    "scheme": scheme,
                    "against": reference if scaling == AS_TRAINED else f"{reference} under {scaling}",
                    "diffs": [mine[s] - ref_loss[s] for s in common],
                    "expect": "lower",
                }
            )
    for c in claims:
        if len(c["diffs"]) > 1 and equivalence_can_pass(
            len(c["diffs"]), statistics.stdev(c["diffs"]), margin, 2 * len(claims)
        ):
            c["margin"] = margin
    out = verdicts(claims)
    for c in out:
        n, sd = len(c["diffs"]), statistics.stdev(c["diffs"]) if len(c["diffs"]) > 1 else 0.0
        c |= {
            "equivalence": "margin" in c,
            "margin": margin,
            "detectable_80": smallest_effect(n, sd, c["family"]) if sd > 0 else None,
        }
    return out


def loss_past_against(schemes, reference, ranking, margin, L0):
    """verdicts_against on the val loss past L0, averaged over the lengths the reference was scored at there: each
    scheme as trained against the reference as deployed past L0, under DEPLOYED where that scaling was scored (else as
    trained), which the claim id names ("-vs-rope-yarn"). Its equivalence margin is the loss claims' at L0."""
    ref = schemes.get(reference)
    if ref is None:
        return []
    scaling = DEPLOYED if scored_past(ref[ranking], L0, DEPLOYED) else AS_TRAINED
    lengths = scored_past(ref[ranking], L0, scaling)
    return verdicts_against(
        schemes,
        reference,
        ranking,
        margin,
        values=functools.partial(loss_past, lengths=lengths),
        deployed=functools.partial(loss_past, lengths=lengths, scaling=scaling),
        claim=LOSS_PAST_CLAIM,
        scaling=scaling,
    )


def learning_order(schemes, reference, ranking, alpha=ALPHA):
    """Which learns retrieval first, each scheme or the reference, seed by seed over the seeds both ran: an exact
    sign test of the seeds on which each learned first. A seed where both learned at the same evaluation, or
    neither by the ceiling, is a tie and dropped; where one alone learned, it learned first (both are censored at
    the same ceiling). One Holm family over the table, of the tests that have an untied seed. Each claim: the counts
    ("earlier": the scheme first, "later", "ties"), "p", "p_holm", "family", "smallest_p" (2 * 0.5**untied, the
    least p the untied seeds can give), "can_settle" (whether that passes Holm's strictest step, alpha / family)
    and "verdict" ("earlier", "later", "inconclusive", or None where every seed tied: no test)."""
    ref = schemes.get(reference)
    if ref is None or ref[ranking]["learning"] is None:
        return []
    ref_first = first_learned(ref[ranking])
    claims = []
    for name, x in schemes.items():
        if name != reference:
            mine = first_learned(x[ranking])
            common = sorted(mine.keys() & ref_first.keys())
            signs = [(mine[s] > ref_first[s]) - (mine[s] < ref_first[s]) for s in common]  # +1: the reference first
            untied = sum(d != 0 for d in signs)
            claims.append(
                {
                    "id": ORDER_CLAIM.format(scheme=name, reference=reference),
                    "scheme": name,
                    "earlier": signs.count(-1),
                    "later": signs.count(1),
                    "ties": signs.count(0),
                    "p": sign_p(signs) if untied else None,
                    "smallest_p": 2 * 0.5**untied if untied else None,
                }
            )
    adjusted = holm([c["p"] for c in claims])
    family = sum(p is not None for p in adjusted)
    for c, p in zip(claims, adjusted, strict=True):
        side = "earlier" if c["earlier"] > c["later"] else "later"
        c |= {
            "p_holm": p,
            "family": family,
            "can_settle": c["p"] is not None and c["smallest_p"] < alpha / family,
            "verdict": None if p is None else side if p < alpha else "inconclusive",
        }
    return claims


def first_learned(figures):
    """{seed: the step it learned at, infinity where censored}: a seed that never learned comes after every one
    that did, and ties with another that never did."""
    learning = figures["learning"]
    return {
        seed: step if learned else math.inf
        for seed, step, learned in zip(figures["seeds"], learning["steps"], learning["learned"], strict=True)
    }


def retrieval_against(schemes, reference, ranking):
    """Each scheme's whole answers in the first band past L0 (L0 to s L0, its longest window) minus the reference's,
    seed by seed over the seeds on which both learned retrieval by the ceiling, the inclusion rule fixed before any
    run: a model that never learned the task has no retrieval to carry past L0, so its band would measure the task
    and not the scheme. Against the reference as trained, and where its deployed scaling was probed, under it
    (DEPLOYED, read zero-shot; the claim id names it, "-vs-rope-yarn"). Where the reference does not retrieve above
    the band's floor over those seeds (`above_floor`), the claim would set a scheme against one that reads no key:
    no test, as the extension lab's band claims. stats.verdicts over every claim, one family, "higher" expected (the
    scheme retrieves more); each claim carries "seeds", those compared, and "means", the two arms' mean accuracy
    over them; one with no test carries "untested", why."""
    ref = schemes.get(reference)
    if ref is None or ref[ranking]["learning"] is None or ref[ranking]["retrieval"] is None:
        return []
    comparators = [(reference, past_L0(ref[ranking]))]
    if any(f.get("deployed") for f in ref[ranking]["per_seed"]):  # probed under the deployed scaling
        comparators.append((f"{reference}-{DEPLOYED}", past_L0(ref[ranking], deployed=True)))
    claims = []
    for against, ref_past in comparators:
        for name, x in schemes.items():
            if name != reference and x[ranking]["retrieval"] is not None:
                mine = past_L0(x[ranking])
                common = sorted(mine.keys() & ref_past.keys())
                arms = [[arm[s] for s in common] for arm in (mine, ref_past)]
                if not common:
                    untested = why_untested(x[ranking])
                elif not above_floor(arms[1]):
                    untested = "the comparator at its floor"
                else:
                    untested = None
                claims.append(
                    {
                        "id": PAST_CLAIM.format(scheme=name, reference=against),
                        "scheme": name,
                        "against": against,
                        "seeds": common,
                        "means": [statistics.fmean(b["accuracy"] for b in bands) if common else None for bands in arms],
                        "diffs": [m["accuracy"] - r["accuracy"] for m, r in zip(*arms, strict=True)],
                        "expect": "higher",
                    }
                    | ({"verdict": None, "untested": untested} if untested else {})
                )
    tested = iter(verdicts([c for c in claims if "untested" not in c]))
    return [c if "untested" in c else next(tested) for c in claims]


def why_untested(figures):
    """Why a scheme's past-L0 claim has no seed to compare: no band past L0 (learned positions end at L0), or none
    of its seeds that have one learned where the reference did."""
    reaches = any(longest_window(f)["bands"][BEYOND[0]] is not None for f in figures["per_seed"])
    return "no seed where both learned" if reaches else "no window past L0"


def past_L0(figures, deployed=False):
    """{seed: its band from L0 to s L0 ({"hits", "trials", "accuracy", "floor", ...})} over the seeds that learned
    retrieval and have that band; where deployed, read under the deployed scaling ({} where it was not probed)."""
    out = {}
    for f in figures["per_seed"]:
        windows = f.get("deployed") if deployed else f["windows"]
        band = longest_window({"windows": windows})["bands"][BEYOND[0]] if windows else None
        if f["learning"]["learned"] and band is not None:
            out[f["seed"]] = band
    return out


def longest_window(f):
    """A seed's readout in its longest probed window that the scheme reaches (None marks one it cannot)."""
    return max(((int(W), w) for W, w in f["windows"].items() if w is not None))[1]


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
    w.writerow(
        [
            "scheme",
            "pos_emb",
            "lr_scale",
            "seed",
            "params",
            "final_val_loss",
            "val_bpb",
            "tokens_per_s",
            "train_s",
            "eval_s",
            *columns,
        ]
    )
    for (name, scale, seed), (r, e) in done.items():
        losses = {column(sc, L): v for sc, by_len in e["loss"].items() for L, v in by_len.items()}
        w.writerow(
            [
                name,
                plan.grid[name].pos_emb,
                scale,
                seed,
                plan.params[name],
                r["final_val_loss"],
                r["val_bpb"],
                r["tokens_per_s"],
                r["train_s"],
                e["eval_s"],
                *("" if losses.get(c) is None else losses[c] for c in columns),
            ]
        )
    atomic_write(path, lambda f: f.write(text.getvalue().encode()))


def segments(curve, L0):
    """Mean of the curve over each L0-long stretch of positions: [(first, last, mean)]."""
    return [(a, min(a + L0, len(curve)) - 1, statistics.fmean(curve[a : a + L0])) for a in range(0, len(curve), L0)]


def markdown(results, plots):
    """results.md: every verdict first, then how the grid was run, one section per table, the plots and the
    samples."""
    parts = [
        "# Positional-scheme ablation",
        md_verdicts(results),
        md_setup(results),
        md_regime(results["regime"]) if results["regime"] else "",
        md_rates(results),
        md_ranking(results, "tuned"),
        md_ranking(results, "shared"),
        md_loss_past(results),
        md_learning(results),
        md_retrieval(results),
        md_past(results),
        md_speed(results),
        md_lengths(results),
        md_positions(results),
        md_attention(results),
        plots.section(),
        md_samples(results),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def md_verdicts(r):
    """The findings on one screen: each claim's verdict with its figure and p (Holm), in each ranking."""
    ref, lines = r["reference"], []
    for ranking in ("tuned", "shared"):
        loss = r["verdicts"].get(ranking, [])
        past = r.get("loss_past_L0", {}).get(ranking, [])
        order = r["learning_order"].get(ranking, [])
        retrieval = r["retrieval_past_L0"].get(ranking, [])
        if not (loss or past or order or retrieval):
            continue
        where = "each scheme at its own learning rate" if ranking == "tuned" else "every scheme at the shared rate"
        lines.append(f"**{where.capitalize()}**:\n")
        for what, claims in (("val loss at L0", loss), ("val loss past L0", past)):
            for c in claims:
                lines.append(
                    f"- {what}, `{c['id']}`: {verdict_words(c, c['against'])}; {difference(c['test'], '.4f')} nats, "
                    f"p (Holm) {fmt(c['p_holm'])}"
                )
        for c in order:
            lines.append(
                f"- learning retrieval, `{c['id']}`: {ORDER_WORDS[c['verdict']].format(ref=ref)}; first on "
                f"{c['earlier']} seeds, after on {c['later']}, tied on {c['ties']}, p (Holm) {fmt(c['p_holm'])}"
            )
        for c in retrieval:
            verdict = (
                f"no test: {c['untested']}"
                if c["verdict"] is None
                else PAST_WORDS[c["verdict"]].format(ref=c["against"])
            )
            figure = "" if c["verdict"] is None else f"; {difference(c['test'], '.3f')}, p (Holm) {fmt(c['p_holm'])}"
            lines.append(f"- retrieval past L0, `{c['id']}`: {verdict}{figure}")
        lines.append("")
    return (
        "## Verdicts\n\nEach claim against the reference, seed by seed, as the sections below define and test it "
        "(Δ: the scheme minus the reference, mean with its 95% CI; a verdict needs p (Holm) < 0.05 in its family).\n\n"
        + "\n".join(lines).rstrip()
    )


def difference(test, spec):
    """A paired test's mean difference with its 95% CI, as "Δ +0.0123 [+0.0050, +0.0196]"."""
    if test is None or test["ci"] is None:
        return "Δ —"
    return f"Δ {test['mean']:+{spec}} [{test['ci'][0]:+{spec}}, {test['ci'][1]:+{spec}}]"


def md_setup(r):
    m, t, env, schemes = r["settings"]["model"], r["settings"]["train"], r["environment"], r["schemes"]
    ranked = [x[rk] for x in schemes.values() for rk in ("shared", "tuned") if rk == "shared" or x["best_scale"] != 1]
    train_min, eval_min = (sum(f[k] for f in ranked) / 60 for k in ("train_s", "eval_s"))
    b, a = r["settings"]["batches"], r["settings"]["ablate"]
    task = f", the recall task in {b['recall_share']:.0%} of the sequences" if b.get("recall_share") else ""
    sels = r["selection_seeds"]
    sweep = f"; each scheme's learning rate chosen on seeds {', '.join(map(str, sels))}, in no test" if sels else ""
    return (
        f"## Setup\n\n{len(schemes)} schemes on `{t['dataset']}`, test seeds "
        f"{', '.join(map(str, r['seeds']))} (fixed before the run){sweep}: {m['n_layer']} layers, "
        f"{m['n_head']} heads, width {m['n_embd']}, trained at context L0 = {r['block_size']}. Each run: "
        f"{t['max_iters']} steps, {r['tokens_per_run']:,} tokens, {t['optimizer']}{task}; every scheme of a seed "
        f"sees the same batches in the same order.\n\n"
        f"Compute: {train_min:.1f} min training + {eval_min:.1f} min evaluation, summed over the ranked runs, "
        f"{a['workers']} run(s) at a time; this command's wall time {r['wall_s'] / 60:.1f} min (runs finished "
        f"earlier are reused). Device {r['device']}, {t['dtype']}, {env['cpu_threads']} CPU threads, torch "
        f"{env['torch']}, code {env['code_version']}."
    )


def md_rates(r):
    sels = r["selection_seeds"]
    if not sels:
        return ""
    lr = r["learning_rates"]
    rates = f"learning_rate {lr['learning_rate']:g}" + (
        f", muon_lr {lr['muon_lr']:g}" if lr["optimizer"] == "muon" else ""
    )
    scales = sorted({float(k) for x in r["schemes"].values() for k in x["sweep"]})
    rows = [
        [
            name,
            *(f"{x['sweep'][k]:.4f}" if (k := f"{s:g}") in x["sweep"] else "—" for s in scales),
            f"x{x['best_scale']:g}",
            ", ".join(f"x{min(losses, key=losses.get)}" if losses else "—" for losses in x["sweep_by_seed"].values()),
        ]
        for name, x in r["schemes"].items()
    ]
    return (
        f"## Each scheme's learning rate\n\nFinal val loss at each multiple of the learning rates ({rates} at x1), "
        f"averaged over the selection seeds ({', '.join(map(str, sels))}, in no test; results.json keeps each "
        f"seed's under `sweep_by_seed`), widened by one more multiple where the best lay at an edge; the lowest is "
        f"the scheme's own rate, at which it trains every test seed (—: not tried; DroPE's variants keep the shared "
        f"rate, their recalibration rate being their axis). The last column is the rate each selection seed would "
        f"have chosen alone: where they differ, one seed would have decided it.\n\n"
        + md_table(["scheme", *(f"x{s:g}" for s in scales), "chosen", "each seed's best"], rows)
    )


def md_ranking(r, ranking):
    ref, schemes = r["reference"], r["schemes"]
    if ranking not in r["verdicts"]:  # no rates chosen: no ranking at each scheme's own
        return ""
    by = {c["scheme"]: c for c in r["verdicts"][ranking]}
    rows = []
    for name, x in sorted(schemes.items(), key=lambda kv: kv[1][ranking]["final_val_loss"]["mean"]):
        f, c = x[ranking], by.get(name)
        test = None if c is None else c["test"]
        diff = (
            "—"
            if test is None or test["ci"] is None
            else f"{test['mean']:+.4f} [{test['ci'][0]:+.4f}, {test['ci'][1]:+.4f}]"
        )
        p = "—" if test is None or test["p"] is None else f"{test['p']:.2g}"
        holm = "—" if c is None or c["p_holm"] is None else f"{c['p_holm']:.2g}"
        eq = "—" if c is None else equivalence_cell(c)
        settled = "—" if c is None or c["detectable_80"] is None else f"{c['detectable_80']:.3f}"
        rows.append(
            [
                name,
                "—" if c is None else c["id"],
                f"x{f['scale']:g}",
                pm(f["final_val_loss"]),
                diff,
                p,
                holm,
                eq,
                "reference" if c is None else verdict_words(c, ref),
                settled,
                len(f["seeds"]),
            ]
        )
    title = "each scheme at its own learning rate" if ranking == "tuned" else "every scheme at the shared learning rate"
    a, family, n = r["settings"]["ablate"], next(iter(by.values()))["family"] if by else 0, len(r["seeds"])
    spread = (
        f": with {n} seeds, where the differences' spread lies below "
        f"{equivalence_spread(n, a['equivalence_margin'], 2 * len(by)):.4f} nats"
        if by and n > 1
        else ""
    )
    return (
        f"## Ranking: {title}\n\nFinal val loss at step {r['settings']['train']['max_iters']} (every scheme at the "
        f"same step), mean ± std over the test seeds; against {ref}, per seed (same batches), the mean difference "
        f"with its 95% CI (unadjusted), the paired t-test's p, and p Holm-adjusted over one family of {family} "
        f"tests: each scheme's difference test, and its equivalence test (two one-sided tests within "
        f"±{a['equivalence_margin']:g} nats) only where these seeds and their spread let it pass at all "
        f"(stats.equivalence_can_pass, in the largest family the table could have{spread}); "
        f"elsewhere the CI is read "
        f'against the margin and no verdict "no difference" is given. "lower" or "higher" needs the '
        f"difference's p (Holm) < 0.05, \"no difference\" the equivalence's. Detectable: the smallest mean "
        f"difference these seeds detect with 80% power at Holm's strictest step (0.05 / {family}), given the "
        f"spread seen (stats.smallest_effect).\n\n"
        + md_table(
            [
                "scheme",
                "claim",
                "lr",
                "val loss",
                f"Δ vs {ref} [95% CI]",
                "p",
                "p (Holm)",
                "equivalence",
                "verdict",
                "detectable (80%)",
                "seeds",
            ],
            rows,
            text_columns=2,
        )
    )


def equivalence_cell(claim):
    """The equivalence column: its p (Holm) where the test ran, else where the CI lies against the margin."""
    if claim["equivalence"]:
        return f"p (Holm) {claim['equivalence_p_holm']:.2g}"
    ci, m = claim["test"]["ci"], claim["margin"]
    if ci is None:
        return "not run"
    where = "inside" if -m < ci[0] and ci[1] < m else "outside" if ci[0] >= m or ci[1] <= -m else "across"
    return f"not run (cannot pass): CI {where} ±{m:g}"


def md_loss_past(r):
    """The claims of val loss past L0: each scheme as trained against the reference as deployed there."""
    rows = []
    for ranking, claims in r.get("loss_past_L0", {}).items():
        for c in claims:
            where = "own rate" if ranking == "tuned" else "shared rate"
            rows.append(
                [
                    c["scheme"],
                    c["id"],
                    where,
                    difference(c["test"], ".4f").removeprefix("Δ "),
                    fmt(c["test"]["p"]),
                    fmt(c["p_holm"]),
                    verdict_words(c, c["against"]),
                    len(c["diffs"]),
                ]
            )
    if not rows:
        return ""
    lengths = [L for L in r["lengths"] if int(L) > r["block_size"]]
    return (
        f"## Val loss past L0\n\nEach scheme's val loss averaged over the scored lengths past L0 "
        f"({', '.join(map(str, lengths))} tokens), as trained, minus the reference's as deployed there (under YaRN "
        f"where it was scored, as the claim id says), seed by seed: the mean difference with its 95% CI, the paired "
        f"t-test's p and p Holm-adjusted over the table's own family, with the equivalence test of the ranking's "
        f"margin where it can pass. A scheme whose positions end at L0 makes no claim.\n\n"
        + md_table(["scheme", "claim", "rate", "Δ [95% CI]", "p", "p (Holm)", "verdict", "seeds"], rows, text_columns=3)
    )


def md_retrieval(r):
    figures = {n: own(x)["retrieval"] for n, x in r["schemes"].items() if own(x)["retrieval"]}
    if not figures:
        return ""
    L0, probe, a = r["block_size"], r["probe"], r["settings"]["ablate"]
    longest = max(int(f["longest"]) for f in figures.values())
    s = longest / (2 * L0)
    names = {"inside L0": "inside L0", "L0 to sL0": f"L0 to {s:g} L0", "sL0 to 2sL0": f"{s:g} L0 to {2 * s:g} L0"}
    rows = [
        [
            name,
            pm(f["worst_slot"], ".2f"),
            *(pm(v, ".2f") for v in f["bands"].values()),
            *(pm(f["reach"][n], ".0f") for n in THRESHOLDS),
            pm(f["effective_length"], ".0f"),
        ]
        for name, f in figures.items()
    ]
    seeds = [
        [name, f["seed"], *(band_cell(w, b) for w, b in seed_bands(f, L0))]
        for name, x in r["schemes"].items()
        if own(x)["retrieval"]
        for f in own(x)["per_seed"]
    ]
    elim = ", ".join(f"{v:.2f}" for v in probe["elimination"].values())
    errors = "; ".join(
        f"at {th:.0%}: the best model reading no key reaches a distance with probability {e['false_pass']:.2g}, a "
        f"{probe['good']:.0%} reader misses the whole window with probability {e['false_fail']:.2g}"
        for th, e in zip(THRESHOLDS.values(), probe["error_rates"].values(), strict=True)
    )
    return (
        f"## Retrieval by distance at step {r['settings']['train']['max_iters']}\n\n"
        f"Each seed's probe: windows of {', '.join(map(str, probe['lengths']))} tokens whose block of "
        f"{round(1 / probe['chance'])} needles side by side stands at every place it fits ({a['probe_trials']} "
        f"each), each needle asked by one query at the window's end, scored as whole answers by cells of "
        f"distances; copying some needle at random without reading the key scores {probe['chance']:.0%}, copying "
        f"the needle of a fixed recency rank or place up to each cell's floor, at most twice that (results.json "
        f"keeps each cell's `blind` scores). Bands: whole answers over the distances inside L0 (from the "
        f"{L0}-token windows, where most of them lie), from L0 to {s:g} L0 and from {s:g} L0 to {2 * s:g} L0 "
        f"(from the {longest}-token windows). k_max "
        f"is the PI paper's effective window (section 3.3: every distance up to k retrieved at "
        f"{THRESHOLDS['pi']:.0%} at least), beside it our {THRESHOLDS['strict']:.0%}, in the longest window, read "
        f"so that no single cell decides it: {probe['per']} consecutive cells pooled into one ({probe['cell_trials']} "
        f"trials in the first, at the window's edge, more inside), read only where a {probe['good']:.0%} reader "
        f"clears its floor more often "
        f"than not, and passing only when its accuracy reaches the threshold (as PI and RULER compare) and its "
        f"95% Clopper-Pearson interval lies wholly above its floor. "
        f"Error rates at these trials ({probe['cells']} cells read): {errors}. Effective length: RULER's reading, "
        f"k_max at one reference for every scheme, {reference_text(probe['reference'])}. Worst slot: the worst "
        f"query slot's whole answers at L0 when "
        f"every needle is queried once in a random order (elimination would score {elim} at slots 1 onwards). "
        f"{own_words(r).capitalize()}, mean ± std over the test seeds; below, each seed's bands with their 95% "
        f"intervals.\n\n"
        + md_table(["scheme", "worst slot at L0", *names.values(), "k_max 20%", "k_max 90%", "effective length"], rows)
        + "\n\n"
        + md_table(["scheme", "seed", *names.values()], seeds)
    )


def md_past(r):
    """The claims of retrieval past L0 among the seeds on which the scheme and the reference both learned."""
    ref, parts = r["reference"], []
    for ranking, claims in r.get("retrieval_past_L0", {}).items():
        if not claims:
            continue
        rows = []
        for c in claims:
            test = c.get("test")
            rows.append(
                [
                    c["scheme"],
                    c["id"],
                    ", ".join(map(str, c["seeds"])) or "none",
                    "—" if not c["seeds"] else f"{c['means'][0]:.2f}",
                    "—" if not c["seeds"] else f"{c['means'][1]:.2f} ({c['against']})",
                    "—"
                    if test is None or test["ci"] is None
                    else f"{test['mean']:+.3f} [{test['ci'][0]:+.3f}, {test['ci'][1]:+.3f}]",
                    fmt(None if test is None else test["p"]),
                    fmt(c.get("p_holm")),
                    f"no test: {c['untested']}"
                    if c["verdict"] is None
                    else PAST_WORDS[c["verdict"]].format(ref=c["against"]),
                ]
            )
        family = next((c["family"] for c in claims if "family" in c), 0)
        where = "each scheme at its own learning rate" if ranking == "tuned" else "every scheme at the shared rate"
        parts.append(
            f"### {where.capitalize()}\n\n"
            + md_table(
                [
                    "scheme",
                    "claim",
                    "seeds where both learned",
                    "scheme",
                    "comparator",
                    "Δ [95% CI]",
                    "p",
                    "p (Holm)",
                    "verdict",
                ],
                rows,
                text_columns=3,
            )
            + f"\n\nOne Holm family of {family} test{'' if family == 1 else 's'} (two seeds or more to compare, the "
            f"comparator above its floor)."
        )
    if not parts:
        return ""
    return (
        f"## Retrieval past L0 among the seeds that learned\n\nWhole answers from L0 to the middle of the longest "
        f"window (the first band past L0), each scheme minus {ref} seed by seed, {ref} as trained and, where probed, "
        f"under {DEPLOYED} (factor W / L0, read zero-shot: the scaling deployed models extend with), over the seeds "
        f"on which both learned retrieval by the ceiling (the inclusion rule fixed before the run: a model that never "
        f"learned the task has no retrieval to carry past L0), tested only where the comparator's answers pooled over "
        f"those seeds have a 95% interval above the band's floor (against one that reads no key, a difference says "
        f"nothing of the scheme); the "
        f"mean difference with its 95% CI (unadjusted), the paired t-test's p (the exact sign test where every seed "
        f'gives the same difference) and p Holm-adjusted over the table. "more" or "less" needs p (Holm) < 0.05.\n\n'
        + "\n\n".join(parts)
    )


ORDER_WORDS = {
    "earlier": "learns before {ref}",
    "later": "learns after {ref}",
    "inconclusive": "inconclusive",
    None: "no test: every seed tied",
}
PAST_WORDS = {
    "holds": "retrieves more than {ref}",
    "does not hold": "retrieves less than {ref}",
    "inconclusive": "inconclusive",
}


def seed_bands(f, L0):
    """[(the window a band is read from, the band's name)] of a seed: inside L0 from the L0 windows where probed."""
    longest = longest_window(f)
    return [(f["windows"].get(str(L0)) or longest, "inside L0"), *((longest, b) for b in BEYOND)]


def band_cell(window, name):
    b = window["bands"][name]
    return (
        "—"
        if b is None
        else f"{b['accuracy']:.2f} [{b['ci'][0]:.2f}, {b['ci'][1]:.2f}] of {b['trials']}, floor {b['floor']:.2f}"
    )


def md_learning(r):
    """Steps-to-learn per scheme and seed, the share that learned, and the order against the reference."""
    rankings = [ranking for ranking in ("tuned", "shared") if ranking in r["learning_order"]]
    if not any(x["shared"]["learning"] for x in r["schemes"].values()):
        return ""
    t, probe, ref, n = r["settings"]["train"], r["probe"], r["reference"], len(r["seeds"])
    a = r["settings"]["ablate"]
    parts = [
        f"## Learning retrieval: steps to learn\n\nEvery {t['eval_interval']} steps each run's query slots "
        f"are probed at L0 ({a['probe_slots']} "
        f"windows, every needle queried once); a run has learned retrieval at the first evaluation at which every "
        f"slot answers at least {probe['learn_gate']:.0%} whole, the extension lab's gate. No gate decides who "
        f'is compared here: learning is an outcome of the scheme. ">{t["max_iters"]}": not by the ceiling '
        f"(max_iters), censored there. Learned by the ceiling: the share of seeds, with its 95% Clopper-Pearson "
        f"interval."
    ]
    for ranking in rankings:
        rows = [
            [
                name,
                ", ".join(
                    str(st) if ok else f">{t['max_iters']}" for st, ok in zip(lg["steps"], lg["learned"], strict=True)
                ),
                f"{sum(lg['learned'])} of {len(lg['learned'])} [{lg['ci'][0]:.2f}, {lg['ci'][1]:.2f}]",
            ]
            for name, x in r["schemes"].items()
            if (lg := x[ranking]["learning"])
        ]
        order = r["learning_order"][ranking]
        family = order[0]["family"] if order else 0
        tests = [
            [
                c["scheme"],
                c["id"],
                f"{c['earlier']} / {c['later']} / {c['ties']}",
                fmt(c["p"]),
                fmt(c["p_holm"]),
                fmt(c["smallest_p"]),
                "yes" if c["can_settle"] else "no",
                ORDER_WORDS[c["verdict"]].format(ref=ref),
            ]
            for c in order
        ]
        where = "each scheme at its own learning rate" if ranking == "tuned" else "every scheme at the shared rate"
        parts.append(
            f"### {where.capitalize()}\n\n"
            + md_table(["scheme", "steps to learn, by seed", f"learned by {t['max_iters']}"], rows)
        )
        if order:
            parts.append(
                f"Which learns first, each scheme or {ref}, seed by seed: an exact two-sided sign test of the seeds "
                f"on which each learned first (a seed where both learned at the same evaluation, or neither, is a "
                f"tie and dropped; where one alone learned, it learned first, both being censored at the same "
                f"ceiling), p Holm-adjusted over one family of {family} tests (those with an untied seed). With "
                f"{n} seeds the smallest p a sign test reaches is 2 x 0.5^{n} = {2 * 0.5**n:.2g}, where every seed "
                f'agrees; smallest p below is that of the untied seeds, and "can settle" says whether it passes '
                + (
                    f"Holm's strictest step, 0.05 / {family} = {0.05 / family:.2g}"
                    if family
                    else "Holm's strictest step (here no comparison has an untied seed)"
                )
                + ". A difference is a finding only where p (Holm) < 0.05.\n\n"
                + md_table(
                    [
                        "scheme",
                        "claim",
                        f"first: scheme / {ref} / tie",
                        "p",
                        "p (Holm)",
                        "smallest p",
                        "can settle",
                        "verdict",
                    ],
                    tests,
                    text_columns=2,
                )
            )
    return "\n\n".join(parts)


def fmt(p):
    return "—" if p is None else f"{p:.2g}"


def md_speed(r):
    rows = [
        [name, pm(own(x)["tokens_per_s"], ",.0f"), ", ".join(map(str, own(x)["threads"]))]
        for name, x in r["schemes"].items()
    ]
    threads = {t for x in r["schemes"].values() for t in own(x)["threads"]}
    note = (
        "every run on the same thread count, so the figures compare"
        if len(threads) == 1
        else "the runs' thread counts differ: compare tokens/s only between rows of the same thread count"
    )
    return (
        "## Training speed\n\nTokens per second during training, median over the run's logging windows, mean ± "
        f"std over the test seeds, {own_words(r)}; {note}.\n\n" + md_table(["scheme", "tokens/s", "CPU threads"], rows)
    )


def md_attention(r):
    inside = {n: own(x)["attention"] for n, x in r["schemes"].items() if own(x)["attention"]}
    if not inside:
        return ""
    rows = [
        [
            name,
            *(
                f"{sum(d) / len(d):.1f} / {sum(e) / len(e):.2f}"
                for d, e in zip(a["distance"], a["entropy"], strict=True)
            ),
        ]
        for name, a in inside.items()
    ]
    uniform = next(iter(inside.values()))["uniform_entropy"]
    return (
        f"## Inside: attention distance and entropy\n\nPer layer, the mean over heads of the attention-weighted "
        f"distance (tokens) / the attention's entropy (nats; a uniform causal head has about {uniform:.2f}), over "
        f"fixed validation windows at L0, first seed, {own_words(r)}; attention.png shows every "
        f"head.\n\n" + md_table(["scheme", *(f"layer {i}" for i in range(len(rows[0]) - 1))], rows)
    )


def md_lengths(r):
    L0, lengths = r["block_size"], r["lengths"]
    rows = [
        (name, sc, *(pm(by_len[str(L)]) if str(L) in by_len else "—" for L in lengths))
        for name, x in r["schemes"].items()
        for sc, by_len in own(x)["loss_by_length"].items()
    ]
    windows = ", ".join(f"{w} of {L}" for L, w in r["windows"].items())
    return (
        f"## Length extrapolation\n\nValidation loss averaged over every position of fixed windows, the same "
        f"for every model ({windows} tokens), mean ± std over seeds, {own_words(r)}. RoPE models are "
        f"also scored with "
        f"inference-time scaling by the factor L/L0 beyond L0 (—: at or below L0 the factor would be 1). N/A: "
        f"learned positions have no embedding past L0.\n\n"
        + md_table(["scheme", "scaling", *(f"{L} ({L / L0:g}x)" for L in lengths)], rows, text_columns=2)
    )


def md_positions(r):
    L0, longest = r["block_size"], max(r["lengths"])
    curves = [(name, sc, c) for name, x in r["schemes"].items() for sc, c in own(x)["loss_by_position"].items()]
    if longest <= L0 or not curves:
        return ""
    missing = [name for name, x in r["schemes"].items() if not own(x)["loss_by_position"]]
    return (
        f"## Loss by position within the {longest}-token windows\n\nMean loss over each L0-long stretch of "
        f"positions, mean over seeds; positions from {L0} on were never seen in training"
        + (f" ({', '.join(missing)}: N/A past L0)" if missing else "")
        + ".\n\n"
        + md_table(
            ["scheme", "scaling", *(f"{a}–{b}" for a, b, _ in segments(curves[0][2], L0))],
            [(name, sc, *(f"{v:.3f}" for _, _, v in segments(c, L0))) for name, sc, c in curves],
            text_columns=2,
        )
    )


def md_samples(r):
    a, seed = r["settings"]["ablate"], r["seeds"][0]
    samples = [(name, x["sample"]) for name, x in r["schemes"].items() if x["sample"] is not None]
    if not samples:
        return ""
    return (
        f"## Samples\n\nPrompt {a['sample_prompt']!r}, {a['sample_tokens']} tokens at temperature "
        f"{a['sample_temperature']}, generator seed {seed}, from each scheme's seed-{seed} run.\n\n"
        + "\n\n".join(f"**{name}**\n\n```text\n{text}\n```" for name, text in samples)
    )


def write_plots(results, out):
    """The PNG plots in out (report.Plots: none without matplotlib)."""
    plots = Plots(out)
    if (plt := plots.plt) is None:
        return plots
    L0, schemes = results["block_size"], results["schemes"]
    colors = palette(plt, schemes)
    dashes = dict(
        zip(
            [AS_TRAINED, *results["settings"]["ablate"]["rope_scalings"].split(",")],
            itertools.cycle(["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3))]),
        )
    )

    def save(fig, ax, file, title, xlabel, ylabel):
        dress(ax, title, xlabel, ylabel)
        plots.save(fig, file, title)

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name, x in schemes.items():
        c = own(x)["val_curve"]
        ax.plot(c["iters"], c["mean"], color=colors[name], label=name)
        ax.fill_between(c["iters"], c["min"], c["max"], color=colors[name], alpha=0.2)
    save(fig, ax, "val_loss.png", "Validation loss during training (band: min-max over seeds)", "step", "val loss")

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for name, x in schemes.items():
        lengths = own(x)["loss_by_length"]
        for sc, by_len in lengths.items():
            if sc != AS_TRAINED and str(L0) in lengths[AS_TRAINED]:  # at L0 the factor is 1: start from plain
                by_len = {str(L0): lengths[AS_TRAINED][str(L0)], **by_len}
            pts = [(int(L), v["mean"], v["std"] or 0.0) for L, v in by_len.items() if v is not None]
            if pts:
                Ls, means, stds = zip(*pts, strict=True)
                ax.errorbar(
                    Ls,
                    means,
                    yerr=stds,
                    color=colors[name],
                    linestyle=dashes.get(sc, "-"),
                    marker="o",
                    markersize=3,
                    capsize=2,
                    label=name if sc == AS_TRAINED else f"{name} + {sc}",
                )
    ax.axvline(L0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(results["lengths"], [str(L) for L in results["lengths"]])
    save(
        fig,
        ax,
        "loss_vs_length.png",
        f"Loss vs evaluation context (trained at L0 = {L0})",
        "context length (tokens)",
        "val loss",
    )

    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    longest = max(results["lengths"])
    width = max(1, longest // 32)  # 32 buckets: one position's mean over a few dozen windows is too noisy to read
    for name, x in schemes.items():
        for sc, curve in own(x)["loss_by_position"].items():
            buckets = np.array(curve[: len(curve) // width * width]).reshape(-1, width).mean(1)  # (n_buckets,)
            ax.plot(
                (np.arange(len(buckets)) + 0.5) * width,
                buckets,
                color=colors[name],
                linestyle=dashes.get(sc, "-"),
                label=name if sc == AS_TRAINED else f"{name} + {sc}",
            )
    ax.axvline(L0, color="grey", linewidth=0.8)
    save(
        fig,
        ax,
        "loss_vs_position.png",
        f"Loss by position in {longest}-token windows ({width}-position means)",
        "position in window",
        "val loss",
    )

    grids = [(name, own(x)["retrieval"]["grid"]) for name, x in schemes.items() if own(x)["retrieval"]]
    if grids:
        distance_plots(
            plots,
            grids,
            L0,
            results["probe"]["chance"],
            "retrieval.png",
            f"Whole answers by needle-to-query distance, each window length (L0 = {L0}; mean over seeds)",
        )
    inside = [(name, own(x)["attention"]) for name, x in schemes.items() if own(x)["attention"]]
    if inside:
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        for ax, key, label in zip(
            axes, ("distance", "entropy"), ("attention distance (tokens)", "entropy (nats)"), strict=True
        ):
            for name, a in inside:
                heads = np.array(a[key])  # (layers, heads)
                ax.plot(
                    np.arange(heads.size) / heads.shape[1],
                    heads.flatten(),
                    marker="o",
                    markersize=3,
                    linestyle="",
                    color=colors[name],
                    label=name,
                )
            dress(ax, f"{label} of every head", "layer (its heads side by side)", label, legend=None)
        axes[1].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        plots.save(fig, "attention.png", "Attention distance and entropy per layer and head, first seed")
    learned = [(name, own(x)["biases"]) for name, x in schemes.items() if own(x)["biases"]]
    if learned:
        fig, axes = plt.subplots(1, len(learned), figsize=(4.5 * len(learned), 3.8), squeeze=False)
        for ax, (name, by_layer) in zip(axes[0], learned, strict=True):
            for layer, heads in by_layer.items():
                color = plt.get_cmap("viridis")(int(layer) / max(1, len(by_layer) - 1))
                for h, curve in enumerate(heads):
                    ax.plot(curve, color=color, alpha=0.7, label=f"layer {layer}" if h == 0 else None)
            ax.axvline(L0, color="grey", linewidth=0.8)
            dress(ax, name, "distance (tokens; the line: L0)", "score bias", legend="inside")
        plots.save(
            fig,
            "biases.png",
            f"Score biases against distance, each head, from a query at {max(results['lengths']) - 1}",
        )
    return plots
