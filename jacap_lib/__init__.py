"""jacap_lib — the library behind the Jacap book.

Jacap (Yang et al., arXiv 2609.08131) evicts KV-cache entries by keeping the tokens that
preserve the most Jacobian information capacity of the retained attention. This package
holds every piece of logic the book's chapters call:

layers, low to high (a module imports only from its own layer or lower ones; ``tests/test_layers.py``
checks it):

0. :mod:`._checks`, :mod:`._env`, :mod:`._lazy`, :mod:`.config` — argument checks; where the code runs; lazy names;
   Jacap's parameters (:class:`~.config.JacapConfig`, one default and one check each)
1. :mod:`.theory`, :mod:`.examples`, :mod:`.scoring` (Algorithm 1, torch + :mod:`.scoring.triton`),
   :mod:`.stats`, :mod:`.selection` — the core
2. :mod:`.hf` (model plumbing), :mod:`.models`, :mod:`.memory`
3. :mod:`.presses` (kvpress presses + registry), :mod:`.controller` (Algorithm 2)
4. :mod:`.measure` — quality (KL), decomposition, failures, eviction inspection
5. :mod:`.results` — data access: the files under ``data/``   6. :mod:`.verdicts` — the statistics of a verdict
7. :mod:`.experiments` — one module per experiment job, numbers only (the protocol and confirmation as packages)
8. :mod:`.viz` (plotly figures)   9. :mod:`.widgets`   10. :mod:`.exercises`
11. :mod:`.report` — the sentences the book prints   12. :mod:`.cli`, :mod:`.book`

Public names are imported lazily so that ``import jacap_lib`` stays cheap and the
optional parts (transformers, kvpress, triton) load only when used.
"""
from __future__ import annotations

from ._lazy import lazy_attributes

__version__ = "0.1.0"

# public name -> module that defines it (add one line per new public name)
_EXPORTS = {
    # Jacap's parameters (one default and one check each)
    "JacapConfig": "jacap_lib.config",
    # exact small-n math and the worked examples of the theory chapters
    "softmax_jacobian": "jacap_lib.theory",
    "attention": "jacap_lib.theory",
    "attention_jacobian": "jacap_lib.theory",
    "removal_loss": "jacap_lib.theory",
    "random_cache": "jacap_lib.examples",
    "deletion_damage": "jacap_lib.examples",
    "deletion_damage_curve": "jacap_lib.examples",
    "leverage_example": "jacap_lib.examples",
    "weighted_capacity": "jacap_lib.examples",
    "selection_by_budget": "jacap_lib.examples",
    "monotonicity_counterexample": "jacap_lib.examples",
    "submodularity_counterexample": "jacap_lib.examples",
    "NOTE_U": "jacap_lib.examples",
    "NOTE_W": "jacap_lib.examples",
    # Algorithm 1 core
    "jacap_scores": "jacap_lib.scoring",
    "JacapScores": "jacap_lib.scoring",
    "select_keep": "jacap_lib.selection",
    "triton_jacap_scores": "jacap_lib.scoring.triton",
    # query statistics
    "flat_query_stats": "jacap_lib.stats",
    "ema_query_stats": "jacap_lib.stats",
    "EMAQueryStats": "jacap_lib.stats",
    # model, presses, registry
    "load_model": "jacap_lib.models",
    "JacapPress": "jacap_lib.presses.jacap_context",
    "JacapPromptPress": "jacap_lib.presses.jacap",
    # the ragged cache: only the kept entries of each head (what a head-varying press frees)
    "RaggedCache": "jacap_lib.cache.ragged",
    "RaggedPress": "jacap_lib.cache.press",
    "cache_bytes": "jacap_lib.cache.ragged",
    "list_methods": "jacap_lib.presses.registry",
    "build_press": "jacap_lib.presses.registry",
    "press_from_spec": "jacap_lib.presses.registry",
    "PRESETS": "jacap_lib.presses.presets",
    "preset": "jacap_lib.presses.presets",
    "inspect_eviction": "jacap_lib.measure.eviction",
    "describe_model": "jacap_lib.models",
    "describe_method": "jacap_lib.presses.registry",
    "EvictionInspection": "jacap_lib.measure.eviction",
    "answer": "jacap_lib.measure.eviction",
    "kl_table": "jacap_lib.measure.eviction",
    "DEMO_CONTEXT": "jacap_lib.measure.eviction",
    "DEMO_QUESTION": "jacap_lib.measure.eviction",
    "DEMO_CONTINUATION": "jacap_lib.measure.eviction",
    "facts_stated": "jacap_lib.measure.eviction",
    "phrase_kept": "jacap_lib.measure.eviction",
    "load_kl_table": "jacap_lib.results.loaders",
    "load_bench": "jacap_lib.results.loaders",
    "load_eval_summary": "jacap_lib.results.loaders",
    # quality under compression
    "next_token_kl": "jacap_lib.measure.quality",
    "full_reference": "jacap_lib.measure.quality",
    "rank_one_corrected_scores": "jacap_lib.scoring",
    "capture_heads": "jacap_lib.hf",
    "head_tensors": "jacap_lib.hf",
    # Algorithm 2 (decode-time controller)
    "JacapDecodeController": "jacap_lib.controller",
    "EvictionEvent": "jacap_lib.controller",
    "ema_trace": "jacap_lib.stats",
    # committed results
    "load_decoding_comparison": "jacap_lib.results.loaders",
    "load_failures": "jacap_lib.results.loaders",
    "decoding_summary": "jacap_lib.experiments.decoding_comparison",
    "decoding_findings": "jacap_lib.experiments.decoding_comparison",
    "decoding_verdicts": "jacap_lib.experiments.decoding_comparison",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, __all__)
