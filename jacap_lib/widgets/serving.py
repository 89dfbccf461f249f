"""Live controls for the serving chapter. The callbacks are pure functions (tested without a
kernel); :func:`beta_app` wires them to an ipywidgets slider when a kernel runs."""
from __future__ import annotations

import torch

from jacap_lib.stats import ema_trace, ema_tradeoff
from jacap_lib.results.loaders import load_serving_run
from jacap_lib.viz import serving as V

__all__ = ["beta_view", "beta_figure", "beta_app", "load_run"]


def load_run(path=None) -> dict:
    """The precomputed results of ``jacap serve-run`` (``data/serving/serving_run.json`` by default)."""
    return load_serving_run(path)


def beta_view(q, beta: float, horizon: int = 16) -> dict:
    """EMA of a one-coordinate (or ``(T, d)``) query stream for any ``beta``: the trajectory of the
    mean and the noise/lag summary of :func:`jacap_lib.stats.ema_tradeoff`."""
    q = torch.as_tensor(q, dtype=torch.float32)
    if q.dim() == 1:
        q = q[:, None]
    mu, lam = ema_trace(q, beta)
    summary = ema_tradeoff(q, beta, horizon)
    return {"beta": float(beta), "mu": mu[:, 0].tolist(), "lam": lam[:, 0].tolist(), **summary}


def beta_figure(q, beta: float, horizon: int = 16):
    """The tracking figure for one ``beta`` (what the live slider redraws)."""
    view = beta_view(q, beta, horizon)
    fig = V.beta_tracking(list(q), {str(beta): view["mu"]},
                          title=f"EMA mean at β = {beta}: jitter {view['jitter']:.3f}, lag error {view['lag_error']:.3f}")
    fig.update_layout(sliders=[])
    return fig


def beta_app(q, horizon: int = 16):
    """A β slider (0.3 ... 0.995) redrawing :func:`beta_figure` on a query stream ``q``."""
    import ipywidgets as W
    from IPython.display import display

    out = W.Output()
    slider = W.FloatSlider(value=0.9, min=0.3, max=0.995, step=0.005, description="β", continuous_update=False,
                           readout_format=".3f")

    def redraw(_=None):
        out.clear_output(wait=True)
        with out:
            display(beta_figure(q, slider.value, horizon))

    slider.observe(redraw, names="value")
    redraw()
    return W.VBox([slider, out])
