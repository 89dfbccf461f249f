"""Generate the book's notebooks from their text sources.

Every chapter is written as a MyST-Markdown notebook ``book/chapters/NN_slug.md`` (jupytext
header, ``format_name: myst``). This script writes ``book/NN_slug.ipynb`` next to ``_toc.yml``'s
entries: no outputs, no execution counts, stable JSON, so the notebook in git never diverges
from its source and Colab's launch button opens exactly what the page shows.

    python book/sync.py            # write book/*.ipynb from book/chapters/*.md
    python book/sync.py --check    # exit 1 if any notebook is missing, stale or orphaned
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

BOOK = Path(__file__).resolve().parent
SOURCES = BOOK / "chapters"


def notebook_text(source: Path) -> str:
    """The ``.ipynb`` JSON text generated from one MyST source (deterministic)."""
    nb = jupytext.read(source, fmt="md:myst")
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["colab"] = {"provenance": []}
    for i, cell in enumerate(nb.cells):
        cell.pop("id", None)
        cell["id"] = f"c{i:03d}"
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.nbformat, nb.nbformat_minor = 4, 5
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def target_for(source: Path) -> Path:
    return BOOK / f"{source.stem}.ipynb"


def sources() -> list[Path]:
    return sorted(SOURCES.glob("*.md"))


def sync(check: bool = False) -> list[str]:
    """Write (or, with ``check``, compare) every notebook. Returns the list of problems."""
    problems = []
    expected = set()
    for source in sources():
        target = target_for(source)
        expected.add(target.name)
        text = notebook_text(source)
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        if check:
            state = "missing" if current is None else "differs from its source"
            problems.append(f"{target.relative_to(BOOK.parent)} {state}; run: python book/sync.py")
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(BOOK.parent)}")
    for nb_path in sorted(BOOK.glob("*.ipynb")):
        if nb_path.name not in expected:
            problems.append(
                f"{nb_path.relative_to(BOOK.parent)} has no source book/chapters/{nb_path.stem}.md"
            )
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a notebook is not in sync")
    args = parser.parse_args(argv)
    problems = sync(check=args.check)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
