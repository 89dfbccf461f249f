r"""Jacap with the exact softmax competition term (note §14.3, "keep the rank-one correction").

Algorithm 1 replaces :math:`S=\mathrm{Diag}(\bar\alpha)-\bar\alpha\bar\alpha^\top` by its diagonal.
Keeping :math:`S` exactly (and :math:`K\Lambda K^\top\approx\mathrm{Diag}(\kappa)` as before),

.. math::

    \tfrac1d\,U S\,\mathrm{Diag}(\kappa)\,S U^\top
      = \sum_i \frac{\bar\alpha_i^2\kappa_i}{d}\,(u_i-\bar u)(u_i-\bar u)^\top,
      \qquad \bar u=\sum_j\bar\alpha_j u_j,

since column :math:`i` of :math:`US` is :math:`\bar\alpha_i(u_i-\bar u)`. The per-token weight this
implies is :math:`w'_i=\bar\alpha_i^2\kappa_i/d` (not :math:`\rho_i^2\kappa_i/d`) on the *centred*
direction :math:`u_i-\bar u`: a dominant token (:math:`\bar\alpha_i\to1`) has :math:`u_i\approx\bar u`
and loses its leverage through the centring, not through :math:`\rho_i`. Cost :math:`O(Nd^2)`, no
:math:`N\times N` matrix (the math lives in
:func:`jacap_lib.scoring.rank_one.rank_one_corrected_scores`). Registry name ``jacap_rank1``,
file ``jacap_rank1.py``, class :class:`JacapRank1Press`.
"""
from __future__ import annotations

from dataclasses import dataclass

from transformers.models.llama.modeling_llama import repeat_kv

from ..scoring.rank_one import rank_one_corrected_scores
from . import utils
from .jacap import TemperedCentrePress

__all__ = ["JacapRank1Press"]


@dataclass
class JacapRank1Press(TemperedCentrePress):
    """JacapPromptPress scoring with the exact softmax Jacobian ``S = Diag(alpha) - alpha alpha^T``.

    Parameters: those of :class:`~jacap_lib.presses.jacap.JacapPromptPress`, with ``centre="tempered"`` (its default and
    only centre), a numeric ``noise`` (the ``"deff"`` rule is not implemented for the centred scoring; it is refused
    when scoring) and ``backend`` ignored (the centred scoring runs in torch).
    """

    def components(self, keys, values, mu, lam, module, alpha=None, key_mask=None):
        """The centred scores (``alpha``, ``key_mask`` unused: the tempered centre is rebuilt over every slot)."""
        out_proj = utils.out_proj_factors(module, pooled=self.gqa == "pool").to(keys.device) if self.use_out_proj else None
        if self.gqa == "mean":
            g = mu.shape[1] // keys.shape[1]
            keys, values = repeat_kv(keys, g), repeat_kv(values, g)
        parts = rank_one_corrected_scores(keys, values, mu, lam, tau=self.tau, noise=self.noise, out_proj=out_proj)
        if self.gqa == "mean":
            b, h, n = parts.score.shape
            parts = parts.map(lambda t: t.view(b, h // g, g, n).mean(2))
        return parts
