"""Small statistics the benches share: a mean with its 95% t-interval, and a curve read at a
target (bench/ is not a package; its scripts put this folder on sys.path)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# two-sided 95% Student t quantiles by sample size (n - 1 degrees of freedom)
_T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for one value; nan for none)."""
    values = [v for v in values if v is not None and v == v]
    if not values:
        return math.nan, math.nan
    if len(values) == 1:
        return values[0], 0.0
    t = _T95.get(len(values), 2.0)
    return statistics.fmean(values), t * statistics.stdev(values) / math.sqrt(len(values))


def first_crossing(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The x at which a curve of (x, y) points, in x order, first reaches y >= target, linear
    between points; None when it never does."""
    previous = None
    for x, y in points:
        if y >= target:
            if previous is None or previous[1] >= target:
                return x
            x0, y0 = previous
            return x0 + (x - x0) * (target - y0) / (y - y0)
        previous = (x, y)
    return None


def value_at(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """y of a curve of (x, y) points at `x`, linear between points; None outside the curve."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None
