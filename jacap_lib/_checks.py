"""Argument checks shared by the public functions: every failure is a ValueError that names
the argument and says how to fix it."""
from __future__ import annotations

import math
import sys


def _is_tensor(value) -> bool:
    """``isinstance(value, torch.Tensor)`` without importing torch (a tensor exists only once torch is loaded),
    so the command line can check its arguments before torch loads."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def tensor(name: str, x, *, min_dim: int = 1, floating: bool = True) -> torch.Tensor:
    if not _is_tensor(x):
        raise ValueError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}; wrap it with torch.as_tensor(...)")
    if x.dim() < min_dim:
        raise ValueError(f"`{name}` must have at least {min_dim} dimension(s), got shape {tuple(x.shape)}")
    if floating and not x.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor, got dtype {x.dtype}; cast it with .float()")
    return x


def finite(name: str, x: torch.Tensor) -> None:
    import torch

    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"`{name}` contains {bad} NaN/Inf value(s); clean the cache or the statistics before scoring")


def real(name: str, value) -> float:
    """A finite real number (bools and strings refused)."""
    if isinstance(value, bool) or isinstance(value, str) or value is None:
        raise ValueError(f"`{name}` must be a real number, got {value!r}")
    if _is_tensor(value) and value.numel() != 1:
        raise ValueError(f"`{name}` must be a real number (or a one-element tensor), got a tensor of shape "
                         f"{tuple(value.shape)}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be a real number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"`{name}` must be finite, got {value!r} (NaN/Inf)")
    return v


def positive(name: str, value, *, allow_zero: bool = False) -> float:
    v = real(name, value)
    if v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be finite and {bound}, got {value!r}")
    return v


def nonneg_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
        _is_tensor(value) and value.numel() == 1 and not value.is_floating_point()
        and value.dtype != sys.modules["torch"].bool
    ):
        raise ValueError(f"`{name}` must be a non-negative int, got {value!r}")
    v = int(value)
    if v < 0:
        raise ValueError(f"`{name}` must be a non-negative int, got {v}")
    return v


def int_at_least(name: str, value, low: int) -> int:
    """An int ``>= low`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{name}` must be an int >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"`{name}` must be an int >= {low}, got {value}")
    return int(value)


def unit_interval(name: str, value, *, closed_right: bool = False) -> float:
    v = positive(name, value, allow_zero=True)
    if v > 1 or (v == 1 and not closed_right):
        raise ValueError(f"`{name}` must lie in [0, 1{']' if closed_right else ')'}, got {value!r}")
    return v


def compression_ratio(value, name: str = "compression_ratio", *, allow_zero: bool = True) -> float:
    """The one check of a compression ratio: a number (not a bool) in [0, 1), the fraction of the prompt's KV pairs
    removed (0: nothing removed); ``allow_zero=False``: in (0, 1), for a grid whose uncompressed answer is measured
    apart. The presses, the registry and every command line's ``--ratio`` / ``--ratios`` check through it."""
    low = 0 if allow_zero else 0.0
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < 1
            or (not allow_zero and value == 0)):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        why = "" if allow_zero else "; 0, the uncompressed model, is measured apart"
        raise ValueError(f"{name} must be a number in {interval} (the fraction of the prompt's KV pairs removed{why}), "
                         f"got {value!r}")
    return float(value)


def boolean(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False, got {value!r}")
    return value


def choice(name: str, value, options) -> object:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"`{name}` must be one of {', '.join(repr(o) for o in options)}; got {value!r}")
    return value
