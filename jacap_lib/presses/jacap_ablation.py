r"""One-knob ablations of Jacap's Algorithm 1: every component can be swapped alone.

Algorithm 1 scores token :math:`i` of one KV head by

.. math::

    r_i = \frac{w_i}{\sigma^2}\,u_i^\top A^{-1}u_i,\qquad
    w_i = s(\bar\alpha_i)\,\kappa_i/d,\qquad A = I + \textstyle\sum_j (w_j/\sigma^2)\,u_ju_j^\top,

with the *centre* :math:`\bar\alpha` (JacapPromptPress's ``centre`` field: the observed attention by default, the
tempered softmax of :math:`K\mu_Q/(\tau\sqrt d)`, or Expected Attention's), the *sensitivity factor*
:math:`s = \rho^2`, :math:`\rho_i = \bar\alpha_i(1-\bar\alpha_i)`, the *response variance*
:math:`\kappa_i = k_i^\top\Lambda_Q k_i` and the *leverage* :math:`u_i^\top A^{-1}u_i`.
:class:`JacapAblationPress` adds one field per component that is not a JacapPromptPress option (the sensitivity, the
response variance, the leverage, the query prior, the budget); each field's default is Algorithm 1's choice, and
with every field at its default the press *is* :class:`~jacap_lib.presses.jacap.JacapPromptPress` (same code path, same
scores bit for bit). The swaps are options of the one Algorithm 1, :func:`jacap_lib.scoring.core.validated_scores`
(``sensitivity``, ``kappa_rule``, ``leverage_rule``); the registry's ``jacap_ablate`` builds a JacapPromptPress where no
such field is set. :data:`ONE_KNOB` lists the one-knob ablations as registry specs (label -> spec, what it
changes); ablations that an existing registry name or option already expresses (``u = W_O v``: ``jacap_prompt_wo``;
two-stage selection: ``jacap_two_stage``; the query window: ``jacap_prompt[n_queries=32]``) use it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .. import _checks
from ..scoring.core import KAPPAS, LEVERAGES, SENSITIVITIES
from .jacap import JacapPromptPress

__all__ = ["JacapAblationPress", "marginal_capacity", "ONE_KNOB", "BASE_OF", "base_spec", "BUDGETS", "ABLATION_FIELDS"]

BUDGETS = ("uniform", "layer", "model")
#: JacapAblationPress's own fields (not JacapPromptPress options) and their defaults, Algorithm 1's choices
ABLATION_FIELDS = {"sensitivity": "rho2", "kappa": "on", "leverage": "A", "prior_iso": 0.0, "budget": "uniform"}


def marginal_capacity(score: torch.Tensor) -> torch.Tensor:
    r"""The capacity :math:`\tfrac12\log\det A - \tfrac12\log\det(A - (w_i/\sigma^2)u_iu_i^\top) = -\tfrac12\log(1-r_i)`
    (nats) that dropping token ``i`` alone loses, from Algorithm 1's score :math:`r_i\in[0,1)` (matrix determinant
    lemma; :func:`jacap_lib.theory.removal_loss` is the brute-force check). Strictly increasing in :math:`r_i`.
    Scores at or above 1 (rounding of a dominant token) are clamped just below 1."""
    r = score.float()
    return -0.5 * torch.log1p(-r.clamp(0.0, 1.0 - torch.finfo(r.dtype).eps))


@dataclass
class JacapAblationPress(JacapPromptPress):
    r"""JacapPromptPress with one field per component of Algorithm 1 that is not a JacapPromptPress option; every default is
    Algorithm 1's own choice.

    Parameters
    ----------
    sensitivity : {"rho2", "rho", "alpha"}, default="rho2"
        The factor :math:`s_i` in :math:`w_i = s_i\kappa_i/d`: :math:`\rho_i^2`, :math:`\rho_i` or :math:`\bar\alpha_i`.
    kappa : {"on", "mean"}, default="on"
        ``"mean"``: :math:`\kappa_i` replaced by the head's constant :math:`\bar\kappa = \sum s_i\kappa_i/\sum s_i`
        (the total weight, hence what :math:`\sigma^2` means, unchanged; not :math:`\kappa_i := 1`, which would also
        rescale every weight by :math:`1/\bar\kappa` and so move the noise scale: two changes at once).
    leverage : {"A", "identity"}, default="A"
        ``"identity"``: score :math:`w_i\lVert u_i\rVert^2/\sigma^2` (:math:`A := I`, no redundancy discount).
    prior_iso : float, default=0.0
        Widen the query prior: :math:`\Lambda_Q \to \Lambda_Q + \lambda_\mathrm{iso} I` with
        :math:`\lambda_\mathrm{iso}` = ``prior_iso`` x the mean of :math:`\mathrm{diag}\,\Lambda_Q` (per head).
        Changes :math:`\Lambda_Q` only (:meth:`query_statistics`); :math:`\mu_Q` is untouched.
    budget : {"uniform", "layer", "model"}, default="uniform"
        How the kept slots are spread. ``"uniform"``: ``n_kept`` per KV head (kvpress's top-k per head).
        ``"layer"`` / ``"model"``: the press scores tokens by their marginal capacity :math:`-\tfrac12\log(1-r_i)`
        (:func:`marginal_capacity`, nats; comparable across heads and layers because the objective adds over
        them), and the registry's ``jacap_ablate[budget=layer]`` wraps it in kvpress ``AdaKVPress`` (a layer's
        total split across its KV heads by top-k; ``alpha_safeguard=0``: the objective alone decides), while
        ``jacap_ablate[budget=model]`` wraps it in
        :class:`~jacap_lib.presses.jacap_global_budget.JacapGlobalBudgetPress`
        (the model's total split across every layer and head). Sinks and windows stay protected in every head.
        The press alone (no wrapper) keeps the same tokens as ``"uniform"`` (the transform is increasing).
    (all other parameters, ``centre`` included, default ``"observed"``: see
    :class:`~jacap_lib.presses.jacap.JacapPromptPress`)
    """

    # at its field defaults this press is JacapPromptPress (registry.changed_options reads it; a test checks it)
    same_as_parent_at_defaults: ClassVar[bool] = True

    sensitivity: str = ABLATION_FIELDS["sensitivity"]
    kappa: str = ABLATION_FIELDS["kappa"]
    leverage: str = ABLATION_FIELDS["leverage"]
    prior_iso: float = ABLATION_FIELDS["prior_iso"]
    budget: str = ABLATION_FIELDS["budget"]

    def __post_init__(self):
        super().__post_init__()
        _checks.choice("sensitivity", self.sensitivity, SENSITIVITIES)
        _checks.choice("kappa", self.kappa, KAPPAS)
        _checks.choice("leverage", self.leverage, LEVERAGES)
        _checks.choice("budget", self.budget, BUDGETS)
        _checks.positive("prior_iso", self.prior_iso, allow_zero=True)
        if self.backend == "triton" and (self.sensitivity, self.kappa, self.leverage) != ("rho2", "on", "A"):
            raise ValueError("backend='triton' computes Algorithm 1's own weight and leverage in its kernels; with a "
                             "swapped sensitivity, kappa or leverage use backend='auto' or 'torch'")

    @property
    def scoring_rules(self) -> dict:
        """The swapped components, as the options of the one Algorithm 1
        (:func:`jacap_lib.scoring.core.validated_scores`)."""
        return {"sensitivity": self.sensitivity, "kappa_rule": self.kappa, "leverage_rule": self.leverage}

    def query_statistics(self, module, hidden_states, keys, kwargs):
        """JacapPromptPress's ``(mu, lam)``, with ``lam + prior_iso * mean(lam)`` when ``prior_iso > 0``."""
        mu, lam = super().query_statistics(module, hidden_states, keys, kwargs)
        if self.prior_iso:
            lam = lam + self.prior_iso * lam.mean(-1, keepdim=True)
        return mu, lam

    def retention(self, parts) -> torch.Tensor:
        """``parts.score`` for ``budget="uniform"``, else its :func:`marginal_capacity` (comparable across heads)."""
        return parts.score if self.budget == "uniform" else marginal_capacity(parts.score)


# label -> (registry spec, what it changes relative to the default "jacap_prompt"); BASE_OF names the exceptions
ONE_KNOB: dict[str, tuple[str, str]] = {
    "centre=ea": ("jacap_ablate[centre=ea]",
                  "centre: Expected Attention's log-normal expectation softmax(K mu/sqrt d + diag(K Lambda K^T)/(2d)), "
                  "no tau, instead of the tempered softmax(K mu/(tau sqrt d))"),
    "centre=observed": ("jacap_ablate[centre=observed]",
                        "centre: the attention the prompt's queries actually paid (own RoPE positions, causal), "
                        "averaged with mu's EMA weights, no tau, instead of the tempered softmax"),
    "rope-average=off": ("jacap_prompt[n_future_positions=1]",
                         "query statistics: queries rotated to the next position only, not RoPE-averaged over "
                         "512 future positions"),
    "queries=32": ("jacap_prompt[n_queries=32]", "query statistics from the last 32 prompt queries instead of all (the "
                                          "EMA, beta 0.9, gives the older ones 0.9^32 of the weight in all)"),
    "queries=128": ("jacap_prompt[n_queries=128]", "query statistics from the last 128 prompt queries instead of all (the "
                                            "EMA gives the older ones 0.9^128 of the weight in all)"),
    "stats=flat": ("jacap_prompt[beta=none]", "query statistics: flat mean/variance over the prompt's queries instead "
                                       "of the EMA (beta 0.9)"),
    "sensitivity=rho": ("jacap_ablate[sensitivity=rho]", "sensitivity factor rho instead of rho^2"),
    "sensitivity=alpha": ("jacap_ablate[sensitivity=alpha]", "sensitivity factor alpha-bar instead of rho^2"),
    "kappa=off": ("jacap_ablate[kappa=mean]",
                  "response variance off: kappa_i replaced by the head's weighted mean kappa (total weight "
                  "unchanged)"),
    "leverage=I": ("jacap_ablate[leverage=identity]",
                   "leverage off: A := I, score w_i |u_i|^2 / sigma^2 (no redundancy discount)"),
    "u=W_O v": ("jacap_prompt_wo", "output directions u = W_O v (the head's output-projection slice) instead of v"),
    "selection=two-stage": ("jacap_two_stage",
                            "selection: top-2B candidates, then alpha-bar, w and A recomputed on them and rescored, "
                            "instead of one shot"),
    "budget=layer": ("jacap_ablate[budget=layer]",
                     "budget: a layer's total split across its KV heads by top-k of the marginal capacity "
                     "-1/2 log(1 - r_i) (kvpress AdaKV, no safeguard) instead of the same budget per head"),
    "budget=model": ("jacap_ablate[budget=model]",
                     "budget: the model's total split across all layers and KV heads by top-k of the marginal "
                     "capacity -1/2 log(1 - r_i) instead of the same budget per head"),
    "prior=isotropic": ("jacap_ablate[prior_iso=1]",
                        "query prior widened: Lambda_Q + mean(diag Lambda_Q) I (an isotropic part as large as "
                        "the mean variance)"),
    "prior=3-centres": ("jacap_multicenter",
                        "query prior: 3 k-means centres per KV head (max of normalised scores) instead of one "
                        "Gaussian; flat statistics (its base is jacap_prompt[beta=none])"),
}

# the spec each ablation changes one knob of, where it is not the default "jacap_prompt"
BASE_OF: dict[str, str] = {"prior=3-centres": "jacap_prompt[beta=none]"}


def base_spec(label: str) -> str:
    """The spec ``ONE_KNOB[label]`` differs from in exactly one respect (``"jacap_prompt"`` unless :data:`BASE_OF` says)."""
    if label not in ONE_KNOB:
        raise ValueError(f"unknown ablation {label!r}; valid labels: {', '.join(ONE_KNOB)}")
    return BASE_OF.get(label, "jacap_prompt")

