"""Exercises with checkers. ``theory`` holds the theory chapters' exercises (``check``, ``question``,
``data``), ``algorithm`` those of the Algorithm 1 chapter; both are re-exported here by name."""
from __future__ import annotations

from . import algorithm, theory  # noqa: F401
from .theory import check, data, question  # noqa: F401

__all__ = ["check", "data", "question", "theory", "algorithm"]
