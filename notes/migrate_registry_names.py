"""One-time migration: the registry names follow the library's default (recorded in
data/results/eval/name_migration.json).

Before: ``jacap`` built ``JacapPromptPress`` (the prompt press) and ``jacap_context`` built ``JacapPress`` (the
default). After: ``jacap`` builds the default ``JacapPress``, ``jacap_prompt`` the prompt press; the prompt press's
aliases follow it (``jacap_adakv`` -> ``jacap_prompt_adakv``, ``jacap_wo`` -> ``jacap_prompt_wo``). Every other
name is unchanged.

What it does, once, to every committed results file under data/ (JSON, JSONL, Markdown):

* every recorded spec (a string ``name`` or ``name[options]``, as a value or a key) with an old name gets the new
  name, options untouched; specs inside generated prose (sentences, findings) too;
* left as they were: the commands that were run (``command``: what was typed then), JacapPress's option
  ``summary="jacap"`` (a value of the option, not a name), the candidate list's family label ``"jacap"`` and the
  decode-time controller's ``"jacap"`` event label (Jacap's score against the window fallback);
* every protocol fingerprint recomputed from the renamed configuration (``protocol.fingerprint``), and every
  recorded fingerprint and file sha256 mapped old -> new (to a fixed point: a file that records another's sha256
  changes in turn);
* each old spec is checked to build, under its new name, the press it was measured as (the recorded options of
  every setting equal the new spec's, ``registry.effective_options``).

    PYTHONPATH=$PWD python notes/migrate_registry_names.py
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
RENAMES = {"jacap": "jacap_prompt", "jacap_context": "jacap", "jacap_adakv": "jacap_prompt_adakv",
           "jacap_wo": "jacap_prompt_wo"}
WHEN = "2026-12-07"
SPEC = re.compile(r"^([A-Za-z0-9_]+)(\[.*\])?$")
_OLD = "|".join(sorted(RENAMES, key=len, reverse=True))
IN_PROSE = [re.compile(r"(?<![\w./\-])(" + _OLD + r")(?=\[)"),            # jacap[...] in a sentence
            re.compile(r"(?<=[\"'`])(" + _OLD + r")(?=[\"'`])"),           # `jacap` / "jacap"
            re.compile(r"(?<![\w./\-])(jacap_adakv|jacap_context|jacap_wo)(?![\w])"),  # the longer old names anywhere
            re.compile(r"(?<=the bare specs )(jacap)(?=, )")]
# (file name, key) whose string values are not registry names
NOT_NAMES = {("*", "summary"), ("*", "command"), ("candidates.json", "family"), ("serving_run.json", "method")}
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def renamed_spec(s: str) -> str:
    m = SPEC.match(s)
    if m and m.group(1) in RENAMES:
        return RENAMES[m.group(1)] + (m.group(2) or "")
    return s


def renamed_prose(s: str) -> str:
    for pat in IN_PROSE:
        s = pat.sub(lambda m: RENAMES[m.group(1)], s)
    return s


def renamed(x, fname: str, key: str | None = None):
    if isinstance(x, dict):
        return {renamed_spec(k): renamed(v, fname, k) for k, v in x.items()}
    if isinstance(x, list):
        return [renamed(v, fname, key) for v in x]
    if isinstance(x, str):
        if ("*", key) in NOT_NAMES or (fname, key) in NOT_NAMES:
            return x
        out = renamed_spec(x)
        return out if out != x else renamed_prose(x)
    return x


def mapped(x, mapping: dict):
    if isinstance(x, dict):
        return {k: mapped(v, mapping) for k, v in x.items()}
    if isinstance(x, list):
        return [mapped(v, mapping) for v in x]
    if isinstance(x, str) and x in mapping:
        return mapping[x]
    return x


def dump_format(text: str, data) -> dict | None:
    """The json.dumps options that write ``data`` back as ``text`` exactly (None: none found)."""
    for indent in (1, None, 2):
        for ascii_ in (True, False):
            if json.dumps(data, indent=indent, ensure_ascii=ascii_) + "\n" == text:
                return {"indent": indent, "ensure_ascii": ascii_}
            if json.dumps(data, indent=indent, ensure_ascii=ascii_) == text:
                return {"indent": indent, "ensure_ascii": ascii_, "no_newline": True}
    return None


class File:
    def __init__(self, path: Path):
        self.path, self.text = path, path.read_text()
        self.kind = path.suffix
        if self.kind == ".json":
            self.data = json.loads(self.text)
            self.fmt = dump_format(self.text, self.data)
            assert self.fmt is not None, f"{path}: cannot round-trip its JSON"
        elif self.kind == ".jsonl":
            self.lines = self.text.splitlines()
            self.data = [json.loads(l) if l.strip() else None for l in self.lines]
            for l, d in zip(self.lines, self.data):
                assert d is None or json.dumps(d) == l or json.dumps(d, ensure_ascii=False) == l, f"{path}: a line does not round-trip"
            self.ascii = all(d is None or json.dumps(d) == l for l, d in zip(self.lines, self.data))

    def apply(self, f):
        if self.kind == ".json":
            self.data = f(self.data)
        elif self.kind == ".jsonl":
            self.data = [None if d is None else f(d) for d in self.data]
        else:
            self.text = f(self.text) if isinstance(self.text, str) else self.text

    def render(self) -> str:
        if self.kind == ".json":
            out = json.dumps(self.data, indent=self.fmt["indent"], ensure_ascii=self.fmt["ensure_ascii"])
            return out if self.fmt.get("no_newline") else out + "\n"
        if self.kind == ".jsonl":
            lines = ["" if d is None else json.dumps(d, ensure_ascii=self.ascii) for d in self.data]
            return "\n".join(lines) + ("\n" if self.text.endswith("\n") else "")
        return self.text


def fingerprints(x, out: dict):
    """Old -> new protocol fingerprints of every ``{"config"|"protocol": cfg, "fingerprint": fp}`` pair in ``x``
    (old: the recorded one, checked against the configuration before the rename)."""
    from jacap_lib.experiments.protocol import rules as P
    if isinstance(x, dict):
        for ck in ("config", "protocol"):
            if isinstance(x.get(ck), dict) and isinstance(x.get("fingerprint"), str) and "search_space" in x[ck]:
                out[x["fingerprint"]] = P.fingerprint(x[ck])
        for v in x.values():
            fingerprints(v, out)
    elif isinstance(x, list):
        for v in x:
            fingerprints(v, out)


def main():
    paths = sorted(p for p in DATA.rglob("*") if p.suffix in (".json", ".jsonl", ".md") and "texts" not in p.parts)
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    files = {p: File(p) for p in paths}
    for p, f in files.items():
        if f.kind in (".json", ".jsonl"):
            f.apply(lambda d, n=p.name: renamed(d, n))
        else:
            f.text = "\n".join(renamed_prose(l) for l in f.text.split("\n"))
    fps: dict = {}
    for f in files.values():
        if f.kind in (".json", ".jsonl"):
            fingerprints(f.data, fps)
    fps = {k: v for k, v in fps.items() if k != v}
    for f in files.values():
        if f.kind in (".json", ".jsonl"):
            f.apply(lambda d: mapped(d, fps))
    # file sha256s, to a fixed point
    shas: dict = {}
    for _ in range(10):
        changed = False
        now = {p: hashlib.sha256(f.render().encode()).hexdigest() for p, f in files.items()}
        for p in paths:
            if now[p] != before[p] and shas.get(before[p]) != now[p]:
                shas[before[p]] = now[p]
                changed = True
        chain = {**shas, **{old: now[p] for p in paths for old in [before[p]] if old in shas}}
        for f in files.values():
            if f.kind in (".json", ".jsonl"):
                f.apply(lambda d: mapped(d, chain))
        if not changed:
            break
    n = 0
    for p, f in files.items():
        new = f.render()
        if new != p.read_text():
            p.write_text(new)
            n += 1
    record = {"description": "The registry names follow the library's default: each old name, the name it has now "
                             "(a recorded spec keeps its options), per the one-time rename of " + WHEN + ".",
              "renames": RENAMES,
              "left_as_recorded": "the commands that were run (command), JacapPress's option summary='jacap', the "
                                  "candidate list's family label 'jacap', the controller's event label 'jacap'",
              "fingerprints": fps, "file_sha256": {k: v for k, v in shas.items()},
              "script": "notes/migrate_registry_names.py"}
    out = DATA / "results" / "eval" / "name_migration.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{n} files rewritten; {len(fps)} fingerprints and {len(shas)} file sha256 mapped -> {out}")


if __name__ == "__main__":
    main()
