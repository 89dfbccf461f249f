r"""Two-stage Jacap (note §14.3, "score twice"): top-2B, renormalise, rebuild A, rescore.

One-shot Algorithm 1 scores every token on the geometry of the *full* pool: the centre softmax
:math:`\bar\alpha` is normalised over all N tokens and :math:`A` sums over all of them. After keeping
:math:`B\ll N` both change (note §13.4). This press scores once, keeps the best ``expand * B``
candidates, recomputes :math:`\bar\alpha` (renormalised over the candidates only), :math:`w` and
:math:`A` on the candidates, and lets kvpress keep the top B of the second score.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..selection import n_kept
from . import utils
from .jacap import TemperedCentrePress

__all__ = ["JacapTwoStagePress"]


@dataclass
class JacapTwoStagePress(TemperedCentrePress):
    """JacapPromptPress with a second scoring pass on the top ``expand * B`` candidates.

    Parameters
    ----------
    expand : float, default=2.0
        Candidates kept by the first pass, as a multiple of the final budget B (capped at N).
    (all other parameters: see :class:`~jacap_lib.presses.jacap.JacapPromptPress`; ``centre="tempered"`` is the default
    and only centre: both passes recompute the tempered softmax on their own pool)
    """

    expand: float = 2.0

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.expand, bool) or not (isinstance(self.expand, (int, float)) and 1 <= self.expand < float("inf")):
            raise ValueError(f"expand must be a number >= 1 (candidates = expand * budget), got {self.expand!r}")

    def token_scores(self, keys, values, mu, lam, module, protected: torch.Tensor | None = None):
        """Second-pass scores on the candidates, ``finfo.min`` elsewhere. ``protected (N,)`` (or ``(B, 1, N)``): the
        slots the first pass must keep among the candidates; :meth:`score` hands in :meth:`protected`, the one
        protection rule; the default (a direct call) is the first ``n_sink`` and last ``window`` slots, unfitted."""
        if protected is None:
            protected = utils.protected_slots(keys.shape[-2], self.n_sink, self.window, device=keys.device)
        first = self.components(keys, values, mu, lam, module).score
        first = first.masked_fill(protected, torch.finfo(first.dtype).max)
        n = keys.shape[-2]
        budget = n_kept(n, self.compression_ratio)  # 0 at compression_ratio = 1.0 (a dropped layer)
        n_cand = min(n, max(budget, int(round(self.expand * budget))))
        if budget == 0 or n_cand >= n:
            return first
        cand = first.topk(n_cand, dim=-1).indices.sort(dim=-1).values  # (B, H, n_cand), in position order
        idx = cand.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        second = self.components(keys.gather(2, idx), values.gather(2, idx), mu, lam, module).score
        out = torch.full_like(first, torch.finfo(first.dtype).min)
        return out.scatter(-1, cand, second.to(out.dtype))

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        mu, lam = self.query_statistics(module, hidden_states, keys, kwargs)
        protected = self.protected(hidden_states, keys, kwargs)
        scores = self.token_scores(keys, values, mu, lam, module, protected)
        return scores.masked_fill(protected, torch.finfo(scores.dtype).max)
