"""The ragged cache and its attention against brute force, on random tensors and a tiny random Llama.

The brute force is dense attention in float64 with the dropped prompt keys removed by a boolean mask (each query
head reads its KV head's kept set, GQA), causal among the new tokens. The ragged path packs the kept entries and
merges two online-softmax partials, so agreement is to float32 rounding (atol 1e-5 on unit-scale outputs).
"""
from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache

from jacap_lib.cache import RaggedCache, RaggedKV, RaggedLayer, cache_bytes, is_ragged, kept_per_head, to_ragged
from jacap_lib.cache.attention import RAGGED_ATTENTION, ragged_attention_torch, use_ragged_attention
from jacap_lib.cache.convert import keep_from_masks
from jacap_lib.measure.kvpress_grid import tiny_model


def brute_force(query, keys, values, new_keys, new_values, keep, scale, pad=None):
    """Dense masked attention in float64: ``query (B, Hq, q, d)`` over the kept prompt keys ``keys (B, H, N, d)``
    (``keep (B, H, N)``) and the new keys ``(B, H, t, d)``, the ``q`` queries being the last ``q`` new ones.
    ``pad (B, N + t)`` bool: False positions are never attended."""
    B, Hq, q, d = query.shape
    H, N, t = keys.shape[1], keys.shape[2], new_keys.shape[2]
    G = Hq // H
    out = torch.zeros(B, Hq, q, values.shape[-1], dtype=torch.float64)
    for b in range(B):
        for j in range(Hq):
            h = j // G
            K = torch.cat([keys[b, h], new_keys[b, h]]).double()
            V = torch.cat([values[b, h], new_values[b, h]]).double()
            for i in range(q):
                visible = torch.cat([keep[b, h], torch.arange(t) <= t - q + i])
                if pad is not None:
                    visible = visible & pad[b]
                s = (K @ query[b, j, i].double()) * scale
                s = s.masked_fill(~visible, -math.inf)
                out[b, j, i] = torch.softmax(s, 0) @ V
    return out


def random_layer(B=2, H=2, N=23, d=8, seed=0, p_keep=0.6):
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(B, H, N, d, generator=g), torch.randn(B, H, N, d, generator=g)
    keep = torch.rand(B, H, N, generator=g) < p_keep
    if H > 1:
        keep[0, 1] = False  # a head that kept nothing
    if B > 1:
        keep[1, 0] = True  # a head that kept everything
    return keys, values, keep


@pytest.mark.parametrize("q_len,t_before", [(1, 0), (1, 3), (5, 0), (4, 2)])
def test_attention_equals_dense_masked(q_len, t_before):
    keys, values, keep = random_layer()
    B, H, N, d = keys.shape
    G = 3
    layer = RaggedLayer.from_dense(keys, values, keep)
    g = torch.Generator().manual_seed(1)
    t = t_before + q_len
    new_k, new_v = torch.randn(B, H, t, d, generator=g), torch.randn(B, H, t, d, generator=g)
    if t_before:
        layer.update(new_k[:, :, :t_before], new_v[:, :, :t_before])
    k, v = layer.update(new_k[:, :, t_before:], new_v[:, :, t_before:])
    query = torch.randn(B, H * G, q_len, d, generator=g)
    scale = d ** -0.5
    got = ragged_attention_torch(query, k, v, scale)
    want = brute_force(query, keys, values, new_k, new_v, keep, scale)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    assert layer.get_seq_length() == N + t


def test_padding_mask_masks_packed_entries_at_their_positions():
    keys, values, keep = random_layer(seed=3)
    B, H, N, d = keys.shape
    layer = RaggedLayer.from_dense(keys, values, keep)
    g = torch.Generator().manual_seed(4)
    q_len = 3
    new_k, new_v = torch.randn(B, H, q_len, d, generator=g), torch.randn(B, H, q_len, d, generator=g)
    k, v = layer.update(new_k, new_v)
    pad = torch.ones(B, N + q_len, dtype=torch.bool)
    pad[0, :5] = False  # batch 0 left-padded by 5
    causal = torch.arange(N + q_len)[None, :] <= (N + torch.arange(q_len))[:, None]
    mask4d = (causal[None] & pad[:, None, :])[:, None]  # (B, 1, q, N + q) as transformers' sdpa mask
    query = torch.randn(B, 2 * H, q_len, d, generator=g)
    got = ragged_attention_torch(query, k, v, 0.3, mask4d)
    want = brute_force(query, keys, values, new_k, new_v, keep, 0.3, pad=pad)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


def test_packing_frees_the_dense_storage_and_keeps_positions():
    keys, values, keep = random_layer(B=1, H=3, N=40, d=16, seed=5, p_keep=0.5)
    cache = DynamicCache()
    cache.update(keys.clone(), values.clone(), 0)
    dense = cache_bytes(cache)
    assert dense == 2 * keys.numel() * 4
    to_ragged(cache, keep=[keep])
    assert is_ragged(cache)
    layer = cache.layers[0]
    kept = int(keep.sum())
    # kept keys and values (float32), 4-byte positions, (B H + 1) int64 offsets, empty tails
    assert cache_bytes(cache) == 2 * kept * 16 * 4 + kept * 4 + (3 + 1) * 8
    for h in range(3):
        torch.testing.assert_close(layer.keys.head(0, h), keys[0, h, keep[0, h]])
        assert layer.keys.head_positions(0, h).tolist() == keep[0, h].nonzero().flatten().tolist()
    assert kept_per_head(cache).tolist() == [keep.sum(-1).tolist()]
    assert cache.get_seq_length() == 40  # the uncompressed length: new tokens get positions 40, 41, ...


def test_cut_along_the_sequence_axis_as_kvpress_pipeline_does():
    keys, values, keep = random_layer(B=1, H=2, N=12, d=4, seed=6)
    layer = RaggedLayer.from_dense(keys, values, keep)
    n = layer.get_seq_length()
    layer.update(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))
    assert layer.keys.shape == (1, 2, 17, 4)
    layer.keys, layer.values = layer.keys[:, :, :n], layer.values[:, :, :n]  # the pipeline's _remove_answer_from_cache
    assert layer.get_seq_length() == 12 and layer.keys.tail.shape[2] == 0
    layer.crop(7)  # into the prompt: only positions < 7 stay
    assert layer.get_seq_length() == 7
    for h in range(2):
        want = keep[0, h].clone()
        want[7:] = False
        torch.testing.assert_close(layer.values.head(0, h), values[0, h, want])
    with pytest.raises(TypeError, match="sequence axis"):
        layer.keys[0]
    with pytest.raises(TypeError, match="RaggedKV"):
        layer.keys = torch.zeros(1, 2, 3, 4)


def test_keep_from_kvpress_masks_and_bad_input():
    model = tiny_model("llama", layers=2, seed=0)
    keys, values, keep = random_layer(B=1, H=2, N=10, d=16, seed=7)
    cache = DynamicCache()
    for i in range(2):
        cache.update(keys.clone(), values.clone(), i)
    b, h, s = (~keep).nonzero(as_tuple=True)
    model.model.layers[1].self_attn.masked_key_indices = (b, h, s)
    masks = keep_from_masks(model, cache)
    assert masks[0] is None and torch.equal(masks[1], keep)
    with pytest.raises(ValueError, match="one entry per cache layer"):
        to_ragged(cache, keep=[keep])
    with pytest.raises(ValueError, match="needs `model`"):
        to_ragged(cache)
    with pytest.raises(ValueError, match="bool tensor of shape"):
        RaggedLayer.from_dense(keys, values, keep.float())
    to_ragged(cache, model)
    assert model.model.layers[1].self_attn.masked_key_indices is None
    assert model.config._attn_implementation == RAGGED_ATTENTION["sdpa"]
    assert kept_per_head(cache).tolist() == [[[10, 10]], keep.sum(-1).tolist()]


def _masked_vs_ragged(model, prompt, cont, keep):
    """Logits of ``cont`` after ``prompt`` with ``keep (L, 1, H, N)`` applied as kvpress masks and as a ragged cache."""
    from jacap_lib.hf import clear_masks

    N = prompt.shape[1]
    pos = torch.arange(N, N + cont.shape[1])[None]
    out = []
    for ragged in (False, True):
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=prompt, past_key_values=cache)
            for layer in model.model.layers:
                b, h, s = (~keep[layer.self_attn.layer_idx]).nonzero(as_tuple=True)
                layer.self_attn.masked_key_indices = (b, h, s)
            if ragged:
                to_ragged(cache, model)
            out.append(model(input_ids=cont, past_key_values=cache, position_ids=pos).logits)
            clear_masks(model)
    return out


def test_tiny_model_logits_equal_the_masked_path():
    model = tiny_model("llama", layers=2, seed=0)
    g = torch.Generator().manual_seed(8)
    prompt, cont = torch.randint(0, 96, (1, 30), generator=g), torch.randint(0, 96, (1, 6), generator=g)
    keep = torch.rand(2, 1, 2, 30, generator=g) < 0.5
    keep[..., 0] = True
    masked, ragged = _masked_vs_ragged(model, prompt, cont, keep)
    torch.testing.assert_close(ragged, masked, atol=1e-5, rtol=0)
    assert model.config._attn_implementation == "jacap_ragged"
    # a dense cache on the switched model runs the model's own sdpa: the same logits as before the switch
    fresh = tiny_model("llama", layers=2, seed=0)
    with torch.no_grad():
        assert torch.equal(model(input_ids=prompt).logits, fresh(input_ids=prompt).logits)


def test_generate_decodes_from_the_ragged_cache_as_from_the_masked_one():
    model = tiny_model("llama", layers=2, seed=1)
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, 96, (1, 25), generator=g)
    question = torch.randint(0, 96, (1, 4), generator=g)
    keep = torch.rand(2, 1, 2, 25, generator=g) < 0.4
    answers = []
    for ragged in (False, True):
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=prompt, past_key_values=cache)
        for layer in model.model.layers:
            layer.self_attn.masked_key_indices = tuple((~keep[layer.self_attn.layer_idx]).nonzero(as_tuple=True))
        if ragged:
            to_ragged(cache, model)
        full = torch.cat([prompt, question], 1)
        out = model.generate(full, attention_mask=torch.ones_like(full), past_key_values=cache, max_new_tokens=6,
                             do_sample=False, pad_token_id=0)
        answers.append(out[0, full.shape[1]:].tolist())
        for layer in model.model.layers:
            layer.self_attn.masked_key_indices = None
    assert answers[0] == answers[1]
    assert len(answers[1]) == 6


def test_ragged_cache_from_dense_and_attention_switch():
    keys, values, keep = random_layer(B=1, H=2, N=9, d=4, seed=10)
    cache = RaggedCache.from_dense([keys, keys], [values, values], torch.stack([keep, keep]))
    assert len(cache) == 2 and cache.get_seq_length(1) == 9
    with pytest.raises(ValueError, match="one entry per layer"):
        RaggedCache.from_dense([keys], [values, values], [keep])
    model = tiny_model("llama", layers=1, seed=0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        use_ragged_attention(model)
    with pytest.raises(NotImplementedError, match="beam search"):
        cache.layers[0].reorder_cache(torch.tensor([0]))


def test_ragged_kv_repr_and_shape():
    keys, values, keep = random_layer(B=1, H=2, N=9, d=4, seed=11)
    kv = RaggedLayer.from_dense(keys, values, keep).keys
    assert isinstance(kv, RaggedKV)
    assert kv.shape == (1, 2, 9, 4) and kv.lengths.tolist() == keep.sum(-1).tolist()
    assert f"kept={int(keep.sum())}" in repr(kv)


def test_free_memory_is_no_part_of_a_record_and_the_registry_builds_the_masked_press():
    """``JacapPress(free_memory=True)`` (the default) frees memory; the registry builds the measured, masked press
    unless asked, and no record, spec or equality sees the field (committed fingerprints stay as they are)."""
    from jacap_lib import JacapPress
    from jacap_lib.cache import RaggedPress
    from jacap_lib.presses import registry as R

    name = next(n for n, m in R.METHODS.items() if m.press is JacapPress and not m.options)
    assert JacapPress().free_memory is True
    assert R.build_press(name, 0.5).free_memory is False
    assert R.build_press(name, 0.5, free_memory=True).free_memory is True
    assert "free_memory" not in R.method_options(JacapPress(compression_ratio=0.5))
    assert R.method_options(JacapPress(compression_ratio=0.5)) == R.method_options(R.build_press(name, 0.5))
    assert JacapPress(compression_ratio=0.5) == JacapPress(compression_ratio=0.5, free_memory=False)
    assert "free_memory" not in R.valid_options(name)
    with pytest.raises(ValueError, match="free_memory"):
        JacapPress(free_memory="yes")
    with pytest.raises(ValueError, match="kvpress press"):
        RaggedPress(object())
    wrapped = RaggedPress(R.build_press("snapkv", 0.25))
    assert wrapped.compression_ratio == 0.25
    wrapped.compression_ratio = 0.5
    assert wrapped.press.compression_ratio == 0.5


def test_kept_mask_round_trips_and_a_second_conversion_is_a_no_op_only_for_the_same_set():
    from jacap_lib.cache.convert import kept_mask

    keys, values, keep = random_layer(B=2, H=3, N=17, d=4, seed=12)
    cache = DynamicCache()
    cache.update(keys, values, 0)
    to_ragged(cache, keep=[keep])
    assert torch.equal(kept_mask(cache.layers[0]), keep)
    to_ragged(cache, keep=[keep])  # the same kept set: nothing to do
    with pytest.raises(ValueError, match="another kept set"):
        to_ragged(cache, keep=[torch.ones_like(keep)])
