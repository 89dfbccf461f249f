"""Needle retrieval ("passkey"): a number hidden at a relative depth in filler text, asked for after
the context's cache was compressed; greedy decoding on the compressed cache, as in kvpress's pipeline.

The evaluation's needle job (the tuned settings, ``data/results/eval/needle.jsonl``) is
:mod:`jacap_lib.results.needle` (``jacap evaluate needle``).
"""
from __future__ import annotations

import torch

__all__ = ["FILLER", "QUESTION", "passkey_prompt", "greedy_answer", "passkey_answer", "passkey_trial"]

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")
QUESTION = " What is the pass key? The pass key is"


def _tokens(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids


def passkey_prompt(tokenizer, length: int, depth: float, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(context_ids (1, length), question_ids)``: filler with the needle at relative ``depth`` in [0, 1].

    The context (filler + needle, exactly ``length`` tokens) is what gets compressed; the question
    is run afterwards on the compressed cache, as in kvpress's pipeline.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    needle = _tokens(tokenizer, f" The pass key is {key}. Remember it. {key} is the pass key. ")[0]
    filler = _tokens(tokenizer, FILLER)[0]
    n_fill = length - needle.numel()
    if n_fill < 8:
        raise ValueError(f"length {length} is too short for the needle ({needle.numel()} tokens)")
    reps = filler.repeat(n_fill // filler.numel() + 1)[:n_fill]
    at = int(round(depth * n_fill))
    ctx = torch.cat([reps[:at], needle, reps[at:]]).unsqueeze(0)
    return ctx, _tokens(tokenizer, QUESTION)


@torch.inference_mode()
def greedy_answer(model, cache, prompt_len: int, question: torch.Tensor, n_new: int) -> list[int]:
    """``n_new`` greedy tokens after ``question``, run on ``cache`` (a prompt of ``prompt_len`` tokens,
    possibly compressed) at the true positions ``prompt_len, prompt_len + 1, ...``."""
    from ..hf import clear_masks

    device = next(model.parameters()).device
    q = question.to(device)
    pos = torch.arange(prompt_len, prompt_len + q.shape[1], device=device).unsqueeze(0)
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


def passkey_trial(model, tokenizer, capture, press, question: torch.Tensor, *, n_new: int = 8) -> tuple[str, float]:
    """``(answer, kept_tokens)``: the decoded answer after ``press`` (``None`` = uncompressed) was replayed on
    a captured prefill (:func:`jacap_lib.measure.quality.capture_prefill` of the context), and the mean number
    of context tokens per layer and KV head the question could see
    (:func:`jacap_lib.measure.quality.kept_tokens`)."""
    from .quality import kept_tokens, replay_press

    cache = replay_press(model, capture, press)
    kept = kept_tokens(model, cache)
    return tokenizer.decode(greedy_answer(model, cache, capture.prompt_len, question, n_new=n_new)), kept


def passkey_answer(model, tokenizer, capture, press, question: torch.Tensor, *, n_new: int = 8) -> str:
    """The decoded answer after ``press`` (``None`` = uncompressed) was replayed on a captured prefill
    (:func:`jacap_lib.measure.quality.capture_prefill` of the context)."""
    return passkey_trial(model, tokenizer, capture, press, question, n_new=n_new)[0]
