"""One-knob ablations of Algorithm 1 (jacap_lib.presses.jacap_ablation): the default is Jacap bit for bit (the
registry builds a JacapPromptPress where no ablation field is set), every knob against an independent float64
computation, every ONE_KNOB spec changes exactly one option and runs."""
import math

import pytest
import torch

pytest.importorskip("kvpress")
from kvpress.utils import compute_n_kept  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from jacap_lib import jacap_scores, theory  # noqa: E402
from jacap_lib.hf import clear_masks  # noqa: E402
from jacap_lib.measure.kvpress_grid import tiny_model  # noqa: E402
from jacap_lib.presses.jacap import JacapPromptPress  # noqa: E402
from jacap_lib.experiments import ablation as A  # noqa: E402
from jacap_lib.presses.jacap_ablation import ONE_KNOB, JacapAblationPress, base_spec, marginal_capacity  # noqa: E402
from jacap_lib.presses.utils import observed_attention  # noqa: E402
from jacap_lib.presses.registry import build_press, changed_options, press_from_spec  # noqa: E402
from jacap_lib.experiments.protocol import rules as P  # noqa: E402
from conftest import eager_layer, random_head as _head  # noqa: E402

N, D = 24, 8  # the token count and head dimension of conftest.random_head (_head here)


def _brute(k, v, mu, lam, *, alpha, sens="rho2", kappa="on", lev="A", noise=1.0):
    """Dense float64 Algorithm 1 from a given centre: w = s kappa / d, A = I + sum w u u^T / noise, explicit solve."""
    d = k.shape[-1]
    rho = alpha * (1 - alpha)
    s = {"rho2": rho ** 2, "rho": rho, "alpha": alpha}[sens]
    kap = torch.einsum("id,de,ie->i", k, torch.diag(lam), k)
    if kappa == "mean":
        kap = torch.full_like(kap, float((s * kap).sum() / s.sum()))
    w = s * kap / d
    A = torch.eye(v.shape[-1], dtype=k.dtype) + (v.T * (w / noise)) @ v
    ell = (v * torch.linalg.solve(A, v.T).T).sum(-1) if lev == "A" else v.square().sum(-1)
    return w / noise * ell, w


def _tempered(k, mu, tau):
    return torch.softmax(k @ mu / (tau * math.sqrt(k.shape[-1])), -1)


def _press_scores(press, k, v, mu, lam):
    return press.components(k[None, None], v[None, None], mu[None, None], lam[None, None], module=None)


# ----------------------------------------------------------------------------- the default is Jacap
def test_ablation_press_at_its_defaults_is_algorithm1():
    """JacapAblationPress with every ablation field at Algorithm 1's choice scores as jacap_scores and as the theory
    module's explicit solve, in float32 and float64: the knobs below change only their component."""
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        k, v, mu, lam = _head(1, dtype=dtype)
        got = _press_scores(JacapAblationPress(0.5, centre="tempered", noise=0.5), k, v, mu, lam)
        ref = jacap_scores(k, v, mu, lam, tau=3.0, noise=0.5)
        for f in ("alpha", "rho", "kappa", "weight", "leverage", "score"):
            torch.testing.assert_close(getattr(got, f)[0, 0], getattr(ref, f), rtol=tol, atol=1e-12)
    k, v, mu, lam = _head(1)
    th = theory.algorithm1_scores(k, v.T, mu, lam, tau=3.0, noise=0.5)
    got = _press_scores(JacapAblationPress(0.5, centre="tempered", noise=0.5), k.float(), v.float(), mu.float(),
                        lam.float())
    torch.testing.assert_close(got.score[0, 0].double(), th["score"], rtol=1e-5, atol=1e-10)


def _cache(seed, n=40):
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(1, n, 64, generator=g)
    return hs, torch.randn(1, 2, n, 16, generator=g), torch.randn(1, 2, n, 16, generator=g)


@pytest.mark.parametrize("opts", [{}, {"gqa": "mean"}, {"beta": None, "n_queries": 16}, {"noise": "deff"}])
def test_no_option_is_jacap_bit_for_bit(attn_module, opts):
    hs, keys, values = _cache(2)
    a = JacapAblationPress(0.6, window=8, **opts)
    b = build_press("jacap_prompt", 0.6, window=8, **opts)
    assert type(build_press("jacap_ablate", 0.6, window=8, **opts)) is JacapPromptPress  # no ablation field: JacapPromptPress
    with torch.no_grad():
        sa = a.score(attn_module, hs, keys, values, None, {})
        sb = b.score(attn_module, hs, keys, values, None, {})
        assert torch.equal(sa, sb)
        ka, _ = a.compress(attn_module, hs, keys, values, None, {})
        kb, _ = b.compress(attn_module, hs, keys, values, None, {})
    assert torch.equal(ka, kb)


def test_no_option_is_jacap_on_a_tiny_model():
    model = tiny_model("llama")
    ids = torch.randint(0, 96, (1, 64), generator=torch.Generator().manual_seed(3))
    caches = []
    for spec in ("jacap_prompt", "jacap_ablate"):
        cache = DynamicCache()
        with torch.no_grad(), press_from_spec(spec + "[window=8]", 0.5)(model):
            model.model(input_ids=ids, past_key_values=cache)
        caches.append(cache)
    for la, lb in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


# ----------------------------------------------------------------------------- each knob against brute force
@pytest.mark.parametrize("noise", [1.0, 0.05])
def test_centre_ea_is_the_log_normal_expectation(noise):
    k, v, mu, lam = _head(3)
    d = k.shape[-1]
    alpha = torch.softmax(k @ mu / math.sqrt(d) + torch.diag(k @ torch.diag(lam) @ k.T) / (2 * d), -1)
    expected, _ = _brute(k, v, mu, lam, alpha=alpha, noise=noise)
    for press in (JacapPromptPress(0.5, centre="ea", noise=noise, tau=7.0), JacapAblationPress(0.5, centre="ea", noise=noise)):
        got = _press_scores(press, k, v, mu, lam)  # tau unused
        torch.testing.assert_close(got.alpha[0, 0].double(), alpha, rtol=1e-6, atol=1e-12)
        torch.testing.assert_close(got.score[0, 0].double(), expected, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("sens", ["rho", "alpha"])
def test_sensitivity_factor(sens):
    k, v, mu, lam = _head(4)
    alpha = _tempered(k, mu, 3.0)
    expected, w = _brute(k, v, mu, lam, alpha=alpha, sens=sens)
    got = _press_scores(JacapAblationPress(0.5, centre="tempered", sensitivity=sens), k, v, mu, lam)
    torch.testing.assert_close(got.weight[0, 0].double(), w, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(got.score[0, 0].double(), expected, rtol=1e-5, atol=1e-12)
    default = _press_scores(JacapAblationPress(0.5, centre="tempered"), k, v, mu, lam).weight[0, 0].double()
    rho = alpha * (1 - alpha)
    ratio = {"rho": 1 / rho, "alpha": alpha / rho ** 2}[sens]  # w_ablated / w_default, token by token
    torch.testing.assert_close(got.weight[0, 0].double() / default, ratio, rtol=1e-5, atol=0)


def test_kappa_off_keeps_the_total_weight():
    k, v, mu, lam = _head(5)
    expected, w = _brute(k, v, mu, lam, alpha=_tempered(k, mu, 3.0), kappa="mean")
    got = _press_scores(JacapAblationPress(0.5, centre="tempered", kappa="mean"), k, v, mu, lam)
    torch.testing.assert_close(got.score[0, 0].double(), expected, rtol=1e-5, atol=1e-12)
    assert torch.unique(got.kappa).numel() == 1  # one kappa for the head
    default = _press_scores(JacapAblationPress(0.5, centre="tempered"), k, v, mu, lam)
    torch.testing.assert_close(got.weight.sum(), default.weight.sum(), rtol=1e-6, atol=0)
    # the weights now follow rho^2 alone
    torch.testing.assert_close(got.weight / got.weight.sum(), default.rho.square() / default.rho.square().sum(),
                               rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("noise", [1.0, 0.01])
def test_leverage_identity_is_weighted_norm(noise):
    k, v, mu, lam = _head(6)
    got = _press_scores(JacapAblationPress(0.5, centre="tempered", leverage="identity", noise=noise), k, v, mu, lam)
    default = _press_scores(JacapAblationPress(0.5, centre="tempered", noise=noise), k, v, mu, lam)
    torch.testing.assert_close(got.weight, default.weight)  # weights untouched
    torch.testing.assert_close(got.score[0, 0].double(), default.weight[0, 0].double() * v.square().sum(-1) / noise,
                               rtol=1e-5, atol=1e-12)


def test_leverage_identity_with_out_proj_uses_w_o_v(attn_module):
    """u = W_O v with A = I: the score is w |W_O v|^2 summed over the KV head's G output slices."""
    hs, keys, values = _cache(7)
    press = JacapAblationPress(0.5, centre="tempered", leverage="identity", use_out_proj=True)
    with torch.no_grad():
        mu, lam = press.query_statistics(attn_module, hs, keys, {})
        got = press.components(keys, values, mu, lam, attn_module)
    W = attn_module.o_proj.weight.detach().double()  # (hidden, H_q d)
    for h in range(2):
        Wg = torch.cat([W[:, q * 16:(q + 1) * 16] for q in (2 * h, 2 * h + 1)], 0)  # the G slices stacked
        expected = got.weight[0, h].double() * (values[0, h].double() @ Wg.T).square().sum(-1)
        torch.testing.assert_close(got.score[0, h].double(), expected, rtol=1e-4, atol=1e-10)


def test_prior_iso_changes_lambda_only(attn_module):
    hs, keys, values = _cache(8)
    base, wide = JacapAblationPress(0.5, window=8, centre="tempered"), JacapAblationPress(0.5, window=8, prior_iso=2.0, centre="tempered")
    with torch.no_grad():
        mu0, lam0 = base.query_statistics(attn_module, hs, keys, {})
        mu1, lam1 = wide.query_statistics(attn_module, hs, keys, {})
        torch.testing.assert_close(mu1, mu0, rtol=0, atol=0)
        torch.testing.assert_close(lam1, lam0 + 2.0 * lam0.mean(-1, keepdim=True))
        # and the scores are Algorithm 1 with that Lambda
        got = wide.score(attn_module, hs, keys, values, None, {})
        ref = base.protect(base.token_scores(keys, values, mu0, lam1, attn_module), hs, keys, {})
    assert torch.equal(got, ref)


def test_marginal_capacity_is_half_the_exact_logdet_loss():
    """-1/2 log(1 - r_i) against the theory module's brute-force determinants (float64)."""
    for seed, tau, noise in ((9, 1.0, 1.0), (9, 10.0, 1e-3), (10, 30.0, 1e-3)):
        k, v, mu, lam = _head(seed)
        res = theory.algorithm1_scores(k, v.T, mu, lam, tau=tau, noise=noise)
        exact = 0.5 * theory.removal_loss(v.T, res["weight"], noise)
        torch.testing.assert_close(marginal_capacity(res["score"]).double(), exact, rtol=1e-5, atol=1e-9)
    assert float(res["score"].max()) > 0.5  # the last case is far from the linear regime (-log(1-r) ~ r)


def test_head_budget_is_adakv_top_k_of_the_marginal():
    """The logdet allocation masks exactly the layer's total, keeps every head's sinks and window, and (the
    transform being increasing) masks the same slots as AdaKV on the raw scores without a safeguard."""
    model = tiny_model("llama")
    n, c = 64, 0.6
    ids = torch.randint(0, 96, (1, n), generator=torch.Generator().manual_seed(11))
    masks = {}
    for spec in ("jacap_ablate[budget=layer,window=8]", "jacap_prompt_adakv[alpha_safeguard=0,window=8]"):
        press = press_from_spec(spec, c)
        with torch.no_grad(), press(model):
            model.model(input_ids=ids, past_key_values=DynamicCache())
        masks[spec] = [layer.self_attn.masked_key_indices for layer in model.model.layers]
        clear_masks(model)
    a, b = masks.values()
    for ma, mb in zip(a, b):
        assert int(ma[0].numel()) == 2 * (n - compute_n_kept(n, c))  # the layer's total budget
        sa = set(zip(ma[1].tolist(), ma[2].tolist()))
        assert sa == set(zip(mb[1].tolist(), mb[2].tolist()))
        assert not any(s < 4 or s >= n - 8 for _, s in sa)  # sinks and window never masked
        counts = torch.bincount(ma[1], minlength=2)
        assert counts.sum() == 2 * (n - compute_n_kept(n, c))


@pytest.mark.parametrize("n", [30, 250])
def test_centre_observed_is_the_models_own_attention(n):
    """observed_attention against the attention weights of an eager forward of the layer (transformers'
    output_attentions): rows at positions >= n_sink, EMA-weighted, pooled over the G query heads. At n = 250 the
    EMA's oldest rows (weight < 1e-9 of the newest) are skipped; the brute force keeps them."""
    module, hs, keys, values, attn = eager_layer(n, seed=12)  # attn: (1, H_q, n, n)
    seen = {"hs": hs}
    for beta, n_queries in ((0.9, None), (None, 10)):
        rows = torch.arange(4, n)[-n_queries:] if n_queries else torch.arange(4, n)
        if beta is None:
            expected = attn[:, :, rows].mean(2)
        else:  # the EMA recursion of mu_Q, run on the attention rows: m = q_first, then m = beta m + (1 - beta) row
            expected = attn[:, :, rows[0]]
            for r in rows[1:]:
                expected = beta * expected + (1 - beta) * attn[:, :, r]
        got = observed_attention(module, seen["hs"], keys, {}, n_queries=n_queries, skip=4, beta=beta, pooled=False,
                                 block=7)
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6)
        pooled = observed_attention(module, seen["hs"], keys, {}, n_queries=n_queries, skip=4, beta=beta, pooled=True)
        torch.testing.assert_close(pooled.double(), expected.view(1, 2, 2, n).mean(2), rtol=1e-4, atol=1e-6)
    # the press uses it as the centre, with no tau
    press = JacapAblationPress(0.5, centre="observed", tau=50.0)
    with torch.no_grad():
        mu, lam = press.query_statistics(module, seen["hs"], keys, {})
        alpha = press.centre_attention(module, seen["hs"], keys, {})
        parts = press.components(keys, values, mu, lam, module, alpha)
    torch.testing.assert_close(parts.alpha, alpha)
    for h in range(2):
        exp, _ = _brute(keys[0, h].double(), values[0, h].double(), mu[0, h].double(),
                        lam[0, h].double(), alpha=alpha[0, h].double())
        torch.testing.assert_close(parts.score[0, h].double(), exp, rtol=1e-4, atol=1e-10)


def test_generic_path_gqa_mean_averages_query_heads(attn_module):
    hs, keys, values = _cache(13)
    press = JacapAblationPress(0.5, centre="tempered", gqa="mean", sensitivity="rho")
    with torch.no_grad():
        mu, lam = press.query_statistics(attn_module, hs, keys, {})  # (1, H_q, d)
        got = press.components(keys, values, mu, lam, attn_module).score
    for h in range(2):
        per_q = [_brute(keys[0, h].double(), values[0, h].double(), mu[0, q].double(), lam[0, q].double(),
                        alpha=_tempered(keys[0, h].double(), mu[0, q].double(), 3.0), sens="rho")[0]
                 for q in (2 * h, 2 * h + 1)]
        torch.testing.assert_close(got[0, h].double(), (per_q[0] + per_q[1]) / 2, rtol=1e-4, atol=1e-10)


# ----------------------------------------------------------------------------- the list of ablations
EXPECTED_CHANGE = {
    "centre=ea": {"centre"}, "centre=observed": {"centre"}, "rope-average=off": {"n_future_positions"},
    "queries=32": {"n_queries"}, "queries=128": {"n_queries"}, "stats=flat": {"beta"},
    "sensitivity=rho": {"sensitivity"}, "sensitivity=alpha": {"sensitivity"}, "kappa=off": {"kappa"},
    "leverage=I": {"leverage"}, "u=W_O v": {"use_out_proj"},
    "selection=two-stage": {"class"},  # JacapTwoStagePress (expand at its default, 2)
    "budget=layer": {"budget", "wrapper"},  # the AdaKV wrapper is how budget=layer allocates
    "budget=model": {"budget", "wrapper"},  # JacapGlobalBudgetPress
    "prior=isotropic": {"prior_iso"},
    "prior=3-centres": {"class"},  # JacapMultiCenterPress at its defaults, from jacap_prompt[beta=none]
}


def test_every_ablation_changes_one_thing():
    assert set(ONE_KNOB) == set(EXPECTED_CHANGE)
    for label, (spec, what) in ONE_KNOB.items():
        assert what and isinstance(what, str)
        # as measured: on Algorithm 1 as tuned then (the tempered centre, a window of 32), written out in full
        changed = changed_options(A.knob_spec(spec), A.knob_spec(base_spec(label)))
        assert set(changed) == EXPECTED_CHANGE[label], (label, changed)
    assert changed_options("jacap_ablate") == {}
    assert changed_options("jacap_ablate[budget=layer]")["wrapper"][1] == {"class": "AdaKVPress",
                                                                           "alpha_safeguard": 0.0}
    assert changed_options("jacap_ablate[budget=model]")["wrapper"][1] == {"class": "JacapGlobalBudgetPress"}
    # the diff sees real changes, and options a subclass adds once they leave their default
    assert changed_options("jacap_two_stage[expand=3]") == {"class": ("JacapPromptPress", "JacapTwoStagePress"),
                                                            "centre": ("observed", "tempered"), "expand": (None, 3)}
    assert changed_options("jacap_ablate[centre=ea,noise=deff]") == {"centre": ("observed", "ea"),
                                                                     "noise": (1.0, "deff")}
    # the observed centre has no temperature: tau is inert there, and the default is jacap_obs at window 16
    assert changed_options("jacap_prompt[tau=10]", "jacap_prompt[tau=1]") == {}
    assert changed_options("jacap_obs[window=16]") == {}
    assert changed_options("jacap_prompt[centre=tempered,tau=10]", "jacap_prompt[centre=tempered]") == {"tau": (3.0, 10)}
    assert changed_options("jacap_ablate", "jacap_ablate[deff_frac=0.5]") == {}  # inert without noise=deff


def test_bad_ablation_options():
    with pytest.raises(ValueError, match="centre"):
        build_press("jacap_ablate", 0.5, centre="median")
    with pytest.raises(ValueError, match="sensitivity"):
        build_press("jacap_ablate", 0.5, sensitivity="rho3")
    with pytest.raises(ValueError, match="kappa"):
        build_press("jacap_ablate", 0.5, kappa="off")
    with pytest.raises(ValueError, match="leverage"):
        build_press("jacap_ablate", 0.5, leverage="I")
    with pytest.raises(ValueError, match="prior_iso"):
        build_press("jacap_ablate", 0.5, prior_iso=-1.0)
    with pytest.raises(ValueError, match="alpha_safeguard"):
        build_press("jacap_ablate", 0.5, alpha_safeguard=0.2)
    with pytest.raises(ValueError, match="base_spec|unknown ablation"):
        base_spec("centre=median")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("label", sorted(ONE_KNOB))
def test_every_ablation_runs_on_a_tiny_model(label, dtype):
    """A 128-token prefill at c = 0.5 (64 kept: 4 sinks, 32 window, 28 by score) in float32 and bfloat16, outside
    torch.no_grad() (the cache tensors then require grad): every pruning spec keeps compute_n_kept keys per head,
    rows of the full cache; the AdaKV spec masks the layer's total."""
    model = tiny_model("llama").to(dtype)
    n, c = 128, 0.5
    ids = torch.randint(0, 96, (1, n), generator=torch.Generator().manual_seed(14))
    full, cache = DynamicCache(), DynamicCache()
    with torch.no_grad():
        model.model(input_ids=ids, past_key_values=full)
    press = press_from_spec(ONE_KNOB[label][0], c)
    with press(model):
        model.model(input_ids=ids, past_key_values=cache)
    masks = [layer.self_attn.masked_key_indices for layer in model.model.layers]
    clear_masks(model)
    if label.startswith("budget="):  # masking wrappers: the tensors keep every slot
        counts = [int(m[0].numel()) for m in masks]
        total = 2 * (n - compute_n_kept(n, c))  # per layer
        assert counts == [total] * 2 if label == "budget=layer" else sum(counts) == 2 * total
        return
    for i, layer in enumerate(cache.layers):
        mask = masks[i]
        assert mask is None
        kept, ref = layer.keys[0].detach(), full.layers[i].keys[0]
        assert kept.shape == (2, compute_n_kept(n, c), 16) and torch.isfinite(kept.float()).all()
        for h in range(2):
            assert torch.equal(kept[h, :4], ref[h, :4])  # sinks
            assert all(bool((ref[h] == row).all(-1).any()) for row in kept[h])  # every kept row is a cache row


def test_model_budget_is_top_k_over_all_layers_and_heads():
    """budget=model against a brute-force top-k of the per-layer marginal capacities (recorded from the scorer):
    the masks cover exactly the model's total, the layers' shares differ, sinks and windows are never masked, and
    decoding on the masked cache goes on."""
    model = tiny_model("llama", layers=3)
    n, c = 96, 0.7
    ids = torch.randint(0, 96, (1, n), generator=torch.Generator().manual_seed(15))
    press = press_from_spec("jacap_ablate[budget=model,window=8]", c)
    recorded = {}
    score = press.press.score

    def record(module, *args):
        recorded[module.layer_idx] = out = score(module, *args)
        return out

    press.press.score = record
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=ids, past_key_values=cache)
    masks = [layer.self_attn.masked_key_indices for layer in model.model.layers]
    all_scores = torch.stack([recorded[i][0] for i in range(3)])  # (L, H, N)
    n_pruned = 3 * 2 * (n - compute_n_kept(n, c))
    order = sorted(((float(all_scores[l, h, t]), l, h, t) for l in range(3) for h in range(2) for t in range(n)))
    expected = {(l, h, t) for _, l, h, t in order[:n_pruned]}
    got = {(l, int(h), int(t)) for l, m in enumerate(masks) for h, t in zip(m[1], m[2])}
    assert got == expected and len(got) == n_pruned
    assert not any(t < 4 or t >= n - 8 for _, _, t in got)
    per_layer = [int(m[0].numel()) for m in masks]
    assert len(set(per_layer)) > 1  # the layers' budgets are not the uniform split
    # the recorded scores are the marginal capacities of Algorithm 1 (then protected)
    unprotected = all_scores[:, :, 4:n - 8]
    assert float(unprotected.min()) >= 0 and float(unprotected.max()) < 50
    with torch.no_grad():
        logits = model(input_ids=ids[:, :1], past_key_values=cache, cache_position=torch.tensor([n])).logits
    assert torch.isfinite(logits).all()
    clear_masks(model)


def test_rope_average_off_is_the_next_positions_rotation(attn_module):
    """What "rope-average=off" (n_future_positions=1) means: each query rotated by RoPE at the first future
    position exactly (kvpress's average over [next, next + 1)), instead of the rotation averaged over 512."""
    from jacap_lib.hf import apply_rope
    from jacap_lib.presses import utils
    from kvpress.utils import get_prerope_query_states

    hs = torch.randn(1, 20, 64, generator=torch.Generator().manual_seed(16))
    with torch.no_grad():
        got = utils.future_query_states(attn_module, hs, n_future_positions=1)
        cos, sin = attn_module.rotary_emb(hs, torch.tensor([[20]]))
        expected = apply_rope(attn_module, get_prerope_query_states(attn_module, hs), cos, sin)
        averaged = utils.future_query_states(attn_module, hs, n_future_positions=512)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(averaged, expected, atol=1e-3)


@pytest.mark.model
def test_every_ablation_runs_on_the_bundled_model(bundled):
    """Every jacap_ablate spec of ONE_KNOB on SmolLM2-135M (30 layers, 3 KV heads; the other specs are registry
    names or options test_variants runs there): a 64-token prefill at c = 0.5 keeps compute_n_kept(64, 0.5) slots
    per head (pruning) or masks the budget's total (the budget ablations), and the next token's logits are finite."""
    model, _ = bundled
    n, c = 64, 0.5
    ids = torch.randint(200, 20000, (1, n), generator=torch.Generator().manual_seed(17))
    heads, layers = model.config.num_key_value_heads, model.config.num_hidden_layers
    for label, (spec, _) in ONE_KNOB.items():
        if not spec.startswith("jacap_ablate"):
            continue
        cache = DynamicCache()
        with torch.no_grad():
            with press_from_spec(spec, c)(model):
                model.model(input_ids=ids, past_key_values=cache)
            masks = [layer.self_attn.masked_key_indices for layer in model.model.layers]
            logits = model(input_ids=ids[:, -1:], past_key_values=cache, cache_position=torch.tensor([n])).logits
        clear_masks(model)
        assert torch.isfinite(logits).all(), label
        pruned = heads * (n - compute_n_kept(n, c))
        if label.startswith("budget="):
            counts = [int(m[0].numel()) for m in masks]
            assert (counts == [pruned] * layers) if label == "budget=layer" else sum(counts) == layers * pruned, label
        else:
            assert all(m is None for m in masks), label
            assert all(cache.layers[i].keys.shape[-2] == compute_n_kept(n, c) + 1 for i in range(layers)), label


@pytest.mark.parametrize("label", [k for k, (spec, _) in ONE_KNOB.items() if spec.startswith("jacap_ablate")])
def test_replay_equals_the_kvpress_path(label):
    """The evaluation's replay (the press's own hook called layer by layer on one captured prefill) leaves the same
    cache and the same per-head masks as ``with press(model): model(prompt)``, for every jacap_ablate spec (the
    model-wide budget decides at the last layer in both), and the continuation's log-probabilities agree."""
    from jacap_lib.measure.quality import capture_prefill, compressed_forward, continue_from_cache, replay_press

    model = tiny_model("llama", layers=3)
    ids = torch.randint(0, 96, (1, 76), generator=torch.Generator().manual_seed(18))
    prompt, cont = ids[:, :64], ids[:, 64:]
    spec = ONE_KNOB[label][0].replace("]", ",window=8]")
    real = DynamicCache()
    with press_from_spec(spec, 0.6)(model), torch.inference_mode():
        model(input_ids=prompt, past_key_values=real, use_cache=True)
    real_masks = [layer.self_attn.masked_key_indices for layer in model.model.layers]
    cache = replay_press(model, capture_prefill(model, prompt), press_from_spec(spec, 0.6))
    masks = [layer.self_attn.masked_key_indices for layer in model.model.layers]
    for a, b in zip(cache.layers, real.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    for m, r in zip(masks, real_masks):
        assert (m is None) == (r is None) and (m is None or all(torch.equal(x, y) for x, y in zip(m, r)))
    assert (masks[0] is not None) == label.startswith("budget=")
    logq, _, kept = continue_from_cache(model, cache, 64, cont)
    real_logq, _, real_kept = compressed_forward(model, prompt, cont, press=press_from_spec(spec, 0.6))
    torch.testing.assert_close(logq, real_logq, rtol=1e-5, atol=1e-6)
    assert kept == real_kept == compute_n_kept(64, 0.6)
    clear_masks(model)


def test_generic_path_noise_deff_meets_its_target():
    """noise="deff" on an ablated weight: sigma^2 is chosen so that sum_i r_i (the effective dimension of the
    ablated weights' Gram) equals deff_frac * min(n_kept, d)."""
    k, v, mu, lam = _head(19, n=40)
    press = JacapAblationPress(0.5, centre="tempered", noise="deff", deff_frac=0.5, sensitivity="rho", kappa="mean")
    got = _press_scores(press, k, v, mu, lam)
    target = 0.5 * min(compute_n_kept(40, 0.5), D)
    torch.testing.assert_close(got.score.sum().double(), torch.tensor(target, dtype=torch.float64), rtol=1e-4, atol=0)
    # and it is Algorithm 1's leverage of those weights at that sigma^2 (sigma^2 = w_i lev_i / r_i)
    sigma2 = float((got.weight * got.leverage / got.score)[0, 0, 0])
    expected, _ = _brute(k, v, mu, lam, alpha=_tempered(k, mu, 3.0), sens="rho", kappa="mean", noise=sigma2)
    torch.testing.assert_close(got.score[0, 0].double(), expected, rtol=1e-4, atol=1e-12)


def test_observed_centre_with_gqa_mean(attn_module):
    """gqa="mean": the observed rows per query head, Algorithm 1 per query head, the group's mean."""
    hs, keys, values = _cache(20)
    press = JacapAblationPress(0.5, gqa="mean", centre="observed", window=8)
    with torch.no_grad():
        mu, lam = press.query_statistics(attn_module, hs, keys, {})
        alpha = press.centre_attention(attn_module, hs, keys, {})  # (1, H_q, N)
        got = press.components(keys, values, mu, lam, attn_module, alpha).score
    assert alpha.shape == (1, 4, 40)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(1, 4))
    for h in range(2):
        per_q = [_brute(keys[0, h].double(), values[0, h].double(), mu[0, q].double(), lam[0, q].double(),
                        alpha=alpha[0, q].double())[0] for q in (2 * h, 2 * h + 1)]
        torch.testing.assert_close(got[0, h].double(), (per_q[0] + per_q[1]) / 2, rtol=1e-4, atol=1e-10)
