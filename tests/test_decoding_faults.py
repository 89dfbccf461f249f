"""Fault injection on the decode controller (Algorithm 2): a Cholesky failure, a deadline, NaN in the
cache, an exception inside the eviction hook.

After each fault, generation either goes on (Cholesky failure and deadline: the affected layers fall
back to a sliding window, checked position by position against the window computed here) or stops
with a clear error (NaN, a raising hook) -- and then the cache and the controller's bookkeeping are
byte-identical to what they were before the failed eviction, and a retry without the fault gives
exactly what a run that never failed gives. Runs on a tiny random GQA Llama (2 layers, no download).
"""
from __future__ import annotations

import warnings

import pytest
import torch

from jacap_lib.controller import JacapDecodeController
from jacap_lib.controller import decode as decoding  # the module whose clock, scorer and selector are faked
from jacap_lib.measure.replay import replay
from jacap_lib.scoring import CholeskyFailure

N_PROMPT, HIGH, BUDGET, INTERVAL, N_SINK, WINDOW = 40, 48, 32, 4, 2, 8


def _controller(model, **kw):
    return JacapDecodeController(model, high=HIGH, budget=BUDGET, interval=INTERVAL, n_sink=N_SINK, window=WINDOW,
                                 record_kept=True, **kw)


def _sequence(model, T=90, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (1, T), generator=g)


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().numpy().tobytes()


def _snapshot(ctrl: JacapDecodeController) -> dict:
    """Every byte the eviction may change: keys/values of each layer, positions, slot validity, events."""
    cache = ctrl._cache
    return {"kv": [(_bytes(l.keys), _bytes(l.values), tuple(l.keys.shape)) for l in cache.layers],
            "positions": {k: _bytes(v) for k, v in ctrl._positions.items()},
            "slot_valid": _bytes(ctrl._slot_valid), "n_events": len(ctrl.events), "seq_len": ctrl._seq_len}


def _prefill(model, ctrl, seq, n=N_PROMPT - 8):
    """Prompt of n tokens with the controller attached; n + INTERVAL <= HIGH, so no eviction yet."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=seq[:, :n], past_key_values=cache)
        for t in range(n, N_PROMPT):  # decode steps up to N_PROMPT cached tokens (looks see 36, 40 < 44+)
            pos = torch.tensor([t])
            model(input_ids=seq[:, t:t + 1], past_key_values=cache, cache_position=pos, position_ids=pos[None])
    return cache


def _window_positions(n_real: int) -> list[int]:
    """The sliding-window fallback: the first n_sink positions and the most recent budget - n_sink ones."""
    return list(range(N_SINK)) + list(range(n_real - (BUDGET - N_SINK), n_real))


# ----------------------------------------------------------------------------- Cholesky failure
def test_cholesky_failure_falls_back_on_that_layer_and_generation_goes_on(tiny_llama, monkeypatch):
    model = tiny_llama
    seq = _sequence(model)
    real = decoding._scoring.validated_scores
    calls = []

    def flaky(*args, **kw):  # the second scoring call of the run is layer 1 of the first eviction
        calls.append(1)
        if len(calls) == 2:
            raise CholeskyFailure("injected: A is not positive definite")
        return real(*args, **kw)

    monkeypatch.setattr(decoding._scoring, "validated_scores", flaky)
    ctrl = _controller(model)
    with pytest.warns(RuntimeWarning, match="Cholesky failed at layer 1"):
        logits = replay(model, seq, N_PROMPT, ctrl)
    first = ctrl.events[0]
    assert first.method == "mixed" and first.fallback_layers == [1] and "injected" in first.fallback_reason
    window = torch.tensor(_window_positions(first.seq_len))
    assert (first.kept_positions[1][0] == window).all()  # every KV head of layer 1 kept the window
    assert not all((first.kept_positions[0][0, h] == window).all() for h in range(2))  # layer 0 scored by Jacap
    # generation went on: later evictions are Jacap again, the cache stays within `high`, logits are finite
    assert all(ev.method == "jacap" for ev in ctrl.events[1:]) and len(ctrl.events) >= 3
    assert max(slots for _, _, slots in ctrl.trace) <= HIGH
    assert logits.shape[0] == seq.shape[1] - N_PROMPT + 1 and torch.isfinite(logits).all()


# ----------------------------------------------------------------------------- deadline
class _Clock:
    """perf_counter that advances `step` seconds per reading."""

    def __init__(self, step):
        self.t, self.step = 0.0, step

    def perf_counter(self):
        self.t += self.step
        return self.t


def test_deadline_falls_back_on_the_layers_it_did_not_reach(tiny_llama, monkeypatch):
    model = tiny_llama
    seq = _sequence(model, seed=1)
    # readings: t0, then one before each layer -> 0.3 s before layer 0, 0.6 s before layer 1 (deadline 0.5 s)
    monkeypatch.setattr(decoding, "time", _Clock(0.3))
    ctrl = _controller(model, deadline_s=0.5)
    with pytest.warns(RuntimeWarning, match="deadline of 0.5 s exceeded before layer 1"):
        logits = replay(model, seq, N_PROMPT, ctrl)
    for ev in ctrl.events:
        assert ev.fallback_layers == [1] and ev.method == "mixed"
    first = ctrl.events[0]
    assert (first.kept_positions[1][0] == torch.tensor(_window_positions(first.seq_len))).all()
    assert torch.isfinite(logits).all() and max(slots for _, _, slots in ctrl.trace) <= HIGH


# ----------------------------------------------------------------------------- NaN in the cache
def test_nan_in_the_cache_stops_with_an_error_and_leaves_the_cache_as_it_was(tiny_llama):
    model = tiny_llama
    seq = _sequence(model, seed=2)
    ctrl = _controller(model)
    with ctrl:
        cache = _prefill(model, ctrl, seq)
    assert cache.get_seq_length() == N_PROMPT and not ctrl.events
    cache.layers[1].keys[0, 1, 20, 3] = float("nan")
    before = _snapshot(ctrl)
    with pytest.raises(ValueError, match=r"`keys` contains 1 NaN/Inf"):
        ctrl.evict()
    assert _snapshot(ctrl) == before
    # ... and inside generation the same error stops the forward that would have evicted
    with ctrl, pytest.raises(ValueError, match="keys"), torch.no_grad():
        for t in range(N_PROMPT, N_PROMPT + 4 * INTERVAL):  # the next look that evicts raises
            pos = torch.tensor([t])
            model(input_ids=seq[:, t:t + 1], past_key_values=cache, cache_position=pos, position_ids=pos[None])
    assert not ctrl.events


# ----------------------------------------------------------------------------- exception inside the eviction hook
@pytest.mark.parametrize("where", ["select_keep", "entropy"])
def test_exception_inside_the_eviction_leaves_everything_as_it_was(tiny_llama, monkeypatch, where):
    """A failure while planning (select_keep of the last layer) or measuring (the entropy of the kept set):
    the error comes out unchanged, nothing is committed, and a retry equals a run that never failed."""
    model = tiny_llama
    seq = _sequence(model, seed=3)
    ref = _controller(model)  # the run that never fails
    with ref:
        ref_cache = _prefill(model, ref, seq)
    ref.evict()

    ctrl = _controller(model)
    with ctrl:
        cache = _prefill(model, ctrl, seq)
    before = _snapshot(ctrl)
    if where == "select_keep":
        real = decoding._select.select_keep
        calls = []

        def broken(*a, **kw):
            calls.append(1)
            if len(calls) == 2:  # layer 1, after layer 0 was planned
                raise RuntimeError("injected failure in select_keep")
            return real(*a, **kw)

        monkeypatch.setattr(decoding._select, "select_keep", broken)
    else:
        monkeypatch.setattr(JacapDecodeController, "_entropy",
                            lambda self, *a: (_ for _ in ()).throw(RuntimeError("injected failure in _entropy")))
    with pytest.raises(RuntimeError, match="injected failure"):
        ctrl.evict()
    assert _snapshot(ctrl) == before
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the retry is a plain Jacap eviction
        ev = ctrl.evict()
    assert ev.method == "jacap"
    for a, b in zip(cache.layers, ref_cache.layers):
        assert _bytes(a.keys) == _bytes(b.keys) and _bytes(a.values) == _bytes(b.values)
    for layer in range(2):
        assert torch.equal(ctrl.positions(layer), ref.positions(layer))
    # and generation goes on from the retried eviction
    with ctrl, torch.no_grad():
        pos = torch.tensor([N_PROMPT])
        out = model(input_ids=seq[:, N_PROMPT:N_PROMPT + 1], past_key_values=cache, cache_position=pos,
                    position_ids=pos[None]).logits
    assert torch.isfinite(out).all() and cache.get_seq_length() == BUDGET + 1
