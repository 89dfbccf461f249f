"""Numbers as the book prints them: the one rule for how many digits an estimate and its interval get.

An estimate is printed to the precision its interval supports: the interval's width shown with two
significant digits (:func:`decimals`). A geometric-mean ratio with an interval of about ±10 %
(``[0.90, 1.10]``, width 0.2) gets two decimals, ``1.00 [0.90, 1.10]``; a KL of about 0.01 nats known to
±0.002 gets four, ``0.0123 [0.0105, 0.0146]``. A point-like interval -- one whose two ends print the same at
three significant digits (every document gave the same value, or nearly: ``1.000000 [0.999999, 1.000001]``) --
prints with three significant digits instead, ``1.00 [1.00, 1.00]``: digits beyond those would only show
rounding noise. Tables (:mod:`jacap_lib.viz.evaluation`) and
the generated findings (:mod:`jacap_lib.report.findings`) both use :func:`interval_text`.
"""
from __future__ import annotations

import math

from jacap_lib._checks import real

__all__ = ["decimals", "interval_text", "plain"]

MAX_DECIMALS = 6


def _significant3(value: float) -> int:
    """Decimals that show ``value`` with three significant digits (0 for 0)."""
    return 2 - math.floor(math.log10(abs(value))) if value else 0


def decimals(low, high, estimate=None) -> int:
    """Decimals that show the interval ``[low, high]`` with two significant digits of its width:
    ``max(0, 1 - floor(log10(high - low)))`` (width 0.2 -> 2, 0.02 -> 3, 3.5 -> 1, 35 -> 0). A point-like
    interval -- its ends equal when printed with three significant digits of the largest of ``|estimate|``,
    ``|low|``, ``|high|`` (a zero width included) -- takes those three significant digits instead; at most 6."""
    lo, hi = real("low", low), real("high", high)
    if lo > hi:
        raise ValueError(f"low {lo} is above high {hi}; pass the interval as (low, high)")
    ref = max(abs(lo), abs(hi), abs(real("estimate", estimate)) if estimate is not None else 0.0)
    d3 = min(MAX_DECIMALS, max(0, _significant3(ref)))
    if plain(lo, d3) == plain(hi, d3):  # a point at the precision three significant digits give
        return int(d3)
    return int(min(MAX_DECIMALS, max(0, 1 - math.floor(math.log10(hi - lo)))))


def plain(x, digits: int) -> str:
    """``x`` with ``digits`` decimals, a minus sign (−) for negatives and no ``-0``."""
    s = f"{real('x', x):.{int(digits)}f}"
    if float(s) == 0:
        s = s.lstrip("-")
    return s.replace("-", "−")


def interval_text(estimate, low, high, *, scale: float = 1.0, unit: str = "") -> str:
    """``"1.19 [1.04, 1.40]"``: the estimate and its interval, all at :func:`decimals` of the (scaled)
    interval. ``scale`` multiplies every value first (100 for percent); ``unit`` is appended after the
    bracket (``" %"``)."""
    s = real("scale", scale)
    est, lo, hi = (real(n, v) * s for n, v in (("estimate", estimate), ("low", low), ("high", high)))
    d = decimals(lo, hi, est)
    return f"{plain(est, d)} [{plain(lo, d)}, {plain(hi, d)}]{unit}"
