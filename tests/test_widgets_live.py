"""Callbacks and figures of the live-eviction chapter, without a kernel."""
from __future__ import annotations

import pytest
import torch

from jacap_lib.measure.eviction import EvictionInspection
from jacap_lib.viz import live as V
from jacap_lib.widgets import live as W


def _fake(ratio=0.5, n=10, jacap=True):
    """A hand-made inspection: 2 layers x 2 heads x n tokens; layer 0 keeps the first half, layer 1 the evens."""
    b = n // 2
    kept = torch.stack([torch.stack([torch.arange(b), torch.arange(b)]),
                        torch.stack([torch.arange(0, n, 2), torch.arange(0, n, 2)])])
    parts = {}
    if jacap:
        alpha = torch.softmax(torch.arange(n, dtype=torch.float32), 0).expand(2, 2, n).clone()
        parts = dict(alpha=alpha, rho=alpha * (1 - alpha), kappa=torch.ones(2, 2, n), weight=alpha,
                     leverage=torch.ones(2, 2, n), score=alpha)
    return EvictionInspection(method="jacap_prompt" if jacap else "knorm", compression_ratio=ratio, options={},
                              token_ids=list(range(n)), tokens=[f"t{i}" for i in range(n)], kept=kept, **parts)


def test_press_options_only_steer_jacap():
    assert W.press_options("jacap_prompt", 5, 0.9) == {"tau": 5.0, "beta": 0.9}
    assert W.press_options("jacap_two_stage", 5, None) == {"tau": 5.0, "beta": None}
    assert W.press_options("snapkv", 5, 0.9) == {}
    assert W.press_options("jacap", 5, 0.9, "tempered") == {"tau": 5.0, "centre": "tempered"}  # no beta
    # the centre goes to a press that offers it; a variant that rebuilds the tempered centre keeps its own
    assert W.press_options("jacap_prompt", 5, 0.9, "tempered") == {"tau": 5.0, "beta": 0.9, "centre": "tempered"}
    assert W.press_options("jacap_two_stage", 5, None, "observed") == {"tau": 5.0, "beta": None}
    assert W.press_options("snapkv", 5, 0.9, "tempered") == {}
    with pytest.raises(ValueError, match="centre"):
        W.press_options("jacap_prompt", 5, 0.9, "ea")
    assert W.parse_choice("all") is None and W.parse_choice(3) == 3 and W.parse_choice("2") == 2
    with pytest.raises(ValueError):
        W.parse_choice("three")


def test_strip_data_keep_fraction_and_hover():
    insp = _fake()
    data = V.strip_data(insp, width=4)
    # token 0, 2, 4 kept by all 4 (layer, head) pairs; token 1, 3 by layer 0 only; 6, 8 by layer 1 only
    expected = [1, .5, 1, .5, 1, 0, .5, 0, .5, 0]
    assert torch.allclose(data["keep"], torch.tensor(expected))
    assert data["z"][0] == expected[:4] and data["z"][2] == expected[8:] + [None, None]
    assert "alpha" in data["hover"][0][1] and "kept by 50%" in data["hover"][0][1]
    one = V.strip_data(insp, layer=1, head=0, width=10)
    assert one["z"][0] == [1.0, 0.0] * 5
    with pytest.raises(ValueError, match="layer"):
        V.strip_data(insp, layer=2)


def test_token_strip_and_slider_figures():
    fig = V.token_strip(_fake(jacap=False), head=1)
    assert fig.data[0].type == "heatmap" and "knorm" in fig.layout.title.text
    slider = V.token_strip_slider([_fake(0.5), _fake(0.75)])
    steps = slider.layout.sliders[0].steps
    assert [s.label for s in steps] == ["0.5", "0.75"]
    assert steps[1].args[0]["z"][0] == V.strip_data(_fake(0.75))["z"]
    with pytest.raises(ValueError):
        V.token_strip_slider([])


def test_kl_bars_groups_by_ratio():
    from jacap_lib.viz.style import METHOD_STYLES

    rows = [{"method": m, "ratio": r, "kl": kl} for m, r, kl in
            [("jacap_prompt", 0.5, 0.1), ("knorm", 0.5, 0.3), ("jacap_prompt", 0.9, 1.0), ("knorm", 0.9, 2.0)]]
    fig = V.kl_bars(rows)
    # one trace (and legend entry) per method, named for a reader, grouped (and coloured) by its registry name
    assert [t.name for t in fig.data] == ["the prompt press", "KNorm"]
    assert [t.legendgroup for t in fig.data] == ["jacap_prompt", "knorm"]
    assert list(fig.data[1].y) == [0.3, 2.0] and list(fig.data[0].x) == ["c = 0.5", "c = 0.9"]
    assert [t.marker.color for t in fig.data] == [METHOD_STYLES["jacap_prompt"][0], METHOD_STYLES["knorm"][0]]
    # bars on a linear axis from 0: a bar's length is its KL (a log axis cut at 0.2 exaggerated small gaps)
    assert fig.layout.yaxis.type == "linear" and fig.layout.yaxis.rangemode == "tozero"
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_kl_bars_legend_shows_every_method_of_the_registry():
    """The live chapter's table holds every method of the registry (~18): the legend sits under the plot in rows,
    and the figure and its bottom margin grow by one legend row per three methods, so no entry scrolls away."""
    from jacap_lib.presses.registry import list_methods

    from jacap_lib.presses.registry import PRESS_NAMES

    methods = ["jacap", "jacap_prompt"] + list_methods("kvpress")  # what kl_table measures by default
    assert len(methods) >= 15
    rows = [{"method": m, "ratio": r, "kl": 0.1} for m in methods for r in (0.5, 0.9)]
    fig, few = V.kl_bars(rows), V.kl_bars([r for r in rows if r["method"] in methods[:3]])
    names = [t.name for t in fig.data]
    assert names == ["the default", "the prompt press"] + [PRESS_NAMES[m] for m in methods[2:]]
    assert "_" not in "".join(names) and len(set(names)) == len(names)  # no registry names, none twice
    assert all(t.showlegend is not False for t in fig.data)
    legend = fig.layout.legend
    assert legend.orientation == "h" and legend.y < 0 and legend.yanchor == "top"
    n_rows = -(-len(methods) // 3)
    assert legend.entrywidthmode == "fraction" and legend.entrywidth * 3 <= 1  # three entries fit in one row
    # one row of three methods more: 28 px more figure and bottom margin (a row of 11 px legend text)
    assert fig.layout.height - few.layout.height == fig.layout.margin.b - few.layout.margin.b == 28 * (n_rows - 1)
    assert fig.layout.margin.b >= 90 + 28 * n_rows


@pytest.mark.model
def test_explorer_callbacks_on_the_bundled_model():
    from jacap_lib import load_model

    model, tok = load_model()
    context = "The green kiosk sells ferry tickets for twelve crowns. " * 4
    ex = W.EvictionExplorer(model, tok, context, "How much is a ticket?", max_new_tokens=6)
    fig = ex.figure("jacap_prompt", 0.5, 10.0, None, layer=3, head="all")
    insp = ex.inspect("jacap_prompt", 0.5, 10.0, None)
    assert ex.inspect("jacap_prompt", 0.5, 10.0, None) is insp  # memoised: moving layer/head costs nothing
    assert [list(row) for row in fig.data[0].z] == V.strip_data(insp, 3, None)["z"]
    assert ex.inspect("jacap_prompt", 0.5, 2.0, None).options["tau"] == 2.0
    hot = ex.inspect("jacap_prompt", 0.5, 100.0, None, "tempered")  # tau acts on the tempered centre: flatter alpha
    assert hot.options["centre"] == "tempered" and float(hot.alpha.std()) < float(ex.inspect("jacap_prompt", 0.5, 1.0, None, "tempered").alpha.std())
    got = ex.answers("knorm", 0.5)
    assert set(got) == {"full", "compressed"} and all(isinstance(v, str) for v in got.values())

    # the ipywidgets app: moving the layer control re-draws from the memoised inspection
    app = W.live_app(model, tok, context, "How much is a ticket?")
    layer_control = app.children[1].children[2]
    assert layer_control.description == "layer"
    centre_control, tau_control = app.children[0].children[2], app.children[1].children[0]
    assert (centre_control.description, centre_control.value, tau_control.disabled) == ("centre", "observed", True)
    centre_control.value = "tempered"  # the slider steers only the tempered centre
    assert tau_control.disabled is False
    before = app.explorer.inspect.cache_info()
    layer_control.value = 7
    after = app.explorer.inspect.cache_info()
    assert after.hits == before.hits + 1 and after.misses == before.misses


def test_head_budgets_show_each_heads_count():
    """The heatmap's cells are each (layer, head)'s kept share, also when a masking press gives heads different
    counts (hand-built: head 1 of layer 0 hides two of its kept positions)."""
    insp = _fake()
    masked = torch.zeros(insp.n_layers, insp.n_heads, insp.n_tokens, dtype=torch.bool)
    masked[0, 1, insp.kept[0, 1, :2]] = True
    insp.masked = masked
    fig = V.head_budgets(insp)
    z = torch.tensor(fig.data[0].z)
    assert z.shape == (insp.n_heads, insp.n_layers)
    torch.testing.assert_close(z, insp.n_kept.T.float() / insp.n_tokens)
    assert int(insp.n_kept[0, 1]) == insp.kept.shape[-1] - 2 and "mean" in V._title(insp, None, None)
    assert (fig.layout.xaxis.title.text, fig.layout.yaxis.title.text) == ("layer", "KV head")


def test_strip_padding_is_blank_text_not_null():
    data = V.strip_data(_fake(), width=4)
    assert data["text"][2] == ["t8", "t9", "", ""] and data["hover"][2][2:] == ["", ""]
    fig = V.token_strip(_fake(), width=4)
    assert None not in fig.data[0].text[2]


def test_component_correlations_against_a_hand_ranking():
    insp = _fake()
    # score = alpha = weight: correlation 1; rho = alpha (1 - alpha) is increasing while alpha < 1/2;
    # kappa and leverage are constant: spearmanr is undefined (nan) and the average skips nothing valid
    corr = insp.component_correlations()
    assert corr["alpha"] == pytest.approx(1.0) and corr["weight"] == pytest.approx(1.0)
    a = torch.softmax(torch.arange(10, dtype=torch.float64), 0)
    from scipy.stats import spearmanr
    assert corr["rho"] == pytest.approx(spearmanr(a.numpy(), (a * (1 - a)).numpy()).statistic)
    import math
    assert math.isnan(corr["kappa"])


def test_memory_bars_heights_are_the_byte_shares():
    """Each bar is bytes / bytes_full in %: a pruning press one bar per c, a masking press two (held, freed);
    both axes titled, the dotted marker at 1 - c; no bytes is a ValueError."""
    pruned = [_fake(c) for c in (0.5, 0.75)]
    for insp, held in zip(pruned, (500, 250)):
        insp.bytes_full, insp.bytes_held = 1000, held
    masked = _fake(0.5, jacap=False)
    masked.bytes_full, masked.bytes_held, masked.bytes_freed = 1000, 1960, 504
    fig = V.memory_bars(pruned + [masked])
    bars = {t.name: list(t.y) for t in fig.data if t.type == "bar"}
    assert sorted(bars.values(), key=str) == sorted([[50.0, 25.0], [196.0, None], [50.4, None]], key=str)
    assert all(n.endswith(("(masked)", "(freed)")) for n, y in bars.items() if y[1] is None)
    marker = [t for t in fig.data if t.type == "scatter"][0]
    assert list(marker.y) == pytest.approx([50.0, 25.0])
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    with pytest.raises(ValueError, match="inspections"):
        V.memory_bars([_fake()])


def test_ragged_bench_frames_read_the_benchmark_record():
    """Hand-built records of two lengths: held % is the largest ragged share over the presses, the peak is the
    default's over the uncompressed prefill's, decode rows are ms per token for each cache; no rows is an error."""
    def cell(press, c, share, **decode):
        return {"press": press, "compression_ratio": c, "ragged_over_uncompressed": share, **decode}

    a = {"rows": [{"length": 512, "uncompressed_bytes": 2_000_000, "peak_uncompressed_bytes": 10,
                   "peak_ragged_prefill_bytes_c0.5": {"jacap_default": 30, "kvzip": 99},
                   "cells": [cell("jacap_default", 0.5, 0.504), cell("kvzip", 0.5, 0.506), cell("kvzip", 0.9, 0.101)]}]}
    b = {"rows": [{"length": 8192, "uncompressed_bytes": 4_000_000, "decode_uncompressed_s": 0.25,
                   "cells": [cell("jacap_default", 0.5, 0.5, decode_masked_s=0.342, decode_ragged_s=0.074)]}]}
    mem, dec = V.ragged_bench_frames(b, a)  # sorted by length whatever the order
    assert list(mem.index) == [512, 8192]
    assert mem.loc[512, "uncompressed (MB)"] == "2.0" and mem.loc[512, "c = 0.5"] == "50.6%"
    assert mem.loc[512, "c = 0.9"] == "10.1%" and mem.loc[512, "prefill peak"] == "3.0x"
    assert dec.loc[(8192, "uncompressed"), "c = 0.5"] == "250" and dec.loc[(8192, "masked"), "c = 0.5"] == "342"
    assert dec.loc[(8192, "ragged"), "c = 0.5"] == "74" and len(dec) == 3
    with pytest.raises(ValueError, match="benches"):
        V.ragged_bench_frames({"rows": []})
