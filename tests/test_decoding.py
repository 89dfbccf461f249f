"""Tests of the decode-time controller (Algorithm 2) on the bundled SmolLM2-135M (CPU).

Every check compares against an independent computation: plain ``generate`` without the
controller, or one full forward pass of the whole sequence with explicit per-layer, per-head
attention masks over the evicted positions at their original positions.
"""
import math

import pytest
import torch

import jacap_lib
from jacap_lib import scoring, selection as select
from jacap_lib.controller import JacapDecodeController
from jacap_lib.measure.quality import kl_from_logits
from jacap_lib.measure.replay import replay
from jacap_lib.stats import ema_trace, ema_tradeoff
from jacap_lib.stats import ema_query_stats

PROMPT = "Write a long story about a lighthouse keeper who finds a map."
SHORT = "Name three colours."


@pytest.fixture(scope="module")
def bundled():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many tiny ops; one thread avoids contention on a shared CPU
    model, tok = jacap_lib.load_model()
    model.eval()
    yield model, tok
    torch.set_num_threads(threads)


def chat(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True)


def gen(model, inputs, n, ctrl=None, **kw):
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, return_dict_in_generate=True,
              output_logits=True, **kw)
    with torch.no_grad():
        if ctrl is None:
            return model.generate(**inputs, **kw)
        with ctrl:
            return model.generate(**inputs, **kw)


@pytest.mark.model
def test_bad_arguments(bundled):
    model, _ = bundled
    with pytest.raises(ValueError, match="interval"):
        JacapDecodeController(model, high=64, budget=60, interval=8)
    with pytest.raises(ValueError, match="protected"):
        JacapDecodeController(model, high=64, budget=20, interval=4, n_sink=4, window=32)
    with pytest.raises(ValueError, match="beta"):
        JacapDecodeController(model, high=64, budget=40, interval=4, beta=1.5)


@pytest.mark.model
def test_no_eviction_below_watermark_reproduces_generate(bundled):
    model, tok = bundled
    inputs = chat(tok, PROMPT)
    ref = gen(model, inputs, 12)
    ctrl = JacapDecodeController(model, high=4096, budget=64, interval=8)
    out = gen(model, inputs, 12, ctrl)
    assert ctrl.events == []
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.logits, ref.logits):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # the statistics are the EMA of the rotated queries: one query per processed token
    assert ctrl._stats[0][0].count == inputs["input_ids"].shape[1] + 11


@pytest.mark.model
def test_cache_never_exceeds_watermark(bundled):
    model, tok = bundled
    inputs = chat(tok, PROMPT)
    n_prompt = inputs["input_ids"].shape[1]
    high, budget, interval = 64, 44, 4
    ctrl = JacapDecodeController(model, high=high, budget=budget, interval=interval, window=8)
    out = gen(model, inputs, 48, ctrl)
    assert out.sequences.shape[1] == n_prompt + 48
    lengths = [L for _, _, L in ctrl.trace]
    assert max(lengths) <= high
    assert len(ctrl.events) >= 2
    n_layers, n_kv = model.config.num_hidden_layers, model.config.num_key_value_heads
    for ev in ctrl.events:
        assert ev.method == "jacap" and ev.fallback_reason is None
        assert ev.tokens_before > budget and ev.tokens_after == budget
        assert ev.step % interval == 0 and ev.tokens_before + interval > high
        assert ev.kv_bytes_after * ev.tokens_before == ev.kv_bytes_before * budget
        assert sum(ev.age_counts) == n_layers * n_kv * budget
    # between looks the cache grows by one slot per token; every look that did not evict had room
    for step, _, L in ctrl.trace:
        if step % interval == 0 and step not in {ev.step for ev in ctrl.events}:
            assert L + interval <= high
    # protected sink and recent window survive in every layer and head
    pos = ctrl.positions(5)[0]
    seq = ctrl.trace[-1][1]
    for h in range(n_kv):
        kept = set(pos[h].tolist())
        assert set(range(4)) <= kept
        assert set(range(seq - 8, seq)) <= kept


@pytest.mark.model
def test_cholesky_failure_falls_back_to_window(bundled, monkeypatch):
    model, tok = bundled
    inputs = chat(tok, PROMPT)

    def boom(*args, **kwargs):
        raise scoring.CholeskyFailure("forced failure for the test")

    monkeypatch.setattr(scoring, "validated_scores", boom)  # the controller scores with its validated parameters
    ctrl = JacapDecodeController(model, high=64, budget=44, interval=4, window=8, n_sink=4)
    with pytest.warns(RuntimeWarning, match="Cholesky failed"):
        out = gen(model, inputs, 24, ctrl)
    n_prompt = inputs["input_ids"].shape[1]
    assert out.sequences.shape[1] == n_prompt + 24  # generation continued
    assert ctrl.events and all(ev.method == "window" for ev in ctrl.events)
    assert all("Cholesky" in ev.fallback_reason for ev in ctrl.events)
    assert all(ev.fallback_layers == list(range(model.config.num_hidden_layers)) for ev in ctrl.events)
    assert max(L for _, _, L in ctrl.trace) <= 64
    # a sliding window: the 4 sink tokens and then the newest tokens, contiguous
    pos = ctrl.positions(0)[0, 0].tolist()
    seq = ctrl.trace[-1][1]
    tail = len(pos) - 4
    assert pos == list(range(4)) + list(range(seq - tail, seq))


@pytest.mark.model
def test_deadline_falls_back_to_window(bundled):
    model, tok = bundled
    inputs = chat(tok, PROMPT)
    ctrl = JacapDecodeController(model, high=40, budget=28, interval=4, window=8, deadline_s=0.0)
    with pytest.warns(RuntimeWarning, match="deadline"):
        gen(model, inputs, 8, ctrl)
    assert ctrl.events and all(ev.method == "window" and "deadline" in ev.fallback_reason for ev in ctrl.events)


def _masked_reference_logits(model, sequences, events, n_kv, group):
    """Logits of one full forward over ``sequences`` where, from each eviction on, every layer and
    KV head sees only the tokens that layer/head kept (original positions, true position ids)."""
    T = sequences.shape[1]
    n_layers = model.config.num_hidden_layers
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    masks = [causal.expand(1, n_kv * group, T, T).clone() for _ in range(n_layers)]
    for ev in events:
        S = ev.seq_len
        for layer in range(n_layers):
            kept = ev.kept_positions[layer][0]  # (H_kv, budget)
            for g in range(n_kv):
                gone = torch.ones(S, dtype=torch.bool)
                gone[kept[g]] = False
                heads = slice(g * group, (g + 1) * group)
                masks[layer][0, heads, S:, :S] &= ~gone
    handles = []
    for m in model.modules():
        if m.__class__.__name__.endswith("Attention") and hasattr(m, "layer_idx"):
            def pre(mod, args, kwargs):
                kwargs["attention_mask"] = masks[mod.layer_idx]
                return args, kwargs
            handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        with torch.no_grad():
            logits = model(input_ids=sequences, position_ids=torch.arange(T)[None]).logits
    finally:
        for h in handles:
            h.remove()
    return logits[0]


@pytest.mark.model
def test_positions_are_true_after_eviction(bundled):
    model, tok = bundled
    inputs = chat(tok, PROMPT)
    n_prompt = inputs["input_ids"].shape[1]
    n_new = 24
    ctrl = JacapDecodeController(model, high=40, budget=28, interval=4, window=6, record_kept=True)
    out = gen(model, inputs, n_new, ctrl)
    assert len(ctrl.events) >= 2
    ref = _masked_reference_logits(model, out.sequences, ctrl.events, model.config.num_key_value_heads,
                                   ctrl.group)
    got = torch.stack(out.logits)[:, 0]  # (n_new, vocab)
    want = ref[n_prompt - 1: n_prompt - 1 + n_new]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-3)
    # the eviction mattered: without masks the same tokens give clearly different logits
    with torch.no_grad():
        full = model(input_ids=out.sequences).logits[0, n_prompt - 1: n_prompt - 1 + n_new]
    assert (full - got).abs().max() > 0.1
    # the controller's slot positions are the kept original positions plus everything after
    last = ctrl.events[-1]
    seq = ctrl.trace[-1][1]
    expect = torch.cat([last.kept_positions[3][0], torch.arange(last.seq_len, seq).expand(ctrl.n_kv_heads, -1)], -1)
    assert torch.equal(ctrl.positions(3)[0], expect)


@pytest.mark.model
def test_replay_matches_one_forward(bundled):
    model, tok = bundled
    seq = chat(tok, PROMPT)["input_ids"]
    n_prompt = seq.shape[1] - 6
    with torch.no_grad():
        full = model(input_ids=seq).logits[0, n_prompt - 1:]
    torch.testing.assert_close(replay(model, seq, n_prompt), full, rtol=1e-4, atol=1e-3)
    ctrl = JacapDecodeController(model, high=4096, budget=64, interval=8)
    torch.testing.assert_close(replay(model, seq, n_prompt, ctrl), full, rtol=1e-4, atol=1e-3)
    assert ctrl.events == [] and ctrl.trace[-1][1] == seq.shape[1]


@pytest.mark.model
def test_statistics_are_per_request(bundled):
    model, tok = bundled
    tok.pad_token = tok.pad_token or tok.eos_token
    tok.padding_side = "left"
    texts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
             for t in (PROMPT, SHORT)]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert batch["attention_mask"].sum(-1).tolist()[0] != batch["attention_mask"].sum(-1).tolist()[1]
    ctrl = JacapDecodeController(model, high=4096, budget=64, interval=8)
    gen(model, batch, 6, ctrl, pad_token_id=tok.pad_token_id)
    together = {layer: ctrl.query_stats(layer) for layer in (0, 14, 29)}
    for row, text in enumerate(texts):
        alone_inputs = tok([text], return_tensors="pt", add_special_tokens=False)
        alone = JacapDecodeController(model, high=4096, budget=64, interval=8)
        gen(model, alone_inputs, 6, alone, pad_token_id=tok.pad_token_id)
        for layer, (mu, lam) in together.items():
            mu1, lam1 = alone.query_stats(layer)
            torch.testing.assert_close(mu[row], mu1[0], rtol=1e-3, atol=2e-4)
            torch.testing.assert_close(lam[row], lam1[0], rtol=1e-3, atol=2e-4)
    # and the two requests really differ (mixing them would be visible)
    mu, _ = together[14]
    assert (mu[0] - mu[1]).abs().max() > 0.1


@pytest.mark.model
def test_padded_batch_evicts_per_row(bundled):
    model, tok = bundled
    tok.pad_token = tok.pad_token or tok.eos_token
    tok.padding_side = "left"
    texts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
             for t in (PROMPT, SHORT)]
    batch = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    n_real = batch["attention_mask"].sum(-1)
    ctrl = JacapDecodeController(model, high=48, budget=32, interval=4, window=6)
    gen(model, batch, 16, ctrl, pad_token_id=tok.pad_token_id)
    assert ctrl.events and max(L for _, _, L in ctrl.trace) <= 48
    pos = ctrl.positions(7)
    valid = ctrl._slot_valid
    for row in range(2):
        # real slots hold distinct real positions, ascending; the newest processed token is kept
        # (16 new tokens = the prompt forward + 15 decode forwards)
        newest = int(n_real[row]) + 15 - 1
        for h in range(ctrl.n_kv_heads):
            p = pos[row, h][valid[row]]
            assert torch.all(p[1:] > p[:-1]) and int(p[-1]) == newest and int(p[0]) == 0


@pytest.mark.model
def test_failed_eviction_leaves_cache_unchanged(bundled, monkeypatch):
    from transformers import DynamicCache

    model, tok = bundled
    inputs = chat(tok, PROMPT)
    n_prompt = inputs["input_ids"].shape[1]
    plain = DynamicCache(config=model.config)
    with torch.no_grad():
        model(**inputs, past_key_values=plain)

    def boom(*args, **kwargs):
        raise ValueError("forced selection failure")

    monkeypatch.setattr(select, "select_keep", boom)
    cache = DynamicCache(config=model.config)
    ctrl = JacapDecodeController(model, high=32, budget=16, interval=4, window=4)
    with ctrl, torch.no_grad(), pytest.raises(ValueError, match="forced selection failure"):
        model(**inputs, past_key_values=cache)  # the prompt already passes the watermark
    assert cache.get_seq_length() == n_prompt and ctrl.events == []
    for a, b in zip(cache.layers, plain.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-6)
        torch.testing.assert_close(a.values, b.values, rtol=0, atol=1e-6)
    assert ctrl.positions(0).shape[-1] == n_prompt


# ---------------------------------------------------------------- no model needed

def test_ema_trace_matches_closed_form():
    q = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
    mu, lam = ema_trace(q, 0.8)
    for t in (0, 7, 39):
        mu_c, lam_c = ema_query_stats(q[: t + 1], 0.8)
        torch.testing.assert_close(mu[t], mu_c, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lam[t], lam_c, rtol=1e-5, atol=1e-6)


def test_ema_tradeoff_on_a_step_change():
    # queries jump from -1 to +1 halfway, plus noise: small beta is noisier, large beta lags more
    g = torch.Generator().manual_seed(0)
    q = torch.cat([-torch.ones(100, 1), torch.ones(100, 1)]) + 0.3 * torch.randn(200, 1, generator=g)
    fast, slow = ema_tradeoff(q, 0.3, horizon=8), ema_tradeoff(q, 0.98, horizon=8)
    assert fast["jitter"] > 3 * slow["jitter"]
    assert slow["lag_error"] > 2 * fast["lag_error"]
    # a constant stream has neither noise nor lag
    const = ema_tradeoff(torch.full((30, 2), 2.0), 0.5, horizon=4)
    assert const["lag_error"] == pytest.approx(0.0, abs=1e-7) and const["jitter"] == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match="horizon"):
        ema_tradeoff(q[:5], 0.5, horizon=8)


def test_kl_from_logits_against_brute_force():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(3, 11, generator=g), torch.randn(3, 11, generator=g)
    p, r = a.softmax(-1).double(), b.softmax(-1).double()
    want = (p * (p.log() - r.log())).sum(-1)
    torch.testing.assert_close(kl_from_logits(a, b).double(), want, rtol=1e-5, atol=1e-6)
    assert torch.all(kl_from_logits(a, a) < 1e-6)
    with pytest.raises(ValueError, match="shape"):
        kl_from_logits(a, b[:2])


def _fake_events():
    from jacap_lib.controller import EvictionEvent

    return [EvictionEvent(step=s, seq_len=40 + s, tokens_before=60, tokens_after=40, method=m, seconds=0.01,
                          kv_bytes_before=600, kv_bytes_after=400, entropy_before=2.0, entropy_after=1.8,
                          age_edges=[0.0, 10.0, 20.0], age_counts=[30, 10], mean_age_kept=7.0)
            for s, m in ((8, "jacap"), (24, "window"))]


def test_viz_figures():
    from jacap_lib.viz import serving as VS, style
    from jacap_lib.viz.style import METHOD_STYLES

    evs = _fake_events()
    trace = [(s, 40 + s, min(40 + s, 60)) for s in range(30)]
    fig = VS.cache_timeline(trace, evs, high=64, budget=40)
    assert list(fig.data[1].y) == [t[2] for t in trace] and list(fig.data[2].x) == [8, 24]
    # the controller's cache in Algorithm 2's colour; watermark and budget black lines named in the legend with
    # their values, so no text label sits on the cache line
    assert fig.data[1].line.color == METHOD_STYLES["alg2"][0]
    assert [(t.name, list(t.y)) for t in fig.data[3:]] == [("high watermark (64)", [64, 64]), ("budget (40)", [40, 40])]
    assert {t.line.color for t in fig.data[3:]} == {METHOD_STYLES["full"][0]} and not fig.layout.annotations
    fig = VS.age_histograms(evs)
    assert len(fig.data) == 2 and len(fig.layout.sliders[0].steps) == 2
    assert list(fig.data[0].y) == [0.75, 0.25]
    with pytest.raises(ValueError, match="empty"):
        VS.age_histograms([])
    q = [0.0, 1.0, 2.0, 3.0]
    fig = VS.beta_tracking(q, {"0.5": [0, 0.5, 1.25, 2.125], "0.9": [0, 0.1, 0.29, 0.561]})
    assert len(fig.layout.sliders[0].steps) == 2
    runs = {"0.9": {"beta": 0.9, "method": "jacap", "mean_kl": 0.1, "kl": [0.1, 0.2]},
            "window": {"beta": None, "method": "window", "mean_kl": 0.2, "kl": [0.2, 0.3]}}
    fig = VS.beta_tradeoff([{"beta": 0.9, "jitter": 0.1, "lag_error": 0.2}], runs)
    assert len(fig.data) == 4
    assert len(VS.kl_timeline(runs).data) == 2
    # before (and at) a run's first eviction the KL is float rounding: left out, so the log axis starts at the signal
    ev = lambda step: {"step": step}  # noqa: E731
    runs = {"0.5": {"beta": 0.5, "method": "jacap", "kl": [0.0, 3e-9, 8e-8, 0.02, 0.3], "events": [ev(2), ev(4)]},
            "0.9": {"beta": 0.9, "method": "jacap", "kl": [0.0, 1e-8, 0.01, 0.5, 0.4], "events": [ev(1)]},
            "window": {"beta": None, "method": "window", "kl": [1e-9, 0.0, 5e-8, 0.04, 0.1], "events": [ev(2)]}}
    fig = VS.kl_timeline(runs)
    assert [list(t.y) for t in fig.data] == [[None, None, None, 0.02, 0.3], [None, None, 0.01, 0.5, 0.4],
                                            [None, None, None, 0.04, 0.1]]
    assert list(fig.layout.yaxis.tickvals) == [0.01, 0.02, 0.05, 0.1, 0.2, 0.5]  # not down to 1e-9
    assert (fig.layout.shapes[0].x0, fig.layout.shapes[0].x1) == (0, 1)  # the shaded "no eviction yet"
    colours = [t.line.color for t in fig.data]
    assert len(set(colours)) == 3 and colours[2] == METHOD_STYLES["window"][0]
    assert colours[:2] == list(style.setting_colours(["0.5", "0.9"], ordered=True).values())
    # each β its own dash too (the lines cross often), none the window's dash
    dashes = [t.line.dash for t in fig.data]
    assert dashes[:2] == list(style.SETTING_DASHES[:2]) and dashes[2] == "dash" and len(set(dashes)) == 3


def _summary(age_fraction):
    return {"bin_edges": [0, 4, 8], "kl_binned": [0.01, 0.02], "per_generation_kl": [0.01, 0.03], "gm_kl": 0.017,
            "gm_low": 0.01, "gm_high": 0.03, "age_edges": [0, 16, 32, 64, 1 << 30], "age_fraction": age_fraction}


def test_decoding_comparison_titles_every_panel_and_drops_empty_age_bins():
    from jacap_lib.viz import serving as VS
    from jacap_lib.viz.style import METHOD_STYLES

    fig = VS.decoding_comparison({"alg2": _summary([0.5, 0.5, 0.0, 0.0]), "tova": _summary([0.4, 0.4, 0.2, 0.0])})
    for k in ("", "2", "3"):
        assert fig.layout[f"xaxis{k}"].title.text and fig.layout[f"yaxis{k}"].title.text, k
    bars = [t for t in fig.data if t.type == "bar"]
    # the last bin (>= 64) is empty for every method: gone; 32-63 holds tova's tokens: kept, with alg2's 0
    assert [list(t.x) for t in bars] == [["0-15", "16-31", "32-63"]] * 2 and list(bars[0].y) == [0.5, 0.5, 0.0]
    assert [t.marker.color for t in bars] == [METHOD_STYLES["alg2"][0], METHOD_STYLES["tova"][0]]
    # the per-generation panel labels its columns with each method's short name (not hidden ticks)
    assert fig.layout.xaxis2.showticklabels is not False
    dots = [t for t in fig.data if t.type == "scatter" and t.xaxis == "x2"]
    assert {x for t in dots for x in t.x} == {"Algorithm 2 (EMA)", "TOVA"}


def test_widget_callbacks():
    from jacap_lib.widgets import serving as WS

    q = [1.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    view = WS.beta_view(q, 0.5, horizon=2)
    # closed form: mu_1 = 1, mu_t = 0.5 mu_{t-1} + 0.5 * 3
    assert view["mu"][:3] == pytest.approx([1.0, 2.0, 2.5])
    assert view["lam"][1] == pytest.approx(0.5 * 1 + 0.5 * 9 - 4.0)
    fig = WS.beta_figure(q, 0.5, horizon=2)
    assert list(fig.data[1].y) == pytest.approx(view["mu"])
    with pytest.raises(FileNotFoundError, match="serve-run"):
        WS.load_run("/nonexistent/serving_run.json")


def test_event_entropy_closed_form(tiny_llama):
    """The entropy an event records (EvictionEvent.entropy_before/after) on hand-made queries and keys:
    q = 0 gives uniform attention over the valid slots (entropy log n_valid); a query along e_0 with
    keys (a_i, 0, ...) gives softmax(a_i q_0 / sqrt(d)), whose entropy is summed here by hand."""
    ctrl = JacapDecodeController(tiny_llama, high=64, budget=40, interval=8, window=8)
    d = 16
    keys = torch.randn(2, 2, 10, d, generator=torch.Generator().manual_seed(0))
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, :3] = False  # row 1: three padding slots
    ctrl._last_q[0] = torch.zeros(2, 4, d)
    ent = ctrl._entropy(0, keys, valid)
    torch.testing.assert_close(ent, torch.tensor([[math.log(10)] * 4, [math.log(7)] * 4]), rtol=1e-6, atol=1e-6)
    a = [0.0, 1.0, 2.0, 4.0]
    keys = torch.zeros(1, 2, 4, d)
    keys[0, :, :, 0] = torch.tensor(a)
    q = torch.zeros(1, 4, d)
    q[..., 0] = 3.0
    ctrl._last_q[0] = q
    z = [math.exp(3.0 * x / math.sqrt(d)) for x in a]
    p = [v / sum(z) for v in z]
    want = -sum(pi * math.log(pi) for pi in p)
    got = ctrl._entropy(0, keys, torch.ones(1, 4, dtype=torch.bool))
    torch.testing.assert_close(got, torch.full((1, 4), want), rtol=1e-6, atol=1e-7)
