"""Chapters stay thin: logic lives in jacap_lib, a chapter only calls it.

Per chapter source (book/chapters/*.md): no ``def``/``class`` outside an exercise solution (a hidden
code cell that calls ``exercises.check``), no code cell over MAX_LINES lines (blank lines, comments and
cell options not counted), no file opened by path, and at most MAX_MODULES parts of jacap_lib drawn on,
counted truthfully by where each name the chapter uses lives: a part is a first-level module or package
(``jacap_lib.theory``, ``jacap_lib.viz`` with its sub-modules, ``jacap_lib.results``, ...), and a name
reached through a module that merely imports it (``WT.rotated_example`` with ``WT = widgets.theory``)
counts as the part that defines it. The top-level API is one part: ``from jacap_lib import load_model,
jacap_scores`` and ``import jacap_lib as jl; jl.random_cache`` draw on ``jacap_lib`` (its lazy-export
table), ``from jacap_lib import viz, widgets`` on two parts."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import types
from pathlib import Path

import pytest

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "book" / "chapters").glob("*.md"))
MAX_LINES = 15
MAX_MODULES = 3
NOT_COUNTED = {"jacap_lib.exercises"}
KNOWN_DIRTY: set[str] = set()
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
IMPORT = re.compile(r"^\s*(?:from\s+(jacap_lib[\w.]*)\s+import\s+([\w ,()*]+?)\s*$|import\s+(jacap_lib[\w.]*))", re.M)
OPENS = re.compile(r"\bopen\(|\.read_text\(|\.read_bytes\(|json\.load\(|\bPath\(|np\.load|torch\.load\(|pd\.read_")


def _cells(text: str) -> list[tuple[list[str], str]]:
    out = []
    for body in CELL.findall(text):
        opts, code = [], []
        for line in body.split("\n"):
            (opts if line.startswith(":") and not code else code).append(line)
        out.append((opts, "\n".join(code)))
    return out


def _is_solution(opts: list[str], code: str) -> bool:
    return any("hide-cell" in o or "hide-input" in o for o in opts) and "exercises.check(" in code


def _modules(code: str) -> set[str]:
    """The parts of jacap_lib one piece of code draws on (see the module docstring)."""
    return modules_used([code])


#: the packages along the data chain below the figures — data access, statistics, experiments, report — count as
#: one part, the record of the committed results (one package, ``jacap_lib.results``, until it was split by job)
RECORD = ("jacap_lib.results", "jacap_lib.verdicts", "jacap_lib.experiments", "jacap_lib.report")


def _part(module: str) -> str:
    """``jacap_lib`` (the top-level API) or the first-level module/package holding ``module`` (one of
    :data:`RECORD`: the record, ``"jacap_lib.results"``)."""
    part = ".".join(module.split(".")[:2])
    return RECORD[0] if part in RECORD else part


def _home(module: str, name: str, seen=()) -> str:
    """The module that defines ``module.name``: a class's or function's ``__module__``; else (a constant)
    followed through ``from X import name`` / ``from X import *`` in ``module``'s source."""
    obj = getattr(importlib.import_module(module), name)
    home = getattr(obj, "__module__", None) if isinstance(obj, (type, types.FunctionType)) else None
    if isinstance(home, str) and home.startswith("jacap_lib"):
        return home
    spec = importlib.util.find_spec(module)
    if not spec or not spec.origin or module in seen:
        return module
    tree = ast.parse(Path(spec.origin).read_text())
    star = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = module.split(".")
            if node.level:
                base = base[: len(base) - node.level + (1 if spec.origin.endswith("__init__.py") else 0)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            if not src.startswith("jacap_lib"):
                continue
            for a in node.names:
                if a.name == "*":
                    star.append(src)
                elif (a.asname or a.name) == name:
                    return _home(src, a.name, seen + (module,))
    for src in star:
        if hasattr(importlib.import_module(src), name):
            return _home(src, name, seen + (module,))
    return module


def _unit(module: str, name: str) -> tuple[str, str | None]:
    """``(part counted, module bound)`` for ``module.name``: a sub-module binds (and, reached from the
    top-level package, counts) itself; a lazy public name of the package counts as the API."""
    full = f"{module}.{name}"
    if _is_module(full):
        return (_part(full) if module == "jacap_lib" else _part(module)), full
    if module == "jacap_lib":
        import jacap_lib

        if name in getattr(jacap_lib, "_EXPORTS", {}) or name in vars(jacap_lib):
            return "jacap_lib", None
    return _part(_home(module, name)), None


def _chain(node) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id] + parts[::-1] if isinstance(node, ast.Name) else None


def modules_used(codes: list[str]) -> set[str]:
    """The parts of jacap_lib that these cells (in order, one namespace) draw on."""
    mods, bound = set(), {}  # bound: local name -> jacap_lib module

    def resolve(chain):
        module = bound.get(chain[0])
        if module is None:
            return None
        for attr in chain[1:]:
            part, sub = _unit(module, attr)
            mods.add(part)
            if sub is None:
                return None
            module = sub
        return module

    for code in codes:
        code = "\n".join("" if l.lstrip().startswith(("%", "!")) else l for l in code.split("\n"))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("jacap_lib"):
                        mods.add(_part(a.name))
                        bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else "jacap_lib"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jacap_lib") and not node.level:
                for a in node.names:
                    part, sub = _unit(node.module, a.name)
                    mods.add(part)
                    if sub is not None:
                        bound[a.asname or a.name] = sub
            elif isinstance(node, ast.Assign):  # VT, WT = viz.theory, widgets.theory
                targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else [node.targets[0]]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                for t, v in zip(targets, values):
                    chain = _chain(v)
                    module = resolve(chain) if chain else None
                    if isinstance(t, ast.Name) and module is not None:
                        bound[t.id] = module
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                chain = _chain(node)
                if chain:
                    resolve(chain)
    return mods


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def problems(text: str) -> list[str]:
    found, codes = [], []
    for i, (opts, code) in enumerate(_cells(text), 1):
        lines = [l for l in code.split("\n") if l.strip() and not l.strip().startswith("#")]
        solution = _is_solution(opts, code)
        if re.search(r"^\s*(def|class)\s", code, re.M) and not solution:
            found.append(f"cell {i}: defines a function/class (move it into jacap_lib)")
        if len(lines) > MAX_LINES and not solution:
            found.append(f"cell {i}: {len(lines)} lines (> {MAX_LINES})")
        if OPENS.search(code):
            found.append(f"cell {i}: opens a file by path (use a jacap_lib.results loader)")
        codes.append(code)
    mods = modules_used(codes) - NOT_COUNTED
    if len(mods) > MAX_MODULES:
        found.append(f"imports {len(mods)} jacap_lib modules (> {MAX_MODULES}): {sorted(mods)}")
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_is_thin(path):
    found = problems(path.read_text())
    if path.stem in KNOWN_DIRTY:
        assert found, f"{path.name} is thin now: remove it from KNOWN_DIRTY"
        pytest.xfail(f"{path.name} still being thinned: " + "; ".join(found))
    assert not found, f"{path.name}:\n" + "\n".join(found)


def test_the_checker_can_fail():
    fat = ("```{code-cell} ipython3\nfrom jacap_lib import viz, widgets, theory, stats\n"
           "def f():\n    return open('data/x.json')\n" + "x = 1\n" * 16 + "```\n")
    found = problems(fat)
    assert any("defines" in p for p in found) and any("lines" in p for p in found)
    assert any("opens a file" in p for p in found) and any("imports 4" in p for p in found)
    assert not any("imports" in p for p in problems(fat.replace("theory, stats", "exercises")))
    solution = "```{code-cell} ipython3\n:tags: [hide-cell]\ndef g():\n    pass\nexercises.check('x.1', g())\n```\n"
    assert problems(solution) == []
    assert _modules("from jacap_lib import load_model, jacap_scores\n") == {"jacap_lib"}


def test_modules_are_counted_where_the_names_live():
    """A name reached through a module that only imports it counts as its home; a package's own
    sub-modules are the package; the top-level API is one part."""
    assert _modules("from jacap_lib import viz, widgets\nVT, WT = viz.theory, widgets.theory\n"
                    "VT.leverage_angle_figure\nWT.leverage_app\n") == {"jacap_lib.viz", "jacap_lib.widgets"}
    # widgets.theory imports rotated_example from examples for its app: reaching it there is reaching examples
    assert _modules("from jacap_lib.widgets import theory as WT\nWT.rotated_example(10, 0.5)\n") == {
        "jacap_lib.widgets", "jacap_lib.examples"}
    assert _modules("from jacap_lib.widgets.theory import rotated_example\n") == {"jacap_lib.examples"}
    assert _modules("import jacap_lib as jl\njl.random_cache(4)\njl.load_model()\n") == {"jacap_lib"}
    assert _modules("import jacap_lib as jl\njl.viz.theory.saturation_figure\n") == {"jacap_lib", "jacap_lib.viz"}
    assert _modules("from jacap_lib.results import loaders as R\nR.load_eval_summary()\n") == {"jacap_lib.results"}
    fat = "from jacap_lib import viz, widgets, theory as T\nWT = widgets.theory\nWT.rotated_example\n"
    assert any("imports 4" in p for p in problems("```{code-cell} ipython3\n" + fat + "```\n"))
