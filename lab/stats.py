"""Statistics over seeds: mean and spread, the paired t-test, Holm's correction, the equivalence test, and the
verdict a claim gets from them. Student's t distribution is written here (scipy is not a dependency).

Every comparison in the lab is paired by seed (the runs of a seed see the same batches), so each is a test of the
per-seed differences. A verdict follows the test, never the means alone.
"""

import functools
import math
import statistics

def t_cdf(t, df, steps=1000):
    """P(T <= t) for Student's t with df degrees of freedom.

    x = sqrt(df) tan(u) turns the density Gamma((df+1)/2) / (sqrt(df pi) Gamma(df/2)) (1 + x^2/df)^(-(df+1)/2) dx
    into Gamma((df+1)/2) / (sqrt(pi) Gamma(df/2)) cos(u)^(df-1) du, bounded and smooth on [0, pi/2], so
    Simpson's rule over [0, atan(|t|/sqrt(df))] integrates it with no special functions; at the default
    steps it agrees with the closed forms of df = 1 and 2 to 1e-10 (tests/test_report.py checks it)."""
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


# ----------------------------------------------------------------------------- verdicts

ALPHA = 0.05  # the family-wise error rate of a claims table, kept by Holm's correction
UNSETTLED = (0.01, 0.1)  # a raw p in this band asks for more seeds before a verdict is read (5 where 3 were run)


def holm(ps):
    """Holm's step-down adjustment of the p-values ps (a family of tests, in any order; None stays None): the
    k-th smallest is multiplied by (m - k + 1), kept monotone and at most 1. Rejecting where the adjusted p is
    below alpha keeps the chance of any false rejection in the family at alpha."""
    ranked = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    out, running = list(ps), 0.0
    for k, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - k) * p))
        out[i] = running
    return out


def equivalence_test(diffs, margin):
    """Two one-sided t-tests (TOST) that the mean paired difference lies inside (-margin, +margin): the larger of
    the two one-sided p-values (None with fewer than 2 seeds or no spread to measure)."""
    n = len(diffs)
    if n < 2 or statistics.stdev(diffs) == 0:
        return None
    mean, se = statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(n)
    return max(1 - t_cdf((mean + margin) / se, n - 1), t_cdf((mean - margin) / se, n - 1))


def verdicts(claims, alpha=ALPHA):
    """Each claim {"diffs": per-seed A - B, "expect": "lower" (A below B), "higher", or "same" (|A - B| within
    "margin"), "margin": optional} gets its paired test, its equivalence test where a margin is stated, p-values
    Holm-adjusted over every test of the table, and a verdict:
      holds          the difference is on the expected side ("lower"/"higher"), or equivalence shown ("same");
      does not hold  the difference is on the other side, or equivalence shown where a difference was expected,
                     or a difference shown where none was;
      inconclusive   neither, at alpha after Holm; a raw p inside UNSETTLED asks for more seeds.
    Returns the claims with "test", "equivalence_p", "p_holm", "equivalence_p_holm" and "verdict" added."""
    out = [dict(c, test=paired_test(c["diffs"]),
                equivalence_p=equivalence_test(c["diffs"], c["margin"]) if c.get("margin") else None) for c in claims]
    adjusted = holm([c["test"]["p"] for c in out] + [c["equivalence_p"] for c in out])
    for c, p, q in zip(out, adjusted, adjusted[len(out):]):
        c["p_holm"], c["equivalence_p_holm"] = p, q
        differs = p is not None and p < alpha
        same = q is not None and q < alpha
        side = "lower" if c["test"]["mean"] < 0 else "higher"
        if c["expect"] == "same":
            c["verdict"] = "holds" if same else "does not hold" if differs else "inconclusive"
        elif differs:
            c["verdict"] = "holds" if side == c["expect"] else "does not hold"
        else:
            c["verdict"] = "does not hold" if same else "inconclusive"
        c["more_seeds"] = c["test"]["p"] is not None and UNSETTLED[0] <= c["test"]["p"] <= UNSETTLED[1]
    return out
