"""The evaluation protocol: the same tuning for every method, one selection rule, one fingerprint.

Every method of the comparison — each kvpress baseline of the registry and Jacap (uniform per-head
budgets, ``jacap_prompt``; kvpress AdaKV's head-adaptive budgets around Jacap's scores, ``jacap_prompt_adakv``) —
gets a small grid of settings, written in one table, :data:`SEARCH_SPACE` (registry name -> method
specs, the tie-break winner first; every Jacap setting written out in full on the preset
``algorithm1_as_published`` (:data:`jacap_lib.presses.presets.PRESETS`), so
that no setting depends on the library's defaults; a kvpress baseline's spec names what differs from kvpress's own
defaults, which kvpress never moves). The budget is the same for everyone: a method whose press takes
options gets exactly :data:`CONFIGS_PER_METHOD` settings on its main knobs plus two for each knob of
:data:`AROUND_CHOICE` (its protected sinks and recent window, SnapKV's pooling kernel: one value on each side of the
choice), a method without options its one setting, and every
baseline whose scores differ across KV heads (``registry.ADAKV_BASELINES``) one more: its setting chosen on the
first tune round under kvpress's head-adaptive allocation (``adakv=true``), as Jacap's scores get it in
``jacap_prompt_adakv`` (:func:`check_search_space` enforces it).

**The rule** (:data:`RULE`, used for every choice made on the *tune* documents):

    score(setting) = mean over the tune documents d, prompt lengths L and compression ratios c of
                     log max(KL_setting(d, L, c), KL_FLOOR)

i.e. the log of the geometric mean of the KL ratios to any common reference (the reference cancels),
every (document, length, ratio) weighted alike. The setting with the smallest score is chosen; ties
(scores equal to 1e-12) go to the setting listed first in the table.
:func:`choose_settings` applies it per method over all cells; :func:`best_baseline_per_cell` applies
the same rule within one (L, c) cell to the baselines' chosen settings: picked on the tune documents
(the protocol's best baseline) or, labelled as the stricter secondary line, on the dev documents.

:func:`fingerprint` hashes what a tune choice depends on (model, lengths, ratios, continuation, search
space, rule, the tune and dev documents with their sha256); the dev job refuses choices made with a
different fingerprint.
"""
from __future__ import annotations

import json
import math

from jacap_lib.verdicts.intervals import KL_FLOOR  # the statistics' floor, used by the selection rule
from jacap_lib.results.loaders import SPACES as SPACE_FOLDERS
from jacap_lib.results.provenance import fingerprint  # sha256 of a configuration's canonical JSON
from jacap_lib.presses.registry import method_of
from jacap_lib.presses.presets import PRESETS
from jacap_lib.presses.registry import ADAKV_BASELINES, BASELINES, parse_method, press_from_spec

__all__ = ["SEARCH_SPACE", "PEER_SPACE", "CONTEXT_SPACE", "CONTEXT_REPLACED", "PEER_REPLACED", "REPLACED", "SPACES", "PAPER_PRESET", "settings_record", "same_setting", "CONFIGS_PER_METHOD", "AROUND_CHOICE", "KL_FLOOR", "RULE", "RULE_WORDINGS", "same_rule", "BASELINE_METHODS", "JACAP_METHODS",
           "method_of", "check_search_space", "selection_score", "choose_settings", "best_baseline_per_cell",
           "protocol_config", "fingerprint", "compare_configs", "same_measurements", "neighbours", "grid_edges", "quick_space"]

CONFIGS_PER_METHOD = 5
# method -> the knobs its first grids left at their defaults: the protected sinks and recent window, and SnapKV's
# pooling kernel. Each gets one value below and one above the method's tune choice (its other knobs at the choice):
# 2 more settings per knob, the same rule for every method (StreamingLLM's only knob, its sinks, is its main grid;
# TOVA, KNorm and KeyDiff protect nothing in kvpress). Left at their defaults: Expected Attention's and CapKV's
# epsilon (a constant added to every score before the value-norm rescaling) and CapKV's future positions.
AROUND_CHOICE: dict[str, tuple[str, ...]] = {
    "snapkv": ("kernel_size",), "expected_attention": ("n_sink",), "capkv": ("n_sink",),
    "jacap_prompt": ("n_sink", "window"), "jacap_prompt_adakv": ("n_sink", "window"), "jacap_obs": ("n_sink",),
    "jacap_ea": ("n_sink", "window"), "jacap": ("n_sink", "window"),
}
RULE = ("smallest mean over the tune documents, prompt lengths and compression ratios of log max(KL, 1e-8) "
        "(= log geometric-mean KL ratio to any common reference); ties (to 1e-12) go to the setting listed "
        "first. Per method over all cells for its setting; within each (length, "
        "ratio) cell, over the baselines' chosen settings, for the best baseline.")

#: Earlier wordings of :data:`RULE` that state the same rule: the first rounds' choices.json says "ties ... go to the
#: setting listed first (the library default first)"; the parenthetical described how those grids were listed (the
#: library default first), not the rule, and went when every setting was written out in full. Read by
#: :func:`same_rule`.
RULE_WORDINGS: dict[str, str] = {
    RULE.replace("go to the setting listed first.", "go to the setting listed first (the library default first)."): RULE,
}


def same_rule(a: str | None, b: str | None) -> bool:
    """Whether two recorded rule texts state the same selection rule (:data:`RULE_WORDINGS` maps an earlier
    wording to today's)."""
    return RULE_WORDINGS.get(a, a) == RULE_WORDINGS.get(b, b)


_EMA3 = {"tau": 3, "beta": 0.9}  # the tempered centre's tune choice of the first rounds
#: Algorithm 1's grid (the same for its scores under AdaKV's head-adaptive budgets): the paper's settings, the
#: effective-dimension noise rule, tau 3 with the EMA statistics; then, around the chosen window, tau 1 and 10, the
#: sinks on both sides and the window on both sides
_ALGORITHM1_GRID = ({}, {"noise": "deff", "deff_frac": 0.25}, _EMA3, {**_EMA3, "tau": 1, "window": 128},
                    {**_EMA3, "tau": 10, "window": 128}, {**_EMA3, "n_sink": 0, "window": 128},
                    {**_EMA3, "n_sink": 16, "window": 128}, {**_EMA3, "window": 128}, {**_EMA3, "window": 256})
_OBSERVED = {"centre": "observed", "beta": 0.9}  # the observed centre (no temperature), EMA statistics
_EA = {"centre": "ea", "gqa": "mean", "beta": None, "n_future_positions": 32, "window": 16}  # jacap_ea's summary


def _jacap(name: str, **change) -> str:
    """A Jacap setting of the protocol: registry ``name`` on the preset ``algorithm1_as_published`` changed by
    ``change``, every option written out (:meth:`jacap_lib.presses.presets.Preset.spec`)."""
    return PRESETS["algorithm1_as_published"].spec(name, **change)


# registry name -> settings (method specs), the tie-break winner first. Methods whose press takes options
# get CONFIGS_PER_METHOD settings each; TOVA, KNorm and KeyDiff take none. `random` (no setting to tune,
# a floor, never a best baseline) is left out; run it with --methods if wanted.
SEARCH_SPACE: dict[str, tuple[str, ...]] = {
    # kvpress baselines (kvpress defaults first); each numeric knob a user of the method would set is given
    # values on both sides of the earlier grid's choice, so a choice on the grid's edge shows as one
    "snapkv": ("snapkv", "snapkv[window_size=32]", "snapkv[window_size=16]", "snapkv[window_size=8]",
               "snapkv[window_size=4]", "snapkv[adakv=true,window_size=16]",
               "snapkv[kernel_size=1,window_size=16]", "snapkv[kernel_size=9,window_size=16]"),
    "streaming_llm": ("streaming_llm", "streaming_llm[n_sink=1]", "streaming_llm[n_sink=16]", "streaming_llm[n_sink=0]",
                      "streaming_llm[n_sink=2]"),
    "expected_attention": ("expected_attention", "expected_attention[use_covariance=false]",
                           "expected_attention[use_vnorm=false]", "expected_attention[n_future_positions=32]",
                           "expected_attention[n_future_positions=8]",
                           "expected_attention[adakv=true,n_future_positions=32]",
                           "expected_attention[n_future_positions=32,n_sink=0]",
                           "expected_attention[n_future_positions=32,n_sink=16]"),
    "capkv": ("capkv", "capkv[tau=10]", "capkv[tau=20]", "capkv[tau=50]", "capkv[tau=200]", "capkv[adakv=true,tau=50]",
              "capkv[n_sink=0,tau=50]", "capkv[n_sink=16,tau=50]"),
    "tova": ("tova",),
    "knorm": ("knorm", "knorm[adakv=true]"),
    "keydiff": ("keydiff", "keydiff[adakv=true]"),
    # Jacap (each setting written out in full, _jacap): uniform per-head budgets, and AdaKV's head-adaptive budgets
    # around Jacap's scores; the paper's settings first, the effective-dimension noise rule, tau from 1 to 10 with
    # the EMA statistics; then the protection around the choice
    "jacap_prompt": tuple(_jacap("jacap_prompt", **o) for o in _ALGORITHM1_GRID),
    "jacap_prompt_adakv": tuple(_jacap("jacap_prompt_adakv", alpha_safeguard=0.2, **o) for o in _ALGORITHM1_GRID),
    # the capacity press built from the one-knob ablations' winners on tune (the observed centre; with the
    # slots spread across a layer's heads by marginal capacity; with flat statistics; the protected recent
    # window halved and doubled), chosen by the same rule; then its sinks around the choice
    "jacap_obs": tuple(_jacap("jacap_obs", **{**_OBSERVED, **o}) for o in (
        {}, {"alpha_safeguard": 0, "budget": "layer"}, {"beta": None}, {"window": 16}, {"window": 8},
        {"n_sink": 0, "window": 16}, {"n_sink": 16, "window": 16})),
    # the capacity press linearised at Expected Attention's centre with that method's summary of the queries (per
    # query head, flat, 32 future positions: the first entry, the finalist of a screen on tune documents); each main
    # knob of that summary moved back one at a time, the horizon on both sides; then its sinks and recent window
    # around the choice (the window first had 64 alone, which left the choice of 16 at the end of two values)
    "jacap_ea": tuple(_jacap("jacap_ea", **{**_EA, **o}) for o in (
        {}, {"gqa": "pool"}, {"beta": 0.9}, {"n_future_positions": 512}, {"n_future_positions": 8}, {"n_sink": 0},
        {"n_sink": 16}, {"window": 8}, {"window": 64})),
}
#: kvpress's newer presses (``registry.PEERS``), the field as it is today, each at kvpress's defaults first and then on an
#: interior grid of the knobs a user of it sets: a value on each side of kvpress's default where the knob is numeric,
#: the alternative where it is a switch; CONFIGS_PER_METHOD settings each, chosen by the same RULE on the same tune
#: documents, in their own folder (``jacap evaluate tune --space peers``: ``data/results/eval/peers``) so the first
#: rounds' choices and fingerprint stay as they were. Left at kvpress's defaults: KVzip's and KVgrad's chunk sizes
#: at or above the longest prompt for KVzip (2,048: one reconstruction pass), Compactor's sinks, CUR's sinks.
#: Their head-adaptive setting (adakv=true) is the second round, around each first choice, as for the baselines above.
PEER_SPACE: dict[str, tuple[str, ...]] = {
    # the reconstruction scorer: the KVzip+ normalisation; budgets per layer instead of global; sinks on both sides
    "kvzip": ("kvzip", "kvzip[kvzip_plus_normalization=true]", "kvzip[layerwise=true]", "kvzip[n_sink=0]",
              "kvzip[n_sink=16]"),
    # input x gradient on a replay: per-layer budgets; sinks on both sides; the chunk doubled
    "kvgrad": ("kvgrad", "kvgrad[layerwise=true]", "kvgrad[n_sink=0]", "kvgrad[n_sink=16]", "kvgrad[chunk_size=1024]"),
    # leverage + non-causal attention: the sketch halved and doubled, the chunk halved and doubled; the choice (24)
    # was the end of {24, 48, 96}, so 12 replaced the sketch's worst setting (96); 12 was chosen, the new end, so 6
    # replaced the worst setting the grid can drop (24; kvpress's default 48 stays first)
    "compactor": ("compactor", "compactor[sketch_dimension=12]", "compactor[sketch_dimension=6]",
                  "compactor[chunk_size=128]", "compactor[chunk_size=512]"),
    # the sketch dimension from a quarter to four times kvpress's 48
    "leverage_score": ("leverage_score", "leverage_score[sketch_dimension=12]", "leverage_score[sketch_dimension=24]",
                       "leverage_score[sketch_dimension=96]", "leverage_score[sketch_dimension=192]"),
    # the lag halved, quartered and doubled; cross scoring. The choice (32) was the end of {32, 64, 128, 256}, so 16
    # replaced the lag's worst setting the grid can drop (64; kvpress's default 128 stays first). The choice moved
    # to 16, again the end, so 8 replaced the next worst (256)
    "lagkv": ("lagkv", "lagkv[lag_size=32]", "lagkv[lag_size=16]", "lagkv[lag_size=8]", "lagkv[cross_scoring=true]"),
    # which leverage (keys alone, the mean of keys and values); the local window halved and doubled. The choice (8)
    # was the end of {8, 16, 32}, so 4 replaced the window's worst droppable setting (32); the choice moved to 4,
    # again the end, so 2 replaced the next worst (8)
    "cur": ("cur", "cur[leverage_type=key]", "cur[leverage_type=kv_avg]", "cur[local_window_size=2]",
            "cur[local_window_size=4]"),
    # the observation window halved and doubled; the pyramid's slope (beta) on both sides. The choice (32) was the
    # end of {32, 64, 128}, so 16 replaced the window's worst droppable setting (128); the choice moved to 16, again
    # the end, so 8 replaced the next worst (32)
    "pyramidkv": ("pyramidkv", "pyramidkv[window_size=8]", "pyramidkv[window_size=16]", "pyramidkv[beta=5]",
                  "pyramidkv[beta=50]"),
    # around Expected Attention (the best baseline of the first rounds on tune): the first stage's share on both
    # sides; around SnapKV instead; epsilon ten times larger. The choice (0.75) was the end of {0.25, 0.5, 0.75}, so
    # 0.9 replaced the share's worst setting (0.25); 0.9 was chosen, the new end, so 1 (the largest share: the whole
    # budget by the first stage, the scorer alone) replaced 0.75
    "critical_kv": ("critical_kv", "critical_kv[first_stage_ratio=0.9]", "critical_kv[first_stage_ratio=1.0]",
                    "critical_kv[scorer=snapkv]", "critical_kv[epsilon=0.001]"),
    "critical_adakv": ("critical_adakv", "critical_adakv[first_stage_ratio=0.25]",
                       "critical_adakv[first_stage_ratio=0.75]", "critical_adakv[scorer=snapkv]",
                       "critical_adakv[alpha_safeguard=0.1]"),
}
def _context(**change) -> str:
    """A setting of :data:`CONTEXT_SPACE`: the preset ``context_as_first_tuned`` (JacapPress's options when its first
    grid was tuned) changed by ``change``, every option written out (:meth:`jacap_lib.presses.presets.Preset.spec`)."""
    return PRESETS["context_as_first_tuned"].spec(**change)


#: The capacity press whose query prior is the context (``jacap``: Jacap's score on the queries of KVzip's
#: reconstruction pass), in its own folder (``jacap evaluate tune --space context``: ``data/results/eval/context``),
#: tuned by the same RULE on the same tune documents. Its defaults first (the preset ``context_as_first_tuned``); then each
#: knob it adds to KVzip moved once: the budget per layer and per KV head (Jacap's uniform one), Expected Attention's
#: centre, a 16-token recent window (JacapPromptPress()'s). The budget and the window are read after the scoring, so those
#: settings share one reconstruction pass per (document, prompt length) (``measure_group(share_scoring=True)``).
#: Second round, around the first choice (a 16-token window, :data:`AROUND_CHOICE`): its sinks on both sides of 4.
#: Third round: that choice's window was the end of the two values tried ({0, 16}), so 64 was added beyond it
#: (the window joined AROUND_CHOICE); the rule chose 64 (-2.894 against 16's -2.882), again the end of the grid. Fourth
#: round, as Algorithm 1's window went on doubling: 256 beyond the choice, the window's value below it the defaults' 0,
#: the sinks re-centred on the new choice (0 and 16 at window 64); the 16-token window and its two sink settings were
#: replaced (:data:`CONTEXT_REPLACED`; their rows stay in tune.jsonl). The specs were first recorded in a short form
#: (``jacap[window=16]``); they were written out in full once, by a recorded migration
#: (``data/results/eval/context/spec_migration.json``).
CONTEXT_SPACE: dict[str, tuple[str, ...]] = {
    "jacap": tuple(_context(**o) for o in (
        {}, {"budget": "layer"}, {"budget": "head"}, {"centre": "ea"}, {"window": 64},
        {"window": 256}, {"n_sink": 0, "window": 64}, {"n_sink": 16, "window": 64})),
}
#: Settings of :data:`PEER_SPACE`'s first round that a value beyond a choice on its grid's edge replaced (the knob's
#: worst setting on the tune documents; their rows stay in the tune file, the rule no longer chooses among them).
PEER_REPLACED: tuple[str, ...] = ("compactor[sketch_dimension=96]", "critical_kv[first_stage_ratio=0.25]",
                                   "compactor[sketch_dimension=24]", "critical_kv[first_stage_ratio=0.75]",
                                   "lagkv[lag_size=64]", "cur[local_window_size=32]", "pyramidkv[window_size=128]",
                                   "lagkv[lag_size=256]", "cur[local_window_size=8]", "pyramidkv[window_size=32]")
#: Settings of earlier rounds of :data:`CONTEXT_SPACE` that a later round replaced (their rows stay in the tune file;
#: the rule no longer chooses among them): the 16-token window and its sinks, replaced when the choice moved to 64.
CONTEXT_REPLACED: tuple[str, ...] = tuple(_context(**o) for o in (
    {"window": 16}, {"n_sink": 0, "window": 16}, {"n_sink": 16, "window": 16}))
#: the search spaces by name (``jacap evaluate tune --space``): the first rounds' methods, the peers, the context press
SPACES: dict[str, dict] = {"first": SEARCH_SPACE, "peers": PEER_SPACE, "context": CONTEXT_SPACE}
if tuple(SPACES) != SPACE_FOLDERS:  # the loaders find each space's files by these names
    raise RuntimeError(f"SPACES {tuple(SPACES)} must be the loaders' spaces {SPACE_FOLDERS}")
#: per space, the settings a later round replaced whose rows its tune file keeps (the first space's written-out rows
#: of earlier grids are described in the comment below, not listed)
REPLACED: dict[str, tuple[str, ...]] = {"peers": PEER_REPLACED, "context": CONTEXT_REPLACED}
# The budget: 5 settings for every method with options (1 for TOVA, KNorm, KeyDiff), plus, for each baseline whose
# scores differ across KV heads, its choice of the earlier rounds (on the first 12 tune documents) under kvpress's
# head-adaptive allocation (adakv=true; Jacap's scores get it as the method jacap_prompt_adakv, jacap_obs as budget=layer).
# The first grid gave 3
# each and three choices sat on its edge (SnapKV window 16, CapKV tau 10, StreamingLLM 1 sink); the two added
# per method put a value beyond each edge (one tune replay costs ~1.3 CPU-s; the 14 added settings on the 12
# tune documents ~50 CPU-minutes). Where that second grid's choice was still on an edge (Expected Attention 128
# future positions, CapKV tau 50, jacap_obs window 16), a value beyond it replaced the knob's worst setting on the
# tune documents (2048 future positions, tau 2, window 64); Expected Attention then chose 32 future positions, the
# new edge, and 8 replaced 128. Then the knobs those grids left at their defaults (AROUND_CHOICE: the protected sinks
# and recent window, SnapKV's pooling kernel) got one value on each side of the method's choice, on all 18 tune
# documents (16 settings, ~1.5 CPU-hours). Every baseline's choice stayed inside (CapKV moved to no sinks, the smallest
# value the knob takes); Algorithm 1 and jacap_prompt_adakv chose the largest window tried, 64 of {16, 32, 64}, so the window
# went on doubling (128, then 256), each time with the window's other value and the sinks re-centred on the new choice
# (the settings they replaced stay in tune.jsonl). Last, the temperature of Algorithm 1 and jacap_prompt_adakv, tried only at
# the first window (32) until then, was tried again around the chosen window: tau 1 and 10 at window 128 replaced tau 1
# and 10 at window 32 (main-grid settings: they differ from the choice in tau alone, _around_settings). Every choice is
# made on tune documents only; each round's rows stay in tune.jsonl.
# The paper's exact settings, the first setting of Algorithm 1's grid: the dev job runs it next to the tuned choice
# whenever the two differ (evaluation.dev_specs), so both are in every table.
PAPER_PRESET = PRESETS["algorithm1_as_published"].spec()
BASELINE_METHODS = tuple(m for m in SEARCH_SPACE if m in BASELINES)
JACAP_METHODS = tuple(m for m in SEARCH_SPACE if m.startswith("jacap"))


def settings_record(specs, ratio: float) -> dict:
    """What a job records of the settings it measures: ``{"settings": {spec: press options}}`` (the press options as
    ``press_from_spec`` builds them at ``ratio``)."""
    from jacap_lib.presses.registry import method_options

    return {"settings": {s: method_options(press_from_spec(s, ratio)) for s in specs}}


def same_setting(a: str, b: str) -> bool:
    """Whether two method specs build the same press (same registry name and resolved options)."""
    from jacap_lib.presses.registry import effective_options, method_options, quiet_kvpress

    if method_of(a) != method_of(b):
        return False
    with quiet_kvpress():  # built only to read their options
        return (effective_options(method_options(press_from_spec(a, 0.5)))
                == effective_options(method_options(press_from_spec(b, 0.5))))


def _takes_options(name: str) -> bool:
    """Whether the method has knobs of its own (the head-adaptive wrapper ``adakv`` is not one: it is offered
    once, :func:`check_search_space`)."""
    from jacap_lib.presses.registry import WRAPPER_OPTIONS, valid_options

    return bool(valid_options(name) - set(WRAPPER_OPTIONS))


def _adakv_settings(specs) -> int:
    return sum(bool(parse_method(s)[1].get("adakv")) for s in specs)


def _around_settings(name: str, specs) -> dict[str, int]:
    """``{knob: number of settings around it}`` for the knobs of :data:`AROUND_CHOICE` of method ``name``. A setting
    counts for knob ``k`` when it moves ``k`` away from the method's first setting (the grid's origin: kvpress's
    defaults for a baseline, the paper's settings for Algorithm 1) and another setting of the list differs from it in
    ``k`` alone (resolved press options; a wrapped scorer's ``press.k`` too): one value beside the setting it is
    around. A setting at the choice's protection that moves a main knob (``tau`` at the choice's window) differs from
    its neighbours in that main knob, so it counts as a main-grid setting."""
    knobs = AROUND_CHOICE.get(name, ())
    specs = list(specs)
    if not knobs:
        return {}
    flat = [_flat_options(s) for s in specs]

    def knob_alone(i: int, j: int) -> str | None:  # the one option in which settings i and j differ, if it is a knob
        diff = _differing_options(flat[i], flat[j])
        return diff[0].rsplit(".", 1)[-1] if len(diff) == 1 and diff[0].rsplit(".", 1)[-1] in knobs else None

    counts = dict.fromkeys(knobs, 0)
    for i in range(len(specs)):
        own = {k.rsplit(".", 1)[-1] for k in _differing_options(flat[0], flat[i])}  # what it moves from the origin
        found = {knob_alone(i, j) for j in range(len(specs)) if j != i} - {None}
        knob = next((k for k in knobs if k in found and k in own), None)
        if knob is not None:
            counts[knob] += 1
    return counts


def _own_settings(specs, around: dict[str, int]) -> int:
    """A method's settings on its main knobs: neither the head-adaptive one nor those around the choice (``around``:
    :func:`_around_settings` of the same specs)."""
    specs = list(specs)
    return len(specs) - _adakv_settings(specs) - sum(around.values())


def _canonical(spec: str) -> tuple:
    name, opts = parse_method(spec)
    return name, tuple(sorted((k, json.dumps(v)) for k, v in opts.items()))


def check_search_space(space: dict | None = None, *, configs_per_method: int | None = None,
                       exact: bool = True) -> dict[str, int]:
    """Check that a search space gives every method a comparable budget; returns ``{method: n_settings}``.

    Every key is a registry name; each of its specs names that method, builds a press, and appears once
    (options compared after parsing, so ``x[a=1,b=2]`` equals ``x[b=2,a=1]``); a kvpress baseline's first spec is
    its bare name (kvpress's defaults; ties go to the first). A method whose press takes options has ``configs_per_method`` settings
    (default: :data:`CONFIGS_PER_METHOD` for :data:`SEARCH_SPACE`, else the largest count in ``space``, so
    a reduced table stays equal for everyone; at most that many with ``exact=False``), one without options
    exactly one; each knob of :data:`AROUND_CHOICE` exactly two more (a reduced table: none or two; at most two
    with ``exact=False``). Raises ``ValueError`` naming the method and the fix.
    """
    around_of: dict = {}  # method -> _around_settings of its specs, computed once

    def around(name, specs):
        if name not in around_of:
            around_of[name] = _around_settings(name, specs)
        return around_of[name]

    if configs_per_method is None:
        configs_per_method = (CONFIGS_PER_METHOD if space is None or space is SEARCH_SPACE or space is PEER_SPACE
                              else max((_own_settings(v, around(m, v)) for m, v in space.items()), default=1)
                              if isinstance(space, dict) else 1)
    full = space is None or space is SEARCH_SPACE or space is PEER_SPACE  # every knob of AROUND_CHOICE must be searched there
    space = SEARCH_SPACE if space is None else space
    if not isinstance(space, dict) or not space:
        raise ValueError("search space must be a non-empty dict {registry name: [method specs]}")
    counts = {}
    for name, specs in space.items():
        specs = list(specs)
        if not specs:
            raise ValueError(f"search space: method {name!r} has no settings; list at least its default {name!r}")
        for spec in specs:
            if method_of(spec) != name:
                raise ValueError(f"search space: spec {spec!r} is listed under {name!r} but names {method_of(spec)!r}")
            press_from_spec(spec, 0.5)  # unknown names / options fail here
        if name in BASELINES and specs[0] != name:
            raise ValueError(f"search space: the first setting of {name!r} must be kvpress's default {name!r} "
                             f"(ties go to it), got {specs[0]!r}")
        canon = [_canonical(s) for s in specs]
        dup = sorted({s for s, c in zip(specs, canon) if canon.count(c) > 1})
        if dup:
            raise ValueError(f"search space: method {name!r} lists the same setting twice: {dup}")
        want = configs_per_method if _takes_options(name) else 1
        n_adakv = _adakv_settings(specs)
        if n_adakv and name not in ADAKV_BASELINES:
            raise ValueError(f"search space: method {name!r} has a setting with adakv=true; the protocol offers kvpress's "
                             f"head-adaptive allocation only to the baselines whose scores differ across KV heads "
                             f"({', '.join(ADAKV_BASELINES)}; Jacap's scores get it as jacap_prompt_adakv)")
        if n_adakv > 1:
            raise ValueError(f"search space: method {name!r} has {n_adakv} settings with adakv=true; the head-adaptive "
                             "allocation is offered once, around the method's choice")
        own = _own_settings(specs, around(name, specs))
        if (exact and own != want) or own > want:
            raise ValueError(f"search space: method {name!r} has {own} settings of its own; every method with options "
                             f"gets {'exactly' if exact else 'at most'} {configs_per_method} (one without options "
                             f"gets 1), plus at most one with kvpress's head-adaptive allocation (adakv=true), so the "
                             "budgets stay comparable")
        for knob, n in around(name, specs).items():
            if n > 2 or (exact and n != 2 and (full or n)):
                raise ValueError(f"search space: method {name!r} has {n} settings of {knob!r} (a knob around the "
                                 f"choice, AROUND_CHOICE); give it {'exactly' if exact else 'at most'} 2, one value below "
                                 "and one above the choice" + ("" if full else " (or none, in a reduced table)"))
        counts[name] = len(specs)
    return counts


def quick_space(space: dict | None = None, *, methods=("knorm", "snapkv", "jacap_prompt"), per_method: int = 2) -> dict:
    """A small search space for smoke runs: ``methods`` with their first ``per_method`` settings of their own (the
    head-adaptive ``adakv=true`` setting left out)."""
    space = SEARCH_SPACE if space is None else space
    return {m: tuple([s for s in space[m] if not _adakv_settings([s])][:per_method]) for m in methods}


# --------------------------------------------------------------------------------------------- the rule
def _log_kl(kl) -> float:
    kl = float(kl)
    if not math.isfinite(kl) or kl < 0:
        raise ValueError(f"KL must be a finite number >= 0, got {kl!r}; drop or recompute that row")
    return math.log(max(kl, KL_FLOOR))


def selection_score(kls) -> float:
    """The rule's score of one setting: mean of ``log max(KL, KL_FLOOR)`` over its rows."""
    kls = list(kls)
    if not kls:
        raise ValueError("selection_score needs at least one KL value")
    return sum(_log_kl(k) for k in kls) / len(kls)


def _argmin_first(scored: list[tuple[str, float]]) -> str:
    """The name with the smallest score; within 1e-12 of it, the first listed."""
    best = min(s for _, s in scored)
    return next(n for n, s in scored if s <= best + 1e-12)


def _by_key(rows, split):
    out: dict = {}
    for r in rows:
        if split is not None and r.get("split") != split:
            continue
        out.setdefault(r["method"], {})[(r["doc"], int(r["length"]), float(r["ratio"]))] = r["kl"]
    return out


def choose_settings(rows: list[dict], space: dict, *, split: str | None = "tune") -> dict:
    """Each method's setting by :data:`RULE` on the ``split`` rows (``None``: all rows given).

    ``rows``: dicts with ``method`` (spec), ``doc``, ``length``, ``ratio``, ``kl`` (and ``split``). Every
    setting of a method must have rows on the same (doc, length, ratio) keys — an unfinished tune run
    raises ``ValueError`` naming what is missing. Returns ``{method: {"chosen": spec, "score": float,
    "n": rows per setting, "candidates": [{"spec", "score"}, ...] in table order}}``.
    """
    by = _by_key(rows, split)
    out = {}
    for name, specs in space.items():
        keys = None
        for spec in specs:
            have = set(by.get(spec, {}))
            if not have:
                raise ValueError(f"no {split or ''} rows for setting {spec!r}; run (or finish) the tune job first")
            if keys is None:
                keys = have
            elif have != keys:
                missing = sorted(keys ^ have)[:3]
                raise ValueError(f"settings of {name!r} were measured on different (doc, length, ratio) keys "
                                 f"(e.g. {missing}); finish the tune job (a rerun resumes) before choosing")
        cands = [(spec, selection_score(by[spec].values())) for spec in specs]
        chosen = _argmin_first(cands)
        out[name] = {"chosen": chosen, "score": dict(cands)[chosen], "n": len(keys),
                     "candidates": [{"spec": s, "score": v} for s, v in cands]}
    return out


def best_baseline_per_cell(rows: list[dict], chosen: dict[str, str], *, split: str | None = "tune",
                           baselines=None) -> dict:
    """Per (length, ratio) cell, the baseline whose chosen setting has the smallest rule score there.

    ``chosen``: ``{method: spec}`` (the tune choices); ``baselines``: method names in tie-break order
    (default: the kvpress baselines of ``chosen`` in its order). Every baseline must have rows on the
    same documents of the cell. Returns ``{"L/c": {"method", "spec", "score", "n_docs", "scores"}}``.
    """
    names = [m for m in (baselines if baselines is not None else chosen) if m in BASELINES and m in chosen]
    if not names:
        raise ValueError("best_baseline_per_cell: `chosen` holds no kvpress baseline")
    by = _by_key(rows, split)
    cells: dict = {}
    for m in names:
        for (doc, L, c), kl in by.get(chosen[m], {}).items():
            cells.setdefault((L, c), {}).setdefault(m, {})[doc] = kl
    out = {}
    for (L, c), per in sorted(cells.items()):
        docs = None
        for m in names:
            d = set(per.get(m, {}))
            if docs is None:
                docs = d
            if not d or d != docs:
                raise ValueError(f"cell L={L}, c={c}: baseline {m!r} ({chosen[m]!r}) lacks rows on some documents "
                                 f"of the {split or 'given'} split; finish the job first")
        scored = [(m, selection_score(per[m].values())) for m in names]
        best = _argmin_first(scored)
        out[f"{L}/{c}"] = {"length": L, "ratio": c, "method": best, "spec": chosen[best], "score": dict(scored)[best],
                           "n_docs": len(docs), "scores": dict(scored)}
    return out


# --------------------------------------------------------------------------------------------- configuration
def protocol_config(*, model: dict, lengths, ratios, continuation: int, space: dict, docs: list[dict]) -> dict:
    """What a tune choice depends on: model (name, file sha256), lengths, ratios, continuation, the search
    space, the rule, and the tune/dev documents (id, sha256) in manifest order."""
    return {"model": {k: model.get(k) for k in ("name", "sha256")},
            "lengths": [int(x) for x in lengths], "ratios": [float(x) for x in ratios],
            "continuation": int(continuation), "search_space": {m: list(v) for m, v in space.items()},
            "rule": RULE, "kl_floor": KL_FLOOR,
            "tune_docs": [[d["id"], d["sha256"]] for d in docs if d.get("split") == "tune"],
            "dev_docs": [[d["id"], d["sha256"]] for d in docs if d.get("split") == "dev"]}


def compare_configs(recorded: dict, current: dict) -> list[str]:
    """The top-level keys on which two :func:`protocol_config` records differ (``[]``: same protocol)."""
    return sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))


def same_measurements(recorded: dict, current: dict) -> bool:
    """Whether dev rows measured under ``recorded`` are measurements of ``current``'s protocol: the two differ at
    most in the search space and the tune documents (model, lengths, ratios, continuation, rule, floor and dev
    documents equal). A dev row measures one setting on one dev document, whichever settings the tune offered and
    on however many tune documents it chose; which rows a job reads is up to today's choices, and the jobs refuse to
    resume a file whose setting now builds another press
    (:func:`jacap_lib.experiments.protocol.check_settings_unchanged`)."""
    if not isinstance(recorded, dict) or not isinstance(current, dict):
        return False
    return set(compare_configs(recorded, current)) <= {"search_space", "tune_docs"}


def _flat_options(spec: str) -> dict:
    """The resolved press options of a protocol setting, a wrapped scorer's as ``press.<option>``."""
    from jacap_lib.presses.registry import effective_options, method_options

    def flat(record, prefix=""):  # a wrapper's scorer options under "press.<option>" (AdaKV around Jacap, ...)
        out = {}
        for k, v in record.items():
            if k.startswith("_"):  # a press's private sub-press built from its own options (Compactor's): no knob
                continue
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            elif k not in ("compression_ratio", "class"):
                out[prefix + k] = v
        return out

    return flat(effective_options(method_options(press_from_spec(spec, 0.5))))


def _differing_options(a: dict, b: dict) -> list[str]:
    """The options (of two :func:`_flat_options` records) whose values differ, an option one record lacks too."""
    return [k for k in set(a) | set(b) if a.get(k) != b.get(k)]


def neighbours(choices: dict, method: str) -> dict[str, dict]:
    """The settings of ``method``'s grid one numeric option away from its tune choice: ``{option: {value: spec}}``
    (settings whose resolved press options differ from the choice's in that option only; the choice
    itself under its own value). ``choices``: ``choices.json``'s content."""
    chosen = choices["chosen"][method]
    base = _flat_options(chosen)
    out: dict = {}
    for spec in choices["config"]["search_space"].get(method, ()):
        other = _flat_options(spec)
        diff = _differing_options(base, other)
        if len(diff) == 1 and isinstance(other.get(diff[0]), (int, float)) and not isinstance(other.get(diff[0]), bool):
            if isinstance(base.get(diff[0]), (int, float)):
                out.setdefault(diff[0], {base[diff[0]]: chosen})[other[diff[0]]] = spec
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def grid_edges(choices: dict) -> list[dict]:
    """Where each method's tune choice sits in its grid, per numeric option: for every option of the chosen
    setting whose value the search space varies *alone* (:func:`neighbours`; a wrapped scorer's options as
    ``press.<option>``), the values tried and whether the choice is the smallest
    or largest of three or more (``edge``; with two values every choice is an end, so ``edge`` is ``None``), and
    whether the choice is the smallest integer or the largest value the option can take (``bound``: an edge no
    grid can widen; :func:`~jacap_lib.presses.registry.largest_value`).
    ``choices``: ``choices.json``'s content. ``[{"method", "option", "chosen", "values", "edge", "bound"}]``."""
    from jacap_lib.presses.registry import largest_value, smallest_value

    out = []
    for method, chosen in choices["chosen"].items():
        for k, by_value in neighbours(choices, method).items():
            values = sorted(by_value)
            value = next(v for v, spec in by_value.items() if spec == chosen)  # neighbours lists the choice too
            edge = None if len(values) < 3 else value in (values[0], values[-1])
            knob = k.rsplit(".", 1)[-1]
            bound = ((isinstance(value, int) and value == smallest_value(knob, None if "." in k else method))
                     or (largest_value(knob) is not None and value == largest_value(knob)))
            out.append({"method": method, "option": k, "chosen": value, "values": values, "edge": edge,
                        "bound": bound})
    return out
