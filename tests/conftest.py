"""Shared fixtures and helpers: tiny randomly initialised causal LMs with grouped-query attention (no
downloads), a random float64 attention head, a one-token-per-character tokenizer and a small document corpus.
Helpers are imported by name (``from conftest import random_head``)."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from jacap_lib.measure.kvpress_grid import tiny_model

TINY_VOCAB = 96  # tiny_model's vocabulary


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_qwen3():
    return tiny_model("qwen3")


def sharpened_tiny_llama():
    """A 2-layer tiny Llama (seed 0) whose query projections are scaled by 8, so that the random attention is
    sharp enough for an eviction to change the output measurably."""
    model = tiny_model("llama", layers=2, seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def attn_module():
    """Layer 0's attention of a random 1-layer Llama (4 query heads, 2 KV heads, head_dim 16), with the model's
    rotary embedding attached."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    module = model.model.layers[0].self_attn
    module.rotary_emb = model.model.rotary_emb
    return module


@pytest.fixture(scope="module")
def bundled():
    """The bundled SmolLM2-135M and its tokenizer, on the CPU (tests that use it are marked ``model``)."""
    from jacap_lib import load_model

    return load_model(device="cpu")


def eager_layer(n, seed):
    """A random one-layer eager Llama (4 query heads, 2 KV heads, head_dim 16, seed 0) run on ``n`` random tokens
    (seed ``seed``): ``(module, hidden_states, keys, values, attn)``: its attention module (rotary embedding
    attached), the hidden states the module was handed, the cache's keys and values and the attention weights the
    model reports, ``attn (1, H_q, n, n)`` float64."""
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    module = model.model.layers[0].self_attn
    module.rotary_emb = model.model.rotary_emb
    seen = {}
    module.register_forward_pre_hook(lambda m, a, kw: seen.update(hs=kw["hidden_states"]), with_kwargs=True)
    ids = torch.randint(0, 50, (1, n), generator=torch.Generator().manual_seed(seed))
    cache = DynamicCache()
    with torch.no_grad():
        out = model.model(input_ids=ids, past_key_values=cache, output_attentions=True)
    return module, seen["hs"], cache.layers[0].keys, cache.layers[0].values, out.attentions[0].double()


def random_head(seed=0, n=24, d=8, dtype=torch.float64):
    """Keys (n, d), values (n, d), a query centre (d,) and a positive query variance (d,) from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, d, generator=g, dtype=dtype) * 2.0
    v = torch.randn(n, d, generator=g, dtype=dtype)
    mu = torch.randn(d, generator=g, dtype=dtype) * 3.0
    lam = torch.rand(d, generator=g, dtype=dtype) + 0.1
    return k, v, mu, lam


class CharTokenizer:
    """One token per character (ids below the tiny model's vocabulary); decodes ids back to characters."""

    def __call__(self, text, return_tensors=None, add_special_tokens=False):
        return type("Enc", (), {"input_ids": torch.tensor([[ord(ch) % TINY_VOCAB for ch in text]])})()

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def write_corpus(folder, splits):
    """A manifest of one ~200-character document per entry of ``splits`` ("tune" or "dev"), ids ``kind/d<i>``,
    written with the documents to ``folder``; returns the manifest's path."""
    docs = []
    for i, split in enumerate(splits):
        text = " ".join(f"word{(i * 7 + j * j) % 23}" for j in range(40))
        f = folder / f"d{i}.txt"
        f.write_text(text)
        docs.append({"id": f"kind/d{i}", "kind": "kind", "file": str(f), "source": "test", "license": "test",
                     "sha256": hashlib.sha256(text.encode()).hexdigest(), "split": split})
    (folder / "manifest.json").write_text(json.dumps({"documents": docs}))
    return folder / "manifest.json"
