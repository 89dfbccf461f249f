"""JacapPromptPress's three centres against an independent dense computation, and the one protection rule under padding.

* every ``centre`` ("observed", "tempered", "ea") and both GQA conventions: the press's scores equal a float64
  Algorithm 1 from a centre computed here from its formula (the observed one from the attention weights an eager
  forward of the model reports), with an explicit solve instead of the blocked Cholesky path;
* right padding (an attention mask in the attention module's kwargs): the sinks and the recent window are the first
  ``n_sink`` and the last ``window`` *real* tokens of each batch row, for every press and instrument (one rule), and
  the observed centre puts no mass on pads (it equals the centre of the row run alone, without padding).
"""
import contextlib
import math

import pytest
import torch

pytest.importorskip("kvpress")
from kvpress import KnormPress  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from jacap_lib.measure.instruments import ProtectedPress  # noqa: E402
from jacap_lib.presses.jacap import CENTRES, JacapPromptPress  # noqa: E402
from jacap_lib.presses.jacap_two_stage import JacapTwoStagePress  # noqa: E402
from jacap_lib.presses.utils import real_tokens  # noqa: E402
from jacap_lib.selection import n_kept  # noqa: E402
from conftest import eager_layer  # noqa: E402


def _dense_scores(k, v, lam, alpha, noise):
    """Algorithm 1 from a given centre, float64, explicit solve: r_i = w_i/s2 u_i^T (I + sum_j w_j/s2 u_j u_j^T)^-1 u_i."""
    d = k.shape[-1]
    w = (alpha * (1 - alpha)).square() * (k.square() * lam).sum(-1) / d
    A = torch.eye(v.shape[-1], dtype=torch.float64) + (v.T * (w / noise)) @ v
    return w / noise * (v * torch.linalg.solve(A, v.T).T).sum(-1)


def _observed(attn, rows, beta):
    """The observed centre from the model's own attention rows: flat mean, or the EMA recursion of mu_Q."""
    if beta is None:
        return attn[:, :, rows].mean(2)
    out = attn[:, :, rows[0]]
    for r in rows[1:]:
        out = beta * out + (1 - beta) * attn[:, :, r]
    return out


@pytest.mark.parametrize("gqa", ["pool", "mean"])
@pytest.mark.parametrize("centre", CENTRES)
def test_every_centre_scores_as_a_dense_algorithm1_from_that_centre(centre, gqa):
    n, n_sink, window, tau, noise = 48, 4, 6, 2.5, 0.3
    module, hs, keys, values, attn = eager_layer(n, seed=31)
    press = JacapPromptPress(0.5, centre=centre, gqa=gqa, n_sink=n_sink, window=window, tau=tau, noise=noise)
    with torch.no_grad():
        mu, lam = press.query_statistics(module, hs, keys, {})  # (1, H, d): H = H_kv (pool) or H_q (mean)
        got = press.score(module, hs, keys, values, None, {})
    mu, lam = mu.double()[0], lam.double()[0]
    heads = mu.shape[0]
    g = heads // 2  # query heads per scored head's KV head
    d = keys.shape[-1]
    observed = _observed(attn, torch.arange(n_sink, n), press.beta)[0]  # (H_q, n)
    if gqa == "pool":
        observed = observed.view(2, 2, n).mean(1)
    expected = torch.zeros(2, n, dtype=torch.float64)
    for h in range(heads):
        kv = h // g
        k, v = keys[0, kv].double(), values[0, kv].double()
        if centre == "tempered":
            alpha = torch.softmax(k @ mu[h] / (tau * math.sqrt(d)), -1)
        elif centre == "ea":
            alpha = torch.softmax(k @ mu[h] / math.sqrt(d) + (k.square() * lam[h]).sum(-1) / (2 * d), -1)
        else:
            alpha = observed[h]
        expected[kv] += _dense_scores(k, v, lam[h], alpha, noise) / g
    free = torch.ones(n, dtype=torch.bool)
    free[:n_sink] = free[n - window:] = False
    torch.testing.assert_close(got[0][:, free].double(), expected[:, free], rtol=2e-4, atol=1e-9)
    assert bool((got[0][:, ~free] == torch.finfo(got.dtype).max).all())
    kept = got.topk(n_kept(n, 0.5), dim=-1).indices.sort(-1).values
    ranked = expected.masked_fill(~free, float("inf")).topk(n_kept(n, 0.5), dim=-1).indices.sort(-1).values
    assert torch.equal(kept[0], ranked)


def test_the_ea_centre_refuses_triton_and_needs_no_tau():
    with pytest.raises(ValueError, match="triton"):
        JacapPromptPress(0.5, centre="ea", backend="triton")
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(1, 2, 30, 8, generator=g), torch.randn(1, 2, 30, 8, generator=g)
    mu, lam = torch.randn(1, 2, 8, generator=g), torch.rand(1, 2, 8, generator=g) + 0.1
    a = JacapPromptPress(0.5, centre="ea", tau=1.0).components(k, v, mu, lam, None)
    b = JacapPromptPress(0.5, centre="ea", tau=40.0).components(k, v, mu, lam, None)
    assert torch.equal(a.score, b.score)


# ----------------------------------------------------------------------------- padding
def _prefill(model, ids, mask=None):
    """Layer 0's hook inputs (module, kwargs) and its cache's keys and values after a prefill of ``ids`` (with the
    2-D ``attention_mask`` ``mask``, or none)."""
    seen = {}
    module = model.model.layers[0].self_attn
    handle = module.register_forward_hook(lambda m, a, kw, out: seen.update(kw), with_kwargs=True)
    cache = DynamicCache()
    try:
        with torch.no_grad():
            model.model(input_ids=ids, attention_mask=mask, past_key_values=cache)
    finally:
        handle.remove()
    module.rotary_emb = model.model.rotary_emb
    return module, seen, cache.layers[0].keys, cache.layers[0].values


def _padded_prefill(model, lengths, n):
    """A right-padded batch (row b has lengths[b] real tokens of n): its ids, its mask and :func:`_prefill`."""
    ids = torch.randint(0, 96, (len(lengths), n), generator=torch.Generator().manual_seed(41))
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for b, length in enumerate(lengths):
        mask[b, :length] = 1
    return (ids, mask, *_prefill(model, ids, mask))


def _brute_protected(mask2d, n_sink, window, budget):
    """Per row: the first n_sink real positions, then the last real positions that fit what the budget leaves."""
    out = torch.zeros(mask2d.shape, dtype=torch.bool)
    for b, row in enumerate(mask2d):
        real = torch.nonzero(row).flatten().tolist()
        sinks = real[: min(n_sink, budget)]
        rest = [p for p in real if p not in sinks]
        recent = rest[len(rest) - min(window, budget - len(sinks), len(rest)):]
        out[b, sinks + recent] = True
    return out


@pytest.mark.parametrize("ratio, n_sink, window", [(0.5, 3, 5), (0.9, 3, 5), (0.5, 0, 7)])
def test_under_right_padding_sinks_and_window_are_real_tokens(tiny_llama, ratio, n_sink, window):
    n, lengths = 40, (27, 40)
    ids, mask2d, module, kw, keys, values = _padded_prefill(tiny_llama, lengths, n)
    hs = kw["hidden_states"]
    assert real_tokens(kw, n) is not None and torch.equal(real_tokens(kw, n), mask2d.bool())
    want = _brute_protected(mask2d, n_sink, window, n_kept(n, ratio))
    presses = [JacapPromptPress(ratio, n_sink=n_sink, window=window),
               JacapTwoStagePress(ratio, n_sink=n_sink, window=window),
               ProtectedPress(press=KnormPress(compression_ratio=ratio), compression_ratio=ratio, n_sink=n_sink,
                              window=window)]
    with torch.no_grad(), (pytest.warns(RuntimeWarning, match="window was shrunk") if ratio == 0.9
                           else contextlib.nullcontext()):
        for press in presses:
            got = press.protected(hs, keys, kw)
            assert got.shape == (2, 1, n) and torch.equal(got[:, 0], want), type(press).__name__
            scores = press.score(module, hs, keys, values, None, kw)
            top = scores.topk(n_kept(n, ratio), dim=-1).indices  # kvpress's top-k keeps every protected slot
            kept = torch.zeros(2, 2, n, dtype=torch.bool).scatter(-1, top, True)
            assert bool(kept[want[:, None].expand_as(kept)].all()), type(press).__name__
    # without a padding mask the rule is the slot rule (the last window slots of the full row)
    assert real_tokens({"attention_mask": None}, n) is None


def test_under_right_padding_the_observed_centre_is_the_rows_own(tiny_llama):
    """The observed centre of a padded row puts no mass on its pad slots and equals the centre of that row's real
    tokens prefilled alone (no padding); the unpadded row of the batch is unchanged too."""
    n, lengths = 40, (27, 40)
    ids, mask2d, module, kw, keys, values = _padded_prefill(tiny_llama, lengths, n)
    press = JacapPromptPress(0.5, n_sink=3, window=5)
    with torch.no_grad():
        alpha = press.centre_attention(module, kw["hidden_states"], keys, kw)  # (2, H_kv, n)
        assert bool((alpha[0, :, lengths[0]:] == 0).all())
        torch.testing.assert_close(alpha.sum(-1), torch.ones(2, 2))
        for b, length in enumerate(lengths):  # each row's real tokens prefilled alone, no padding
            mod, alone_kw, alone_keys, _ = _prefill(tiny_llama, ids[b:b + 1, :length])
            alone = press.centre_attention(mod, alone_kw["hidden_states"], alone_keys, alone_kw)
            torch.testing.assert_close(alpha[b, :, :length], alone[0], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("centre, gqa", [("observed", "pool"), ("tempered", "pool"), ("ea", "mean")])
def test_under_right_padding_a_row_scores_as_if_prefilled_alone(tiny_llama, centre, gqa):
    """A padded row's query statistics are those of its real tokens alone, and its scores on the real slots are the
    scores of the row prefilled alone (the centre puts no mass on pads, so they weigh nothing in A): pads score 0."""
    n, lengths = 40, (27, 40)
    ids, mask2d, module, kw, keys, values = _padded_prefill(tiny_llama, lengths, n)
    press = JacapPromptPress(0.5, centre=centre, gqa=gqa, n_sink=3, window=5, noise=0.2)
    with torch.no_grad():
        mu, lam = press.query_statistics(module, kw["hidden_states"], keys, kw)
        scores = press.score(module, kw["hidden_states"], keys, values, None, kw)
        for b, length in enumerate(lengths):
            mod, alone_kw, alone_keys, alone_values = _prefill(tiny_llama, ids[b:b + 1, :length])
            hs = alone_kw["hidden_states"]
            amu, alam = press.query_statistics(mod, hs, alone_keys, alone_kw)
            torch.testing.assert_close(mu[b], amu[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(lam[b], alam[0], rtol=1e-5, atol=1e-6)
            alone = press.score(mod, hs, alone_keys, alone_values, None, alone_kw)[0]
            free = alone < torch.finfo(alone.dtype).max  # the row's own protection differs (budget of N slots)
            torch.testing.assert_close(scores[b, :, :length][free], alone[free], rtol=1e-4, atol=1e-7)
    assert bool((scores[0, :, lengths[0]:] == 0).all())
