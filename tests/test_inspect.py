"""inspect_eviction: kept positions read from the cache agree with an independent selection from the
recorded scores and from the press's own scores recomputed on a separate prefill; every token's status
(kept by score / protected / evicted) per layer and head; the marked text and the HTML page."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import torch
from kvpress.utils import compute_n_kept

from jacap_lib.measure.eviction import (DEFAULT_RATIO, MARKS, EvictionInspection, inspect_eviction, kept_indices,
                                        parse_view)
from jacap_lib.selection import protected_mask, select_keep

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
    res = inspect_eviction(model, tok, TEXT, "jacap_prompt", 0.6, window=5)
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


def _masks_of(model, press, ids) -> torch.Tensor:
    """kvpress's own run of ``press`` (no inspection hooks): the (L, H, N) positions its masks hide, read from
    every attention module's ``masked_key_indices``; the masks are then dropped."""
    from transformers import DynamicCache

    from jacap_lib.hf import clear_masks

    with torch.inference_mode(), press(model):
        model.model(input_ids=ids, past_key_values=DynamicCache())
    L, H, N = model.config.num_hidden_layers, model.config.num_key_value_heads, ids.shape[1]
    out = torch.zeros(L, H, N, dtype=torch.bool)
    for layer in model.model.layers:
        b, h, s = (t.cpu() for t in layer.self_attn.masked_key_indices)
        out[layer.self_attn.layer_idx, h[b == 0], s[b == 0]] = True
    clear_masks(model)
    return out


def _no_masks_left(model) -> bool:
    return all(getattr(layer.self_attn, "masked_key_indices", None) is None for layer in model.model.layers)


@pytest.mark.model
@pytest.mark.parametrize("method,opts,raised", [("jacap", {"window": 8}, (4, 8)), ("kvzip", {}, (4, 0))])
def test_inspect_press_that_masks_after_the_prefill(model_tok, method, opts, raised):
    """The default JacapPress and KVzip hide, after the prefill, the int(c * entries) lowest-scoring entries of the
    whole model (a global budget): the inspection's evicted entries are kvpress's own masks, and no evicted entry
    outscores a kept one once the protected entries (sinks, the default's window) are raised."""
    from jacap_lib.presses.registry import build_press

    model, tok = model_tok
    res = inspect_eviction(model, tok, TEXT, method, 0.5, **opts)
    assert _no_masks_left(model)
    L, H, N = res.n_layers, res.n_heads, res.n_tokens
    assert torch.equal(res.kept, torch.arange(N).expand(L, H, N)) and res.masked.shape == (L, H, N)
    assert int(res.masked.sum()) == int(L * H * N * 0.5) and int(res.n_kept.sum()) == L * H * N - int(L * H * N * 0.5)
    assert res.n_kept.unique().numel() > 1  # the budget is spread unevenly over heads and layers
    ids = tok(TEXT, return_tensors="pt", add_special_tokens=False).input_ids
    assert torch.equal(res.masked, _masks_of(model, build_press(method, 0.5, **opts), ids))
    n_sink, window = raised
    up = torch.zeros(N, dtype=torch.bool)
    up[:n_sink] = True
    if window:
        up[N - window:] = True
    assert torch.equal(res.protected, up.expand(L, H, N))  # the budget holds them: kept in every head
    score = res.score.masked_fill(up, float("inf"))
    assert float(score[res.masked].max()) <= float(score[~res.masked].min())  # brute force: the global lowest
    assert "kept (mean" in repr(res) and res.budget == int(res.n_kept.sum()) // (L * H)


@pytest.mark.model
def test_inspect_default_with_a_per_head_budget(model_tok):
    """JacapPress(budget="head") masks int(N c) entries in every head after its second reading: the inspection shows
    one budget again, each head's kept set its top scores once the sinks and window are raised."""
    model, tok = model_tok
    res = inspect_eviction(model, tok, TEXT, "jacap", 0.5, window=8, budget="head")
    N = res.n_tokens
    assert res.n_kept.eq(N - int(N * 0.5)).all() and res.budget == N - int(N * 0.5)
    assert repr(res).splitlines()[1].startswith(f"  per head: budget {N - int(N * 0.5)} = ")
    score = res.score.masked_fill(res.protected, float("inf"))
    lowest_kept = score.masked_fill(~res.kept_mask, float("inf")).amin(-1)
    highest_evicted = score.masked_fill(res.kept_mask, float("-inf")).amax(-1)
    assert bool((highest_evicted <= lowest_kept).all())


@pytest.mark.model
def test_inspect_head_wise_budget_of_adakv(model_tok):
    """AdaKV around the prompt press keeps the layer's budget summed over its heads, each head its own share (at
    least the safeguard's fraction), chosen by the prompt press's recorded score."""
    from kvpress import AdaKVPress

    from jacap_lib.presses.jacap import JacapPromptPress

    model, tok = model_tok
    press = AdaKVPress(press=JacapPromptPress(0.5, window=4), alpha_safeguard=0.2)
    res = inspect_eviction(model, tok, TEXT, press)
    assert _no_masks_left(model)
    N = res.n_tokens
    budget = compute_n_kept(N, 0.5)
    assert res.n_kept.sum(-1).tolist() == [res.n_heads * budget] * res.n_layers
    assert int(res.n_kept.min()) >= int(0.2 * budget) and res.n_kept.unique().numel() > 1
    assert res.alpha is not None and res.protected[..., :4].all() and res.protected[..., N - 4:].all()
    score = res.score.masked_fill(res.protected, float("inf"))
    for l in range(res.n_layers):  # within a head, every kept token outscores every evicted one
        for h in range(res.n_heads):
            kept = res.kept_mask[l, h]
            if kept.all():
                continue
            assert float(score[l, h][~kept].max()) <= float(score[l, h][kept].min())


# ----------------------------------------------------------------------------- statuses, view, HTML
def _hand_built():
    """2 layers x 2 heads, 6 tokens (some holding the view's mark characters), budget 3; position 0 protected."""
    tokens = ["[a]", " b·c", "«d»", " e\\", "f", " g"]
    kept = torch.tensor([[[0, 1, 2], [0, 3, 5]], [[0, 4, 5], [0, 1, 5]]])
    prot = torch.zeros(2, 2, 6, dtype=torch.bool)
    prot[..., 0] = True
    return EvictionInspection(method="jacap_prompt", compression_ratio=0.5, options={}, token_ids=list(range(6)),
                              tokens=tokens, kept=kept, protected=prot, score=torch.arange(24.).reshape(2, 2, 6),
                              model="tiny")


def test_masked_positions_count_as_evicted_and_heads_keep_their_own_number():
    """A hand-built masking inspection: the cache holds every position, the masks hide some; by hand, the status,
    the per-head counts, the mean budget and the repr follow."""
    base = _hand_built()
    kept = torch.arange(6).expand(2, 2, 6)
    masked = torch.ones(2, 2, 6, dtype=torch.bool)
    masked.scatter_(-1, base.kept, False)  # the same kept sets as the hand-built one ...
    masked[1, 1, 5] = True  # ... except that layer 1, head 1 also hides position 5
    insp = EvictionInspection(method="kvzip", compression_ratio=0.5, options={}, token_ids=base.token_ids,
                              tokens=base.tokens, kept=kept, protected=base.protected, masked=masked)
    expected = base.status.clone()
    expected[1, 1, 5] = 0
    assert torch.equal(insp.status, expected)
    assert insp.n_kept.tolist() == [[3, 3], [3, 2]] and insp.budget == 11 // 4
    assert insp.n_scored.tolist() == [[2, 2], [2, 1]]
    assert repr(insp).endswith("per head: 2-3 kept (mean 2) = 1-2 kept by score + 1 protected (first 1); "
                               "3-4 evicted; no score recorded")
    # a protected position the mask hides all the same (a global budget below the protected entries) is evicted
    insp.masked[0, 0, 0] = True
    assert insp.statuses(0, 0)[0] == "evicted" and insp.n_protected[0, 0] == 0 and insp.n_kept[0, 0] == 2


def _expand(runs):
    """Per-character statuses of (text, status) runs."""
    return [st for text, st in runs for _ in text]


def test_status_view_round_trip_and_repr_on_a_hand_built_inspection():
    insp = _hand_built()
    expected = torch.zeros(2, 2, 6, dtype=torch.int8)  # by hand: 0 evicted, 1 kept by score, 2 protected
    for l, h, pos in [(0, 0, [1, 2]), (0, 1, [3, 5]), (1, 0, [4, 5]), (1, 1, [1, 5])]:
        expected[l, h, pos] = 1
    expected[..., 0] = 2
    assert torch.equal(insp.status, expected)
    assert insp.budget == 3 and insp.n_scored.tolist() == [[2, 2], [2, 2]] and insp.n_protected.eq(1).all()
    for l in range(2):
        for h in range(2):
            marked = insp.view(l, h)
            runs = parse_view(marked)
            assert "".join(t for t, _ in runs) == "".join(insp.tokens)  # the text comes back exactly
            per_token = [st for tok, st in zip(insp.tokens, insp.statuses(l, h)) for _ in tok]
            assert _expand(runs) == per_token
    assert insp.view(0, 0) == "«\\[a\\]»[ b\\·c\\«d\\»]· e\\\\f g·"
    assert repr(insp) == ("EvictionInspection(jacap_prompt at c=0.5 on tiny: N=6 prompt tokens, 2 layers x 2 KV heads)\n"
                          "  per head: budget 3 = 2 kept by score + 1 protected (first 1); 3 evicted")
    rows = insp.head_table(0, 1)
    assert [r["status"] for r in rows] == ["protected", "evicted", "evicted", "kept", "evicted", "kept"]
    assert rows[2]["score"] == 8.0
    torch.testing.assert_close(insp.keep_grid([1, 5]), torch.tensor([[0.5, 0.5], [0.5, 1.0]]))
    for bad in [(2, 0), (0, -1), (0, 1.0)]:
        with pytest.raises(ValueError, match="layer|head"):
            insp.view(*bad)
    assert set(insp.to_frame()["status"]) == {"kept", "protected", "evicted"}
    with pytest.raises(ValueError, match="not closed"):
        parse_view("[abc")


def _html_data(text):
    m = re.search(r'<script type="application/json" id="eviction-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def test_html_holds_every_layer_and_head_and_needs_no_network(tmp_path):
    from jacap_lib.viz.eviction import to_html

    insp = _hand_built()
    insp.tokens[2] = "</script><b>"  # must neither end the data script nor become markup
    path = to_html(insp, tmp_path / "sub" / "e.html", 1, 0)
    text = path.read_text()
    for l in range(2):
        for h in range(2):
            assert f'id="cell-{l}-{h}"' in text
    data = _html_data(text)
    assert data["tokens"] == insp.tokens and (data["layer"], data["head"]) == (1, 0)
    assert data["status"] == {f"{l},{h}": "".join(map(str, insp.status[l, h].tolist()))
                              for l in range(2) for h in range(2)}
    assert "http" not in text and " src=" not in text  # opens offline: nothing is fetched
    assert "<b>" not in text and "</script><b>" not in text
    with pytest.raises(ValueError, match="html"):
        to_html(insp, tmp_path / "e.png")
    with pytest.raises(ValueError, match="layer"):
        to_html(insp, tmp_path / "f.html", 5, 0)
    assert not (tmp_path / "f.html").exists()


@pytest.mark.browser
def test_html_page_runs_in_chromium(tmp_path):
    """The page's script runs: it marks the shown head's grid cell and fills the title of its text."""
    from jacap_lib.viz.eviction import to_html

    chromium = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                    None)
    if chromium is None:
        pytest.skip("no chromium binary on PATH")
    path = to_html(_hand_built(), tmp_path / "e.html", 1, 1)
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'p'}",
                          "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert re.search(r'id="cell-1-1"[^>]*class="shown"', dom)
    assert re.search(r'id="cell-0-0"[^>]*class=""', dom)
    assert len(re.findall(r'<span class="s[012]', dom)) == 6  # the shown head's tokens, drawn by the script
    assert "Layer 1, KV head 1: 2 kept by score + 1 protected of 6 tokens" in dom


@pytest.mark.model
def test_statuses_against_an_independent_computation(model_tok):
    """Protected = the first n_sink and last window positions; per head the budget is split into protected +
    kept by score; the kept set is the top-B of the press's own score recomputed on a separate, uncompressed
    prefill (captured hook inputs, no cache reading)."""
    from jacap_lib.hf import attention_modules
    from jacap_lib.measure.quality import capture_prefill
    from jacap_lib.presses.jacap import JacapPromptPress

    model, tok = model_tok
    res = inspect_eviction(model, tok, TEXT, "jacap_prompt", window=8)  # the default ratio
    N, L, H = res.n_tokens, res.n_layers, res.n_heads
    budget = compute_n_kept(N, DEFAULT_RATIO)
    assert res.compression_ratio == DEFAULT_RATIO == 0.5 and res.budget == budget
    prot = protected_mask(N, n_sink=4, window=8)
    assert torch.equal(res.protected, prot.expand(L, H, N))
    assert torch.equal(res.status == 2, prot.expand(L, H, N))
    assert res.n_scored.eq(budget - 12).all() and (res.status != 0).sum(-1).eq(budget).all()
    # the press's own scores, recomputed layer by layer from an uncompressed prefill
    press = JacapPromptPress(DEFAULT_RATIO, window=8)
    cap = capture_prefill(model, tok(TEXT, return_tensors="pt", add_special_tokens=False).input_ids)
    for i, (module, rec) in enumerate(zip(attention_modules(model), cap.layers)):
        kw = rec["kwargs"]
        with torch.inference_mode():  # the captured tensors are inference tensors
            s = press.score(module, kw["hidden_states"], rec["keys"], rec["values"], None, kw)[0]
        assert torch.equal(res.kept[i], s.topk(budget, dim=-1).indices.sort(-1).values), i
        scored = s.masked_fill(prot, float("-inf")).topk(budget - 12, dim=-1).indices
        assert torch.equal(torch.nonzero(res.status[i] == 1)[:, 1].view(H, -1), scored.sort(-1).values), i
    assert repr(res).splitlines() == [
        f"EvictionInspection(jacap_prompt at c=0.5 on SmolLM2-135M-Instruct: N={N} prompt tokens, 30 layers x 3 KV heads)",
        f"  per head: budget {budget} = {budget - 12} kept by score + 12 protected (first 4 + last 8); "
        f"{N - budget} evicted",
        # bytes: 30 layers x 3 KV heads x 64 dims x (keys + values) x 4 bytes (float32) per kept token
        f"  cache: {budget * 30 * 3 * 64 * 2 * 4 / 1e6:.1f} MB held of {N * 30 * 3 * 64 * 2 * 4 / 1e6:.1f} MB "
        f"uncompressed ({100 * budget / N:.1f} %)"]
    assert res.bytes_full == N * 30 * 3 * 64 * 2 * 4 and res.bytes_held == budget * 30 * 3 * 64 * 2 * 4
    assert res.bytes_freed is None  # the prompt press prunes every head to the same budget: nothing left to free
    runs = parse_view(res.view(3, 1))
    assert "".join(t for t, _ in runs) == TEXT
    assert _expand(runs) == [st for tok_, st in zip(res.tokens, res.statuses(3, 1)) for _ in tok_]
    assert runs[0] == ("Maria keeps her bicycle", "protected")  # the 4 sinks
    # a budget below n_sink + window: the press shrinks the window, the score decides nothing (repr says so)
    with pytest.warns(RuntimeWarning, match="shrunk to"):
        tight = inspect_eviction(model, tok, TEXT, "jacap_prompt", 0.75, window=8)
    b = compute_n_kept(N, 0.75)
    assert tight.n_scored.eq(0).all() and torch.equal(tight.protected[0, 0], protected_mask(N, n_sink=4, window=b - 4))
    assert f"0 kept by score + {b} protected (first 4 + last {b - 4})" in repr(tight)


@pytest.mark.model
def test_baselines_protect_nothing(model_tok):
    model, tok = model_tok
    res = inspect_eviction(model, tok, TEXT, "streaming_llm", 0.5)
    assert not res.protected.any() and res.n_scored.eq(res.budget).all()
    assert "0 protected" in repr(res) and set(MARKS) == {"kept", "protected", "evicted"}


@pytest.mark.model
def test_cli_inspects_the_default_press(capsys):
    """`jacap inspect --method jacap` (the default JacapPress, which masks after the prefill) prints each
    head's own count and the marked text of the asked head."""
    from jacap_lib import cli

    cli.main(["inspect", "--method", "jacap[window=8]", "--ratio", "0.5", "--text", TEXT, "--layer", "3",
              "--head", "1"])
    out = capsys.readouterr().out
    assert "kept (mean" in out and "layer 3, KV head 1:" in out
    marked = out.split("layer 3, KV head 1:", 1)[1].split("\n", 2)[1]
    assert "".join(text for text, _ in parse_view(marked)) == TEXT


@pytest.mark.model
@pytest.mark.parametrize("method", ["jacap", "kvzip"])
def test_bytes_of_a_masking_press_and_of_its_kept_entries_freed(model_tok, method):
    """A press that masks keys (the default, KVzip) frees nothing: the cache still holds every slot (at least the
    uncompressed bytes). Its kept entries, freed into a ragged cache, hold what they weigh (kept entries x 64 dims x
    keys and values x 4 bytes) plus the ragged layout's offsets and positions: at most 2 % more, and at most
    (1 - c) + 2 % of the uncompressed bytes."""
    model, tok = model_tok
    res = inspect_eviction(model, tok, TEXT, method, 0.5)
    N = res.n_tokens
    entry = 64 * 2 * 4
    assert res.masked is not None and res.bytes_full == N * 30 * 3 * entry
    assert res.bytes_held >= res.bytes_full
    kept = int(res.n_kept.sum())
    assert kept * entry <= res.bytes_freed <= 1.02 * kept * entry
    assert res.bytes_freed <= (0.5 + 0.02) * res.bytes_full + 30 * 3 * entry  # the global budget's rounding: a token a head
    assert "frees nothing" in repr(res).splitlines()[2]
