r"""Jacap with the query statistics handed in: one knob of the critique's anatomy (not a registry method).

:class:`JacapGivenStatisticsPress` is :class:`~jacap_lib.presses.jacap.JacapPress` except for one step: the mean
and variance of the future queries, :math:`(\mu_Q, \Lambda_Q)`, are not estimated from the prompt's recent queries
(:meth:`~jacap_lib.presses.jacap.JacapPress.query_statistics`) but read from ``statistics``, one pair per layer.
Everything downstream — the centre (a tempered softmax of :math:`K\mu_Q`, or the observed attention), the weight,
the leverage and the protection — is computed exactly as the press it copies computes it.

Handed the moments of the queries that actually come after the prompt (the continuation whose next-token KL is
scored), it answers "what would Jacap keep if it knew the future queries' statistics": the *oracle statistics*
of the anatomy (:func:`jacap_lib.measure.anatomy.future_statistics` computes them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .jacap import JacapPress

__all__ = ["JacapGivenStatisticsPress"]


@dataclass
class JacapGivenStatisticsPress(JacapPress):
    """Jacap's score with ``(mu, lam)`` read from ``statistics``: ``{layer index: (mu, lam)}``, each ``(H_kv, d)``
    (``gqa="pool"``) or ``(H_q, d)`` (``gqa="mean"``), or with a leading batch dimension. Every layer the press
    compresses must be there; set the field (or :meth:`set_statistics`) before each prompt."""

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
