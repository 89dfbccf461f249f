"""The confirmatory summary: the committed plan's verdicts, computed as the plan says and nothing else.

``jacap evaluate confirm-summary`` reads ``confirm/plan.json`` (:mod:`jacap_lib.experiments.confirm.plan`), the rows of
``confirm/kl.jsonl`` and ``confirm/needle.jsonl`` (:mod:`jacap_lib.experiments.confirm.run`) and the confirmatory
manifest (which work each document comes from), and writes ``confirm/summary.json``:

* per planned KL comparison (setting ``a`` against reference ``b`` in one cell): the geometric-mean KL ratio over the
  documents with its bootstrap interval over works at the plan's per-interval level
  (:func:`~jacap_lib.verdicts.intervals.work_ratio`, Bonferroni over the plan's ``m`` judged comparisons), the
  verdict that interval gives (below 1: better; above 1: worse; holding 1: no detectable difference), the
  works-level Wilcoxon p and its Holm adjustment over the judged comparisons; a comparison the plan does not judge
  (protection fills the budget) gets the plan's label. The plan's sentence for each outcome is filled in by
  :func:`jacap_lib.report.confirm.plan_sentence` (the summary holds numbers and verdicts, no prose);
* per needle mode: each needle setting's accuracy per (length, c) cell with a Wilson interval, and each judged KL
  comparison of a needle cell (the same two settings there) with the exact McNemar p on the prompts both answered,
  Holm over the cells and pairs of the mode, and the verdict of the adjusted test;
* per run setting and cell, the geometric-mean KL ratio to :data:`REFERENCE` (KVzip) over the documents both have:
  a description for the KL–retrieval plane (:func:`jacap_lib.experiments.confirm.groups.plane_points`), not a verdict;
* ``complete``: whether every planned row is there. A comparison whose rows are not all there gets no verdict
  (``"incomplete"``); the adjustment stays the plan's ``m`` whatever is complete.

KLs are floored at :data:`~jacap_lib.verdicts.intervals.KL_FLOOR` as the tune rule floors them. Nothing here chooses:
the comparisons and the level are the plan's.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.experiments.protocol import runs

__all__ = ["summarize_kl", "summarize_needle", "summarize", "to_reference", "REFERENCE", "CONFIRM_SUMMARY"]

#: the setting every run setting's KL is divided by in :func:`to_reference` (the dev plane's reference too; each entry names it)
REFERENCE = "kvzip"


def _floored(rows: list[dict]) -> dict:
    """``{(setting, length, c): {document: max(KL, KL_FLOOR)}}`` of the KL rows."""
    from jacap_lib.verdicts.intervals import KL_FLOOR

    kl: dict = {}
    for r in rows:
        kl.setdefault((r["method"], int(r["length"]), float(r["ratio"])), {})[r["doc"]] = max(float(r["kl"]), KL_FLOOR)
    return kl


def summarize_kl(plan: dict, rows: list[dict], works: dict[str, str], *, n_resamples: int | None = None,
                 seed: int | None = None) -> dict:
    """The KL part of the summary (see the module) from the plan, the KL rows and ``{document id: work}`` (every
    confirmatory document)."""
    from scipy.stats import wilcoxon

    from jacap_lib.experiments.confirm.plan import parse_cell
    from jacap_lib.verdicts.intervals import N_RESAMPLES, SEED, holm, work_ratio

    n_resamples = N_RESAMPLES if n_resamples is None else n_resamples
    seed = SEED if seed is None else seed
    level = float(plan["adjustment"]["per_interval"])
    kl = _floored(rows)
    docs = list(works)
    out = []
    for c in plan["comparisons"]:
        entry = {k: c[k] for k in ("a", "b", "what", "cell", "judged")}
        L, ratio = parse_cell(c["cell"])
        a, b = kl.get((c["a"], L, ratio), {}), kl.get((c["b"], L, ratio), {})
        have = [d for d in docs if d in a and d in b]
        entry["n_documents"] = len(have)
        if not c["judged"]:
            entry.update(verdict=c.get("label", "not judged"))
            out.append(entry)
            continue
        if len(have) < len(docs):
            entry.update(verdict="incomplete")
            out.append(entry)
            continue
        x, y = np.array([a[d] for d in have]), np.array([b[d] for d in have])
        labels = [works[d] for d in have]
        iv = work_ratio(x, y, labels, confidence=level, n_resamples=n_resamples, seed=seed)
        key = "better" if iv.high < 1 else "worse" if iv.low > 1 else "no detectable difference"
        logs = np.log(x) - np.log(y)
        per_work = np.array([logs[[w == u for w in labels]].mean() for u in dict.fromkeys(labels)])
        p = 1.0 if np.all(per_work == 0) else float(wilcoxon(per_work, alternative="two-sided").pvalue)
        entry.update(ratio=iv.estimate, low=iv.low, high=iv.high, level=level, n_works=iv.n, wilcoxon_p=p,
                     verdict=key)
        out.append(entry)
    judged = [e for e in out if "wilcoxon_p" in e]
    for e, q in zip(judged, holm([e["wilcoxon_p"] for e in judged]) if judged else []):
        e["holm_p"] = float(q)
    counts: dict = {}
    for e in out:
        if e["judged"]:
            counts.setdefault(e["what"], {}).setdefault(e["verdict"], 0)
            counts[e["what"]][e["verdict"]] += 1
    return {"comparisons": out, "m": int(plan["adjustment"]["m"]), "level": level,
            "complete": all(e["verdict"] != "incomplete" for e in out), "counts": counts,
            "n_resamples": int(n_resamples), "seed": int(seed), "to_reference": _to_reference(plan, kl, docs)}


def to_reference(plan: dict, rows: list[dict], docs: list[str]) -> list[dict]:
    """Each run setting's geometric-mean KL ratio to :data:`REFERENCE` in each planned cell (KLs floored as above),
    over the documents of ``docs`` both have; ``complete`` when that is every document. A description (the plane's
    x), not a verdict: no interval, nothing judged."""
    return _to_reference(plan, _floored(rows), docs)


def _to_reference(plan: dict, kl: dict, docs: list[str]) -> list[dict]:
    """:func:`to_reference` from the floored KLs of :func:`_floored`."""
    from jacap_lib.experiments.confirm.plan import parse_cell

    out = []
    for cell in plan["cells"]:
        L, ratio = parse_cell(cell)
        ref = kl.get((REFERENCE, L, ratio), {})
        for s in plan["run"]:
            if s == REFERENCE:
                continue
            a = kl.get((s, L, ratio), {})
            have = [d for d in docs if d in a and d in ref]
            if not have:
                continue
            gm = float(np.exp(np.mean([np.log(a[d]) - np.log(ref[d]) for d in have])))
            out.append({"setting": s, "reference": REFERENCE, "cell": cell, "n_documents": len(have),
                        "complete": len(have) == len(docs), "ratio": gm})
    return out


def summarize_needle(plan: dict, rows: list[dict]) -> dict:
    """The needle part of the summary (see the module): ``{mode: {"accuracy": [...], "pairs": [...]}}`` for every
    mode of the plan's design that has rows."""
    from jacap_lib.experiments.needle import FULL, needle_keys
    from jacap_lib.verdicts.intervals import accuracy_interval, holm, mcnemar_p, mcnemar_verdict

    design = plan["needle"]
    keys = needle_keys(tuple(float(d) for d in design["depths"]), int(design["trials"]), int(design["seed"]))
    prompts = [(float(d), int(t), k) for (d, t), k in keys.items()]
    pairs = {}  # per needle cell, the plan's judged comparisons there
    for c in plan["comparisons"]:
        if c["judged"]:
            pairs.setdefault(c["cell"], []).append((c["a"], c["b"]))
    settings = list(design.get("settings", plan["run"]))
    out = {}
    for mode in design["modes"]:
        got: dict = {}
        for r in rows:
            if r.get("mode", "after") == mode:
                got[(r["method"], int(r["length"]), float(r["ratio"]), float(r["depth"]), int(r["trial"]),
                     r["key"])] = bool(r["correct"])
        if not got:
            continue
        acc, tests = [], []
        for L in design["lengths"]:
            for ratio in design["ratios"]:
                answered = {}
                for s in [FULL, *settings]:  # the uncompressed answer is recorded at ratio 0
                    rr = 0.0 if s == FULL else float(ratio)
                    vals = [got.get((s, int(L), rr, d, t, k)) for d, t, k in prompts]
                    if any(v is None for v in vals):
                        acc.append({"setting": s, "cell": f"{L}/{ratio}", "n": sum(v is not None for v in vals),
                                    "complete": False})
                        continue
                    answered[s] = np.array(vals, dtype=float)
                    a, lo, hi = accuracy_interval(answered[s])
                    acc.append({"setting": s, "cell": f"{L}/{ratio}", "n": len(vals), "complete": True,
                                "accuracy": a, "low": lo, "high": hi})
                for x, y in pairs.get(f"{L}/{ratio}", []):
                    if x in answered and y in answered:
                        m, r = answered[x], answered[y]
                        tests.append({"a": x, "b": y, "cell": f"{L}/{ratio}", "n": int(m.size),
                                      "wins": int(np.sum((m == 1) & (r == 0))),
                                      "losses": int(np.sum((m == 0) & (r == 1))), "p": mcnemar_p(m, r)})
        for t, q in zip(tests, holm([t["p"] for t in tests]) if tests else []):
            t["holm_p"] = float(q)
            t["verdict"] = mcnemar_verdict(t["wins"], t["losses"], float(q))
        planned = sum(len(pairs.get(f"{L}/{c}", [])) for L in design["lengths"] for c in design["ratios"])
        complete = all(e["complete"] for e in acc) and len(tests) == planned
        out[mode] = {"accuracy": acc, "pairs": tests, "complete": complete,
                     "holm": "over every cell and pair of this mode"}
    return out


def summarize(plan: dict, plan_sha256: str, kl_rows: list[dict], needle_rows: list[dict], works: dict[str, str],
              **opts) -> dict:
    """The whole summary record: its configuration, the KL part and the needle part."""
    kl = summarize_kl(plan, kl_rows, works, **opts)
    needle = summarize_needle(plan, needle_rows)
    return {"config": {"plan_sha256": plan_sha256, "kl_rows": len(kl_rows), "needle_rows": len(needle_rows),
                       "documents": len(works), "works": len(set(works.values())),
                       "adjustment": plan["adjustment"], "needle_design": plan["needle"]},
            "complete": kl["complete"] and all(v["complete"] for v in needle.values())
            and set(needle) == set(plan["needle"]["modes"]),
            "kl": kl, "needle": needle}


# --------------------------------------------------------------------------------------------- the job
def _add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None,
                        help="the evaluation folder (default data/results/eval): reads confirm/plan.json and the rows "
                             "beside it, writes confirm/summary.json")


def _run(args):
    from jacap_lib.experiments.confirm.run import load_plan
    from jacap_lib.results.texts import load_corpus_manifest

    eval_dir = runs.eval_dir(args.dir, quick=False)
    plan, sha = J.prepared(load_plan, eval_dir)
    kl_rows = files.read_jsonl(eval_dir / "confirm" / "kl.jsonl")
    needle_rows = files.read_jsonl(eval_dir / "confirm" / "needle.jsonl")
    J.check(bool(kl_rows), f"{eval_dir / 'confirm' / 'kl.jsonl'}: no rows; run `jacap evaluate confirm --part kl`")
    manifest = load_corpus_manifest(which="confirm")
    works = {d["id"]: f"{d['kind']}/{d.get('group', d['id'])}" for d in manifest["documents"]}
    data = summarize(plan, sha, kl_rows, needle_rows, works)
    out = eval_dir / "confirm" / "summary.json"
    files.write_json(out, data)
    print(f"wrote {out}: {'complete' if data['complete'] else 'INCOMPLETE (rows missing)'}; "
          + "; ".join(f"{w}: " + ", ".join(f"{k} {v}" for k, v in c.items()) for w, c in data["kl"]["counts"].items()))
    return out


CONFIRM_SUMMARY = J.Job("the committed confirmatory plan's verdicts from its rows -> data/results/eval/confirm/"
                        "summary.json", _add, _run)
