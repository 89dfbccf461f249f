"""The pieces every chapter's exercises are built from: :class:`Exercise`, :class:`Verdict` and the
graders (:func:`number`, :func:`integer`, :func:`tensor`, :func:`custom`).

A grader is a function ``(answer, expected) -> (correct, hint)`` that also carries the tolerance it
applies, as text (``grader.tolerance``). :func:`jacap_lib.exercises.question` prints that text after the
question, so the tolerance a reader is told is the one the checker uses.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

__all__ = ["Exercise", "Verdict", "number", "integer", "tensor", "custom", "as_number", "as_tensor"]


@dataclass
class Verdict:
    """What ``check`` returns: truthy when correct; shows its message in a notebook."""

    exercise: str
    correct: bool
    message: str

    def __bool__(self):
        return self.correct

    def __repr__(self):
        # wrapped to 72 columns so that a verdict fits the book's column (and a notebook's)
        return "\n".join(textwrap.fill(line, 72, break_on_hyphens=False) or line for line in self.message.split("\n"))

    def _repr_pretty_(self, p, cycle):
        p.text(repr(self))


class Grader:
    """``grade(answer, expected) -> (correct, hint)`` with the tolerance it applies stated in words."""

    def __init__(self, fn: Callable[[object, object], tuple], tolerance: str):
        if not tolerance:
            raise ValueError("tolerance must be stated (e.g. 'relative 1e-4', 'exact')")
        self.fn, self.tolerance = fn, tolerance

    def __call__(self, answer, expected) -> tuple[bool, str]:
        return self.fn(answer, expected)


@dataclass
class Exercise:
    """One exercise. ``expected(**given)`` computes the answer from the library (never typed in);
    ``given`` names the objects of the chapter that ``check`` must be passed (e.g. an inspection),
    ``data()`` returns the inputs the question talks about."""

    question: str
    expected: Callable[..., object]
    grade: Grader
    data: Callable[[], dict] | None = None
    given: tuple[str, ...] = ()
    id: str = field(default="", init=False)

    def __post_init__(self):
        if not isinstance(self.grade, Grader):
            raise ValueError("grade must be built with number(), integer(), tensor() or custom() "
                             "so that its tolerance is stated")


def as_number(answer) -> float:
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    try:
        return float(answer)
    except (TypeError, ValueError):
        raise ValueError(f"answer must be a number, got {type(answer).__name__}: {answer!r}") from None


def as_tensor(x) -> torch.Tensor:
    try:
        return torch.as_tensor(x, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"answer must be a tensor or nested list of numbers, got {type(x).__name__}") from None


def _num_tol(rtol: float, atol: float) -> str:
    parts = ([f"relative {rtol:g}"] if rtol else []) + ([f"absolute {atol:g}"] if atol else [])
    return " or ".join(parts) if parts else "exact"


def number(*, rtol: float = 1e-4, atol: float = 0.0, slips: dict | None = None, hint: str = "") -> Grader:
    """A real number within ``rtol``/``atol`` of the expected one. ``slips`` maps a factor ``f`` to a
    hint shown when the answer is ``f`` times the expected value (a missing 2, 1/2, GiB vs GB...)."""
    slips = dict(slips or {})

    def grade(answer, expected):
        a, e = as_number(answer), float(expected)
        if math.isclose(a, e, rel_tol=rtol, abs_tol=atol):
            return True, ""
        for factor, why in slips.items():
            if math.isclose(a, factor * e, rel_tol=max(rtol, 1e-3), abs_tol=atol):
                return False, why
        if hint:
            return False, hint
        return False, (f"{a:.6g} is {a / e:.4g} times the expected value." if e else "")

    return Grader(grade, _num_tol(rtol, atol))


def integer(*, slips: Sequence[tuple[Callable[[int], float], str]] = (), hint: str = "") -> Grader:
    """An exact integer. ``slips`` pairs ``wrong(expected) -> value`` with the hint shown when the
    answer equals that value (to 0.1%)."""

    def grade(answer, expected):
        a = as_number(answer)
        if a == int(expected):
            return True, ""
        for wrong, why in slips:
            if math.isclose(a, wrong(expected), rel_tol=1e-3):
                return False, why
        return False, hint

    return Grader(grade, "exact integer")


def tensor(*, rtol: float = 1e-6, atol: float = 1e-9,
           slips: Sequence[tuple[Callable[[torch.Tensor], torch.Tensor], str]] = (), hint: str = "") -> Grader:
    """A tensor of the expected shape, ``torch.allclose`` to the expected one with ``rtol``/``atol``.
    ``slips`` pairs ``wrong(expected) -> tensor`` with the hint shown when the answer is that tensor."""

    def grade(answer, expected):
        a, e = as_tensor(answer), as_tensor(expected)
        if a.shape != e.shape:
            return False, f"expected shape {tuple(e.shape)}, got {tuple(a.shape)}."
        if torch.allclose(a, e, rtol=rtol, atol=atol):
            return True, ""
        for wrong, why in slips:
            w = as_tensor(wrong(e))
            if w.shape == a.shape and torch.allclose(a, w, rtol=max(rtol, 1e-6), atol=atol):
                return False, why
        return False, hint

    return Grader(grade, f"elementwise |answer - expected| <= {atol:g} + {rtol:g} |expected| (torch.allclose), "
                         "shape must match")


def custom(fn: Callable[[object, object], tuple], tolerance: str) -> Grader:
    """Any grading rule ``fn(answer, expected) -> (correct, hint)``; ``tolerance`` says what it accepts."""
    return Grader(fn, tolerance)
