"""The kvpress compatibility grid: one registry press inside one kvpress wrapper, prefill + decoding.

Used by ``tests/test_kvpress_grid.py`` (and runnable as a script to print the whole grid):
``run_combo`` builds the wrapper around a fresh registry press, prefills a prompt under it, decodes a few
tokens (the press stays attached, as kvpress's pipeline does for decoding presses), and returns what
happened: the refusal kvpress raised, or the per-layer cache lengths after the prefill and after each
decoding step, the per-layer-and-head kept counts of masking wrappers (AdaKV), every score tensor the
scorer returned, and whether the logits stayed finite. ``expected_lengths`` says, from kvpress's own
rules (``compute_n_kept``, ``DecodingPress``'s schedule, ...), what the lengths must be.
"""
from __future__ import annotations

import kvpress
import torch
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

from jacap_lib.presses.registry import build_press

WRAPPERS = ["DecodingPress", "PrefillDecodingPress", "CAMPress", "ChunkPress", "ChunkKVPress", "AdaKVPress",
            "CriticalKVPress", "CriticalAdaKVPress", "KeyRerotationPress", "PerLayerCompressionPress",
            "ComposedPress", "BlockPress"]

RATIO = 0.5
INTERVAL, TARGET, BUFFER = 3, 24, 8  # decoding wrappers: compress every 3 steps down to 24 slots
CHUNK, BLOCK = 8, 16
STEPS = 7  # decoding steps after the prefill


def _scorer(name: str, ratio: float, small: bool):
    opts = {}
    if name.startswith("jacap") and small:
        opts["n_future_positions"] = 64
    if name == "snapkv":
        opts["window_size"] = 8  # kvpress default 64 is longer than the test prompts
    if name == "jacap_hybrid":
        opts["snap_window"] = 8
    return build_press(name, ratio, **opts)


def wrap(wrapper: str, name: str, n_layers: int, small: bool = True):
    """kvpress ``wrapper`` around a fresh registry press ``name`` (kvpress asserts on a refusal)."""
    s = lambda r=RATIO: _scorer(name, r, small)  # noqa: E731
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


def _decoding_schedule(start: int, cam: bool) -> list[int]:
    """Cache length after each decoding step under DecodingPress (cam=False) / CAMPress (cam=True)."""
    out, n, count = [], start, 0
    for _ in range(STEPS):
        n += 1
        count += 1
        if cam:
            if count >= INTERVAL and n > TARGET:
                n, count = TARGET, 0
        elif count >= INTERVAL:
            n, count = min(n, TARGET), 0
        out.append(n)
    return out


def expected_lengths(wrapper: str, prompt: int, n_layers: int) -> list[list[int]] | None:
    """Per layer: the cache length after the prefill, then after each decoding step (kvpress's rules)."""
    n = compute_n_kept(prompt, RATIO)
    grow = lambda m: [m + i for i in range(STEPS + 1)]  # noqa: E731
    if wrapper == "DecodingPress":
        return [[prompt] + _decoding_schedule(prompt, False)] * n_layers
    if wrapper == "PrefillDecodingPress":
        return [[n] + _decoding_schedule(n, False)] * n_layers
    if wrapper == "CAMPress":
        return [[prompt] + _decoding_schedule(prompt, True)] * n_layers
    if wrapper == "ChunkPress":
        kept = sum(max(1, int(min(CHUNK, prompt - i) * (1 - RATIO))) for i in range(0, prompt, CHUNK))
        return [grow(kept)] * n_layers
    if wrapper == "ChunkKVPress":  # prompt is a multiple of CHUNK: whole chunks kept
        return [grow(max(1, int(prompt // CHUNK * (1 - RATIO))) * CHUNK)] * n_layers
    if wrapper in ("AdaKVPress", "CriticalAdaKVPress"):  # masking: the tensors keep every slot
        return [grow(prompt)] * n_layers
    if wrapper in ("CriticalKVPress", "KeyRerotationPress", "BlockPress"):
        return [grow(n)] * n_layers
    if wrapper == "PerLayerCompressionPress":
        ratios = [1.0] + [0.25 if i % 2 else 0.75 for i in range(1, n_layers)]
        return [grow(compute_n_kept(prompt, r)) for r in ratios]
    if wrapper == "ComposedPress":
        return [grow(compute_n_kept(n, 0.25))] * n_layers
    raise ValueError(wrapper)


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


@torch.no_grad()
def run_combo(model, wrapper: str, name: str, prompt_ids: torch.Tensor, small: bool = True) -> dict:
    """Prefill ``prompt_ids (1, P)`` under ``wrapper(name)``, decode STEPS greedy tokens; what happened."""
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


if __name__ == "__main__":  # print the grid on the tiny Llama
    import sys

    sys.path.insert(0, "tests")
    from conftest import tiny_model

    from jacap_lib.presses.registry import list_methods

    arch = sys.argv[1] if len(sys.argv) > 1 else "llama"
    model = tiny_model(arch)
    ids = torch.randint(0, 96, (1, 48), generator=torch.Generator().manual_seed(0))
    for w in WRAPPERS:
        for name in list_methods():
            try:
                r = run_combo(model, w, name, ids)
            except Exception as err:  # noqa: BLE001
                print(f"{w:26s} {name:20s} CRASH {type(err).__name__}: {str(err)[:150]}")
                continue
            if "refused" in r:
                print(f"{w:26s} {name:20s} REFUSED[{r['stage']}] {r['refused'][:120]}")
                continue
            exp = expected_lengths(w, 48, model.config.num_hidden_layers)
            nan = sum(bool(torch.isnan(s).any()) for s in r["scores"])
            inf = sum(bool(torch.isinf(s).any()) for s in r["scores"])
            ok = r["lengths"] == exp
            print(f"{w:26s} {name:20s} len_ok={ok} n_scores={len(r['scores'])} nan={nan} inf={inf} "
                  f"finite_logits={r['finite_logits']}" + ("" if ok else f" got={r['lengths'][0]} exp={exp[0]}"))
