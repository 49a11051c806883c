"""Statistics over seeds: mean and spread, the paired test, the equivalence test, Holm's correction, the verdict a
claim gets from them, and the smallest effect the seeds can detect. The distributions are scipy.stats'; Holm's
step-down is written here because scipy has none.

Every comparison in the lab is paired by seed (the runs of a seed see the same batches), so each is a test of the
per-seed differences A - B. A verdict follows the tests, never the means alone. The seeds of a table are fixed
before it is read: adding seeds because a p came out near alpha (optional stopping) would break the error rate.

  mean_std(values)                  {"mean", "std" (n - 1; None for one value), "values"}
  paired_test(diffs)                {"test": "paired t" | "sign (exact)" | None, "n", "mean",
                                     "ci": [lo, hi] (95% = 1 - ALPHA, unadjusted; None where t is undefined),
                                     "t" (None where undefined), "p" (two-sided; None under 2 seeds; never 0)}
  equivalence_test(diffs, margin)   p of the mean lying inside (-margin, +margin) (TOST); None under 2 seeds
  beyond_test(diffs, margin)        p of the mean lying beyond +-margin, on its mean's side; None under 2 seeds
  holm(ps)                          Holm-adjusted ps, same order; None stays None and is not counted
  verdicts(claims, alpha)           the claims with "test", "equivalence_p", "beyond_p", "p_holm",
                                    "equivalence_p_holm", "beyond_p_holm", "family" and "verdict" added
  detectable(diffs, family, alpha)  the smallest |mean difference| these seeds could show, or None

Planning, before a table is run (the paired t at Holm's strictest step, alpha / family, two-sided; the spread sd of
the per-seed differences taken from an earlier run):
  power(effect, sd, n, family)             the chance that n seeds detect a true mean difference of effect
  seeds_needed(effect, sd, family, target) the fewest seeds that detect effect with power target (80% unless told)
  smallest_effect(n, sd, family, target)   the smallest effect n seeds detect with power target
  equivalence_spread(n, margin, family)    the largest spread at which TOST within +-margin can pass at all
  equivalence_can_pass(n, sd, margin, family)   whether it can: where not, show the CI against the margin instead
"""

import itertools
import math
import statistics

from scipy import optimize, stats

ALPHA = 0.05  # the family-wise error rate of a claims table, kept by Holm's correction
POWER = 0.8  # the chance of detecting an effect that a table's number of seeds is chosen for
EXPECT = ("lower", "higher", "same")


def mean_std(values):
    """Mean and sample standard deviation (n - 1; None for a single value) of values."""
    values = list(values)
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "values": values,
    }


def paired_test(diffs):
    """Two-sided test that the per-seed differences have mean 0: Student's paired t-test, or where every
    difference is the same (no spread, t undefined) the exact sign test on the non-zero ones. The 95% interval
    is t-based and not adjusted for the family."""
    if not diffs:
        raise ValueError("diffs=[] must hold at least one per-seed difference")
    n, mean = len(diffs), statistics.fmean(diffs)
    out = {"test": None, "n": n, "mean": mean, "ci": None, "t": None, "p": None}
    if n < 2:
        return out
    if statistics.stdev(diffs) == 0:  # stdev is exact, so 0 means every seed moved by the same amount
        return out | {"test": "sign (exact)", "p": sign_p(diffs)}
    r = stats.ttest_1samp(diffs, 0.0)
    ci = r.confidence_interval(1 - ALPHA)
    return out | {
        "test": "paired t",
        "ci": [float(ci.low), float(ci.high)],
        "t": float(r.statistic),
        "p": float(r.pvalue),
    }


def sign_p(diffs):
    """Exact two-sided sign test: the count of positive differences among the non-zero ones against
    Binomial(m, 1/2); 1 where all are zero. Its smallest p is 2 * 0.5**m, so it is never 0."""
    nonzero = [d for d in diffs if d != 0]
    if not nonzero:
        return 1.0
    return float(stats.binomtest(sum(d > 0 for d in nonzero), len(nonzero), 0.5).pvalue)


def equivalence_test(diffs, margin):
    """Two one-sided tests (TOST) that the mean difference lies inside (-margin, +margin): the larger one-sided
    p of t-tests against -margin and +margin. With no spread, the exact version: each one-sided sign test
    counts all n differences on its side or none, so p = 0.5**n if they lie strictly inside, else 1."""
    if not margin > 0:
        raise ValueError(f"margin={margin} must be > 0")
    n = len(diffs)
    if n < 2:
        return None
    if statistics.stdev(diffs) == 0:
        return 0.5**n if abs(diffs[0]) < margin else 1.0
    above = stats.ttest_1samp(diffs, -margin, alternative="greater").pvalue
    below = stats.ttest_1samp(diffs, margin, alternative="less").pvalue
    return float(max(above, below))


def beyond_test(diffs, margin):
    """p of the mean difference lying beyond +-margin, on the side its mean lies: twice the one-sided p of the
    t-test against that side's edge (twice, because the data chose the side), so p < alpha exactly where the
    (1 - alpha) CI lies wholly beyond the margin. With no spread, the exact version: the sign test against that
    edge, 2 * 0.5**n where every difference lies beyond it, else 1. None under 2 seeds."""
    if not margin > 0:
        raise ValueError(f"margin={margin} must be > 0")
    n = len(diffs)
    if n < 2:
        return None
    mean = statistics.fmean(diffs)
    if statistics.stdev(diffs) == 0:
        return min(1.0, 2 * 0.5**n) if abs(diffs[0]) > margin else 1.0
    side = "greater" if mean > 0 else "less"
    return float(min(1.0, 2 * stats.ttest_1samp(diffs, math.copysign(margin, mean), alternative=side).pvalue))


def holm(ps):
    """Holm's step-down adjustment of the p-values ps (a family of tests, in any order; None stays None and is
    not counted): the k-th smallest is multiplied by (m - k + 1), kept monotone and at most 1. Rejecting where the
    adjusted p is below alpha keeps the chance of any false rejection in the family at alpha."""
    ranked = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    out, running = list(ps), 0.0
    for k, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - k) * p))
        out[i] = running
    return out


def verdicts(claims, alpha=ALPHA):
    """Judge a table of claims {"diffs": per-seed A - B, "expect": "lower" (A below B), "higher", or "same"
    (|A - B| within "margin"), "margin": optional for "lower"/"higher", required for "same"}.

    One Holm family per table, of the tests that decide a verdict: a "lower"/"higher" claim gives its paired test
    and, with a margin, its equivalence test too; a "same" claim gives its test of lying beyond the margin
    (beyond_test) and its equivalence test, unless "tost" is False (where it cannot pass at these seeds); its
    paired test is shown, with "p_holm" None. Tests with p None (under 2 seeds) are not counted. Verdicts, at alpha
    after Holm:
      holds          the difference is on the expected side, or equivalence shown for "same";
      does not hold  the difference is on the other side, equivalence shown where a difference was expected, or
                     for "same" the difference shown to lie beyond the margin;
      inconclusive   neither.
    Returns new dicts: each claim with "test" (paired_test), "equivalence_p" (None without a margin), "beyond_p"
    (None but for "same"), "p_holm", "equivalence_p_holm", "beyond_p_holm", "family" (the number of tests in the
    table's Holm family, the same on every claim), "verdict" and "detectable" (the smallest difference its seeds
    could settle in this family)."""
    out, n = [judged(c) for c in claims], len(claims)
    differences = [None if c["expect"] == "same" else c["test"]["p"] for c in out]
    adjusted = holm(differences + [c["equivalence_p"] for c in out] + [c["beyond_p"] for c in out])
    family = sum(p is not None for p in adjusted)
    for c, p, q, b in zip(out, adjusted[:n], adjusted[n : 2 * n], adjusted[2 * n :], strict=True):
        differs, same, beyond = (x is not None and x < alpha for x in (p, q, b))
        c |= {
            "p_holm": p,
            "equivalence_p_holm": q,
            "beyond_p_holm": b,
            "family": family,
            "verdict": verdict(c["expect"], c["test"]["mean"], differs, same, beyond),
            "detectable": detectable(c["diffs"], family, alpha) if family else None,
        }
    return out


def judged(claim):
    """The claim with its paired test and equivalence p; bad expect or margin raises ValueError."""
    expect, margin = claim["expect"], claim.get("margin")
    if expect not in EXPECT:
        raise ValueError(f"expect={expect!r} must be one of {EXPECT}")
    if expect == "same" and margin is None:
        raise ValueError("expect='same' needs a margin > 0")
    tost = margin is not None and claim.get("tost", True)
    equivalence = equivalence_test(claim["diffs"], margin) if tost else None
    beyond = beyond_test(claim["diffs"], margin) if expect == "same" else None
    return dict(claim, test=paired_test(claim["diffs"]), equivalence_p=equivalence, beyond_p=beyond)


def verdict(expect, mean, differs, same, beyond=False):
    """The verdict from the claim's side, its mean and which of its tests rejected (see verdicts)."""
    if expect == "same":
        return "holds" if same else "does not hold" if beyond else "inconclusive"
    if differs:
        return "holds" if ("lower" if mean < 0 else "higher") == expect else "does not hold"
    return "does not hold" if same else "inconclusive"


def detectable(diffs, family, alpha=ALPHA):
    """The smallest |mean difference| that would reach p < alpha / family (Holm's strictest step) with these
    seeds: t_{1 - alpha / (2 family), n - 1} * sd / sqrt(n) for the paired t-test at this n and sample sd. With
    no spread the sign test decides: 0.0 if its smallest p, 2 * 0.5**n, is below alpha / family, else None (no
    effect can be settled with this many seeds: 5 give 0.0625). None under 2 seeds."""
    if not (isinstance(family, int) and family >= 1):
        raise ValueError(f"family={family!r} must be an integer >= 1")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must lie in (0, 1)")
    n = len(diffs)
    if n < 2:
        return None
    sd, level = statistics.stdev(diffs), alpha / family
    if sd == 0:
        return 0.0 if 2 * 0.5**n < level else None
    return float(stats.t.ppf(1 - level / 2, n - 1)) * sd / math.sqrt(n)


def power(effect, sd, n, family=1, alpha=ALPHA):
    """The chance that the two-sided paired t-test of n seeds rejects at alpha / family (Holm's strictest step)
    when the per-seed differences have mean effect and spread sd: the noncentral t's mass beyond the critical t."""
    df, level = planned(n, family, alpha, sd=sd)
    critical, shift = stats.t.isf(level / 2, df), effect * math.sqrt(n) / sd
    # the wrong side's tail as its mirror image: scipy's nct.cdf far below the shift can return nan, its sf does not
    return float(stats.nct.sf(critical, df, shift) + stats.nct.sf(critical, df, -shift))


def seeds_needed(effect, sd, family=1, target=POWER, alpha=ALPHA):
    """The fewest seeds (at least 2) whose paired t-test detects a mean difference of effect with power target."""
    if not effect > 0:
        raise ValueError(f"effect={effect} must be > 0")
    return next(n for n in itertools.count(2) if power(effect, sd, n, family, alpha) >= target)


def smallest_effect(n, sd, family=1, target=POWER, alpha=ALPHA):
    """The smallest mean difference that n seeds detect with power target (power inverted in effect)."""
    high = sd
    while power(high, sd, n, family, alpha) < target:
        high *= 2
    return float(optimize.brentq(lambda e: power(e, sd, n, family, alpha) - target, 0.0, high, xtol=1e-12 * high))


def equivalence_spread(n, margin, family=1, alpha=ALPHA):
    """The largest spread sd of n per-seed differences at which the equivalence test (TOST within +-margin) can
    pass at alpha / family: its best case, a mean of exactly 0, gives p = P(t_{n-1} > margin sqrt(n) / sd)."""
    df, level = planned(n, family, alpha, margin=margin)
    return float(margin * math.sqrt(n) / stats.t.isf(level, df))


def equivalence_can_pass(n, sd, margin, family=1, alpha=ALPHA):
    """Whether TOST within +-margin can pass with n seeds whose differences spread sd; where it cannot, a table
    shows the difference's CI against the margin instead of a test that cannot say "no difference"."""
    return sd < equivalence_spread(n, margin, family, alpha)


def planned(n, family, alpha, **positive):
    """(degrees of freedom, Holm's strictest level alpha / family) of a planned t-test of n seeds; bad input raises
    ValueError, as does any of positive (e.g. sd=...) that is not > 0."""
    if not (isinstance(n, int) and n >= 2):
        raise ValueError(f"n={n!r} must be an integer >= 2: a t-test needs two seeds")
    if not (isinstance(family, int) and family >= 1):
        raise ValueError(f"family={family!r} must be an integer >= 1")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must lie in (0, 1)")
    for name, value in positive.items():
        if not value > 0:
            raise ValueError(f"{name}={value} must be > 0")
    return n - 1, alpha / family
