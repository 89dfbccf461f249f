r"""Cost model of Algorithm 1 and the inverse-versus-solve experiment (chapter 5).

:func:`step_costs` counts floating-point operations and bytes moved per step for one head.
:func:`inverse_vs_solve` builds ``A = I + sum_j w_j u_j u_j^T`` with a chosen condition number
and measures, in float32, the leverages ``u_i^T A^{-1} u_i`` obtained three ways against a float64
reference: through the explicit inverse, through Cholesky + triangular solve (the torch reference),
and through ``L^{-1}`` formed once by a triangular solve on the identity (the Triton path).
"""
from __future__ import annotations

import math

import torch

__all__ = ["step_costs", "inverse_vs_solve", "ill_conditioned_system", "inverse_vs_solve_table", "error_per_condition"]


def step_costs(N: int, d: int, *, bytes_per_scalar: int = 2) -> list[dict]:
    """FLOPs and bytes read for each step of Algorithm 1 on one head (``u = v``, ``d_k = d_v = d``).

    Multiply-adds count as 2 FLOPs; the Gram counts the full ``d x d`` product (a kernel may halve
    it by symmetry). ``bytes`` are the cache bytes each step must read (K or V at
    ``bytes_per_scalar``), the floor being one read of K and V: ``2 N d bytes_per_scalar``.
    """
    for name, v in (("N", N), ("d", d), ("bytes_per_scalar", bytes_per_scalar)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"`{name}` must be a positive int, got {v!r}")
    kv = N * d * bytes_per_scalar
    return [
        {"step": "logits k.mu, softmax", "order": "O(N d)", "flops": 2 * N * d + 5 * N, "bytes": kv},
        {"step": "kappa = sum lam k^2, weight", "order": "O(N d)", "flops": 3 * N * d + 5 * N, "bytes": 0},
        {"step": "Gram sum w u u^T", "order": "O(N d^2)", "flops": 2 * N * d * d + N * d, "bytes": kv},
        {"step": "Cholesky of A", "order": "O(d^3)", "flops": d**3 // 3, "bytes": 0},
        {"step": "L^-1 (solve on I)", "order": "O(d^3)", "flops": d**3 // 3, "bytes": 0},
        {"step": "leverage |L^-1 u|^2, score", "order": "O(N d^2)", "flops": 2 * N * d * d + 2 * N * d, "bytes": kv},
    ]


def ill_conditioned_system(cond: float, *, d: int = 64, N: int = 512, n_copies: int = 16, seed: int = 0):
    """``U`` (float64, ``(N + n_copies, d)``) with ``A = I + sum_j u_j u_j^T`` of condition number about ``cond``.

    ``N`` values are random directions whose covariance has eigenvalues spread geometrically from
    ``1e-3`` to ``cond`` (a cache whose values crowd into a few directions); ``n_copies`` more are
    near-copies of the most covered direction, whose exact leverage is tiny (about ``1 / cond``).
    """
    if isinstance(cond, bool) or not isinstance(cond, (int, float)) or not (math.isfinite(cond) and cond > 2):
        raise ValueError(f"`cond` must be a finite number > 2, got {cond!r}")
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    spectrum = torch.logspace(-3, math.log10(cond), d, dtype=torch.float64)  # eigenvalues of sum u u^T
    Z = torch.randn(N, d, generator=g, dtype=torch.float64)
    Z = Z @ torch.linalg.inv(torch.linalg.cholesky(Z.T @ Z)).T  # whitened: Z^T Z = I
    U = Z @ torch.diag(spectrum.sqrt()) @ Q.T
    copies = Q[:, -1] + 1e-3 * torch.randn(n_copies, d, generator=g, dtype=torch.float64)
    return torch.cat([U, copies])


def inverse_vs_solve(conds=(1e3, 1e4, 1e5, 1e6, 1e7, 1e8), *, d: int = 64, N: int = 512, seed: int = 0) -> list[dict]:
    """Float32 leverages ``u_i^T A^{-1} u_i`` of every token three ways, against float64.

    ``A = I + sum_j u_j u_j^T`` is accumulated in float32 (as the kernels do). The reference is
    the float64 Cholesky solve *on that same float32 matrix*, so the errors are those of the
    solve step alone; ``formation_rel_err`` separately gives how far rounding ``A`` itself to
    float32 moves the exact leverages (a floor no float32 method can beat).

    Returns one row per condition number: ``cond`` (of the float32 ``A``, measured in float64)
    and, for ``inverse`` (``u^T inv(A) u``), ``cholesky_solve`` (``|L^{-1} u|^2`` by a triangular
    solve per token, the torch reference) and ``triangular_inverse`` (``L^{-1}`` once, then
    ``|L^{-1} u|^2``, the Triton path), the median and maximum relative error over tokens and the
    count of negative leverages (impossible in exact arithmetic: ``A`` is positive definite).
    When rounding makes the float32 ``A`` indefinite, float32 Cholesky fails (the library then
    retries with jitter and warns) and the inverse is compared with the float64 exact values.
    """
    rows = []
    for c in conds:
        U = ill_conditioned_system(c, d=d, N=N, seed=seed)
        U32 = U.float()
        A32 = torch.eye(d) + U32.T @ U32
        A64 = torch.eye(d, dtype=torch.float64) + U.T @ U
        exact64 = torch.linalg.solve_triangular(torch.linalg.cholesky(A64), U.T, upper=False).square().sum(0)
        L_ref, info_ref = torch.linalg.cholesky_ex(A32.double())
        pd32 = int(info_ref) == 0  # rounding A to float32 can destroy positive definiteness
        exact = torch.linalg.solve_triangular(L_ref, U32.double().T, upper=False).square().sum(0) if pd32 else exact64
        L32, info = torch.linalg.cholesky_ex(A32)
        methods = {"inverse": ((U32 @ torch.linalg.inv(A32)) * U32).sum(-1)}
        if int(info) == 0:
            methods["cholesky_solve"] = torch.linalg.solve_triangular(L32, U32.T, upper=False).square().sum(0)
            Linv = torch.linalg.solve_triangular(L32, torch.eye(d), upper=False)
            methods["triangular_inverse"] = (U32 @ Linv.T).square().sum(-1)
        row = {"cond_target": float(c), "cond": float(torch.linalg.cond(A32.double())),
               "float32_A_positive_definite": pd32, "cholesky_ok_float32": int(info) == 0,
               "formation_rel_err": float(((exact - exact64).abs() / exact64).median()) if pd32 else None}
        for name, lev in methods.items():
            rel = (lev.double() - exact).abs() / exact
            row[name] = {"median_rel_err": float(rel.median()), "max_rel_err": float(rel.max()),
                         "negative": int((lev < 0).sum())}
        rows.append(row)
    return rows


_ROUTES = {"inverse": "explicit inverse", "cholesky_solve": "Cholesky + triangular solve",
           "triangular_inverse": "L^-1 formed once (the Triton route)"}


def inverse_vs_solve_table(rows: list[dict]) -> list[dict]:
    """:func:`inverse_vs_solve`'s result flattened to one row per condition number: the median and
    largest relative leverage error of each route, the count of negative leverages of the inverse, and
    whether float32 ``A`` was still positive definite (a route Cholesky refused is ``None``)."""
    out = []
    for r in rows:
        row = {"cond(A)": r["cond"], "float32 A positive definite": bool(r["float32_A_positive_definite"]),
               "rounding A to float32 (rel. error)": r.get("formation_rel_err")}
        for key, name in _ROUTES.items():
            res = r.get(key)
            row[f"{name}: median"] = None if res is None else res["median_rel_err"]
            row[f"{name}: max"] = None if res is None else res["max_rel_err"]
        row["negative leverages (inverse)"] = r["inverse"]["negative"]
        out.append(row)
    return out


def error_per_condition(rows: list[dict]) -> dict:
    """Median over the positive-definite rows of (median relative leverage error) / cond(A), per route,
    and the same for the error of merely rounding ``A`` to float32 — the constant c in err ~ c cond(A)."""
    import statistics

    ok = [r for r in rows if r["float32_A_positive_definite"] and r.get("cholesky_solve")]
    if not ok:
        raise ValueError("no row with a positive definite float32 A: nothing to fit")
    out = {name: statistics.median(r[key]["median_rel_err"] / r["cond"] for r in ok) for key, name in _ROUTES.items()}
    out["rounding A to float32"] = statistics.median(r["formation_rel_err"] / r["cond"] for r in ok)
    return out
