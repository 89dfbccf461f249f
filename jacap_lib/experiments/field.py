"""The field on the dev documents: the context press, the default and KVzip, paired per document.

``jacap evaluate field-summary``  the dev rows of three search spaces -> ``data/results/eval/peers/field_summary.json``

Three tune choices meet here, each measured on the 48 dev documents by ``jacap evaluate dev`` in its own folder:

* ``context``: the context press's tune choice (``jacap``, :data:`~jacap_lib.experiments.protocol.rules.CONTEXT_SPACE`);
* ``kvzip``: KVzip's tune choice (kvpress's defaults, :data:`~jacap_lib.experiments.protocol.rules.PEER_SPACE`);
* ``one_prefill``: the setting ``JacapPromptPress()`` builds (``jacap_obs``'s tune choice, the first space).

Per (prompt length, c) cell each comparison of :data:`COMPARISONS` is the paired geometric-mean KL ratio with a
BCa interval simultaneous over every (comparison, cell) judged together (Bonferroni; Holm over the same for the
Wilcoxon p-values), :func:`jacap_lib.verdicts.intervals.compare_cells`. A cell where a setting's protected tokens fill
its budget (:func:`jacap_lib.experiments.protection.protection_fills_budget`) is labelled: its score chose nothing there.

The needle rows of the same three settings (``needle.jsonl`` of each folder, both modes where measured) are summed up
beside them (:func:`summarize_needle`): accuracies, and each comparison paired per prompt with an exact McNemar test.
What each setting's rows cost in CPU time, against the reference's on the same prompts, is :func:`summarize_cost`.

Beside these three, :func:`field_table` lays out every method's tune choice of every search space on the same dev
documents, each by its geometric-mean KL ratio to KVzip's per cell, and :func:`field_needle` their needle accuracies.
Those two rank and judge nothing: twenty methods in twelve cells would need an adjustment so wide that no interval
could say much, so the verdicts stay with the three settings above.

The dev documents were looked at in four earlier rounds (the first space's default was chosen after seeing them), so
these verdicts are exploratory; the three settings compared were chosen on the tune documents only and had not run
on the dev documents before.
"""
from __future__ import annotations

import math

from jacap_lib.results import files
from jacap_lib.experiments import job as J

__all__ = ["ROLES", "COMPARISONS", "FILE", "settings", "summarize_field", "summarize_needle", "summarize_cost",
           "field_table", "field_needle", "field_points", "JOB"]

#: role -> (search space, method of that space whose tune choice plays it)
ROLES = {"context": ("context", "jacap"), "kvzip": ("peers", "kvzip"), "one_prefill": ("first", "jacap_obs")}
#: (setting role, reference role): the ratio is the setting's KL over the reference's
COMPARISONS = (("context", "kvzip"), ("one_prefill", "kvzip"), ("context", "one_prefill"))
#: the comparisons whose cost the rows measure alike (both presses run their own prefill): :func:`summarize_cost`
COST_COMPARISONS = (("context", "kvzip"),)
FILE = "field_summary.json"
ALPHA = 0.05


def settings(choices_by_space: dict) -> dict:
    """``{role: spec}``: each role's tune choice from ``choices_by_space`` (``{space: choices.json's content}``)."""
    out = {}
    for role, (space, method) in ROLES.items():
        chosen = choices_by_space.get(space, {}).get("chosen", {})
        if method not in chosen:
            raise ValueError(f"the {space!r} space's choices.json has no choice for {method!r}; run "
                             f"`jacap evaluate tune --space {space}` first")
        out[role] = chosen[method]
    return out


def _kl_by_cell(rows: list[dict], spec: str) -> dict:
    """``{(length, c): {doc: KL}}`` of one setting's dev rows, KL floored at the rule's floor (as the tune scores
    floor it)."""
    from jacap_lib.verdicts.intervals import KL_FLOOR

    out: dict = {}
    for r in rows:
        if r["method"] == spec and r.get("split", "dev") == "dev":
            out.setdefault((int(r["length"]), float(r["ratio"])), {})[r["doc"]] = max(float(r["kl"]), KL_FLOOR)
    return out


def summarize_field(rows_by_space: dict, specs: dict, *, seed: int | None = None) -> dict:
    """Per comparison of :data:`COMPARISONS` and (length, c) cell the paired verdict, simultaneous over all of them.

    ``rows_by_space``: ``{space: dev rows}``; ``specs``: ``{role: spec}`` (:func:`settings`). Documents are paired
    within a cell; a cell needs at least 3 documents holding both settings. Returns ``{"m", "confidence",
    "settings", "comparisons": [{"setting", "reference", "cells": [...]}], "cells_missing", "no_higher"}``, where
    ``no_higher[comparison]`` counts the cells whose geometric-mean ratio is at most 1."""
    from jacap_lib.verdicts import intervals as V
    from jacap_lib.experiments.protection import protection_fills_budget

    cells = {role: _kl_by_cell(rows_by_space.get(ROLES[role][0], []), specs[role]) for role in ROLES}
    pairs, keys, missing = {}, [], []
    grid = sorted(set().union(*(set(c) for c in cells.values())))
    for setting, reference in COMPARISONS:
        for cell in grid:
            a, b = cells[setting].get(cell, {}), cells[reference].get(cell, {})
            docs = sorted(set(a) & set(b))
            if len(docs) < 3:
                missing.append({"setting": setting, "reference": reference, "length": cell[0], "ratio": cell[1],
                                "documents": len(docs)})
                continue
            name = f"{setting}/{reference}/{cell[0]}/{cell[1]}"
            pairs[name] = ([a[d] for d in docs], [b[d] for d in docs])
            keys.append((setting, reference, cell))
    if not pairs:
        raise ValueError("no (comparison, cell) has 3 documents holding both settings; run `jacap evaluate dev` for "
                         "each space (--space context, --space peers --methods kvzip) first")
    rows = V.compare_cells(pairs, seed=V.SEED if seed is None else seed, alpha=ALPHA)
    out = []
    for (setting, reference, (L, c)), row in zip(keys, rows):
        row = {"length": L, "ratio": c, **{k: v for k, v in row.items() if k != "cell"},
               "protection_fills": sorted(role for role in (setting, reference)
                                          if protection_fills_budget(specs[role], L, c))}
        block = next((b for b in out if b["setting"] == setting and b["reference"] == reference), None)
        if block is None:
            block = {"setting": setting, "reference": reference, "cells": []}
            out.append(block)
        block["cells"].append(row)
    no_higher = {f"{b['setting']}/{b['reference']}": {"cells": sum(r["gm_ratio"] <= 1 for r in b["cells"]),
                                                      "of": len(b["cells"])} for b in out}
    return {"m": len(pairs), "confidence": rows[0]["confidence_adjusted"], "settings": dict(specs),
            "comparisons": out, "cells_missing": missing, "no_higher": no_higher}


def summarize_needle(rows_by_space: dict, specs: dict) -> dict:
    """Per needle mode and (length, c) cell: each role's accuracy with its Wilson interval and the uncompressed one,
    and each comparison of :data:`COMPARISONS` paired per prompt (length, depth, trial, key): wins (prompts only the
    setting answers), losses, exact McNemar p, Holm over every (mode, comparison, cell) judged, and the verdict.

    ``rows_by_space``: ``{space: needle rows}`` (a role whose space has no rows is left out). Returns ``{"modes":
    {mode: {"cells": [...]}}, "m"}``; ``{"modes": {}, "m": 0}`` when no comparison has paired prompts."""
    from jacap_lib.verdicts import intervals as V
    from jacap_lib.verdicts.rows import FULL, row_mode

    def prompt(r):
        return int(r["length"]), float(r["depth"]), int(r["trial"]), str(r["key"])

    answers: dict = {}  # (mode, role, length, ratio) -> {prompt: correct}
    full: dict = {}  # (mode, length) -> {prompt: correct}, the first space's uncompressed answers first
    for role, (space, _) in ROLES.items():
        for r in rows_by_space.get(space, []):
            mode = row_mode(r)
            if r["method"] == FULL:
                full.setdefault((mode, int(r["length"])), {}).setdefault(prompt(r), bool(r["correct"]))
            elif r["method"] == specs[role]:
                answers.setdefault((mode, role, int(r["length"]), float(r["ratio"])), {})[prompt(r)] = bool(r["correct"])
    tests = []
    for mode, (setting, reference) in ((m, pair) for m in sorted({k[0] for k in answers}) for pair in COMPARISONS):
        for L, c in sorted({(k[2], k[3]) for k in answers if k[0] == mode}):
            a, b = answers.get((mode, setting, L, c), {}), answers.get((mode, reference, L, c), {})
            keys = sorted(set(a) & set(b))
            if keys:
                x, y = [int(a[k]) for k in keys], [int(b[k]) for k in keys]
                tests.append({"mode": mode, "setting": setting, "reference": reference, "length": L, "ratio": c,
                              "n": len(keys), "wins": sum(p > q for p, q in zip(x, y)),
                              "losses": sum(p < q for p, q in zip(x, y)), "p_mcnemar": V.mcnemar_p(x, y)})
    for t, p in zip(tests, V.holm([t["p_mcnemar"] for t in tests]) if tests else []):
        t["p_holm"] = float(p)
        t["verdict"] = V.mcnemar_verdict(t["wins"], t["losses"], float(p), alpha=ALPHA)
    modes: dict = {}
    for (mode, role, L, c), got in sorted(answers.items()):
        acc, lo, hi = V.accuracy_interval([int(v) for v in got.values()])
        cell = next((x for x in modes.setdefault(mode, {"cells": []})["cells"]
                     if x["length"] == L and x["ratio"] == c), None)
        if cell is None:
            ceiling = full.get((mode, L), {})
            cell = {"length": L, "ratio": c, "accuracy": {}, "comparisons": [],
                    "uncompressed": (sum(ceiling.values()) / len(ceiling)) if ceiling else None}
            modes[mode]["cells"].append(cell)
        cell["accuracy"][role] = {"accuracy": acc, "low": lo, "high": hi, "n": len(got)}
    for t in tests:
        cell = next(x for x in modes[t["mode"]]["cells"] if x["length"] == t["length"] and x["ratio"] == t["ratio"])
        cell["comparisons"].append({k: v for k, v in t.items() if k not in ("mode", "length", "ratio")})
    return {"modes": modes, "m": len(tests)}


def summarize_cost(rows_by_space: dict, specs: dict) -> dict:
    """Per prompt length, the context press's cost over KVzip's on the dev documents: the CPU seconds its rows spent
    on one (document, length) over KVzip's, geometric mean over the documents both have (:data:`COST_COMPARISONS`).

    Both presses run the real prefill inside their rows (kvpress's context manager, then the reconstruction
    passes), so a row's ``cpu_seconds`` holds the whole press: prefill, reconstruction, scoring, and the
    teacher-forced continuation both share; a score shared by several ratios is split among them
    (``scores_shared_by``), so a (document, length) costs the sum over its ratios. A replayed press (the
    one-prefill press) reuses a captured prefill whose time is not in its rows, so it is left out: its cost is
    one prefill by construction. The jobs ran on a shared machine: read the ratios as rough factors. Returns
    ``{"lengths": [{"length", "comparisons": [{"setting", "reference", "ratio", "n"}]}]}``."""
    cost: dict = {}  # role -> {(length, doc): CPU seconds}
    for role, (space, _) in ROLES.items():
        for r in rows_by_space.get(space, []):
            if r["method"] == specs[role] and r.get("split", "dev") == "dev" and r.get("cpu_seconds") is not None:
                key = (int(r["length"]), r["doc"])
                cost.setdefault(role, {})[key] = cost.get(role, {}).get(key, 0.0) + float(r["cpu_seconds"])
    out = []
    for L in sorted({k[0] for c in cost.values() for k in c}):
        block = {"length": L, "comparisons": []}
        for setting, reference in COST_COMPARISONS:
            a, b = cost.get(setting, {}), cost.get(reference, {})
            docs = sorted(k for k in set(a) & set(b) if k[0] == L and a[k] > 0 and b[k] > 0)
            if docs:
                ratio = math.exp(sum(math.log(a[k] / b[k]) for k in docs) / len(docs))
                block["comparisons"].append({"setting": setting, "reference": reference, "ratio": ratio,
                                             "n": len(docs)})
        out.append(block)
    return {"lengths": out}


def field_table(rows_by_space: dict, chosen_by_space: dict, *, reference: str = "kvzip") -> dict:
    """Every method's tune choice on the dev documents beside ``reference``'s (a method name; KVzip's choice).

    ``rows_by_space``: ``{space: dev rows}``; ``chosen_by_space``: ``{space: {method: spec}}`` (each space's
    ``choices.json`` ``chosen``). KL is floored at the rule's floor. Per method and (length, c) cell: ``gm_kl`` (the
    geometric mean over the method's documents) and ``gm_ratio`` (the geometric mean over the documents both have of
    the method's KL over the reference's); over all paired (document, cell) pairs, ``gm_ratio`` of the method and
    ``cells_lower``, how many cells' ratio is below 1. ``complete``: the method has every (document, cell) the
    reference has. Methods are sorted by their overall ratio, lowest first; those without dev rows are listed in
    ``missing``. A description, not a verdict (no interval). Returns ``{"reference", "reference_spec", "methods",
    "missing"}``."""
    owner = {m: (space, spec) for space, chosen in chosen_by_space.items() for m, spec in chosen.items()}
    if reference not in owner:
        raise ValueError(f"reference: no search space has a tune choice for {reference!r}; the choices name "
                         f"{sorted(owner)}")

    def kl_by_cell(method):
        space, spec = owner[method]
        return _kl_by_cell(rows_by_space.get(space, []), spec)

    ref = kl_by_cell(reference)
    if not ref:
        raise ValueError(f"reference: {reference!r} has no dev rows; run `jacap evaluate dev --space "
                         f"{owner[reference][0]} --methods {reference}` first")
    methods, missing = [], []
    for method, (space, spec) in owner.items():
        mine = kl_by_cell(method)
        if not mine:
            missing.append({"method": method, "space": space, "spec": spec})
            continue
        cells, logs = [], []
        for cell in sorted(mine):
            docs = sorted(set(mine[cell]) & set(ref.get(cell, {})))
            own = [math.log(v) for v in mine[cell].values()]
            pair = [math.log(mine[cell][d] / ref[cell][d]) for d in docs]
            logs += pair
            cells.append({"length": cell[0], "ratio": cell[1], "n": len(docs), "documents": len(own),
                          "gm_kl": math.exp(sum(own) / len(own)),
                          "gm_ratio": math.exp(sum(pair) / len(pair)) if pair else None})
        complete = all(set(ref[cell]) <= set(mine.get(cell, {})) for cell in ref)
        methods.append({"method": method, "space": space, "spec": spec, "complete": complete, "cells": cells,
                        "gm_ratio": math.exp(sum(logs) / len(logs)) if logs else None,
                        "cells_lower": sum(c["gm_ratio"] is not None and c["gm_ratio"] < 1 for c in cells)})
    methods.sort(key=lambda m: (m["gm_ratio"] is None, m["gm_ratio"] or 0.0, m["method"]))
    return {"reference": reference, "reference_spec": owner[reference][1], "methods": methods, "missing": missing}


def field_needle(rows_by_space: dict, chosen_by_space: dict) -> dict:
    """Every method's tune choice on the needle, per mode and c, pooled over the prompt lengths measured.

    ``rows_by_space``: ``{space: needle rows}``; ``chosen_by_space`` as :func:`field_table`. Per mode: the
    uncompressed model's accuracy per prompt length (``uncompressed``, the first space's rows first), and per method
    and c the accuracy over its prompts with a Wilson 95 % interval and ``n``. Returns ``{"modes": {mode:
    {"uncompressed": [{"length", "accuracy", "n"}], "methods": {method: [{"ratio", "accuracy", "low", "high",
    "n"}]}, "partial": {method: rows}}}}`` (lists, so no number becomes a JSON key). A method whose rows in a mode
    miss a prompt the uncompressed model answered in its own space's file (fewer rows at some prompt length and c
    of the mode, a length it has no rows at included) is still running: it is left out of that mode's ``methods``
    and ``cells`` and counted in ``partial``, so no reader pools a few prompts as if they were all."""
    from jacap_lib.verdicts import intervals as V
    from jacap_lib.verdicts.rows import FULL, row_mode

    owner = {spec: (space, m) for space, chosen in chosen_by_space.items() for m, spec in chosen.items()}
    got: dict = {}  # (mode, method, c) -> [0/1]
    per_length: dict = {}  # (mode, method, length, c) -> [0/1]
    full: dict = {}  # (mode, length) -> {prompt: 0/1}
    asked: dict = {}  # (space, mode) -> {length: prompts the uncompressed model answered in that space's file}
    for space in sorted(chosen_by_space, key=lambda s: s != "first"):  # the first space's uncompressed answers first
        for r in rows_by_space.get(space, []):
            mode = row_mode(r)
            if r["method"] == FULL:
                key = (int(r["length"]), float(r["depth"]), int(r["trial"]), str(r["key"]))
                full.setdefault((mode, int(r["length"])), {}).setdefault(key, int(bool(r["correct"])))
                asked.setdefault((space, mode), {}).setdefault(int(r["length"]), set()).add(key)
            elif owner.get(r["method"], (None,))[0] == space:
                x, m = int(bool(r["correct"])), owner[r["method"]][1]
                got.setdefault((mode, m, float(r["ratio"])), []).append(x)
                per_length.setdefault((mode, m, int(r["length"]), float(r["ratio"])), []).append(x)
    modes: dict = {}
    new = lambda: {"uncompressed": [], "methods": {}, "cells": {}, "partial": {}}  # noqa: E731
    for (mode, L), answers in sorted(full.items()):
        modes.setdefault(mode, new())["uncompressed"].append(
            {"length": L, "accuracy": sum(answers.values()) / len(answers), "n": len(answers)})
    ratios = {}  # mode -> every c measured there
    for mode, _, c in got:
        ratios.setdefault(mode, set()).add(c)
    space_of = {m: space for space, m in owner.values()}

    def still_running(mode: str, m: str) -> bool:
        """Complete = a row at every c of the mode for every prompt its own space's uncompressed model answered (every
        space's, where its own has none), at every prompt length there: a run stopped between two lengths is still
        running, not complete over fewer lengths."""
        expected = asked.get((space_of[m], mode)) or {L: k for (md, L), k in full.items() if md == mode}
        return any(len(per_length.get((mode, m, L, c), [])) < len(keys)
                   for L, keys in expected.items() for c in ratios[mode])

    partial = {(mode, m) for mode, m in {k[:2] for k in got} if still_running(mode, m)}
    for mode, m in sorted(partial):
        modes.setdefault(mode, new())["partial"][m] = sum(len(xs) for (md, mm, _), xs in got.items()
                                                          if (md, mm) == (mode, m))
    got = {k: xs for k, xs in got.items() if k[:2] not in partial}
    per_length = {k: xs for k, xs in per_length.items() if k[:2] not in partial}
    for (mode, method, c), xs in sorted(got.items()):
        acc, lo, hi = V.accuracy_interval(xs)
        block = modes.setdefault(mode, new())
        block["methods"].setdefault(method, []).append({"ratio": c, "accuracy": acc, "low": lo, "high": hi,
                                                        "n": len(xs)})
    for (mode, method, L, c), xs in sorted(per_length.items()):
        acc, lo, hi = V.accuracy_interval(xs)
        modes[mode]["cells"].setdefault(method, []).append({"length": L, "ratio": c, "accuracy": acc, "low": lo,
                                                            "high": hi, "n": len(xs), "correct": sum(xs)})
    return {"modes": modes}


def field_points(summary: dict, mode: str = "after") -> list[dict]:
    """The KL–retrieval plane of the whole field (``summary``: ``field_summary.json``): one point per (cell, method)
    with complete dev rows and needle rows in ``mode`` there, in the shape of
    :func:`jacap_lib.experiments.plane.kl_retrieval_points` (so :func:`jacap_lib.viz.plane.kl_retrieval_figure` draws
    it): x the method's geometric-mean KL ratio to KVzip on the dev documents of the cell, y its needle accuracy
    with its Wilson interval, beside the uncompressed model's."""
    from jacap_lib.experiments.names import spec_name

    table, needle = summary["table"], summary.get("needle_table", {}).get("modes", {}).get(mode)
    if not needle:
        return []
    ref = table["reference_spec"]
    full = {u["length"]: u["accuracy"] for u in needle["uncompressed"]}
    points = []
    for m in table["methods"]:
        if not m["complete"]:
            continue
        acc = {(a["length"], a["ratio"]): a for a in needle["cells"].get(m["method"], [])}
        for cell in m["cells"]:
            a = acc.get((cell["length"], cell["ratio"]))
            if a is None or cell["length"] not in full:
                continue
            points.append({
                "length": cell["length"], "ratio": cell["ratio"], "cell": f"{cell['length']}/{cell['ratio']:g}",
                "spec": m["spec"], "family": m["method"], "name": spec_name(m["spec"], legend=True),
                "prose_name": spec_name(m["spec"]), "reference": spec_name(ref, legend=True), "reference_spec": ref,
                "reference_name": spec_name(ref, legend=True), "reference_prose_name": spec_name(ref),
                "kl_ratio": cell["gm_ratio"], "n_docs": cell["n"], "split": "dev", "accuracy": a["accuracy"],
                "accuracy_low": a["low"], "accuracy_high": a["high"], "correct": a["correct"], "n_prompts": a["n"],
                "full_accuracy": full[cell["length"]]})
    return points


# --------------------------------------------------------------------------------------------- the job
def _add(parser):
    from jacap_lib.experiments import protocol as E

    E.summary_options(parser, "the evaluation folder (default data/results/eval): reads dev.jsonl and choices.json "
                              "there and in its context/ and peers/ folders, writes peers/field_summary.json")


def _load(args):
    from jacap_lib.experiments import protocol as E

    if args.quick:
        raise ValueError("--quick: the field summary reads the protocol's folders; the smoke run has no context or "
                         "peers folder")
    root = E.eval_dir(args.dir, quick=False)
    folders = {"first": root, "context": root / "context", "peers": root / "peers"}
    choices, rows, runs = {}, {}, {}
    for space, folder in folders.items():
        for name in ("choices.json", "dev.jsonl"):
            if not (folder / name).is_file():
                hint = "tune" if name == "choices.json" else "dev"
                raise ValueError(f"--dir: {folder / name} does not exist; run `jacap evaluate {hint}"
                                 f"{'' if space == 'first' else ' --space ' + space}` first")
        choices[space] = files.read_json(folder / "choices.json")
        rows[space] = files.read_jsonl(folder / "dev.jsonl")
        runs[space] = files.read_runs(folder / "dev.jsonl")
    specs = settings(choices)
    needle = {space: files.read_jsonl(folder / "needle.jsonl") for space, folder in folders.items()
              if (folder / "needle.jsonl").is_file()}
    summary = summarize_field(rows, specs, seed=args.seed)
    summary["needle"] = summarize_needle(needle, specs)
    summary["cost"] = summarize_cost(rows, specs)
    chosen = {space: c["chosen"] for space, c in choices.items()}
    summary["table"] = field_table(rows, chosen)
    summary["needle_table"] = field_needle(needle, chosen)
    return root, specs, rows, runs, summary


def _run(args):
    from jacap_lib.verdicts import intervals as V

    root, specs, rows, runs, summary = J.prepared(_load, args)
    docs = sorted({r["doc"] for space in rows.values() for r in space if r["method"] in specs.values()})
    config = {"inputs": {space: [f"{'' if space == 'first' else space + '/'}{name}" for name in ("dev.jsonl", "needle.jsonl")]
                         for space in rows},
              "command": getattr(args, "command", None), "settings": specs, "roles": {k: list(v) for k, v in ROLES.items()},
              "runs": {space: [r.get("command") for r in rs] for space, rs in runs.items()},
              "model": runs["peers"][-1].get("model") if runs["peers"] else None,
              "continuation": runs["peers"][-1].get("continuation") if runs["peers"] else None,
              "documents": docs,
              "statistics": {"primary": "geometric-mean KL ratio of the setting to the reference, paired per dev "
                                        "document", "adjustment": f"Bonferroni: each interval at 1 - {ALPHA}/m over the "
                                                                  "m (comparison, cell) pairs; Holm over the same",
                             "method": V.METHOD, "seed": V.SEED if args.seed is None else args.seed,
                             "needle": "per mode and cell, accuracy with a Wilson interval; each comparison paired per "
                                       "prompt, exact McNemar p, Holm over every (mode, comparison, cell) judged"},
              "table": "every method's tune choice of every space (table) and its needle accuracy per mode and c "
                       "(needle_table), beside KVzip's: geometric-mean KL ratios and accuracies, no interval or verdict",
              "exploratory": "the dev documents were looked at in four earlier rounds; these three settings were "
                             "chosen on the tune documents only"}
    out = root / "peers" / FILE
    files.write_json(out, {"config": config, **files.round_floats(summary)})
    print(f"wrote {out}: {summary['m']} comparisons at {summary['confidence']:.5f}")
    for block in summary["comparisons"]:
        print(f"{block['setting']} / {block['reference']}: " + "; ".join(
            f"{r['length']}/{r['ratio']} {r['gm_ratio']:.3f} [{r['gm_low_adjusted']:.3f}, {r['gm_high_adjusted']:.3f}]"
            for r in block["cells"]))
    table = summary["table"]
    print("every tune choice, KL ratio to KVzip over all cells: " + "; ".join(
        f"{m['method']} {m['gm_ratio']:.3f}{'' if m['complete'] else ' (incomplete)'}" for m in table["methods"]))
    return out


JOB = J.Job("on the dev documents, per cell, the context press's tune choice against KVzip's and against the setting "
            "JacapPromptPress() builds, and that setting against KVzip: simultaneous intervals and verdicts; beside them "
            "every method's tune choice by its KL ratio to KVzip and its needle accuracy -> "
            "data/results/eval/peers/field_summary.json", _add, _run)
