"""inspect_eviction: kept positions read from the cache agree with an independent selection from the
recorded scores, and the recorded Jacap components satisfy Algorithm 1's identities."""
from __future__ import annotations

import pytest
import torch
from kvpress.utils import compute_n_kept

from jacap_lib.measure.eviction import inspect_eviction, kept_indices
from jacap_lib.selection import select_keep

TEXT = (
    "Maria keeps her bicycle in the blue shed behind the bakery. Every Tuesday she rides it to the market, "
    "buys three lemons and a loaf of rye bread, and visits her brother Tomas, who repairs old clocks."
)


def test_kept_indices_recovers_a_permuted_subset():
    torch.manual_seed(0)
    full = torch.randn(1, 2, 20, 8)
    chosen = torch.stack([torch.randperm(20)[:7], torch.randperm(20)[:7]])[None]  # (1, 2, 7), unordered
    kept = full.gather(2, chosen.unsqueeze(-1).expand(1, 2, 7, 8))
    assert torch.equal(kept_indices(full, kept), chosen.sort(-1).values)
    with pytest.raises(RuntimeError, match="do not match"):
        kept_indices(full, kept + 1e-3)


@pytest.fixture(scope="module")
def model_tok():
    from jacap_lib import load_model

    return load_model()


@pytest.mark.model
def test_inspect_jacap_records_consistent_components(model_tok):
    model, tok = model_tok
    res = inspect_eviction(model, tok, TEXT, "jacap", 0.6, window=5)
    N = res.n_tokens
    budget = compute_n_kept(N, 0.6)
    assert res.kept.shape == (30, 3, budget) and len(res.tokens) == N
    assert "".join(res.tokens) == TEXT
    # the kept positions (read back from the cache) = an independent top-B of the recorded score
    assert torch.equal(res.kept, select_keep(res.score, budget, n_sink=4, window=5))
    assert torch.allclose(res.keep_fraction().mean(), torch.tensor(budget / N))
    # Algorithm 1 identities on the recorded components
    torch.testing.assert_close(res.alpha.sum(-1), torch.ones(30, 3))
    torch.testing.assert_close(res.rho, res.alpha * (1 - res.alpha))
    torch.testing.assert_close(res.weight, res.rho.square() * res.kappa / 64)
    torch.testing.assert_close(res.score, res.weight * res.leverage)
    frame = res.to_frame()
    assert len(frame) == 30 * 3 * N and frame["kept"].sum() == 30 * 3 * budget


@pytest.mark.model
def test_inspect_baseline_records_score_only(model_tok):
    model, tok = model_tok
    res = inspect_eviction(model, tok, TEXT, "knorm", 0.5)
    budget = compute_n_kept(res.n_tokens, 0.5)
    assert torch.equal(res.kept, select_keep(res.score, budget, n_sink=0))
    assert res.alpha is None
    with pytest.raises(ValueError, match="not recorded"):
        res.component("alpha")
    with pytest.raises(ValueError, match="unknown method"):
        inspect_eviction(model, tok, TEXT, "nope", 0.5)


@pytest.mark.model
def test_inspect_refuses_masking_presses(model_tok):
    from kvpress import AdaKVPress

    from jacap_lib.presses.jacap import JacapPress

    model, tok = model_tok
    with pytest.raises(ValueError, match="masking"):
        inspect_eviction(model, tok, TEXT, AdaKVPress(press=JacapPress(0.5)))
