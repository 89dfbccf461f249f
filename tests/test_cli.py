"""`jacap` (jacap_lib.cli): every subcommand has --help; a bad call exits with status 2 naming the
argument, before any model is loaded, and writes nothing."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kvpress")
from jacap_lib import cli  # noqa: E402

def _leaves(table=cli.COMMANDS, path=()):
    """Every job of the ``jacap`` table, as its words (``["bench", "kl"]``, ``["inspect"]``, ...)."""
    for name, entry in table.items():
        if isinstance(entry[1], dict):
            yield from _leaves(entry[1], path + (name,))
        else:
            yield list(path + (name,))


SUBCOMMANDS = list(_leaves())
GROUPS = [[name] for name, entry in cli.COMMANDS.items() if isinstance(entry[1], dict)]


def test_the_table_names_every_job():
    assert SUBCOMMANDS == [["book", "build"], ["compare-decoding"], ["decompose"],
                           ["diagnose", "mechanisms"], ["diagnose", "query-stats"], ["evaluate", "tune"],
                           ["evaluate", "dev"], ["evaluate", "time"], ["evaluate", "summary"], ["evaluate", "candidates"],
                           ["evaluate", "confirm-plan"], ["evaluate", "confirm"],
                           ["evaluate", "confirm-summary"], ["evaluate", "ablate"],
                           ["evaluate", "ablate-summary"], ["evaluate", "needle"], ["evaluate", "needle-summary"],
                           ["evaluate", "record"], ["evaluate", "kvzip-ladder"], ["evaluate", "kvzip-ladder-summary"],
                           ["evaluate", "field-summary"], ["evaluate", "anatomy"], ["inspect"], ["serve-run"],
                           ["texts"], ["time", "scoring"], ["time", "e2e"]]


@pytest.mark.parametrize("sub", SUBCOMMANDS + GROUPS, ids=lambda s: " ".join(s))
def test_help(sub, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(sub + ["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("usage: jacap " + " ".join(sub) + " ")


def test_python_dash_m_and_help_of_a_benchmark():
    out = subprocess.run([sys.executable, "-m", "jacap_lib", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    assert all(name in out.stdout for name in cli.COMMANDS)  # the top-level list names every subcommand


HEAVY = ("torch", "transformers", "kvpress")
# `jacap ARGS` in a fresh interpreter that, on exit, writes which of HEAVY were imported to the file $HEAVY_OUT
_JACAP = ("import atexit, os, sys\n"
          "atexit.register(lambda: open(os.environ['HEAVY_OUT'], 'w').write("
          "' '.join(m for m in %r if m in sys.modules)))\n"
          "from jacap_lib.cli import main\n"
          "sys.exit(main(sys.argv[1:]))\n" % (HEAVY,))


def _jacap(argv, tmp_path, env=None):
    """Run ``jacap argv`` in a subprocess; returns (the completed process, the HEAVY modules it imported)."""
    import os

    heavy = tmp_path / "heavy.txt"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))}
    out = subprocess.run([sys.executable, "-c", _JACAP, *argv], capture_output=True, text=True, timeout=300,
                         env={**base, **(env or {}), "OMP_NUM_THREADS": "1", "HEAVY_OUT": str(heavy)},
                         cwd=Path(__file__).resolve().parents[1])
    loaded = heavy.read_text().split()
    heavy.unlink()
    return out, loaded


@pytest.mark.parametrize("sub", [[], ["diagnose"], ["evaluate"]], ids=lambda s: " ".join(s) or "top")
def test_help_imports_no_job_module(sub, tmp_path):
    """``jacap --help`` and a group's help list every subcommand with its help without importing any job
    module (so neither torch, transformers nor kvpress): the table names jobs as ``module:attribute``."""
    out, loaded = _jacap(sub + ["--help"], tmp_path)
    assert out.returncode == 0 and loaded == [], (loaded, out.stderr[-2000:])
    table = cli.COMMANDS if not sub else cli.COMMANDS[sub[0]][1]
    names = re.findall(r"^    (\S+)", out.stdout, flags=re.M)
    assert names == list(table)  # every subcommand, in the table's order, each with its help
    assert sub or {"compare-decoding", "evaluate", "inspect"} <= set(names)


def test_the_tables_help_is_each_jobs_own():
    """The one-line help in :data:`COMMANDS` (shown without importing the job) is the job's ``help``."""
    from jacap_lib.experiments.job import _resolve

    def walk(table):
        for entry in table.values():
            if isinstance(entry[1], dict):
                yield from walk(entry[1])
            else:
                yield entry
    for help_, target in walk(cli.COMMANDS):
        assert help_ == _resolve(target).help, target


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model (or its weights) fails the test: the checks must all run before."""
    import jacap_lib.models

    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(jacap_lib.models, "load_model", boom)


@pytest.mark.parametrize("sub", SUBCOMMANDS + GROUPS, ids=lambda s: " ".join(s))
def test_an_unknown_option_prints_the_subcommands_usage(sub, tmp_path, monkeypatch, no_model, capsys):
    """``jacap <sub> --bad-flag``: that subcommand's usage (not the top-level one), status 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main(sub + ["--bad-flag"])
    err = capsys.readouterr().err
    prog = "jacap " + " ".join(sub)
    assert e.value.code == 2 and err.startswith(f"usage: {prog} ") and f"{prog}: error:" in err
    assert list(tmp_path.iterdir()) == []


def test_a_bad_value_prints_the_subcommands_usage(capsys):
    """A value refused by the job's checks (not by argparse) also reports with the subcommand's usage."""
    with pytest.raises(SystemExit) as e:
        cli.main(["inspect", "--ratio", "1.5"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: jacap inspect ") and "--ratio" in err


def test_shared_options_have_one_default():
    """--model/--threads/--out/--no-progress: declared by one helper, the same default in every job."""
    parser = cli.build_parser()
    seen = {}
    for sub in SUBCOMMANDS:
        leaf = parser.parse_args(sub + (["--out", "x.jsonl"] if sub[0] == "bench" else []) +
                                 (["--inp", "x"] if sub == ["bench", "summary"] else []))
        for opt in ("model", "threads", "no_progress", "out"):
            if hasattr(leaf, opt) and not (opt == "out" and sub[0] == "bench"):
                seen.setdefault(opt, set()).add(repr(getattr(leaf, opt)))
    assert seen == {"model": {"None"}, "threads": {"1"}, "no_progress": {"False"}, "out": {"None"}}


def test_prepared_turns_a_checks_value_error_into_a_bad_argument():
    """J.prepared: a ValueError (a ResultsFileError too) or FileNotFoundError of the checks becomes a BadArgument
    with the same message; a BadArgument passes as it is; any other error is no bad argument and stays itself."""
    from jacap_lib.results import files
    from jacap_lib.experiments import job as J

    def fail(error):
        raise error

    assert J.prepared(lambda a, *, b: (a, b), 1, b=2) == (1, 2)
    for error in (ValueError("--x: bad"), FileNotFoundError("--x: bad"), files.ResultsFileError("--x: bad")):
        with pytest.raises(J.BadArgument) as e:
            J.prepared(fail, error)
        assert str(e.value) == "--x: bad" and type(e.value) is J.BadArgument
    own = J.BadArgument("--y: bad")
    with pytest.raises(J.BadArgument) as e:
        J.prepared(fail, own)
    assert e.value is own
    with pytest.raises(RuntimeError, match="not an argument"):
        J.prepared(fail, RuntimeError("not an argument"))


def test_grid_options_name_each_jobs_defaults():
    """--lengths/--ratios/--continuation: default None (the job's own), which the help names."""
    import argparse

    from jacap_lib.experiments import job as J

    ap = argparse.ArgumentParser()
    J.grid_options(ap, lengths=(2048, 512), ratios=(0.5, 0.9), continuation=64)
    helps = {a.dest: a.help for a in ap._actions if a.dest != "help"}
    assert helps == {"lengths": "prompt tokens (default 2048 512)", "ratios": "compression ratios (default 0.5 0.9)",
                     "continuation": "continuation tokens scored (default 64)"}
    assert vars(ap.parse_args([])) == {"lengths": None, "ratios": None, "continuation": None}
    assert vars(ap.parse_args(["--lengths", "80", "96", "--ratios", "0.75"])) == {
        "lengths": [80, 96], "ratios": [0.75], "continuation": None}
    ap = argparse.ArgumentParser()
    J.grid_options(ap, lengths=(512,), ratios=(0.5,))  # no continuation: no --continuation
    assert vars(ap.parse_args([])) == {"lengths": None, "ratios": None}


BAD = [
    (["evaluate", "tune", "--dir", "{tmp}/e", "--ratios", "1.0"], "--ratios"),
    (["evaluate", "tune", "--dir", "{tmp}/e", "--methods", "nosuch"], "nosuch"),
    (["evaluate", "tune", "--dir", "{tmp}/e", "--lengths", "0"], "--lengths"),
    (["evaluate", "summary", "--dir", "{tmp}/none"], "does not exist"),
    (["decompose", "--out", "{tmp}/d", "--ratio", "1.2"], "ratio"),
    (["decompose", "--out", "{tmp}/d", "--sel-n", "30"], "sel-n"),
    (["decompose", "--out", "{tmp}/d", "--text", "{tmp}/none.txt"], "text"),
    (["inspect", "--method", "nosuch"], "--method"),
    (["inspect", "--kl-table", "--ratios", "0.5", "-0.1"], "--ratios"),
    (["inspect", "--kl-table", "--layer", "1"], "--layer"),
    (["inspect", "--layer", "-1"], "--layer"),
    (["inspect", "--head", "-2", "--layer", "0"], "--head"),
    (["inspect", "--head", "1"], "--head needs --layer"),
    (["inspect", "--html", "{tmp}/e.png"], "--html"),
    (["inspect", "--html", "{tmp}"], "--html"),
    (["inspect", "--text", ""], "--text"),
    (["inspect", "--text", "a", "--file", "{tmp}/t.txt"], "--text and --file"),
    (["inspect", "--file", "{tmp}/none.txt"], "--file"),
    (["inspect", "--model", "two words"], "--model"),
    (["inspect", "--model", "no/such"], "--model: model 'no/such' is not"),
    (["inspect", "--kl-table", "--model", "no/such"], "--model: model 'no/such' is not"),
    (["decompose", "--out", "{tmp}/d", "--model", "no/such"], "--model: model 'no/such' is not"),
    (["evaluate", "tune", "--dir", "{tmp}/e", "--model", "no/such"], "--model: model 'no/such' is not"),
    (["evaluate", "needle", "--dir", "{tmp}/e", "--model", "no/such"], "--model: model 'no/such' is not"),
    (["serve-run", "--out", "{tmp}/x.txt"], "must end in .json"),
    (["serve-run", "--threads", "0"], "--threads"),
    (["compare-decoding", "--out", "{tmp}/x.txt"], "must end in .json"),
    (["compare-decoding", "--prompts", "7"], "--prompts"),
    (["diagnose", "mechanisms", "--taus", "0"], "--taus"),
    (["diagnose", "query-stats", "--segments", "prose/nosuch"], "unknown segment"),
    (["time", "e2e", "--repeats", "0", "--out", "{tmp}/e.json"], "--repeats"),
    (["time", "scoring", "--N", "0", "--out", "{tmp}/s.json"], "--N"),
    (["texts", "--out", "{tmp}"], "prose"),
    (["evaluate", "tune", "--dir", "{tmp}/e", "--ratios", "1.0"], "--ratios"),
    (["evaluate", "tune", "--dir", "{tmp}/e", "--methods", "random"], "not in the search space"),
    (["evaluate", "dev", "--dir", "{tmp}/e"], "run `jacap evaluate tune`"),
    (["evaluate", "time", "--dir", "{tmp}/e", "--lengths", "4096"], "no document has"),
    (["evaluate", "needle", "--dir", "{tmp}/e", "--choices", "{tmp}/none.json"], "run `jacap evaluate tune`"),
    (["evaluate", "needle", "--dir", "{tmp}/e", "--trials", "0"], "--trials"),
    (["evaluate", "needle", "--dir", "{tmp}/e", "--lengths", "16"], "--lengths"),
    (["evaluate", "needle-summary", "--dir", "{tmp}/e"], "run `jacap evaluate needle`"),
    (["evaluate", "anatomy", "--dir", "{tmp}/e"], "run `jacap evaluate dev` first"),
    (["evaluate", "record", "--dir", "{tmp}/e"], "run `jacap evaluate dev` first"),
    (["evaluate", "ablate", "--dir", "{tmp}/e", "--lengths", "8"], "--lengths"),
    (["evaluate", "ablate", "--dir", "{tmp}/e", "--ablations", "nosuch"], "not in the one-knob table"),
    (["evaluate", "ablate-summary", "--dir", "{tmp}/e"], "run `jacap evaluate ablate` first"),
    (["evaluate", "anatomy", "--ratio", "0.6", "--out", "{tmp}/a.json"], "not a cell of the evaluation"),
    (["book", "build", "--root", "{tmp}"], "_config.yml"),
]


@pytest.mark.parametrize("argv,msg", BAD, ids=lambda x: x if isinstance(x, str) else " ".join(x[:3]))
def test_bad_arguments_fail_before_any_work(argv, msg, tmp_path, no_model, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no row asks the Hub: an uncached id is unusable here
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err
    prog = "jacap " + " ".join(a for a in argv[:2] if not a.startswith("-"))
    assert err.startswith(f"usage: {prog} ")  # the subcommand's usage
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_time_runs_the_speed_benchmark(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli.main(["time", "scoring", "--quick", "--N", "64", "--d", "16", "--device", "cpu", "--out", str(out)]) == 0
    from jacap_lib.results import files

    data = files.read_json(out, require=("rows", "environment"))
    assert {r["method"] for r in data["rows"]} >= {"floor", "jacap_torch", "capkv"}
    assert data["environment"]["packages"]["torch"] and "git" in data["environment"]
    with pytest.raises(SystemExit) as e:
        cli.main(["time", "e2e", "--bogus", "--out", str(tmp_path / "e.json")])
    assert e.value.code == 2 and not (tmp_path / "e.json").exists()


@pytest.mark.model
def test_serving_job_on_the_bundled_model(tmp_path):
    """`jacap serve-run`'s job with a short configuration: evictions happen, every run is scored on the
    same tokens, and the file carries its configuration and provenance."""
    from jacap_lib.models import load_model
    from jacap_lib.results import files
    from jacap_lib.experiments.serving import CONFIG, run_serving

    model, tok = load_model()
    cfg = dict(CONFIG, n_new=24, high=40, budget=32, interval=4, window=8, betas=[0.5, 0.9], main_beta=0.9,
               tradeoff_betas=[0.5, 0.9], horizon=4)
    data = files.read_json(run_serving(model, tok, out=tmp_path / "s.json", config=cfg, progress=False),
                        require=("config", "runs", "tradeoff", "query_trace"))
    assert set(data["runs"]) == {"0.5", "0.9", "window"} and data["config"]["n_sink"] == 4
    assert data["config"]["provenance"]["versions"]["torch"]
    n = len(data["runs"]["window"]["kl"])
    assert n >= cfg["n_new"] and all(len(r["kl"]) == n for r in data["runs"].values())
    assert all(r["events"] for r in data["runs"].values())  # the watermark was crossed
    assert all(k >= 0 for r in data["runs"].values() for k in r["kl"])


def test_diagnose_passes_its_options_to_the_job(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["diagnose", "mechanisms", "--help"])
    assert e.value.code == 0 and "--taus" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["diagnose", "query-stats", "--bogus"])
    assert e.value.code == 2


def test_inspect_default_ratio_is_the_library_default():
    from jacap_lib.measure.eviction import DEFAULT_RATIO

    args = cli.build_parser().parse_args(["inspect"])
    assert args.ratio == DEFAULT_RATIO == 0.5


def test_inspect_defaults_to_the_default_press_and_its_help_names_it(capsys):
    """No ``--method``: registry ``jacap``, which builds the library's default ``JacapPress``; ``--help`` says so."""
    from jacap_lib import JacapPress, build_press

    args = cli.build_parser().parse_args(["inspect"])
    assert args.method == "jacap" and type(build_press(args.method, args.ratio)) is JacapPress
    with pytest.raises(SystemExit):
        cli.main(["inspect", "--help"])
    help_ = " ".join(capsys.readouterr().out.split())
    assert "(default: jacap, the library's default press JacapPress: Jacap's score on the queries of KVzip's" in help_


@pytest.mark.parametrize("argv,msg", [
    (["--method", "nosuch"], "--method: unknown method 'nosuch'; valid names: "),
    (["--method", "nosuch[window=8]"], "--method: unknown method 'nosuch'; valid names: "),
    (["--layer", "30"], "--layer 30 out of range: the model has 30 layers (0-29)"),
    (["--layer", "0", "--head", "3"], "--head 3 out of range: the model has 3 KV heads (0-2)"),
], ids=["method", "method-with-options", "layer", "head"])
def test_inspect_checks_method_layer_head_before_torch_loads(argv, msg, tmp_path):
    """A misspelt ``--method`` or an out-of-range ``--layer``/``--head``: usage, one error line (a bad method's
    lists the registry's names, as :func:`list_methods` orders them), status 2, nothing printed or written, and
    neither torch, transformers nor kvpress imported (the registry and the model's weights never load; they took
    5-12 s before the error). How long it takes is a benchmark's business, not this test's."""
    from jacap_lib import list_methods

    (tmp_path / "out").mkdir()
    out, loaded = _jacap(["inspect", *argv, "--html", str(tmp_path / "out" / "e.html")], tmp_path)
    err = out.stderr
    assert out.returncode == 2 and err.startswith("usage: jacap inspect "), err[-3000:]
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(f"jacap inspect: error: {msg}"), errors
    if "method" in msg:
        assert errors[0].split("valid names: ")[1] == ", ".join(list_methods())
    assert out.stdout == "" and list((tmp_path / "out").iterdir()) == []
    assert loaded == []


def test_inspects_quick_checks_agree_with_the_registry_and_the_model():
    """The names ``jacap inspect`` checks before torch loads are the registry's; the (layers, KV heads) it reads
    from the bundled model's config.json are transformers' reading of it."""
    from jacap_lib import list_methods
    from jacap_lib.models import load_config
    from jacap_lib.viz.eviction import _layers_and_kv_heads, _registry_names

    assert sorted(_registry_names()) == sorted(list_methods())
    cfg = load_config()
    assert _layers_and_kv_heads(None) == (cfg.num_hidden_layers, cfg.num_key_value_heads) == (30, 3)


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}],
                         ids=["offline", "hub-unreachable"])
def test_inspect_with_an_unavailable_model_fails_like_any_bad_argument(env, tmp_path):
    """No network needed: the Hub is either switched off or pointed at a closed local port. The command ends
    as every bad call does (its usage, then one error line naming --model and the model, status 2), without
    transformers' retries (the old behaviour: a minute of "Retrying in 8s" and a 100-line traceback), and
    before torch, transformers or kvpress is imported. The timeout only guards a hang; no time is asserted."""
    (tmp_path / "out").mkdir()
    out, loaded = _jacap(["inspect", "--model", "no/such-model", "--html", str(tmp_path / "out" / "e.html")],
                         tmp_path, env)
    err = out.stderr
    assert out.returncode == 2 and err.startswith("usage: jacap inspect "), err[-3000:]
    assert "Traceback" not in err and "Retrying" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("jacap inspect: error: --model: model 'no/such-model' is not")
    assert out.stdout == "" and list((tmp_path / "out").iterdir()) == []
    assert loaded == []  # checked with huggingface_hub alone: torch, transformers and kvpress never loaded


# ----------------------------------------------------------------------------- jacap inspect
INSPECT_TEXT = ("Maria keeps her bicycle in the blue shed behind the bakery. Every Tuesday she rides it to the market, "
                "buys three lemons and a loaf of rye bread, and visits her brother Tomas, who repairs old clocks.")


@pytest.fixture(scope="module")
def bundled():
    from jacap_lib.models import load_model

    return load_model()


@pytest.mark.model
def test_inspect_layer_head_and_html_on_own_text(bundled, tmp_path, monkeypatch, capsys):
    from jacap_lib.measure.eviction import parse_view
    from jacap_lib.experiments import job

    monkeypatch.setattr(job, "load_model", lambda args: bundled)
    html = tmp_path / "out" / "e.html"
    assert cli.main(["inspect", "--text", INSPECT_TEXT, "--method", "jacap_prompt[window=8]", "--layer", "3", "--head", "1",
                     "--html", str(html)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("EvictionInspection(jacap_prompt at c=0.5 on SmolLM2-135M-Instruct: N=43 prompt tokens")
    assert out[1] == "  per head: budget 21 = 9 kept by score + 12 protected (first 4 + last 8); 22 evicted"
    i = out.index("layer 3, KV head 1: 9 kept by score + 12 protected of 43")
    runs = parse_view(out[i + 1])
    assert "".join(t for t, _ in runs) == INSPECT_TEXT and runs[0] == ("Maria keeps her bicycle", "protected")
    assert out[-1] == f"wrote {html}"
    text = html.read_text()
    assert all(f'id="cell-{l}-{h}"' in text for l in range(30) for h in range(3))
    # --file, --layer alone (all its heads); a text that leaves the score nothing says so (a 32-token window)
    f = tmp_path / "t.txt"
    f.write_text(INSPECT_TEXT)
    assert cli.main(["inspect", "--file", str(f), "--layer", "0", "--method", "jacap_prompt[window=32]"]) == 0
    out = capsys.readouterr().out
    assert all(f"layer 0, KV head {h}:" in out for h in range(3))
    assert "the window was shrunk to 17" in out and "the score chose nothing" in out


@pytest.mark.model
def test_inspect_text_of_any_length_is_the_prompt(bundled, tmp_path, monkeypatch, capsys):
    """``--text`` is always the text itself, never a path: 10 kB of it (over the 255-byte limit of a file name,
    which the old check tripped with ``OSError: File name too long``) come back marked, token by token."""
    from jacap_lib.measure.eviction import parse_view
    from jacap_lib.experiments import job

    monkeypatch.setattr(job, "load_model", lambda args: bundled)
    monkeypatch.chdir(tmp_path)
    text = " ".join(f"Day {i}: {INSPECT_TEXT}" for i in range(50))[:10_000]
    assert len(text.encode()) == 10_000
    assert cli.main(["inspect", "--text", text, "--method", "jacap_prompt[window=8]", "--layer", "2", "--head", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    n = len(bundled[1](text, add_special_tokens=False)["input_ids"])
    assert out[0].startswith(f"EvictionInspection(jacap_prompt at c=0.5 on SmolLM2-135M-Instruct: N={n} prompt tokens")
    i = next(k for k, line in enumerate(out) if line.startswith("layer 2, KV head 0: "))
    runs = parse_view(out[i + 1])
    assert "".join(t for t, _ in runs) == text  # every character of the text, marked
    chars = {st: sum(len(t) for t, s in runs if s == st) for st in ("kept", "protected", "evicted")}
    assert all(chars.values()) and runs[0][1] == "protected" and runs[-1][1] == "protected"  # sinks, window
    assert list(tmp_path.iterdir()) == []  # printed only
    # a text that names an existing file is still the text, not the file's contents
    name = "notes about the blue shed behind the bakery.txt"
    (tmp_path / name).write_text(INSPECT_TEXT)
    assert cli.main(["inspect", "--text", name, "--layer", "0", "--head", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    i = out.index(next(line for line in out if line.startswith("layer 0, KV head 0: ")))
    assert "".join(t for t, _ in parse_view(out[i + 1])) == name


@pytest.mark.parametrize("argv,msg", [(["--layer", "30"], "--layer 30 out of range: the model has 30 layers"),
                                      (["--layer", "0", "--head", "3"], "--head 3 out of range: the model has 3 KV")])
def test_inspect_layer_head_beyond_the_model_exit_2_and_write_nothing(tmp_path, no_model, capsys, argv, msg):
    """Checked against the bundled model's configuration, before its weights load."""
    with pytest.raises(SystemExit) as e:
        cli.main(["inspect", "--text", INSPECT_TEXT, "--html", str(tmp_path / "e.html"), *argv])
    assert e.value.code == 2 and msg in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
