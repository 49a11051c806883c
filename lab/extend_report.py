"""Figures over seeds, the papers' claims with their verdicts, tables and plots of the context-extension lab
(lab/extend.py). Readouts are lab/retrieval.py's, statistics lab/stats.py's, output formats lab/report.py's; this
module knows nothing of training."""

import math
import statistics
from dataclasses import dataclass

import scalings
from lab.report import Plots, dress, md_regime, md_table, pm, regime_rows
from lab.retrieval import (
    BANDS,
    THRESHOLDS,
    above_floor,
    band,
    distance_plots,
    papers_reach,
    readout as read_cells,
    readout_errors as errors,
    shares,
)
from lab.stats import (
    ALPHA,
    POWER,
    equivalence_can_pass,
    equivalence_spread,
    mean_std,
    paired_test,
    smallest_effect,
    verdicts,
)

# nats: a "same" claim's margin, the largest change of loss at the original window the PI paper reports: Table 2,
# Proof-pile, 7B extended to 32,768, perplexity 2.77 -> 2.82 at 2,048 tokens (ln 2.82/2.77 = 0.018)
SAME_MARGIN = 0.02
# PI's Table 4, LLaMA 7B extended from 2,048 to 8,192: k_max (passkey, 20%) after each fine-tuning step, in L0
PI_TABLE4 = {
    "steps": [200, 400, 600, 800, 1000, 10000],
    "FT": [1792, 2048, 2048, 2048, 2304, 2560],
    "PI": [8192, 8192, 8192, 8192, 8192, None],
    "L0": 2048,
}
CONTEXT_WORTH = 0.05  # nats: context past L0 worth less than this leaves the loss claims reading short-range damage
UNTESTED = "CI against the margin"  # a "same" claim whose equivalence test cannot pass at these seeds
AT_FLOOR = "not read: the comparator at its floor"  # a band claim whose arm b's pooled accuracy does not clear it
FLOOR = "floor"  # a band claim's arm b that is the band's floor itself: arm a's accuracy above what no key reading gets


def key(b, method, s):
    return f"rope-b{b:g}-{method}-x{s:g}"


def lab_results(lab, done, sweeps, rates, screening):
    """results.json's figures and claims; done maps each job (lab/extend.py's) to that run's figures, screening
    each role's seeds screened, passed and included."""
    L0, sels, per, read = lab.L0, lab.chosen_selection, lab.settings.probe_pool, lab.steps[-1]
    screened = [seed for role in screening.values() for seed in role["screened"]]
    base = {
        f"rope-b{b:g}": {str(seed): base_readout(done["base", b, seed], L0, per) for seed in screened}
        for b in lab.bases
    }
    # RULER reads every model against one score fixed for all (Llama-2-7B's 85.6% at its trained 4K); here the gate's,
    # which every query slot of every included base model reached at L0, fixed in the config before the run. Not the
    # bases' measured accuracy inside L0: near 1, a read cell with two misses of its trials would stop the reach of a
    # model that retrieves everywhere.
    reference = lab.settings.base_gate
    finetune = {}
    for b in lab.bases:
        for s in lab.factors:
            for m in lab.methods:
                arm, at = (b, m, s), str(round(s * L0))
                runs = {
                    str(seed): readout(done["finetune", *arm, seed, rates[arm]], L0, s, per, reference)
                    for seed in lab.seeds
                }
                by_seed = {
                    str(sel): {
                        f"{lr:g}": {
                            "kept": kept(run, done["base", b, sel], L0),
                            "loss": run["scores"][str(read)]["loss"][at],
                        }
                        for lr in sweeps.get(arm, [])
                        for run in [done["finetune", *arm, sel, lr]]
                    }
                    for sel in sels or []
                }
                finetune[key(*arm)] = {
                    "base": b,
                    "method": m,
                    "factor": s,
                    "lr": rates[arm],
                    # each rate's share of retrieval kept inside L0 (the rule's reading) and loss at s L0 at the read
                    # step, averaged over the selection seeds; each seed's beside it
                    "sweep": {lr: swept([s[lr] for s in by_seed.values()]) for lr in next(iter(by_seed.values()), {})},
                    "sweep_by_seed": by_seed,
                    "runs": runs,
                    "by_step": by_step(runs, [0, *lab.steps], s, L0),
                }
    results = {
        "block_size": L0,
        "seeds": lab.seeds,
        "selection_seeds": sels,
        "screening": screening,
        "bases": lab.bases,
        "factors": lab.factors,
        "methods": lab.methods,
        "steps": lab.steps,
        "read_step": read,
        "reads": THRESHOLDS,
        "per": per,
        "chance": lab.probe.chance,
        "reference": reference,
        "elimination": lab.probe.elimination,
        "base_gate": lab.settings.base_gate,
        "finetune_keep": lab.settings.finetune_keep,
        "regime": regime_rows([(f"this config (base {b:g})", lab.model_cfg.head_dim, b, L0) for b in lab.bases]),
        "base": base,
        "finetune": finetune,
        "train_s": sum(r["train_s"] for r in done.values()),
    }
    results["error_rates"] = readout_errors(results)
    results["claims"] = judge(claims(results))
    return results


def base_readout(run, L0, per):
    """A base run's result with each probe's readout at L0: the band inside it, k_max at each of THRESHOLDS."""

    def at_L0(cells):
        got = read_cells(cells, L0, 1, None, per)  # s = 1: of the bands only the one inside L0 is read
        return {"inside L0": got["bands"]["inside L0"], "kmax": got["reach"]}

    return run | {"curve": {st: c | at_L0(c["counts"]["cells"]) for st, c in run["curve"].items()}}


def mean_kept(shares):
    """{read step: the share kept (`kept`) averaged over the seeds}: its least is what the rate rule reads."""
    return {st: statistics.fmean(share[st] for share in shares) for st in shares[0]}


def swept(seeds):
    """A rate's sweep figures averaged over the selection seeds: the share kept at each read step and its least (what
    the rate rule reads), and the loss."""
    at = mean_kept([s["kept"] for s in seeds])
    return {"kept": at, "least kept": min(at.values()), "loss": statistics.fmean(s["loss"] for s in seeds)}


def kept(finetune, base, L0):
    """{read step: the share of its base model's retrieval inside L0 (at its last probe, in windows of L0) that a
    fine-tune keeps inside L0 (in windows of s L0)}: the rate rule's reading (lab/extend.py). A base that retrieves
    nothing there (only in tests: an included base passed the gate) has nothing to lose: it keeps all."""

    def inside(cells):
        return band(cells, 0, L0)["accuracy"]

    before = inside(base["curve"][str(base["steps"])]["counts"]["cells"])
    return {
        st: inside(sc["retrieval"]["target"]["cells"]) / before if before else 1.0
        for st, sc in finetune["scores"].items()
        if "target" in sc.get("retrieval", {}) and st != "0"
    }


def readout(run, L0, s, per, reference):
    """A fine-tune's result with each scored step's readout beside its counts: the bands (inside L0 and L0 to s L0
    in windows of s L0, s L0 to 2s L0 in windows of 2s L0, probed at the read step alone), k_max at each of
    THRESHOLDS in windows of s L0 (as PI's Table 4 reads it), and RULER's effective length at reference (the same
    for every arm) in windows of 2s L0."""
    out = {}
    for st, sc in run["scores"].items():
        target, past = (sc["retrieval"].get(w, {}).get("cells") for w in ("target", "past"))
        near = read_cells(target, L0, s, reference, per)
        far = None if past is None else read_cells(past, L0, s, reference, per)
        out[st] = sc | {
            "bands": {
                "inside L0": near["bands"]["inside L0"],
                "L0 to sL0": near["bands"]["L0 to sL0"],
                "sL0 to 2sL0": None if far is None else far["bands"]["sL0 to 2sL0"],
            },
            "kmax": near["reach"],
            "effective": None if far is None else far["effective_length"],
        }
    return run | {"scores": out}


def by_step(runs, steps, s, L0):
    """{step: {"loss": {L: mean_std}, "bands": {band: mean_std of accuracies}, "kmax": {read: mean_std},
    "effective": mean_std}} over the seeds at each scored step (None where no seed has the figure: a window too
    short for a band's distances)."""
    lengths = [str(L) for L in (L0, round(s * L0), round(2 * s * L0))]

    def over(st, get):
        values = [v for r in runs.values() if (v := get(r["scores"][str(st)])) is not None]
        return mean_std(values) if values else None

    return {
        str(st): {
            "loss": {L: over(st, lambda sc, L=L: sc["loss"][L]) for L in lengths},
            "bands": {
                name: over(st, lambda sc, name=name: sc["bands"][name] and sc["bands"][name]["accuracy"])
                for name in BANDS
            },
            "kmax": {name: over(st, lambda sc, name=name: sc["kmax"][name]) for name in THRESHOLDS},
            "effective": over(st, lambda sc: sc["effective"] and sc["effective"]["length"]),
            "context": over(st, lambda sc: sc["context"]["L0"] - sc["context"]["whole"] if "context" in sc else None),
        }
        for st in steps
    }


def readout_errors(r):
    """What k_max gets wrong at the trials used, in each window length the lab reads it in (every seed has the same
    cells there; the first's are read): {str(W): {"trials" and "floor" of its first read cell, "cells" read, read:
    error_rates}}."""
    first = next(iter(next(iter(r["base"].values())).values()))
    windows = {str(r["block_size"]): next(iter(first["curve"].values()))["counts"]["cells"]}
    for x in r["finetune"].values():
        scores = next(iter(x["runs"].values()))["scores"][str(r["read_step"])]["retrieval"]
        windows |= {
            str(round(m * x["factor"] * r["block_size"])): scores[w]["cells"] for m, w in ((1, "target"), (2, "past"))
        }
    return {W: errors(cells, r["per"]) for W, cells in windows.items() if cells}


# ----------------------------------------------------------------------------- the papers' claims at this scale

# the lab's methods that are no RoPE scaling (lab/extend.py's METHODS says how each fine-tunes): PoSE's rows at PI's
# steps and rows, and at PI's tokens
POSE, POSE_TOKENS = "pose", "pose-tokens"
# a scaling's name with this suffix sets it for 2s while it fine-tunes at s L0, as YaRN's s = 32 model was fine-tuned
# at 64k and read to 128k (its section 4): from s L0 to 2s L0 it is read past its fine-tuned length inside its factor
HEADROOM = "-2s"


@dataclass(frozen=True)
class Claim:
    """One of the papers' claims, a row of CLAIMS, made for every base and factor the lab ran: per test seed, arm
    a's figure minus arm b's (two methods fine-tuned from the same base model to the same factor s), read at the
    read step, the same for every arm (untuned: at step 0, the scaling alone). expect "lower" or "higher" is tested
    by the paired t-test (the exact sign test where every seed gives the same difference), "same" by an equivalence
    test within margin where it can pass (judge); every test in one Holm family. The sentence is results.md's, its
    fields filled in for each base and factor (claims' words)."""

    id: str  # stable: code, results.json, tests and the guides name the claim by it
    a: str  # methods (lab/extend.py's METHODS)
    b: str
    figure: str  # "loss" at a length, or "band": the accuracy over a band
    at: str  # the length ("L0", "sL0" or "2sL0") or the band (of retrieval.BANDS)
    expect: str  # "lower", "higher" or "same"
    sentence: str
    untuned: bool = False
    margin: float | None = None  # a "same" claim's, in nats, set against the arms it compares
    b_step: str | None = None  # the step b is read at where not a's: "0" reads direct fine-tuning's, the base model


DIRECT, PI, NTK, YARN = (
    scalings.NO_SCALING,
    scalings.LINEAR,
    scalings.NTK,
    scalings.YARN,
)  # the methods as the papers name them
YARN_2S = YARN + HEADROOM
CLAIMS = (
    Claim(
        "ntk-loss-below-pi-untuned",
        a=NTK,
        b=PI,
        figure="loss",
        at="sL0",
        expect="lower",
        sentence="(a) without fine-tuning, NTK has a lower loss than PI at {near} tokens {at}",
        untuned=True,
    ),
    Claim(
        "yarn-loss-below-pi-untuned",
        a=YARN,
        b=PI,
        figure="loss",
        at="sL0",
        expect="lower",
        sentence="(a) without fine-tuning, YaRN has a lower loss than PI at {near} tokens {at}",
        untuned=True,
    ),
    Claim(
        "pi-loss-below-direct",
        a=PI,
        b=DIRECT,
        figure="loss",
        at="sL0",
        expect="lower",
        sentence="(b) after {read} steps, PI has a lower loss than direct fine-tuning at {near} tokens {at}",
    ),
    Claim(
        "yarn-loss-below-pi",
        a=YARN,
        b=PI,
        figure="loss",
        at="sL0",
        expect="lower",
        sentence="(c) after {read} steps, YaRN has a lower loss than PI at {near} tokens {at}",
    ),
    Claim(
        "yarn-2s-loss-below-yarn-past-sL0",
        a=YARN_2S,
        b=YARN,
        figure="loss",
        at="2sL0",
        expect="lower",
        sentence="(d) after {read} steps at {near} tokens, YaRN set for 2s has a lower loss than YaRN set for s at "
        "{far} tokens, past the fine-tuned length and inside its factor {at}",
    ),
    Claim(
        "pi-L0-loss-same-as-base",
        a=PI,
        b=DIRECT,
        figure="loss",
        at="L0",
        expect="same",
        sentence="(e) after {read} steps, PI's loss at L0 = {L0} is within {margin} nats of the base model's, the "
        "cost on the original window that PI's Table 2 reads {at}",
        margin=SAME_MARGIN,
        b_step="0",
    ),
    Claim(
        "pi-retrieves-more-than-direct",
        a=PI,
        b=DIRECT,
        figure="band",
        at="L0 to sL0",
        expect="higher",
        sentence="(f) after {read} steps, PI retrieves more than direct fine-tuning from L0 to s L0 (band accuracy) "
        "{at}",
    ),
    Claim(
        "yarn-2s-retrieves-more-than-yarn-past-sL0",
        a=YARN_2S,
        b=YARN,
        figure="band",
        at="sL0 to 2sL0",
        expect="higher",
        sentence="(g) after {read} steps at {near} tokens, YaRN set for 2s retrieves more than YaRN set for s from "
        "s L0 to 2s L0, past the fine-tuned length and inside its factor (band accuracy) {at}",
    ),
    Claim(
        "yarn-2s-retrieves-above-floor-past-sL0",
        a=YARN_2S,
        b=FLOOR,
        figure="band",
        at="sL0 to 2sL0",
        expect="higher",
        sentence="(g) after {read} steps at {near} tokens, YaRN set for 2s retrieves above the band's floor from s L0 "
        "to 2s L0, past the fine-tuned length (band accuracy minus the floor) {at}",
    ),
    Claim(
        "pose-loss-same-as-pi",
        a=POSE,
        b=PI,
        figure="loss",
        at="sL0",
        expect="same",
        sentence="(h) after {read} steps, PoSE at PI's steps and rows has a loss at {near} tokens within {margin} nats "
        "of PI's {at}",
        margin=SAME_MARGIN,
    ),
    Claim(
        "pose-tokens-loss-same-as-pi",
        a=POSE_TOKENS,
        b=PI,
        figure="loss",
        at="sL0",
        expect="same",
        sentence="(h) after {read} steps, PoSE at PI's tokens has a loss at {near} tokens within {margin} nats of PI's "
        "{at}",
        margin=SAME_MARGIN,
    ),
)


def claims(r):
    """Every claim of CLAIMS for every base and factor, in that order, as per-seed differences A - B with the side
    expected: {"id", "claim" (its sentence), "diffs", "expect", "margin", "at_floor": a band claim whose comparator
    b does not retrieve above the band's floor over the test seeds, `retrieval.above_floor`: no arm is set against
    one that reads no key, the floor itself aside}. A claim whose methods the
    lab did not run, or that lacks a figure (a band without distances), is left out."""
    L0, read, out = r["block_size"], str(r["read_step"]), []
    for base in r["bases"]:
        for s in r["factors"]:
            near, far = str(round(s * L0)), str(round(2 * s * L0))
            lengths = {"L0": str(L0), "sL0": near, "2sL0": far}
            words = {"near": near, "far": far, "L0": L0, "read": read, "at": f"(base {base:g}, s = {s:g})"}
            for c in CLAIMS:
                step = "0" if c.untuned else read
                a_arm = r["finetune"].get(key(base, c.a, s))
                b_arm = a_arm if c.b == FLOOR else r["finetune"].get(key(base, c.b, s))
                a = seed_figures(a_arm, c, step, lengths)
                b = seed_figures(b_arm, c, c.b_step or step, lengths, floor=c.b == FLOOR)
                if a is not None and b is not None and None not in a + b:
                    floored = (
                        c.figure == "band"
                        and c.b != FLOOR
                        and not above_floor(
                            [run["scores"][c.b_step or step]["bands"][c.at] for run in b_arm["runs"].values()]
                        )
                    )
                    out.append(
                        {
                            "id": c.id,
                            "claim": c.sentence.format_map(words | {"margin": c.margin}),
                            "diffs": [x - y for x, y in zip(a, b, strict=True)],
                            "expect": c.expect,
                            "margin": c.margin,
                            "at_floor": floored,
                        }
                    )
    return out


def seed_figures(arm, c, step, lengths, floor=False):
    """Claim c's figure of an arm on each test seed at step (lengths: c.at's in tokens), or where floor its band's
    floor; None where the lab did not run the arm, a seed's None where it has no such band."""
    if arm is None:
        return None
    scores = [run["scores"][step] for run in arm["runs"].values()]
    if c.figure == "loss":
        return [sc["loss"][lengths[c.at]] for sc in scores]
    return [sc["bands"][c.at] and sc["bands"][c.at]["floor" if floor else "accuracy"] for sc in scores]


def can_pass(c, family):
    """Whether c's equivalence test could pass at all with its seeds and the spread they show, in a Holm family of
    family tests (with no spread, its exact version's smallest p is 0.5 ** n)."""
    n = len(c["diffs"])
    if n < 2:
        return False
    sd = statistics.stdev(c["diffs"])
    return 0.5**n < ALPHA / family if sd == 0 else equivalence_can_pass(n, sd, c["margin"], family)


def judge(claims):
    """Every claim judged in one Holm family (stats.verdicts). A "same" claim always gives its test of lying beyond
    the margin, and its equivalence test only where that can pass at these seeds in that family (the family shrinks
    as such tests leave it, so this is decided to a fixed point); one without it, whose difference is not shown to
    lie beyond the margin either, keeps its CI against the margin, verdict UNTESTED. A band claim whose comparator
    sits at the band's floor (`retrieval.above_floor`) sets an arm against one that reads no key: it leaves the
    family, verdict AT_FLOOR (a claim against the floor itself says whether the arm reads at all). Each claim
    gains "power": the smallest difference its seeds detect with 80% power at Holm's strictest
    level for the family, at the spread seen (None without spread), and for a "same" claim "equivalence_spread":
    the largest spread at which its equivalence test could pass."""
    same = [i for i, c in enumerate(claims) if c["expect"] == "same"]
    floored = {i for i, c in enumerate(claims) if c.get("at_floor")}
    differences = sum(len(c["diffs"]) >= 2 for i, c in enumerate(claims) if i not in floored)  # paired or beyond
    tested = same
    while len(kept := [i for i in tested if can_pass(claims[i], differences + len(tested))]) < len(tested):
        tested = kept
    judged = verdicts(
        [
            c | ({"tost": False} if i in same and i not in tested else {})
            for i, c in enumerate(claims)
            if i not in floored
        ]
    )
    family = judged[0]["family"] if judged else 0
    out = iter(judged)

    def verdict(i, c):
        if i in floored:
            return untested(c, family, AT_FLOOR)
        c = next(out)
        return c | {"verdict": UNTESTED} if i in same and i not in tested and c["verdict"] == "inconclusive" else c

    return [annotated(verdict(i, c), family) for i, c in enumerate(claims)]


def untested(c, family, verdict):
    return dict(
        c,
        test=paired_test(c["diffs"]),
        equivalence_p=None,
        beyond_p=None,
        p_holm=None,
        equivalence_p_holm=None,
        beyond_p_holm=None,
        family=family,
        verdict=verdict,
        detectable=None,
    )


def annotated(c, family):
    n = len(c["diffs"])
    sd = statistics.stdev(c["diffs"]) if n >= 2 else 0
    power = smallest_effect(n, sd, family) if sd > 0 and family else None
    spread = equivalence_spread(n, c["margin"], max(family, 1)) if c["expect"] == "same" and n >= 2 else None
    return c | {"sd": sd if n >= 2 else None, "power": power, "equivalence_spread": spread}


# ----------------------------------------------------------------------------- results.md


def markdown(r, plots):
    L0, ex = r["block_size"], r["settings"]["extend"]
    parts = [
        f"# Context extension\n\nRoPE trained at L0 = {L0} tokens; test seeds {', '.join(map(str, r['seeds']))}"
        + (
            f" and selection seeds {', '.join(map(str, r['selection_seeds']))} (rates chosen on them)"
            if r["selection_seeds"]
            else ""
        )
        + ", admitted by the rule below. "
        f"Every arm fine-tuned {', '.join(map(str, r['steps']))} steps and read there; the claims read step "
        f"{r['read_step']}. Mean ± std over the test seeds. Compute: {r['train_s'] / 60:.1f} min of training "
        f"summed over the runs ({ex['workers']} at a time), evaluation besides; this command's wall time "
        f"{r['wall_s'] / 60:.1f} min (runs finished earlier are reused). Device {r['device']} "
        f"({r['settings']['train']['dtype']}), torch {r['environment']['torch']}, code "
        f"{r['environment']['code_version']}.",
        md_regime(r["regime"]),
        md_probe(r),
        md_screening(r),
        md_base(r),
        md_rates(r),
        md_bands(r),
        md_seeds(r),
        md_kmax(r),
        md_loss(r),
        md_plateaus(r, ex),
        md_claims(r),
        plots.section(),
    ]
    return "\n\n".join(parts) + "\n"


def md_probe(r):
    rows = [
        [
            W,
            e["cells"],
            e["trials"],
            "—" if e["floor"] is None else f"{e['floor']:.0%}",
            *(f"{e[name]['false_pass']:.2g} / {e[name]['false_fail']:.2g}" for name in THRESHOLDS),
        ]
        for W, e in r["error_rates"].items()
    ]
    return (
        f"## The probe and its readout\n\nWhole answers (both capitals of the asked needle's answer, the argmax "
        f"given the tokens before) to one query at the end of a window, its needle k tokens before it in a block of "
        f"{round(1 / r['chance'])} needles side by side, the block at every place it fits: a model that copies "
        f"some needle at random without reading the key scores {r['chance']:.0%} (chance). A cell holds the "
        f"queries of a span of distances; its floor is the best score of a copier that reads no key, by the "
        f"needle's recency rank (the window's edges among them) or by its place (the needle nearest a fixed "
        f"distance), exact, from the layout (each cell keeps them as `blind`), and at most twice chance in every "
        f"cell. Per seed and scored step, results.json keeps each cell's trials and hits (`cells`), so every band, "
        f"interval and k_max below can be recomputed.\n\n- **Bands**: the "
        f"accuracy over the distances inside L0, from L0 to s L0 (windows of s L0) and from s L0 to 2s L0 (windows "
        f"of 2s L0), with its 95% Clopper-Pearson interval and its floor; the retrieval claims test these.\n- "
        f"**k_max** (PI's effective window, its section 3.3, kept for the side-by-side with its Table 4): the "
        f"longest distance up to which every read cell ({r['per']} pooled) passes: its accuracy reaches "
        f"the threshold (PI's 20%, our 90%), as PI and RULER compare, and its interval lies wholly above its "
        f"floor. A cell is read only where a reader "
        f"right 97% of the time clears its floor more often than not.\n- **Effective length** (RULER's reading): "
        f"k_max at one reference for every arm, fixed in the config before the run: the gate's share of whole "
        f"answers ({r['reference']:.0%}), which every query slot of every included base model reached at L0, in "
        f"windows of 2s L0.\n\nWhat k_max gets "
        f"wrong at the trials used: false pass (the best model reading no key, right as often as the first read cell's "
        f"floor, reaches any distance) / false fail (a reader right 97% of the time misses the window).\n\n"
        + md_table(
            [
                "window",
                "cells",
                "trials a cell",
                "first cell's floor",
                *(f"k_max {th:.0%}: false pass / false fail" for th in THRESHOLDS.values()),
            ],
            rows,
        )
    )


def md_screening(r):
    gate, rows = r["base_gate"], []
    for role, x in r["screening"].items():
        for seed in x["screened"]:
            for name, seeds in r["base"].items():
                run = seeds[str(seed)]
                final = run["curve"][str(run["steps"])]
                rows.append(
                    [
                        role,
                        seed,
                        name,
                        run["gate"] or "not by the ceiling",
                        run["steps"],
                        pct(min(final["slot"].values())),
                        "yes" if run["passed"] else "no",
                        "yes" if seed in x["included"] else "no",
                    ]
                )
    counts = "; ".join(
        f"{role}: {len(x['screened'])} screened, {len(x['passed'])} passed, {len(x['included'])} included"
        for role, x in r["screening"].items()
    )
    ex = r["settings"]["extend"]
    return (
        f"## Who enters the comparisons: the gate\n\nA rule fixed in the config before the run: the test seeds are "
        f"the first {len(r['seeds'])} seeds from {r['settings']['train']['seed']} on, in order, whose base model "
        f"passes the gate"
        + (
            f", the selection seeds the first {ex['selection_seeds']} that pass from {ex['selection_seed']} on"
            if r["selection_seeds"]
            else ""
        )
        + ". A base model "
        f"passes when every query slot retrieves at least {gate:.0%} of whole answers at L0 (probed every "
        f"{ex['base_check']} steps at a constant rate, by step {r['settings']['train']['max_iters']}) and still "
        f"does after its rate's decay over {ex['base_decay']} steps. Bases are launched in order, only as far as "
        f"still needed, and a seed is included once it passed and every earlier seed is decided. Inclusion "
        f"depends on the base model alone, before any method touches it: every method is fine-tuned from the "
        f"same included bases, so the paired comparisons of methods stay unbiased (a seed is never kept or dropped "
        f"for what a method did on it). {counts}.\n\n"
        + md_table(
            [
                "role",
                "seed",
                "model",
                "gate passed at step",
                "steps trained",
                "worst slot, last probe",
                "passed",
                "included",
            ],
            rows,
            text_columns=3,
        )
    )


def md_base(r):
    rows = []
    for name, seeds in r["base"].items():
        for seed, run in seeds.items():
            for st, c in run["curve"].items():
                rows.append(
                    [
                        name,
                        seed,
                        st,
                        pct(min(c["slot"].values())),
                        pct(max(c["slot"].values())),
                        md_band(c["inside L0"]),
                        c["kmax"]["pi"],
                        c["kmax"]["strict"],
                        f"{c['loss']:.3f}",
                    ]
                )
    elim = ", ".join(f"{pct(v)}" for v in r["elimination"].values())
    return (
        f"## The base models' learning curves at L0\n\nThe slot probe queries every needle once in a random order, "
        f"earlier answers shown: elimination would score {elim} at slots 1 to {len(r['elimination'])}, a model "
        f"that reads the key the same at every slot.\n\n"
        + md_table(
            [
                "model",
                "seed",
                "step",
                "worst slot",
                "best slot",
                "inside L0 [95% CI]",
                "k_max 20%",
                "k_max 90%",
                "val loss at L0",
            ],
            rows,
            text_columns=2,
        )
    )


def md_rates(r):
    if not r["selection_seeds"]:
        rates = ", ".join(sorted({f"{x['lr']:g}" for x in r["finetune"].values()}))
        return f"## Fine-tuning rate\n\nOne rate for every arm, {rates}, fixed in the config: no seed chose it."
    keep = r["finetune_keep"]

    def highest_kept(shares):
        return max((lr for lr, share in shares.items() if share >= keep), key=float, default="none")

    rows = [
        [
            f"{x['base']:g}",
            f"{x['factor']:g}",
            x["method"],
            ", ".join(f"{lr}: {100 * f['least kept']:.1f}% / {f['loss']:.4f}" for lr, f in x["sweep"].items()),
            f"{x['lr']:g}",
            ", ".join(
                highest_kept({lr: min(f["kept"].values()) for lr, f in rates.items()})
                for rates in x["sweep_by_seed"].values()
            ),
        ]
        for x in r["finetune"].values()
    ]
    sels = ", ".join(map(str, r["selection_seeds"]))
    return (
        f"## Fine-tuning rates, chosen on seeds {sels}\n\nThe rule, fixed before the sweep ran: each arm's test "
        f"seeds fine-tune at the highest rate at which the selection seeds keep, averaged over them, at least "
        f"{pct(keep)} of their base models' retrieval inside L0 at every read step (the least of those steps' shares "
        f"below; the sweep widened upward where its highest rate kept it, downward where none did, and where none "
        f"did the lowest stands). Beside it each rate's loss at s L0 after {r['read_step']} steps, averaged over "
        f"the seeds (results.json keeps each seed's and each step's under `sweep_by_seed`). The last column is the "
        f"rate each selection seed would have chosen alone: where they differ, one seed would have decided it.\n\n"
        + md_table(
            ["base", "s", "method", "rate: least kept / loss at s L0", "chosen", "each seed's pick"],
            rows,
            text_columns=4,
        )
    )


def steps_of(r):
    return ["0", *map(str, r["steps"])]


def md_bands(r):
    rows = [
        [f"{x['factor']:g}", x["method"], name, *(pm(x["by_step"][st]["bands"][name], ".2f") for st in steps_of(r))]
        for x in r["finetune"].values()
        for name in BANDS
    ]
    return (
        "## Retrieval in distance bands against fine-tuning steps\n\nWhole answers over the distances of each band "
        "(the statistic the retrieval claims test), mean ± std over the test seeds.\n\n"
        + md_table(["s", "method", "band", *(f"step {st}" for st in steps_of(r))], rows, text_columns=3)
    )


def md_seeds(r):
    read, rows = str(r["read_step"]), []
    for x in r["finetune"].values():
        for seed, run in x["runs"].items():
            sc = run["scores"][read]
            rows.append(
                [
                    f"{x['factor']:g}",
                    x["method"],
                    seed,
                    *(md_band(sc["bands"][name]) for name in BANDS),
                    sc["kmax"]["pi"],
                    sc["kmax"]["strict"],
                    sc["effective"]["length"] if sc["effective"] else "—",
                ]
            )
    return (
        f"## Each seed after {read} steps\n\nBand accuracies with their 95% intervals, k_max (20%, 90%) in windows "
        f"of s L0 and the effective length in windows of 2s L0, in tokens.\n\n"
        + md_table(["s", "method", "seed", *BANDS, "k_max 20%", "k_max 90%", "effective length"], rows, text_columns=3)
    )


def md_band(b):
    return "—" if b is None else f"{b['accuracy']:.0%} [{b['ci'][0]:.0%}, {b['ci'][1]:.0%}], floor {b['floor']:.0%}"


def md_kmax(r):
    L0 = r["block_size"]

    def cell(k):
        return f"{pm(k['pi'], '.0f')} / {pm(k['strict'], '.0f')}"

    rows = [
        [
            f"{x['factor']:g}",
            x["method"],
            round(x["factor"] * L0),
            *(cell(x["by_step"][st]["kmax"]) for st in steps_of(r)),
            pm(x["by_step"][str(r["read_step"])]["effective"], ".0f"),
        ]
        for x in r["finetune"].values()
    ]
    read = [run["scores"][str(r["read_step"])] for x in r["finetune"].values() for run in x["runs"].values()]
    same = sum(sc["kmax"]["pi"] == papers_reach(sc["retrieval"]["target"]["cells"], THRESHOLDS["pi"]) for sc in read)
    # cell by cell, as PI reads each distance: like for like where k_max reads each cell alone
    agree = (
        f"PI's rule in its own words (every cell's accuracy at least {THRESHOLDS['pi']:.0%}, no floor read: "
        f"`lab.retrieval.papers_reach`) gives the same k_max at 20% as ours on {same} of {len(read)} fine-tunes at "
        f"step {r['read_step']}."
        if r["per"] == 1
        else ""
    )
    t4 = PI_TABLE4
    paper = [[name, *("–" if v is None else f"{v:,} ({v / t4['L0']:g} L0)" for v in t4[name])] for name in ("FT", "PI")]
    return (
        "## k_max beside PI's Table 4\n\nk_max at 20% (PI's) / at 90% (ours), in tokens, in windows of the target "
        "s L0 (as the PI paper spreads its distances over the target window), mean ± std over the test seeds; "
        "last, "
        f"the effective length after {r['read_step']} steps. Beside it, PI's Table 4 (LLaMA 7B, 2,048 → 8,192; "
        f"FT is direct fine-tuning), which reads k_max at equal steps as here. {agree}\n\n"
        + md_table(
            ["s", "method", "s L0", *(f"step {st}" for st in steps_of(r)), "effective length"], rows, text_columns=2
        )
        + "\n\n"
        + md_table(["PI's Table 4, 7B at 8,192", *(f"step {st:,}" for st in t4["steps"])], paper)
    )


def md_loss(r):
    rows = [
        [f"{x['factor']:g}", x["method"], L, *(pm(x["by_step"][st]["loss"][L], ".3f") for st in steps_of(r))]
        for x in r["finetune"].values()
        for L in x["by_step"]["0"]["loss"]
    ]
    worth = {(x["factor"], x["method"]): x["by_step"][str(r["read_step"])]["context"] for x in r["finetune"].values()}
    small = all(abs(w["mean"]) < CONTEXT_WORTH for w in worth.values())
    return (
        "## Val loss against fine-tuning steps at L0, s L0 and 2s L0\n\n"
        + md_table(["s", "method", "length", *(f"step {st}" for st in steps_of(r))], rows, text_columns=3)
        + f"\n\n**What context past L0 is worth on this text**, at step {r['read_step']}: the loss of the last L0/4 "
        f"tokens of the windows of s L0, read from their last L0 tokens alone minus read from the whole window (the "
        f"same tokens; positive: the longer context helps). "
        + (
            f"Below {CONTEXT_WORTH} nats for every arm: the loss claims at s L0 measure what a method costs the "
            "model at short range more than what it gains from the longer window (2s L0 is not measured)."
            if small
            else f"{CONTEXT_WORTH} nats or more for some arm: the longer window is worth something on this text."
        )
        + "\n\n"
        + md_table(
            ["s", "method", "L0 minus whole window (nats)"],
            [[f"{s:g}", m, pm(w, ".4f")] for (s, m), w in worth.items()],
            text_columns=2,
        )
    )


def md_plateaus(r, ex):
    rows = []
    for x in r["finetune"].values():
        runs = list(x["runs"].values())
        levelled = [run["plateau"] for run in runs if run["plateau"] is not None]
        memory = r["memory"][f"{x['method']} x{x['factor']:g}"]
        rows.append(
            [
                f"{x['factor']:g}",
                x["method"],
                f"{len(levelled)} of {len(runs)}",
                pm(mean_std(levelled), ".0f") if levelled else "—",
                f"{runs[0]['tokens']:,}",
                pm(mean_std(run["train_s"] for run in runs), ".0f"),
                f"{memory / 2**20:.1f}",
            ]
        )
    return (
        f"## Where the L0 loss levelled off (a secondary reading)\n\nThe first step where the loss at L0 fell by "
        f"less "
        f"than {ex['plateau_tol']} nats over the last {ex['plateau_span']} steps (measured every "
        f"{ex['finetune_eval']}), within the {r['read_step']} steps every arm runs; no verdict reads it. The rate "
        f"warms up over {ex['finetune_warmup']} steps and stays constant (the PI paper states a 20-step warmup and "
        f"no schedule after it). Memory: the bytes autograd saves for backward in one micro-batch of the run's "
        f"shape.\n\n"
        + md_table(
            ["s", "method", "levelled off", "at step", "tokens", "training seconds", "activation MiB"],
            rows,
            text_columns=2,
        )
    )


def pct(x):
    return f"{100 * x:.0f}%"


def p_text(p):
    return "—" if p is None else f"{p:.2g}"


def md_claims(r):
    claims, rows = r["claims"], []
    for c in claims:
        t, same = c["test"], c["expect"] == "same"
        ci = "—" if t["ci"] is None else f"[{t['ci'][0]:+.3f}, {t['ci'][1]:+.3f}]"
        if c["verdict"] == AT_FLOOR:
            tests = [("none: the comparator not above the band's floor", None, None)]
        elif same:  # its equivalence test where it could pass, and its test of lying beyond the margin
            tost = [(f"TOST ±{c['margin']:g}", c["equivalence_p"], c["equivalence_p_holm"])]
            tests = tost * (c["equivalence_p"] is not None) + [
                (f"beyond ±{c['margin']:g}", c["beyond_p"], c["beyond_p_holm"])
            ]
        else:
            tests = [(t["test"] or "—", t["p"], c["p_holm"])]
        columns = zip(*((name, p_text(p), p_text(holm)) for name, p, holm in tests), strict=True)
        test, p, holm = (" / ".join(column) for column in columns)
        power = ("—" if c["power"] is None else f"{c['power']:.3g}") + (
            f" (TOST can pass below sd {c['equivalence_spread']:.3g})" if same and c["equivalence_spread"] else ""
        )
        rows.append(
            [
                c["id"],
                c["claim"],
                f"{t['mean']:+.3f}",
                ci,
                test,
                p,
                holm,
                f"**{c['verdict']}**",
                len(c["diffs"]),
                "—" if c["sd"] is None else f"{c['sd']:.3g}",
                power,
            ]
        )
    family = claims[0]["family"] if claims else 0
    return (
        "## The papers' claims at this scale\n\nEach claim once, as per-seed differences A − B (loss in nats, "
        "band "
        "accuracy as a share), read after the same steps for every arm (step 0 for the claims about no "
        "fine-tuning): their mean, the 95% CI (unadjusted), the test (the paired t-test; the exact sign test "
        'where every seed gives the same difference; for a "same" claim its equivalence test, TOST within '
        f"±{SAME_MARGIN} nats, and its test of lying beyond that margin: twice the one-sided p against the "
        f"margin's edge on the mean's side, below 0.05 where the CI lies wholly beyond it) and its p, and p "
        f'Holm-adjusted over one family of {family} tests. "holds" needs p (Holm) < 0.05 on the expected side, '
        '"does not hold" on the other; a "same" claim holds when equivalence is shown and does not hold when its '
        'difference is shown to lie beyond the margin. A "same" claim\'s equivalence test runs only where it could '
        "pass with these seeds and the spread they show (stats.equivalence_can_pass, in this family); where it "
        f'cannot and no difference beyond the margin is shown, its CI stands against the margin ("{UNTESTED}"), '
        'and no verdict says "no difference". A band claim whose comparator\'s hits, pooled over the seeds, have no '
        "interval above the band's floor sets an arm against one that reads no key: it leaves the family "
        f'("{AT_FLOOR}"); a claim against the floor itself (band accuracy minus the floor, per seed) says whether '
        "an arm reads at all. The last columns: the spread "
        f"of the per-seed differences, and the smallest mean difference these seeds detect with {POWER:.0%} power "
        f"after Holm (at its strictest level, {ALPHA:g} / {family}), at that spread (stats.smallest_effect).\n\n"
        + md_table(
            [
                "id",
                "claim",
                "mean A − B",
                "95% CI (unadjusted)",
                "test",
                "p",
                "p (Holm)",
                "verdict",
                "seeds",
                "sd",
                f"detectable at {POWER:.0%} power",
            ],
            rows,
            text_columns=2,
        )
    )


# ----------------------------------------------------------------------------- plots


def write_plots(r, out):
    """The PNG plots in out (report.Plots: none without matplotlib): the band accuracies and the L0 loss against
    fine-tuning steps, retrieval by distance after the read step, and the base models' learning curves."""
    plots = Plots(out)
    if (plt := plots.plt) is None:
        return plots
    L0, steps, read = r["block_size"], [int(st) for st in steps_of(r)], str(r["read_step"])
    for b in r["bases"]:
        arms = [x for x in r["finetune"].values() if x["base"] == b]
        color = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(x["method"] for x in arms))}  # a method's, everywhere
        fig, axes = plt.subplots(2, len(r["factors"]), figsize=(6 * len(r["factors"]), 7), squeeze=False)
        for col, s in enumerate(r["factors"]):
            for x in (x for x in arms if x["factor"] == s):
                for name, style in zip(BANDS, ("o:", "o-", "x--"), strict=True):
                    axes[0, col].plot(
                        [max(st, 1) for st in steps],
                        [mean(x["by_step"][str(st)]["bands"][name]) for st in steps],
                        style,
                        color=color[x["method"]],
                        label=f"{x['method']}, {name}",
                    )
                for seed, run in x["runs"].items():
                    curve = sorted((int(st), v) for st, v in run["l0_curve"].items())
                    axes[1, col].plot(
                        [max(st, 1) for st, _ in curve],
                        [v for _, v in curve],
                        lw=0.8,
                        color=color[x["method"]],
                        label=x["method"] if seed == next(iter(x["runs"])) else None,
                    )
            axes[0, col].axhline(r["chance"], color="gray", linestyle=":")
            for ax in axes[:, col]:
                ax.set(xscale="log")
            dress(
                axes[0, col],
                f"s = {s:g}: whole answers by band (dotted: chance)",
                "fine-tuning step (0 drawn at 1)",
                "band accuracy, mean over seeds",
                legend="inside",
            )
            dress(
                axes[1, col],
                f"s = {s:g}: loss at L0 = {L0} while fine-tuning (each seed)",
                "fine-tuning step",
                "val loss at L0",
                legend="inside",
            )
        title = f"RoPE base {b:g}: retrieval by band and the L0 loss against fine-tuning steps"
        fig.suptitle(title)
        plots.save(fig, f"window_b{b:g}.png", title)
        panels = [
            (
                f"{x['method']} x{x['factor']:g}, step {read}",
                {
                    str(round(m * x["factor"] * L0)): shares(
                        [run["scores"][read]["retrieval"][where]["cells"] for run in x["runs"].values()]
                    )
                    for m, where in ((1, "target"), (2, "past"))
                },
            )
            for x in arms
        ]
        distance_plots(
            plots,
            panels,
            L0,
            r["chance"],
            f"retrieval_b{b:g}.png",
            f"RoPE base {b:g}: whole answers by distance after {read} steps (mean over seeds)",
        )
        # a panel a seed, at the probe that decided it (every probe's figures are in results.md's table): one per
        # probe made the figure grow with the screening, 70 panels and 1.1 MB for 10 seeds
        curve = [
            (f"seed {seed}, step {st}", {str(L0): shares([run["curve"][st]["counts"]["cells"]])})
            for seed, run in r["base"][f"rope-b{b:g}"].items()
            for st in [str(run["gate"] or run["steps"])]
        ]
        distance_plots(
            plots,
            curve,
            L0,
            r["chance"],
            f"learning_b{b:g}.png",
            f"RoPE base {b:g}: whole answers by distance at L0 where each base passed the gate (or its last probe)",
        )
    return plots


def mean(stat):
    """A mean_std's mean, nan (not drawn) for None."""
    return math.nan if stat is None else stat["mean"]
