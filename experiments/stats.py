"""
The statistics the experiments share: Student-t intervals over seeds, verdicts, ratios, and a least-squares trend over
budgets with where it reaches 0.
"""
import math

import numpy as np


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
       15: 2.13, 20: 2.09, 30: 2.04}  # Student's t, two-sided 95%, by degrees of freedom


def t95(df):
    """Student's t for a two-sided 95% interval; between the table's entries, the next smaller df's (wider)."""
    return T95[max(k for k in T95 if k <= df)] if df < 60 else 1.96


def interval(xs):
    """(mean, sd, half-width of the 95% t-interval of the mean) of a list; sd and half-width are None for one value."""
    m = float(np.mean(xs))
    if len(xs) < 2:
        return m, None, None
    sd = float(np.std(xs, ddof=1))
    return m, sd, t95(len(xs) - 1) * sd / math.sqrt(len(xs))


def fmt(xs, signed=False, places=1):
    """A list of values as "mean ± sd", or with signed=True, for differences, "+mean [95% interval]"."""
    m, sd, hw = interval(xs)
    f = f"{'+' * signed}.{places}f"
    if sd is None:
        return f"{m:{f}} (1 seed)"
    return f"{m:{f}} [{m - hw:{f}}, {m + hw:{f}}]" if signed else f"{m:{f}} ± {sd:.{places}f}"


def fmt_ratio(ratios):
    """Ratios (one per seed pair) as their geometric mean with a 95% interval, "1.52x [1.31x, 1.77x]": the t-interval
    of the mean log ratio, taken back to a ratio, so that a/b and b/a get mirrored intervals."""
    m, _, hw = interval(np.log(ratios))
    if hw is None:
        return f"{math.exp(m):.2f}x (1 seed)"
    return f"{math.exp(m):.2f}x [{math.exp(m - hw):.2f}x, {math.exp(m + hw):.2f}x]"


def trend(points):
    """The least-squares line through (log2 FLOPs, trained − init) points, one per training seed and budget: its slope
    in points per doubling of FLOPs, with a 95% half-width, and the log2 FLOPs where it crosses 0, with a 95%
    half-width (delta method; None for a flat line). None for fewer than 3 points or one budget. The crossing is an
    extrapolation when it lies beyond the budgets measured: the line is an assumption there, so the range is a lower
    bound on the uncertainty."""
    x, y = np.log2([p[0] for p in points]), np.array([p[1] for p in points], dtype=float)
    if len(x) < 3 or len(set(x)) < 2:
        return None
    xm, ym = x.mean(), y.mean()
    sxx = ((x - xm) ** 2).sum()
    slope = ((x - xm) * (y - ym)).sum() / sxx
    s2 = ((y - ym - slope * (x - xm)) ** 2).sum() / (len(x) - 2)  # the residual variance
    t = t95(len(x) - 2)
    slope_hw = t * math.sqrt(s2 / sxx)
    if slope == 0:
        return slope, slope_hw, None, None
    x0 = xm - ym / slope  # where the line is 0; the mean and the slope of a centred fit are independent
    x0_hw = t * math.sqrt(s2 / len(x) / slope ** 2 + ym ** 2 * s2 / sxx / slope ** 4)
    return float(slope), slope_hw, float(x0), x0_hw


def verdict(diffs):
    """Where the 95% interval of a list of differences lies: above 0, below 0, or around it."""
    m, _, hw = interval(diffs)
    if hw is None:
        return "one seed: no interval"
    return "above" if m - hw > 0 else "below" if m + hw < 0 else "not distinguishable"
