"""The kvpress compatibility grid: one registry press inside one kvpress wrapper, prefill + decoding.

:func:`run_combo` builds kvpress ``wrapper`` around a fresh registry press, prefills a prompt under it,
decodes a few tokens (the press stays attached, as kvpress's pipeline does for decoding presses) and
returns what happened: the refusal kvpress raised, or the per-layer cache lengths after the prefill and
after each decoding step, the per-layer-and-head masked counts of masking wrappers (AdaKV), every score
tensor the scorer returned, and whether the logits stayed finite. :func:`known_refusal` says which
combinations kvpress refuses and how. :func:`tiny_model` builds the random GQA models the grid runs on (no
download; the book's page and the tests use it). ``tests/test_kvpress_grid.py`` asserts all of it, with the
lengths kvpress's own rules (``compute_n_kept``, ``DecodingPress``'s schedule, ...) say there must be; the
book's "Use Jacap from kvpress" page runs :func:`grid_table` on the Jacap family.
"""
from __future__ import annotations

import kvpress
import torch
from transformers import DynamicCache

from jacap_lib.presses.registry import build_press, parse_method

WRAPPERS = ["DecodingPress", "PrefillDecodingPress", "CAMPress", "ChunkPress", "ChunkKVPress", "AdaKVPress",
            "CriticalKVPress", "CriticalAdaKVPress", "KeyRerotationPress", "PerLayerCompressionPress",
            "ComposedPress", "BlockPress"]

__all__ = ["WRAPPERS", "DECODING", "jacap_scorers", "tiny_model", "wrap", "known_refusal", "run_combo", "masked_counts",
           "grid_table"]

RATIO = 0.5
INTERVAL, TARGET, BUFFER = 3, 24, 8  # decoding wrappers: compress every 3 steps down to 24 slots
CHUNK, BLOCK = 8, 16
STEPS = 7  # decoding steps after the prefill


def tiny_model(arch: str = "llama", *, layers: int = 2, seed: int = 0):
    """A random ``LlamaForCausalLM`` / ``Qwen3ForCausalLM``: hidden 64, 4 query heads sharing 2 KV heads
    (GQA, G = 2), head_dim 16, vocabulary 96, SDPA attention, eval mode, float32; ``seed`` fixes the weights."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if arch not in ("llama", "qwen3"):
        raise ValueError(f"arch must be 'llama' or 'qwen3', got {arch!r}")
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                  attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**common)) if arch == "llama" else Qwen3ForCausalLM(Qwen3Config(**common))
    return model.eval()


def _scorer(spec: str, ratio: float, small: bool):
    """A fresh press for a registry name or spec (``name[key=value]``; its options override the small-prompt ones)."""
    name, given = parse_method(spec)
    opts = {}
    if name.startswith("jacap") and small:
        opts["n_future_positions"] = 64
    if name == "snapkv":
        opts["window_size"] = 8  # kvpress default 64 is longer than the test prompts
    return build_press(name, ratio, **{**opts, **given})


def wrap(wrapper: str | None, name: str, n_layers: int, small: bool = True):
    """kvpress ``wrapper`` around a fresh registry press ``name`` (a name or a spec ``name[key=value]``; kvpress
    asserts on a refusal); ``None``: the registry press alone (``jacap_prompt_adakv`` is a kvpress wrapper
    itself)."""
    s = lambda r=RATIO: _scorer(name, r, small)  # noqa: E731
    if wrapper is None:
        return s()
    if wrapper == "DecodingPress":
        return kvpress.DecodingPress(base_press=s(0.0), compression_interval=INTERVAL, target_size=TARGET,
                                     hidden_states_buffer_size=BUFFER)
    if wrapper == "PrefillDecodingPress":
        return kvpress.PrefillDecodingPress(
            prefilling_press=s(), decoding_press=kvpress.DecodingPress(
                base_press=s(0.0), compression_interval=INTERVAL, target_size=TARGET, hidden_states_buffer_size=BUFFER))
    if wrapper == "CAMPress":
        return kvpress.CAMPress(base_press=s(0.0), compression_interval=INTERVAL, target_size=TARGET,
                                hidden_states_buffer_size=BUFFER, merge_budget=4)
    if wrapper == "ChunkPress":
        return kvpress.ChunkPress(press=s(), chunk_length=CHUNK)
    if wrapper == "ChunkKVPress":
        return kvpress.ChunkKVPress(press=s(), chunk_length=CHUNK)
    if wrapper == "AdaKVPress":
        return kvpress.AdaKVPress(press=s())
    if wrapper == "CriticalKVPress":
        return kvpress.CriticalKVPress(press=s())
    if wrapper == "CriticalAdaKVPress":
        return kvpress.CriticalAdaKVPress(press=s())
    if wrapper == "KeyRerotationPress":
        return kvpress.KeyRerotationPress(press=s())
    if wrapper == "PerLayerCompressionPress":  # layer 0 dropped whole (ratio 1.0), the others 0.25 / 0.75
        ratios = [1.0] + [0.25 if i % 2 else 0.75 for i in range(1, n_layers)]
        return kvpress.PerLayerCompressionPress(press=s(), compression_ratios=ratios)
    if wrapper == "ComposedPress":
        return kvpress.ComposedPress([s(), kvpress.KnormPress(compression_ratio=0.25)])
    if wrapper == "BlockPress":
        return kvpress.BlockPress(press=s(), block_size=BLOCK)
    raise ValueError(f"unknown wrapper {wrapper!r}")


def _record_scores(press, store: list):
    """Record every score tensor of the innermost scorer(s) (instance attribute shadows the method)."""
    seen = set()
    stack = [press]
    while stack:
        p = stack.pop()
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        for attr in ("press", "base_press", "prefilling_press", "decoding_press"):
            stack.append(getattr(p, attr, None))
        stack.extend(getattr(p, "presses", None) or [])
        if isinstance(p, kvpress.ScorerPress) and not isinstance(p, kvpress.CriticalKVPress):
            original = p.score

            def score(*args, _original=original, **kwargs):
                out = _original(*args, **kwargs)
                store.append(out.detach().clone())
                return out

            p.score = score


def masked_counts(model) -> list | None:
    """Per layer ``(H_kv,)`` number of masked slots set by a masking wrapper (AdaKV), or None."""
    out = []
    for layer in model.model.layers:
        idx = getattr(layer.self_attn, "masked_key_indices", None)
        if idx is None:
            return None
        heads = idx[1]
        out.append(torch.bincount(heads, minlength=model.config.num_key_value_heads).tolist())
    return out


def run_combo(model, wrapper: str | None, name: str, prompt_ids: torch.Tensor, small: bool = True, *,
              grad: bool = False) -> dict:
    """Prefill ``prompt_ids (1, P)`` under ``wrapper(name)``, decode STEPS greedy tokens; what happened.

    ``grad=True`` runs the model with autograd on, as kvpress's own tests do (its parameters require grad),
    so the press sees hidden states, keys and values that require grad."""
    with torch.set_grad_enabled(grad):
        return _run_combo(model, wrapper, name, prompt_ids, small)


def _run_combo(model, wrapper, name, prompt_ids, small):
    n_layers = model.config.num_hidden_layers
    try:
        press = wrap(wrapper, name, n_layers, small)
    except AssertionError as err:
        return {"refused": f"AssertionError: {err}", "stage": "construct"}
    scores: list = []
    _record_scores(press, scores)
    for layer in model.model.layers:  # a previous masking press leaves its indices on the modules
        layer.self_attn.masked_key_indices = None
    cache = DynamicCache()
    lengths = [[] for _ in range(n_layers)]
    finite = True
    try:
        with press(model):
            out = model(input_ids=prompt_ids, past_key_values=cache)
            masked = masked_counts(model)
            for i in range(n_layers):
                lengths[i].append(cache.layers[i].keys.shape[2])
            finite &= bool(torch.isfinite(out.logits).all())
            token = out.logits[:, -1:].argmax(-1)
            for t in range(prompt_ids.shape[1], prompt_ids.shape[1] + STEPS):
                pos = torch.tensor([t])
                out = model(input_ids=token, past_key_values=cache, cache_position=pos, position_ids=pos[None])
                finite &= bool(torch.isfinite(out.logits).all())
                token = out.logits[:, -1:].argmax(-1)
                for i in range(n_layers):
                    lengths[i].append(cache.layers[i].keys.shape[2])
    except AssertionError as err:
        return {"refused": f"AssertionError: {err}", "stage": "run"}
    finally:
        for layer in model.model.layers:
            layer.self_attn.masked_key_indices = None
    return {"lengths": lengths, "masked": masked, "scores": scores, "finite_logits": finite}


REGISTRY_WRAPPERS = {"jacap_prompt_adakv": "AdaKVPress"}
NEEDS_SCORER = {"ChunkPress", "ChunkKVPress", "AdaKVPress", "CriticalKVPress", "CriticalAdaKVPress",
                "KeyRerotationPress", "PerLayerCompressionPress", "BlockPress"}
DECODING = {"DecodingPress", "PrefillDecodingPress", "CAMPress"}


def known_refusal(wrapper: str, name: str):
    """``(exception type, message regex, reason)`` kvpress answers this combination with, or None if it runs.

    * the registry's wrapper variant (``jacap_prompt_adakv`` is an ``AdaKVPress``) in wrappers that assert a
      ``ScorerPress`` inside (use ``press.press``, the ``JacapPromptPress`` within, there);
    * ``ComposedPress`` refuses ``AdaKVPress`` by design; ``CAMPress`` admits ``AdaKVPress`` through
      ``DecodingPress``'s type check but then calls its missing ``score``;
    * kvpress SnapKV asserts more queries than its window (a decoding buffer or a chunk has fewer).
    """
    if name in REGISTRY_WRAPPERS:
        if wrapper in NEEDS_SCORER:  # kvpress asserts isinstance(press, ScorerPress) (KeyRerotation: no message)
            return (AssertionError, r"ScorerPress|compression_ratio can't be set|^AssertionError: $",
                    "kvpress asserts a ScorerPress inside; wrap the JacapPromptPress (press.press) instead")
        if name == "jacap_prompt_adakv" and wrapper == "ComposedPress":
            return AssertionError, "ComposedPress cannot contains AdaKVPress", "kvpress refuses AdaKVPress in a ComposedPress"
        if name == "jacap_prompt_adakv" and wrapper == "CAMPress":
            return (AttributeError, "'AdaKVPress' object has no attribute 'score'",
                    "CAMPress admits AdaKVPress but calls its (missing) score()")
    if name == "snapkv" and (wrapper in DECODING or wrapper == "ChunkPress"):
        return (AssertionError, "should be greater than the window size",
                "SnapKV needs more queries than its window (8 here)")
    return None


def jacap_scorers() -> list[str]:
    """The Jacap-family registry names a kvpress wrapper can hold: every ``jacap*`` method but those scored after the
    prefill with a second pass over the context (``registry.RECONSTRUCTION_METHODS``: ``jacap``)."""
    from jacap_lib.presses.registry import RECONSTRUCTION_METHODS, list_methods

    return [m for m in list_methods("jacap") if m not in RECONSTRUCTION_METHODS]


def grid_table(model, names, wrappers=WRAPPERS, prompt_len: int = 48, seed: int = 0) -> list[dict]:
    """Run every ``names`` x ``wrappers`` combination on ``model``; one row per combination:
    ``{"wrapper", "press", "outcome": "works" | "refused" | "NaN scores", "detail"}``.

    The tiny prompt's budgets are smaller than Jacap's sinks plus its default recent window, so its presses
    shrink the window; their warning about it is not shown here (the grid is about which wrappers work)."""
    import re
    import warnings

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    rows = []
    for wrapper in wrappers:
        for name in names:
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="JacapPromptPress: the budget", category=RuntimeWarning)
                    r = run_combo(model, wrapper, name, ids)
            except (AttributeError, IndexError) as err:
                r = {"refused": f"{type(err).__name__}: {err}"}
            if "refused" in r:
                known = known_refusal(wrapper, name)
                detail = known[2] if known and re.search(known[1], r["refused"]) else r["refused"]
                rows.append({"wrapper": wrapper, "press": name, "outcome": "refused", "detail": detail})
            elif any(bool(torch.isnan(s).any()) for s in r["scores"]):
                rows.append({"wrapper": wrapper, "press": name, "outcome": "NaN scores",
                             "detail": "scores are NaN (no error)"})
            else:
                lengths = r["lengths"]
                rows.append({"wrapper": wrapper, "press": name, "outcome": "works",
                             "detail": f"cache {lengths[-1][0]} -> {lengths[-1][-1]} slots (last layer)"})
    return rows
