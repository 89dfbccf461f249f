r"""The Triton ragged-decode kernel: one query token against each KV head's packed keys and values.

Program ``p = b H_q + j`` (query head ``j`` of batch ``b``; GQA: its KV head is ``g = p // G``) walks the rows
``offsets[g] .. offsets[g + 1]`` of the packed ``(T, d)`` keys in tiles of ``BLOCK_N``, keeping the online-softmax
state (running max :math:`m`, sum :math:`\ell`, weighted values), and writes the normalised output and
:math:`\log\sum e^{s} = m + \log \ell` (``-inf`` for a head with no kept entry) in float32, which
:func:`jacap_lib.cache.attention.ragged_attention_torch` merges with the tail.

CUDA tensors run the compiled kernel; CPU tensors run it in the Triton interpreter (``TRITON_INTERPRET=1`` set
before triton is first imported: how it is tested without a GPU). Triton is imported on the first launch.
"""
from __future__ import annotations

import torch

__all__ = ["triton_ragged_decode", "ragged_decode_torch"]

_KERNEL = {}


def _kernel(device_type: str):
    import triton

    from ..scoring.triton.launch import interpreter_active

    if device_type == "cpu" and not interpreter_active():
        raise ValueError("CPU tensors run the ragged-decode kernel only in the Triton interpreter: set "
                         "TRITON_INTERPRET=1 before triton is first imported, or pass CUDA tensors")
    if device_type not in _KERNEL:
        from ._triton_kernel import ragged_decode_kernel

        _KERNEL[device_type] = triton.jit(ragged_decode_kernel)
    return _KERNEL[device_type]


def _check(query, packed_keys, packed_values, offsets):
    if query.ndim != 2 or packed_keys.ndim != 2 or packed_values.ndim != 2:
        raise ValueError(f"query must be (B H_q, d) and packed keys/values (T, d); got {tuple(query.shape)}, "
                         f"{tuple(packed_keys.shape)}, {tuple(packed_values.shape)}")
    if packed_keys.shape[0] != packed_values.shape[0] or packed_keys.shape[1] != query.shape[1]:
        raise ValueError(f"packed keys {tuple(packed_keys.shape)} must match the values' rows and the query's d")
    groups = offsets.numel() - 1
    if groups < 1 or query.shape[0] % groups:
        raise ValueError(f"query rows ({query.shape[0]}) must be a multiple of the heads in `offsets` ({groups})")
    return query.shape[0] // groups


def ragged_decode_torch(query, packed_keys, packed_values, offsets, scale: float):
    """The kernel's contract in torch: ``(out (B H_q, d_v), lse (B H_q,))`` float32 of each query row over its KV
    head's packed rows (GQA: row ``p`` reads head ``p // G``)."""
    G = _check(query, packed_keys, packed_values, offsets)
    out = query.new_zeros(query.shape[0], packed_values.shape[1], dtype=torch.float32)
    lse = query.new_full((query.shape[0],), float("-inf"), dtype=torch.float32)
    for g in range(offsets.numel() - 1):
        a, b = int(offsets[g]), int(offsets[g + 1])
        if b == a:
            continue
        rows = slice(g * G, (g + 1) * G)
        s = (query[rows].float() @ packed_keys[a:b].float().T) * scale
        lse[rows] = torch.logsumexp(s, -1)
        out[rows] = torch.softmax(s, -1) @ packed_values[a:b].float()
    return out, lse


def triton_ragged_decode(query, packed_keys, packed_values, offsets, scale: float, *, block_n: int = 64):
    """:func:`ragged_decode_torch` by the Triton kernel (compiled on CUDA tensors, interpreted on CPU ones)."""
    import triton

    G = _check(query, packed_keys, packed_values, offsets)
    query, packed_keys, packed_values = query.contiguous(), packed_keys.contiguous(), packed_values.contiguous()
    offsets = offsets.to(device=query.device, dtype=torch.int64).contiguous()
    rows, D = query.shape
    DV = packed_values.shape[1]
    out = torch.empty(rows, DV, dtype=torch.float32, device=query.device)
    lse = torch.empty(rows, dtype=torch.float32, device=query.device)
    if rows == 0:
        return out, lse
    _kernel(query.device.type)[(rows,)](
        query, packed_keys, packed_values, offsets, out, lse, float(scale), G=G, D=D, DV=DV,
        BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(D), BLOCK_DV=triton.next_power_of_2(DV))
    return out, lse
