"""The book's method registry: one name per eviction method, every comparison goes through it.

:data:`METHODS` is the table, literal: each name is a distinct method or an alias of one spec. Baselines are the
field's own implementations (kvpress presses at kvpress's defaults); ``jacap_prompt`` is
:class:`~jacap_lib.presses.jacap.JacapPromptPress` at the library's defaults; the other names beginning with ``jacap_prompt`` are
Jacap's variants. A spec ``name[key=value,...]`` sets options; ``adakv=true`` wraps any scorer in kvpress's
head-adaptive ``AdaKVPress``, the same way for every method. The spec grammar is :mod:`.specs`.

>>> from jacap_lib import build_press, list_methods
>>> press = build_press("snapkv", 0.5)           # kvpress SnapKVPress(compression_ratio=0.5)
>>> press = build_press("jacap_prompt", 0.75, tau=5.0)   # options go to the press constructor
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import typing
from dataclasses import dataclass
from typing import Callable

import kvpress
import torch

from .. import _checks
from ..config import DEFAULTS
from .jacap import JacapPromptPress
from .jacap_ablation import ABLATION_FIELDS  # Algorithm 1's own choice of the ablation fields: never written out
from .jacap_context import JacapPress
from .jacap_multicenter import JacapMultiCenterPress
from .jacap_rank1 import JacapRank1Press
from .jacap_two_stage import JacapTwoStagePress
from .specs import method_of, parse_method, with_options  # the spec grammar's one home, re-exported
from .variants import jacap_ablate

__all__ = ["Method", "METHODS", "BASELINES", "PEERS", "RECONSTRUCTION_METHODS", "NOT_OFFLINE", "CRITICAL_SCORER", "ADAKV_BASELINES", "WRAPPER_OPTIONS", "list_methods", "describe_method", "alias_of", "valid_options", "full_spec", "explicit_spec", "written_out", "build_press", "method_factory", "parse_method", "method_of", "with_options", "press_from_spec", "inert_options", "effective_options", "changed_options",
           "method_options", "expand_methods", "PRESS_NAMES", "press_name", "quiet_kvpress"]

@dataclass(frozen=True)
class Method:
    """One registry entry: ``press`` builds it (a kvpress press class, or for a Jacap variant a press class or a
    factory ``f(compression_ratio, **opts)``) with ``options`` unless the spec sets them; a name with options is an
    alias of ``<base>[options]`` (:func:`alias_of`)."""

    press: Callable
    options: dict
    description: str


def _kvpress_defaults(cls) -> dict:
    """A kvpress press's constructor defaults (``press`` and ``compression_ratio`` aside), read off kvpress."""
    params = inspect.signature(cls).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty
            and p.name not in ("press", "compression_ratio")}


#: the scorer CriticalKV wraps unless ``scorer=`` is given: Expected Attention, built as kvpress's own evaluation
#: builds it for CriticalKV (``use_vnorm=False``: the wrapper multiplies by ``|W_O v|_1`` itself; kvpress warns otherwise)
CRITICAL_SCORER = "expected_attention"
_CKV, _CADAKV = _kvpress_defaults(kvpress.CriticalKVPress), _kvpress_defaults(kvpress.CriticalAdaKVPress)


def _critical_scorer(scorer: str, compression_ratio: float):
    """The scorer press a CriticalKV wrapper wraps: registry name ``scorer`` at its defaults (Expected Attention
    with ``use_vnorm=False``), which must build a kvpress ``ScorerPress``."""
    names = [n for n in METHODS if not n.startswith("critical_")]
    if not isinstance(scorer, str) or scorer not in names:
        raise ValueError(f"scorer must be a registry name of a scorer press, e.g. {CRITICAL_SCORER!r}; got {scorer!r}")
    inner = build_press(scorer, compression_ratio, **({"use_vnorm": False} if scorer == "expected_attention" else {}))
    if not isinstance(inner, kvpress.ScorerPress):
        raise ValueError(f"scorer={scorer!r} builds a {type(inner).__name__}, not a kvpress ScorerPress; CriticalKV "
                         f"rescales a scorer's scores (e.g. scorer={CRITICAL_SCORER!r} or 'snapkv')")
    return inner


def critical_kv(compression_ratio: float = 0.0, scorer: str = CRITICAL_SCORER, epsilon: float = _CKV["epsilon"],
                first_stage_ratio: float = _CKV["first_stage_ratio"]):
    """kvpress ``CriticalKVPress`` around the registry scorer ``scorer`` (default :data:`CRITICAL_SCORER`).

    Parameters (kvpress's defaults): ``epsilon`` (1e-4), ``first_stage_ratio`` (0.5), the fraction of the kept
    budget chosen by the scorer alone."""
    _checks.positive("epsilon", epsilon, allow_zero=True)
    _checks.unit_interval("first_stage_ratio", first_stage_ratio, closed_right=True)
    return kvpress.CriticalKVPress(_critical_scorer(scorer, compression_ratio), epsilon=epsilon,
                                   first_stage_ratio=first_stage_ratio)


def critical_adakv(compression_ratio: float = 0.0, scorer: str = CRITICAL_SCORER,
                   alpha_safeguard: float = _CADAKV["alpha_safeguard"], epsilon: float = _CADAKV["epsilon"],
                   first_stage_ratio: float = _CADAKV["first_stage_ratio"]):
    """kvpress ``CriticalAdaKVPress`` around the registry scorer ``scorer`` (default :data:`CRITICAL_SCORER`).

    Parameters (kvpress's defaults): ``alpha_safeguard`` (0.20, the fraction of its budget each head keeps),
    ``epsilon`` (1e-4), ``first_stage_ratio`` (0.5)."""
    _checks.unit_interval("alpha_safeguard", alpha_safeguard, closed_right=True)
    _checks.positive("epsilon", epsilon, allow_zero=True)
    _checks.unit_interval("first_stage_ratio", first_stage_ratio, closed_right=True)
    return kvpress.CriticalAdaKVPress(press=_critical_scorer(scorer, compression_ratio),
                                      alpha_safeguard=alpha_safeguard, epsilon=epsilon,
                                      first_stage_ratio=first_stage_ratio)


critical_kv.kvpress_press, critical_adakv.kvpress_press = kvpress.CriticalKVPress, kvpress.CriticalAdaKVPress

#: The registry: name -> what it builds. kvpress's presses at kvpress's own defaults (they never move); Jacap's
#: presses at their class defaults, and the Jacap names that are an alias of one spec (their ``options``) or a
#: different method (their own press class). Named settings (the paper's, the tuned ones) are the preset table's
#: rows (:data:`jacap_lib.presses.presets.PRESETS`).
METHODS: dict[str, Method] = {
    "snapkv": Method(kvpress.SnapKVPress, {}, "attention of the last prompt window (SnapKV)"),
    "knorm": Method(kvpress.KnormPress, {}, "smallest key norm kept (KNorm)"),
    "keydiff": Method(kvpress.KeyDiffPress, {}, "keys least similar to the mean key (KeyDiff)"),
    "expected_attention": Method(kvpress.ExpectedAttentionPress, {},
                                 "expected future attention x |v| (Expected Attention)"),
    "capkv": Method(kvpress.CapPress, {}, "linear Gaussian capacity leverage (CapKV, kvpress CapPress)"),
    "streaming_llm": Method(kvpress.StreamingLLMPress, {}, "sink + most recent tokens (StreamingLLM)"),
    "tova": Method(kvpress.TOVAPress, {}, "attention of the last prompt token (TOVA)"),
    "random": Method(kvpress.RandomPress, {"seed": 0}, "uniformly random tokens (seed 0)"),
    "jacap_prompt": Method(JacapPromptPress, {}, f"Jacap Algorithm 1 on the prompt's recent queries: sensitivity-"
                                    f"weighted leverage (defaults: linearised at the observed attention of the recent "
                                    f"queries, window={DEFAULTS.window}, beta={DEFAULTS.beta}, u=v; the tempered centre: "
                                    f"jacap_prompt[centre=tempered]; the paper's settings: the preset "
                                    f"algorithm1_as_published)"),
    "jacap_prompt_adakv": Method(JacapPromptPress, {"adakv": True},
                          "Jacap scores with kvpress AdaKV head-wise budget allocation (top-k across the heads of a "
                          "layer); an alias of jacap_prompt[adakv=true]"),
    "jacap_prompt_wo": Method(JacapPromptPress, {"use_out_proj": True},
                       "Jacap with the true output directions u = W_O v (the head's slice of the output projection); "
                       "an alias of jacap_prompt[use_out_proj=true]"),
    "jacap_ablate": Method(jacap_ablate, {},
                           "Jacap with one component of Algorithm 1 swapped (centre, sensitivity, kappa, leverage, "
                           "prior_iso, budget)"),
    "jacap_obs": Method(jacap_ablate, {"centre": "observed"},
                        "Jacap linearised at the attention its recent queries actually paid (the observed centre); an "
                        "alias of jacap_ablate[centre=observed]"),
    "jacap_ea": Method(jacap_ablate, {"centre": "ea", "gqa": "mean", "beta": None, "n_future_positions": 32},
                       "Jacap linearised at Expected Attention's centre, with that method's summary of the queries to "
                       "come; an alias of jacap_ablate[beta=none,centre=ea,gqa=mean,n_future_positions=32]"),
    "jacap_rank1": Method(JacapRank1Press, {}, "Jacap with the exact rank-one softmax Jacobian S = Diag(a) - a a^T"),
    "jacap_two_stage": Method(JacapTwoStagePress, {},
                              "Jacap in two stages: top-2B candidates, then the centre, weights and A recomputed on "
                              "them and rescored"),
    "jacap_multicenter": Method(JacapMultiCenterPress, {},
                                "Jacap with a 3-centre query prior (k-means per KV head, max of normalised scores)"),
    # KVzip's reconstruction pass as Jacap's query prior: scored after the prefill like kvzip (real prefill, scored
    # once for every ratio); summary=max,budget=global is kvpress KVzip itself
    "jacap": Method(JacapPress, {},
                            "Jacap Algorithm 1 with the query statistics of KVzip's context-reconstruction pass, budget "
                            "across layers and heads (defaults summary=jacap, budget=global; summary=max is KVzip's "
                            "score, budget=layer|head the per-layer and per-KV-head budgets, window= Jacap's recent "
                            "window)"),
    # kvpress's newer presses that run offline (the field as it is today), at kvpress's defaults; kvzip and kvgrad
    # score after the prefill (reconstruction passes) and mask across layers and heads, so they are measured on the
    # real prefill, not replayed (jacap_lib.measure.quality.can_replay). kvpress's KVzip takes the prompt's first
    # tokens for the chat template's prefix (24 on SmolLM2-135M-Instruct, however the prompt starts): it reconstructs
    # only what follows, so on a raw-text prompt those positions past its n_sink=4 sinks keep score 0 and go first
    "kvzip": Method(kvpress.KVzipPress, {},
                    "max attention of a context-reconstruction pass, budget across layers and heads (KVzip)"),
    "kvgrad": Method(kvpress.KVgradPress, {},
                     "KVzip's reconstruction attention x |v W_O| x |gradient| of the last hidden states (KVgrad)"),
    "compactor": Method(kvpress.CompactorPress, {},
                        "approximate key leverage blended with non-causal chunked attention (Compactor)"),
    "leverage_score": Method(kvpress.LeverageScorePress, {},
                             "approximate leverage of the centred pre-RoPE keys, Gaussian sketch (Compactor's scorer)"),
    "lagkv": Method(kvpress.LagKVPress, {}, "key/value spread relative to the next partition (LagKV)"),
    "cur": Method(kvpress.CURPress, {}, "local key x value leverage, CUR decomposition (CurDKV)"),
    "pyramidkv": Method(kvpress.PyramidKVPress, {}, "SnapKV with a budget decreasing linearly over layers (PyramidKV)"),
    "critical_kv": Method(critical_kv, {},
                          "CriticalKV: half the budget by a scorer (scorer=, Expected Attention unless set), the rest by "
                          "score x |W_O v|_1 (kvpress CriticalKVPress)"),
    "critical_adakv": Method(critical_adakv, {},
                             "CriticalKV with AdaKV's head-wise budget (kvpress CriticalAdaKVPress around scorer=, "
                             "Expected Attention unless set)"),
}
#: kvpress's presses in the registry (the comparison's baselines), in table order; a factory of a kvpress wrapper
#: (``critical_kv``) names the kvpress class it builds in ``kvpress_press``
BASELINES: tuple[str, ...] = tuple(n for n, m in METHODS.items()
                                   if getattr(m.press, "kvpress_press", m.press).__module__.startswith("kvpress"))
#: The name a reader knows each kvpress press by (the paper's or kvpress's), the one home of those names: the book's
#: prose and the landing page's answer name a baseline this way (:func:`press_name`).
PRESS_NAMES: dict[str, str] = {
    "snapkv": "SnapKV", "knorm": "KNorm", "keydiff": "KeyDiff", "expected_attention": "Expected Attention",
    "capkv": "CapKV", "streaming_llm": "StreamingLLM", "tova": "TOVA", "random": "random eviction",
    "kvzip": "KVzip", "kvgrad": "KVgrad", "compactor": "Compactor", "leverage_score": "LeverageScore",
    "lagkv": "LagKV", "cur": "CUR", "pyramidkv": "PyramidKV", "critical_kv": "CriticalKV",
    "critical_adakv": "CriticalAdaKV"}


@contextlib.contextmanager
def quiet_kvpress():
    """Silence kvpress's log warnings while a press is built only to read its options: KVzip warns of its prefill
    cost whenever it is built, which a reader of a setting's name or record has not asked about."""
    logger = logging.getLogger("kvpress")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def press_name(spec: str) -> str:
    """A kvpress press's name for a reader (:data:`PRESS_NAMES`: ``expected_attention[n_future_positions=32]`` ->
    "Expected Attention"); any other spec's registry name."""
    name = parse_method(spec)[0]
    return PRESS_NAMES.get(name, name)


#: kvpress's newer presses, in the registry and measured like the others, not yet in the protocol's search space
#: nor in the kvpress wrapper grid (their tuning comes later)
PEERS: tuple[str, ...] = ("kvzip", "kvgrad", "compactor", "leverage_score", "lagkv", "cur", "pyramidkv", "critical_kv",
                          "critical_adakv")
#: the methods that score after the prefill (a context-reconstruction pass) and mask kvpress's masked keys across
#: layers and heads: not ScorerPresses, so kvpress's wrappers refuse them; measured on the real prefill
#: (jacap_lib.measure.quality.can_replay is False for them)
RECONSTRUCTION_METHODS: tuple[str, ...] = ("kvzip", "kvgrad", "jacap")
#: kvpress 0.5.5's presses that cannot run offline on the bundled model, and why (read off their kvpress source)
NOT_OFFLINE: dict[str, str] = {
    "QFilterPress": "post_init_from_model downloads the model's trained Q-Filters from the Hub "
                    "(QFilters.from_pretrained('nthngdy/<model>_qfilt')); none exist for SmolLM2",
    "KVzapPress": "post_init_from_model downloads a trained surrogate (KVzapModel.from_pretrained("
                  "'nvidia/KVzap-<mlp|linear>-<model>'))",
    "FastKVzipPress": "downloads the model's trained gates (hf_hub_download('Jang-Hyun/Fast-KVzip', "
                      "'<model>/q<groups>_dim16_sink16.pt'))",
    "DuoAttentionPress": "fetches the model's trained attention-head pattern from the DuoAttention GitHub repository "
                         "(requests.get), or calibrates one on the Hub data set kmfoda/booksum (load_dataset)",
    "ExpectedAttentionStatsPress": "loads query statistics from the Hub (ExpectedAttentionStats.from_pretrained) or "
                                   "computes them on a Hub data set (load_dataset) with the Hub model",
    "DMSPress": "no Hub download of its own, but DMS proper needs the paper's trained evictors; kvpress's DMSPress "
                "thresholds a scorer's scores (KVzapPress's trained ones in kvpress's use) with no compression "
                "ratio (a read-only property), so it has no place on a ratio grid",
}
#: The baselines whose scores differ from KV head to KV head, so that kvpress's head-adaptive allocation (AdaKV: one
#: top-k across the heads of a layer) can move slots between heads; the protocol offers them ``adakv=true`` around
#: their choice, as Jacap's scores get it in ``jacap_prompt_adakv``. TOVA repeats one score over every head and
#: StreamingLLM scores by position, so AdaKV could only reproduce their uniform split (they take the option too).
ADAKV_BASELINES = ("snapkv", "knorm", "keydiff", "expected_attention", "capkv")
#: the options every scorer takes from the registry: ``adakv=true`` wraps it in kvpress ``AdaKVPress`` (with
#: ``alpha_safeguard``, kvpress's default 0.20 unless given)
WRAPPER_OPTIONS = ("adakv", "alpha_safeguard")
_ADAKV_SAFEGUARD = 0.20  # kvpress AdaKVPress's default


def list_methods(family: str | None = None) -> list[str]:
    """Registry names: ``family=None`` all, ``"kvpress"`` the baselines, ``"jacap"`` Jacap and its variants."""
    jacap = ["jacap"] + sorted(n for n in METHODS if n.startswith("jacap_"))
    if family is None:
        return jacap + list(BASELINES)
    if family == "jacap":
        return jacap
    if family == "kvpress":
        return list(BASELINES)
    raise ValueError(f"family must be None, 'jacap' or 'kvpress', got {family!r}")


def _method(name: str) -> Method:
    if not isinstance(name, str):
        raise ValueError(f"method name must be a string, one of {list_methods()}; got {name!r}")
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; valid names: {', '.join(list_methods())}")
    return METHODS[name]


def describe_method(name: str) -> str:
    """One line saying what the method keeps."""
    return _method(name).description


def alias_of(name: str) -> str | None:
    """The spec a registry name is an alias of (``"jacap_prompt_adakv"`` -> ``"jacap_prompt[adakv=true]"``), or None for a name
    that is its own method."""
    method = _method(name)
    if not method.options or name in BASELINES:
        return None
    base = next(n for n, m in METHODS.items() if m.press is method.press and not m.options)
    return with_options(base, **dict(sorted(method.options.items())))


def method_factory(name: str) -> Callable:
    """``f(compression_ratio, **opts) -> press`` for a registry name (:func:`build_press` without the checks of the
    ratio; the options are checked)."""
    _method(name)

    def factory(compression_ratio, **opts):
        return build_press(name, compression_ratio, **opts)

    factory.__doc__ = describe_method(name)
    return factory


def _own_options(press) -> set:
    """The keyword options a registry press builder accepts (``compression_ratio`` excluded): a dataclass press
    class's init fields (a private one, ``_name``, is kvpress's own plumbing: CompactorPress's child presses); a
    factory's keyword parameters and, with ``**opts``, the fields of ``forwards_to``."""
    if isinstance(press, type) and dataclasses.is_dataclass(press):
        return {f.name for f in dataclasses.fields(press) if f.init and not f.name.startswith("_")
                and not f.metadata.get("runtime")} - {"compression_ratio"}
    target = press
    params = inspect.signature(target).parameters.values()
    valid = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind == p.VAR_KEYWORD for p in params):
        forwards = getattr(target, "forwards_to", JacapPromptPress)
        valid |= {f.name for f in dataclasses.fields(forwards) if f.init}
    return valid - {"compression_ratio"}


def valid_options(name: str) -> set:
    """Every option a spec of registry ``name`` may set: its press's own and the registry's :data:`WRAPPER_OPTIONS`."""
    return _own_options(_method(name).press) | set(WRAPPER_OPTIONS)


def _runtime_options(press) -> set:
    """The fields of a press class that set how its choice is applied, not what it chooses (``free_memory``: the
    cache turned ragged): field metadata ``runtime``; never in a record (:func:`method_options`) or a spec."""
    if not (isinstance(press, type) and dataclasses.is_dataclass(press)):
        return set()
    return {f.name for f in dataclasses.fields(press) if f.init and f.metadata.get("runtime")}


def build_press(name: str, compression_ratio: float, **opts):
    """A fresh kvpress press for registry ``name`` at ``compression_ratio`` in [0, 1).

    ``opts`` go to the press's constructor (e.g. ``tau``, ``beta``, ``window`` for ``jacap_prompt``; ``window_size`` for
    ``snapkv``), over the name's own :attr:`Method.options`. Every scorer also takes ``adakv=true`` (kvpress
    ``AdaKVPress`` around it, its ``alpha_safeguard`` kvpress's 0.20 unless given). Unknown names, bad ratios or
    options raise ``ValueError``.
    """
    method = _method(name)
    _checks.compression_ratio(compression_ratio)
    own = _own_options(method.press)
    unknown = sorted(set(opts) - own - set(WRAPPER_OPTIONS) - _runtime_options(method.press))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {name!r}; valid options: {sorted(valid_options(name))}")
    opts = {**method.options, **opts}
    adakv = opts.pop("adakv", False)
    _checks.boolean("adakv", adakv)
    # AdaKV's safeguard, unless the press's own builder takes it for a wrapper of its own (jacap_ablate's budget)
    safeguard = opts.pop("alpha_safeguard", None) if adakv or "alpha_safeguard" not in own else None
    if safeguard is not None and not adakv:
        raise ValueError(f"alpha_safeguard is AdaKV's option: set adakv=true with it, or drop it (method {name!r})")
    if safeguard is not None:
        _checks.unit_interval("alpha_safeguard", safeguard, closed_right=True)
    if name in BASELINES:
        _check_baseline_options(method.press, opts)
    if isinstance(method.press, type) and "free_memory" in _runtime_options(method.press):
        # the registry's press is the measured one: kvpress's masked cache unless free_memory=True is asked for
        opts.setdefault("free_memory", False)
    try:
        press = method.press(compression_ratio=float(compression_ratio), **opts)
    except TypeError as err:  # e.g. an option the variant already sets itself ("multiple values for keyword ...")
        if "keyword argument" not in str(err):
            raise
        raise ValueError(f"method {name!r}: {err}; valid options: {sorted(valid_options(name))}") from None
    if not adakv:
        return press
    if not isinstance(press, kvpress.ScorerPress):
        raise ValueError(f"adakv=true wraps a scorer in kvpress AdaKVPress, but {name!r} with these options builds a "
                         f"{type(press).__name__} (a wrapper already); drop adakv or the option that wraps")
    return kvpress.AdaKVPress(press=press, alpha_safeguard=_ADAKV_SAFEGUARD if safeguard is None else safeguard)


# smallest allowed value of the kvpress baselines' integer options (0 for the others); chunk, partition, window and
# sketch sizes of the newer presses are >= 1 too
_BASELINE_INT_MIN = {"window_size": 1, "kernel_size": 1, "n_future_positions": 1, "chunk_size": 1, "lag_size": 1,
                     "local_window_size": 1, "sketch_dimension": 1}
# per press class: PyramidKV's pyramid shape (kvpress asserts beta >= 1); CUR's local window (a window of one
# token normalises each key's norm by itself, so every score is 1 and the press chooses nothing)
_CLASS_INT_MIN = {("PyramidKVPress", "beta"): 1, ("CURPress", "local_window_size"): 2}


#: the largest value a press option takes, where it has one: CriticalKV's first stage can take the whole budget (1)
_LARGEST = {"first_stage_ratio": 1.0}


def largest_value(option: str) -> float | None:
    """The largest value a press option takes (``None``: no largest); CriticalKV's ``first_stage_ratio`` 1, where
    the first stage takes the whole budget and the press is its scorer alone."""
    return _LARGEST.get(option)


def smallest_value(option: str, method: str | None = None) -> int:
    """The smallest value an integer press option takes (1 for window, kernel sizes and future positions of the
    kvpress baselines, 0 for the others: sinks, Jacap's recent window); with ``method`` (a registry name) the
    press class's own floor where it has one (2 for CUR's ``local_window_size``, whose one-token window scores
    every key alike)."""
    cls = METHODS[method].press if method in METHODS else None
    name = getattr(cls, "__name__", None)
    return _CLASS_INT_MIN.get((name, option), _BASELINE_INT_MIN.get(option, 0))


def _check_baseline_options(cls, opts: dict) -> None:
    """Check kvpress baseline options by their declared type, so a bad value fails here and not at the
    first forward pass: bools are bools, ints are ints >= 0 (>= 1 for window/kernel sizes and future
    positions, chunk/partition/sketch sizes), floats are finite (``tau`` > 0, ``epsilon`` >= 0), ``seed`` is None or
    an int, a ``Literal`` option one of its values, an ``Optional[float]`` one None or finite. A factory of a kvpress
    wrapper (``critical_kv``) checks its own options."""
    if not dataclasses.is_dataclass(cls):
        return
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key, value in opts.items():
        default = fields[key].default
        hint = hints.get(key)
        if typing.get_origin(hint) is typing.Literal:
            _checks.choice(key, value, typing.get_args(hint))
        elif key == "seed":
            if value is not None:
                _checks.int_at_least("seed", value, 0)
        elif default is None and float in typing.get_args(hint):
            if value is not None:
                _checks.real(key, value)
        elif isinstance(default, bool):
            _checks.boolean(key, value)
        elif isinstance(default, int):
            _checks.int_at_least(key, value, _CLASS_INT_MIN.get((cls.__name__, key), _BASELINE_INT_MIN.get(key, 0)))
        elif isinstance(default, float):
            if key == "tau":
                _checks.positive(key, value)
            elif key == "epsilon":
                _checks.positive(key, value, allow_zero=True)
            else:
                _checks.real(key, value)


# method specs: the grammar is .specs'; the specs below write a recorded setting out in full


def full_spec(name: str, record: dict) -> str:
    """The spec of registry ``name`` that builds the press ``record`` (a :func:`method_options` record) whatever the
    library's defaults are, so a recorded setting means one press for good.

    For a Jacap name every option of the scorer is written (the compression ratio, the class and the options that
    cannot change what it does, :func:`inert_options`, aside; the ablation press's own fields only where they differ
    from Algorithm 1's choice), and a kvpress wrapper's ``alpha_safeguard``. A kvpress baseline's spec names only
    what differs from kvpress's defaults, which kvpress never moves (its version is in every record): ``record`` must
    be the press of ``name`` with the options it shows."""
    _method(name)
    if not name.startswith("jacap"):
        raise ValueError(f"full_spec writes out Jacap's settings; {name!r} is a kvpress press, whose spec names what "
                         "differs from kvpress's own defaults")
    wrapper = {}
    scorer = record
    if isinstance(record.get("press"), dict):
        scorer = record["press"]
        wrapper = {k: v for k, v in record.items() if k not in ("class", "press", "compression_ratio")}
    opts = {k: v for k, v in scorer.items() if k not in ("class", "compression_ratio")}
    if wrapper.get("alpha_safeguard") is not None:
        opts["alpha_safeguard"] = wrapper["alpha_safeguard"]
    if record.get("class") == "AdaKVPress" and not METHODS[name].options.get("adakv") and opts.get("budget") != "layer":
        opts["adakv"] = True
    return explicit_spec(name, opts)


def explicit_spec(name: str, options: dict) -> str:
    """``name[options]`` with the options sorted, those that cannot change what the press does left out
    (:func:`inert_options`) and the ablation press's fields at Algorithm 1's own choice left out (the one form of a
    written-out setting: :func:`full_spec`)."""
    inert = inert_options(options)
    opts = {k: v for k, v in options.items() if k not in inert
            and not (k in ABLATION_FIELDS and v == ABLATION_FIELDS[k])}
    return with_options(name, **dict(sorted(opts.items())))


def written_out(spec: str) -> str:
    """``spec`` written out in full (:func:`full_spec` of the press it builds today); a kvpress baseline's spec as it
    is."""
    name = parse_method(spec)[0]
    if not name.startswith("jacap"):
        press_from_spec(spec, 0.5)  # checked
        return spec
    return full_spec(name, method_options(press_from_spec(spec, 0.5)))


def press_from_spec(spec: str, compression_ratio: float):
    """:func:`build_press` from a method spec (``"snapkv[window_size=32]"``)."""
    name, opts = parse_method(spec)
    return build_press(name, compression_ratio, **opts)


def expand_methods(specs) -> list[str]:
    """Method specs with ``"all"`` expanded to every registry name; each spec is checked (name and
    options) by building its press once, so a bad spec fails before any model work."""
    out = []
    for spec in specs:
        out.extend(list_methods() if spec == "all" else [spec])
    for spec in out:
        press_from_spec(spec, 0.5)
    return out


def inert_options(options: dict, *, noise=None) -> set[str]:
    """The options of one press's record that cannot change what it does: Jacap's ``deff_frac`` unless the
    record's ``noise`` (or, where the record has none, ``noise``) is ``"deff"`` -- it only sets the
    effective-dimension rule's target; and Jacap's ``tau`` where the record's ``centre`` is not the tempered
    softmax (the observed or Expected Attention centre has no temperature)."""
    noise = options.get("noise", noise)
    out = {"deff_frac"} if "deff_frac" in options and noise is not None and noise != "deff" else set()
    if "tau" in options and options.get("centre", "tempered") != "tempered":
        out.add("tau")
    return out


def effective_options(record):
    """A :func:`method_options` record without the options that cannot change what the press does: Jacap's
    ``deff_frac`` wherever the same record's ``noise`` is not ``"deff"`` (it only sets the effective-dimension
    rule's target), recursively for wrapper presses. Two records build the same press exactly when their
    effective options agree (the compression ratio aside)."""
    if isinstance(record, dict):
        inert = inert_options(record)
        return {k: effective_options(v) for k, v in record.items() if k not in inert}
    if isinstance(record, list):
        return [effective_options(v) for v in record]
    return record


def method_options(press) -> dict:
    """Every constructor field of a press (recursively for wrappers), JSON-safe: its configuration record (a kvpress
    press that is a plain class, CriticalKVPress: its constructor's arguments)."""
    cls = type(press)
    if dataclasses.is_dataclass(press) and ("__dataclass_fields__" in vars(cls) or "__init__" not in vars(cls)):
        items = [(f.name, f.metadata) for f in dataclasses.fields(press) if f.init and not f.metadata.get("runtime")]
    elif isinstance(press, kvpress.BasePress):  # its own __init__ under an inherited dataclass (CriticalKVPress)
        items = [(n, {}) for n in inspect.signature(type(press)).parameters if hasattr(press, n)]
    else:
        return {"class": type(press).__name__}
    out = {"class": type(press).__name__}
    for name, metadata in items:
        v = getattr(press, name)
        if isinstance(metadata.get("record"), str):  # a field that is data, not configuration: what it holds
            v = metadata["record"]
        elif dataclasses.is_dataclass(v):
            v = method_options(v)
        elif isinstance(v, torch.Tensor):
            v = f"tensor{tuple(v.shape)}"
        elif not isinstance(v, (int, float, str, bool, type(None), list, tuple, dict)):
            v = repr(v)
        out[name] = v
    return out


def _scorer_record(press) -> tuple[type, dict, dict | None]:
    """``(scorer class, its effective options, the wrapper's options or None)`` of a registry press (the compression
    ratio left out): a kvpress wrapper around one scorer (``press`` field) is split from it."""
    wrapper = None
    record = effective_options(method_options(press))
    if dataclasses.is_dataclass(press) and dataclasses.is_dataclass(getattr(press, "press", None)):
        wrapper = {k: v for k, v in record.items() if k not in ("press", "compression_ratio")}
        press, record = press.press, record["press"]
    return type(press), {k: v for k, v in record.items() if k not in ("compression_ratio", "class")}, wrapper


def changed_options(spec: str, base: str = "jacap_prompt") -> dict:
    """``{option: (value in base, value in spec)}`` for every option that differs between the presses two registry
    specs build (read off the built presses, not the spec text; the compression ratio and inert options aside).

    ``"class"`` is reported when the scorer classes differ, except for a subclass that declares itself its parent at
    its field defaults (``same_as_parent_at_defaults``, e.g. ``JacapAblationPress``); options only one scorer has
    count where they differ from that class's default (the side without them shows that default for a
    ``same_as_parent_at_defaults`` class, else None); ``"wrapper"`` is a kvpress wrapper (its class and options)
    around the scorer, or None.
    """
    with quiet_kvpress():  # built only to read their options
        (ca, a, wa), (cb, b, wb) = [_scorer_record(press_from_spec(s, 0.5)) for s in (base, spec)]
    out = {}
    if ca is not cb:
        sub, parent = (cb, ca) if issubclass(cb, ca) else (ca, cb) if issubclass(ca, cb) else (None, None)
        if sub is None or not getattr(sub, "same_as_parent_at_defaults", False):
            out["class"] = (ca.__name__, cb.__name__)
    for key in sorted(set(a) | set(b)):
        if key in a and key in b:
            if a[key] != b[key]:
                out[key] = (a[key], b[key])
            continue
        cls, value = (cb, b[key]) if key in b else (ca, a[key])
        default = {f.name: f.default for f in dataclasses.fields(cls)}.get(key, dataclasses.MISSING)
        if value != default:  # the side without the option: that default where the class is its parent at defaults
            absent = default if getattr(cls, "same_as_parent_at_defaults", False) else None
            out[key] = (a.get(key, absent), b.get(key, absent))
    if wa != wb:
        out["wrapper"] = (wa, wb)
    return out
