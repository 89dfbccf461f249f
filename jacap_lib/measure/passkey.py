"""Needle retrieval ("passkey"): a number hidden at a relative depth in filler text, asked for on a
compressed cache; greedy decoding on the compressed cache, as in kvpress's pipeline.

Two modes (:data:`MODES`, :func:`passkey_inputs`):

* ``"after"`` - the context alone is compressed; the question is run afterwards on the compressed cache
  (kvpress's pipeline: the press cannot know what will be asked);
* ``"inside"`` - the question is part of the compressed prompt (query-aware compression: a press that
  looks at the last queries sees the question); only the question's last token is run on the compressed
  cache, so the first answer token, like every later one, is computed on the compressed cache.

:func:`needle_layout` locates the needle and the key's digit tokens in the context (true positions);
:func:`digit_survival` says, per layer and KV head, which of them a compressed cache still holds
(from :func:`jacap_lib.measure.eviction.kept_positions`).

:func:`measure_needle` is the needle job's model loop: one prefill of a :class:`NeedleGroup`'s prompt, every
(setting, ratio) of the group replayed on it and answered, one row each. The job that plans the groups and writes
them (the tuned settings, ``data/results/eval/needle.jsonl``) is :mod:`jacap_lib.experiments.needle` (``jacap evaluate
needle``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

__all__ = ["FILLER", "QUESTION", "MODES", "N_NEW", "passkey_prompt", "needle_layout", "passkey_inputs",
           "digit_survival", "greedy_answer", "needle_trial", "answer_from_cache", "passkey_answer", "passkey_trial", "NeedleGroup",
           "measure_needle"]

MODES = ("after", "inside")
N_NEW = 8  # greedy tokens the needle job decodes after the question
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")
QUESTION = " What is the pass key? The pass key is"


def _tokens(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids


def _needle_text(key: str) -> str:
    return f" The pass key is {key}. Remember it. {key} is the pass key. "


def _build(tokenizer, length: int, depth: float, key: str):
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    needle = _tokens(tokenizer, _needle_text(key))[0]
    filler = _tokens(tokenizer, FILLER)[0]
    n_fill = length - needle.numel()
    if n_fill < 8:
        raise ValueError(f"length {length} is too short for the needle ({needle.numel()} tokens)")
    reps = filler.repeat(n_fill // filler.numel() + 1)[:n_fill]
    at = int(round(depth * n_fill))
    return torch.cat([reps[:at], needle, reps[at:]]).unsqueeze(0), at, needle


def passkey_prompt(tokenizer, length: int, depth: float, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(context_ids (1, length), question_ids)``: filler with the needle at relative ``depth`` in [0, 1].

    The context (filler + needle, exactly ``length`` tokens) is what gets compressed; the question
    is run afterwards on the compressed cache, as in kvpress's pipeline.
    """
    return _build(tokenizer, length, depth, key)[0], _tokens(tokenizer, QUESTION)


def needle_layout(tokenizer, length: int, depth: float, key: str) -> dict:
    """Where the needle of :func:`passkey_prompt` sits in its context, in true positions:
    ``{"needle": [start, end), "key": [positions of the key's digit tokens, both copies],
    "copies": [[positions of copy 1], [copy 2]], "other": [the needle's other positions]}``.

    A token is a key token when its characters overlap a copy of ``key`` in the decoded needle; token ``i``'s
    characters are those that decoding the needle's first ``i + 1`` tokens adds to decoding its first ``i``
    (robust to tokenizers that drop a leading space when decoding one token alone). ``ValueError`` when the
    decoded needle does not hold the key twice."""
    _, at, needle = _build(tokenizer, length, depth, key)
    ids = [int(t) for t in needle]
    ends = [len(tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]
    starts = [0] + ends[:-1]
    text = tokenizer.decode(ids)
    copies, at_char = [], text.find(key)
    while at_char >= 0:
        copies.append([at + i for i, (s0, e0) in enumerate(zip(starts, ends))
                       if e0 > s0 and s0 < at_char + len(key) and e0 > at_char])
        at_char = text.find(key, at_char + len(key))
    if len(copies) != 2:
        raise ValueError(f"tokenizer: the decoded needle {text!r} does not hold the key {key!r} twice; cannot "
                         "locate the key's tokens")
    keys = sorted({i for c in copies for i in c})
    span = list(range(at, at + needle.numel()))
    return {"needle": [at, at + needle.numel()], "key": keys, "copies": copies,
            "other": [i for i in span if i not in set(keys)]}


def passkey_inputs(tokenizer, length: int, depth: float, key: str, mode: str = "after"):
    """``(prefill_ids, decode_ids, layout)`` of one needle prompt in ``mode`` (:data:`MODES`): what is
    prefilled and compressed, what is then run on the compressed cache before the answer's greedy tokens,
    and :func:`needle_layout` (positions in the context, which opens the prefill in both modes).

    ``"after"``: the context (``length`` tokens), then the question; ``"inside"``: the context and the
    question but its last token (``length + len(question) - 1`` tokens compressed), then that last token."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    ctx, question = passkey_prompt(tokenizer, length, depth, key)
    layout = needle_layout(tokenizer, length, depth, key)
    if mode == "after":
        return ctx, question, layout
    return torch.cat([ctx, question[:, :-1]], dim=1), question[:, -1:], layout


def digit_survival(kept: torch.Tensor, layout: dict, digits: int = 4) -> dict:
    """What of the needle a compressed cache holds, from ``kept (L, H, P)`` (True = position kept, e.g.
    :func:`jacap_lib.measure.eviction.kept_positions`) and a :func:`needle_layout`:

    * ``key_kept``: per layer, a list over KV heads of the fraction of the key's digit tokens kept;
    * ``needle_other_kept``: the same for the needle's other tokens;
    * ``key_kept_frac`` / ``needle_kept_frac``: the fraction kept of the key's digit tokens / of all the
      needle's tokens, over every layer and KV head;
    * ``key_all_kept``: every key digit token kept in every layer and KV head;
    * ``key_copy_kept``: the fraction of (layer, KV head) caches that hold at least one whole copy of the key.

    Fractions are rounded to ``digits`` decimals."""
    kept = torch.as_tensor(kept, dtype=torch.bool)
    if kept.dim() != 3:
        raise ValueError(f"kept must be (layers, KV heads, positions), got shape {tuple(kept.shape)}")
    lo, hi = layout["needle"]
    if hi > kept.shape[-1]:
        raise ValueError(f"layout's needle ends at {hi}, after the {kept.shape[-1]} positions of kept")

    def frac(pos):
        return kept[..., torch.as_tensor(pos, dtype=torch.long)].float().mean(-1)

    def grid(x):
        return [[round(float(v), digits) for v in row] for row in x]

    key = kept[..., torch.as_tensor(layout["key"], dtype=torch.long)]
    whole = torch.stack([kept[..., torch.as_tensor(c, dtype=torch.long)].all(-1) for c in layout["copies"]]).any(0)
    return {"key_kept": grid(frac(layout["key"])), "needle_other_kept": grid(frac(layout["other"])),
            "key_kept_frac": round(float(key.float().mean()), digits),
            "needle_kept_frac": round(float(kept[..., lo:hi].float().mean()), digits),
            "key_all_kept": bool(key.all()), "key_copy_kept": round(float(whole.float().mean()), digits)}


@torch.inference_mode()
def greedy_answer(model, cache, prompt_len: int, question: torch.Tensor, n_new: int, *,
                  stepwise: bool | None = None) -> list[int]:
    """``n_new`` greedy tokens after ``question``, run on ``cache`` (a prompt of ``prompt_len`` tokens,
    possibly compressed) at the true positions ``prompt_len, prompt_len + 1, ...``.

    ``stepwise``: feed the question one token at a time (the same answer, one forward per token); ``None``: only for
    a cache whose layers keep different lengths (kvpress PyramidKV), where the attention mask of a multi-token
    forward is sized by the first layer's length."""
    from ..hf import clear_masks
    from .quality import uneven_layers

    device = next(model.parameters()).device
    q = question.to(device)
    pos = torch.arange(prompt_len, prompt_len + q.shape[1], device=device).unsqueeze(0)
    if stepwise is None:
        stepwise = uneven_layers(cache)
    if stepwise:  # every question token but the last, one at a time; the last gives the first answer token
        for t in range(q.shape[1] - 1):
            model(input_ids=q[:, t:t + 1], past_key_values=cache, position_ids=pos[:, t:t + 1], use_cache=True,
                  logits_to_keep=1)
        q, pos = q[:, -1:], pos[:, -1:]
    out = model(input_ids=q, past_key_values=cache, position_ids=pos, use_cache=True, logits_to_keep=1)
    tok = out.logits[0, -1].argmax()
    gen = [int(tok)]
    p = prompt_len + q.shape[1]
    for i in range(n_new - 1):
        out = model(input_ids=tok.view(1, 1), past_key_values=cache,
                    position_ids=torch.tensor([[p + i]], device=device), use_cache=True)
        tok = out.logits[0, -1].argmax()
        gen.append(int(tok))
    clear_masks(model)
    return gen


def needle_trial(model, tokenizer, capture, press, decode_ids: torch.Tensor, layout: dict | None = None, *,
                 n_new: int = 8) -> dict:
    """One needle answer: ``press`` (``None`` = uncompressed) replayed on a captured prefill
    (:func:`jacap_lib.measure.quality.capture_prefill` of the prefill of :func:`passkey_inputs`), then
    ``decode_ids`` and ``n_new`` greedy tokens. Returns ``{"answer", "kept_tokens"}`` (the mean number of
    prompt tokens per layer and KV head the question could see, :func:`jacap_lib.measure.quality.kept_tokens`)
    and, with a ``layout``, the :func:`digit_survival` of the compressed cache."""
    from .quality import can_replay, prefill_cache, replay_press

    # a press that cannot replay (KVzip, KVgrad: they score after the prefill) runs the real prefill instead
    cache = replay_press(model, capture, press) if can_replay(press) else prefill_cache(model, capture.prompt_ids, press)
    return answer_from_cache(model, tokenizer, capture, cache, decode_ids, layout, n_new=n_new)


def answer_from_cache(model, tokenizer, capture, cache, decode_ids: torch.Tensor, layout: dict | None = None, *,
                      n_new: int = 8) -> dict:
    """:func:`needle_trial`'s answer from a compressed ``cache`` of ``capture``'s prompt (the model's attention
    modules holding any masks of the press that made it)."""
    from .eviction import kept_positions
    from .quality import kept_tokens

    out = {"kept_tokens": kept_tokens(model, cache)}
    if layout is not None:
        out.update(digit_survival(kept_positions(model, capture, cache), layout))
    out["answer"] = tokenizer.decode(greedy_answer(model, cache, capture.prompt_len, decode_ids, n_new=n_new))
    return out


def passkey_trial(model, tokenizer, capture, press, question: torch.Tensor, *, n_new: int = 8) -> tuple[str, float]:
    """``(answer, kept_tokens)`` of :func:`needle_trial` (no digit survival)."""
    res = needle_trial(model, tokenizer, capture, press, question, n_new=n_new)
    return res["answer"], res["kept_tokens"]


def passkey_answer(model, tokenizer, capture, press, question: torch.Tensor, *, n_new: int = 8) -> str:
    """The decoded answer after ``press`` (``None`` = uncompressed) was replayed on a captured prefill
    (:func:`jacap_lib.measure.quality.capture_prefill` of the context)."""
    return passkey_trial(model, tokenizer, capture, press, question, n_new=n_new)[0]


@dataclass
class NeedleGroup:
    """One prefill: the context of one (length, depth, trial, key), and the (spec, ratio) answers still to
    decode on it (ratio ``0.0``: the uncompressed answer, whose press is ``None``)."""

    length: int
    depth: float
    trial: int
    key: str
    jobs: list = field(default_factory=list)
    mode: str = MODES[0]


def measure_needle(model, tokenizer, group: NeedleGroup, *, model_name: str, press_of, family_of, n_new: int = N_NEW,
                   on_row=None) -> list[dict]:
    """One prefill of the group's prompt (in the group's mode, :func:`passkey_inputs`) captured, every (spec,
    ratio) of ``group.jobs`` replayed on it and answered (:func:`needle_trial`), with its digit survival; one row
    each, in job order (``on_row(row)``: called as each is made). ``press_of(spec, ratio)``: the press of a job
    (``None``: uncompressed); ``family_of(spec)``: the row's ``family``; both module-level functions, so that the
    measure pickles to spawned workers."""
    from .quality import caches_by_ratio, capture_prefill, scores_once

    prefill_ids, decode_ids, layout = passkey_inputs(tokenizer, group.length, group.depth, group.key, group.mode)
    w0 = time.perf_counter()
    cap = capture_prefill(model, prefill_ids)
    prefill = round(time.perf_counter() - w0, 3)
    rows, shared = [], {}
    for spec, c in group.jobs:
        w0 = time.perf_counter()
        press = press_of(spec, c)
        if (spec, c) in shared:  # answered from the scores one real prefill made for every ratio of the group
            res = shared.pop((spec, c))
        elif press is not None and scores_once(press):
            ratios = [r for s, r in group.jobs if s == spec]
            for r, cache in caches_by_ratio(model, cap.prompt_ids, press, ratios):
                shared[(spec, r)] = answer_from_cache(model, tokenizer, cap, cache, decode_ids, layout, n_new=n_new)
            res = shared.pop((spec, c))
        else:
            res = needle_trial(model, tokenizer, cap, press, decode_ids, layout, n_new=n_new)
        text = res.pop("answer")
        row = {"model": model_name, "length": group.length, "depth": group.depth, "trial": group.trial,
               "key": group.key, "method": spec, "family": family_of(spec), "ratio": c,
               "mode": group.mode, "answer": text, "correct": group.key in text, **res,
               "key_positions": layout["key"], "needle_span": layout["needle"],
               "seconds": round(time.perf_counter() - w0, 3), "prefill_seconds": prefill}
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows
