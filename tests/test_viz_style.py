"""viz.style: one colour and marker per method, readable log ticks, matched axes of one type, outliers
clipped and named, legends moved off sliders, long titles wrapped (checked on hand-built figures)."""
from __future__ import annotations

import math

import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from jacap_lib.viz import evaluation, style
from jacap_lib.viz.style import METHOD_STYLES, clip_outliers, finish, log_ticks, method_style


def test_one_distinct_colour_per_method():
    colours = {}
    for name, (colour, _) in METHOD_STYLES.items():
        colours.setdefault(colour, []).append(name)
    shared = {c: n for c, n in colours.items() if len(n) > 1}
    from jacap_lib.presses.registry import method_options, press_from_spec
    # only aliases of one method (Jacap's torch reference; the tune choice, which JacapPress() now is) and the
    # two references share a colour
    assert shared == {METHOD_STYLES["jacap"][0]: ["jacap", "jacap_torch", "jacap[tau=3,beta=0.9]"],
                      "#ff7f0e": ["jacap[window=0]", "jacap[tau=3,beta=0.9,n_sink=4,window=0]"],
                      "#000000": ["full", "floor"]}, shared
    assert method_options(press_from_spec("jacap[window=0]", 0.5)) == method_options(
        press_from_spec("jacap[tau=3,beta=0.9,n_sink=4,window=0]", 0.5))  # the same press: one colour
    assert method_options(press_from_spec("jacap", 0.5)) == method_options(press_from_spec("jacap[tau=3,beta=0.9]", 0.5))
    assert method_style("jacap[window=0]") == {"color": "#ff7f0e", "symbol": "diamond"}
    assert method_style("jacap[tau=77]") == method_style("jacap[tau=77]")  # unknown names: fixed, by name
    with pytest.raises(ValueError, match="name"):
        method_style("")


def test_finish_paints_methods_by_legendgroup_or_name():
    fig = go.Figure([go.Scatter(x=[0, 1], y=[1, 2], name="TOVA (kvpress)", legendgroup="tova", mode="lines"),
                     go.Bar(x=["a"], y=[1], name="capkv"),
                     go.Scatter(x=[0, 1], y=[1, 2], name="not a method", line={"color": "#123456"}),
                     go.Scatter(x=[0], y=[1], name="jacap", mode="markers", marker={"symbol": "line-ew-open"})])
    finish(fig)
    assert fig.data[0].line.color == METHOD_STYLES["tova"][0]
    assert fig.data[1].marker.color == METHOD_STYLES["capkv"][0]
    assert fig.data[2].line.color == "#123456"
    assert fig.data[3].marker.color == METHOD_STYLES["jacap"][0] and fig.data[3].marker.symbol == "line-ew-open"


def test_log_ticks_decades_or_full_values():
    assert log_ticks([1e-5, 0.3])["dtick"] == 1 and log_ticks([1e-5, 0.3])["exponentformat"] == "e"
    assert log_ticks([1e-6, 1e6])["dtick"] == math.ceil(12 / 6)  # at most ~6 labelled decades
    narrow = log_ticks([0.02, 0.09])
    assert narrow["dtick"] == "D2" and narrow["tickformat"] == "~g"  # 0.02, 0.05: full values, no bare digits


def test_matched_panels_get_one_axis_type_and_readable_ticks():
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True)
    fig.add_trace(go.Scatter(x=[1, 2], y=[1e-3, 1.0]), row=1, col=1)
    fig.add_trace(go.Scatter(x=[1, 2], y=[2e-3, 3.0]), row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=1)
    finish(fig)
    assert fig.layout.yaxis2.type == "log" and fig.layout.yaxis.dtick == 1
    assert fig.layout.xaxis.exponentformat == "e"  # linear axes: 1e−4, never 100μ


def test_clip_outliers_shows_the_bulk_and_names_the_extreme():
    ys = [0.1 * i for i in range(40)] + [6300.0]
    fig = clip_outliers(go.Figure(go.Box(y=ys)), "yaxis")
    lo, hi = fig.layout.yaxis.range
    assert hi < 100 and lo <= 0 and hi >= 3.9  # the bulk [0, 3.9] in range, 6300 not
    assert "1 value off the scale" in fig.layout.annotations[0].text and "6.3e+03" in fig.layout.annotations[0].text
    fine = clip_outliers(go.Figure(go.Box(y=[0.1 * i for i in range(40)])), "yaxis")
    assert fine.layout.yaxis.range is None and not fine.layout.annotations


def test_legend_leaves_the_slider_and_long_titles_wrap():
    fig = go.Figure(go.Scatter(x=[0], y=[0], name="a"))
    fig.update_layout(title="word " * 40, legend={"orientation": "h", "y": -0.3},
                      sliders=[{"steps": [{"label": "1", "method": "restyle", "args": [{}]}]}])
    finish(fig)
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1
    lines = fig.layout.title.text.split("<br>")
    assert len(lines) == 3 and all(len(x) <= 72 for x in lines) and fig.layout.margin.t >= 40 + 22 * 3


def test_book_figure_uses_the_mapping_on_every_panel():
    cells = [{"method": m, "length": L, "ratio": c, "n_docs": 3, "kl_geomean": kl, "kl_low": kl / 2, "kl_high": kl * 2}
             for L in (512, 1024) for c in (0.5, 0.9) for m, kl in (("jacap[tau=3,beta=0.9]", 0.1), ("tova", 0.2))]
    fig = evaluation.kl_figure(cells)
    assert {fig.layout[f"yaxis{k if k > 1 else ''}"].type for k in range(1, 3)} == {"log"}
    jac = [t for t in fig.data if t.name.startswith("jacap")]
    assert len(jac) == 2 and {t.marker.color for t in jac} == {METHOD_STYLES["jacap"][0]}
    assert style.method_of(fig.data[0]) == "jacap[tau=3,beta=0.9]"  # the default Jacap: jacap's colour
    assert {t.marker.color for t in fig.data if t.name == "tova"} == {METHOD_STYLES["tova"][0]}
