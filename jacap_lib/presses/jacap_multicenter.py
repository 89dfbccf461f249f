r"""Multi-centre Jacap (note §13.1, §14.3, "use several query centres").

A single Gaussian :math:`\mathcal N(\mu_Q,\Lambda_Q)` averages incompatible query modes (planning vs
computing vs checking). This press clusters each KV head's prompt queries (k-means, ``n_centers``
centres, deterministic initialisation at evenly spaced positions in time), fits
:math:`(\mu_c,\Lambda_c)` per cluster, runs Algorithm 1 once per centre, and aggregates:

* ``aggregate="mean"``: :math:`s_i=\sum_c \pi_c\, r^{(c)}_i` (:math:`\pi_c` = cluster share);
* ``aggregate="max"``: :math:`s_i=\max_c r^{(c)}_i/\sum_j r^{(c)}_j` — a token needed by any mode is kept
  (the worst-case view).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..stats import moment_stats
from . import utils
from .jacap import TemperedCentrePress

__all__ = ["JacapMultiCenterPress", "kmeans"]


def kmeans(x: torch.Tensor, n_centers: int, iters: int = 10) -> torch.Tensor:
    """Cluster labels ``(..., T)`` for points ``x (..., T, d)``; centres start at evenly spaced points."""
    t = x.shape[-2]
    k = min(n_centers, t)
    init = torch.linspace(0, t - 1, k, device=x.device).round().long()
    centers = x[..., init, :].clone()
    labels = None
    for _ in range(iters):
        labels = torch.cdist(x, centers).argmin(-1)  # (..., T)
        onehot = torch.nn.functional.one_hot(labels, k).to(x.dtype)  # (..., T, k)
        counts = onehot.sum(-2)  # (..., k)
        sums = onehot.transpose(-1, -2) @ x  # (..., k, d)
        new = sums / counts.clamp_min(1).unsqueeze(-1)
        centers = torch.where(counts.unsqueeze(-1) > 0, new, centers)
    return labels


@dataclass
class JacapMultiCenterPress(TemperedCentrePress):
    """JacapPromptPress with ``n_centers`` query centres per KV head (``gqa="pool"`` only).

    Parameters
    ----------
    n_centers : int, default=3
        k-means clusters of each KV head's prompt queries (fewer when there are fewer queries).
    aggregate : {"mean", "max"}, default="max"
        ``"mean"``: the cluster-share-weighted sum of the per-centre scores; ``"max"``: the maximum over centres of
        the scores normalised to sum to one per head.
    kmeans_iters : int, default=10
        Lloyd iterations of the k-means.
    beta : None, default=None
        Must be None (flat statistics per cluster; JacapPromptPress's default is an EMA).
    (all other parameters: see :class:`~jacap_lib.presses.jacap.JacapPromptPress`; ``centre="tempered"`` is the default
    and only centre: each cluster's tempered softmax)
    """

    beta: float | None = None  # the clusters replace the prompt EMA (JacapPromptPress's default is an EMA)
    n_centers: int = 3
    aggregate: str = "max"
    kmeans_iters: int = 10

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.n_centers, bool) or not (isinstance(self.n_centers, int) and self.n_centers >= 1):
            raise ValueError(f"n_centers must be a positive int, got {self.n_centers!r}")
        if isinstance(self.kmeans_iters, bool) or not (isinstance(self.kmeans_iters, int) and self.kmeans_iters >= 1):
            raise ValueError(f"kmeans_iters must be a positive int, got {self.kmeans_iters!r}")
        if self.aggregate not in ("mean", "max"):
            raise ValueError(f"aggregate must be 'mean' or 'max', got {self.aggregate!r}")
        if self.gqa != "pool" or self.beta is not None:
            raise ValueError("JacapMultiCenterPress needs gqa='pool' and beta=None (clusters replace the EMA)")

    def center_statistics(self, module, hidden_states, keys, kwargs=None):
        """``(mu, lam, share)``: ``(C, B, H_kv, d)``, ``(C, B, H_kv, d)``, ``(C, B, H_kv)``."""
        query_pos, _, next_pos = utils.hook_positions(hidden_states, keys, kwargs or {})
        q = utils.future_query_states(module, hidden_states, n_queries=self.n_queries, skip=self.n_sink,
                                      n_future_positions=self.n_future_positions, positions=query_pos,
                                      next_position=next_pos).float()
        q = utils.group_query_heads(q, keys.shape[1])  # (B, H_kv, G*T, d)
        labels = kmeans(q, self.n_centers, self.kmeans_iters)
        onehot = torch.nn.functional.one_hot(labels, min(self.n_centers, q.shape[-2])).float()  # (B,H,T,C)
        counts = onehot.sum(-2)  # (B, H, C)
        w = onehot / counts.clamp_min(1).unsqueeze(-2)
        mu, lam = moment_stats(torch.einsum("bhtc,bhtd->cbhd", w, q), torch.einsum("bhtc,bhtd->cbhd", w, q.square()),
                               self.eps)
        share = (counts / counts.sum(-1, keepdim=True)).permute(2, 0, 1)
        return mu, lam, share

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        mu, lam, share = self.center_statistics(module, hidden_states, keys, kwargs)
        total = None
        for c in range(mu.shape[0]):
            r = self.token_scores(keys, values, mu[c], lam[c], module).float()
            if self.aggregate == "mean":
                part = share[c].unsqueeze(-1) * r
                total = part if total is None else total + part
            else:
                part = r / r.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
                part = torch.where(share[c].unsqueeze(-1) > 0, part, torch.zeros_like(part))
                total = part if total is None else torch.maximum(total, part)
        return self.protect(total, hidden_states, keys, kwargs)
