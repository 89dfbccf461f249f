"""jacap_lib — the library behind the Jacap book.

Jacap (Yang et al., arXiv 2609.08131) evicts KV-cache entries by keeping the tokens that
preserve the most Jacobian information capacity of the retained attention. This package
holds every piece of logic the book's chapters call:

* :mod:`jacap_lib.theory`   exact small-n math (softmax Jacobian, capacities, set selection)
* :mod:`jacap_lib.scoring`  Algorithm 1 on ``(..., N, d)`` tensors (:func:`jacap_scores`)
* :mod:`jacap_lib.select`   protected regions + budget -> kept indices (:func:`select_keep`)
* :mod:`jacap_lib.stats`    query statistics (flat mean, EMA with beta)
* :mod:`jacap_lib.presses`  kvpress presses and the method registry
* :mod:`jacap_lib.kernels`  Triton kernels for the GPU scoring core
* :mod:`jacap_lib.analysis` error decomposition and quality measurements

Public names are imported lazily so that ``import jacap_lib`` stays cheap and the
optional parts (transformers, kvpress, triton) load only when used.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it (add one line per new public name)
_EXPORTS = {
    # Algorithm 1 core
    "jacap_scores": "jacap_lib.scoring",
    "JacapScores": "jacap_lib.scoring",
    "select_keep": "jacap_lib.select",
    "triton_jacap_scores": "jacap_lib.kernels",
    # query statistics
    "flat_query_stats": "jacap_lib.stats",
    "ema_query_stats": "jacap_lib.stats",
    "EMAQueryStats": "jacap_lib.stats",
    # model, presses, registry
    "load_model": "jacap_lib.models",
    "JacapPress": "jacap_lib.presses.jacap",
    "list_methods": "jacap_lib.presses.registry",
    "build_press": "jacap_lib.presses.registry",
    "inspect_eviction": "jacap_lib.inspect",
    "describe_model": "jacap_lib.models",
    "describe_method": "jacap_lib.presses.registry",
    "EvictionInspection": "jacap_lib.inspect",
    # quality under compression
    "next_token_kl": "jacap_lib.analysis.quality",
    "full_reference": "jacap_lib.analysis.quality",
    "rank_one_corrected_scores": "jacap_lib.analysis.decomposition",
    "capture_heads": "jacap_lib.analysis.decomposition",
    # Algorithm 2 (decode-time controller)
    "JacapDecodeController": "jacap_lib.decoding",
    "EvictionEvent": "jacap_lib.decoding",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jacap_lib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
