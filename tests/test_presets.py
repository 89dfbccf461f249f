"""The preset table: each row builds the press its source says, checked against the committed records."""
from __future__ import annotations

import dataclasses

import pytest

from jacap_lib import JacapPress, JacapPromptPress
from jacap_lib.presses import registry as R
from jacap_lib.presses.presets import PRESETS, Preset, list_presets, preset
from jacap_lib.results import files, loaders
from jacap_lib.results.paths import data_path


def _options(spec_or_press) -> dict:
    press = R.press_from_spec(spec_or_press, 0.5) if isinstance(spec_or_press, str) else spec_or_press
    opts = R.method_options(press)
    return {k: v for k, v in opts.items() if k not in R.inert_options(opts) and k != "class"}


def test_every_row_names_every_option_of_its_press():
    """A row means one press whatever the class defaults are: it names every option the press's record has
    (the compression ratio aside), so no option is read from a default."""
    for name, row in PRESETS.items():
        record = R.method_options(row.press(0.5))
        missing = set(record) - set(row.options) - {"class", "compression_ratio"} - R.inert_options(record)
        assert not missing, (name, missing)
        assert _options(row.press(0.5)) == {**{k: v for k, v in row.options.items()
                                               if k not in R.inert_options(row.options)}, "compression_ratio": 0.5}


def test_the_class_defaults_are_their_rows():
    """JacapPromptPress() and JacapPress() build their rows: a class default that moves fails here until its row
    (and the row's source) moves with it."""
    assert PRESETS["jacap_prompt_default"].spec() == R.written_out("jacap_prompt")
    assert PRESETS["jacap_default"].spec() == R.written_out("jacap")
    assert _options(JacapPromptPress(0.5)) == _options(PRESETS["jacap_prompt_default"].spec())
    assert _options(JacapPress(0.5)) == _options(PRESETS["jacap_default"].spec())
    assert isinstance(PRESETS["jacap_default"].press(0.5), JacapPress)


def test_the_rows_are_the_settings_the_records_hold():
    """Each tuned row is what its source names: the context space's tune choice (jacap_default), the capacity press
    with the observed centre chosen on tune (jacap_prompt_default), the ablations' recorded base
    (algorithm1_as_ablated), the first setting of Algorithm 1's grid and of the context grid, both with rows in the
    committed tune files."""
    context = loaders.load_eval_choices(space="context")["chosen"]["jacap"]
    assert _options(context) == _options(PRESETS["jacap_default"].spec())
    first = loaders.load_eval_choices()["chosen"]
    assert _options(first["jacap_obs"]) == _options(PRESETS["jacap_prompt_default"].spec())
    runs = files.read_json(data_path("results", "eval", "ablation.config.json"))["runs"]
    assert {r["default"] for r in runs} == {PRESETS["algorithm1_as_ablated"].spec()}
    tune = {r["method"] for r in files.read_jsonl(data_path("results", "eval", "tune.jsonl"))}
    assert PRESETS["algorithm1_as_published"].spec() in tune
    assert PRESETS["algorithm1_as_ablated"].spec(window=128) == first["jacap_prompt"]
    context_tune = {r["method"] for r in files.read_jsonl(data_path("results", "eval", "context", "tune.jsonl"))}
    assert PRESETS["context_as_first_tuned"].spec() in context_tune


def test_the_protocol_and_the_ablations_write_their_settings_on_the_rows():
    from jacap_lib.experiments import ablation as A
    from jacap_lib.experiments.protocol import rules as P

    assert P.SEARCH_SPACE["jacap_prompt"][0] == P.PAPER_PRESET == PRESETS["algorithm1_as_published"].spec()
    assert P.CONTEXT_SPACE["jacap"][0] == PRESETS["context_as_first_tuned"].spec()
    assert A.knob_spec(A.DEFAULT_SPEC) == PRESETS[A.BASE_PRESET].spec()
    # a spec's own option wins over the row's; an alias's option (jacap_obs's centre) too
    assert R.parse_method(A.knob_spec("jacap_prompt[window=8]"))[1]["window"] == 8
    assert R.parse_method(A.knob_spec("jacap_obs"))[1]["centre"] == "observed"


def test_spec_changes_and_method():
    row = PRESETS["algorithm1_as_published"]
    assert R.parse_method(row.spec(tau=3))[1]["tau"] == 3
    name, opts = R.parse_method(row.spec("jacap_prompt_adakv"))
    assert name == "jacap_prompt_adakv" and opts["tau"] == 10
    assert row.options["tau"] == 10  # spec() changes a copy


def test_bad_names_are_refused():
    with pytest.raises(ValueError, match="preset must be one of algorithm1_as_published"):
        preset("nosuch")
    assert preset("jacap_default") is PRESETS["jacap_default"]
    assert list_presets()[0] == "algorithm1_as_published"
    with pytest.raises(dataclasses.FrozenInstanceError):
        PRESETS["jacap_default"].method = "snapkv"
    assert isinstance(PRESETS["jacap_default"], Preset)
