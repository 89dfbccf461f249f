"""The evaluation's findings as sentences, generated from the summary files so they cannot drift from them.

``summary.json`` (:mod:`jacap_lib.results.evaluation`, ``jacap evaluate summary``) and ``needle_summary.json``
(:mod:`jacap_lib.results.needle`, ``jacap evaluate needle-summary``) hold one verdict per cell
(:func:`jacap_lib.results.verdicts.verdict`: "better by …", "worse by …", "no detectable difference; …" or
"no difference: identical on every document/prompt"). This module counts them (:func:`verdict_counts`, the one
home of that count) and writes short sentences with the counts and the largest differences
(:func:`kl_findings`, :func:`needle_findings`, :func:`findings_text`). Settings are named by their values
(:func:`setting_text`: ``jacap[tau=3,beta=0.9]`` -> "τ = 3, β = 0.9").

Both summary jobs call :func:`write` after writing their file; it rewrites ``findings.md`` (plain MyST text)
next to them, which the book's front page includes; the chapters print the same sentences from a code cell.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import files
from .precision import interval_text

__all__ = ["ALGORITHM1", "family", "tuned_families", "is_library_default", "WORDS", "verdict_word", "verdict_counts", "counts_text", "family_counts", "setting_text",
           "METHOD_WORDS", "accuracy_findings", "kl_findings", "needle_findings", "findings_text", "write", "FILE"]

FILE = "findings.md"
#: The role of the tune choice of the protocol's ``jacap`` method in ``summary.json``: Algorithm 1 with the tempered
#: centre, at the settings the tune picked (the library default until the observed centre replaced it).
ALGORITHM1 = "algorithm 1"
#: the four verdict kinds, in the order the counts are printed
WORDS = ("better", "worse", "no detectable difference", "identical")


def verdict_word(sentence: str) -> str:
    """The kind of a :func:`~jacap_lib.results.verdicts.verdict` sentence: one of :data:`WORDS`."""
    if not isinstance(sentence, str):
        raise ValueError(f"sentence must be a verdict sentence (str), got {sentence!r}")
    if sentence.startswith("no difference: identical"):
        return "identical"
    if sentence.startswith("no detectable difference"):
        return "no detectable difference"
    for w in ("better", "worse"):
        if sentence == w or sentence.startswith(w + " by"):  # a test's verdict is the bare word
            return w
    raise ValueError(f"{sentence!r} is not a verdict sentence of jacap_lib.results.verdicts "
                     "(better [by] / worse [by] / no detectable difference / no difference: identical)")


def verdict_counts(rows) -> dict[str, int]:
    """``{kind: number of rows}`` over :data:`WORDS` (zeros included) from each row's ``verdict``."""
    counts = dict.fromkeys(WORDS, 0)
    for r in rows:
        counts[verdict_word(r["verdict"])] += 1
    return counts


def counts_text(counts: dict, unit: str = "cells", *, identical_unit: str = "document") -> str:
    """``"better in 1, worse in 7 and no detectable difference in 4 of 12 cells"`` (kinds with a zero count
    left out; "identical on every document in k")."""
    n = sum(counts.values())
    names = {"identical": f"identical on every {identical_unit}"}
    parts = [f"{names.get(k, k)} in {v}" for k, v in counts.items() if v]
    if not parts:
        return f"no {unit}"
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{body} of {n} {unit}"


_SYMBOLS = {"tau": "τ", "beta": "β", "noise": "σ²", "deff_frac": "deff_frac", "n_sink": "sinks", "window": "window"}


def setting_text(spec: str) -> str:
    """A method spec by its values: ``jacap[tau=3,beta=0.9]`` -> ``"τ = 3, β = 0.9"``;
    ``jacap[tau=10,noise=1,beta=none]`` -> ``"τ = 10, σ² = 1, flat query statistics"``; ``centre=tempered`` -> ``"the
    tempered centre"``; a spec without options
    -> its name."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"spec must be a method spec such as 'jacap[tau=3,beta=0.9]', got {spec!r}")
    m = re.fullmatch(r"([^\[\]]+)(?:\[(.*)\])?", spec)
    if m is None:
        raise ValueError(f"spec {spec!r} is not of the form name[key=value,...]")
    if not m.group(2):
        return m.group(1)
    out = []
    for item in m.group(2).split(","):
        k, _, v = item.partition("=")
        if k == "beta" and v == "none":
            out.append("flat query statistics")
        elif k == "noise" and v == "deff":
            out.append("σ² by the effective-dimension rule")
        elif k == "centre":
            out.append(f"the {v} centre")
        else:
            out.append(f"{_SYMBOLS.get(k, k)} = {v}")
    return ", ".join(out)


def family(summary: dict, role: str, picked_on: str = "tune") -> dict | None:
    """The family of ``summary.json`` (its content) with that role (:data:`ALGORITHM1`, ``"paper preset"``,
    ``"tuned <method>"``) and baseline line (``picked_on`` "tune" or "test"); ``None`` when it has none."""
    return next((f for f in summary.get("families", []) if f["role"] == role and f["picked_on"] == picked_on), None)


def is_library_default(spec: str) -> bool:
    """Whether the protocol measures ``spec`` as the press ``JacapPress()`` builds today (same options)."""
    from ..presses.registry import changed_options
    from . import protocol as P

    return P.method_of(spec).startswith("jacap") and not changed_options(P.pinned(spec), "jacap")


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
    """The families of ``summary.json`` for the tune choice of every Jacap method other than ``jacap`` (role
    ``"tuned <method>"``), against the best baseline picked on tune."""
    return [f for f in summary.get("families", []) if f["picked_on"] == "tune" and f["role"].startswith("tuned ")]


def _tempered_text(spec: str) -> str:
    """:func:`setting_text` of an Algorithm 1 spec, saying "the tempered centre" once, first (a spec measured before
    the centre was an option does not name it)."""
    from ..presses.registry import parse_method, with_options

    name, opts = parse_method(spec)
    opts.pop("centre", None)
    rest = setting_text(with_options(name, **opts))
    return "the tempered centre" + (f", {rest}" if opts else "")


def kl_findings(summary: dict) -> list[str]:
    """Sentences on the KL verdicts of ``summary.json``: Algorithm 1 at its tuned settings against the best baseline
    of each cell picked on tune (the counts, the largest losses and wins), the stricter line picked on test, the
    paper's settings against the same baselines, and every other tuned Jacap method (saying which one
    ``JacapPress()`` builds by default)."""
    main = family(summary, ALGORITHM1, "tune")
    if main is None:
        raise ValueError("summary has no family of Algorithm 1's tuned setting (role 'algorithm 1') against the "
                         "baseline picked on tune; run `jacap evaluate summary`")
    rows = main["rows"]
    adj = (" (each verdict from an interval adjusted for the number of cells, so that all hold at once with 95 % "
           "probability)" if _adjusted(rows) else "")
    out = [f"Against the best tuned baseline of each cell, picked on tune documents and judged on held-out test "
           f"documents, Algorithm 1 at its tuned settings ({_tempered_text(main['setting'])}) is "
           f"{counts_text(verdict_counts(rows))}{adj}."]
    worst = _largest(rows, "worse")
    if worst:
        out.append("Its largest losses: " + "; ".join(
            f"{_cell(r)}, {r['verdict']} against `{r['baseline_spec']}` (KL ratio "
            f"{interval_text(r['gm_ratio'], *_ends(r))})" for r in worst) + ".")
    best = _largest(rows, "better")
    if best:
        out.append(("Its win: " if len(best) == 1 else "Its largest wins: ") + "; ".join(
            f"{_cell(r)}, {r['verdict']} against `{r['baseline_spec']}`" for r in best) + ".")
    strict = family(summary, ALGORITHM1, "test")
    if strict is not None:
        out.append("Against the best baseline picked on the test documents themselves (a line that favours the "
                   f"baselines) it is {counts_text(verdict_counts(strict['rows']))}.")
    paper = family(summary, "paper preset", "tune")
    if paper is not None:
        out.append(f"The paper's settings ({setting_text(paper['setting'])}) against the same baselines are "
                   f"{counts_text(verdict_counts(paper['rows']))}.")
    for fam in tuned_families(summary):
        method = fam["role"][len("tuned "):]
        what = METHOD_WORDS.get(method, f"`{method}`")
        default = ", the press `JacapPress()` builds by default" if is_library_default(fam["setting"]) else ""
        out.append(f"{what[0].upper() + what[1:]} (`{fam['setting']}`{default}, chosen on tune by the same rule) "
                   f"against the same baselines is {counts_text(verdict_counts(fam['rows']))}.")
    return out


#: How the findings name a Jacap method other than Algorithm 1's ``jacap`` (registry name -> words).
METHOD_WORDS = {"jacap_adakv": "Jacap's scores with kvpress AdaKV's head-adaptive budgets",
                "jacap_obs": "the capacity press linearised at the observed attention",
                "jacap_ea": "the capacity press linearised at Expected Attention's centre"}


def needle_findings(needle: dict) -> list[str]:
    """Sentences on the needle verdicts of ``needle_summary.json``: per comparison of Algorithm 1's tuned setting
    (the best baseline by KL on tune, the paper's settings) the verdict counts over the cells, and the cells it
    loses."""
    by_test = bool(needle.get("config", {}).get("statistics", {}).get("verdict"))
    out = []
    for fam in needle.get("comparisons", []):
        test = " (by McNemar's exact test, Holm-adjusted over the cells)" if by_test and not out else ""
        rows = fam["rows"]
        if not rows:
            continue
        ref = ("the best baseline by KL of each cell" if fam.get("reference") == "best baseline"
               else f"the paper's settings ({setting_text(rows[0]['reference_spec'])})"
               if fam.get("reference") == "paper preset" else fam.get("label", fam.get("reference", "?")))
        head = (f"On the needle task (is a key hidden in the prompt still retrieved?), Algorithm 1 at its tuned "
                f"settings ({_tempered_text(fam['setting'])}) against {ref} is" if not out else f"Against {ref} it is")
        s = f"{head} {counts_text(verdict_counts(rows), identical_unit='prompt')}{test}"
        lost = [r for r in rows if verdict_word(r["verdict"]) == "worse"]
        if lost:
            s += "; it loses " + "; ".join(
                f"{_cell(r)} ({100 * r['accuracy']:.0f} % against {100 * r['reference_accuracy']:.0f} %)"
                for r in lost)
        out.append(s + ".")
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
    return f"On the needle task `{spec}` answers " + "; ".join(parts) + "."


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


def findings_text(summary: dict, needle: dict | None = None) -> str:
    """The findings as one MyST paragraph per source (KL, then the needle when given: Algorithm 1's verdicts and
    the accuracy of every other tuned Jacap method of the KL summary at c <= 0.75)."""
    paras = [" ".join(kl_findings(summary))]
    if needle is not None:
        n = needle_findings(needle)
        for fam in tuned_families(summary):
            line = accuracy_findings(needle, fam["setting"])
            if line:
                n.append(line)
        if n:
            paras.append(" ".join(n))
    return "\n\n".join(paras) + "\n"


def write(out_dir=None) -> Path | None:
    """Rewrite ``findings.md`` in ``out_dir`` (default ``data/results/eval``) from the ``summary.json`` and (when
    present) ``needle_summary.json`` there, as written (rounded). Returns the path; ``None`` (nothing written)
    when the folder has no ``summary.json`` yet."""
    from .paths import data_path

    d = Path(out_dir) if out_dir is not None else data_path("results", "eval", must_exist=False)
    if not (d / "summary.json").exists():
        return None
    summary = files.read_json(d / "summary.json", require=("config", "families"), hint="jacap evaluate summary")
    needle_path = d / "needle_summary.json"
    needle = (files.read_json(needle_path, require=("config", "cells", "comparisons"))
              if needle_path.exists() else None)
    path = d / FILE
    path.write_text(findings_text(summary, needle), encoding="utf-8")
    return path
