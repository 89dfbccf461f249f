"""Plotly figures for the Jacap book (one function per figure, each returns ``go.Figure``).

Sub-modules are per area and load lazily, so ``from jacap_lib import viz`` is cheap and
``viz.theory`` / ``viz.live`` / ``viz.serving`` / ... import on first use. Every figure is finished by
:func:`jacap_lib.viz.style.finish`: one colour and marker per method for the whole book, readable log ticks,
shared axis types, legends clear of sliders.

:func:`setup_notebook` picks how figures are shown:

* in the book build (``JACAP_BOOK_BUILD`` set by :mod:`jacap_lib.book`), figures become a
  ``text/html`` ``<div>`` plus a ``Plotly.newPlot`` call. plotly >= 6 otherwise emits only its
  JSON mime type, which myst-nb cannot render. plotly.js itself is *not* embedded: the build
  copies the installed plotly's ``plotly.min.js`` into the site's ``_static`` and loads it on
  every page, so the site needs no internet;
* on Colab, plotly's ``"colab"`` renderer;
* elsewhere (Jupyter, VS Code), plotly's own default.
"""
from __future__ import annotations

import sys

from .._env import BOOK_BUILD_ENV, in_book_build
from .._lazy import lazy_attributes

STATIC_RENDERER = "jacap_static_html"

_SUBMODULES = ("style", "theory", "live", "serving", "kernels", "decomposition", "diagnostics", "eviction",
               "evaluation", "anatomy", "needle", "ablation", "plane")

__all__ = ["setup_notebook", "in_book_build", "STATIC_RENDERER", "BOOK_BUILD_ENV", *_SUBMODULES]


def _register_static_renderer():
    import plotly.io as pio
    from plotly.io._base_renderers import MimetypeRenderer

    class StaticHtmlRenderer(MimetypeRenderer):
        """``text/html`` output that expects a global ``Plotly`` (served by the built site)."""

        def __init__(self, config=None, auto_play=False):
            self.config = dict(config or {})
            self.auto_play = auto_play

        def to_mimebundle(self, fig_dict):
            html = pio.to_html(
                fig_dict,
                config={"responsive": True, "displaylogo": False, **self.config},
                auto_play=self.auto_play,
                include_plotlyjs=False,
                include_mathjax=False,
                full_html=False,
                validate=False,
            )
            return {"text/html": html}

    if STATIC_RENDERER not in pio.renderers:
        pio.renderers[STATIC_RENDERER] = StaticHtmlRenderer()


def setup_notebook(renderer: str | None = None) -> None:
    """Choose the plotly renderer for this notebook (``plotly.io.renderers.default`` shows it) and let pandas
    print every table cell whole (``display.max_colwidth = None``; the tables build short text themselves).

    ``renderer`` forces a plotly renderer name (for example ``"notebook"``); by default the
    choice follows the environment as described in the module docstring.
    """
    import pandas as pd
    import plotly.io as pio

    pd.set_option("display.max_colwidth", None)  # a table never cuts a cell's text to "..."
    _register_static_renderer()
    if renderer is None:
        if in_book_build():
            renderer = STATIC_RENDERER
        elif "google.colab" in sys.modules:
            renderer = "colab"
        else:
            renderer = pio.renderers.default
    if renderer not in pio.renderers:
        raise ValueError(
            f"renderer={renderer!r} is not a plotly renderer; pick one of {sorted(pio.renderers)}"
        )
    pio.renderers.default = renderer


__getattr__, __dir__ = lazy_attributes(__name__, {m: f"{__name__}.{m}" for m in _SUBMODULES}, __all__)
