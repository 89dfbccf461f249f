"""Live controls for the live-eviction chapter.

:class:`EvictionExplorer` holds a model and a text and answers the controls with pure functions of
their values (memoised, tested without a kernel); :func:`live_app` wires them to ipywidgets:
method, compression ratio, Jacap's centre (observed attention or the tempered softmax, whose tau the slider
sets), tau, beta, layer, head, and an "answer" button comparing the model's answer with and without eviction.
"""
from __future__ import annotations

from functools import lru_cache

from jacap_lib.config import DEFAULTS
from jacap_lib.measure.eviction import DEMO_CONTEXT, DEMO_CONTINUATION, DEMO_QUESTION  # noqa: F401 (re-exported)
from jacap_lib.viz import live as V

__all__ = ["DEMO_CONTEXT", "DEMO_QUESTION", "DEMO_CONTINUATION", "BETA_CHOICES", "CENTRE_CHOICES", "press_options", "parse_choice",
           "EvictionExplorer", "live_app"]

BETA_CHOICES = (None, 0.5, 0.9, 0.99)
CENTRE_CHOICES = ("observed", "tempered")  # JacapPromptPress's default first


def _centres(method: str) -> tuple:
    """The centres ``method``'s Jacap press offers (``()`` for a press without the choice)."""
    from jacap_lib.presses.registry import build_press

    press = build_press(method, 0.5)
    return tuple(getattr(getattr(press, "press", press), "centres", ()))


def press_options(method: str, tau: float, beta: float | None, centre: str | None = None) -> dict:
    """Constructor options a control setting means for ``method``: tau/beta (and ``centre``, where the method's press
    offers it: the variants that rebuild the tempered centre do not) steer only Jacap presses, each only where the
    press has it (the default ``jacap`` summarises its reconstruction queries without ``beta``)."""
    if not isinstance(method, str):
        raise ValueError(f"method must be a registry name, got {method!r}")
    if centre is not None and centre not in CENTRE_CHOICES:
        raise ValueError(f"centre must be one of {CENTRE_CHOICES} or None, got {centre!r}")
    if not method.startswith("jacap"):
        return {}
    from jacap_lib.presses.registry import valid_options

    valid = valid_options(method)
    out = {k: v for k, v in (("tau", float(tau)), ("beta", beta)) if k in valid}
    if centre is not None and centre in _centres(method):
        out["centre"] = centre
    return out


def parse_choice(value):
    """``"all"`` (a dropdown entry) -> ``None``; an int or digit string -> int."""
    if value is None or value == "all":
        return None
    if isinstance(value, str) and not value.isdigit():
        raise ValueError(f"expected 'all' or an index, got {value!r}")
    return int(value)


class EvictionExplorer:
    """Everything the live controls need, memoised on the control values.

    >>> ex = EvictionExplorer(model, tok)                 # doctest: +SKIP
    >>> ex.figure("jacap_prompt", 0.75, tau=10, beta=None, layer=12, head="all", centre="tempered")
    """

    def __init__(self, model, tokenizer, context: str = DEMO_CONTEXT, question: str = DEMO_QUESTION,
                 max_new_tokens: int = 24):
        self.model, self.tokenizer = model, tokenizer
        self.context, self.question, self.max_new_tokens = context, question, max_new_tokens
        self.inspect = lru_cache(maxsize=32)(self._inspect)
        self.answer = lru_cache(maxsize=32)(self._answer)

    def _inspect(self, method: str, ratio: float, tau: float = DEFAULTS.tau, beta: float | None = None,
                 centre: str | None = None):
        from jacap_lib.measure.eviction import inspect_eviction

        return inspect_eviction(self.model, self.tokenizer, self.context, method, float(ratio),
                                **press_options(method, tau, beta, centre))

    def _answer(self, method: str | None, ratio: float, tau: float = DEFAULTS.tau, beta: float | None = None,
                centre: str | None = None) -> str:
        from jacap_lib.measure.eviction import answer

        opts = {} if method is None else press_options(method, tau, beta, centre)
        return answer(self.model, self.tokenizer, self.context, self.question, method, float(ratio),
                      max_new_tokens=self.max_new_tokens, **opts)

    def figure(self, method: str, ratio: float, tau: float = DEFAULTS.tau, beta=None, layer="all", head="all",
               centre: str | None = None):
        """The token strip for one setting of the controls."""
        insp = self.inspect(method, float(ratio), float(tau), beta, centre)
        return V.token_strip(insp, parse_choice(layer), parse_choice(head))

    def answers(self, method: str, ratio: float, tau: float = DEFAULTS.tau, beta=None, centre: str | None = None) -> dict:
        """The model's answer to the question without eviction and with ``method`` at ``ratio``."""
        return {"full": self.answer(None, 0.0),
                "compressed": self.answer(method, float(ratio), float(tau), beta, centre)}


def live_app(model, tokenizer, context: str = DEMO_CONTEXT, question: str = DEMO_QUESTION):
    """ipywidgets app over :class:`EvictionExplorer` (needs a live kernel)."""
    import html

    import ipywidgets as W
    from IPython.display import display

    from jacap_lib.presses.registry import list_methods

    ex = EvictionExplorer(model, tokenizer, context, question)
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    # every registry press: those that mask keys (the default jacap, KVzip) show each head's own count
    method = W.Dropdown(options=list_methods(), value="jacap_prompt", description="method")
    ratio = W.FloatSlider(value=0.75, min=0.1, max=0.9, step=0.05, description="c", continuous_update=False)
    centre = W.Dropdown(options=list(CENTRE_CHOICES), value=CENTRE_CHOICES[0], description="centre")
    tau = W.FloatLogSlider(value=DEFAULTS.tau, base=10, min=-1, max=2, step=0.1, description="τ", continuous_update=False,
                           disabled=True)  # tau only sets the tempered centre
    beta = W.Dropdown(options=[("flat mean", None)] + [(str(b), b) for b in BETA_CHOICES[1:]], value=None,
                      description="β")
    layer = W.Dropdown(options=["all"] + list(range(n_layers)), value="all", description="layer")
    head = W.Dropdown(options=["all"] + list(range(n_heads)), value="all", description="KV head")
    ask = W.Button(description="answer the question")
    answers = W.HTML()
    out = W.Output()  # plotly's FigureWidget would need anywidget; an Output re-showing the figure needs nothing

    def redraw(_=None):
        tau.disabled = centre.value != "tempered"
        out.clear_output(wait=True)
        with out:
            display(ex.figure(method.value, ratio.value, tau.value, beta.value, layer.value, head.value, centre.value))

    def on_ask(_):
        answers.value = "<i>generating…</i>"
        got = ex.answers(method.value, ratio.value, tau.value, beta.value, centre.value)
        answers.value = (f"<b>Q:</b> {html.escape(question)}<br><b>full cache:</b> {html.escape(got['full'])}<br>"
                         f"<b>{method.value}, c = {ratio.value:g}:</b> {html.escape(got['compressed'])}")

    for control in (method, ratio, centre, tau, beta, layer, head):
        control.observe(redraw, names="value")
    ask.on_click(on_ask)
    redraw()
    app = W.VBox([W.HBox([method, ratio, centre]), W.HBox([tau, beta, layer]), W.HBox([head]), out, ask, answers])
    app.explorer = ex  # for inspection and tests
    return app
