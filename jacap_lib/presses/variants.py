"""Jacap variants from the critique (note §14.3), each registered under a name beginning with 'jacap'.

``VARIANTS`` maps a registry name to a factory ``f(compression_ratio, **opts) -> press``;
:mod:`jacap_lib.presses.registry` merges it into the method registry. Presses with new scoring
logic live one per file (``jacap_<name>.py``); variants that only set an option of
:class:`~jacap_lib.presses.jacap.JacapPress` (EMA statistics, ``u = W_O v``) or wrap it in a kvpress
wrapper (AdaKV head-wise budgets, the per-layer pyramid of :mod:`.jacap_pyramid`) are factories here. Sweeps of a single option (``tau``,
``noise``, ``beta``) use the bench's ``jacap[tau=1.0]`` syntax instead of new names.
"""
from __future__ import annotations

from kvpress import AdaKVPress

from .. import _checks
from .jacap import JacapPress
from .jacap_ablation import ABLATION_FIELDS, JacapAblationPress
from .jacap_global_budget import JacapGlobalBudgetPress
from .jacap_hybrid import JacapHybridPress
from .jacap_multicenter import JacapMultiCenterPress
from .jacap_pyramid import JacapPyramidPress
from .jacap_rank1 import JacapRank1Press
from .jacap_two_stage import JacapTwoStagePress


def jacap_ema(compression_ratio, beta=0.99, **opts):
    """Jacap with a slower EMA of the query statistics over the prompt (beta=0.99 by default; JacapPress's is 0.9)"""
    return JacapPress(compression_ratio, beta=beta, **opts)


def jacap_wo(compression_ratio, **opts):
    """Jacap with the true output directions u = W_O v (the head's slice of the output projection)"""
    return JacapPress(compression_ratio, use_out_proj=True, **opts)


def jacap_adakv(compression_ratio, alpha_safeguard=0.20, **opts):
    """Jacap scores with kvpress AdaKV head-wise budget allocation (top-k across the heads of a layer)

    Returns a kvpress ``AdaKVPress`` (a wrapper, not a ``ScorerPress``): kvpress's ``ComposedPress``
    refuses it, and wrappers that need a scorer (``ChunkPress``, ``PerLayerCompressionPress``, ...)
    assert; wrap its ``.press`` (the ``JacapPress``) there instead (see the book's kvpress page).
    """
    _checks.unit_interval("alpha_safeguard", alpha_safeguard, closed_right=True)
    return AdaKVPress(press=JacapPress(compression_ratio, **opts), alpha_safeguard=alpha_safeguard)


def jacap_pyramid(compression_ratio, slope=0.5, max_ratio=0.99, evict="mask", **opts):
    """Jacap with a linear per-layer budget pyramid (kvpress PerLayerCompressionPress; more KV in lower layers, mean ratio = c)

    Returns a ``PerLayerCompressionPress`` subclass (a wrapper): kvpress wrappers that need a scorer
    refuse it (use ``.press``), and in a ``ComposedPress`` it must come last (or use ``evict="prune"``):
    it masks slots that a later press would prune under it.
    """
    return JacapPyramidPress(press=JacapPress(compression_ratio, **opts), slope=slope, max_ratio=max_ratio,
                             evict=evict)


def jacap_ablate(compression_ratio, alpha_safeguard=None, **opts):
    """Jacap with one component of Algorithm 1 swapped (centre, sensitivity, kappa, leverage, prior_iso, budget)

    The one-knob ablations are listed in :data:`jacap_lib.presses.jacap_ablation.ONE_KNOB`. Returns a
    :class:`~jacap_lib.presses.jacap.JacapPress` when only JacapPress's own options are set (``centre`` among
    them: the same press, the same scores), else a
    :class:`~jacap_lib.presses.jacap_ablation.JacapAblationPress`; with ``budget="layer"`` a kvpress
    ``AdaKVPress`` around it (top-k of the marginal capacity across the KV heads of a layer; ``alpha_safeguard``
    defaults to 0, the objective alone), with ``budget="model"`` a
    :class:`~jacap_lib.presses.jacap_global_budget.JacapGlobalBudgetPress` (across all layers and heads). Both are
    masking wrappers: wrap their ``.press`` where kvpress needs a scorer.
    """
    press = JacapAblationPress(compression_ratio, **opts)  # checks every option
    if alpha_safeguard is not None and press.budget != "layer":
        raise ValueError("alpha_safeguard only applies with budget='layer' (AdaKV's allocation across a layer's "
                         "heads); drop it or set budget=layer")
    if press.budget == "uniform":
        if all(getattr(press, k) == v for k, v in ABLATION_FIELDS.items()):
            return JacapPress(compression_ratio, **{k: v for k, v in opts.items() if k not in ABLATION_FIELDS})
        return press
    if press.budget == "model":
        return JacapGlobalBudgetPress(press=press)
    alpha_safeguard = 0.0 if alpha_safeguard is None else alpha_safeguard
    _checks.unit_interval("alpha_safeguard", alpha_safeguard, closed_right=True)
    return AdaKVPress(press=press, alpha_safeguard=alpha_safeguard)


jacap_ablate.forwards_to = JacapAblationPress


def jacap_obs(compression_ratio, centre="observed", **opts):
    """Jacap linearised at the attention its recent queries actually paid (the observed centre), not a tempered softmax

    The capacity objective and Algorithm 1's score are unchanged (sensitivity rho^2, response variance kappa,
    leverage against A); only the centre alpha-bar at which the Jacobian is taken is the causal softmax of the
    recent queries (each at its own RoPE position, EMA-weighted like mu_Q), so no temperature is involved. It is
    ``jacap_ablate[centre=observed]`` under its own name, with every option of ``jacap_ablate`` (``budget=layer``:
    the kept slots spread across a layer's KV heads by marginal capacity): without an ablation field it builds
    ``JacapPress(centre="observed")``, the press ``jacap`` builds at its defaults.
    """
    return jacap_ablate(compression_ratio, centre=centre, **opts)


jacap_obs.forwards_to = JacapAblationPress


def jacap_ea(compression_ratio, centre="ea", gqa="mean", beta=None, n_future_positions=32, **opts):
    """Jacap linearised at Expected Attention's centre, with that method's summary of the queries to come

    The capacity objective and Algorithm 1's score are unchanged (sensitivity rho^2, response variance kappa,
    leverage against A); the centre alpha-bar is the log-normal expectation
    softmax(K mu/sqrt d + diag(K Lambda K^T)/(2d)) (no temperature), and the query statistics are summarised as
    Expected Attention summarises them: per query head (the scores averaged over a KV head's group), flat over the
    prompt, RoPE-averaged over the next 32 positions (the horizon the protocol chose for Expected Attention). It is
    ``jacap_ablate[beta=none,centre=ea,gqa=mean,n_future_positions=32]`` under its own name, with every option of
    ``jacap_ablate``: without an ablation field it builds
    ``JacapPress(centre="ea", gqa="mean", beta=None, n_future_positions=32)``.
    """
    return jacap_ablate(compression_ratio, centre=centre, gqa=gqa, beta=beta, n_future_positions=n_future_positions,
                        **opts)


jacap_ea.forwards_to = JacapAblationPress


def _doc(cls):
    def factory(compression_ratio, **opts):
        return cls(compression_ratio, **opts)

    factory.__doc__ = (cls.__module__.rsplit(".", 1)[-1] + ": " + (cls.__doc__ or "").strip().splitlines()[0])
    factory.press_class = cls
    return factory


VARIANTS: dict = {
    "jacap_rank1": _doc(JacapRank1Press),
    "jacap_two_stage": _doc(JacapTwoStagePress),
    "jacap_hybrid": _doc(JacapHybridPress),
    "jacap_multicenter": _doc(JacapMultiCenterPress),
    "jacap_ema": jacap_ema,
    "jacap_wo": jacap_wo,
    "jacap_adakv": jacap_adakv,
    "jacap_pyramid": jacap_pyramid,
    "jacap_ablate": jacap_ablate,
    "jacap_obs": jacap_obs,
    "jacap_ea": jacap_ea,
}
