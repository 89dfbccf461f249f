"""The layering of ``jacap_lib`` stays one-way: every import (module level or inside a function) points
to the importer's own layer or a lower one, and no two modules import each other, directly or around a
loop. A new module must be given a layer in ``LAYERS`` (the table README's module list follows)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "jacap_lib"

# module prefix -> layer (low to high); the longest matching prefix wins
LAYERS = {
    "jacap_lib._checks": 0, "jacap_lib._env": 0, "jacap_lib._lazy": 0, "jacap_lib.config": 0,
    "jacap_lib.theory": 1, "jacap_lib.examples": 1, "jacap_lib.scoring": 1, "jacap_lib.stats": 1,
    "jacap_lib.selection": 1,
    "jacap_lib.hf": 2, "jacap_lib.models": 2, "jacap_lib.memory": 2,
    "jacap_lib.presses": 3, "jacap_lib.controller": 3,
    "jacap_lib.measure": 4,
    "jacap_lib.results": 5,
    "jacap_lib.viz": 6,
    "jacap_lib.widgets": 7,
    "jacap_lib.exercises": 8,
    "jacap_lib.cli": 9, "jacap_lib.__main__": 9, "jacap_lib.book": 9, "jacap_lib": 9,
}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def imports_of(name: str, path: Path, modules: dict) -> set[str]:
    """Modules of the package that ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for a in node.names:
                full = f"{stem}.{a.name}"
                found.add(full if full in modules else stem)
    out = set()
    for target in found:
        # an import of a.b.c also runs a.b's and a's __init__, but those are the packages' own business:
        # the edge that matters is to the most specific module named
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def layer_of(name: str) -> int:
    best = max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len, default=None)
    if best is None:
        raise KeyError(name)
    return LAYERS[best]


def violations(modules: dict) -> tuple[list[str], list[list[str]]]:
    graph = {m: imports_of(m, p, modules) for m, p in modules.items()}
    upward = []
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            if m.startswith(t + "."):
                continue  # a module importing its own package's __init__ (e.g. lazy re-exports)
            if layer_of(t) > layer_of(m):
                upward.append(f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})")
    # loops: ignore edges between a package's __init__ and its own submodules
    edges = {m: {t for t in ts if not t.startswith(m + ".") and not m.startswith(t + ".")} for m, ts in graph.items()}
    state, stack, loops = {}, [], []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(edges[u]):
            if state.get(v) == 1:
                loops.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return upward, loops


def test_every_module_has_a_layer():
    missing = [m for m in module_files() if not any(m == p or m.startswith(p + ".") for p in LAYERS)]
    assert not missing, f"give these modules a layer in tests/test_layers.py LAYERS: {missing}"


def test_no_upward_import_and_no_loop():
    upward, loops = violations(module_files())
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)
    assert not loops, "import loops:\n" + "\n".join(" -> ".join(c) for c in loops)


def test_checker_catches_an_upward_import_and_a_loop(tmp_path):
    pkg = tmp_path / "jacap_lib"
    (pkg / "measure").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "measure" / "__init__.py").write_text("")
    (pkg / "stats.py").write_text("def f():\n    from .measure import quality\n")  # L1 -> L4, inside a function
    (pkg / "measure" / "quality.py").write_text("from . import failures\n")
    (pkg / "measure" / "failures.py").write_text("from .quality import x\n")
    upward, loops = violations(module_files(pkg))
    assert upward == ["jacap_lib.stats (layer 1) imports jacap_lib.measure.quality (layer 4)"]
    assert sorted(loops[0][:2]) == ["jacap_lib.measure.failures", "jacap_lib.measure.quality"]


def stdlib_clashes(modules: dict) -> list[str]:
    """Modules of the package, at any depth, named like a standard-library module."""
    return [m for m in modules if m != "jacap_lib" and m.rpartition(".")[2] in sys.stdlib_module_names]


@pytest.mark.skipif(sys.version_info < (3, 10), reason="sys.stdlib_module_names is 3.10+")
def test_no_module_shadows_the_standard_library():
    """No module of the package, at any depth, bears a standard-library module's name (``results/io.py``
    read as ``io`` beside ``import io`` in the same file's readers; ``from . import io`` hides the stdlib)."""
    clash = stdlib_clashes(module_files())
    assert not clash, f"these modules shadow the standard library: {clash}"


@pytest.mark.skipif(sys.version_info < (3, 10), reason="sys.stdlib_module_names is 3.10+")
def test_shadow_check_sees_nested_modules(tmp_path):
    pkg = tmp_path / "jacap_lib"
    (pkg / "results").mkdir(parents=True)
    for f in ("__init__.py", "results/__init__.py", "results/io.py", "results/files.py"):
        (pkg / f).write_text("")
    assert stdlib_clashes(module_files(pkg)) == ["jacap_lib.results.io"]
