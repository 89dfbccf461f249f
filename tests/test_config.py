"""One owner per Jacap parameter: the press, the decode-time controller and both scoring paths take their
defaults from ``jacap_lib.config.DEFAULTS`` and refuse a bad value with the same ValueError as the config.

Defaults are read from the signatures and from the objects themselves (a press built with no options, a
controller on a tiny model), and the Triton path is run (interpreted, in a fresh process, as in
tests/test_kernels.py) with its defaults against the torch path given the config's values explicitly.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jacap_lib import config
from jacap_lib.config import DEFAULTS, JacapConfig
from jacap_lib.scoring import jacap_scores, rank_one_corrected_scores
from jacap_lib.scoring.triton import triton_jacap_scores

FIELDS = [f.name for f in dataclasses.fields(JacapConfig)]
# the press's and the controller's name for each config field (the controller's EMA factor is `beta`)
PRESS = {f: f for f in FIELDS if f != "decode_beta"}
CONTROLLER = {"tau": "tau", "noise": "noise", "deff_frac": "deff_frac", "n_sink": "n_sink", "window": "window",
              "decode_beta": "beta", "eps": "eps", "backend": "backend"}
SCORERS = {"tau": "tau", "noise": "noise"}


def defaults_of(fn) -> dict:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not inspect.Parameter.empty}


def controller_cls():
    from jacap_lib.controller import JacapDecodeController

    return JacapDecodeController


def test_the_config_holds_the_documented_defaults():
    assert dataclasses.asdict(DEFAULTS) == {
        "tau": 3.0, "noise": 1.0, "deff_frac": 0.25, "n_sink": 4, "window": 16, "n_queries": None, "beta": 0.9,
        "decode_beta": 0.9, "gqa": "pool", "eps": 1e-6, "backend": "auto"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULTS.tau = 1.0


def test_press_defaults_are_the_config():
    from jacap_lib.presses.jacap import JacapPromptPress

    press = JacapPromptPress()
    for field, attr in PRESS.items():
        assert getattr(press, attr) == getattr(DEFAULTS, field), field
    declared = {f.name: f.default for f in dataclasses.fields(JacapPromptPress)}
    assert {attr: declared[attr] for attr in PRESS.values()} == {a: getattr(DEFAULTS, f) for f, a in PRESS.items()}


def test_controller_defaults_are_the_config(tiny_llama):
    cls = controller_cls()
    sig = defaults_of(cls.__init__)
    assert {a: sig[a] for a in CONTROLLER.values()} == {a: getattr(DEFAULTS, f) for f, a in CONTROLLER.items()}
    ctrl = cls(tiny_llama, high=64, budget=40, interval=8)
    for field, attr in CONTROLLER.items():
        assert getattr(ctrl, attr) == getattr(DEFAULTS, field), field


@pytest.mark.parametrize("fn", [jacap_scores, triton_jacap_scores, rank_one_corrected_scores],
                         ids=["torch", "triton", "rank_one"])
def test_scorer_defaults_are_the_config(fn):
    sig = defaults_of(fn)
    for field, arg in SCORERS.items():
        assert sig[arg] == getattr(DEFAULTS, field), (fn.__name__, arg)
    if "backend" in sig:
        assert sig["backend"] == DEFAULTS.backend


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, 24, 8, generator=g), torch.randn(2, 24, 8, generator=g)
    return k, v, torch.randn(2, 8, generator=g), torch.rand(2, 8, generator=g) + 0.1


_SCRIPT = r"""
import os, sys, torch
assert os.environ.get("TRITON_INTERPRET") == "1"
from jacap_lib.config import DEFAULTS
from jacap_lib.scoring import jacap_scores
from jacap_lib.scoring.triton import triton_jacap_scores
g = torch.Generator().manual_seed(3)
k, v = torch.randn(2, 40, 16, generator=g), torch.randn(2, 40, 16, generator=g)
mu, lam = torch.randn(2, 16, generator=g), torch.rand(2, 16, generator=g) + 0.1
got = triton_jacap_scores(k, v, mu, lam, dot_precision="ieee")          # the Triton path's own defaults
ref = jacap_scores(k, v, mu, lam, tau=DEFAULTS.tau, noise=DEFAULTS.noise, backend="torch")  # the config's values
off = jacap_scores(k, v, mu, lam, tau=DEFAULTS.tau / 10, noise=DEFAULTS.noise, backend="torch")
for f in ("alpha", "weight", "score"):
    torch.testing.assert_close(getattr(got, f), getattr(ref, f), rtol=1e-4, atol=1e-6)
assert not torch.allclose(off.alpha, ref.alpha, rtol=1e-3)  # the comparison would see another tau
print("ok")
"""


def test_triton_path_runs_with_the_config_defaults():
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the interpreted run is for machines without a GPU (tests/test_kernels.py covers the GPU)")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=root, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_torch_path_uses_the_config_defaults():
    k, v, mu, lam = _tensors()
    got = jacap_scores(k, v, mu, lam)
    ref = jacap_scores(k, v, mu, lam, tau=DEFAULTS.tau, noise=DEFAULTS.noise, backend=DEFAULTS.backend)
    other = jacap_scores(k, v, mu, lam, tau=1.0)
    torch.testing.assert_close(got.score, ref.score, rtol=0, atol=0)
    assert not torch.allclose(got.alpha, other.alpha)


# --------------------------------------------------------------------------- one error per bad value
BAD = [("tau", 0.0), ("tau", float("nan")), ("noise", "auto"), ("noise", -1.0), ("deff_frac", 0.0),
       ("deff_frac", 1.5), ("n_sink", -1), ("window", 2.5), ("eps", 0.0), ("backend", "cuda"), ("decode_beta", 1.0),
       ("beta", 1.0), ("n_queries", 0), ("gqa", "max")]


def _message(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    return str(err.value)


@pytest.mark.parametrize("field,value", BAD, ids=[f"{f}={v}" for f, v in BAD])
def test_a_bad_value_raises_the_same_error_everywhere(field, value, tiny_llama):
    from jacap_lib.presses.jacap import JacapPromptPress

    expected = _message(lambda: JacapConfig(**{field: value}))
    assert f"`{field}`" in expected and repr(value) in expected
    entries = {}
    if field in PRESS:
        entries["press"] = lambda: JacapPromptPress(0.5, **{PRESS[field]: value})
    if field in CONTROLLER:
        entries["controller"] = lambda: controller_cls()(tiny_llama, high=64, budget=40, interval=8,
                                                         **{CONTROLLER[field]: value})
    k, v, mu, lam = _tensors()
    if field in SCORERS or field == "backend":
        entries["jacap_scores"] = lambda: jacap_scores(k, v, mu, lam, **{field: value})
    if field in SCORERS:
        entries["triton_jacap_scores"] = lambda: triton_jacap_scores(k, v, mu, lam, **{field: value})
    assert entries or field in ("decode_beta",)
    for where, call in entries.items():
        got = _message(call)
        if field == "decode_beta":  # the controller's argument is `beta`: same rule, its own name
            expected_here = _message(lambda: config.check("decode_beta", value, name="beta"))
        else:
            expected_here = expected
        assert got == expected_here, where


def test_each_parameter_has_one_rule():
    for f in FIELDS:
        config.check(f, getattr(DEFAULTS, f))  # the defaults pass their own rule
    with pytest.raises(ValueError, match="parameter"):
        config.check("temperature", 1.0)


def test_the_paper_preset_spec_builds_the_papers_settings():
    from jacap_lib.config import PAPER
    from jacap_lib.presses.registry import press_from_spec
    from jacap_lib.experiments.protocol.rules import PAPER_PRESET

    press = press_from_spec(PAPER_PRESET, 0.5)
    assert (press.tau, press.noise, press.beta) == (PAPER.tau, PAPER.noise, PAPER.beta) == (10.0, 1.0, None)
    assert (PAPER.tau, PAPER.beta) != (DEFAULTS.tau, DEFAULTS.beta)  # the tuned defaults differ from the paper
