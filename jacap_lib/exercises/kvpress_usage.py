"""Exercises of the chapter labelled ``kvpress-usage`` (Jacap inside kvpress): how a budget is filled,
computed from :meth:`jacap_lib.presses.jacap.JacapPromptPress.budget_split` and kvpress's own rounding."""
from __future__ import annotations

from ..presses.jacap import JacapPromptPress
from ..selection import n_kept
from ._core import Exercise, integer

_PROTECTED = JacapPromptPress().n_sink + JacapPromptPress().window  # the prompt press's sinks + recent window

CHAPTER = "kvpress-usage"


def _scored_1000():
    return JacapPromptPress(0.75).budget_split(1000)["scored"]


def _first_scored_length(ratio: float = 0.9) -> int:
    press = JacapPromptPress(ratio)
    n = 1
    while press.budget_split(n)["scored"] < 1:
        n += 1
    return n


def _first_full_length(ratio: float = 0.9) -> int:
    """The shortest prompt whose budget holds exactly the protected slots (the score still chooses none)."""
    return next(n for n in range(1, 100_000) if n_kept(n, ratio) >= _PROTECTED)


def _decoding_scored(target_size: int = 96) -> int:
    press = JacapPromptPress()
    return target_size - press.n_sink - press.window


EXERCISES = [
    Exercise(
        "A 1000-token context compressed by JacapPromptPress(compression_ratio=0.75) with every other option at its "
        "default: how many of the kept tokens does Algorithm 1's score choose (not counting the protected sinks "
        "and recent window)?",
        _scored_1000,
        integer(slips=[(lambda e: e + _PROTECTED, "That is every kept token; subtract the sinks and the recent window."),
                       (lambda e: e + JacapPromptPress().n_sink, "Subtract the recent window too, not only the sinks."),
                       (lambda e: e + JacapPromptPress().window, "Subtract the sinks too, not only the recent window.")],
                hint="kvpress keeps int(N (1 - c)) tokens; the sinks and the window come out of that budget.")),
    Exercise(
        "JacapPromptPress(compression_ratio=0.9) with its defaults: what is the shortest prompt (in tokens) for which "
        "the score chooses at least one kept token? kvpress computes the budget as int(N * (1 - c)) in floating "
        "point.",
        _first_scored_length,
        integer(slips=[(lambda e: e - 1, "Off by one: 1 - 0.9 is slightly below 0.1 in floating point, so "
                                         "int(N * (1 - 0.9)) is one token short at that N."),
                       (lambda e: _first_full_length(), "At that length the budget holds only the sinks and the "
                                                         "window.")],
                hint="Find the smallest N with int(N * (1 - 0.9)) > n_sink + window.")),
    Exercise(
        "kvpress.DecodingPress(base_press=JacapPromptPress(), compression_interval=4, target_size=96) cuts the cache "
        "back to 96 slots every 4 generated tokens. How many of those 96 slots does Jacap's score choose?",
        _decoding_scored,
        integer(slips=[(lambda e: e + _PROTECTED, "That is every slot; the sinks and the recent window are protected."),
                       (lambda e: e + JacapPromptPress().window, "The sinks count too.")],
                hint="JacapPromptPress locates the sinks and the recent window by true position in a decoding buffer "
                     "too; they come out of the target size.")),
]
