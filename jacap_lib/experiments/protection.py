"""Where a Jacap setting's protection fills the whole budget, so that its score chooses no token.

Every Jacap press keeps ``n_sink`` first tokens and a ``window`` of the most recent ones before its score chooses
anything (:meth:`jacap_lib.presses.jacap.JacapPromptPress.budget_split`). kvpress keeps ``floor((1 - c) L)`` of a prompt of
``L`` tokens at compression ratio ``c``; where that budget is at most ``n_sink + window``, the kept set is the
protected tokens alone, every setting with that protection keeps the same tokens, and a verdict there compares
a recency rule, not the score. The verdict tables and the findings label such cells with
:func:`protection_fills_budget`.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

__all__ = ["protection_fills_budget", "budget_split", "LABEL"]

#: how a table or a sentence labels such a cell
LABEL = "protection fills the budget"


def budget_split(spec: str, length: int, ratio: float) -> dict | None:
    """``{"kept", "sinks", "window", "scored"}`` of setting ``spec`` on a prompt of ``length`` tokens at compression
    ratio ``ratio`` (:meth:`jacap_lib.presses.jacap.JacapPromptPress.budget_split`; an AdaKV wrapper's scorer), ``None``
    for a press without protection."""
    from jacap_lib.presses.registry import press_from_spec, quiet_kvpress

    with quiet_kvpress():  # built to read its budget: KVzip's prefill-cost warning is not the reader's question
        press = press_from_spec(spec, float(ratio))
        scorer = press if hasattr(press, "budget_split") else getattr(press, "press", None)  # AdaKV wraps a scorer
        if not hasattr(scorer, "budget_split"):
            return None
        return dataclasses.replace(scorer, compression_ratio=float(ratio)).budget_split(int(length))


@lru_cache(maxsize=None)
def protection_fills_budget(spec: str, length: int, ratio: float) -> bool:
    """Whether setting ``spec`` keeps only its protected tokens (sinks and recent window) of a prompt of ``length``
    tokens at compression ratio ``ratio``: its score then chooses no token. ``False`` for a spec that is not a
    Jacap press (no protection to fill the budget)."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"spec must be a method spec such as 'jacap_prompt[window=128]', got {spec!r}")
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise ValueError(f"length must be a prompt length in tokens (int >= 1), got {length!r}")
    from jacap_lib._checks import compression_ratio

    compression_ratio(ratio, "ratio")
    split = budget_split(spec, length, ratio)
    return split is not None and split["scored"] == 0
