"""The speed-result tables and findings the Algorithm 1 chapter prints, on hand-made runs."""
import pytest

from jacap_lib.experiments import bench as B
from jacap_lib.scoring import costs


def _run():
    rows = []
    for N, scale in ((1024, 1.0), (4096, 4.0)):
        for m, ms, peak in (("floor", 0.1, 0), ("jacap_torch", 2.0, 2**20), ("capkv", 1.0, 2**21),
                            ("expected_attention", 0.5, 0), ("knorm", 0.1, 0)):
            t = ms * scale / 1e3
            rows.append(dict(N=N, d=64, method=m, median_s=t, ratio_to_floor=ms / 0.1, peak_extra_bytes=peak * scale))
    return {"config": {"dtype": "float32"}, "rows": rows}


def test_scoring_frame_and_findings():
    f = B.scoring_frame(_run(), 64)
    assert list(f.columns) == [1024, 4096]
    assert f.loc["Jacap (torch reference)", 4096] == "8 ms (20x)"
    assert f.loc["Jacap torch / CapKV", 1024] == "2.00"
    with pytest.raises(ValueError, match="`d`"):
        B.scoring_frame(_run(), 128)
    found = B.scoring_findings(_run())
    assert found["torch_over_capkv_min"] == found["torch_over_capkv_max"] == pytest.approx(2.0)
    assert found["torch_above_1_2x_capkv"] == [(1024, 64), (4096, 64)]
    kv_mib = 2 * 8 * 4096 * 64 * 4 / 2**20          # K and V of 8 heads in float32
    assert found["peak_over_kv"]["CapKV (kvpress CapPress.score)"] == pytest.approx(8 / kv_mib)


def test_end_to_end_findings():
    rows = []
    for m, c, score, dec, tot in (("none", 0.0, 0.0, 10.0, 100.0), ("jacap_prompt", 0.5, 2.0, 5.0, 80.0), ("capkv", 0.5, 4.0, 4.0, 90.0)):
        rows.append(dict(prompt_tokens=2048, method=m, ratio=c, prefill_s=10.0, scoring_s=score, total_s=tot,
                         decode_ms_per_token=dec, scoring_share_of_total=score / tot))
    f = B.end_to_end_findings({"rows": rows})
    assert f["jacap_over_capkv_scoring"] == {(2048, 0.5): 0.5}
    assert f["decode_speedup"][(2048, "jacap_prompt", 0.5)] == pytest.approx(2.0)
    assert f["total_over_uncompressed"][(2048, "capkv", 0.5)] == pytest.approx(0.9)
    assert f["scoring_share_of_prefill"]["capkv"] == (0.4, 0.4)
    assert B.end_to_end_frame({"rows": rows}).shape == (3, 5)


def test_error_per_condition_is_the_median_ratio():
    rows = [dict(cond=10.0, float32_A_positive_definite=True, formation_rel_err=1e-6,
                 inverse={"median_rel_err": 4e-6, "max_rel_err": 1e-5, "negative": 0},
                 cholesky_solve={"median_rel_err": 1e-6, "max_rel_err": 2e-6, "negative": 0},
                 triangular_inverse={"median_rel_err": 1e-6, "max_rel_err": 2e-6, "negative": 0}),
            dict(cond=1e9, float32_A_positive_definite=False, formation_rel_err=None,
                 inverse={"median_rel_err": 0.1, "max_rel_err": 1.0, "negative": 3})]
    c = costs.error_per_condition(rows)
    assert c["explicit inverse"] == pytest.approx(4e-7) and c["Cholesky + triangular solve"] == pytest.approx(1e-7)
    table = costs.inverse_vs_solve_table(rows)
    assert table[1]["Cholesky + triangular solve: median"] is None and table[1]["negative leverages (inverse)"] == 3
    with pytest.raises(ValueError):
        costs.error_per_condition(rows[1:])
