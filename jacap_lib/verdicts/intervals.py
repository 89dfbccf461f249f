"""Verdicts from intervals: paired per-document comparisons of a method's KL with a reference's KL.

For one cell (a prompt length, a compression ratio, a method and its reference) the inputs are two
equally long arrays of per-document KL values, ``method_kl[i]`` and ``reference_kl[i]`` measured on the
same document ``i``. Everything here is paired: a bootstrap resample draws *documents* (with
replacement) and keeps each document's two values together.

* :func:`geometric_mean_ratio` — ``exp(mean(log(method_kl / reference_kl)))``, the geometric mean of the
  per-document ratios (the primary statistic: each document counts the same, whatever its KL scale), with
  a 95 % bootstrap interval.
* :func:`mean_ratio` — ``mean(method_kl) / mean(reference_kl)``, the ratio of mean KLs (documents with large
  KL weigh more), with a 95 % paired bootstrap interval.
* Intervals: ``scipy.stats.bootstrap`` with ``method="BCa"`` (bias-corrected and accelerated) by default,
  ``n_resamples=9999``, a fixed seed (``numpy.random.default_rng(seed)``); ``method="percentile"`` is the
  alternative. The geometric-mean interval is the bootstrap interval of the mean log ratio, exponentiated
  (both BCa and percentile intervals carry over through the monotone ``exp``).
* :func:`wilcoxon_p` — two-sided Wilcoxon signed-rank p-value of the log ratios (``scipy.stats.wilcoxon``;
  exact for n ≤ 50 without ties or zeros).
* :func:`holm` — Holm's step-down adjustment of a family of p-values (controls the family-wise error rate).
* The family-wise correction of this book: over the m cells of one comparison (one table), the Wilcoxon
  p-values are Holm-adjusted, and each cell's geometric-mean interval is also computed at the simultaneous
  (Bonferroni) level ``1 − (1 − confidence) / m`` (:func:`simultaneous_confidence`): all m such intervals
  hold their true ratios at once with probability at least ``confidence``. :func:`compare_cells` writes the
  cell's verdict sentence from that adjusted interval (``verdict``) and keeps the cell's own 95 % interval
  and its sentence beside it (``gm_low``/``gm_high``, ``verdict_unadjusted``), with whether the Wilcoxon
  difference survives Holm at ``alpha`` (``holm_significant``), so a reader sees all three. (Bonferroni,
  not Holm-consistent intervals: simpler, and a little more conservative than Holm's test.)
* :func:`verdict` — the one function that turns an interval into the sentence the chapters print: a ratio
  interval (``scale="ratio"``, lower is better) or a difference in percentage points (``scale="points"``,
  higher is better).
* Paired 0/1 outcomes (the needle retrieval of :mod:`jacap_lib.experiments.needle`: right or wrong per prompt):
  :func:`accuracy_difference` (method − reference in points, paired bootstrap interval, prompts resampled),
  :func:`mcnemar_p` (exact McNemar test on the discordant prompts), :func:`accuracy_interval` (one setting's
  accuracy with its Wilson interval). With 20 or so 0/1 outcomes a bootstrap interval of the difference is
  too coarse to judge by, so their verdict is the exact test's (:func:`mcnemar_verdict`: "better" or "worse"
  only where the Holm-adjusted McNemar p is at most ``alpha``); the interval stays as a description.
* Planning (power): :func:`paired_power` — the power of the two-sided paired test of a mean log ratio at the
  Bonferroni level ``alpha / m`` for a true mean log ratio, given the per-document log ratios' standard
  deviation and n documents (noncentral t, or the normal approximation); :func:`detectable_ratio` — the
  geometric-mean ratio that test detects with a given power (80 % by default).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

__all__ = ["RatioInterval", "DifferenceInterval", "log_ratios", "geometric_mean_ratio", "work_ratio", "geometric_mean", "mean_ratio", "wilcoxon_p", "holm",
           "verdict", "simultaneous_confidence", "compare_cells", "accuracy_difference", "mcnemar_p",
           "accuracy_interval", "mcnemar_verdict", "paired_power", "detectable_ratio",
           "DIFFERENCE_METHOD", "N_RESAMPLES", "CONFIDENCE", "SEED", "METHOD"]

KL_FLOOR = 1e-8  # nats; a KL below it (a cache that changes nothing) counts as KL_FLOOR in the log
N_RESAMPLES = 9999
CONFIDENCE = 0.95
SEED = 0
METHOD = "BCa"
_METHODS = ("BCa", "percentile")


@dataclass(frozen=True)
class _Interval:
    """A paired statistic, its bootstrap interval and how it was computed."""
    statistic: str          # e.g. "geometric-mean ratio", "mean-KL ratio", "accuracy difference (points)"
    estimate: float
    low: float
    high: float
    confidence: float
    method: str             # "BCa" or "percentile"
    n: int                  # documents (KL) or prompts (0/1 outcomes)
    n_resamples: int
    seed: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RatioInterval(_Interval):
    """A ratio (method / reference; below 1 = the method's KL is lower) and its bootstrap interval."""


def _kl(name: str, x) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 1-D sequence of numbers (one KL per document), got {type(x).__name__}") from None
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one KL per document), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        bad = np.flatnonzero(~np.isfinite(a))[:5].tolist()
        raise ValueError(f"{name} has non-finite values (NaN or inf) at positions {bad}; drop or recompute "
                         "those documents in both arrays")
    if np.any(a <= 0):
        bad = np.flatnonzero(a <= 0)[:5].tolist()
        raise ValueError(f"{name} must be positive (a KL of 0 has no log ratio) but is <= 0 at positions {bad}; "
                         "floor it (at rowstats.KL_FLOOR, 1e-8 nats, as the protocol does) in both arrays or drop "
                         "those documents")
    return a


def log_ratios(method_kl, reference_kl) -> np.ndarray:
    """``log(method_kl / reference_kl)`` per document, after checking the pair: 1-D, equal length (≥ 3),
    finite, positive. Negative = the method's KL is lower on that document."""
    m, r = _kl("method_kl", method_kl), _kl("reference_kl", reference_kl)
    if m.shape != r.shape:
        raise ValueError(f"method_kl and reference_kl must have the same length (paired per document), got "
                         f"{m.size} and {r.size}")
    if m.size < 3:
        raise ValueError(f"method_kl: a paired bootstrap needs at least 3 documents, got {m.size}")
    return np.log(m) - np.log(r)


def _options(confidence, n_resamples, method):
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence!r}")
    if not (isinstance(n_resamples, (int, np.integer)) and n_resamples >= 100):
        raise ValueError(f"n_resamples must be an integer >= 100, got {n_resamples!r}")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")


def _bootstrap(data, statistic, *, paired, confidence, n_resamples, method, seed):
    from scipy.stats import bootstrap

    res = bootstrap(data, statistic, paired=paired, vectorized=True, n_resamples=n_resamples,
                    confidence_level=confidence, method=method, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def geometric_mean_ratio(method_kl, reference_kl, *, confidence: float = CONFIDENCE,
                         n_resamples: int = N_RESAMPLES, method: str = METHOD, seed: int = SEED) -> RatioInterval:
    """Geometric mean of the per-document KL ratios and its bootstrap interval (documents resampled)."""
    d = log_ratios(method_kl, reference_kl)
    _options(confidence, n_resamples, method)
    est = float(np.mean(d))
    if np.ptp(d) <= 1e-12:  # every document gives the same ratio (to rounding): no spread to resample
        lo = hi = est
    else:
        lo, hi = _bootstrap((d,), lambda x, axis: np.mean(x, axis=axis), paired=False, confidence=confidence,
                            n_resamples=n_resamples, method=method, seed=seed)
    return RatioInterval("geometric-mean ratio", math.exp(est), math.exp(lo), math.exp(hi), confidence, method,
                         int(d.size), int(n_resamples), int(seed))


def work_ratio(method_kl, reference_kl, works, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
               method: str = METHOD, seed: int = SEED) -> RatioInterval:
    """:func:`geometric_mean_ratio` when documents come in clusters (``works``: one label per document, e.g. the
    excerpts of one novel): the same estimate, the geometric mean of the per-document KL ratios, with a bootstrap
    interval that resamples *works*, every document of a drawn work together (the statistic of a resample is its
    works' summed log ratios over their document count). With one document per work it is the documents' bootstrap.
    ``n`` of the result counts works, the independent units."""
    d = log_ratios(method_kl, reference_kl)
    labels = np.asarray(works, dtype=object)
    if labels.shape != d.shape:
        raise ValueError(f"works must give one label per document ({d.size}), got {labels.size}")
    _options(confidence, n_resamples, method)
    names = list(dict.fromkeys(labels.tolist()))
    if len(names) < 3:
        raise ValueError(f"works: a bootstrap over works needs at least 3 works, got {len(names)}")
    sums = np.array([d[labels == w].sum() for w in names])
    counts = np.array([float((labels == w).sum()) for w in names])
    est = float(np.mean(d))
    if np.ptp(d) <= 1e-12:
        lo = hi = est
    else:
        lo, hi = _bootstrap((sums, counts), lambda a, b, axis: a.sum(axis=axis) / b.sum(axis=axis), paired=True,
                            confidence=confidence, n_resamples=n_resamples, method=method, seed=seed)
    return RatioInterval("geometric-mean ratio (works resampled)", math.exp(est), math.exp(lo), math.exp(hi),
                         confidence, method, len(names), int(n_resamples), int(seed))


def geometric_mean(kl, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES, method: str = METHOD,
                   seed: int = SEED) -> RatioInterval:
    """Geometric mean of one method's per-document KLs in one cell and its bootstrap interval (documents
    resampled): the typical KL, the ratio of :func:`geometric_mean_ratio` to a reference of 1 nat."""
    gm = geometric_mean_ratio(kl, np.ones(np.shape(kl)), confidence=confidence, n_resamples=n_resamples,
                              method=method, seed=seed)
    return replace(gm, statistic="geometric-mean KL")


def mean_ratio(method_kl, reference_kl, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
               method: str = METHOD, seed: int = SEED) -> RatioInterval:
    """``mean(method_kl) / mean(reference_kl)`` and its paired bootstrap interval (documents resampled,
    each document's two KLs kept together)."""
    log_ratios(method_kl, reference_kl)
    _options(confidence, n_resamples, method)
    m, r = np.asarray(method_kl, float), np.asarray(reference_kl, float)
    est = float(m.mean() / r.mean())
    q = m / r
    if np.ptp(q) <= 1e-12 * abs(float(q.mean())):  # the same ratio k on every document: every resample gives k
        lo = hi = est
    else:
        lo, hi = _bootstrap((m, r), lambda a, b, axis: np.mean(a, axis=axis) / np.mean(b, axis=axis), paired=True,
                            confidence=confidence, n_resamples=n_resamples, method=method, seed=seed)
    return RatioInterval("mean-KL ratio", est, lo, hi, confidence, method, int(m.size), int(n_resamples), int(seed))


def wilcoxon_p(method_kl, reference_kl) -> float:
    """Two-sided Wilcoxon signed-rank p-value of the per-document log ratios (1.0 when every ratio is 1)."""
    from scipy.stats import wilcoxon

    d = log_ratios(method_kl, reference_kl)
    if np.all(d == 0):
        return 1.0
    return float(wilcoxon(d, alternative="two-sided").pvalue)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the input order: with the p-values sorted ascending
    ``p_(1) <= ... <= p_(m)``, ``adj_(k) = min(1, max_{j <= k} (m - j + 1) p_(j))``. A hypothesis is rejected
    at family-wise level alpha when its adjusted p-value is <= alpha."""
    try:
        p = np.asarray(p_values, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"p_values must be a 1-D sequence of numbers, got {type(p_values).__name__}") from None
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"p_values must be a non-empty 1-D sequence, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p_values must lie in [0, 1] (no NaN), got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = stepped
    return out


def _ends(a: float, b: float, exclude_zero: bool) -> tuple[str, str]:
    """``a`` and ``b`` (percent magnitudes) printed with the fewest decimals (0-3) that keep them apart and,
    with ``exclude_zero``, keep a non-zero end from reading 0 -- an end above 10 with no more decimals than two
    significant digits need (``0.02–25 %``, not ``0.02–25.44 %``), unless the two would then read alike."""
    for d in range(4):
        sa, sb = f"{a:.{d}f}", f"{b:.{d}f}"
        zero = exclude_zero and (float(sa) == 0 and a != 0 or float(sb) == 0 and b != 0)
        if (sa != sb or a == b) and not zero:
            break

    def own(x: float) -> str:  # at most d decimals, and no more than two significant digits need
        k = d if x == 0 else min(d, max(0, 1 - math.floor(math.log10(abs(x)))))
        s = f"{x:.{k}f}"
        return s if not (exclude_zero and float(s) == 0 and x != 0) else f"{x:.{d}f}"

    oa, ob = own(a), own(b)
    return (oa, ob) if float(oa) != float(ob) or a == b else (sa, sb)


def verdict(interval, *, scale: str = "ratio", higher_is_better: bool | None = None) -> str:
    """The sentence for an interval ``[lo, hi]`` (a :class:`RatioInterval`, a :class:`DifferenceInterval` or
    a ``(lo, hi)`` pair) on one of two scales; ``higher_is_better`` says which direction is "better"
    (default: the scale's own, below).

    ``scale="ratio"`` (method / reference, e.g. a KL ratio; **lower is better** by default):

    * ``hi < 1``: ``"better by X–Y %"`` with X = 100 (1 − hi), Y = 100 (1 − lo);
    * ``lo > 1``: ``"worse by X–Y %"`` with X = 100 (lo − 1), Y = 100 (hi − 1);
    * otherwise (the interval holds 1): ``"no detectable difference; the interval is ±Z %"`` when the two
      ends round to the same magnitude Z, else ``"... the interval is −A % to +B %"`` (A = 100 (1 − lo),
      B = 100 (hi − 1); an end at exactly 1 reads ``0 %``).

    ``scale="points"`` (method − reference in percentage points, e.g. an accuracy difference; **higher is
    better** by default):

    * ``lo > 0``: ``"better by X–Y points"`` with X = lo, Y = hi;
    * ``hi < 0``: ``"worse by X–Y points"`` with X = −hi, Y = −lo;
    * otherwise (the interval holds 0): ``"no detectable difference; the interval is ±Z points"`` or
      ``"... the interval is −A to +B points"`` (A = −lo, B = hi; an end at exactly 0 reads ``0``).

    With the scale's direction reversed (``higher_is_better`` given against it) only the words "better" and
    "worse" swap. Magnitudes are printed with the fewest decimals (0 to 3) that keep the two ends distinct
    and a non-zero end from reading 0. An interval exactly touching the null value (1, or 0 points) is "no
    detectable difference"; an interval that *is* the null value (``lo == hi == 1``, or ``0 == 0`` points: every
    document's ratio 1, every prompt's pair alike) reads ``"no difference: identical on every document"``
    (``"... prompt"`` on the points scale)."""
    if scale not in ("ratio", "points"):
        raise ValueError(f"scale must be 'ratio' (method / reference) or 'points' (method - reference, in "
                         f"percentage points), got {scale!r}")
    if isinstance(interval, (RatioInterval, DifferenceInterval)):
        lo, hi = interval.low, interval.high
    else:
        try:
            lo, hi = (float(v) for v in interval)
        except (TypeError, ValueError):
            raise ValueError(f"interval must be a RatioInterval, a DifferenceInterval or a (low, high) pair, got "
                             f"{interval!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or (scale == "ratio" and lo <= 0):
        raise ValueError(f"interval must hold finite{', positive ratios' if scale == 'ratio' else ' differences'}, "
                         f"got ({lo}, {hi})")
    if lo > hi:
        raise ValueError(f"interval: low {lo} is above high {hi}; pass (low, high)")
    if scale == "ratio":  # magnitudes below / above the null, in %
        below, above, unit, num = (100 * (1 - hi), 100 * (1 - lo)), (100 * (lo - 1), 100 * (hi - 1)), " %", " %"
        down, up = 100 * (1 - lo), 100 * (hi - 1)
        lower_better = True if higher_is_better is None else not higher_is_better
    else:
        below, above, unit, num = (-hi, -lo), (lo, hi), " points", ""
        down, up = 0.0 - lo, hi + 0.0  # no "-0"
        lower_better = False if higher_is_better is None else not higher_is_better
    word_below, word_above = ("better", "worse") if lower_better else ("worse", "better")
    if below[0] > 0:
        a, b = _ends(*below, True)
        return f"{word_below} by {a}{unit}" if a == b else f"{word_below} by {a}–{b}{unit}"
    if above[0] > 0:
        a, b = _ends(*above, True)
        return f"{word_above} by {a}{unit}" if a == b else f"{word_above} by {a}–{b}{unit}"
    if down == 0 and up == 0:  # the null point itself: what the paired statistics give when every pair agrees
        return "no difference: identical on every " + ("document" if scale == "ratio" else "prompt")
    for d in range(4):
        sd, su = f"{down:.{d}f}", f"{up:.{d}f}"
        if (float(sd) > 0 or down == 0) and (float(su) > 0 or up == 0):
            break
    if sd == su:
        return f"no detectable difference; the interval is ±{sd}{unit}"
    left = f"−{sd}{num}" if down > 0 else f"0{num}"
    right = f"+{su}{unit}" if up > 0 else f"0{unit}"
    return f"no detectable difference; the interval is {left} to {right}"


# --------------------------------------------------------------------------------------------- paired 0/1 outcomes
def _binary(name: str, x) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a 1-D sequence of 0/1 outcomes (one per prompt), got {type(x).__name__}") from None
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of 0/1 outcomes, got shape {a.shape}")
    if not np.all((a == 0) | (a == 1)):
        raise ValueError(f"{name} must hold only 0/1 (or False/True) outcomes, got {sorted(set(a.tolist()))[:5]}")
    return a


def _paired_binary(method_correct, reference_correct) -> tuple[np.ndarray, np.ndarray]:
    m, r = _binary("method_correct", method_correct), _binary("reference_correct", reference_correct)
    if m.shape != r.shape:
        raise ValueError(f"method_correct and reference_correct must have the same length (paired per prompt), "
                         f"got {m.size} and {r.size}")
    return m, r


@dataclass(frozen=True)
class DifferenceInterval(_Interval):
    """An accuracy difference (method − reference, in percentage points; above 0 = the method is right more
    often) on the same prompts, and its paired bootstrap interval."""


DIFFERENCE_METHOD = "percentile"  # BCa's acceleration is undefined / unstable on sparse 0/1 differences


def accuracy_difference(method_correct, reference_correct, *, confidence: float = CONFIDENCE,
                        n_resamples: int = N_RESAMPLES, method: str = DIFFERENCE_METHOD,
                        seed: int = SEED) -> DifferenceInterval:
    """``100 (mean(method_correct) − mean(reference_correct))`` percentage points, the two 0/1 outcomes of
    each prompt kept together, and its paired bootstrap interval (``scipy.stats.bootstrap``, ``paired=True``:
    prompts resampled; percentile by default). When every prompt gives the same difference (no spread, e.g.
    both right or both wrong everywhere) every resample gives it too: the interval is that point."""
    m, r = _paired_binary(method_correct, reference_correct)
    _options(confidence, n_resamples, method)
    d = m - r
    est = float(100 * d.mean())
    if np.ptp(d) == 0 or m.size < 2:
        lo = hi = est
    else:
        lo, hi = _bootstrap((m, r), lambda a, b, axis: 100 * (np.mean(a, axis=axis) - np.mean(b, axis=axis)),
                            paired=True, confidence=confidence, n_resamples=n_resamples, method=method, seed=seed)
    return DifferenceInterval("accuracy difference (points)", est, lo, hi, confidence, method, int(m.size),
                              int(n_resamples), int(seed))


def mcnemar_p(method_correct, reference_correct) -> float:
    """Exact two-sided McNemar p of two paired 0/1 outcomes: ``scipy.stats.binomtest`` of the prompts only the
    method gets right among the discordant prompts (only one of the two right), p = 1/2 under no difference;
    1.0 when no prompt is discordant."""
    from scipy.stats import binomtest

    m, r = _paired_binary(method_correct, reference_correct)
    wins, losses = int(np.sum((m == 1) & (r == 0))), int(np.sum((m == 0) & (r == 1)))
    if wins + losses == 0:
        return 1.0
    return float(binomtest(wins, wins + losses, 0.5, alternative="two-sided").pvalue)


def accuracy_interval(correct, *, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(accuracy, low, high)`` of one setting's 0/1 outcomes: the share right and its Wilson score interval
    (``scipy.stats.binomtest(...).proportion_ci(method="wilson")``; sensible at 0 and at n of n)."""
    from scipy.stats import binomtest

    a = _binary("correct", correct)
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence!r}")
    k, n = int(a.sum()), int(a.size)
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return k / n, float(ci.low), float(ci.high)


def mcnemar_verdict(wins: int, losses: int, p_adjusted: float, *, alpha: float = 0.05) -> str:
    """The verdict of a paired test on 0/1 outcomes (e.g. :func:`mcnemar_p` Holm-adjusted over the cells of one
    comparison): ``"better"`` (more prompts only the method gets right, ``wins > losses``) or ``"worse"``
    (``losses > wins``) where ``p_adjusted <= alpha``; else ``"no detectable difference"``, or ``"no difference:
    identical on every prompt"`` when no prompt is discordant (``wins == losses == 0``)."""
    for name, v in (("wins", wins), ("losses", losses)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a count >= 0 (discordant prompts), got {v!r}")
    if not (isinstance(p_adjusted, (int, float)) and 0 <= p_adjusted <= 1):
        raise ValueError(f"p_adjusted must be a p-value in [0, 1], got {p_adjusted!r}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1), e.g. 0.05; got {alpha!r}")
    if wins == losses == 0:
        return "no difference: identical on every prompt"
    if p_adjusted <= alpha and wins != losses:
        return "better" if wins > losses else "worse"
    return "no detectable difference"


def simultaneous_confidence(confidence: float, m: int) -> float:
    """Bonferroni's per-interval level for ``m`` intervals judged together: ``1 − (1 − confidence) / m``, so that
    all ``m`` hold their true values at once with probability at least ``confidence`` (``confidence`` itself
    when ``m == 1``)."""
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ValueError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence!r}")
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m must be the number of intervals judged together, an integer >= 1; got {m!r}")
    return float(confidence) if m == 1 else 1 - (1 - confidence) / int(m)


def compare_cells(cells, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES, method: str = METHOD,
                  seed: int = SEED, alpha: float = 0.05) -> list[dict]:
    """One row per cell of ``cells`` (``{name: (method_kl, reference_kl)}``, each pair per document): the
    geometric-mean ratio and the mean-KL ratio with their ``confidence`` intervals, the geometric-mean ratio's
    simultaneous interval over the m cells given (``gm_low_adjusted``/``gm_high_adjusted``, at level
    ``confidence_adjusted`` = :func:`simultaneous_confidence`; the same resamples, so it holds the unadjusted
    one), the number of documents where the method's KL is lower (``wins``), the two-sided Wilcoxon p-value,
    its Holm adjustment over the m cells, whether that survives ``alpha`` (``holm_significant``), the
    :func:`verdict` of the adjusted interval (``verdict``) and of the unadjusted one (``verdict_unadjusted``)."""
    if not isinstance(cells, dict) or not cells:
        raise ValueError("cells must be a non-empty dict {cell name: (method_kl, reference_kl)}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1), e.g. 0.05; got {alpha!r}")
    _options(confidence, n_resamples, method)
    level = simultaneous_confidence(confidence, len(cells))
    rows = []
    for name, pair in cells.items():
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"cells[{name!r}] must be a (method_kl, reference_kl) pair")
        m, r = pair
        d = log_ratios(m, r)
        gm = geometric_mean_ratio(m, r, confidence=confidence, n_resamples=n_resamples, method=method, seed=seed)
        adj = geometric_mean_ratio(m, r, confidence=level, n_resamples=n_resamples, method=method, seed=seed)
        mr = mean_ratio(m, r, confidence=confidence, n_resamples=n_resamples, method=method, seed=seed)
        rows.append({"cell": name, "n": gm.n, "wins": int(np.sum(d < 0)), "ties": int(np.sum(d == 0)),
                     "gm_ratio": gm.estimate, "gm_low": gm.low, "gm_high": gm.high,
                     "gm_low_adjusted": adj.low, "gm_high_adjusted": adj.high, "confidence_adjusted": level,
                     "cells_judged": len(cells), "mean_ratio": mr.estimate, "mean_low": mr.low, "mean_high": mr.high,
                     "p_wilcoxon": wilcoxon_p(m, r), "verdict": verdict(adj), "verdict_unadjusted": verdict(gm)})
    adjusted = holm([row["p_wilcoxon"] for row in rows])
    for row, p in zip(rows, adjusted):
        row["p_holm"] = float(p)
        row["holm_significant"] = bool(p <= alpha)
    return rows


# ------------------------------------------------------------------------------------------------- planning
_APPROXIMATIONS = ("t", "normal")


def _plan_options(log_ratio_sd, n, m, alpha, approximation) -> None:
    if isinstance(log_ratio_sd, bool) or not (isinstance(log_ratio_sd, (int, float, np.floating))
                                              and math.isfinite(log_ratio_sd) and log_ratio_sd > 0):
        raise ValueError(f"log_ratio_sd must be a positive finite number (the standard deviation of the per-document "
                         f"log KL ratios), got {log_ratio_sd!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be the number of documents, an integer >= 2; got {n!r}")
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m must be the number of comparisons judged together, an integer >= 1; got {m!r}")
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1), e.g. 0.05; got {alpha!r}")
    if approximation not in _APPROXIMATIONS:
        raise ValueError(f"approximation must be one of {_APPROXIMATIONS}, got {approximation!r}")


def paired_power(log_effect: float, log_ratio_sd: float, n: int, m: int = 1, *, alpha: float = 0.05,
                 approximation: str = "t") -> float:
    """Power of the two-sided paired test of the mean per-document log KL ratio at level ``alpha / m``
    (Bonferroni over ``m`` comparisons), when the true mean log ratio is ``log_effect`` (a geometric-mean
    ratio of ``exp(log_effect)``) and the log ratios of ``n`` documents have standard deviation
    ``log_ratio_sd``. With ``approximation="t"`` (default) the one-sample t test: its statistic follows a
    noncentral t with ``n - 1`` degrees of freedom and noncentrality ``log_effect * sqrt(n) / log_ratio_sd``
    (``scipy.stats.nct``), critical value ``t_{1 - alpha/(2m), n-1}``; ``"normal"``: the z test with the same
    noncentrality. Both tails count; at ``log_effect = 0`` the power is ``alpha / m``."""
    from scipy import stats

    _plan_options(log_ratio_sd, n, m, alpha, approximation)
    if not (isinstance(log_effect, (int, float, np.floating)) and math.isfinite(log_effect)):
        raise ValueError(f"log_effect must be a finite number (the true mean log ratio), got {log_effect!r}")
    level = alpha / m
    shift = float(log_effect) * math.sqrt(n) / float(log_ratio_sd)
    if approximation == "normal":
        crit = stats.norm.isf(level / 2)
        return float(stats.norm.sf(crit - shift) + stats.norm.cdf(-crit - shift))
    crit = stats.t.isf(level / 2, n - 1)
    if shift == 0:
        return float(level)
    # P(T > crit) + P(T < -crit), the second as P(T' > crit) with T' of noncentrality -shift (scipy's nct.cdf
    # far in the lower tail returns NaN where its sf of the mirrored variable is fine)
    return float(stats.nct.sf(crit, n - 1, shift) + stats.nct.sf(crit, n - 1, -shift))


def detectable_ratio(log_ratio_sd: float, n: int, m: int = 1, power: float = 0.8, *, alpha: float = 0.05,
                     approximation: str = "t") -> float:
    """The geometric-mean KL ratio ``r < 1`` that the two-sided paired test of :func:`paired_power` (level
    ``alpha / m``, ``n`` documents, log ratios with standard deviation ``log_ratio_sd``) detects with
    probability ``power``: ``r = exp(-delta)`` where ``paired_power(delta, ...) == power`` (solved with
    ``scipy.optimize.brentq``). Ratios further from 1 are detected more often; a ratio of ``1 / r`` (a
    method worse by as much) is detected with the same power. The normal approximation gives nearly
    ``delta = (z_{1 - alpha/(2m)} + z_power) * log_ratio_sd / sqrt(n)``."""
    from scipy.optimize import brentq

    _plan_options(log_ratio_sd, n, m, alpha, approximation)
    if not (isinstance(power, (int, float)) and alpha / m < power < 1):
        raise ValueError(f"power must be in (alpha/m, 1) = ({alpha / m:.3g}, 1), e.g. 0.8; got {power!r}")

    def gap(delta: float) -> float:
        return paired_power(delta, log_ratio_sd, n, m, alpha=alpha, approximation=approximation) - power

    high = float(log_ratio_sd)
    while gap(high) < 0:  # widen the bracket until the power there reaches the target
        high *= 2
    return math.exp(-brentq(gap, 0.0, high, xtol=1e-12, rtol=1e-12))
