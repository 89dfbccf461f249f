"""Checkers accept the right answer (computed independently here) and name the usual slips."""
import itertools
import math

import pytest
import torch

from jacap_lib.exercises import theory as E


def msg(ex, ans):
    return E.check(ex, ans).message


@pytest.fixture(autouse=True)
def _not_in_build(monkeypatch):
    monkeypatch.delenv("JACAP_BOOK_BUILD", raising=False)


def test_00_kv_memory_answers_and_hints():
    full = 2 * 32 * 8 * 131072 * 128 * 2 / 2**30
    assert full == 16.0 and E.check("00.1", full)
    assert "KV heads" in msg("00.1", full * 4)
    assert "factor 2" in msg("00.1", full / 2)
    assert "GiB" in msg("00.1", 2 * 32 * 8 * 131072 * 128 * 2 / 1e9)
    assert E.check("00.2", 2**30 // (2 * 30 * 3 * 64 * 2))
    assert "3 KV heads" in msg("00.2", 2**30 // (2 * 30 * 9 * 64 * 2))
    assert E.check("00.3", 2 * 80 * 8 * round(0.1 * 131072) * 128 * 2 / 2**30)
    assert "removed" in msg("00.3", 2 * 80 * 8 * 0.9 * 131072 * 128 * 2 / 2**30)


def test_01_softmax_jacobian_against_autograd():
    z = torch.log(torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64))
    S = torch.autograd.functional.jacobian(lambda z: torch.softmax(z, 0), z)
    assert E.check("01.1", S)
    assert "outer product" in msg("01.1", torch.diag(torch.tensor([0.7, 0.2, 0.1])))
    assert E.check("01.2", (0.5, 0.25)) and not E.check("01.2", (0.5, 0.5))
    d = E.data("01.3")
    f = lambda q: d["U"] @ torch.softmax(d["K"] @ q / math.sqrt(3), 0)  # noqa: E731
    J = torch.autograd.functional.jacobian(f, d["mu"])
    assert E.check("01.3", J)
    assert "sqrt(d)" in msg("01.3", J * math.sqrt(3))
    assert "Transposed" in msg("01.3", J.T)


def test_02_capacity_answers_and_hints():
    assert E.check("02.1", 0.5 * math.log(36 / 11))
    assert "1/2" in msg("02.1", math.log(36 / 11))
    d = E.data("02.2")
    A1 = d["A"] + d["w"] * torch.outer(d["u"], d["u"])
    gain = float(torch.logdet(A1) - torch.logdet(d["A"]))
    assert E.check("02.2", gain)
    assert "log(1 +" in msg("02.2", math.expm1(gain))
    assert E.check("02.3", math.log(2.25))
    assert "sigma^2" in msg("02.3", math.log(3.5))


def test_03_leverage_example_by_brute_force():
    u = torch.tensor([[1, 0], [0.95, 0.05], [0, 1]], dtype=torch.float64)
    w = torch.tensor([1, 1, 0.7], dtype=torch.float64)
    A = torch.eye(2, dtype=torch.float64) + sum(wi * torch.outer(ui, ui) for wi, ui in zip(w, u))
    r = torch.stack([wi * ui @ torch.linalg.inv(A) @ ui for wi, ui in zip(w, u)])
    assert r[2] > r[1]  # the note: u3 ranks above u2
    assert E.check("03.1", r) and "weights alone" in msg("03.1", w)
    cap = {c: torch.logdet(torch.eye(2, dtype=torch.float64) + sum(w[i] * torch.outer(u[i], u[i]) for i in c))
           for c in itertools.combinations(range(3), 2)}
    best = max(cap, key=cap.get)
    assert E.check("03.2", {i + 1 for i in best}) and best == (0, 2)
    assert "nearly coincide" in msg("03.2", {1, 2})
    w3 = E.EXERCISES["03.3"].expected()

    def gap(x):
        wx = torch.tensor([1, 1, x], dtype=torch.float64)
        Ax = torch.eye(2, dtype=torch.float64) + sum(wi * torch.outer(ui, ui) for wi, ui in zip(wx, u))
        s = [wi * ui @ torch.linalg.inv(Ax) @ ui for wi, ui in zip(wx, u)]
        return float(s[2] - s[1])

    assert gap(w3 - 1e-3) < 0 < gap(w3 + 1e-3)
    assert E.check("03.3", w3) and not E.check("03.3", 0.7)


def test_none_is_not_attempted_and_build_mode_raises(monkeypatch):
    res = E.check("01.1", None)
    assert not res and "Replace None" in res.message
    monkeypatch.setenv("JACAP_BOOK_BUILD", "1")
    assert not E.check("01.1", None)  # an unanswered reader cell never fails the build
    with pytest.raises(AssertionError, match="solution in the book is wrong"):
        E.check("02.1", 1.0)


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="exercise_id"):
        E.check("9.9", 1)
    with pytest.raises(ValueError, match="number"):
        E.check("00.1", "lots")
    with pytest.raises(ValueError, match="no data"):
        E.data("00.1")
