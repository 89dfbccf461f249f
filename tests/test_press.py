"""JacapPromptPress and the method registry, checked against independent computations on the bundled model.

* registry: names, errors, variant merging (no model);
* query statistics: recomputed by hand (q_proj, RoPE applied at each future position and averaged,
  flat/EMA moments of the pooled group) and compared with the press;
* use_out_proj: the d x d factor gives the leverages of the full (hidden x d) W_O slices;
* c = 0: logits identical to the plain model;
* c > 0: every layer/head keeps exactly the budget, protected tokens included, and the continuation's
  logits equal an explicit masked-attention run of the *uncompressed* cache (evicted positions masked
  per layer and KV head, original positions);
* kvpress wrappers (PerLayerCompressionPress) and the kv-press-text-generation pipeline (passkey).
"""
from __future__ import annotations

import math

import pytest
import torch
from kvpress import PerLayerCompressionPress
from kvpress.utils import compute_n_kept
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from jacap_lib import jacap_scores
from jacap_lib.presses import registry
from jacap_lib.presses.jacap import JacapPromptPress
from jacap_lib.stats import ema_query_stats, flat_query_stats

TEXT = (
    "Maria keeps her bicycle in the blue shed behind the bakery. Every Tuesday she rides it to the market, "
    "buys three lemons and a loaf of rye bread, and visits her brother Tomas, who repairs old clocks. "
    "Last winter the shed roof leaked, so Tomas fixed it with copper sheets."
)
CONTINUATION = " Where does Maria keep her bicycle? In the"


# ----------------------------------------------------------------------------- registry (no model)
def test_registry_lists_all_methods():
    names = registry.list_methods()
    for name in ["jacap_prompt", "snapkv", "knorm", "keydiff", "expected_attention", "capkv", "streaming_llm", "tova", "random"]:
        assert name in names
    assert registry.list_methods("kvpress") == [n for n in names if not n.startswith("jacap")]
    assert type(registry.build_press("capkv", 0.5)).__name__ == "CapPress"
    press = registry.build_press("jacap_prompt", 0.25, tau=3.0)
    assert isinstance(press, JacapPromptPress) and press.tau == 3.0 and press.compression_ratio == 0.25
    assert registry.build_press("snapkv", 0.5, window_size=8).window_size == 8


@pytest.mark.parametrize("ratio", [1.0, -0.1, "0.5", None, True])
def test_registry_rejects_bad_ratio(ratio):
    with pytest.raises(ValueError, match="compression_ratio"):
        registry.build_press("jacap_prompt", ratio)


def test_registry_errors_name_valid_choices():
    with pytest.raises(ValueError, match="snapkv"):
        registry.build_press("snapvk", 0.5)
    with pytest.raises(ValueError, match="window_size"):
        registry.build_press("snapkv", 0.5, windw_size=3)
    with pytest.raises(ValueError, match="tau"):
        JacapPromptPress(0.5, tau=0)
    with pytest.raises(ValueError, match="gqa"):
        JacapPromptPress(0.5, gqa="max")


def test_registry_is_a_table_of_methods_and_aliases():
    # every name outside kvpress's presses is Jacap's; an alias builds exactly the press of the spec it names
    assert set(registry.METHODS) == set(registry.list_methods())
    assert all(n.startswith("jacap") for n in registry.METHODS if n not in registry.BASELINES)
    assert all(getattr(registry.METHODS[n].press, "kvpress_press", registry.METHODS[n].press).__module__
               .startswith("kvpress") for n in registry.BASELINES)
    aliases = {n: registry.alias_of(n) for n in registry.METHODS if registry.alias_of(n)}
    assert aliases == {"jacap_prompt_adakv": "jacap_prompt[adakv=true]", "jacap_prompt_wo": "jacap_prompt[use_out_proj=true]",
                       "jacap_obs": "jacap_ablate[centre=observed]",
                       "jacap_ea": "jacap_ablate[beta=none,centre=ea,gqa=mean,n_future_positions=32]"}
    for name, spec in aliases.items():
        for c in (0.25, 0.75):
            assert (registry.method_options(registry.build_press(name, c))
                    == registry.method_options(registry.press_from_spec(spec, c))), name
    # a spec's option overrides the alias's own
    assert registry.build_press("jacap_ea", 0.5, gqa="pool").gqa == "pool"


@pytest.mark.parametrize("name", ["snapkv", "tova", "streaming_llm", "jacap_prompt", "jacap_obs", "jacap_two_stage"])
def test_adakv_wraps_every_scorer_the_same_way(name):
    import kvpress

    plain = registry.build_press(name, 0.5)
    press = registry.build_press(name, 0.5, adakv=True)
    assert isinstance(press, kvpress.AdaKVPress) and press.alpha_safeguard == 0.20  # kvpress's default
    assert registry.method_options(press.press) == registry.method_options(plain)
    assert registry.build_press(name, 0.5, adakv=True, alpha_safeguard=0.1).alpha_safeguard == 0.1
    with pytest.raises(ValueError, match="adakv=true"):
        registry.build_press(name, 0.5, alpha_safeguard=0.1)
    with pytest.raises(ValueError, match="adakv"):
        registry.build_press(name, 0.5, adakv="yes")


def test_adakv_refuses_a_press_that_wraps_already():
    with pytest.raises(ValueError, match="wrapper already"):
        registry.build_press("jacap_obs", 0.5, adakv=True, budget="layer")


# ----------------------------------------------------------------------------- model fixtures
@pytest.fixture(scope="module")
def model_tok():
    from jacap_lib import load_model

    return load_model()


def _ids(tok, text):
    return tok(text, return_tensors="pt", add_special_tokens=False).input_ids


def _attn(model, layer):
    attn = model.model.layers[layer].self_attn
    attn.rotary_emb = model.model.rotary_emb  # what kvpress's press(model) does
    return attn


# ----------------------------------------------------------------------------- statistics
@pytest.mark.model
@pytest.mark.parametrize("beta,n_queries,gqa,eps", [(None, None, "pool", 1e-6), (0.9, None, "pool", 1e-6),
                                                    (None, 12, "pool", 1e-6), (None, None, "mean", 1e-6),
                                                    (0.9, 20, "mean", 1e-6), (None, 12, "pool", 0.5)])
def test_query_statistics_match_hand_computation(model_tok, beta, n_queries, gqa, eps):
    """beta (flat / EMA), n_queries (the last ones only), gqa (pooled group / per query head) and eps (the
    variance floor: 0.5 floors most of lam here) against the moments computed by hand."""
    model, _ = model_tok
    torch.manual_seed(0)
    attn = _attn(model, 5)
    T, n_sink, n_future = 40, 4, 64
    hidden = torch.randn(1, T, model.config.hidden_size)
    press = JacapPromptPress(0.5, n_sink=n_sink, n_future_positions=n_future, beta=beta, n_queries=n_queries, gqa=gqa,
                       eps=eps)
    keys = torch.zeros(1, 3, T, 64)
    mu, lam = press.query_statistics(attn, hidden, keys, {})

    # by hand: pre-RoPE queries, RoPE applied at every future position T..T+n_future-1 and averaged
    start = n_sink if n_queries is None else max(n_sink, T - n_queries)
    q = attn.q_proj(hidden[:, start:]).view(1, T - start, 9, 64).transpose(1, 2)
    pos = torch.arange(T, T + n_future)[None]
    cos, sin = model.model.rotary_emb(q, pos)  # (1, F, d)
    rotated = [apply_rotary_pos_emb(q, q, cos[:, f : f + 1], sin[:, f : f + 1])[0] for f in range(n_future)]
    q_future = torch.stack(rotated).mean(0)  # (1, 9, T', d)
    if gqa == "mean":  # per query head: its own moments
        stats = flat_query_stats if beta is None else (lambda x, eps: ema_query_stats(x, beta, eps=eps))
        mu_ref, lam_ref = stats(q_future, eps=eps)
    else:
        grouped = q_future.view(1, 3, 3, T - start, 64)
        if beta is None:  # pooled group: flat moments over all G*T' queries
            mu_ref, lam_ref = flat_query_stats(grouped.flatten(2, 3), eps=eps)
        else:  # EMA over time per query head, then the mixture of the G heads
            mu_h, lam_h = ema_query_stats(grouped, beta, eps=eps)
            mu_ref = mu_h.mean(2)
            lam_ref = ((lam_h + mu_h.square()).mean(2) - mu_ref.square()).clamp_min(eps)
    assert mu.shape == (1, 9 if gqa == "mean" else 3, 64)
    torch.testing.assert_close(mu, mu_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lam, lam_ref, rtol=1e-4, atol=1e-5)
    if eps == 0.5:
        assert bool((lam == 0.5).any()) and bool((lam > 0.5).any())  # the floor binds on part of the dims only


@pytest.mark.model
def test_backend_torch_equals_auto_on_cpu_and_tau_noise_reach_the_scores(model_tok):
    """backend: 'torch' and 'auto' (which picks torch for CPU tensors) give identical scores; tau and noise
    are the ones jacap_scores receives (the press's scores equal a direct call with them)."""
    model, _ = model_tok
    torch.manual_seed(2)
    attn = _attn(model, 3)
    keys, values = torch.randn(1, 3, 30, 64), torch.randn(1, 3, 30, 64)
    mu, lam = torch.randn(1, 3, 64), torch.rand(1, 3, 64) + 0.1
    a = JacapPromptPress(0.5, tau=3.0, noise=7.0, centre="tempered", backend="torch").token_scores(keys, values, mu, lam, attn)
    b = JacapPromptPress(0.5, tau=3.0, noise=7.0, centre="tempered", backend="auto").token_scores(keys, values, mu, lam, attn)
    assert torch.equal(a, b)
    ref = jacap_scores(keys.double(), values.double(), mu.double(), lam.double(), tau=3.0, noise=7.0).score
    torch.testing.assert_close(a.double(), ref.double(), rtol=1e-4, atol=1e-10)


@pytest.mark.model
@pytest.mark.parametrize("gqa", ["pool", "mean"])
def test_out_proj_factor_gives_full_wo_leverage(model_tok, gqa):
    model, _ = model_tok
    torch.manual_seed(1)
    attn = _attn(model, 7)
    keys, values = torch.randn(1, 3, 30, 64), torch.randn(1, 3, 30, 64)
    n_stat = 3 if gqa == "pool" else 9
    mu, lam = torch.randn(1, n_stat, 64), torch.rand(1, n_stat, 64) + 0.1
    press = JacapPromptPress(0.5, use_out_proj=True, gqa=gqa, centre="tempered")
    got = press.components(keys, values, mu, lam, attn)

    w = attn.o_proj.weight.detach()  # (hidden, 9*64)
    slices = torch.stack([w[:, h * 64 : (h + 1) * 64] for h in range(9)])  # (9, hidden, d)
    if gqa == "pool":  # stack the group's slices: u = [W_h1 v; W_h2 v; W_h3 v]
        out_proj = slices.view(3, 3 * w.shape[0], 64)
        ref = jacap_scores(keys.double(), values.double(), mu.double(), lam.double(), out_proj=out_proj.double())
    else:
        ref = jacap_scores(repeat_kv(keys, 3).double(), repeat_kv(values, 3).double(), mu.double(), lam.double(),
                           out_proj=slices.double())
        ref = ref.map(lambda t: t.view(1, 3, 3, 30).mean(2))
    torch.testing.assert_close(got.leverage, ref.leverage.float(), rtol=2e-3, atol=1e-6)
    torch.testing.assert_close(got.score, ref.score.float(), rtol=2e-3, atol=1e-9)


# ----------------------------------------------------------------------------- end to end
def _prefill(model, ids, press=None):
    cache = DynamicCache()
    with torch.inference_mode():
        if press is None:
            model.model(input_ids=ids, past_key_values=cache)
        else:
            with press(model):
                model.model(input_ids=ids, past_key_values=cache)
    return cache


def _continue(model, cache, cont, P):
    with torch.inference_mode():
        pos = torch.arange(P, P + cont.shape[1])[None]
        return model(input_ids=cont, past_key_values=cache, position_ids=pos).logits[0]


def _masked_attention(kept: dict, P: int):
    """Eager attention over the *full* cache with evicted prompt positions of (layer, KV head) masked."""

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        g = query.shape[1] // key.shape[1]
        Q, K = query.shape[2], key.shape[2]
        logits = query @ repeat_kv(key, g).transpose(2, 3) * scaling  # (1, H_q, Q, K)
        q_pos = torch.arange(K - Q, K)[:, None]
        blocked = torch.arange(K)[None, :] > q_pos  # causal, true positions
        allowed_prompt = torch.zeros(key.shape[1], P, dtype=torch.bool)
        allowed_prompt.scatter_(1, kept[module.layer_idx], True)  # (H_kv, P)
        evicted = torch.cat([~allowed_prompt, torch.zeros(key.shape[1], K - P, dtype=torch.bool)], 1)
        evicted = repeat_kv(evicted[None, :, None, :].float(), g).bool()  # (1, H_q, 1, K)
        logits = logits.masked_fill(blocked | evicted, float("-inf"))
        out = torch.softmax(logits.float(), -1) @ repeat_kv(value, g)
        return out.transpose(1, 2).contiguous(), None

    return forward


@pytest.mark.model
@pytest.mark.parametrize("ratio,opts", [(0.5, {"window": 0}), (0.75, {"window": 6, "use_out_proj": True, "beta": 0.95})])
def test_compressed_cache_equals_masked_attention(model_tok, ratio, opts):
    from transformers import AttentionInterface

    from jacap_lib.measure.eviction import capture_kept

    model, tok = model_tok
    ids, cont = _ids(tok, TEXT), _ids(tok, CONTINUATION)
    P = ids.shape[1]
    press = JacapPromptPress(ratio, **opts)
    store = {}
    cache = DynamicCache()
    with torch.inference_mode(), capture_kept(model, press, store):
        model.model(input_ids=ids, past_key_values=cache)
    budget = compute_n_kept(P, ratio)
    protected = list(range(press.n_sink)) + list(range(P - press.window, P))
    kept = {}
    for layer in range(model.config.num_hidden_layers):
        assert cache.layers[layer].keys.shape == (1, 3, budget, 64)
        idx = store[layer][1][0]  # (H_kv, budget) ascending
        assert idx.shape == (3, budget) and bool((idx[:, 1:] > idx[:, :-1]).all())
        assert all(p in row for row in idx.tolist() for p in protected)
        kept[layer] = idx
    compressed = _continue(model, cache, cont, P)

    # independent path: uncompressed cache, explicit per-(layer, head) mask over the evicted positions
    full_cache = _prefill(model, ids)
    plain = _continue(model, _prefill(model, ids), cont, P)
    AttentionInterface.register("jacap_test_masked", _masked_attention(kept, P))
    previous = model.config._attn_implementation
    model.config._attn_implementation = "jacap_test_masked"
    try:
        masked = _continue(model, full_cache, cont, P)
    finally:
        model.config._attn_implementation = previous
    torch.testing.assert_close(compressed, masked, rtol=1e-4, atol=2e-4)
    assert (compressed - plain).abs().max() > 100 * 2e-4  # eviction really changed the logits


@pytest.mark.model
def test_per_layer_wrapper_takes_jacap(model_tok):
    model, tok = model_tok
    ids = _ids(tok, TEXT)
    P = ids.shape[1]
    n_layers = model.config.num_hidden_layers
    ratios = [0.25 if layer % 2 else 0.75 for layer in range(n_layers)]
    cache = _prefill(model, ids, PerLayerCompressionPress(press=JacapPromptPress(), compression_ratios=ratios))
    assert [cache.layers[i].keys.shape[2] for i in range(n_layers)] == [compute_n_kept(P, r) for r in ratios]


PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
PASSKEY_CONTEXT = (
    "There is an important pass key hidden in this text. Find it and remember it. " + PASSKEY_FILLER * 4
    + "The pass key is 68142. Remember it. 68142 is the pass key. " + PASSKEY_FILLER * 4
)


@pytest.mark.model
def test_passkey_survives_jacap_half_compression(model_tok):
    from jacap_lib.measure.eviction import answer

    model, tok = model_tok
    assert 200 <= len(tok(PASSKEY_CONTEXT).input_ids) <= 300
    question = "What is the pass key?"
    assert "68142" in answer(model, tok, PASSKEY_CONTEXT, question, None, max_new_tokens=10)  # model can do it
    # Algorithm 1 as published (the tempered centre) keeps the key at c = 0.5; the default observed centre answers
    # "62" on this prompt: the retrieval cost of the KL-chosen default that the book's needle task measures
    assert "68142" in answer(model, tok, PASSKEY_CONTEXT, question, "jacap_prompt", 0.5, max_new_tokens=10, centre="tempered")
