"""The live chapter's demo checks: which facts an answer states, and whether a phrase survived eviction,
on hand-built answers and a hand-built inspection (no model)."""
from __future__ import annotations

import pytest
import torch

from jacap_lib.measure.eviction import DEMO_CONTEXT, DEMO_FACTS, EvictionInspection, facts_stated, phrase_kept


def test_facts_stated_needs_the_exact_fact():
    assert facts_stated("The captain is Ingrid Voss and the fare is twelve crowns.") == \
        {"the captain's name": True, "the adult fare": True}
    assert facts_stated("Captain Ingrid Vossen; 12 crowns") == {"the captain's name": False, "the adult fare": True}
    assert facts_stated("Captain James Blackwood, eight crowns") == {"the captain's name": False, "the adult fare": False}
    assert all(facts_stated(DEMO_CONTEXT).values())  # every fact is in the demo text
    assert set(facts_stated("", DEMO_FACTS)) == set(DEMO_FACTS)
    with pytest.raises(ValueError, match="reply"):
        facts_stated(None)


def _inspection(tokens, kept):
    kept = torch.tensor(kept)
    return EvictionInspection(method="x", compression_ratio=0.5, options={}, token_ids=list(range(len(tokens))),
                              tokens=tokens, kept=kept)


def test_phrase_kept_counts_caches_keeping_every_token():
    tokens = ["The", " captain", ",", " Ing", "rid", " Voss", ",", " sails"]
    # 2 layers x 2 heads, 5 kept each; " Ing" "rid" " Voss" are positions 3, 4, 5
    kept = [[[0, 3, 4, 5, 7], [0, 1, 3, 4, 7]],
            [[3, 4, 5, 6, 7], [0, 1, 2, 3, 5]]]
    insp = _inspection(tokens, kept)
    assert phrase_kept(insp, "Ingrid Voss") == pytest.approx(0.5)   # caches (0, 0) and (1, 0)
    assert phrase_kept(insp, "Voss") == pytest.approx(0.75)
    assert phrase_kept(insp, "The") == pytest.approx(0.75)
    with pytest.raises(ValueError, match="does not occur"):
        phrase_kept(insp, "Blackwood")


def test_answers_note_judges_against_the_uncompressed_answer():
    from jacap_lib.viz.live import answers_note

    full = "The captain is Ingrid Voss, a retired sailor."       # states the name, not the fare
    note = answers_note({"full cache": full, "c = 0.5": "Captain Ingrid Vossen.", "c = 0.25": full}, {0.5: 0.16})
    assert "states the captain's name but not the adult fare" in note
    assert "The c = 0.5 answer loses the captain's name" in note and "c = 0.25 answer" not in note
    assert "16% of the caches at c = 0.5" in note
    assert "Every compressed answer still states it" in answers_note({"full cache": full, "x": full})
    assert "states none" in answers_note({"full cache": "I do not know.", "x": "Ingrid Voss"})
    where = {"where": r"blue shed"}
    assert "loses where" in answers_note({"full cache": "in the blue shed", "p": "in the blue jeans"}, facts=where)
    with pytest.raises(ValueError, match="uncompressed"):
        answers_note({"x": full})
