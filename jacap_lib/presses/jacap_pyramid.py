r"""Per-layer budget allocation for Jacap (note §14.3): a linear "pyramid" of compression ratios.

PyramidKV (Cai et al., 2024) observed that attention in lower layers is spread over many tokens
while upper layers concentrate on a few, so a fixed total budget is better spent with more KV pairs
low in the stack and fewer high up. This variant keeps Jacap's per-token scores and only changes
how many tokens each layer keeps: kvpress's :class:`~kvpress.PerLayerCompressionPress` wraps a
:class:`~jacap_lib.presses.jacap.JacapPress` and hands layer :math:`l` its own ratio :math:`c_l`.

The schedule (:func:`pyramid_ratios`), for :math:`L` layers, mean ratio :math:`c` and ``slope`` :math:`s`:

.. math::

    \tilde c_l = c - s\,(1 - c)\Big(1 - \frac{2l}{L-1}\Big), \qquad l = 0, \dots, L-1,

i.e. the kept fraction :math:`1-\tilde c_l = (1-c)\,[1 + s(1 - 2l/(L-1))]` falls linearly from
:math:`(1+s)(1-c)` at the bottom layer to :math:`(1-s)(1-c)` at the top (mean exactly :math:`1-c`).
``slope=0`` is uniform Jacap; ``slope=1`` takes the top layer's budget to zero, close to PyramidKV's
default (top budget = mean / 20); a negative slope is the inverted pyramid (more budget high up). The ratios are then clipped to ``[0, max_ratio]``
(``max_ratio = 0.99``: every layer keeps at least 1% of its prompt) and shifted by one common
constant :math:`t` so that the mean is again exactly :math:`c`:
:math:`c_l = \mathrm{clip}(\tilde c_l + t, 0, \texttt{max\_ratio})`, :math:`\frac1L\sum_l c_l = c`.
The shift keeps the schedule monotone (non-decreasing in :math:`l` for ``slope >= 0``) and linear between the clipped ends.

The total number of kept KV pairs equals uniform Jacap's at the same ``compression_ratio`` up to
kvpress's per-layer rounding (:func:`kvpress.utils.compute_n_kept`).

Eviction vs masking (``evict``): kvpress's ``PerLayerCompressionPress`` prunes every layer's cache
to its own length, which (kvpress warns) only works with flash attention: with SDPA/eager the
causal mask of a multi-token forward on the compressed cache is sized from layer 0 and does not fit
the other layers. ``evict="prune"`` does exactly that (fine for one-token decoding or flash
attention). ``evict="mask"`` (default) keeps the same top-:math:`n_l` tokens per head but, like kvpress's
AdaKV, leaves the tensors in place and lists the others in ``module.masked_key_indices``; kvpress's
attention patch then gives them exactly zero attention weight, so every later query sees the same
attention as after pruning (``tests/test_pyramid.py`` checks this), at the memory cost of the
uncompressed prompt. The quality benchmark uses ``"mask"``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from kvpress import PerLayerCompressionPress, ScorerPress
from kvpress.presses.base_press import BasePress

from ..selection import n_kept
from .jacap import JacapPress

__all__ = ["JacapPyramidPress", "pyramid_ratios"]


def _shift_to_mean(base: list[float], target: float, lo: float, hi: float) -> list[float]:
    """``clip(base + t, lo, hi)`` with the scalar ``t`` that makes the mean equal ``target`` (exact, piecewise linear)."""
    n = len(base)
    # f(t) = sum clip(b + t, lo, hi) is continuous, non-decreasing and linear between the breakpoints
    points = sorted({lo - b for b in base} | {hi - b for b in base})

    def f(t):
        return sum(min(max(b + t, lo), hi) for b in base)

    goal = target * n
    if all(lo <= b <= hi for b in base):
        return list(base)
    prev = points[0]
    if f(prev) >= goal:  # every layer at lo and goal == n * lo
        return [lo] * n
    for p in points[1:]:
        fp = f(p)
        if fp >= goal:
            f0 = f(prev)
            t = prev + (goal - f0) * (p - prev) / (fp - f0)
            return [min(max(b + t, lo), hi) for b in base]
        prev = p
    return [hi] * n


def pyramid_ratios(compression_ratio: float, n_layers: int, slope: float = 0.5, *,
                   max_ratio: float = 0.99) -> list[float]:
    """Per-layer compression ratios of a linear pyramid with mean exactly ``compression_ratio``.

    Parameters
    ----------
    compression_ratio : float in [0, max_ratio]
        Mean fraction of the prompt's KV pairs removed over the layers.
    n_layers : int >= 1
    slope : float, default=0.5
        0 = uniform; 1 = the bottom layer keeps twice the mean budget and the top layer (before
        clipping) none. Larger slopes saturate more layers at the bounds. A negative slope inverts
        the pyramid (more budget to the upper layers), for the ablation's control.
    max_ratio : float in (0, 1), default=0.99
        Upper bound of every layer's ratio (each layer keeps at least ``1 - max_ratio`` of its prompt).

    Returns
    -------
    list of ``n_layers`` floats, non-decreasing for ``slope >= 0`` (lower layers keep more;
    non-increasing for ``slope < 0``), each in ``[0, max_ratio]``,
    whose mean is ``compression_ratio`` (to float64 rounding, ~1e-16).
    """
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive int (the model's number of layers), got {n_layers!r}")
    if isinstance(slope, bool) or not isinstance(slope, (int, float)) or slope != slope:
        raise ValueError(f"slope must be a real number (0 = uniform budgets, 1 = PyramidKV-like, "
                         f"< 0 = inverted), got {slope!r}")
    if isinstance(max_ratio, bool) or not isinstance(max_ratio, (int, float)) or not 0 < max_ratio < 1:
        raise ValueError(f"max_ratio must be in (0, 1), got {max_ratio!r}")
    if isinstance(compression_ratio, bool) or not isinstance(compression_ratio, (int, float)) or not (
        0 <= compression_ratio <= max_ratio
    ):
        raise ValueError(f"compression_ratio must be in [0, max_ratio={max_ratio}] for a per-layer schedule, "
                         f"got {compression_ratio!r}")
    c = float(compression_ratio)
    if n_layers == 1:
        return [c]
    base = [c - slope * (1 - c) * (1 - 2 * l / (n_layers - 1)) for l in range(n_layers)]
    # rounded to 1e-12 so that float noise never moves kvpress's token count int(N (1 - c_l)) by one
    return [round(x, 12) for x in _shift_to_mean(base, c, 0.0, float(max_ratio))]


class _QuietPerLayer(logging.Filter):
    def filter(self, record):
        return "Per layer compression wrapper" not in record.getMessage()


@dataclass
class JacapPyramidPress(PerLayerCompressionPress):
    """Jacap with a linear per-layer budget pyramid (more KV pairs kept in lower layers).

    Parameters
    ----------
    press : ScorerPress, default=JacapPress()
        The per-token scorer; its ``compression_ratio`` is the *mean* ratio over the layers.
    slope : float, default=0.5
        Steepness of the pyramid, see :func:`pyramid_ratios`.
    max_ratio : float, default=0.99
        Upper bound of any layer's ratio.
    evict : {"mask", "prune"}, default="mask"
        ``"prune"``: kvpress's per-layer pruning (caches of different lengths; flash attention or
        one-token decoding only). ``"mask"``: same kept tokens, evicted ones masked (see the module doc).

    ``compression_ratios`` (the per-layer schedule) is computed from the model's number of layers
    (``module.config.num_hidden_layers``) at the first forward and kept for inspection.
    """

    press: ScorerPress = field(default_factory=JacapPress)
    compression_ratios: list = field(default_factory=list, init=False)
    slope: float = 0.5
    max_ratio: float = 0.99
    evict: str = "mask"

    def __post_init__(self):
        if self.evict not in ("mask", "prune"):
            raise ValueError(f"evict must be 'mask' (equal-length caches, evicted keys masked) or 'prune', got {self.evict!r}")
        if not isinstance(self.press, ScorerPress):
            raise ValueError(f"press must be a kvpress ScorerPress (e.g. JacapPress), got {type(self.press).__name__}")
        # validate slope / max_ratio / the mean ratio now, not at the first forward
        pyramid_ratios(self.press.compression_ratio, 2, self.slope, max_ratio=self.max_ratio)
        logger = logging.getLogger("kvpress.presses.per_layer_compression_press")
        quiet = _QuietPerLayer()
        logger.addFilter(quiet)
        try:
            super().__post_init__()
        finally:
            logger.removeFilter(quiet)

    def schedule(self, n_layers: int) -> list[float]:
        """The per-layer ratios for a model with ``n_layers`` layers."""
        return pyramid_ratios(self.press.compression_ratio, n_layers, self.slope, max_ratio=self.max_ratio)

    @property
    def compression_ratio(self):
        return self.press.compression_ratio

    @compression_ratio.setter
    def compression_ratio(self, value):
        raise AttributeError(f"set the mean ratio on {type(self).__name__}.press.compression_ratio")

    def post_init_from_model(self, model):
        self.compression_ratios = self.schedule(model.config.num_hidden_layers)
        self.press.post_init_from_model(model)

    def forward_hook(self, module, input, kwargs, output):
        n_layers = module.config.num_hidden_layers
        if len(self.compression_ratios) != n_layers:
            self.compression_ratios = self.schedule(n_layers)
        if self.evict == "prune":
            return super().forward_hook(module, input, kwargs, output)
        if module.config._attn_implementation == "eager":
            raise ValueError("evict='mask' needs kvpress's attention patch, which eager attention bypasses; "
                             "load the model with attn_implementation='sdpa' or use evict='prune'")
        return BasePress.forward_hook(self, module, input, kwargs, output)  # -> self.compress

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """``evict="mask"``: keep the layer's top ``n_kept(N, c_l)`` tokens per head, mask the rest."""
        ratio = self.compression_ratios[module.layer_idx]
        if ratio == 0:
            return keys, values
        original = self.press.compression_ratio
        self.press.compression_ratio = ratio
        try:
            scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
        finally:
            self.press.compression_ratio = original
        bsz, n_heads, k_len = scores.shape
        top = scores.topk(n_kept(k_len, ratio), dim=-1).indices  # the set ScorerPress.compress keeps
        evicted = torch.ones_like(scores, dtype=torch.bool).scatter(-1, top, False)
        module.masked_key_indices = evicted.nonzero(as_tuple=True)  # (batch, head, position)
        return keys, values
