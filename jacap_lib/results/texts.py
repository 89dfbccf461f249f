"""The text segments of the quality benchmark (``data/texts``): build them (``jacap texts``) and load
them sha256-checked.

Three kinds of text, four segments each:

* ``prose``  — short original pieces written for this book (Apache-2.0, like the repository);
  they live in ``data/texts/prose/`` and are copied as they are.
* ``docs``   — technical documentation: sections of the Python Language Reference as shipped in the
  standard library (``pydoc_data/topics.py``), Python Software Foundation License.
* ``code``   — Python standard-library source files (Python Software Foundation License).

Each segment is cut to ``MAX_CHARS`` characters at a line boundary (enough for a 1024-token prompt
plus a 64-token continuation with the SmolLM2 tokenizer). ``manifest.json`` records the source, the
licence and the sha256 of every segment; :func:`load_segments` refuses segments whose hash changed.
The docs and code segments depend on the Python version's standard library (recorded in the manifest).
"""
from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path

from . import files
from .loaders import load_manifest
from .paths import data_path, repo_path

__all__ = ["MAX_CHARS", "DOC_TOPICS", "CODE_FILES", "PROSE", "TUNE", "build_texts", "load_segments"]

MAX_CHARS = 7000
DOC_TOPICS = ["execmodel", "assignment", "import", "comparisons"]
CODE_FILES = ["textwrap.py", "heapq.py", "fractions.py", "shlex.py"]
PROSE = ["lighthouse.txt", "canals.txt", "letter.txt", "clockmaker.txt"]
# the test/tune split used to choose a Jacap variant's settings (issue 6 item 5): one segment of each
# kind is used to tune, the other three are held out
TUNE = {"prose/lighthouse", "docs/execmodel", "code/textwrap"}


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    return text[: cut if cut > limit // 2 else limit]


def _psf() -> str:
    return "Python Software Foundation License Version 2 (Python " + ".".join(map(str, sys.version_info[:3])) + ")"


def build_texts(out: Path | None = None) -> dict:
    """Write the docs and code segments and ``manifest.json`` under ``out`` (default ``data/texts``);
    the prose segments must already be in ``out/prose``. Deterministic for a given Python version."""
    from pydoc_data.topics import topics

    here = Path(out) if out is not None else data_path("texts")
    missing = [n for n in PROSE if not (here / "prose" / n).is_file()]
    if missing:
        raise FileNotFoundError(f"prose segments {missing} are missing under {here / 'prose'}")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    segs = []
    for name in PROSE:
        text = (here / "prose" / name).read_text()
        segs.append(("prose", Path(name).stem, text, f"data/texts/prose/{name}",
                     "Apache-2.0 (original text written for this book)"))
    for topic in DOC_TOPICS:
        segs.append(("docs", topic, _cut(topics[topic]), f"{stdlib}/pydoc_data/topics.py: topics[{topic!r}]", _psf()))
    for fname in CODE_FILES:
        src = (stdlib / fname).read_text()
        start = src.find("\n", len(src) // 5) + 1  # skip the licence-free module header, start in the body
        segs.append(("code", Path(fname).stem, _cut(src[start:]), f"{stdlib}/{fname} (from char {start})", _psf()))
    for kind, name, text, _, _ in segs:
        if kind != "prose":
            (here / kind).mkdir(exist_ok=True)
            (here / kind / f"{name}.txt").write_text(text)
    manifest = {
        "description": "Text segments of the quality benchmark; built by `jacap texts` (jacap_lib.results.texts)",
        "python": sys.version.split()[0],
        "max_chars": MAX_CHARS,
        "segments": [
            {"id": f"{kind}/{name}", "kind": kind, "file": f"data/texts/{kind}/{name}.txt",
             "source": source, "license": lic, "chars": len(text),
             "sha256": hashlib.sha256(text.encode()).hexdigest(),
             "split": "tune" if f"{kind}/{name}" in TUNE else "test"}
            for kind, name, text, source, lic in segs
        ],
    }
    files.write_json(here / "manifest.json", manifest)
    return manifest


def segment_ids() -> list[str]:
    return [s["id"] for s in load_manifest()["segments"]]


def load_segments(ids=None, manifest=None) -> list[dict]:
    """Segments of ``data/texts/manifest.json`` (all, or those whose id is in ``ids``), each with its
    ``text``, sha256-checked against the manifest."""
    meta = load_manifest(manifest)
    known = [s["id"] for s in meta["segments"]]
    if ids:
        missing = sorted(set(ids) - set(known))
        if missing:
            raise ValueError(f"unknown segment id(s) {missing}; valid: {known}")
    segs = []
    for seg in meta["segments"]:
        if ids and seg["id"] not in ids:
            continue
        path = repo_path(seg["file"])
        text = path.read_text()
        if hashlib.sha256(text.encode()).hexdigest() != seg["sha256"]:
            raise ValueError(f"segment {seg['id']} ({path}) does not match its sha256 in the manifest; "
                             "rebuild the texts with: jacap texts")
        segs.append(dict(seg, text=text))
    return segs
