"""Algorithm 1 of Jacap on batched ``(..., N, d)`` tensors.

* :mod:`.contract` — :class:`JacapScores`, :class:`CholeskyFailure`, argument checks shared by both paths;
* :mod:`.core` — :func:`jacap_scores` (torch reference; dispatches CUDA tensors to Triton), :func:`leverage`,
  :func:`centre_attention` (the tempered and Expected Attention centres, written once);
* :mod:`.factor` — the blocked passes over the cache (K read once, V twice, in cache-sized blocks; fp16/bf16
  accumulated in float32) and the small ``d x d`` algebra (one Cholesky per head), shared with the Triton host code;
* :mod:`.noise` — the noise scale: a number, or the effective-dimension rule (:func:`deff_noise`);
* :mod:`.rank_one` — the variant with the exact rank-one softmax Jacobian;
* :mod:`.triton` — fused Triton kernels (tested on the CPU with ``TRITON_INTERPRET=1``);
* :mod:`.costs` — the cost model and the Cholesky-vs-inverse numerics of chapter "Algorithm 1 on a GPU".
"""
from __future__ import annotations

from . import costs, triton  # noqa: F401 (subpackages as attributes: scoring.costs, scoring.triton)
from .contract import CholeskyFailure, JacapScores, cholesky_with_jitter
from .core import centre_attention, jacap_scores, jacap_weight, leverage, tempered_centre, validated_scores
from .noise import deff_noise, effective_dimension, weighted_gram
from .rank_one import rank_one_corrected_scores

__all__ = ["JacapScores", "CholeskyFailure", "jacap_scores", "validated_scores", "jacap_weight", "centre_attention",
           "tempered_centre", "cholesky_with_jitter", "leverage",
           "rank_one_corrected_scores", "deff_noise", "effective_dimension", "weighted_gram"]
