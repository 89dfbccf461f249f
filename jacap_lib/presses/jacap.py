r"""JacapPromptPress: Jacap's Algorithm 1 on the prompt's own queries, as a kvpress :class:`~kvpress.ScorerPress`.

The *prompt press*: it reads the prompt once (one prefill) and takes its query statistics from the prompt's recent
queries, so it works inside every kvpress wrapper (AdaKV, per-layer budgets, decoding) and in the decode-time
controller. The library's default, :class:`~jacap_lib.presses.jacap_context.JacapPress`, scores with the same
objective on the queries of a second reading of the context (KVzip's reconstruction pass), at several times the
prefill's cost.

For every layer and KV head, after the prompt has been prefilled:

.. math::

    w_i = \frac{[\bar\alpha_i(1-\bar\alpha_i)]^2\, k_i^\top\Lambda_Q k_i}{d},\quad
    r_i = \frac{w_i}{\sigma^2}\, u_i^\top\Big(I + \sum_j \frac{w_j}{\sigma^2} u_j u_j^\top\Big)^{-1} u_i

and kvpress keeps the top ``(1 - compression_ratio) N`` tokens by :math:`r_i`
(sink and recent-window tokens always). The centre :math:`\bar\alpha` at which the attention is linearised is,
by default, the attention the prompt's recent queries actually paid (``centre="observed"``); Algorithm 1 as
published takes the tempered softmax
:math:`\bar\alpha_i = \mathrm{softmax}_i(k_i^\top\mu_Q/(\tau\sqrt d))` (``centre="tempered"``); Expected
Attention's log-normal expectation is the third (``centre="ea"``). Each centre is computed in one place
(:func:`jacap_lib.scoring.core.centre_attention`, :func:`jacap_lib.presses.utils.observed_attention`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from kvpress import ScorerPress
from torch import nn
from transformers.models.llama.modeling_llama import repeat_kv

from .. import _checks, config
from ..config import DEFAULTS
from ..scoring import JacapScores
from ..scoring.core import validated_scores
from ..selection import n_kept
from ..stats import ema_weights, moment_stats
from . import utils

__all__ = ["JacapPromptPress", "TemperedCentrePress", "CENTRES"]

#: the centres the press linearises at: the observed attention, Algorithm 1's tempered softmax, Expected Attention's
CENTRES = ("observed", "tempered", "ea")

# the press's fields that are Jacap's shared parameters (defaults and rules: jacap_lib.config)
_SHARED = ("tau", "noise", "deff_frac", "n_sink", "window", "n_queries", "beta", "gqa", "eps", "backend")


@dataclass
class JacapPromptPress(utils.BudgetSplit, ScorerPress):
    r"""Jacap KV-cache eviction (Yang et al., arXiv 2609.08131) for kvpress.

    Parameters
    ----------
    compression_ratio : float, default=0.0
        Fraction of the prompt's KV pairs to remove (kvpress convention; keeps
        :func:`jacap_lib.selection.n_kept` ``(N, compression_ratio)`` tokens per layer and KV head, kvpress's rule).
    centre : {"observed", "tempered", "ea"}, default="observed"
        Where the attention is linearised. ``"observed"``: :math:`\bar\alpha` is the attention the prompt's recent
        queries actually computed (each at its own RoPE position, causal, averaged with the weights of
        :math:`\mu_Q`: :func:`jacap_lib.presses.utils.observed_attention`; under padding, real tokens only); no
        temperature enters, ``tau`` is unused.
        ``"tempered"``: Algorithm 1's centre, :math:`\bar\alpha = \mathrm{softmax}(K\mu_Q/(\tau\sqrt d))`.
        ``"ea"``: Expected Attention's log-normal expectation
        :math:`\bar\alpha = \mathrm{softmax}(K\mu_Q/\sqrt d + \mathrm{diag}(K\Lambda_Q K^\top)/(2d))` (no
        :math:`\tau`; the registry's ``jacap_ea`` pairs it with that method's query statistics).
        The capacity objective and the score are Algorithm 1's; only the point of the linearisation moves. The observed and EA centres are
        scored on the torch path (``backend="triton"`` computes the tempered centre in its kernels and is refused
        with them).
    tau, noise, deff_frac, n_sink, window, n_queries, beta, gqa, eps, backend
        Jacap's shared parameters: their defaults and checks live in :mod:`jacap_lib.config`
        (:data:`~jacap_lib.config.DEFAULTS`), the values below.
    tau : float, default=3.0
        With ``centre="tempered"``: temperature of the centre softmax :math:`\bar\alpha` (the paper uses 10; its
        exact settings are ``press_from_spec(protocol.PAPER_PRESET, c)``: the tempered centre, tau 10, noise 1, flat
        statistics).
    noise : float or "deff", default=1.0
        Channel noise :math:`\sigma^2`; the weights enter ``A`` and the score as ``w / noise``.
        ``"deff"``: per layer and KV head, the :math:`\sigma^2` at which the effective dimension
        :math:`\sum_i r_i` of the weighted Gram equals ``deff_frac * min(n_kept, d)``
        (:func:`jacap_lib.scoring.deff_noise`; ``n_kept`` = tokens this press keeps, ``d`` = head dim).
    deff_frac : float, default=0.25
        With ``noise="deff"``: the target effective dimension as a fraction of ``min(n_kept, d)``.
    use_out_proj : bool, default=False
        ``False``: ``u_i = v_i`` (the paper's cheap proxy). ``True``: ``u_i = W_O v_i`` with the
        head's slice of the output projection (computed exactly through a ``d x d`` factor of
        ``W_O^T W_O``, see :func:`jacap_lib.presses.utils.out_proj_factors`).
    n_sink : int, default=4
        First positions always kept (attention sinks); their queries are also left out of the
        statistics, as in kvpress's ExpectedAttentionPress. Under padding (an ``attention_mask`` in the attention
        module's kwargs) the sinks and the window count real tokens, never pad slots.
    window : int, default=16
        Last positions always kept (recent window; the note's Algorithm 1 step 10 and Algorithm 2
        step 4). For comparison, the baselines' built-in recency: kvpress SnapKV keeps its
        observation window (``window_size``, default 64), TOVA scores by the attention of the last query
        alone, StreamingLLM keeps only the sinks and the most recent tokens. ``window=0`` is Algorithm 1
        without step 10 (only the sinks are protected). When the budget
        ``n_kept`` cannot hold ``n_sink`` + ``window`` tokens, the window shrinks to ``n_kept - n_sink``
        (the most recent tokens are kept; a ``RuntimeWarning`` says so once per press); the sinks go
        before the window: a budget below ``n_sink`` keeps the earliest ``n_kept`` sinks (warned too).
        This is :func:`jacap_lib.presses.utils.protection` on :func:`jacap_lib.selection.fit_protection`, the rule
        :func:`jacap_lib.select_keep`, the decode-time controller and every Jacap press follow.
    n_queries : int or None, default=None
        Statistics from the last ``n_queries`` prompt queries; ``None`` = all (after the sinks).
    beta : float or None, default=0.9
        A float in [0, 1): exponential moving average over the prompt positions (note section 11),
        ``mu_t = beta mu_{t-1} + (1-beta) q_t`` ``None``: flat mean /
        variance over the prompt's queries (the paper's).
    n_future_positions : int, default=512
        Queries are rotated by the RoPE matrix averaged over this many future positions (kvpress).
    gqa : {"pool", "mean"}, default="pool"
        How a KV head shared by G query heads is scored. ``"pool"``: one Gaussian for the KV head,
        fitted to the queries of all G heads together (their moments averaged), and with
        ``use_out_proj`` the G output slices stacked; one Algorithm-1 pass per KV head.
        ``"mean"``: Algorithm 1 per query head with its own statistics (and own ``W_O`` slice),
        scores averaged over the group (kvpress's ExpectedAttention/CapKV convention; G times the work).
    eps : float, default=1e-6
        Floor of the query variance :math:`\mathrm{diag}(\Lambda_Q)`.
    backend : str, default="auto"
        Passed to :func:`jacap_lib.jacap_scores` (``"auto"``, ``"torch"`` or ``"triton"``).

    Subclassing: override :meth:`query_statistics` (how ``mu``/``lam`` are estimated), :meth:`centre_attention`
    (a centre given to the scoring instead of the computed one) and/or :meth:`components` (how tokens are scored
    from them); :meth:`score` glues them together and protects sink/window tokens (:meth:`protect`).
    """

    compression_ratio: float = 0.0
    tau: float = DEFAULTS.tau
    noise: float | str = DEFAULTS.noise
    deff_frac: float = DEFAULTS.deff_frac
    use_out_proj: bool = False
    n_sink: int = DEFAULTS.n_sink
    window: int = DEFAULTS.window
    n_queries: int | None = DEFAULTS.n_queries
    beta: float | None = DEFAULTS.beta
    n_future_positions: int = 512
    gqa: str = DEFAULTS.gqa
    eps: float = DEFAULTS.eps
    backend: str = DEFAULTS.backend
    centre: str = "observed"
    # set by jacap_lib.measure.eviction to record per-layer internals; None = record nothing
    trace: dict | None = field(default=None, init=False, repr=False, compare=False)
    _window_warned: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self):
        _checks.compression_ratio(self.compression_ratio)
        for name in _SHARED:  # Jacap's parameters: one rule each (jacap_lib.config)
            config.check(name, getattr(self, name))
        _checks.int_at_least("n_future_positions", self.n_future_positions, 1)
        _checks.boolean("use_out_proj", self.use_out_proj)
        _checks.choice("centre", self.centre, self.centres)
        if self.centre != "tempered" and self.backend == "triton":  # validated_scores refuses it too
            raise ValueError(f"backend='triton' computes the tempered centre inside its kernels; with "
                             f"centre={self.centre!r} use backend='auto' or 'torch' (or set centre='tempered')")

    #: the centres this press can linearise at (a subclass that recomputes the tempered centre narrows it)
    centres: ClassVar[tuple] = CENTRES
    #: the weight's factors and the leverage handed to the scoring (Algorithm 1's; JacapAblationPress swaps them)
    scoring_rules: ClassVar[dict] = {}

    # ---- step 1: query statistics -------------------------------------------------------
    def query_statistics(self, module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor, kwargs: dict):
        """``(mu, lam)`` of future queries, float32: ``(B, H_kv, d)`` for ``gqa="pool"``, ``(B, H_q, d)`` for ``"mean"``.

        Per query head, the first and second moments over the (future-RoPE-rotated) queries of the
        hidden states the hook hands over, flat or EMA-weighted; with ``"pool"`` the moments of the G
        heads are averaged (a mixture), then ``lam = max(m - mu^2, eps)``.

        Positions come from the hook (:func:`~jacap_lib.presses.utils.hook_positions`), not from the
        row index: only rows at true positions ``< n_sink`` are skipped, and the RoPE average starts
        at the true next position. Under ``DecodingPress`` the rows are the buffered decoding steps,
        under ``ChunkPress`` the chunk. With fewer usable rows than asked for (even one), the
        statistics use the rows there are (``lam`` is then floored at ``eps``). Under padding (an
        ``attention_mask`` in the hook's kwargs, :func:`~jacap_lib.presses.utils.real_rows`) each batch row uses its
        own real rows only, and its RoPE average starts after its last real position.
        """
        query_pos, _, next_pos = utils.hook_positions(hidden_states, keys, kwargs)
        rows = utils.real_rows(hidden_states, keys, kwargs)
        if rows is None:
            return self._moments(module, hidden_states, query_pos, next_pos, keys.shape[1])
        # padding: each batch row's statistics from its own real rows, as if it had been prefilled alone
        per_row = [self._moments(module, hidden_states[b: b + 1, r], query_pos[r.to(query_pos.device)],
                                 int(query_pos[r.to(query_pos.device)].max()) + 1, keys.shape[1])
                   for b, r in enumerate(rows)]
        return tuple(torch.cat(x) for x in zip(*per_row))

    def _moments(self, module, hidden_states, query_pos, next_pos, n_kv_heads):
        """:meth:`query_statistics` of hidden-state rows at ``query_pos``, the first future position ``next_pos``."""
        q = utils.future_query_states(
            module, hidden_states, n_queries=self.n_queries, skip=self.n_sink, n_future_positions=self.n_future_positions,
            positions=query_pos, next_position=next_pos,
        ).float()
        if self.beta is None:
            mu, m = q.mean(-2), q.square().mean(-2)
        else:
            w = ema_weights(q.shape[-2], self.beta, device=q.device).unsqueeze(-1)
            mu, m = (w * q).sum(-2), (w * q.square()).sum(-2)
        group = mu.shape[1] // n_kv_heads if self.gqa == "pool" else 1
        return moment_stats(mu, m, self.eps, group=group)

    def centre_attention(self, module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor,
                         kwargs: dict) -> torch.Tensor | None:
        """The observed centre, ``(B, H_kv, N)`` for ``gqa="pool"`` (``(B, H_q, N)`` for ``"mean"``), float32:
        :func:`~jacap_lib.presses.utils.observed_attention` over the rows and weights of :meth:`query_statistics`
        (positions ``>= n_sink``, the last ``n_queries``, EMA ``beta``); ``None`` for ``centre="tempered"`` and
        ``"ea"``, which :meth:`components` computes from the keys and ``(mu, lam)``."""
        if self.centre != "observed":
            return None
        return utils.observed_attention(module, hidden_states, keys, kwargs or {}, n_queries=self.n_queries,
                                        skip=self.n_sink, beta=self.beta, pooled=self.gqa == "pool")

    # ---- step 2: Algorithm 1 ---------------------------------------------------------------
    def components(self, keys, values, mu, lam, module: nn.Module, alpha: torch.Tensor | None = None,
                   key_mask: torch.Tensor | None = None) -> JacapScores:
        """All per-token quantities of Algorithm 1, ``(B, H_kv, N)`` each (group-averaged for ``"mean"``).

        ``alpha``: a given centre (:meth:`centre_attention`), needed with ``centre="observed"``; ``None`` computes
        the tempered or EA centre (:func:`jacap_lib.scoring.core.centre_attention`). ``key_mask (B, 1, N)``: the
        real slots under padding (:meth:`score` passes it); the centre then puts no mass on the others."""
        if self.centre == "observed" and alpha is None:
            raise ValueError("centre='observed' needs `alpha`, the observed attention (press.centre_attention(module, "
                             "hidden_states, keys, kwargs)); or build the press with centre='tempered'")
        out_proj = utils.out_proj_factors(module, pooled=self.gqa == "pool").to(keys.device) if self.use_out_proj else None
        if self.gqa == "mean":
            g = mu.shape[1] // keys.shape[1]
            keys, values = repeat_kv(keys, g), repeat_kv(values, g)
        noise = self.noise if isinstance(self.noise, str) else float(self.noise)  # checked in __post_init__
        centre = self.centre if alpha is None else "tempered"  # a given alpha replaces the computed one (unused)
        parts = validated_scores(keys, values, mu, lam, tau=float(self.tau), noise=noise,
                                 deff_target=self.deff_target(keys), out_proj=out_proj, backend=self.backend,
                                 alpha=alpha, centre=centre, key_mask=key_mask, **self.scoring_rules)
        if self.gqa == "mean":
            b, h, n = parts.score.shape
            parts = parts.map(lambda t: t.view(b, h // g, g, n).mean(2))
        return parts

    def deff_target(self, keys: torch.Tensor) -> float | None:
        """Target effective dimension ``deff_frac * min(n_kept, d)`` for ``noise="deff"`` (``None`` otherwise)."""
        if self.noise != "deff":
            return None
        budget = max(1, n_kept(keys.shape[-2], self.compression_ratio))  # a dropped layer (ratio 1) scores nothing
        return self.deff_frac * min(budget, keys.shape[-1])

    def token_scores(self, keys, values, mu, lam, module: nn.Module, alpha: torch.Tensor | None = None) -> torch.Tensor:
        """Retention score ``r_i`` per token, ``(B, H_kv, N)``; higher = keep (``alpha``: as :meth:`components`)."""
        return self.components(keys, values, mu, lam, module, alpha).score

    # ---- kvpress entry point -----------------------------------------------------------------
    def protected(self, hidden_states, keys, kwargs) -> torch.Tensor:
        """Boolean mask of the sink and window slots, ``(N,)`` (``(B, 1, N)`` under padding): the one protection rule,
        :func:`jacap_lib.presses.utils.protection` (located by true positions when the hook tells them, else by slot;
        real tokens only under padding; the sinks first, then the window shrunk to the budget left). Any truncation
        is warned about (once per press), never silent.
        """
        mask, note = utils.protection(hidden_states, keys, kwargs, n_sink=self.n_sink, window=self.window,
                                      compression_ratio=self.compression_ratio)
        if note is not None:
            self._warn_once(f"JacapPromptPress: {note}")
        return mask


    def _warn_once(self, message: str) -> None:
        if not self._window_warned:
            self._window_warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def protect(self, scores: torch.Tensor, hidden_states, keys, kwargs) -> torch.Tensor:
        """Sink and window tokens get the largest finite score (kvpress's top-k keeps them)."""
        return scores.masked_fill(self.protected(hidden_states, keys, kwargs), torch.finfo(scores.dtype).max)

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """Algorithm 1's score of every cached token, ``(B, H_kv, N)``, protected slots at the largest finite value:
        :meth:`query_statistics`, :meth:`centre_attention`, :meth:`components` (with the real slots under
        padding), :meth:`retention` and :meth:`protect`."""
        mu, lam = self.query_statistics(module, hidden_states, keys, kwargs)
        alpha = self.centre_attention(module, hidden_states, keys, kwargs)
        real = utils.real_tokens(kwargs, keys.shape[-2], keys.device)
        extra = {} if real is None else {"key_mask": real[:, None, :]}
        parts = self.components(keys, values, mu, lam, module, alpha, **extra)
        scores = self.retention(parts)
        if self.trace is not None:
            self.trace[module.layer_idx] = {"mu": mu, "lam": lam, "score": scores, "parts": parts}
        return self.protect(scores, hidden_states, keys, kwargs)

    def retention(self, parts: JacapScores) -> torch.Tensor:
        """The score kvpress ranks by: Algorithm 1's :math:`r_i` (``parts.score``)."""
        return parts.score

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """kvpress's ``ScorerPress.compress`` with the kept tokens gathered in position order.

        Same kept set as kvpress (top ``compute_n_kept(N, compression_ratio)`` scores per KV head),
        but in ascending slot order instead of score order, so that a later compression of the same
        cache (``DecodingPress``, ``PrefillDecodingPress``) still finds the sinks first and the
        recent window last. Attention does not depend on slot order (keys carry their RoPE).
        ``compression_ratio = 1.0`` (kvpress's "drop the layer") keeps nothing and scores nothing.
        """
        n = keys.shape[2]
        if self.compression_ratio == 0 or n == 0:
            return keys, values
        budget = n_kept(n, self.compression_ratio)
        if budget == 0:
            return keys[:, :, :0].contiguous(), values[:, :, :0].contiguous()
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        idx = scores.topk(budget, dim=-1).indices.sort(dim=-1).values
        idx = idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        return keys.gather(2, idx).contiguous(), values.gather(2, idx).contiguous()


@dataclass
class TemperedCentrePress(JacapPromptPress):
    """Base of the variants built on Algorithm 1's tempered centre (two-stage, rank-one, multi-centre, hybrid; the
    anatomy's window-attention instrument, :class:`jacap_lib.measure.instruments.JacapWindowAttentionPress`, replaces it):
    ``centre="tempered"`` is their default and their only centre, since JacapPromptPress's observed centre (its default)
    would bypass what they change. Under padding they protect real tokens (the one rule, :meth:`protected`) but,
    except the window-attention instrument, score every slot, pads included."""

    centre: str = "tempered"
    centres: ClassVar[tuple] = ("tempered",)

