"""Do a results file's recorded options match the library's defaults, or does the file say why not?

A committed results file carries its configuration. When a recorded press option differs from what the
library builds today for the same method, a reader comparing the file with ``JacapPromptPress()`` is misled
unless the file says so. :func:`deviations` lists every such difference in a loaded results file;
:func:`unexplained` keeps those the file does not explain. A file explains a deviation with a
``"non_default"`` mapping in its configuration (for a ``.config.json`` sidecar: in the run that made the
rows), ``{option: reason}``, e.g. ``{"window": "0: made before the default became 32; kept as the old grid"}``.

Where options are recorded (and what they are compared with):

* a ``"methods"`` or ``"settings"`` mapping ``{method spec: record}`` (the grids' and the evaluation's
  configurations): each record is compared
  with :func:`~jacap_lib.presses.registry.method_options` of the press the spec builds today
  (``press_from_spec(spec, ratio)``), recursively for wrapper presses; an option set in the spec
  (``jacap_prompt[window=0]``) is thereby the method's own and never a deviation;
* a ``"jacap_prompt"`` mapping of options (the live chapter's KL table): compared with ``JacapPromptPress()``;
* ``"options"`` and ``"setup"`` mappings inside rows (the failure demos): their ``JacapPromptPress`` fields
  compared with ``JacapPromptPress()``;
* the configuration's own top-level ``tau``, ``noise``, ``deff_frac``, ``n_sink``, ``window``, ``eps`` and ``centre``
  (Jacap's shared parameters, unambiguous wherever they appear: the decomposition, serving and speed runs).

``JacapPromptPress()``'s defaults are :data:`jacap_lib.config.DEFAULTS`, so this follows the one place they live.

``compression_ratio`` is a per-cell choice, not a default, and is never compared; nor is ``deff_frac`` where the
record's noise is not ``"deff"`` (it has no effect there: :func:`jacap_lib.presses.registry.effective_options`); neither is a class name
(a renamed class keeps its options); an option a file does not record is not compared either (an old file
could not record an option added later; the committed Jacap records made before ``centre`` existed were given the
value they meant, ``"tempered"``, once, with that reason).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

__all__ = ["Deviation", "deviations", "unexplained", "MARKER"]

MARKER = "non_default"
_SKIP = {"compression_ratio", "class"}
_TOP = ("tau", "noise", "deff_frac", "n_sink", "window", "eps", "centre")


@dataclass(frozen=True)
class Deviation:
    where: str          # JSON path inside the file, e.g. "config.runs[0].methods.jacap"
    option: str
    recorded: object
    default: object
    explained: str | None = None   # the file's reason, when it gives one

    def __str__(self) -> str:
        return f"{self.where}: {self.option} = {self.recorded!r} (library default {self.default!r})"


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _jacap_defaults() -> dict:
    from jacap_lib.presses.jacap import JacapPromptPress

    return {f.name: getattr(JacapPromptPress(), f.name) for f in dataclasses.fields(JacapPromptPress) if f.init}


def _compare(record: dict, current: dict, where: str, out: list) -> None:
    from jacap_lib.presses.registry import inert_options

    skip = _SKIP | inert_options(record, noise=current.get("noise"))
    for key, value in record.items():
        if key in skip or key not in current:
            continue
        now = current[key]
        if isinstance(value, dict) and isinstance(now, dict):
            _compare(value, now, f"{where}.{key}", out)
        elif not _same(value, now):
            out.append(Deviation(where, key, value, now))


def _methods(methods: dict, where: str, out: list) -> None:
    from jacap_lib.presses.registry import method_options, press_from_spec

    for spec, record in methods.items():
        if not isinstance(record, dict) or "class" not in record:
            continue
        ratio = record.get("compression_ratio")
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool):
            inner = record.get("press")
            ratio = inner.get("compression_ratio", 0.5) if isinstance(inner, dict) else 0.5
        try:
            current = method_options(press_from_spec(spec, float(ratio)))
        except (ValueError, KeyError, TypeError) as err:
            out.append(Deviation(f"{where}.{spec}", "method", spec, f"not buildable today ({err})"))
            continue
        _compare(record, current, f"{where}.{spec}", out)


def _walk(node, where: str, out: list, defaults: dict) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{where}.{key}" if where else str(key)
            if key in ("methods", "settings") and isinstance(value, dict):
                _methods(value, here, out)
            elif key in ("jacap_prompt", "options", "setup") and isinstance(value, dict) and "class" not in value:
                _compare({k: v for k, v in value.items() if k in defaults}, defaults, here, out)
            else:
                _walk(value, here, out, defaults)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _walk(value, f"{where}[{i}]", out, defaults)


def _top(config, where: str, out: list, defaults: dict) -> None:
    if isinstance(config, dict):
        _compare({k: config[k] for k in _TOP if k in config}, defaults, where, out)


def _reasons(config) -> dict:
    marker = config.get(MARKER) if isinstance(config, dict) else None
    return marker if isinstance(marker, dict) else {}


def deviations(data: dict) -> list[Deviation]:
    """Every recorded option of a loaded results file (``{"config": ..., "rows": ...}`` or a sidecar
    ``{"runs": [...]}``) that differs from what the library builds today, with the file's reason when its
    configuration's ``"non_default"`` names the option."""
    if not isinstance(data, dict):
        raise ValueError(f"data must be a loaded results file (a dict), got {type(data).__name__}")
    defaults = _jacap_defaults()
    out: list[Deviation] = []
    if isinstance(data.get("runs"), list):   # a .config.json sidecar: one configuration per run
        for i, run in enumerate(data["runs"]):
            found: list[Deviation] = []
            _top(run, f"runs[{i}]", found, defaults)
            _walk(run, f"runs[{i}]", found, defaults)
            reasons = _reasons(run)
            out.extend(dataclasses.replace(d, explained=reasons.get(d.option)) for d in found)
        return out
    found = []
    _top(data.get("config"), "config", found, defaults)
    _walk(data, "", found, defaults)
    reasons = _reasons(data.get("config"))
    return [dataclasses.replace(d, explained=reasons.get(d.option)) for d in found]


def unexplained(data: dict) -> list[Deviation]:
    """The :func:`deviations` whose option the file's ``"non_default"`` does not name (with a non-empty reason)."""
    return [d for d in deviations(data) if not (isinstance(d.explained, str) and d.explained.strip())]
