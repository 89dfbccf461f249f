r"""Jacap's parameters: each default and each validation rule written once.

:class:`JacapConfig` is the one owner of the parameters that the press
(:class:`~jacap_lib.presses.jacap.JacapPromptPress`), the decode-time controller
(:class:`~jacap_lib.controller.JacapDecodeController`) and the scorers
(:func:`jacap_lib.jacap_scores`, :func:`jacap_lib.triton_jacap_scores`) share. Their signatures read their
defaults from :data:`DEFAULTS`, and they validate a value with :func:`check` where it enters (the public
entry points); what they hand on to each other is already valid and is not checked again.

=====================  ===========  =====================================================================
parameter              default      meaning
=====================  ===========  =====================================================================
``tau``                3.0          temperature of the centre softmax :math:`\bar\alpha` (unused by the observed centre)
``noise``              1.0          channel noise :math:`\sigma^2` (> 0), or ``"deff"`` (effective-dimension rule)
``deff_frac``          0.25         with ``noise="deff"``: target :math:`\sum_i r_i` as a fraction of
                                    ``min(tokens kept, head dim)``, in (0, 1]
``n_sink``             4            first positions always kept (attention sinks)
``window``             16           last positions always kept (recent window)
``n_queries``          None         prompt statistics from the last ``n_queries`` queries (``None`` = all)
``beta``               0.9          prompt statistics: a float in [0, 1) = EMA over the prompt positions,
                                    ``None`` = flat mean/variance (the paper's)
``decode_beta``        0.9          EMA factor of the decode-time statistics (Algorithm 2), in [0, 1), or
                                    ``None`` = flat (cumulative) mean/variance of every query seen
``gqa``                ``"pool"``   a KV head shared by G query heads: ``"pool"`` (one Gaussian) or ``"mean"``
``eps``                1e-6         floor of the query variance :math:`\mathrm{diag}(\Lambda_Q)`
``backend``            ``"auto"``   scoring backend: ``"auto"``, ``"torch"`` or ``"triton"``
=====================  ===========  =====================================================================

Where the values come from: the defaults are JacapPromptPress's own; the settings the evaluation tuned or the paper
published are named rows of one table, :data:`jacap_lib.presses.presets.PRESETS`, each with its source (these
defaults are its row ``jacap_prompt_default``, the paper's settings its row ``algorithm1_as_published``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from . import _checks

__all__ = ["JacapConfig", "DEFAULTS", "PAPER", "check", "BACKENDS", "GQA_MODES", "DEFAULT_RATIO"]

# The default compression ratio of inspect_eviction, answer and `jacap inspect`. For a ~250-token prompt
# and Jacap's default protection (n_sink = 4, window = 16: 20 protected slots), c = 0.5 keeps 125 tokens per
# head, 105 of them chosen by the score (84 % of the budget); c = 0.75 keeps 62, 42 by score (68 %); c = 0.9
# keeps 24, 4 by score. An inspection should show the score at work on most of the budget: 0.5.
DEFAULT_RATIO = 0.5

BACKENDS = ("auto", "torch", "triton")
GQA_MODES = ("pool", "mean")


def _noise(name, value):
    if isinstance(value, str):
        if value != "deff":
            raise ValueError(f"`{name}` must be a number > 0 or the string 'deff' (effective-dimension rule), "
                             f"got {value!r}")
        return value
    return _checks.positive(name, value)


def _deff_frac(name, value):
    v = _checks.unit_interval(name, value, closed_right=True)
    if v == 0:
        raise ValueError(f"`{name}` must lie in (0, 1] (a fraction of min(tokens kept, head dim)), got {value!r}")
    return v


def _optional(rule):
    return lambda name, value: None if value is None else rule(name, value)


# parameter -> rule(name, value) -> the validated value (a ValueError naming `name` and the fix otherwise)
_RULES = {
    "tau": _checks.positive,
    "noise": _noise,
    "deff_frac": _deff_frac,
    "n_sink": _checks.nonneg_int,
    "window": _checks.nonneg_int,
    "n_queries": _optional(lambda name, v: _checks.int_at_least(name, v, 1)),
    "beta": _optional(_checks.unit_interval),
    "decode_beta": _optional(_checks.unit_interval),
    "gqa": lambda name, v: _checks.choice(name, v, GQA_MODES),
    "eps": _checks.positive,
    "backend": lambda name, v: _checks.choice(name, v, BACKENDS),
}


def check(parameter: str, value, *, name: str | None = None):
    """``value`` validated as Jacap's ``parameter`` (the error names ``name``, default ``parameter``)."""
    if parameter not in _RULES:
        raise ValueError(f"`parameter` must be one of {', '.join(_RULES)}; got {parameter!r}")
    return _RULES[parameter](name or parameter, value)


@dataclass(frozen=True)
class JacapConfig:
    """Jacap's shared parameters, validated on construction (see the module's table)."""

    tau: float = 3.0
    noise: float | str = 1.0
    deff_frac: float = 0.25
    n_sink: int = 4
    window: int = 16
    n_queries: int | None = None
    beta: float | None = 0.9
    decode_beta: float | None = 0.9
    gqa: str = "pool"
    eps: float = 1e-6
    backend: str = "auto"

    def __post_init__(self):
        for f in fields(self):
            check(f.name, getattr(self, f.name))


DEFAULTS = JacapConfig()
#: The paper's exact settings (Algorithm 1 as published: tau = 10 from its ablation, sigma^2 = 1, flat prompt
#: statistics). As a press: the preset ``algorithm1_as_published`` (:data:`jacap_lib.presses.presets.PRESETS`).
PAPER = JacapConfig(tau=10.0, noise=1.0, beta=None)
