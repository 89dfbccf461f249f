"""The book's prose is written for students: no sentence in its text sources runs past 35 words.

Code cells (``` fences), front matter, math, headings, labels, directive fences and table rows are
not prose and are left out; what remains is split into paragraphs on blank lines, a list into its items, and
into sentences after ``.``, ``!`` or ``?`` followed by a capital, a backtick, ``*`` or ``(``.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "book" / "chapters").glob("*.md")) + [ROOT / "book" / n for n in ("index.md", "glossary.md")]
MAX_WORDS = 35

FENCE = re.compile(r"```.*?```", re.S)
FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.S)
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
INLINE_MATH = re.compile(r"\$[^$]*\$")
NOT_PROSE = re.compile(r"^\s*(#|\([^()\s]+\)=|:::|\|)")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(])")


def sentences(text: str) -> list[str]:
    """The prose sentences of a MyST page, each with its whitespace joined."""
    text = FENCE.sub(" X ", text)
    text = FRONT_MATTER.sub("", text)
    text = DISPLAY_MATH.sub(" X ", text)
    text = INLINE_MATH.sub(" X ", text)
    lines = [line for line in text.splitlines() if not NOT_PROSE.match(line)]
    out = []
    for paragraph in re.split(r"\n\s*\n|\n(?=\s*(?:[-*+]|\d+\.)\s)", "\n".join(lines)):  # paragraphs, list items
        paragraph = " ".join(paragraph.split())
        if paragraph:
            out.extend(s for s in SENTENCE_END.split(paragraph) if s.strip())
    return out


def too_long(text: str) -> list[tuple[int, str]]:
    return [(len(s.split()), s) for s in sentences(text) if len(s.split()) > MAX_WORDS]


def test_the_splitter_can_fail():
    """A 36-word sentence is flagged, a 35-word one is not, and code and math do not count."""
    words = lambda n: " ".join(["word"] * n)
    assert too_long(f"Start {words(35)}.") == [(36, f"Start {words(35)}.")]
    assert too_long(f"Start {words(34)}.") == []
    assert too_long(f"Start {words(20)}. Then {words(20)}.") == []
    assert too_long(f"Start {words(20)}.\n\nThen {words(20)}.") == []
    assert too_long(f"Start {words(10)}\n```python\n{words(40)}\n```\nend.") == []
    assert too_long(f"Start {words(10)} ${words(40)}$ end.") == []
    assert too_long(f"Start {words(10)}\n$$\n{words(40)}\n$$\nend.") == []
    assert too_long(f"# Heading {words(40)}\n\nShort one.") == []
    assert too_long(f"- item {words(20)};\n- item {words(20)}.") == []  # list items are sentences of their own
    assert too_long(f"1. item {words(20)} and\n   more {words(20)}.") == [(44, f"1. item {words(20)} and more {words(20)}.")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_sentences_are_short(page):
    bad = too_long(page.read_text())
    assert not bad, (f"{page.relative_to(ROOT)} has sentences over {MAX_WORDS} words:\n"
                     + "\n".join(f"  {n} words: {s[:80]}" for n, s in bad))
