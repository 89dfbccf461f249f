"""Quality under compression: next-token KL and attention-output error of a compressed prompt cache.

The measurement (note §9–§10):

1. Prefill the *prompt* with a kvpress press active, so every layer's prompt cache is compressed
   right after that layer's attention ran (``with press(model): model(prompt_ids, past_key_values=cache)``).
2. Run the *continuation* against the compressed cache with its true positions
   (``position_ids = P, P+1, ...`` where ``P`` is the uncompressed prompt length — the kvpress pipeline
   does the same).
3. Compare the next-token distributions at the ``M`` continuation positions with those of the same two
   steps run without compression:

   ``KL_t = sum_v p_full(v | x_<t) [log p_full(v | x_<t) - log p_comp(v | x_<t)]``, averaged over ``t``.

The prefill logits themselves never change (a press compresses the cache *after* the layer's forward),
so only the continuation positions carry information about the eviction.

The attention-output error is measured on the same forwards: for each layer ``l``, the attention block's
output ``o_l`` (after ``W_O``) at the continuation positions, ``||o_l^comp - o_l^full||_F / ||o_l^full||_F``.
It includes the error propagated from earlier layers (the residual stream already differs), which is
what the next-token KL sees too.

The full-cache reference is computed once per (prompt, continuation) by :func:`full_reference` and can be
passed to :func:`next_token_kl` for every press.

Prefill once, compress many times
---------------------------------
A kvpress press acts in a forward hook *after* each attention layer has run, and only rewrites that
layer's cache; the hidden states that flow on are those of the uncompressed model. So the prefill
is the same for every press, and :func:`capture_prefill` runs it once, recording what every layer's
hook sees (hidden states, position embeddings, keys, values). :func:`replay_press` then calls the
press's own ``forward_hook`` layer by layer on a fresh cache — the exact code path of
``with press(model): model(prompt)``, without the model forward. ``tests/test_quality.py`` checks the
replayed caches and KLs against the real path for several presses. The benchmark uses the replay:
one prefill per (segment, length) instead of one per (segment, length, method, ratio). A press that does its
work after the forward (kvpress's KVzip and KVgrad: reconstruction passes, then masks across layers and heads)
cannot be replayed; :func:`can_replay` says which, and :func:`next_token_kl` runs those on the real prefill.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..hf import capture_attn_outputs, decoder_layers_of

__all__ = [
    "PrefillCapture",
    "prefill_cache",
    "capture_prefill",
    "replay_press",
    "can_replay",
    "scores_once",
    "caches_by_ratio",
    "post_fields",
    "scoring_record",
    "caches_by_setting",
    "next_token_kl_by_setting",
    "next_token_kl_by_ratio",
    "continue_from_cache",
    "kept_tokens",
    "uneven_layers",
    "FullReference",
    "QualityResult",
    "full_reference",
    "compressed_forward",
    "next_token_kl",
    "attention_output_error",
    "kl_from_logits",
    "prompt_and_continuation",
    "kl_grid_cell",
]


@dataclass
class FullReference:
    """Uncompressed reference for one (prompt, continuation) pair.

    Attributes
    ----------
    prompt_len : int
        ``P``, number of prompt tokens (true positions of the continuation start at ``P``).
    continuation_ids : LongTensor (1, M)
    logprobs : FloatTensor (M, V)
        float32 log-softmax of the next-token logits at the ``M`` continuation positions.
    attn_outputs : FloatTensor (L, M, hidden)
        attention-block outputs (after ``W_O``) of every layer at the continuation positions.
    """

    prompt_len: int
    continuation_ids: torch.Tensor
    logprobs: torch.Tensor
    attn_outputs: torch.Tensor


@dataclass
class QualityResult:
    """Outcome of one compressed run against a :class:`FullReference`.

    ``float(result)`` is the mean next-token KL.

    Attributes
    ----------
    kl : float
        mean over continuation positions of KL(full || compressed) in nats.
    kl_per_token : FloatTensor (M,)
    attn_rel_error : float
        mean over layers of the relative Frobenius error of the attention output.
    attn_rel_error_per_layer : FloatTensor (L,)
    kept_tokens : float
        mean (over layers and KV heads) number of prompt tokens left in the cache.
    prompt_len : int
    top1_agreement : float
        fraction of continuation positions where the argmax token agrees with the reference.
    """

    kl: float
    kl_per_token: torch.Tensor
    attn_rel_error: float
    attn_rel_error_per_layer: torch.Tensor
    kept_tokens: float
    prompt_len: int
    top1_agreement: float = field(default=float("nan"))

    def __float__(self) -> float:
        return float(self.kl)


def kl_from_logits(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p_ref || p) per row of two ``(..., vocab)`` logit tensors, in nats (float32)."""
    if ref_logits.shape != logits.shape:
        raise ValueError(f"`ref_logits` {tuple(ref_logits.shape)} and `logits` {tuple(logits.shape)} differ in shape")
    lp_ref = torch.log_softmax(ref_logits.float(), -1)
    lp = torch.log_softmax(logits.float(), -1)
    return (lp_ref.exp() * (lp_ref - lp)).sum(-1).clamp_min(0.0)


def _as_ids(x, tokenizer, name: str) -> torch.Tensor:
    """Turn a string / list / 1-D / 2-D tensor into a (1, n) LongTensor."""
    if isinstance(x, str):
        if tokenizer is None:
            raise ValueError(f"{name} is a string but tokenizer is None; pass a tokenizer or token ids")
        x = tokenizer(x, return_tensors="pt", add_special_tokens=False).input_ids
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    if x.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must hold integer token ids, got dtype {x.dtype}")
    if x.dim() == 1:
        x = x.unsqueeze(0)
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"{name} must have shape (n,) or (1, n); got {tuple(x.shape)} (batch size 1 only)")
    if x.shape[1] == 0:
        raise ValueError(f"{name} is empty; pass at least one token")
    return x.long()


def _cache_kept(cache) -> float:
    # a ragged layer (jacap_lib.cache) holds a different count per head: their mean
    lens = [float(layer.kept_lengths().float().mean()) if hasattr(layer, "kept_lengths") else layer.keys.shape[-2]
            for layer in cache.layers if getattr(layer, "keys", None) is not None]
    return float(sum(lens) / len(lens)) if lens else float("nan")


@torch.inference_mode()
def compressed_forward(model, prompt_ids: torch.Tensor, continuation_ids: torch.Tensor, press=None):
    """Prefill ``prompt_ids`` (press active if given), then run ``continuation_ids`` with true positions.

    The direct path (one model prefill per press); :func:`replay_press` + :func:`continue_from_cache`
    give the same result from one shared :class:`PrefillCapture`.
    Returns ``(logprobs (M, V) float32, attn_outputs (L, M, hidden) float32, kept_tokens float)``.
    ``press=None`` is the uncompressed path (the reference).
    """
    cache = prefill_cache(model, prompt_ids, press)
    return continue_from_cache(model, cache, prompt_ids.shape[1], continuation_ids)


@torch.inference_mode()
def prefill_cache(model, prompt_ids: torch.Tensor, press=None):
    """The cache the real prefill of ``prompt_ids`` leaves under ``with press(model)`` (``None``: uncompressed);
    a press that masks keys (KVzip, AdaKV) leaves its masks on the model's attention modules
    (``masked_key_indices``) for the tokens that follow. The path of a press that cannot replay (:func:`can_replay`)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    cache = DynamicCache()
    ctx = press(model) if press is not None else nullcontext()
    with ctx:
        model(input_ids=prompt_ids.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache

@dataclass
class PrefillCapture:
    """What every attention layer's kvpress hook sees during one uncompressed prefill.

    Attributes
    ----------
    prompt_ids : LongTensor (1, P)
    layers : list of dict, one per decoder layer, with ``kwargs`` (the attention module's forward
        keyword arguments, ``past_key_values`` removed), ``output`` (the module's output tuple),
        ``keys`` and ``values`` ``(1, H_kv, P, d)`` (the layer's full prompt cache).
    """

    prompt_ids: torch.Tensor
    layers: list

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_ids.shape[1])


@torch.inference_mode()
def capture_prefill(model, prompt_ids) -> PrefillCapture:
    """Run the uncompressed prefill once and record every attention layer's hook inputs."""
    from transformers import DynamicCache

    prompt_ids = _as_ids(prompt_ids, None, "prompt_ids")
    device = next(model.parameters()).device
    attn_modules = [layer.self_attn for layer in decoder_layers_of(model)]
    records = [None] * len(attn_modules)

    def make(i):
        def hook(module, args, kwargs, output):
            kw = {k: v for k, v in kwargs.items() if k != "past_key_values"}
            records[i] = {"kwargs": kw, "output": output}

        return hook

    cache = DynamicCache()
    hooks = [m.register_forward_hook(make(i), with_kwargs=True) for i, m in enumerate(attn_modules)]
    try:
        model(input_ids=prompt_ids.to(device), past_key_values=cache, use_cache=True, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    for i, rec in enumerate(records):
        rec["keys"], rec["values"] = cache.layers[i].keys, cache.layers[i].values
    return PrefillCapture(prompt_ids.cpu(), records)


@torch.inference_mode()
def replay_press(model, capture: PrefillCapture, press=None):
    """The prompt cache that ``with press(model): model(prompt, past_key_values=cache)`` would leave.

    Calls ``press.forward_hook`` layer by layer, in order, on a fresh :class:`~transformers.DynamicCache`
    filled with the captured keys/values (``press=None``: the uncompressed cache). Head-wise presses
    (kvpress AdaKV) mark evicted keys in ``module.masked_key_indices`` as they do in a real prefill.
    """
    from transformers import DynamicCache

    layers = decoder_layers_of(model)
    if len(layers) != len(capture.layers):
        raise ValueError(f"capture has {len(capture.layers)} layers but the model has {len(layers)}; "
                         "capture the prefill with the same model")
    inner = model.model.language_model if hasattr(model.model, "language_model") else model.model
    for layer in layers:  # a real prefill resets these (kvpress attention_patch); so do we
        layer.self_attn.masked_key_indices = None
    cache = DynamicCache()
    if press is not None:
        press.post_init_from_model(model)
    for i, (layer, rec) in enumerate(zip(layers, capture.layers)):
        cache.update(rec["keys"], rec["values"], i)
        if press is not None:
            layer.self_attn.rotary_emb = inner.rotary_emb  # as BasePress.__call__ does
            kwargs = dict(rec["kwargs"], past_key_values=cache)
            press.forward_hook(layer.self_attn, [], kwargs, rec["output"])
    return cache


def _masked_count(model) -> int:
    n = 0
    for layer in decoder_layers_of(model):
        idx = getattr(layer.self_attn, "masked_key_indices", None)
        if idx is not None:
            n += int(idx[0].numel())
    return n


def uneven_layers(cache) -> bool:
    """Whether ``cache``'s layers keep different lengths (kvpress PyramidKV): a multi-token forward on it fails,
    since the attention mask is sized by the first layer's length, so new tokens must go one at a time."""
    return len({layer.keys.shape[-2] for layer in cache.layers}) > 1


def kept_tokens(model, cache) -> float:
    """The mean number of prompt tokens per layer and KV head that a later query can see in ``cache``
    (its length, less the keys a head-wise press masked in ``masked_key_indices``)."""
    heads = cache.layers[0].keys.shape[1]
    return _cache_kept(cache) - _masked_count(model) / (len(decoder_layers_of(model)) * heads)


@torch.inference_mode()
def continue_from_cache(model, cache, prompt_len: int, continuation_ids: torch.Tensor, *, stepwise: bool | None = None):
    """Run the continuation on a (compressed) prompt cache at true positions ``prompt_len, ...``.

    Returns ``(logprobs (M, V) float32, attn_outputs (L, M, hidden) float32, kept_tokens float)`` where
    ``kept_tokens`` is the mean number of prompt tokens per layer and KV head the continuation can see.
    ``stepwise``: run the continuation one token at a time (the same next-token distributions, M forwards);
    ``None``: only for a cache whose layers keep different lengths (kvpress PyramidKV), where the attention mask of
    a multi-token forward is sized by the first layer's length.
    """
    device = next(model.parameters()).device
    continuation_ids = continuation_ids.to(device)
    M = continuation_ids.shape[1]
    kept = kept_tokens(model, cache)
    positions = torch.arange(prompt_len, prompt_len + M, device=device).unsqueeze(0)
    if stepwise is None:
        stepwise = uneven_layers(cache)
    steps = [slice(t, t + 1) for t in range(M)] if stepwise else [slice(0, M)]
    logits, attn, store = [], [], []
    for step in steps:
        with capture_attn_outputs(model, store):
            out = model(input_ids=continuation_ids[:, step], past_key_values=cache, position_ids=positions[:, step],
                        use_cache=True)
        logits.append(out.logits[0])
        attn.append(torch.stack(store, dim=0))
    logprobs = F.log_softmax(torch.cat(logits).float(), dim=-1)
    for layer in decoder_layers_of(model):  # do not leak head-wise masks into the next run
        layer.self_attn.masked_key_indices = None
    return logprobs, torch.cat(attn, dim=1), kept


def _check_reference(reference, prompt_len: int, continuation_ids):
    if reference.prompt_len != prompt_len or not torch.equal(reference.continuation_ids, continuation_ids.cpu()):
        raise ValueError("reference was computed for a different (prompt, continuation); "
                         "call full_reference(model, tok, prompt_ids, continuation_ids) for this pair")


def _check_capture(capture, prompt_ids):
    if capture is not None and not torch.equal(capture.prompt_ids, prompt_ids.cpu()):
        raise ValueError("capture was recorded for a different prompt; call capture_prefill(model, prompt_ids)")


def can_replay(press) -> bool:
    """Whether :func:`replay_press` leaves exactly the cache ``with press(model): model(prompt)`` leaves.

    A kvpress press replays when all it does inside ``with press(model)`` is its ``forward_hook`` after each
    attention layer: its class keeps ``BasePress.__call__``, and so does every press it wraps (``press``,
    ``presses``, ``prefilling_press``, ``decoding_press``). kvpress's ``KVzipPress`` and ``KVgradPress`` override it to
    score after the prefill (context-reconstruction passes, then masks across layers and heads); ``FinchPress``
    hooks the embeddings, ``KVComposePress`` and ``FastKVzipPress`` compress after the forward, ``DecodingPress`` and
    ``PrefillDecodingPress`` reset state: none of those replays. ``None`` (no compression) replays."""
    from kvpress import BasePress

    if press is None:
        return True
    if type(press).__call__ is not BasePress.__call__:
        return False
    inner = [getattr(press, a, None) for a in ("press", "prefilling_press", "decoding_press")]
    inner += list(getattr(press, "presses", None) or [])
    return all(can_replay(p) for p in inner if isinstance(p, BasePress))


def _run(model, prompt_ids, continuation_ids, press, capture):
    if capture is None or not can_replay(press):  # the real prefill under ``with press(model)``
        return compressed_forward(model, prompt_ids, continuation_ids, press=press)
    cache = replay_press(model, capture, press)
    return continue_from_cache(model, cache, capture.prompt_len, continuation_ids)


def full_reference(model, tokenizer_or_none, prompt_ids, continuation_ids, *,
                   capture: PrefillCapture | None = None) -> FullReference:
    """Uncompressed reference for one (prompt, continuation); reuse it across presses.

    With ``capture`` (from :func:`capture_prefill` on the same prompt) no prefill is run.
    """
    prompt_ids = _as_ids(prompt_ids, tokenizer_or_none, "prompt_ids")
    continuation_ids = _as_ids(continuation_ids, tokenizer_or_none, "continuation_ids")
    _check_capture(capture, prompt_ids)
    logprobs, attn, _ = _run(model, prompt_ids, continuation_ids, None, capture)
    return FullReference(prompt_ids.shape[1], continuation_ids.cpu(), logprobs.cpu(), attn.cpu())


def attention_output_error(reference: FullReference, attn_outputs: torch.Tensor) -> torch.Tensor:
    """Relative Frobenius error per layer, ``(L,)``: ||o_comp - o_full|| / ||o_full|| over the continuation."""
    ref = reference.attn_outputs
    if attn_outputs.shape != ref.shape:
        raise ValueError(f"attn_outputs {tuple(attn_outputs.shape)} must match the reference {tuple(ref.shape)}")
    diff = (attn_outputs.float() - ref).flatten(1).norm(dim=1)
    return diff / ref.flatten(1).norm(dim=1).clamp_min(1e-12)


def next_token_kl(model, tokenizer_or_none, prompt_ids, continuation_ids, press, *,
                  reference: FullReference | None = None,
                  capture: PrefillCapture | None = None) -> QualityResult:
    """Mean KL(full || compressed) of the next-token distributions over the continuation.

    Parameters
    ----------
    model : transformers causal LM (batch size 1; Llama-like, as kvpress supports).
    tokenizer_or_none : tokenizer used only when ``prompt_ids``/``continuation_ids`` are strings.
    prompt_ids, continuation_ids : str, list of ints, (n,) or (1, n) LongTensor.
    press : kvpress press (or ``None`` = no compression, KL 0).
    reference : the :func:`full_reference` of the same pair (computed here when omitted).
    capture : a :func:`capture_prefill` of the same prompt; when given, the press is replayed on it
        (:func:`replay_press`) instead of running a new prefill — same result, much cheaper. A press that cannot
        replay (:func:`can_replay`: KVzip, KVgrad) runs the real prefill under ``with press(model)`` instead, its
        continuation teacher-forced on that compressed cache, the KL against the same ``reference``.
    """
    prompt_ids = _as_ids(prompt_ids, tokenizer_or_none, "prompt_ids")
    continuation_ids = _as_ids(continuation_ids, tokenizer_or_none, "continuation_ids")
    _check_capture(capture, prompt_ids)
    if reference is None:
        reference = full_reference(model, None, prompt_ids, continuation_ids, capture=capture)
    else:
        _check_reference(reference, prompt_ids.shape[1], continuation_ids)
    return _result(reference, *_run(model, prompt_ids, continuation_ids, press, capture))


def _result(reference: FullReference, logq, attn, kept) -> QualityResult:
    logq, attn = logq.cpu(), attn.cpu()
    kl_tok = kl_from_logits(reference.logprobs, logq)  # log-probabilities are their own logits
    rel = attention_output_error(reference, attn)
    top1 = (reference.logprobs.argmax(-1) == logq.argmax(-1)).float().mean().item()
    return QualityResult(
        kl=float(kl_tok.mean()),
        kl_per_token=kl_tok,
        attn_rel_error=float(rel.mean()),
        attn_rel_error_per_layer=rel,
        kept_tokens=kept,
        prompt_len=int(reference.prompt_len),
        top1_agreement=top1,
    )


def scores_once(press) -> bool:
    """Whether a press scores the prompt the same at every compression ratio and only its masks depend on it:
    kvpress ``KVzipPress`` and its subclasses, ``KVgradPress`` and
    :class:`~jacap_lib.presses.jacap_context.JacapPress` (the reconstruction passes fill ``score_val``
    whatever the ratio; ``compress_post`` alone reads ``compression_ratio``, to mask the bottom of ``score_val``)."""
    from kvpress import KVzipPress

    return isinstance(press, KVzipPress)


def _copy_cache(cache):
    from transformers import DynamicCache

    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.clone(), layer.values.clone(), i)
    return out


@torch.inference_mode()
def caches_by_ratio(model, prompt_ids, press, ratios):
    """For a press that :func:`scores_once`: one real prefill under ``with press(model)`` (its scoring passes
    run once), then for each ratio of ``ratios`` kvpress's own ``press.compress_post`` on the same scores; yields
    ``(ratio, cache)``, the model's attention modules holding that ratio's masks (``masked_key_indices``) -- what a
    separate prefill at that ratio leaves. The press's ``compression_ratio`` is the last ratio afterwards."""
    import dataclasses

    if not scores_once(press):
        raise ValueError(f"press must score once for every ratio (kvpress KVzipPress, KVgradPress); got "
                         f"{type(press).__name__}: measure it per ratio")
    from jacap_lib._checks import compression_ratio

    if not ratios:
        raise ValueError("ratios must hold at least one compression ratio in (0, 1); got none")
    ratios = [compression_ratio(c, "ratios", allow_zero=False) for c in ratios]
    # one press per ratio, the same scoring: caches_by_setting scores once under the first and masks with each
    copies = [dataclasses.replace(press, compression_ratio=c) for c in ratios]
    try:
        for p, cache in caches_by_setting(model, prompt_ids, copies):
            yield p.compression_ratio, cache
    finally:
        press.compression_ratio = ratios[-1]


def next_token_kl_by_ratio(model, prompt_ids, continuation_ids, press, ratios, *,
                           reference: FullReference) -> list[QualityResult]:
    """:func:`next_token_kl` of a press that :func:`scores_once` at every ratio of ``ratios``, from one scoring
    (:func:`caches_by_ratio`): the same results as one real prefill per ratio, at the cost of one."""
    continuation_ids = _as_ids(continuation_ids, None, "continuation_ids")
    prompt_len = _as_ids(prompt_ids, None, "prompt_ids").shape[1]
    _check_reference(reference, prompt_len, continuation_ids)
    return [_result(reference, *continue_from_cache(model, cache, prompt_len, continuation_ids))
            for _, cache in caches_by_ratio(model, prompt_ids, press, ratios)]


def post_fields(press) -> tuple[str, ...]:
    """The fields of a press that :func:`scores_once` which only its ``compress_post`` reads: kvpress ``KVzipPress``
    reads ``compression_ratio`` and ``layerwise`` there alone, and so does ``KVgradPress``, which inherits that
    ``compress_post`` and scores with a gradient pass that reads neither; a subclass declares its own in a
    ``post_only`` class attribute (:class:`~jacap_lib.presses.jacap_context.JacapPress`: the budget and the
    window too); any other subclass only ``compression_ratio``."""
    from kvpress import KVzipPress

    if not scores_once(press):
        raise ValueError(f"press must score once for every ratio (kvpress KVzipPress and its subclasses); got "
                         f"{type(press).__name__}")
    own = getattr(type(press), "post_only", None)
    if own is not None:
        return tuple(own)
    from kvpress import KVgradPress

    return ("compression_ratio", "layerwise") if type(press) in (KVzipPress, KVgradPress) else ("compression_ratio",)


def scoring_record(press) -> tuple:
    """What decides the scores of a press that :func:`scores_once`: its class and every constructor field but its
    :func:`post_fields`. Two presses with equal records fill the same ``score_val`` from the same prompt, so one
    scoring serves both (:func:`caches_by_setting`)."""
    import dataclasses
    import json

    post = post_fields(press)
    fields = {f.name: getattr(press, f.name) for f in dataclasses.fields(press) if f.init and f.name not in post}
    return (type(press), json.dumps(fields, sort_keys=True, default=repr))


@torch.inference_mode()
def caches_by_setting(model, prompt_ids, presses):
    """:func:`caches_by_ratio` across settings: ``presses`` that :func:`scores_once` with one :func:`scoring_record`
    (they differ only in their :func:`post_fields`: ratio, budget, window). One real prefill under the first press
    scores the prompt; then each press's own ``compress_post`` masks a copy of those scores; yields ``(press, cache)``
    in order, the model's attention modules holding that press's masks -- what its own prefill leaves."""
    from transformers import DynamicCache

    presses = list(presses)
    if not presses:
        raise ValueError("presses must hold at least one press")
    records = {scoring_record(p) for p in presses}  # raises for a press that does not score once
    if len(records) != 1:
        raise ValueError("presses must share one scoring (the same class and fields but their post_fields: ratio, "
                         "budget, window); group them by quality.scoring_record")
    from jacap_lib._checks import compression_ratio

    for p in presses:
        compression_ratio(p.compression_ratio, "every press's compression_ratio", allow_zero=False)
    prompt_ids = _as_ids(prompt_ids, None, "prompt_ids")
    first, stash = presses[0], {}
    post = first.compress_post

    def keep(m):  # the scores before compress_post marks the sinks in place
        stash["scores"] = first.score_val.clone()
        post(m)

    first.compress_post = keep
    cache = DynamicCache()
    try:
        with first(model):
            model(input_ids=prompt_ids.to(next(model.parameters()).device), past_key_values=cache, use_cache=True,
                  logits_to_keep=1)
    finally:
        del first.compress_post
    for p in presses:
        p.score_val = stash["scores"].clone()
        try:
            p.compress_post(model)
        finally:
            p.score_val = None
        yield p, _copy_cache(cache)


def next_token_kl_by_setting(model, prompt_ids, continuation_ids, presses, *,
                             reference: FullReference) -> list[QualityResult]:
    """:func:`next_token_kl` of each of ``presses`` (one scoring, :func:`caches_by_setting`), in order."""
    continuation_ids = _as_ids(continuation_ids, None, "continuation_ids")
    prompt_len = _as_ids(prompt_ids, None, "prompt_ids").shape[1]
    _check_reference(reference, prompt_len, continuation_ids)
    return [_result(reference, *continue_from_cache(model, cache, prompt_len, continuation_ids))
            for _, cache in caches_by_setting(model, prompt_ids, presses)]


def prompt_and_continuation(tokenizer, text: str, length: int, continuation: int, *, name: str = "text"):
    """``(prompt (1, length), continuation (1, continuation))`` token ids from the start of ``text``."""
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
    if ids.shape[1] < length + continuation:
        raise ValueError(f"{name} has {ids.shape[1]} tokens, fewer than length {length} + continuation "
                         f"{continuation}; use shorter lengths or a longer text")
    return ids[:, :length], ids[:, length:length + continuation]


def kl_grid_cell(model, prompt_ids, continuation_ids, presses, on_result=None) -> list:
    """One cell of the quality grid: the prefill of ``prompt_ids`` captured once with its full
    reference, then every press of ``presses`` (an iterable of ``(label, press)``) replayed on it.

    ``on_result(label, result, seconds, prefill_seconds)`` is called as each press finishes (a grid
    job writes its row there, so an interrupted run keeps what was done). Returns the
    ``[(label, QualityResult)]`` list.
    """
    import time

    t0 = time.perf_counter()
    cap = capture_prefill(model, prompt_ids)
    ref = full_reference(model, None, prompt_ids, continuation_ids, capture=cap)
    prefill_seconds = time.perf_counter() - t0
    out = []
    for label, press in presses:
        t0 = time.perf_counter()
        res = next_token_kl(model, None, prompt_ids, continuation_ids, press, reference=ref, capture=cap)
        if on_result is not None:
            on_result(label, res, time.perf_counter() - t0, prefill_seconds)
        out.append((label, res))
    return out
