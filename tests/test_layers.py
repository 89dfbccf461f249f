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
    "jacap_lib.presses": 3, "jacap_lib.controller": 3, "jacap_lib.cache": 3,
    "jacap_lib.measure": 4,
    "jacap_lib.results": 5,
    "jacap_lib.verdicts": 6,
    "jacap_lib.experiments": 7,
    "jacap_lib.viz": 8,
    "jacap_lib.widgets": 9,
    "jacap_lib.exercises": 10,
    "jacap_lib.report": 11,
    "jacap_lib.cli": 12, "jacap_lib.__main__": 12, "jacap_lib.book": 12, "jacap_lib": 12,
}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def lazy_exports(modules: dict) -> dict[str, dict[str, str]]:
    """Per package, its lazy public names (PEP 562, :mod:`jacap_lib._lazy`): the dict literal in its
    ``__init__.py`` mapping each name to the module that defines it (``jacap_lib/__init__.py``'s
    ``_EXPORTS``). ``from jacap_lib import X`` is an import of that module, not of the package."""
    out = {}
    for name, path in modules.items():
        if path.name != "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict) and node.value.keys:
                items = list(zip(node.value.keys, node.value.values))
                if all(isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Constant)
                       and isinstance(v.value, str) and v.value in modules for k, v in items):
                    out.setdefault(name, {}).update({k.value: v.value for k, v in items})
    return out


def imports_of(name: str, path: Path, modules: dict, exports: dict | None = None) -> set[str]:
    """Modules of the package that ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``; a lazy
    public name of a package, ``from jacap_lib import X`` or ``import jacap_lib; jacap_lib.X``, counts as
    the module that defines ``X``, from ``exports`` = :func:`lazy_exports`)."""
    exports = lazy_exports(modules) if exports is None else exports
    is_pkg = path.name == "__init__.py"
    found = set()
    tree = ast.parse(path.read_text())
    bound = {}  # local name -> package imported whole (``import jacap_lib [as jl]``)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
            bound.update({a.asname or a.name: a.name for a in node.names if a.name in exports})
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for a in node.names:
                full = f"{stem}.{a.name}"
                if full in modules:
                    found.add(full)
                elif a.name in exports.get(stem, {}):
                    found.add(exports[stem][a.name])
                else:
                    found.add(stem)
    for node in ast.walk(tree):  # jacap_lib.X through a package imported whole
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            found.add(exports[bound[node.value.id]].get(node.attr, bound[node.value.id]))
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
    exports = lazy_exports(modules)
    graph = {m: imports_of(m, p, modules, exports) for m, p in modules.items()}
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


def test_checker_catches_an_upward_import_through_the_lazy_facade(tmp_path):
    """A layer-1 module reaching a layer-5 name through the package's lazy top level (``from jacap_lib
    import X``, ``from .. import X``, ``import jacap_lib; jacap_lib.X``) is the upward import it hides."""
    pkg = tmp_path / "jacap_lib"
    (pkg / "results").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from ._lazy import lazy_attributes\n"
        "_EXPORTS = {'load_things': 'jacap_lib.results.loaders', 'select_keep': 'jacap_lib.selection'}\n"
        "__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, sorted(_EXPORTS))\n")
    (pkg / "_lazy.py").write_text("def lazy_attributes(*a):\n    return None, None\n")
    (pkg / "results" / "__init__.py").write_text("")
    (pkg / "results" / "loaders.py").write_text("def load_things():\n    return 1\n")
    (pkg / "selection.py").write_text("def select_keep():\n    return 0\n")
    (pkg / "theory.py").write_text("from jacap_lib import load_things, select_keep\n")          # L1 -> L5 (and L1)
    (pkg / "stats.py").write_text("def f():\n    from . import load_things\n")                  # relative
    (pkg / "examples.py").write_text("import jacap_lib as J\n\ndef f():\n    return J.load_things()\n")
    (pkg / "scoring.py").write_text("import jacap_lib\n\nx = jacap_lib.select_keep\n")            # same layer: fine
    upward, loops = violations(module_files(pkg))
    assert upward == [f"jacap_lib.{m} (layer 1) imports jacap_lib.results.loaders (layer 5)"
                      for m in ("examples", "stats", "theory")]
    assert not loops


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


#: the modules that may import the report (the sentences the book prints): the command line and the book's own entry
REPORT_READERS = ("jacap_lib.report", "jacap_lib.cli", "jacap_lib.book", "jacap_lib.__main__")


def report_importers(modules: dict) -> list[str]:
    """Modules outside :data:`REPORT_READERS` that import a module of ``jacap_lib.report``."""
    exports = lazy_exports(modules)
    out = []
    for m, p in sorted(modules.items()):
        if any(m == r or m.startswith(r + ".") for r in REPORT_READERS) or m == "jacap_lib":
            continue
        if any(t == "jacap_lib.report" or t.startswith("jacap_lib.report.") for t in imports_of(m, p, modules, exports)):
            out.append(m)
    return out


def test_only_the_book_and_the_cli_read_the_report():
    """Experiments return numbers; figures, widgets and exercises draw them: none of them imports the report."""
    assert report_importers(module_files()) == []


def test_report_check_sees_a_figure_reading_the_report(tmp_path):
    pkg = tmp_path / "jacap_lib"
    (pkg / "report").mkdir(parents=True)
    (pkg / "viz").mkdir()
    for f in ("__init__.py", "report/__init__.py", "viz/__init__.py", "report/findings.py", "cli.py"):
        (pkg / f).write_text("")
    (pkg / "viz" / "plane.py").write_text("def f():\n    from ..report import findings\n")
    (pkg / "cli.py").write_text("from jacap_lib.report import findings\n")
    assert report_importers(module_files(pkg)) == ["jacap_lib.viz.plane"]


def test_results_holds_data_access_only():
    """``results/`` is the data access layer: where the files are, their shape, their provenance, one loader per
    file. A job, a statistic or a sentence there fails."""
    have = sorted(m for m in module_files() if m.startswith("jacap_lib.results"))
    assert have == ["jacap_lib.results", "jacap_lib.results.files", "jacap_lib.results.loaders",
                    "jacap_lib.results.paths", "jacap_lib.results.provenance", "jacap_lib.results.texts"]
