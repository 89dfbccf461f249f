"""Figures of the theory chapters (00–03). Each function returns a ``plotly.graph_objects.Figure``.

Figures that move carry a slider whose steps were computed in Python (``restyle`` with the
full data of every trace), so they move in the static site without a kernel.
"""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from jacap_lib import theory as T
from jacap_lib import examples as W
from jacap_lib import memory as MEM
from .style import finish

_DATA_KEYS = ("x", "y", "z", "text")


def _add_slider(fig: go.Figure, frames: list[list[go.BaseTraceType]], labels, prefix: str, active: int = 0) -> go.Figure:
    """Start ``fig`` from ``frames[active]`` and add a slider whose step k restyles to ``frames[k]``.

    Every frame must hold the same number of traces in the same order (only data changes).
    """
    if not frames or len(frames) != len(labels):
        raise ValueError("`frames` and `labels` must be non-empty lists of the same length")
    n = len(frames[0])
    if any(len(f) != n for f in frames):
        raise ValueError("every frame must have the same number of traces")
    active = min(active, len(frames) - 1)
    for trace in frames[active]:
        fig.add_trace(trace)
    steps = []
    for label, frame in zip(labels, frames):
        update = {}
        for key in _DATA_KEYS:
            if all(key in tr and tr[key] is not None for tr in frame):
                update[key] = [_plain(tr[key]) for tr in frame]
        steps.append(dict(method="restyle", label=str(label), args=[update]))
    fig.update_layout(sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix=prefix),
                                    pad=dict(t=50))])
    return fig


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, tuple):
        return list(v)
    return v


# ----------------------------------------------------------------------------- chapter 00
def kv_memory_figure(configs: dict, *, tokens: int = 131072, batch: int = 1, dtype: str = "bf16",
                     compressions=(0.0, 0.25, 0.5, 0.75, 0.9)) -> go.Figure:
    """KV-cache GiB per model at ``tokens`` tokens; the slider sets the compression ratio c."""
    frames, labels = [], []
    for c in compressions:
        rows = MEM.kv_memory_table(configs, tokens=tokens, batch=batch, dtype=dtype, compression=c)
        frames.append([go.Bar(x=[r["model"] for r in rows], y=[r["gib"] for r in rows],
                              text=[f"{r['gib']:.2f} GiB" for r in rows], textposition="outside",
                              marker_color="#4c78a8", name="KV cache")])
        labels.append(f"{c:g}")
    fig = go.Figure()
    _add_slider(fig, frames, labels, prefix="compression c = ")
    top = max(MEM.kv_memory_table(configs, tokens=tokens, batch=batch, dtype=dtype)[i]["gib"] for i in range(len(configs)))
    fig.update_layout(title=f"KV cache at T = {tokens} tokens, batch {batch}, {dtype}",
                      xaxis_title="model", yaxis=dict(title="GiB", range=[0, top * 1.2]), height=500, margin=dict(t=60))
    fig.layout.sliders[0].pad.t = 90  # below the model names and the axis title, not over them
    return finish(fig)


# ----------------------------------------------------------------------------- chapter 01
def saturation_figure(taus=(0.5, 1.0, 2.0, 5.0, 10.0, 20.0), gap_max: float = 20.0) -> go.Figure:
    """Two tokens with logit gap Δ: α₁ and the sensitivity α₁(1−α₁) against Δ; slider over τ."""
    gaps = np.linspace(-gap_max, gap_max, 241)
    frames = []
    for tau in taus:
        alpha = 1.0 / (1.0 + np.exp(-gaps / tau))
        frames.append([
            go.Scatter(x=gaps, y=alpha, name="α₁ = softmax weight", line=dict(color="#4c78a8")),
            go.Scatter(x=gaps, y=alpha * (1 - alpha), name="ρ₁ = α₁(1−α₁)", line=dict(color="#e45756")),
        ])
    fig = go.Figure()
    _add_slider(fig, frames, [f"{t:g}" for t in taus], prefix="temperature τ = ", active=1)
    fig.add_hline(y=0.25, line_dash="dot", annotation_text="max 1/4 at α = 1/2")
    fig.update_layout(title="Saturation: sensitivity vanishes at both ends",
                      xaxis_title="logit gap Δ = z₁ − z₂", yaxis=dict(title="value", range=[0, 1.05]), height=440)
    return finish(fig)


def jacobian_heatmap_figure(logits, taus=(0.25, 0.5, 1.0, 2.0, 5.0, 10.0)) -> go.Figure:
    """Heat map of S = Diag(α) − ααᵀ for softmax(logits/τ); slider over τ."""
    logits = torch.as_tensor(logits, dtype=torch.float64)
    n = logits.shape[0]
    names = [f"token {i + 1}" for i in range(n)]
    frames = []
    for tau in taus:
        S = T.softmax_jacobian(torch.softmax(logits / tau, dim=0)).numpy()
        frames.append([go.Heatmap(z=S, x=names, y=names, zmin=-0.25, zmax=0.25, colorscale="RdBu",
                                  reversescale=True, text=np.round(S, 3), texttemplate="%{text}")])
    fig = go.Figure()
    _add_slider(fig, frames, [f"{t:g}" for t in taus], prefix="temperature τ = ", active=2)
    fig.update_layout(title="Softmax Jacobian S: positive diagonal, negative competition off it",
                      xaxis_title="column j (token)", yaxis=dict(title="row i (token)", autorange="reversed"), height=480)
    return finish(fig)


def deletion_damage_figure(curve: dict) -> go.Figure:
    """Local sensitivity against deletion damage as one token's logit grows (``examples.deletion_damage_curve``).

    Log y axis: the quantities span several decades."""
    x = curve["shift"]
    fig = go.Figure([
        go.Scatter(x=x, y=curve["rho"], name="ρᵢ = αᵢ(1−αᵢ) (local sensitivity)", line=dict(color="#e45756")),
        go.Scatter(x=x, y=curve["jacobian_norm"], name="‖J_C‖ (Frobenius)", line=dict(color="#f58518", dash="dot")),
        go.Scatter(x=x, y=curve["damage"], name="‖f_C − f_C∖i‖ (deletion damage)", line=dict(color="#4c78a8")),
        go.Scatter(x=x, y=[curve["spread"]] * len(x), name="spread of the values max‖u_j − u_k‖",
                   line=dict(color="#54a24b", dash="dash")),
    ])
    fig.update_layout(title="A saturated token: tiny derivative, large but bounded deletion damage",
                      xaxis_title="shift of token i's logit", yaxis=dict(title="norm", type="log"), height=440,
                      legend=dict(orientation="h", y=-0.25))
    return finish(fig)


# ----------------------------------------------------------------------------- chapter 02
def capacity_split_figure(total: float = 10.0, noises=(0.5, 1.0, 2.0, 4.0)) -> go.Figure:
    """½[log(1+λ₁/σ²) + log(1+λ₂/σ²)] with λ₁+λ₂ = ``total``; slider over the noise σ²."""
    lam1 = np.linspace(0.0, total, 101)
    frames = []
    for s2 in noises:
        cap = [float(T.capacity_from_eigenvalues(torch.tensor([a / s2, (total - a) / s2], dtype=torch.float64)))
               for a in lam1]
        frames.append([go.Scatter(x=lam1, y=cap, name="capacity", line=dict(color="#4c78a8"))])
    fig = go.Figure()
    _add_slider(fig, frames, [f"{s:g}" for s in noises], prefix="noise σ² = ", active=1)
    fig.update_layout(title=f"Same total energy {total:g}, split over two directions",
                      xaxis_title="λ₁ (λ₂ = total − λ₁)", yaxis_title="½ log det(I + G)", height=420)
    return finish(fig)


def capacity_sharpness_figure(K, U, mu, lam, scales, noises=(0.25, 1.0, 4.0)) -> go.Figure:
    """Jacobian vs linear (CapKV) capacity as the centre query is scaled; slider over σ²."""
    frames = []
    for s2 in noises:
        res = W.capacity_vs_sharpness(K, U, mu, lam, scales, noise=s2)
        frames.append([
            go.Scatter(x=res["scales"], y=res["jacobian"], name="Jacobian capacity (softmax)", line=dict(color="#e45756")),
            go.Scatter(x=res["scales"], y=res["linear"], name="linear capacity (CapKV)", line=dict(color="#4c78a8", dash="dash")),
        ])
    fig = go.Figure()
    _add_slider(fig, frames, [f"{s:g}" for s in noises], prefix="noise σ² = ", active=1)
    fig.update_layout(title="Sharpening the query saturates the softmax; the linear model cannot see it",
                      xaxis=dict(title="scale of the centre query μ", type="log"), yaxis_title="capacity (nats)",
                      height=440)
    return finish(fig)


# ----------------------------------------------------------------------------- chapter 03
def _leverage_traces(ex: W.LeverageExample, u) -> list:
    u = np.asarray(u, dtype=float)
    xs, ys = [], []
    for ux, uy in u:
        xs += [0.0, ux, None]
        ys += [0.0, uy, None]
    labels = [f"u{i + 1}" for i in range(len(u))]
    return [
        go.Scatter(x=xs, y=ys, mode="lines+markers", name="directions u_i", line=dict(width=3, color="#4c78a8"),
                   xaxis="x", yaxis="y"),
        go.Bar(x=labels, y=ex.weight.tolist(), name="weight w_i (per-token)", marker_color="#bab0ac",
               xaxis="x2", yaxis="y2"),
        go.Bar(x=labels, y=ex.score.tolist(), name="score r_i = w_i u_iᵀA⁻¹u_i", marker_color="#e45756",
               xaxis="x2", yaxis="y2"),
    ]


def _leverage_layout(fig: go.Figure, title: str) -> go.Figure:
    fig.update_layout(
        title=title, height=460, barmode="group",
        xaxis=dict(domain=[0, 0.42], range=[-0.1, 1.2], title="first output coordinate"),
        yaxis=dict(range=[-0.1, 1.2], title="second coordinate"),
        xaxis2=dict(domain=[0.55, 1.0], anchor="y2", title="token"), yaxis2=dict(anchor="x2", range=[0, 2.0], title="value"),
    )
    return finish(fig)


def leverage_weight_figure(w3_values=(0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0)) -> go.Figure:
    """The note's 2-D example; slider over the weight w3 of u3 (u fixed)."""
    frames = []
    for w3 in w3_values:
        ex = W.leverage_example(W.NOTE_U, (W.NOTE_W[0], W.NOTE_W[1], w3))
        frames.append(_leverage_traces(ex, W.NOTE_U))
    fig = go.Figure()
    _add_slider(fig, frames, [f"{w:g}" for w in w3_values], prefix="w3 = ", active=list(w3_values).index(0.7))
    return _leverage_layout(fig, "Leverage discounts the near-copy u2; slide w3")


def leverage_angle_figure(angles=(0, 3, 6, 10, 20, 30, 45, 60, 90), w3: float = 0.7) -> go.Figure:
    """The 2-D example with u2 rotated away from u1; slider over the angle (degrees)."""
    frames = []
    for a in angles:
        ex = W.rotated_example(a, w3)
        r = math.hypot(*W.NOTE_U[1])
        u = (W.NOTE_U[0], (r * math.cos(math.radians(a)), r * math.sin(math.radians(a))), W.NOTE_U[2])
        frames.append(_leverage_traces(ex, u))
    fig = go.Figure()
    _add_slider(fig, frames, [f"{a:g}°" for a in angles], prefix="angle between u1 and u2: ", active=1)
    return _leverage_layout(fig, "Rotate u2 away from u1 and its score recovers")


def selection_tau_figure(K, U, mu, lam, budgets, taus=(1.0, 3.0, 10.0, 30.0, 100.0), noise: float = 1.0) -> go.Figure:
    """Jacobian capacity of the kept set for one-shot (Algorithm 1), greedy and exhaustive selection
    against the budget; slider over the one-shot temperature τ (greedy/exhaustive do not use τ)."""
    budgets = list(budgets)
    greedy = [T.select_greedy(K, U, mu, lam, b, noise=noise).capacity for b in budgets]
    best = [T.select_exhaustive(K, U, mu, lam, b, noise=noise).capacity for b in budgets]
    frames = []
    for tau in taus:
        one = [T.select_one_shot(K, U, mu, lam, b, tau=tau, noise=noise).capacity for b in budgets]
        frames.append([
            go.Scatter(x=budgets, y=best, name="exhaustive (optimum)", mode="lines+markers", line=dict(color="#54a24b")),
            go.Scatter(x=budgets, y=greedy, name="greedy", mode="lines+markers", line=dict(color="#4c78a8", dash="dash")),
            go.Scatter(x=budgets, y=one, name="one-shot (Algorithm 1)", mode="lines+markers", line=dict(color="#e45756")),
        ])
    fig = go.Figure()
    _add_slider(fig, frames, [f"{t:g}" for t in taus], prefix="one-shot temperature τ = ", active=2)
    fig.update_layout(title=f"Kept-set capacity on a {K.shape[0]}-token cache",
                      xaxis_title="budget B (tokens kept)", yaxis_title="Jacobian capacity of kept set (nats)",
                      height=440)
    return finish(fig)
