"""How the book names a setting: one home for every name a figure, a table or a sentence gives a press spec.

:func:`spec_name` names one setting ("the default `JacapPress()`", "Algorithm 1 tuned", "SnapKV"),
:func:`setting_name` a summary family's setting, :func:`short_spec` a written-out spec by the options that set it
apart, :func:`setting_text` the same options in words ("τ = 3, β = 0.9"); :func:`counts_text` and
:func:`or_list` join counts and names for a sentence. Names only: the sentences are :mod:`jacap_lib.report`'s."""
from __future__ import annotations

import re

from jacap_lib.verdicts.rows import ALGORITHM1, is_library_default, is_prompt_default

__all__ = ["short_spec", "setting_text", "spec_name", "setting_name", "DEFAULT_NAME", "PROMPT_NAME", "SETTING_NAMES",
           "counts_text", "or_list"]


def counts_text(counts: dict, unit: str = "cells", *, identical_unit: str = "document") -> str:
    """``"better in 1, worse in 7 and no detectable difference in 4 of 12 cells"`` (kinds with a zero count
    left out; "identical on every document in k")."""
    n = sum(counts.values())
    names = {"identical": f"identical on every {identical_unit}"}
    parts = [f"{names.get(k, k)} in {v}" for k, v in counts.items() if v]
    if not parts:
        return f"no {unit}"
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{body} of {n} {unit}"


_SYMBOLS = {"tau": "τ", "beta": "β", "noise": "σ²", "deff_frac": "deff_frac", "n_sink": "sinks", "window": "window"}


def _differing_options(spec: str) -> dict:
    """The options a spec sets to another value than its registry name's press at today's defaults (the options that
    cannot change what the press does left out): what tells a written-out setting apart in a sentence."""
    import math

    from jacap_lib.presses.registry import build_press, inert_options, method_options, parse_method, quiet_kvpress

    name, opts = parse_method(spec)
    try:
        with quiet_kvpress():
            record = method_options(build_press(name, 0.5))
    except ValueError:
        return opts
    if isinstance(record.get("press"), dict):  # a wrapper's own options beside its scorer's
        record = {**record["press"], **{k: v for k, v in record.items() if k != "press"}}

    def same(a, b):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
            return not isinstance(b, bool) and math.isclose(a, b, rel_tol=1e-12)
        return a == b

    try:
        with quiet_kvpress():
            own = method_options(build_press(name, 0.5, **opts))
    except ValueError:
        own = {}
    own = {**own.get("press", {}), **own} if isinstance(own.get("press"), dict) else own
    inert, idle = inert_options(own or opts), inert_options(record)  # idle: no effect on the reference (tau, observed)
    return {k: v for k, v in opts.items()
            if k not in inert and (k in idle or not (k in record and same(record[k], v)))}


def short_spec(spec: str) -> str:
    """A spec by its name and the options that set it apart from the name's press at today's defaults
    (:func:`_differing_options`): the written-out ``jacap_obs[backend=auto,...,window=16]`` -> ``jacap_obs``; for
    a reader, where the written-out spec is for the record."""
    from jacap_lib.presses.registry import parse_method, with_options

    name = parse_method(spec)[0]
    return with_options(name, **_differing_options(spec))


def setting_text(spec: str) -> str:
    """A method spec by the values that set it apart from its name's press at today's defaults
    (:func:`_differing_options`): ``jacap_prompt[centre=tempered,tau=10,beta=none,...]`` -> ``"flat query statistics, the
    tempered centre, τ = 10, ..."``; ``noise=deff`` -> ``"σ² by the effective-dimension rule"``; a spec that sets
    nothing apart -> its name."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"spec must be a method spec such as 'jacap_prompt[tau=3,beta=0.9]', got {spec!r}")
    if re.fullmatch(r"([^\[\]]+)(?:\[(.*)\])?", spec) is None:
        raise ValueError(f"spec {spec!r} is not of the form name[key=value,...]")
    opts = _differing_options(spec)
    if not opts:
        return spec.split("[", 1)[0]
    order = {k: i for i, k in enumerate(("centre", "tau", "beta", "noise", "deff_frac", "n_sink", "window"))}
    out = []
    for k, v in sorted(opts.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])):
        if k == "beta" and v is None:
            out.append("flat query statistics")
        elif k == "noise" and v == "deff":
            out.append("σ² by the effective-dimension rule")
        elif k == "centre":
            out.append(f"the {v} centre")
        else:
            text = "none" if v is None else str(v).lower() if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else v
            out.append(f"{_SYMBOLS.get(k, k)} = {text}")
    return ", ".join(out)


#: How the findings name each summary family's setting (role -> name); the tune choice that ``JacapPromptPress()``
#: builds is "the prompt press `JacapPromptPress()`", the one ``JacapPress()`` builds "the default `JacapPress()`", and
#: any other tuned Jacap method its registry name (:func:`setting_name`, by the family's role; :func:`spec_name` names a
#: spec the same way).
SETTING_NAMES = {ALGORITHM1: "Algorithm 1 tuned", "paper preset": "Algorithm 1 as published"}


#: the plain-text and the prose form of the name of the press ``JacapPress()`` builds ("the default" means that press
#: only: Jacap on the queries of the context's reconstruction pass)
DEFAULT_NAME = {"legend": "default JacapPress()", "prose": "the default `JacapPress()`"}


#: the same for the press ``JacapPromptPress()`` builds (Jacap on the prompt's recent queries, one prefill)
PROMPT_NAME = {"legend": "JacapPromptPress()", "prose": "the prompt press `JacapPromptPress()`"}


def _committed_chosen() -> dict:
    """The committed tune choices (``{method: spec}``) of every search space (kvpress's newer presses and the context
    press beside the first rounds' methods): :func:`~jacap_lib.results.loaders.load_all_chosen`."""
    from jacap_lib.results.loaders import load_all_chosen

    return load_all_chosen()


def spec_name(spec: str, *, legend: bool = False, choices: dict | None = None) -> str:
    """The book's name of one setting, the one home of that naming. In this order:

    * ``"full"``: "uncompressed";
    * the options ``JacapPress()`` builds today: "the default `JacapPress()`" (``legend=True``: "default
      JacapPress()", plain text for a figure or a printed line);
    * the options ``JacapPromptPress()`` builds today: "the prompt press `JacapPromptPress()`" (``legend=True``:
      "JacapPromptPress()");
    * the tune choice of ``jacap_prompt`` (``choices["chosen"]["jacap_prompt"]``; ``choices``: a ``choices.json``, by default the
      committed choices of every search space): "Algorithm 1 tuned" — the choice defines it, not its options (the paper preset has the tempered
      centre too);
    * the paper's preset (:data:`~jacap_lib.experiments.protocol.rules.PAPER_PRESET`): "Algorithm 1 as published";
    * a kvpress press as kvpress builds it or as the tune chose it: its reader name
      (:func:`~jacap_lib.presses.registry.press_name`: "SnapKV", "Expected Attention");
    * another method's tune choice: its registry name (```jacap_ea```);
    * any other setting: its :func:`short_spec` (```snapkv[window_size=32]```, ```jacap[window=16]```).

    Code (registry names, specs) is in backticks unless ``legend``. Two specs build the same setting when they build
    the same press (:func:`~jacap_lib.experiments.protocol.rules.same_setting`)."""
    from jacap_lib.experiments.protocol import rules as P
    from jacap_lib.presses.registry import PRESS_NAMES, parse_method, press_name

    if not isinstance(spec, str) or not spec:
        raise ValueError(f"spec must be a method spec such as 'snapkv[window_size=16]' or 'full', got {spec!r}")
    if spec == "full":
        return "uncompressed"
    name = parse_method(spec)[0]
    if name.startswith("jacap") and is_prompt_default(spec):
        return PROMPT_NAME["legend" if legend else "prose"]
    if is_library_default(spec):
        return DEFAULT_NAME["legend" if legend else "prose"]
    chosen = (_committed_chosen() if choices is None else choices["chosen"]).get(name)
    tuned = chosen is not None and P.same_setting(spec, chosen)
    if name == "jacap_prompt" and tuned:
        return "Algorithm 1 tuned"
    if name == "jacap_prompt" and P.same_setting(spec, P.PAPER_PRESET):
        return "Algorithm 1 as published"
    short = short_spec(spec)
    if name in PRESS_NAMES and (tuned or short == name):
        return press_name(name)
    code = name if tuned else short
    return code if legend else f"`{code}`"


def setting_name(fam: dict) -> str:
    """The name of a summary family's setting in the findings: its role's name where the role names it
    (:data:`SETTING_NAMES`: "Algorithm 1 tuned", "Algorithm 1 as published"), "the prompt press `JacapPromptPress()`"
    or "the default `JacapPress()`" (the tune choices those build), else a tuned method's registry name."""
    if fam["role"] in SETTING_NAMES:
        return SETTING_NAMES[fam["role"]]
    if is_prompt_default(fam["setting"]) or is_library_default(fam["setting"]):
        return spec_name(fam["setting"])
    method = fam["role"][len("tuned "):] if fam["role"].startswith("tuned ") else fam["role"]
    return f"`{method}`"


def or_list(names: list[str]) -> str:
    """``"A"``, ``"A or B"``, ``"A, B or C"``: names joined for a sentence."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
