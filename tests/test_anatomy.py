"""The anatomy of the losing cells (jacap_lib.experiments.anatomy, jacap_lib.measure.anatomy, jacap_lib.viz.anatomy,
jacap_lib.measure.instruments): every statistic against a hand computation on hand-built inputs, and the job's
bad calls refused before any work."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from jacap_lib import cli
from jacap_lib.measure import anatomy as M
from jacap_lib.experiments import anatomy as A
from jacap_lib.report import findings as F
from jacap_lib.verdicts import rows as RS
from conftest import CharTokenizer


def _rows(errs_a, errs_b, kls_a, kls_b, kinds, *, length=2048, ratio=0.5, a="jacap_prompt[tau=3,beta=0.9]",
          b="expected_attention"):
    rows = []
    for i, (ea, eb, ka, kb, kind) in enumerate(zip(errs_a, errs_b, kls_a, kls_b, kinds)):
        for spec, e, k in ((a, ea, ka), (b, eb, kb)):
            rows.append({"method": spec, "doc": f"{kind}/d{i}", "kind": kind, "length": length, "ratio": ratio,
                         "kl": k, "attn_rel_error_per_layer": list(e)})
    return rows


ERR_A = [[0.2, 0.5, 0.9], [0.1, 0.4, 0.3], [0.3, 0.6, 0.2], [0.25, 0.2, 0.5], [0.4, 0.3, 0.3], [0.3, 0.3, 0.3]]
ERR_B = [[0.1, 0.5, 0.3], [0.1, 0.2, 0.6], [0.2, 0.3, 0.1], [0.5, 0.2, 0.25], [0.2, 0.6, 0.3], [0.3, 0.3, 0.3]]
KL_A = [0.2, 0.1, 0.4, 0.05, 0.3, 0.1]
KL_B = [0.1, 0.2, 0.1, 0.05, 0.1, 0.2]
KINDS = ["dialogue", "dialogue", "dialogue", "prose", "prose", "prose"]


def test_layer_ratio_is_the_geometric_mean_of_the_per_document_ratios():
    rows = _rows(ERR_A, ERR_B, KL_A, KL_B, KINDS)
    out = RS.layer_error_ratios(rows, "jacap_prompt[tau=3,beta=0.9]", "expected_attention", 2048, 0.5, n_resamples=999)
    assert [r["layer"] for r in out] == [0, 1, 2]
    for layer, r in enumerate(out):
        logs = [math.log(ERR_A[d][layer] / ERR_B[d][layer]) for d in range(6)]
        want = math.exp(sum(logs) / 6)
        assert r["ratio"] == pytest.approx(want, rel=1e-12) and r["n"] == 6
        assert r["low"] <= r["ratio"] <= r["high"]
    # layer 0: ratios 2, 1, 1.5, 0.5, 2, 1 -> product 3, geometric mean 3 ** (1/6)
    assert out[0]["ratio"] == pytest.approx(3 ** (1 / 6), rel=1e-12)
    # one kind: only its documents
    dia = RS.layer_error_ratios(rows, "jacap_prompt[tau=3,beta=0.9]", "expected_attention", 2048, 0.5, kind="dialogue",
                         n_resamples=999)
    assert dia[2]["ratio"] == pytest.approx((3 * 0.5 * 2) ** (1 / 3), rel=1e-12) and dia[2]["n"] == 3


def test_kind_ratios_count_losses_and_wins_per_kind():
    rows = _rows(ERR_A, ERR_B, KL_A, KL_B, KINDS)
    out = {r["kind"]: r for r in RS.kind_ratios(rows, "jacap_prompt[tau=3,beta=0.9]", "expected_attention", 2048, 0.5,
                                                n_resamples=999)}
    assert set(out) == {"all", "dialogue", "prose"}
    assert (out["all"]["losses"], out["all"]["wins"]) == (3, 2)  # the tie (0.05 vs 0.05) is neither
    assert out["dialogue"]["ratio"] == pytest.approx((2 * 0.5 * 4) ** (1 / 3), rel=1e-12)
    with pytest.raises(ValueError, match="at least 3"):
        RS.kind_ratios(rows[:4], "jacap_prompt[tau=3,beta=0.9]", "expected_attention", 2048, 0.5)


def test_losing_cells_are_those_whose_interval_lies_above_one():
    summary = {"families": [
        {"role": "algorithm 1", "picked_on": "dev", "rows": [{"gm_low": 2.0}]},
        {"role": "algorithm 1", "picked_on": "tune", "rows": [{"cell": "a", "gm_low": 1.01}, {"cell": "b", "gm_low": 1.0},
                                                          {"cell": "c", "gm_low": 0.7}]}]}
    assert [r["cell"] for r in RS.losing_cells(summary)] == ["a"]


def test_the_library_defaults_part_reads_its_own_family_and_cells():
    """library_default_part measures the family whose setting JacapPromptPress() builds today (the observed centre, window
    16), on that family's own losing cells; Algorithm 1's family (the tempered centre) is not it."""
    from jacap_lib.presses.registry import changed_options
    obs = "jacap_obs[window=16]"  # today's default; Algorithm 1's tuned setting is the tempered centre
    assert not changed_options(obs, "jacap_prompt") and changed_options("jacap_prompt[centre=tempered,tau=3,beta=0.9]", "jacap_prompt")
    rows = _rows(ERR_A, ERR_B, KL_A, KL_B, KINDS, a=obs)
    row = {"length": 2048, "ratio": 0.5, "baseline_spec": "expected_attention", "gm_ratio": 1.5, "gm_low": 1.1,
           "gm_high": 2.0}
    summary = {"families": [
        {"role": "algorithm 1", "picked_on": "tune", "setting": "jacap_prompt[centre=tempered,tau=3,beta=0.9]", "rows": []},
        {"role": "tuned jacap_obs", "picked_on": "dev", "setting": obs, "rows": []},
        {"role": "tuned jacap_obs", "picked_on": "tune", "setting": obs,
         "rows": [row, {**row, "ratio": 0.9, "gm_low": 0.9}]}]}
    assert RS.default_role(summary) == "tuned jacap_obs"
    part = RS.library_default_part(rows, summary, n_resamples=999)
    assert (part["role"], part["setting"]) == ("tuned jacap_obs", obs)
    assert [e["cell"] for e in part["kinds"]] == ["2048/0.5"]  # only the cell whose interval lies above 1
    (all_docs,) = [k for k in part["kinds"][0]["kinds"] if k["kind"] == "all"]
    want = math.exp(sum(math.log(a / b) for a, b in zip(KL_A, KL_B)) / 6)
    assert all_docs["ratio"] == pytest.approx(want, rel=1e-12) and part["kinds"][0]["setting"] == obs
    assert {e["kind"] for e in part["layers"]} == {"all", "dialogue", "prose"}
    # no part when the default is Algorithm 1's own family, or when no family measures it
    summary["families"][1:] = []
    assert RS.default_role(summary) is None and RS.library_default_part(rows, summary) is None


def test_jaccard_and_exclusive_positions_on_hand_built_kept_sets():
    n = 40
    kept_a = torch.tensor([[[0, 1, 2, 39], [0, 1, 2, 3]], [[0, 5, 6, 7], [10, 11, 12, 13]]])
    kept_b = torch.tensor([[[0, 1, 3, 38], [0, 1, 2, 3]], [[0, 5, 6, 7], [20, 21, 22, 23]]])
    jac = M.jaccard_per_layer(kept_a, kept_b, n)
    assert jac[0] == pytest.approx((2 / 6 + 1) / 2) and jac[1] == pytest.approx((1 + 0) / 2)
    h = M.exclusive_histogram(kept_a, kept_b, n, edges=(0, 8, 32, 64))
    # a only: layer 0 positions 2 (distance 37) and 39 (distance 0); layer 1 positions 10-13 (distances 29-26)
    assert h["a_only"] == [[1, 0, 1], [0, 4, 0]]
    # b only: layer 0 positions 3 (distance 36) and 38 (distance 1); layer 1 positions 20-23 (distances 19-16)
    assert h["b_only"] == [[1, 0, 1], [0, 4, 0]]
    assert h["a_only_first"] == [1, 0] and h["b_only_first"] == [1, 0]
    with pytest.raises(ValueError, match="n_tokens"):
        M.jaccard_per_layer(kept_a, kept_b, 30)


def test_token_categories_and_counts():
    tokens = ["**", "HAM", "LET", "**", "  \n", "Words", ",", " words", ".", "\n", " ", "42"]
    cats = M.token_categories(tokens)
    assert cats == ["markup/punctuation", "name line", "name line", "markup/punctuation", "line break", "word",
                    "markup/punctuation", "word", "markup/punctuation", "line break", "space", "other"]
    mask = torch.zeros(2, len(tokens), dtype=torch.bool)
    mask[0, [1, 2, 4]] = True
    mask[1, [1, 5]] = True
    counts = M.category_counts(mask, cats)
    assert counts["name line"] == 3 and counts["line break"] == 1 and counts["word"] == 1
    assert M.top_tokens(mask, tokens, k=1) == [["HAM", 2]]


def test_protected_press_keeps_the_score_and_forces_sinks_and_window():
    from kvpress import KnormPress

    from jacap_lib.measure.instruments import ProtectedPress

    torch.manual_seed(0)
    keys = torch.randn(1, 2, 20, 8)
    hidden = torch.randn(1, 20, 16)
    inner = KnormPress(compression_ratio=0.5)
    press = ProtectedPress(press=inner, compression_ratio=0.5, n_sink=2, window=3)
    raw = inner.score(None, hidden, keys, keys, None, {})
    got = press.score(None, hidden, keys, keys, None, {})
    prot = torch.zeros(20, dtype=torch.bool)
    prot[:2] = prot[-3:] = True
    assert torch.equal(got[..., ~prot], raw[..., ~prot].float())
    assert bool((got[..., prot] == torch.finfo(torch.float32).max).all())
    with pytest.raises(ValueError, match="ScorerPress"):
        ProtectedPress(press=None, compression_ratio=0.5)


def test_swap_settings_change_one_knob_each():
    from jacap_lib.presses.registry import changed_options, parse_method, written_out

    default = written_out("jacap_prompt[centre=tempered,tau=3,beta=0.9,window=32]")
    s = {x["key"]: x for x in A.swap_settings(default, "expected_attention")}
    assert all(written_out(re.split(r"\+(?:window_attention|protect|oracle)", x["spec"])[0]) ==
               re.split(r"\+(?:window_attention|protect|oracle)", x["spec"])[0] for x in s.values() if x["key"] != "baseline")

    def changed(key):  # what the swap changes, read off the presses the two specs build
        return {k: v[1] for k, v in changed_options(s[key]["spec"], default).items()}

    assert changed("jacap_baseline_protection") == {"window": 0}  # Expected Attention's 4 sinks are Jacap's
    assert changed("jacap_no_protection") == {"n_sink": 0, "window": 0}
    assert s["baseline_jacap_protection"]["protect"] == (4, 32)
    assert changed("tau_1") == {"tau": 1.0} and changed("tau_10") == {"tau": 10.0}
    assert changed("flat_statistics") == {"beta": None} and changed("gqa_mean") == {"gqa": "mean"}
    assert changed("no_leverage") == {"noise": 1e6}
    # the weight's form one factor at a time: each differs from the default in one option
    for key, option in (("sensitivity_alpha", {"sensitivity": "alpha"}), ("kappa_mean", {"kappa": "mean"}),
                        ("ea_centre", {"centre": "ea"})):
        assert parse_method(s[key]["spec"])[0] == "jacap_ablate"
        assert {k: v for k, v in changed(key).items() if k != "class"} == option, key
    assert s["oracle_statistics"]["oracle"] and s["oracle_statistics"]["spec"] == f"{default}+oracle"
    # the RoPE horizon: the baseline's number of future positions, alone, and as the ladder's last step before it
    u = {x["key"]: x for x in A.swap_settings(default, "expected_attention[n_future_positions=32]")}
    assert {k: v[1] for k, v in changed_options(u["future_positions"]["spec"], default).items()} == {
        "n_future_positions": 32}
    assert "future_positions" not in s  # kvpress's default horizon is Jacap's: nothing to swap
    rungs = [u[k]["spec"] for k in RS.LADDER[1:-1]]
    for a, b in zip(rungs, rungs[1:]):  # one option more per step
        assert len([k for k in changed_options(b, a) if k != "class"]) == 1, (a, b)
    # under the observed centre there is no tempered centre to replace by Expected Attention's
    observed = written_out("jacap_prompt[window=16]")
    t = {x["key"]: x for x in A.swap_settings(observed, "expected_attention")}
    assert "ea_centre" not in t
    assert {k: v[1] for k, v in changed_options(t["kappa_mean"]["spec"], observed).items()
            if k != "class"} == {"kappa": "mean"}
    # a baseline without sinks: its protection is no protection, listed once
    keys = [x["key"] for x in A.swap_settings(default, "snapkv[window_size=16]")]
    assert "jacap_baseline_protection" not in keys and "jacap_no_protection" in keys


def test_swap_ratios_are_paired_geometric_means_to_the_default():
    docs = [{"kind": k, "kl": {"default": {"kl": d}, "x": {"kl": x}}}
            for k, d, x in (("a", 0.1, 0.2), ("a", 0.2, 0.1), ("b", 0.4, 0.8), ("b", 0.1, 0.1))]
    out = {r["key"]: r for r in RS.swap_ratios(docs, n_resamples=999)}
    assert out["default"]["ratio"] == 1.0 and out["default"]["lower"] == 0
    assert out["x"]["ratio"] == pytest.approx((2 * 0.5 * 2 * 1) ** 0.25, rel=1e-12)
    assert out["x"]["lower"] == 1 and out["x"]["n"] == 4
    back = {r["key"]: r for r in RS.swap_ratios(docs, reference="x", n_resamples=999)}
    assert back["default"]["ratio"] == pytest.approx(1 / out["x"]["ratio"], rel=1e-12)


def test_figures_have_axis_titles_and_two_log_ticks():
    from jacap_lib.viz import anatomy as V

    rows = _rows(ERR_A, ERR_B, KL_A, KL_B, KINDS)
    layers = [{"cell": "2048/0.5", "length": 2048, "ratio": 0.5, "setting": "jacap_prompt[tau=3,beta=0.9]",
               "baseline": "expected_attention", "kind": k,
               "layers": RS.layer_error_ratios(rows, "jacap_prompt[tau=3,beta=0.9]", "expected_attention", 2048, 0.5,
                                        kind=None if k == "all" else k, n_resamples=999)} for k in ("all", "dialogue")]
    fig = V.layer_ratio_figure({"layers": layers})
    shown = {t.name: t.line.color for t in fig.data if t.showlegend is not False}
    assert set(shown) == {"all documents", "dialogue"} and len(set(shown.values())) == 2  # one colour per kind
    ax = fig.layout.yaxis
    assert ax.type == "log" and len(ax.tickvals) >= 2 and fig.layout.xaxis.title.text and ax.title.text
    assert V.log_tickvals([1.02, 1.05]) == [1, 1.5] and V.distance_labels([0, 8, 32]) == ["0–7", "8–31"]


@pytest.mark.parametrize("argv,msg", [
    (["--ratio", "1.5"], "--ratio"),
    (["--length", "300"], "not a cell of the evaluation"),
    (["--per-kind", "0"], "--per-kind"),
    (["--docs", "dialogue/nosuch"], "not dev documents"),
    (["--out", "{tmp}/x.txt"], "must end in .json"),
    (["--dir", "{tmp}/empty"], "does not exist"),
    (["--extend"], "run without --extend first"),
])
def test_bad_calls_are_refused_before_any_work(argv, msg, tmp_path, monkeypatch, capsys):
    import jacap_lib.models

    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(jacap_lib.models, "load_model", boom)
    out = tmp_path / "out"
    out.mkdir()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(out / "a.json")]
    with pytest.raises(SystemExit) as e:
        cli.main(["evaluate", "anatomy", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and err.startswith("usage: jacap evaluate anatomy ")
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_gap_splits_into_protection_and_score_that_multiply_to_it():
    rng = np.random.default_rng(0)
    docs = []
    for i in range(6):
        d, b, jb, bj = rng.uniform(0.01, 0.3, 4)
        docs.append({"kind": "x", "kl": {"default": {"kl": d}, "baseline": {"kl": b},
                                         "jacap_baseline_protection": {"kl": jb}, "baseline_jacap_protection": {"kl": bj}}})
    parts = {p["part"]: p for p in RS.decompose_gap(docs, n_resamples=999)}
    total = parts["total"]["ratio"]
    want = math.exp(np.mean([math.log(x["kl"]["default"]["kl"] / x["kl"]["baseline"]["kl"]) for x in docs]))
    assert total == pytest.approx(want, rel=1e-12)
    assert parts["protection (Jacap's score)"]["ratio"] * parts["score (the baseline's protection)"]["ratio"] \
        == pytest.approx(total, rel=1e-12)
    assert parts["score (Jacap's protection)"]["ratio"] * parts["protection (the baseline's score)"]["ratio"] \
        == pytest.approx(total, rel=1e-12)
    assert all(p["low"] <= p["ratio"] <= p["high"] and p["verdict"] for p in parts.values())


def test_kept_positions_read_back_from_the_cache_are_the_presses_top_k(tiny_llama):
    """On a tiny model: the positions read back for KNorm are the budget smallest key norms of every layer and
    head, computed from the captured keys; the baseline under Jacap's protection keeps the window too."""
    from kvpress import KnormPress

    from jacap_lib.measure.quality import capture_prefill
    from jacap_lib.measure.instruments import ProtectedPress

    torch.manual_seed(1)
    ids = torch.randint(0, 96, (1, 48))
    cap = capture_prefill(tiny_llama, ids)
    kept = M.kept_positions(tiny_llama, cap, KnormPress(compression_ratio=0.5))
    assert kept.shape == (2, 2, 24)
    for layer, rec in enumerate(cap.layers):
        norms = rec["keys"][0].norm(dim=-1)  # (H, N)
        want = norms.topk(24, dim=-1, largest=False).indices.sort(-1).values
        assert torch.equal(kept[layer], want)
    prot = M.kept_positions(tiny_llama, cap, ProtectedPress(press=KnormPress(compression_ratio=0.5),
                                                            compression_ratio=0.5, n_sink=2, window=6))
    mask = M.kept_mask(prot, 48)
    assert bool(mask[..., :2].all()) and bool(mask[..., -6:].all()) and prot.shape == (2, 2, 24)


def test_window_attention_centre_is_the_models_own_attention_of_the_last_queries(tiny_llama):
    """JacapWindowAttentionPress's centre equals the attention weights the model itself reports (eager attention) for the
    last obs_window queries, averaged over them and over each KV head's query heads."""
    import copy

    from jacap_lib.hf import decoder_layers_of
    from jacap_lib.measure.quality import capture_prefill
    from jacap_lib.measure.instruments import JacapWindowAttentionPress

    torch.manual_seed(2)
    ids = torch.randint(0, 96, (1, 40))
    cap = capture_prefill(tiny_llama, ids)
    press = JacapWindowAttentionPress(compression_ratio=0.5, obs_window=8, n_future_positions=64)
    eager = copy.deepcopy(tiny_llama)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        att = eager(ids, output_attentions=True).attentions
        for layer, rec in enumerate(cap.layers):
            mod = decoder_layers_of(tiny_llama)[layer].self_attn
            got = press.window_attention_alpha(mod, rec["kwargs"]["hidden_states"], rec["keys"], rec["kwargs"])
            want = att[layer][:, :, -8:, :].mean(2).view(1, 2, 2, 40).mean(2)
            assert torch.allclose(got[..., :32], want[..., :32], atol=1e-6)
            assert bool((got[..., 32:] == 0).all())  # the window's own keys: left out by kvpress, weight 0
    with pytest.raises(ValueError, match="gqa"):
        JacapWindowAttentionPress(compression_ratio=0.5, gqa="mean")


def test_the_committed_file_agrees_with_the_summary_and_its_configuration():
    from jacap_lib.results import loaders

    data, summary = loaders.load_anatomy(), loaders.load_eval_summary()
    cfg, choices = data["config"], loaders.load_eval_choices()
    # measured against today's choices: the same fingerprint, or a search space that only added methods (Algorithm
    # 1's choice and the cell's best baseline unchanged)
    same = (cfg.get("fingerprint") == choices["fingerprint"]
            or (cfg["default"] == choices["chosen"]["jacap_prompt"]
                and cfg["baseline"] == choices["best_baseline"]["cells"][cfg["cell"]]["spec"]))
    if not same:
        pytest.skip("anatomy.json was measured against the tune choices of another search space (its baseline: "
                    f"{cfg['baseline']}); rerun `jacap evaluate anatomy` to judge today's losing cells")
    losing = {f"{r['length']}/{float(r['ratio'])}": r for r in RS.losing_cells(summary)}
    assert {e["cell"] for e in data["kinds"]} == set(losing) and cfg["cell"] in losing
    for e in data["kinds"]:  # the all-document ratio is the summary's own geometric-mean ratio, recomputed
        (all_docs,) = [k for k in e["kinds"] if k["kind"] == "all"]
        assert all_docs["ratio"] == pytest.approx(losing[e["cell"]]["gm_ratio"], rel=1e-3)
        assert all_docs["losses"] == losing[e["cell"]]["losses"]
    part = data.get("library_default")
    if RS.default_role(summary) not in (None, "algorithm 1"):  # the press JacapPromptPress() builds, on its own losing cells
        assert part is not None and part["role"] == RS.default_role(summary)
        own = {f"{r['length']}/{float(r['ratio'])}": r for r in RS.losing_cells(summary, part["role"])}
        assert {e["cell"] for e in part["kinds"]} == set(own)
        for e in part["kinds"]:
            (all_docs,) = [k for k in e["kinds"] if k["kind"] == "all"]
            assert all_docs["ratio"] == pytest.approx(own[e["cell"]]["gm_ratio"], rel=1e-3)
    keys = [s["key"] for s in cfg["settings"]]
    assert [d["doc"] for d in data["documents"]] == [d["id"] for d in cfg["documents"]]
    from jacap_lib.experiments.protocol import load_docs  # the job's default documents are the file's

    assert [d["id"] for d in cfg["documents"]] == [d["id"] for d in A.pick_documents(load_docs(), A.DEFAULT_PER_KIND)]
    assert all(list(d["kl"]) == keys for d in data["documents"])
    assert all(len(d["jaccard"]) == d["n_layers"] for d in data["documents"])


def test_layer_lines_count_layers_against_a_hand_built_anatomy():
    """layer_lines counts, per losing cell of all documents, the layers whose interval lies above / below 1 and
    how often layer 0 is above 1 and the largest: checked on a hand-built two-cell anatomy."""
    from jacap_lib.report.findings import layer_lines

    def lay(*triples):
        return [{"layer": i, "ratio": r, "low": lo, "high": hi} for i, (r, lo, hi) in enumerate(triples)]

    anatomy = {"layers": [
        {"kind": "all", "length": 512, "ratio": 0.5, "baseline": "b",
         "layers": lay((3.0, 2.0, 4.0), (1.5, 1.1, 2.0), (0.8, 0.7, 0.9))},
        {"kind": "dialogue", "length": 512, "ratio": 0.5, "baseline": "b", "layers": lay((9.0, 8.0, 10.0))},
        {"kind": "all", "length": 1024, "ratio": 0.5, "baseline": "b",
         "layers": lay((1.0, 0.9, 1.1), (2.0, 1.5, 2.5), (1.2, 1.1, 1.3))}]}
    lines = layer_lines(anatomy)
    assert len(lines) == 3  # two cells of all documents, then the layer-0 line
    assert "above 1 in 2 of 3 layers, below 1 in 1; layer 0: 3.00, largest: layer 0 (3.00), last layer: 0.80" in lines[0]
    assert "above 1 in 2 of 3 layers, below 1 in 0; layer 0: 1.00, largest: layer 1 (2.00)" in lines[1]
    assert lines[2].endswith("above 1 in 1 of 2 losing cells; it has the largest ratio of any layer in 1")


def test_swap_setting_lines_are_the_key_to_the_swap_tables_settings():
    from jacap_lib.viz import anatomy as V
    data = {"config": {"settings": [{"key": "default", "spec": "jacap_prompt", "changes": "nothing"},
                                    {"key": "tau_1", "spec": "jacap_prompt[tau=1]", "changes": "temperature 1"}]}}
    assert V.swap_setting_lines(data) == ["tau_1 = jacap_prompt[tau=1]: temperature 1"]


def test_kind_lines_name_the_largest_kind_and_count_it():
    """kind_lines: per cell the kind with the largest ratio and the kinds above 1, then the count for dialogue;
    checked on a hand-built two-cell anatomy."""
    def k(kind, ratio, low, losses=3, wins=1):
        return {"kind": kind, "ratio": ratio, "low": low, "high": ratio * 2, "losses": losses, "wins": wins}

    anatomy = {"kinds": [
        {"length": 512, "ratio": 0.5, "kinds": [k("all", 1.5, 1.1), k("dialogue", 2.0, 1.2), k("prose", 1.1, 0.9)]},
        {"length": 1024, "ratio": 0.5, "kinds": [k("all", 1.2, 1.01), k("dialogue", 1.1, 0.8), k("code", 1.3, 1.05, 2, 2)]}]}
    lines = F.kind_lines(anatomy)
    assert lines[0] == ("prompt 512, c=0.5: largest ratio on dialogue (2.00, 3/4 lost); kinds whose interval lies "
                        "above 1: dialogue")
    assert lines[1].startswith("prompt 1024, c=0.5: largest ratio on code (1.30, 2/4 lost)") and lines[1].endswith(": code")
    assert lines[2] == "dialogue has the largest ratio in 1 of 2 losing cells; its interval lies above 1 in 1"


def test_swap_lines_report_the_paired_geometric_means_of_the_committed_file():
    """swap_lines' numbers are paired geometric means of the committed per-document KLs, recomputed by hand here
    (the flat statistics on the kinds other than dialogue; the centre over all documents)."""
    from jacap_lib.results import loaders

    docs = loaders.load_anatomy()["documents"]
    lines = F.swap_lines(docs)

    def gm(key, sel):
        return math.exp(np.mean([math.log(d["kl"][key]["kl"] / d["kl"]["default"]["kl"]) for d in sel]))

    others = [d for d in docs if d["kind"] != "dialogue"]
    assert max(map(len, lines)) <= 96  # short enough for the book's text column

    def numbers(label):  # the indented line under the first line naming `label`
        return lines[lines.index(label) + 1]

    flat = lines.index("statistics: flat instead of EMA (/ Algorithm 1 tuned):")
    flat_others = lines[flat:].index("  on the other kinds (/ Algorithm 1 tuned):") + flat
    assert lines[flat_others + 1].startswith(f"      {gm('flat_statistics', others):.2f} [")
    centre = numbers("centre = SnapKV's window attention of the last prompt queries (/ Algorithm 1 tuned):")
    assert centre.startswith(f"    {gm('window_attention_centre', docs):.2f} [")
    assert numbers("temperature 10 (/ Algorithm 1 tuned):").startswith(f"    {gm('tau_10', docs):.2f} [")


def test_future_statistics_are_the_moments_of_the_continuations_own_queries(tiny_llama):
    """future_statistics = the flat mean and variance of the queries the model computes on the continuation, at their
    own positions (recomputed here from an independent capture of the whole sequence), pooled per KV head."""
    from jacap_lib.hf import capture_heads

    torch.manual_seed(3)
    prompt, cont = torch.randint(0, 96, (1, 30)), torch.randint(0, 96, (1, 10))
    got = M.future_statistics(tiny_llama, prompt, cont, eps=1e-9)
    per_head = M.future_statistics(tiny_llama, prompt, cont, group=False, eps=1e-9)
    caps = capture_heads(tiny_llama, torch.cat([prompt, cont], dim=-1))
    for layer, cap in caps.items():
        q = cap.queries[:, 30:].double()  # (H_q = 4, 10, d)
        mu_h, var_h = q.mean(1), q.var(1, unbiased=False)
        assert torch.allclose(per_head[layer][0].double(), mu_h, atol=1e-5)
        assert torch.allclose(per_head[layer][1].double(), var_h.clamp_min(1e-9), atol=1e-5)
        # pooled: the equal mixture of the two query heads of each KV head
        mu = mu_h.view(2, 2, -1).mean(1)
        var = (var_h + mu_h.square()).view(2, 2, -1).mean(1) - mu.square()
        assert torch.allclose(got[layer][0].double(), mu, atol=1e-5)
        assert torch.allclose(got[layer][1].double(), var.clamp_min(1e-9), atol=1e-5)
    with pytest.raises(ValueError, match="continuation_ids"):
        M.future_statistics(tiny_llama, prompt, cont[:, :0])


def test_given_statistics_press_scores_as_jacap_with_those_statistics(tiny_llama):
    """Handed the very statistics JacapPromptPress estimates from the prompt, the given-statistics press keeps the same
    tokens; handed the continuation's (the oracle), it scores what Jacap's own components give at those moments."""
    from jacap_lib.hf import decoder_layers_of
    from jacap_lib.measure.quality import capture_prefill
    from jacap_lib.presses.jacap import JacapPromptPress
    from jacap_lib.measure.instruments import JacapGivenStatisticsPress

    torch.manual_seed(4)
    ids = torch.randint(0, 96, (1, 40))
    cap = capture_prefill(tiny_llama, ids)
    opts = dict(compression_ratio=0.5, centre="tempered", tau=3.0, beta=0.9, n_sink=2, window=4)
    jacap = JacapPromptPress(**opts)
    mods = [layer.self_attn for layer in decoder_layers_of(tiny_llama)]
    inputs = [(m, r["kwargs"]["hidden_states"], r["keys"], r["values"], r["kwargs"]) for m, r in zip(mods, cap.layers)]
    with torch.inference_mode():  # the captured hidden states are inference tensors
        own = {i: tuple(x[0] for x in jacap.query_statistics(m, h, k, kw)) for i, (m, h, k, v, kw) in enumerate(inputs)}
        given = JacapGivenStatisticsPress(**opts, statistics=own)
        assert torch.equal(M.kept_positions(tiny_llama, cap, given), M.kept_positions(tiny_llama, cap, jacap))
        oracle = M.future_statistics(tiny_llama, ids, torch.randint(0, 96, (1, 12)))
        given.set_statistics(oracle)
        for i, (m, h, k, v, kw) in enumerate(inputs):
            mu, lam = (x.unsqueeze(0) for x in oracle[i])
            want = jacap.protect(jacap.components(k, v, mu, lam, m).score, h, k, kw)
            assert torch.allclose(given.score(m, h, k, v, None, kw), want)
        with pytest.raises(ValueError, match="no entry for layer 1"):
            JacapGivenStatisticsPress(**opts, statistics={0: oracle[0]}).score(*inputs[1][:4], None, inputs[1][4])
    with pytest.raises(ValueError, match="statistics"):
        given.set_statistics({})


def test_document_kl_hands_the_oracle_press_the_documents_continuation_statistics(tiny_llama, monkeypatch):
    from jacap_lib.measure.instruments import JacapGivenStatisticsPress

    seen = []
    real = M.future_statistics
    monkeypatch.setattr(M, "future_statistics", lambda *a, **k: seen.append((a[1].shape[-1], a[2].shape[-1]))
                        or real(*a, **k))

    press = JacapGivenStatisticsPress(compression_ratio=0.5, centre="tempered", window=4)
    text = "".join(chr(33 + (i * 7) % 90) for i in range(80))
    out = M.document_kl(tiny_llama, CharTokenizer(), text, length=40, continuation=8, presses={"oracle": press})
    assert seen == [(40, 8)] and math.isfinite(out["oracle"]["kl"]) and set(press.statistics) == {0, 1}


def test_the_ladder_steps_multiply_to_the_whole_ladder_and_each_is_paired_to_the_step_before():
    rng = np.random.default_rng(5)
    docs = [{"doc": f"d{i}", "kind": "dialogue" if i < 4 else "prose",
             "kl": {k: {"kl": float(rng.uniform(0.01, 1.0))} for k in RS.LADDER}} for i in range(8)]
    steps = RS.ladder_ratios(docs)
    assert [(r["previous"], r["key"]) for r in steps] == list(zip(RS.LADDER, RS.LADDER[1:]))
    for r in steps:  # each step: the geometric mean of its per-document ratios to the step before
        a = np.array([d["kl"][r["key"]]["kl"] / d["kl"][r["previous"]]["kl"] for d in docs])
        assert r["ratio"] == pytest.approx(math.exp(np.log(a).mean())) and r["lower"] == int((a < 1).sum())
        assert r["low"] <= r["ratio"] <= r["high"]
    whole = np.array([d["kl"][RS.LADDER[-1]]["kl"] / d["kl"]["default"]["kl"] for d in docs])
    assert math.prod(r["ratio"] for r in steps) == pytest.approx(math.exp(np.log(whole).mean()))
    assert len(RS.ladder_ratios(docs, kind="dialogue")) == len(steps) and RS.ladder_ratios(docs, kind="dialogue")[0]["n"] == 4
    lines = F.ladder_lines(docs)
    assert lines[2] == "all documents (8):" and "dialogue (4):" in lines and "the other kinds (4):" in lines
    assert lines[3].startswith(f"  ea_centre: {steps[0]['ratio']:.2f} [") and lines[4].startswith("      adjusted: ")
    # the rungs as lines: each names the option it adds to the rung before
    cfg = {"settings": [{"key": x["key"], "spec": x["spec"], "changes": x["changes"]} for x in A.swap_settings(
        "jacap_prompt[beta=0.9,centre=tempered,tau=3,window=128]", "expected_attention[n_future_positions=32]")]}
    rungs = F.ladder_setting_lines(cfg)
    assert rungs[0] == "ea_centre (+ centre=ea)" and "ea_alpha_kappa_identity_horizon_flat (+ beta=none)" in rungs
    assert all(len(line) <= 96 for line in rungs if line.startswith("    "))
    for d in docs:
        del d["kl"]["ea_alpha"]
    with pytest.raises(ValueError, match="--extend"):
        RS.ladder_ratios(docs)


def test_a_stopped_run_resumes_the_documents_of_its_partial_file_with_the_same_text(tmp_path):
    from jacap_lib.results import files

    partial = tmp_path / "anatomy.json.partial"
    assert A._resumable(partial, [{"id": "a", "sha256": "1"}]) == {}  # no file: nothing to resume
    recs = [{"doc": "a", "kind": "prose", "sha256": "1", "kl": {"default": {"kl": 0.1}}},
            {"doc": "b", "kind": "prose", "sha256": "2", "kl": {"default": {"kl": 0.2}}},
            {"doc": "c", "kind": "prose", "sha256": "3", "kl": {"default": {"kl": 0.3}}}]
    files.write_json(partial, {"documents": recs})
    docs = [{"id": "a", "sha256": "1"}, {"id": "b", "sha256": "changed"}, {"id": "d", "sha256": "4"}]
    assert A._resumable(partial, docs) == {"a": recs[0]}  # b's text changed, c is not asked for
    partial.write_text("{not json")
    assert A._resumable(partial, docs) == {}


def test_a_press_field_holding_data_is_recorded_by_what_it_holds():
    import json

    from jacap_lib.measure.instruments import JacapGivenStatisticsPress
    from jacap_lib.presses.registry import method_options

    press = JacapGivenStatisticsPress(compression_ratio=0.5, statistics={0: (torch.zeros(2, 4), torch.ones(2, 4))})
    rec = method_options(press)
    assert rec["statistics"] == "(mu, lam) per layer, handed in per prompt" and rec["window"] == press.window
    json.dumps(rec)  # JSON-safe: the run's configuration can be written


def test_kind_pairs_are_paired_geometric_means_on_one_kind_with_cell_adjusted_verdicts():
    """kind_pairs on hand-built rows: per cell, on the documents of one kind only, the paired geometric mean of
    setting / reference (None: the cell's best baseline) recomputed by hand, a verdict (from the interval adjusted for
    the cells), the documents where the setting is lower; the frame has one row per cell and pair."""
    from jacap_lib.viz import anatomy as VA

    rng = np.random.default_rng(0)
    rows = []
    for L in (512, 1024):
        for i in range(8):
            kind = "dialogue" if i < 5 else "code"
            base = float(rng.uniform(0.1, 1.0))
            for m, f in (("x", 0.5 if kind == "dialogue" else 3.0), ("y", 1.0), ("b", 2.0)):
                rows.append({"doc": f"d{i}", "kind": kind, "length": L, "ratio": 0.5, "method": m,
                             "kl": base * f * float(rng.uniform(0.9, 1.1))})
    choices = {"best_baseline": {"cells": {f"{L}/0.5": {"length": L, "ratio": 0.5, "spec": "b"} for L in (512, 1024)}}}
    out = RS.kind_pairs(rows, choices, {"x / baseline": ("x", None), "x / y": ("x", "y")}, kind="dialogue")
    assert [(r["length"], r["pair"], r["reference"]) for r in out] == [
        (512, "x / baseline", "b"), (512, "x / y", "y"), (1024, "x / baseline", "b"), (1024, "x / y", "y")]
    for r in out:
        kl = {(q["doc"], q["method"]): q["kl"] for q in rows if q["length"] == r["length"] and q["kind"] == "dialogue"}
        logs = [math.log(kl[(d, "x")] / kl[(d, r["reference"])]) for d, m in kl if m == "x"]
        assert len(logs) == r["n"] == 5 and r["wins"] == 5
        assert r["gm_ratio"] == pytest.approx(math.exp(np.mean(logs)), rel=1e-9)
        assert r["gm_low"] <= r["gm_ratio"] <= r["gm_high"] < 1 and r["verdict"].startswith("better by")
        assert r["gm_low_adjusted"] <= r["gm_low"] and r["cells_judged"] == 2  # adjusted for the two cells
    frame = VA.kind_pair_frame(out)
    assert list(frame.columns) == ["KL ratio [95 % CI]", "verdict (adjusted)"] and len(frame) == 4
    assert frame.loc[(512, 0.5, "x / y"), "KL ratio [95 % CI]"].startswith(f"{out[1]['gm_ratio']:.2f} [")
    assert frame.loc[(512, 0.5, "x / y"), "verdict (adjusted)"].startswith("better ")
