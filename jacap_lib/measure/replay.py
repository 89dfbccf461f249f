"""Teacher-forced decoding: the same tokens fed to a model with and without a decode-time controller, so
that their next-token distributions can be compared token by token."""
from __future__ import annotations

from contextlib import nullcontext

import torch

__all__ = ["replay"]


def replay(model, sequence: torch.Tensor, n_prompt: int, controller=None,
           *, progress: bool = False) -> torch.Tensor:
    """Teacher-forced decoding: feed ``sequence (1, T)`` to ``model`` -- the first ``n_prompt`` tokens in
    one forward, then one token per forward -- with ``controller`` attached (if given).

    Returns the float32 logits ``(T - n_prompt + 1, vocab)`` predicting tokens ``n_prompt .. T``, so two
    controllers (or none) can be compared on the *same* tokens, e.g. with :func:`kl_from_logits`.
    """
    from transformers import DynamicCache

    if not isinstance(sequence, torch.Tensor) or sequence.dim() != 2 or sequence.shape[0] != 1:
        raise ValueError(f"`sequence` must be a (1, T) tensor of token ids, got {getattr(sequence, 'shape', sequence)!r}")
    if sequence.is_floating_point() or sequence.dtype == torch.bool:
        raise ValueError(f"`sequence` must hold integer token ids, got dtype {sequence.dtype}")
    T = sequence.shape[1]
    if isinstance(n_prompt, bool) or not isinstance(n_prompt, int) or not 0 < n_prompt <= T:
        raise ValueError(f"`n_prompt` must lie in [1, T={T}], got {n_prompt}")
    cache = DynamicCache(config=model.config)
    steps = range(n_prompt, T)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="replay", leave=False)
    out = []
    ctx = controller if controller is not None else nullcontext()
    with ctx, torch.no_grad():
        logits = model(input_ids=sequence[:, :n_prompt], past_key_values=cache).logits[:, -1]
        out.append(logits.float())
        for t in steps:
            pos = torch.tensor([t], device=sequence.device)
            logits = model(input_ids=sequence[:, t:t + 1], past_key_values=cache, cache_position=pos,
                           position_ids=pos[None]).logits[:, -1]
            out.append(logits.float())
    return torch.cat(out, 0)
