"""The kind of a verdict: :func:`~jacap_lib.verdicts.intervals.verdict` writes a verdict as a short sentence
("better by …", "worse by …", "no detectable difference; …", "no difference: identical on every document");
:func:`verdict_word` reads its kind back and :func:`verdict_counts` counts the kinds over rows, the one home of
that count."""
from __future__ import annotations

__all__ = ["WORDS", "verdict_word", "verdict_counts"]


#: the four verdict kinds, in the order the counts are printed
WORDS = ("better", "worse", "no detectable difference", "identical")


def verdict_word(sentence: str) -> str:
    """The kind of a :func:`~jacap_lib.verdicts.intervals.verdict` sentence: one of :data:`WORDS`."""
    if not isinstance(sentence, str):
        raise ValueError(f"sentence must be a verdict sentence (str), got {sentence!r}")
    if sentence.startswith("no difference: identical"):
        return "identical"
    if sentence.startswith("no detectable difference"):
        return "no detectable difference"
    for w in ("better", "worse"):
        if sentence == w or sentence.startswith(w + " by"):  # a test's verdict is the bare word
            return w
    raise ValueError(f"{sentence!r} is not a verdict sentence of jacap_lib.verdicts.intervals "
                     "(better [by] / worse [by] / no detectable difference / no difference: identical)")


def verdict_counts(rows) -> dict[str, int]:
    """``{kind: number of rows}`` over :data:`WORDS` (zeros included) from each row's ``verdict``."""
    counts = dict.fromkeys(WORDS, 0)
    for r in rows:
        counts[verdict_word(r["verdict"])] += 1
    return counts
