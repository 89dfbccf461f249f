"""Tables of the committed speed results (``data/bench/*.json``) for the book; read them with
:func:`jacap_lib.results.loaders.load_bench`."""
from __future__ import annotations

from jacap_lib.results.loaders import available_benches, load_bench  # noqa: F401 (re-exported: the chapters' names)

__all__ = ["available_benches", "load_bench", "scoring_rows", "end_to_end_rows", "METHOD_NAMES", "scoring_frame",
           "scoring_findings", "end_to_end_frame", "end_to_end_findings", "gpu_benches", "floor_ratio_frame",
           "fixed_cost_frame"]


def scoring_rows(data: dict) -> list[dict]:
    """One row per (N, d): median milliseconds per method, ratios to the floor, and Jacap/CapKV."""
    table: dict[tuple, dict] = {}
    for r in data["rows"]:
        row = table.setdefault((r["N"], r["d"]), {"N": r["N"], "d": r["d"]})
        row[f"{r['method']}_ms"] = 1e3 * r["median_s"]
        row[f"{r['method']}_x_floor"] = r["ratio_to_floor"]
        row[f"{r['method']}_peak_MiB"] = None if r["peak_extra_bytes"] is None else r["peak_extra_bytes"] / 2**20
    for row in table.values():
        row["jacap_torch_over_capkv"] = row["jacap_torch_ms"] / row["capkv_ms"]
    return [table[k] for k in sorted(table, key=lambda k: (k[1], k[0]))]


def end_to_end_rows(data: dict) -> list[dict]:
    """The end-to-end rows with the prefill split into scoring and the rest."""
    out = []
    for r in data["rows"]:
        out.append({**r, "prefill_other_s": r["prefill_s"] - r["scoring_s"]})
    return out


#: full names of the timed scorers (table headers)
METHOD_NAMES = {
    "floor": "floor: one read of K and V",
    "floor_gemm": "two-GEMM floor: V^T V and V G",
    "jacap_torch": "Jacap (torch reference)",
    "jacap_triton": "Jacap (Triton kernels)",
    "jacap_triton_async": "Jacap (Triton, check=False)",
    "capkv": "CapKV (kvpress CapPress.score)",
    "expected_attention": "Expected Attention (kvpress)",
    "knorm": "KNorm (kvpress)",
}
_SCORERS = ("jacap_triton", "jacap_triton_async", "jacap_torch", "capkv", "expected_attention", "knorm")


def gpu_benches(kind: str = "scoring") -> list[str]:
    """Names of the committed GPU runs of ``kind`` (``"scoring"`` or ``"end_to_end"``)."""
    return [n for n in available_benches() if n.startswith(f"{kind}_") and n != f"{kind}_cpu"]


def scoring_frame(data: dict, d: int):
    """The scoring benchmark at head dimension ``d`` as a ``pandas.DataFrame`` narrow enough for a page:
    one row per scorer (full names), one column per cache length N, cells "median ms (multiple of the
    floor)"; a last row gives Jacap torch / CapKV."""
    import pandas as pd

    rows = [r for r in scoring_rows(data) if r["d"] == d]
    if not rows:
        raise ValueError(f"`d` = {d} was not timed; the run has d in {sorted({r['d'] for r in scoring_rows(data)})}")
    table = {}
    for m in ("floor", "floor_gemm") + _SCORERS:
        if f"{m}_ms" not in rows[0]:
            continue
        table[METHOD_NAMES[m]] = {r["N"]: (f"{r[m + '_ms']:.3g} ms" if m == "floor" else
                                          f"{r[m + '_ms']:.3g} ms ({r[m + '_x_floor']:.0f}x)") for r in rows}
    table["Jacap torch / CapKV"] = {r["N"]: f"{r['jacap_torch_over_capkv']:.2f}" for r in rows}
    return pd.DataFrame(table).T.rename_axis(index=f"d = {d}", columns="cached tokens N")


def scoring_findings(data: dict, *, itemsize: int | None = None) -> dict:
    """What the chapter says about a scoring run, computed: Jacap torch / CapKV range and median, where it
    exceeds 1.2x, the Triton path's position (if timed), and peak extra memory at the largest cache as
    a multiple of K and V together."""
    import statistics

    rows = scoring_rows(data)
    ratios = [r["jacap_torch_over_capkv"] for r in rows]
    if itemsize is None:
        itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(data["config"].get("dtype", "float32")), 4)
    largest = max(rows, key=lambda r: (r["N"], r["d"]))
    kv_mib = 2 * 8 * largest["N"] * largest["d"] * itemsize / 2**20
    out = dict(torch_over_capkv_min=min(ratios), torch_over_capkv_max=max(ratios),
               torch_over_capkv_median=statistics.median(ratios),
               torch_above_1_2x_capkv=[(r["N"], r["d"]) for r in rows if r["jacap_torch_over_capkv"] > 1.2],
               largest=(largest["N"], largest["d"]), largest_kv_mib=kv_mib,
               peak_over_kv={METHOD_NAMES[m]: largest[m + "_peak_MiB"] / kv_mib for m in _SCORERS
                             if largest.get(m + "_peak_MiB") is not None})
    if "jacap_triton_ms" in rows[0]:
        out["triton_ahead_from"] = {d: [r["N"] for r in rows if r["d"] == d and
                                        r["jacap_triton_ms"] < min(r["jacap_torch_ms"], r["capkv_ms"])]
                                    for d in sorted({r["d"] for r in rows})}
        out["triton_x_floor_at_largest"] = largest["jacap_triton_x_floor"]
        out["floor_bandwidth_TBps"] = {(r["N"], r["d"]): 2 * 8 * r["N"] * r["d"] * itemsize / (r["floor_ms"] / 1e3) / 1e12
                                       for r in rows}
    return out


def floor_ratio_frame(data: dict, methods=("jacap_torch", "jacap_triton", "jacap_triton_async")):
    """Each Jacap method's fastest call as a multiple of the two floors measured in the same run: one read of K
    and V (``x K/V read``) and the two ``N d^2`` GEMMs (``x two GEMMs``); one row per (d, N). Runs made
    before the two-GEMM floor was timed have only the first."""
    import pandas as pd

    out = {}
    for r in data["rows"]:
        if r["method"] not in methods or "min_over_kv_floor" not in r:
            continue
        row = out.setdefault((r["d"], r["N"]), {})
        row[f"{METHOD_NAMES[r['method']]}: x K/V read"] = r["min_over_kv_floor"]
        row[f"{METHOD_NAMES[r['method']]}: x two GEMMs"] = r["min_over_gemm_floor"]
    if not out:
        raise ValueError("this run has no min_over_kv_floor / min_over_gemm_floor fields (made before they existed)")
    return pd.DataFrame.from_dict(out, orient="index").rename_axis(["d", "N"]).sort_index()


def fixed_cost_frame(data: dict):
    """The fixed per-call cost and the per-token cost of every timed method (``fixed_and_per_token`` of the
    run): microseconds per call, nanoseconds per token, the per-token cost over each floor's, the fit's worst
    relative residual; one row per (d, method)."""
    import pandas as pd

    from jacap_lib.measure.timing import fixed_and_per_token

    # refitted from the run's rows where it has them, so a file written before the fit was constrained to a fixed
    # cost >= 0 reads as today's fit
    rows = fixed_and_per_token(data["rows"]) if data.get("rows") else data.get("fixed_and_per_token")
    if not rows:
        raise ValueError("this run has no fixed_and_per_token fit (made before it existed)")
    return pd.DataFrame([{
        "d": f["d"], "method": METHOD_NAMES.get(f["method"], f["method"]),
        "fixed (µs/call)": 1e6 * f["fixed_s"], "per token (ns)": 1e9 * f["per_token_s"],
        "per token / K-V read's": f["per_token_over_kv_floor"], "per token / two GEMMs'": f["per_token_over_gemm_floor"],
        "worst residual": f["fit_max_rel_residual"]} for f in rows]).set_index(["d", "method"])


def end_to_end_frame(data: dict):
    """The end-to-end run as a ``pandas.DataFrame``: one row per (prompt tokens, method, c); prefill and
    scoring seconds, scoring's share of the prefill and of prefill + decode, decode ms per token."""
    import pandas as pd

    out = []
    for r in data["rows"]:
        out.append({"prompt tokens": r["prompt_tokens"], "method": r["method"],
                    "c": f"{r['ratio']:g}" if r["method"] != "none" else "—",
                    "prefill (s)": r["prefill_s"], "scoring (s)": r["scoring_s"],
                    "scoring share of prefill": r["scoring_s"] / r["prefill_s"],
                    "scoring share of total": r["scoring_share_of_total"],
                    "decode (ms/token)": r["decode_ms_per_token"]})
    return pd.DataFrame(out).set_index(["prompt tokens", "method", "c"])


def end_to_end_findings(data: dict) -> dict:
    """Per (length, c): Jacap's scoring time over CapPress's, each press's decode speed-up and total over
    the uncompressed run; the uncompressed prefill time per length (a load check); scoring share ranges."""
    by = {(r["prompt_tokens"], r["method"], r["ratio"]): r for r in data["rows"]}
    base = {L: r for (L, m, c), r in by.items() if m == "none"}
    pressed = sorted(k for k in by if k[1] != "none")
    return dict(
        jacap_over_capkv_scoring={(L, c): by[(L, m, c)]["scoring_s"] / by[(L, "capkv", c)]["scoring_s"]
                                  for L, m, c in pressed if m == "jacap_prompt" and (L, "capkv", c) in by},
        jacap_over_capkv_decode={(L, c): by[(L, m, c)]["decode_ms_per_token"] / by[(L, "capkv", c)]["decode_ms_per_token"]
                                 for L, m, c in pressed if m == "jacap_prompt" and (L, "capkv", c) in by},
        decode_speedup={(L, m, c): base[L]["decode_ms_per_token"] / by[(L, m, c)]["decode_ms_per_token"]
                        for L, m, c in pressed if L in base},
        total_over_uncompressed={(L, m, c): by[(L, m, c)]["total_s"] / base[L]["total_s"] for L, m, c in pressed if L in base},
        uncompressed_prefill_s={L: base[L]["prefill_s"] for L in sorted(base)},
        scoring_share_of_prefill={m: (min(v), max(v)) for m in ("jacap_prompt", "capkv") if (v := [
            r["scoring_s"] / r["prefill_s"] for r in data["rows"] if r["method"] == m])},
        scoring_share_of_total={m: (min(v), max(v)) for m in ("jacap_prompt", "capkv") if (v := [
            r["scoring_share_of_total"] for r in data["rows"] if r["method"] == m])},
        # with repeats: the fastest per-token decode of each row (its range over rows) and the slowest repeat
        decode_ms_fastest=(min(v), max(v)) if (v := [r.get("decode_ms_per_token_min", r["decode_ms_per_token"])
                                                     for r in data["rows"]]) else None,
        decode_ms_slowest=max(r.get("decode_ms_per_token_max", r["decode_ms_per_token"]) for r in data["rows"]),
    )
