"""The evaluation protocol (jacap_lib.experiments.protocol.rules) and its jobs (jacap_lib.experiments.protocol,
`jacap evaluate`): comparable search spaces, the one selection rule against hand computations (ties
included), the replay of every method equal to kvpress's own path, resumable jobs, and a dev job that
refuses choices it cannot trust."""
import argparse
import hashlib
import json
import math
import re

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from jacap_lib import cli  # noqa: E402
from jacap_lib.measure.quality import (  # noqa: E402
    capture_prefill, compressed_forward, continue_from_cache, replay_press)
from jacap_lib.presses.registry import BASELINES, build_press, press_from_spec  # noqa: E402
from jacap_lib.experiments import protocol as E  # noqa: E402
from jacap_lib.results import files as io  # noqa: E402
from jacap_lib.experiments.protocol import rules as P  # noqa: E402
from jacap_lib.verdicts import intervals as verdicts  # noqa: E402
from conftest import CharTokenizer, sharpened_tiny_llama, write_corpus  # noqa: E402


# --------------------------------------------------------------------------------------------- search space
def test_search_space_budgets_are_comparable():
    counts = P.check_search_space()
    # every kvpress baseline of the registry is tuned (random: a floor with nothing to tune; the newer presses, PEERS,
    # not yet), and Jacap both ways
    from jacap_lib.presses.registry import PEERS

    assert set(BASELINES) - {"random"} - set(PEERS) <= set(counts) and {"jacap_prompt", "jacap_prompt_adakv"} <= set(counts)
    no_options = {"tova", "knorm", "keydiff"}
    from jacap_lib.presses.registry import ADAKV_BASELINES

    # each baseline whose scores differ across heads gets one more setting: kvpress AdaKV around its earlier choice
    adakv = {m: sum("adakv=true" in s for s in P.SEARCH_SPACE[m]) for m in counts}
    assert {m for m, n in adakv.items() if n} == set(ADAKV_BASELINES) and set(adakv.values()) == {0, 1}
    assert {m for m, n in counts.items() if n - adakv[m] == 1} == no_options
    # the knobs around the choice: two settings each (one value below, one above), counted by hand from the specs
    around = {m: sum(2 for _ in P.AROUND_CHOICE.get(m, ())) for m in counts}
    assert around == {"snapkv": 2, "streaming_llm": 0, "expected_attention": 2, "capkv": 2, "tova": 0, "knorm": 0,
                      "keydiff": 0, "jacap_prompt": 4, "jacap_prompt_adakv": 4, "jacap_obs": 2, "jacap_ea": 4}
    # each knob of AROUND_CHOICE has two settings that differ from the tune choice in that knob alone (read off the
    # built presses)
    from jacap_lib.presses.registry import method_options
    from jacap_lib.results.paths import repo_path

    chosen = json.loads((repo_path("data") / "results" / "eval" / "choices.json").read_text())["chosen"]
    for m, knobs in P.AROUND_CHOICE.items():
        if m not in P.SEARCH_SPACE:  # another space's method (jacap): its knobs come in its own second round
            continue
        base = method_options(press_from_spec(chosen[m], 0.5))
        for knob in knobs:
            values = []
            for spec in P.SEARCH_SPACE[m]:
                rec = method_options(press_from_spec(spec, 0.5))
                if rec["class"] != base["class"]:  # kvpress's head-adaptive wrapper: another setting
                    continue
                inner, binner = rec.get("press", rec), base.get("press", base)
                diff = {k for k in set(inner) | set(binner) if inner.get(k) != binner.get(k)} - {"compression_ratio"}
                if diff == {knob}:
                    values.append(inner[knob])
            assert len(values) == 2, (m, knob, values)  # around the choice of the round that placed them
    assert {n - adakv[m] - around[m] for m, n in counts.items() if m not in no_options} == {P.CONFIGS_PER_METHOD}
    # a baseline's grid starts at kvpress's defaults; Algorithm 1's (and its AdaKV budgets') at the paper's settings
    assert all(P.SEARCH_SPACE[m][0] == m for m in counts if m in BASELINES)
    assert P.SEARCH_SPACE["jacap_prompt"][0] == P.PAPER_PRESET


@pytest.mark.parametrize("change, match", [
    (lambda s: s.update(jacap_prompt=s["jacap_prompt"] + ("jacap_prompt[tau=5]",)), "has 6 settings"),
    # tau moved at the choice's window is a main-grid setting, not one around the window
    (lambda s: s.update(jacap_prompt=s["jacap_prompt"] + ("jacap_prompt[beta=0.9,centre=tempered,tau=5,window=128]",)), "has 6 settings"),
    (lambda s: s.update(jacap_prompt=s["jacap_prompt"] + ("jacap_prompt[beta=0.9,centre=tempered,tau=3,window=64]",)),
     "3 settings of 'window'"),
    (lambda s: s.update(jacap_obs=s["jacap_obs"] + ("jacap_obs[n_sink=2,window=16]",)), "3 settings of 'n_sink'"),
    (lambda s: s.update(snapkv=s["snapkv"][:-1]), "1 settings of 'kernel_size'"),
    (lambda s: s.update(snapkv=s["snapkv"][:2]), "exactly 5"),
    (lambda s: s.update(snapkv=("snapkv[window_size=32]", "snapkv", "snapkv[window_size=16]")), "kvpress's default"),
    (lambda s: s.update(jacap_prompt=("jacap_prompt", "jacap_prompt[tau=3,beta=0.9]", "jacap_prompt[beta=0.9,tau=3]")), "twice"),
    (lambda s: s.update(capkv=("capkv", "capkv[tau=2]", "snapkv[window_size=8]")), "names 'snapkv'"),
    (lambda s: s.update(capkv=("capkv", "capkv[tau=2]", "capkv[bogus=1]")), "unknown option"),
    (lambda s: s.update(tova=("tova", "tova")), "twice"),
    (lambda s: s.update(knorm=("knorm", "knorm[adakv=true]", "knorm[adakv=1]")), "must be True or False"),
    (lambda s: s.update(snapkv=s["snapkv"] + ("snapkv[adakv=true]", "snapkv[adakv=true,window_size=8]")), "offered once"),
    (lambda s: s.update(tova=("tova", "tova[adakv=true]")), "only to the baselines whose scores differ"),
])
def test_search_space_check_fails_on_unequal_or_bad_budgets(change, match):
    space = dict(P.SEARCH_SPACE)
    change(space)
    with pytest.raises(ValueError, match=match):
        P.check_search_space(space, configs_per_method=P.CONFIGS_PER_METHOD)


# --------------------------------------------------------------------------------------------- the rule
def _rows(table, split="tune"):
    """``{spec: {(doc, L, c): kl}}`` -> rows."""
    return [{"method": s, "doc": d, "length": L, "ratio": c, "kl": kl, "split": split}
            for s, per in table.items() for (d, L, c), kl in per.items()]


KEYS = [("a", 512, 0.5), ("b", 512, 0.5), ("a", 1024, 0.9), ("b", 1024, 0.9)]


def test_rule_picks_what_a_hand_computation_picks():
    e = math.e
    table = {
        # logs: default 0,0,0,0 -> 0;  x: -1,+1,-1,-1 -> -0.5;  y: -2,+2,-1,-1 -> -0.5 (tie with x: x listed first)
        "snapkv": dict(zip(KEYS, [1.0, 1.0, 1.0, 1.0])),
        "snapkv[window_size=32]": dict(zip(KEYS, [1 / e, e, 1 / e, 1 / e])),
        "snapkv[window_size=16]": dict(zip(KEYS, [e ** -2, e ** 2, 1 / e, 1 / e])),
        # the mean KL would prefer this one (mean 0.5 < 1) but its geometric mean is 1: log score 0, tie with default
        "streaming_llm": dict(zip(KEYS, [0.25, 0.25, 0.5, 1.0 / (0.25 * 0.25 * 0.5)])),
        "streaming_llm[n_sink=1]": dict(zip(KEYS, [1.0, 1.0, 1.0, 1.0])),
        # a KL of exactly 0 counts as the floor, 1e-8
        "knorm": dict(zip(KEYS, [0.0, 1.0, 1.0, 1.0])),
    }
    space = {"snapkv": ("snapkv", "snapkv[window_size=32]", "snapkv[window_size=16]"),
             "streaming_llm": ("streaming_llm", "streaming_llm[n_sink=1]"), "knorm": ("knorm",)}
    res = P.choose_settings(_rows(table) + _rows({"snapkv": dict(zip(KEYS, [1e-6] * 4))}, split="dev"), space)
    assert res["snapkv"]["chosen"] == "snapkv[window_size=32]"
    assert res["snapkv"]["score"] == pytest.approx(-0.5, abs=1e-12)
    assert [c["score"] for c in res["snapkv"]["candidates"]] == pytest.approx([0.0, -0.5, -0.5], abs=1e-12)
    assert res["streaming_llm"]["chosen"] == "streaming_llm"  # tie: the default, listed first
    assert res["knorm"]["score"] == pytest.approx(math.log(1e-8) / 4)
    assert res["snapkv"]["n"] == 4  # the dev rows were not used
    # same table, the tied pair listed the other way round: the rule follows the table order
    flipped = {"snapkv": ("snapkv", "snapkv[window_size=16]", "snapkv[window_size=32]")}
    assert P.choose_settings(_rows(table), flipped)["snapkv"]["chosen"] == "snapkv[window_size=16]"


def test_rule_refuses_unfinished_or_bad_tables():
    table = {"snapkv": dict(zip(KEYS, [1.0] * 4)), "snapkv[window_size=32]": dict(zip(KEYS[:3], [0.5] * 3))}
    with pytest.raises(ValueError, match="different"):
        P.choose_settings(_rows(table), {"snapkv": tuple(table)})
    with pytest.raises(ValueError, match="no tune rows"):
        P.choose_settings(_rows(table), {"snapkv": ("snapkv", "snapkv[window_size=8]")})
    with pytest.raises(ValueError, match="finite"):
        P.selection_score([0.1, float("nan")])


def test_best_baseline_per_cell_on_tune_and_on_dev():
    chosen = {"snapkv": "snapkv[window_size=32]", "tova": "tova", "knorm": "knorm", "jacap_prompt": "jacap_prompt"}
    cells = [("a", 512, 0.5), ("b", 512, 0.5), ("a", 512, 0.9), ("b", 512, 0.9)]
    tune = {"snapkv[window_size=32]": dict(zip(cells, [0.1, 0.4, 1.0, 1.0])),   # 512/0.5: geo 0.2; 512/0.9: 1
            "tova": dict(zip(cells, [0.2, 0.2, 2.0, 0.5])),                     # 512/0.5: 0.2 (tie); 512/0.9: 1 (tie)
            "knorm": dict(zip(cells, [0.3, 0.3, 0.9, 1.0])),                    # 512/0.9: geo sqrt(0.9) < 1
            "jacap_prompt": dict(zip(cells, [0.01] * 4)),                              # not a baseline
            "snapkv": dict(zip(cells, [0.001] * 4))}                            # not the chosen setting
    best = P.best_baseline_per_cell(_rows(tune), chosen)
    assert best["512/0.5"]["method"] == "snapkv"  # tie at geo 0.2: snapkv comes first in `chosen`
    assert best["512/0.5"]["score"] == pytest.approx(math.log(0.2))
    assert best["512/0.9"]["method"] == "knorm" and best["512/0.9"]["n_docs"] == 2
    assert set(best["512/0.9"]["scores"]) == {"snapkv", "tova", "knorm"}
    dev = {"snapkv[window_size=32]": dict(zip(cells, [1.0] * 4)), "tova": dict(zip(cells, [0.5] * 4)),
           "knorm": dict(zip(cells, [2.0] * 4))}
    lines = E.best_baselines({"best_baseline": {"cells": best}, "chosen": chosen}, _rows(dev, split="dev"))
    assert {c["method"] for c in lines["dev"]["cells"].values()} == {"tova"}
    assert "dev" in lines["dev"]["label"] and lines["tune"]["cells"] is best
    with pytest.raises(ValueError, match="lacks rows"):
        P.best_baseline_per_cell(_rows({**tune, "tova": dict(zip(cells[:3], [1.0] * 3))}), chosen)


# --------------------------------------------------------------------------------------------- replay == kvpress
# every method of the search space, sized for the tiny model (prompt 48: windows that leave the score a choice)
REPLAY_SPECS = ["jacap_prompt[window=4]", "jacap_prompt[window=4,noise=deff,deff_frac=0.25,tau=3,beta=0.9]", "jacap_prompt_adakv[window=4]", "snapkv[window_size=8]",
                "knorm", "keydiff", "tova", "streaming_llm[n_sink=2]", "expected_attention[n_future_positions=16]",
                "expected_attention[use_covariance=false,use_vnorm=false]", "capkv[tau=10]"]


@pytest.fixture(scope="module")
def tiny():
    model = sharpened_tiny_llama()
    ids = torch.randint(0, 96, (1, 48 + 12), generator=torch.Generator().manual_seed(3))
    return model, ids[:, :48], ids[:, 48:]


@pytest.mark.parametrize("spec", REPLAY_SPECS)
def test_replay_equals_the_kvpress_path(tiny, spec):
    """The cache replayed on one captured prefill (the press's own hook, layer by layer) holds the same keys
    and values, and the continuation the same log-probabilities (rtol 1e-5, atol 1e-6), as running the press
    the kvpress way, ``with press(model): model(prompt)``."""
    from transformers import DynamicCache

    model, prompt, cont = tiny
    cap = capture_prefill(model, prompt)
    for ratio in (0.5, 0.75):
        real_cache = DynamicCache()
        with press_from_spec(spec, ratio)(model), torch.inference_mode():
            model(input_ids=prompt, past_key_values=real_cache, use_cache=True)
        real_masks = [getattr(l.self_attn, "masked_key_indices", None) for l in model.model.layers]
        cache = replay_press(model, cap, press_from_spec(spec, ratio))
        masks = [getattr(l.self_attn, "masked_key_indices", None) for l in model.model.layers]
        for a, b in zip(cache.layers, real_cache.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        for m, r in zip(masks, real_masks):  # AdaKV: the same keys masked per head
            assert (m is None) == (r is None) and (m is None or all(torch.equal(x, y) for x, y in zip(m, r)))
        logq, attn, kept = continue_from_cache(model, cache, prompt.shape[1], cont)
        real_logq, real_attn, real_kept = compressed_forward(model, prompt, cont, press=press_from_spec(spec, ratio))
        torch.testing.assert_close(logq, real_logq, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(attn, real_attn, rtol=1e-5, atol=1e-6)
        assert kept == real_kept < prompt.shape[1]
        full, _, _ = compressed_forward(model, prompt, cont)
        assert (full.exp() * (full - logq)).sum(-1).mean() > 1e-6  # the eviction changed the output


# --------------------------------------------------------------------------------------------- the jobs
SPACE = {"knorm": ("knorm",), "snapkv": ("snapkv", "snapkv[window_size=8]"), "jacap_prompt": ("jacap_prompt", "jacap_prompt[tau=3]")}


@pytest.fixture
def corpus(tmp_path):
    """A manifest of 2 tune + 2 dev documents of ~200 characters."""
    return write_corpus(tmp_path, ["tune", "tune", "dev", "dev"])


def _parse(job, argv):
    ap = argparse.ArgumentParser()
    E.add_arguments(ap, job)
    args = ap.parse_args(argv)
    args.job = job
    return args


def _args(job, corpus, out, *extra):
    return _parse(job, ["--manifest", str(corpus), "--dir", str(out), "--lengths", "80", "96",
                        "--ratios", "0.5", "0.75", "--continuation", "8", "--no-progress", *extra])


def test_tune_then_dev_jobs_resume_and_choose(tiny, corpus, tmp_path, monkeypatch):
    model = tiny[0]
    tok = CharTokenizer()
    monkeypatch.setattr(P, "SEARCH_SPACE", SPACE)
    monkeypatch.setitem(P.SPACES, "first", SPACE)  # the jobs read the table by its --space name
    out = tmp_path / "eval"
    plan = E.prepare(_args("tune", corpus, out), tokenizer=tok)
    res = E.execute(plan, model=model, tokenizer=tok)
    rows = io.read_jsonl(out / "tune.jsonl")
    assert res["rows_written"] == len(rows) == 2 * 2 * 2 * 5  # tune docs x lengths x ratios x settings
    assert {r["split"] for r in rows} == {"tune"}
    assert all(r["kl"] >= 0 and 0 <= r["top1_agreement"] <= 1 and r["attn_rel_error"] >= 0 for r in rows)
    assert all(r["kept_tokens"] == int(r["length"] * (1 - r["ratio"])) for r in rows)
    # the choices are the rule's on the written rows
    choices = json.loads((out / "choices.json").read_text())
    assert choices["chosen"] == {m: v["chosen"] for m, v in P.choose_settings(rows, SPACE).items()}
    assert choices["fingerprint"] == P.fingerprint(plan.config)
    assert set(choices["best_baseline"]["cells"]) == {"80/0.5", "80/0.75", "96/0.5", "96/0.75"}
    cfg = io.read_runs(out / "tune.jsonl")[0]
    assert cfg["settings"]["jacap_prompt[tau=3]"]["tau"] == 3 and cfg["protocol"]["continuation"] == 8
    assert cfg["versions"]["kvpress"] and cfg["documents"][0]["sha256"]
    # a rerun measures nothing; a dropped row is measured again, with the same value
    calls = []
    import jacap_lib.measure.quality as Q
    real = Q.next_token_kl
    monkeypatch.setattr(Q, "next_token_kl", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert E.execute(E.prepare(_args("tune", corpus, out), tokenizer=tok), model=model, tokenizer=tok)["rows_written"] == 0
    assert not calls
    (out / "tune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    assert E.execute(E.prepare(_args("tune", corpus, out), tokenizer=tok), model=model, tokenizer=tok)["rows_written"] == 1
    assert io.read_jsonl(out / "tune.jsonl")[-1]["kl"] == pytest.approx(rows[-1]["kl"], rel=1e-6)
    # the dev job: each method's chosen setting on the dev documents only
    E.execute(E.prepare(_args("dev", corpus, out), tokenizer=tok), model=model, tokenizer=tok)
    dev_rows = io.read_jsonl(out / "dev.jsonl")
    want = set(E.dev_specs(choices["chosen"]))  # the choices, plus the paper preset when Jacap's choice differs
    assert {r["method"] for r in dev_rows} == want and set(choices["chosen"].values()) <= want
    assert {r["split"] for r in dev_rows} == {"dev"} and len(dev_rows) == 2 * 2 * 2 * len(want)


def test_dev_job_refuses_missing_or_foreign_choices(tiny, corpus, tmp_path, monkeypatch, capsys):
    tok = CharTokenizer()
    monkeypatch.setattr(P, "SEARCH_SPACE", SPACE)
    monkeypatch.setitem(P.SPACES, "first", SPACE)
    out = tmp_path / "eval"
    with pytest.raises(ValueError, match="does not exist.*evaluate tune"):
        E.prepare(_args("dev", corpus, out), tokenizer=tok)
    # through the command line: exit 2, nothing written
    with pytest.raises(SystemExit) as e:
        cli.main(["evaluate", "dev", "--manifest", str(corpus), "--dir", str(out), "--lengths", "48",
                  "--continuation", "8"])
    assert e.value.code == 2 and not out.exists()
    assert "evaluate tune" in capsys.readouterr().err
    E.execute(E.prepare(_args("tune", corpus, out), tokenizer=tok), model=tiny[0], tokenizer=tok)
    E.prepare(_args("dev", corpus, out), tokenizer=tok)  # the same configuration: accepted
    # a --methods stage has the whole table's configuration, so it reads the same choices and runs only its methods
    stage = E.prepare(_args("dev", corpus, out, "--methods", "knorm", "snapkv"), tokenizer=tok)
    assert list(stage.space) == ["knorm", "snapkv"] and stage.config["search_space"] == {m: list(v) for m, v in SPACE.items()}
    # a method whose choice is missing is refused by name, unless the stage leaves it out
    path = out / "choices.json"
    saved = path.read_text()
    data = json.loads(saved)
    del data["chosen"]["jacap_prompt"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"no choice for \['jacap_prompt'\].*--methods"):
        E.prepare(_args("dev", corpus, out), tokenizer=tok)
    E.prepare(_args("dev", corpus, out, "--methods", "knorm"), tokenizer=tok)
    path.write_text(saved)
    for extra, what in ((["--continuation", "9"], "continuation"), (["--ratios", "0.5"], "ratios")):
        args = _args("dev", corpus, out, *extra)
        with pytest.raises(ValueError, match=f"different configuration.*{what}"):
            E.prepare(args, tokenizer=tok)
    # a corpus whose split or text changed is a different configuration too
    man = json.loads(corpus.read_text())
    man["documents"][0]["split"], man["documents"][2]["split"] = "dev", "tune"
    corpus.write_text(json.dumps(man))
    with pytest.raises(ValueError, match="different configuration.*dev_docs.*tune_docs"):
        E.prepare(_args("dev", corpus, out), tokenizer=tok)
    assert not (out / "dev.jsonl").exists()


def test_bad_options_raise_before_work(corpus, tmp_path):
    tok = CharTokenizer()
    for extra, match in ((["--ratios", "1.0"], "ratios"), (["--lengths", "8"], "lengths"),
                         (["--methods", "nope"], "methods"), (["--workers", "0"], "workers")):
        args = _parse("tune", ["--manifest", str(corpus), "--dir", str(tmp_path / "x"), "--lengths", "48",
                               "--continuation", "8", *extra])
        with pytest.raises(ValueError, match=match):
            E.prepare(args, tokenizer=tok)
    args = _args("tune", corpus, tmp_path / "x")
    args.lengths = [400]
    with pytest.raises(ValueError, match="fewer than 408 tokens"):
        E.prepare(args, tokenizer=tok)
    assert not (tmp_path / "x").exists()


def test_tune_documents_per_kind(tmp_path):
    docs = []
    for i, (kind, group, split) in enumerate([("a", "x", "tune"), ("b", "y", "tune"), ("a", "x", "dev"),
                                              ("a", "x", "tune"), ("a", "z", "tune"), ("b", "y", "dev"),
                                              ("a", "w", "tune")]):
        f = tmp_path / f"{i}.txt"
        f.write_text(f"text {i}")
        docs.append({"id": f"{kind}/{i}", "kind": kind, "group": group, "file": str(f), "split": split,
                     "sha256": hashlib.sha256(f"text {i}".encode()).hexdigest()})
    (tmp_path / "m.json").write_text(json.dumps({"documents": docs}))
    ids = [d["id"] for d in E.load_docs(tmp_path / "m.json", tune_per_kind=2)]
    # kind a: the first excerpt of works x, z, w, then x's second -> a/0, a/4; kind b: its one tune document
    assert ids == ["a/0", "b/1", "a/2", "a/4", "b/5"]
    ids = [d["id"] for d in E.load_docs(tmp_path / "m.json", tune_per_kind=4)]
    assert ids == ["a/0", "b/1", "a/2", "a/3", "a/4", "b/5", "a/6"]
    assert len(E.load_docs(tmp_path / "m.json")) == 7
    assert [d["id"] for d in E.load_docs(tmp_path / "m.json", quick=True)] == ["a/0", "b/1", "a/2", "b/5"]


def test_estimate_counts_the_grid():
    rows = [{"length": 10, "what": "prefill", "cpu_seconds": 5.0}]
    space = {"a": ("a", "a[x=1]"), "b": ("b",)}
    rows += [{"length": 10, "what": "replay", "method": s, "cpu_seconds": t} for s, t in
             (("a", 1.0), ("a[x=1]", 3.0), ("b", 2.0))]
    est = E.estimate(rows, space=space, n_tune=2, n_dev=3, n_ratios=4)
    assert est["tune"] == 2 * (5 + 4 * (1 + 3 + 2))
    assert est["dev"] == 3 * (5 + 4 * (2 + 2))  # a: mean of its settings
    assert est["total"] == est["tune"] + est["dev"]


@pytest.mark.model
def test_quick_run_on_bundled_model(tmp_path):
    """`jacap evaluate tune --quick` then `dev --quick` end to end on the bundled model (a few minutes on a
    loaded 2-core machine)."""
    out = tmp_path / "q"
    assert cli.main(["evaluate", "tune", "--quick", "--dir", str(out), "--no-progress"]) == 0
    assert cli.main(["evaluate", "dev", "--quick", "--dir", str(out), "--no-progress"]) == 0
    tune, dev = io.read_jsonl(out / "tune.jsonl"), io.read_jsonl(out / "dev.jsonl")
    chosen = json.loads((out / "choices.json").read_text())["chosen"]
    assert len(tune) == 2 * 2 * 5 and len(dev) == 2 * 2 * len(E.dev_specs(chosen))
    # the three choices, and the paper preset beside them unless Algorithm 1's choice is the paper preset itself
    assert len(E.dev_specs(chosen)) == 3 + (not P.same_setting(chosen["jacap_prompt"], P.PAPER_PRESET))
    assert all(r["continuation"] == 32 and r["length"] == 512 for r in tune + dev)
    assert io.read_runs(out / "dev.jsonl")[0]["model"]["sha256"]


# --------------------------------------------------------------------------------------------- summary
SUM_DOCS = [f"t{i}" for i in range(8)]
SUM_SPACE = {"knorm": ("knorm",), "snapkv": ("snapkv",), "jacap_prompt": ("jacap_prompt",), "jacap_prompt_adakv": ("jacap_prompt_adakv",)}


def _eval_dir(tmp_path):
    """A hand-built tune/dev pair: knorm is the best baseline on tune, snapkv on dev (knorm = 1.25 snapkv there).
    Cell 512/0.5: jacap = 0.8 knorm x exp(+-0.05) (alternating); cell 512/0.9: jacap = knorm. jacap_prompt_adakv = knorm."""
    config = P.protocol_config(model={"name": "m", "sha256": "0"}, lengths=(512,), ratios=(0.5, 0.9), continuation=8,
                               space=SUM_SPACE, docs=[{"id": "u0", "sha256": "s", "split": "tune"}]
                               + [{"id": d, "sha256": "s", "split": "dev"} for d in SUM_DOCS])
    base = dict(model="m", sha256="s", length=512, continuation=8)
    tune = [{**base, "doc": "u0", "split": "tune", "ratio": c, "method": m, "kl": kl}
            for c in (0.5, 0.9) for m, kl in (("knorm", 1.0), ("snapkv", 2.0), ("jacap_prompt", 1.0), ("jacap_prompt_adakv", 1.0))]
    out = tmp_path / "eval"
    E.write_choices(out / "choices.json", tune, config, SUM_SPACE)
    dev = []
    for i, d in enumerate(SUM_DOCS):
        snap = 0.1 * (i + 1)
        knorm = 1.25 * snap
        for c, jac in ((0.5, 0.8 * knorm * math.exp(0.05 if i % 2 else -0.05)), (0.9, knorm)):
            for m, kl in (("snapkv", snap), ("knorm", knorm), ("jacap_prompt", jac), ("jacap_prompt_adakv", knorm),
                          (P.PAPER_PRESET, knorm)):  # the dev job adds the paper's settings (not today's default)
                dev.append({**base, "doc": d, "split": "dev", "ratio": c, "method": m, "kl": kl})
    for r in dev:
        io.append_jsonl(out / "dev.jsonl", r)
    io.append_run(out / "dev.jsonl", {"fingerprint": P.fingerprint(config), "protocol": config, "command": "x"})
    return out, config


def test_summary_verdicts_intervals_and_holm(tmp_path):
    out, _ = _eval_dir(tmp_path)
    assert cli.main(["evaluate", "summary", "--dir", str(out)]) == 0
    data = json.loads((out / "summary.json").read_text())
    assert data["config"]["fingerprint"] == json.loads((out / "choices.json").read_text())["fingerprint"]
    fams = {(f["setting"], f["picked_on"]): f for f in data["families"]}
    # the default, the paper's settings, then every other Jacap method's tune choice the dev rows hold
    assert set(fams) == {(s, p) for s in ("jacap_prompt", P.PAPER_PRESET, "jacap_prompt_adakv") for p in ("tune", "dev")}
    assert [f["setting"] for f in data["families"]][::2] == ["jacap_prompt", P.PAPER_PRESET, "jacap_prompt_adakv"]
    assert fams[(P.PAPER_PRESET, "tune")]["role"] == "paper preset"
    assert fams[("jacap_prompt_adakv", "tune")]["role"] == "tuned jacap_prompt_adakv"
    assert {r["ratio"]: r["gm_ratio"] for r in fams[("jacap_prompt_adakv", "tune")]["rows"]} == pytest.approx({0.5: 1, 0.9: 1})
    assert fams[("jacap_prompt", "tune")]["role"] == "algorithm 1"
    assert fams[("jacap_prompt", "dev")]["label"] == "picked on dev (stricter)"
    tune = {r["ratio"]: r for r in fams[("jacap_prompt", "tune")]["rows"]}
    assert {r["baseline"] for r in tune.values()} == {"knorm"}
    better, same = tune[0.5], tune[0.9]
    assert better["gm_ratio"] == pytest.approx(0.8, rel=1e-4)  # the +-0.05 logs cancel
    assert better["gm_low"] < 0.8 < better["gm_high"] < 1
    # two cells judged together: the verdict from the 97.5 % interval, which holds the 95 % one
    assert better["cells_judged"] == 2 and better["confidence_adjusted"] == pytest.approx(0.975)
    assert better["gm_low_adjusted"] <= better["gm_low"] and better["gm_high"] <= better["gm_high_adjusted"] < 1
    low, high = (float(x) for x in re.findall(r"[\d.]+", better["verdict"]))
    assert better["verdict"].startswith("better by") and low < 20 < high
    assert high == pytest.approx(100 * (1 - better["gm_low_adjusted"]), abs=0.5)
    assert better["verdict_unadjusted"] == verdicts.verdict((better["gm_low"], better["gm_high"]))
    assert (better["wins"], better["losses"]) == (8, 0)
    assert better["p_wilcoxon"] == pytest.approx(2 / 2 ** 8, rel=1e-3)  # exact: every one of 8 ratios below 1
    assert same["verdict"] == "no difference: identical on every document" and same["p_wilcoxon"] == 1.0
    # Holm over the family's two cells, by hand: the smaller p doubled, the larger max(that, itself)
    assert better["p_holm"] == pytest.approx(2 * 2 / 2 ** 8, rel=1e-3) and same["p_holm"] == 1.0
    # against snapkv (picked on dev): 0.5 becomes a wash, 0.9 worse by 25 %
    strict = {r["ratio"]: r for r in fams[("jacap_prompt", "dev")]["rows"]}
    assert {r["baseline"] for r in strict.values()} == {"snapkv"}
    assert strict[0.9]["verdict"] == "worse by 25 %" and (strict[0.9]["wins"], strict[0.9]["losses"]) == (0, 8)
    assert strict[0.5]["verdict"].startswith("no detectable difference")
    p = sorted([strict[0.5]["p_wilcoxon"], strict[0.9]["p_wilcoxon"]])
    hand = [min(1, 2 * p[0]), max(min(1, 2 * p[0]), p[1])]
    assert sorted([strict[0.5]["p_holm"], strict[0.9]["p_holm"]]) == pytest.approx(hand, rel=1e-3)
    # the table rows: primary line first, one per (setting, line, cell)
    table = E.summary_table(data)
    assert len(table) == 12 and table[0]["best baseline"] == "picked on tune (the protocol)"
    assert table[0]["wins/losses"] == "8/0" and table[0]["verdict"] == better["verdict"]


def _rewrite_dev_rows(out, rows, run):
    """``out``'s dev.jsonl replaced by ``rows``, with ``run`` its one recorded configuration."""
    (out / "dev.jsonl").unlink()
    io.config_path(out / "dev.jsonl").unlink()
    for r in rows:
        io.append_jsonl(out / "dev.jsonl", r)
    io.append_run(out / "dev.jsonl", run)


def test_summary_judges_complete_cells_of_an_unfinished_run(tmp_path, capsys):
    """One dev document lacks its 512/0.9 row of snapkv: that cell is named missing, 512/0.5 is judged alone
    (a one-cell Holm family: adjusted p = raw p); with no complete cell the summary refuses."""
    out, _ = _eval_dir(tmp_path)
    rows = io.read_jsonl(out / "dev.jsonl")
    runs = io.read_runs(out / "dev.jsonl")
    drop = lambda r: r["doc"] == "t3" and r["ratio"] == 0.9 and r["method"] == "snapkv"  # noqa: E731
    assert sum(map(drop, rows)) == 1
    _rewrite_dev_rows(out, [r for r in rows if not drop(r)], runs[0])
    assert cli.main(["evaluate", "summary", "--dir", str(out)]) == 0
    assert "512/0.9" in capsys.readouterr().out
    data = json.loads((out / "summary.json").read_text())
    assert data["cells_measured"] == ["512/0.5"] and data["cells_missing"] == ["512/0.9"]
    for fam in data["families"]:
        assert [r["ratio"] for r in fam["rows"]] == [0.5]
        assert fam["rows"][0]["p_holm"] == pytest.approx(fam["rows"][0]["p_wilcoxon"])
    (out / "summary.json").unlink()
    _rewrite_dev_rows(out, [r for r in rows if not (r["doc"] == "t3" and r["method"] == "snapkv")], runs[0])
    with pytest.raises(SystemExit) as e:
        cli.main(["evaluate", "summary", "--dir", str(out)])
    assert e.value.code == 2 and "no complete" in capsys.readouterr().err and not (out / "summary.json").exists()


def test_dev_specs_add_the_paper_preset_only_when_it_differs():
    # the paper's settings written another way (a shorter spec that builds the same press today)
    same = "jacap_prompt[beta=none,centre=tempered,noise=1.0,tau=10.0,window=32]"
    assert E.dev_specs({"knorm": "knorm", "jacap_prompt": same}) == ["knorm", same]
    tuned = "jacap_prompt[beta=0.9,centre=tempered,tau=3,window=128]"
    assert E.dev_specs({"jacap_prompt": tuned}) == [tuned, P.PAPER_PRESET]
    assert E.dev_specs({"knorm": "knorm"}) == ["knorm"]
    from jacap_lib.config import DEFAULTS

    assert P.same_setting("jacap_prompt", f"jacap_prompt[window={DEFAULTS.window},beta={DEFAULTS.beta}]")
    assert P.same_setting(P.PAPER_PRESET, same) and not P.same_setting("jacap_prompt", "jacap_prompt_adakv")


def test_summary_refuses_missing_or_foreign_inputs(tmp_path, capsys):
    def refused(out, match):
        with pytest.raises(SystemExit) as e:
            cli.main(["evaluate", "summary", "--dir", str(out)])
        assert e.value.code == 2 and not (out / "summary.json").exists()
        assert re.search(match, capsys.readouterr().err)

    out, config = _eval_dir(tmp_path)
    (out / "dev.jsonl").rename(out / "t.jsonl")
    refused(out, "dev.jsonl does not exist")
    (out / "t.jsonl").rename(out / "dev.jsonl")
    (out / "choices.json").rename(out / "c.json")
    refused(out, "choices.json does not exist.*evaluate tune")
    (out / "c.json").rename(out / "choices.json")
    # a dev run made under another search space stays valid (a row measures one setting on one document; the
    # summary reads the rows of today's choices); one made with another option (continuation, ...) does not
    fewer = {**config, "search_space": {m: v for m, v in config["search_space"].items() if m != "jacap_prompt_adakv"}}
    changed = {**config, "search_space": {**config["search_space"], "snapkv": ["snapkv", "snapkv[window_size=8]"]}}
    assert P.same_measurements(fewer, config) and P.same_measurements(config, fewer)
    assert P.same_measurements(changed, config) and not P.same_measurements(None, config)
    # a dev row does not depend on how many tune documents chose the settings; it does on the dev documents
    tuned_on_fewer = {**changed, "tune_docs": config["tune_docs"][:1]}
    assert P.same_measurements(tuned_on_fewer, config)
    assert not P.same_measurements({**config, "dev_docs": config["dev_docs"][:1]}, config)
    io.append_run(out / "dev.jsonl", {"fingerprint": P.fingerprint(fewer), "protocol": fewer})
    io.append_run(out / "dev.jsonl", {"fingerprint": P.fingerprint(changed), "protocol": changed})
    assert cli.main(["evaluate", "summary", "--dir", str(out)]) == 0
    (out / "summary.json").unlink()
    capsys.readouterr()
    other = {**config, "continuation": 9}
    assert not P.same_measurements(other, config) and not P.same_measurements({**other, "search_space": {}}, config)
    io.append_run(out / "dev.jsonl", {"fingerprint": P.fingerprint(other), "protocol": other})
    refused(out, "different configurations.*continuation")


def test_cell_statistics_and_evaluation_views(tmp_path):
    """cell_statistics: the geometric mean is exp(mean log KL) over the documents, its interval brackets it, a
    cell missing a document for one setting is left out; the evaluation tables and figure read it back."""
    from jacap_lib.viz import evaluation as VE
    from jacap_lib.viz.style import method_style

    out, _ = _eval_dir(tmp_path)
    rows = [dict(r, top1_agreement=0.5, attn_rel_error=0.1) for r in io.read_jsonl(out / "dev.jsonl")]
    cells = E.cell_statistics(rows, ["jacap_prompt", "knorm"], seed=1)
    assert {(c["method"], c["ratio"]) for c in cells} == {(m, c) for m in ("jacap_prompt", "knorm") for c in (0.5, 0.9)}
    for c in cells:
        kls = [r["kl"] for r in rows if r["method"] == c["method"] and r["ratio"] == c["ratio"]]
        assert c["n_docs"] == 8 == len(kls)
        assert c["kl_geomean"] == pytest.approx(math.exp(sum(map(math.log, kls)) / 8), rel=1e-9)
        assert c["kl_low"] < c["kl_geomean"] < c["kl_high"]
        assert c["top1_agreement"] == pytest.approx(0.5) and c["attn_rel_error"] == pytest.approx(0.1)
    partial = [r for r in rows if not (r["method"] == "knorm" and r["ratio"] == 0.9 and r["doc"] == "t0")]
    assert {c["ratio"] for c in E.cell_statistics(partial, ["jacap_prompt", "knorm"])} == {0.5}
    pair = {r["ratio"]: r for r in E.compare_settings(rows, "jacap_prompt", "knorm", seed=0)}
    assert pair[0.5]["gm_ratio"] == pytest.approx(0.8, rel=1e-4) and (pair[0.5]["wins"], pair[0.5]["losses"]) == (8, 0)
    assert pair[0.9]["gm_ratio"] == pytest.approx(1.0) and pair[0.9]["ties"] == 8
    # the two cells judged together: the verdict from the interval at 1 - 0.05/2, the 95 % one's beside it
    a = pair[0.5]
    assert a["cells_judged"] == 2 and a["gm_low_adjusted"] <= a["gm_low"] < a["gm_high"] <= a["gm_high_adjusted"]
    assert a["verdict"] == verdicts.verdict((a["gm_low_adjusted"], a["gm_high_adjusted"]))
    assert a["verdict_unadjusted"] == verdicts.verdict((a["gm_low"], a["gm_high"]))
    with pytest.raises(ValueError, match="no cell"):
        E.compare_settings(rows, "jacap_prompt", "tova")
    assert VE.pair_frame(list(pair.values()), details=True)["won/lost"].tolist() == ["8/0", "all tied"]
    assert VE.pair_frame(list(pair.values()))["verdict"].tolist()[1] == "identical on every document"
    docs = [{"id": "a", "kind": "prose", "split": "tune", "license": "PD"},
            {"id": "b", "kind": "prose", "split": "dev", "license": "MIT"}, {"id": "c", "kind": "code", "split": "dev"}]
    assert VE.corpus_frame(docs).to_dict("index") == {"prose": {"tune": 1, "dev": 1, "sources": 1},
                                                      "code": {"tune": 0, "dev": 1, "sources": 1}}
    assert VE.corpus_frame(docs, details=True).to_dict("index") == {
        ("prose", "?"): {"tune": 1, "dev": 1, "licence": "MIT; PD"}, ("code", "?"): {"tune": 0, "dev": 1, "licence": ""}}
    split = {"512 / 0.95": {"kept": 25, "sinks": 4, "window": 21, "scored": 0},
             "2048 / 0.9": {"kept": 204, "sinks": 4, "window": 32, "scored": 168}}
    frame = VE.split_frame(split)
    assert frame["chosen by the score"].tolist() == [0, 168] and frame["share chosen by the score"].tolist() == ["0%", "82%"]
    fig = VE.kl_figure(cells)
    assert [t.name for t in fig.data] == ["JacapPromptPress()", "KNorm"] and fig.layout.yaxis.type == "log"
    assert fig.data[0].line.color == method_style("jacap_prompt")["color"]
    assert VE.cells_frame(cells).shape == (2, 2)
    assert cli.main(["evaluate", "summary", "--dir", str(out)]) == 0
    summ = json.loads((out / "summary.json").read_text())
    from jacap_lib.report import findings
    assert (out / "findings.md").read_text(encoding="utf-8") == findings.findings_text(summ)  # the job rewrites it
    frame = VE.verdict_frame(summ, picked_on="tune", role="algorithm 1", details=True)
    assert len(frame) == 2 and frame["won/lost"].tolist() == ["8/0", "all tied"]
    assert VE.choices_frame(json.loads((out / "choices.json").read_text())).shape[0] == 4
    with pytest.raises(ValueError, match="no family"):
        VE.verdict_frame(summ, picked_on="tune", role="no such role")


def test_resume_refuses_a_spec_whose_defaults_changed(tmp_path):
    """Rows of a bare spec made under other library defaults must not be resumed under the same name."""
    from jacap_lib.presses.registry import method_options, press_from_spec

    out = tmp_path / "tune.jsonl"
    io.append_jsonl(out, {"method": "jacap_prompt"})
    now = method_options(press_from_spec("jacap_prompt", 0.5))  # today's defaults
    io.append_run(out, {"settings": {"jacap_prompt": now, "knorm": method_options(press_from_spec("knorm", 0.5))}})
    E.check_settings_unchanged(out, {"jacap_prompt": ("jacap_prompt",), "knorm": ("knorm",)})  # same options: fine
    io.append_run(out, {"settings": {"jacap_prompt": {**now, "window": now["window"] + 1}}})
    with pytest.raises(ValueError, match=r"'jacap_prompt'.*window.*new --dir"):
        E.check_settings_unchanged(out, {"jacap_prompt": ("jacap_prompt",)})
    E.check_settings_unchanged(out, {"knorm": ("knorm",)})
    E.check_settings_unchanged(tmp_path / "none.jsonl", {"jacap_prompt": ("jacap_prompt",)})  # nothing to resume


def test_resume_keeps_rows_of_a_renamed_class(tmp_path):
    """Rows recorded when jacap's press class was named JacapPress (now JacapPromptPress), also inside AdaKV, resume
    under the same spec; the same options with a changed field still refuse."""
    from jacap_lib.presses.registry import method_options, press_from_spec

    out = tmp_path / "kl.jsonl"
    io.append_jsonl(out, {"method": "jacap_prompt"})
    plain, wrapped = (method_options(press_from_spec(s, 0.5)) for s in ("jacap_prompt", "jacap_prompt_adakv"))
    assert plain["class"] == "JacapPromptPress" and wrapped["press"]["class"] == "JacapPromptPress"
    io.append_run(out, {"settings": {"jacap_prompt": {**plain, "class": "JacapPress"},
                                     "jacap_prompt_adakv": {**wrapped, "press": {**wrapped["press"], "class": "JacapPress"}}}})
    E.check_settings_unchanged(out, None, ["jacap_prompt", "jacap_prompt_adakv"])
    io.append_run(out, {"settings": {"jacap_prompt_adakv": {**wrapped, "press": {**wrapped["press"], "window": 3}}}})
    with pytest.raises(ValueError, match=r"'jacap_prompt_adakv'.*press"):
        E.check_settings_unchanged(out, None, ["jacap_prompt_adakv"])


def test_an_option_without_effect_does_not_block_a_resume(tmp_path):
    """deff_frac only sets the effective-dimension rule's target: with a fixed noise a recorded deff_frac that
    differs from today's is no other press (resume allowed, same_setting true); with noise="deff" it is."""
    from jacap_lib.presses.registry import effective_options, method_options, press_from_spec

    now = method_options(press_from_spec("jacap_prompt", 0.5))
    assert now["noise"] != "deff" and "deff_frac" in now and "deff_frac" not in effective_options(now)
    wrapped = method_options(press_from_spec("jacap_prompt_adakv", 0.5))
    assert "deff_frac" not in str(effective_options(wrapped)) and "deff_frac" in str(wrapped)
    out = tmp_path / "dev.jsonl"
    io.append_jsonl(out, {"method": "jacap_prompt"})
    io.append_run(out, {"settings": {"jacap_prompt": {**now, "deff_frac": now["deff_frac"] * 2},
                                     "jacap_prompt[noise=deff]": {**method_options(press_from_spec("jacap_prompt[noise=deff]", 0.5)),
                                                           "deff_frac": 0.9}}})
    E.check_settings_unchanged(out, {"jacap_prompt": ("jacap_prompt",)})
    with pytest.raises(ValueError, match=r"'jacap_prompt\[noise=deff\]'.*deff_frac"):
        E.check_settings_unchanged(out, {"jacap_prompt": ("jacap_prompt[noise=deff]",)})
    assert P.same_setting("jacap_prompt", "jacap_prompt[deff_frac=0.9]")
    assert not P.same_setting("jacap_prompt[noise=deff]", "jacap_prompt[noise=deff,deff_frac=0.9]")


def test_target_status_judges_each_named_cell_by_hand():
    """Judged on the adjusted (simultaneous) interval; the 95 % one gives ``met_unadjusted``."""
    def row(L, c, lo, hi, alo, ahi):
        return {"length": L, "ratio": c, "gm_ratio": (lo + hi) / 2, "gm_low": lo, "gm_high": hi,
                "gm_low_adjusted": alo, "gm_high_adjusted": ahi, "baseline_spec": "snapkv[window_size=16]",
                "verdict": "v", "verdict_unadjusted": "u"}

    summ = {"families": [
        {"role": "paper preset", "picked_on": "tune", "rows": [row(512, 0.9, 0.1, 0.2, 0.1, 0.2)]},
        {"role": "algorithm 1", "picked_on": "dev", "rows": [row(512, 0.9, 0.1, 0.2, 0.1, 0.2)]},
        {"role": "algorithm 1", "picked_on": "tune", "rows": [row(512, 0.9, 0.83, 0.93, 0.80, 0.97),
                                                          row(512, 0.95, 0.90, 0.98, 0.86, 1.04),
                                                          row(512, 0.75, 1.03, 1.32, 0.98, 1.40)]}],
        "cells_missing": ["1024/0.9"]}
    got = {(r["length"], r["ratio"]): r for r in E.target_status(summ)}
    assert got[(512, 0.9)]["met"] is True and got[(512, 0.9)]["shortfall"] == 0.0
    # better within its 95 % interval, not within the adjusted one: missed by its upper end 1.04
    assert got[(512, 0.95)]["met_unadjusted"] is True
    assert got[(512, 0.95)]["met"] is False and got[(512, 0.95)]["shortfall"] == pytest.approx(0.04)
    # worse within its 95 % interval (lower end 1.03), not detectably worse within the adjusted one (0.98)
    assert got[(512, 0.75)]["met_unadjusted"] is False
    assert got[(512, 0.75)]["met"] is True and got[(512, 0.75)]["shortfall"] == 0.0
    assert (got[(512, 0.75)]["verdict"], got[(512, 0.75)]["verdict_unadjusted"]) == ("v", "u")
    assert got[(1024, 0.9)]["met"] is None and got[(1024, 0.75)]["verdict"] == "not measured"
    old = {"families": [{**f, "rows": [{k: v for k, v in r.items() if "adjusted" not in k} for r in f["rows"]]}
                        for f in summ["families"]]}
    with pytest.raises(ValueError, match="rerun `jacap evaluate summary`"):
        E.target_status(old)
    assert set(got) == {(L, c) for L in (512, 1024) for c in (0.9, 0.95, 0.75)}
    with pytest.raises(ValueError, match="Algorithm 1"):
        E.target_status({"families": summ["families"][:2]})
    with pytest.raises(ValueError, match="requirement"):
        E.target_status(summ, target={0.9: "best"})


def test_identical_documents_counts_equal_kls_per_cell():
    rows = [{"method": m, "length": 512, "ratio": c, "doc": d, "kl": kl}
            for c, pairs in ((0.95, [(0.3, 0.3), (0.1, 0.1)]), (0.5, [(0.3, 0.31), (0.2, 0.2)]))
            for d, (ka, kb) in zip("xy", pairs) for m, kl in (("a", ka), ("b", kb))]
    rows.append({"method": "a", "length": 1024, "ratio": 0.5, "doc": "x", "kl": 0.1})  # no partner: no cell
    assert E.identical_documents(rows, "a", "b") == {(512, 0.5): (1, 2), (512, 0.95): (2, 2)}
    # replay noise: 0.3 against 0.3 * (1 + 1e-5) is the same KL at rtol 1e-4, not at the default 1e-9;
    # 0.3 against 0.31 (3 % apart) is a difference at either
    rows[0]["kl"] = 0.3 * (1 + 1e-5)
    assert E.identical_documents(rows, "a", "b")[(512, 0.95)] == (1, 2)
    assert E.identical_documents(rows, "a", "b", rtol=1e-4) == {(512, 0.5): (1, 2), (512, 0.95): (2, 2)}
    with pytest.raises(ValueError, match="rtol"):
        E.identical_documents(rows, "a", "b", rtol=-1)


def test_target_frame_shows_each_cell_with_its_shortfall():
    from jacap_lib.viz import evaluation as VE

    status = [{"length": 512, "ratio": 0.9, "requirement": "better", "met": False, "baseline": "tova",
               "gm_ratio": 1.0, "gm_low": 0.95, "gm_high": 1.05, "verdict": "no detectable difference", "shortfall": 0.05},
              {"length": 1024, "ratio": 0.9, "requirement": "better", "met": None, "baseline": None, "gm_ratio": None,
               "gm_low": None, "gm_high": None, "verdict": "not measured", "shortfall": None}]
    f = VE.target_frame(status)
    assert f.loc["512 / 0.9", "met"] == "no" and f.loc["512 / 0.9", "missed by"] == "5.0 %"
    assert f.loc["512 / 0.9", "KL ratio [95 % CI]"] == "1.00 [0.95, 1.05]"  # width 0.1: two decimals
    assert f.loc["1024 / 0.9", "met"] == "not measured" and f.loc["1024 / 0.9", "missed by"] == ""


#: the press classes renamed when the context press became the default: recorded name -> today's
RENAMED = {"JacapPress": "JacapPromptPress", "JacapContextPress": "JacapPress"}


def test_every_recorded_jacap_setting_is_written_out_and_builds_what_was_recorded():
    """No setting depends on the library's defaults: every Jacap spec of the search space, the choices and the rows
    writes out every option of its press (so it builds the same press whatever the defaults become), and builds
    exactly the press options the latest run recorded for it; the committed tune resumes. Today's ``JacapPromptPress()``
    is the tune's jacap_obs choice (the same options)."""
    from jacap_lib.presses.registry import changed_options, effective_options, method_options, written_out
    from jacap_lib.results import loaders
    from jacap_lib.results.paths import data_path

    # the class's name aside, as a resume compares (the rows were recorded when JacapPromptPress was JacapPress)
    strip = lambda d: {k: (strip(v) if isinstance(v, dict) else v) for k, v in d.items()  # noqa: E731
                       if k not in ("compression_ratio", "class")}
    runs = loaders.load_eval_runs("tune")
    rows = {r["method"] for r in io.read_jsonl(data_path("results", "eval", "tune.jsonl"))}
    searched = [s for m in P.JACAP_METHODS for s in P.SEARCH_SPACE[m]]
    assert set(searched) <= rows
    for spec in sorted({s for s in rows if s.startswith("jacap")} | set(searched)):
        assert written_out(spec) == spec, spec
        then = next((r["settings"][spec] for r in reversed(runs) if spec in r.get("settings", {})), None)
        if spec in searched:
            built = json.loads(json.dumps(method_options(press_from_spec(spec, 0.5))))
            assert effective_options(strip(built)) == effective_options(strip(then)), spec
            assert RENAMED.get(then["class"], then["class"]) == built["class"], spec
    assert P.PAPER_PRESET == searched[0] and written_out(P.PAPER_PRESET) == P.PAPER_PRESET
    first = press_from_spec(P.PAPER_PRESET, 0.5)
    assert (first.centre, first.tau, first.beta, first.noise, first.window) == ("tempered", 10, None, 1, 32)
    chosen = loaders.load_eval_choices()["chosen"]
    assert not P.same_setting(chosen["jacap_prompt"], "jacap_prompt")  # Algorithm 1's choice is not the default
    assert changed_options(chosen["jacap_obs"], "jacap_prompt") == {}  # JacapPromptPress() is the jacap_obs choice
    E.check_settings_unchanged(data_path("results", "eval", "tune.jsonl"), P.SEARCH_SPACE)  # resumes


def test_grid_edges_sees_a_knob_a_press_copies_into_its_private_sub_press():
    """Compactor copies its sketch dimension into a private LeverageScorePress (``_leverage_press``): moving the knob
    moves two recorded options, and the edge check must still see it as one knob (the first peers round chose 24 of
    {24, 48, 96}, the grid's end). Replaced settings are out of the space, their rows kept."""
    space = {"compactor": ["compactor", "compactor[sketch_dimension=24]", "compactor[sketch_dimension=96]"]}
    choices = {"config": {"search_space": space}, "chosen": {"compactor": "compactor[sketch_dimension=24]"}}
    assert P.grid_edges(choices) == [{"method": "compactor", "option": "sketch_dimension", "chosen": 24,
                                      "values": [24, 48, 96], "edge": True, "bound": False}]
    assert "compactor[sketch_dimension=12]" in P.PEER_SPACE["compactor"]
    # CriticalKV's first stage at the whole budget (1) is an edge no grid can widen; 0.9 of {0.5, 0.9, 1} is inside
    space = {"critical_kv": ["critical_kv", "critical_kv[first_stage_ratio=0.9]", "critical_kv[first_stage_ratio=1.0]"]}
    edge = P.grid_edges({"config": {"search_space": space}, "chosen": {"critical_kv": space["critical_kv"][2]}})
    assert [(e["chosen"], e["values"], e["edge"], e["bound"]) for e in edge] == [(1.0, [0.5, 0.9, 1.0], True, True)]
    edge = P.grid_edges({"config": {"search_space": space}, "chosen": {"critical_kv": space["critical_kv"][1]}})
    assert [(e["edge"], e["bound"]) for e in edge] == [(False, False)]
    assert not set(P.PEER_REPLACED) & {s for v in P.PEER_SPACE.values() for s in v}


def test_curs_two_token_window_is_a_bound_because_one_token_scores_every_key_alike():
    """kvpress's CUR normalises each key's (and value's) squared norm within a local window: with one token per
    window every score is the same (1/N after the final normalisation), so the press chooses nothing. The registry
    refuses that window and the edge check counts 2 as a bound of the knob."""
    import kvpress
    import torch

    keys, values = torch.randn(1, 3, 40, 64), torch.randn(1, 3, 40, 64)
    flat = kvpress.CURPress(local_window_size=1, num_sinks=0).score(None, None, keys, values, None, {})
    assert torch.allclose(flat, torch.full_like(flat, 1 / 40))
    two = kvpress.CURPress(local_window_size=2, num_sinks=0).score(None, None, keys, values, None, {})
    assert two.std() > 1e-3  # a two-token window already ranks keys
    with pytest.raises(ValueError, match="local_window_size"):
        build_press("cur", 0.5, local_window_size=1)
    space = {"cur": ["cur", "cur[local_window_size=2]", "cur[local_window_size=4]"]}
    edge = P.grid_edges({"config": {"search_space": space}, "chosen": {"cur": space["cur"][1]}})
    assert [(e["chosen"], e["values"], e["edge"], e["bound"]) for e in edge] == [(2, [2, 4, 16], True, True)]
    # the floor is CUR's own: another press's window of 2 is no bound
    space = {"snapkv": ["snapkv", "snapkv[window_size=2]", "snapkv[window_size=16]"]}
    edge = P.grid_edges({"config": {"search_space": space}, "chosen": {"snapkv": space["snapkv"][1]}})
    assert [(e["chosen"], e["bound"]) for e in edge] == [(2, False)]


def test_context_space_is_written_out_and_its_migration_renamed_rows_not_measurements():
    """The context space's settings are the preset context_as_first_tuned with the named changes, written out in full; the
    one-off migration renamed the short specs of the first rounds: each old name's written-out form is its map
    entry, every committed row and run names a written-out setting, each run's recorded options are those the new
    name builds, and each run's fingerprint is the one its renamed configuration hashes to; the folder resumes."""
    from jacap_lib.presses.registry import effective_options, method_options, parse_method, written_out
    from jacap_lib.results import files as FI
    from jacap_lib.results.paths import data_path

    folder = data_path("results", "eval", "context")
    specs = P.CONTEXT_SPACE["jacap"]
    assert all(written_out(s) == s for s in specs)
    assert specs[0] == P._context() and P._context(window=64) in specs
    assert all(written_out(s) == s for s in P.CONTEXT_REPLACED) and not set(P.CONTEXT_REPLACED) & set(specs)
    first = press_from_spec(specs[0], 0.5)
    assert (first.budget, first.centre, first.n_sink, first.window, first.chunk_size) == ("global", "observed", 4, 0, 2048)
    migration = json.loads((folder / "spec_migration.json").read_text())
    assert migration["eval"]["jacap[window=16]"] == P._context(window=16)
    for old, new in migration["eval"].items():
        # an old short name meant the defaults of its day (the preset context_as_first_tuned), not today's (window 64)
        assert written_out(new) == new == P._context(**parse_method(old)[1])
        assert new in specs or new in P.CONTEXT_REPLACED
    rows = FI.read_jsonl(folder / "tune.jsonl")
    assert {r["method"] for r in rows} <= set(specs) | set(P.CONTEXT_REPLACED) and len(rows) >= migration["rows"]
    strip = lambda d: {k: v for k, v in d.items() if k not in ("compression_ratio", "class")}  # noqa: E731
    for run in FI.read_runs(folder / "tune.jsonl"):
        assert P.fingerprint(run["protocol"]) == run["fingerprint"]
        for spec, then in run["settings"].items():
            assert spec in specs or spec in P.CONTEXT_REPLACED
            now = json.loads(json.dumps(method_options(press_from_spec(spec, then["compression_ratio"]))))
            assert effective_options(strip(now)) == effective_options(strip(then)), spec
            assert RENAMED.get(then["class"], then["class"]) == now["class"] == "JacapPress", spec
    assert set(migration["fingerprints"].values()) <= {r["fingerprint"] for r in FI.read_runs(folder / "tune.jsonl")}
    E.check_settings_unchanged(folder / "tune.jsonl", {"jacap": specs + P.CONTEXT_REPLACED})  # resumes


def test_grid_edges_finds_a_choice_on_the_edge_of_its_grid():
    """grid_edges: per method, the numeric options the space varies alone around the choice, the values tried
    and whether the choice is the smallest or largest of three or more (hand-built choices)."""
    space = {"snapkv": ["snapkv", "snapkv[window_size=32]", "snapkv[window_size=16]"], "knorm": ["knorm"],
             "jacap_prompt": ["jacap_prompt[centre=tempered,tau=10,beta=none]", "jacap_prompt[centre=tempered,tau=3,beta=0.9]",
                       "jacap_prompt[centre=tempered,tau=1,beta=0.9]", "jacap_prompt[centre=tempered,tau=10,beta=0.9]"],
             "capkv": ["capkv", "capkv[tau=2]"]}
    choices = {"config": {"search_space": space},
               "chosen": {"snapkv": "snapkv[window_size=16]", "knorm": "knorm", "jacap_prompt": "jacap_prompt[centre=tempered,tau=3,beta=0.9]",
                          "capkv": "capkv"}}
    rows = {(r["method"], r["option"]): r for r in P.grid_edges(choices)}
    # the paper's tau = 10 with flat statistics differs in two options: not a tau neighbour
    assert set(rows) == {("snapkv", "window_size"), ("jacap_prompt", "tau"), ("capkv", "tau")}
    assert rows[("snapkv", "window_size")] == {"method": "snapkv", "option": "window_size", "chosen": 16,
                                               "values": [16, 32, 64], "edge": True, "bound": False}
    assert rows[("jacap_prompt", "tau")]["values"] == [1, 3, 10] and rows[("jacap_prompt", "tau")]["edge"] is False
    assert P.neighbours(choices, "jacap_prompt") == {"tau": {1: "jacap_prompt[centre=tempered,tau=1,beta=0.9]",
                                                      3: "jacap_prompt[centre=tempered,tau=3,beta=0.9]",
                                                      10: "jacap_prompt[centre=tempered,tau=10,beta=0.9]"}}
    assert rows[("capkv", "tau")]["values"] == [2, 5] and rows[("capkv", "tau")]["edge"] is None  # two values
    assert not rows[("capkv", "tau")]["bound"]  # a float knob has no smallest value
    # a choice at the smallest value its knob can take: an edge, and a bound (no sinks; a 1-token pooling kernel)
    space = {"capkv": ["capkv", "capkv[n_sink=0]", "capkv[n_sink=16]"],
             "snapkv": ["snapkv", "snapkv[kernel_size=1]", "snapkv[kernel_size=9]"]}
    choices = {"config": {"search_space": space}, "chosen": {"capkv": "capkv[n_sink=0]", "snapkv": "snapkv[kernel_size=1]"}}
    rows = {(r["method"], r["option"]): r for r in P.grid_edges(choices)}
    assert rows[("capkv", "n_sink")]["values"] == [0, 4, 16] and rows[("capkv", "n_sink")]["edge"] is True
    assert rows[("capkv", "n_sink")]["bound"] and rows[("snapkv", "kernel_size")]["bound"]
    assert rows[("snapkv", "kernel_size")]["values"] == [1, 5, 9]


def test_kl_figure_names_each_setting_once():
    """The legend names a setting as the book does (findings.spec_name) and keeps names apart: SnapKV as kvpress
    ships it and as the tune chose it would both read "SnapKV", so each is named by its short spec there."""
    from jacap_lib.viz import evaluation as VE

    def cell(method, ratio):
        return {"method": method, "length": 512, "ratio": ratio, "n_docs": 4, "kl_geomean": 0.1, "kl_low": 0.05,
                "kl_high": 0.2}

    from jacap_lib.results.paths import data_path

    chosen = json.loads(data_path("results", "eval", "choices.json").read_text())["chosen"]
    one = VE.kl_figure([cell(chosen["snapkv"], r) for r in (0.5, 0.9)] + [cell("keydiff", r) for r in (0.5, 0.9)])
    assert [t.name for t in one.data] == ["SnapKV", "KeyDiff"]
    both = VE.kl_figure([cell(m, r) for m in ("snapkv", chosen["snapkv"]) for r in (0.5, 0.9)])
    assert [t.name for t in both.data] == ["snapkv", "snapkv[window_size=16]"]
