"""The frozen candidates (results.candidates): the rule's Jacap-family default and the best baseline are the argmin of
the tune scores recomputed from rows, spaces chosen under other configurations are refused, an unfinished space
keeps the file unfrozen, and the committed file agrees with the committed choices."""
from __future__ import annotations

import json
import math

import pytest

from jacap_lib.experiments import candidates as C
from jacap_lib.experiments.protocol import rules as P
from jacap_lib.experiments.protocol.choices import write_choices
from jacap_lib.results.paths import data_path

DOCS = [{"id": f"d{i}", "sha256": f"s{i}", "split": "tune"} for i in range(3)]


def _config(space, **change):
    cfg = P.protocol_config(model={"name": "m", "sha256": "x"}, lengths=[16], ratios=[0.5, 0.9], continuation=4,
                            space=space, docs=DOCS)
    return {**cfg, **change}


def _rows(kl_of):
    return [{"method": spec, "doc": d["id"], "length": 16, "ratio": c, "split": "tune",
             "kl": kl_of(spec, i, c), "cpu_seconds": 1.0 + i}
            for spec in kl_of.specs for i, d in enumerate(DOCS) for c in (0.5, 0.9)]


class KL:
    def __init__(self, table):
        self.table, self.specs = table, list(table)

    def __call__(self, spec, i, c):
        return self.table[spec] * (1 + i) * (2 if c == 0.9 else 1)


def _choices(tmp_path, name, space, table, config=None):
    rows = _rows(KL(table))
    return write_choices(tmp_path / f"{name}.json", rows, config or _config(space), space), rows


def test_default_and_best_baseline_are_the_rule_argmin(tmp_path):
    first = {"snapkv": ("snapkv", "snapkv[window_size=16]"), "jacap_prompt": ("jacap_prompt", "jacap_prompt[window=64]"),
             "jacap_ea": ("jacap_ea",)}
    peers = {"kvzip": ("kvzip", "kvzip[n_sink=16]")}
    a, rows_a = _choices(tmp_path, "a", first, {"snapkv": 0.2, "snapkv[window_size=16]": 0.1, "jacap_prompt": 0.3,
                                                "jacap_prompt[window=64]": 0.05, "jacap_ea": 0.08})
    b, rows_b = _choices(tmp_path, "b", peers, {"kvzip": 0.01, "kvzip[n_sink=16]": 0.02})
    out = C.freeze({"first": a, "peers": b}, {"first": rows_a, "peers": rows_b}, spaces={"first": first, "peers": peers})
    # the rule score by hand: mean of log KL over the 6 rows
    want = sum(math.log(0.05 * (1 + i) * f) for i in range(3) for f in (1, 2)) / 6
    assert out["default"]["chosen"]["method"] == "jacap_prompt" and out["default"]["chosen"]["spec"] == "jacap_prompt[window=64]"
    assert out["default"]["chosen"]["tune_score"] == pytest.approx(want, abs=1e-12)
    assert out["best_baseline"]["method"] == "kvzip" and out["pending"] == [] and out["frozen"] is True
    assert out["methods"]["snapkv"]["spec"] == "snapkv[window_size=16]"
    assert out["methods"]["kvzip"]["tune_cpu_seconds_per_row"] == pytest.approx(2.0)  # mean of 1, 2, 3
    assert out["default"]["jacap_press_today"]["same_press_as_chosen"] is False
    # jacap_prompt[window=64] is not JacapPromptPress() (window 16, observed centre), nor JacapPress() (the context press)
    assert out["default"]["prompt_press_today"] == {"same_press_as_chosen": False, "equals": None}


def test_missing_space_is_pending_and_other_configurations_are_refused(tmp_path):
    first = {"jacap_prompt": ("jacap_prompt",)}
    peers = {"kvzip": ("kvzip",)}
    a, _ = _choices(tmp_path, "a", first, {"jacap_prompt": 0.3})
    out = C.freeze({"first": a}, spaces={"first": first, "peers": peers})
    assert out["pending"] == ["kvzip"] and out["frozen"] is False
    b, _ = _choices(tmp_path, "b", peers, {"kvzip": 0.1}, config=_config(peers, lengths=[32]))
    with pytest.raises(ValueError, match="lengths"):
        C.freeze({"first": a, "peers": b}, spaces={"first": first, "peers": peers})
    with pytest.raises(ValueError, match="no choices"):
        C.freeze({})


def test_committed_candidates_agree_with_the_committed_choices():
    path = data_path("results", "eval", "candidates.json", must_exist=False)
    if not path.is_file():
        pytest.skip("no candidates.json committed")
    data = json.loads(path.read_text())
    for space, p in C.choice_files(path.parent).items():
        ch = json.loads(p.read_text())
        assert data["spaces"][space]["fingerprint"] == ch["fingerprint"]
        for m, v in ch["choices"].items():
            assert data["methods"][m]["spec"] == v["chosen"] and data["methods"][m]["tune_score"] == v["score"]
    fam = data["default"]["eligible"]
    assert data["default"]["chosen"]["tune_score"] == min(e["tune_score"] for e in fam)
    # the rule's choice is what JacapPress() builds; the prompt press is jacap_obs's tune choice
    assert data["default"]["jacap_press_today"] == {"same_press_as_chosen": True, "equals": "jacap"}
    assert data["default"]["prompt_press_today"]["equals"] == "jacap_obs"


def test_score_table_ratios_are_geometric_mean_ratios_of_the_rows(tmp_path):
    """kl_ratio = exp(score difference) equals the geometric mean over the tune rows of KL_method / KL_default."""
    first = {"jacap_prompt": ("jacap_prompt",), "snapkv": ("snapkv",)}
    table = {"jacap_prompt": 0.1, "snapkv": 0.25}
    a, rows = _choices(tmp_path, "a", first, table)
    cand = C.freeze({"first": a}, spaces={"first": first})
    out = {r["method"]: r for r in C.score_table(cand)}
    by = {}
    for r in rows:
        by.setdefault(r["method"], {})[(r["doc"], r["ratio"])] = r["kl"]
    logs = [math.log(by["snapkv"][k] / by["jacap_prompt"][k]) for k in by["jacap_prompt"]]
    assert out["snapkv"]["kl_ratio"] == pytest.approx(math.exp(sum(logs) / len(logs)), rel=1e-12) == pytest.approx(2.5)
    assert out["jacap_prompt"]["kl_ratio"] == 1.0 and [r["method"] for r in C.score_table(cand)] == ["jacap_prompt", "snapkv"]


def test_tune_ratio_figure_draws_one_bar_per_method_in_its_colour():
    from jacap_lib.viz.field import tune_ratio_figure
    from jacap_lib.viz.style import METHOD_STYLES

    table = [{"method": "kvzip", "setting": "kvzip", "kl_ratio": 0.2}, {"method": "jacap_prompt", "setting": "jacap_prompt",
                                                                        "kl_ratio": 1.0}]
    fig = tune_ratio_figure(table, pending=["kvgrad"])
    assert [t.y[0] for t in fig.data] == ["jacap_prompt", "kvzip"]  # best at the top: drawn last
    assert fig.data[1].marker.color == METHOD_STYLES["kvzip"][0] and fig.layout.xaxis.type == "log"
    assert "kvgrad" in fig.layout.annotations[0].text
    with pytest.raises(ValueError, match="table"):
        tune_ratio_figure([])


def test_shared_ratio_is_the_geometric_mean_over_the_shared_rows_only():
    import math

    from jacap_lib.experiments.candidates import shared_ratio

    a = [{"doc": "d1", "length": 512, "ratio": 0.5, "method": "x", "kl": 0.02, "split": "tune"},
         {"doc": "d2", "length": 512, "ratio": 0.5, "method": "x", "kl": 0.08, "split": "tune"},
         {"doc": "d3", "length": 1024, "ratio": 0.5, "method": "x", "kl": 5.0, "split": "tune"},  # b lacks it
         {"doc": "d1", "length": 512, "ratio": 0.5, "method": "y", "kl": 9.0, "split": "tune"}]  # another spec
    b = [{"doc": "d1", "length": 512, "ratio": 0.5, "method": "k", "kl": 0.01, "split": "tune"},
         {"doc": "d2", "length": 512, "ratio": 0.5, "method": "k", "kl": 0.0, "split": "tune"},  # floored at 1e-8
         {"doc": "d2", "length": 512, "ratio": 0.5, "method": "k", "kl": 0.5, "split": "dev"}]  # not a tune row
    out = shared_ratio(a, "x", b, "k")
    assert out["n"] == 2
    assert out["gm_ratio"] == pytest.approx(math.sqrt((0.02 / 0.01) * (0.08 / 1e-8)))
    assert out["lengths"] == [512] and out["cells"] == [(512, 0.5)]
    with pytest.raises(ValueError, match="share no tune row"):
        shared_ratio(a, "y", b, "absent")


def test_eval_rows_of_each_space_come_from_its_own_folder():
    from jacap_lib.results import loaders as R
    from jacap_lib.experiments.protocol import rules as P

    for space, table in P.SPACES.items():
        if space == "first":
            continue  # its rows hold settings of earlier grids too (written out), so only the folder is checked below
        try:
            rows = R.load_eval_rows("tune", space=space)
        except FileNotFoundError:
            continue  # a space not measured yet
        specs = {s for v in table.values() for s in v} | set(P.REPLACED.get(space, ()))  # replaced: rows kept
        assert rows and {r["method"] for r in rows} <= specs, space
    assert R.load_eval_rows("tune", space="first") == R.load_eval_rows("tune")
    with pytest.raises(ValueError, match="space must be one of"):
        R.load_eval_rows("tune", space="nowhere")


def test_an_earlier_wording_of_the_rule_is_the_same_rule():
    """The first rounds' choices.json words the tie-break with "(the library default first)": the same rule, so
    freeze compares it with a later space's; any other difference still refuses."""
    from jacap_lib.experiments.protocol import rules as P

    old = next(iter(P.RULE_WORDINGS))
    assert old != P.RULE and P.same_rule(old, P.RULE) and P.same_rule(P.RULE, old)
    assert not P.same_rule(P.RULE, P.RULE.replace("1e-8", "1e-6")) and not P.same_rule(None, P.RULE)
