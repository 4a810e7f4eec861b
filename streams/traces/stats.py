"""Statistics the trace analysis reports the way pandas computes them (HTA's numbers come from pandas)."""

from __future__ import annotations

import math


def quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of ``ordered`` (sorted, not empty) with linear interpolation between
    the two nearest values: pandas' and numpy's default."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
