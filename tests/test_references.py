"""Every dotted ``jacap_lib.<module>[.<name>]`` the library, the chapters, the README and the benchmarks write names
something that exists: a module that imports and, after it, attributes that resolve (a reference to a removed or
moved module fails here instead of reaching a reader)."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (sorted((ROOT / "jacap_lib").rglob("*.py")) + sorted((ROOT / "book" / "chapters").glob("*.md"))
           + sorted((ROOT / "benchmarks").glob("*.py")) + [ROOT / "README.md"])
REF = re.compile(r"jacap_lib(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolves(ref: str) -> bool:
    """Whether the longest importable prefix of ``ref`` has the rest as attributes."""
    parts = ref.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for name in parts[k:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_the_check_can_fail():
    assert resolves("jacap_lib.results.loaders.load_mechanisms") and resolves("jacap_lib.cache")
    assert not resolves("jacap_lib.experiments.diagnostics.load_mechanisms")  # the stale name this test found
    assert not resolves("jacap_lib.nosuch") and not resolves("jacap_lib.bench.kl")


def test_every_dotted_reference_resolves():
    refs: dict[str, set] = {}
    for path in SOURCES:
        for ref in REF.findall(path.read_text(encoding="utf-8")):
            refs.setdefault(ref.rstrip("."), set()).add(str(path.relative_to(ROOT)))
    stale = {r: sorted(p) for r, p in refs.items() if not resolves(r)}
    assert not stale, stale
