"""Pure computations behind the theory chapters' calculators and live widgets (chapters 00–03).

Every function here is a plain function of numbers (tested without a kernel); the ``*_app``
factories wire them to ipywidgets and are only built in a live kernel
(see :func:`jacap_lib.widgets.show`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from jacap_lib import theory as T
from jacap_lib.scoring import leverage

GIB = 1024**3

# Public config values (config.json on the Hugging Face hub) of well-known models:
# layers L, KV heads H_kv, head dimension d_h.
MODEL_KV_CONFIGS = {
    "Llama-3.1-8B": dict(layers=32, kv_heads=8, head_dim=128),
    "Llama-3.1-70B": dict(layers=80, kv_heads=8, head_dim=128),
    "Qwen3-8B": dict(layers=36, kv_heads=8, head_dim=128),
    "Qwen3-14B": dict(layers=40, kv_heads=8, head_dim=128),
    "Mistral-7B-v0.1": dict(layers=32, kv_heads=8, head_dim=128),
}

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int4": 0.5}


# ----------------------------------------------------------------------------- chapter 00
def kv_cache_bytes(layers: int, batch: int, kv_heads: int, tokens: int, head_dim: int, bytes_per_scalar: float) -> float:
    r"""KV-cache size :math:`M_{KV} = 2\,L\,b\,H_{kv}\,T\,d_h\,s` in bytes (keys and values)."""
    for name, value in (("layers", layers), ("batch", batch), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if int(value) != value or value < 1:
            raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
    if int(tokens) != tokens or tokens < 0:
        raise ValueError(f"`tokens` must be a non-negative integer, got {tokens!r}")
    if not bytes_per_scalar > 0:
        raise ValueError(f"`bytes_per_scalar` must be > 0 (2 for bf16), got {bytes_per_scalar!r}")
    return 2.0 * layers * batch * kv_heads * tokens * head_dim * bytes_per_scalar


def kept_tokens(n: int, compression: float) -> int:
    r"""Tokens kept at compression ratio :math:`c`: :math:`B = (1-c)N`, rounded to the nearest integer."""
    if not 0.0 <= compression < 1.0:
        raise ValueError(f"`compression` must be in [0, 1) (0.9 keeps 10%), got {compression!r}")
    return int(round((1.0 - compression) * n))


def bundled_kv_config() -> dict:
    """Layers, KV heads and head dimension of the bundled SmolLM2-135M, read from its GGUF header."""
    import gguf

    from jacap_lib.models import bundled_gguf_path

    fields = gguf.GGUFReader(bundled_gguf_path()).fields
    arch = fields["general.architecture"].contents()

    def get(key):
        return int(fields[f"{arch}.{key}"].contents())

    heads = get("attention.head_count")
    return dict(layers=get("block_count"), kv_heads=get("attention.head_count_kv"),
                head_dim=get("embedding_length") // heads)


def kv_memory_table(configs: dict, *, tokens: int, batch: int = 1, dtype: str = "bf16", compression: float = 0.0) -> list[dict]:
    """One row per model: its config and the cache size in GiB at ``tokens`` tokens (after compression)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"`dtype` must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    kept = kept_tokens(tokens, compression)
    rows = []
    for name, cfg in configs.items():
        size = kv_cache_bytes(cfg["layers"], batch, cfg["kv_heads"], kept, cfg["head_dim"], DTYPE_BYTES[dtype])
        rows.append(dict(model=name, **cfg, tokens_kept=kept, gib=size / GIB))
    return rows


# ----------------------------------------------------------------------------- chapter 01
def two_token_sensitivity(gap: float, tau: float = 1.0) -> dict:
    r"""Two tokens with logit gap ``gap`` at temperature ``tau``: :math:`\alpha_1`, :math:`\rho_1=\alpha_1(1-\alpha_1)`, S."""
    tau = float(tau)
    if not tau > 0:
        raise ValueError(f"`tau` must be > 0, got {tau!r}")
    alpha = torch.softmax(torch.tensor([gap / tau, 0.0], dtype=torch.float64), dim=0)
    S = T.softmax_jacobian(alpha)
    return dict(alpha=alpha, rho=float(alpha[0] * (1 - alpha[0])), S=S)


# ----------------------------------------------------------------------------- chapter 02
def capacity_vs_sharpness(K, U, mu, lam, scales, noise: float = 1.0) -> dict:
    """Jacobian and linear (CapKV) capacity of one cache as the centre query is scaled by ``scales``."""
    jac = [float(T.jacobian_capacity(K, U, s * mu, lam, noise)) for s in scales]
    lin = float(T.linear_capacity(K, U, lam, noise))
    return dict(scales=list(map(float, scales)), jacobian=jac, linear=[lin] * len(jac))


# ----------------------------------------------------------------------------- chapter 03
def weighted_capacity(u: torch.Tensor, w: torch.Tensor, subset, noise: float = 1.0) -> float:
    r""":math:`\tfrac12\log\det(I + \sum_{i\in C} (w_i/\sigma^2) u_i u_i^\top)` for rows ``u (n, m)``."""
    idx = torch.as_tensor(list(subset), dtype=torch.long)
    m = u.shape[-1]
    A = torch.eye(m, dtype=u.dtype) + (u[idx].T * (w[idx] / noise)) @ u[idx]
    return 0.5 * float(torch.logdet(A))


@dataclass
class LeverageExample:
    """Scores and the three selections of the weighted-direction example (indices 0-based)."""

    weight: torch.Tensor
    leverage: torch.Tensor
    score: torch.Tensor
    one_shot: tuple
    greedy: tuple
    exhaustive: tuple
    capacity: dict


def leverage_example(u, w, budget: int = 2, noise: float = 1.0) -> LeverageExample:
    r"""The reading note's 2-D example, generalised: rows ``u (n, m)``, weights ``w (n,)``.

    score :math:`r_i = (w_i/\sigma^2)\,u_i^\top A^{-1} u_i` with :math:`A` over *all* tokens;
    one-shot keeps the top-``budget`` scores; greedy adds the token with the largest
    :math:`\log(1 + (w_i/\sigma^2) u_i^\top A_C^{-1} u_i)` for the current set :math:`C`;
    exhaustive tries every subset of size ``budget`` for :func:`weighted_capacity`.
    """
    u = torch.as_tensor(u, dtype=torch.float64)
    w = torch.as_tensor(w, dtype=torch.float64)
    if u.dim() != 2 or w.shape != (u.shape[0],):
        raise ValueError(f"`u` must be (n, m) and `w` (n,), got {tuple(u.shape)} and {tuple(w.shape)}")
    if bool((w < 0).any()):
        raise ValueError("`w` must be >= 0 (weights are squared sensitivities times variances)")
    n = u.shape[0]
    if not 1 <= budget <= n:
        raise ValueError(f"`budget` must be between 1 and n = {n}, got {budget}")
    lev = leverage(u, w, noise)
    score = w / noise * lev
    one_shot = tuple(sorted(score.topk(budget).indices.tolist()))
    chosen: list[int] = []
    while len(chosen) < budget:
        rest = [i for i in range(n) if i not in chosen]
        chosen.append(max(rest, key=lambda i: weighted_capacity(u, w, chosen + [i], noise)))
    greedy = tuple(sorted(chosen))
    exhaustive = max(itertools.combinations(range(n), budget), key=lambda c: weighted_capacity(u, w, c, noise))
    capacity = {name: weighted_capacity(u, w, sel, noise)
                for name, sel in (("one-shot", one_shot), ("greedy", greedy), ("exhaustive", exhaustive))}
    return LeverageExample(w, lev, score, one_shot, greedy, tuple(exhaustive), capacity)


NOTE_U = ((1.0, 0.0), (0.95, 0.05), (0.0, 1.0))
NOTE_W = (1.0, 1.0, 0.7)


def rotated_example(angle_deg: float, w3: float = 0.7) -> LeverageExample:
    """The note's example with u2 at ``angle_deg`` degrees from u1 (|u2| kept) and weight ``w3`` on u3."""
    r = math.hypot(*NOTE_U[1])
    a = math.radians(angle_deg)
    u = (NOTE_U[0], (r * math.cos(a), r * math.sin(a)), NOTE_U[2])
    return leverage_example(u, (NOTE_W[0], NOTE_W[1], w3))


# ----------------------------------------------------------------------------- live apps (kernel only)
def kv_calculator_app():
    """Sliders for T, batch, dtype and compression; prints M_KV for each model config."""
    import ipywidgets as W

    configs = dict(MODEL_KV_CONFIGS)
    out = W.Output()
    tokens = W.IntSlider(value=32768, min=1024, max=262144, step=1024, description="T")
    batch = W.IntSlider(value=1, min=1, max=64, description="batch b")
    dtype = W.Dropdown(options=list(DTYPE_BYTES), value="bf16", description="dtype")
    comp = W.FloatSlider(value=0.0, min=0.0, max=0.95, step=0.05, description="compression c")

    def redraw(*_):
        out.clear_output(wait=True)
        with out:
            for row in kv_memory_table(configs, tokens=tokens.value, batch=batch.value, dtype=dtype.value,
                                       compression=comp.value):
                print(f"{row['model']:>16}: {row['gib']:8.2f} GiB ({row['tokens_kept']} tokens kept)")

    for wdg in (tokens, batch, dtype, comp):
        wdg.observe(redraw, names="value")
    redraw()
    return W.VBox([W.HBox([tokens, batch]), W.HBox([dtype, comp]), out])


def leverage_app():
    """Sliders for the angle of u2 and the weight w3; prints scores and the three selections."""
    import ipywidgets as W

    out = W.Output()
    angle = W.FloatSlider(value=math.degrees(math.atan2(0.05, 0.95)), min=0.0, max=90.0, step=0.5,
                          description="angle u2 (deg)")
    w3 = W.FloatSlider(value=0.7, min=0.05, max=2.0, step=0.05, description="w3")

    def redraw(*_):
        out.clear_output(wait=True)
        with out:
            ex = rotated_example(angle.value, w3.value)
            print("scores r_i:", [round(float(s), 4) for s in ex.score])
            for name in ("one-shot", "greedy", "exhaustive"):
                sel = {"one-shot": ex.one_shot, "greedy": ex.greedy, "exhaustive": ex.exhaustive}[name]
                print(f"{name:>10}: keep u{[i + 1 for i in sel]}  capacity {ex.capacity[name]:.4f}")

    angle.observe(redraw, names="value")
    w3.observe(redraw, names="value")
    redraw()
    return W.VBox([W.HBox([angle, w3]), out])


def sensitivity_app():
    """Sliders for the logit gap and tau; prints alpha, rho and S of two tokens."""
    import ipywidgets as W

    out = W.Output()
    gap = W.FloatSlider(value=2.0, min=-20.0, max=20.0, step=0.5, description="gap Δ")
    tau = W.FloatSlider(value=1.0, min=0.25, max=20.0, step=0.25, description="τ")

    def redraw(*_):
        out.clear_output(wait=True)
        with out:
            res = two_token_sensitivity(gap.value, tau.value)
            print(f"alpha = {res['alpha'].numpy().round(4)}, rho_1 = {res['rho']:.4f}")
            print("S =\n", res["S"].numpy().round(4))

    gap.observe(redraw, names="value")
    tau.observe(redraw, names="value")
    redraw()
    return W.VBox([W.HBox([gap, tau]), out])


def capacity_app(K, U, mu, lam):
    """Sliders for the query scale and the noise; prints Jacobian and linear capacity of one cache."""
    import ipywidgets as W

    out = W.Output()
    scale = W.FloatLogSlider(value=1.0, base=10, min=-2, max=2, step=0.05, description="μ scale")
    noise = W.FloatLogSlider(value=1.0, base=10, min=-2, max=2, step=0.05, description="σ²")

    def redraw(*_):
        out.clear_output(wait=True)
        with out:
            res = capacity_vs_sharpness(K, U, mu, lam, [scale.value], noise=noise.value)
            print(f"Jacobian capacity {res['jacobian'][0]:.4f} nats; linear (CapKV) {res['linear'][0]:.4f} nats")

    scale.observe(redraw, names="value")
    noise.observe(redraw, names="value")
    redraw()
    return W.VBox([W.HBox([scale, noise]), out])
