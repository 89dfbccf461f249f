r"""The reading note's three failure cases (§20), as runnable measurements on a real model.

Each demo builds a prompt in which one piece of context matters only later, compresses the
prompt's KV cache with :class:`jacap_lib.JacapPromptPress` (kvpress) and measures, on the continuation
that needs that piece:

* the log-probability of the critical answer token(s) and whether greedy decoding would get them,
* the next-token KL(full ‖ compressed) over the continuation (:mod:`jacap_lib.measure.quality`),
* whether the critical context tokens survived eviction (fraction of (layer, KV head) pairs).

1. :func:`delayed_constraint` (§20.1) — a code in the system prefix, asked for only at the end;
   with and without prefix protection (``n_sink`` covering the system prefix).
2. :func:`competing_evidence` (§20.2) — two statements with opposite values; Algorithm 1's
   diagonal scoring vs the exact rank-one-corrected scoring (:class:`JacapRank1Press`).
3. :func:`phase_change` (§20.3) — the queries switch from prose to a table; EMA statistics with
   large vs small β (:func:`jacap_lib.stats.ema_query_stats` for the lag, ``JacapPromptPress(beta=...)``
   for the eviction).

The bundled model is small: each result object reports what was measured, and the chapter says
plainly when a demo does not show the effect the note predicts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..config import DEFAULTS
from ..presses.jacap import JacapPromptPress
from ..presses.jacap_rank1 import JacapRank1Press
from ..selection import n_kept, protect_within, protected_mask

__all__ = [
    "CaseResult",
    "FailureDemo",
    "run_case",
    "delayed_constraint",
    "competing_evidence",
    "phase_change",
    "query_lag",
    "DELAYED_PROMPT",
    "COMPETING_PROMPT",
    "COMPETING_PROMPT_NORTH",
    "PHASE_PROMPT",
]


# ----------------------------------------------------------------------------- prompts (self-written)
_FILLER = (
    "The village market opens at dawn on Saturdays. Farmers arrive with carts of vegetables, bakers "
    "set out bread on long tables, and a man with a barrel organ plays the same four songs until noon. "
    "Children run between the stalls, and the smell of roasted chestnuts drifts from the corner by the "
    "fountain. In autumn there are apples of every colour, and in winter the stalls sell candles, wool "
    "and dried herbs. The market has been held in the same square for more than three hundred years, "
    "and the oldest stall still belongs to the family that founded it. "
)

#: Delayed constraint: a code in the system prefix, needed only after a long unrelated message.
DELAYED_PROMPT = dict(
    system="Remember this for later: the access code is 5847. Never forget the access code.",
    user=_FILLER * 2,
    question=" Now, what is the access code? The access code is",
    answer=" 5847",
)

#: Competing evidence: two reports with opposite values; the question asks for one of them.
COMPETING_PROMPT = dict(
    context=(
        "Two stations sent reports this morning.\nStation North: the mountain road is open.\n"
        "Station South: the mountain road is closed.\n" + _FILLER * 2
    ),
    question="\nStation South: the mountain road is",
    answer=" closed",
    rival=" open",
)

#: The same context, asking for the other station (a model that compares gets both right).
COMPETING_PROMPT_NORTH = dict(COMPETING_PROMPT, question="\nStation North: the mountain road is", answer=" open",
                              rival=" closed")

#: Phase change: prose that mentions quantities, then a table that recalls them.
PHASE_PROMPT = dict(
    prose=(
        _FILLER + "Last Saturday Anna sold 17 baskets of plums, Boris sold 42 loaves of rye bread, "
        "Clara sold 8 jars of honey, Dmitri sold 63 bundles of firewood, Elena sold 29 wool scarves, "
        "Farid sold 51 bags of walnuts, and Greta sold 36 bunches of lavender. " + _FILLER
    ),
    table_head="\n\nSales table:\nName | Amount\nAnna | 17\nBoris | 42\n",
    table_rest="Clara | 8\nDmitri | 63\nElena | 29\nFarid | 51\nGreta | 36\n",
)


# ----------------------------------------------------------------------------- measurement core
@dataclass
class CaseResult:
    """One compressed run of a demo.

    ``answer_logprob``: summed log-probability of the answer tokens given the compressed cache;
    ``answer_correct``: greedy decoding reproduces every answer token; ``margin``: log p(answer) -
    log p(rival) at the first answer position (``nan`` without a rival); ``kl``: mean next-token
    KL(full ‖ compressed) over the continuation; ``critical_kept``: fraction of (layer, KV head)
    pairs that kept every critical context token (1.0 = always kept)."""

    label: str
    compression_ratio: float
    answer_logprob: float
    answer_correct: bool
    margin: float
    kl: float
    critical_kept: float
    options: dict = field(default_factory=dict)


@dataclass
class FailureDemo:
    """All runs of one demo plus its setup; ``reference`` is the uncompressed run."""

    name: str
    reference: CaseResult
    cases: list
    setup: dict

    def to_dict(self) -> dict:
        return dict(name=self.name, reference=asdict(self.reference), cases=[asdict(c) for c in self.cases], setup=self.setup)

    def table(self) -> list[dict]:
        """Flat rows (one per case, reference first) for printing or plotting."""
        rows = [asdict(self.reference)] + [asdict(c) for c in self.cases]
        for r in rows:
            r.update(r.pop("options"))
        return rows


def _kept_indices(trace: dict, n_tokens: int, ratio: float, press) -> dict:
    """Per layer, the ``(H_kv, n_kept)`` indices kvpress kept (re-derived from the traced scores), with the
    protected region the press uses for a cache in position order (:func:`jacap_lib.selection.protect_within`,
    the rule of :meth:`JacapPromptPress.protected`: sinks first, then the window shrunk to the budget left)."""
    budget = n_kept(n_tokens, ratio)
    protect, _ = protect_within(protected_mask(n_tokens, n_sink=press.n_sink),
                                protected_mask(n_tokens, n_sink=0, window=press.window), budget)
    out = {}
    for layer, rec in trace.items():
        s = rec["score"].float()
        out[layer] = s.masked_fill(protect, torch.finfo(s.dtype).max)[0].topk(budget, dim=-1).indices
    return out


def run_case(model, prompt_ids: torch.Tensor, continuation_ids: torch.Tensor, *, answer_slice: slice,
             press=None, critical=(), rival_id: int | None = None, label: str = "", reference=None) -> CaseResult:
    """Compress ``prompt_ids`` with ``press`` (``None`` = full cache), run the continuation, measure.

    ``answer_slice`` indexes the answer tokens inside ``continuation_ids``; ``critical`` lists prompt
    positions whose survival is reported; ``reference`` is the uncompressed
    :func:`jacap_lib.measure.quality.compressed_forward` output ``(logprobs, ...)`` for the KL."""
    from .quality import compressed_forward, kl_from_logits

    if answer_slice.start is None or answer_slice.start < 1:
        raise ValueError("`answer_slice` must start at >= 1 (the token before the answer predicts it)")
    if press is not None:
        press.trace = {}
    logp, _, _ = compressed_forward(model, prompt_ids, continuation_ids, press=press)
    cont = continuation_ids[0]
    ans = torch.arange(answer_slice.start, answer_slice.stop)
    lp = logp[ans - 1, cont[ans]]
    correct = bool((logp[ans - 1].argmax(-1) == cont[ans]).all())
    margin = float(logp[ans[0] - 1, cont[ans[0]]] - logp[ans[0] - 1, rival_id]) if rival_id is not None else float("nan")
    kl = float(kl_from_logits(reference[0], logp).mean()) if reference is not None else 0.0
    kept = 1.0
    if press is not None and critical:
        kept_idx = _kept_indices(press.trace, prompt_ids.shape[1], press.compression_ratio, press)
        crit = torch.tensor(list(critical))
        hits = [torch.isin(crit, k).all().item() for ki in kept_idx.values() for k in ki]
        kept = float(sum(hits) / len(hits))
        press.trace = None
    ratio = 0.0 if press is None else float(press.compression_ratio)
    return CaseResult(label, ratio, float(lp.sum()), correct, margin, kl, kept)


def _positions_of(tok, ids: torch.Tensor, text_before: str, needle: str) -> list[int]:
    """Token positions of ``needle`` (as it tokenises after ``text_before``) inside ``ids``."""
    sub = tok(needle, add_special_tokens=False).input_ids
    seq = ids[0].tolist()
    start = len(tok(text_before, add_special_tokens=False).input_ids) - 3
    for p in range(max(start, 0), len(seq) - len(sub) + 1):
        if seq[p:p + len(sub)] == sub:
            return list(range(p, p + len(sub)))
    raise ValueError(f"could not locate {needle!r} in the prompt tokens; change the prompt text")


def _split(tok, prompt: str, continuation: str):
    p = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    c = tok(continuation, return_tensors="pt", add_special_tokens=False).input_ids
    return p, c


def _reference(model, p, c):
    """Uncompressed ``compressed_forward`` output (the KL reference)."""
    from .quality import compressed_forward

    return compressed_forward(model, p, c, press=None)


# ----------------------------------------------------------------------------- 20.1 delayed constraint
def delayed_constraint(model, tok, *, ratios=(0.5, 0.75, 0.9), n_queries: int = 32, tau: float = DEFAULTS.tau,
                       prompt: dict = DELAYED_PROMPT) -> FailureDemo:
    """§20.1: the access code sits in the system prefix; the question comes after a long user message.

    JacapPromptPress with statistics from the last ``n_queries`` prompt queries (what "recent" queries
    look like) and ``n_sink = 4`` (attention sinks only) vs ``n_sink = `` the whole system prefix."""
    sys_text = tok.apply_chat_template([{"role": "system", "content": prompt["system"]}], tokenize=False)
    full_prompt = tok.apply_chat_template(
        [{"role": "system", "content": prompt["system"]}, {"role": "user", "content": prompt["user"]}], tokenize=False
    ).removesuffix("<|im_end|>\n")
    p, c = _split(tok, full_prompt, prompt["question"] + prompt["answer"])
    n_q = len(tok(prompt["question"], add_special_tokens=False).input_ids)
    answer_slice = slice(n_q, c.shape[1])
    n_prefix = len(tok(sys_text, add_special_tokens=False).input_ids)
    critical = _positions_of(tok, p, "", prompt["answer"].strip())
    ref_out = _reference(model, p, c)
    ref = run_case(model, p, c, answer_slice=answer_slice, label="full cache", reference=ref_out)
    cases = []
    for ratio in ratios:
        # a budget below the prefix cannot protect all of it (the press refuses): protect its first `budget` tokens
        n_protect = min(n_prefix, n_kept(p.shape[1], ratio))
        for protect, n_sink in (("sinks only (n_sink=4)", 4), (f"system prefix protected (n_sink={n_protect})", n_protect)):
            press = JacapPromptPress(compression_ratio=ratio, tau=tau, n_sink=n_sink, n_queries=n_queries)
            r = run_case(model, p, c, answer_slice=answer_slice, press=press, critical=critical, label=protect,
                         reference=ref_out)
            r.options = dict(n_sink=n_sink, protection=protect)
            cases.append(r)
    setup = dict(prompt=prompt, prompt_tokens=int(p.shape[1]), system_prefix_tokens=n_prefix,
                 critical_positions=critical, n_queries=n_queries, tau=tau, ratios=list(ratios))
    return FailureDemo("delayed_constraint", ref, cases, setup)


# ----------------------------------------------------------------------------- 20.2 competing evidence
def competing_evidence(model, tok, *, ratios=(0.5, 0.75, 0.9), tau: float = DEFAULTS.tau,
                       n_sink: int = DEFAULTS.n_sink,
                       n_queries: int | None = None, prompt: dict = COMPETING_PROMPT) -> FailureDemo:
    """§20.2: "North: open" and "South: closed"; the question asks for South's value.

    Algorithm 1's diagonal scoring (JacapPromptPress) vs the exact-S scoring (JacapRank1Press), same
    statistics and protection. ``margin`` = log p(" closed") - log p(" open") at the answer."""
    p, c = _split(tok, prompt["context"], prompt["question"] + prompt["answer"])
    n_q = len(tok(prompt["question"], add_special_tokens=False).input_ids)
    answer_slice = slice(n_q, c.shape[1])
    rival_id = tok(prompt["rival"], add_special_tokens=False).input_ids[0]
    critical = (_positions_of(tok, p, "", prompt["answer"]) + _positions_of(tok, p, "", prompt["rival"]))
    ref_out = _reference(model, p, c)
    ref = run_case(model, p, c, answer_slice=answer_slice, rival_id=rival_id, label="full cache", reference=ref_out)
    cases = []
    for ratio in ratios:
        for label, cls in (("diagonal S (Algorithm 1)", JacapPromptPress), ("exact S (rank-one corrected)", JacapRank1Press)):
            press = cls(compression_ratio=ratio, tau=tau, n_sink=n_sink, n_queries=n_queries)
            r = run_case(model, p, c, answer_slice=answer_slice, press=press, critical=critical, rival_id=rival_id,
                         label=label, reference=ref_out)
            r.options = dict(scoring=label)
            cases.append(r)
    setup = dict(prompt=prompt, prompt_tokens=int(p.shape[1]), critical_positions=critical, tau=tau,
                 n_sink=n_sink, n_queries=n_queries, ratios=list(ratios))
    name = "competing_evidence" + ("" if prompt is COMPETING_PROMPT else f" ({prompt['question'].strip()!r})")
    return FailureDemo(name, ref, cases, setup)


# ----------------------------------------------------------------------------- 20.3 phase change
def query_lag(queries: torch.Tensor, switch: int, betas, *, future: torch.Tensor) -> dict:
    r"""How far the EMA centre is from the new phase's queries, for each β.

    ``queries (..., T, d)`` are the queries seen so far (the phase switches at position
    ``switch``); ``future (..., M, d)`` the queries of the rest of the new phase. Returns
    ``{beta: relative distance}`` with distance :math:`\lVert\mu_\beta-\bar q_{future}\rVert/\lVert\bar q_{future}\rVert`
    averaged over leading dims, plus ``"flat"`` for the flat mean and ``"old_phase_weight"``:
    the EMA weight still on the pre-switch queries."""
    from ..stats import ema_query_stats, ema_weights, flat_query_stats

    target = future.mean(-2)
    out, old = {}, {}
    Tlen = queries.shape[-2]
    if not 0 < switch < Tlen:
        raise ValueError(f"`switch` must lie inside the query sequence (0 < switch < T={Tlen}); got {switch}")
    for beta in betas:
        mu, _ = ema_query_stats(queries, beta)
        out[beta] = float(((mu - target).norm(dim=-1) / target.norm(dim=-1)).mean())
        old[beta] = float(ema_weights(Tlen, beta)[:switch].sum())
    mu, _ = flat_query_stats(queries)
    out["flat"] = float(((mu - target).norm(dim=-1) / target.norm(dim=-1)).mean())
    old["flat"] = switch / Tlen
    return dict(distance=out, old_phase_weight=old)


def phase_change(model, tok, *, ratio: float = 0.75, betas=(0.5, 0.8, 0.9, 0.95, 0.99, 0.999), tau: float = DEFAULTS.tau,
                 n_sink: int = DEFAULTS.n_sink, prompt: dict = PHASE_PROMPT, lag_layers=(5, 15, 25)) -> FailureDemo:
    """§20.3: prose, then a table that recalls the quantities; the cache is compressed a few rows
    into the table. JacapPromptPress with EMA statistics over the prompt's queries for each β (and the
    flat mean). Answer = the remaining table rows (their number tokens); ``setup["lag"]`` holds the
    EMA centre's distance to the table's later (pre-RoPE) queries for each β."""
    from ..hf import capture_heads

    p, c = _split(tok, prompt["prose"] + prompt["table_head"], prompt["table_rest"])
    answer_slice = slice(1, c.shape[1])
    ref_out = _reference(model, p, c)
    ref = run_case(model, p, c, answer_slice=answer_slice, label="full cache", reference=ref_out)
    cases = []
    for beta in (None, *betas):
        press = JacapPromptPress(compression_ratio=ratio, tau=tau, n_sink=n_sink, beta=beta)
        label = "flat mean" if beta is None else f"EMA beta={beta}"
        r = run_case(model, p, c, answer_slice=answer_slice, press=press, label=label, reference=ref_out)
        r.options = dict(beta=beta)
        cases.append(r)
    # the statistics' lag, measured on pre-RoPE queries (content, not position)
    switch = len(tok(prompt["prose"], add_special_tokens=False).input_ids)
    full_ids = torch.cat([p, c], dim=1)
    caps = capture_heads(model, full_ids, layers=list(lag_layers))
    P = p.shape[1]
    lag = {}
    for layer, cap in caps.items():
        q = cap.queries_prerope.double()
        lag[layer] = query_lag(q[:, :P], switch, betas, future=q[:, P:])
    setup = dict(prompt=prompt, prompt_tokens=int(P), switch_position=switch, ratio=ratio, tau=tau, n_sink=n_sink,
                 betas=list(betas), lag={str(k): v for k, v in lag.items()})
    return FailureDemo("phase_change", ref, cases, setup)
