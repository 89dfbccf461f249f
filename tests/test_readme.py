"""The README's Python examples run as written, in order, on the bundled model, and say what they claim: the
pipeline answers with both presses, build_press builds the classes the comments name, the inspection of the default
spreads one budget over the heads, and the scoring example's shapes are the comments' (the scores themselves are
checked against autograd and brute force elsewhere)."""
from __future__ import annotations

import contextlib
import io
import logging
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_its_four_examples():
    blocks = _blocks()
    assert len(blocks) == 4
    assert "pipeline(" in blocks[0] and "build_press" in blocks[1] and "inspect_eviction" in blocks[2]
    assert "jacap_scores" in blocks[3]


@pytest.mark.model
def test_the_readme_examples_run_and_do_what_they_say():
    from jacap_lib import JacapPress, JacapPromptPress

    logging.getLogger("kvpress").setLevel(logging.ERROR)  # KVzip's cost note, printed when the default is built
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in _blocks():
            exec(compile(block, str(README), "exec"), ns)  # noqa: S102 - the README's own code
    assert isinstance(ns["answer"], str) and ns["answer"].strip() and ns["one_prefill"].strip()
    assert isinstance(ns["press"], type(ns["build_press"]("jacap_ea", 0.5)))
    assert type(ns["build_press"]("jacap_context", 0.5)) is JacapPress
    assert type(ns["build_press"]("jacap", 0.5)) is JacapPromptPress
    insp = ns["insp"]
    assert insp.method == "jacap_context" and insp.n_kept.shape == (30, 3) and insp.n_kept.unique().numel() > 1
    assert "kept (mean" in out.getvalue() and insp.view(15, 0) in out.getvalue()
    assert ns["keep"].shape == (2, 8, 256) and bool((ns["keep"].diff(dim=-1) > 0).all())
    assert torch.equal(ns["keep"][..., :4], torch.arange(4).expand(2, 8, 4))  # the sinks
    assert torch.equal(ns["keep"][..., -32:], torch.arange(1024 - 32, 1024).expand(2, 8, 32))  # the window
