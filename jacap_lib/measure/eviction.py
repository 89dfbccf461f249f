"""Look inside one eviction: which prompt tokens every layer and KV head keeps, and why.

:func:`inspect_eviction` prefills a text with a press active and records, per layer x KV head,

* the kept positions - read back from the cache itself: the compressed keys are matched row by
  row against the uncompressed keys (exact equality), so this works for any kvpress press; keys a press hides
  from attention instead of dropping them (kvpress's ``masked_key_indices``: KVzip, KVgrad, the default
  :class:`~jacap_lib.presses.jacap_context.JacapPress`, AdaKV's head-wise budgets) are read from the masks and
  count as evicted, so each head may keep its own number of tokens;
* the press's raw score per token (any :class:`kvpress.ScorerPress`, and the presses that score after the
  prefill from the context's reconstruction: KVzip, KVgrad and the default ``JacapPress``), before protection;
* the protected positions - the slots the press keeps whatever their score (for Jacap presses: the first
  ``n_sink`` and the last ``window`` positions, read from the press's own ``protected`` mask; for KVzip and KVgrad
  their ``n_sink`` sinks);
* for Jacap presses, Algorithm 1's components ``alpha, rho, kappa, weight, leverage`` per token.

Every prompt token then has one *status* per layer and KV head: ``"kept"`` (kept because of its score),
``"protected"`` (kept whatever its score) or ``"evicted"``. :meth:`EvictionInspection.view` marks them on
the text; :func:`jacap_lib.viz.eviction.to_html` draws the whole model as a self-contained HTML page.

:func:`answer` runs the kvpress pipeline to get the model's answer with and without eviction.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..config import DEFAULT_RATIO  # its home is config: `jacap inspect` reads it before torch loads
from ..hf import attention_modules

__all__ = ["EvictionInspection", "inspect_eviction", "kept_indices", "kept_positions", "capture_kept", "answer", "COMPONENTS",
           "STATUSES", "MARKS", "DEFAULT_RATIO", "parse_view",
           "DEMO_FACTS", "facts_stated", "phrase_kept"]

# status codes of EvictionInspection.status, and their names
EVICTED, KEPT, PROTECTED = 0, 1, 2
STATUSES = ("evicted", "kept", "protected")
# the marks of EvictionInspection.view: (opening, closing) per status; a mark character inside a token is
# escaped with a backslash, so parse_view recovers every run exactly
MARKS = {"evicted": ("·", "·"), "kept": ("[", "]"), "protected": ("«", "»")}
_MARK_CHARS = frozenset("·[]«»\\")

# the demo text of the live-eviction chapter (written for the book; the KL table and the widgets use it)
DEMO_CONTEXT = (
    "The night ferry to Skarholm leaves from pier seven at a quarter past eleven. Its captain, Ingrid Voss, "
    "has sailed the route for nineteen years and knows every rock by name. Passengers buy tickets at the "
    "green kiosk beside the fish market; the fare is twelve crowns, or eight for children. "
    "On board there is a small cafe that sells cardamom buns and hot blackcurrant juice, and a reading room "
    "with old maps of the archipelago pinned to the walls. The crossing takes two hours when the sea is calm "
    "and nearly three when the wind comes from the north. Halfway across, the ferry passes the lighthouse on "
    "Tern Island, which was built in 1871 and still flashes twice every ten seconds. The keeper, a retired "
    "teacher called Oskar Lind, waves a red lantern at the ferry every night. On Skarholm the ferry docks "
    "next to the old cannery, which is now a museum about herring. The island has one hotel, the Anchor, "
    "with fourteen rooms, and a bakery that opens at six in the morning. Most visitors rent bicycles from "
    "the shed behind the church, because cars are not allowed on the island."
)
DEMO_QUESTION = "Who is the captain of the night ferry, and how much does an adult ticket cost?"
DEMO_CONTINUATION = (
    " Ingrid Voss, the captain, says that the best seat is by the window of the reading room, where you can "
    "see the lighthouse on Tern Island flash twice every ten seconds."
)
COMPONENTS = ("alpha", "rho", "kappa", "weight", "leverage")
# what a right answer to DEMO_QUESTION states: a regular expression per fact (matched ignoring case)
DEMO_FACTS = {"the captain's name": r"\bIngrid Voss\b", "the adult fare": r"\b(twelve|12) crowns\b"}


def facts_stated(reply: str, facts: dict | None = None) -> dict:
    """``{fact: bool}``: which facts (``DEMO_FACTS`` by default: name -> regular expression) ``reply`` states.
    A near miss such as "Ingrid Vossen" does not state "Ingrid Voss" (word boundaries)."""
    import re

    if not isinstance(reply, str):
        raise ValueError(f"reply must be a string, got {type(reply).__name__}")
    return {name: re.search(rx, reply, re.IGNORECASE) is not None for name, rx in (facts or DEMO_FACTS).items()}


def phrase_kept(inspection, phrase: str) -> float:
    """Fraction of the (layer, KV head) caches of ``inspection`` that kept *every* token of the first
    occurrence of ``phrase`` in the inspected text (tokens located by their decoded characters)."""
    text = "".join(inspection.tokens)
    start = text.find(phrase)
    if not phrase or start < 0:
        raise ValueError(f"phrase {phrase!r} does not occur in the inspected text")
    ends, pos = [], 0
    for tok in inspection.tokens:
        pos += len(tok)
        ends.append(pos)
    idx = [i for i, end in enumerate(ends) if end > start and end - len(inspection.tokens[i]) < start + len(phrase)]
    return float(inspection.kept_mask[..., idx].all(-1).float().mean())


def _mb(n: int) -> str:
    """Bytes as megabytes (10^6), one decimal."""
    return f"{n / 1e6:.1f} MB"


@dataclass
class EvictionInspection:
    """Result of :func:`inspect_eviction` (L layers, H KV heads, N prompt tokens, B = the budget: tokens
    kept per head; a press that masks keys may give each head its own number, :attr:`n_kept`).

    ``repr`` gives two lines (model, method, ratio, N, budget, kept by score vs protected);
    :meth:`view` the text of one head with every token marked; :attr:`status` every token's status in
    every head; :func:`jacap_lib.viz.eviction.to_html` the whole model as an HTML page.

    Attributes
    ----------
    method, compression_ratio, options : what was run.
    token_ids : list[int] (N,)
    tokens : list[str] (N,) each token decoded on its own.
    kept : LongTensor (L, H, B'), ascending positions the compressed cache holds (B' = B unless the press masks).
    masked : BoolTensor (L, H, N) or None - positions the cache holds but the press hides from every later query
        (kvpress's ``masked_key_indices``); they count as evicted. ``None`` for presses that only shrink the cache.
    score : FloatTensor (L, H, N) or None - the press's score (higher = keep), before protection.
    alpha, rho, kappa, weight, leverage : FloatTensor (L, H, N) or None - Jacap's components.
    protected : BoolTensor (L, H, N) or None - True for the positions the press keeps *whatever their
        score*: for :class:`~jacap_lib.presses.jacap.JacapPromptPress` and its variants, the first ``n_sink``
        positions (attention sinks) and the last ``window`` positions (the recent window, shrunk when the
        budget cannot hold it), as the press's own ``protected`` mask reports them; for the default
        ``JacapPress`` its sinks and window, for KVzip and KVgrad their sinks (a global budget smaller than the
        protected entries keeps a tie-broken part of them: the rest shows as evicted). All False for the other kvpress
        baselines: they protect nothing explicitly (their built-in recency - SnapKV's observation window,
        StreamingLLM's sinks and recent tokens - enters through their score, so it shows as kept).
        ``None`` only for hand-built inspections (then treated as all False).
    model : str - the model's name (``describe_model``), "" when unknown.
    bytes_full : int or None - bytes of the uncompressed cache (every layer's keys and values of the N tokens).
    bytes_held : int or None - bytes the cache holds after the press (:func:`jacap_lib.cache.cache_bytes`, each
        tensor's whole storage): a press that masks keys (:attr:`masked`) keeps every slot, so it holds at least
        :attr:`bytes_full`; kvpress's KVzip (and the presses built on it: KVgrad, the default ``JacapPress``) hold
        more, since their cache is a view of a storage that also keeps the last chunk of the reconstruction pass.
    bytes_freed : int or None - for a masking press, the bytes the same choice holds in a
        :class:`~jacap_lib.cache.RaggedCache` (``RaggedPress(press)``, or ``JacapPress(free_memory=True)``): only
        each head's kept entries, with their offsets and positions; ``None`` for a press that prunes already.
    """

    method: str
    compression_ratio: float
    options: dict
    token_ids: list
    tokens: list
    kept: torch.Tensor
    score: torch.Tensor | None = None
    alpha: torch.Tensor | None = None
    rho: torch.Tensor | None = None
    kappa: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    leverage: torch.Tensor | None = None
    protected: torch.Tensor | None = None
    model: str = ""
    masked: torch.Tensor | None = None
    bytes_full: int | None = None
    bytes_held: int | None = None
    bytes_freed: int | None = None

    @property
    def n_layers(self) -> int:
        return self.kept.shape[0]

    @property
    def n_heads(self) -> int:
        return self.kept.shape[1]

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def budget(self) -> int:
        """B: tokens kept per (layer, KV head), protected ones included; where a masking press gives the heads
        different numbers (:attr:`n_kept`), their mean rounded down."""
        if self.masked is None:
            return self.kept.shape[-1]
        return int(self.n_kept.sum()) // (self.n_layers * self.n_heads)

    @property
    def kept_mask(self) -> torch.Tensor:
        """BoolTensor (L, H, N): True where a later query still sees the token (kept by score or protected)."""
        mask = torch.zeros(self.n_layers, self.n_heads, self.n_tokens, dtype=torch.bool)
        mask.scatter_(-1, self.kept, True)
        return mask if self.masked is None else mask & ~self.masked

    @property
    def n_kept(self) -> torch.Tensor:
        """LongTensor (L, H): tokens each head keeps (all :attr:`budget` unless the press masks keys)."""
        return self.kept_mask.sum(-1)

    @property
    def protected_mask(self) -> torch.Tensor:
        """BoolTensor (L, H, N): :attr:`protected`, all False when it was not recorded."""
        if self.protected is None:
            return torch.zeros(self.n_layers, self.n_heads, self.n_tokens, dtype=torch.bool)
        return self.protected

    @property
    def status(self) -> torch.Tensor:
        """Int8Tensor (L, H, N): 0 evicted, 1 kept by score, 2 protected (names: ``STATUSES[code]``); a protected
        position a masking press hid all the same (a budget below the protected entries) is evicted."""
        kept = self.kept_mask
        return kept.to(torch.int8).masked_fill_(self.protected_mask & kept, PROTECTED)

    @property
    def n_protected(self) -> torch.Tensor:
        """LongTensor (L, H): protected tokens each head keeps."""
        return (self.protected_mask & self.kept_mask).sum(-1)

    @property
    def n_scored(self) -> torch.Tensor:
        """LongTensor (L, H): tokens kept by score per head (``n_kept - n_protected``)."""
        return (self.kept_mask & ~self.protected_mask).sum(-1)

    def __repr__(self) -> str:
        def span(t):
            lo, hi = int(t.min()), int(t.max())
            return f"{lo}" if lo == hi else f"{lo}-{hi}"

        model = f" on {self.model}" if self.model else ""
        head = (f"EvictionInspection({self.method} at c={self.compression_ratio:g}{model}: N={self.n_tokens} prompt "
                f"tokens, {self.n_layers} layers x {self.n_heads} KV heads)")
        prot = self.protected_mask
        where = ""
        lead, trail = prot.int().cumprod(-1).sum(-1), prot.flip(-1).int().cumprod(-1).sum(-1)  # (L, H) runs
        if bool(prot.any()) and not bool(prot.all()) and bool((lead + trail == self.n_protected).all()) \
                and lead.unique().numel() == 1 and trail.unique().numel() == 1:
            first, last = int(lead.flatten()[0]), int(trail.flatten()[0])
            where = f" (first {first}" + (f" + last {last})" if last else ")")
        scored = "" if self.score is not None else "; no score recorded"
        n_kept = self.n_kept
        if bool((n_kept == n_kept.flatten()[0]).all()):
            kept = f"budget {int(n_kept.flatten()[0])}"
            evicted = f"{self.n_tokens - int(n_kept.flatten()[0])} evicted"
        else:  # a masking press spreads its budget over heads and layers
            kept = f"{span(n_kept)} kept (mean {self.budget})"
            evicted = f"{span(self.n_tokens - n_kept)} evicted"
        out = (f"{head}\n  per head: {kept} = {span(self.n_scored)} kept by score + "
               f"{span(self.n_protected)} protected{where}; {evicted}{scored}")
        if self.bytes_full and self.bytes_held is not None:
            out += (f"\n  cache: {_mb(self.bytes_held)} held of {_mb(self.bytes_full)} uncompressed "
                    f"({100 * self.bytes_held / self.bytes_full:.1f} %)")
            if self.bytes_freed is not None:
                out += (f"; the press masks keys and frees nothing: its kept entries alone (RaggedPress) hold "
                        f"{_mb(self.bytes_freed)} ({100 * self.bytes_freed / self.bytes_full:.1f} %)")
        return out

    def check_head(self, layer, head) -> None:
        for name, value, n in (("layer", layer, self.n_layers), ("head", head, self.n_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
                raise ValueError(f"{name} must be an int in [0, {n}) (this model has {self.n_layers} layers x "
                                 f"{self.n_heads} KV heads), got {value!r}")

    def statuses(self, layer: int, head: int) -> list[str]:
        """Status name of every prompt token in ``(layer, head)``: "kept" (by score), "protected" or "evicted"."""
        self.check_head(layer, head)
        return [STATUSES[c] for c in self.status[layer, head].tolist()]

    def view(self, layer: int, head: int) -> str:
        """The prompt as ``(layer, head)`` sees it after eviction, every run of tokens with one status marked:

        ``[kept by score]``, ``«protected (sink / window)»``, ``·evicted·``. A mark character inside the text
        is escaped with a backslash; :func:`parse_view` turns the marked text back into ``(text, status)`` runs.
        """
        runs = []
        for tok, st in zip(self.tokens, self.statuses(layer, head)):
            if runs and runs[-1][1] == st:
                runs[-1][0].append(tok)
            else:
                runs.append(([tok], st))
        out = []
        for toks, st in runs:
            text = "".join("\\" + ch if ch in _MARK_CHARS else ch for ch in "".join(toks))
            out.append(MARKS[st][0] + text + MARKS[st][1])
        return "".join(out)

    def head_table(self, layer: int, head: int) -> list[dict]:
        """One row per prompt token of ``(layer, head)``: position, token, status and (when recorded) score."""
        rows = []
        score = None if self.score is None else self.score[layer, head].tolist()
        for i, (tok, st) in enumerate(zip(self.tokens, self.statuses(layer, head))):
            rows.append({"position": i, "token": tok, "status": st, "score": None if score is None else score[i]})
        return rows

    def keep_grid(self, positions=None) -> torch.Tensor:
        """FloatTensor (L, H): fraction of ``positions`` (default: every position) each head keeps."""
        mask = self.kept_mask.float()
        if positions is not None:
            mask = mask[..., torch.as_tensor(list(positions), dtype=torch.long)]
        return mask.mean(-1)

    def keep_fraction(self, layer: int | None = None, head: int | None = None) -> torch.Tensor:
        """FloatTensor (N,): fraction of (layer, head) pairs keeping each token (restricted if given)."""
        mask = self.kept_mask.float()
        if layer is not None:
            mask = mask[layer : layer + 1]
        if head is not None:
            mask = mask[:, head : head + 1]
        return mask.mean(dim=(0, 1))

    def component(self, name: str) -> torch.Tensor:
        if name not in ("score",) + COMPONENTS:
            raise ValueError(f"component must be 'score' or one of {COMPONENTS}, got {name!r}")
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"{name!r} was not recorded for method {self.method!r} (components exist for Jacap presses)")
        return value

    def component_correlations(self) -> dict:
        """Spearman rank correlation (``scipy.stats.spearmanr``) of the press's score with each recorded
        Jacap component, computed per (layer, KV head) cache and averaged over the caches."""
        from scipy.stats import spearmanr

        score = self.component("score").reshape(-1, self.n_tokens)
        out = {}
        for name in COMPONENTS:
            if getattr(self, name) is None:
                continue
            comp = self.component(name).reshape(-1, self.n_tokens)
            rhos = [spearmanr(s.numpy(), c.numpy()).statistic for s, c in zip(score, comp)]
            out[name] = float(torch.tensor(rhos, dtype=torch.float64).nanmean())
        return out

    def to_frame(self):
        """Long pandas DataFrame: one row per (layer, head, position)."""
        import pandas as pd

        L, H, N = self.n_layers, self.n_heads, self.n_tokens
        grid = torch.stack(torch.meshgrid(torch.arange(L), torch.arange(H), torch.arange(N), indexing="ij"), -1)
        grid = grid.reshape(-1, 3)
        data = {"layer": grid[:, 0].numpy(), "head": grid[:, 1].numpy(), "position": grid[:, 2].numpy()}
        data["token"] = [self.tokens[i] for i in data["position"]]
        data["kept"] = self.kept_mask.reshape(-1).numpy()
        data["status"] = [STATUSES[c] for c in self.status.reshape(-1).tolist()]
        for name in ("score",) + COMPONENTS:
            value = getattr(self, name)
            if value is not None:
                data[name] = value.reshape(-1).numpy()
        return pd.DataFrame(data)


def parse_view(marked: str) -> list[tuple[str, str]]:
    """``(text, status)`` runs of a text marked by :meth:`EvictionInspection.view` (the inverse of it)."""
    openers = {o: (st, c) for st, (o, c) in MARKS.items()}
    runs, i = [], 0
    while i < len(marked):
        if marked[i] not in openers:
            raise ValueError(f"marked text: expected one of {sorted(openers)} at character {i}, got {marked[i]!r}")
        status, close = openers[marked[i]]
        i += 1
        text = []
        while True:
            if i >= len(marked):
                raise ValueError(f"marked text: a {status} run is not closed by {close!r}")
            ch = marked[i]
            if ch == "\\" and i + 1 < len(marked):
                text.append(marked[i + 1])
                i += 2
            elif ch == close:
                i += 1
                break
            else:
                text.append(ch)
                i += 1
        runs.append(("".join(text), status))
    return runs


def kept_indices(full_keys: torch.Tensor, kept_keys: torch.Tensor, *, sort: bool = True) -> torch.Tensor:
    """Positions of the rows of ``kept_keys (B, H, n, d)`` inside ``full_keys (B, H, N, d)``, ascending
    (``sort=False``: slot by slot, the true position of each cache slot; kvpress writes the kept rows back
    in score order, so a slot index is not a position).

    Raises ``RuntimeError`` unless every kept row equals (exactly) the full row it is matched to.
    """
    gen = torch.Generator(device="cpu").manual_seed(0)
    r = torch.randn(full_keys.shape[-1], 1, generator=gen, dtype=torch.float64).to(full_keys.device)
    pf = (full_keys.double() @ r).squeeze(-1)  # (B, H, N)
    pk = (kept_keys.double() @ r).squeeze(-1)  # (B, H, n)
    idx = (pk.unsqueeze(-1) - pf.unsqueeze(-2)).abs().argmin(-1)  # (B, H, n)
    gathered = full_keys.gather(2, idx.unsqueeze(-1).expand(*idx.shape, full_keys.shape[-1]))
    if not torch.equal(gathered, kept_keys):
        raise RuntimeError("compressed cache rows do not match rows of the uncompressed cache exactly")
    ordered = idx.sort(-1).values
    if bool((ordered[..., 1:] == ordered[..., :-1]).any()):
        raise RuntimeError("two kept rows matched the same position (duplicate keys in the cache)")
    return ordered if sort else idx


@torch.inference_mode()
def kept_positions(model, capture, cache) -> torch.Tensor:
    """BoolTensor ``(L, H_kv, P)``: which prompt positions each layer and KV head of ``cache`` (the
    :func:`jacap_lib.measure.quality.replay_press` of a
    :class:`~jacap_lib.measure.quality.PrefillCapture`) still lets a later query see, at their TRUE positions.

    The cache rows are matched to the captured uncompressed keys (:func:`kept_indices`, exact equality), so
    the score order in which kvpress writes kept rows back does not matter; keys a head-wise press masked (``masked_key_indices``, cache
    slots) count as evicted."""
    from ..hf import decoder_layers_of

    layers = decoder_layers_of(model)
    n = capture.prompt_len
    out = []
    for i, (layer, rec) in enumerate(zip(layers, capture.layers)):
        full, keys = rec["keys"], cache.layers[i].keys
        if keys.shape[2] > n:
            raise ValueError(f"layer {i}'s cache holds {keys.shape[2]} rows for a prompt of {n}: call "
                             "kept_positions right after replay_press, before decoding")
        slots = kept_indices(full, keys, sort=False)[0]  # (H, n_kept): slot -> true position
        live = torch.ones_like(slots, dtype=torch.bool)
        masked = getattr(layer.self_attn, "masked_key_indices", None)
        if masked is not None:
            b, h, s = masked
            sel = b == 0
            live[h[sel].to(live.device), s[sel].to(live.device)] = False
        mask = torch.zeros(slots.shape[0], n, dtype=torch.bool, device=slots.device)
        rows = torch.arange(slots.shape[0], device=slots.device).unsqueeze(1).expand_as(slots)
        mask[rows[live], slots[live]] = True
        out.append(mask.cpu())
    return torch.stack(out)


def _masked_positions(module, slots: torch.Tensor, n: int) -> torch.Tensor | None:
    """BoolTensor ``(H, n)``: the prompt positions ``module``'s kvpress mask (``masked_key_indices``, cache slots of
    batch row 0) hides, ``slots`` (``(H, B')``) giving each cache slot's true position; ``None`` without a mask."""
    masked = getattr(module, "masked_key_indices", None)
    if masked is None:
        return None
    b, h, s = (t.cpu() for t in masked)
    sel = b == 0
    out = torch.zeros(slots.shape[0], n, dtype=torch.bool)
    out[h[sel], slots.cpu()[h[sel], s[sel]]] = True
    return out


def _freed_positions(layer, slots: torch.Tensor, n: int) -> torch.Tensor:
    """BoolTensor ``(H, n)``: the prompt positions a ragged layer (:mod:`jacap_lib.cache`) dropped from the cache
    slots ``slots`` (``(H, B')``) the press saw, batch row 0 -- what :func:`_masked_positions` reads off the masks."""
    slots = slots.cpu()
    present = torch.zeros(slots.shape[0], n, dtype=torch.bool)
    kept = torch.zeros_like(present)
    for h in range(slots.shape[0]):
        present[h, slots[h]] = True
        kept[h, slots[h, layer.keys.head_positions(0, h).long().cpu()]] = True
    return present & ~kept


@contextmanager
def capture_kept(model, press, store: dict):
    """Apply ``press`` to ``model`` (like ``with press(model)``) and fill ``store[layer_idx]`` with
    ``(full_keys, kept_positions, masked)`` after every layer's compression: the uncompressed keys ``(1, H, N, d)``,
    the positions the compressed cache holds ``(1, H, B')`` and the positions the press hides from attention
    (``(H, N)`` bool, kvpress's ``masked_key_indices``, or ``None``). Works with any kvpress press: a head-wise budget
    (AdaKV) masks during the prefill; KVzip, KVgrad and the default JacapPress mask when the context closes, after
    their reconstruction pass (read then, and dropped from the model: the inspection has them)."""
    attns = attention_modules(model)
    full, slots, caches = {}, {}, {}

    def before(module, args, kwargs, output):
        cache = kwargs["past_key_values"]
        full[module.layer_idx] = cache.layers[module.layer_idx].keys.detach().clone()

    def after(module, args, kwargs, output):
        i = module.layer_idx
        caches[i] = kwargs["past_key_values"]
        keys = kwargs["past_key_values"].layers[i].keys.detach()
        if i in full and keys.shape[2] <= full[i].shape[2]:
            slots[i] = kept_indices(full[i], keys, sort=False)  # (1, H, B'): cache slot -> true position
            n = full[i].shape[2]
            store[i] = (full[i], slots[i].sort(-1).values, _masked_positions(module, slots[i][0], n))

    from ..hf import clear_masks

    clear_masks(model)  # a mask left by an earlier run would hide keys of this prefill
    first = [a.register_forward_hook(before, with_kwargs=True) for a in attns]  # run before the press's hooks
    try:
        with press(model):
            last = [a.register_forward_hook(after, with_kwargs=True) for a in attns]
            try:
                yield store
            finally:
                for h in last:
                    h.remove()
        for a in attns:  # masks set after the prefill (KVzip's reconstruction pass): read them, then drop them
            i = a.layer_idx
            if i in store and store[i][2] is None and getattr(a, "masked_key_indices", None) is not None:
                store[i] = (*store[i][:2], _masked_positions(a, slots[i][0], store[i][0].shape[2]))
            elif i in store and store[i][2] is None and hasattr(caches[i].layers[i], "kept_lengths"):
                # a press that freed what it masked (JacapPress(), RaggedPress): the ragged layer holds the kept set
                store[i] = (*store[i][:2], _freed_positions(caches[i].layers[i], slots[i][0], store[i][0].shape[2]))
    finally:
        for h in first:
            h.remove()
        clear_masks(model)


def _ids(tokenizer, text, chat: bool) -> torch.Tensor:
    if not isinstance(text, str) or not text:
        raise ValueError("text must be a non-empty string")
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids


@torch.inference_mode()
def inspect_eviction(model, tokenizer, text: str, method="jacap", compression_ratio: float | None = None, *, chat=False,
                     **opts):
    """Prefill ``text`` with ``method`` at ``compression_ratio`` and record what was kept, and why.

    Parameters
    ----------
    method : a registry name (:func:`jacap_lib.list_methods`) or a ready kvpress press
        (then ``compression_ratio``/``opts`` must be left out: the press carries its own).
    compression_ratio : float in [0, 1); ``None`` = :data:`DEFAULT_RATIO` (0.5) with a method name.
    chat : wrap ``text`` in the tokenizer's chat template first.
    opts : options for the press (``tau``, ``beta``, ``window``, ...).

    Returns
    -------
    :class:`EvictionInspection`: per layer and KV head, every token kept by score, protected or evicted.
    A press that hides keys instead of dropping them (the default ``JacapPress``, KVzip, KVgrad: after the prefill,
    across heads and layers; AdaKV: per layer) gives each head its own number of kept tokens
    (:attr:`EvictionInspection.n_kept`); no mask is left on the model.
    """
    from transformers import DynamicCache

    from ..models import describe_model
    from ..presses.jacap import JacapPromptPress

    press, name = _press_for(method, compression_ratio, opts)
    import kvpress

    after_prefill = isinstance(press, kvpress.KVzipPress)  # KVzip, KVgrad, the default JacapPress: scored afterwards
    compression_ratio = float(getattr(press, "compression_ratio", DEFAULT_RATIO if compression_ratio is None
                                      else compression_ratio))
    ids = _ids(tokenizer, text, chat).to(next(model.parameters()).device)

    scores, protected, layer = {}, {}, [None]
    scorer = press.press if type(press) is kvpress.AdaKVPress else press  # AdaKV: its scorer's score and protection
    is_jacap = isinstance(scorer, JacapPromptPress)
    if is_jacap:
        scorer.trace = {}
    patched = []
    if hasattr(scorer, "score") and callable(scorer.score) and not after_prefill:
        raw_score = scorer.score

        def recording_score(module, *args, **kwargs):
            layer[0] = module.layer_idx
            s = raw_score(module, *args, **kwargs)
            if not is_jacap:
                scores[module.layer_idx] = s.detach()
            return s

        scorer.score = recording_score
        patched.append("score")
    if callable(getattr(scorer, "protected", None)) and not after_prefill:  # JacapPromptPress: the sink/window mask
        raw_protected = scorer.protected

        def recording_protected(*args, **kwargs):
            mask = raw_protected(*args, **kwargs)
            protected[layer[0]] = mask.detach()
            return mask

        scorer.protected = recording_protected
        patched.append("protected")
    if after_prefill:  # their scores live in score_val until compress_post turns them into masks
        raw_post = press.compress_post

        def recording_post(*args, **kwargs):
            scores["all"] = press.score_val.detach().float().clone()  # (L, B, H, N), before any protection
            return raw_post(*args, **kwargs)

        press.compress_post = recording_post
        patched.append("compress_post")
    store: dict = {}
    cache = DynamicCache()
    try:
        with capture_kept(model, press, store):
            model.model(input_ids=ids, past_key_values=cache)
    finally:
        if is_jacap:
            trace, scorer.trace = scorer.trace, None
        for attr in patched:
            for obj in {id(press): press, id(scorer): scorer}.values():
                if attr in vars(obj):
                    delattr(obj, attr)
    n_layers = len(attention_modules(model))
    if sorted(store) != list(range(n_layers)):
        raise RuntimeError(f"compression was recorded for layers {sorted(store)} only, expected all {n_layers}")
    kept = torch.stack([store[i][1][0].cpu() for i in range(n_layers)])
    token_ids = ids[0].tolist()
    n_heads, n = kept.shape[1], len(token_ids)
    masks = [store[i][2] for i in range(n_layers)]
    masked = None if all(m is None for m in masks) else torch.stack(
        [torch.zeros(n_heads, n, dtype=torch.bool) if m is None else m for m in masks])
    prot = torch.zeros(n_layers, n_heads, n, dtype=torch.bool)
    for i, mask in protected.items():  # (N,) per layer from JacapPromptPress.protected, the same for every head
        if i is not None:
            mask = mask.cpu()
            prot[i] = mask.expand(n_heads, n) if mask.dim() == 1 else mask.reshape(-1, n_heads, n)[0]
    if after_prefill:  # the entries raised above every score: the default's sinks and window, KVzip's sinks
        raised = press.protected(n) if callable(getattr(press, "protected", None)) else \
            torch.arange(n) < int(getattr(press, "n_sink", 0))
        prot[:] = raised.cpu()
    result = EvictionInspection(
        method=name, compression_ratio=float(compression_ratio), options=dict(opts), token_ids=token_ids,
        tokens=[tokenizer.decode([t]) for t in token_ids], kept=kept, protected=prot,
        model=describe_model(model)["model"], masked=masked,
    )
    _count_bytes(result, cache, store)
    if masked is not None:  # a budget below the protected entries keeps a tie-broken part of them
        result.protected = prot & result.kept_mask
    elif bool((prot & ~result.kept_mask).any()):
        raise RuntimeError("a protected position is missing from the compressed cache")
    if is_jacap and len(trace) == n_layers:
        result.score = torch.stack([trace[i]["score"][0].float().cpu() for i in range(n_layers)])
        for comp in COMPONENTS:
            setattr(result, comp, torch.stack([getattr(trace[i]["parts"], comp)[0].cpu() for i in range(n_layers)]))
    elif "all" in scores:
        result.score = scores["all"][:, 0].cpu()
    elif len(scores) == n_layers:
        result.score = torch.stack([scores[i][0].float().cpu() for i in range(n_layers)])
    return result


def _count_bytes(result: EvictionInspection, cache, store: dict) -> None:
    """Fill ``result``'s bytes: the uncompressed cache (``store``'s full keys, and values of the cache's own width),
    what ``cache`` holds after the press, and, where the press masks keys, what its kept entries hold once freed
    (``cache`` is turned ragged in place: it is the inspection's own, thrown away after)."""
    from ..cache import cache_bytes, to_ragged

    layers = cache.layers
    result.bytes_full = int(sum(store[i][0].numel() * store[i][0].element_size()
                                * (1 + layers[i].values.shape[-1] / layers[i].keys.shape[-1])
                                for i in range(len(layers))))
    result.bytes_held = cache_bytes(cache)
    if result.masked is not None:
        keep = result.kept_mask.to(layers[0].keys.device)
        to_ragged(cache, keep=[keep[i][None] for i in range(len(layers))])
        result.bytes_freed = cache_bytes(cache)


def _press_for(method, compression_ratio, opts: dict):
    """``(press, name)`` for a registry name (``compression_ratio`` None = :data:`DEFAULT_RATIO`) or a ready press object (then
    ``compression_ratio`` and ``opts`` must be left out: the press carries its own, and a second value
    would be ignored without a word)."""
    from ..presses.registry import build_press

    if isinstance(method, str):
        return build_press(method, DEFAULT_RATIO if compression_ratio is None else compression_ratio, **opts), method
    if compression_ratio is not None:
        raise ValueError(f"compression_ratio={compression_ratio!r} was given with a press object "
                         f"({type(method).__name__}), which carries its own ratio; set it on the press instead")
    if opts:
        raise ValueError(f"options {sorted(opts)} are only accepted with a method name; configure the press object "
                         "instead")
    return method, type(method).__name__


def answer(model, tokenizer, context: str, question: str, method=None, compression_ratio: float | None = None,
           *, max_new_tokens: int = 20, **opts) -> str:
    """Greedy answer of the kvpress pipeline; ``method=None`` = no eviction, a registry name (at
    ``compression_ratio``, ``None`` = :data:`DEFAULT_RATIO`) or a ready press object (no ratio, no options)."""
    from transformers import pipeline

    press = None
    if method is not None:
        press = _press_for(method, compression_ratio, opts)[0]
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    return pipe(context, question=question, press=press, max_new_tokens=max_new_tokens)["answer"]


def kl_table(model, tokenizer, prompt: str, continuation: str, methods=None, ratios=(0.5, 0.75, 0.9),
             progress: bool = False) -> list[dict]:
    """Next-token KL(full || compressed) on ``continuation`` after ``prompt`` for every method x ratio.

    Uses :func:`jacap_lib.measure.quality.next_token_kl` with one captured prefill replayed for
    every press. ``methods=None``: the default ``jacap`` (``JacapPress``, measured masked, as the registry builds it),
    the prompt press ``jacap_prompt`` and every kvpress baseline of the registry.
    Returns rows ``{"method", "ratio", "kl", "top1_agreement", "kept_tokens"}``.
    """
    from tqdm.auto import tqdm

    from .quality import capture_prefill, full_reference, next_token_kl
    from ..presses.registry import build_press, list_methods

    methods = ["jacap", "jacap_prompt"] + list_methods("kvpress") if methods is None else list(methods)
    prompt_ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    cont_ids = tokenizer(continuation, return_tensors="pt", add_special_tokens=False).input_ids
    capture = capture_prefill(model, prompt_ids)
    reference = full_reference(model, None, prompt_ids, cont_ids, capture=capture)
    rows = []
    for method, ratio in tqdm([(m, r) for m in methods for r in ratios], disable=not progress, desc="KL"):
        res = next_token_kl(model, None, prompt_ids, cont_ids, build_press(method, ratio),
                            reference=reference, capture=capture)
        rows.append({"method": method, "ratio": float(ratio), "kl": res.kl, "top1_agreement": res.top1_agreement,
                     "kept_tokens": res.kept_tokens})
    return rows
