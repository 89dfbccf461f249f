"""One look for every figure of the book: a colour and a marker per method, readable axes.

Every figure function of :mod:`jacap_lib.viz` ends with :func:`finish`, which

* draws each trace that stands for a method (its ``legendgroup`` or ``name`` is a key of
  :data:`METHOD_STYLES`) in that method's colour and marker, so a method looks the same on every page
  and its legend entry always matches its points;
* gives every log axis readable ticks (:func:`log_ticks`: whole decades written ``1e−3, 0.01, 0.1, 1``
  when the data span two decades or more, otherwise at least two — usually three to six — round values
  written in full, like ``0.03, 0.05, 0.1, 0.2, 0.5``; never a single label, plotly's bare ``2 3 … 9``
  digits or SI suffixes such as ``1f`` or ``100μ``), and every linear
  axis ``1e−4`` rather than ``100μ``;
* gives panels that share an axis (``matches``) the same axis type;
* keeps a legend clear of a slider (a legend below the plot moves to the right when the figure has a
  slider) and a long title on several lines instead of clipped.

:func:`clip_outliers` keeps a single extreme value from flattening a panel: the axis shows the bulk of
the values and an annotation names what lies beyond it.

Tables: :func:`wrapped` lets the free-text columns of a table (licences, method specs) wrap at spaces inside
the text column, where the book's stylesheet keeps every other cell on one line.

The browser test (``tests/test_browser.py``) reads :data:`METHOD_STYLES` and checks every page against it.
"""
from __future__ import annotations

import html
import math
import re
import textwrap
import zlib

import pandas as pd
import plotly.colors
import plotly.graph_objects as go

__all__ = ["wrapped", "WrappedFrame", "setting_colour", "FIGURE_WIDTH", "FOREST_TICKS", "forest_ticks", "log_tickvals", "METHOD_STYLES", "SETTING_COLOURS", "SETTING_SCALE", "SETTING_DASHES", "REFERENCE_COLOUR", "method_style", "method_of", "style_key", "setting_colours",
           "finish", "log_ticks", "clip_outliers", "wrap_title"]

#: method name -> (colour, marker symbol): the one mapping of the book. Jacap and its configurations in
#: warm colours, the kvpress baselines in cool and neutral ones; any two methods a figure can draw together (the
#: registry's methods, Algorithm 2, the references and the named settings) differ by at least 18 in CIELAB
#: (tests/test_viz_style.py), so no two of them read as one colour.
METHOD_STYLES: dict[str, tuple[str, str]] = {
    "jacap_prompt": ("#d62728", "circle"),
    "jacap_torch": ("#d62728", "circle"),            # the same scorer: Jacap's torch reference
    "jacap_triton": ("#e7298a", "circle-open"),      # Jacap's Triton kernels
    "jacap_triton_async": ("#c51b7d", "circle-dot"),  # the same kernels, check=False (no synchronisation)
    "jacap_prompt[window=0]": ("#ff7f0e", "diamond"),
    "jacap_prompt[tau=3,beta=0.9]": ("#d62728", "circle"),  # the tune choice = JacapPromptPress()'s defaults: the same press as jacap
    # two settings as a written-out spec is named (results.findings.short_spec): the paper's exact settings
    # (protocol.PAPER_PRESET), and Algorithm 1 tuned
    "jacap_prompt[beta=none,centre=tempered,tau=10,window=32]": ("#620042", "star"),
    "jacap_prompt[centre=tempered,tau=3,window=128]": ("#fc0080", "circle"),
    "jacap_obs": ("#762a83", "star-triangle-up"),    # the capacity press linearised at the observed attention
    "jacap_ea": ("#993404", "star-square"),          # the capacity press linearised at Expected Attention's centre
    "jacap_prompt_adakv": ("#f781bf", "diamond"),           # Jacap's scores under kvpress AdaKV's head-adaptive budgets
    # one-knob changes of the default (the critique's anatomy of the losing cells, jacap_lib.experiments.anatomy)
    "jacap_prompt[tau=3,beta=0.9,n_sink=4,window=0]": ("#ff7f0e", "diamond"),  # no window: the same knob as jacap_prompt[window=0]
    "jacap_prompt[tau=3,beta=0.9,n_sink=0,window=0]": ("#8c510a", "diamond-open"),
    "jacap_prompt[tau=1,beta=0.9]": ("#f768a1", "triangle-up"),
    "jacap_prompt[tau=10,beta=0.9]": ("#67000d", "triangle-down"),
    "jacap_prompt[tau=3,beta=0.9,noise=1e+06]": ("#fdae61", "square"),
    "jacap_prompt[tau=3,beta=0.9,gqa=mean]": ("#ce1256", "cross"),
    "jacap_prompt[tau=3,beta=none]": ("#fc8d59", "star-open"),
    "jacap_prompt[tau=3,beta=0.9]+window_attention[obs_window=32]": ("#54278f", "pentagon"),  # centre = SnapKV's window attention
    "expected_attention+protect[n_sink=4,window=32]": ("#08519c", "hexagon-open"),  # its score, Jacap's protection
    "alg2": ("#e6ab02", "hexagram"),                 # Algorithm 2: the decode-time Jacap controller
    "alg2_flat": ("#a6761d", "hexagram-open"),       # Algorithm 2 with flat (cumulative) query statistics
    "capkv": ("#1f77b4", "square"),
    "snapkv": ("#2ca02c", "triangle-up"),
    "snapkv[window_size=32]": ("#006d2c", "triangle-down"),
    "snapkv[window_size=16]": ("#74c476", "triangle-left"),
    "tova": ("#9467bd", "x"),
    "knorm": ("#8c564b", "cross"),
    "keydiff": ("#bcbd22", "pentagon"),
    "expected_attention": ("#17becf", "hexagon"),
    "streaming_llm": ("#a3a3a3", "triangle-right"),
    # kvpress's newer presses (registry.PEERS), cool colours of their own
    "kvzip": ("#00441b", "star"),                    # scores from the model's reconstruction of its context
    "kvgrad": ("#da16ff", "star-open"),
    "compactor": ("#3f007d", "square-x"),
    "leverage_score": ("#66c2a5", "square-open"),
    "lagkv": ("#511cfb", "bowtie"),
    "cur": ("#6baed6", "hourglass"),
    "pyramidkv": ("#6c7c32", "triangle-ne"),
    "critical_kv": ("#24796c", "hexagram"),
    "critical_adakv": ("#3283fe", "hexagram-open"),
    "jacap": ("#fd8d3c", "star-diamond"),    # the capacity press with the reconstruction queries' statistics
    "window": ("#525252", "square-open"),            # a sliding window (sinks + the most recent tokens)
    "random": ("#393b79", "diamond-open"),
    "full": ("#000000", "circle-open"),              # no compression (reference)
    "floor": ("#000000", "line-ew"),                 # one read of K and V (reference)
    "floor_gemm": ("#969696", "line-ns"),            # two N d^2 GEMMs: Algorithm 1's compute floor (reference)
}

# further Jacap configurations (not drawn in the book's figures today) get one of these, by name
_JACAP_EXTRA = ("#a50f15", "#fc8d59", "#b35806", "#f768a1", "#ce1256", "#fdae61")
_OTHER_EXTRA = ("#08519c", "#41ab5d", "#6a51a3", "#636363", "#0868ac", "#807dba")


#: the colours of a figure's settings that are not methods of :data:`METHOD_STYLES` (the cases of one demo, the
#: values of one knob, the layers of one model), handed out in order by :func:`setting_colours` so that no two
#: settings of one figure share a colour: plotly's D3 palette
SETTING_COLOURS: tuple[str, ...] = tuple(c.lower() for c in plotly.colors.qualitative.D3)

#: the colour of a reference drawn in a figure (the full cache, an exact optimum): black, as ``full`` above
REFERENCE_COLOUR = METHOD_STYLES["full"][0]


#: the sequential scale (and the part of it used) for the ordered values of one knob of Jacap (β, τ, ...): plasma,
#: reversed, from gold through orange and magenta to indigo. Its lightness falls evenly (CIE L* about 80 to 19) and
#: its hue turns as it falls, so five values are five colours, not five shades of one orange-brown.
SETTING_SCALE = ("Plasma_r", 0.15, 0.95)
#: the line dashes of the ordered values of one knob, one each in order, so that lines of neighbouring values stay
#: apart where they cross (no plain "dash": that marks a reference such as the sliding window)
SETTING_DASHES = ("solid", "dot", "dashdot", "longdash", "longdashdot")


def setting_colours(names, *, ordered: bool = False) -> dict[str, str]:
    """``{name: colour}``: a distinct colour for each distinct name, in order of first appearance (the settings
    one figure compares): :data:`SETTING_COLOURS` one by one, or with ``ordered=True`` (the values of one knob,
    given in increasing order) evenly spaced shades of :data:`SETTING_SCALE`, light to dark. Raises
    ``ValueError`` for more unordered settings than colours."""
    names = list(dict.fromkeys(names))
    if not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"names must be non-empty setting names, got {names!r}")
    if ordered:
        scale, lo, hi = SETTING_SCALE
        shades = plotly.colors.sample_colorscale(scale, [lo + (hi - lo) * i / max(len(names) - 1, 1)
                                                         for i in range(len(names))])
        return dict(zip(names, shades))
    if len(names) > len(SETTING_COLOURS):
        raise ValueError(f"names has {len(names)} settings, more than the {len(SETTING_COLOURS)} distinct setting "
                         "colours; split the figure or compare fewer settings")
    return {n: SETTING_COLOURS[i] for i, n in enumerate(names)}


def method_style(name: str) -> dict:
    """``{"color", "symbol"}`` of a method name (a registry name, a method spec ``name[key=value]``, or one
    of the book's reference names such as ``"full"``). Names outside :data:`METHOD_STYLES` get a fixed
    colour derived from the name (the same on every page)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty method name, got {name!r}")
    if name in METHOD_STYLES:
        color, symbol = METHOD_STYLES[name]
    else:
        pool = _JACAP_EXTRA if name.startswith("jacap") else _OTHER_EXTRA
        color = pool[zlib.crc32(name.encode()) % len(pool)]
        base = name.split("[", 1)[0]
        symbol = METHOD_STYLES.get(base, (None, "circle"))[1]
    return {"color": color, "symbol": symbol}


def style_key(spec: str) -> str:
    """The :data:`METHOD_STYLES` key a setting is drawn with: the spec itself, or its short spec
    (:func:`~jacap_lib.experiments.names.short_spec`), when that has a colour of its own (Algorithm 1 tuned and as
    published are two colours, SnapKV's window), else its method's (``capkv[tau=10]`` -> ``capkv``)."""
    from jacap_lib.experiments.names import short_spec

    if spec in METHOD_STYLES:
        return spec
    short = short_spec(spec)
    return short if short in METHOD_STYLES else spec.split("[", 1)[0]


def method_of(trace) -> str | None:
    """The method a trace stands for: its ``legendgroup`` or its ``name`` when that is a key of
    :data:`METHOD_STYLES`, else ``None``."""
    for key in (getattr(trace, "legendgroup", None), getattr(trace, "name", None)):
        if isinstance(key, str) and key in METHOD_STYLES:
            return key
    return None


def _paint(trace, style: dict) -> None:
    kind = trace.type
    if kind in ("scatter", "scattergl"):
        mode = trace.mode or "lines+markers"
        if "lines" in mode:
            trace.update(line={"color": style["color"]})
        trace.update(marker={"color": style["color"]})
        if trace.marker.symbol is None:  # a symbol set on purpose (e.g. a mean bar) stays
            trace.update(marker={"symbol": style["symbol"]})
        if trace.error_y is not None and trace.error_y.array is not None:
            trace.update(error_y={"color": style["color"]})
    elif kind in ("bar", "box", "violin", "histogram"):
        trace.update(marker={"color": style["color"]})
        if kind in ("box", "violin"):
            trace.update(line={"color": style["color"]})


def wrap_title(text: str, width: int = 72) -> str:
    """``text`` broken into lines of at most ``width`` characters with ``<br>`` (existing ``<br>`` kept)."""
    parts = []
    for part in str(text).split("<br>"):
        if "<" in part:  # markup such as <sub>: leave it on its own line
            parts.append(part)
        else:
            parts.extend(textwrap.wrap(part, width) or [""])
    return "<br>".join(parts)


def _axis_names(fig: go.Figure, letter: str) -> list[str]:
    layout = fig.to_plotly_json().get("layout", {})
    names = {k for k in layout if k == f"{letter}axis" or (k.startswith(f"{letter}axis") and k[5:].isdigit())}
    for tr in fig.data:  # axes used by a trace but never set in the layout
        ref = getattr(tr, f"{letter}axis", None) or letter
        names.add(f"{letter}axis" + ref[1:])
    return sorted(names, key=lambda n: int(n[5:] or 1))


def _values_on(fig: go.Figure, axis: str) -> list[float]:
    """Every finite number the traces put on layout axis ``axis`` (``"yaxis2"``), with error bars."""
    letter, ref = axis[0], axis[0] + axis[5:]
    out: list[float] = []

    def add(seq):
        if seq is None:
            return
        for v in seq:
            if isinstance(v, (list, tuple)):
                add(v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out.append(float(v))

    for tr in fig.data:
        if (getattr(tr, f"{letter}axis", None) or letter) != ref:
            continue
        vals = getattr(tr, letter, None)
        if vals is None:
            continue
        vals = list(vals)
        add(vals)
        err = getattr(tr, f"error_{letter}", None)
        if err is not None and err.array is not None:
            hi = list(err.array)
            lo = list(err.arrayminus) if err.arrayminus is not None else hi
            for v, a, b in zip(vals, hi, lo):
                if isinstance(v, (int, float)) and a is not None and b is not None:
                    add([v + a, v - b])
    return out


#: mantissas of the labelled values on a log axis narrower than two decades, coarsest first: the first set that
#: labels at least three values in the span is used (``0.02, 0.05, 0.1, 0.2, 0.5``; ``0.03, 0.05, 0.1``; ...)
_MANTISSAS = ((1, 2, 5), (1, 2, 3, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9), tuple(round(1 + k / 10, 1) for k in range(90)))


def _tick_text(v: float) -> str:
    """A tick value as a full number (``0.05``, ``200``), or ``2e−5`` / ``3e6`` where that is shorter."""
    s = f"{v:g}"
    if "e" in s:
        mant, exp = s.split("e")
        s = f"{mant}e{int(exp)}"
    return s.replace("-", "\u2212")


def _nice_values(lo: float, hi: float, mantissas) -> list[float]:
    out = []
    for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        for m in mantissas:
            v = float(f"{m}e{e}")  # exact decimal: 3e-2 is 0.03, not 0.030000000000000002
            if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9):
                out.append(v)
    return out


def log_ticks(values) -> dict:
    """Tick settings for a log axis showing ``values`` (the data's extent, or the axis range): whole decades
    (``1e−3, 0.01, 0.1, 1, 10``; every k-th decade when more than 6 would show) when the positive values span
    at least two decades, so that at least two decades are labelled; otherwise explicit ticks at round values
    written as full numbers (``0.03, 0.05, 0.1, 0.2, 0.5``: the coarsest of :data:`_MANTISSAS` that labels three
    values, at least two), so a narrow log axis never shows a single label, bare ``2 3 … 9`` digits or SI
    suffixes."""
    pos = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    if not pos:
        return {"dtick": 1, "exponentformat": "e", "tickformat": None}
    lo, hi = min(pos), max(pos)
    span = math.log10(hi / lo)
    if span >= 2:  # whole decades, every one labelled up to 6 labels, else every 2nd, 3rd, ...
        return {"dtick": max(1, math.ceil(span / 6)), "exponentformat": "e", "tickformat": None,
                "minor": {"ticks": "inside", "ticklen": 3}}
    if span == 0:  # one value: that value and a round neighbour on each side
        lo, hi = lo / 1.5, hi * 1.5
    ticks: list[float] = []
    for mantissas in _MANTISSAS:
        found = _nice_values(lo, hi, mantissas)
        if len(found) > 8 and len(ticks) >= 2:  # finer would crowd the axis: keep the two labels found
            break
        if len(found) >= 2:
            ticks = found
        if len(ticks) >= 3:
            break
    if len(ticks) < 2:  # a span too narrow for round values: its two ends, with digits enough to differ
        digits = 3
        while float(f"{lo:.{digits}g}") == float(f"{hi:.{digits}g}") and digits < 15:
            digits += 1
        ticks = [float(f"{lo:.{digits}g}"), float(f"{hi:.{digits}g}")]
    if len(ticks) > 8:  # one set jumped from two labels to many: every k-th of them
        ticks = ticks[::math.ceil(len(ticks) / 6)]
    return {"tickmode": "array", "tickvals": ticks, "ticktext": [_tick_text(v) for v in ticks],
            "exponentformat": "e", "tickformat": None}


def clip_outliers(fig: go.Figure, axis: str = "yaxis", *, factor: float = 5.0, quantiles=(0.02, 0.98)):
    """Show the bulk of the values on a linear ``axis`` when a few extreme ones would flatten it: the range
    becomes the ``quantiles`` of the values widened by ``factor`` times their spread (never past the data),
    and an annotation says how many values lie beyond it and the extreme one. Does nothing when every value
    fits that range."""
    vals = sorted(_values_on(fig, axis))
    if len(vals) < 5:
        return fig
    q = lambda p: vals[min(len(vals) - 1, max(0, round(p * (len(vals) - 1))))]  # noqa: E731
    lo, hi = q(quantiles[0]), q(quantiles[1])
    spread = max(hi - lo, 1e-12)
    low, high = max(vals[0], lo - factor * spread), min(vals[-1], hi + factor * spread)
    pad = 0.05 * (high - low)
    outside = [v for v in vals if v < low or v > high]
    if not outside:
        return fig
    fig.update_layout({axis: {"range": [low - pad, high + pad]}})
    extreme = max(outside, key=abs)
    ref = axis[0] + axis[5:]
    domain_ref = f"{ref} domain"
    fig.add_annotation(text=f"{len(outside)} value{'s' if len(outside) > 1 else ''} off the scale "
                            f"(the extreme: {extreme:.3g})",
                       xref=("x" + axis[5:]) + " domain" if axis[0] == "y" else domain_ref,
                       yref=domain_ref if axis[0] == "y" else ("y" + axis[5:]) + " domain",
                       x=1, y=1 if extreme > 0 else 0, xanchor="right", yanchor="top" if extreme > 0 else "bottom",
                       showarrow=False, font={"size": 11}, bgcolor="rgba(255,255,255,0.8)")
    return fig


def finish(fig: go.Figure, *, title_width: int = 72) -> go.Figure:
    """The book's styling, applied last by every figure function (see the module docstring)."""
    for tr in fig.data:
        m = method_of(tr)
        if m is not None:
            _paint(tr, method_style(m))
    for frame in fig.frames or ():
        for tr in frame.data:
            m = method_of(tr)
            if m is not None:
                _paint(tr, method_style(m))
    for letter in ("x", "y"):
        names = _axis_names(fig, letter)
        # panels linked by `matches` compare the same quantity: one axis type for all of them
        for name in names:
            ax = fig.layout[name]
            if ax.matches:
                target = fig.layout[letter + "axis" + ax.matches[1:]]
                if target.type and ax.type != target.type:
                    ax.type = target.type
                elif ax.type and not target.type:
                    target.type = ax.type
        for name in names:
            ax = fig.layout[name]
            if ax.type == "log":
                group = lambda n: fig.layout[n].matches or letter + n[5:]  # noqa: E731
                if ax.range is not None and None not in ax.range:  # a set log range is in decades
                    vals = [10 ** min(ax.range), 10 ** max(ax.range)]
                else:
                    vals = [v for n in names if group(n) == group(name) for v in _values_on(fig, n)]
                settings = log_ticks(vals)
                if ax.dtick is None and ax.tickvals is None:
                    ax.update(settings)
                else:
                    ax.update(exponentformat="e")
            elif ax.exponentformat is None:
                ax.exponentformat = "e"
    title = fig.layout.title.text
    if title:
        wrapped = wrap_title(title, title_width)
        lines = wrapped.count("<br>") + 1
        fig.layout.title.text = wrapped
        top = fig.layout.margin.t
        # subplot titles sit just above the plots: keep the figure title clear of them
        over = any(a.yref == "paper" and (a.y or 0) >= 0.99 and a.yanchor == "bottom" for a in fig.layout.annotations)
        need = 40 + 22 * lines + (24 if over else 0)
        if top is None or top < need:
            fig.update_layout(margin={"t": need})
    if fig.layout.sliders:
        legend = fig.layout.legend
        if legend.orientation == "h" or (legend.y is not None and legend.y < 0):
            fig.update_layout(legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"})
    return fig


# --------------------------------------------------------------------------------------------------- tables
def _cell_html(value, *, breaks: bool = False) -> str:
    """A table entry as HTML that wraps only at spaces (and after the slash of ``won/lost``) and never inside a
    number, an interval or a unit: hyphens next to a digit are non-breaking (``1811-1817``, ``Apache-2.0``), so
    are the spaces of ``τ = 3``, ``95 %`` and ``[0.83, 0.93]``. With ``breaks``, a method spec may also wrap
    after its ``[``, each ``,`` and the ``_`` of a name (``<wbr>``: no character is added, the spec copies as
    written)."""
    text = html.escape(str(value))
    text = re.sub(r"-(?=\d)|(?<=\d)-", "\u2011", text)
    text = re.sub(r"(?<=\d)([–—])(?=[\d+−])", "\\1\u2060", text)  # "7–17": no break after the dash
    text = text.replace(" = ", "\u00a0=\u00a0")
    text = re.sub(r"(?<=\d) %", "\u00a0%", text)  # "95 %" stays whole
    text = re.sub(r"\[[^\[\]]*\]", lambda m: m.group(0).replace(" ", "\u00a0"), text)  # an interval stays whole
    text = re.sub(r"(?<=[A-Za-z])/(?=[A-Za-z])", "/<wbr>", text)  # "won/lost" may wrap after its slash
    if breaks:  # a spec name[key=value,...] (no spaces) may wrap after its "[", each "," and a name's "_"
        text = re.sub(r"\w\[[^\[\]\s]*\]", lambda m: m.group(0).replace("[", "[<wbr>").replace(",", ",<wbr>"), text)
        text = re.sub(r"(?<=[A-Za-z])_(?=[A-Za-z])", "_<wbr>", text)
    return text


class WrappedFrame(pd.DataFrame):
    """A :class:`pandas.DataFrame` whose HTML fits the text column: its headers and entries may wrap at spaces
    (never inside a number, an interval ``[a, b]``, ``τ = 3`` or ``95 %``: :func:`_cell_html`), and so may the
    index levels named in ``wrap_columns`` (free text: licences, method specs, setting names, verdicts), where a
    spec may also wrap after its ``[`` and each ``,``. The book's stylesheet keeps the cells of other tables on one
    line; the browser's table layout wraps only as far as the text column needs, and never narrows a column below
    its longest word. The values are the frame's own; only the HTML differs. Made by :func:`wrapped`."""

    _metadata = ["wrap_columns"]

    @property
    def _constructor(self):
        return WrappedFrame

    def _repr_html_(self) -> str:
        names = list(getattr(self, "wrap_columns", None) or ())
        cols = [c for c in names if c in self.columns]
        levels = [k for k, n in enumerate(self.index.names) if n is not None and n in names]
        sty = pd.DataFrame(self).style
        sty = sty.format(_cell_html, escape=None).format_index(_cell_html, axis=1, escape=None)
        sty = sty.format_index(_cell_html, axis=0, escape=None)
        if levels:
            sty = sty.format_index(lambda v: _cell_html(v, breaks=True), axis=0, escape=None, level=levels)
        if cols:
            sty = sty.format(lambda v: _cell_html(v, breaks=True), subset=cols, escape=None)
        wrap = "white-space: normal;"
        styles = [{"selector": "th.col_heading", "props": wrap}, {"selector": "td", "props": wrap}]
        styles += [{"selector": f"th.row_heading.level{k}", "props": wrap} for k in levels]
        return sty.set_table_styles(styles).to_html()


def wrapped(frame, columns=()) -> WrappedFrame:
    """``frame`` as a :class:`WrappedFrame`: its headers and entries, and the free-text ``columns`` or index levels
    (names of either), wrap at spaces (a spec also after ``[`` and ``,``), so the table fits the text column.
    Raises ``ValueError`` for a name that is neither a column nor an index level."""
    names = set(frame.columns) | {n for n in frame.index.names if n is not None}
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"columns {missing} are neither columns nor index levels of the frame "
                         f"(its columns: {list(frame.columns)}, index levels: {list(frame.index.names)})")
    out = WrappedFrame(frame)
    out.wrap_columns = list(columns)
    return out


FIGURE_WIDTH = 650  # fixed-width figures fit the text column (676 px in the built book at a 1,280 px window) and a
#                   collapsed output opened (654 px inside its toggle)
FOREST_TICKS = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100)  # the forest plots' ticks: few, so several panels fit
_NICE = (0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 7, 10, 20, 30, 50, 100)


def log_tickvals(values) -> list[float]:
    """Tick values for a log axis over ``values``: the 1-1.5-2-3-5-7 steps inside their range, at least two
    (the nearest outside values are added when fewer fall inside)."""
    pos = [v for v in values if v > 0 and math.isfinite(v)]
    if not pos:
        return [1, 2]
    lo, hi = min(pos), max(pos)
    ticks = [t for t in _NICE if lo <= t <= hi]
    below = [t for t in _NICE if t < lo]
    above = [t for t in _NICE if t > hi]
    while len(ticks) < 2 and (below or above):
        if below:
            ticks.insert(0, below.pop())
        if len(ticks) < 2 and above:
            ticks.append(above.pop(0))
    return ticks


def forest_ticks(lo: float, hi: float) -> list[float]:
    """The ticks of a forest plot's log axis over ``[lo, hi]``: the coarse :data:`FOREST_TICKS` inside it, or, when
    fewer than three fall inside (a narrow range), the finer round values of :func:`log_tickvals` inside it (every
    other one when more than four), ``[1]`` when none falls inside."""
    ticks = [t for t in FOREST_TICKS if lo <= t <= hi]
    if len(ticks) >= 3:
        return ticks
    ticks = [t for t in log_tickvals([lo, hi]) if lo <= t <= hi] or [1]
    return ticks[::2] if len(ticks) > 4 else ticks


def setting_colour(spec: str) -> str:
    """The colour of a setting: its short spec's when the book has one (Algorithm 1 tuned, as published), else its
    registry name's (``expected_attention[n_future_positions=32]`` -> Expected Attention's)."""
    from ..presses.registry import parse_method
    from jacap_lib.experiments.names import short_spec

    short = short_spec(spec)
    if short in METHOD_STYLES:
        return METHOD_STYLES[short][0]
    from jacap_lib.verdicts.rows import is_prompt_default

    if is_prompt_default(spec):
        return METHOD_STYLES[parse_method(spec)[0]][0]
    return method_style(parse_method(spec)[0])["color"]
