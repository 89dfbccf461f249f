"""One-time migration: the context space's settings written out in full.

``jacap_context``'s first two tune rounds recorded short specs (``jacap_context[window=16]``), which mean "the
library's defaults with this changed"; every other Jacap setting of the protocol is written out in full so that its
meaning cannot move with the defaults. This rewrites, once, in ``data/results/eval/context``:

* ``tune.jsonl``: each row's ``method`` -> the written-out spec of the press it was measured as
  (``registry.written_out``, checked equal to ``protocol._context`` of the short spec's options, and the press
  options each run recorded checked equal to the new spec's);
* ``tune.config.json``: each run's search space and settings keys renamed the same way, its fingerprint recomputed
  from the renamed configuration (``protocol.fingerprint``);
* ``spec_migration.json``: the map, the fingerprints old -> new, the reason.

It ran once, on 2026-12-04, while ``JacapPress``'s defaults were still
``protocol.CONTEXT_AS_FIRST_TUNED`` (window 0; now the preset ``context_as_first_tuned``). Its defaults have since become the tune choice (window 64), so
``written_out`` of an old short spec now differs from the setting it named, and a rerun stops at its check
(the migrated files need no rerun: their specs are written out and mean the same under any defaults).

``choices.json`` and ``candidates.json`` are then rewritten by their jobs (``jacap evaluate choices --space context``,
``jacap evaluate candidates``). Nothing measured changes: the same rows under their full names.

    PYTHONPATH=$PWD python notes/migrate_context_specs.py
"""
from __future__ import annotations

import json
from pathlib import Path

from jacap_lib.presses.registry import effective_options, method_options, parse_method, press_from_spec, written_out
from jacap_lib.results import files
from jacap_lib.experiments.protocol import rules as P

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "data/results/eval/context"
REASON = ("the context space's first two rounds recorded short specs (jacap_context[window=16]: the library's "
          "defaults with one option changed), whose meaning would move with the defaults; each is renamed to the "
          "written-out spec of the press it was measured as (protocol.CONTEXT_AS_FIRST_TUNED changed by its options), "
          "the same rows under their full names; fingerprints recomputed from the renamed configurations")


def main() -> None:
    rows_path, config_path = FOLDER / "tune.jsonl", FOLDER / "tune.config.json"
    if (FOLDER / "spec_migration.json").exists():
        raise SystemExit("already migrated (spec_migration.json exists)")
    rows = files.read_jsonl(rows_path)
    old = sorted({r["method"] for r in rows})
    mapping = {}
    for spec in old:
        new = written_out(spec)
        if new != P._context(**parse_method(spec)[1]):
            raise SystemExit(f"{spec}: written_out {new} differs from protocol._context")
        mapping[spec] = new
    config = json.loads(config_path.read_text())
    fingerprints = {}
    for run in config["runs"]:
        for spec, then in (run.get("settings") or {}).items():  # each run measured the press the new spec builds
            now = method_options(press_from_spec(mapping.get(spec, spec), float(then["compression_ratio"])))
            if effective_options(json.loads(json.dumps(now))) != effective_options(then):
                raise SystemExit(f"{spec}: the recorded options differ from those of {mapping.get(spec, spec)}")
        run["settings"] = {mapping.get(k, k): v for k, v in run["settings"].items()}
        proto = run["protocol"]
        proto["search_space"] = {m: [mapping.get(s, s) for s in v] for m, v in proto["search_space"].items()}
        new_fp = P.fingerprint(proto)
        fingerprints[run["fingerprint"]] = new_fp
        run["fingerprint"] = new_fp
    for r in rows:
        r["method"] = mapping[r["method"]]
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    files.write_json(config_path, config)
    files.write_json(FOLDER / "spec_migration.json", {
        "description": "What each recorded spec of the context space's tune files meant, written out in full: the "
                       "one-off migration of 2026-12-04 (tune.jsonl's method field, tune.config.json's search spaces, "
                       "settings and fingerprints).",
        "reason": REASON, "eval": mapping, "fingerprints": fingerprints, "rows": len(rows)})
    print(f"{len(rows)} rows, {len(mapping)} specs renamed, {len(fingerprints)} fingerprints")


if __name__ == "__main__":
    main()
