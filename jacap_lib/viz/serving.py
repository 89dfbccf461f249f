"""Figures of the serving chapter (Algorithm 2 during decoding). One function per figure; each
takes plain data (the controller's ``trace``/``events`` or ``data/serving/serving_run.json``) and
returns a ``plotly.graph_objects.Figure``. Sliders are precomputed so they move in the static site.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from .style import REFERENCE_COLOUR, SETTING_DASHES, finish, method_style, setting_colours

__all__ = ["DECODING_SHORT", "decoding_summary_table", "decoding_findings_text", "decoding_verdict_table", "decoding_verdict_sentences", "cache_timeline", "age_histograms", "beta_tracking", "beta_tradeoff", "kl_timeline",
           "decoding_comparison"]


def _ev(e):
    return e if isinstance(e, dict) else e.to_dict()


def cache_timeline(trace, events, *, high: int, budget: int, title: str = "KV cache size during decoding") -> go.Figure:
    """Cache slots per layer/head after every step (Algorithm 2's colour) against the high watermark and the
    budget (black reference lines, named with their values in the legend so no label sits on the data), with the
    true sequence length for comparison and a marker at every eviction (in the colour of the method that chose
    the kept tokens)."""
    steps = [t[0] for t in trace]
    fig = go.Figure()
    fig.add_scatter(x=steps, y=[t[1] for t in trace], name="tokens seen (true length)", line=dict(color="#bbb", dash="dot"))
    fig.add_scatter(x=steps, y=[t[2] for t in trace], name="cache slots", legendgroup="alg2", mode="lines")
    evs = [_ev(e) for e in events]
    if evs:
        fig.add_scatter(x=[e["step"] for e in evs], y=[e["tokens_before"] for e in evs], mode="markers",
                        name="eviction", marker=dict(color=[method_style(e["method"])["color"] for e in evs],
                                                     size=9, symbol="x"),
                        customdata=[[e["tokens_before"], e["tokens_after"], e["method"], 1e3 * e["seconds"]] for e in evs],
                        hovertemplate="step %{x}<br>%{customdata[0]} → %{customdata[1]} slots<br>%{customdata[2]}, "
                                      "%{customdata[3]:.0f} ms<extra></extra>")
    x_end = max(steps) if steps else 1
    for value, name, dash in ((high, "high watermark", "dash"), (budget, "budget", "dashdot")):
        fig.add_scatter(x=[0, x_end], y=[value, value], mode="lines", name=f"{name} ({value})",
                        line=dict(color=REFERENCE_COLOUR, dash=dash, width=1.5), hoverinfo="name")
    fig.update_layout(title=title, xaxis_title="decode step (0 = prompt)", yaxis_title="tokens", height=380,
                      legend=dict(orientation="h", y=-0.25))
    return finish(fig)


def age_histograms(events, *, title: str = "Age of the kept tokens at each eviction") -> go.Figure:
    """Token-age histogram (pooled over layers, KV heads, rows) of every eviction, one slider step
    per eviction. Age = position of the newest token minus the token's original position."""
    evs = [_ev(e) for e in events]
    if not evs:
        raise ValueError("`events` is empty: no eviction happened, so there is no age histogram to show")
    fig = go.Figure()
    for i, e in enumerate(evs):
        edges = e["age_edges"]
        centers = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        total = max(sum(e["age_counts"]), 1)
        fig.add_bar(x=centers, y=[c / total for c in e["age_counts"]], width=edges[1] - edges[0], visible=i == 0,
                    name=f"eviction {i + 1}", marker_color=method_style(e["method"])["color"])
    steps = []
    for i, e in enumerate(evs):
        vis = [j == i for j in range(len(evs))]
        label = (f"eviction {i + 1} at step {e['step']} ({e['method']}): {e['tokens_before']} → {e['tokens_after']} slots, "
                 f"mean age {e['mean_age_kept']:.1f}")
        steps.append(dict(method="update", label=str(i + 1), args=[{"visible": vis}, {"title.text": f"{title}<br><sub>{label}</sub>"}]))
    first = evs[0]
    fig.update_layout(
        title=f"{title}<br><sub>eviction 1 at step {first['step']} ({first['method']}): {first['tokens_before']} → "
              f"{first['tokens_after']} slots, mean age {first['mean_age_kept']:.1f}</sub>",
        xaxis_title="token age (positions behind the newest token)", yaxis_title="share of kept slots",
        sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix="eviction "), pad=dict(t=40))], height=420,
        bargap=0.05)
    return finish(fig)


def beta_tracking(q, ema_mu: dict, *, coord_label: str = "query coordinate",
                  title: str = "What β does to the EMA mean of the queries") -> go.Figure:
    """One coordinate of a query stream (grey) and its EMA mean for each β (one slider step per β):
    large β is smooth but lags behind changes, small β follows them and their noise."""
    betas = sorted(ema_mu, key=float)
    steps_x = list(range(len(q)))
    fig = go.Figure()
    fig.add_scatter(x=steps_x, y=list(q), name="query q_t", mode="lines", line=dict(color="#ccc", width=1))
    for i, b in enumerate(betas):
        fig.add_scatter(x=steps_x, y=list(ema_mu[b]), name=f"EMA μ_t, β = {b}", visible=i == len(betas) // 2,
                        line=dict(color="#1f77b4", width=2.5))
    sl = []
    for i, b in enumerate(betas):
        vis = [True] + [j == i for j in range(len(betas))]
        sl.append(dict(method="update", label=str(b), args=[{"visible": vis}]))
    fig.update_layout(title=title, xaxis_title="token index (prompt, then generated)", yaxis_title=coord_label,
                      sliders=[dict(active=len(betas) // 2, steps=sl, currentvalue=dict(prefix="β = "), pad=dict(t=40))],
                      height=420, legend=dict(orientation="h", y=-0.45))
    return finish(fig)


def beta_tradeoff(tradeoff, runs: dict | None = None, *, title: str = "β: noise against lag") -> go.Figure:
    """Left: EMA jitter (noise) and tracking error against the next queries (lag), relative to the
    query norm, for each β. Right (when ``runs`` given): mean next-token KL of each controller run
    against the uncompressed model, with the sliding-window run as a reference line."""
    cols = 2 if runs else 1
    fig = make_subplots(rows=1, cols=cols, subplot_titles=["EMA on the raw queries", "eviction quality"][:cols])
    betas = [t["beta"] for t in tradeoff]
    fig.add_scatter(x=betas, y=[t["jitter"] for t in tradeoff], name="jitter ‖μ_t − μ_{t−1}‖ (noise)",
                    mode="lines+markers", line=dict(color="#969696", dash="dot"), row=1, col=1)
    fig.add_scatter(x=betas, y=[t["lag_error"] for t in tradeoff], name="error vs next queries (lag)",
                    mode="lines+markers", line=dict(color="#252525"), row=1, col=1)
    fig.update_xaxes(title_text="β", row=1, col=1)
    fig.update_yaxes(title_text="relative to mean ‖q‖", type="log", row=1, col=1)
    if runs:
        jac = sorted((r for r in runs.values() if r["method"] == "jacap"), key=lambda r: r["beta"])
        fig.add_scatter(x=[r["beta"] for r in jac], y=[r["mean_kl"] for r in jac], name="Jacap controller, mean KL",
                        legendgroup="alg2", mode="lines+markers", row=1, col=2)
        win = [r for r in runs.values() if r["method"] == "window"]
        if win:
            fig.add_scatter(x=[min(r["beta"] for r in jac), max(r["beta"] for r in jac)], y=[win[0]["mean_kl"]] * 2,
                            name="sliding window, mean KL", legendgroup="window", mode="lines", line=dict(dash="dash"),
                            row=1, col=2)
        fig.update_xaxes(title_text="β", row=1, col=2)
        fig.update_yaxes(title_text="mean next-token KL (nats)", row=1, col=2)
    fig.update_layout(title=title, height=400, legend=dict(orientation="h", y=-0.3))
    return finish(fig)


def kl_timeline(runs: dict, *, title: str = "Next-token KL against the uncompressed model, per step") -> go.Figure:
    """KL(full ‖ evicted) of every replayed step for each run (β values in shades of one warm scale, light to dark, each
    with a dash of its own, and the sliding window dashed grey). A step's KL comes from its forward pass, which runs before that step's eviction, so
    up to and including a run's first eviction step the cache is the full one and the KL only float rounding
    (1e−8 and below): those steps are left out (shaded, "no eviction yet") and the log axis starts where the
    signal does."""
    fig = go.Figure()
    betas = sorted(float(r["beta"]) for r in runs.values() if r["method"] != "window")
    shades = setting_colours([f"{b:g}" for b in betas], ordered=True)
    dashes = {f"{b:g}": SETTING_DASHES[i % len(SETTING_DASHES)] for i, b in enumerate(betas)}
    first_any = None
    for name, r in runs.items():
        window = r["method"] == "window"
        label = "sliding window" if window else f"Jacap β = {r['beta']}"
        steps = [_ev(e)["step"] for e in r.get("events") or ()]
        first = min(steps) if steps else len(r["kl"])
        first_any = first if first_any is None else min(first_any, first)
        kl = [None if i <= first else v for i, v in enumerate(r["kl"])]
        fig.add_scatter(x=list(range(len(kl))), y=kl, name=label, mode="lines", legendgroup="window" if window else label,
                        line=dict(dash="dash", color=REFERENCE_COLOUR) if window else dict(color=shades[f"{float(r['beta']):g}"], dash=dashes[f"{float(r['beta']):g}"]))
    if first_any:
        fig.add_vrect(x0=0, x1=first_any, fillcolor="#969696", opacity=0.12, line_width=0,
                      annotation_text="no eviction yet", annotation_position="top")
    fig.update_layout(title=title, xaxis_title="decode step", yaxis_title="KL (nats)", yaxis_type="log", height=400,
                      legend=dict(orientation="h", y=-0.3))
    return finish(fig)


DECODING_LABELS = {"alg2": "Algorithm 2 (EMA)", "alg2_flat": "Algorithm 2 (flat statistics)",
                   "jacap_prompt": "DecodingPress(Jacap)", "tova": "DecodingPress(TOVA)",
                   "knorm": "DecodingPress(KNorm)", "expected_attention": "DecodingPress(Expected Attention)",
                   "streaming_llm": "DecodingPress(StreamingLLM)"}


def decoding_comparison(summary: dict, *, title: str = "Compression during decoding, one cache budget") -> go.Figure:
    """Three panels from :func:`jacap_lib.experiments.decoding_comparison.decoding_summary`: the next-token KL along
    the generation (mean over generations, per step range), the per-generation KL after the first compression
    (one dot per generation; the bar is the geometric mean with its bootstrap interval), and where the kept tokens
    sit (fraction of the final cache per age bin; the bins past the oldest kept token of every method, empty for
    all, are left out)."""
    if not summary:
        raise ValueError("`summary` is empty: load data/serving/decoding_comparison.json and summarise it first")
    fig = make_subplots(rows=1, cols=3, column_widths=[0.40, 0.22, 0.38], horizontal_spacing=0.12,
                        subplot_titles=("KL along the generation", "KL per generation", "age of the kept tokens"))
    # age bins past the oldest kept token of every method are empty for all of them: left out
    n_age = max((j + 1 for s in summary.values() for j, f in enumerate(s["age_fraction"]) if f > 0), default=0)
    for i, (name, s) in enumerate(summary.items()):
        color, label = method_style(name)["color"], DECODING_LABELS.get(name, name)
        edges = s["bin_edges"]
        mids = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        fig.add_scatter(x=mids, y=s["kl_binned"], name=label, legendgroup=name, line=dict(color=color), row=1, col=1)
        short = label[len("DecodingPress("):-1] if label.startswith("DecodingPress(") else label  # a tick label
        fig.add_scatter(x=[short] * len(s["per_generation_kl"]), y=s["per_generation_kl"], mode="markers",
                        legendgroup=name, showlegend=False, marker=dict(color=color, size=6, opacity=0.5), row=1, col=2)
        err = None
        if s["gm_low"] == s["gm_low"]:  # an interval (not NaN)
            err = dict(type="data", symmetric=False, array=[s["gm_high"] - s["gm_kl"]],
                       arrayminus=[s["gm_kl"] - s["gm_low"]], color=color, thickness=2)
        fig.add_scatter(x=[short], y=[s["gm_kl"]], mode="markers", legendgroup=name, showlegend=False, error_y=err,
                        marker=dict(color=color, size=16, symbol="line-ew-open", line=dict(width=3)), row=1, col=2)
        a = s["age_edges"]
        bins = [f"{lo}-{hi - 1}" if j < len(a) - 2 else f">={lo}" for j, (lo, hi) in enumerate(zip(a[:-1], a[1:]))]
        fig.add_bar(x=bins[:n_age], y=s["age_fraction"][:n_age], name=label, legendgroup=name, showlegend=False,
                    marker_color=color, row=1, col=3)
    fig.update_yaxes(type="log", title_text="KL (nats)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="KL (nats)", row=1, col=2)
    fig.update_xaxes(title_text="generated token", row=1, col=1)
    # one column per method (colours as in the legend): dots = generations, bar = geometric mean and 95 % interval
    fig.update_xaxes(tickangle=-40, title_text="a dot per generation,<br>bar: geometric mean", row=1, col=2)
    fig.update_xaxes(title_text="age (tokens)", row=1, col=3)
    fig.update_yaxes(title_text="fraction of the cache", row=1, col=3)
    # the legend above the panels: below them it would meet the rotated age-bin labels and their axis title
    fig.update_layout(title=dict(text=title, y=0.98, yanchor="top"), barmode="group", height=520, margin=dict(t=175),
                      legend=dict(orientation="h", x=0, y=1.14, yanchor="bottom"))
    return finish(fig)


def decoding_findings_text(findings: dict) -> str:
    """:func:`jacap_lib.experiments.decoding_comparison.decoding_findings` as the serving chapter prints it
    (method names as :data:`DECODING_LABELS`)."""
    L = lambda m: DECODING_LABELS.get(m, m)  # noqa: E731
    lines = ["ranking by geometric-mean KL after the first compression: " + " < ".join(L(m) for m in findings["ranking"])]
    lines.append("mean age of the kept tokens: " + ", ".join(f"{L(m)} {a:.0f}" for m, a in findings["by_age"].items()))
    lines.append(f"fraction of the final cache older than {findings['old_after']} tokens (the sinks and the prompt): "
                 + str({L(m): round(v, 3) for m, v in findings["old_fraction"].items()}))
    lines.append("scoring share of the run time: " + str({L(m): f"{v:.1%}" for m, v in findings["scoring_share"].items()}))
    return "\n".join(lines)


#: short method names for narrow table rows (the key is printed under the tables: DP = kvpress's DecodingPress)
DECODING_SHORT = {"alg2": "Alg. 2", "alg2_flat": "Alg. 2 flat", "jacap_prompt": "DP(Jacap)", "tova": "DP(TOVA)",
                  "knorm": "DP(KNorm)", "expected_attention": "DP(Exp. Att.)", "streaming_llm": "DP(StreamingLLM)"}


def decoding_summary_table(summary: dict):
    """:func:`jacap_lib.experiments.decoding_comparison.decoding_summary` as a table (pandas ``DataFrame``), one row
    per method (:data:`DECODING_SHORT` names): the geometric-mean KL after the first compression with its
    interval (digits from the interval: :func:`jacap_lib.verdicts.precision.interval_text`), top-1 agreement, peak
    cache, scoring share of the run time, mean age of the kept tokens, milliseconds per step (short headers:
    ``top-1``, ``scoring``, ``mean age``)."""
    import pandas as pd

    from jacap_lib.verdicts.precision import interval_text

    return pd.DataFrame([{
        "method": DECODING_SHORT.get(m, m), "KL [95 % CI]": interval_text(s["gm_kl"], s["gm_low"], s["gm_high"]),
        "top-1": f"{s['top1_agree']:.3f}", "peak cache": f"{s['peak_cache']:.0f}",
        "scoring": f"{s['scoring_share']:.1%}", "mean age": f"{s['mean_age']:.0f}",
        "ms / step": f"{1000 * s['seconds_per_step']:.0f}"} for m, s in summary.items()]).set_index("method")


def decoding_verdict_table(verdicts: list, *, details: bool = False):
    """:func:`jacap_lib.experiments.decoding_comparison.decoding_verdicts` as a table (pandas ``DataFrame``), one row
    per comparison (:data:`DECODING_SHORT` names): the geometric-mean KL ratio (first / second method; below 1 =
    the first is better) with the BCa interval its verdict comes from (adjusted for the comparisons judged
    together when the rows have it) and the verdict in short words. ``details=True``: the units won, the
    Holm-adjusted p, the unadjusted 95 % interval, what the comparison isolates."""
    import pandas as pd

    from jacap_lib.verdicts.precision import interval_text
    from .evaluation import short_verdict, verdict_interval

    S = lambda m: DECODING_SHORT.get(m, m)  # noqa: E731
    rows = []
    for v in verdicts:
        row = {"comparison": f"{S(v['method'])} vs {S(v['reference'])}"}
        if details:
            row.update({"won": f"{v['wins']}/{v['n']} {v['unit']}s", "Holm p": f"{v['p_holm']:.2g}"})
            if v.get("gm_low_adjusted") is not None:
                row["95 % CI"] = interval_text(v["gm_ratio"], v["gm_low"], v["gm_high"])
            row["isolates"] = v["isolates"].split(":")[0]
        else:
            lo, hi, adj = verdict_interval(v)
            row.update({f"KL ratio [{'adjusted' if adj else '95 %'} CI]": interval_text(v["gm_ratio"], lo, hi),
                        "verdict": short_verdict(v["verdict"])})
        rows.append(row)
    return pd.DataFrame(rows).set_index("comparison")


def decoding_verdict_sentences(verdicts: list) -> str:
    """One sentence per comparison of :func:`~jacap_lib.experiments.decoding_comparison.decoding_verdicts`, every number
    read from its row, each naming what the comparison isolates (the only cause a sentence may claim)."""
    from jacap_lib.verdicts.precision import interval_text
    from .evaluation import verdict_interval

    L = lambda m: DECODING_LABELS.get(m, m)  # noqa: E731
    out = []
    for v in verdicts:
        label = "adjusted" if verdict_interval(v)[2] else "95 %"
        holm = "survives" if v["holm_significant"] else "does not survive"
        out.append(f"{L(v['method'])} against {L(v['reference'])} [isolates {v['isolates']}]: {v['verdict']} "
                   f"(KL ratio with its {label} interval {interval_text(v['gm_ratio'], *verdict_interval(v)[:2])}; lower on "
                   f"{v['wins']} of {v['n']} {v['unit']}s; the difference {holm} Holm's correction over the "
                   f"{len(verdicts)} comparisons, adjusted p = {v['p_holm']:.3g}).")
    return "\n".join(out)
