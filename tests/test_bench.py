"""The quality grid jobs (jacap_lib.results.quality, `jacap bench`): rows are written, keyed by configuration,
and a rerun resumes without recomputing; the summary's intervals; method specs."""
import json
import math

import pytest
import torch

pytest.importorskip("kvpress")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from jacap_lib import cli  # noqa: E402
from jacap_lib.measure.passkey import passkey_prompt  # noqa: E402
from jacap_lib.presses.jacap import JacapPress  # noqa: E402
from jacap_lib.presses.registry import parse_method, press_from_spec  # noqa: E402
from jacap_lib.results import files  # noqa: E402
from jacap_lib.results import quality as bench  # noqa: E402

V = 61


class CharTokenizer:
    """Stand-in tokenizer: one token per character."""

    def __call__(self, text, return_tensors=None, add_special_tokens=False):
        ids = torch.tensor([[ord(c) % V for c in text]])
        return type("Enc", (), {"input_ids": ids})()

    def decode(self, ids):
        return "".join(chr(48 + i % 10) for i in ids)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval(), CharTokenizer()


SEG = [{"id": "prose/x", "kind": "prose", "split": "test",
        "text": "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 3}]


def test_run_kl_writes_and_resumes(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    out = tmp_path / "q.jsonl"
    kw = dict(segments=SEG, methods=["knorm", "jacap[tau=2.0]"], ratios=[0.5], lengths=[48, 64], continuation=8,
              out=out, model_name="tiny", progress=False)
    assert bench.run_kl(model, tok, **kw) == 4
    rows = files.read_jsonl(out)
    assert len(rows) == 4 and {r["method"] for r in rows} == {"knorm", "jacap[tau=2.0]"}
    jac = next(r for r in rows if r["method"] == "jacap[tau=2.0]")
    assert jac["press"]["tau"] == 2.0 and jac["press"]["class"] == "JacapPress"
    assert jac["kept_tokens"] == jac["length"] // 2 and len(jac["kl_per_token"]) == 8
    # a rerun computes nothing: the next-token path must not even be entered
    calls = []
    import jacap_lib.measure.quality as q
    monkeypatch.setattr(q, "next_token_kl", lambda *a, **k: calls.append(a))
    assert bench.run_kl(model, tok, **kw) == 0 and not calls
    monkeypatch.undo()
    # drop one row: only that one is recomputed, with the same value
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    assert bench.run_kl(model, tok, **kw) == 1
    again = files.read_jsonl(out)
    assert again[-1]["kl"] == pytest.approx(rows[-1]["kl"], rel=1e-6)
    assert again[-1]["method"] == rows[-1]["method"] and again[-1]["length"] == rows[-1]["length"]


def test_too_short_segment_raises(tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(ValueError, match="fewer than length"):
        bench.run_kl(model, tok, segments=SEG, methods=["knorm"], ratios=[0.5], lengths=[1000], continuation=8,
                     out=tmp_path / "q.jsonl", model_name="tiny", progress=False)


def test_parse_method():
    assert parse_method("jacap[tau=1,noise=1e3,beta=None]") == ("jacap", {"tau": 1, "noise": 1000.0,
                                                                             "beta": None})
    with pytest.raises(ValueError, match="key=value"):
        parse_method("jacap[tau]")
    with pytest.raises(ValueError):
        press_from_spec("nosuch", 0.5)


def test_summary_intervals_and_target():
    rows = []
    for i, seg in enumerate(["a", "b", "c", "d"]):
        split = "tune" if seg == "a" else "test"
        for method, kl in (("snapkv", 1.0 + i), ("knorm", 3.0 + i), ("jacap", 0.5 * (1.0 + i)),
                           ("jacap_rank1", 2.0 * (1.0 + i))):
            rows.append({"task": "kl", "segment": seg, "kind": "prose", "split": split, "length": 8, "ratio": 0.75,
                         "method": method, "kl": kl, "attn_rel_error": 0.1, "top1_agreement": 1.0})
    s = bench.summarize(rows, n_boot=500)
    cell = next(c for c in s["table"] if c["method"] == "snapkv" and c["kind"] == "all")
    assert cell["kl_mean"] == pytest.approx(2.5) and cell["kl_lo"] <= 2.5 <= cell["kl_hi"]
    assert 1.0 <= cell["kl_lo"] and cell["kl_hi"] <= 4.0
    comp = next(c for c in s["comparisons"] if c["method"] == "jacap" and c["split"] == "test")
    assert comp["best_baseline"] == "snapkv" and comp["mean_ratio"] == pytest.approx(0.5)
    assert comp["geo_mean_ratio"] == pytest.approx(0.5)
    assert comp["wins"] == 3 and comp["losses"] == 0
    assert comp["wilcoxon_p"] == pytest.approx(0.25)  # exact two-sided signed-rank p for 3 of 3 same-sign pairs
    assert comp["vs_capkv"] if "capkv" in {r["method"] for r in rows} else "vs_capkv" not in comp
    assert s["target"]["chosen"] == "jacap" and s["target"]["test"]["8/0.75"]["mean_ratio"] == pytest.approx(0.5)
    assert s["target"]["reached"] and s["target"]["test_worst_ratio"] == pytest.approx(0.5)


def test_paired_against_scipy_and_counts():
    from scipy import stats

    a = {"s1": 1.0, "s2": 2.0, "s3": 0.5, "s4": 4.0, "s5": 1.0}
    b = {"s1": 2.0, "s2": 1.0, "s3": 1.0, "s4": 1.0, "s5": 1.0}
    res = bench.paired(a, b)
    assert (res["wins"], res["losses"], res["ties"]) == (2, 2, 1)
    logr = [math.log(a[k] / b[k]) for k in sorted(a)]
    assert res["wilcoxon_p"] == pytest.approx(stats.wilcoxon(logr).pvalue)
    assert res["geo_mean_ratio"] == pytest.approx(math.exp(sum(logr) / 5))
    assert res["mean_ratio"] == pytest.approx(8.5 / 6.0)


def test_passkey_prompt_places_needle(tiny):
    _, tok = tiny
    ctx, q = passkey_prompt(tok, 300, 0.5, "12345")
    assert ctx.shape == (1, 300)
    text = "".join(chr(i) for i in ctx[0].tolist())  # CharTokenizer ids are ord % 61; check the needle position
    needle = tok(" The pass key is 12345").input_ids[0].tolist()
    ids = ctx[0].tolist()
    at = next(i for i in range(300) if ids[i:i + len(needle)] == needle)
    assert abs(at - 0.5 * (300 - len(tok(" The pass key is 12345. Remember it. 12345 is the pass key. ").input_ids[0]))) <= 1
    assert text  # decodable


@pytest.mark.model
def test_cli_on_bundled_model(tmp_path):
    out = tmp_path / "cli.jsonl"
    argv = ["bench", "kl", "--methods", "knorm", "jacap", "--ratios", "0.5", "--lengths", "64", "--continuation", "4",
            "--segments", "prose/letter", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    assert len(files.read_jsonl(out)) == 2
    cfg = json.loads(out.with_suffix(".config.json").read_text())["runs"][0]
    assert cfg["model"]["sha256"] and cfg["versions"]["kvpress"] and cfg["methods"]["jacap"]["tau"] == JacapPress().tau
    assert cli.main(argv) == 0 and len(files.read_jsonl(out)) == 2
    assert len(files.read_runs(out)) == 2  # one configuration per invocation


@pytest.mark.model
def test_passkey_subcommand_on_bundled_model(tmp_path):
    """`jacap bench passkey` end to end into a new folder: one row per method, the seeded key, `correct`
    meaning the key is in the answer, the uncompressed answer equal to greedy decoding done here with
    model.generate on the same context + question, and a rerun that resumes (no new row)."""
    import random

    from jacap_lib import load_model

    out = tmp_path / "new" / "pk.jsonl"
    argv = ["bench", "passkey", "--methods", "jacap", "--ratios", "0.5", "--lengths", "96", "--depths", "0.5",
            "--trials", "1", "--seed", "3", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    rows = files.read_jsonl(out)
    key = str(random.Random(3).randrange(10000, 100000))
    assert [(r["method"], r["ratio"]) for r in rows] == [("full", 0.0), ("jacap", 0.5)]
    for r in rows:
        assert r["key"] == key and r["length"] == 96 and r["depth"] == 0.5 and r["correct"] == (key in r["answer"])
    model, tok = load_model(device="cpu")
    ctx, question = passkey_prompt(tok, 96, 0.5, key)
    ids = torch.cat([ctx, question], 1)
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             pad_token_id=tok.eos_token_id)
    assert tok.decode(gen[0, ids.shape[1]:]) == rows[0]["answer"]
    assert cli.main(argv) == 0 and len(files.read_jsonl(out)) == 2


def test_too_short_segment_writes_nothing(tiny, tmp_path):
    model, tok = tiny
    out = tmp_path / "q.jsonl"
    segs = SEG + [{"id": "prose/short", "kind": "prose", "split": "test", "text": "too short"}]
    with pytest.raises(ValueError, match="segment prose/short"):
        bench.run_kl(model, tok, segments=segs, methods=["knorm"], ratios=[0.5], lengths=[48], continuation=8,
                     out=out, model_name="tiny", progress=False)
    assert not out.exists()


def test_bootstrap_ci_against_scipy_and_degenerate_cases():
    import numpy as np
    from scipy import stats

    x = [0.3, 1.2, 0.7, 2.5, 0.1, 0.9]
    m, lo, hi = bench.bootstrap_ci(x, n_boot=999, seed=3)
    want = stats.bootstrap((np.array(x),), np.mean, n_resamples=999, method="percentile",
                           rng=np.random.default_rng(3)).confidence_interval
    assert m == pytest.approx(np.mean(x)) and (lo, hi) == pytest.approx((want.low, want.high))
    assert min(x) < lo < m < hi < max(x)
    assert bench.bootstrap_ci([2.0]) == (2.0, 2.0, 2.0) and bench.bootstrap_ci([1.5, 1.5]) == (1.5, 1.5, 1.5)
    with pytest.raises(ValueError, match="at least one"):
        bench.bootstrap_ci([])
