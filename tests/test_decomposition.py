"""Tests for jacap_lib.measure.decomposition: every quantity against an independent computation
(autograd, dense N×N matrices, brute-force re-computation, exhaustive enumeration)."""
import itertools
import math

import pytest
import torch

import jacap_lib.theory as T
from jacap_lib.measure import decomposition as D
from jacap_lib.scoring import jacap_scores

torch.set_default_dtype(torch.float32)


def _rand_head(n=12, d=8, d_out=5, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    K = scale * torch.randn(n, d, generator=g, dtype=torch.float64)
    U = torch.randn(d_out, n, generator=g, dtype=torch.float64)
    mu = torch.randn(d, generator=g, dtype=torch.float64)
    lam = torch.rand(d, generator=g, dtype=torch.float64) + 0.1
    return K, U, mu, lam


# ----------------------------------------------------------------------------- real head (bundled model)
@pytest.fixture(scope="module")
def real_head():
    """Layer 3, query head 4 of SmolLM2-135M on the built-in text (first 160 tokens cached)."""
    from jacap_lib import load_model

    model, tok = load_model(device="cpu")
    ids = tok(D.DEFAULT_TEXT, return_tensors="pt").input_ids[:, :200]
    caps = D.capture_heads(model, ids, layers=[3])
    return caps[3], model, ids


@pytest.mark.model
def test_capture_matches_model_attention_output(real_head):
    """Captured q/k/v + W_O reproduce the model's own o_proj output for layer 3 (causal attention)."""
    cap, model, ids = real_head
    got = {}
    attn = model.model.layers[3].self_attn

    def hook(module, args, out):
        got["o"] = out[0][0].detach()  # returns None: the output is left unchanged

    h = attn.register_forward_hook(hook)
    with torch.no_grad():
        model(ids, use_cache=False)
    h.remove()
    H, Tlen, d = cap.queries.shape
    out = torch.zeros(Tlen, cap.out_proj.shape[1])
    mask = torch.ones(Tlen, Tlen).tril().bool()
    for head in range(H):
        kv = head // cap.group
        logits = cap.queries[head] @ cap.keys[kv].T / math.sqrt(d)
        a = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)
        out += (a @ cap.values[kv]) @ cap.out_proj[head].T
    assert torch.allclose(out, got["o"], atol=1e-4, rtol=1e-3)


@pytest.mark.model
def test_reduced_out_proj_preserves_capacity(real_head):
    cap = real_head[0]
    t_full = D.head_tensors(cap, 4, prefix=40, reduce=False)
    t_red = D.head_tensors(cap, 4, prefix=40, reduce=True)
    assert t_full["U"].shape[0] == cap.out_proj.shape[1] and t_red["U"].shape[0] == cap.out_proj.shape[2]
    mu, lam = t_full["Q_future"].mean(0), t_full["Q_future"].var(0)
    a = T.jacobian_capacity(t_full["K"], t_full["U"], mu, lam)
    b = T.jacobian_capacity(t_red["K"], t_red["U"], mu, lam)
    assert torch.allclose(a, b, rtol=1e-8)


@pytest.mark.model
def test_linear_term_matches_autograd_on_real_head(real_head):
    """J_C δq of taylor_error equals the autograd Jacobian-vector product of f_C at mu."""
    t = D.head_tensors(real_head[0], 4, prefix=160)
    keep = torch.arange(0, 160, 4)
    K, U = t["K"][keep], t["U"][:, keep]
    mu = t["Q_future"].mean(0)
    J_auto = torch.autograd.functional.jacobian(lambda q: T.attention(K, U, q), mu)
    dq = t["Q_future"] - mu
    e = D.taylor_error(K, U, mu, t["Q_future"])
    assert torch.allclose(e["linear_change"], (dq @ J_auto.T).norm(dim=-1), rtol=1e-9)
    true = torch.stack([T.attention(K, U, q) for q in t["Q_future"]]) - T.attention(K, U, mu)
    assert torch.allclose(e["true_change"], true.norm(dim=-1), rtol=1e-9)


@pytest.mark.model
def test_taylor_error_decays_quadratically_on_real_head(real_head):
    """Residual f(mu+eps dq) - f(mu) - J eps dq is O(eps^2): halving eps quarters it, and the
    relative error goes to 0 linearly."""
    t = D.head_tensors(real_head[0], 4, prefix=160)
    K, U = t["K"], t["U"]
    mu = t["Q_future"].mean(0)
    dq = t["Q_future"][:8] - mu
    res, rel = [], []
    for eps in (1e-2, 5e-3, 2.5e-3):
        e = D.taylor_error(K, U, mu, mu + eps * dq)
        res.append(e["residual"])
        rel.append(e["rel_error"])
    ratio1, ratio2 = res[0] / res[1], res[1] / res[2]
    assert torch.allclose(ratio1, torch.full_like(ratio1, 4.0), rtol=0.05)
    assert torch.allclose(ratio2, torch.full_like(ratio2, 4.0), rtol=0.05)
    assert bool((rel[2] < rel[0] / 3).all()) and float(rel[2].max()) < 0.05


@pytest.mark.model
def test_loo_damage_equals_recomputation_on_real_head(real_head):
    t = D.head_tensors(real_head[0], 4, prefix=40)
    K, U, Q = t["K"], t["U"], t["Q_future"][:5]
    dmg = D.loo_damage(K, U, Q)
    assert dmg.shape == (5, 40)
    for i in (0, 1, 17, 39):
        rest = [j for j in range(40) if j != i]
        for tq in range(5):
            brute = (T.attention(K, U, Q[tq]) - T.attention(K[rest], U[:, rest], Q[tq])).norm()
            assert math.isclose(float(dmg[tq, i]), float(brute), rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.model
def test_selection_on_real_small_cache(real_head):
    """exhaustive >= greedy and >= one-shot on a real 10-token cache; exhaustive is the brute-force max."""
    t = D.head_tensors(real_head[0], 4, prefix=160)
    sel = torch.tensor([0, 7, 19, 33, 50, 71, 90, 104, 131, 150])
    K, U = t["K"][sel], t["U"][:, sel]
    mu, lam = t["Q_future"].mean(0), t["Q_future"].var(0)
    r = D.selection_gap(K, U, mu, lam, budget=3)
    assert r["exhaustive"] >= r["greedy"] - 1e-12 and r["exhaustive"] >= r["one_shot"] - 1e-12
    assert math.isclose(r["ratio_one_shot"], r["one_shot"] / r["exhaustive"], rel_tol=1e-12)
    assert math.isclose(r["ratio_greedy"], r["greedy"] / r["exhaustive"], rel_tol=1e-12)
    brute = max(float(T.jacobian_capacity(K[list(c)], U[:, list(c)], mu, lam))
                for c in itertools.combinations(range(10), 3))
    assert math.isclose(r["exhaustive"], brute, rel_tol=1e-10)


# ----------------------------------------------------------------------------- E_diagonal
def test_capacities_agree_when_key_response_is_diagonal():
    """With orthogonal keys K Lambda K^T is diagonal by construction, so the exact-S capacity
    (rank_one_capacity) must equal theory.jacobian_capacity, and diagonal_capacity must equal the
    capacity with S replaced by Diag(rho) written densely."""
    d, n = 8, 5
    g = torch.Generator().manual_seed(1)
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    lam = torch.rand(d, generator=g, dtype=torch.float64) + 0.2
    # rows of K along Lambda-orthogonal directions: K Λ K^T diagonal  <=>  K = D E with E Λ E^T diag.
    E = torch.eye(d, dtype=torch.float64)[:n]
    K = torch.diag(torch.tensor([3.0, -2.0, 1.5, 4.0, -1.0], dtype=torch.float64)) @ E
    KLK = K @ torch.diag(lam) @ K.T
    U = torch.randn(4, n, generator=g, dtype=torch.float64)
    mu = torch.randn(d, generator=g, dtype=torch.float64)
    full = T.jacobian_capacity(K, U, mu, lam, noise=0.5)
    assert torch.allclose(D.rank_one_capacity(K, U, mu, lam, noise=0.5), full, rtol=1e-10)
    alpha = torch.softmax(K @ mu / math.sqrt(d), -1)
    Sd = torch.diag(alpha * (1 - alpha))
    G = U @ Sd @ KLK @ Sd @ U.T / d
    dense = 0.5 * torch.logdet(torch.eye(4, dtype=torch.float64) + G / 0.5)
    assert torch.allclose(D.diagonal_capacity(K, U, mu, lam, noise=0.5), dense, rtol=1e-10)
    # and with a genuinely non-diagonal K Λ K^T the approximations differ from the full capacity
    K2, U2, mu2, lam2 = _rand_head()
    assert not torch.allclose(D.rank_one_capacity(K2, U2, mu2, lam2), T.jacobian_capacity(K2, U2, mu2, lam2), rtol=1e-3)


def test_diagonal_capacities_records_shape_and_alg1_weights():
    K, U, mu, lam = _rand_head(n=20)
    r = D.diagonal_capacities(K, U, mu, lam, budget=6, n_subsets=10, tau=3.0)
    assert r["full"].shape == (10,) and r["subsets"].shape == (10, 6)
    # alg1 capacity of subset 0 equals logdet with jacap_lib.jacap_scores weights restricted to it
    s = jacap_scores(K, U.T, mu, lam, tau=3.0)
    idx = r["subsets"][0]
    G = (U[:, idx] * s.weight.double()[idx]) @ U[:, idx].T
    ref = 0.5 * torch.logdet(torch.eye(U.shape[0], dtype=torch.float64) + G)
    assert math.isclose(float(r["alg1"][0]), float(ref), rel_tol=1e-5)
    # rank correlation of diag with full across the subsets, ranked by hand (no ties in continuous data)
    def ranks(x):
        return x.argsort().argsort().double()

    a, b = ranks(r["full"]), ranks(r["diag"])
    rho = float(((a - a.mean()) * (b - b.mean())).sum() / ((a - a.mean()).norm() * (b - b.mean()).norm()))
    assert math.isclose(r["spearman_diag"], rho, rel_tol=1e-9, abs_tol=1e-12)


# ----------------------------------------------------------------------------- rank-one corrected scores
def _dense_rank_one(K, V, mu, lam, tau, noise, W=None):
    d = K.shape[-1]
    alpha = torch.softmax(K @ mu / (tau * math.sqrt(d)), -1)
    S = torch.diag(alpha) - torch.outer(alpha, alpha)  # explicit N×N
    U = (V @ W.T).T if W is not None else V.T
    kappa = (K.square() * lam).sum(-1)
    G = U @ S @ torch.diag(kappa.sqrt()) / math.sqrt(d * noise)  # columns g_i
    A = torch.eye(U.shape[0], dtype=K.dtype) + G @ G.T
    lev_g = (G * torch.linalg.solve(A, G)).sum(0)
    return alpha, kappa, lev_g


@pytest.mark.parametrize("tau,noise,use_w", [(1.0, 1.0, False), (10.0, 0.3, True), (2.5, 4.0, False)])
def test_rank_one_corrected_scores_match_dense(tau, noise, use_w):
    g = torch.Generator().manual_seed(3)
    n, d = 15, 6
    K = 2 * torch.randn(n, d, generator=g, dtype=torch.float64)
    V = torch.randn(n, d, generator=g, dtype=torch.float64)
    W = torch.randn(9, d, generator=g, dtype=torch.float64) if use_w else None
    mu = torch.randn(d, generator=g, dtype=torch.float64)
    lam = torch.rand(d, generator=g, dtype=torch.float64) + 0.1
    s = D.rank_one_corrected_scores(K, V, mu, lam, tau=tau, noise=noise, out_proj=W)
    alpha, kappa, lev_g = _dense_rank_one(K, V, mu, lam, tau, noise, W)
    assert torch.allclose(s.alpha, alpha) and torch.allclose(s.kappa, kappa)
    assert torch.allclose(s.weight, alpha.square() * kappa / d)
    assert torch.allclose(s.score, lev_g, rtol=1e-8, atol=1e-14)


def test_rank_one_corrected_scores_batched_and_float32():
    g = torch.Generator().manual_seed(4)
    K = torch.randn(2, 3, 10, 4, generator=g)
    V = torch.randn(2, 3, 10, 4, generator=g)
    mu = torch.randn(2, 3, 4, generator=g)
    lam = torch.rand(2, 3, 4, generator=g) + 0.1
    s = D.rank_one_corrected_scores(K, V, mu, lam, tau=2.0)
    assert s.score.shape == (2, 3, 10) and s.score.dtype == torch.float32
    _, _, lev = _dense_rank_one(K[1, 2].double(), V[1, 2].double(), mu[1, 2].double(), lam[1, 2].double(), 2.0, 1.0)
    assert torch.allclose(s.score[1, 2].double(), lev, rtol=1e-4, atol=1e-8)


def test_rank_one_differs_from_diagonal_for_competing_pair():
    """Two keys near the centre with opposite values: the diagonal weight rho^2 shrinks as the pair
    dominates, the exact-S weight does not (alpha^2), and the centred directions are ±."""
    d = 4
    mu = torch.tensor([4.0, 0, 0, 0], dtype=torch.float64)
    K = torch.tensor([[4.0, 0.3, 0, 0], [4.0, -0.3, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.float64)
    V = torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0], [0, 0.1, 0, 0], [0, 0, 0.1, 0]], dtype=torch.float64)
    lam = torch.ones(d, dtype=torch.float64)
    r1 = D.rank_one_corrected_scores(K, V, mu, lam, tau=1.0)
    dg = jacap_scores(K, V, mu, lam, tau=1.0)
    assert float(r1.alpha[:2].sum()) > 0.95
    assert float(r1.weight[0] / dg.weight.double()[0]) > 3.5  # (1-alpha)^-2 with alpha ~ 0.49
    assert float(r1.score[:2].min()) > float(r1.score[2:].max())


# ----------------------------------------------------------------------------- bad input
def test_bad_inputs_raise_value_error():
    K, U, mu, lam = _rand_head()
    with pytest.raises(ValueError, match="queries"):
        D.taylor_error(K, U, mu, torch.randn(3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        D.loo_damage(K[:1], U[:, :1], mu)
    with pytest.raises(ValueError, match="budget"):
        D.diagonal_capacities(K, U, mu, lam, budget=1)
    with pytest.raises(ValueError, match="tau"):
        D.rank_one_corrected_scores(K, K, mu, lam, tau=-1.0)
    with pytest.raises(ValueError, match="input_ids"):
        D.capture_heads(None, torch.zeros(3))


# ----------------------------------------------------------------------------- tidy records on a synthetic capture
def _synthetic_capture(H=4, H_kv=2, Tlen=60, d=8, d_model=12, seed=5):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(H_kv, Tlen, d, generator=g)
    k[:, 0] *= 0.0
    k[:, 0, 0] = 6.0  # a sink-like key that every query hits
    q = torch.randn(H, Tlen, d, generator=g)
    q[..., 0] += 3.0
    return D.HeadCapture(layer=2, queries=q, keys=k, values=torch.randn(H_kv, Tlen, d, generator=g),
                         queries_prerope=q, keys_prerope=k, out_proj=torch.randn(H, d_model, d, generator=g))


def test_loo_records_full_and_subsampled():
    cap = _synthetic_capture()
    full = D.loo_records({2: cap}, prefix=40, keep_top=None)
    assert len(full) == 4 * 40
    # damage of head 1 equals the mean closed-form damage divided by the mean output norm
    t = D.head_tensors(cap, 1, prefix=40)
    dmg = D.loo_damage(t["K"], t["U"], t["Q_future"])
    a = torch.softmax(t["Q_future"] @ t["K"].T / math.sqrt(8), -1)
    ref = dmg.mean(0) / (a @ t["U"].T).norm(dim=-1).mean()
    got = torch.tensor([r["damage"] for r in full if r["head"] == 1], dtype=torch.float64)
    assert torch.allclose(got, ref, rtol=1e-9)
    sub = D.loo_records({2: cap}, prefix=40, keep_top=5, n_random=3)
    for h in range(4):
        pos = {r["position"] for r in sub if r["head"] == h}
        top = {r["position"] for r in sorted((r for r in full if r["head"] == h), key=lambda r: -r["damage"])[:5]}
        sat = {r["position"] for r in full if r["head"] == h and r["alpha_bar_tau1"] >= 0.5}
        assert top | sat <= pos and len(pos) <= len(top | sat) + 3


def test_record_builders_on_synthetic_capture():
    cap = _synthetic_capture()
    tay = D.taylor_error_records({2: cap}, prefix=40, ratio=0.5, n_sink=2)
    assert len(tay) == 4 and all(r["budget"] == 20 and r["n_queries"] == 20 for r in tay)
    dia = D.diagonal_records({2: cap}, prefix=40, pool=12, budget=4, n_subsets=6)
    assert [(r["layer"], r["head"]) for r in dia] == [(2, h) for h in range(4)]
    sel = D.selection_records({2: cap}, prefix=40, n=8, budget=3, n_caches=1, heads=[0])
    assert len(sel) == 1 and sel[0]["exhaustive"] >= max(sel[0]["greedy"], sel[0]["one_shot"]) - 1e-12
    with pytest.raises(ValueError, match="prefix"):
        D.head_tensors(cap, 0, prefix=60)
    with pytest.raises(ValueError, match="n"):
        D.selection_records({2: cap}, prefix=40, n=21)
