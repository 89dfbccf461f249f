"""The book's method registry: one name per eviction method, every comparison goes through it.

Baselines are the field's own implementations (kvpress presses, constructed with kvpress's
defaults); ``jacap`` is :class:`~jacap_lib.presses.jacap.JacapPress` with the library's (tuned) defaults;
Jacap variants (``jacap_lib.presses.variants.VARIANTS``) are merged in under names beginning with
``jacap``.

>>> from jacap_lib import build_press, list_methods
>>> press = build_press("snapkv", 0.5)           # kvpress SnapKVPress(compression_ratio=0.5)
>>> press = build_press("jacap", 0.75, tau=5.0)   # options go to the press constructor
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Callable

import kvpress
import torch

from .. import _checks
from ..config import DEFAULTS
from .jacap import JacapPress

__all__ = ["BASELINES", "ADAKV_BASELINES", "list_methods", "build_press", "method_factory", "parse_method", "with_options", "press_from_spec", "inert_options", "effective_options", "changed_options",
           "method_options", "expand_methods"]

# name -> (press class, default options, one-line description)
BASELINES: dict[str, tuple[type, dict, str]] = {
    "snapkv": (kvpress.SnapKVPress, {}, "attention of the last prompt window (SnapKV)"),
    "knorm": (kvpress.KnormPress, {}, "smallest key norm kept (KNorm)"),
    "keydiff": (kvpress.KeyDiffPress, {}, "keys least similar to the mean key (KeyDiff)"),
    "expected_attention": (kvpress.ExpectedAttentionPress, {}, "expected future attention x |v| (Expected Attention)"),
    "capkv": (kvpress.CapPress, {}, "linear Gaussian capacity leverage (CapKV, kvpress CapPress)"),
    "streaming_llm": (kvpress.StreamingLLMPress, {}, "sink + most recent tokens (StreamingLLM)"),
    "tova": (kvpress.TOVAPress, {}, "attention of the last prompt token (TOVA)"),
    "random": (kvpress.RandomPress, {"seed": 0}, "uniformly random tokens (seed 0)"),
}
#: The baselines whose scores differ from KV head to KV head, so that kvpress's head-adaptive allocation (AdaKV: one
#: top-k across the heads of a layer) can move slots between heads: option ``adakv=true`` wraps their press in
#: ``kvpress.AdaKVPress`` (its default safeguard). TOVA repeats one score over every head and StreamingLLM scores by
#: position, so AdaKV could only reproduce their uniform split; they do not take the option.
ADAKV_BASELINES = ("snapkv", "knorm", "keydiff", "expected_attention", "capkv")
JACAP_DESCRIPTION = (f"Jacap Algorithm 1: sensitivity-weighted leverage (defaults: linearised at the observed attention "
                     f"of the recent queries, window={DEFAULTS.window}, beta={DEFAULTS.beta}, u=v; Algorithm 1 as "
                     f"published: jacap[centre=tempered]; the paper's settings: jacap[tau=10,noise=1,beta=none,"
                     f"centre=tempered])")


def _variants() -> dict[str, Callable]:
    from .variants import VARIANTS

    bad = [name for name in VARIANTS if not name.startswith("jacap") or name == "jacap"]
    if bad:
        raise ValueError(f"Jacap variants must be registered under names beginning with 'jacap' (not 'jacap' itself): {bad}")
    return dict(VARIANTS)


def list_methods(family: str | None = None) -> list[str]:
    """Registry names: ``family=None`` all, ``"kvpress"`` the baselines, ``"jacap"`` Jacap and its variants."""
    jacap = ["jacap"] + sorted(_variants())
    if family is None:
        return jacap + list(BASELINES)
    if family == "jacap":
        return jacap
    if family == "kvpress":
        return list(BASELINES)
    raise ValueError(f"family must be None, 'jacap' or 'kvpress', got {family!r}")


def describe_method(name: str) -> str:
    """One line saying what the method keeps."""
    if name == "jacap":
        return JACAP_DESCRIPTION
    if name in BASELINES:
        return BASELINES[name][2]
    factory = method_factory(name)
    doc = (getattr(factory, "__doc__", None) or "").strip().splitlines()
    return doc[0] if doc else name


def method_factory(name: str) -> Callable:
    """``f(compression_ratio, **opts) -> press`` for a registry name."""
    if not isinstance(name, str):
        raise ValueError(f"method name must be a string, one of {list_methods()}; got {name!r}")
    if name == "jacap":
        return JacapPress
    if name in BASELINES:
        cls, defaults, _ = BASELINES[name]

        def factory(compression_ratio, adakv=False, **opts):
            press = cls(compression_ratio=compression_ratio, **{**defaults, **opts})
            return kvpress.AdaKVPress(press=press) if adakv else press

        factory.__doc__ = f"kvpress {cls.__name__}"
        factory.press_class = cls
        factory.extra_options = ("adakv",) if name in ADAKV_BASELINES else ()
        return factory
    variants = _variants()
    if name in variants:
        return variants[name]
    raise ValueError(f"unknown method {name!r}; valid names: {', '.join(list_methods())}")


def build_press(name: str, compression_ratio: float, **opts):
    """A fresh kvpress press for registry ``name`` at ``compression_ratio`` in [0, 1).

    ``opts`` go to the press's constructor (e.g. ``tau``, ``beta``, ``window`` for ``jacap``;
    ``window_size`` for ``snapkv``). Unknown names, bad ratios or options raise ``ValueError``.
    """
    factory = method_factory(name)
    if isinstance(compression_ratio, bool) or not isinstance(compression_ratio, (int, float)) or not (
        0 <= compression_ratio < 1
    ):
        raise ValueError(
            f"compression_ratio must be a number in [0, 1) (fraction of the prompt's KV pairs removed), "
            f"got {compression_ratio!r}"
        )
    valid = _valid_options(factory)
    unknown = sorted(set(opts) - valid)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {name!r}; valid options: {sorted(valid)}")
    if name in BASELINES:
        if "adakv" in opts:
            _checks.boolean("adakv", opts["adakv"])
        _check_baseline_options(BASELINES[name][0], {k: v for k, v in opts.items() if k != "adakv"})
    try:
        return factory(float(compression_ratio), **opts)
    except TypeError as err:  # e.g. an option the variant already sets itself ("multiple values for keyword ...")
        if "keyword argument" not in str(err):
            raise
        raise ValueError(f"method {name!r}: {err}; valid options: {sorted(valid)}") from None


def _valid_options(factory) -> set:
    """Keyword options a registry factory accepts (``compression_ratio`` excluded).

    A press class (or a factory with ``press_class``): its dataclass init fields. A variant factory
    function: its own keyword parameters and, when it takes ``**opts``, the fields of the press it
    forwards them to (``factory.forwards_to``, default :class:`JacapPress`)."""
    cls = factory if isinstance(factory, type) else getattr(factory, "press_class", None)
    if cls is not None and dataclasses.is_dataclass(cls):
        own = {f.name for f in dataclasses.fields(cls) if f.init} - {"compression_ratio"}
        return own | set(getattr(factory, "extra_options", ()))
    params = inspect.signature(factory).parameters.values()
    valid = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if any(p.kind == p.VAR_KEYWORD for p in params):
        target = getattr(factory, "forwards_to", JacapPress)
        valid |= {f.name for f in dataclasses.fields(target) if f.init}
    return valid - {"compression_ratio"}


# smallest allowed value of the kvpress baselines' integer options (0 for the others)
_BASELINE_INT_MIN = {"window_size": 1, "kernel_size": 1, "n_future_positions": 1}


def smallest_value(option: str) -> int:
    """The smallest value an integer press option takes (1 for window, kernel sizes and future positions of the
    kvpress baselines, 0 for the others: sinks, Jacap's recent window)."""
    return _BASELINE_INT_MIN.get(option, 0)


def _check_baseline_options(cls, opts: dict) -> None:
    """Check kvpress baseline options by their declared type, so a bad value fails here and not at the
    first forward pass: bools are bools, ints are ints >= 0 (>= 1 for window/kernel sizes and future
    positions), floats are finite (``tau`` > 0, ``epsilon`` >= 0), ``seed`` is None or an int."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key, value in opts.items():
        default = fields[key].default
        if key == "seed":
            if value is not None:
                _checks.int_at_least("seed", value, 0)
        elif isinstance(default, bool):
            _checks.boolean(key, value)
        elif isinstance(default, int):
            _checks.int_at_least(key, value, _BASELINE_INT_MIN.get(key, 0))
        elif isinstance(default, float):
            if key == "tau":
                _checks.positive(key, value)
            elif key == "epsilon":
                _checks.positive(key, value, allow_zero=True)
            else:
                _checks.real(key, value)


# ---------------------------------------------------------------------------------------------
# method specs: a registry name with options in brackets, e.g. "jacap[tau=1,noise=100]"
# ---------------------------------------------------------------------------------------------
_METHOD_RE = re.compile(r"^([A-Za-z0-9_]+)(?:\[(.*)\])?$")


def _parse_value(text: str):
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_method(spec: str) -> tuple[str, dict]:
    """``"jacap[tau=1,noise=10]"`` -> ``("jacap", {"tau": 1, "noise": 10})`` (values: int, float, bool,
    None or string). The name is not checked here; :func:`press_from_spec` checks name and options."""
    if not isinstance(spec, str):
        raise ValueError(f"method spec must be a string like 'jacap' or 'jacap[tau=1]', got {spec!r}")
    m = _METHOD_RE.match(spec.strip())
    if not m:
        raise ValueError(f"method spec {spec!r} must look like 'name' or 'name[key=value,...]'")
    name, body = m.group(1), m.group(2)
    opts = {}
    if body:
        for item in body.split(","):
            if "=" not in item:
                raise ValueError(f"option {item!r} in method spec {spec!r} must be key=value")
            k, v = item.split("=", 1)
            opts[k.strip()] = _parse_value(v.strip())
    return name, opts


def with_options(spec: str, **opts) -> str:
    """``spec`` with ``opts`` set (added or replaced), written back as a method spec (the inverse of
    :func:`parse_method`)."""
    name, have = parse_method(spec)
    have.update(opts)
    if not have:
        return name

    def fmt(v):
        return "none" if v is None else str(v).lower() if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)

    return f"{name}[{','.join(f'{k}={fmt(v)}' for k, v in have.items())}]"


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


#: Options added to a press after results were recorded without them, with the value every press had before
#: (a record without the option meant that value): JacapPress's ``centre`` was the tempered softmax.
IMPLIED_OPTIONS: dict = {"centre": "tempered"}


def with_implied(record: dict, like: dict) -> dict:
    """``record`` with :data:`IMPLIED_OPTIONS` filled in where ``like`` (today's record of the same press) has the
    option and ``record`` does not (an older record made before the option existed), recursively for a wrapped
    press's record."""
    out = {**{k: v for k, v in IMPLIED_OPTIONS.items() if k in like and k not in record}, **record}
    return {k: (with_implied(v, like[k]) if isinstance(v, dict) and isinstance(like.get(k), dict) else v)
            for k, v in out.items()}


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
    """Every constructor field of a press (recursively for wrappers), JSON-safe: its configuration record."""
    if not dataclasses.is_dataclass(press):
        return {"class": type(press).__name__}
    out = {"class": type(press).__name__}
    for f in dataclasses.fields(press):
        if not f.init:
            continue
        v = getattr(press, f.name)
        if isinstance(f.metadata.get("record"), str):  # a field that is data, not configuration: what it holds
            v = f.metadata["record"]
        elif dataclasses.is_dataclass(v):
            v = method_options(v)
        elif isinstance(v, torch.Tensor):
            v = f"tensor{tuple(v.shape)}"
        elif not isinstance(v, (int, float, str, bool, type(None), list, tuple, dict)):
            v = repr(v)
        out[f.name] = v
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


def changed_options(spec: str, base: str = "jacap") -> dict:
    """``{option: (value in base, value in spec)}`` for every option that differs between the presses two registry
    specs build (read off the built presses, not the spec text; the compression ratio and inert options aside).

    ``"class"`` is reported when the scorer classes differ, except for a subclass that declares itself its parent at
    its field defaults (``same_as_parent_at_defaults``, e.g. ``JacapAblationPress``); options only one scorer has
    count where they differ from that class's default (the side without them shows that default for a
    ``same_as_parent_at_defaults`` class, else None); ``"wrapper"`` is a kvpress wrapper (its class and options)
    around the scorer, or None.
    """
    (ca, a, wa), (cb, b, wb) = (_scorer_record(press_from_spec(s, 0.5)) for s in (base, spec))
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
