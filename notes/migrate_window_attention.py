"""One-time migration: "observed" names one thing, the observed centre.

The anatomy's swap that centres Jacap's score on SnapKV's window attention (the attention the last 32 prompt
queries paid, ``jacap_lib.measure.instruments.JacapWindowAttentionPress``) was recorded under the key
``observed_centre``, the spec suffix ``+observed[obs_window=32]`` and the setting field ``observed``. The observed
centre is something else: ``JacapPromptPress``'s ``centre="observed"``. This renames the swap, once, in
``data/results/eval/anatomy.json``:

* the key ``observed_centre`` -> ``window_attention_centre`` (the setting's key and every per-document key);
* the spec suffix ``+observed[`` -> ``+window_attention[``;
* the setting field ``observed`` -> ``window_attention`` (the same value: the 32 queries averaged);

and writes ``data/results/eval/anatomy_name_migration.json`` (the renames, the file's sha256 before and after).
No number changes: the same measurements under the new name (the script checks that every number is equal).

    PYTHONPATH=$PWD python notes/migrate_window_attention.py
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH = ROOT / "data/results/eval/anatomy.json"
RECORD = ROOT / "data/results/eval/anatomy_name_migration.json"
KEYS = {"observed_centre": "window_attention_centre"}
SUFFIX = ("+observed[", "+window_attention[")
FIELD = ("observed", "window_attention")


def rename(obj):
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            k = KEYS.get(k, k)
            if k == FIELD[0] and isinstance(v, int) and not isinstance(v, bool):  # the swap setting's window field
                k = FIELD[1]
            out[k] = rename(v)
        return out
    if isinstance(obj, list):
        return [rename(v) for v in obj]
    if isinstance(obj, str):
        return KEYS.get(obj, obj).replace(*SUFFIX)
    return obj


def numbers(obj):
    if isinstance(obj, dict):
        names = {**KEYS, FIELD[0]: FIELD[1]}
        return [x for k in sorted(obj, key=lambda k: names.get(k, k)) for x in numbers(obj[k])]
    if isinstance(obj, list):
        return [x for v in obj for x in numbers(v)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def main() -> None:
    if RECORD.exists():
        raise SystemExit("already migrated (anatomy_name_migration.json exists)")
    before = PATH.read_bytes()
    old = json.loads(before)
    new = rename(old)
    if numbers(old) != numbers(new):
        raise SystemExit("a number changed")
    if "observed_centre" in json.dumps(new) or "+observed[" in json.dumps(new):
        raise SystemExit("an old name is left")
    new["config"]["renamed"] = ("the window-attention swap renamed once (observed_centre -> window_attention_centre, "
                                "+observed[ -> +window_attention[, field observed -> window_attention): "
                                "data/results/eval/anatomy_name_migration.json")
    text = json.dumps(new, indent=1) + "\n"
    PATH.write_text(text)
    RECORD.write_text(json.dumps({
        "description": "The anatomy's window-attention swap renamed, so that 'observed' names only the observed "
                       "centre (JacapPromptPress's centre='observed'); the same measurements under the new names.",
        "keys": KEYS, "spec_suffix": dict([SUFFIX]), "setting_field": dict([FIELD]),
        "file_sha256": {"before": hashlib.sha256(before).hexdigest(),
                        "after": hashlib.sha256(text.encode()).hexdigest()},
        "script": "notes/migrate_window_attention.py",
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
