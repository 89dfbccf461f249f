"""Exercises of the chapter labelled ``error-decomposition`` (where Algorithm 1's error comes from)."""
from __future__ import annotations

import torch

from ..config import DEFAULTS
from ._core import Exercise, number

CHAPTER = "error-decomposition"


def _head():
    g = torch.Generator().manual_seed(8)
    n, d = 200, 16
    K = torch.randn(n, d, generator=g, dtype=torch.float64)
    V = torch.randn(n, d, generator=g, dtype=torch.float64)
    mu = 2.0 * torch.randn(d, generator=g, dtype=torch.float64)
    lam = 0.1 + torch.rand(d, generator=g, dtype=torch.float64)
    return {"K": K, "V": V, "mu": mu, "lam": lam, "tau": DEFAULTS.tau}


def _deff(K, V, mu, lam, tau):
    from ..scoring import jacap_scores

    return float(jacap_scores(K, V, mu, lam, tau=tau, noise=1.0).score.sum())


def _damage_data():
    g = torch.Generator().manual_seed(9)
    K = torch.randn(12, 8, generator=g, dtype=torch.float64)
    U = torch.randn(4, 12, generator=g, dtype=torch.float64)
    q = 3.0 * torch.randn(8, generator=g, dtype=torch.float64)
    return {"K": K, "U": U, "q": q, "i": 5}


def _damage(K, U, q, i):
    from ..theory import attention

    keep = [j for j in range(K.shape[0]) if j != i]
    return float((attention(K, U, q) - attention(K[keep], U[:, keep], q)).norm())


EXERCISES = [
    Exercise(
        "With K, V, mu, lam, tau from exercises.data('error-decomposition.1') (u = v, sigma^2 = 1), compute the "
        "effective dimension sum_k lambda_k / (lambda_k + 1) from the eigenvalues lambda_k of "
        "G = sum_i w_i v_i v_i^T, where w_i = [alpha_i (1 - alpha_i)]^2 k_i^T Lambda k_i / d and alpha is the "
        "softmax of K mu / (tau sqrt(d)). (It equals the sum of Algorithm 1's scores.)",
        lambda: _deff(**_head()),
        number(rtol=1e-6, slips={2.0: "A factor 2: (1 - alpha)^2, not 2 (1 - alpha)."},
               hint="Build w from alpha, rho = alpha (1 - alpha) and kappa = (K**2 * lam).sum(-1); then "
                    "torch.linalg.eigvalsh of (V * w[:, None]).T @ V."),
        data=_head),
    Exercise(
        "With K, U (columns u_j), q and i from exercises.data('error-decomposition.2'), compute the deletion damage "
        "||f_C(q) - f_{C without i}(q)|| using only alpha = softmax(K q / sqrt(d)) over all 12 tokens and U — "
        "no second softmax. (Hint: f_C - f_{C without i} = alpha_i (u_i - f_{C without i}).)",
        lambda: _damage(**_damage_data()),
        number(rtol=1e-9, hint="f_{C without i} = (f_C - alpha_i u_i) / (1 - alpha_i)."),
        data=_damage_data),
]
