r"""One-knob ablations of Jacap's Algorithm 1: every component can be swapped alone.

Algorithm 1 scores token :math:`i` of one KV head by

.. math::

    r_i = \frac{w_i}{\sigma^2}\,u_i^\top A^{-1}u_i,\qquad
    w_i = s(\bar\alpha_i)\,\kappa_i/d,\qquad A = I + \textstyle\sum_j (w_j/\sigma^2)\,u_ju_j^\top,

with the *centre* :math:`\bar\alpha` (default: the tempered softmax of :math:`K\mu_Q/(\tau\sqrt d)`), the
*sensitivity factor* :math:`s = \rho^2`, :math:`\rho_i = \bar\alpha_i(1-\bar\alpha_i)`, the *response variance*
:math:`\kappa_i = k_i^\top\Lambda_Q k_i` and the *leverage* :math:`u_i^\top A^{-1}u_i`.
:class:`JacapAblationPress` has one field per component; each field's default is Algorithm 1's choice, and with
every field at its default the press *is* :class:`~jacap_lib.presses.jacap.JacapPress` (same code path, same
scores bit for bit). :data:`ONE_KNOB` lists the one-knob ablations as registry specs (label -> spec, what it
changes); ablations that an existing registry name or option already expresses (``u = W_O v``: ``jacap_wo``;
two-stage selection: ``jacap_two_stage``; the query window: ``jacap[n_queries=32]``) use it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers.models.llama.modeling_llama import repeat_kv

from .. import _checks
from ..scoring import JacapScores
from ..scoring.contract import compute_dtype, validate_inputs
from ..scoring.core import leverage as leverage_of
from ..scoring.noise import deff_noise, weighted_gram
from . import utils
from .jacap import JacapPress
from .utils import observed_attention  # noqa: F401  (re-exported: the observed centre's one home is utils)

__all__ = ["JacapAblationPress", "ablation_components", "observed_attention", "marginal_capacity", "ONE_KNOB",
           "BASE_OF", "base_spec", "CENTRES", "SENSITIVITIES", "KAPPAS", "LEVERAGES", "BUDGETS"]

CENTRES = ("tempered", "ea", "observed")
SENSITIVITIES = ("rho2", "rho", "alpha")
KAPPAS = ("on", "mean")
LEVERAGES = ("A", "identity")
BUDGETS = ("uniform", "layer", "model")


def marginal_capacity(score: torch.Tensor) -> torch.Tensor:
    r"""The capacity :math:`\tfrac12\log\det A - \tfrac12\log\det(A - (w_i/\sigma^2)u_iu_i^\top) = -\tfrac12\log(1-r_i)`
    (nats) that dropping token ``i`` alone loses, from Algorithm 1's score :math:`r_i\in[0,1)` (matrix determinant
    lemma; :func:`jacap_lib.theory.removal_loss` is the brute-force check). Strictly increasing in :math:`r_i`.
    Scores at or above 1 (rounding of a dominant token) are clamped just below 1."""
    r = score.float()
    return -0.5 * torch.log1p(-r.clamp(0.0, 1.0 - torch.finfo(r.dtype).eps))


def ablation_components(keys, values, mu, lam, *, tau: float, noise, centre: str = "tempered",
                        alpha: torch.Tensor | None = None, sensitivity: str = "rho2", kappa: str = "on",
                        leverage: str = "A", deff_target=None, out_proj: torch.Tensor | None = None) -> JacapScores:
    r"""Algorithm 1 with any component swapped, dense torch in float32 (float64 for float64 inputs): ``(..., N)``
    fields like :func:`jacap_lib.jacap_scores` (``kappa`` = the :math:`\kappa` actually used).

    ``centre``: ``"tempered"`` :math:`\mathrm{softmax}(K\mu/(\tau\sqrt d))`; ``"ea"`` Expected Attention's log-normal
    expectation :math:`\mathrm{softmax}(K\mu/\sqrt d + \mathrm{diag}(K\Lambda K^\top)/(2d))` (no :math:`\tau`);
    ``"observed"``: the given ``alpha`` (``(..., N)``, e.g. :func:`observed_attention`).
    ``sensitivity``: :math:`s = \rho^2` (``"rho2"``), :math:`\rho` or :math:`\bar\alpha`.
    ``kappa``: ``"on"`` :math:`\kappa_i = k_i^\top\Lambda k_i`; ``"mean"`` every token gets the head's
    :math:`\bar\kappa = \sum_i s_i\kappa_i / \sum_i s_i`, so the total weight :math:`\sum_i w_i` (the scale the noise
    :math:`\sigma^2` is compared with) is unchanged and only the token-to-token variation of :math:`\kappa` goes.
    ``leverage``: ``"A"`` :math:`u_i^\top A^{-1}u_i`; ``"identity"`` :math:`\lVert u_i\rVert^2` (:math:`A := I`).
    ``noise``, ``deff_target``, ``out_proj``: as in :func:`jacap_lib.jacap_scores` (the effective-dimension rule is
    applied to the Gram of the weights actually used).
    """
    validate_inputs(keys, values, mu, lam, out_proj)
    cdt = compute_dtype(keys.dtype)
    with torch.no_grad():
        k, v = keys.to(cdt), values.to(cdt)
        mu_, lam_ = mu.to(cdt).unsqueeze(-1), lam.to(cdt).unsqueeze(-1)
        d = k.shape[-1]
        logits = (k @ mu_).squeeze(-1)
        kap = (k.square() @ lam_).squeeze(-1)
        if centre == "tempered":
            a = torch.softmax(logits / (tau * math.sqrt(d)), dim=-1)
        elif centre == "ea":
            a = torch.softmax(logits / math.sqrt(d) + kap / (2 * d), dim=-1)
        elif centre == "observed":
            if alpha is None:
                raise ValueError("centre='observed' needs `alpha`, the observed attention (the press computes it "
                                 "from the hidden states in score())")
            a = torch.broadcast_to(alpha.to(device=k.device, dtype=cdt), logits.shape)
        else:
            raise ValueError(f"`centre` must be one of {CENTRES}, got {centre!r}")
        rho = a * (1.0 - a)
        s = {"rho2": rho.square(), "rho": rho, "alpha": a}[sensitivity]
        if kappa == "mean":
            total = s.sum(-1, keepdim=True)
            kbar = torch.where(total > 0, (s * kap).sum(-1, keepdim=True) / total.clamp_min(torch.finfo(cdt).tiny),
                               kap.mean(-1, keepdim=True))
            kap = kbar.expand_as(kap)
        weight = s * kap / d
        u = v if out_proj is None else v @ out_proj.to(device=v.device, dtype=cdt).transpose(-1, -2)
        lead = tuple(weight.shape[:-1])
        if isinstance(noise, str):
            target = deff_target if isinstance(deff_target, torch.Tensor) else torch.tensor(float(deff_target))
            sigma2 = deff_noise(torch.linalg.eigvalsh(weighted_gram(u, weight).to(torch.float64)),
                                torch.broadcast_to(target.to(k.device, torch.float64), lead)).to(cdt)
        else:
            sigma2 = torch.full(lead, float(noise), dtype=cdt, device=k.device)
        if leverage == "A":
            lev = leverage_of(u, weight, sigma2)
        elif leverage == "identity":
            lev = u.square().sum(-1)
        else:
            raise ValueError(f"`leverage` must be one of {LEVERAGES}, got {leverage!r}")
        score = weight / sigma2.unsqueeze(-1) * lev
    out = JacapScores(alpha=a, rho=rho, kappa=kap, weight=weight, leverage=lev, score=score)
    return out.map(lambda t: t.contiguous().to(torch.float32))


@dataclass
class JacapAblationPress(JacapPress):
    r"""JacapPress with one field per component of Algorithm 1; every default is Algorithm 1's own choice.

    Parameters
    ----------
    centre : {"tempered", "ea", "observed"}, default="tempered"
        The centre :math:`\bar\alpha`: ``"tempered"`` :math:`\mathrm{softmax}(K\mu_Q/(\tau\sqrt d))`;
        ``"ea"`` Expected Attention's log-normal expectation
        :math:`\mathrm{softmax}(K\mu_Q/\sqrt d + \mathrm{diag}(K\Lambda_Q K^\top)/(2d))` (no :math:`\tau`);
        ``"observed"`` the attention the recent prompt queries actually paid
        (:func:`observed_attention`: the rows and weights of :math:`\mu_Q`, each query at its own RoPE position,
        causal, no :math:`\tau`).
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
    (all other parameters: see :class:`~jacap_lib.presses.jacap.JacapPress`)
    """

    # at its field defaults this press is JacapPress (registry.changed_options reads it; a test checks it)
    same_as_parent_at_defaults: ClassVar[bool] = True

    centres: ClassVar[tuple] = CENTRES
    sensitivity: str = "rho2"
    kappa: str = "on"
    leverage: str = "A"
    prior_iso: float = 0.0
    budget: str = "uniform"

    def __post_init__(self):
        super().__post_init__()
        _checks.choice("sensitivity", self.sensitivity, SENSITIVITIES)
        _checks.choice("kappa", self.kappa, KAPPAS)
        _checks.choice("leverage", self.leverage, LEVERAGES)
        _checks.choice("budget", self.budget, BUDGETS)
        _checks.positive("prior_iso", self.prior_iso, allow_zero=True)

    @property
    def algorithm1_scoring(self) -> bool:
        """True when the scoring fields are JacapPress's own (sensitivity, kappa, leverage at Algorithm 1's choice and
        a centre JacapPress offers): then :meth:`components` is JacapPress's, the same code path and scores."""
        return self.centre in JacapPress.centres and (self.sensitivity, self.kappa, self.leverage) == ("rho2", "on", "A")

    def query_statistics(self, module, hidden_states, keys, kwargs):
        """JacapPress's ``(mu, lam)``, with ``lam + prior_iso * mean(lam)`` when ``prior_iso > 0``."""
        mu, lam = super().query_statistics(module, hidden_states, keys, kwargs)
        if self.prior_iso:
            lam = lam + self.prior_iso * lam.mean(-1, keepdim=True)
        return mu, lam

    def components(self, keys, values, mu, lam, module, alpha: torch.Tensor | None = None) -> JacapScores:
        """Algorithm 1's per-token quantities with this press's components (``alpha``: the observed centre)."""
        if self.algorithm1_scoring:
            return super().components(keys, values, mu, lam, module, alpha)
        out_proj = None
        if self.use_out_proj:
            out_proj = utils.out_proj_factors(module, pooled=self.gqa == "pool").to(keys.device)
        g = mu.shape[1] // keys.shape[1] if self.gqa == "mean" else 1
        if g > 1:
            keys, values = repeat_kv(keys, g), repeat_kv(values, g)
        noise = self.noise if isinstance(self.noise, str) else float(self.noise)
        parts = ablation_components(keys, values, mu, lam, tau=float(self.tau), noise=noise, centre=self.centre,
                                    alpha=alpha, sensitivity=self.sensitivity, kappa=self.kappa,
                                    leverage=self.leverage, deff_target=self.deff_target(keys), out_proj=out_proj)
        if g > 1:
            b, h, n = parts.score.shape
            parts = parts.map(lambda t: t.view(b, h // g, g, n).mean(2))
        return parts

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        mu, lam = self.query_statistics(module, hidden_states, keys, kwargs)
        alpha = self.centre_attention(module, hidden_states, keys, kwargs)
        parts = self.components(keys, values, mu, lam, module, alpha)
        scores = parts.score if self.budget == "uniform" else marginal_capacity(parts.score)
        if self.trace is not None:
            self.trace[module.layer_idx] = {"mu": mu, "lam": lam, "score": scores, "parts": parts}
        return self.protect(scores, hidden_states, keys, kwargs)


# label -> (registry spec, what it changes relative to the default "jacap"); BASE_OF names the exceptions
ONE_KNOB: dict[str, tuple[str, str]] = {
    "centre=ea": ("jacap_ablate[centre=ea]",
                  "centre: Expected Attention's log-normal expectation softmax(K mu/sqrt d + diag(K Lambda K^T)/(2d)), "
                  "no tau, instead of the tempered softmax(K mu/(tau sqrt d))"),
    "centre=observed": ("jacap_ablate[centre=observed]",
                        "centre: the attention the prompt's queries actually paid (own RoPE positions, causal), "
                        "averaged with mu's EMA weights, no tau, instead of the tempered softmax"),
    "rope-average=off": ("jacap[n_future_positions=1]",
                         "query statistics: queries rotated to the next position only, not RoPE-averaged over "
                         "512 future positions"),
    "queries=32": ("jacap[n_queries=32]", "query statistics from the last 32 prompt queries instead of all (the "
                                          "EMA, beta 0.9, gives the older ones 0.9^32 of the weight in all)"),
    "queries=128": ("jacap[n_queries=128]", "query statistics from the last 128 prompt queries instead of all (the "
                                            "EMA gives the older ones 0.9^128 of the weight in all)"),
    "stats=flat": ("jacap[beta=none]", "query statistics: flat mean/variance over the prompt's queries instead "
                                       "of the EMA (beta 0.9)"),
    "sensitivity=rho": ("jacap_ablate[sensitivity=rho]", "sensitivity factor rho instead of rho^2"),
    "sensitivity=alpha": ("jacap_ablate[sensitivity=alpha]", "sensitivity factor alpha-bar instead of rho^2"),
    "kappa=off": ("jacap_ablate[kappa=mean]",
                  "response variance off: kappa_i replaced by the head's weighted mean kappa (total weight "
                  "unchanged)"),
    "leverage=I": ("jacap_ablate[leverage=identity]",
                   "leverage off: A := I, score w_i |u_i|^2 / sigma^2 (no redundancy discount)"),
    "u=W_O v": ("jacap_wo", "output directions u = W_O v (the head's output-projection slice) instead of v"),
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
                        "Gaussian; flat statistics (its base is jacap[beta=none])"),
}

# the spec each ablation changes one knob of, where it is not the default "jacap"
BASE_OF: dict[str, str] = {"prior=3-centres": "jacap[beta=none]"}


def base_spec(label: str) -> str:
    """The spec ``ONE_KNOB[label]`` differs from in exactly one respect (``"jacap"`` unless :data:`BASE_OF` says)."""
    if label not in ONE_KNOB:
        raise ValueError(f"unknown ablation {label!r}; valid labels: {', '.join(ONE_KNOB)}")
    return BASE_OF.get(label, "jacap")

