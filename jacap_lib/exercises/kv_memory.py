"""Exercises of the chapter labelled ``kv-memory`` (the KV cache and what it costs)."""
from __future__ import annotations

import math

from .. import memory as MEM
from ._core import Exercise, integer, number

CHAPTER = "kv-memory"

_SMOL = dict(layers=30, kv_heads=3, head_dim=64)  # bundled SmolLM2-135M (tests read it from the GGUF header)
_QWEN8 = MEM.MODEL_KV_CONFIGS["Qwen3-8B"]
_LLAMA70 = MEM.MODEL_KV_CONFIGS["Llama-3.1-70B"]


def _qwen8_batch_gib():
    return MEM.kv_cache_bytes(_QWEN8["layers"], 8, _QWEN8["kv_heads"], 8192, _QWEN8["head_dim"],
                              MEM.DTYPE_BYTES["fp8"]) / MEM.GIB


def _smol_tokens_per_gib():
    per_token = MEM.kv_cache_bytes(_SMOL["layers"], 1, _SMOL["kv_heads"], 1, _SMOL["head_dim"], 2)
    return math.floor(MEM.GIB / per_token)


def _llama70_evicted_gib():
    kept = MEM.kept_tokens(131072, 0.9)
    return MEM.kv_cache_bytes(_LLAMA70["layers"], 1, _LLAMA70["kv_heads"], kept, _LLAMA70["head_dim"], 2) / MEM.GIB


EXERCISES = [
    Exercise(
        "KV cache (GiB, 1 GiB = 2^30 bytes) of Qwen3-8B (36 layers, 8 KV heads, 32 query heads, head_dim 128) "
        "for a batch of 8 sequences of 8192 tokens each, cached in fp8 (1 byte per number).",
        _qwen8_batch_gib,
        number(slips={0.5: "Half the answer: keys AND values are cached (the factor 2).",
                      4.0: "Four times too big: use the 8 KV heads, not the 32 query heads (GQA).",
                      8.0: "Eight times too big: s counts bytes (fp8 = 1 byte), not bits.",
                      1 / 8: "An eighth: the batch of 8 sequences multiplies the cache (b = 8).",
                      2**30 / 1e9: "You divided by 10^9 (GB); the question asks for GiB = 2^30 bytes.",
                      2.0: "Twice too big: fp8 is 1 byte per number, not 2 (or did you double the factor 2?)."})),
    Exercise(
        "How many tokens of one sequence fit in 1 GiB of KV cache for the bundled SmolLM2-135M "
        "(30 layers, 3 KV heads, head_dim 64) in fp16? (an integer)",
        _smol_tokens_per_gib,
        integer(slips=[(lambda e: e, "Close: round *down* — a partial token does not fit."),
                       (lambda e: 2 * e, "Twice too many: each token stores a key AND a value (the factor 2)."),
                       (lambda e: e / 3, "Three times too few: use the 3 KV heads, not the 9 query heads "
                                         "(GQA shares KV heads)."),
                       (lambda e: e * 1e9 / MEM.GIB, "You used 1 GB = 10^9 bytes; the question asks for "
                                                     "1 GiB = 2^30 bytes.")],
                hint="Bytes per token = 2 * L * H_kv * d_h * s; divide 2^30 by it and round down.")),
    Exercise(
        "Llama-3.1-70B (80 layers, 8 KV heads, head_dim 128), bf16, 131072 tokens, compression ratio "
        "c = 0.9 (B = round((1 - c) N) tokens kept): how many GiB does the cache take after eviction?",
        _llama70_evicted_gib,
        number(rtol=1e-3, slips={9.0: "c is the fraction *removed*: 90% of 131072 tokens go, 10% stay.",
                                 10.0: "That is the uncompressed cache; apply B = (1 - c) N.",
                                 0.5: "Half: keys AND values (the factor 2)."})),
]
