"""Theory figures: slider steps carry the data an independent computation gives."""
import math

import numpy as np
import plotly.io as pio
import pytest
import torch

from jacap_lib import viz
from jacap_lib.viz import theory as V
from jacap_lib import memory as MEM


def test_kv_memory_slider_steps_apply_compression():
    fig = V.kv_memory_figure(MEM.MODEL_KV_CONFIGS, tokens=131072, compressions=(0.0, 0.9))
    steps = fig.layout.sliders[0].steps
    y0, y9 = steps[0].args[0]["y"][0], steps[1].args[0]["y"][0]
    i = list(MEM.MODEL_KV_CONFIGS).index("Llama-3.1-8B")
    assert y0[i] == 16.0
    assert y9[i] == pytest.approx(2 * 32 * 8 * 13107 * 128 * 2 / 2**30)


def test_saturation_steps_are_sigmoid_bumps():
    fig = V.saturation_figure(taus=(1.0, 10.0))
    for step, tau in zip(fig.layout.sliders[0].steps, (1.0, 10.0)):
        x = np.asarray(step.args[0]["x"][1])
        rho = np.asarray(step.args[0]["y"][1])
        a = 1 / (1 + np.exp(-x / tau))
        assert np.allclose(rho, a * (1 - a)) and rho.max() == pytest.approx(0.25)


def test_heatmap_steps_are_softmax_jacobians():
    logits = [2.0, 0.0, -1.0]
    fig = V.jacobian_heatmap_figure(logits, taus=(1.0, 5.0))
    z = np.asarray(fig.layout.sliders[0].steps[1].args[0]["z"][0])
    a = torch.softmax(torch.tensor(logits, dtype=torch.float64) / 5.0, 0)
    assert np.allclose(z, (torch.diag(a) - torch.outer(a, a)).numpy())
    assert np.allclose(z.sum(1), 0)


def test_capacity_split_peaks_at_even_split():
    fig = V.capacity_split_figure(total=10.0, noises=(1.0,))
    x, y = np.asarray(fig.data[0].x), np.asarray(fig.data[0].y)
    assert x[np.argmax(y)] == pytest.approx(5.0)
    assert y[0] == pytest.approx(0.5 * math.log(11)) and y.max() == pytest.approx(0.5 * math.log(36))


def test_leverage_weight_slider_crossing():
    fig = V.leverage_weight_figure(w3_values=(0.3, 0.7))
    low, high = (s.args[0]["y"][2] for s in fig.layout.sliders[0].steps)
    assert low[2] < low[1] and high[2] > high[1]  # u3 overtakes u2 between w3 = 0.3 and 0.7


def test_selection_figure_exhaustive_is_an_upper_bound():
    g = torch.Generator().manual_seed(0)
    K = torch.randn(6, 3, generator=g, dtype=torch.float64)
    U = torch.randn(2, 6, generator=g, dtype=torch.float64)
    mu = torch.randn(3, generator=g, dtype=torch.float64)
    lam = torch.ones(3, dtype=torch.float64)
    fig = V.selection_tau_figure(K, U, mu, lam, budgets=[2, 3], taus=(1.0, 10.0))
    for step in fig.layout.sliders[0].steps:
        best, greedy, one = (np.asarray(y) for y in step.args[0]["y"])
        assert np.all(best >= greedy - 1e-12) and np.all(best >= one - 1e-12)


def test_setup_notebook_static_renderer_emits_html(monkeypatch):
    monkeypatch.setenv(viz.BOOK_BUILD_ENV, "1")
    viz.setup_notebook()
    assert pio.renderers.default == viz.STATIC_RENDERER
    bundle = pio.renderers[viz.STATIC_RENDERER].to_mimebundle(V.saturation_figure().to_dict())
    assert list(bundle) == ["text/html"]
    html = bundle["text/html"]
    assert "Plotly.newPlot" in html and "cdn" not in html.lower() and len(html) < 500_000
    with pytest.raises(ValueError, match="renderer"):
        viz.setup_notebook("no-such-renderer")
    monkeypatch.delenv(viz.BOOK_BUILD_ENV)
    assert not viz.in_book_build()
