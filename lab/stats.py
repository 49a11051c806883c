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
