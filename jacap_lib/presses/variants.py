"""``jacap_ablate``: the registry's builder of :class:`~jacap_lib.presses.jacap_ablation.JacapAblationPress`.

The press has one field per component of Algorithm 1; its ``budget`` field says how the kept slots are spread, and
this builder puts the press inside the wrapper that spreads them (kvpress ``AdaKVPress`` for a layer,
:class:`~jacap_lib.presses.jacap_global_budget.JacapGlobalBudgetPress` for the whole model). The registry
(:data:`jacap_lib.presses.registry.METHODS`) names it ``jacap_ablate`` and its aliases ``jacap_obs`` and ``jacap_ea``.
"""
from __future__ import annotations

from kvpress import AdaKVPress

from .. import _checks
from .jacap import JacapPromptPress
from .jacap_ablation import ABLATION_FIELDS, JacapAblationPress
from .jacap_global_budget import JacapGlobalBudgetPress


def jacap_ablate(compression_ratio, alpha_safeguard=None, **opts):
    """Jacap with one component of Algorithm 1 swapped (centre, sensitivity, kappa, leverage, prior_iso, budget)

    The one-knob ablations are listed in :data:`jacap_lib.presses.jacap_ablation.ONE_KNOB`. The registry's
    ``jacap_obs`` and ``jacap_ea`` are aliases of it with their centre (and EA's summary of the queries). Returns a
    :class:`~jacap_lib.presses.jacap.JacapPromptPress` when only JacapPromptPress's own options are set (``centre`` among
    them: the same press, the same scores), else a
    :class:`~jacap_lib.presses.jacap_ablation.JacapAblationPress`; with ``budget="layer"`` a kvpress
    ``AdaKVPress`` around it (top-k of the marginal capacity across the KV heads of a layer; ``alpha_safeguard``
    defaults to 0, the objective alone), with ``budget="model"`` a
    :class:`~jacap_lib.presses.jacap_global_budget.JacapGlobalBudgetPress` (across all layers and heads). Both are
    masking wrappers: wrap their ``.press`` where kvpress needs a scorer.
    """
    press = JacapAblationPress(compression_ratio, **opts)  # checks every option
    if alpha_safeguard is not None and press.budget != "layer":
        raise ValueError("alpha_safeguard is AdaKV's option (the allocation across a layer's heads): set adakv=true "
                         "or budget=layer with it, or drop it")
    if press.budget == "uniform":
        if all(getattr(press, k) == v for k, v in ABLATION_FIELDS.items()):
            return JacapPromptPress(compression_ratio, **{k: v for k, v in opts.items() if k not in ABLATION_FIELDS})
        return press
    if press.budget == "model":
        return JacapGlobalBudgetPress(press=press)
    alpha_safeguard = 0.0 if alpha_safeguard is None else alpha_safeguard
    _checks.unit_interval("alpha_safeguard", alpha_safeguard, closed_right=True)
    return AdaKVPress(press=press, alpha_safeguard=alpha_safeguard)


jacap_ablate.forwards_to = JacapAblationPress
