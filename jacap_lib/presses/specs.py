"""The method-spec grammar: a registry name with its options in brackets, ``"jacap_prompt[tau=1,noise=100]"``.

One home for reading and writing a spec: :func:`parse_method` (spec to name and options), :func:`with_options`
(its inverse, an option set or replaced) and :func:`method_of` (the name alone). Nothing here checks that a name is
in the registry or that an option is the press's: :func:`jacap_lib.presses.registry.press_from_spec` does, by
building the press."""
from __future__ import annotations

import re

__all__ = ["parse_method", "with_options", "method_of"]

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
    """``"jacap_prompt[tau=1,noise=10]"`` -> ``("jacap_prompt", {"tau": 1, "noise": 10})`` (values: int, float, bool,
    None or string). The name is not checked here; :func:`press_from_spec` checks name and options."""
    if not isinstance(spec, str):
        raise ValueError(f"method spec must be a string like 'jacap_prompt' or 'jacap_prompt[tau=1]', got {spec!r}")
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


def method_of(spec: str) -> str:
    """The registry name of a method spec (``"snapkv[window_size=16]"`` -> ``"snapkv"``)."""
    return parse_method(spec)[0]


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
