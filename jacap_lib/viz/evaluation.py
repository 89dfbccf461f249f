"""Tables and figures of the evaluation (``data/results/eval``: the tune choices, the dev rows, the summary).

Inputs come from :mod:`jacap_lib.results.loaders` (``load_eval_choices``, ``load_eval_rows``,
``load_eval_summary``, ``load_needle_summary``) and :func:`jacap_lib.experiments.protocol.cell_statistics`; tables are
:class:`pandas.DataFrame` objects, figures ``go.Figure`` finished by :func:`~jacap_lib.viz.style.finish`.
"""
from __future__ import annotations

import math
import re

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from jacap_lib.experiments import protection
from jacap_lib.verdicts import rows as rowstats
from jacap_lib.experiments.names import spec_name
from jacap_lib.verdicts.precision import interval_text
from .style import METHOD_STYLES, finish, wrapped

__all__ = ["split_frame", "corpus_frame", "choices_frame", "verdict_frame", "pair_frame", "target_frame", "kl_figure",
           "cells_frame", "needle_frame", "needle_verdict_frame", "short_verdict", "setting_names", "plan_frame", "verdict_interval",
           "kl_and_needle_frame", "tuned_line", "record_frame", "pair_verdict_frame",
           "document_ratio_figure", "verdict_counts_frame", "confirm_forest"]


def _interval(est, lo, hi) -> str:
    """An estimate and its interval as table text at the precision the interval supports
    (:func:`jacap_lib.verdicts.precision.interval_text`): ``1.19 [1.04, 1.40]``."""
    return interval_text(est, lo, hi)


def short_verdict(sentence: str) -> str:
    """A :func:`~jacap_lib.verdicts.intervals.verdict` sentence in a few words for a narrow table column:
    "better by 7–17 %" -> "better 7–17 %", "no detectable difference; the interval is −11 % to +4 %" ->
    "no det. diff. (−11 to +4 %)", "no difference: identical on every document" -> "identical on every document";
    "points" -> "pts". Anything else comes back unchanged."""
    s = str(sentence)
    if s == "no detectable difference":  # a test's verdict (no interval range to give)
        return "no det. diff."
    if s.startswith("no difference: "):
        return s[len("no difference: "):]
    m = re.fullmatch(r"no detectable difference; the interval is (.*)", s)
    if m:
        rng = m.group(1).replace(" points", " pts")
        rng = re.sub(r"^(−?\d[\d.]*) % to ", r"\1 to ", rng)  # one unit at the end: "−11 to +4 %"
        return f"no det. diff. ({rng})"
    m = re.fullmatch(r"(better|worse) by (.*)", s)
    if m:
        return f"{m.group(1)} {m.group(2).replace(' points', ' pts')}"
    return s


def _short(spec) -> str:
    """A method spec's method name (``snapkv[window_size=16]`` -> ``snapkv``; under kvpress's head-adaptive
    allocation ``snapkv+AdaKV``): the full spec is in the table's details."""
    if not spec:
        return ""
    name = str(spec).split("[", 1)[0]
    return name + "+AdaKV" if "adakv=true" in str(spec).lower() else name


def _shorter(spec: str) -> str:
    """A spec as a reader sees it (:func:`~jacap_lib.experiments.names.short_spec`; the written-out one is in the
    results file)."""
    from jacap_lib.experiments.names import short_spec

    return short_spec(spec) if spec else spec


def _cell(length, ratio) -> str:
    return f"{length} / {float(ratio):g}"


def verdict_interval(r: dict, stat: str = "gm") -> tuple[float, float, bool]:
    """The interval a row's verdict comes from: ``(low, high, adjusted)`` — the multiplicity-adjusted one
    (``gm_low_adjusted``/``gm_high_adjusted``) when the row has it, else its 95 % one (``gm_low``/``gm_high``)."""
    if r.get(f"{stat}_low_adjusted") is not None:
        return r[f"{stat}_low_adjusted"], r[f"{stat}_high_adjusted"], True
    return r[f"{stat}_low"], r[f"{stat}_high"], False


def _unadjusted(r: dict, stat: str = "gm") -> tuple | None:
    """The unadjusted (per-cell 95 %) interval and its verdict a row keeps beside an adjusted one:
    ``(low, high, verdict or None)``; ``None`` for rows without an adjusted interval (their interval is the
    95 % one)."""
    if r.get(f"{stat}_low_adjusted") is None:
        return None
    return r[f"{stat}_low"], r[f"{stat}_high"], r.get("verdict_unadjusted")


def _identical(r: dict) -> bool:
    """Whether a ratio row compares two settings that gave the same KL on every document: its verdict says so,
    or its interval is the point 1 (the ratio of every document 1 to rounding; the ``ptp <= 1e-12`` rule of
    :func:`~jacap_lib.verdicts.intervals.geometric_mean_ratio`)."""
    if str(r.get("verdict", "")).startswith("no difference: identical"):
        return True
    return "gm_low" in r and r["gm_low"] == r["gm_high"] and abs(r["gm_ratio"] - 1) <= 1e-9


def _won_lost(r: dict) -> str:
    if _identical(r):
        return "all tied"
    ties = r.get("ties", 0)
    return f"{r['wins']}/{r['losses']}" + (f" ({ties} tied)" if ties else "")


def _ratio_columns(r: dict, *, headline: str = "KL ratio") -> dict:
    """The headline columns of a ratio row: the geometric-mean ratio with its interval (the adjusted one when
    the row carries an unadjusted one beside it) and the short verdict."""
    lo, hi, adj = verdict_interval(r)
    return {f"{headline} [{'adjusted' if adj else '95 %'} CI]": _interval(r["gm_ratio"], lo, hi),
            "verdict": "identical on every document" if _identical(r) else short_verdict(r["verdict"])}


#: the details' p-values: Wilcoxon's signed-rank p, Holm's adjustment over the table's cells in brackets (one column,
#: so that a table with three-decimal intervals still fits the text column)
P_COLUMN = "Wilcoxon p (Holm)"


def _ratio_details(r: dict) -> dict:
    """The supporting columns of a ratio row: the cell's own (unadjusted) 95 % interval of the geometric-mean
    ratio when the headline one is adjusted, the mean-KL ratio, won/lost documents, Wilcoxon p with Holm's in
    brackets (:data:`P_COLUMN`). (The
    verdict the unadjusted interval alone would give is ``verdict_unadjusted`` in the summary file: it reads
    off the interval, and a column for it would not fit the text column.)"""
    out = {}
    un = _unadjusted(r)
    if un is not None:
        out["KL ratio [95 % CI]"] = _interval(r["gm_ratio"], un[0], un[1])
    out.update({"mean-KL [95 % CI]": _interval(r["mean_ratio"], r["mean_low"], r["mean_high"]),
                "won/lost": _won_lost(r), P_COLUMN: f"{r['p_wilcoxon']:.2g} ({r['p_holm']:.2g})"})
    return out


def split_frame(split: dict) -> pd.DataFrame:
    """``{"prompt / c": JacapPromptPress.budget_split(prompt)}`` as a table: kept slots, sinks, window, and how many
    the score chose (and that share of the budget)."""
    rows = [{"prompt / c": k, "kept": v["kept"], "sinks": v["sinks"], "window": v["window"], "chosen by the score":
             v["scored"], "share chosen by the score": f"{v['scored'] / v['kept']:.0%}"} for k, v in split.items()]
    return pd.DataFrame(rows).set_index("prompt / c")


def corpus_frame(documents: list[dict], *, details: bool = False) -> pd.DataFrame:
    """Documents per kind and split (``documents``: a run's ``documents`` records: id, kind, split, source,
    licence) and the number of sources they come from. ``details=True``: one row per (kind, source package)
    with its documents and licences."""
    rows: dict = {}
    for d in documents:
        src = (d.get("source") or {}).get("package") or "?"
        key = (d.get("kind") or "?", src) if details else d.get("kind") or "?"
        row = rows.setdefault(key, {"tune": 0, "dev": 0, "sources": set(), "licences": set()})
        row[d["split"]] += 1
        row["sources"].add(src)
        if d.get("license"):
            row["licences"].add(str(d["license"]))
    if details:
        frame = pd.DataFrame([{"kind": k, "source": s, "tune": v["tune"], "dev": v["dev"],
                               "licence": "; ".join(sorted(v["licences"]))} for (k, s), v in rows.items()])
        return wrapped(frame.set_index(["kind", "source"]), ["licence"])
    return pd.DataFrame([{"kind": k, "tune": v["tune"], "dev": v["dev"], "sources": len(v["sources"])}
                         for k, v in rows.items()]).set_index("kind")


def _filled(specs, length, ratio) -> list[str]:
    """The settings of ``specs`` whose protection fills the budget of the cell
    (:func:`~jacap_lib.experiments.protection.protection_fills_budget`), in order."""
    return [s for s in specs if s and protection.protection_fills_budget(s, int(length), float(ratio))]


def _protection_note(specs, length, ratio) -> str:
    """:data:`~jacap_lib.experiments.protection.LABEL` where the protection of every Jacap setting of ``specs`` fills the
    budget of the cell ("… of <name>" where it fills only one's), else ``""``."""
    jac = [s for s in specs if s and s.split("[", 1)[0].startswith("jacap")]
    filled = _filled(jac, length, ratio)
    if not filled:
        return ""
    if len(filled) == len(jac):
        return protection.LABEL
    return f"{protection.LABEL} of {spec_name(filled[0], legend=True)}"


def pair_frame(rows: list[dict], *, details: bool = False) -> pd.DataFrame:
    """:func:`~jacap_lib.experiments.protocol.compare_settings` rows as a table, one row per "prompt / c": the
    geometric-mean KL ratio with its interval and the verdict; ``details=True``: the supporting columns
    (mean-KL ratio, documents won/lost, Wilcoxon and Holm p). A "note" column says where protection fills the
    budget (:func:`_protection_note`), when the rows name their settings and some cell is such."""
    out = [{"prompt / c": _cell(r["length"], r["ratio"]), **(_ratio_details(r) if details else _ratio_columns(r)),
            "note": _protection_note((r.get("setting"), r.get("reference")), r["length"], r["ratio"])}
           for r in rows]
    frame = pd.DataFrame(out).set_index("prompt / c")
    if not frame["note"].any():
        frame = frame.drop(columns="note")
    return wrapped(frame, ([] if details else ["verdict"]) + (["note"] if "note" in frame else []))


def target_frame(status: list[dict]) -> pd.DataFrame:
    """:func:`~jacap_lib.experiments.protocol.target_status` rows as a table, one row per "prompt / c" (grouped by
    c): what the target asks, the best baseline (picked on tune), the geometric-mean ratio with the interval it
    is judged on (the multiplicity-adjusted one when the rows have it), whether the target is met, by how far
    that interval misses (in % of the baseline's KL), and a note where the setting's protection fills the budget."""
    adjusted = any(r.get("gm_low_adjusted") is not None for r in status)
    label = f"KL ratio [{'adjusted' if adjusted else '95 %'} CI]"
    rows = []
    for r in sorted(status, key=lambda r: (r["ratio"], r["length"])):
        rows.append({"prompt / c": _cell(r["length"], r["ratio"]), "target": r["requirement"],
                     "baseline": _short(r["baseline"]),
                     label: "" if r["gm_ratio"] is None else _interval(r["gm_ratio"], *verdict_interval(r)[:2]),
                     "met": {True: "yes", False: "no", None: "not measured"}[r["met"]],
                     "missed by": "" if not r["shortfall"] else f"{100 * r['shortfall']:.1f} %",
                     "note": _protection_note((r.get("setting"),), r["length"], r["ratio"])})
    frame = pd.DataFrame(rows).set_index("prompt / c")
    if not frame["note"].any():
        frame = frame.drop(columns="note")
    return wrapped(frame, ["baseline"] + (["note"] if "note" in frame else []))


def _spec_options(spec: str, method: str) -> str:
    """The options that set a spec apart from its method's press at today's defaults (``snapkv[window_size=16]`` ->
    ``window_size=16``; a written-out Jacap setting by what it changes, :func:`~jacap_lib.experiments.names.short_spec`),
    ``(default)`` without."""
    from jacap_lib.experiments.names import short_spec

    spec = short_spec(spec) if spec.startswith(method) else spec
    return spec[len(method) + 1:-1] if spec.startswith(method + "[") else ("(default)" if spec == method else spec)


def choices_frame(choices: dict) -> pd.DataFrame:
    """One row per (method, candidate setting): the rule's score as a geometric-mean KL over every tune
    (document, length, ratio) — ``exp(score)`` nats, three significant digits — the chosen one marked."""
    rows = []
    for method, ch in choices["choices"].items():
        for cand in ch["candidates"]:
            rows.append({"method": method, "options": _spec_options(cand["spec"], method),
                         "tune KL (nats)": f"{math.exp(cand['score']):.3g}",
                         "chosen": "yes" if cand["spec"] == ch["chosen"] else ""})
    return wrapped(pd.DataFrame(rows).set_index(["method", "options"]), ["method", "options"])


_ROLE = {"algorithm 1": "Algorithm 1 tuned", "paper preset": "as published"}


def role_label(role: str) -> str:
    """A summary family's role in a narrow table column: ``"Algorithm 1 tuned"``, ``"as published"`` (Algorithm 1's
    paper preset), ``"default"`` for the tune choice ``JacapPromptPress()`` builds (``"tuned jacap_obs"``), and any other
    tuned Jacap method by its registry name (``"tuned jacap_ea"`` -> ``"jacap_ea"``)."""
    if role == "tuned jacap_obs":
        return "default"
    return _ROLE.get(role, role[len("tuned "):] if role.startswith("tuned ") else role)


def verdict_frame(summary: dict, *, picked_on: str = "tune", role: str | None = None,
                  details: bool = False) -> pd.DataFrame:
    """One row per (Jacap setting, "prompt / c") of the summary's families picked on ``picked_on`` ("tune": the
    protocol's line; "dev": the stricter one): the best baseline (its method; the setting is in the details),
    the geometric-mean KL ratio with its interval (the multiplicity-adjusted one when the summary has it) and
    the verdict in short words, and a note on the cells where the setting's sinks and window fill the whole budget
    (:func:`~jacap_lib.experiments.protection.protection_fills_budget`: its score chose no token). ``details=True``: the baseline's setting, the mean-KL ratio, documents won/lost,
    Wilcoxon and Holm p (and the cell's own 95 % interval when the headline one is adjusted).
    ``role``: only that Jacap setting's family ("algorithm 1", "paper preset", ...)."""
    rows = []
    for fam in summary["families"]:
        if fam["picked_on"] != picked_on or (role is not None and fam["role"] != role):
            continue
        for r in fam["rows"]:
            head = {"Jacap": role_label(fam["role"]), "prompt / c": _cell(r["length"], r["ratio"])}
            if details:
                rows.append({**head, "baseline setting": _shorter(r["baseline_spec"]), **_ratio_details(r)})
            else:
                rows.append({**head, "baseline": _short(r["baseline_spec"]), **_ratio_columns(r),
                             "note": protection.LABEL if protection.protection_fills_budget(
                                 fam["setting"], int(r["length"]), float(r["ratio"])) else ""})
    if not rows:
        raise ValueError(f"summary has no family picked on {picked_on!r}" + (f" with role {role!r}" if role else ""))
    frame = pd.DataFrame(rows).set_index(["Jacap", "prompt / c"])
    return wrapped(frame, ["Jacap", "baseline setting"] if details else ["Jacap", "baseline", "verdict"])


def plan_frame(plan: dict) -> pd.DataFrame:
    """The confirmatory plan's comparisons, one row per purpose (``what``): the two settings by their book names
    (the reference "best tuned baseline" where it changes from cell to cell), the cells it judges, the cells it leaves
    out because protection fills the budget, and the KL ratio each judged comparison detects with 80 % power at the
    plan's adjustment (the range over its cells; :func:`jacap_lib.verdicts.intervals.detectable_ratio`)."""
    names = setting_names([s for c in plan["comparisons"] for s in (c["a"], c["b"])])
    power = {(p["a"], p["b"], p["cell"]): p["detectable_ratio_80"] for p in plan["power"]["per_comparison"]}
    rows: dict = {}
    for c in plan["comparisons"]:
        for what in c["what"].split("; "):
            key = (c["a"], what)
            row = rows.setdefault(key, {"setting": names[c["a"]], "against": set(), "judged": 0, "left out": [],
                                        "detectable": []})
            row["against"].add(names[c["b"]])
            if c["judged"]:
                row["judged"] += 1
                row["detectable"].append(power[c["a"], c["b"], c["cell"]])
            else:
                row["left out"].append(c["cell"])
    out = []
    for (_, what), r in rows.items():
        ref = next(iter(r["against"])) if len(r["against"]) == 1 else "the cell's best tuned baseline"
        det = r["detectable"]
        out.append({"setting": r["setting"], "against": ref, "cells judged": r["judged"],
                    "left out (protection fills the budget)": ", ".join(r["left out"]) or "none",
                    "detectable ratio (80 % power)": f"{min(det):.2f}–{max(det):.2f}" if det else "—"})
    return wrapped(pd.DataFrame(out).set_index("setting"), ["left out (protection fills the budget)"])


def setting_names(specs) -> dict[str, str]:
    """``{spec: name}``: the names a figure's legend and a table's rows give the settings ``specs`` shown together,
    the one rule for both. A setting by the book's name where it has one
    (:func:`~jacap_lib.experiments.names.spec_name`, plain text: "Algorithm 1 tuned", "default JacapPromptPress()",
    "SnapKV"), else by its method's registry name when it is that method's only setting here (the tuned options are
    in the choices table), else by its short spec; two settings the book names alike (kvpress's SnapKV as shipped
    and as tuned) each by its short spec, so no two rows or legend entries share a name."""
    from jacap_lib.results.loaders import load_all_chosen

    shown = {s: _shorter(s) for s in specs}  # each spec shortened once (short_spec builds its press)
    choices = {"chosen": load_all_chosen()}  # every space's choices, read once for every name, not once per setting
    family = {m: m.split("[", 1)[0] for m in shown.values()}
    name = {m: spec_name(m, legend=True, choices=choices) for m in family}
    name = {m: family[m] if n == m and list(family.values()).count(family[m]) == 1 else n for m, n in name.items()}
    name = {m: m if list(name.values()).count(n) > 1 else n for m, n in name.items()}
    return {s: name[m] for s, m in shown.items()}


def cells_frame(cells: list[dict], *, value: str = "kl_geomean", details: bool = False) -> pd.DataFrame:
    """``cell_statistics`` rows as a table: one row per (prompt, setting), one column per c. ``value``:
    "kl_geomean" (the geometric-mean KL in nats at the precision its interval supports; ``details=True``: its
    95 % interval instead), "top1_agreement" or "attn_rel_error" (three decimals)."""
    if value not in ("kl_geomean", "top1_agreement", "attn_rel_error"):
        raise ValueError(f"value must be 'kl_geomean', 'top1_agreement' or 'attn_rel_error', got {value!r}")
    table: dict = {}
    names = setting_names(c["method"] for c in cells)
    for c in cells:
        if value == "kl_geomean":
            est, iv = _interval(c["kl_geomean"], c["kl_low"], c["kl_high"]).split(" ", 1)
            txt = iv if details else est
        else:
            txt = f"{c[value]:.3f}"
        table.setdefault((c["length"], names[c["method"]]), {})[f"c = {float(c['ratio']):g}"] = txt
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=["prompt", "setting"])
    return wrapped(frame, ["setting"])


def kl_figure(cells: list[dict], *, title: str | None = None) -> go.Figure:
    """Geometric-mean KL (log axis) against c, one panel per prompt length, one line per setting, with
    95 % bootstrap intervals over the documents (``cells``: :func:`~jacap_lib.experiments.protocol.cell_statistics`).

    The ratios are evenly spaced categories (``0.5, 0.75, 0.9, 0.95`` one step apart), so the high ratios, where
    the methods separate, are as wide as the low ones instead of bunched at the right edge of a linear axis."""
    if not cells:
        raise ValueError("cells is empty; give cell_statistics rows of a finished run")
    ratios = [f"{r:g}" for r in sorted({c["ratio"] for c in cells})]
    lengths = sorted({c["length"] for c in cells})
    specs = list(dict.fromkeys(c["method"] for c in cells))
    label = {m: _shorter(m) for m in specs}  # a setting as a reader sees it
    names = setting_names(specs)
    cells = [{**c, "method": label[c["method"]]} for c in cells]
    methods = list(dict.fromkeys(c["method"] for c in cells))
    family = {m: m.split("[", 1)[0] for m in methods}
    # a setting's colour: its own where the book names it, else its method's when the figure shows one setting
    # of that method (so each method keeps its colour whatever the tune chose), else one derived from the spec
    group = {m: m if m in METHOD_STYLES or list(family.values()).count(family[m]) > 1 or family[m] not in METHOD_STYLES
             else family[m] for m in methods}
    n_docs = sorted({c["n_docs"] for c in cells})
    fig = make_subplots(rows=1, cols=len(lengths), shared_yaxes=True, x_title="compression ratio c (evenly spaced)",
                        subplot_titles=[f"prompt {L}" for L in lengths], horizontal_spacing=0.04)
    name = {label[m]: names[m] for m in specs}
    for j, L in enumerate(lengths, start=1):
        for m in methods:
            cs = sorted((c for c in cells if c["method"] == m and c["length"] == L), key=lambda c: c["ratio"])
            if not cs:
                continue
            jac = m.startswith("jacap")
            fig.add_trace(go.Scatter(
                x=[f"{c['ratio']:g}" for c in cs], y=[c["kl_geomean"] for c in cs], name=name[m], legendgroup=group[m],
                showlegend=j == 1, mode="lines+markers",
                line={"width": 3.5 if jac else 1.5, "dash": "solid" if jac else "dot"},
                error_y={"type": "data", "symmetric": False, "array": [c["kl_high"] - c["kl_geomean"] for c in cs],
                         "arrayminus": [c["kl_geomean"] - c["kl_low"] for c in cs]},
                hovertemplate="c=%{x}<br>KL %{y:.3g}<extra>" + m + "</extra>"), row=1, col=j)
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=ratios, row=1, col=j)
    fig.update_yaxes(type="log")  # every panel: the same quantity on the same axis type
    fig.update_yaxes(title_text="geometric-mean next-token KL (nats)", row=1, col=1)
    docs = "-".join(map(str, n_docs[:: max(1, len(n_docs) - 1)]))
    # the legend under the panels, in rows: every setting in sight at any width (a side legend scrolls)
    rows = -(-len(methods) // 3)
    fig.update_layout(height=460 + 24 * rows, title=title or f"Quality against compression on {docs} dev documents "
                      "(geometric mean, 95% bootstrap interval)",
                      legend={"font": {"size": 10}, "orientation": "h", "x": 0, "xanchor": "left", "y": -0.26,
                              "yanchor": "top", "entrywidth": 0.33, "entrywidthmode": "fraction"},
                      margin={"b": 60 + 24 * rows})
    return finish(fig)


def _pct(a: dict) -> str:
    return f"{100 * a['accuracy']:.0f} [{100 * a['low']:.0f}, {100 * a['high']:.0f}]"


def needle_frame(summary: dict) -> pd.DataFrame:
    """The needle summary's accuracies as a table: one row per (prompt, setting), the uncompressed answer (the
    ceiling) first, one column per c, each entry "accuracy [95 % Wilson interval]" in % of its prompts."""
    table: dict = {}
    names = setting_names(a["spec"] for cell in summary["cells"] for a in cell["settings"])
    for cell in summary["cells"]:
        col = f"c = {float(cell['ratio']):g}"
        table.setdefault((cell["length"], "uncompressed (ceiling)"), {})[col] = _pct(cell["full"])
        for a in cell["settings"]:
            table.setdefault((cell["length"], names[a["spec"]]), {})[col] = _pct(a)
    if not table:
        raise ValueError("summary has no complete cell; run the needle job and its summary")
    frame = pd.DataFrame.from_dict(table, orient="index")
    frame.index = pd.MultiIndex.from_tuples(frame.index, names=["prompt", "setting"])
    frame.columns.name = "accuracy, % [95 % CI]"
    return wrapped(frame, ["setting"])


_AGAINST = {"best baseline": "best baseline", "paper preset": "paper's settings"}


def needle_verdict_frame(summary: dict, *, details: bool = False) -> pd.DataFrame:
    """One row per (comparison, "prompt / c") of the needle summary: Algorithm 1's tuned Jacap setting against the best
    baseline by KL on tune and against the paper preset, paired per prompt: the reference (its method), both
    accuracies (%), the prompts only one of the two answered (won/lost), the Holm-adjusted exact McNemar p and the
    verdict in short words (higher accuracy is better). ``details=True``: the reference's setting, the accuracy
    difference in points with its paired bootstrap interval, the unadjusted McNemar p."""
    from jacap_lib.experiments.protocol.rules import PAPER_PRESET

    rows = []
    for fam in summary["comparisons"]:
        for r in fam["rows"]:
            ref_name = fam.get("reference")
            against = _AGAINST.get(ref_name) or (_AGAINST["paper preset"] if ref_name == PAPER_PRESET else fam["label"])
            head = {"against": against,
                    "prompt / c": _cell(r["length"], r["ratio"])}
            if details:
                row = {**head, "reference setting": ("Algorithm 1 as published" if r["reference_spec"] == PAPER_PRESET
                                                    else _shorter(r["reference_spec"])),
                       "difference, pts [95 % CI]": interval_text(r["diff_points"], r["diff_low"], r["diff_high"]),
                       "McNemar p": f"{r['p_mcnemar']:.2g}"}
            else:
                ref = r["reference_spec"]
                row = {**head, "reference": "paper's" if ref == PAPER_PRESET else _short(ref),
                       "Jacap %": f"{100 * r['accuracy']:.0f}", "ref. %": f"{100 * r['reference_accuracy']:.0f}",
                       "won/lost": f"{r['wins']}/{r['losses']}", "Holm p": f"{r['p_holm']:.2g}",
                       "verdict": short_verdict(r["verdict"])}
            rows.append(row)
    if not rows:
        raise ValueError("summary has no comparison rows; run the needle job and its summary")
    return wrapped(pd.DataFrame(rows).set_index(["against", "prompt / c"]),
                   ["against", "reference setting"] if details else ["against", "reference", "verdict"])


def kl_and_needle_frame(summary: dict, needle: dict, *, role: str) -> pd.DataFrame:
    """One Jacap setting's two objectives side by side, one row per "prompt / c" of the KL summary: against the
    best baseline of the cell picked on tune, the geometric-mean KL ratio with its adjusted interval and the short
    verdict; then the share of needle prompts it answers (%, 95 % Wilson interval) beside the uncompressed model's
    (``–`` where the needle task has no such cell). ``role``: the summary family (``"tuned jacap_obs"``, ...)."""
    fam = rowstats.family(summary, role, "tune")
    if fam is None:
        raise ValueError(f"summary has no family with role {role!r} picked on tune; choose among "
                         f"{sorted({f['role'] for f in summary['families']})}")
    acc = {}
    for cell in needle.get("cells", []):
        a = next((x for x in cell["settings"] if x["spec"] == fam["setting"]), None)
        if a is not None:
            acc[(int(cell["length"]), float(cell["ratio"]))] = (_pct(a), f"{100 * cell['full']['accuracy']:.0f}")
    rows = []
    for r in fam["rows"]:
        kl = _ratio_columns(r)
        needle_pct, full_pct = acc.get((int(r["length"]), float(r["ratio"])), ("–", "–"))
        rows.append({"prompt / c": _cell(r["length"], r["ratio"]), "baseline": _short(r["baseline_spec"]), **kl,
                     "needle % [95 % CI]": needle_pct, "uncompr. %": full_pct,
                     "note": _protection_note((fam["setting"],), r["length"], r["ratio"])})
    frame = pd.DataFrame(rows).set_index("prompt / c")
    if not frame["note"].any():
        frame = frame.drop(columns="note")
    return wrapped(frame, ["baseline", "verdict"] + (["note"] if "note" in frame else []))


def tuned_line(summary: dict, role: str) -> tuple[str, str]:
    """``(sentence, spec)``: the verdict counts of one Jacap family of ``summary`` against the best baseline of
    each cell picked on tune (``role``: ``"tuned jacap_obs"``, ...), and that family's setting."""
    from jacap_lib.experiments import names as N
    from jacap_lib.verdicts import words as VW

    fam = rowstats.family(summary, role, "tune")
    if fam is None:
        raise ValueError(f"summary has no family with role {role!r} picked on tune; choose among "
                         f"{sorted({f['role'] for f in summary['families']})}")
    return (f"{fam['setting']} against the best tuned baseline of each cell: "
            f"{N.counts_text(VW.verdict_counts(fam['rows']))}", fam["setting"])


def record_frame(record: dict) -> pd.DataFrame:
    """``dev_record.json`` as a table that fits the text column: one row per setting ever run on the dev
    documents (round, setting by its short label, dev rows, first run, status, what it led to)."""
    from jacap_lib.experiments.record import record_table

    frame = pd.DataFrame(record_table(record))
    if frame.empty:
        raise ValueError("record has no settings; run `jacap evaluate record`")
    frame["led to"] = frame["led to"].fillna("")
    return wrapped(frame.set_index(["round", "setting"]), ["setting", "status", "led to"])


def pair_verdict_frame(rows: list[dict], setting: str, reference: str) -> pd.DataFrame:
    """:func:`pair_frame` of ``setting`` against ``reference`` (``rows``:
    :func:`~jacap_lib.experiments.protocol.compare_settings` rows of that pair) with a note column: where either
    setting's sinks and recent window fill the whole budget (:func:`~jacap_lib.experiments.protection.protection_fills_budget`),
    which of the two — "both", or the one named by :func:`~jacap_lib.experiments.names.spec_name` — so that the
    verdict beside it reads as a verdict on a recency rule, not on a score."""
    frame = pair_frame(rows)
    notes = []
    for r in rows:
        filled = _filled((setting, reference), r["length"], r["ratio"])
        who = "both" if len(filled) == 2 else spec_name(filled[0], legend=True) if filled else ""
        notes.append(f"{protection.LABEL}: {who}" if who else "")
    out = pd.DataFrame(frame).assign(note=notes)
    return wrapped(out, ["verdict", "note"])


def document_ratio_figure(rows: list[dict], setting: str, reference: str, length: int, ratio: float, *,
                          verdict: dict | None = None) -> go.Figure:
    """One cell's verdict from its rows: the per-document KL ratio ``setting / reference`` (log axis), documents
    sorted by it, with the line at 1 (no difference), the geometric mean of the ratios (the KL ratio) and, given
    ``verdict`` (a :func:`~jacap_lib.experiments.protocol.compare_settings` or summary row of that cell), the band
    of its adjusted interval. ``rows``: evaluation rows of one split."""
    kl = {}
    for r in rows:
        if r["method"] in (setting, reference) and int(r["length"]) == int(length) and float(r["ratio"]) == float(ratio):
            kl.setdefault(r["method"], {})[r["doc"]] = (float(r["kl"]), r.get("kind", "?"))
    a, b = kl.get(setting, {}), kl.get(reference, {})
    if not a or set(a) != set(b):
        raise ValueError(f"no cell prompt {length}, c = {ratio} holds rows of both {setting!r} and {reference!r} "
                         "on the same documents")
    pts = sorted(((a[d][0] / b[d][0], d, a[d][1]) for d in a), key=lambda t: t[0])
    gm = math.exp(sum(math.log(x) for x, _, _ in pts) / len(pts))
    xs = [0.5, len(pts) + 0.5]
    fig = go.Figure()
    # the reference lines as traces, named in the legend under the plot (no label over the points)
    if verdict is not None:
        lo, hi, adj = verdict_interval(verdict)
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=[lo, lo, hi, hi], fill="toself", fillcolor="rgba(150,150,150,0.3)",
                                 line={"width": 0}, mode="lines", hoverinfo="skip",
                                 name=f"{'adjusted' if adj else '95 %'} interval [{lo:.3g}, {hi:.3g}]"))
    fig.add_trace(go.Scatter(x=xs, y=[1, 1], mode="lines", line={"color": "#444444", "width": 1},
                             name="1: no difference", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=xs, y=[gm, gm], mode="lines", line={"color": "#222222", "width": 2, "dash": "dash"},
                             name=f"KL ratio {gm:.3g} (geometric mean)", hoverinfo="skip"))
    method = setting.split("[", 1)[0]
    fig.add_trace(go.Scatter(x=list(range(1, len(pts) + 1)), y=[x for x, _, _ in pts], mode="markers",
                             name="one dev document", legendgroup=method,
                             customdata=[[d, k] for _, d, k in pts],
                             hovertemplate="%{customdata[0]} (%{customdata[1]})<br>ratio %{y:.3g}<extra></extra>"))
    fig.update_yaxes(type="log", title_text="per-document KL ratio")
    fig.update_xaxes(title_text="dev document, sorted by its ratio", range=xs)
    fig.update_layout(height=480, legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.22, "yanchor": "top"},
                      margin={"b": 110},
                      title=f"{spec_name(setting, legend=True)} against {spec_name(reference, legend=True)}, "
                            f"prompt {length}, c = {float(ratio):g}: one point per document")
    return finish(fig)


def verdict_counts_frame(summary: dict, *, picked_on: str = "tune") -> pd.DataFrame:
    """One row per Jacap setting of ``summary`` (Algorithm 1 tuned, as published, then the tuned Jacap methods)
    against the best baseline of each cell picked on ``picked_on``: how many cells each verdict has (from the
    adjusted intervals), and how many of the "worse" cells are cells where the setting's sinks and recent window
    fill the whole budget (:func:`~jacap_lib.experiments.protection.protection_fills_budget`). A table, where
    :func:`~jacap_lib.report.findings.kl_findings` gives the same counts as MyST text."""
    from jacap_lib.experiments import names as N
    from jacap_lib.verdicts import words as VW

    fams = [f for f in summary.get("families", []) if f["picked_on"] == picked_on]
    if not fams:
        raise ValueError(f"summary has no family picked on {picked_on!r}; run `jacap evaluate summary`")
    order = {"algorithm 1": 0, "paper preset": 1}
    rows = []
    for f in sorted(fams, key=lambda f: order.get(f["role"], 2)):
        c = VW.verdict_counts(f["rows"])
        worse_filled = sum(VW.verdict_word(r["verdict"]) == "worse" and protection.protection_fills_budget(
                               f["setting"], int(r["length"]), float(r["ratio"]))
                           for r in f["rows"])
        rows.append({"setting": N.setting_name(f).replace("`", ""), "better": c["better"], "worse": c["worse"],
                     "no det. diff.": c["no detectable difference"], "identical": c["identical"],
                     "worse where protection fills the budget": worse_filled})
    return wrapped(pd.DataFrame(rows).set_index("setting"), ["setting"])


_LENGTH_SYMBOLS = ("circle", "square", "diamond", "triangle-up")
_LENGTH_GLYPHS = ("●", "■", "◆", "▲")  # the same shapes, written in the figure's key


def confirm_forest(summary: dict) -> go.Figure:
    """The confirmatory run's KL verdicts (``confirm/summary.json`` with every KL row) as a forest plot: one panel per
    c, one row per planned pair (each Jacap-family setting against the cell's best tuned baseline, the default against
    KVzip and against Expected Attention; :func:`jacap_lib.experiments.confirm.groups.verdict_groups`), one point per
    prompt length at its KL ratio with the plan's adjusted interval. A point is in its setting's colour, shaped by the
    prompt length, filled when the interval excludes 1 and open when it holds 1; a cell the plan does not judge
    (protection fills the budget) has no point."""
    from jacap_lib.experiments.confirm.groups import BEST_BASELINE, verdict_groups
    from jacap_lib.experiments.confirm.plan import parse_cell
    from .style import FIGURE_WIDTH, forest_ticks, setting_colour

    groups = verdict_groups(summary)
    if not groups:
        raise ValueError("summary: no confirmatory comparisons; run `jacap evaluate confirm-summary` first")
    cells = [parse_cell(e["cell"]) for g in groups for e in g["cells"]]
    lengths, ratios = sorted({L for L, _ in cells}), sorted({c for _, c in cells})
    if len(lengths) > len(_LENGTH_SYMBOLS):
        raise ValueError(f"summary: {len(lengths)} prompt lengths, the figure shapes at most {len(_LENGTH_SYMBOLS)}")
    names = setting_names([s for g in groups for s in [g["a"], *g["references"]]])

    def label(g):
        ref = "best tuned baseline" if g["reference"] == BEST_BASELINE else names.get(g["references"][0], g["reference"])
        return f"{names[g['a']]} / {ref}"

    labels = [label(g) for g in groups]
    level = float(summary["kl"]["level"])
    fig = make_subplots(rows=1, cols=len(ratios), shared_yaxes=True, horizontal_spacing=0.025,
                        subplot_titles=[f"c = {c:g}" for c in ratios])
    step = 0.5 / max(len(lengths), 1)
    allv = [1.0]
    for i, g in enumerate(groups):
        colour = setting_colour(g["a"])
        for e in g["cells"]:
            if "low" not in e:  # not judged: protection fills the budget
                continue
            L, c = parse_cell(e["cell"])
            j = lengths.index(L)
            y = len(groups) - 1 - i - (j - (len(lengths) - 1) / 2) * step  # the shortest prompt on top
            excl = e["low"] > 1 or e["high"] < 1
            allv += [e["low"], e["high"]]
            fig.add_trace(go.Scatter(
                x=[e["ratio"]], y=[y], mode="markers", showlegend=False,
                marker={"color": colour, "size": 9, "symbol": _LENGTH_SYMBOLS[j] + ("" if excl else "-open"),
                        "line": {"color": colour, "width": 1.5}},
                error_x={"type": "data", "symmetric": False, "array": [e["high"] - e["ratio"]],
                         "arrayminus": [e["ratio"] - e["low"]], "color": colour, "thickness": 1.5},
                hovertemplate=f"{labels[i]}, prompt {L}, c = {c:g}: %{{x:.3f}} [{e['low']:.3f}, {e['high']:.3f}]; "
                              f"{e['verdict']}<extra></extra>"), row=1, col=ratios.index(c) + 1)
    for col in range(1, len(ratios) + 1):
        fig.add_vline(x=1, line={"color": "black", "width": 1}, row=1, col=col)
    lo, hi = min(allv), max(allv)
    ticks = forest_ticks(lo, hi)
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks], tickangle=0,
                     range=[math.log10(lo) - 0.05, math.log10(hi) + 0.05], title_text="KL ratio")
    fig.update_yaxes(tickvals=list(range(len(groups)))[::-1], ticktext=labels, range=[-0.6, len(groups) - 0.4])
    fig.update_yaxes(title_text="planned pair", row=1, col=1)
    key = "   ".join(f"{_LENGTH_GLYPHS[j]} prompt {L}" for j, L in enumerate(lengths))
    fig.add_annotation(text=f"{key}<br>filled: the interval excludes 1", xref="paper", yref="paper", x=0, y=0,
                       yshift=-70, xanchor="left", yanchor="top", showarrow=False, align="left")
    height = 260 + 56 * len(groups)
    fig.update_layout(title=f"Confirmatory KL ratio per planned pair ({100 * level:.2f} % intervals, adjusted)",
                      height=height, width=FIGURE_WIDTH, margin={"l": 250, "r": 20, "t": 100, "b": 110}, showlegend=False)
    return finish(fig)
