"""Committed results files either record the library's default options or say why not: every option a
file records for a press (its ``"methods"`` records, a ``"jacap_prompt"`` options mapping, the failure demos'
``"options"``/``"setup"``) is compared with what the library builds today, and a difference must be named
in the file's configuration under ``"non_default"`` with a reason."""
from __future__ import annotations

import json

import pytest

from jacap_lib.presses.jacap import JacapPromptPress
from jacap_lib.results import paths
from jacap_lib.experiments.defaults import MARKER, deviations, unexplained

DEFAULT = JacapPromptPress()


def results_files():
    root = paths.data_dir()
    return sorted(p for p in root.rglob("*.json") if "texts" not in p.relative_to(root).parts)


@pytest.mark.parametrize("path", results_files(), ids=lambda p: str(p.relative_to(paths.data_dir())))
def test_committed_options_are_defaults_or_explained(path):
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        pytest.skip("not a results object")
    bad = unexplained(data)
    listed = "\n".join(f"  {d}" for d in bad[:20])
    options = sorted({d.option for d in bad})
    assert not bad, (f"{path.name} records {len(bad)} option value(s) that differ from the library's defaults "
                     f"without saying so:\n{listed}\nRegenerate the file with today's defaults, or add to its "
                     f"configuration (each run's, for a .config.json) \"{MARKER}\": "
                     + "{" + ", ".join(f'"{o}": "<why>"' for o in options) + "}")


def jacap_record(**over):
    rec = {"class": "JacapPromptPress", "compression_ratio": 0.5, "tau": DEFAULT.tau, "noise": DEFAULT.noise,
           "n_sink": DEFAULT.n_sink, "window": DEFAULT.window, "gqa": DEFAULT.gqa, "centre": DEFAULT.centre}
    rec.update(over)
    return rec


def test_a_silent_deviation_is_caught_and_a_named_one_is_not():
    other = DEFAULT.window + 5
    data = {"config": {"methods": {"jacap_prompt": jacap_record(window=other)}}, "rows": []}
    (dev,) = unexplained(data)
    assert (dev.option, dev.recorded, dev.default) == ("window", other, DEFAULT.window)
    assert "config.methods.jacap" in dev.where
    data["config"][MARKER] = {"window": "a study of the window"}
    assert unexplained(data) == [] and deviations(data)[0].explained == "a study of the window"
    data["config"][MARKER] = {"window": "  "}          # a reason must say something
    assert len(unexplained(data)) == 1


def test_an_option_set_in_the_method_spec_is_the_methods_own():
    other = DEFAULT.window + 5
    data = {"config": {"methods": {f"jacap_prompt[window={other}]": jacap_record(window=other)}}}
    assert deviations(data) == []
    data = {"config": {"methods": {f"jacap_prompt[window={other}]": jacap_record(window=other, n_sink=DEFAULT.n_sink + 1)}}}
    assert [d.option for d in unexplained(data)] == ["n_sink"]


def test_wrapped_presses_sidecars_and_loose_option_mappings():
    wrapped = {"class": "AdaKVPress", "press": jacap_record(n_sink=DEFAULT.n_sink + 1), "alpha_safeguard": 0.2}
    sidecar = {"runs": [{"methods": {"jacap_prompt_adakv": wrapped}},
                        {"methods": {"jacap_prompt_adakv": wrapped}, MARKER: {"n_sink": "protects a prefix"}}]}
    devs = deviations(sidecar)
    assert [(d.where.split(".")[0], d.option, d.explained) for d in devs] == [
        ("runs[0]", "n_sink", None), ("runs[1]", "n_sink", "protects a prefix")]
    assert len(unexplained(sidecar)) == 1
    loose = {"config": {"jacap_prompt": {"window": DEFAULT.window + 1, "tau": DEFAULT.tau, "centre": DEFAULT.centre}},
             "rows": [{"cases": [{"options": {"n_sink": 26, "protection": "prefix"}}]}]}
    assert sorted(d.option for d in unexplained(loose)) == ["n_sink", "window"]
    # an option a record lacks is not compared (nothing is implied): the committed records all name their centre
    old = {"config": {"jacap_prompt": {"window": DEFAULT.window, "tau": DEFAULT.tau}}}
    assert unexplained(old) == []
    (dev,) = unexplained({"config": {"jacap_prompt": {"window": DEFAULT.window, "tau": DEFAULT.tau, "centre": "tempered"}}})
    assert (dev.option, dev.recorded, dev.default) == ("centre", "tempered", "observed")
    # a baseline's record is compared with today's kvpress defaults too
    from jacap_lib.presses.registry import build_press, method_options

    snap = method_options(build_press("snapkv", 0.5))
    assert deviations({"config": {"methods": {"snapkv": snap}}}) == []
    snap_off = dict(snap, window_size=snap["window_size"] + 1)
    assert [d.option for d in deviations({"config": {"methods": {"snapkv": snap_off}}})] == ["window_size"]


def test_bad_input():
    with pytest.raises(ValueError, match="data"):
        deviations([1, 2])


def test_top_level_shared_parameters_are_compared():
    data = {"config": {"window": DEFAULT.window + 3, "tau": DEFAULT.tau, "centre": DEFAULT.centre, "budget": 56},
            "rows": []}
    assert [(d.option, d.where) for d in unexplained(data)] == [("window", "config")]
    data["config"][MARKER] = {"window": "a short demo"}
    assert unexplained(data) == []


def test_deff_frac_counts_only_with_the_effective_dimension_rule():
    other = DEFAULT.deff_frac * 2
    fixed = {"config": {"jacap_prompt": {"noise": 1.0, "deff_frac": other, "tau": DEFAULT.tau, "centre": DEFAULT.centre}},
             "rows": []}
    assert unexplained(fixed) == []  # no effect with a fixed noise
    rule = {"config": {"jacap_prompt": {"noise": "deff", "deff_frac": other, "tau": DEFAULT.tau, "centre": DEFAULT.centre}},
            "rows": []}
    devs = {d.option: d for d in unexplained(rule)}
    assert set(devs) == {"noise", "deff_frac"}
    assert (devs["deff_frac"].recorded, devs["deff_frac"].default) == (other, DEFAULT.deff_frac)


def test_the_evaluations_settings_mapping_is_compared_like_methods():
    """The evaluation's sidecars record ``settings`` ({spec: press options}); a bare spec made under other defaults
    is a deviation unless the run says why."""
    from jacap_lib.presses.registry import method_options, press_from_spec

    now = method_options(press_from_spec("jacap_prompt", 0.5))
    run = {"settings": {"jacap_prompt": {**now, "beta": None}, "knorm": method_options(press_from_spec("knorm", 0.5))}}
    (dev,) = unexplained({"runs": [run]})
    assert (dev.option, dev.recorded) == ("beta", None) and "settings.jacap" in dev.where
    # tau has no effect at the default observed centre: a different tau is no deviation there
    assert unexplained({"runs": [{"settings": {"jacap_prompt": {**now, "tau": now["tau"] + 7.0}}}]}) == []
    run[MARKER] = {"beta": "made under the defaults of the day"}
    assert unexplained({"runs": [run]}) == []


def test_every_committed_jacap_record_names_its_centre():
    """A Jacap press's record without ``centre`` would read as today's default; the records made before the option
    existed were given the value they meant (the tempered softmax), so every committed one names it."""
    import glob
    import json

    from jacap_lib.results.paths import repo_path

    def missing(o, where):
        if isinstance(o, dict):
            if "tau" in o and "noise" in o and o.get("class", "JacapPromptPress") != "CapPress" and "centre" not in o:
                yield where
            for k, v in o.items():
                yield from missing(v, f"{where}.{k}")
        elif isinstance(o, list):
            for i, v in enumerate(o):
                yield from missing(v, f"{where}[{i}]")

    found = []
    for path in sorted(glob.glob(str(repo_path("data") / "**" / "*.json"), recursive=True)):
        with open(path) as f:
            found += list(missing(json.load(f), path.rsplit("data/", 1)[-1]))
    assert found == []
