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
    # only aliases of one method (Jacap's torch reference; the tune choice, which JacapPromptPress() now is) and the
    # two references share a colour
    assert shared == {METHOD_STYLES["jacap_prompt"][0]: ["jacap_prompt", "jacap_torch", "jacap_prompt[tau=3,beta=0.9]"],
                      "#ff7f0e": ["jacap_prompt[window=0]", "jacap_prompt[tau=3,beta=0.9,n_sink=4,window=0]"],
                      "#000000": ["full", "floor"]}, shared
    assert method_options(press_from_spec("jacap_prompt[window=0]", 0.5)) == method_options(
        press_from_spec("jacap_prompt[tau=3,beta=0.9,n_sink=4,window=0]", 0.5))  # the same press: one colour
    assert method_options(press_from_spec("jacap_prompt", 0.5)) == method_options(press_from_spec("jacap_prompt[tau=3,beta=0.9]", 0.5))
    assert method_style("jacap_prompt[window=0]") == {"color": "#ff7f0e", "symbol": "diamond"}
    assert method_style("jacap_prompt[tau=77]") == method_style("jacap_prompt[tau=77]")  # unknown names: fixed, by name
    with pytest.raises(ValueError, match="name"):
        method_style("")


def _lab(colour: str) -> tuple[float, float, float]:
    """CIELAB (D65) of a ``#rrggbb`` colour: the sRGB transfer curve, the XYZ matrix and the L*a*b* cube root
    written out (an independent computation, not the library's)."""
    rgb = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92 for c in rgb]
    xyz = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_methods_drawn_together_never_read_as_one_colour():
    """Any two of the registry's methods (and Algorithm 2, the references and the two named settings the
    predictions chapter draws beside them) differ by at least 18 in CIELAB: SnapKV, PyramidKV and KVgrad are no
    longer three greens, nor CapKV and CriticalAdaKV one blue, nor Expected Attention's Jacap centre and Algorithm 1
    as published one maroon. The check itself: the old green pair fails it."""
    from jacap_lib.presses.registry import list_methods

    names = [m for m in list_methods() if m in METHOD_STYLES] + [
        "alg2", "alg2_flat", "full", "jacap_prompt[beta=none,centre=tempered,tau=10,window=32]",
        "jacap_prompt[centre=tempered,tau=3,window=128]"]
    assert {"jacap", "jacap_prompt", "kvzip", "kvgrad", "snapkv", "pyramidkv", "capkv", "critical_adakv"} <= set(names)
    close = [(a, b, round(math.dist(_lab(METHOD_STYLES[a][0]), _lab(METHOD_STYLES[b][0])), 1))
             for i, a in enumerate(names) for b in names[i + 1:]
             if math.dist(_lab(METHOD_STYLES[a][0]), _lab(METHOD_STYLES[b][0])) < 18]
    assert not close, close
    assert math.dist(_lab("#41ab5d"), _lab("#238b45")) < 18  # the old KVgrad and PyramidKV greens


def test_finish_paints_methods_by_legendgroup_or_name():
    fig = go.Figure([go.Scatter(x=[0, 1], y=[1, 2], name="TOVA (kvpress)", legendgroup="tova", mode="lines"),
                     go.Bar(x=["a"], y=[1], name="capkv"),
                     go.Scatter(x=[0, 1], y=[1, 2], name="not a method", line={"color": "#123456"}),
                     go.Scatter(x=[0], y=[1], name="jacap_prompt", mode="markers", marker={"symbol": "line-ew-open"})])
    finish(fig)
    assert fig.data[0].line.color == METHOD_STYLES["tova"][0]
    assert fig.data[1].marker.color == METHOD_STYLES["capkv"][0]
    assert fig.data[2].line.color == "#123456"
    assert fig.data[3].marker.color == METHOD_STYLES["jacap_prompt"][0] and fig.data[3].marker.symbol == "line-ew-open"


def _value(text: str) -> float:
    return float(text.replace("\u2212", "-"))


def test_log_ticks_decades_or_full_values():
    assert log_ticks([1e-5, 0.3])["dtick"] == 1 and log_ticks([1e-5, 0.3])["exponentformat"] == "e"
    assert log_ticks([1e-6, 1e6])["dtick"] == math.ceil(12 / 6)  # at most ~6 labelled decades
    # narrower than two decades: explicit round values written in full, never a single label
    quality = log_ticks([0.0134, 0.703])  # the baselines chapter's KL axis: plotly showed only "0.1"
    assert quality["tickvals"] == [0.02, 0.05, 0.1, 0.2, 0.5] and quality["ticktext"] == ["0.02", "0.05", "0.1", "0.2", "0.5"]
    assert log_ticks([0.03, 0.1])["tickvals"] == [0.03, 0.05, 0.1]  # 1-2-5 gives two: 1-2-3-5 gives three
    assert log_ticks([0.3, 0.45])["tickvals"] == [0.3, 0.4]  # finer sets would crowd: two labels
    assert log_ticks([5, 5.3])["tickvals"] == [5, 5.1, 5.2, 5.3]
    assert log_ticks([1.001, 1.002])["ticktext"] == ["1.001", "1.002"]  # no round value inside: the two ends
    assert log_ticks([2e-5, 9e-4])["ticktext"] == ["2e\u22125", "5e\u22125", "0.0001", "0.0002", "0.0005"]
    assert log_ticks([100, 5000])["ticktext"] == ["100", "200", "500", "1000", "2000", "5000"]


@pytest.mark.parametrize("lo", [1.3e-4, 0.0134, 0.03, 0.31, 0.9, 7.0])
@pytest.mark.parametrize("decades", [0.02, 0.1, 0.3, 0.7, 1.2, 1.72, 1.99, 2.0, 2.6, 5.0])
def test_every_log_span_gets_two_to_eight_labels_that_state_their_value(lo, decades):
    hi = lo * 10 ** decades
    t = log_ticks([lo, hi])
    if "tickvals" in t:
        vals = t["tickvals"]
        assert 2 <= len(vals) <= 8 and vals == sorted(vals)
        assert all(lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9) for v in vals)  # inside the data's extent
        assert [_value(x) for x in t["ticktext"]] == pytest.approx(vals, rel=1e-12)  # each label is its value
    else:  # decades: at least two labelled powers of ten inside the span (every dtick-th one)
        powers = [e for e in range(-20, 20) if lo <= 10.0 ** e <= hi]
        assert len(powers[:: t["dtick"]]) >= 2


def test_finish_labels_a_narrow_log_axis_from_its_data_or_its_range():
    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[0.04, 0.1, 0.3], error_y={"array": [0.01, 0.02, 0.2]}))
    fig.update_yaxes(type="log")
    finish(fig)
    assert list(fig.layout.yaxis.tickvals) == [0.05, 0.1, 0.2, 0.5]  # the extent 0.03-0.5 includes the error bars
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1e-4, 10.0]))
    fig.update_yaxes(type="log", range=[math.log10(0.03), math.log10(0.5)])  # a set range decides, not the data
    finish(fig)
    assert list(fig.layout.yaxis.tickvals) == [0.05, 0.1, 0.2, 0.5]


def test_setting_colours_are_distinct_and_ordered_shades_darken():
    names = [f"setting {i}" for i in range(len(style.SETTING_COLOURS))]
    colours = style.setting_colours(names + names[:3])  # repeats get their first colour
    assert list(colours) == names and len(set(colours.values())) == len(names)
    with pytest.raises(ValueError, match="names"):
        style.setting_colours(names + ["one too many"])
    shades = style.setting_colours(["0.5", "0.9", "0.99"], ordered=True)
    lum = [sum(int(v) for v in c[4:-1].split(",")) for c in shades.values()]  # "rgb(r, g, b)": light to dark
    assert len(set(shades.values())) == 3 and lum == sorted(lum, reverse=True)
    # five values of one knob: neighbouring steps differ clearly (RGB distance), not five near-identical shades
    five = [[int(v) for v in c[4:-1].split(",")] for c in style.setting_colours(list("abcde"), ordered=True).values()]
    assert min(sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 for a, b in zip(five, five[1:])) > 50


def _lightness(rgb) -> float:
    """CIE L* (0 black, 100 white) of an sRGB triple 0-255, computed here from the sRGB and CIE formulas."""
    lin = [(u / 12.92 if u <= 0.04045 else ((u + 0.055) / 1.055) ** 2.4) for u in (v / 255 for v in rgb)]
    y = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return 116 * y ** (1 / 3) - 16 if y > 216 / 24389 else 24389 / 27 * y


def test_ordered_shades_turn_in_hue_and_fall_in_lightness():
    """The values of one Jacap knob (the serving chapter's five β): lightness differs pairwise by at least 10 L*
    units and falls from light to dark, and the hue (CIELAB) turns at every step and by at least 90 degrees in all,
    so the lines are five colours, not five near-identical orange-browns (the old YlOrBr ramp fails this)."""
    assert _lightness((255, 255, 255)) == pytest.approx(100) and _lightness((0, 0, 0)) == 0
    assert _lightness((119, 119, 119)) == pytest.approx(50, abs=0.5)

    def hue(rgb):
        _, a, b = _lab("#%02x%02x%02x" % tuple(rgb))
        return math.degrees(math.atan2(b, a))

    def shades_of(n):
        return [[int(float(v)) for v in c[4:-1].split(",")]
                for c in style.setting_colours([f"{i}" for i in range(n)], ordered=True).values()]

    for n in (2, 5, 7):
        shades = shades_of(n)
        light = [_lightness(c) for c in shades]
        assert light == sorted(light, reverse=True)
        assert min(a - b for a, b in zip(light, light[1:])) >= (10 if n <= 5 else 7), light
        assert light[0] - light[-1] >= 50  # the ramp spans light to dark
        turns = [abs((hue(a) - hue(b) + 180) % 360 - 180) for a, b in zip(shades, shades[1:])]
        assert min(turns) >= (10 if n <= 5 else 5) and sum(turns) >= 90, turns
    import plotly.colors
    old = [[int(float(v)) for v in c[4:-1].split(",")] for c in plotly.colors.sample_colorscale("YlOrBr", [0.4, 0.55, 0.7, 0.85, 1.0])]
    assert sum(abs((hue(a) - hue(b) + 180) % 360 - 180) for a, b in zip(old, old[1:])) < 90
    assert len(set(style.SETTING_DASHES)) == len(style.SETTING_DASHES) and "dash" not in style.SETTING_DASHES


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
             for L in (512, 1024) for c in (0.5, 0.9) for m, kl in (("jacap_prompt[tau=3,beta=0.9]", 0.1), ("tova", 0.2))]
    fig = evaluation.kl_figure(cells)
    assert {fig.layout[f"yaxis{k if k > 1 else ''}"].type for k in range(1, 3)} == {"log"}
    jac = [t for t in fig.data if t.name == "JacapPromptPress()"]  # the press JacapPromptPress() builds, by that name
    assert len(jac) == 2 and {t.marker.color for t in jac} == {METHOD_STYLES["jacap_prompt"][0]}
    assert style.method_of(fig.data[0]) == "jacap_prompt"  # the default Jacap, named by what sets it apart: jacap's colour
    assert {t.marker.color for t in fig.data if t.name == "TOVA"} == {METHOD_STYLES["tova"][0]}  # its reader name
    # the ratios evenly spaced as categories (0.9 and 0.95 no longer bunch), said in the axis title
    assert fig.layout.xaxis.type == "category" and list(fig.layout.xaxis2.categoryarray) == ["0.5", "0.9"]
    # one x title shared below the panels (an annotation of make_subplots), not one per panel; the legend in rows
    # under it
    assert [a.text for a in fig.layout.annotations if "evenly spaced" in a.text] == ["compression ratio c (evenly spaced)"]
    assert not fig.layout.xaxis.title.text and list(fig.data[0].x) == ["0.5", "0.9"]
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.y < -0.2
    # the KL axis spans 0.05-0.4 (the intervals): several labelled round values, not one
    assert list(fig.layout.yaxis.tickvals) == [0.05, 0.1, 0.2]


def _demo(name, cases, reference):
    keys = ("label", "compression_ratio", "answer_logprob", "answer_correct")
    return {"name": name, "reference": dict(zip(keys[2:], reference)),
            "cases": [dict(zip(keys, c)) for c in cases]}


def test_failure_figure_one_colour_per_setting_marks_clear_of_the_bars():
    from jacap_lib.viz import decomposition as VD

    # the delayed-constraint shape: the protected prefix is capped at the budget at c = 0.9 (n_sink 25, not 26)
    demo = _demo("delayed_constraint", [("sinks only (n_sink=4)", c, -7.0 - c, False) for c in (0.5, 0.75, 0.9)]
                 + [("prefix protected (n_sink=26)", 0.5, -0.7, True), ("prefix protected (n_sink=26)", 0.75, -0.8, True),
                    ("prefix protected (n_sink=25)", 0.9, -0.3, True)], (-1.0, True))
    fig = VD.failure_figure(demo)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == ["sinks only (n_sink=4)", "prefix protected (n_sink=26; n_sink=25 at c = 0.9)"]
    assert list(bars[1].y) == [-0.7, -0.8, -0.3] and len({t.marker.color for t in bars}) == 2
    # the reference: a black dotted line named in the legend, no text label on the plot
    ref = [t for t in fig.data if t.type == "scatter"]
    assert [t.name for t in ref] == ["full cache (-1)"] and ref[0].line.color == style.REFERENCE_COLOUR
    assert [s.y0 for s in fig.layout.shapes] == [-1.0]
    # one ✓/✗ per bar, above the plot area (paper y >= 1, so over no bar), at the centre of its bar:
    # two bars share 0.8 of a category, centres at k - 0.2 and k + 0.2
    marks = fig.layout.annotations
    assert all(a.yref == "paper" and a.y >= 1 and a.yanchor == "bottom" for a in marks)
    assert sorted((round(a.x, 9), a.text) for a in marks) == sorted(
        [(round(k - 0.2, 9), "✗") for k in range(3)] + [(round(k + 0.2, 9), "✓") for k in range(3)])
    for t in bars:  # each bar's own extent: [k + offset, k + offset + width]
        assert all(w == pytest.approx(0.4) for w in t.width)
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_failure_figure_seven_settings_at_one_ratio_get_seven_colours():
    from jacap_lib.viz import decomposition as VD

    labels = ["flat mean"] + [f"EMA beta={b}" for b in (0.5, 0.8, 0.9, 0.95, 0.99, 0.999)]
    demo = _demo("phase_change", [(lab, 0.75, -1.0 - i, False) for i, lab in enumerate(labels)], (0.0, True))
    fig = VD.failure_figure(demo)
    bars = [t for t in fig.data if t.type == "bar"]
    colours = [t.marker.color for t in bars]
    assert [t.name for t in bars] == labels and len(set(colours)) == 7  # flat mean and β = 0.999 no longer share blue
    assert colours == list(style.setting_colours(labels).values())
    assert list(fig.layout.xaxis.categoryarray) == labels and fig.layout.xaxis.title.text == "setting"
    assert sorted(a.x for a in fig.layout.annotations) == pytest.approx(list(range(7)))  # one bar: the centre


def test_lag_figure_names_the_flat_mean_in_the_legend():
    from jacap_lib.viz import decomposition as VD

    lag = {"15": {"distance": {"0.5": 0.25, "0.9": 0.22, "0.999": 0.69, "flat": 0.34}},
           "5": {"distance": {"0.5": 0.27, "0.9": 0.14, "0.999": 0.47, "flat": 0.30}}}
    fig = VD.lag_figure(lag)
    assert [t.name for t in fig.data] == ["layer 5: EMA", "layer 5: flat mean", "layer 15: EMA", "layer 15: flat mean"]
    assert not fig.layout.annotations and not fig.layout.shapes  # no label drawn across the data lines
    assert list(fig.data[1].y) == [0.30] * 3 and fig.data[1].line.dash == "dot"
    assert fig.data[0].line.color == fig.data[1].line.color != fig.data[2].line.color
    assert fig.layout.xaxis.type == "category" and list(fig.data[0].x) == ["0.5", "0.9", "0.999"]
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_forest_ticks_coarse_then_finer_round_values():
    from jacap_lib.viz.style import forest_ticks

    assert forest_ticks(0.05, 20) == [0.1, 0.3, 1, 3, 10]  # three or more coarse ticks inside: those
    assert forest_ticks(0.6, 1.8) == [0.7, 1, 1.5]  # a narrow range: the finer round values inside
    assert forest_ticks(0.15, 8) == [0.3, 1, 3]
    assert forest_ticks(0.15, 2.5) == [0.2, 0.5, 1, 2]  # 0.2 .. 2 inside, more than four: every other
    assert forest_ticks(1.01, 1.02) == [1]  # none inside: 1
