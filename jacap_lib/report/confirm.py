"""The confirmatory summary in plain sentences and tables: the landing page's answer and the findings.

``confirm/summary.json`` (:mod:`jacap_lib.experiments.confirm.summary`) holds the committed plan's verdicts, computed
once on the confirmatory documents. This module only words them; it chooses nothing:

* :func:`verdict_groups` counts the verdicts of each planned pair of settings over its cells: each Jacap-family
  setting against the best tuned baseline of each cell, and the default against KVzip and against Expected
  Attention. A cell where the setting's protection fills the budget is counted apart, as the plan labels it;
* :func:`needle_accuracy` pools each setting's needle accuracy over the prompt lengths, per mode and ``c``;
* :func:`answer_lines` gives the landing page's sentences (at most :data:`~jacap_lib.report.answer.MAX_SENTENCES`
  with the cost sentence :mod:`~jacap_lib.report.answer` adds, each at most
  :data:`~jacap_lib.report.answer.MAX_WORDS` words);
* :func:`plane_points` pairs each setting's KL ratio to KVzip with its needle accuracy, cell by cell (the landing
  page's KL–retrieval plane), once the KL rows and a needle mode are complete;
* :func:`findings_text` gives ``findings.md`` (:func:`write` writes it): the source, the verdict table, the needle
  table and one-claim sentences.

:func:`jacap_lib.results.loaders.load_confirm_summary` (``part="kl"``) returns the summary once every planned KL row
is there; until then the answer and the findings stay on the dev documents, labelled exploratory
(:func:`jacap_lib.report.answer.write`, :func:`jacap_lib.report.findings.write`, which leaves a confirmatory
``findings.md`` alone). A needle mode enters the answer and the findings only when every planned prompt of that mode
is answered (a Holm adjustment over part of the pairs is not the plan's); until then the findings say how far it has
got and the answer's fact sentence stays on the dev documents, labelled so.
"""
from __future__ import annotations

from pathlib import Path

from jacap_lib.experiments.confirm.groups import (BEST_BASELINE, NEEDLE_VERDICTS, VERDICTS, needle_accuracy, needle_done,
                                                 needle_groups, needle_progress, verdict_groups)

__all__ = ["write", "answer_lines", "findings_text", "fact_sentence", "needle_text", "needle_lines", "plan_sentence"]

_WHEN = {"after": "after compression", "inside": "inside the prompt"}


def write(eval_dir=None) -> Path | None:
    """Rewrite ``findings.md`` in ``eval_dir`` (default ``data/results/eval``) from the confirmatory summary there
    (:func:`findings_text`) once its KL rows are complete; ``None`` (nothing written) before. The dev findings'
    writer (:func:`jacap_lib.report.findings.write`) leaves the file alone from then on."""
    from jacap_lib.report.findings import FILE as FINDINGS
    from jacap_lib.results.loaders import load_confirm_summary
    from jacap_lib.results.paths import data_path

    d = Path(eval_dir) if eval_dir is not None else data_path("results", "eval", must_exist=False)
    summary = load_confirm_summary(d, part="kl")
    if summary is None:
        return None
    path = d / FINDINGS
    path.write_text(findings_text(summary), encoding="utf-8")
    return path


def _judged(g: dict) -> int:
    return sum(v for k, v in g["counts"].items() if k != "protection fills the budget")


def _counts(g: dict) -> str:
    c = g["counts"]
    return (f"better in {c['better']}, worse in {c['worse']} and not distinguishable in "
            f"{c['no detectable difference']} of {_judged(g)} judged cells")


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return _pct(lo) if round(100 * lo) == round(100 * hi) else f"{100 * lo:.0f}–{100 * hi:.0f} %"


def answer_lines(summary: dict, *, max_ratio: float = 0.75) -> list[str]:
    """The landing page's answer from a confirmatory summary with every KL row: which press keeps the predictions (the
    default against KVzip, then against the best tuned baseline), the prompt press beside it, and which press keeps
    a fact (:func:`fact_sentence`, over every complete needle mode). Four sentences at most; every count is read from
    the plan's verdicts."""
    from jacap_lib.experiments.names import spec_name
    from jacap_lib.verdicts.rows import is_library_default, is_prompt_default

    groups = verdict_groups(summary)
    n_docs, n_works = summary["config"]["documents"], summary["config"]["works"]
    default = next((g for g in groups if g["reference"] == "kvzip" and is_library_default(g["a"])), None)
    out = []
    if default is not None:
        out.append(f"On {n_docs} fresh documents from {n_works} works, the default `JacapPress()` against KVzip is "
                   f"{_counts(default)}.")
    best = [g for g in groups if g["reference"] == BEST_BASELINE]
    mine = next((g for g in best if is_library_default(g["a"])), None)
    if mine is not None:
        refs = " or ".join(spec_name(b, legend=True) for b in mine["references"])
        out.append(f"Against each cell's best tuned baseline ({refs}), the default is {_counts(mine)}.")
    prompt = next((g for g in best if is_prompt_default(g["a"])), None)
    if prompt is not None:
        out.append(f"The prompt press `JacapPromptPress()`, which reads the prompt once, is {_counts(prompt)}.")
    fact = fact_sentence(summary, max_ratio)
    return out + ([fact] if fact else [])


def fact_sentence(summary: dict, max_ratio: float = 0.75) -> str | None:
    """Which press keeps a fact: over the needle modes whose every planned prompt is answered (in the plan's order),
    the settings whose lowest accuracy at ``c <= max_ratio`` in any of those modes is highest (ties: the larger sum),
    with their accuracy range per mode, and the default's beside them when it is not among them. ``None`` before a
    mode is complete."""
    from jacap_lib.experiments.names import or_list, spec_name
    from jacap_lib.verdicts.rows import FULL, is_library_default

    complete = needle_accuracy(summary)
    modes = [m for m in summary["config"]["needle_design"]["modes"] if m in complete]
    low = {}  # setting -> mode -> its accuracies at c <= max_ratio
    for m in modes:
        for setting, by in complete[m].items():
            vals = [a for c, a in by.items() if c <= max_ratio]
            if setting != FULL and vals:
                low.setdefault(setting, {})[m] = vals
    low = {s: by for s, by in low.items() if len(by) == len(modes)}  # a setting in every complete mode
    if not low:
        return None

    def key(s):
        vals = [a for m in modes for a in low[s][m]]
        return min(vals), sum(vals)

    top = max(key(s) for s in low)
    best = [s for s in low if key(s) == top]

    names, each = or_list([spec_name(b) for b in best]), "each answers" if len(best) > 1 else "it answers"
    per_mode = [_range([a for x in best for a in low[x][m]]) for m in modes]  # a tie may differ cell by cell
    if len(modes) == 1:
        when = "after" if modes[0] == "after" else "inside the prompt"
        s = (f"To keep a fact of the prompt, use {names}: {each} {per_mode[0]} of needle prompts at "
             f"c ≤ {max_ratio:g}, question {when}")
    elif len(set(per_mode)) == 1:  # "100 % of needle prompts, asked after or inside"
        s = f"To keep a fact, use {names}: at c ≤ {max_ratio:g} {each} {per_mode[0]} of needle prompts, " \
            f"asked {' or '.join(modes)}"
    else:  # "100 % of needle prompts asked after, 85–95 % asked inside"
        asked = ", ".join(f"{r}{' of needle prompts' if i == 0 else ''} asked {m}"
                          for i, (r, m) in enumerate(zip(per_mode, modes)))
        s = f"To keep a fact, use {names}: at c ≤ {max_ratio:g} {each} {asked}"
    default = next((x for x in low if is_library_default(x)), None)
    if default is not None and default not in best:
        s += f"; the default answers {' and '.join(_range(low[default][m]) for m in modes)}"  # the modes' order
    return s + "."


def findings_text(summary: dict) -> str:
    """``findings.md`` from a confirmatory summary with every KL row (MyST): the source sentence, the verdict counts of
    every planned pair (with the cells where protection fills the budget, which the plan does not judge), the pooled needle
    accuracies of every setting beside the uncompressed answer, and the paired needle tests counted per mode."""
    from jacap_lib.report.findings import _paragraphs, _table
    from jacap_lib.experiments.names import or_list, spec_name

    cfg = summary["config"]
    kl = summary["kl"]
    out = [f"*From the confirmatory run.* {cfg['documents']} documents from {cfg['works']} works, never used for a "
           "choice, were measured once, after the plan was committed.",
           f"Each verdict comes from an interval over works adjusted for the plan's {kl['m']} judged comparisons "
           f"(level {kl['level']:.5f}).",
           ]
    groups = verdict_groups(summary)
    best = list(dict.fromkeys(b for g in groups if g["reference"] == BEST_BASELINE for b in g["references"]))
    if best:
        out.append(f"A cell's best tuned baseline is the one the tune documents picked there: "
                   f"{or_list([spec_name(b, legend=True) for b in best])}.")
    out += ["", "Verdicts of each planned pair over its cells (KL ratio below 1: the first setting moved the "
            "predictions less):", ""]
    rows = []
    for g in groups:
        ref = "best tuned baseline" if g["reference"] == BEST_BASELINE else spec_name(g["reference"], legend=True)
        rows.append([spec_name(g["a"], legend=True), ref, *(g["counts"][v] for v in VERDICTS)])
    out += _table(["setting", "against", "better", "worse", "no det. diff.", "protection fills the budget"], rows,
                  "llrrrr")
    out += ["", "{ref}`fair-comparison-result` draws each ratio with its interval."]
    out += ["", *needle_lines(summary)]
    return "\n".join(_paragraphs(out)) + "\n"


def needle_text(summary: dict, *, fact: bool = False) -> str:
    """The needle part of the findings as MyST text (:func:`needle_lines`), for a chapter to display; with ``fact``,
    the landing answer's fact sentence (:func:`fact_sentence`) first, when a mode is complete."""
    from jacap_lib.report.findings import _paragraphs

    first = fact_sentence(summary) if fact else None
    return "\n".join(_paragraphs(([first, ""] if first else []) + needle_lines(summary))) + "\n"


def needle_lines(summary: dict) -> list[str]:
    """The needle part of the findings, as lines (tables as Markdown rows): for each complete mode, the pooled
    accuracies of every setting beside the uncompressed answer, the paired tests counted per planned pair; for each
    mode still running, how many of its planned prompts are answered."""
    from jacap_lib.report.findings import _table
    from jacap_lib.experiments.names import spec_name

    cfg = summary["config"]
    out: list[str] = []
    acc = needle_accuracy(summary)
    if acc:
        ratios = sorted({c for by in acc.values() for s in by.values() for c in s})
        modes = list(acc)
        settings = list(dict.fromkeys(s for m in modes for s in acc[m]))
        header = ["setting", *(f"{m} {c:g}" for m in modes for c in ratios)]
        body = [[spec_name(s, legend=True), *(_pct(acc[m][s][c]) if c in acc[m].get(s, {}) else "–"
                                               for m in modes for c in ratios)] for s in settings]
        n = cfg["needle_design"]
        out += [f"Needle accuracy (mode and c), pooled over prompts {', '.join(map(str, n['lengths']))}: "
                f"{len(n['depths']) * n['trials']} prompts per prompt length and cell, fresh keys:", "",
                *_table(header, body, "l" + "r" * (len(header) - 1))]
        for m in modes:
            rows = [[spec_name(g["a"], legend=True), "best tuned baseline" if g["reference"] == BEST_BASELINE
                     else spec_name(g["reference"], legend=True), *(g["counts"][v] for v in NEEDLE_VERDICTS)]
                    for g in needle_groups(summary, m)]
            out += ["", f"Needle verdicts with the question {_WHEN[m]}: the exact paired test per needle cell, Holm "
                    f"over the mode's {len(summary['needle'][m]['pairs'])} planned pairs (better: more prompts "
                    "answered; identical: right on the same prompts):", "",
                    *_table(["setting", "against", "better", "worse", "no det. diff.", "identical"], rows, "llrrrr")]
    for m in cfg["needle_design"]["modes"]:
        if not needle_done(summary, m):
            done, planned = needle_progress(summary, m)
            out += [""] if out else []
            out.append(f"The needle run with the question {_WHEN[m]} is not finished: {done:,} of {planned:,} "
                       "planned prompts are answered. Its accuracies and tests appear here when every prompt is.")
    return out


def plan_sentence(entry: dict, plan: dict) -> str | None:
    """The committed plan's sentence for one KL comparison of the summary (``summary["kl"]["comparisons"]``), filled
    in with the comparison's cell, the two methods' registry names and, for a judged one, its ratio and interval
    ends at three decimals (an end near 1 stays readable: 1.002, not 1); ``None`` while the comparison is incomplete."""
    from jacap_lib.presses.registry import method_of

    if entry["verdict"] == "incomplete":
        return None
    names = {"cell": entry["cell"], "a": method_of(entry["a"]), "b": method_of(entry["b"])}
    if not entry["judged"]:
        key = entry["verdict"] if entry["verdict"] in plan["sentences"] else "protection fills the budget"
        return plan["sentences"][key].format(**names)
    return plan["sentences"][entry["verdict"]].format(**names, ratio=f"{entry['ratio']:.3f}", low=f"{entry['low']:.3f}",
                                                      high=f"{entry['high']:.3f}")
