"""The landing page's answer: which press to use for which job, and why, in at most five plain sentences.

Generated from the committed summary files, so it cannot drift from them: the KL verdicts of ``summary.json``
(each Jacap setting against the best tuned baseline of each cell), the needle accuracies of ``needle_summary.json``,
the mechanism diagnostics of ``data/diagnostics/mechanisms.json`` (:func:`~jacap_lib.experiments.diagnostics.defaults_summary`),
the tune-document ladder from the prompt press to kvpress's KVzip (``peers/ladder_summary.json``) and, when it exists, the
whole field on the dev documents (``peers/field_summary.json``: every method's tune choice, kvpress's newer presses
among them, beside KVzip), which then answers which press keeps the predictions and which keeps a fact.

:func:`answer_lines` returns the label line and the sentences; :func:`answer_text` the MyST paragraph; :func:`write`
rewrites ``answer.md`` next to ``findings.md`` (the KL and needle summary jobs, the ladder, field and confirmatory
summaries call it), which the book's front page includes. The label says which documents the verdicts come from: the
confirmatory run once its KL rows are complete (``confirm/summary.json``, :mod:`~jacap_lib.report.confirm`;
the fact sentence stays the dev documents' until its needle run ends), until then the exploratory dev summary,
labelled so.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments.names import DEFAULT_NAME, SETTING_NAMES, or_list, setting_name
from jacap_lib.report.findings import tuned_families
from jacap_lib.verdicts.words import verdict_counts, verdict_word
from jacap_lib.verdicts.rows import ALGORITHM1, family

__all__ = ["FILE", "answer_lines", "predictions_lines", "field_lines", "answer_text", "write", "MAX_SENTENCES",
           "MAX_WORDS"]

FILE = "answer.md"
#: the landing page's limits: sentences, and words per sentence
MAX_SENTENCES, MAX_WORDS = 5, 30


def _baseline_name(spec: str) -> str:
    from jacap_lib.presses.registry import press_name

    return press_name(spec)


def _jacap_families(summary: dict) -> list[dict]:
    main = family(summary, ALGORITHM1, "tune")
    if main is None:
        raise ValueError("summary has no family of Algorithm 1 tuned against the baseline picked on tune; "
                         "run `jacap evaluate summary`")
    return [f for f in (main, family(summary, "paper preset", "tune"), *tuned_families(summary)) if f is not None]


def _predictions(summary: dict) -> list[str]:
    """Two sentences: the baseline to use for next-token fidelity (the best tuned baseline, named when it is one
    press in every cell), and the Jacap presses with the fewest losses against it, with their counts."""
    fams = _jacap_families(summary)
    rows = fams[0]["rows"]
    names = Counter(_baseline_name(r["baseline_spec"]) for r in rows)
    n = len(rows)
    better = sum(verdict_counts(f["rows"]).get("better", 0) for f in fams)
    if len(names) == 1:
        who = f"{next(iter(names))}, the best tuned baseline in all {n} cells"
    else:
        who = "the best tuned baseline of each cell (" + ", ".join(f"{k} in {v}" for k, v in names.most_common()) + ")"
    s1 = (f"To keep the model's next-token predictions, use {who}; "
          + ("no Jacap setting is better in any cell." if better == 0 else
             f"Jacap settings are better in {better} (setting, cell) pairs."))

    def losses(f):  # worse verdicts where the setting's own score chose some tokens
        return sum(verdict_word(r["verdict"]) == "worse" for r in f["rows"])

    ranked = sorted(fams, key=losses)
    top = [f for f in ranked if f["role"] not in SETTING_NAMES and f["role"] != "tuned jacap_prompt_adakv"][:2]
    if not top:
        top = ranked[:1]
    parts = " and ".join(setting_name(f) for f in top)
    counts = " and ".join(str(losses(f)) for f in top)
    s2 = (f"Of the Jacap presses, {parts} come closest: worse in {counts} of {n} cells, against "
          f"{losses(fams[0])} for Algorithm 1 tuned.")
    return [s1, s2]


def _facts(summary: dict, needle: dict, max_ratio: float = 0.75) -> str | None:
    """One sentence: the baseline that keeps a hidden fact best at c <= ``max_ratio`` (the highest lowest accuracy
    over those cells), its range, beside the best baseline by KL's and the best Jacap setting's highest accuracy."""
    cells = [c for c in needle.get("cells", []) if float(c["ratio"]) <= max_ratio]
    if not cells:
        return None
    acc: dict[str, list[float]] = {}
    for c in cells:
        for x in c["settings"]:
            acc.setdefault(x["spec"], []).append(x["accuracy"])
    complete = {s: a for s, a in acc.items() if len(a) == len(cells)}
    baselines = {s: a for s, a in complete.items() if not s.startswith("jacap")}
    if not baselines:
        return None
    best = max(baselines, key=lambda s: (min(baselines[s]), sum(baselines[s])))
    lo, hi = 100 * min(baselines[best]), 100 * max(baselines[best])
    by_kl = next((f for f in needle.get("comparisons", []) if f.get("reference") == "best baseline"), None)
    kl_top = max((100 * r["reference_accuracy"] for r in (by_kl or {}).get("rows", []) if float(r["ratio"]) <= max_ratio),
                 default=None)
    rng = f"{lo:.0f} %" if lo == hi else f"{lo:.0f}–{hi:.0f} %"
    s = (f"To keep a fact of the prompt, use {_baseline_name(best)}: it answers {rng} of needle prompts at "
         f"c ≤ {max_ratio:g}")
    if kl_top is not None:
        s += ("; the best baseline by KL answers 0 %" if kl_top == 0 else
              f"; the best baseline by KL at most {kl_top:.0f} %")
    return s + "."


def _why(mechanisms: list | None) -> str | None:
    """One sentence: at the paper's settings the two mechanisms stay off (no token saturates; the kept set is almost
    the per-token ranking), so Algorithm 1 acts as a per-token score (the mechanism diagnostics' medians)."""
    if not mechanisms:
        return None
    from jacap_lib.experiments.diagnostics import defaults_summary

    d = defaults_summary(mechanisms)
    sat = (f"no token saturates in any of {d['n_heads']} heads" if d["heads_saturated"] == 0 else
           f"a token saturates in only {d['heads_saturated']} of {d['n_heads']} heads")
    return (f"Why: at the paper's settings {sat}, and the leverage changes {100 * (1 - d['overlap']):.0f} % of the "
            "kept tokens: Jacap acts as a per-token score.")


def _kvzip(ladder: dict | None) -> str | None:
    """One sentence: where kvpress's KVzip beats and loses to the default on the tune documents (the ladder's
    whole-gap verdicts), and what its prefill costs, measured."""
    if not ladder or not ladder.get("cells"):
        return None
    word = Counter(verdict_word(c["total_verdict"]) for c in ladder["cells"])
    n = len(ladder["cells"])
    ratios = _kvzip_prefill_ratios(ladder)
    cost = ""
    if ratios:
        lo, hi = min(ratios), max(ratios)
        cost = (f", for {lo:.1f}–{hi:.1f} times the prefill" if hi - lo >= 0.05 else
                f", for {lo:.1f} times the prefill")
    return (f"On the tune documents, kvpress's KVzip has a lower KL than the prompt press in {word.get('better', 0)} of {n} "
            f"cells and a higher one in {word.get('worse', 0)}{cost}.")


def _kvzip_prefill_ratios(ladder: dict) -> list[float]:
    """KVzip's prefill CPU time over an uncompressed prefill's, per prompt length the ladder timed."""
    return [t["kvzip"]["cpu_seconds"] / t["none"]["cpu_seconds"] for t in ladder.get("prefill_timing") or []
            if "kvzip" in t and "none" in t]


def _field_predictions(field: dict) -> list[str]:
    """Two sentences from the whole field on the dev documents (``field_summary.json``'s ``table``): the two presses
    with the lowest KL over all cells (and whether both read the context a second time), then the closest press that
    reads it once and the default ``JacapPromptPress()``'s ratio, both as multiples of the reference's (KVzip's) KL."""
    from jacap_lib.presses.registry import RECONSTRUCTION_METHODS
    from jacap_lib.experiments.names import spec_name
    from jacap_lib.verdicts.rows import is_prompt_default

    done = [m for m in field["table"]["methods"] if m["complete"]]
    if len(done) < 2:
        return []
    ref = spec_name(field["table"]["reference_spec"])
    top = done[:2]
    twice = all(m["method"] in RECONSTRUCTION_METHODS for m in top)
    s1 = (f"To keep the next-token predictions, use {or_list([spec_name(m['spec']) for m in top])}: the lowest KL of the "
          f"{len(done)} presses measured on the dev documents" + ("; both read the context twice." if twice else "."))
    once = next((m for m in done if m["method"] not in RECONSTRUCTION_METHODS), None)
    default = next((m for m in done if is_prompt_default(m["spec"])), None)
    if once is None:
        return [s1]
    s2 = f"Reading it once, {spec_name(once['spec'])} comes closest, at {once['gm_ratio']:.2f} times {ref}'s KL"
    if default is not None and default is not once:
        s2 += f"; {spec_name(default['spec'])} keeps {default['gm_ratio']:.2f} times"
    return [s1, s2 + "."]


def field_lines(field: dict) -> list[str]:
    """The whole field's answer on the dev documents (``field``: ``peers/field_summary.json``'s content), in at most
    three sentences: which presses keep the predictions best, the closest one that reads the context once beside the
    default, and which keep a fact. Empty when fewer than two methods have complete dev rows."""
    lines = _field_predictions(field) if field.get("table") else []
    fact = _field_facts(field) if lines else None
    return lines + ([fact] if fact else [])


def _field_facts(field: dict, max_ratio: float = 0.75, mode: str = "after") -> str | None:
    """One sentence from the field's needle table: the presses whose lowest accuracy at c <= ``max_ratio`` (question
    after the compression) is highest, and, beside them, the accuracy of the press that reads the context once and
    comes closest by KL."""
    from jacap_lib.presses.registry import RECONSTRUCTION_METHODS
    from jacap_lib.experiments.names import spec_name

    block = field.get("needle_table", {}).get("modes", {}).get(mode)
    if not block:
        return None
    acc = {m: [v["accuracy"] for v in vs if v["ratio"] <= max_ratio] for m, vs in block["methods"].items()}
    ratios = {v["ratio"] for vs in block["methods"].values() for v in vs if v["ratio"] <= max_ratio}
    acc = {m: a for m, a in acc.items() if len(a) == len(ratios) and a}
    if not acc:
        return None
    key = lambda m: (min(acc[m]), sum(acc[m]))  # noqa: E731
    top = max(key(m) for m in acc)
    best = sorted(m for m in acc if key(m) == top)
    table = field["table"]
    chosen = {m["method"]: m["spec"] for m in table["methods"] + table["missing"]}  # every method's tune choice
    lo, hi = 100 * min(acc[best[0]]), 100 * max(acc[best[0]])
    rng = f"{lo:.0f} %" if lo == hi else f"{lo:.0f}–{hi:.0f} %"
    s = (f"To keep a fact, use {or_list([spec_name(chosen[m]) for m in best])}: "
         f"{'each answers' if len(best) > 1 else 'it answers'} {rng} of needle prompts at c ≤ {max_ratio:g}")
    done = [m for m in table["methods"] if m["complete"] and m["method"] not in RECONSTRUCTION_METHODS]
    once = next((m for m in done if m["method"] in acc), None)
    if once is not None and once["method"] not in best:
        a = 100 * max(acc[once["method"]])
        longer = s + f"; {spec_name(once['spec'])} answers {'at most ' if a else ''}{a:.0f} %"
        if len(longer.split()) <= MAX_WORDS:  # many keepers named: the sentence keeps its limit, the keepers first
            s = longer
    return s + "."


def _field_cost(field: dict, ladder: dict | None) -> str | None:
    """One sentence: what the second reading costs, measured: KVzip's prefill against an uncompressed one (the
    ladder's timing), and the context press's rows against KVzip's on the dev documents (the field's cost)."""
    ratios = _kvzip_prefill_ratios(ladder) if ladder else []
    if not ratios:
        return None
    s = f"The second reading has a price: KVzip's prefill costs {min(ratios):.1f}–{max(ratios):.1f} times an uncompressed one"
    rel = [c["ratio"] for b in field.get("cost", {}).get("lengths", []) for c in b["comparisons"]
           if (c["setting"], c["reference"]) == ("context", "kvzip")]
    if rel:
        s += f", and {DEFAULT_NAME['prose']}'s {min(rel):.2f}–{max(rel):.2f} times KVzip's"
    return s + "."


def answer_lines(summary: dict, needle: dict | None = None, mechanisms: list | None = None, ladder: dict | None = None,
                 field: dict | None = None, *, confirm: dict | None = None) -> list[str]:
    """The label line, then at most :data:`MAX_SENTENCES` sentences. With the whole field on the dev documents
    (``field``: ``peers/field_summary.json``, every method's tune choice beside KVzip): which presses keep the
    predictions, the closest one that reads the context once, which keeps a fact, why Jacap's Algorithm 1 behaves as
    it does, and what the second reading costs. Without it, from the first rounds' summary: which baseline keeps the
    predictions, which Jacap presses come closest, which keeps a fact, why, and what KVzip does on the tune documents.
    The label says the dev summary is exploratory. ``confirm``: the confirmatory summary (``confirm/summary.json``)
    once its KL rows are complete: then the answer is its verdicts
    (:func:`jacap_lib.report.confirm.answer_lines`) and the measured cost of the second reading, labelled
    confirmatory; while its needle run (question after compression) is not finished, the fact sentence is the dev
    documents' and the label says so."""
    if confirm is not None:
        from jacap_lib.report.confirm import answer_lines as confirm_lines
        from jacap_lib.experiments.confirm.groups import needle_done

        out = confirm_lines(confirm)
        label = "*The answer, from the confirmatory run (fresh documents, judged once by a plan committed first):*"
        if not needle_done(confirm, "after"):
            fact = _field_facts(field) if field and field.get("table") else None
            out += [fact] if fact else []
            label = ("*The answer, from the confirmatory run's KL verdicts (fresh documents, judged once by a plan "
                     "committed first); until its needle run ends, the fact sentence is from the exploratory dev "
                     "documents:*")
        out += [s for s in (_field_cost(field, ladder) if field else None,) if s]
        return [label, *out[:MAX_SENTENCES]]
    label = "*The answer, from the exploratory dev summary (documents that also chose the settings):*"
    lines = _field_predictions(field) if field and field.get("table") else []
    if lines:
        rest = (_field_facts(field), _why(mechanisms), _field_cost(field, ladder))
    else:
        lines = _predictions(summary)
        rest = (_facts(summary, needle) if needle else None, _why(mechanisms), _kvzip(ladder))
    out = lines + [s for s in rest if s]
    return [label, *out[:MAX_SENTENCES]]


def answer_text(summary: dict, needle: dict | None = None, mechanisms: list | None = None, ladder: dict | None = None,
                field: dict | None = None, *, confirm: dict | None = None) -> str:
    """:func:`answer_lines` as one MyST paragraph."""
    return " ".join(answer_lines(summary, needle, mechanisms, ladder, field, confirm=confirm)) + "\n"


def write(out_dir=None) -> Path | None:
    """Rewrite ``answer.md`` in ``out_dir`` (default ``data/results/eval``) from the summaries there: the confirmatory
    ``confirm/summary.json`` once its KL rows are complete (:func:`jacap_lib.results.loaders.load_confirm_summary`), else the dev
    ``summary.json``, ``needle_summary.json`` and the whole field (``peers/field_summary.json``), with
    ``peers/ladder_summary.json`` and the mechanism diagnostics. ``None`` (nothing written) without a dev summary."""
    from jacap_lib.results.loaders import load_confirm_summary
    from jacap_lib.results.paths import data_path

    d = Path(out_dir) if out_dir is not None else data_path("results", "eval", must_exist=False)
    source = d / "summary.json"
    if not source.exists():
        return None
    confirm = load_confirm_summary(d, part="kl")
    summary = files.read_json(source, require=("config", "families"), hint="jacap evaluate summary")
    needle_path, ladder_path = d / "needle_summary.json", d / "peers" / "ladder_summary.json"
    field_path = d / "peers" / "field_summary.json"
    needle = files.read_json(needle_path, require=("cells",)) if needle_path.exists() else None
    ladder = files.read_json(ladder_path, require=("cells",)) if ladder_path.exists() else None
    field = files.read_json(field_path, require=("comparisons",)) if field_path.exists() else None
    mech_path = d.parent.parent / "diagnostics" / "mechanisms.json"
    mechanisms = files.read_results(mech_path)[1] if mech_path.exists() else None
    path = d / FILE
    path.write_text(answer_text(summary, needle, mechanisms, ladder, field, confirm=confirm), encoding="utf-8")
    return path


def predictions_lines(summary: dict) -> list[str]:
    """The predictions chapter's answer: the dev summary in four short sentences (pure; ``summary``: ``summary.json``'s content): the best
    baseline of the cells and whether any Jacap setting beats it; the prompt press ``JacapPromptPress()``'s verdict counts;
    Algorithm 1 tuned's, with the losses where its sinks and window fill the budget; and that the dev documents are
    exploratory. Every count is read from the families picked on tune (adjusted intervals)."""
    from jacap_lib.experiments import names as N
    from jacap_lib.verdicts import words as VW
    from jacap_lib.verdicts import rows as RS
    from jacap_lib.experiments.protection import protection_fills_budget

    fams = [f for f in summary.get("families", []) if f["picked_on"] == "tune"]
    main = RS.family(summary, RS.ALGORITHM1, "tune")
    default = next((f for f in fams if f["role"].startswith("tuned ") and RS.is_prompt_default(f["setting"])), None)
    if main is None or default is None:
        raise ValueError("summary needs the families of Algorithm 1 tuned and of the prompt press JacapPromptPress() picked on "
                         "tune; run `jacap evaluate summary`")
    n_cells = len(main["rows"])
    n_docs = sorted({int(r["n"]) for r in main["rows"]})
    bases = sorted({r["baseline_spec"].split("[", 1)[0] for r in main["rows"]})
    better = sum(VW.verdict_word(r["verdict"]) == "better" for f in fams for r in f["rows"])
    base = f"the best baseline, `{bases[0]}`," if len(bases) == 1 else \
        "the best baseline of its cell (" + ", ".join(f"`{b}`" for b in bases) + "),"
    docs = "–".join(map(str, n_docs))
    which = f"the {len(fams)} Jacap settings that read the prompt once"  # the default reads it twice: field_lines
    first = (f"On the {docs} dev documents, none of {which} beats {base} in any of the {n_cells} cells." if not better
             else f"On the {docs} dev documents, {which} beat {base} in {better} (setting, cell) pairs.")
    second = f"The prompt press `JacapPromptPress()` against it: {N.counts_text(VW.verdict_counts(default['rows']))}."
    lost = [r for r in main["rows"] if VW.verdict_word(r["verdict"]) == "worse"]
    filled = sum(protection_fills_budget(main["setting"], int(r["length"]), float(r["ratio"])) for r in lost)
    third = (f"Algorithm 1 tuned: {N.counts_text(VW.verdict_counts(main['rows']))}"
             + (f"; in {filled} of its {len(lost)} losses its protection fills the budget." if filled else "."))
    fourth = ("These documents served four rounds of choices, the prompt press's among them, so the verdicts are "
              "exploratory.")
    return [first, second, third, fourth]
