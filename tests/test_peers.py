"""kvpress's newer presses in the registry (PEERS) and their measurement: every row builds kvpress's press at
kvpress's defaults, bad options are refused by name, :func:`can_replay` tells the presses that work after the
prefill (KVzip, KVgrad) from those a captured prefill replays, and those are measured on the real prefill with
the budget kvpress's rule gives (bundled model)."""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from jacap_lib.measure.quality import (can_replay, capture_prefill, continue_from_cache, full_reference,  # noqa: E402
                                       next_token_kl, prompt_and_continuation, replay_press)
from jacap_lib.presses import registry as R  # noqa: E402
from conftest import sharpened_tiny_llama  # noqa: E402

logging.getLogger("kvpress").setLevel(logging.ERROR)

KVPRESS_CLASS = {"kvzip": "KVzipPress", "kvgrad": "KVgradPress", "compactor": "CompactorPress",
                 "leverage_score": "LeverageScorePress", "lagkv": "LagKVPress", "cur": "CURPress",
                 "pyramidkv": "PyramidKVPress", "critical_kv": "CriticalKVPress", "critical_adakv": "CriticalAdaKVPress"}


# --------------------------------------------------------------------------------------------- registry rows
def test_peers_are_kvpress_baselines_at_kvpress_defaults():
    assert set(R.PEERS) == set(KVPRESS_CLASS) and set(R.PEERS) <= set(R.BASELINES) <= set(R.list_methods("kvpress"))
    for name in R.PEERS:
        press = R.build_press(name, 0.5)
        cls = getattr(kvpress, KVPRESS_CLASS[name])
        assert type(press) is cls and press.compression_ratio == 0.5
        if dataclasses.is_dataclass(cls) and name not in ("critical_kv", "critical_adakv"):
            assert press == cls(compression_ratio=0.5), name  # every field at kvpress's default
        assert R.describe_method(name)
    # CriticalKV wraps Expected Attention as kvpress's evaluation does (use_vnorm off: the wrapper weights by |W_O v|)
    for name, cls in (("critical_kv", kvpress.CriticalKVPress), ("critical_adakv", kvpress.CriticalAdaKVPress)):
        press = R.build_press(name, 0.25)
        assert press.press == kvpress.ExpectedAttentionPress(compression_ratio=0.25, use_vnorm=False)
        assert (press.epsilon, press.first_stage_ratio) == (1e-4, 0.5)
        inner = R.build_press(name, 0.25, scorer="snapkv").press
        assert inner == kvpress.SnapKVPress(compression_ratio=0.25)
    assert R.build_press("critical_adakv", 0.5).alpha_safeguard == 0.2
    assert R.build_press("critical_adakv", 0.5, alpha_safeguard=0.4).alpha_safeguard == 0.4
    # the record of a plain-class kvpress wrapper holds its scorer and options
    rec = R.method_options(R.build_press("critical_kv", 0.5, epsilon=0.01))
    assert rec["epsilon"] == 0.01 and rec["press"]["class"] == "ExpectedAttentionPress"
    assert "_leverage_press" not in R.valid_options("compactor")


@pytest.mark.parametrize("name, opts, word", [
    ("kvzip", {"chunk_size": 0}, "chunk_size"), ("kvzip", {"layerwise": 1}, "layerwise"),
    ("kvzip", {"n_sinks": 4}, "n_sinks"), ("kvgrad", {"kvzip_plus_normalization": True}, "kvzip_plus_normalization"),
    ("cur", {"leverage_type": "keys"}, "leverage_type"), ("compactor", {"blending": "half"}, "blending"),
    ("lagkv", {"lag_size": 0}, "lag_size"), ("pyramidkv", {"beta": 0}, "beta"),
    ("leverage_score", {"sketch_dimension": 2.5}, "sketch_dimension"),
    ("critical_kv", {"scorer": "kvzip"}, "scorer"), ("critical_kv", {"scorer": "snapvk"}, "scorer"),
    ("critical_kv", {"first_stage_ratio": 1.5}, "first_stage_ratio"), ("critical_kv", {"epsilon": -1}, "epsilon"),
    ("critical_adakv", {"alpha_safeguard": 2}, "alpha_safeguard"), ("kvzip", {"adakv": True}, "adakv"),
])
def test_bad_peer_options_raise_naming_them(name, opts, word):
    with pytest.raises(ValueError, match=word):
        R.build_press(name, 0.5, **opts)


def test_not_offline_presses_are_kvpress_presses_outside_the_registry():
    built = {type(R.build_press(n, 0.5)).__name__ for n in R.METHODS}
    for cls in R.NOT_OFFLINE:
        assert hasattr(kvpress, cls) and cls not in built
    # the book's table of them: one row per press, the reason unchanged (wrapped with HTML breaks only)
    from jacap_lib.viz.field import not_offline_frame

    frame = not_offline_frame()
    assert list(frame.index) == list(R.NOT_OFFLINE)
    for cls, why in frame.iloc[:, 0].items():
        assert why.replace("<br>", " ").split() == R.NOT_OFFLINE[cls].split()


# --------------------------------------------------------------------------------------------- replay or real
def test_can_replay_follows_the_context_manager():
    ea = kvpress.ExpectedAttentionPress(0.5)
    assert not can_replay(kvpress.KVzipPress(0.5)) and not can_replay(kvpress.KVgradPress(0.5))
    assert not can_replay(kvpress.DecodingPress(base_press=kvpress.KnormPress()))
    assert can_replay(None) and can_replay(kvpress.SnapKVPress(0.5)) and can_replay(kvpress.AdaKVPress(ea))
    assert can_replay(kvpress.ComposedPress([kvpress.KnormPress(0.5), ea]))


    class After(kvpress.KnormPress):  # work after the forward, as KVzip does (kvpress's ComposedPress refuses KVzip)
        def __call__(self, model):
            return super().__call__(model)

    assert not can_replay(kvpress.ComposedPress([kvpress.KnormPress(0.5), After(0.5)]))
    assert not can_replay(kvpress.AdaKVPress(After(0.5)))
    assert {n for n in R.METHODS if not can_replay(R.build_press(n, 0.5))} == set(R.RECONSTRUCTION_METHODS)
    assert set(R.RECONSTRUCTION_METHODS) == {"kvzip", "kvgrad", "jacap"}


P, M = 48, 8


@pytest.fixture(scope="module")
def tiny():
    model = sharpened_tiny_llama()
    ids = torch.randint(0, 96, (1, P + M), generator=torch.Generator().manual_seed(2))
    return model, ids[:, :P], ids[:, P:]


@pytest.mark.parametrize("spec", ["snapkv[window_size=16]", "jacap_prompt", "pyramidkv[window_size=8]", "critical_kv", "critical_adakv",
                                  "cur", "lagkv[lag_size=8]", "compactor[chunk_size=16]", "leverage_score"])
def test_replay_equals_real_prefill(tiny, spec):
    """The captured prefill replayed and the real prefill under ``with press(model)`` give the same KL."""
    model, prompt, cont = tiny
    cap = capture_prefill(model, prompt)
    ref = full_reference(model, None, prompt, cont, capture=cap)
    out = []
    for capture in (cap, None):
        torch.manual_seed(0)  # leverage scores draw a Gaussian sketch
        out.append(next_token_kl(model, None, prompt, cont, R.press_from_spec(spec, 0.5), reference=ref,
                                 capture=capture))
    assert can_replay(R.press_from_spec(spec, 0.5)) and out[0].kl > 1e-5
    torch.testing.assert_close(out[0].kl_per_token, out[1].kl_per_token, rtol=0, atol=1e-6)
    assert out[0].kept_tokens == out[1].kept_tokens == P // 2


def test_stepwise_continuation_equals_one_pass(tiny):
    model, prompt, cont = tiny
    cap = capture_prefill(model, prompt)
    one, attn1, _ = continue_from_cache(model, replay_press(model, cap), P, cont, stepwise=False)
    steps, attn2, _ = continue_from_cache(model, replay_press(model, cap), P, cont, stepwise=True)
    torch.testing.assert_close(steps, one, rtol=0, atol=1e-5)
    torch.testing.assert_close(attn2, attn1, rtol=0, atol=1e-5)


def test_pyramidkv_keeps_kvpress_layer_budgets(tiny):
    """PyramidKV's layers keep different lengths; the continuation runs on them (one token at a time)."""
    model, prompt, cont = tiny
    press = R.build_press("pyramidkv", 0.5, window_size=8)
    cache = replay_press(model, capture_prefill(model, prompt), press)
    lengths = [layer.keys.shape[-2] for layer in cache.layers]
    assert lengths == [press.get_layer_budget(layer.self_attn, P) for layer in model.model.layers]
    assert lengths[0] > lengths[-1]


def test_needle_answer_runs_on_pyramidkv_layer_lengths(tiny):
    """A multi-token question on PyramidKV's cache (layers of different lengths) fails in one forward (the mask is
    sized by the first layer); the answer feeds it one token at a time. By hand: each greedy token is the argmax of
    the last next-token distribution of the question plus the tokens so far, each run on a fresh copy of the
    compressed cache (continue_from_cache, one token at a time). On a cache of equal lengths both ways agree."""
    from jacap_lib.measure.passkey import greedy_answer

    model, prompt, cont = tiny
    cap = capture_prefill(model, prompt)

    def pyramid():
        return replay_press(model, cap, R.build_press("pyramidkv", 0.5, window_size=8))

    question, n_new = cont[:, :5], 4
    with pytest.raises(RuntimeError):
        greedy_answer(model, pyramid(), P, question, n_new, stepwise=False)
    answer = greedy_answer(model, pyramid(), P, question, n_new)
    seq, want = question, []
    for _ in range(n_new):
        logprobs, _, _ = continue_from_cache(model, pyramid(), P, seq, stepwise=True)
        want.append(int(logprobs[-1].argmax()))
        seq = torch.cat([seq, torch.tensor([[want[-1]]])], dim=1)
    assert answer == want
    equal = [greedy_answer(model, replay_press(model, cap, R.build_press("snapkv", 0.5, window_size=8)), P, question,
                           n_new, stepwise=s) for s in (False, True)]
    assert equal[0] == equal[1]


# --------------------------------------------------------------------------------------------- bundled model
@pytest.fixture(scope="module")
def text_pair(bundled):
    from jacap_lib.experiments.protocol.documents import load_docs

    doc = next(d for d in load_docs(None) if d["split"] == "tune")
    return prompt_and_continuation(bundled[1], doc["text"], 512, 16)


@pytest.mark.model
def test_kvzip_real_prefill_masks_kvpress_budget(bundled, text_pair):
    """KVzip on the real prefill: every layer keeps its 512 slots, c of all (layer, head, token) entries are masked
    (kvpress's rule int(c * L * H_kv * P)), the continuation sees the rest, and the masks are gone afterwards."""
    model, _ = bundled
    prompt, cont = text_pair
    cfg = model.config
    cap = capture_prefill(model, prompt)
    ref = full_reference(model, None, prompt, cont, capture=cap)
    snap = next_token_kl(model, None, prompt, cont, R.build_press("snapkv", 0.5), reference=ref, capture=cap)
    press = R.build_press("kvzip", 0.5)
    seen = {}
    original = press.compress_post

    def spy(m):
        original(m)
        seen["masked"] = sum(int(layer.self_attn.masked_key_indices[0].numel()) for layer in m.model.layers)

    press.compress_post = spy
    res = next_token_kl(model, None, prompt, cont, press, reference=ref, capture=cap)
    assert seen["masked"] == int(0.5 * cfg.num_hidden_layers * cfg.num_key_value_heads * 512) == 23040
    assert res.kept_tokens == 256.0 and res.kl > 0
    assert all(getattr(layer.self_attn, "masked_key_indices", None) is None for layer in model.model.layers)
    # the next measurement is untouched by KVzip's masks
    after = next_token_kl(model, None, prompt, cont, R.build_press("snapkv", 0.5), reference=ref, capture=cap)
    assert after.kl == snap.kl and after.kept_tokens == 256.0
    model.model.layers[3].self_attn.masked_key_indices = (torch.zeros(1, dtype=torch.long),) * 3
    with torch.inference_mode():  # kvpress clears a stale mask at the next prefill
        model(input_ids=prompt[:, :8], use_cache=True)
    assert model.model.layers[3].self_attn.masked_key_indices is None


@pytest.mark.model
@pytest.mark.parametrize("name", ["kvzip", "kvgrad"])
def test_scores_once_gives_the_masks_of_separate_runs(bundled, name):
    """KVzip's (KVgrad's) scores do not depend on the ratio: one scoring, masked at each ratio by kvpress's own
    compress_post, leaves the masks and the KL of one real prefill per ratio."""
    from jacap_lib.measure.quality import caches_by_ratio, next_token_kl_by_ratio, scores_once
    from jacap_lib.experiments.protocol.documents import load_docs

    model, tok = bundled
    doc = next(d for d in load_docs(None) if d["split"] == "tune")
    prompt, cont = prompt_and_continuation(tok, doc["text"], 160, 8)
    ratios = [0.5, 0.75, 0.9]
    ref = full_reference(model, None, prompt, cont)

    def masks():
        return [tuple(i.tolist() for i in layer.self_attn.masked_key_indices) for layer in model.model.layers]

    once = [masks() for _, _ in caches_by_ratio(model, prompt, R.build_press(name, 0.5), ratios)]
    separate = []
    for c in ratios:
        seen = []
        press = R.build_press(name, c)
        post = press.compress_post
        press.compress_post = lambda m, post=post: (post(m), seen.append(masks()))
        res = next_token_kl(model, None, prompt, cont, press, reference=ref)
        separate.append((seen[0], res))
    assert [m for m, _ in separate] == once
    assert [len(sum((m[0] for m in per), [])) for per in once] == [int(c * 30 * 3 * 160) for c in ratios]
    by_ratio = next_token_kl_by_ratio(model, prompt, cont, R.build_press(name, 0.5), ratios, reference=ref)
    for r, (_, s) in zip(by_ratio, separate):
        torch.testing.assert_close(r.kl_per_token, s.kl_per_token, rtol=0, atol=1e-6)
        assert r.kept_tokens == s.kept_tokens
    assert scores_once(R.build_press(name, 0.5)) and not scores_once(R.build_press("snapkv", 0.5))
    with pytest.raises(ValueError, match="press"):
        next(caches_by_ratio(model, prompt, R.build_press("snapkv", 0.5), ratios))


@pytest.mark.model
@pytest.mark.parametrize("name", ["kvzip", "kvgrad"])
def test_one_scoring_serves_the_layerwise_budget(bundled, name):
    """``layerwise`` is read by KVzip's ``compress_post`` alone, which KVgrad inherits: one scoring masked for the
    global and the per-layer budget leaves each setting's own masks, and ``n_sink`` (read by the scoring) is not
    shared."""
    from transformers import DynamicCache

    from jacap_lib.measure import quality as Q
    from jacap_lib.experiments.protocol.documents import load_docs

    model, tok = bundled
    doc = next(d for d in load_docs(None) if d["split"] == "tune")
    prompt, _ = prompt_and_continuation(tok, doc["text"], 160, 8)
    specs = [(name, 0.5), (f"{name}[layerwise=true]", 0.75)]
    presses = [R.press_from_spec(s, c) for s, c in specs]
    assert Q.post_fields(presses[0]) == ("compression_ratio", "layerwise")
    assert Q.scoring_record(presses[0]) == Q.scoring_record(presses[1])
    assert Q.scoring_record(presses[0]) != Q.scoring_record(R.press_from_spec(f"{name}[n_sink=0]", 0.5))

    def masks():
        return [tuple(i.tolist() for i in layer.self_attn.masked_key_indices) for layer in model.model.layers]

    shared = [masks() for _ in Q.caches_by_setting(model, prompt, presses)]
    separate = []
    for s, c in specs:
        press, seen = R.press_from_spec(s, c), []
        post = press.compress_post
        press.compress_post = lambda m, post=post: (post(m), seen.append(masks()))
        with torch.inference_mode(), press(model):  # KVzip's pass reads the cache handed to the prefill
            model(input_ids=prompt, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
        separate.append(seen[0])
    assert shared == separate
    # the per-layer budget masks c of every layer's entries; the global one does not (its layers differ)
    per_layer = [len(m[0]) for m in shared[1]]
    assert set(per_layer) == {int(0.75 * 3 * 160)}
    assert len(set(len(m[0]) for m in shared[0])) > 1


@pytest.mark.model
def test_measure_group_reuses_kvzip_scores_across_ratios(bundled):
    """The evaluation's group measurement with ``reuse_scores``: the same rows as one real prefill per ratio."""
    from jacap_lib.experiments.protocol.documents import load_docs
    from jacap_lib.experiments.protocol.runs import Group, measure_group

    model, tok = bundled
    doc = next(d for d in load_docs(None) if d["split"] == "tune")
    jobs = [("kvzip", 0.5), ("snapkv[window_size=16]", 0.5), ("kvzip", 0.9)]
    rows = {reuse: measure_group(model, tok, Group(doc, 160, jobs), 8, "m", build=R.press_from_spec,
                                 reuse_scores=reuse) for reuse in (False, True)}
    assert [(r["method"], r["ratio"]) for r in rows[True]] == jobs == [(r["method"], r["ratio"]) for r in rows[False]]
    for a, b in zip(rows[False], rows[True]):
        assert abs(a["kl"] - b["kl"]) < 1e-6 and a["kept_tokens"] == b["kept_tokens"]
    assert [r.get("scores_shared_by") for r in rows[True]] == [2, None, 2]
    assert rows[True][0]["kl"] < rows[True][2]["kl"]


@pytest.mark.model
def test_needle_runs_kvzip_on_the_real_prefill(bundled):
    """The needle measurement of a press that cannot replay (KVzip): its answer and digit survival are those of the
    real prefill under ``with press(model)`` then greedy decoding by hand; the group measurement scores once for its
    ratios and gives the same rows as one real prefill per ratio; a replayable press is unchanged."""
    from jacap_lib.measure.eviction import kept_positions
    from jacap_lib.measure.passkey import NeedleGroup, greedy_answer, measure_needle, needle_trial, passkey_inputs

    model, tok = bundled
    prefill, decode, layout = passkey_inputs(tok, 256, 0.5, "31415")
    cap = capture_prefill(model, prefill)
    res = needle_trial(model, tok, cap, R.build_press("kvzip", 0.75), decode, layout)
    # by hand: the real prefill, the masks it leaves, the greedy answer
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode(), R.build_press("kvzip", 0.75)(model):
        model(input_ids=prefill, past_key_values=cache, use_cache=True, logits_to_keep=1)
    kept = kept_positions(model, cap, cache)
    assert int((~kept).sum()) == int(0.75 * 30 * 3 * 256)  # kvpress's global budget
    answer = tok.decode(greedy_answer(model, cache, cap.prompt_len, decode, 8))
    assert res["answer"] == answer
    assert res["key_kept_frac"] == round(float(kept[..., layout["key"]].float().mean()), 4)
    group = NeedleGroup(256, 0.5, 0, "31415", jobs=[("kvzip", 0.5), ("snapkv", 0.5), ("kvzip", 0.75)])
    rows = measure_needle(model, tok, group, model_name="m", press_of=R.press_from_spec, family_of=lambda s: s)
    assert [(r["method"], r["ratio"]) for r in rows] == group.jobs
    assert rows[2]["answer"] == answer and rows[2]["key_kept_frac"] == res["key_kept_frac"]
    alone = needle_trial(model, tok, cap, R.build_press("kvzip", 0.5), decode, layout)
    assert rows[0]["answer"] == alone["answer"] and rows[0]["kept_tokens"] == alone["kept_tokens"]
    snap = needle_trial(model, tok, cap, R.build_press("snapkv", 0.5), decode, layout)
    assert rows[1]["answer"] == snap["answer"] and rows[1]["kept_tokens"] == snap["kept_tokens"] == 128.0
