"""Build the text segments of the quality benchmark (run from the repo root; deterministic, offline).

Three kinds of text, four segments each:

* ``prose``  — short original pieces written for this book (Apache-2.0, like the repository);
  they live in ``data/texts/prose/`` and are copied as they are.
* ``docs``   — technical documentation: sections of the Python Language Reference as shipped in the
  standard library (``pydoc_data/topics.py``), Python Software Foundation License.
* ``code``   — Python standard-library source files (Python Software Foundation License).

Each segment is cut to ``MAX_CHARS`` characters at a line boundary (enough for a 1024-token prompt
plus a 64-token continuation with the SmolLM2 tokenizer). ``manifest.json`` records the source, the
licence and the sha256 of every segment; the benchmark refuses segments whose hash changed.

    python data/texts/build_texts.py
"""
from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_CHARS = 7000
PSF = "Python Software Foundation License Version 2 (Python " + ".".join(map(str, sys.version_info[:3])) + ")"
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


def main() -> None:
    from pydoc_data.topics import topics

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name in PROSE:
        text = (HERE / "prose" / name).read_text()
        out.append(("prose", Path(name).stem, text, f"data/texts/prose/{name}",
                    "Apache-2.0 (original text written for this book)"))
    docs_dir = HERE / "docs"
    docs_dir.mkdir(exist_ok=True)
    for topic in DOC_TOPICS:
        text = _cut(topics[topic])
        (docs_dir / f"{topic}.txt").write_text(text)
        out.append(("docs", topic, text, f"{stdlib}/pydoc_data/topics.py: topics[{topic!r}]", PSF))
    code_dir = HERE / "code"
    code_dir.mkdir(exist_ok=True)
    for fname in CODE_FILES:
        src = (stdlib / fname).read_text()
        start = src.find("\n", len(src) // 5) + 1  # skip the licence-free module header, start in the body
        text = _cut(src[start:])
        (code_dir / f"{Path(fname).stem}.txt").write_text(text)
        out.append(("code", Path(fname).stem, text, f"{stdlib}/{fname} (from char {start})", PSF))
    manifest = {
        "description": "Text segments of the quality benchmark; built by data/texts/build_texts.py",
        "python": sys.version.split()[0],
        "max_chars": MAX_CHARS,
        "segments": [
            {"id": f"{kind}/{name}", "kind": kind, "file": f"data/texts/{kind}/{name}.txt",
             "source": source, "license": lic, "chars": len(text),
             "sha256": hashlib.sha256(text.encode()).hexdigest(),
             "split": "tune" if f"{kind}/{name}" in TUNE else "test"}
            for kind, name, text, source, lic in out
        ],
    }
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"wrote {len(out)} segments to {HERE}")


if __name__ == "__main__":
    main()
