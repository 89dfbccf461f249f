"""The critique's Jacap variants: their math against dense brute force."""
import math

import pytest
import torch

pytest.importorskip("kvpress")
from kvpress.utils import compute_n_kept  # noqa: E402

from jacap_lib import jacap_scores  # noqa: E402
from jacap_lib.presses import utils  # noqa: E402
from jacap_lib.presses.jacap import JacapPromptPress  # noqa: E402
from jacap_lib.presses.jacap_multicenter import JacapMultiCenterPress, kmeans  # noqa: E402
from jacap_lib.presses.jacap_rank1 import JacapRank1Press  # noqa: E402
from jacap_lib.presses.jacap_two_stage import JacapTwoStagePress  # noqa: E402
from jacap_lib.presses.registry import build_press, list_methods  # noqa: E402
from conftest import random_head as _head  # noqa: E402

N, D = 24, 8  # the token count and head dimension of conftest.random_head (_head here)


@pytest.mark.parametrize("tau,noise", [(1.0, 1.0), (10.0, 0.01), (0.3, 5.0)])
def test_rank_one_press_matches_dense_softmax_jacobian(tau, noise):
    """Dense brute force: A = I + (1/(d sigma^2)) U S Diag(kappa) S U^T with the N x N matrix
    S = Diag(alpha) - alpha alpha^T, then r_i = the capacity gain of token i's rank-one term in the
    centred decomposition, w'_i (u_i - ubar)^T A^{-1} (u_i - ubar) / sigma^2."""
    k, v, mu, lam = _head()
    d = k.shape[-1]
    alpha = torch.softmax(k @ mu / (tau * math.sqrt(d)), -1)
    S = torch.diag(alpha) - torch.outer(alpha, alpha)
    kappa = (k.square() * lam).sum(-1)
    U = v.T
    A = torch.eye(d, dtype=k.dtype) + U @ S @ torch.diag(kappa) @ S @ U.T / (d * noise)
    # per-token weight and direction implied by the dense form: column i of U S is alpha_i (u_i - ubar)
    US = U @ S
    w_prime = alpha.square() * kappa / d
    centred = US / alpha  # (d, N): u_i - ubar
    expected = w_prime / noise * torch.einsum("in,ij,jn->n", centred, torch.linalg.inv(A), centred)
    press = JacapRank1Press(0.5, tau=tau, noise=noise)
    got = press.token_scores(k[None, None], v[None, None], mu[None, None], lam[None, None], module=None)[0, 0]
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    # and it is *not* Algorithm 1's diagonal score
    diag = JacapPromptPress(0.5, tau=tau, noise=noise, centre="tempered").token_scores(k[None, None], v[None, None], mu[None, None],
                                                              lam[None, None], module=None)[0, 0]
    assert not torch.allclose(diag.double(), got, rtol=1e-3)


def test_rank_one_dominant_token_loses_leverage_by_centring():
    k, v, mu, lam = _head(1)
    k[3] = mu * 5.0  # token 3 dominates the centre softmax
    r = JacapRank1Press(0.5, tau=1.0).token_scores(k[None, None], v[None, None], mu[None, None],
                                                     lam[None, None], module=None)[0, 0]
    alpha = torch.softmax(k @ mu / math.sqrt(D), -1)
    assert alpha[3] > 0.999
    assert r[3] < r.max() * 1e-3


@pytest.mark.parametrize("arg", ["keys", "values"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_rank_one_nonfinite_cache_names_the_argument(arg, bad):
    """NaN/Inf in the cache: the same ValueError naming the argument as jacap_scores (not the solve's
    CholeskyFailure), and the valid cache still scores."""
    from jacap_lib.scoring import rank_one_corrected_scores

    k, v, mu, lam = _head(2)
    tensors = {"keys": k, "values": v}
    tensors[arg] = tensors[arg].clone()
    tensors[arg][5, 3] = bad
    with pytest.raises(ValueError, match=f"`{arg}` contains 1 NaN/Inf"):
        rank_one_corrected_scores(tensors["keys"], tensors["values"], mu, lam)
    assert torch.isfinite(rank_one_corrected_scores(k, v, mu, lam).score).all()


def test_two_stage_equals_brute_force_rescoring():
    k, v, mu, lam = _head(2, n=40, dtype=torch.float32)
    ratio = 0.75
    press = JacapTwoStagePress(ratio, tau=2.0, n_sink=2, window=0)
    got = press.token_scores(k[None, None], v[None, None], mu[None, None], lam[None, None], module=None)[0, 0]
    # brute force: first pass, protect sinks, top-2B, renormalised second pass on the candidates
    first = jacap_scores(k, v, mu, lam, tau=2.0).score.clone()
    first[:2] = float("inf")
    budget = compute_n_kept(40, ratio)
    cand = sorted(first.topk(2 * budget).indices.tolist())
    second = jacap_scores(k[cand], v[cand], mu, lam, tau=2.0)
    # the renormalised softmax is a softmax over the candidates only
    torch.testing.assert_close(second.alpha.sum(), torch.tensor(1.0))
    expected_keep = {cand[i] for i in second.score.topk(budget).indices.tolist()}
    assert set(got.topk(budget).indices.tolist()) == expected_keep
    assert (got[[i for i in range(40) if i not in cand]] == torch.finfo(got.dtype).min).all()


def test_kmeans_recovers_separated_clusters():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(30, 4, generator=g) + 10
    b = torch.randn(30, 4, generator=g) - 10
    x = torch.cat([a, b])[torch.randperm(60, generator=g)]
    labels = kmeans(x, 2)
    truth = (x[:, 0] > 0).long()
    assert (labels == truth).all() or (labels == 1 - truth).all()


def test_multicenter_one_center_equals_flat_jacap(attn_module):
    g = torch.Generator().manual_seed(5)
    hs = torch.randn(1, 32, 64, generator=g)
    keys = torch.randn(1, 2, 32, 16, generator=g)
    values = torch.randn(1, 2, 32, 16, generator=g)
    with torch.no_grad():
        one = JacapMultiCenterPress(0.5, n_centers=1, aggregate="mean").score(attn_module, hs, keys, values, None, {})
        flat = JacapPromptPress(0.5, beta=None, centre="tempered").score(attn_module, hs, keys, values, None, {})
    torch.testing.assert_close(one, flat, rtol=1e-4, atol=1e-10)


def test_multicenter_max_keeps_a_token_needed_by_a_minority_mode(attn_module):
    """Per-centre statistics by hand: the aggregate equals the max over centres of normalised scores."""
    g = torch.Generator().manual_seed(6)
    hs = torch.randn(1, 40, 64, generator=g)
    keys = torch.randn(1, 2, 40, 16, generator=g)
    values = torch.randn(1, 2, 40, 16, generator=g)
    press = JacapMultiCenterPress(0.5, n_centers=2, aggregate="max", n_sink=0, window=0)
    with torch.no_grad():
        got = press.score(attn_module, hs, keys, values, None, {})
        q = utils.group_query_heads(utils.future_query_states(attn_module, hs), 2).float()
    labels = kmeans(q, 2)
    expected = torch.zeros_like(got)
    for h in range(2):
        parts = []
        for c in range(2):
            qc = q[0, h][labels[0, h] == c]
            mu, lam = qc.mean(0), (qc.square().mean(0) - qc.mean(0).square()).clamp_min(1e-6)
            r = jacap_scores(keys[0, h], values[0, h], mu, lam, tau=press.tau).score
            parts.append(r / r.sum())
        expected[0, h] = torch.maximum(*parts)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-9)


def test_large_noise_collapses_leverage_to_weighted_norm():
    """sigma^2 -> inf: A -> I, so sigma^2 r_i -> w_i ||u_i||^2 (the score loses its diversity term)."""
    k, v, mu, lam = _head(7, dtype=torch.float32)
    res = jacap_scores(k, v, mu, lam, tau=1.0, noise=1e6)
    torch.testing.assert_close(res.score * 1e6, res.weight * v.square().sum(-1), rtol=1e-4, atol=1e-12)
    low = jacap_scores(k, v, mu, lam, tau=1.0, noise=1e-4)
    assert not torch.allclose(low.leverage, v.square().sum(-1), rtol=1e-2)


def test_registry_names_and_bad_options():
    assert all(name == "jacap" or name.startswith("jacap_") for name in list_methods("jacap"))
    with pytest.raises(ValueError, match="expand"):
        JacapTwoStagePress(0.5, expand=0.5)
    with pytest.raises(ValueError, match="aggregate"):
        JacapMultiCenterPress(0.5, aggregate="median")


# ----------------------------------------------------------------------------- every Jacap method on the bundled model
@pytest.mark.model
@pytest.mark.parametrize("name", list_methods("jacap"))
def test_every_jacap_method_runs_on_the_bundled_model(bundled, name):
    """A 64-token prefill at c = 0.5 with every registry method beginning with 'jacap'. Pruning presses:
    every layer keeps compute_n_kept(64, 0.5) keys per head, each one a row of the uncompressed cache,
    the 4 sinks among them. Masking wrappers (AdaKV): the cache keeps all 64 slots and the
    masked count is the one their budget rule gives (AdaKV: the layer's total)."""
    from transformers import DynamicCache

    from jacap_lib.hf import clear_masks

    model, _ = bundled
    n, c = 64, 0.5
    ids = torch.randint(200, 20000, (1, n), generator=torch.Generator().manual_seed(7))
    full, cache = DynamicCache(), DynamicCache()
    press = build_press(name, c)
    with torch.no_grad():
        model.model(input_ids=ids, past_key_values=full)
        with press(model):
            model.model(input_ids=ids, past_key_values=cache)
    heads, layers = model.config.num_key_value_heads, model.config.num_hidden_layers
    try:
        masks = [getattr(layer.self_attn, "masked_key_indices", None) for layer in model.model.layers]
        if name == "jacap":  # scored after the prefill (reconstruction pass), masks across layers and heads
            assert all(cache.layers[i].keys.shape[-2] == n for i in range(layers))
            assert sum(int(m[0].numel()) for m in masks) == int(layers * heads * n * c)
            assert not any(set(range(4)) & set(m[2].tolist()) for m in masks)  # KVzip's sinks stay
            return
        if name == "jacap_prompt_adakv":
            for i, m in enumerate(masks):
                assert cache.layers[i].keys.shape[-2] == n and m is not None
                counts = torch.bincount(m[1], minlength=heads)
                assert int(counts.sum()) == heads * n - int(heads * n * (1 - c)), (i, counts)
            return
        assert all(m is None for m in masks)
        for i in range(layers):
            kept, ref = cache.layers[i].keys[0], full.layers[i].keys[0]
            assert kept.shape == (heads, compute_n_kept(n, c), ref.shape[-1])
            for h in range(heads):
                same = (kept[h][:, None, :] == ref[h][None, :, :]).all(-1)  # (kept, n): exact row equality
                assert (same.sum(-1) == 1).all()  # every kept key is one row of the uncompressed cache
                pos = same.float().argmax(-1)
                assert set(range(4)) <= set(pos.tolist()) and len(set(pos.tolist())) == pos.numel()
    finally:
        clear_masks(model)


def test_adakv_option_wraps_the_baselines_whose_scores_differ_across_heads():
    """``adakv=true`` puts a per-head baseline inside kvpress's AdaKVPress (its options still reach the scorer); it is
    offered to every scorer, TOVA (one score repeated over the heads) and StreamingLLM (positions) too, although the
    protocol tries it only for the baselines whose scores differ across heads."""
    from kvpress import AdaKVPress

    from jacap_lib.presses.registry import ADAKV_BASELINES, method_options

    p = build_press("snapkv", 0.6, adakv=True, window_size=16)
    assert isinstance(p, AdaKVPress) and p.press.window_size == 16 and p.press.compression_ratio == 0.6
    assert method_options(p)["press"]["window_size"] == 16 and method_options(p)["class"] == "AdaKVPress"
    assert not isinstance(build_press("snapkv", 0.6, adakv=False), AdaKVPress)
    for name in ADAKV_BASELINES:
        assert isinstance(build_press(name, 0.5, adakv=True), AdaKVPress)
    for name in ("tova", "streaming_llm"):
        assert isinstance(build_press(name, 0.5, adakv=True), AdaKVPress)
