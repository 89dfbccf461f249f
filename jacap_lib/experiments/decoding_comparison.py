"""The serving chapter's decoding comparison: Algorithm 2 against kvpress ``DecodingPress`` with several
scorers at the same cache budget, on sampled generations of the bundled model ->
``data/serving/decoding_comparison.json``. Command line: ``jacap compare-decoding`` (:data:`JOB`;
``--quick`` for a smoke run, ``--workers`` processes, resumable).

A **generation** is one (prompt, sampling seed): its continuation is sampled once without compression
(seeded, EOS suppressed so every generation has ``n_new`` tokens), then every method replays the same
tokens teacher-forced (:func:`jacap_lib.measure.decoding_compare.compare_decoding`). Rows are keyed by
``(prompt, seed, method)``; the file is rewritten after every generation, and a rerun with the same
configuration skips the generations already in it (a file of another configuration is refused).

The methods (:data:`CONFIG` ``methods``, label -> spec; ``method_specs`` in the file records what ran):

* ``alg2``: :class:`jacap_lib.controller.JacapDecodeController` with EMA statistics (the default β);
* ``alg2_flat``: the same controller with flat (cumulative) statistics (``beta=None``), nothing else
  changed -- the one comparison that isolates the query statistics;
* ``jacap_prompt``: ``DecodingPress(JacapPromptPress(centre="tempered"))``: the same score as Algorithm 2's controller (the
  tempered centre; the default observed centre is a prefill choice the controller does not make), the same sinks
  and window, kvpress's wrapper instead of the controller;
* the baselines: TOVA (no option) and StreamingLLM with 1 sink (``streaming_llm[n_sink=1]``, the evaluation's
  prefill tune choice on all 18 tune documents).

Every ``DecodingPress`` runs as :func:`jacap_lib.measure.decoding_compare.positional_decoding_press`:
kvpress 0.5.5 writes the kept tokens back in score order, after which StreamingLLM (which scores by slot
index) would drop its sinks; the wrapper writes them back in position order.

Statistics (:func:`decoding_summary`, :func:`decoding_verdicts`): per generation, a method's KL is its
mean next-token KL over the steps after its first compression (``mean_kl_compressed``). The bootstrap
**resamples prompts**, not generations: the two seeds of one prompt share the prompt's text and the
first tokens of the context, so they are not independent; each prompt's value is the geometric mean of
its seeds' KLs (the geometric-mean ratio over prompts then equals the one over generations, the interval
is honest about the clustering). ``unit="generation"`` resamples generations instead.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from jacap_lib.config import DEFAULTS
from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.results.paths import data_path
from jacap_lib.results.provenance import provenance
from jacap_lib.verdicts.rows import KL_FLOOR

__all__ = ["CONFIG", "QUICK", "COMPARISONS", "run_decoding_comparison", "generation_keys", "decoding_summary",
           "decoding_verdicts", "decoding_findings", "JOB"]

_PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain step by step how a refrigerator keeps food cold.",
    "Write a tutorial on reading and writing CSV files in Python, with code examples.",
    "Write a dialogue between a baker and a customer who wants a cake for a wedding.",
    "List twenty ideas for a rainy weekend at home and explain each one.",
    "Write a letter to a friend describing your first week in a new city.",
    "Explain how a bicycle's gears work and when to shift them.",
    "Write a story about a robot who learns to paint.",
    "How do I plant and care for tomatoes in a small garden? Give detailed steps.",
    "Write a tutorial on Python list comprehensions with many examples.",
    "Write a conversation between two students planning a science fair project.",
    "Explain why the sky is blue and why sunsets are red.",
    "Write a fairy tale about a fox, a crow and a lost golden key.",
    "Explain how to write a good cover letter for a first job.",
    "Write a JavaScript tutorial that builds a simple to-do list in the browser.",
    "List the planets of the solar system and describe each in a few sentences.",
    "Write a letter from a grandmother to her grandson who is starting university.",
    "Explain how vaccines teach the immune system to fight a disease.",
    "Write a story about two children who build a raft and sail down a river.",
    "Explain step by step how to bake a loaf of bread at home.",
    "Write a tutorial on SQL SELECT queries with examples on a table of books.",
    "Write a dialogue between a detective and a witness about a stolen painting.",
    "Explain how a computer turns source code into a running program.",
    "Write a travel guide for a three-day visit to a mountain village.",
]

# Sizing, measured here (one torch thread; the two cores shared with another long job). `--quick` (3 generations
# of 40 tokens, 5 methods, --workers 2): 87 CPU-s in all, ~24 s of them loading the model in 3 processes, so
# ~0.075 CPU-s per decode step; per method 64-84 ms/step with one worker running, 130-200 ms with two (4
# processes on 2 cores). Every method costs about the same per step at these cache sizes (the forward
# dominates): Algorithm 2 ~1.15-1.3x the others (its per-step statistics), Expected Attention ~1.3x, sampling ~1x.
# A generation = sampling + the uncompressed replay + M methods ~= (M + 2.5) step-equivalents x n_new.
# Budget ~60 CPU-min = 3600 CPU-s over 24 prompts x 2 seeds = 48 generations:
#     48 x (M + 2.5) x n_new x 0.075 <= 3600   ->   (M + 2.5) x n_new <= 1000.
# M = 5 (alg2, alg2_flat, jacap, tova, streaming_llm) and n_new = 128: 48 x 7.5 x 128 x 0.075 ~= 3460 CPU-s
# ~= 58 CPU-min (~30 min wall on 2 free cores, up to ~1 h while another job holds them). KNorm and Expected
# Attention would bring it to ~75 CPU-min: over budget, left out (add them to `methods` to run them; a changed
# config needs a new --out, since a file of another configuration is refused).
# budget = 64 of ~41-46 prompt + 128 new tokens: every method first compresses about 32 steps in, so ~95 of the
# 128 steps are judged; 28 of the 64 slots are chosen by the score (4 sinks + 32 window protected).
CONFIG = {
    "prompts": _PROMPTS,
    "seeds": [0, 1],
    "chat_template": True,
    "n_new": 128,
    "sampling": {"temperature": 0.8, "top_p": 0.95, "eos_suppressed": True},
    "budget": 64,
    "interval": 16,
    "window": DEFAULTS.window,
    "n_sink": DEFAULTS.n_sink,
    "beta": DEFAULTS.decode_beta,
    "methods": {"alg2": "alg2", "alg2_flat": "alg2[beta=none]", "jacap_prompt": "jacap_prompt[centre=tempered]", "tova": "tova",
                "streaming_llm": "streaming_llm[n_sink=1]"},
    "method_notes": {
        "alg2": "JacapDecodeController(high=budget+interval, budget, interval, beta, n_sink, window)",
        "alg2_flat": "the same controller with beta=None (flat cumulative statistics); nothing else differs",
        "jacap_prompt": "DecodingPress(JacapPromptPress(n_sink, window, centre='tempered')) (library defaults otherwise: the score of "
                 "Algorithm 2's controller), compression_interval=interval, "
                 "target_size=budget, hidden_states_buffer_size=256",
        "others": "DecodingPress(<registry press, its prefill-tune choice from data/results/eval/choices.json>, "
                  "compression_interval=interval, target_size=budget, hidden_states_buffer_size=256)",
        "wrapper": "every DecodingPress writes the kept tokens back in position order (kvpress 0.5.5 writes them in "
                   "score order, after which StreamingLLM would score by slot index and drop its sinks)",
    },
    "choices_from": "data/results/eval/choices.json",
    "kl_bins": 32,
    "kl_floor": KL_FLOOR,
    "torch_threads": 1,
}
QUICK = {**CONFIG, "prompts": _PROMPTS[:3], "seeds": [0], "n_new": 40, "budget": 24, "interval": 8, "window": 8}

# the verdict family: (method, reference, what the pair isolates)
COMPARISONS = [
    ("alg2", "alg2_flat", "the query statistics alone: EMA vs flat, same controller"),
    ("alg2", "jacap_prompt", "no single cause: two systems with the same score, sinks and window: statistics, buffering, RoPE averaging and "
                      "per-layer compression differ at once"),
]


def _family(methods) -> list[tuple[str, str, str]]:
    base = [m for m in methods if m not in ("alg2", "alg2_flat", "jacap_prompt")]
    fam = [c for c in COMPARISONS if c[0] in methods and c[1] in methods]
    fam += [("alg2", b, "no single cause: two systems whose controller, statistics and score all differ") for b in base if "alg2" in methods]
    fam += [("jacap_prompt", b, "the selection rule, same DecodingPress wrapper: Jacap's score with its protected sinks and "
                         "window against the baseline's own rule") for b in base if "jacap_prompt" in methods]
    return fam


def _check_config(cfg: dict) -> dict:
    """The method specs of ``cfg`` checked (bad ones raise ``ValueError``); returns the press options per method."""
    from jacap_lib.measure.decoding_compare import build_decoding_press, decoding_methods, parse_decoding_method
    from jacap_lib.presses.registry import method_options

    decoding_methods(list(cfg["methods"].values()))
    out = {}
    for label, spec in cfg["methods"].items():
        name, opts = parse_decoding_method(spec)
        if name == "alg2":
            out[label] = {"class": "JacapDecodeController", "beta": opts.get("beta", cfg["beta"]),
                          "high": cfg["budget"] + cfg["interval"], "budget": cfg["budget"], "interval": cfg["interval"],
                          "n_sink": cfg["n_sink"], "window": cfg["window"]}
        else:
            out[label] = method_options(build_decoding_press(spec, budget=cfg["budget"], interval=cfg["interval"],
                                                             n_sink=cfg["n_sink"], window=cfg["window"]))
    return out


def generation_keys(cfg: dict) -> list[tuple[int, int]]:
    """Every generation of ``cfg``: ``(prompt index, seed)``."""
    return [(p, s) for p in range(len(cfg["prompts"])) for s in cfg["seeds"]]


def _sample(model, tok, prompt: str, seed: int, cfg: dict):
    import torch

    inputs = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    s = cfg["sampling"]
    torch.manual_seed(seed)
    with torch.no_grad():
        seq = model.generate(**inputs, do_sample=True, temperature=s["temperature"], top_p=s["top_p"],
                             max_new_tokens=cfg["n_new"], min_new_tokens=cfg["n_new"])
    return seq, int(inputs["input_ids"].shape[1])


def run_generation(model, tok, cfg: dict, p_idx: int, seed: int) -> list[dict]:
    """The rows of one generation: one per method and one ``"uncompressed"`` row."""
    import torch

    from jacap_lib.measure.decoding_compare import compare_decoding

    torch.set_num_threads(cfg["torch_threads"])
    model.eval()
    t0 = time.time()
    seq, n_prompt = _sample(model, tok, cfg["prompts"][p_idx], seed, cfg)
    t_sample = time.time() - t0
    res = compare_decoding(model, seq, n_prompt, cfg["methods"], budget=cfg["budget"], interval=cfg["interval"],
                           window=cfg["window"], n_sink=cfg["n_sink"], beta=cfg["beta"], bins=cfg["kl_bins"])
    key = {"prompt": p_idx, "seed": seed}
    rows = [{**key, "method": name, "n_prompt": n_prompt, **row,
             "seconds_per_step": row["seconds"] / max(res["reference"]["n_steps"], 1)}
            for name, row in res["methods"].items()]
    rows.append({**key, "method": "uncompressed", "n_prompt": n_prompt, "seconds": res["reference"]["seconds"],
                 "sample_seconds": t_sample, "peak_cache": res["reference"]["peak_cache"],
                 "seconds_per_step": res["reference"]["seconds"] / max(res["reference"]["n_steps"], 1),
                 "generated_text": tok.decode(seq[0, n_prompt:])})
    return rows


def _generation(model, tok, task):
    """One generation ``task = (cfg, prompt index, seed)`` in a spawned worker
    (:func:`~jacap_lib.experiments.protocol.map_in_workers`): its rows and the worker's provenance record."""
    cfg, p_idx, seed = task
    return run_generation(model, tok, cfg, p_idx, seed), provenance(model)


_VOLATILE = ("command", "provenance", "wall_seconds", "generations_done", "workers")


def _stable(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in _VOLATILE}


def existing_rows(path: Path, config: dict) -> list[dict]:
    """The rows already in ``path`` if it was made under ``config`` (else ``ValueError`` saying what differs);
    ``[]`` when there is no file."""
    path = Path(path)
    if not path.is_file():
        return []
    old, rows = files.read_results(path)
    a, b = _stable(old), _stable(config)
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if diff:
        raise ValueError(f"{path} holds a run of another configuration (differs in: {', '.join(diff)}); give another "
                         "--out, or delete it to start over")
    return rows


def run_decoding_comparison(model=None, tok=None, *, config: dict | None = None, out: Path | None = None,
                            workers: int = 1, progress: bool = True, log=print,
                            command: str = "jacap compare-decoding") -> Path:
    """Run every generation x method of ``config`` (default :data:`CONFIG`) not yet in ``out``, rewriting
    ``out`` after each generation. ``workers > 1``: that many spawned processes (each loads the bundled model),
    one generation per task; else in this process with ``model``/``tok`` (loaded when not given)."""
    from tqdm.auto import tqdm

    from jacap_lib.experiments.protocol import _WORKER, _init_worker, map_in_workers

    cfg = dict(CONFIG if config is None else config)
    out = Path(out or data_path("serving", "decoding_comparison.json", must_exist=False))
    specs = _check_config(cfg)
    cfg["method_specs"] = specs
    rows = existing_rows(out, cfg)
    done = {(r["prompt"], r["seed"]) for r in rows if r["method"] == "uncompressed"}
    rows = [r for r in rows if (r["prompt"], r["seed"]) in done]  # a generation counts only when complete
    todo = [k for k in generation_keys(cfg) if k not in done]
    log(f"{len(done)} generation(s) already in {out}, {len(todo)} to run ({len(cfg['methods'])} methods each)")
    t_start = time.time()
    old = files.read_results(out)[0] if rows else {}
    record, wall_before = old.get("provenance"), float(old.get("wall_seconds", 0.0))

    def save():
        order = {m: i for i, m in enumerate([*cfg["methods"], "uncompressed"])}
        rows.sort(key=lambda r: (r["prompt"], r["seed"], order[r["method"]]))
        gens = sorted({(r["prompt"], r["seed"]) for r in rows})
        files.write_results(out, {**cfg, "command": command, "provenance": record, "workers": workers,
                                  "wall_seconds": wall_before + time.time() - t_start,
                                  "generations_done": [list(g) for g in gens]}, rows)

    bar = tqdm(total=len(todo), desc="generations", disable=not progress)
    try:
        if not todo:
            pass
        elif workers <= 1:
            if model is None:
                _init_worker(None, cfg["torch_threads"], 0)
                model, tok = _WORKER["model"], _WORKER["tok"]
            record = provenance(model)
            for p, s in todo:
                rows.extend(run_generation(model, tok, cfg, p, s))
                save()
                bar.update(1)
        else:
            for got, record in map_in_workers(_generation, [(cfg, p, s) for p, s in todo], workers=workers,
                                              threads=cfg["torch_threads"]):
                rows.extend(got)
                save()
                bar.update(1)
        if not todo:
            save()
    finally:
        bar.close()
    return out


# --------------------------------------------------------------------------------------------- statistics
def _per_generation(rows: list, key: str = "mean_kl_compressed", floor: float = KL_FLOOR) -> dict:
    """``{method: {(prompt, seed): max(row[key], floor)}}``."""
    out: dict = {}
    for r in rows:
        if r["method"] != "uncompressed":
            out.setdefault(r["method"], {})[(r["prompt"], r["seed"])] = max(float(r[key]), floor)
    return out


def _units(values: dict, keys: list, unit: str) -> list[float]:
    """Per-unit values from per-generation ``values`` at ``keys``: the generations themselves, or per prompt the
    geometric mean over its seeds."""
    if unit == "generation":
        return [values[k] for k in keys]
    if unit != "prompt":
        raise ValueError(f"`unit` must be 'prompt' or 'generation', got {unit!r}")
    by: dict = {}
    for k in keys:
        by.setdefault(k[0], []).append(math.log(values[k]))
    return [math.exp(sum(v) / len(v)) for _, v in sorted(by.items())]


def decoding_summary(rows: list, *, unit: str = "prompt", floor: float = KL_FLOOR, n_resamples: int = 9999) -> dict:
    """Per method (in the order they first appear): ``gm_kl`` -- the geometric mean over generations of the
    per-generation mean KL over the steps after the first compression (floored at ``floor``) -- with its 95 %
    BCa bootstrap interval ``gm_low``/``gm_high`` (``unit`` resampled: ``"prompt"``, the seeds of a prompt
    together, or ``"generation"``); ``n_generations``, ``n_units``; and the means over generations of
    ``mean_kl``, ``mean_kl_compressed``, ``p90_kl``, ``top1_agree``, ``scoring_share``, ``mean_age``,
    ``seconds_per_step``, ``peak_cache`` (max), the pooled ``age_fraction`` per age bin and the ``kl_binned`` curve."""
    from jacap_lib.verdicts.intervals import geometric_mean

    per = _per_generation(rows, floor=floor)
    by: dict = {}
    for r in rows:
        if r["method"] != "uncompressed":
            by.setdefault(r["method"], []).append(r)
    summary = {}
    for name, rs in by.items():
        n = len(rs)
        mean = lambda key: sum(r[key] for r in rs) / n  # noqa: E731
        keys = sorted(per[name])
        vals = _units(per[name], keys, unit)
        if len(vals) >= 3:
            gm = geometric_mean(vals, n_resamples=n_resamples)
            est, lo, hi = gm.estimate, gm.low, gm.high
        else:
            est, lo, hi = math.exp(sum(math.log(v) for v in vals) / len(vals)), float("nan"), float("nan")
        counts = [sum(r["age_counts"][i] for r in rs) for i in range(len(rs[0]["age_counts"]))]
        total = max(sum(counts), 1)
        summary[name] = {
            "gm_kl": est, "gm_low": lo, "gm_high": hi, "unit": unit, "n_generations": n, "n_units": len(vals),
            "mean_kl": mean("mean_kl"), "mean_kl_compressed": mean("mean_kl_compressed"), "p90_kl": mean("p90_kl"),
            "top1_agree": mean("top1_agree"), "peak_cache": max(r["peak_cache"] for r in rs),
            "scoring_share": mean("scoring_share"), "mean_age": mean("mean_age"),
            "seconds_per_step": sum(r.get("seconds_per_step", r["seconds"] / len(r.get("kl", [1]))) for r in rs) / n,
            "age_edges": rs[0]["age_edges"], "age_fraction": [c / total for c in counts],
            "kl_binned": [sum(r["kl_binned"][i] for r in rs) / n for i in range(len(rs[0]["kl_binned"]))],
            "bin_edges": rs[0]["bin_edges"], "per_generation_kl": [per[name][k] for k in keys],
        }
    return summary


def decoding_verdicts(rows: list, *, unit: str = "prompt", floor: float = KL_FLOOR, family=None, **options) -> list[dict]:
    """Paired comparisons of methods on the same generations through :func:`jacap_lib.verdicts.intervals.compare_cells`:
    per pair (method, reference) the per-unit KLs (``unit`` as in :func:`decoding_summary`: a prompt's value is the
    geometric mean of its seeds' mean KLs after the first compression), the geometric-mean and mean-KL ratios
    (method / reference; below 1 = the method is better) with BCa intervals, wins (units where the method's KL is
    lower), the Wilcoxon p-value, Holm over the family, and the verdict sentence (from the geometric-mean interval
    adjusted for the family's comparisons, the 95 % one's in ``verdict_unadjusted``). ``family``: list of
    ``(method, reference, isolates)`` (default: alg2 vs alg2_flat, alg2 vs jacap_prompt, alg2 and jacap_prompt vs each
    baseline present). Each row adds ``method``, ``reference`` and ``isolates``."""
    from jacap_lib.verdicts.intervals import compare_cells

    per = _per_generation(rows, floor=floor)
    fam = _family(list(per)) if family is None else list(family)
    if not fam:
        raise ValueError(f"no comparison of the family has both methods in the rows (methods: {sorted(per)})")
    cells = {}
    for m, ref, _ in fam:
        if m not in per or ref not in per:
            raise ValueError(f"comparison {m} vs {ref}: the rows lack {[x for x in (m, ref) if x not in per]}")
        keys = sorted(set(per[m]) & set(per[ref]))
        cells[f"{m} vs {ref}"] = (_units(per[m], keys, unit), _units(per[ref], keys, unit))
    out = compare_cells(cells, **options)
    for row, (m, ref, what) in zip(out, fam):
        row.update({"method": m, "reference": ref, "isolates": what, "unit": unit})
    return out


def decoding_findings(summary: dict, *, reference: str = "alg2", old_after: int = 128) -> dict:
    """What the serving chapter reads off :func:`decoding_summary`'s ``summary``: ``ranking`` (methods by
    geometric-mean KL, lowest first), ``by_age`` (methods by the mean age of their kept tokens, youngest first),
    ``old_fraction`` (per method, the fraction of the final cache in age bins starting at ``old_after`` tokens or
    later) and ``scoring_share`` (per method, the share of the run time spent scoring)."""
    if reference not in summary:
        raise ValueError(f"`reference` {reference!r} is not a method of the summary: {list(summary)}")
    return {
        "reference": reference,
        "ranking": sorted(summary, key=lambda m: summary[m]["gm_kl"]),
        "by_age": {m: summary[m]["mean_age"] for m in sorted(summary, key=lambda m: summary[m]["mean_age"])},
        "old_after": old_after,
        "old_fraction": {m: sum(f for f, lo in zip(s["age_fraction"], s["age_edges"]) if lo >= old_after)
                         for m, s in summary.items()},
        "scoring_share": {m: s["scoring_share"] for m, s in summary.items()},
    }


# --------------------------------------------------------------------------------------------- job: jacap compare-decoding
def _add_arguments(p) -> None:
    J.shared_options(p, model=False, threads=False, out="default data/serving/decoding_comparison.json")
    p.add_argument("--quick", action="store_true", help="three prompts x one seed, 40 tokens, budget 24 (a smoke run)")
    p.add_argument("--workers", type=int, default=2, help="processes, one generation per task (default 2)")


def _run(args) -> Path:
    if args.out is not None:
        J.check_out_file(args.out, ".json")
    J.check(args.workers >= 1, f"--workers must be >= 1, got {args.workers}")
    cfg = dict(QUICK if args.quick else CONFIG)
    out = args.out or data_path("serving", "decoding_comparison.json", must_exist=False)
    try:
        cfg["method_specs"] = _check_config(cfg)
        existing_rows(out, cfg)
    except ValueError as e:
        raise J.BadArgument(str(e)) from None
    path = run_decoding_comparison(config=cfg, out=out, workers=args.workers, progress=not args.no_progress,
                                   log=lambda msg: print(msg, flush=True), command=args.command)
    print(f"wrote {path}")
    return path


JOB = J.Job("Algorithm 2 vs kvpress DecodingPress, teacher-forced -> data/serving/decoding_comparison.json",
            _add_arguments, _run, description=__doc__)
