"""The ragged cache: per layer, only the kept keys and values of each KV head, packed one after another.

A head-varying press (KVzip, KVgrad, ``AdaKVPress(...)``, CriticalAdaKV, the default ``JacapPress``) chooses a
different set of prompt tokens for every (layer, KV head). kvpress can only *mask* such a choice: it leaves the
dense ``(B, H, N, d)`` cache in place and sets ``module.masked_key_indices`` for its attention patch, so no byte is
freed. :func:`jacap_lib.cache.convert.to_ragged` turns that choice (or a boolean keep mask) into :class:`RaggedLayer` s, in place, in the
same ``Cache`` object: per layer the kept entries of head ``(b, h)`` are the rows
``packed[offsets[b H + h] : offsets[b H + h + 1]]`` of one ``(T, d)`` tensor, with their original positions; the
dense tensors are dropped and their storage freed. Tokens that come later (a question, decoded tokens) are appended
to every head, into a dense ``(B, H, t, d)`` tail.

The cache still reports the uncompressed length ``N + t`` (``get_seq_length``), so ``model.generate`` and the
model's position code put new tokens at the positions of the uncompressed sequence; the attention over it is
:mod:`jacap_lib.cache.attention`. :func:`cache_bytes` counts the bytes a cache holds (tensor storage).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["RaggedKV", "RaggedLayer", "RaggedCache", "cache_bytes", "is_ragged", "kept_per_head"]


class RaggedKV:
    """One layer's keys (or values) as the ragged attention reads them.

    Attributes
    ----------
    packed : Tensor (T, d)
        The kept prompt entries of every (batch, KV head), head after head (row-major over ``(b, h)``), each head's
        in ascending original position.
    offsets : LongTensor (B H + 1,)
        Head ``g = b H + h`` holds ``packed[offsets[g]:offsets[g + 1]]``.
    positions : IntTensor (T,)
        The original (uncompressed) position of each packed entry.
    tail : Tensor (B, H, t, d)
        The tokens appended after the compression, dense (every head holds all of them).
    n_prompt : int
        The prompt length the packed part was taken from (positions ``0 .. n_prompt - 1``).

    ``shape`` is the uncompressed shape ``(B, H, n_prompt + t, d)``; indexing the sequence axis, ``x[:, :, :n]``
    (how kvpress's pipeline trims an answer off), gives the entries at positions ``< n``.
    """

    __slots__ = ("packed", "offsets", "positions", "tail", "n_prompt")

    def __init__(self, packed, offsets, positions, tail, n_prompt: int):
        self.packed, self.offsets, self.positions, self.tail, self.n_prompt = packed, offsets, positions, tail, int(n_prompt)

    @property
    def batch(self) -> int:
        return int(self.tail.shape[0])

    @property
    def heads(self) -> int:
        return int(self.tail.shape[1])

    @property
    def lengths(self) -> torch.Tensor:
        """``(B, H)`` kept prompt entries per head."""
        return (self.offsets[1:] - self.offsets[:-1]).view(self.batch, self.heads)

    @property
    def shape(self) -> torch.Size:
        b, h, t, d = self.tail.shape
        return torch.Size((b, h, self.n_prompt + t, d))

    @property
    def dtype(self):
        return self.tail.dtype

    @property
    def device(self):
        return self.tail.device

    def head(self, b: int, h: int) -> torch.Tensor:
        """``(n_bh, d)``: the kept prompt entries of head ``(b, h)`` (a view of ``packed``)."""
        g = b * self.heads + h
        return self.packed[int(self.offsets[g]):int(self.offsets[g + 1])]

    def head_positions(self, b: int, h: int) -> torch.Tensor:
        g = b * self.heads + h
        return self.positions[int(self.offsets[g]):int(self.offsets[g + 1])]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.packed, self.offsets, self.positions, self.tail

    def to(self, device, non_blocking: bool = False) -> "RaggedKV":
        packed, offsets, positions, tail = (x.to(device, non_blocking=non_blocking) for x in self.tensors())
        return RaggedKV(packed, offsets, positions, tail, self.n_prompt)

    def truncated(self, length: int) -> "RaggedKV":
        """The entries at positions ``< length`` (the appended tail first; into the prompt, a re-pack)."""
        length = int(length)
        if length < 0:
            raise ValueError(f"`length` must be >= 0, got {length}")
        if length >= self.n_prompt:
            cut = length - self.n_prompt
            tail = self.tail if cut >= self.tail.shape[2] else self.tail[:, :, :cut].clone()  # a copy frees the rest
            return RaggedKV(self.packed, self.offsets, self.positions, tail, self.n_prompt)
        keep = self.positions < length
        segment = torch.repeat_interleave(torch.arange(self.batch * self.heads, device=self.offsets.device),
                                          self.offsets[1:] - self.offsets[:-1])
        counts = torch.bincount(segment[keep.to(segment.device)], minlength=self.batch * self.heads)
        offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        b, h, _, d = self.tail.shape
        return RaggedKV(self.packed[keep], offsets, self.positions[keep], self.tail.new_empty((b, h, 0, d)), length)

    def __getitem__(self, index) -> "RaggedKV":
        """Only a cut of the sequence axis: ``x[:, :, :n]``, ``x[:, :, :n, :]`` or ``x[..., :n, :]``."""
        index = index if isinstance(index, tuple) else (index,)
        full = slice(None)
        if len(index) >= 3 and index[0] == full and index[1] == full and all(i == full for i in index[3:4]) \
                and len(index) <= 4:
            cut = index[2]
        elif len(index) == 3 and index[0] is Ellipsis and index[2] == full:
            cut = index[1]
        else:
            cut = None
        if not isinstance(cut, slice) or cut.start not in (None, 0) or cut.step not in (None, 1):
            raise TypeError(f"a ragged layer's keys/values can only be cut along the sequence axis (x[:, :, :n]); "
                            f"got index {index!r}")
        total = self.shape[2]
        stop = total if cut.stop is None else (cut.stop if cut.stop >= 0 else total + cut.stop)
        return self.truncated(min(max(stop, 0), total))

    def __repr__(self):
        return (f"RaggedKV(batch={self.batch}, heads={self.heads}, n_prompt={self.n_prompt}, "
                f"kept={int(self.packed.shape[0])}, tail={int(self.tail.shape[2])}, d={int(self.tail.shape[3])})")


def _pack(dense: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed (T, d), offsets (B H + 1,), positions (T,) int32)`` of the True entries of ``keep (B, H, N)``."""
    packed = dense[keep]  # row-major over (b, h, n): each head's kept entries in ascending position, a new storage
    counts = keep.flatten(0, 1).sum(-1)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.long)
    positions = keep.nonzero()[:, 2].to(torch.int32)
    return packed, offsets, positions


class RaggedLayer(CacheLayerMixin):
    """A ``transformers`` cache layer holding each KV head's kept prompt entries (:class:`RaggedKV`) and a dense
    tail of the tokens appended since. ``update`` appends to every head and returns the two :class:`RaggedKV`,
    which only the ragged attention (:func:`jacap_lib.cache.attention.ragged_attention`) reads."""

    is_sliding = False
    is_compileable = False

    def __init__(self, keys: RaggedKV, values: RaggedKV):
        self.is_initialized = True
        self._keys, self._values = keys, values
        self.dtype, self.device = keys.dtype, keys.device

    @classmethod
    def from_dense(cls, keys: torch.Tensor, values: torch.Tensor, keep: torch.Tensor) -> "RaggedLayer":
        """From a dense layer's ``keys``/``values (B, H, N, d)`` and ``keep (B, H, N)`` bool."""
        if keys.ndim != 4 or values.shape[:3] != keys.shape[:3]:
            raise ValueError(f"keys and values must be (B, H, N, d) with the same (B, H, N); got {tuple(keys.shape)} "
                             f"and {tuple(values.shape)}")
        if keep.shape != keys.shape[:3] or keep.dtype != torch.bool:
            raise ValueError(f"`keep` must be a bool tensor of shape (B, H, N) = {tuple(keys.shape[:3])}; got "
                             f"{keep.dtype} {tuple(keep.shape)}")
        keep = keep.to(keys.device)
        pk, offsets, positions = _pack(keys, keep)
        pv = values[keep]
        b, h, n, d = keys.shape
        # empty tails of their own (a zero-length slice would be a view keeping the dense storage alive)
        return cls(RaggedKV(pk, offsets, positions, keys.new_empty((b, h, 0, d)), n),
                   RaggedKV(pv, offsets, positions, values.new_empty((b, h, 0, values.shape[-1])), n))

    # keys / values: the RaggedKV pair (kvpress's pipeline trims answers with ``layer.keys = layer.keys[:, :, :n]``)
    @property
    def keys(self) -> RaggedKV:
        return self._keys

    @keys.setter
    def keys(self, value):
        self._keys = self._checked(value, "keys")

    @property
    def values(self) -> RaggedKV:
        return self._values

    @values.setter
    def values(self, value):
        self._values = self._checked(value, "values")

    @staticmethod
    def _checked(value, name):
        if not isinstance(value, RaggedKV):
            raise TypeError(f"a RaggedLayer's {name} are a RaggedKV (cut them with {name}[:, :, :n]); a dense tensor "
                            f"cannot be set on it: build a new cache instead")
        return value

    def lazy_initialization(self, key_states, value_states) -> None:  # built initialised
        return None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs=None):
        k, v = self._keys, self._values
        if key_states.shape[:2] != k.tail.shape[:2] or key_states.shape[-1] != k.tail.shape[-1]:
            raise ValueError(f"new keys {tuple(key_states.shape)} do not match the ragged layer's (B, H, ., d) = "
                             f"{tuple(k.tail.shape)}")
        k.tail = torch.cat([k.tail, key_states.to(k.tail.dtype)], dim=-2)
        v.tail = torch.cat([v.tail, value_states.to(v.tail.dtype)], dim=-2)
        return k, v

    def get_seq_length(self) -> int:
        return self._keys.n_prompt + int(self._keys.tail.shape[2])

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.get_seq_length() + int(cache_position.shape[0]), 0

    def get_max_cache_shape(self) -> int:
        return -1

    def kept_lengths(self) -> torch.Tensor:
        """``(B, H)`` entries each head attends to: its kept prompt entries plus the appended tail."""
        return self._keys.lengths + int(self._keys.tail.shape[2])

    def crop(self, max_length: int) -> None:
        if max_length < 0:
            max_length = self.get_seq_length() - abs(max_length)
        if self.get_seq_length() <= max_length:
            return
        self._keys, self._values = self._keys.truncated(max_length), self._values.truncated(max_length)

    def offload(self):
        self._keys, self._values = self._keys.to("cpu", non_blocking=True), self._values.to("cpu", non_blocking=True)

    def prefetch(self):
        if self._keys.device != self.device:
            self._keys = self._keys.to(self.device, non_blocking=True)
            self._values = self._values.to(self.device, non_blocking=True)

    def reset(self) -> None:
        for kv in (self._keys, self._values):
            kv.packed.zero_()
            kv.tail = kv.tail[:, :, :0]

    def _batch_op(self, *_):
        raise NotImplementedError("a ragged cache does not reorder, repeat or select its batch (beam search, "
                                  "contrastive search): decode greedily or by sampling, or keep the masked cache")

    reorder_cache = batch_repeat_interleave = batch_select_indices = _batch_op

    def __repr__(self):
        return f"RaggedLayer({self._keys!r})"


class RaggedCache(Cache):
    """A ``transformers`` ``Cache`` of :class:`RaggedLayer` s (what :func:`~jacap_lib.cache.convert.to_ragged` turns a ``DynamicCache``'s
    layers into, in place; build one directly from dense ``(B, H, N, d)`` layers and keep masks with
    :meth:`from_dense`)."""

    def __init__(self, layers: list):
        super().__init__(layers=list(layers))

    @classmethod
    def from_dense(cls, keys: list, values: list, keep: torch.Tensor | list) -> "RaggedCache":
        """From per-layer dense ``keys[l], values[l] (B, H, N, d)`` and ``keep (L, B, H, N)`` bool."""
        if len(keys) != len(values) or len(keys) != len(keep):
            raise ValueError(f"keys, values and keep must have one entry per layer; got {len(keys)}, {len(values)}, "
                             f"{len(keep)}")
        return cls([RaggedLayer.from_dense(k, v, m) for k, v, m in zip(keys, values, keep)])


def is_ragged(cache) -> bool:
    """Whether any layer of ``cache`` is a :class:`RaggedLayer`."""
    return any(isinstance(layer, RaggedLayer) for layer in getattr(cache, "layers", ()))


def kept_per_head(cache) -> torch.Tensor:
    """``(L, B, H)`` entries each (layer, batch, KV head) attends to: a ragged layer's kept prompt entries plus its
    tail, a dense layer's length."""
    out = []
    for layer in cache.layers:
        if isinstance(layer, RaggedLayer):
            out.append(layer.kept_lengths())
        else:
            b, h, n = layer.keys.shape[:3]
            out.append(torch.full((b, h), n, dtype=torch.long))
    return torch.stack([o.cpu() for o in out])


def _storages(x) -> list[torch.Tensor]:
    if isinstance(x, RaggedKV):
        return list(x.tensors())
    if isinstance(x, torch.Tensor):
        return [x]
    return []


def cache_bytes(cache) -> int:
    """Bytes of tensor storage ``cache`` holds (keys, values and, for ragged layers, their offsets and positions),
    each storage counted once (``untyped_storage().nbytes()``: what the allocator holds, views included in full)."""
    seen, total = set(), 0
    for layer in getattr(cache, "layers", ()):
        for part in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            for t in _storages(part):
                if t.device.type == "meta":
                    continue
                storage = t.untyped_storage()
                key = (t.device, storage.data_ptr())
                if key in seen:
                    continue
                seen.add(key)
                total += storage.nbytes()
    return int(total)
