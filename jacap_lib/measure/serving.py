"""Algorithm 2 on a real generation (the serving chapter's study): one greedy continuation generated
without eviction, then the same tokens replayed (teacher forcing) through
:class:`jacap_lib.controller.JacapDecodeController` for several beta values and through the sliding-window
fallback, each judged on identical tokens by the next-token KL against the uncompressed model; plus the
EMA's noise/lag trade-off on one layer's raw query stream.

The job that writes ``data/serving/serving_run.json`` is :func:`jacap_lib.experiments.serving.run_serving`.
"""
from __future__ import annotations

import time
import warnings

__all__ = ["CONTROLLER_KEYS", "jaccard_turnover", "serving_study"]

CONTROLLER_KEYS = ("high", "budget", "interval", "window", "n_sink", "prefix", "tau", "noise", "eps")


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


def serving_study(model, tok, cfg: dict, *, progress: bool = True) -> dict:
    """Run the study described by ``cfg`` (see :data:`jacap_lib.experiments.serving.CONFIG` for the keys);
    returns ``n_prompt``, ``generated_text``, ``runs`` (per beta and ``"window"``), ``tradeoff`` and
    ``query_trace``."""
    import torch
    from tqdm.auto import tqdm

    from ..controller import JacapDecodeController
    from ..stats import ema_trace, ema_tradeoff
    from .quality import kl_from_logits
    from .replay import replay

    model.eval()
    inputs = tok.apply_chat_template([{"role": "user", "content": cfg["prompt"]}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    n_prompt = int(inputs["input_ids"].shape[1])
    n = cfg["n_new"]
    with torch.no_grad():
        seq = model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        ref = model(input_ids=seq).logits[0, n_prompt - 1:].float()
    text = tok.decode(seq[0, n_prompt:])
    common = {k: cfg[k] for k in CONTROLLER_KEYS}
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

    return {"n_prompt": n_prompt, "generated_text": text, "runs": runs, "tradeoff": tradeoff,
            "query_trace": {"layer": layer, "head": 0, "dim": dim, "q": q0[:, dim].tolist(), "ema_mu": trajectories}}
