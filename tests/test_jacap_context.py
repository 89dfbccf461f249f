"""JacapPress against independent computations on the bundled model (short prompts).

* summary="max" is kvpress KVzip: the same masked_key_indices sets (global budget; layerwise for budget="layer");
* summary="jacap": the reconstruction queries captured by our own hooks on q_proj / k_proj (RoPE applied here),
  their pooled mean and variance, KVzip's cross-attention recomputed by brute force, and Algorithm 1's score with an
  explicit A and its inverse, against the press's scores;
* budget="head": each (layer, KV head) masks int(N * ratio) entries (minus protected), its lowest scores;
* bad options raise ValueError naming the field; a failing press leaves the cache as it was.
"""
from __future__ import annotations

import math

import pytest
import torch

from jacap_lib.presses import registry as R
from jacap_lib.presses.jacap_context import JacapPress
from jacap_lib.presses.presets import PRESETS

pytestmark = pytest.mark.model


def _prompt(tok, n):
    from jacap_lib.experiments.protocol.documents import load_docs

    doc = next(d for d in load_docs(None) if d["split"] == "tune")
    return tok(doc["text"], return_tensors="pt", add_special_tokens=False).input_ids[:, :n]


def _masks(model):
    out = []
    for layer in model.model.layers:
        idx = layer.self_attn.masked_key_indices
        out.append(set(zip(*(i.tolist() for i in idx))) if idx is not None else set())
    return out


def _run(model, prompt, press, record=None):
    """The real prefill under the press; its masks (and what ``record`` hooks saw). The choice is read off kvpress's
    masks, so the press leaves them (``free_memory=False``, the masked reference the ragged cache is tested against
    in tests/test_ragged_cache.py)."""
    from transformers import DynamicCache

    press.free_memory = False
    cache = DynamicCache()
    with torch.inference_mode(), press(model):
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
    masks = _masks(model)
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    return masks, cache


@pytest.fixture(scope="module")
def prompt(bundled):
    return _prompt(bundled[1], 96)


@pytest.mark.parametrize("ratio", [0.5, 0.9])
def test_max_summary_is_kvzip(bundled, prompt, ratio):
    import kvpress

    model, _ = bundled
    ours, _ = _run(model, prompt, JacapPress(ratio, summary="max", budget="global", window=0))
    theirs, _ = _run(model, prompt, kvpress.KVzipPress(ratio))
    assert ours == theirs and sum(map(len, ours)) == int(30 * 3 * prompt.shape[1] * ratio)
    ours, _ = _run(model, prompt, R.press_from_spec("jacap[summary=max,budget=layer,window=0]", ratio))
    theirs, _ = _run(model, prompt, kvpress.KVzipPress(ratio, layerwise=True))
    assert ours == theirs and all(len(m) == int(3 * prompt.shape[1] * ratio) for m in ours)


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin  # x (H, T, d), cos and sin (T, d)


def test_jacap_summary_matches_brute_force(bundled, prompt):
    """Our own capture of the reconstruction pass and a brute-force Algorithm 1 give the press's scores."""
    model, _ = bundled
    cfg = model.config
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    g = hq // hkv
    seen = {"q": {}, "k": {}}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name, proj in (("q", layer.self_attn.q_proj), ("k", layer.self_attn.k_proj)):
            hooks.append(proj.register_forward_hook(
                lambda m, a, out, i=i, name=name: seen[name].setdefault(i, []).append(out.detach().double())))
    press = JacapPress(0.5, summary="jacap", budget="global")
    try:
        _, cache = _run(model, prompt, press)
    finally:
        for h in hooks:
            h.remove()
    n = prompt.shape[1]
    scores = press.last_scores  # (L, 1, H_kv, N)
    assert scores.shape == (30, 1, hkv, n)
    prefix = 24  # KVzip's chat-template prefix on SmolLM2-Instruct: the reconstruction covers positions 24..N-1
    n_sink = min(4, prefix)
    checked = 0
    for layer in (0, 7, 29):
        q_all, k_all = seen["q"][layer], seen["k"][layer]
        assert len(k_all) == 2  # the prefill, then the one reconstruction chunk (KVzip's hook re-runs q_proj)
        t = q_all[1].shape[1]
        pos = torch.arange(n, n + t)
        cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=torch.float64), pos[None])
        cos, sin = cos[0].double(), sin[0].double()
        q = _rope(q_all[1][0].view(t, hq, d).transpose(0, 1), cos, sin)  # (H_q, T, d)
        k_rep = _rope(k_all[1][0].view(t, hkv, d).transpose(0, 1), cos, sin)  # (H_kv, T, d)
        keys = cache.layers[layer].keys[0].double()  # (H_kv, N, d): the context only
        values = cache.layers[layer].values[0].double()
        for h in range(hkv):
            qh = q[h * g:(h + 1) * g].reshape(-1, d)  # the group's queries pooled
            mu = qh.mean(0)
            lam = (qh.square().mean(0) - mu.square()).clamp_min(1e-6)
            # KVzip's cross-attention: sinks, the reconstructed chunk, the repeat tokens (causal)
            sub = torch.cat([keys[h, :n_sink], keys[h, prefix:n], k_rep[h]])
            logits = q[h * g:(h + 1) * g] @ sub.T / math.sqrt(d)  # (G, T, S)
            causal = torch.ones(t, t, dtype=torch.bool).triu(1)
            logits[..., -t:] = logits[..., -t:].masked_fill(causal, float("-inf"))
            attn = torch.softmax(logits, -1).mean((0, 1))
            alpha = torch.zeros(n, dtype=torch.float64)
            alpha[:n_sink], alpha[prefix:n] = attn[:n_sink], attn[n_sink: n_sink + n - prefix]
            kappa = (keys[h].square() * lam).sum(-1)
            w = (alpha * (1 - alpha)).square() * kappa / d
            A = torch.eye(d, dtype=torch.float64) + (values[h].T * w) @ values[h]
            lev = torch.einsum("nd,de,ne->n", values[h], torch.linalg.inv(A), values[h])
            want = w * lev
            torch.testing.assert_close(scores[layer, 0, h].double(), want, rtol=1e-4, atol=1e-12)
            checked += 1
    assert checked == 3 * hkv


def test_jacap_statistics_pool_the_group(bundled, prompt):
    """The press's (mu, lam) are the group-pooled moments of the reconstruction queries (rank check on one layer):
    tempered centre at tau = 1 from them equals softmax(K mu / sqrt d) computed here."""
    model, _ = bundled
    press = JacapPress(0.5, summary="jacap", centre="tempered", tau=1.0)
    stats = {}
    orig = press.jacap_scores

    def spy(layer, keys, values):
        stats[layer] = press.query_statistics(layer), keys.clone(), values.clone()
        return orig(layer, keys, values)

    press.jacap_scores = spy
    _run(model, prompt, press)
    (mu, lam), keys, values = stats[5]
    d = keys.shape[-1]
    alpha = torch.softmax((keys.double() @ mu.double().unsqueeze(-1)).squeeze(-1) / math.sqrt(d), -1)
    w = (alpha * (1 - alpha)).square() * (keys.double().square() * lam.double().unsqueeze(-2)).sum(-1) / d
    v = values.double()[0]
    for h in range(keys.shape[1]):
        A = torch.eye(d, dtype=torch.float64) + (v[h].T * w[0, h]) @ v[h]
        want = w[0, h] * torch.einsum("nd,de,ne->n", v[h], torch.linalg.inv(A), v[h])
        torch.testing.assert_close(press.last_scores[5, 0, h].double(), want, rtol=1e-4, atol=1e-12)


@pytest.mark.parametrize("window", [0, 16])
def test_head_budget_masks_each_heads_lowest(bundled, prompt, window):
    model, _ = bundled
    ratio = 0.75
    press = JacapPress(ratio, summary="jacap", budget="head", window=window)
    masks, _ = _run(model, prompt, press)
    n = prompt.shape[1]
    protected = set(range(4)) | set(range(n - window, n))
    n_mask = min(int(n * ratio), n - len(protected))
    for layer, m in enumerate(masks):
        for h in range(3):
            got = {s for b, hh, s in m if hh == h}
            assert len(got) == n_mask and not got & protected
            s = press.last_scores[layer, 0, h]
            free = torch.tensor([i for i in range(n) if i not in protected])
            worst = set(free[s[free].argsort()[:n_mask]].tolist())
            # ties aside, the masked set is the lowest n_mask scores of the unprotected slots
            assert float(s[list(got)].max()) <= float(s[list(set(free.tolist()) - got)].min())
            assert len(got & worst) >= n_mask - 1


def test_window_is_protected_under_a_global_budget(bundled, prompt):
    model, _ = bundled
    n = prompt.shape[1]
    # c = 0.75 masks fewer entries than the 30 x 3 x (n - 20) unprotected ones: the window and sinks all stay
    masks, _ = _run(model, prompt, JacapPress(0.75, summary="max", budget="global", window=16))
    flat = {s for m in masks for _, _, s in m}
    assert not flat & set(range(n - 16, n)) and not flat & set(range(4))
    assert sum(map(len, masks)) == int(30 * 3 * n * 0.75)
    plain, _ = _run(model, prompt, JacapPress(0.75, summary="max", budget="global", window=0))
    assert {s for m in plain for _, _, s in m} & set(range(n - 16, n))  # without the window some are masked


@pytest.mark.parametrize("field,value", [("summary", "mean"), ("budget", "adakv"), ("centre", "x"), ("tau", 0.0),
                                         ("noise", "deff"), ("noise", -1.0), ("window", -1), ("n_sink", 1.5),
                                         ("chunk_size", 0), ("layerwise", True), ("compression_ratio", 1.0)])
def test_bad_options_name_the_field(field, value):
    kwargs = {field: value} if field != "compression_ratio" else {}
    with pytest.raises(ValueError, match=field):
        JacapPress(value if field == "compression_ratio" else 0.5, **kwargs)
    with pytest.raises(ValueError, match=field):
        R.press_from_spec(f"jacap[{field}={value}]" if field != "compression_ratio" else "jacap", value
                          if field == "compression_ratio" else 0.5)


def test_failing_press_leaves_the_cache(bundled, prompt):
    """A press that fails while scoring leaves the prefill's cache as the prefill wrote it (no masks)."""
    from transformers import DynamicCache

    model, _ = bundled
    press = JacapPress(0.5)

    def boom(*a, **k):
        raise RuntimeError("scoring failed")

    press.jacap_scores = boom
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
    ref = [(l.keys.clone(), l.values.clone()) for l in cache.layers]
    cache2 = DynamicCache()
    with pytest.raises(RuntimeError, match="scoring failed"), torch.inference_mode(), press(model):
        model(input_ids=prompt, past_key_values=cache2, use_cache=True)
    assert all(getattr(l.self_attn, "masked_key_indices", None) is None for l in model.model.layers)
    n = prompt.shape[1]
    for (k, v), layer in zip(ref, cache2.layers):
        assert layer.keys.shape[-2] == n
        torch.testing.assert_close(layer.keys, k, rtol=0, atol=0)
        torch.testing.assert_close(layer.values, v, rtol=0, atol=0)


def test_registry_and_quality_treat_it_like_kvzip(bundled, prompt):
    from jacap_lib.measure import quality as Q

    press = R.press_from_spec("jacap[budget=head]", 0.5)
    assert isinstance(press, JacapPress) and press.budget == "head" and press.summary == "jacap"
    assert {"summary", "budget", "window", "centre", "tau", "noise", "n_sink"} <= R.valid_options("jacap")
    assert R.method_options(press)["budget"] == "head"
    assert not Q.can_replay(press) and Q.scores_once(press)
    assert Q.scoring_record(press) == Q.scoring_record(R.press_from_spec("jacap[window=16]", 0.9))
    assert Q.scoring_record(press) != Q.scoring_record(R.press_from_spec("jacap[summary=max]", 0.9))
    # one scoring masked for several settings = each setting's own prefill
    model, _ = bundled
    specs = [("jacap[budget=head]", 0.5), ("jacap[window=16]", 0.9), ("jacap", 0.75)]
    shared = []
    for p, _ in Q.caches_by_setting(model, prompt, [R.press_from_spec(s, c) for s, c in specs]):
        shared.append(_masks(model))
    separate = [_run(model, prompt, R.press_from_spec(s, c))[0] for s, c in specs]
    assert shared == separate


def test_defaults_are_the_tune_choice():
    """JacapPress()'s defaults build the setting the protocol's rule chose on the tune documents (the context
    space's choices.json), option by option, and differ from the options its first grid was tuned with."""
    from jacap_lib.results import loaders

    chosen = loaders.load_eval_choices(space="context")["chosen"]["jacap"]
    built = R.method_options(R.press_from_spec(chosen, 0.5))
    default = R.method_options(JacapPress(0.5))
    assert built == default
    assert default["window"] == 64 != PRESETS["context_as_first_tuned"].options["window"]


@pytest.mark.parametrize("ratio", [0.5, 0.9])
def test_budget_split_says_where_protection_fills_a_global_budget(bundled, prompt, ratio):
    """budget_split's scored == 0 exactly where the masks keep protected entries only (and then keep no other):
    at c = 0.9 the 96-token prompt keeps ~10 tokens per head, fewer than 4 sinks + 16 recent ones."""
    model, _ = bundled
    n = prompt.shape[1]
    press = JacapPress(ratio, summary="jacap", budget="global", window=16)
    split = press.budget_split(n)
    masks, _ = _run(model, prompt, press)
    protected = set(range(4)) | set(range(n - 16, n))
    masked = {(layer, h, s) for layer, m in enumerate(masks) for _, h, s in m}
    kept = [(layer, h, s) for layer in range(30) for h in range(3) for s in range(n) if (layer, h, s) not in masked]
    assert len(kept) == 30 * 3 * n - int(30 * 3 * n * ratio)
    if ratio == 0.9:
        assert split["scored"] == 0 and all(s in protected for _, _, s in kept)
    else:
        assert split["scored"] == split["kept"] - 20 > 0
        assert {(layer, h, s) for layer in range(30) for h in range(3) for s in protected} <= set(kept)
