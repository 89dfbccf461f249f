"""The book speaks to its readers about Jacap, not to the project: no issue numbers, no "earlier
results of this book", no local paths — in the chapter sources and in every piece of text the library
can put on a page (any string constant of ``jacap_lib`` that is not a docstring: printed lines, figure
titles, table labels, notes, warnings, exercise questions and hints).

Executed outputs (what a cell prints at build time) are checked in the rendered pages by the browser
test; this test checks the sources that produce them, so it runs without a build.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "book" / "chapters").glob("*.md")) + [ROOT / "book" / n for n in
                                                              ("index.md", "reading_note.md", "glossary.md", "references.md")]

# "issue 10", "Issue #6", "issues 6 and 10", "#10" (not a colour such as "#1f77b4" or CSS's "color: #222;")
ISSUE = re.compile(r"\bissues?\s*#?\s*\d+|(?<![\w&#/\x22\x27])(?<!: )#\d{1,4}(?![0-9A-Fa-f])(?!\s*[;}])", re.IGNORECASE)
PROJECT = re.compile(r"earlier results|results of this book|earlier version of this book|earlier run of|"
                     r"in the repository's history|no longer reads", re.IGNORECASE)
LOCAL_PATH = re.compile(r"(?<![\w.~])/(?:work|root|home|tmp|Users|mnt|private/var)/|\b[A-Za-z]:\\\\[A-Za-z]")
RULES = {"an issue number": ISSUE, "a remark about the project's history": PROJECT, "a local path": LOCAL_PATH}


def offences(text: str) -> list[str]:
    return [f"{what}: {m.group(0)!r}" for what, rx in RULES.items() for m in rx.finditer(text)]


def test_the_rules_can_fail():
    """Each rule fires on the kind of line it is for, and stays quiet on ordinary book text."""
    bad = ["Issue 10's target: a configuration", "see #10 for the details", "issues 6 and 10",
           "The earlier results of this book ran Jacap with no window.",
           "python -m jacap_lib.bench kl --out /work/i10-runs/base.jsonl",
           "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/kvpress/pipeline.py:93: RuntimeWarning",
           "C:\\\\Users\\\\me\\\\book"]
    for line in bad:
        assert offences(line), line
    good = ["colour #1f77b4 and #cde", "body { color: #222; }", "border: 1px solid #444 }", 'color = "#222"',
            "the kept set (issue of budgets)", "data/results/grid.jsonl",
            "`python -m jacap_lib.experiments.diagnostics mechanisms`", "step 10 of Algorithm 1",
            "https://github.com/jacap-book/jacap-book", "a ratio of 1/2 and 3/4"]
    for line in good:
        assert not offences(line), (line, offences(line))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_speak_to_readers(page):
    bad = [f"line {i}: {o}" for i, line in enumerate(page.read_text().splitlines(), 1) for o in offences(line)]
    assert not bad, f"{page.relative_to(ROOT)} speaks to the project, not the reader:\n" + "\n".join(bad)


def _page_strings(path: Path):
    """``(line, text)`` of every string constant of a module except docstrings (which no page shows)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


LIBRARY = sorted((ROOT / "jacap_lib").rglob("*.py"))


def test_library_page_text_speaks_to_readers():
    bad = [f"{path.relative_to(ROOT)}:{line}: {o}" for path in LIBRARY for line, text in _page_strings(path)
           for o in offences(text)]
    assert not bad, "library text that can reach a page speaks to the project:\n" + "\n".join(bad)


def test_repository_urls_on_pages_are_the_books():
    """An install line on a page names the repository of ``_config.yml`` (the one the launch buttons use)."""
    import yaml

    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    for page in PAGES:
        for found in re.findall(r"git\+(https://[^\s\"'`]+)", page.read_text()):
            assert found.rstrip("/").removesuffix(".git") == url, (page.name, found, url)
