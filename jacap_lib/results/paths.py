"""The one locator of ``data/``: every results file, text segment and benchmark file is found here.

``data_dir()`` is, in this order,

1. the folder named by the environment variable ``JACAP_DATA`` (a Colab install or an installed
   package pointing at a clone: ``JACAP_DATA=/content/jacap/data``);
2. ``data/`` next to the ``jacap_lib`` package (an editable install or a clone on ``sys.path``);
3. ``data/`` in the working directory or the nearest of its ancestors that has one
(2 and 3 count only a folder holding ``texts/manifest.json``, so an unrelated ``data/`` is skipped).

Nothing else in the library builds a path to ``data/``.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DATA_ENV", "data_dir", "data_path", "repo_path", "SUBDIRS"]

DATA_ENV = "JACAP_DATA"
# the folders of data/ and what each holds
SUBDIRS = {
    "results": "the evaluation protocol (eval/: tune and dev rows, choices, summary, needle retrieval)",
    "decomposition": "error decomposition and failure demos (one JSON per part)",
    "live": "the live-eviction chapter's KL table",
    "serving": "the serving chapter's Algorithm 2 run",
    "texts": "the text segments of the quality benchmark (manifest.json + segment files)",
    "bench": "speed benchmarks (benchmarks/*.py, `jacap time`)",
    "diagnostics": "Jacap's mechanism diagnostics and query-statistic errors (jacap diagnose)",
}


def _is_book_data(path: Path) -> bool:
    """A ``data/`` folder of this book (every clone has the benchmark texts' manifest), not any ``data/``."""
    return (path / "texts" / "manifest.json").is_file()


def _package_data() -> Path:
    return Path(__file__).resolve().parents[2] / "data"


def data_dir() -> Path:
    """The ``data/`` folder (see the module docstring for the search order)."""
    env = os.environ.get(DATA_ENV, "").strip()
    if env:
        path = Path(env).expanduser().resolve()
        if not path.is_dir():
            raise FileNotFoundError(f"{DATA_ENV}={env!r} is not a folder; point it at the data/ folder of a clone "
                                    "of the book's repository, or unset it")
        return path
    here = _package_data()
    if _is_book_data(here):
        return here
    cwd = Path.cwd().resolve()
    for root in (cwd, *cwd.parents):
        if _is_book_data(root / "data"):
            return root / "data"
    raise FileNotFoundError(
        f"no data/ folder next to jacap_lib ({here.parent}) or above the working directory ({cwd}); clone the "
        f"book's repository (the committed results live there) and set {DATA_ENV}=<clone>/data")


def data_path(*parts: str, must_exist: bool = True) -> Path:
    """``data/<parts...>``; with ``must_exist`` a missing file raises ``FileNotFoundError`` naming it."""
    path = data_dir().joinpath(*parts)
    if must_exist and not path.exists():
        raise FileNotFoundError(f"{path} does not exist (looked under {DATA_ENV} / the clone's data/ folder)")
    return path


def repo_path(relative: str) -> Path:
    """A path recorded relative to the repository root (``"data/texts/prose/x.txt"``) resolved under
    :func:`data_dir` (so it follows ``JACAP_DATA``)."""
    rel = Path(relative)
    if rel.is_absolute():
        return rel
    if rel.parts and rel.parts[0] == "data":
        return data_dir().joinpath(*rel.parts[1:])
    return data_dir().parent / rel
