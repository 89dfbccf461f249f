"""The serving chapter's decoding comparison: Algorithm 2 against kvpress ``DecodingPress`` with several
scorers at the same cache budget, on long sampled generations of the bundled model ->
``data/serving/decoding_comparison.json``. Command line: ``jacap compare-decoding`` (:data:`JOB`;
``--quick`` for a smoke run); about 15-30 min on one busy CPU core for the default configuration.

Each prompt's continuation is sampled once without compression (seeded, EOS suppressed so every run has
``n_new`` tokens), then every method replays the same tokens (:func:`jacap_lib.measure.decoding_compare.compare_decoding`).
"""
from __future__ import annotations

import time
from pathlib import Path

from . import files
from . import job as J
from .paths import data_path
from .provenance import provenance

__all__ = ["CONFIG", "QUICK", "run_decoding_comparison", "merge_parts", "decoding_summary", "decoding_findings", "JOB"]

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
                            prompts=None, log=print, command: str = "jacap compare-decoding") -> Path:
    """Run every prompt x method of ``config`` (default :data:`CONFIG`) and write the results file.

    ``prompts``: indices into ``config["prompts"]`` to run (default all), so that several processes can
    share the work; :func:`merge_parts` joins their files."""
    import torch

    from ..measure.decoding_compare import compare_decoding

    cfg = dict(CONFIG if config is None else config)
    torch.set_num_threads(cfg["torch_threads"])
    model.eval()
    t_start = time.time()
    rows = []
    indices = list(range(len(cfg["prompts"]))) if prompts is None else list(prompts)
    for p_idx in indices:
        prompt = cfg["prompts"][p_idx]
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
    config_out = {**cfg, "command": command, "provenance": record,
                  "wall_seconds": time.time() - t_start, "prompts_run": indices}
    return files.write_results(out or data_path("serving", "decoding_comparison.json", must_exist=False),
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


def decoding_findings(summary: dict, *, reference: str = "alg2", versus=("jacap", "tova"),
                      old_after: int = 512) -> dict:
    """What the serving chapter reads off :func:`decoding_summary`'s ``summary``:

    * ``ranking``: methods by mean KL, lowest first;
    * ``versus``: for each method of ``versus``, ``reference``'s and its mean KL, their ``ratio`` and the
      ``wins`` — prompts on which ``reference``'s per-prompt KL is lower — of ``n_prompts``;
    * ``by_age``: methods by the mean age of their kept tokens, youngest first, with ``mean_age``;
    * ``old_fraction``: per method, the fraction of the final cache in age bins starting at ``old_after``
      tokens or later (the sinks and the prompt, for prompts of that length);
    * ``scoring_share``: per method, the share of the run time spent scoring."""
    if reference not in summary:
        raise ValueError(f"`reference` {reference!r} is not a method of the summary: {list(summary)}")
    missing = [m for m in versus if m not in summary]
    if missing:
        raise ValueError(f"`versus` names methods {missing} that the summary lacks: {list(summary)}")
    ref = summary[reference]
    return {
        "reference": reference,
        "ranking": sorted(summary, key=lambda m: summary[m]["mean_kl"]),
        "versus": {m: {"mean_kl": ref["mean_kl"], "other_mean_kl": summary[m]["mean_kl"],
                       "ratio": ref["mean_kl"] / summary[m]["mean_kl"],
                       "wins": sum(a < b for a, b in zip(ref["per_prompt_kl"], summary[m]["per_prompt_kl"])),
                       "n_prompts": ref["n_prompts"]} for m in versus},
        "by_age": {m: summary[m]["mean_age"] for m in sorted(summary, key=lambda m: summary[m]["mean_age"])},
        "old_after": old_after,
        "old_fraction": {m: sum(f for f, lo in zip(s["age_fraction"], s["age_edges"]) if lo >= old_after)
                         for m, s in summary.items()},
        "scoring_share": {m: s["scoring_share"] for m, s in summary.items()},
    }


def merge_parts(parts, out: Path) -> Path:
    """Join result files of :func:`run_decoding_comparison` run on disjoint prompt subsets of one config."""
    configs, rows = [], []
    for part in parts:
        c, r = files.read_results(part)
        configs.append(c)
        rows.extend(r)
    strip = lambda c: {k: v for k, v in c.items() if k not in ("provenance", "wall_seconds", "prompts_run")}  # noqa: E731
    if any(strip(c) != strip(configs[0]) for c in configs):
        raise ValueError("the parts were run with different configurations; merge only parts of one configuration")
    done = [i for c in configs for i in c["prompts_run"]]
    if len(set(done)) != len(done):
        raise ValueError(f"the parts overlap: prompts {sorted(done)}")
    rows.sort(key=lambda r: r["prompt"])
    merged = {**configs[0], "prompts_run": sorted(done), "wall_seconds": [c["wall_seconds"] for c in configs],
              "parts": len(configs), "provenance": configs[0]["provenance"]}
    return files.write_results(out, merged, rows)


# --------------------------------------------------------------------------------------------- job: jacap compare-decoding
def _add_arguments(p) -> None:
    J.shared_options(p, model=False, threads=False, progress=False, out="default data/serving/decoding_comparison.json")
    p.add_argument("--quick", action="store_true", help="one prompt, 48 tokens, three methods (a smoke run)")
    p.add_argument("--prompts", type=int, nargs="+", default=None,
                   help="indices of the prompts to run (default all); run parts in parallel, then --merge")
    p.add_argument("--merge", type=Path, nargs="+", default=None, help="join these part files into --out")


def _run(args) -> Path:
    if args.out is not None:
        J.check_out_file(args.out, ".json")
    cfg = QUICK if args.quick else CONFIG
    J.check(args.prompts is None or all(0 <= i < len(cfg["prompts"]) for i in args.prompts),
            f"--prompts must be indices in [0, {len(cfg['prompts'])})")
    if args.merge is not None:
        missing = [str(p) for p in args.merge if not p.is_file()]
        J.check(not missing, f"--merge: no such file(s): {missing}")
        path = merge_parts(args.merge, args.out or data_path("serving", "decoding_comparison.json", must_exist=False))
    else:
        from ..models import load_model

        model, tok = load_model()
        path = run_decoding_comparison(model, tok, config=cfg, out=args.out, prompts=args.prompts,
                                       log=lambda msg: print(msg, flush=True), command=args.command)
    print(f"wrote {path}")
    return path


JOB = J.Job("Algorithm 2 vs kvpress DecodingPress, teacher-forced -> data/serving/decoding_comparison.json",
            _add_arguments, _run, description=__doc__)
