"""The serving chapter's job: Algorithm 2 (:class:`jacap_lib.decoding.JacapDecodeController`) on the
bundled model -> ``data/serving/serving_run.json``. Command line: ``jacap serve-run`` (~6 min on two
busy CPU cores).

One greedy continuation of a story prompt is generated once without eviction; then the same tokens
are replayed (teacher forcing) through the controller for several beta values and through the
sliding-window fallback, so every configuration is judged on identical tokens by the next-token KL
against the uncompressed model.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

from . import io
from .paths import data_path
from .provenance import provenance

__all__ = ["CONFIG", "jaccard_turnover", "run_serving"]

CONFIG = {
    "prompt": "Write a long story about a lighthouse keeper who finds an old map in a bottle.",
    "chat_template": True,
    "n_new": 160,
    "decoding": "greedy (do_sample=False)",
    "high": 80,
    "budget": 56,
    "interval": 8,
    "window": 16,
    "n_sink": 4,
    "prefix": 0,
    "tau": 10.0,
    "noise": 1.0,
    "eps": 1e-6,
    "betas": [0.5, 0.8, 0.9, 0.95, 0.99],
    "main_beta": 0.9,
    "study_layer": 15,
    "tradeoff_betas": [0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99],
    "horizon": 16,
    "torch_threads": 1,
}
_CONTROLLER = ("high", "budget", "interval", "window", "n_sink", "prefix", "tau", "noise", "eps")


def jaccard_turnover(events, layer: int) -> list:
    """Mean (over KV heads) Jaccard overlap of the kept position sets of consecutive evictions,
    restricted to positions both evictions could have kept (older than the earlier one)."""
    out = []
    for a, b in zip(events, events[1:]):
        pa, pb = a.kept_positions[layer][0], b.kept_positions[layer][0]
        vals = []
        for h in range(pa.shape[0]):
            sa = set(pa[h].tolist())
            sb = {p for p in pb[h].tolist() if p < a.seq_len}
            vals.append(len(sa & sb) / max(len(sa | sb), 1))
        out.append(sum(vals) / len(vals))
    return out


def run_serving(model, tok, *, out: Path | None = None, config: dict | None = None, progress: bool = True) -> Path:
    """Run every configuration of ``config`` (default :data:`CONFIG`) and write the results file."""
    import torch
    from tqdm.auto import tqdm

    from ..decoding import JacapDecodeController, ema_trace, ema_tradeoff, kl_from_logits, replay
    from ..models import BUNDLED_DIST, BUNDLED_FILE, BUNDLED_NAME, BUNDLED_VERSION

    cfg = dict(CONFIG if config is None else config)
    torch.set_num_threads(cfg["torch_threads"])
    t_start = time.time()
    model.eval()
    inputs = tok.apply_chat_template([{"role": "user", "content": cfg["prompt"]}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    n_prompt = int(inputs["input_ids"].shape[1])
    n = cfg["n_new"]
    with torch.no_grad():
        seq = model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        ref = model(input_ids=seq).logits[0, n_prompt - 1:].float()
    text = tok.decode(seq[0, n_prompt:])
    common = {k: cfg[k] for k in _CONTROLLER}
    layer = cfg["study_layer"]

    runs = {}
    query_log = None
    for beta in tqdm(cfg["betas"], desc="serving betas", disable=not progress):
        ctrl = JacapDecodeController(model, beta=beta, record_kept=True,
                                     record_layers=(layer,) if beta == cfg["main_beta"] else (), **common)
        t0 = time.time()
        logits = replay(model, seq, n_prompt, ctrl)
        kl = kl_from_logits(ref, logits)
        runs[str(beta)] = {
            "beta": beta, "method": "jacap", "kl": kl.tolist(), "mean_kl": float(kl.mean()),
            "top1_agree": float((logits.argmax(-1) == ref.argmax(-1)).float().mean()),
            "trace": ctrl.trace, "events": [e.to_dict() for e in ctrl.events],
            "turnover": jaccard_turnover(ctrl.events, layer), "seconds": time.time() - t0,
        }
        if beta == cfg["main_beta"]:
            query_log = torch.cat(ctrl.query_log[layer], dim=2)[0]  # (H_q, T, d)

    ctrl = JacapDecodeController(model, beta=cfg["main_beta"], deadline_s=0.0, record_kept=True, **common)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the fallback is the point of this run; it is recorded
        logits = replay(model, seq, n_prompt, ctrl)
    kl = kl_from_logits(ref, logits)
    runs["window"] = {
        "beta": None, "method": "window", "kl": kl.tolist(), "mean_kl": float(kl.mean()),
        "top1_agree": float((logits.argmax(-1) == ref.argmax(-1)).float().mean()),
        "trace": ctrl.trace, "events": [e.to_dict() for e in ctrl.events],
        "turnover": jaccard_turnover(ctrl.events, layer),
    }

    # beta on the raw query stream of one layer (all query heads)
    tradeoff = []
    for beta in cfg["tradeoff_betas"]:
        rows = [ema_tradeoff(query_log[h], beta, cfg["horizon"]) for h in range(query_log.shape[0])]
        tradeoff.append({"beta": beta, "jitter": sum(r["jitter"] for r in rows) / len(rows),
                         "lag_error": sum(r["lag_error"] for r in rows) / len(rows)})
    q0 = query_log[0]  # query head 0
    dim = int(q0.mean(0).abs().argmax())  # the coordinate with the largest mean: a visible signal
    trajectories = {str(beta): ema_trace(q0, beta)[0][:, dim].tolist() for beta in cfg["tradeoff_betas"]}

    record = provenance(model)
    result = {
        "config": {"model": BUNDLED_NAME, "model_file": BUNDLED_FILE,
                   "model_package": f"{BUNDLED_DIST}=={BUNDLED_VERSION}", "dtype": "float32", **cfg,
                   "command": "jacap serve-run", "provenance": record},
        "versions": record["versions"], "n_prompt": n_prompt, "generated_text": text,
        "runs": runs, "tradeoff": tradeoff,
        "query_trace": {"layer": layer, "head": 0, "dim": dim, "q": q0[:, dim].tolist(), "ema_mu": trajectories},
        "wall_seconds": time.time() - t_start,
    }
    return io.write_json(out or data_path("serving", "serving_run.json", must_exist=False), result)
