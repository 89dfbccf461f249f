"""Tests for jacap_lib.measure.quality on a tiny random Llama (no download, < 2 s)."""
import pytest
import torch
import torch.nn.functional as F

kvpress = pytest.importorskip("kvpress")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from jacap_lib.measure.quality import (  # noqa: E402
    attention_output_error,
    capture_prefill,
    replay_press,
    full_reference,
    kl_from_logits,
    next_token_kl,
)

P, M, V = 40, 8, 97


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"  # kvpress AdaKV refuses eager
    model = LlamaForCausalLM(cfg).eval()
    # sharpen the random model so that eviction changes the output measurably
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    ids = torch.randint(0, V, (1, P + M), generator=torch.Generator().manual_seed(1))
    return model, ids


def test_no_compression_gives_zero_kl(tiny):
    model, ids = tiny
    ref = full_reference(model, None, ids[:, :P], ids[:, P:])
    r = next_token_kl(model, None, ids[:, :P], ids[:, P:], None, reference=ref)
    assert r.kl < 1e-6 and r.attn_rel_error < 1e-6
    assert r.kept_tokens == P and r.top1_agreement == 1.0


def test_kl_matches_masked_full_forward(tiny):
    """StreamingLLM keeps the same tokens in every layer and head, so the compressed run must equal a
    single forward over prompt+continuation where the continuation cannot see the evicted prompt tokens."""
    model, ids = tiny
    press = kvpress.StreamingLLMPress(compression_ratio=0.5, n_sink=4)
    r = next_token_kl(model, None, ids[:, :P], ids[:, P:], press)
    n_kept = P // 2
    keep = torch.zeros(P, dtype=torch.bool)
    keep[:4] = True
    keep[P - (n_kept - 4):] = True
    T = P + M
    allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))
    allowed[P:, :P] &= keep
    mask = torch.zeros(1, 1, T, T).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        full = model(input_ids=ids).logits[0, P:].float().log_softmax(-1)
        masked = model(input_ids=ids, attention_mask=mask).logits[0, P:].float().log_softmax(-1)
    expected = F.kl_div(masked, full, log_target=True, reduction="none").sum(-1)
    assert r.kept_tokens == n_kept
    assert r.kl > 1e-4  # eviction really changed something
    torch.testing.assert_close(r.kl_per_token, expected, rtol=1e-3, atol=1e-6)


def test_kl_nonnegative_and_grows_with_compression(tiny):
    model, ids = tiny
    ref = full_reference(model, None, ids[:, :P], ids[:, P:])
    kls = [next_token_kl(model, None, ids[:, :P], ids[:, P:], kvpress.KnormPress(c), reference=ref).kl
           for c in (0.25, 0.9)]
    assert min(kls) >= 0.0
    assert kls[1] > kls[0]


def test_kl_from_logits_matches_torch():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 11, generator=g).log_softmax(-1)
    b = torch.randn(5, 11, generator=g).log_softmax(-1)
    torch.testing.assert_close(kl_from_logits(a, b), F.kl_div(b, a, log_target=True, reduction="none").sum(-1))
    assert torch.equal(kl_from_logits(a, a), torch.zeros(5))


def test_attention_output_error_closed_form(tiny):
    model, ids = tiny
    ref = full_reference(model, None, ids[:, :P], ids[:, P:])
    rel = attention_output_error(ref, ref.attn_outputs * 1.5)
    torch.testing.assert_close(rel, torch.full_like(rel, 0.5))


def test_bad_inputs_raise(tiny):
    model, ids = tiny
    with pytest.raises(ValueError, match="tokenizer"):
        next_token_kl(model, None, "hello", ids[:, P:], None)
    with pytest.raises(ValueError, match="continuation_ids"):
        next_token_kl(model, None, ids[:, :P], ids[:, P:P].float(), None)
    ref = full_reference(model, None, ids[:, :P], ids[:, P:])
    with pytest.raises(ValueError, match="different"):
        next_token_kl(model, None, ids[:, :P - 1], ids[:, P:], None, reference=ref)


@pytest.mark.parametrize("make_press", [
    lambda: kvpress.KnormPress(0.5),
    lambda: kvpress.SnapKVPress(0.5, window_size=8),
    lambda: kvpress.ExpectedAttentionPress(0.5, n_future_positions=16, n_sink=2),
    lambda: kvpress.AdaKVPress(kvpress.SnapKVPress(0.75, window_size=8)),
], ids=["knorm", "snapkv", "expected_attention", "adakv_snapkv"])
def test_replay_equals_real_prefill(tiny, make_press):
    """Replaying the press hook on a captured prefill gives the same cache and the same KL as a real
    prefill with the press active (also for AdaKV's head-wise masking)."""
    model, ids = tiny
    prompt, cont = ids[:, :P], ids[:, P:]
    cap = capture_prefill(model, prompt)
    ref = full_reference(model, None, prompt, cont)
    ref_replayed = full_reference(model, None, prompt, cont, capture=cap)
    assert torch.equal(ref.logprobs, ref_replayed.logprobs)
    real = next_token_kl(model, None, prompt, cont, make_press(), reference=ref)
    replayed = next_token_kl(model, None, prompt, cont, make_press(), reference=ref, capture=cap)
    assert real.kl > 1e-5
    torch.testing.assert_close(replayed.kl_per_token, real.kl_per_token, rtol=1e-5, atol=1e-8)
    assert replayed.kept_tokens == real.kept_tokens < P
    # the replayed cache holds exactly the keys kvpress keeps in a real prefill
    from transformers import DynamicCache
    real_cache = DynamicCache()
    with make_press()(model), torch.no_grad():
        model(input_ids=prompt, past_key_values=real_cache, use_cache=True)
    cache = replay_press(model, cap, make_press())
    for a, b in zip(cache.layers, real_cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_adakv_kept_counts_masked_keys(tiny):
    model, ids = tiny
    r = next_token_kl(model, None, ids[:, :P], ids[:, P:], kvpress.AdaKVPress(kvpress.KnormPress(0.5)),
                      capture=capture_prefill(model, ids[:, :P]))
    assert r.kept_tokens == P // 2  # masked keys are not counted as kept
