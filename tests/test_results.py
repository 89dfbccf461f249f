"""The results layer: one locator of data/ (with the JACAP_DATA override), one file shape with errors
that name the file, one loader per committed results file, one provenance record."""
import json

import pytest

from jacap_lib.results import files
from jacap_lib.results import loaders
from jacap_lib.results import paths
from jacap_lib.results import provenance


def test_data_dir_is_the_clone_and_follows_the_env_override(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    here = paths.data_dir()
    assert (here / "results" / "eval" / "summary.json").is_file() and here.name == "data"
    (tmp_path / "results").mkdir()
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path))
    assert paths.data_dir() == tmp_path.resolve()
    assert paths.repo_path("data/texts/x.txt") == tmp_path.resolve() / "texts" / "x.txt"
    with pytest.raises(FileNotFoundError, match="summary.json"):
        loaders.load_eval_summary()
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="JACAP_DATA"):
        paths.data_dir()


def test_malformed_files_are_named(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(files.ResultsFileError, match=r"x\.json is not valid JSON \(line 1"):
        files.read_json(bad)
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(files.ResultsFileError, match=r"x\.json has no \['config'\]"):
        files.read_results(bad)
    grid = tmp_path / "g.jsonl"
    grid.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(files.ResultsFileError, match=r"g\.jsonl line 2 must be a JSON object"):
        files.read_jsonl(grid)
    grid.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(files.ResultsFileError, match=r"g\.jsonl line 2 is not valid JSON"):
        files.read_jsonl(grid)
    with pytest.raises(FileNotFoundError, match="jacap serve-run"):
        loaders.load_serving_run(tmp_path / "missing.json")


def test_common_shape_round_trip_and_sidecar(tmp_path):
    path = files.write_results(tmp_path / "sub" / "r.json", {"tau": 10.0}, [{"kl": 0.25}], seconds=1.5)
    assert files.read_results(path) == ({"tau": 10.0}, [{"kl": 0.25}])
    assert not list(tmp_path.rglob("*.tmp"))
    grid = tmp_path / "g.jsonl"
    files.append_jsonl(grid, {"k": 1})
    files.append_jsonl(grid, {"k": 2})
    files.append_run(grid, {"run": 1})
    files.append_run(grid, {"run": 2})
    assert files.read_jsonl(grid) == [{"k": 1}, {"k": 2}]
    assert files.read_runs(grid) == [{"run": 1}, {"run": 2}] and files.config_path(grid).name == "g.config.json"
    assert files.round_floats({"a": [0.123456789, float("nan")], "b": 3}) == {"a": [0.12346, pytest.approx(float("nan"), nan_ok=True)], "b": 3}


def test_every_committed_results_file_loads():
    summary = loaders.load_eval_summary()
    assert summary["families"] and summary["cells_measured"]
    rows = loaders.load_eval_rows("dev")
    assert rows and all(r["split"] == "dev" for r in rows)
    assert loaders.load_eval_rows("tune") and loaders.load_eval_runs("dev")[-1]["versions"]
    assert loaders.load_eval_choices()["chosen"]["jacap_prompt"]
    for part in loaders.DECOMPOSITION_PARTS:
        config, recs = loaders.load_decomposition(part)
        assert config["prefix"] == 384 and recs and "layer" in recs[0]
    _, demos = loaders.load_failures()
    assert demos and all(d["name"] == name for name, d in demos.items())
    config, kl = loaders.load_kl_table()
    assert config["prompt_tokens"] > 0 and {r["method"] for r in kl} >= {"jacap_prompt", "snapkv"}
    assert loaders.load_serving_run()["runs"]
    assert "scoring_cpu" in loaders.available_benches() and loaders.load_bench("scoring_cpu")["rows"]
    assert len(loaders.load_manifest()["segments"]) == 12
    with pytest.raises(ValueError, match="part"):
        loaders.load_decomposition("nosuch")


def test_segments_are_hash_checked(tmp_path, monkeypatch):
    from jacap_lib.results.texts import load_segments

    segs = load_segments(["prose/letter"])
    assert len(segs) == 1 and segs[0]["text"]
    with pytest.raises(ValueError, match="unknown segment"):
        load_segments(["prose/nosuch"])
    # a copy of data/ with one segment changed is refused, naming it
    import shutil
    shutil.copytree(paths.data_dir() / "texts", tmp_path / "texts")
    (tmp_path / "texts" / "prose" / "letter.txt").write_text("changed")
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="prose/letter .*sha256"):
        load_segments(["prose/letter"])


def test_provenance_record():
    v = provenance.versions()
    assert v["python"].count(".") == 2 and v["torch"] and "kvpress" in v
    rec = provenance.provenance(command="jacap x")
    assert rec["command"] == "jacap x" and rec["time"].endswith("+00:00")
    assert rec["git"] is None or len(rec["git"].split("+")[0]) == 40
    assert set(rec["model"]) >= {"name", "sha256"}


def test_an_unrelated_data_folder_is_skipped(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    monkeypatch.setattr(paths, "_package_data", lambda: tmp_path / "site-packages" / "data")
    (tmp_path / "site-packages" / "data").mkdir(parents=True)  # some other package's data/
    (tmp_path / "clone" / "data" / "texts").mkdir(parents=True)
    (tmp_path / "clone" / "data" / "texts" / "manifest.json").write_text("{}")
    (tmp_path / "clone" / "book").mkdir()
    monkeypatch.chdir(tmp_path / "clone" / "book")
    assert paths.data_dir() == (tmp_path / "clone" / "data").resolve()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="JACAP_DATA"):
        paths.data_dir()


def test_protection_fills_the_budget_where_floor_of_the_kept_share_is_at_most_sinks_plus_window():
    from jacap_lib.experiments.protection import protection_fills_budget as fills
    # kvpress keeps floor((1 - c) L): 512 at c = 0.75 keeps 128 <= 4 + 128; at c = 0.5 it keeps 256 > 132
    spec = "jacap_prompt[centre=tempered,tau=3,beta=0.9,window=128]"
    assert fills(spec, 512, 0.75) and not fills(spec, 512, 0.5)
    assert fills(spec, 1024, 0.9) and not fills(spec, 2048, 0.9)  # 102 <= 132 < 204
    assert fills("jacap_prompt_adakv[window=128]", 1024, 0.95)  # the AdaKV wrapper's scorer has the same protection
    assert not fills("jacap_prompt[window=16]", 512, 0.95)  # 25 > 4 + 16: the score chooses 5 tokens
    assert fills("jacap_prompt[window=21]", 512, 0.95) and not fills("jacap_prompt[window=20]", 512, 0.95)  # the edge, both sides
    assert not fills("snapkv", 512, 0.95)  # no Jacap protection
    with pytest.raises(ValueError, match="ratio"):
        fills(spec, 512, 1.0)
