"""Figures of the live-eviction chapter: the prompt as a strip of tokens coloured by what the cache keeps.

* :func:`token_strip` - one inspection, one (layer, head) or the fraction of all heads keeping each
  token; hover shows the token's Jacap components;
* :func:`token_strip_slider` - the same strip for several inspections (e.g. compression ratios)
  behind a precomputed plotly slider, so it moves in the static site;
* :func:`head_budgets` - how many tokens each layer and KV head keeps: one number for a press with a per-head
  budget, a different one per head for a press that spreads its budget over heads and layers (the default
  ``JacapPress``, KVzip);
* :func:`kl_bars` - next-token KL per compression ratio and method (linear axis from 0, the book's method
  colours).
"""
from __future__ import annotations

import html

import plotly.graph_objects as go
from .style import finish

__all__ = ["strip_data", "token_strip", "token_strip_slider", "head_budgets", "memory_bars", "kl_bars", "answers_note", "ragged_bench_frames",
           "reader_name"]

_HOVER_FIELDS = ("score", "alpha", "rho", "kappa", "weight", "leverage")


def _grid(values, width, fill=None):
    """``values`` as rows of ``width``; the last row padded with ``fill`` (``""`` for text: plotly would
    print a ``None`` text as the word "null")."""
    rows = -(-len(values) // width)
    padded = list(values) + [fill] * (rows * width - len(values))
    return [padded[r * width : (r + 1) * width] for r in range(rows)]


def strip_data(insp, layer: int | None = None, head: int | None = None, width: int = 16) -> dict:
    """Heat-strip arrays for :func:`token_strip`: ``z`` (keep fraction or 0/1), ``text``, ``hover``.

    ``layer``/``head`` ``None`` = averaged over all layers / heads. Components in the hover are those
    of the chosen (layer, head), averaged the same way when not chosen.
    """
    if layer is not None and not 0 <= layer < insp.n_layers:
        raise ValueError(f"layer must be in [0, {insp.n_layers}) or None, got {layer}")
    if head is not None and not 0 <= head < insp.n_heads:
        raise ValueError(f"head must be in [0, {insp.n_heads}) or None, got {head}")
    keep = insp.keep_fraction(layer, head)
    parts = {}
    for name in _HOVER_FIELDS:
        value = getattr(insp, name)
        if value is None:
            continue
        v = value if layer is None else value[layer : layer + 1]
        v = v if head is None else v[:, head : head + 1]
        parts[name] = v.float().mean(dim=(0, 1))
    hover = []
    for i, tok in enumerate(insp.tokens):
        lines = [f"#{i} {html.escape(repr(tok))}", f"kept by {float(keep[i]):.0%} of heads"]
        lines += [f"{name} = {float(val[i]):.3g}" for name, val in parts.items()]
        hover.append("<br>".join(lines))
    shown = [html.escape(t.replace("\n", "⏎")) for t in insp.tokens]
    return {"z": _grid(keep.tolist(), width), "text": _grid(shown, width, ""), "hover": _grid(hover, width, ""),
            "keep": keep, "parts": parts}


def _title(insp, layer, head):
    where = "all layers" if layer is None else f"layer {layer}"
    where += ", all KV heads" if head is None else f", KV head {head}"
    n_kept = insp.n_kept
    kept = f"{int(n_kept.flatten()[0])}/{insp.n_tokens} tokens kept per head" if n_kept.unique().numel() == 1 else \
        f"{int(n_kept.min())}–{int(n_kept.max())} of {insp.n_tokens} tokens kept per head (mean {insp.budget})"
    return f"{insp.method} at c = {insp.compression_ratio:g}: {kept} ({where})"


def head_budgets(insp, title: str | None = None) -> go.Figure:
    """Heatmap: the share of the prompt each (layer, KV head) keeps (:attr:`EvictionInspection.n_kept` over
    ``N``), layers across, KV heads down, the count in each cell's hover."""
    n_kept = insp.n_kept  # (L, H)
    share = (n_kept.float() / insp.n_tokens).T.tolist()
    hover = [[f"layer {l}, KV head {h}: {int(n_kept[l, h])} of {insp.n_tokens} tokens kept" for l in
              range(insp.n_layers)] for h in range(insp.n_heads)]
    fig = go.Figure(go.Heatmap(
        z=share, x=list(range(insp.n_layers)), y=[str(h) for h in range(insp.n_heads)], customdata=hover,
        hovertemplate="%{customdata}<extra></extra>", zmin=0, zmax=1, colorscale="Blues",
        colorbar={"title": "kept"}, xgap=1, ygap=2,
    ))
    fig.update_yaxes(autorange="reversed", title="KV head")
    fig.update_xaxes(title="layer", dtick=5)
    fig.update_layout(title=title or f"{insp.method} at c = {insp.compression_ratio:g}: share of the prompt each "
                      "KV head keeps", height=120 + 28 * insp.n_heads, margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return finish(fig)


#: how the live chapter's figures and tables name a press for a reader
_READER_NAMES = {"jacap": "the default", "jacap_prompt": "the prompt press"}


def reader_name(method: str) -> str:
    """A method's name for a reader of the live chapter: "the default" (``JacapPress``), "the prompt press"
    (``JacapPromptPress``), kvpress's press names ("KVzip", "SnapKV", ...); any other spec's registry name."""
    from ..presses.registry import press_name

    return _READER_NAMES.get(method.split("[", 1)[0], press_name(method))


def memory_bars(inspections: list, title: str | None = None) -> go.Figure:
    """Bars: the cache's bytes after each press, in % of the uncompressed cache, against c. Per press one solid bar
    (what the cache kvpress leaves holds: :attr:`EvictionInspection.bytes_held`) and, for a press that masks keys,
    a hatched one beside it (its kept entries alone, freed into a ragged cache: ``bytes_freed``); a dotted line at
    ``1 - c`` would be a perfect prune. ``inspections``: :func:`~jacap_lib.measure.eviction.inspect_eviction`
    results with bytes, several c per press."""
    if not inspections or any(i.bytes_full is None or i.bytes_held is None for i in inspections):
        raise ValueError("inspections must be a non-empty list of EvictionInspection with bytes (from inspect_eviction)")
    ratios = sorted({i.compression_ratio for i in inspections})
    x = [f"c = {c:g}" for c in ratios]
    fig = go.Figure()
    for method in dict.fromkeys(i.method for i in inspections):
        by_c = {i.compression_ratio: i for i in inspections if i.method == method}
        name = reader_name(method)
        held = [100 * by_c[c].bytes_held / by_c[c].bytes_full if c in by_c else None for c in ratios]
        masks = any(i.bytes_freed is not None for i in by_c.values())
        fig.add_bar(x=x, y=held, name=name + (" (masked)" if masks else ""), legendgroup=method.split("[", 1)[0],
                    hovertemplate=name + ", %{x}: %{y:.1f} % of the uncompressed bytes<extra></extra>")
        if masks:
            freed = [100 * by_c[c].bytes_freed / by_c[c].bytes_full if c in by_c and by_c[c].bytes_freed is not None
                     else None for c in ratios]
            fig.add_bar(x=x, y=freed, name=name + " (freed)", legendgroup=method.split("[", 1)[0],
                        marker={"pattern": {"shape": "/"}},
                        hovertemplate=name + " freed, %{x}: %{y:.1f} % of the uncompressed bytes<extra></extra>")
    fig.add_scatter(x=x, y=[100 * (1 - c) for c in ratios], mode="markers", name="1 − c (a perfect prune)",
                    marker={"symbol": "line-ew-open", "size": 40, "color": "black", "line": {"width": 2}},
                    hovertemplate="%{x}: 1 − c = %{y:.0f} %<extra></extra>")
    fig.update_layout(barmode="group", title=title or "Bytes the cache holds after each press",
                      xaxis_title="compression ratio c (the share of the cache a press drops)",
                      yaxis_title="% of the uncompressed cache", height=400,
                      legend={"orientation": "h", "y": -0.25}, margin={"l": 10, "r": 10, "t": 50, "b": 40})
    return finish(fig)


def token_strip(insp, layer: int | None = None, head: int | None = None, width: int = 16) -> go.Figure:
    """The prompt as a grid of tokens; colour = fraction of (layer, head) pairs that keep the token."""
    data = strip_data(insp, layer, head, width)
    fig = go.Figure(go.Heatmap(
        z=data["z"], text=data["text"], customdata=data["hover"], texttemplate="%{text}",
        hovertemplate="%{customdata}<extra></extra>", zmin=0, zmax=1, colorscale="Blues",
        colorbar={"title": "kept"}, xgap=2, ygap=2, textfont={"size": 10},
    ))
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(title=_title(insp, layer, head), height=60 + 26 * len(data["z"]),
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return finish(fig)


def token_strip_slider(inspections: list, layer: int | None = None, head: int | None = None, width: int = 16,
                       label: str = "c") -> go.Figure:
    """:func:`token_strip` for several inspections of the same text, one slider step each."""
    if not inspections:
        raise ValueError("inspections must be a non-empty list of EvictionInspection")
    if len({tuple(i.token_ids) for i in inspections}) != 1:
        raise ValueError("all inspections must be of the same text")
    fig = token_strip(inspections[0], layer, head, width)
    steps = []
    for insp in inspections:
        data = strip_data(insp, layer, head, width)
        value = insp.compression_ratio if label == "c" else insp.options.get(label)
        steps.append({
            "method": "update", "label": f"{value:g}" if isinstance(value, float) else str(value),
            "args": [{"z": [data["z"]], "customdata": [data["hover"]]}, {"title.text": _title(insp, layer, head)}],
        })
    fig.update_layout(sliders=[{"active": 0, "steps": steps, "currentvalue": {"prefix": f"{label} = "},
                                "pad": {"t": 10}}])
    fig.update_layout(height=fig.layout.height + 80)
    return finish(fig)


def kl_bars(rows: list[dict], title: str = "Next-token KL(full || compressed), lower is better") -> go.Figure:
    """Grouped bars: x = compression ratio, one bar (and legend entry) per method in the method's colour of
    the book, named for a reader (the default, the prompt press, kvpress's press names); rows have
    ``method, ratio, kl``. The KL axis is linear from 0, so a bar's length is its KL and
    the ratio of two bars is the ratio of their KLs (a log axis cut above 0 would make small differences look
    large)."""
    if not rows:
        raise ValueError("rows must be a non-empty list of {'method', 'ratio', 'kl'} dicts")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    ratios = sorted({r["ratio"] for r in rows})
    fig = go.Figure()
    for m in methods:
        by = {r["ratio"]: r["kl"] for r in rows if r["method"] == m}
        name = reader_name(m)
        fig.add_bar(name=name, legendgroup=m, x=[f"c = {c:g}" for c in ratios], y=[by.get(c) for c in ratios],
                    hovertemplate="%{x}: KL %{y:.4g} nats<extra>" + name + "</extra>")
    fig.update_yaxes(type="linear", rangemode="tozero", title="KL (nats)")
    fig.update_xaxes(title="compression ratio")
    # the legend under the plot in _LEGEND_COLUMNS columns (each entry a share of the width that leaves room for
    # its symbol), the figure and its bottom margin as much taller as the legend has rows: every method in sight
    # (a side legend of the registry's ~18 methods scrolls entries out of view)
    rows = _legend_rows(len(methods))
    fig.update_layout(barmode="group", title=title, height=400 + _LEGEND_ROW_PX * rows,
                      margin={"b": 90 + _LEGEND_ROW_PX * rows},
                      legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.2, "yanchor": "top",
                              "entrywidth": 0.75 / _LEGEND_COLUMNS, "entrywidthmode": "fraction", "font": {"size": 11}})
    return finish(fig)


#: a legend under a figure: its columns and the height of one row of entries (pixels)
_LEGEND_COLUMNS, _LEGEND_ROW_PX = 3, 28


def _legend_rows(n_entries: int) -> int:
    """The rows a legend of ``n_entries`` takes under a figure in ``_LEGEND_COLUMNS`` columns."""
    if n_entries < 1:
        raise ValueError(f"n_entries must be at least 1, got {n_entries}")
    return -(-n_entries // _LEGEND_COLUMNS)


def answers_note(replies: dict, name_kept: dict | None = None, *, facts: dict | None = None,
                 reference: str = "full cache", phrase: str = "the captain's name") -> str:
    """A paragraph (Markdown) on a chapter's answers: which compressed answers lose a fact that the uncompressed
    answer states (``facts``: name -> regular expression, ``DEMO_FACTS`` by default; see ``facts_stated``), and
    what such a wrong answer shows. ``replies``: label -> answer, the uncompressed one under ``reference``;
    ``name_kept``: compression ratio -> fraction of caches keeping every token of ``phrase`` (``phrase_kept``),
    or ``None``."""
    from ..measure.eviction import facts_stated

    if reference not in replies:
        raise ValueError(f"replies must hold the uncompressed answer under {reference!r}, got {sorted(replies)}")
    ref = facts_stated(replies[reference], facts)
    known = [f for f, ok in ref.items() if ok]
    if not known:
        return (f"The {reference} answer states none of what was asked, so the compressed answers cannot be judged "
                "against it; the next-token KL is the measure here.")
    missed = [f for f, ok in ref.items() if not ok]
    text = (f"The {reference} answer states {' and '.join(known)}"
            + (f" but not {' and '.join(missed)} (a 135M-parameter model, in a short answer)" if missed else "")
            + ". ")
    lost = {label: [f for f in known if not facts_stated(r, facts)[f]] for label, r in replies.items() if label != reference}
    wrong = [label for label, fs in lost.items() if fs]
    if not wrong:
        return text + "Every compressed answer still states it: at these budgets the cache kept what the answer needs."
    gone = [f for f in known if any(f in fs for fs in lost.values())]
    text += (f"The {' and the '.join(wrong)} {'answer loses' if len(wrong) == 1 else 'answers lose'} "
             f"{' and '.join(gone)}. What such a "
             "wrong answer shows: the model does not say that it no longer knows. It answers as fluently as before and "
             "fills the gap with something plausible, a near miss or an invention; eviction damage is silent in the "
             "output.")
    if name_kept:
        kept = ", ".join(f"{f:.0%} of the caches at c = {c:g}" for c, f in name_kept.items())
        text += (f" On the token strips above, every token of {phrase} survives in {kept} (the inspection reads the "
                 "text without the chat template the pipeline adds, so its kept sets are close to, not identical "
                 "with, the pipeline's).")
    return text + " One answer is a coarse check; the next-token KL measures the damage on every token."


def ragged_bench_frames(*benches: dict) -> tuple:
    """Two tables from committed ``ragged_cache`` benchmark files (:func:`jacap_lib.results.loaders.load_bench`).
    ``memory``, a row per prompt length: the uncompressed cache (MB), the bytes a ragged cache holds after each
    ratio c (% of the uncompressed bytes; the largest over the benchmark's presses), and the peak memory of the
    default's freeing prefill over an uncompressed prefill's. ``decode``, a row per (prompt length, cache): ms per
    generated token at each c on the uncompressed cache (the same cache at every c), the default's masked cache
    and its ragged cache."""
    import pandas as pd

    rows = sorted((r for b in benches for r in b["rows"]), key=lambda r: r["length"])
    if not rows:
        raise ValueError("benches must be ragged_cache benchmark records with rows (load_bench('ragged_cache_cpu'))")
    memory, decode = {}, {}
    for r in rows:
        ratios = sorted({c["compression_ratio"] for c in r["cells"]})
        m = {"uncompressed (MB)": f"{r['uncompressed_bytes'] / 1e6:.1f}"}
        for c in ratios:
            held = max(x["ragged_over_uncompressed"] for x in r["cells"] if x["compression_ratio"] == c)
            m[f"c = {c:g}"] = f"{held:.1%}"
        peak = r.get("peak_ragged_prefill_bytes_c0.5", {}).get("jacap_default")
        if peak and r.get("peak_uncompressed_bytes"):
            m["prefill peak"] = f"{peak / r['peak_uncompressed_bytes']:.1f}x"
        memory[r["length"]] = m
        if "decode_uncompressed_s" in r:
            decode[(r["length"], "uncompressed")] = {f"c = {c:g}": f"{1e3 * r['decode_uncompressed_s']:.0f}" for c in ratios}
            for kind in ("masked", "ragged"):
                decode[(r["length"], kind)] = {f"c = {x['compression_ratio']:g}": f"{1e3 * x[f'decode_{kind}_s']:.0f}"
                                               for x in r["cells"] if f"decode_{kind}_s" in x}
    mem = pd.DataFrame.from_dict(memory, orient="index").rename_axis("prompt tokens")
    dec = pd.DataFrame.from_dict(decode, orient="index")
    if len(dec):
        dec.index = pd.MultiIndex.from_tuples(dec.index, names=["prompt tokens", "cache"])
    return mem, dec
