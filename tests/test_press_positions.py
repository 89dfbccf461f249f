"""Jacap presses where kvpress wrappers put a scorer: hidden states that do not start at position 0.

Each statistic is recomputed by hand (q_proj of the rows, the model's own RoPE applied at every future
position from the *true* next position and averaged, flat moments pooled over the GQA group) and
compared with what the press computes from the hook's ``cache_position`` / a ``ChunkPress`` slice.
"""
from __future__ import annotations

import pytest
import torch
from kvpress import ChunkPress, DecodingPress, PerLayerCompressionPress
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from jacap_lib.presses import utils
from jacap_lib.presses.jacap import JacapPromptPress
from jacap_lib.presses.registry import RECONSTRUCTION_METHODS, build_press, list_methods
from jacap_lib.stats import flat_query_stats

F = 16  # future positions averaged (small: the hand computation loops over them)


def _attn(model, layer=0):
    attn = model.model.layers[layer].self_attn
    attn.rotary_emb = model.model.rotary_emb  # what kvpress's press(model) does
    return attn


def _by_hand(model, attn, rows: torch.Tensor, next_pos: int, eps: float):
    """Pooled (mu, lam) of the pre-RoPE queries of ``rows (1, T, hidden)``, RoPE averaged over next_pos.. +F."""
    t = rows.shape[1]
    q = attn.q_proj(rows).view(1, t, 4, 16).transpose(1, 2)  # llama: no q_norm
    cos, sin = model.model.rotary_emb(q, torch.arange(next_pos, next_pos + F)[None])
    rotated = torch.stack([apply_rotary_pos_emb(q, q, cos[:, f:f + 1], sin[:, f:f + 1])[0] for f in range(F)]).mean(0)
    return flat_query_stats(rotated.view(1, 2, 2 * t, 16), eps=eps)


@torch.no_grad()
def test_decoding_buffer_statistics_use_true_positions(tiny_llama):
    """DecodingPress hands the last T decoding steps; positions t-T+1..t are no sinks, RoPE starts at t+1."""
    model, attn = tiny_llama, _attn(tiny_llama)
    g = torch.Generator().manual_seed(0)
    buffer = torch.randn(1, 3, 64, generator=g)  # 3 buffered steps (fewer than n_sink = 4)
    keys = torch.randn(1, 2, 50, 16, generator=g)
    press = JacapPromptPress(0.5, n_future_positions=F, beta=None)  # flat statistics: compared with the by-hand mean
    step = 57
    mu, lam = press.query_statistics(attn, buffer, keys, {"cache_position": torch.tensor([step]),
                                                          "hidden_states": buffer[:, -1:]})
    mu_ref, lam_ref = _by_hand(model, attn, buffer, step + 1, press.eps)
    torch.testing.assert_close(mu, mu_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lam, lam_ref, rtol=1e-4, atol=1e-5)
    # kvpress's pipeline passes position_ids only: cache_position is then the compressed slot count (50),
    # position_ids the true position, and the latter wins
    mu2, lam2 = press.query_statistics(attn, buffer, keys, {"cache_position": torch.tensor([50]),
                                                            "position_ids": torch.tensor([[step]])})
    torch.testing.assert_close(mu2, mu_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lam2, lam_ref, rtol=1e-4, atol=1e-5)
    # the old behaviour (rows taken as positions 0.., RoPE from T) is measurably different
    mu_old, _ = _by_hand(model, attn, buffer, 3, press.eps)
    assert (mu - mu_old).abs().max() > 1e-2


@torch.no_grad()
def test_chunk_statistics_and_protection_from_the_slice_offset(tiny_llama):
    """A ChunkPress slice hidden[:, i:i+c] is located in the prompt: sinks only in the first chunk,
    the recent window only in the last one, RoPE averaged from the prompt's end."""
    model, attn = tiny_llama, _attn(tiny_llama)
    g = torch.Generator().manual_seed(1)
    P, c = 24, 8
    hidden = torch.randn(1, P, 64, generator=g)
    kwargs = {"cache_position": torch.arange(P), "hidden_states": hidden}
    press = JacapPromptPress(0.5, n_sink=4, window=3, n_future_positions=F, beta=None)
    for i in range(0, P, c):
        chunk = hidden[:, i:i + c]
        keys = torch.randn(1, 2, c, 16, generator=g)
        qpos, kpos, nxt = utils.hook_positions(chunk, keys, kwargs)
        assert qpos.tolist() == list(range(i, i + c)) and kpos.tolist() == qpos.tolist() and nxt == P
        mu, lam = press.query_statistics(attn, chunk, keys, kwargs)
        rows = chunk[:, max(0, 4 - i):]  # only true sinks (positions 0..3) are skipped
        mu_ref, lam_ref = _by_hand(model, attn, rows, P, press.eps)
        torch.testing.assert_close(mu, mu_ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(lam, lam_ref, rtol=1e-4, atol=1e-5)
        mask = press.protected(chunk, keys, kwargs)
        expected = [(i + j) < 4 or (i + j) >= P - 3 for j in range(c)]
        assert mask.tolist() == expected


@torch.no_grad()
def test_few_queries_fall_back_to_those_there_are(tiny_llama):
    model, attn = tiny_llama, _attn(tiny_llama)
    g = torch.Generator().manual_seed(2)
    keys = torch.randn(1, 2, 10, 16, generator=g)
    press = JacapPromptPress(0.5, n_sink=4, n_future_positions=F, beta=None)
    # a prompt of 3 tokens, all of them sinks: the statistics use the 3 queries instead of none
    short = torch.randn(1, 3, 64, generator=g)
    mu, lam = press.query_statistics(attn, short, keys, {"cache_position": torch.arange(3)})
    mu_ref, lam_ref = _by_hand(model, attn, short, 3, press.eps)
    torch.testing.assert_close(mu, mu_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lam, lam_ref, rtol=1e-4, atol=1e-5)
    # one query per head: the pooled group still has G = 2 queries; with gqa="mean" each head has one,
    # its variance is 0 and floored at eps
    one = torch.randn(1, 1, 64, generator=g)
    mu, lam = JacapPromptPress(0.5, gqa="mean", n_future_positions=F).query_statistics(
        attn, one, keys, {"cache_position": torch.tensor([30])})
    assert torch.isfinite(mu).all() and torch.equal(lam, torch.full_like(lam, 1e-6))
    scores = JacapPromptPress(0.5, gqa="mean").score(attn, one, keys, keys, None, {"cache_position": torch.tensor([30])})
    assert scores.shape == (1, 2, 10) and torch.isfinite(scores).all()


@torch.no_grad()
def test_decoding_press_with_short_interval_keeps_sinks_window_and_order(tiny_llama):
    """The issue's crash: DecodingPress(compression_interval=3 <= n_sink). Every compression now keeps the
    4 sink positions and the last `window` positions, the cache stays in position order, and its length
    follows DecodingPress's schedule exactly."""
    model = tiny_llama
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 96, (1, 40), generator=g)
    P, target, interval, window = 12, 16, 3, 2
    press = DecodingPress(base_press=JacapPromptPress(n_future_positions=F, window=window), compression_interval=interval,
                          target_size=target, hidden_states_buffer_size=8)
    full = DynamicCache()
    model(input_ids=ids, past_key_values=full)  # uncompressed keys of every position (to locate kept slots)
    cache = DynamicCache()
    lengths = []
    with press(model):
        model(input_ids=ids[:, :P], past_key_values=cache)
        for t in range(P, ids.shape[1]):
            pos = torch.tensor([t])
            model(input_ids=ids[:, t:t + 1], past_key_values=cache, cache_position=pos, position_ids=pos[None])
            lengths.append(cache.layers[0].keys.shape[2])
    # DecodingPress: every `interval` steps the cache is cut to `target` (when longer)
    expected, n = [], P
    for step in range(1, ids.shape[1] - P + 1):
        n += 1
        if step % interval == 0 and n > target:
            n = target
        expected.append(n)
    assert lengths == expected
    # layer 0's keys depend on token and position only, so each kept key is the uncompressed run's key of
    # exactly one position (deeper layers' keys move once layer 0 attends a compressed cache)
    kept, ref = cache.layers[0].keys[0], full.layers[0].keys[0]  # (H, n, d), (H, T, d)
    for h in range(2):
        dist = torch.cdist(kept[h], ref[h], compute_mode="donot_use_mm_for_euclid_dist")
        assert float(dist.min(-1).values.max()) < 1e-4
        positions = dist.argmin(-1).tolist()
        assert positions == sorted(positions)  # position order
        assert positions[:4] == [0, 1, 2, 3]
        assert positions[-window:] == list(range(ids.shape[1] - window, ids.shape[1]))


@pytest.mark.parametrize("name", [n for n in list_methods("jacap") if n not in RECONSTRUCTION_METHODS])
@torch.no_grad()
def test_every_jacap_press_takes_ratio_one(tiny_llama, name):
    """kvpress's PerLayerCompressionPress with a ratio of 1.0 drops a layer; decoding goes on."""
    model = tiny_llama
    press = build_press(name, 0.5, n_future_positions=F)
    if not isinstance(press, JacapPromptPress):  # registry wrappers (AdaKV, pyramid): kvpress refuses them here,
        with pytest.raises(AssertionError, match="compression_ratio can't be set|ScorerPress"):
            PerLayerCompressionPress(press=press, compression_ratios=[1.0, 0.5])
        press = press.press  # ... their Jacap scorer is what takes the ratio
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 96, (1, 20), generator=g)
    cache = DynamicCache()
    with PerLayerCompressionPress(press=press, compression_ratios=[1.0, 0.5])(model):
        model(input_ids=ids, past_key_values=cache)
    assert [cache.layers[i].keys.shape[2] for i in range(2)] == [0, 10]
    out = model(input_ids=ids[:, :1], past_key_values=cache, cache_position=torch.tensor([20])).logits
    assert torch.isfinite(out).all() and [cache.layers[i].keys.shape[2] for i in range(2)] == [1, 11]
    # the scorer itself at ratio 1.0 (AdaKV, CriticalKV call score() with the wrapper's ratio)
    attn = _attn(model)
    press.compression_ratio = 1.0
    hs = torch.randn(1, 20, 64, generator=g)
    keys = torch.randn(1, 2, 20, 16, generator=g)
    scores = press.score(attn, hs, keys, keys, None, {"cache_position": torch.arange(20)})
    assert scores.shape == (1, 2, 20) and not torch.isnan(scores).any()


@torch.no_grad()
def test_chunk_press_with_chunks_shorter_than_n_sink(tiny_llama):
    model = tiny_llama
    ids = torch.randint(0, 96, (1, 21), generator=torch.Generator().manual_seed(5))
    cache = DynamicCache()
    with ChunkPress(press=JacapPromptPress(0.5, n_future_positions=F, window=0), chunk_length=3)(model):
        model(input_ids=ids, past_key_values=cache)
    # 7 chunks of 3, each keeps max(1, int(3 * 0.5)) = 1
    assert [cache.layers[i].keys.shape[2] for i in range(2)] == [7, 7]
