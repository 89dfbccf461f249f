"""KV-cache memory arithmetic: the size formula, budgets from compression ratios, and the cache sizes of
well-known models (used by the preface's calculator and its exercises)."""
from __future__ import annotations

__all__ = ["GIB", "MODEL_KV_CONFIGS", "DTYPE_BYTES", "kv_cache_bytes", "kept_tokens", "bundled_kv_config",
           "kv_memory_table"]

GIB = 1024**3

# Public config values (config.json on the Hugging Face hub) of well-known models:
# layers L, KV heads H_kv, head dimension d_h.
MODEL_KV_CONFIGS = {
    "Llama-3.1-8B": dict(layers=32, kv_heads=8, head_dim=128),
    "Llama-3.1-70B": dict(layers=80, kv_heads=8, head_dim=128),
    "Qwen3-8B": dict(layers=36, kv_heads=8, head_dim=128),
    "Qwen3-14B": dict(layers=40, kv_heads=8, head_dim=128),
    "Mistral-7B-v0.1": dict(layers=32, kv_heads=8, head_dim=128),
}

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int4": 0.5}


def kv_cache_bytes(layers: int, batch: int, kv_heads: int, tokens: int, head_dim: int, bytes_per_scalar: float) -> float:
    r"""KV-cache size :math:`M_{KV} = 2\,L\,b\,H_{kv}\,T\,d_h\,s` in bytes (keys and values)."""
    for name, value in (("layers", layers), ("batch", batch), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if int(value) != value or value < 1:
            raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
    if int(tokens) != tokens or tokens < 0:
        raise ValueError(f"`tokens` must be a non-negative integer, got {tokens!r}")
    if not bytes_per_scalar > 0:
        raise ValueError(f"`bytes_per_scalar` must be > 0 (2 for bf16), got {bytes_per_scalar!r}")
    return 2.0 * layers * batch * kv_heads * tokens * head_dim * bytes_per_scalar


def kept_tokens(n: int, compression: float) -> int:
    r"""Tokens kept at compression ratio :math:`c`: :math:`B = \max(1, \lfloor (1-c)N \rfloor)`, kvpress's count and
    the glossary's (:func:`jacap_lib.selection.n_kept`, the one rule every press follows)."""
    from .selection import n_kept

    from ._checks import compression_ratio

    compression_ratio(compression, "`compression`")
    return n_kept(n, compression)


def bundled_kv_config() -> dict:
    """Layers, KV heads and head dimension of the bundled SmolLM2-135M, read from its GGUF header."""
    import gguf

    from .models import bundled_gguf_path

    fields = gguf.GGUFReader(bundled_gguf_path()).fields
    arch = fields["general.architecture"].contents()

    def get(key):
        return int(fields[f"{arch}.{key}"].contents())

    heads = get("attention.head_count")
    return dict(layers=get("block_count"), kv_heads=get("attention.head_count_kv"),
                head_dim=get("embedding_length") // heads)


def kv_memory_table(configs: dict, *, tokens: int, batch: int = 1, dtype: str = "bf16", compression: float = 0.0) -> list[dict]:
    """One row per model: its config and the cache size in GiB at ``tokens`` tokens (after compression)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"`dtype` must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    kept = kept_tokens(tokens, compression)
    rows = []
    for name, cfg in configs.items():
        size = kv_cache_bytes(cfg["layers"], batch, cfg["kv_heads"], kept, cfg["head_dim"], DTYPE_BYTES[dtype])
        rows.append(dict(model=name, **cfg, tokens_kept=kept, gib=size / GIB))
    return rows
