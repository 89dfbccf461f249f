"""Any kvpress scorer under Jacap's protection rule: the one-knob swap that separates *score* from *protection*.

:class:`ProtectedPress` keeps the score of the press it wraps and protects like
:class:`~jacap_lib.presses.jacap.JacapPress`: the first ``n_sink`` positions and the last ``window`` positions
get the largest finite score, within the budget by the one rule of :func:`jacap_lib.selection.protect_within`
(sinks first, then the window shrunk to what is left). Everything else — the wrapped press's statistics, its
own built-in sinks, its scores — is untouched, so ``ProtectedPress(ExpectedAttentionPress(c), 4, 32)`` differs
from ``ExpectedAttentionPress(c)`` only in the 32 most recent positions being kept whatever their score.

Used by :mod:`jacap_lib.measure.anatomy` (the swap of the critique); not a registry method (a spec cannot name
a press inside another).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress import ScorerPress

from .. import _checks
from ..selection import n_kept, protect_within
from . import utils

__all__ = ["ProtectedPress"]


@dataclass
class ProtectedPress(ScorerPress):
    """``press``'s scores, with the first ``n_sink`` and the last ``window`` positions always kept.

    Parameters
    ----------
    press : kvpress.ScorerPress
        The scorer whose scores are kept (its own ``compression_ratio`` is not used).
    compression_ratio : float
        Fraction of the prompt's KV pairs removed (default: ``press.compression_ratio``).
    n_sink, window : int
        Protected first and last positions (Jacap's defaults: 4 and 32).
    """

    press: ScorerPress = None
    compression_ratio: float | None = None
    n_sink: int = 4
    window: int = 32
    _noted: list = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.press, ScorerPress):
            raise ValueError(f"press must be a kvpress ScorerPress (a press with a score), got "
                             f"{type(self.press).__name__}")
        if self.compression_ratio is None:
            self.compression_ratio = float(self.press.compression_ratio)
        ratio = self.compression_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
            raise ValueError(f"compression_ratio must be a number in [0, 1), got {ratio!r}")
        _checks.nonneg_int("n_sink", self.n_sink)
        _checks.nonneg_int("window", self.window)

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    def protected(self, hidden_states, keys, kwargs) -> torch.Tensor:
        """Boolean ``(N,)`` mask of the protected slots, as :meth:`JacapPress.protected` finds them."""
        _, key_pos, next_pos = utils.hook_positions(hidden_states, keys, kwargs)
        n = keys.shape[-2]
        where = dict(key_positions=key_pos, next_position=next_pos, device=keys.device)
        sink = utils.protected_slots(n, self.n_sink, 0, **where)
        recent = utils.protected_slots(n, 0, self.window, **where)
        mask, fit = protect_within(sink, recent, max(n_kept(n, self.compression_ratio), 0), positions=key_pos)
        if fit.note is not None and not self._noted:
            self._noted.append(fit.note)
        return mask

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs).float()
        mask = self.protected(hidden_states, keys, kwargs)
        return scores.masked_fill(mask, torch.finfo(scores.dtype).max)
