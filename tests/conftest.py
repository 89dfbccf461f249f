"""Shared fixtures: tiny randomly initialised causal LMs with grouped-query attention (no downloads)."""
from __future__ import annotations

import pytest
import torch


def tiny_model(arch: str = "llama", *, layers: int = 2, seed: int = 0):
    """A random ``LlamaForCausalLM`` / ``Qwen3ForCausalLM``: hidden 64, 4 query heads sharing 2 KV heads
    (GQA, G = 2), head_dim 16, SDPA attention, eval mode, float32."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                  attn_implementation="sdpa")
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    else:
        raise ValueError(f"arch must be 'llama' or 'qwen3', got {arch!r}")
    return model.eval()


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_qwen3():
    return tiny_model("qwen3")
