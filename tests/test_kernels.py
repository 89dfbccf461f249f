"""Triton scoring kernels vs the torch reference and vs a float64 brute force.

Without a GPU the kernels run in the Triton interpreter, which must be switched on before triton
is first imported. Without CUDA this module sets ``TRITON_INTERPRET=1`` before importing triton; when the whole
suite runs and some earlier test module already imported triton (kvpress does), the in-process
cases skip and ``test_cases_under_interpreter_subprocess`` reruns this file in a fresh interpreter
process instead, so the cases always run somewhere. On a CUDA machine (without the interpreter)
the same cases run on the GPU.
"""
import os

import torch  # noqa: E402 (torch does not import triton)

if not torch.cuda.is_available():
    # before anything below can import triton; on a CUDA machine the compiled kernels are what is tested
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed: the GPU scoring kernels cannot be tested")

from jacap_lib.scoring.triton import plan_launch, triton_jacap_scores  # noqa: E402
from jacap_lib.scoring.triton.launch import interpreter_active  # noqa: E402
from jacap_lib.config import DEFAULTS  # noqa: E402
from jacap_lib.scoring import jacap_scores  # noqa: E402

INTERPRETED = interpreter_active()
if INTERPRETED:
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    DEVICE = None
needs_kernels = pytest.mark.skipif(
    DEVICE is None,
    reason="triton was imported before TRITON_INTERPRET=1 was set and there is no GPU; "
    "test_cases_under_interpreter_subprocess runs these cases in a fresh process",
)
# on a GPU, compare with exact fp32 dots; tf32 gets its own, looser test
PRECISION = "ieee"
FIELDS = ("alpha", "rho", "kappa", "weight", "leverage", "score")


def brute_force(keys, values, mu, lam, tau, noise, out_proj=None):
    """Algorithm 1 in float64 straight from the formulas, one (batch, head) at a time, A solved densely."""
    k, v = keys.double().cpu(), values.double().cpu()
    lead, (N, d) = k.shape[:-2], k.shape[-2:]
    mu = torch.broadcast_to(mu.double().cpu(), lead + (d,))
    lam = torch.broadcast_to(lam.double().cpu(), lead + (d,))
    out = {f: torch.empty(lead + (N,), dtype=torch.float64) for f in FIELDS}
    for idx in (torch.cartesian_prod(*[torch.arange(s) for s in lead]).reshape(-1, len(lead)) if lead else [()]):
        idx = tuple(int(i) for i in idx)
        K, V, m, l = k[idx], v[idx], mu[idx], lam[idx]
        z = K @ m / (tau * math.sqrt(d))
        alpha = torch.exp(z - z.max()) / torch.exp(z - z.max()).sum()
        rho = alpha * (1 - alpha)
        kappa = (K**2 * l).sum(-1)
        w = rho**2 * kappa / d
        if out_proj is None:
            U = V
        else:
            W = torch.broadcast_to(out_proj.double().cpu(), lead + out_proj.shape[-2:])[idx]
            U = V @ W.T
        A = torch.eye(U.shape[-1], dtype=torch.float64) + (U * (w / noise)[:, None]).T @ U
        lev = (U * torch.linalg.solve(A, U.T).T).sum(-1)
        for name, val in zip(FIELDS, (alpha, rho, kappa, w, lev, w / noise * lev)):
            out[name][idx] = val
    return out


def make_inputs(B, H, N, d, dtype, *, key_scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = (key_scale * torch.randn(B, H, N, d, generator=g)).to(dtype)
    values = torch.randn(B, H, N, d, generator=g).to(dtype)
    mu = 2.0 * torch.randn(B, H, d, generator=g)
    lam = 0.05 + torch.rand(B, H, d, generator=g)
    return [t.to(DEVICE) for t in (keys, values, mu, lam)]


def assert_fields_close(got, want, *, rtol, atol_rel, fields=FIELDS):
    """|got - want| <= atol_rel * max|want| + rtol * |want|, field by field (reported by name)."""
    for f in fields:
        a = getattr(got, f).double().cpu()
        b = want[f] if isinstance(want, dict) else getattr(want, f)
        b = b.double().cpu()
        assert a.shape == b.shape, f
        assert torch.isfinite(a).all(), f"{f} has non-finite entries"
        tol = atol_rel * b.abs().max().clamp_min(1e-30) + rtol * b.abs()
        err = (a - b).abs()
        assert bool((err <= tol).all()), f"{f}: max err {err.max():.3g}, worst ratio {(err / tol).max():.3g}"


def assert_same_top(got, want, budget, tol):
    """Same top-`budget` set per head, except swaps between tokens whose reference scores tie within `tol`."""
    top_got = got.topk(budget, dim=-1).indices
    top_want = want.topk(budget, dim=-1).indices
    kth = want.topk(budget, dim=-1).values[..., -1:]
    flat_got, flat_want = top_got.reshape(-1, budget), top_want.reshape(-1, budget)
    flat_score, flat_kth = want.reshape(flat_got.shape[0], -1), kth.reshape(-1)
    for row in range(flat_got.shape[0]):
        diff = set(flat_got[row].tolist()) ^ set(flat_want[row].tolist())
        for i in diff:  # a swapped token must sit at the selection boundary
            assert abs(float(flat_score[row, i]) - float(flat_kth[row])) <= tol, (row, i)


# (dtype, N, d, B, H): every dtype x N x d, with several batch x head shapes
CASES = [
    (dtype, N, d, *bh)
    for dtype in (torch.float32, torch.float16, torch.bfloat16)
    for N, bh in ((1, (2, 3)), (17, (1, 8)), (1000, (1, 2)))
    for d in (64, 128)
]
# tolerances against the float32 torch reference (same rounded inputs, different summation order)
TOL = {"rtol": 2e-4, "atol_rel": 2e-5}


@needs_kernels
@pytest.mark.parametrize("dtype,N,d,B,H", CASES, ids=lambda x: str(x).replace("torch.", ""))
def test_matches_torch_reference(dtype, N, d, B, H):
    keys, values, mu, lam = make_inputs(B, H, N, d, dtype, seed=N + d)
    got = triton_jacap_scores(keys, values, mu, lam, tau=2.0, noise=0.5, dot_precision=PRECISION)
    want = jacap_scores(keys, values, mu, lam, tau=2.0, noise=0.5, backend="torch")
    assert got.score.dtype == torch.float32 and got.score.shape == (B, H, N)
    assert_fields_close(got, want, **TOL)
    budget = max(1, N // 4)
    assert_same_top(got.score, want.score, budget, tol=1e-4 * float(want.score.abs().max()))
    if dtype == torch.float32 and N > 1:  # and both against the float64 formulas
        assert_fields_close(got, brute_force(keys, values, mu, lam, 2.0, 0.5), rtol=1e-3, atol_rel=1e-5)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_large_magnitude_keys(dtype):
    """Keys ~ 300: logits of several hundred (exp overflows without the running max) and kappa ~ 1e7."""
    keys, values, mu, lam = make_inputs(1, 3, 1000, 64, dtype, key_scale=300.0, seed=7)
    got = triton_jacap_scores(keys, values, mu, lam, tau=1.0, dot_precision=PRECISION)
    want = jacap_scores(keys, values, mu, lam, tau=1.0, backend="torch")
    z = (keys.float() @ mu[..., None]).squeeze(-1) / math.sqrt(64)
    assert float(z.max()) > 200, "the case must overflow a naive exp"
    assert_fields_close(got, want, rtol=1e-3, atol_rel=1e-4, fields=("alpha", "rho", "kappa", "weight", "score"))
    assert_same_top(got.score, want.score, 250, tol=1e-3 * float(want.score.abs().max()))
    assert torch.isfinite(got.leverage).all() and bool((got.leverage >= 0).all())
    torch.testing.assert_close(got.alpha.sum(-1), torch.ones(1, 3, device=DEVICE), rtol=0, atol=1e-5)


@needs_kernels
def test_chunked_softmax_and_gram_over_many_splits():
    """N split into several chunks per head (N not a multiple of the chunk): same result as one chunk."""
    keys, values, mu, lam = make_inputs(2, 2, 1000, 64, torch.float32, key_scale=30.0, seed=3)
    plan = plan_launch(4, 1000, 64, 64, keys.device, num_splits=5)
    assert plan["n_split"] > 1 and 1000 % plan["chunk"] != 0
    one = triton_jacap_scores(keys, values, mu, lam, num_splits=1, dot_precision=PRECISION)
    many = triton_jacap_scores(keys, values, mu, lam, num_splits=5, dot_precision=PRECISION)
    for f in FIELDS:
        torch.testing.assert_close(getattr(many, f), getattr(one, f), rtol=1e-4, atol=1e-6)
    assert_fields_close(many, brute_force(keys, values, mu, lam, DEFAULTS.tau, DEFAULTS.noise), rtol=1e-3, atol_rel=1e-5)


@needs_kernels
@pytest.mark.parametrize("d_out", [32, 64, 160])
def test_out_proj(d_out):
    """u = W v for d_out < d, = d and > d (the d_out > d case is reduced to d x d through QR)."""
    keys, values, mu, lam = make_inputs(1, 2, 300, 64, torch.float32, key_scale=20.0, seed=d_out)
    W = torch.randn(d_out, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE) / 8
    got = triton_jacap_scores(keys, values, mu, lam, out_proj=W, dot_precision=PRECISION)
    assert_fields_close(got, brute_force(keys, values, mu, lam, DEFAULTS.tau, DEFAULTS.noise, out_proj=W), rtol=2e-3, atol_rel=1e-5)
    want = jacap_scores(keys, values, mu, lam, out_proj=W, backend="torch")
    assert_fields_close(got, want, rtol=2e-3, atol_rel=1e-5)


@needs_kernels
def test_per_head_out_proj_and_broadcast_stats():
    """(H, d_out, d) projections and one (d,) mu / lam shared by every head."""
    keys, values, mu, lam = make_inputs(2, 3, 100, 64, torch.float16, seed=11)
    W = torch.randn(3, 48, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE) / 8
    got = triton_jacap_scores(keys, values, mu[0, 0], lam[0, 0], out_proj=W, dot_precision=PRECISION)
    want = brute_force(keys, values, mu[0, 0], lam[0, 0], DEFAULTS.tau, DEFAULTS.noise, out_proj=W)
    assert_fields_close(got, want, rtol=2e-3, atol_rel=1e-5)


@needs_kernels
def test_strided_inputs_need_no_copy():
    """Keys/values as transposed views of a (B, N, H, d) cache, plus 3-d and 5-d leading shapes."""
    g = torch.Generator().manual_seed(5)
    cache_k = torch.randn(2, 200, 3, 64, generator=g).to(DEVICE)
    cache_v = torch.randn(2, 200, 3, 64, generator=g).to(DEVICE)
    mu, lam = torch.randn(2, 3, 64, generator=g).to(DEVICE), torch.rand(2, 3, 64, generator=g).to(DEVICE)
    k, v = cache_k.transpose(1, 2), cache_v.transpose(1, 2)
    assert not k.is_contiguous()
    got = triton_jacap_scores(k, v, mu, lam, dot_precision=PRECISION)
    ref = triton_jacap_scores(k.contiguous(), v.contiguous(), mu, lam, dot_precision=PRECISION)
    for f in FIELDS:
        torch.testing.assert_close(getattr(got, f), getattr(ref, f), rtol=0, atol=0)
    three = triton_jacap_scores(k[0], v[0], mu[0], lam[0], dot_precision=PRECISION)
    torch.testing.assert_close(three.score, ref.score[0], rtol=1e-5, atol=1e-7)
    five = triton_jacap_scores(k[:, None], v[:, None], mu[:, None], lam[:, None], dot_precision=PRECISION)
    torch.testing.assert_close(five.score[:, 0], ref.score, rtol=1e-5, atol=1e-7)


@needs_kernels
def test_single_token_closed_form():
    """N = 1: alpha = 1, rho = 0, weight = 0, A = I, leverage = |v|^2, score = 0."""
    keys, values, mu, lam = make_inputs(1, 2, 1, 64, torch.float32, seed=1)
    got = triton_jacap_scores(keys, values, mu, lam, dot_precision=PRECISION)
    assert torch.equal(got.alpha, torch.ones_like(got.alpha))
    assert torch.equal(got.weight, torch.zeros_like(got.weight))
    torch.testing.assert_close(got.leverage, values.float().square().sum(-1), rtol=1e-5, atol=0)
    assert torch.equal(got.score, torch.zeros_like(got.score))


@needs_kernels
def test_dispatch_from_jacap_scores():
    keys, values, mu, lam = make_inputs(1, 1, 40, 64, torch.float32, seed=2)
    via = jacap_scores(keys, values, mu, lam, backend="triton")
    direct = triton_jacap_scores(keys, values, mu, lam)
    torch.testing.assert_close(via.score, direct.score, rtol=0, atol=0)


@needs_kernels
def test_bad_inputs_raise_value_error():
    keys, values, mu, lam = make_inputs(1, 1, 8, 64, torch.float32)
    with pytest.raises(ValueError, match="float64"):
        triton_jacap_scores(keys.double(), values.double(), mu, lam)
    with pytest.raises(ValueError, match="mu"):
        triton_jacap_scores(keys, values, mu[..., :32], lam)
    with pytest.raises(ValueError, match="tau"):
        triton_jacap_scores(keys, values, mu, lam, tau=0.0)
    with pytest.raises(ValueError, match="out_proj"):
        triton_jacap_scores(keys, values, mu, lam, out_proj=torch.ones(8, 32, device=DEVICE))
    with pytest.raises(ValueError, match="dot_precision"):
        triton_jacap_scores(keys, values, mu, lam, dot_precision="fp8")
    # non-finite caches are named, through the same contract as the torch path
    with pytest.raises(ValueError, match="`keys`"):
        triton_jacap_scores(keys.masked_fill(keys > 1.5, float("nan")), values, mu, lam)
    with pytest.raises(ValueError, match="`values`"):
        triton_jacap_scores(keys, values.masked_fill(values > 1.5, float("inf")), mu, lam)
    with pytest.raises(ValueError, match="`lam`"):
        triton_jacap_scores(keys, values, mu, -lam)


def test_cpu_tensors_without_interpreter_raise(monkeypatch):
    import jacap_lib.scoring.triton.launch as ks

    monkeypatch.setattr(ks, "interpreter_active", lambda: False)
    x = torch.zeros(1, 4, 16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        ks.triton_jacap_scores(x, x, torch.zeros(16), torch.ones(16))


@needs_kernels
@pytest.mark.parametrize("kw", [{}, {"noise": "deff", "deff_target": 3.0}, {"noise": "deff", "deff_target": 5.0, "d_out": 48},
                                {"noise": 0.5, "d_out": 96}], ids=["fixed", "deff", "deff-proj", "fixed-proj-qr"])
def test_unchecked_call_is_the_same_computation(kw):
    """check=False (no synchronisation at all) returns exactly what the checked call returns, and both match
    the torch path: the softmax combination, the jitter choice and the noise rule all run on the device."""
    kw = dict(kw)
    keys, values, mu, lam = make_inputs(1, 3, 300, 64, torch.float32, key_scale=10.0, seed=13)
    d_out = kw.pop("d_out", None)
    if d_out is not None:
        kw["out_proj"] = torch.randn(d_out, 64, generator=torch.Generator().manual_seed(3)).to(DEVICE) / 8
    a = triton_jacap_scores(keys, values, mu, lam, dot_precision=PRECISION, check=False, num_splits=3, **kw)
    b = triton_jacap_scores(keys, values, mu, lam, dot_precision=PRECISION, num_splits=3, **kw)
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    want = jacap_scores(keys, values, mu, lam, backend="torch", **kw)
    assert_fields_close(a, want, rtol=2e-3, atol_rel=1e-5)
    if "deff_target" in kw:  # the rule's defining property: the scores sum to the target
        torch.testing.assert_close(a.score.double().sum(-1), torch.full((1, 3), kw["deff_target"], dtype=torch.float64),
                                   rtol=1e-4, atol=0)


@needs_kernels
def test_unchecked_call_shows_bad_inputs_as_nan_and_checked_call_names_them():
    keys, values, mu, lam = make_inputs(1, 2, 64, 64, torch.float32, seed=14)
    bad = values.masked_fill(values > 1.5, float("nan"))
    out = triton_jacap_scores(keys, bad, mu, lam, check=False)
    assert torch.isnan(out.score).all()
    with pytest.raises(ValueError, match="`values`"):
        triton_jacap_scores(keys, bad, mu, lam)
    with pytest.raises(ValueError, match="`mu`"):
        triton_jacap_scores(keys, values, mu.masked_fill(mu > 1, float("inf")), lam)
    with pytest.raises(ValueError, match="deff_target"):
        triton_jacap_scores(keys, values, mu, lam, noise="deff", deff_target=torch.tensor([2.0, -1.0], device=DEVICE))


@pytest.mark.skipif(DEVICE != "cuda", reason="host synchronisation exists only with CUDA")
@pytest.mark.parametrize("kw", [{}, {"noise": "deff", "deff_target": 8.0}, {"out_proj": "W"}], ids=["fixed", "deff", "proj"])
def test_no_host_synchronisation_on_cuda(kw):
    """A scoring call with check=False only enqueues work: under sync-debug mode "error" any
    synchronising CUDA call (a .item(), a host copy, a blocking copy to the device) raises."""
    keys, values, mu, lam = make_inputs(1, 8, 4096, 128, torch.bfloat16, seed=15)
    if kw.get("out_proj") == "W":
        kw = {"out_proj": torch.randn(64, 128, generator=torch.Generator().manual_seed(4)).to(DEVICE) / 8}
    triton_jacap_scores(keys, values, mu, lam, check=False, **kw)  # compiles the kernels first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = triton_jacap_scores(keys, values, mu, lam, check=False, **kw)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    want = jacap_scores(keys, values, mu, lam, backend="torch", **kw)
    assert_fields_close(out, want, rtol=5e-3, atol_rel=1e-4, fields=("alpha", "weight", "leverage", "score"))
    torch.cuda.set_sync_debug_mode("error")
    try:  # the checked call reads its status once, at the end: that read is its one synchronisation
        with pytest.raises(RuntimeError, match="synchroniz"):
            triton_jacap_scores(keys, values, mu, lam, **kw)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.skipif(DEVICE != "cuda", reason="tf32 dots only exist on a GPU")
def test_tf32_default_precision_on_gpu():
    keys, values, mu, lam = make_inputs(2, 8, 4096, 128, torch.bfloat16, seed=4)
    got = triton_jacap_scores(keys, values, mu, lam)  # default tf32
    want = jacap_scores(keys, values, mu, lam, backend="torch")
    assert_fields_close(got, want, rtol=5e-3, atol_rel=1e-4, fields=("alpha", "weight", "leverage", "score"))


@needs_kernels
@pytest.mark.parametrize("kw", [{}, {"noise": "deff", "deff_target": 3.0, "d_out": 48}], ids=["fixed", "deff-proj"])
def test_inputs_that_require_grad_score_as_plain_ones(kw):
    """A model run outside torch.no_grad() hands the scorer tensors that require grad: the Triton entries
    (``triton_jacap_scores`` and ``jacap_scores(backend="triton")``) score them without autograd and return
    exactly what they return for the same values without grad."""
    kw = dict(kw)
    keys, values, mu, lam = make_inputs(1, 2, 96, 32, torch.float32, seed=15)
    d_out = kw.pop("d_out", None)
    if d_out is not None:
        kw["out_proj"] = torch.randn(d_out, 32, generator=torch.Generator().manual_seed(4)).to(DEVICE) / 6
    tensors = {k: v for k, v in dict(keys=keys, values=values, mu=mu, lam=lam, **kw).items() if isinstance(v, torch.Tensor)}
    graded = {k: v.clone().requires_grad_(True) for k, v in tensors.items()}
    opts = {k: v for k, v in kw.items() if k not in tensors}
    assert torch.is_grad_enabled()
    for entry in (lambda **t: triton_jacap_scores(**t, dot_precision=PRECISION, **opts),
                  lambda **t: jacap_scores(**t, backend="triton", **opts)):
        plain, got = entry(**tensors), entry(**graded)
        for f in FIELDS:
            assert not getattr(got, f).requires_grad and torch.equal(getattr(got, f), getattr(plain, f)), f


@pytest.mark.skipif(INTERPRETED or DEVICE == "cuda", reason="the cases already run in this process")
def test_cases_under_interpreter_subprocess():
    """Run this file in a fresh process with TRITON_INTERPRET=1 set before triton is imported."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " skipped" in proc.stdout  # this test skips itself there


SM90_COMPILE = r"""
import inspect, triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from jacap_lib.scoring.triton import _kernels as src
ptr = {n: "*fp32" for n in "MU LAM Z KAPPA PART_M PART_S ALPHA RHO WEIGHT GRAM P INV_NOISE LEVERAGE SCORE".split()}
ptr.update(K="*bf16", V="*bf16")
for fn, const in ((src.logits_kernel, dict(BLOCK_N=64, BLOCK_D=64)),
                  (src.gram_kernel, dict(BLOCK_N=64, BLOCK_D=64, BLOCK_S=16, DOT_PRECISION="tf32")),
                  (src.leverage_kernel, dict(BLOCK_N=64, BLOCK_D=64, DOT_PRECISION="tf32"))):
    sig = {n: "constexpr" if n in const else ptr.get(n, "fp32" if n in ("scale", "inv_d") else "i32")
           for n in inspect.signature(fn).parameters}
    k = triton.compile(ASTSource(triton.jit(fn), sig, const), target=GPUTarget("cuda", 90, 32))
    assert k.asm["cubin"], fn.__name__
print("compiled")
"""


def test_kernels_compile_for_hopper():
    """The kernels lower to PTX and a cubin for sm_90 (no GPU needed): catches interpreter-only code."""
    pytest.importorskip("triton.backends.nvidia", reason="triton has no NVIDIA backend here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-c", SM90_COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
