"""Bad and edge input to the default press ``JacapPress`` (kvpress KVzip's second reading): a prompt too short to
compress is kept whole, a padded batch is refused with the fix, a tokenizer kvpress cannot find by the model's name
gets a ValueError that says how to give it. Each failing call leaves the cache as the prefill wrote it and no mask
on the model. Before the fixes: a one-token prompt raised ``RuntimeError: output with shape [1, 3, 1] doesn't
match the broadcast shape [1, 3, 4]``; a batch of two ``RuntimeError: Sizes of tensors must match except in
dimension 1``; an unknown name kvpress's ``OSError`` about repository ids."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.model

TEXT = "Maria keeps her bicycle in the blue shed behind the bakery, every single day of the week."


def _prefill(model, ids, press=None, **kw):
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        if press is None:
            model.model(input_ids=ids, past_key_values=cache, **kw)
        else:
            with press(model):
                model.model(input_ids=ids, past_key_values=cache, **kw)
    return cache


def _same_cache(a, b) -> bool:
    return len(a.layers) == len(b.layers) and all(
        torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(a.layers, b.layers))


def _no_masks(model) -> bool:
    return all(getattr(layer.self_attn, "masked_key_indices", None) is None for layer in model.model.layers)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_a_prompt_too_short_to_compress_is_kept_whole(bundled, n):
    """n <= n_sink (4), or a budget n_kept(n, 0.5) that the 4 sinks fill: the cache after the default press is the
    uncompressed prefill's, exactly, and the next token's logits from it are the uncompressed model's."""
    from jacap_lib import JacapPress

    model, tok = bundled
    ids = tok(TEXT, return_tensors="pt").input_ids[:, :n]
    full, pressed = _prefill(model, ids), _prefill(model, ids, JacapPress(0.5))
    assert _same_cache(full, pressed) and _no_masks(model)
    nxt = tok(" and", return_tensors="pt", add_special_tokens=False).input_ids[:, :1]
    with torch.inference_mode():  # the next token's logits from either cache: the same, exactly
        want = model(input_ids=nxt, past_key_values=full).logits
        got = model(input_ids=nxt, past_key_values=pressed).logits
    assert torch.equal(want, got)


def test_a_padded_batch_is_refused_and_the_cache_left_as_prefilled(bundled):
    from jacap_lib import JacapPress

    model, tok = bundled
    rows = [tok(t).input_ids for t in ("A short prompt.", "A much longer prompt about the history of the bicycle.")]
    width, pad = max(map(len, rows)), tok.eos_token_id  # left-padded by hand: the tokenizer names no pad token
    enc = type("Batch", (), {})()
    enc.input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    enc.attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    full = _prefill(model, enc.input_ids, attention_mask=enc.attention_mask)
    from transformers import DynamicCache

    cache = DynamicCache()
    with pytest.raises(ValueError, match="JacapPress compresses one prompt at a time.*got a batch of 2 prompts: run "
                                         "them one by one"):
        with torch.inference_mode(), JacapPress(0.5)(model):
            model.model(input_ids=enc.input_ids, attention_mask=enc.attention_mask, past_key_values=cache)
    assert _same_cache(full, cache) and _no_masks(model)


def test_a_tokenizer_not_found_by_name_says_how_to_give_one(bundled):
    from jacap_lib import JacapPress

    model, tok = bundled
    ids = tok(TEXT, return_tensors="pt").input_ids
    name, model.config.name_or_path = model.config.name_or_path, "/nonexistent/tokenizer-folder"
    try:
        with pytest.raises(ValueError, match=r"needs the model's tokenizer.*'/nonexistent/tokenizer-folder'.*"
                                             r"tokenizer.save_pretrained\(folder\).*model.config.name_or_path = folder"):
            _prefill(model, ids, JacapPress(0.5))
    finally:
        model.config.name_or_path = name
    assert _no_masks(model)
    assert _prefill(model, ids, JacapPress(0.5)).get_seq_length() == ids.shape[1]  # the real name still works
