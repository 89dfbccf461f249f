"""The README: under 1,500 words; its Python examples run as written, in order, on the bundled model, and say what
they claim (the pipeline answers from the compressed cache with both Jacap presses, as the output shown says;
build_press builds the classes the comments name; the inspection of the default spreads one budget over the heads;
the scoring example's shapes are the comments'; building the default logs no kvpress cost note); its presses table
says what each listed registry name builds (class, readings of the context, whether it frees memory); its layer
table is tests/test_layers.py's; its command-line table names every subcommand. The scores themselves are checked
against autograd and brute force elsewhere."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
FACT = "The queen lays all the eggs."  # the pipeline example's question, answered from its context


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _blocks(lang: str = "python") -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _text(), re.S)


def _table(header: str) -> list[list[str]]:
    """The rows (cells stripped) of the README's Markdown table whose header row starts with ``header``."""
    lines = _text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def test_the_readme_is_under_1500_words():
    assert len(_text().split()) < 1500  # as `wc -w` counts


def test_the_readme_has_its_four_examples():
    blocks = _blocks()
    assert len(blocks) == 4
    assert "pipeline(" in blocks[0] and "build_press" in blocks[1] and "jacap_scores" in blocks[2]
    assert "inspect_eviction" in blocks[3]


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.model
def test_the_readme_examples_run_and_do_what_they_say():
    from kvpress import AdaKVPress, KVzipPress  # noqa: F401 - imported before the handler, as the README's import

    from jacap_lib import JacapPress, JacapPromptPress, RaggedPress

    ns: dict = {}
    out = io.StringIO()
    records = _Records()
    kv_log = logging.getLogger("kvpress")
    level = kv_log.level
    kv_log.addHandler(records)
    kv_log.setLevel(logging.WARNING)  # whatever an earlier test left: KVzip's note is a warning
    cost_notes = []
    try:
        with contextlib.redirect_stdout(out):
            for block in _blocks():
                exec(compile(block, str(README), "exec"), ns)  # noqa: S102 - the README's own code
                cost_notes.append(sum("prefilling cost" in m for m in records.messages))
                records.messages.clear()
    finally:
        kv_log.removeHandler(records)
        kv_log.setLevel(level)
    # the default is built in blocks 0, 1 and 3 and never logs kvpress's fixed cost note; block 1's KVzip does, once
    assert cost_notes == [0, 1, 0, 0]
    # the pipeline: every press answers the question from its compressed cache, as the output shown says
    printed = out.getvalue().splitlines()[:3]
    shown = _blocks("text")[0].strip().splitlines()
    assert [line.split(": ")[0] for line in printed] == [line.split(": ")[0] for line in shown] == list(ns["presses"])
    assert all(line.endswith(FACT) for line in printed + shown), printed
    assert type(ns["presses"]["JacapPress"]) is JacapPress and type(ns["presses"]["JacapPromptPress"]) is JacapPromptPress
    # build_press: the classes the comments name
    assert type(ns["build_press"]("jacap", 0.5)) is JacapPress
    assert type(ns["build_press"]("jacap_prompt", 0.5)) is JacapPromptPress
    assert isinstance(ns["press"], RaggedPress) and type(ns["press"].press) is KVzipPress
    # the scoring example
    assert ns["keep"].shape == (2, 8, 256) and bool((ns["keep"].diff(dim=-1) > 0).all())
    assert torch.equal(ns["keep"][..., :4], torch.arange(4).expand(2, 8, 4))  # the sinks
    assert torch.equal(ns["keep"][..., -32:], torch.arange(1024 - 32, 1024).expand(2, 8, 32))  # the window
    # the inspection of the default: one budget spread unevenly over the (layer, KV head) pairs, some of it by score
    insp = ns["insp"]
    assert insp.method == "jacap" and insp.n_kept.shape == (30, 3) and insp.n_kept.unique().numel() > 1
    assert int(insp.n_scored.sum()) > 0
    assert "kept (mean" in out.getvalue() and insp.view(15, 0) in out.getvalue()


def test_the_presses_table_says_what_each_name_builds():
    """Each registry name in the table builds a press of a class its row names; it reads the context twice exactly
    when it is a reconstruction method; it frees memory ("yes") exactly when kvpress prunes it for real (a
    ScorerPress, one budget per head) or it is JacapPress (whose ``JacapPress()`` frees what it masks)."""
    import kvpress

    import jacap_lib
    from jacap_lib import JacapPress, build_press, list_methods
    from jacap_lib.presses.registry import RECONSTRUCTION_METHODS

    rows = _table("| name | class | what it scores | readings | frees memory |")
    seen = []
    for name_cell, class_cell, _, readings, frees in rows:
        names = [n for n in re.findall(r"`(\w+)`", name_cell) if n in list_methods()]
        classes = tuple(getattr(jacap_lib, c, None) or getattr(kvpress, c) for c in re.findall(r"\b(\w+Press)\b", class_cell))
        assert names and classes, name_cell
        for name in names:
            press = build_press(name, 0.5)
            assert isinstance(press, classes), (name, type(press).__name__)
            assert readings == ("2" if name in RECONSTRUCTION_METHODS else "1"), name
            prunes = isinstance(press, kvpress.ScorerPress) or type(press) is JacapPress
            assert frees.startswith("yes") == prunes and (prunes or "RaggedPress" in frees), name
        seen += names
    assert set(list_methods("jacap")) <= set(seen)  # every Jacap press has its row
    assert rows[0][0].startswith("`jacap` (the default)") and "`JacapPress`" in rows[0][1]


def test_the_layer_table_is_test_layers_table():
    spec = importlib.util.spec_from_file_location("_layers", Path(__file__).with_name("test_layers.py"))
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    table = {}
    for layer, modules, _ in _table("| layer | modules |"):
        low, _, high = layer.partition("–")
        for k, module in enumerate(re.findall(r"`(jacap_lib[\w.]*)`", modules)):
            table[module] = int(low) + (k if high else 0)  # "6–8": one module per layer, in order
    # every module of the layer test except the package's own plumbing (lazy names, __main__, the top level)
    expected = {m: n for m, n in layers.LAYERS.items() if m not in ("jacap_lib", "jacap_lib.__main__", "jacap_lib._lazy")}
    assert table == expected


def test_the_command_line_table_names_every_subcommand():
    from jacap_lib import cli

    rows = _table("| subcommand | what it does |")
    named = [re.match(r"`jacap ([\w-]+)", row[0]).group(1) for row in rows]
    assert sorted(named) == sorted(cli.COMMANDS)
