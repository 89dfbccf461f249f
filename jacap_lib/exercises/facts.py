"""Exercises of the chapter labelled ``facts`` (which press keeps a fact: the needle task, the KL–retrieval plane).

Every answer is computed from the committed rows: ``needle.jsonl`` (one row per prompt, setting and ratio) and
``dev.jsonl`` (one row per dev document, setting and cell), with the settings of ``needle_summary.json``.
"""
from __future__ import annotations

import math

from ._core import Exercise, custom, number

CHAPTER = "facts"
PREDICT_CELL = (1024, 0.75)   # exercise 1: which press keeps the fact here
PAIR_CELL = (512, 0.5)        # exercise 2: Algorithm 1 tuned against Algorithm 1 as published, paired per prompt
PLANE_CELL = (1024, 0.75)     # exercise 3: one point of the plane


def _cell_rows(length: int, ratio: float) -> list[dict]:
    """The needle rows of one cell for the settings of ``needle_summary.json`` (question after the prompt)."""
    from jacap_lib.results.loaders import load_needle_rows, load_needle_summary
    from jacap_lib.verdicts.rows import row_mode

    settings = set(load_needle_summary()["config"]["settings"])
    return [{k: r[k] for k in ("method", "family", "depth", "trial", "key", "correct")}
            for r in load_needle_rows() if r["method"] in settings and r["length"] == length
            and math.isclose(float(r["ratio"]), ratio) and row_mode(r) == "after"]


def _names() -> dict:
    from jacap_lib.experiments.names import spec_name
    from jacap_lib.results.loaders import load_needle_summary

    return {s: spec_name(s, legend=True) for s in load_needle_summary()["config"]["settings"]}


def _predict_data() -> dict:
    L, c = PREDICT_CELL
    return {"length": L, "ratio": c, "rows": _cell_rows(L, c), "names": _names()}


def _keepers() -> set:
    """Every way of naming the settings with the most right answers in the cell: spec, book name, and the family
    where no other setting of the needle task shares it."""
    d = _predict_data()
    right: dict = {}
    for r in d["rows"]:
        right[r["method"]] = right.get(r["method"], 0) + bool(r["correct"])
    top = max(right.values())
    family = {r["method"]: r["family"] for r in d["rows"]}
    out = set()
    for spec in (s for s, n in right.items() if n == top):
        out |= {spec, d["names"][spec]}
        if list(family.values()).count(family[spec]) == 1:  # a family with one setting here names it unambiguously
            out.add(family[spec])
    return out


def _grade_keeper(answer, expected):
    if not isinstance(answer, str) or not answer:
        return False, "Answer with a method's name as the rows write it (the 'family' field), e.g. 'tova'."
    if answer in expected:
        return True, ""
    return False, ("Count, per method, the rows with correct == True in d['rows']; the press with the largest count "
                   "keeps the fact most often.")


def _prompt(r: dict) -> str:
    return f"{float(r['depth']):g}/{int(r['trial'])}/{r['key']}"


def _pair_data() -> dict:
    from jacap_lib.experiments.protocol import rules as P
    from jacap_lib.results.loaders import load_eval_choices

    L, c = PAIR_CELL
    tuned = load_eval_choices()["chosen"]["jacap_prompt"]
    rows = _cell_rows(L, c)
    pick = lambda spec: {_prompt(r): bool(r["correct"]) for r in rows if r["method"] == spec}  # noqa: E731
    return {"length": L, "ratio": c, "a": pick(tuned), "b": pick(P.PAPER_PRESET), "a_spec": tuned,
            "b_spec": P.PAPER_PRESET}


def _mcnemar():
    from scipy import stats

    d = _pair_data()
    only_a = sum(d["a"][k] and not d["b"][k] for k in d["a"])
    only_b = sum(d["b"][k] and not d["a"][k] for k in d["a"])
    if only_a + only_b == 0:
        return 1.0
    return float(stats.binomtest(min(only_a, only_b), only_a + only_b, 0.5).pvalue)


def _plane_data() -> dict:
    from jacap_lib.results.loaders import load_eval_choices, load_eval_rows

    L, c = PLANE_CELL
    ref = load_eval_choices()["best_baseline"]["cells"][f"{L}/{c:g}"]["spec"]
    rows = [r for r in load_eval_rows("dev") if r["length"] == L and math.isclose(float(r["ratio"]), c)]
    pick = lambda m: {r["doc"]: r["kl"] for r in rows if r["method"] == m}  # noqa: E731
    return {"length": L, "ratio": c, "a": pick("keydiff"), "b": pick(ref), "reference": ref}


def _plane_x():
    from jacap_lib.experiments.plane import cell_points, kl_retrieval_points

    return next(p["kl_ratio"] for p in cell_points(kl_retrieval_points(probe={}), *PLANE_CELL)
                if p["spec"] == "keydiff")


EXERCISES = [
    Exercise(
        "Predict which press keeps the fact most often at prompt 1024, c = 0.75; then check it from the rows. "
        "d = exercises.data('facts.1'): d['rows'] holds one row per (prompt, setting) of that cell, question asked "
        "after the compressed prompt, with 'method' (the spec), 'family' (the method's name) and 'correct'; "
        "d['names'] gives the book's name of each spec. Answer with the family of the press that answers the "
        "most prompts right (or its spec, or its book name).",
        _keepers,
        custom(_grade_keeper, "the family, spec or book name of any setting tied for the most right answers"),
        data=_predict_data),
    Exercise(
        "d = exercises.data('facts.2'): d['a'] and d['b'] map each needle prompt of prompt 512, c = 0.5 to whether "
        "Algorithm 1 tuned (a) and Algorithm 1 as published (b) answered it right. Compute the exact paired "
        "(McNemar) p-value: the two-sided binomial test, with p = 1/2, of the prompts only one of the two answered.",
        _mcnemar,
        number(rtol=1e-6, hint="Count n_a = prompts only a answered and n_b = prompts only b answered; then "
                               "scipy.stats.binomtest(min(n_a, n_b), n_a + n_b, 0.5).pvalue. The prompts both or "
                               "neither answered carry no information."),
        data=_pair_data),
    Exercise(
        "d = exercises.data('facts.3'): d['a'] and d['b'] hold the per-document KL of keydiff and of the cell's best "
        "baseline by KL (d['reference']) on the dev documents at prompt 1024, c = 0.75. Compute keydiff's x in the "
        "KL–retrieval plane: the geometric mean over the documents of a[doc] / b[doc].",
        _plane_x,
        number(rtol=1e-6, hint="exp(mean(log(a[doc] / b[doc]))) over the documents; not mean(a) / mean(b)."),
        data=_plane_data),
]
