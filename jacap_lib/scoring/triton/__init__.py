"""Triton kernels for Algorithm 1 (the GPU scoring core).

:func:`triton_jacap_scores` has the contract of :func:`jacap_lib.jacap_scores` and is what
``jacap_scores(..., backend="triton")`` calls. CUDA tensors run compiled kernels; CPU tensors run the
same kernels in the Triton interpreter (slow; it is how the kernels are tested without a GPU).
Triton is imported only when a kernel is first launched.
"""
from __future__ import annotations

from .launch import interpreter_active, plan_launch, triton_jacap_scores

__all__ = ["triton_jacap_scores", "plan_launch", "interpreter_active", "triton_available"]


def triton_available() -> tuple[bool, str]:
    """``(True, version)`` when Triton imports, else ``(False, reason)``."""
    try:
        import triton
    except Exception as exc:  # ImportError, or a broken install raising at import
        return False, f"triton is not importable: {type(exc).__name__}: {exc}"
    return True, triton.__version__
