r"""The anatomy's instruments: presses that change one step of Jacap (or of a baseline) to measure what that step
does, used by :mod:`jacap_lib.measure.anatomy` and the job :mod:`jacap_lib.experiments.anatomy` (not registry methods:
a spec cannot name a press inside another, nor hand statistics in).

* :class:`ProtectedPress` -- any kvpress scorer under Jacap's protection rule (the swap that separates *score* from
  *protection*);
* :class:`JacapWindowAttentionPress` -- Jacap with its centre replaced by the attention the last ``obs_window`` prompt
  queries paid, as kvpress SnapKV computes it (not JacapPromptPress's ``centre="observed"``, which averages the recent
  queries with :math:`\mu_Q`'s weights and keeps the window's own keys);
* :class:`JacapGivenStatisticsPress` -- Jacap with the query statistics :math:`(\mu_Q, \Lambda_Q)` handed in (the
  oracle statistics of the queries that follow the prompt, :func:`jacap_lib.measure.anatomy.future_statistics`).

Each scores with :class:`~jacap_lib.presses.jacap.JacapPromptPress`'s one Algorithm 1 and protects with its one rule
(:func:`jacap_lib.presses.utils.protection`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress import ScorerPress, SnapKVPress

from .. import _checks
from ..presses import utils
from ..presses.jacap import JacapPromptPress, TemperedCentrePress

__all__ = ["ProtectedPress", "JacapWindowAttentionPress", "JacapGivenStatisticsPress"]


@dataclass
class ProtectedPress(ScorerPress):
    """``press``'s scores, with the first ``n_sink`` and the last ``window`` positions always kept.

    The wrapped press's statistics, its own built-in sinks and its scores are untouched; the protected slots get the
    largest finite score, within the budget by Jacap's one rule (:func:`jacap_lib.presses.utils.protection`: sinks
    first, then the window shrunk to what is left; real tokens only under padding). So
    ``ProtectedPress(press=ExpectedAttentionPress(c), n_sink=4, window=16)`` differs from
    ``ExpectedAttentionPress(c)`` only in its first 4 and 16 most recent positions being kept whatever their score.

    Parameters
    ----------
    press : kvpress.ScorerPress
        The scorer whose scores are kept (its own ``compression_ratio`` is not used).
    compression_ratio : float or None, default=None
        Fraction of the prompt's KV pairs removed (``None``: ``press.compression_ratio``).
    n_sink : int, default=4
        Protected first positions (JacapPromptPress's default).
    window : int, default=32
        Protected last positions (JacapPromptPress's default is 16; 32 is the window the tempered-centre settings of the
        protocol were measured with).
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
        _checks.compression_ratio(self.compression_ratio)
        _checks.nonneg_int("n_sink", self.n_sink)
        _checks.nonneg_int("window", self.window)

    def post_init_from_model(self, model):
        self.press.post_init_from_model(model)

    def protected(self, hidden_states, keys, kwargs) -> torch.Tensor:
        """Boolean mask of the protected slots, ``(N,)`` (``(B, 1, N)`` under padding), by JacapPromptPress's rule
        (:func:`jacap_lib.presses.utils.protection`); a truncation is noted in ``_noted`` (once), not warned."""
        mask, note = utils.protection(hidden_states, keys, kwargs, n_sink=self.n_sink, window=self.window,
                                      compression_ratio=self.compression_ratio)
        if note is not None and not self._noted:
            self._noted.append(note)
        return mask

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs).float()
        mask = self.protected(hidden_states, keys, kwargs)
        return scores.masked_fill(mask, torch.finfo(scores.dtype).max)


@dataclass
class JacapWindowAttentionPress(TemperedCentrePress):
    r"""Jacap's score with :math:`\bar\alpha` = SnapKV's window attention of the last ``obs_window`` prompt queries
    (``gqa="pool"`` only).

    :class:`~jacap_lib.presses.jacap.JacapPromptPress` (``centre="tempered"``, the field it records) except for one
    quantity: the centre :math:`\bar\alpha_i = \mathrm{softmax}_i(k_i^\top\mu_Q/(\tau\sqrt d))` becomes the
    attention of the last ``obs_window`` prompt queries to token ``i`` (kvpress's
    ``SnapKVPress.compute_window_attention``: true RoPE positions, causal), averaged over those queries and over the
    query heads of the KV head (:meth:`window_attention_alpha`). The weight
    :math:`w_i = [\bar\alpha_i(1-\bar\alpha_i)]^2 k_i^\top\Lambda_Q k_i / d`, the leverage and the protection are
    Jacap's (:meth:`~jacap_lib.presses.jacap.JacapPromptPress.components` with that centre given; ``tau`` is unused).
    kvpress's window attention leaves out the window's own keys: they get :math:`\bar\alpha = 0` (weight 0); with
    ``window >= obs_window`` they are protected, so only their share of ``A`` changes.

    Parameters
    ----------
    obs_window : int, default=32
        How many of the last prompt queries are averaged (capped at ``N - 1``).
    (all other parameters: see :class:`~jacap_lib.presses.jacap.JacapPromptPress`)
    """

    obs_window: int = 32

    def __post_init__(self):
        super().__post_init__()
        _checks.int_at_least("obs_window", self.obs_window, 1)
        if self.gqa != "pool":
            raise ValueError("JacapWindowAttentionPress supports gqa='pool' only (its centre is pooled over the KV head's "
                             "query heads)")

    def window_attention_alpha(self, module, hidden_states, keys, kwargs) -> torch.Tensor:
        """``(B, H_kv, N)``: the last ``obs_window`` queries' attention to each key, averaged over those queries and
        the KV head's query heads (0 for the window's own keys)."""
        w = min(self.obs_window, keys.shape[-2] - 1)
        attn = SnapKVPress.compute_window_attention(module, hidden_states, keys, w, kwargs["position_embeddings"])
        b, hq, _, n = attn.shape
        hkv = keys.shape[1]
        alpha = attn.float().mean(2).view(b, hkv, hq // hkv, n).mean(2)
        return torch.nn.functional.pad(alpha, (0, keys.shape[-2] - n))

    def centre_attention(self, module, hidden_states, keys, kwargs) -> torch.Tensor:
        """The centre :meth:`~jacap_lib.presses.jacap.JacapPromptPress.components` is given: :meth:`window_attention_alpha`."""
        return self.window_attention_alpha(module, hidden_states, keys, kwargs)


@dataclass
class JacapGivenStatisticsPress(JacapPromptPress):
    r"""Jacap's score with ``(mu, lam)`` read from ``statistics``: ``{layer index: (mu, lam)}``, each ``(H_kv, d)``
    (``gqa="pool"``) or ``(H_q, d)`` (``gqa="mean"``), or with a leading batch dimension. Every layer the press
    compresses must be there; set the field (or :meth:`set_statistics`) before each prompt.

    :class:`~jacap_lib.presses.jacap.JacapPromptPress` except for one step: :math:`(\mu_Q, \Lambda_Q)` are not estimated
    from the prompt's recent queries (:meth:`~jacap_lib.presses.jacap.JacapPromptPress.query_statistics`) but read from
    ``statistics``. Everything downstream (the centre of its ``centre`` field, the weight, the leverage, the
    protection) is JacapPromptPress's; the observed centre still comes from the prompt's own recent queries. Handed the
    moments of the queries that actually come after the prompt, it answers "what would Jacap keep if it knew the
    future queries' statistics": the anatomy's *oracle statistics*.

    Parameters
    ----------
    statistics : dict, default={}
        ``{layer index: (mu, lam)}`` as above.
    (all other parameters: see :class:`~jacap_lib.presses.jacap.JacapPromptPress`)
    """

    statistics: dict = field(default_factory=dict, repr=False,
                             metadata={"record": "(mu, lam) per layer, handed in per prompt"})

    def set_statistics(self, statistics: dict) -> None:
        """Replace the statistics (``{layer: (mu, lam)}``; checked per layer when it is used)."""
        if not isinstance(statistics, dict) or not statistics:
            raise ValueError("`statistics` must be a non-empty dict {layer index: (mu, lam)}, e.g. from "
                             "jacap_lib.measure.anatomy.future_statistics(model, prompt_ids, continuation_ids)")
        self.statistics = statistics

    def query_statistics(self, module, hidden_states, keys, kwargs):
        layer = int(module.layer_idx)
        if layer not in self.statistics:
            raise ValueError(f"`statistics` has no entry for layer {layer} (it has {sorted(self.statistics)}); give "
                             "every layer's (mu, lam), e.g. from jacap_lib.measure.anatomy.future_statistics")
        mu, lam = self.statistics[layer]
        heads = keys.shape[1] if self.gqa == "pool" else keys.shape[1] * int(module.num_key_value_groups)
        mu, lam = (x if x.dim() == 3 else x.unsqueeze(0) for x in (mu, lam))
        want = (keys.shape[0], heads, keys.shape[-1])
        if tuple(mu.shape) not in (want, (1, *want[1:])) or mu.shape != lam.shape:
            raise ValueError(f"`statistics[{layer}]` must hold two tensors of shape {want[1:]} (gqa={self.gqa!r}); got "
                             f"{tuple(mu.shape)} and {tuple(lam.shape)}")
        device = keys.device
        return (mu.to(device, torch.float32).expand(*want), lam.to(device, torch.float32).expand(*want))
