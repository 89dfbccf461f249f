"""The serving chapter's decoding comparison: Algorithm 2 against kvpress ``DecodingPress`` with several
scorers at the same cache budget, on long sampled generations of the bundled model ->
``data/serving/decoding_comparison.json``. Command line: ``python -m jacap_lib.results.decoding_comparison``
(``--quick`` for a smoke run); about 15-30 min on one busy CPU core for the default configuration.

Each prompt's continuation is sampled once without compression (seeded, EOS suppressed so every run has
``n_new`` tokens), then every method replays the same tokens (:func:`jacap_lib.measure.decoding_compare.compare_decoding`).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import io
from .paths import data_path
from .provenance import provenance

__all__ = ["CONFIG", "QUICK", "run_decoding_comparison", "decoding_summary", "main"]

CONFIG = {
    "prompts": [
        "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle.",
        "Explain in detail, step by step, how a refrigerator keeps food cold.",
        "Write a tutorial about reading and writing CSV files in Python, with code examples.",
    ],
    "chat_template": True,
    "n_new": 512,
    "sampling": {"temperature": 0.8, "top_p": 0.95, "seed": 0, "eos_suppressed": True},
    "budget": 128,
    "interval": 16,
    "window": 32,
    "n_sink": 4,
    "beta": 0.9,
    "methods": ["alg2", "jacap", "tova", "knorm", "expected_attention", "streaming_llm"],
    "method_notes": {
        "alg2": "JacapDecodeController(high=budget+interval, budget, interval, beta, n_sink, window)",
        "jacap": "kvpress DecodingPress(JacapPress(n_sink, window), compression_interval=interval, target_size=budget)",
        "others": "kvpress DecodingPress(<registry press with kvpress defaults>, compression_interval=interval, "
                  "target_size=budget, hidden_states_buffer_size=256)",
    },
    "kl_bins": 32,
    "torch_threads": 1,
}
QUICK = {**CONFIG, "prompts": CONFIG["prompts"][:1], "n_new": 48, "budget": 24, "interval": 8, "window": 8,
         "methods": ["alg2", "jacap", "streaming_llm"]}


def _sample(model, tok, prompt: str, cfg: dict):
    import torch

    inputs = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    s = cfg["sampling"]
    torch.manual_seed(s["seed"])
    with torch.no_grad():
        seq = model.generate(**inputs, do_sample=True, temperature=s["temperature"], top_p=s["top_p"],
                             max_new_tokens=cfg["n_new"], min_new_tokens=cfg["n_new"])
    return seq, int(inputs["input_ids"].shape[1])


def run_decoding_comparison(model, tok, *, config: dict | None = None, out: Path | None = None,
                            log=print) -> Path:
    """Run every prompt x method of ``config`` (default :data:`CONFIG`) and write the results file."""
    import torch

    from ..measure.decoding_compare import compare_decoding

    cfg = dict(CONFIG if config is None else config)
    torch.set_num_threads(cfg["torch_threads"])
    model.eval()
    t_start = time.time()
    rows = []
    for p_idx, prompt in enumerate(cfg["prompts"]):
        seq, n_prompt = _sample(model, tok, prompt, cfg)
        log(f"prompt {p_idx}: {n_prompt} prompt + {seq.shape[1] - n_prompt} generated tokens")
        res = compare_decoding(model, seq, n_prompt, cfg["methods"], budget=cfg["budget"], interval=cfg["interval"],
                               window=cfg["window"], n_sink=cfg["n_sink"], beta=cfg["beta"], bins=cfg["kl_bins"],
                               progress=lambda name: log(f"  {name} ({time.time() - t_start:.0f} s)"))
        for name, row in res["methods"].items():
            rows.append({"prompt": p_idx, "method": name, "n_prompt": n_prompt, **row})
        rows.append({"prompt": p_idx, "method": "uncompressed", "n_prompt": n_prompt,
                     "seconds": res["reference"]["seconds"], "peak_cache": res["reference"]["peak_cache"],
                     "generated_text": tok.decode(seq[0, n_prompt:])})
    record = provenance(model)
    config_out = {**cfg, "command": "python -m jacap_lib.results.decoding_comparison", "provenance": record,
                  "wall_seconds": time.time() - t_start}
    return io.write_results(out or data_path("serving", "decoding_comparison.json", must_exist=False),
                            config_out, rows)


def decoding_summary(rows: list) -> dict:
    """Per method, the means over prompts of the per-prompt summaries of :func:`run_decoding_comparison`'s rows:
    ``mean_kl``, ``mean_kl_compressed``, ``p90_kl``, ``top1_agree``, ``peak_cache`` (max over prompts),
    ``scoring_share``, ``mean_age``, the pooled ``age_fraction`` per age bin, ``kl_binned`` (mean curve)
    and ``per_prompt_kl``; methods in the order they first appear."""
    out: dict = {}
    for r in rows:
        if r["method"] == "uncompressed":
            continue
        out.setdefault(r["method"], []).append(r)
    summary = {}
    for name, rs in out.items():
        n = len(rs)
        mean = lambda key: sum(r[key] for r in rs) / n  # noqa: E731
        counts = [sum(r["age_counts"][i] for r in rs) for i in range(len(rs[0]["age_counts"]))]
        total = max(sum(counts), 1)
        summary[name] = {
            "mean_kl": mean("mean_kl"), "mean_kl_compressed": mean("mean_kl_compressed"), "p90_kl": mean("p90_kl"),
            "top1_agree": mean("top1_agree"), "peak_cache": max(r["peak_cache"] for r in rs),
            "scoring_share": mean("scoring_share"), "mean_age": mean("mean_age"),
            "age_edges": rs[0]["age_edges"], "age_fraction": [c / total for c in counts],
            "kl_binned": [sum(r["kl_binned"][i] for r in rs) / n for i in range(len(rs[0]["kl_binned"]))],
            "bin_edges": rs[0]["bin_edges"], "per_prompt_kl": [r["mean_kl"] for r in rs], "n_prompts": n,
        }
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jacap_lib.results.decoding_comparison", description=__doc__)
    ap.add_argument("--out", type=Path, default=None, help="default data/serving/decoding_comparison.json")
    ap.add_argument("--quick", action="store_true", help="one prompt, 48 tokens, three methods (a smoke run)")
    args = ap.parse_args(argv)
    if args.out is not None and args.out.suffix != ".json":
        ap.error("--out must end in .json")
    from ..models import load_model

    model, tok = load_model()
    path = run_decoding_comparison(model, tok, config=QUICK if args.quick else CONFIG, out=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
