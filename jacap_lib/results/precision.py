"""Numbers as the book prints them: the one rule for how many digits an estimate and its interval get.

An estimate is printed to the precision its interval supports: the interval's width shown with two
significant digits (:func:`decimals`). A geometric-mean ratio with an interval of about ±10 %
(``[0.90, 1.10]``, width 0.2) gets two decimals, ``1.00 [0.90, 1.10]``; a KL of about 0.01 nats known to
±0.002 gets four, ``0.0123 [0.0105, 0.0146]``. An interval of zero width (every document gave the same
value; a width below 1e-9 of the values is rounding and counts as zero) falls back to three significant digits of the estimate. Tables (:mod:`jacap_lib.viz.evaluation`) and
the generated findings (:mod:`jacap_lib.results.findings`) both use :func:`interval_text`.
"""
from __future__ import annotations

import math

__all__ = ["decimals", "interval_text", "plain"]

MAX_DECIMALS = 6


def _finite(name: str, x) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {x!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return v


def decimals(low, high, estimate=None) -> int:
    """Decimals that show the interval ``[low, high]`` with two significant digits of its width:
    ``max(0, 1 - floor(log10(high - low)))`` (width 0.2 -> 2, 0.02 -> 3, 3.5 -> 1, 35 -> 0). A zero-width
    interval (or one narrower than 1e-9 of its ends) takes three significant digits of ``estimate`` (of ``high`` without one); at most 6."""
    lo, hi = _finite("low", low), _finite("high", high)
    if lo > hi:
        raise ValueError(f"low {lo} is above high {hi}; pass the interval as (low, high)")
    width = hi - lo
    if width > 1e-9 * max(abs(lo), abs(hi)):  # narrower than that is rounding: a point
        d = 1 - math.floor(math.log10(width))
    else:
        ref = abs(_finite("estimate", estimate) if estimate is not None else hi)
        d = 2 - math.floor(math.log10(ref)) if ref > 0 else 0
    return int(min(MAX_DECIMALS, max(0, d)))


def plain(x, digits: int) -> str:
    """``x`` with ``digits`` decimals, a minus sign (−) for negatives and no ``-0``."""
    s = f"{_finite('x', x):.{int(digits)}f}"
    if float(s) == 0:
        s = s.lstrip("-")
    return s.replace("-", "−")


def interval_text(estimate, low, high, *, scale: float = 1.0, unit: str = "") -> str:
    """``"1.19 [1.04, 1.40]"``: the estimate and its interval, all at :func:`decimals` of the (scaled)
    interval. ``scale`` multiplies every value first (100 for percent); ``unit`` is appended after the
    bracket (``" %"``)."""
    s = _finite("scale", scale)
    est, lo, hi = (_finite(n, v) * s for n, v in (("estimate", estimate), ("low", low), ("high", high)))
    d = decimals(lo, hi, est)
    return f"{plain(est, d)} [{plain(lo, d)}, {plain(hi, d)}]{unit}"
