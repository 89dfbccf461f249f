"""Benchmark scripts (smoke runs), what they time (checked against the methods' formulas), the cost
model, the inverse-vs-solve experiment and the chapter-5 figures."""
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from jacap_lib.scoring import costs as numerics
from jacap_lib.experiments.bench import end_to_end_rows, load_bench, scoring_rows

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def scoring():
    return _load("scoring")


def _inputs(N=40, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(1, 2, N, d, generator=g, dtype=torch.float64), torch.randn(1, 2, N, d, generator=g, dtype=torch.float64)
    mu, lam = torch.randn(1, 2, d, generator=g, dtype=torch.float64), 0.1 + torch.rand(1, 2, d, generator=g, dtype=torch.float64)
    return keys, values, mu, lam


def test_capkv_timed_is_capkv_formula(scoring):
    """The timed CapPress.score (anchor given) equals CapKV's formula computed here by hand."""
    keys, values, mu, lam = _inputs()
    got = scoring.kvpress_scorers(keys, values, mu, lam)["capkv"]()
    tau, sink, eps = 5.0, 4, 1e-6  # CapPress defaults
    k, v = keys[:, :, sink:], values[:, :, sink:]
    cos = (torch.nn.functional.normalize(k, dim=-1) * torch.nn.functional.normalize(mu, dim=-1)[:, :, None]).sum(-1)
    w = torch.exp(tau * cos - (tau * cos).amax(-1, keepdim=True))
    for h in range(2):
        A = torch.eye(16, dtype=torch.float64) + (v[0, h] * (w[0, h] + eps)[:, None]).T @ v[0, h]
        want = w[0, h] * (v[0, h] * torch.linalg.solve(A, v[0, h].T).T).sum(-1)
        torch.testing.assert_close(got[0, h, sink:].double(), want, rtol=1e-5, atol=1e-7)
    assert bool((got[:, :, :sink] > got[:, :, sink:].amax()).all())  # sinks padded above every score


def test_expected_attention_and_knorm_timed_are_their_formulas(scoring):
    keys, values, mu, lam = _inputs(seed=1)
    fns = scoring.kvpress_scorers(keys, values, mu, lam)
    ea = fns["expected_attention"]()
    k, v = keys[:, :, 4:], values[:, :, 4:]
    logit = (k @ mu[..., None]).squeeze(-1) / 4.0 + 0.5 * (k * k * lam[:, :, None]).sum(-1) / 16
    want = torch.softmax(logit, -1) * v.norm(dim=-1)
    torch.testing.assert_close(ea[:, :, 4:].double(), want, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(fns["knorm"]().double(), -keys.norm(dim=-1), rtol=1e-6, atol=0)


def test_scoring_script_quick_run(scoring, tmp_path):
    out = scoring.main(["--N", "300", "--d", "32", "--quick", "--threads", "1", "--out", str(tmp_path / "s.json")])
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["config"]["N"] == [300] and saved["config"]["kv_heads"] == 8 and saved["argv"][0] == "--N"
    methods = {r["method"] for r in saved["rows"]}
    assert methods == {"floor", "floor_gemm", "jacap_torch", "capkv", "expected_attention", "knorm"}
    floor = next(r for r in saved["rows"] if r["method"] == "floor")
    gemm = next(r for r in saved["rows"] if r["method"] == "floor_gemm")
    for r in saved["rows"]:
        assert math.isclose(r["ratio_to_floor"], r["median_s"] / floor["median_s"], rel_tol=1e-12)
        assert math.isclose(r["min_over_kv_floor"], r["min_s"] / floor["min_s"], rel_tol=1e-12)
        assert math.isclose(r["min_over_gemm_floor"], r["min_s"] / gemm["min_s"], rel_tol=1e-12)
        assert r["median_s"] > 0 and r["repeats"] == 1
    assert saved["config"]["timer"] == "time.thread_time" and set(saved["config"]["load_average_1m"]) == {"start", "end"}
    assert set(saved["what_was_timed"]) >= methods
    rows = scoring_rows(saved)
    assert len(rows) == 1 and math.isclose(
        rows[0]["jacap_torch_over_capkv"], out["summary"]["N=300,d=32"]["jacap_torch_over_capkv"], rel_tol=1e-12
    )


@pytest.mark.model
def test_end_to_end_script_tiny_run(tmp_path):
    e2e = _load("end_to_end")
    out = e2e.main(["--lengths", "48", "--ratios", "0.5", "--new-tokens", "2", "--threads", "1",
                    "--out", str(tmp_path / "e.json")])
    rows = {(r["method"], r["ratio"]): r for r in out["rows"]}
    assert set(rows) == {("none", 0.0), ("jacap_prompt", 0.5), ("capkv", 0.5)}
    assert rows[("none", 0.0)]["kept_tokens_per_head"] == 47  # prompt[:-1] prefilled, nothing evicted
    assert rows[("jacap_prompt", 0.5)]["kept_tokens_per_head"] < 47
    n_layers = out["config"]["num_hidden_layers"]
    for key in (("jacap_prompt", 0.5), ("capkv", 0.5)):
        r = rows[key]
        assert r["score_calls"] == n_layers and 0 < r["scoring_s"] < r["prefill_s"]
        assert math.isclose(r["scoring_share_of_total"], r["scoring_s"] / (r["prefill_s"] + r["decode_s"]))


def test_end_to_end_random_init_is_validated_before_work(tmp_path, capsys):
    e2e = _load("end_to_end")
    out = tmp_path / "e.json"
    (tmp_path / "no_tok").mkdir()
    (tmp_path / "no_tok" / "config.json").write_text("{}")
    (tmp_path / "ok").mkdir()
    for f in ("config.json", "tokenizer.json"):
        (tmp_path / "ok" / f).write_text("{}")
    bad = [["--random-init", str(tmp_path / "missing")],
           ["--random-init", str(tmp_path / "no_tok")],
           ["--random-init", str(tmp_path / "ok"), "--model", "x"],
           ["--ratios", "1.0"], ["--new-tokens", "0"], ["--lengths", "1"]]
    errors = []
    for argv in bad:
        with pytest.raises(SystemExit):
            e2e.main([*argv, "--out", str(out)])
        assert not out.exists()
        errors.append(capsys.readouterr().err.rsplit("error: ", 1)[-1])
    assert "has no config.json" in errors[0] and "no tokenizer" in errors[1] and "drop --model" in errors[2], errors
    assert "--ratios" in errors[3] and "--new-tokens" in errors[4] and "--lengths" in errors[5], errors


@pytest.mark.model
def test_end_to_end_random_init_has_the_bundled_architecture(tmp_path):
    """--save-architecture + --random-init: same parameter names and shapes as the real bundled model,
    weights from the seed (two builds agree), the same prompt ids, and the record says 'random'."""
    from jacap_lib.models import load_model

    e2e = _load("end_to_end")
    arch = tmp_path / "arch"
    assert e2e.main(["--save-architecture", str(arch)]) is None
    assert not (arch / "model.safetensors").exists() and (arch / "config.json").is_file()
    real, tokenizer = load_model()
    model, tok, record = e2e.random_init_model(arch, torch.device("cpu"))
    again, _, _ = e2e.random_init_model(arch, torch.device("cpu"))
    want = {k: v.shape for k, v in real.state_dict().items()}
    assert {k: v.shape for k, v in model.state_dict().items()} == want
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    name = "model.layers.0.self_attn.k_proj.weight"
    assert not torch.allclose(model.state_dict()[name], real.state_dict()[name])
    assert torch.equal(e2e.prompt_ids(tok, 300)[0], e2e.prompt_ids(tokenizer, 300)[0])
    assert record["architecture_of"]["model"] == "SmolLM2-135M-Instruct" and "random" in record["model"]
    assert record["architecture"]["num_key_value_heads"] == real.config.num_key_value_heads


def test_device_tag():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import common

    assert common.device_tag({"cpu": "x"}) == "cpu"
    assert common.device_tag({"gpu": "NVIDIA H200"}) == "h200"
    assert common.device_tag({"gpu": "NVIDIA H100 80GB HBM3"}) == "h100_80gb_hbm3"


def test_step_costs_closed_forms():
    costs = {c["step"]: c for c in numerics.step_costs(1000, 64, bytes_per_scalar=2)}
    assert costs["Gram sum w u u^T"]["flops"] == 2 * 1000 * 64 * 64 + 1000 * 64
    assert costs["Cholesky of A"]["flops"] == 64**3 // 3
    assert sum(c["bytes"] for c in costs.values()) == 3 * 1000 * 64 * 2  # K once, V twice
    with pytest.raises(ValueError, match="`d`"):
        numerics.step_costs(10, 0)


def test_ill_conditioned_system_hits_its_condition_number():
    U = numerics.ill_conditioned_system(1e5, d=32, N=200, n_copies=4)
    A = torch.eye(32, dtype=torch.float64) + U.T @ U
    assert U.shape == (204, 32)
    assert 0.5e5 < float(torch.linalg.cond(A)) < 2e5
    with pytest.raises(ValueError, match="cond"):
        numerics.ill_conditioned_system(1.0)


def test_inverse_vs_solve_findings():
    rows = {r["cond_target"]: r for r in numerics.inverse_vs_solve((1e3, 1e6, 1e8), d=32, N=256)}
    for c in (1e3, 1e6):  # both fine, the explicit inverse less accurate
        r = rows[c]
        assert r["cholesky_ok_float32"] and r["inverse"]["negative"] == 0
        assert r["cholesky_solve"]["median_rel_err"] < r["inverse"]["median_rel_err"]
        assert r["cholesky_solve"]["median_rel_err"] < 1e4 * c * 6e-8
    assert rows[1e6]["inverse"]["median_rel_err"] > 1e-5
    bad = rows[1e8]  # float32 rounding makes A indefinite: Cholesky refuses, the inverse answers wrongly
    assert not bad["float32_A_positive_definite"] and not bad["cholesky_ok_float32"]
    assert "cholesky_solve" not in bad and bad["inverse"]["max_rel_err"] > 0.1


def test_fixed_and_per_token_recovers_a_line():
    """The fit of t = fixed + per_token * N on exact lines gives back their intercepts and slopes, and the
    per-token ratios to both floors."""
    from jacap_lib.measure.timing import fixed_and_per_token

    lines = {"floor": (1e-5, 1e-8), "floor_gemm": (2e-5, 1e-7), "jacap_torch": (3e-3, 1.5e-7)}
    rows = [{"N": N, "d": 64, "method": m, "min_s": a + b * N} for N in (1024, 4096, 16384) for m, (a, b) in lines.items()]
    fits = {f["method"]: f for f in fixed_and_per_token(rows)}
    for m, (a, b) in lines.items():
        assert fits[m]["fixed_s"] == pytest.approx(a, rel=1e-6) and fits[m]["per_token_s"] == pytest.approx(b, rel=1e-9)
        assert fits[m]["fit_max_rel_residual"] < 1e-9
    assert fits["jacap_torch"]["per_token_over_gemm_floor"] == pytest.approx(1.5)
    assert fits["jacap_torch"]["per_token_over_kv_floor"] == pytest.approx(15.0)


def test_figures_build():
    from jacap_lib.viz import kernels as V

    assert len(V.step_cost_figure(Ns=(1024, 4096), ds=(64, 128)).data) == 2 * 6
    rows = numerics.inverse_vs_solve((1e3, 1e8), d=16, N=64)
    fig = V.inverse_vs_solve_figure(rows)
    assert {t.name for t in fig.data} >= {"u^T inv(A) u", "Cholesky + solve"}
    data = {"rows": [
        {"N": N, "d": 64, "method": m, "median_s": t * N, "ratio_to_floor": t / 1e-3, "peak_extra_bytes": 2**20}
        for N in (1024, 4096) for m, t in (("floor", 1e-3), ("jacap_torch", 2e-2), ("capkv", 1e-2),
                                          ("expected_attention", 5e-3), ("knorm", 1e-3))
    ], "environment": {"cpu": "test", "torch_threads": 1}}
    assert len(V.scoring_benchmark_figure(data).data) == 5
    table = scoring_rows(data)
    assert table[0]["jacap_torch_over_capkv"] == pytest.approx(2.0)
    assert len(V.scoring_table_figure(table).data[0].cells.values) == 2 + 5 + 1
    e2e = {"config": {"model": "m"}, "environment": {}, "rows": [
        {"method": "jacap_prompt", "ratio": 0.8, "prompt_tokens": 2048, "new_tokens": 100, "prefill_s": 3.0, "scoring_s": 1.0,
         "decode_s": 2.0, "scoring_share_of_total": 0.2}]}
    assert end_to_end_rows(e2e)[0]["prefill_other_s"] == pytest.approx(2.0)
    assert [t.x[0] for t in V.end_to_end_figure(e2e).data] == [1.0, 2.0, 2.0]


@pytest.mark.parametrize("name", ["scoring_cpu", "end_to_end_cpu", "scoring_h200", "end_to_end_h200"])
def test_committed_results_are_complete(name):
    try:
        data = load_bench(name)
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    assert data["environment"]["packages"]["torch"] and data["rows"]
    if name == "scoring_cpu":  # N 4K-16K (the target range) and the sizes around them, both floors, one thread
        Ns = sorted(data["config"]["N"])
        assert {4096, 8192, 16384} <= set(Ns) and data["config"]["d"] == [64, 128] and not data["skipped_time_budget"]
        assert data["environment"]["torch_threads"] == 1 and data["config"]["load_average_1m"]["end"] is not None
        assert len(data["rows"]) == len(Ns) * 2 * 6 and {"floor", "floor_gemm"} <= {r["method"] for r in data["rows"]}
        fits = {(f["d"], f["method"]) for f in data["fixed_and_per_token"]}
        assert fits == {(r["d"], r["method"]) for r in data["rows"]}
        for r in data["rows"]:
            assert r["min_s"] <= r["median_s"] <= r["max_s"]
    elif name == "scoring_h200":  # the GPU run adds the Triton column and N = 256K
        assert data["environment"]["gpu"] == "NVIDIA H200" and data["config"]["dtype"] == "bfloat16"
        assert sorted(data["config"]["N"]) == [1024, 4096, 16384, 65536, 262144] and not data["skipped_time_budget"]
        assert len(data["rows"]) == 5 * 2 * 6 and "jacap_triton" in {r["method"] for r in data["rows"]}
        for key, s in data["summary"].items():  # the saved summary agrees with the rows
            N, d = (int(x.split("=")[1]) for x in key.split(","))
            t = {r["method"]: r["median_s"] for r in data["rows"] if (r["N"], r["d"]) == (N, d)}
            assert math.isclose(s["jacap_triton_over_jacap_torch"], t["jacap_triton"] / t["jacap_torch"], rel_tol=1e-9)
    else:
        assert {r["method"] for r in data["rows"]} == {"none", "jacap_prompt", "capkv"}
        for r in data["rows"]:
            assert 0 <= r["scoring_s"] < r["prefill_s"]
            assert math.isclose(r["scoring_share_of_total"], r["scoring_s"] / r["total_s"], rel_tol=1e-9)
            if r.get("repeats", 1) == 1:  # one run: its total is its prefill + decode (with repeats, medians each)
                assert math.isclose(r["total_s"], r["prefill_s"] + r["decode_s"], rel_tol=1e-9)
            else:
                assert r["decode_ms_per_token_min"] <= r["decode_ms_per_token"] <= r["decode_ms_per_token_max"]
        if name == "end_to_end_h200":  # random weights, same architecture: the record must say so
            cfg = data["config"]
            assert "random" in cfg["weights"] and "random weights" in cfg["model"]
            assert cfg["architecture_of"]["model"] == "SmolLM2-135M-Instruct" and cfg["num_key_value_heads"] == 3



def test_median_row_takes_the_median_of_each_timing_and_refuses_mixed_configurations():
    from jacap_lib.measure.timing import median_row

    base = {"method": "jacap_prompt", "ratio": 0.5, "prompt_tokens": 64, "kept_tokens_per_head": 32, "new_tokens": 4}
    runs = [dict(base, prefill_s=p, decode_s=d, total_s=p + d, decode_ms_per_token=250 * d, scoring_s=s)
            for p, d, s in ((1.0, 4.0, 0.1), (3.0, 1.0, 0.3), (2.0, 2.0, 0.2))]
    row = median_row(runs)
    assert (row["prefill_s"], row["decode_s"], row["scoring_s"]) == (2.0, 2.0, 0.2)
    assert row["total_s"] == 4.0 and row["scoring_share_of_total"] == pytest.approx(0.05)
    assert (row["decode_ms_per_token_min"], row["decode_ms_per_token_max"], row["repeats"]) == (250.0, 1000.0, 3)
    with pytest.raises(ValueError, match="kept_tokens_per_head"):
        median_row([runs[0], dict(runs[1], kept_tokens_per_head=31)])
    with pytest.raises(ValueError, match="runs"):
        median_row([])


def test_end_to_end_repeats_are_validated_and_reported(tmp_path):
    e2e = _load("end_to_end")
    with pytest.raises(SystemExit):
        e2e.main(["--repeats", "0", "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
    out = e2e.main(["--lengths", "40", "--ratios", "0.5", "--new-tokens", "2", "--threads", "1", "--methods", "jacap_prompt",
                    "--repeats", "2", "--out", str(tmp_path / "e.json")])
    assert out["config"]["repeats"] == 2 and [r["repeats"] for r in out["rows"]] == [2]
    row = out["rows"][0]
    assert row["decode_ms_per_token_min"] <= row["decode_ms_per_token"] <= row["decode_ms_per_token_max"]


def test_fixed_cost_is_never_negative():
    """Times that a free line would meet at a negative intercept (t = -1e-4 + 1e-7 N, two points) are fitted
    through the origin: fixed 0, and the slope minimising the relative error, checked by brute force."""
    import numpy as np

    from jacap_lib.measure.timing import fixed_and_per_token

    N = np.array([2048.0, 8192.0])
    t = -1e-4 + 1e-7 * N
    rows = [{"N": int(n), "d": 64, "method": "knorm", "min_s": float(x)} for n, x in zip(N, t)]
    (fit,) = fixed_and_per_token(rows)
    assert fit["fixed_s"] == 0.0
    grid = np.linspace(0.5e-7, 2e-7, 200001)
    best = grid[np.argmin([np.sum(((g * N - t) / t) ** 2) for g in grid])]
    assert fit["per_token_s"] == pytest.approx(best, rel=1e-5)
