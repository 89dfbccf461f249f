"""The frozen candidates: in one file, the settings a confirmatory evaluation runs.

``jacap evaluate candidates`` reads the tune choices of every search space (``choices.json`` of the first rounds'
methods, ``peers/choices.json`` of kvpress's newer presses; :data:`jacap_lib.experiments.protocol.rules.SPACES`) and writes
``data/results/eval/candidates.json``:

* every method's tune choice with its rule score (:data:`~jacap_lib.experiments.protocol.rules.RULE`: the mean over the
  tune documents, lengths and ratios of log max(KL, floor)) and the mean CPU-seconds of one of its tune rows;
* the Jacap-family settings eligible as the library's default, and the one the rule picks (the smallest score;
  ties to the first listed), next to what ``JacapPress()`` (the default) and ``JacapPromptPress()`` (the prompt press)
  build today and whether each is that press;
* the methods whose tune is unfinished (``pending``): while any is, ``frozen`` is false and a confirmatory plan
  must not be written from the file.

The scores of two search spaces are comparable only when both were chosen on the same tune documents (with their
sha256), prompt lengths, ratios, continuation, model, rule and KL floor; otherwise the job refuses, naming what
differs. It reads committed files only (no model), so it is cheap to rerun.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.experiments.protocol import runs
from jacap_lib.experiments.protocol import rules as P

__all__ = ["shared_ratio", "COMPARABLE", "JACAP_FAMILY_PREFIX", "choice_files", "tune_cpu_seconds", "freeze", "score_table", "CANDIDATES"]

#: the configuration keys two choices files must share for their rule scores to be compared
COMPARABLE = ("model", "lengths", "ratios", "continuation", "rule", "kl_floor", "tune_docs")
JACAP_FAMILY_PREFIX = "jacap"


def choice_files(eval_dir: Path) -> dict[str, Path]:
    """``{space: choices.json}`` of every search space (:data:`~jacap_lib.experiments.protocol.rules.SPACES`) whose file exists
    under ``eval_dir`` (the first rounds' in ``eval_dir``, another space's in ``eval_dir/<space>``)."""
    out = {}
    for space in P.SPACES:
        path = Path(eval_dir) / ("" if space == "first" else space) / "choices.json"
        if path.is_file():
            out[space] = path
    return out


def tune_cpu_seconds(rows) -> dict[str, float]:
    """``{spec: mean cpu_seconds of its tune rows}``: a replayed row's own cost (the captured prefill it shares with
    every row of its document and length left out), a real-prefill row's whole cost (KVzip's reconstruction passes
    included; a row scored once for several ratios counts its share)."""
    acc: dict = {}
    for r in rows:
        if r.get("split") == "tune" and r.get("cpu_seconds") is not None:
            acc.setdefault(r["method"], []).append(float(r["cpu_seconds"]))
    return {s: sum(v) / len(v) for s, v in acc.items()}


def _same_press(spec: str, press) -> bool:
    from jacap_lib.presses.registry import effective_options, method_options, press_from_spec

    return effective_options(method_options(press_from_spec(spec, 0.5))) == effective_options(method_options(press))


def freeze(choices: dict[str, dict], tune_rows: dict[str, list] | None = None, *, spaces: dict | None = None) -> dict:
    """The candidates record from ``{space: choices.json content}`` (and ``{space: tune rows}`` for the costs);
    every method of ``spaces`` (default :data:`~jacap_lib.experiments.protocol.rules.SPACES`) without a choice is pending.

    Raises ``ValueError`` when two spaces' choices were made under configurations whose scores cannot be compared
    (:data:`COMPARABLE`), naming the keys."""
    from jacap_lib.presses.jacap import JacapPromptPress
    from jacap_lib.presses.jacap_context import JacapPress

    if not choices:
        raise ValueError("no choices.json found: run `jacap evaluate tune` (and `--space peers`) first")
    expected = P.SPACES if spaces is None else spaces
    chosen = list(choices)  # the spaces that have choices, in the given order
    first = choices[chosen[0]]["config"]
    for s in chosen[1:]:
        diff = [k for k in COMPARABLE if not (P.same_rule(choices[s]["config"].get(k), first.get(k)) if k == "rule"
                                              else choices[s]["config"].get(k) == first.get(k))]
        if diff:
            raise ValueError(f"the tune choices of {chosen[0]!r} and {s!r} were made under different configurations "
                             f"({', '.join(diff)}); their rule scores cannot be compared: tune both alike")
    cost = {}
    for s, rows in (tune_rows or {}).items():
        cost.update(tune_cpu_seconds(rows))
    methods, pending = {}, []
    for s, table in expected.items():
        if s not in choices:
            pending += list(table)
    for s in chosen:
        data = choices[s]
        pending += [m for m in data.get("pending", []) if m not in pending]
        for m, v in data["choices"].items():
            methods[m] = {"space": s, "spec": v["chosen"], "tune_score": v["score"], "n_rows": v["n"],
                          "family": "jacap" if m.startswith(JACAP_FAMILY_PREFIX) else "baseline",
                          "tune_cpu_seconds_per_row": (round(cost[v["chosen"]], 3) if v["chosen"] in cost else None)}
    family = [{"method": m, "spec": v["spec"], "tune_score": v["tune_score"]}
              for m, v in methods.items() if v["family"] == "jacap"]
    baselines = [{"method": m, "spec": v["spec"], "tune_score": v["tune_score"]}
                 for m, v in methods.items() if v["family"] == "baseline"]
    out = {"rule": P.RULE, "spaces": {s: {"fingerprint": choices[s]["fingerprint"],
                                          "methods": list(choices[s]["choices"])} for s in chosen},
           "tune": {k: first.get(k) for k in ("lengths", "ratios", "continuation")} | {
               "tune_docs": len(first.get("tune_docs") or [])},
           "methods": methods, "pending": pending, "frozen": not pending}
    if family:
        pick = min(family, key=lambda e: e["tune_score"])  # min keeps the first listed on a tie
        def today(press):
            return {"same_press_as_chosen": _same_press(pick["spec"], press),
                    "equals": next((e["method"] for e in family if _same_press(e["spec"], press)), None)}

        out["default"] = {
            "eligible": family, "chosen": pick,
            "rule": "the Jacap-family tune choice with the smallest rule score (ties: the first listed)",
            "jacap_press_today": today(JacapPress(compression_ratio=0.5)),
            "prompt_press_today": today(JacapPromptPress(compression_ratio=0.5)),
        }
    if baselines:
        out["best_baseline"] = min(baselines, key=lambda e: e["tune_score"])
    return out


def score_table(candidates: dict) -> list[dict]:
    """Every chosen method of a candidates record, best first: ``{"method", "spec", "setting" (its short label), "family",
    "space", "tune_score", "kl_ratio"}``, ``kl_ratio`` the geometric-mean KL ratio over the tune rows to the setting
    ``JacapPromptPress()`` builds today, the prompt press (``exp(score - score of that setting)``: the rule score is a
    mean log KL over the same tune rows, so the difference of two scores is the log of their geometric-mean KL ratio),
    and ``cpu_seconds_per_row``. Raises ``ValueError`` when no chosen method is ``JacapPromptPress()``'s setting."""
    import math

    from jacap_lib.experiments.names import short_spec

    today = (candidates.get("default") or {}).get("prompt_press_today", {}).get("equals")
    if today is None or today not in candidates["methods"]:
        raise ValueError("candidates: no chosen method builds JacapPromptPress()'s setting; the table's ratios are to it")
    ref = candidates["methods"][today]["tune_score"]
    rows = [{"method": m, "spec": v["spec"], "setting": short_spec(v["spec"]), "family": v["family"], "space": v["space"],
             "tune_score": v["tune_score"], "kl_ratio": math.exp(v["tune_score"] - ref),
             "cpu_seconds_per_row": v.get("tune_cpu_seconds_per_row")} for m, v in candidates["methods"].items()]
    return sorted(rows, key=lambda r: r["tune_score"])


def shared_ratio(rows_a: list[dict], spec_a: str, rows_b: list[dict], spec_b: str) -> dict:
    """Setting ``spec_a`` (rows ``rows_a``) against ``spec_b`` (rows ``rows_b``) on the tune rows both have: the same
    (document, prompt length, c) keys. ``{"n": keys, "gm_ratio": exp(mean log KL_a - mean log KL_b), "lengths": the
    prompt lengths covered, "cells": the (length, c) cells covered}``, KLs floored at ``protocol.KL_FLOOR`` as the rule
    floors them. A screen while one of the two tunes is unfinished: a ratio over the shared rows only, not a verdict.
    Raises ``ValueError`` when the two share no row."""
    import math

    def by_key(rows, spec):
        return {(r["doc"], int(r["length"]), float(r["ratio"])): max(float(r["kl"]), P.KL_FLOOR)
                for r in rows if r["method"] == spec and r.get("split", "tune") == "tune"}

    a, b = by_key(rows_a, spec_a), by_key(rows_b, spec_b)
    keys = sorted(set(a) & set(b))
    if not keys:
        raise ValueError(f"{spec_a!r} and {spec_b!r} share no tune row (document, prompt length, c); measure both "
                         "on the same tune documents first")
    log = sum(math.log(a[k]) - math.log(b[k]) for k in keys) / len(keys)
    return {"n": len(keys), "gm_ratio": math.exp(log), "lengths": sorted({k[1] for k in keys}),
            "cells": sorted({(k[1], k[2]) for k in keys})}


# --------------------------------------------------------------------------------------------- the job
def _add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None,
                        help="the evaluation folder (default data/results/eval): reads choices.json and "
                             "peers/choices.json (and their tune.jsonl), writes candidates.json")


def _run(args):

    eval_dir = runs.eval_dir(args.dir, quick=False)
    paths = choice_files(eval_dir)
    J.check(bool(paths), f"--dir {eval_dir}: no choices.json there; run `jacap evaluate tune` first")
    choices = {s: files.read_json(p, require=("config", "fingerprint", "chosen", "choices")) for s, p in paths.items()}
    rows = {s: files.read_jsonl(p.parent / "tune.jsonl") for s, p in paths.items() if (p.parent / "tune.jsonl").is_file()}
    data = J.prepared(freeze, choices, rows)
    out = eval_dir / "candidates.json"
    files.write_json(out, data)
    d = data.get("default", {})
    print(f"wrote {out}: {len(data['methods'])} methods chosen, pending: {', '.join(data['pending']) or 'none'}; "
          f"the rule's Jacap-family default: {d.get('chosen', {}).get('method')} "
          f"(JacapPress() today {'is' if d.get('jacap_press_today', {}).get('same_press_as_chosen') else 'is not'} it)")
    return out


CANDIDATES = J.Job("every method's tune choice from every search space, the Jacap-family default the rule picks, and "
                   "what is still pending -> data/results/eval/candidates.json", _add, _run)
