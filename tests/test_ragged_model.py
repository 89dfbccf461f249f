"""The ragged cache on the bundled model: the same logits as kvpress's masked cache, the same greedy needle answers,
c = 0 is the uncompressed model, and the default press holds about 1 - c of the bytes.

"The same kept set": one prefill under the press leaves its masks (kvpress's ``masked_key_indices``) on the
attention modules; the masked path continues on a copy of that dense cache, the ragged path on the cache turned
ragged from the same masks. Tolerance: atol 2e-3 on float32 logits (their scale is about 30) and the same argmax at
every position. The masked path is the looser of the two: kvpress overwrites a dropped key with a "fake" key whose
score is only very negative, not -inf, and with many keys dropped its weights leak (on this prompt at c = 0.9,
AdaKV(SnapKV): 1.5e-3 on the logits in float32, 3e-4 in float64; with 90 % of keys dropped at random, 0.14 at layer
0's output), while the ragged path equals dense attention over the kept keys to rounding: checked here against an
independent exact reference, a dense cache physically cut to the same tokens in every head (atol 1e-4), and against
brute force on random tensors in ``tests/test_ragged_cache.py``.
"""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

pytestmark = pytest.mark.model

LOGIT_ATOL = 2e-3
LENGTH = 256  # the needle prompt's context tokens: short, for CI's two CPU cores


@pytest.fixture(scope="module")
def model_tok():
    """A bundled model of this module's own (its attention gets switched to the ragged one)."""
    from jacap_lib import load_model

    return load_model(device="cpu")


@pytest.fixture(scope="module")
def needle(model_tok):
    from jacap_lib.measure.passkey import passkey_inputs

    _, tok = model_tok
    ctx, question, _ = passkey_inputs(tok, LENGTH, 0.4, "73914", "after")
    return ctx, question


def _press(name, c, free_memory=False):
    from kvpress import AdaKVPress, KVzipPress, SnapKVPress

    from jacap_lib import JacapPress, RaggedPress

    if name == "default":
        return JacapPress(compression_ratio=c, free_memory=free_memory)
    inner = KVzipPress(compression_ratio=c) if name == "kvzip" else AdaKVPress(SnapKVPress(compression_ratio=c))
    return RaggedPress(inner) if free_memory else inner


def _copy(cache):
    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.clone(), layer.values.clone(), i)
    return out


@torch.inference_mode()
def _prefill(model, ids, press=None):
    cache = DynamicCache()
    if press is None:
        model.model(input_ids=ids, past_key_values=cache)
    else:
        with press(model):
            model.model(input_ids=ids, past_key_values=cache)
    return cache


@torch.inference_mode()
def _logits(model, cache, n, cont):
    pos = torch.arange(n, n + cont.shape[1])[None]
    return model(input_ids=cont, past_key_values=cache, position_ids=pos).logits[0]


@torch.inference_mode()
@pytest.mark.parametrize("name", ["default", "kvzip", "adakv_snapkv"])
@pytest.mark.parametrize("c", [0.5, 0.9])
def test_ragged_logits_equal_the_masked_path(model_tok, needle, name, c):
    from jacap_lib.cache import cache_bytes, is_ragged, to_ragged
    from jacap_lib.hf import clear_masks

    model, _ = model_tok
    ctx, question = needle
    n = ctx.shape[1]
    cache = _prefill(model, ctx, _press(name, c))
    masked = _copy(cache)
    dense_bytes = cache_bytes(masked)
    want = _logits(model, masked, n, question)  # kvpress's masks still on the modules: the masked path
    to_ragged(cache, model)  # the same masks, now freed
    assert is_ragged(cache) and all(getattr(m.self_attn, "masked_key_indices", None) is None
                                    for m in model.model.layers)
    assert cache_bytes(cache) <= (1 - c + 0.02) * dense_bytes
    got = _logits(model, cache, n, question)
    clear_masks(model)
    torch.testing.assert_close(got, want, atol=LOGIT_ATOL, rtol=0)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert cache.get_seq_length() == n + question.shape[1]  # the question went into every head's tail


@torch.inference_mode()
def test_greedy_needle_answers_identical(model_tok, needle):
    from jacap_lib.cache import to_ragged
    from jacap_lib.measure.passkey import greedy_answer

    model, tok = model_tok
    ctx, question = needle
    n = ctx.shape[1]
    cache = _prefill(model, ctx, _press("default", 0.5))
    masked = _copy(cache)
    masks = [m.self_attn.masked_key_indices for m in model.model.layers]
    answer_masked = greedy_answer(model, masked, n, question, n_new=8)  # clears the masks at its end
    for m, idx in zip(model.model.layers, masks):
        m.self_attn.masked_key_indices = idx
    to_ragged(cache, model)
    answer_ragged = greedy_answer(model, cache, n, question, n_new=8)
    assert answer_ragged == answer_masked
    assert "73914" in tok.decode(answer_ragged).replace(" ", "")


@torch.inference_mode()
@pytest.mark.parametrize("name", ["default", "adakv_snapkv"])
def test_c0_is_the_uncompressed_model(model_tok, needle, name):
    from jacap_lib.cache import is_ragged

    model, _ = model_tok
    ctx, question = needle
    n = ctx.shape[1]
    want = _logits(model, _prefill(model, ctx), n, question)
    cache = _prefill(model, ctx, _press(name, 0.0, free_memory=True))
    assert not is_ragged(cache)  # nothing dropped: nothing to free
    assert torch.equal(_logits(model, cache, n, question), want)


@torch.inference_mode()
def test_the_default_press_frees_memory_as_a_user_calls_it(model_tok, needle):
    """``JacapPress(compression_ratio=0.5)`` with ``with press(model)`` then ``model.generate``: at most 52 % of the
    uncompressed bytes, the same greedy tokens as its masked cache (free_memory=False)."""
    from jacap_lib import JacapPress, cache_bytes
    from jacap_lib.cache import is_ragged

    model, _ = model_tok
    ctx, question = needle
    dense = cache_bytes(_prefill(model, ctx))
    outs = []
    for free in (False, True):
        cache = _prefill(model, ctx, JacapPress(compression_ratio=0.5, free_memory=free))
        assert is_ragged(cache) == free
        ratio = cache_bytes(cache) / dense
        if free:
            assert ratio <= 0.52
        else:
            # kvpress's masking frees nothing; KVzip's pass leaves the cache a view of a storage that also holds
            # its last reconstruction chunk, so the masked cache holds more than the uncompressed one
            assert ratio >= 1.0
        full = torch.cat([ctx, question], 1)
        out = model.generate(full, attention_mask=torch.ones_like(full), past_key_values=cache, max_new_tokens=6,
                             do_sample=False, pad_token_id=0)
        outs.append(out[0, full.shape[1]:].tolist())
        for m in model.model.layers:
            m.self_attn.masked_key_indices = None
    assert outs[0] == outs[1]


def test_kvpress_pipeline_answers_from_the_freed_cache(model_tok):
    """kvpress's pipeline (prefill under the press, questions answered from the same cache, each answer cut off
    after it) gives the same answers from the ragged cache as from the masked one."""
    from transformers import pipeline

    from jacap_lib import JacapPress, cache_bytes
    from jacap_lib.cache import is_ragged

    model, tok = model_tok
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok)
    context = "Maria keeps her bicycle in the blue shed behind the bakery. Every Tuesday she rides it to the market. " * 6
    questions = ["Where does Maria keep her bicycle?", "On which day does she ride to the market?"]
    answers, held = [], []
    for free in (False, True):
        cache = DynamicCache()
        out = pipe(context, questions=questions, press=JacapPress(compression_ratio=0.5, free_memory=free),
                   cache=cache, max_new_tokens=12)
        answers.append(out["answers"])
        held.append(cache_bytes(cache))
        assert is_ragged(cache) == free
        assert cache.get_seq_length() == cache.layers[0].get_seq_length()
    assert answers[0] == answers[1]
    assert held[1] < 0.55 * held[0]


@torch.inference_mode()
def test_ragged_equals_a_dense_cache_cut_to_the_same_tokens(model_tok, needle):
    """Every head keeps the same random 40 % of the prompt (the first token too): a dense cache cut to those tokens is
    an exact reference (sdpa over the kept keys, no masking); the ragged cache of that keep mask gives its logits."""
    from jacap_lib.cache import to_ragged

    model, _ = model_tok
    ctx, question = needle
    n = ctx.shape[1]
    g = torch.Generator().manual_seed(0)
    kept = torch.rand(n, generator=g) < 0.4
    kept[0] = True
    cache = _prefill(model, ctx)
    cut = DynamicCache()
    for i, layer in enumerate(cache.layers):
        cut.update(layer.keys[:, :, kept].clone(), layer.values[:, :, kept].clone(), i)
    want = _logits(model, cut, n, question)
    b, h = cache.layers[0].keys.shape[:2]
    to_ragged(cache, model, keep=[kept.expand(b, h, n)] * len(cache.layers))
    torch.testing.assert_close(_logits(model, cache, n, question), want, atol=1e-4, rtol=0)


@torch.inference_mode()
def test_library_continuation_helper_reads_the_ragged_cache(model_tok, needle):
    """``quality.continue_from_cache`` on the ragged cache: the masked path's log-probabilities (atol 2e-3) and the
    same mean kept count per (layer, KV head)."""
    from jacap_lib.cache import to_ragged
    from jacap_lib.measure.quality import continue_from_cache

    model, _ = model_tok
    ctx, question = needle
    n = ctx.shape[1]
    cache = _prefill(model, ctx, _press("adakv_snapkv", 0.75))
    masked = _copy(cache)
    masks = [m.self_attn.masked_key_indices for m in model.model.layers]
    lp_masked, _, kept_masked = continue_from_cache(model, masked, n, question)  # clears the masks at its end
    for m, idx in zip(model.model.layers, masks):
        m.self_attn.masked_key_indices = idx
    to_ragged(cache, model)
    lp_ragged, _, kept_ragged = continue_from_cache(model, cache, n, question)
    torch.testing.assert_close(lp_ragged, lp_masked, atol=2e-3, rtol=0)
    assert kept_ragged == pytest.approx(kept_masked, abs=1e-9)
    assert kept_ragged == pytest.approx(n - int(0.75 * n), abs=1)


@torch.inference_mode()
def test_inspection_of_the_freeing_default_sees_the_masked_kept_set(model_tok):
    """``inspect_eviction`` with ``JacapPress()`` (free_memory) reads the kept set off the ragged cache: the same
    kept positions as the masked press, and the bytes it holds are those the masked press's entries hold once freed."""
    from jacap_lib import JacapPress, inspect_eviction

    model, tok = model_tok
    text = "The lighthouse keeper counted the ships every night and wrote their names in a book. " * 6
    masked = inspect_eviction(model, tok, text, JacapPress(compression_ratio=0.5, free_memory=False))
    freed = inspect_eviction(model, tok, text, JacapPress(compression_ratio=0.5))
    assert torch.equal(freed.kept_mask, masked.kept_mask)
    assert freed.bytes_held == masked.bytes_freed < 0.52 * masked.bytes_full
