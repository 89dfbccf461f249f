"""Protected regions + budget -> the indices of the tokens to keep (Algorithm 1, step 10).

Two rules live here and nowhere else:

* :func:`n_kept` -- how many of ``n`` tokens a compression ratio keeps (kvpress's rule);
* :func:`fit_protection` -- what of the protected sinks and recent window fits a budget: the sinks
  first (if even they do not fit, the earliest ``budget`` of them), then the window, shrunk to the
  budget left after the sinks (its most recent tokens). :func:`protect_within` applies it to masks of
  slots, :func:`select_keep` to scores; the press and the decode-time controller use the same rule.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import torch

from . import _checks
from .config import DEFAULTS

__all__ = ["select_keep", "protected_mask", "n_kept", "fit_protection", "protect_within", "Protection"]


def n_kept(n: int, compression_ratio: float) -> int:
    """Tokens kept out of ``n`` at ``compression_ratio``: kvpress's ``compute_n_kept`` (at least one token
    below ratio 1, none at 1.0, kvpress's "drop the layer"), never more than ``n``.

    The ratio is checked where it enters (the press); this is the arithmetic only."""
    from kvpress.utils import compute_n_kept  # the presses are kvpress presses: follow its rounding exactly

    return min(compute_n_kept(n, compression_ratio), n)


def budget_split(n_tokens: int, compression_ratio: float, n_sink: int, window: int) -> dict:
    """How the ``n_kept(n_tokens, compression_ratio)`` slots of one head are filled by the protection rule
    (:func:`fit_protection`): ``{"kept", "sinks", "window", "scored"}``, ``kept = sinks + window + scored``;
    ``scored`` is how many kept tokens the score chooses. The sinks are the slots present (at most ``n_tokens``),
    the window counts recent tokens that are not sinks."""
    budget = n_kept(n_tokens, compression_ratio)
    sinks = min(n_sink, n_tokens)
    fit = fit_protection(budget, sinks, min(window, n_tokens - sinks))
    return {"kept": budget, "sinks": fit.n_sink, "window": fit.window, "scored": budget - fit.n_sink - fit.window}


class Protection(NamedTuple):
    """The protected tokens that fit a budget: ``n_sink`` sinks and ``window`` recent tokens besides them;
    ``note`` says what was cut (``None`` when everything fit)."""

    n_sink: int
    window: int
    note: str | None


def fit_protection(budget: int, n_sink: int, window: int) -> Protection:
    """The one protection rule: sinks first, then the window shrunk to the budget left.

    ``n_sink`` and ``window`` count distinct tokens (sinks, then recent tokens that are not sinks)."""
    sinks = min(n_sink, budget)
    recent = min(window, budget - sinks)
    note = None
    if sinks < n_sink:
        note = (f"the budget of {budget} tokens is smaller than the {n_sink} sink tokens; only the first {budget} "
                f"sinks are kept (no window, no scored tokens)")
    elif recent < window:
        note = (f"the budget of {budget} tokens cannot hold the {n_sink} sink + {window} window tokens; the window was "
                f"shrunk to {recent} (sinks kept). Lower `window` to silence this.")
    return Protection(sinks, recent, note)


def protect_within(sink: torch.Tensor, recent: torch.Tensor, budget: int, *,
                   positions: torch.Tensor | None = None) -> tuple[torch.Tensor, Protection]:
    """Boolean ``(N,)`` masks of the sink and recent-window slots -> the slots protected within ``budget``.

    :func:`fit_protection` on the slots present: the earliest sinks and the most recent window slots, by
    ``positions (N,)`` (default: slot order). Returns the mask and the :class:`Protection` applied."""
    recent = recent & ~sink
    fit = fit_protection(budget, int(sink.sum()), int(recent.sum()))
    if fit.note is None:
        return sink | recent, fit
    pos = torch.arange(sink.shape[-1], device=sink.device) if positions is None else positions.to(sink.device)
    mask = torch.zeros_like(sink)
    first = torch.nonzero(sink).flatten()
    mask[first[pos[first].argsort()][: fit.n_sink]] = True
    last = torch.nonzero(recent).flatten()
    mask[last[pos[last].argsort(descending=True)][: fit.window]] = True
    return mask, fit


def protected_mask(n: int, *, n_sink: int = DEFAULTS.n_sink, window: int = 0, device=None) -> torch.Tensor:
    """Boolean ``(n,)`` mask: the first ``n_sink`` and the last ``window`` positions."""
    n = _checks.nonneg_int("n", n)
    n_sink = _checks.nonneg_int("n_sink", n_sink)
    window = _checks.nonneg_int("window", window)
    mask = torch.zeros(n, dtype=torch.bool, device=device)
    mask[: min(n_sink, n)] = True
    if window:
        mask[max(n - window, 0):] = True
    return mask


def select_keep(scores: torch.Tensor, budget: int, *, n_sink: int = DEFAULTS.n_sink, window: int = 0) -> torch.Tensor:
    """Indices of the ``budget`` tokens to keep, ascending, shape ``(..., budget)``.

    The first ``n_sink`` positions (attention sinks / system prefix) and the last ``window``
    positions (recent tokens) are always kept; the remaining budget goes to the highest scores.
    ``budget >= N`` keeps everything (shape ``(..., N)``). A budget smaller than the protected set
    follows :func:`fit_protection`, as the press does: the sinks first (the earliest ``budget`` of them if
    even they do not fit), then the most recent tokens of the window; a ``RuntimeWarning`` says so.
    """
    _checks.tensor("scores", scores, min_dim=1)
    budget = _checks.nonneg_int("budget", budget)
    n_sink = _checks.nonneg_int("n_sink", n_sink)
    window = _checks.nonneg_int("window", window)
    if bool(torch.isnan(scores).any()):
        raise ValueError("`scores` contains NaN; score computation failed upstream")
    n = scores.shape[-1]
    if n == 0:
        raise ValueError("`scores` has N = 0 tokens: nothing to select from")
    if budget >= n:
        return torch.arange(n, device=scores.device).expand(*scores.shape[:-1], n).clone()
    protect, fit = protect_within(protected_mask(n, n_sink=n_sink, device=scores.device),
                                  protected_mask(n, n_sink=0, window=window, device=scores.device), budget)
    if fit.note is not None:
        warnings.warn(f"select_keep: {fit.note}", RuntimeWarning, stacklevel=2)
    big = torch.finfo(torch.float32).max
    ranked = scores.float().clamp(-big, big).masked_fill(protect, float("inf"))
    idx = ranked.topk(budget, dim=-1).indices
    return idx.sort(dim=-1).values
