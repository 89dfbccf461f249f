"""The chapters name presses the way the registry builds them: every registry name a page writes (in prose or in
a cell) is one :func:`~jacap_lib.presses.registry.build_press` builds, ``build_press("x", ...)`` names a method the
registry has, and no sentence gives the default's name to the prompt press or calls the default ``JacapPress`` a
kvpress ``ScorerPress`` (it scores after the prefill, across layers and heads)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "book" / "chapters").glob("*.md")) + [ROOT / "book" / n for n in ("index.md", "glossary.md")]

#: a backticked registry-style name: ``jacap``, ``jacap_prompt``, ``jacap_prompt[window=0]`` (a spec), ...
NAME = re.compile(r"`(jacap(?:_[a-z0-9]+)*)(?:\[[^`\]]*\])?`")
BUILD = re.compile(r"build_press\(\s*[\"']([a-z_0-9]+)")
#: "the default `JacapPromptPress`", "default press `jacap_prompt`": the prompt press under the default's name
PROMPT_AS_DEFAULT = re.compile(r"\bdefault\b[^.`]{0,24}`(?:JacapPromptPress(?:\(\))?|jacap_prompt)`", re.IGNORECASE)
#: "`JacapPress` is a kvpress `ScorerPress`"
DEFAULT_AS_SCORER = re.compile(r"`JacapPress(?:\(\))?`\s+is\s+(?:a|one)\s+(?:kvpress\s+)?`?ScorerPress`?")
NOT_NAMES = {"jacap_lib"}


def _library_name(name: str) -> bool:
    """A name of the library itself (``jacap_lib``, the scorer ``jacap_scores``), not of a press."""
    import jacap_lib

    return name in NOT_NAMES or hasattr(jacap_lib, name)


def _prose(text: str) -> str:
    """The page without its code cells and fenced blocks (what a reader reads as sentences)."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def offences(text: str, methods: set[str]) -> list[str]:
    out = [f"`{m}` is not a registry name" for m in NAME.findall(_prose(text)) if m not in methods and not _library_name(m)]
    out += [f"build_press({m!r}) names no registry method" for m in BUILD.findall(text) if m not in methods]
    out += [f"the prompt press named the default: {m.group(0)!r}" for m in PROMPT_AS_DEFAULT.finditer(_prose(text))]
    out += [f"the default called a ScorerPress: {m.group(0)!r}" for m in DEFAULT_AS_SCORER.finditer(_prose(text))]
    return out


@pytest.fixture(scope="module")
def methods():
    from jacap_lib.presses.registry import list_methods

    return set(list_methods())


def test_the_rules_can_fail(methods):
    bad = ["Use `jacap_adakv` here.", "```python\nbuild_press('jacap_wo', 0.5)\n```",
           "The default `JacapPromptPress()` reads the prompt once.", "`JacapPress` is a kvpress `ScorerPress`."]
    for text in bad:
        assert offences(text, methods), text
    good = ["`jacap` builds `JacapPress`; `jacap_prompt[window=0]` is a spec.", "`jacap_lib` is the library.",
            "The default `JacapPress()` and the prompt press `JacapPromptPress()`.",
            "`JacapPromptPress` is a kvpress `ScorerPress`.", "```python\nbuild_press('jacap_prompt', 0.5)\n```"]
    for text in good:
        assert not offences(text, methods), (text, offences(text, methods))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_name_presses_as_the_registry_builds_them(page, methods):
    bad = offences(page.read_text(), methods)
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)
