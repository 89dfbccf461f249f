"""Pure callbacks of the theory widgets, against independent computations."""
import itertools
import math

import pytest
import torch

from jacap_lib import theory as T
from jacap_lib import examples as EX
from jacap_lib import memory as MEM
from jacap_lib.widgets import theory as W


def test_kv_cache_bytes_formula_and_errors():
    assert MEM.kv_cache_bytes(32, 1, 8, 131072, 128, 2) == 2 * 32 * 8 * 131072 * 128 * 2 == 16 * 2**30
    assert MEM.kv_cache_bytes(30, 4, 3, 100, 64, 0.5) == 2 * 30 * 4 * 3 * 100 * 64 * 0.5
    with pytest.raises(ValueError, match="kv_heads"):
        MEM.kv_cache_bytes(32, 1, 0, 10, 128, 2)
    with pytest.raises(ValueError, match="bytes_per_scalar"):
        MEM.kv_cache_bytes(32, 1, 8, 10, 128, 0)
    with pytest.raises(ValueError, match="compression"):
        MEM.kept_tokens(100, 1.0)
    assert MEM.kept_tokens(131072, 0.9) == 13107 and MEM.kept_tokens(1000, 0.75) == 250
    # the glossary's rule, max(1, floor((1 - c) N)): 0.53 * 20 = 10.6 keeps 10 (nearest-integer rounding kept 11),
    # and a tiny prompt keeps one token
    assert MEM.kept_tokens(20, 0.47) == 10 and MEM.kept_tokens(3, 0.9) == 1


def test_memory_table_scales_with_compression():
    rows = MEM.kv_memory_table(MEM.MODEL_KV_CONFIGS, tokens=131072, compression=0.5)
    llama = next(r for r in rows if r["model"] == "Llama-3.1-8B")
    assert llama["gib"] == 8.0 and llama["tokens_kept"] == 65536
    with pytest.raises(ValueError, match="dtype"):
        MEM.kv_memory_table(MEM.MODEL_KV_CONFIGS, tokens=10, dtype="fp64")


def test_bundled_config_read_from_gguf_header():
    assert MEM.bundled_kv_config() == dict(layers=30, kv_heads=3, head_dim=64)


def test_two_token_sensitivity_matches_the_note():
    res = EX.two_token_sensitivity(0.0)
    assert torch.allclose(res["S"], torch.tensor([[0.25, -0.25], [-0.25, 0.25]], dtype=torch.float64))
    gap = math.log(99.0)  # alpha = (0.99, 0.01)
    res = EX.two_token_sensitivity(gap)
    assert torch.allclose(res["S"].abs(), torch.full((2, 2), 0.0099, dtype=torch.float64))
    assert EX.two_token_sensitivity(10 * gap, tau=10)["rho"] == pytest.approx(0.0099)


def _brute(u, w, budget):
    def cap(c):
        A = torch.eye(u.shape[1], dtype=torch.float64)
        for i in c:
            A = A + w[i] * torch.outer(u[i], u[i])
        return 0.5 * float(torch.logdet(A))
    return max(itertools.combinations(range(len(u)), budget), key=cap), cap


def test_leverage_example_note_numbers_and_brute_force():
    ex = EX.leverage_example(EX.NOTE_U, EX.NOTE_W)
    u = torch.tensor(EX.NOTE_U, dtype=torch.float64)
    w = torch.tensor(EX.NOTE_W, dtype=torch.float64)
    A = torch.eye(2, dtype=torch.float64) + (u.T * w) @ u
    r = w * torch.einsum("id,de,ie->i", u, torch.linalg.inv(A), u)
    assert torch.allclose(ex.score, r) and ex.score[2] > ex.score[1]
    assert ex.one_shot == (0, 2)
    best, cap = _brute(u, w, 2)
    assert ex.exhaustive == best and ex.capacity["exhaustive"] == pytest.approx(cap(best))
    g = torch.Generator().manual_seed(5)
    u6 = torch.randn(6, 3, generator=g, dtype=torch.float64)
    w6 = torch.rand(6, generator=g, dtype=torch.float64)
    ex6 = EX.leverage_example(u6, w6, budget=3)
    best6, cap6 = _brute(u6, w6, 3)
    assert ex6.capacity["exhaustive"] == pytest.approx(cap6(best6))
    assert ex6.capacity["greedy"] <= ex6.capacity["exhaustive"] + 1e-12
    with pytest.raises(ValueError, match="budget"):
        EX.leverage_example(EX.NOTE_U, EX.NOTE_W, budget=4)
    with pytest.raises(ValueError, match="`w`"):
        EX.leverage_example(EX.NOTE_U, (1.0, -1.0, 1.0))


def test_rotation_makes_u2_independent():
    assert EX.rotated_example(math.degrees(math.atan2(0.05, 0.95))).score.tolist() == pytest.approx(
        EX.leverage_example(EX.NOTE_U, EX.NOTE_W).score.tolist())
    assert EX.rotated_example(90.0).score[1] > EX.rotated_example(3.0).score[1]


def test_capacity_vs_sharpness_uses_the_library_capacities():
    g = torch.Generator().manual_seed(2)
    K = torch.randn(5, 3, generator=g, dtype=torch.float64)
    U = torch.randn(2, 5, generator=g, dtype=torch.float64)
    mu = torch.randn(3, generator=g, dtype=torch.float64)
    lam = torch.ones(3, dtype=torch.float64)
    res = EX.capacity_vs_sharpness(K, U, mu, lam, [0.5, 100.0])
    assert res["jacobian"][0] == pytest.approx(float(T.jacobian_capacity(K, U, 0.5 * mu, lam)))
    assert res["jacobian"][1] < 1e-6 < res["jacobian"][0]  # saturation kills the Jacobian capacity
    assert res["linear"][0] == res["linear"][1] == pytest.approx(float(T.linear_capacity(K, U, lam)))


def test_apps_build_without_a_kernel():
    pytest.importorskip("ipywidgets")
    for app in (W.kv_calculator_app(), W.leverage_app(), W.sensitivity_app()):
        assert app.children
