"""The live chapter's demo checks: which facts an answer states, and whether a phrase survived eviction,
on hand-built answers and a hand-built inspection (no model)."""
from __future__ import annotations

import pytest
import torch

from jacap_lib.measure.eviction import DEMO_CONTEXT, DEMO_FACTS, EvictionInspection, facts_stated, phrase_kept


def test_facts_stated_needs_the_exact_fact():
    assert facts_stated("The captain is Ingrid Voss and the fare is twelve crowns.") == \
        {"the captain": True, "the adult fare": True}
    assert facts_stated("Captain Ingrid Vossen; 12 crowns") == {"the captain": False, "the adult fare": True}
    assert facts_stated("Captain James Blackwood, eight crowns") == {"the captain": False, "the adult fare": False}
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
