"""Live widgets of the theory chapters. Their callbacks are the plain functions of
:mod:`jacap_lib.examples` and :mod:`jacap_lib.memory` (imported from there by whoever uses them; this
module re-exports nothing); the ``*_app`` factories wire them to ipywidgets and are only built in a live
kernel (see :func:`jacap_lib.widgets.show`).
"""
from __future__ import annotations

import math

from jacap_lib.examples import capacity_vs_sharpness, rotated_example, two_token_sensitivity
from jacap_lib.memory import DTYPE_BYTES, MODEL_KV_CONFIGS, kv_memory_table


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
