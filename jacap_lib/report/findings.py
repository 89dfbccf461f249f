"""The evaluation's findings as sentences, generated from the summary files so they cannot drift from them.

``summary.json`` (:mod:`jacap_lib.experiments.protocol`, ``jacap evaluate summary``) and ``needle_summary.json``
(:mod:`jacap_lib.experiments.needle`, ``jacap evaluate needle-summary``) hold one verdict per cell
(:func:`jacap_lib.verdicts.intervals.verdict`: "better by …", "worse by …", "no detectable difference; …" or
"no difference: identical on every document/prompt"). This module counts them (:func:`verdict_counts`, the one
home of that count) and writes short sentences with the counts and the largest differences
(:func:`kl_findings`, :func:`needle_findings`, :func:`findings_text`). Settings are named by their values
(:func:`setting_text`: ``jacap_prompt[tau=3,beta=0.9]`` -> "τ = 3, β = 0.9").

Both summary jobs call :func:`write` after writing their file; it rewrites ``findings.md`` (plain MyST text)
next to them, which the book's front page includes; the chapters print the same sentences from a code cell.

The other results files' lines, printed by the critique chapter and the jobs: ``anatomy.json``'s
(:func:`layer_lines`, :func:`kind_lines`, :func:`swap_lines`, :func:`ladder_setting_lines`, :func:`ladder_lines`;
``jacap evaluate anatomy``) and a needle summary's comparisons (:func:`needle_lines`). The statistics behind every
line are :mod:`jacap_lib.verdicts.rows`'.
"""
from __future__ import annotations

from pathlib import Path

from jacap_lib.results import files
from jacap_lib.verdicts import intervals as V
from jacap_lib.verdicts.rows import (ALGORITHM1, LADDER, LADDER_ONLY, decompose_gap, family, is_prompt_default, ladder_ratios,
                       swap_ratios)
from jacap_lib.verdicts.precision import interval_text
from jacap_lib.verdicts.words import WORDS, verdict_counts, verdict_word
from jacap_lib.experiments.names import counts_text, setting_name, setting_text, short_spec

__all__ = ["tuned_families", "needle_table", "SOURCE", "family_counts", "METHOD_WORDS", "accuracy_findings", "kl_findings", "needle_findings", "findings_text", "write", "FILE", "needle_baseline_lines", "layer_lines", "kind_lines", "swap_lines", "ladder_setting_lines", "ladder_lines", "needle_lines", "ladder_sentence"]

FILE = "findings.md"


def _adjusted(rows) -> bool:
    """Whether the rows' verdicts come from multiplicity-adjusted intervals (``gm_low_adjusted``/``gm_high_adjusted``;
    ``gm_low``/``gm_high`` are then the unadjusted 95 % ones)."""
    return any(r.get("gm_low_adjusted") is not None for r in rows)


def _ends(r: dict) -> tuple[float, float]:
    """The interval a row's verdict comes from: the adjusted one when the row has it."""
    if r.get("gm_low_adjusted") is not None:
        return r["gm_low_adjusted"], r["gm_high_adjusted"]
    return r["gm_low"], r["gm_high"]


def family_counts(summary: dict) -> list[str]:
    """One line per family of ``summary.json``: the Jacap setting, the baseline line and its verdict counts."""
    return [f"{f['setting']} ({f['role']}) against the best baseline {f['label']}: "
            + counts_text(verdict_counts(f["rows"])) for f in summary["families"]]


def _cell(r: dict) -> str:
    return f"prompt {r['length']}, c = {r['ratio']:g}"


def _largest(rows, word: str, k: int = 2) -> list[dict]:
    """The ``k`` rows of kind ``word`` farthest from the null (by the interval end nearest to it)."""
    sel = [r for r in rows if verdict_word(r["verdict"]) == word]
    key = (lambda r: -_ends(r)[0]) if word == "worse" else (lambda r: _ends(r)[1])
    return sorted(sel, key=key)[:k]


def tuned_families(summary: dict) -> list[dict]:
    """The families of ``summary.json`` for the tune choice of every Jacap method other than ``jacap_prompt`` (role
    ``"tuned <method>"``), against the best baseline picked on tune."""
    return [f for f in summary.get("families", []) if f["picked_on"] == "tune" and f["role"].startswith("tuned ")]


def _tempered_text(spec: str) -> str:
    """:func:`setting_text` of an Algorithm 1 spec, saying "the tempered centre" once, first."""
    rest = [t for t in setting_text(spec).split(", ") if t != "the tempered centre" and t != spec.split("[", 1)[0]]
    return ", ".join(["the tempered centre", *rest])


def _capital(text: str) -> str:
    return text[0].upper() + text[1:]


def _picked(summary: dict, role: str, *where: str) -> dict | None:
    """The family ``role`` picked on the first of ``where`` the summary holds ("dev" and "test" name one split)."""
    for w in where:
        f = family(summary, role, w)
        if f is not None:
            return f
    return None


def _fills(spec: str, r: dict) -> bool:
    from jacap_lib.experiments.protection import protection_fills_budget

    return protection_fills_budget(spec, int(r["length"]), float(r["ratio"]))


def _table(header: list[str], rows: list[list], align: str) -> list[str]:
    """A MyST pipe table: ``align`` one letter per column ("l" left, "r" right)."""
    rule = ["---:" if a == "r" else ":---" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |",
            *("| " + " | ".join(str(x) for x in row) + " |" for row in rows)]


def kl_findings(summary: dict) -> list[str]:
    """The KL verdicts of ``summary.json`` as lines of MyST: a table of the verdict counts of every Jacap setting
    against the best baseline of each cell picked on tune (with the losses where the setting's protection fills the
    budget, :func:`~jacap_lib.experiments.protection.protection_fills_budget`), Algorithm 1 tuned's largest losses in a
    table, and one-claim sentences on them."""
    main = family(summary, ALGORITHM1, "tune")
    if main is None:
        raise ValueError("summary has no family of Algorithm 1's tuned setting (role 'algorithm 1') against the "
                         "baseline picked on tune; run `jacap evaluate summary`")
    fams = [f for f in (main, family(summary, "paper preset", "tune"), *tuned_families(summary)) if f is not None]
    kind = "simultaneous 95 % intervals" if _adjusted(main["rows"]) else "95 % intervals"
    out = [f"Verdicts against the best tuned baseline of each cell ({len(main['rows'])} cells, from {kind}):", ""]
    rows = []
    for f in fams:
        c = verdict_counts(f["rows"])
        filled = sum(verdict_word(r["verdict"]) == "worse" and _fills(f["setting"], r) for r in f["rows"])
        rows.append([_capital(setting_name(f)), *(c[w] for w in WORDS), filled])
    out += _table(["setting", *WORDS, "worse where protection fills the budget"], rows, "lrrrrr") + [""]
    worst = _largest(main["rows"], "worse")
    if worst:
        out += ["Algorithm 1 tuned's largest losses:", ""]
        out += _table(["cell", "best baseline", "KL ratio [adjusted interval]"],
                      [[_cell(r), f"`{short_spec(r['baseline_spec'])}`", interval_text(r["gm_ratio"], *_ends(r))]
                       for r in worst], "llr") + [""]
    lost = [r for r in main["rows"] if verdict_word(r["verdict"]) == "worse"]
    filled = [r for r in lost if _fills(main["setting"], r)]
    if filled:
        out.append(f"In {len(filled)} of Algorithm 1 tuned's {len(lost)} losses, its sinks and recent window fill the "
                   "budget.")
        out.append("There its score chooses no token: those losses are losses of its window.")
    strict = _picked(summary, ALGORITHM1, "dev", "test")
    if strict is not None:
        same = all(a["baseline_spec"] == b["baseline_spec"] for a, b in zip(strict["rows"], main["rows"]))
        out.append("Picking the best baseline on the dev documents themselves "
                   + ("names the same baseline in every cell." if same else
                      f"leaves Algorithm 1 tuned {counts_text(verdict_counts(strict['rows']))}."))
    return out


#: How the findings name a Jacap method other than Algorithm 1's ``jacap_prompt`` (registry name -> words).
METHOD_WORDS = {"jacap_prompt_adakv": "Jacap's scores with kvpress AdaKV's head-adaptive budgets",
                "jacap_obs": "the capacity press linearised at the observed attention",
                "jacap_ea": "the capacity press linearised at Expected Attention's centre"}


def needle_findings(needle: dict) -> list[str]:
    """One sentence per comparison of Algorithm 1 tuned in ``needle_summary.json`` (the best baseline by KL of each
    cell, Algorithm 1 as published): its verdict counts over the cells, and the cells it loses."""
    by_test = bool(needle.get("config", {}).get("statistics", {}).get("verdict"))
    out = []
    for fam in needle.get("comparisons", []):
        rows = fam["rows"]
        if not rows:
            continue
        ref = ("the best baseline by KL" if fam.get("reference") == "best baseline"
               else "Algorithm 1 as published" if fam.get("reference") == "paper preset"
               else fam.get("label", fam.get("reference", "?")))
        test = " (exact paired test, Holm)" if by_test else ""
        out.append(f"Algorithm 1 tuned against {ref}: {counts_text(verdict_counts(rows), identical_unit='prompt')}"
                   f"{test}.")
        if fam.get("reference") == "best baseline":
            top = max(100 * r["reference_accuracy"] for r in rows)
            out.append(f"The best baseline by KL answers {'0 % in every cell' if top == 0 else f'at most {top:.0f} %'}.")
        lost = [r for r in rows if verdict_word(r["verdict"]) == "worse"]
        if lost:
            out.append("It loses " + " and ".join(_cell(r) for r in lost) + ".")
    return out


def _accuracies(needle: dict, spec: str, max_ratio: float) -> list[tuple[dict, float | None]]:
    """``(cell, accuracy of spec)`` for every cell of ``needle`` with c <= ``max_ratio`` (``None``: spec not measured
    there)."""
    return [(cell, next((x["accuracy"] for x in cell["settings"] if x["spec"] == spec), None))
            for cell in needle.get("cells", []) if float(cell["ratio"]) <= max_ratio]


def accuracy_findings(needle: dict, spec: str, *, max_ratio: float = 0.75) -> str | None:
    """One sentence: the needle accuracy of setting ``spec`` in every cell with c <= ``max_ratio``, beside the
    uncompressed model's (``None`` when ``needle`` holds no such cell of ``spec``)."""
    parts = [f"{_cell(cell)} {100 * a:.0f} % (uncompressed {100 * cell['full']['accuracy']:.0f} %)"
             for cell, a in _accuracies(needle, spec, max_ratio) if a is not None]
    if not parts:
        return None
    return f"On the needle task `{short_spec(spec)}` answers " + "; ".join(parts) + "."


def target_lines(summary: dict, needle: dict, role: str, *, max_ratio: float = 0.75,
                 min_accuracy: float = 0.9) -> list[str]:
    """The evaluation's bar for a capacity press worth choosing, checked for the Jacap family ``role`` of
    ``summary`` (``"tuned <method>"``, against the best baseline picked on tune): better in at least half of the
    cells and worse in none (adjusted verdicts), and needle accuracy >= ``min_accuracy`` in every needle cell with
    c <= ``max_ratio``. Lines: the verdict counts, the needle accuracies, whether the bar is cleared."""
    fam = family(summary, role, "tune")
    if fam is None:
        raise ValueError(f"summary has no family {role!r} picked on tune; choose among "
                         f"{sorted({f['role'] for f in summary.get('families', [])})}")
    counts = verdict_counts(fam["rows"])
    acc = [a for _, a in _accuracies(needle, fam["setting"], max_ratio)]
    half = 2 * counts.get("better", 0) >= sum(counts.values())
    cleared = half and not counts.get("worse") and bool(acc) and all(a is not None and a >= min_accuracy for a in acc)
    return [f"{fam['setting']} against the best tuned baseline of each cell: {counts_text(counts)}",
            f"needle at c <= {max_ratio:g}: " + (", ".join("not measured" if a is None else f"{100 * a:.0f} %"
                                                          for a in acc) or "not measured"),
            "the bar is " + ("cleared" if cleared else "not cleared")]


#: The line that opens the findings: where the numbers come from and what they can say.
SOURCE = ("*From the exploratory dev summary.* The 48 dev documents served four rounds of choices, so these counts "
          "guide the next measurement; they confirm nothing. They judge Jacap's settings against the best of the "
          "book's first seven baselines.")


def needle_table(summary: dict, needle: dict) -> list[str]:
    """Needle accuracy per cell ("L / c") as a MyST table: the uncompressed model, the best baseline by KL of the
    cell, the baseline that answers most prompts of the cell (first of a tie, named), and every Jacap setting of
    ``summary`` picked on tune but ``jacap_prompt_adakv`` (:func:`setting_name`; the default as "default"), named beside
    each entry; the best baseline by KL is named by :func:`needle_baseline_lines`."""
    best = next((f for f in needle.get("comparisons", []) if f.get("reference") == "best baseline"), None)
    ref = {(r["length"], float(r["ratio"])): r for r in (best or {}).get("rows", [])}
    fams = [f for f in (family(summary, ALGORITHM1, "tune"), family(summary, "paper preset", "tune"),
                        *tuned_families(summary)) if f is not None]
    cells = needle.get("cells", [])
    by_kl = [ref.get((c["length"], float(c["ratio"]))) for c in cells]
    top = [max((x for x in c["settings"] if not x["spec"].startswith(("jacap", "full"))),
               key=lambda x: x["accuracy"], default=None) for c in cells]

    kl_vals = ["–" if e is None else f"{100 * e['reference_accuracy']:.0f}" for e in by_kl]
    top_vals = ["–" if e is None else f"{100 * e['accuracy']:.0f} ({e['spec'].split('[', 1)[0]})" for e in top]
    rows = []
    for cell, kv, tv in zip(cells, kl_vals, top_vals):
        acc = {x["spec"]: x["accuracy"] for x in cell["settings"]}
        rows.append([f"{cell['length']} / {float(cell['ratio']):g}", kv, tv,
                     *(f"{100 * acc[f['setting']]:.0f}" if f["setting"] in acc else "–" for f in fams)])
    # narrow columns: the settings by plain names (the prompt press as "prompt press"), Jacap's AdaKV variant left to the
    # chapters; a baseline the same in every cell is named by needle_lines' sentence, not in its column
    keep = [i for i, f in enumerate(fams) if f["role"] != "tuned jacap_prompt_adakv"]
    names = ["prompt press" if is_prompt_default(fams[i]["setting"]) else setting_name(fams[i]).strip("`") for i in keep]
    rows = [r[:3] + [r[3 + i] for i in keep] for r in rows]
    return _table(["L / c", "best baseline by KL", "best-answering baseline", *names], rows, "lrr" + "r" * len(keep))


def needle_baseline_lines(needle: dict) -> list[str]:
    """The sentences naming the best baseline by KL of :func:`needle_table` where it is one method in every cell, and
    the uncompressed model's accuracy (the ceiling)."""
    best = next((f for f in needle.get("comparisons", []) if f.get("reference") == "best baseline"), None)
    names = {r["reference_spec"].split("[", 1)[0] for r in (best or {}).get("rows", [])}
    if len(names) != 1:
        return []
    out = [f"The best baseline by KL is {names.pop()} in every cell."]
    full = sorted({round(100 * c["full"]["accuracy"]) for c in needle.get("cells", [])})
    if full:
        out.append("The uncompressed model answers " + (f"{full[0]} %" if len(full) == 1 else f"{full[0]}–{full[-1]} %")
                   + " of the prompts in " + ("every cell." if len(full) == 1 else "each cell."))
    return out


def findings_text(summary: dict, needle: dict | None = None) -> str:
    """The findings as MyST: :data:`SOURCE`, the KL verdicts (:func:`kl_findings`), then, when ``needle`` is given,
    the needle accuracies of every setting beside the best baseline by KL (:func:`needle_table`) and Algorithm 1
    tuned's needle verdicts (:func:`needle_findings`). Each sentence makes one claim; the numbers are in tables."""
    out = [SOURCE, "", *kl_findings(summary)]
    if needle is not None and needle.get("cells"):
        n = needle["cells"][0].get("n_prompts")
        out += ["", f"Needle accuracy per cell (L / c: prompt length and compression ratio), in % of {n} prompts: is a key "
                "hidden in the prompt still retrieved?"
                if n else "Needle accuracy, in % of the prompts of each cell:", "", *needle_table(summary, needle), "",
                *needle_baseline_lines(needle)]
        out += needle_findings(needle)
    return "\n".join(_paragraphs(out)) + "\n"


def _paragraphs(lines: list[str]) -> list[str]:
    """Sentences one after another on one line each (a MyST paragraph each), tables and blank lines as they are."""
    out = []
    for line in lines:
        if out and line and not line.startswith("|") and out[-1] and not out[-1].startswith("|") \
                and not out[-1].endswith(":"):
            out[-1] += " " + line
        else:
            out.append(line)
    return out


def write(out_dir=None) -> Path | None:
    """Rewrite ``findings.md`` in ``out_dir`` (default ``data/results/eval``) from the dev ``summary.json`` and (when
    present) ``needle_summary.json`` there, as written (rounded). Returns the path; ``None`` (nothing written)
    when the folder has no ``summary.json`` yet. Once the confirmatory summary there has every KL row, the findings
    are its own (:func:`jacap_lib.report.confirm.write`) and this leaves the file as it is."""
    from jacap_lib.results.loaders import load_confirm_summary
    from jacap_lib.results.paths import data_path

    d = Path(out_dir) if out_dir is not None else data_path("results", "eval", must_exist=False)
    if not (d / "summary.json").exists():
        return None
    if load_confirm_summary(d, part="kl") is not None and (d / FILE).exists():
        return d / FILE
    summary = files.read_json(d / "summary.json", require=("config", "families"), hint="jacap evaluate summary")
    needle_path = d / "needle_summary.json"
    needle = (files.read_json(needle_path, require=("config", "cells", "comparisons"))
              if needle_path.exists() else None)
    path = d / FILE
    path.write_text(findings_text(summary, needle), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------- the anatomy
def layer_lines(anatomy: dict) -> list[str]:
    """Per losing cell (all documents), how many layers' error-ratio intervals lie above and below 1, layer 0's,
    the largest and the last layer's ratio; then how often layer 0 lies above 1 and has the largest ratio."""
    out, n_cells, layer0_largest, layer0_above = [], 0, 0, 0
    for e in anatomy["layers"]:
        if e["kind"] != "all":
            continue
        lay = e["layers"]
        top = max(lay, key=lambda x: x["ratio"])
        n_cells += 1
        layer0_largest += top["layer"] == 0
        layer0_above += lay[0]["low"] > 1
        out.append(f"prompt {e['length']}, c={e['ratio']} vs {e['baseline']}: error ratio's interval above 1 in "
                   f"{sum(x['low'] > 1 for x in lay)} of {len(lay)} layers, below 1 in {sum(x['high'] < 1 for x in lay)}; "
                   f"layer 0: {lay[0]['ratio']:.2f}, largest: layer {top['layer']} ({top['ratio']:.2f}), last layer: "
                   f"{lay[-1]['ratio']:.2f}")
    out.append(f"layer 0: its interval lies above 1 in {layer0_above} of {n_cells} losing cells; it has the largest "
               f"ratio of any layer in {layer0_largest}")
    return out


def kind_lines(anatomy: dict, kind: str = "dialogue") -> list[str]:
    """Per losing cell of ``anatomy`` (the file, or its ``library_default`` part): the document kind with the largest
    KL ratio and the kinds whose interval lies above 1; then in how many cells ``kind`` has the largest ratio and
    lies above 1."""
    out, largest, above_n = [], 0, 0
    for e in anatomy["kinds"]:
        worst = max((k for k in e["kinds"] if k["kind"] != "all"), key=lambda k: k["ratio"])
        above = [k["kind"] for k in e["kinds"] if k["kind"] != "all" and k["low"] > 1]
        largest += worst["kind"] == kind
        above_n += kind in above
        out.append(f"prompt {e['length']}, c={e['ratio']}: largest ratio on {worst['kind']} ({worst['ratio']:.2f}, "
                   f"{worst['losses']}/{worst['losses'] + worst['wins']} lost); kinds whose interval lies above 1: "
                   f"{', '.join(above) or 'none'}")
    out.append(f"{kind} has the largest ratio in {largest} of {len(anatomy['kinds'])} losing cells; its interval lies "
               f"above 1 in {above_n}")
    return out


_OPTIONAL_SWAPS = (  # key -> what it names in swap_lines (settings a file measured before them lacks)
    ("oracle_statistics", "statistics of the queries that follow the prompt (oracle)"),
    ("sensitivity_alpha", "sensitivity factor alpha-bar instead of rho^2"),
    ("kappa_mean", "response variance k^T Lambda k flattened to its mean"),
    ("ea_centre", "centre = Expected Attention's log-normal expectation"),
    ("future_positions", "RoPE horizon of the future queries = the baseline's"),
)


def _optional_entries(docs, dialogue, others, one) -> list[tuple[str, dict]]:
    """swap_lines' entries for the settings of :data:`_OPTIONAL_SWAPS` the file holds: each against the default, on
    all documents, on dialogue and on the other kinds, and against the baseline on dialogue and the other kinds."""
    have = set(docs[0]["kl"])
    out = []
    for key, text in _OPTIONAL_SWAPS:
        if key in have:
            out += [(f"{text} (/ Algorithm 1 tuned)", one(key)),
                    ("  on dialogue (/ Algorithm 1 tuned)", one(key, dialogue)),
                    ("  on dialogue, against the baseline", one(key, dialogue, "baseline")),
                    ("  on the other kinds (/ Algorithm 1 tuned)", one(key, others)),
                    ("  on the other kinds, against the baseline", one(key, others, "baseline"))]
    return out


def swap_lines(docs: list[dict]) -> list[str]:
    """The swap's findings as short lines: the protection and score parts of the gap, then each one-knob setting
    against Algorithm 1 tuned (the anatomy's base, key ``default``) (and, for the statistics and the centre, on dialogue and the other kinds, also against the
    baseline). Each comparison is a line naming it, then an indented line with its KL ratio, 95 % interval and the
    verdict of the interval adjusted for the one-knob settings of the file (Bonferroni)."""
    m = sum(k != "default" and k not in LADDER_ONLY for k in docs[0]["kl"])  # the one-knob settings judged together
    conf = V.simultaneous_confidence(V.CONFIDENCE, m)
    tables: dict = {}  # (selection, reference, confidence; None: the default) -> {key: row}: one pass each

    def table(sel, reference, confidence):
        at = (tuple(d["doc"] for d in sel), reference, confidence)
        if at not in tables:
            kw = {k: v for k, v in (("reference", reference), ("confidence", confidence)) if v is not None}
            tables[at] = {r["key"]: r for r in swap_ratios(sel, **kw)}
        return tables[at]

    def one(key, sel=None, reference=None):
        sel = docs if sel is None else sel
        return {**table(sel, reference, None)[key], "adjusted": table(sel, reference, conf)[key]["verdict"]}

    adjusted = {p["part"]: p["verdict"] for p in decompose_gap(docs, confidence=conf)}
    parts = {p["part"]: {**p, "adjusted": adjusted[p["part"]]} for p in decompose_gap(docs)}
    dialogue = [d for d in docs if d["kind"] == "dialogue"]
    others = [d for d in docs if d["kind"] != "dialogue"]
    entries = [
        ("protection, on Jacap's score (Jacap with the baseline's protection / Algorithm 1 tuned)",
         one("jacap_baseline_protection")),
        ("protection, on the baseline's score (baseline with Jacap's protection / baseline)",
         parts["protection (the baseline's score)"]),
        ("score, under Jacap's protection (Algorithm 1 tuned / baseline with Jacap's protection)",
         parts["score (Jacap's protection)"]),
        ("statistics: flat instead of EMA (/ Algorithm 1 tuned)", one("flat_statistics")),
        ("  on dialogue (/ Algorithm 1 tuned)", one("flat_statistics", dialogue)),
        ("  on dialogue, against the baseline", one("flat_statistics", dialogue, "baseline")),
        ("  on the other kinds (/ Algorithm 1 tuned)", one("flat_statistics", others)),
        ("centre = SnapKV's window attention of the last prompt queries (/ Algorithm 1 tuned)", one("window_attention_centre")),
        ("  on dialogue (/ Algorithm 1 tuned)", one("window_attention_centre", dialogue)),
        ("  on dialogue, against the baseline", one("window_attention_centre", dialogue, "baseline")),
        ("  on the other kinds (/ Algorithm 1 tuned)", one("window_attention_centre", others)),
        ("  on the other kinds, against the baseline", one("window_attention_centre", others, "baseline")),
        *_optional_entries(docs, dialogue, others, one),
        ("leverage interaction removed (/ Algorithm 1 tuned)", one("no_leverage")),
        ("temperature 1 (/ Algorithm 1 tuned)", one("tau_1")),
        ("temperature 10 (/ Algorithm 1 tuned)", one("tau_10")),
        ("per-query-head scoring (/ Algorithm 1 tuned)", one("gqa_mean")),
    ]
    out = ["each comparison: its KL ratio and 95 % interval; the verdict adjusted for",
           f"the {m} one-knob settings judged together (Bonferroni, {100 * conf:.1f} % interval)"]
    for label, r in entries:
        pad = " " * (len(label) - len(label.lstrip()) + 4)
        out += [f"{label}:", f"{pad}{r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}]; adjusted: {r['adjusted']}"]
    return out


def ladder_setting_lines(config: dict, width: int = 96) -> list[str]:
    """The ladder's rungs as short lines, from the file's ``config``: each rung's key, the option(s) it sets on top
    of the rung before it (``+ option=value``), and what it changes, wrapped at ``width`` characters."""
    import textwrap

    from jacap_lib.presses.registry import parse_method

    settings = {s["key"]: s for s in config["settings"]}
    missing = [k for k in LADDER if k not in settings]
    if missing:
        raise ValueError(f"ladder_setting_lines: the file lacks {missing}; run `jacap evaluate anatomy --extend`")
    out = []
    for a, b in zip(LADDER, LADDER[1:]):
        pa, pb = (parse_method(settings[k]["spec"].split("+", 1)[0])[1] for k in (a, b))
        added = ", ".join(f"{k}={'none' if v is None else v}" for k, v in pb.items() if pa.get(k, object()) != v)
        out.append(f"{b}" + (f" (+ {added})" if added and b in LADDER_ONLY + ("ea_centre",) else ""))
        out += textwrap.wrap(settings[b]["changes"], width, initial_indent="    ", subsequent_indent="    ")
    return out


def ladder_lines(docs: list[dict]) -> list[str]:
    """The ladder (:func:`~jacap_lib.verdicts.rows.ladder_ratios`) as lines: per group of documents (all,
    dialogue, the other kinds), each step's KL / the step before it with its 95 % interval and the documents where
    the step lowered it, then the verdict of its interval adjusted for the steps of the group (Bonferroni)."""
    groups = (("all documents", docs), ("dialogue", [d for d in docs if d["kind"] == "dialogue"]),
              ("the other kinds", [d for d in docs if d["kind"] != "dialogue"]))
    m = len(LADDER) - 1
    conf = V.simultaneous_confidence(V.CONFIDENCE, m)
    out = ["each step: its KL / the KL of the step before (95 % interval),",
           f"verdict adjusted for the {m} steps of a group (Bonferroni, {100 * conf:.0f} % interval)"]
    for label, sel in groups:
        out.append(f"{label} ({len(sel)}):")
        for r, a in zip(ladder_ratios(sel), ladder_ratios(sel, confidence=conf)):
            out.append(f"  {r['key']}: {r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}], lower on {r['lower']} of "
                       f"{r['n']}")
            out.append(f"      adjusted: {a['verdict']}")
    return out


# --------------------------------------------------------------------------------------------- the needle
def needle_lines(summary: dict) -> list[str]:
    """One printed line per comparison row of a needle summary (:func:`~jacap_lib.verdicts.rows.needle_summary`)."""
    return [f"  {f['setting']} vs {r['reference_spec']} ({f['label']}), L={r['length']} c={r['ratio']}: "
            f"{100 * r['accuracy']:.0f}% vs {100 * r['reference_accuracy']:.0f}%, {r['verdict']} "
            f"(wins/losses {r['wins']}/{r['losses']}, Holm p {r['p_holm']:.2g})"
            for f in summary["comparisons"] for r in f["rows"]]


def ladder_sentence(summary: dict) -> str | None:
    """What the ladder summary (``ladder_summary.json``, :func:`jacap_lib.experiments.ladder.summarize_ladder`) says
    about the gap from the prompt press to KVzip, in one or two sentences: per side (cells where KVzip's KL is lower,
    and where it is higher), the step that carries the largest share of the pooled log gap, with every step's share;
    then the cells with no gap to split (within a factor ``summary["gap"]``). ``None`` when there is neither."""
    from jacap_lib.experiments.ladder import GAP, STEPS

    gap = summary.get("gap", GAP)
    out = []
    for side, pooled in summary["pooled_share_of_log_gap"].items():
        carrier, shares = pooled["carrier"], pooled["shares"]
        out.append(f"Where KVzip's KL is {'lower' if side == 'kvzip_lower' else 'higher'} than the prompt press's "
                   f"({', '.join(pooled['cells'])}), step {carrier} ({STEPS[carrier][1]}) carries "
                   f"{100 * shares[carrier]:.0f} % of the log gap (shares: "
                   + ", ".join(f"{k} {100 * v:.0f} %" for k, v in shares.items()) + ").")
    small = [f"{x['length']}/{x['ratio']}" for x in summary["cells"] if x["carrier"] is None]
    if small:
        out.append(f"In {', '.join(small)} the prompt press and KVzip are within a factor {gap} (no gap to split).")
    return " ".join(out) or None
