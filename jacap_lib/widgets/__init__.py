"""ipywidgets apps for the Jacap book; shown only where a live kernel serves a reader.

Callbacks are pure functions in the per-area modules (``widgets.theory``, ``widgets.live``, ...)
so they are tested without a kernel. A chapter shows an app with::

    from jacap_lib import widgets
    widgets.show(widgets.theory.softmax_app)   # a zero-argument factory

In the book build (``JACAP_BOOK_BUILD`` set) :func:`show` builds nothing and prints one line
pointing the reader to Colab/Jupyter, so the static site carries no dead widget state and
needs no widget-manager scripts; the static pages use precomputed plotly sliders instead.
"""
from __future__ import annotations

from jacap_lib._env import in_book_build
from jacap_lib._lazy import lazy_attributes

_SUBMODULES = ("theory", "live", "serving")

__all__ = ["show", "live_kernel", *_SUBMODULES]

STATIC_NOTE = (
    "[live widget] Run this notebook in Jupyter or Colab (launch button at the\n"
    "top of the page) to use the interactive controls; the figure above moves\n"
    "without a kernel."
)


def live_kernel() -> bool:
    """True when running in an IPython kernel outside the book build."""
    if in_book_build():
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show(factory, *args, **kwargs):
    """Display ``factory(*args, **kwargs)`` (an ipywidgets widget) in a live kernel.

    Returns the widget, or ``None`` in the book build / outside a kernel (then prints a note).
    """
    if not callable(factory):
        raise ValueError("factory must be a callable that returns an ipywidgets widget")
    if not live_kernel():
        print(STATIC_NOTE)
        return None
    from IPython.display import display

    app = factory(*args, **kwargs)
    display(app)
    return app


__getattr__, __dir__ = lazy_attributes(__name__, {m: f"{__name__}.{m}" for m in _SUBMODULES}, __all__)
