"""jacap_pyramid: the per-layer budget schedule and what it does to the bundled model's cache."""
import pytest
import torch

pytest.importorskip("kvpress")
from kvpress.utils import compute_n_kept  # noqa: E402

from jacap_lib.presses.jacap import JacapPress  # noqa: E402
from jacap_lib.presses.jacap_pyramid import JacapPyramidPress, pyramid_ratios  # noqa: E402
from jacap_lib.presses.registry import build_press, list_methods  # noqa: E402

CASES = [(c, n, s) for c in (0.0, 0.3, 0.5, 0.75, 0.9, 0.97) for n in (2, 7, 30) for s in (0.0, 0.5, 1.0, 3.0, -0.5, -2.0)]


@pytest.mark.parametrize("c,n,slope", CASES)
def test_schedule_mean_monotone_bounds(c, n, slope):
    r = pyramid_ratios(c, n, slope)
    assert len(r) == n
    assert abs(sum(r) / n - c) < 1e-12
    assert all(0.0 <= x <= 0.99 for x in r)
    sign = 1 if slope >= 0 else -1  # slope >= 0: lower layers keep more (smaller ratio); < 0: inverted
    assert all(sign * (b - a) >= -1e-15 for a, b in zip(r, r[1:]))
    if slope != 0 and n > 2 and c > 0:
        assert sign * (r[-1] - r[0]) > 0


def test_schedule_closed_form_without_clipping():
    """c=0.5, slope=0.5, L=5: keep fractions 0.5*(1 + 0.5*(1 - 2l/4)) = .75 .625 .5 .375 .25, by hand."""
    r = pyramid_ratios(0.5, 5, 0.5)
    torch.testing.assert_close(torch.tensor(r, dtype=torch.float64),
                               torch.tensor([0.25, 0.375, 0.5, 0.625, 0.75], dtype=torch.float64))
    assert pyramid_ratios(0.6, 4, 0.0) == [0.6] * 4


def test_schedule_clips_then_shifts_to_the_mean():
    """c=0.9, slope=1, L=3: raw 0.8, 0.9, 1.0 -> the top clips at 0.99 and the shift t solves
    clip(0.8+t) + clip(0.9+t) + 0.99 = 2.7, i.e. t = 0.005: 0.805, 0.905, 0.99."""
    r = pyramid_ratios(0.9, 3, 1.0)
    torch.testing.assert_close(torch.tensor(r, dtype=torch.float64),
                               torch.tensor([0.805, 0.905, 0.99], dtype=torch.float64))
    # a very steep pyramid saturates both ends and is still exact in the mean
    r = pyramid_ratios(0.5, 10, 10.0)
    assert r[0] == 0.0 and r[-1] == 0.99 and abs(sum(r) / 10 - 0.5) < 1e-12
    # the inverted pyramid is the mirror image
    assert pyramid_ratios(0.9, 3, -1.0) == pyramid_ratios(0.9, 3, 1.0)[::-1]


@pytest.mark.parametrize("kwargs,name", [({"compression_ratio": 0.995, "n_layers": 4}, "compression_ratio"),
                                         ({"compression_ratio": 0.5, "n_layers": 0}, "n_layers"),
                                         ({"compression_ratio": 0.5, "n_layers": 4, "slope": float("nan")}, "slope"),
                                         ({"compression_ratio": 0.5, "n_layers": 4, "max_ratio": 1.0}, "max_ratio")])
def test_schedule_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        pyramid_ratios(**kwargs)


def test_registered_and_validated():
    assert "jacap_pyramid" in list_methods()
    press = build_press("jacap_pyramid", 0.75, slope=1.0, tau=3.0)
    assert isinstance(press, JacapPyramidPress) and isinstance(press.press, JacapPress)
    assert press.press.tau == 3.0 and press.slope == 1.0 and press.compression_ratio == 0.75
    assert press.schedule(30) == pyramid_ratios(0.75, 30, 1.0)
    with pytest.raises(ValueError, match="evict"):
        build_press("jacap_pyramid", 0.5, evict="drop")
    with pytest.raises(ValueError, match="slope"):
        build_press("jacap_pyramid", 0.5, slope="steep")


# ----------------------------------------------------------------------------- bundled model
@pytest.fixture(scope="module")
def model_tok():
    from jacap_lib import load_model

    torch.manual_seed(0)
    return load_model()


def _prompt(n=96, m=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(200, 20000, (1, n), generator=g), torch.randint(200, 20000, (1, m), generator=g)


@pytest.mark.model
@pytest.mark.parametrize("evict", ["prune", "mask"])
def test_cache_lengths_follow_schedule(model_tok, evict):
    """After a real kvpress prefill, layer l holds compute_n_kept(N, c_l) usable KV pairs per head:
    physically (prune) or as N minus the masked keys of each head (mask)."""
    model, _ = model_tok
    prompt, _ = _prompt()
    n = prompt.shape[1]
    # n_sink=1: the top layers keep a single token each at this length, and a press refuses to drop a sink
    press = build_press("jacap_pyramid", 0.75, slope=1.0, evict=evict, n_sink=1)
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
    expected = [compute_n_kept(n, c) for c in pyramid_ratios(0.75, model.config.num_hidden_layers, 1.0)]
    assert expected[0] > expected[-1]  # the pyramid is visible at this prompt length
    heads = model.config.num_key_value_heads
    got = []
    for i, layer in enumerate(model.model.layers):
        length = cache.layers[i].keys.shape[-2]
        if evict == "prune":
            got.append(length)
            assert getattr(layer.self_attn, "masked_key_indices", None) is None
        else:
            assert length == n
            b, h, _ = layer.self_attn.masked_key_indices
            counts = torch.bincount(h, minlength=heads)
            assert (counts == counts[0]).all()  # every head evicts the same number
            got.append(n - int(counts[0]))
            layer.self_attn.masked_key_indices = None
    assert got == expected


@pytest.mark.model
def test_mask_equals_pruning_on_the_continuation(model_tok):
    """slope=0 (uniform budget) with masked eviction gives the continuation the same log-probs as
    plain JacapPress pruning the same tokens; and the pyramid (slope=1) differs from both."""
    from jacap_lib.measure import quality as Q

    model, _ = model_tok
    prompt, cont = _prompt(seed=1)
    cap = Q.capture_prefill(model, prompt)
    n = prompt.shape[1]
    # n_sink=1: the pyramid's top layers keep one token each at this length (a press refuses to drop a sink)
    lp_uniform, _, kept_u = Q.continue_from_cache(model, Q.replay_press(model, cap, JacapPress(0.75, n_sink=1)), n, cont)
    flat = build_press("jacap_pyramid", 0.75, slope=0.0, n_sink=1)
    lp_flat, _, kept_f = Q.continue_from_cache(model, Q.replay_press(model, cap, flat), n, cont)
    assert kept_f == kept_u == compute_n_kept(n, 0.75)
    torch.testing.assert_close(lp_flat, lp_uniform, rtol=1e-4, atol=1e-4)
    pyr = build_press("jacap_pyramid", 0.75, slope=1.0, n_sink=1)
    lp_pyr, _, kept_p = Q.continue_from_cache(model, Q.replay_press(model, cap, pyr), n, cont)
    sched = [compute_n_kept(n, c) for c in pyr.compression_ratios]
    assert kept_p == pytest.approx(sum(sched) / len(sched))
    assert (lp_pyr - lp_uniform).abs().max() > 1e-3
