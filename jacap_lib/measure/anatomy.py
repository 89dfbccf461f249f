"""The anatomy of a losing cell: which tokens two presses keep differently, and what a one-knob swap does to KL.

On one document at one prompt length and compression ratio, one uncompressed prefill is captured
(:func:`jacap_lib.measure.quality.capture_prefill`) and every press is replayed on it with its own kvpress hook:

* :func:`kept_positions` — the prompt positions a press keeps, per layer and KV head, read back from the replayed
  cache (rows matched exactly against the uncompressed keys by :func:`jacap_lib.measure.eviction.kept_indices`);
* :func:`jaccard_per_layer` — the overlap ``|A ∩ B| / |A ∪ B|`` of two presses' kept sets, per layer (mean over
  its KV heads);
* :func:`exclusive_histogram` — where the tokens kept by one press only lie: counts per bin of distance from
  the end of the prompt, per layer, summed over KV heads;
* :func:`token_categories` / :func:`category_counts` — what those tokens are (line breaks, names on a line of
  their own — the speaker lines of a play — markup and punctuation, words);
* :func:`future_statistics` — the mean and variance of the queries that come *after* the prompt (the continuation
  whose KL is scored), per layer and KV head: the oracle statistics a
  :class:`~jacap_lib.measure.instruments.JacapGivenStatisticsPress` is handed in :func:`document_kl`;
* :func:`measure_document` — all of it for a pair of presses, plus the next-token KL of every press given
  (:func:`jacap_lib.measure.quality.next_token_kl` on the same capture and full reference).

The job that runs this on the dev documents and writes ``data/results/eval/anatomy.json`` is
:mod:`jacap_lib.experiments.anatomy`.
"""
from __future__ import annotations

import re
import time
from collections import Counter

import torch

from .instruments import JacapGivenStatisticsPress

__all__ = ["DISTANCE_EDGES", "CATEGORIES", "kept_positions", "kept_mask", "jaccard_per_layer", "exclusive_histogram",
           "token_categories", "category_counts", "top_tokens", "future_statistics", "document_kl", "measure_document"]

#: bin edges of the distance from the end of the prompt (``N - 1 - position``; 0 = the last prompt token): the
#: first two bins are the last 32 positions (a recent window of that size; JacapPromptPress's default window is 16)
DISTANCE_EDGES = (0, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
#: token categories of :func:`token_categories`, in the order they are tested
CATEGORIES = ("line break", "name line", "markup/punctuation", "space", "word", "other")
_MARKUP = re.compile(r"^[\s\W_]+$")


def kept_positions(model, capture, press) -> torch.Tensor:
    """LongTensor ``(L, H, B)``: ascending prompt positions each layer and KV head keeps under ``press``, replayed
    on ``capture`` (a press that masks keys per head instead of evicting them is refused)."""
    from ..hf import decoder_layers_of
    from .eviction import kept_indices
    from .quality import replay_press

    cache = replay_press(model, capture, press)
    out = []
    for i, rec in enumerate(capture.layers):
        full, kept = rec["keys"], cache.layers[i].keys
        out.append(kept_indices(full, kept)[0].cpu())
    if any(getattr(layer.self_attn, "masked_key_indices", None) is not None for layer in decoder_layers_of(model)):
        for layer in decoder_layers_of(model):
            layer.self_attn.masked_key_indices = None
        raise ValueError(f"{type(press).__name__} masks keys per head instead of evicting them; kept_positions "
                         "needs a press that shrinks the cache")
    return torch.stack(out)


def kept_mask(kept: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """BoolTensor ``(L, H, N)`` from kept positions ``(L, H, B)``."""
    kept = torch.as_tensor(kept, dtype=torch.long)
    if kept.dim() != 3:
        raise ValueError(f"kept must be (layers, heads, budget) positions, got shape {tuple(kept.shape)}")
    if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= n_tokens):
        raise ValueError(f"kept positions must lie in [0, n_tokens={n_tokens}), got {int(kept.min())}..{int(kept.max())}")
    return torch.zeros(*kept.shape[:2], n_tokens, dtype=torch.bool).scatter_(-1, kept, True)


def jaccard_per_layer(kept_a: torch.Tensor, kept_b: torch.Tensor, n_tokens: int) -> list[float]:
    """Per layer, the mean over KV heads of ``|A ∩ B| / |A ∪ B|`` of two kept sets ``(L, H, B)``."""
    a, b = kept_mask(kept_a, n_tokens), kept_mask(kept_b, n_tokens)
    if a.shape != b.shape:
        raise ValueError(f"kept_a and kept_b must have the same layers and heads, got {tuple(a.shape)} and {tuple(b.shape)}")
    inter, union = (a & b).sum(-1).double(), (a | b).sum(-1).double()
    return (inter / union.clamp_min(1)).mean(-1).tolist()


def exclusive_histogram(kept_a: torch.Tensor, kept_b: torch.Tensor, n_tokens: int, edges=DISTANCE_EDGES) -> dict:
    """Where the positions kept by ``a`` and not by ``b`` (``"a_only"``) and the converse (``"b_only"``) lie:
    per layer, the count over KV heads in each bin ``[edges[k], edges[k+1])`` of distance from the end of the
    prompt (``N - 1 - position``), ``[[count per bin] per layer]``; ``"first"``: per layer, the counts among the
    first four positions."""
    a, b = kept_mask(kept_a, n_tokens), kept_mask(kept_b, n_tokens)
    edges = [int(e) for e in edges]
    if edges != sorted(set(edges)) or edges[0] != 0:
        raise ValueError(f"edges must start at 0 and increase, got {edges}")
    dist = torch.arange(n_tokens - 1, -1, -1)
    bins = torch.bucketize(dist, torch.tensor(edges[1:]), right=True)  # bin k: edges[k] <= dist < edges[k+1]
    out = {"edges": edges}
    for name, m in (("a_only", a & ~b), ("b_only", b & ~a)):
        per_pos = m.sum(1)  # (L, N): heads keeping it
        hist = torch.zeros(per_pos.shape[0], len(edges) - 1, dtype=torch.long)
        hist.index_add_(1, bins.clamp_max(len(edges) - 2), per_pos.long())
        out[name] = hist.tolist()
        out[name + "_first"] = per_pos[:, :4].sum(-1).tolist()
    return out


def token_categories(tokens: list[str]) -> list[str]:
    """One category of :data:`CATEGORIES` per token (tokens decoded one by one, joined they give the text):

    * ``"line break"`` — the token holds a newline;
    * ``"name line"`` — part of a line whose letters (two or more) are all capitals: a speaker's name on a line
      of its own in a play, a heading in capitals;
    * ``"markup/punctuation"`` — only punctuation, markup characters or underscores;
    * ``"space"`` — only blanks;
    * ``"word"`` — holds a letter; ``"other"`` — the rest (digits, ...)."""
    text = "".join(tokens)
    name_char = [False] * len(text)
    pos = 0
    for line in text.split("\n"):
        letters = [ch for ch in line if ch.isalpha()]
        if len(letters) >= 2 and all(ch.isupper() for ch in letters):
            for k in range(pos, pos + len(line)):
                name_char[k] = True
        pos += len(line) + 1
    out, pos = [], 0
    for tok in tokens:
        span = range(pos, pos + len(tok))
        pos += len(tok)
        if "\n" in tok:
            out.append("line break")
        elif tok.strip() and any(name_char[k] for k in span) and any(ch.isalpha() for ch in tok):
            out.append("name line")
        elif tok.strip() and _MARKUP.match(tok):
            out.append("markup/punctuation")
        elif not tok.strip():
            out.append("space")
        elif any(ch.isalpha() for ch in tok):
            out.append("word")
        else:
            out.append("other")
    return out


def category_counts(mask: torch.Tensor, categories: list[str]) -> dict:
    """``{category: count}`` of the True entries of ``mask (..., N)`` by the category of their position."""
    per_pos = mask.reshape(-1, mask.shape[-1]).sum(0).tolist()
    out = dict.fromkeys(CATEGORIES, 0)
    for n, c in zip(per_pos, categories):
        out[c] += int(n)
    return out


def top_tokens(mask: torch.Tensor, tokens: list[str], k: int = 12) -> list[list]:
    """The ``k`` most frequent decoded tokens among the True entries of ``mask (..., N)``: ``[[token, count]]``."""
    per_pos = mask.reshape(-1, mask.shape[-1]).sum(0).tolist()
    c = Counter()
    for n, tok in zip(per_pos, tokens):
        if n:
            c[tok] += int(n)
    return [[t, n] for t, n in c.most_common(k)]


@torch.no_grad()
def future_statistics(model, prompt_ids: torch.Tensor, continuation_ids: torch.Tensor, *, group: bool = True,
                      eps: float = 1e-6) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{layer: (mu, lam)}``: the flat mean and variance (floored at ``eps``) of the continuation's queries — the
    queries the model computes at positions ``N .. N + T - 1`` when it reads ``continuation_ids`` after
    ``prompt_ids`` (post-RoPE, at their true positions; :func:`jacap_lib.hf.capture_heads`), float32. ``group``:
    the query heads of each KV head pooled into one Gaussian (``(H_kv, d)``, Jacap's ``gqa="pool"``), else per
    query head ``(H_q, d)``."""
    from ..hf import capture_heads
    from ..stats import moment_stats

    prompt_ids, continuation_ids = (x if x.dim() == 2 else x.unsqueeze(0) for x in (prompt_ids, continuation_ids))
    if continuation_ids.shape[-1] < 1:
        raise ValueError("`continuation_ids` is empty: the future queries' statistics need at least one query")
    n = prompt_ids.shape[-1]
    caps = capture_heads(model, torch.cat([prompt_ids, continuation_ids], dim=-1).cpu())
    out = {}
    for layer, cap in caps.items():
        q = cap.queries[:, n:].float()  # (H_q, T, d)
        out[layer] = moment_stats(q.mean(-2), q.square().mean(-2), eps, group=cap.group if group else 1)
    return out


@torch.inference_mode()
def document_kl(model, tokenizer, text: str, *, length: int, continuation: int, presses: dict,
                name: str = "text", capture=None) -> dict:
    """``{label: {kl, top1_agreement, attn_rel_error, kept_tokens}}`` of every press on one document (one
    captured prefill and full reference shared by all; ``capture``: ``(capture, reference, prompt, continuation)``
    already made). A :class:`~jacap_lib.measure.instruments.JacapGivenStatisticsPress` is first handed this
    document's :func:`future_statistics` (the oracle)."""
    from .quality import capture_prefill, full_reference, next_token_kl, prompt_and_continuation

    if capture is None:
        prompt, cont = prompt_and_continuation(tokenizer, text, length, continuation, name=name)
        cap = capture_prefill(model, prompt)
        capture = (cap, full_reference(model, None, prompt, cont, capture=cap), prompt, cont)
    cap, ref, prompt, cont = capture
    given = [p for p in presses.values() if isinstance(p, JacapGivenStatisticsPress)]
    if given:  # the oracle statistics: the continuation's own queries, once per document
        stats = {g: future_statistics(model, prompt, cont, group=g == "pool", eps=given[0].eps)
                 for g in {p.gqa for p in given}}
        for p in given:
            p.set_statistics(stats[p.gqa])
    kl = {}
    for label, press in presses.items():
        res = next_token_kl(model, None, prompt, cont, press, reference=ref, capture=cap)
        kl[label] = {"kl": res.kl, "top1_agreement": res.top1_agreement, "attn_rel_error": res.attn_rel_error,
                     "kept_tokens": res.kept_tokens}
    return kl


@torch.inference_mode()
def measure_document(model, tokenizer, text: str, *, length: int, continuation: int, presses: dict, pair: tuple,
                     name: str = "text") -> dict:
    """One document: KL of every press in ``presses`` (``{label: press}``) and the kept sets of the two presses
    named by ``pair = (a, b)`` (labels of ``presses``) compared. Returns ``{"kl": {label: {kl, top1_agreement,
    attn_rel_error}}, "jaccard": [per layer], "histogram": ..., "categories": {"a_only", "b_only", "prompt"},
    "top_tokens": {"a_only", "b_only"}, "budget": B, "seconds"}`` (``a_only``: kept by ``a``, not by ``b``)."""
    from .quality import capture_prefill, full_reference, prompt_and_continuation

    a, b = pair
    for lab in pair:
        if lab not in presses:
            raise ValueError(f"pair names {lab!r}, not a label of presses ({list(presses)})")
    t0 = time.perf_counter()
    prompt, cont = prompt_and_continuation(tokenizer, text, length, continuation, name=name)
    cap = capture_prefill(model, prompt)
    ref = full_reference(model, None, prompt, cont, capture=cap)
    kl = document_kl(model, tokenizer, text, length=length, continuation=continuation, presses=presses,
                     capture=(cap, ref, prompt, cont))
    n = prompt.shape[1]
    ka, kb = kept_positions(model, cap, presses[a]), kept_positions(model, cap, presses[b])
    ma, mb = kept_mask(ka, n), kept_mask(kb, n)
    tokens = [tokenizer.decode([t]) for t in prompt[0].tolist()]
    cats = token_categories(tokens)
    return {"kl": kl, "budget": int(ka.shape[-1]), "n_layers": int(ka.shape[0]), "n_heads": int(ka.shape[1]),
            "jaccard": jaccard_per_layer(ka, kb, n), "histogram": exclusive_histogram(ka, kb, n),
            "categories": {"a_only": category_counts(ma & ~mb, cats), "b_only": category_counts(mb & ~ma, cats),
                           "prompt": category_counts(torch.ones(1, n, dtype=torch.bool), cats)},
            "top_tokens": {"a_only": top_tokens(ma & ~mb, tokens), "b_only": top_tokens(mb & ~ma, tokens)},
            "seconds": round(time.perf_counter() - t0, 2)}
