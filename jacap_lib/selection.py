"""Protected regions + budget -> the indices of the tokens to keep (Algorithm 1, step 10)."""
from __future__ import annotations

import torch

from . import _checks

__all__ = ["select_keep", "protected_mask"]


def protected_mask(n: int, *, n_sink: int = 4, window: int = 0, device=None) -> torch.Tensor:
    """Boolean ``(n,)`` mask: the first ``n_sink`` and the last ``window`` positions."""
    n = _checks.nonneg_int("n", n)
    n_sink = _checks.nonneg_int("n_sink", n_sink)
    window = _checks.nonneg_int("window", window)
    mask = torch.zeros(n, dtype=torch.bool, device=device)
    mask[: min(n_sink, n)] = True
    if window:
        mask[max(n - window, 0):] = True
    return mask


def select_keep(scores: torch.Tensor, budget: int, *, n_sink: int = 4, window: int = 0) -> torch.Tensor:
    """Indices of the ``budget`` tokens to keep, ascending, shape ``(..., budget)``.

    The first ``n_sink`` positions (attention sinks / system prefix) and the last ``window``
    positions (recent tokens) are always kept; the remaining budget goes to the highest scores.
    ``budget >= N`` keeps everything (shape ``(..., N)``). A budget smaller than the protected
    set raises ``ValueError``.
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
    protect = protected_mask(n, n_sink=n_sink, window=window, device=scores.device)
    n_protected = int(protect.sum())
    if budget < n_protected:
        raise ValueError(
            f"`budget` = {budget} is smaller than the protected set ({n_protected} tokens: n_sink={n_sink}, "
            f"window={window}, N={n}); raise the budget or shrink `n_sink`/`window`"
        )
    big = torch.finfo(torch.float32).max
    ranked = scores.float().clamp(-big, big).masked_fill(protect, float("inf"))
    idx = ranked.topk(budget, dim=-1).indices
    return idx.sort(dim=-1).values
