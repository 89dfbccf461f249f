"""The live-eviction chapter's KL table job: :func:`jacap_lib.measure.eviction.kl_table` on the demo
text -> ``data/live/kl_table.json`` (``{"config", "rows"}``). Command line: ``jacap inspect --kl-table``
(the job ``jacap inspect`` is :data:`jacap_lib.viz.eviction.INSPECT`: it also draws, so it lives with the
drawing, above this layer)."""
from __future__ import annotations

from pathlib import Path

from jacap_lib.results import files
from jacap_lib.results.paths import data_path
from jacap_lib.results.provenance import provenance

__all__ = ["write_kl_table"]


def write_kl_table(model, tok, *, out: Path | None = None, ratios=(0.5, 0.75, 0.9), model_name=None,
                   progress: bool = True) -> Path:
    """Run the KL table on ``DEMO_CONTEXT`` / ``DEMO_CONTINUATION`` and write it with its configuration."""
    import torch

    from jacap_lib.measure.eviction import DEMO_CONTEXT, DEMO_CONTINUATION, kl_table
    from jacap_lib.presses.jacap import JacapPromptPress
    from jacap_lib.presses.registry import build_press, method_options

    torch.manual_seed(0)
    rows = kl_table(model, tok, DEMO_CONTEXT, DEMO_CONTINUATION, ratios=ratios, progress=progress)
    config = {
        "command": "jacap inspect --kl-table",
        "prompt": "jacap_lib.measure.eviction.DEMO_CONTEXT",
        "continuation": "jacap_lib.measure.eviction.DEMO_CONTINUATION",
        "prompt_tokens": len(tok(DEMO_CONTEXT, add_special_tokens=False).input_ids),
        "continuation_tokens": len(tok(DEMO_CONTINUATION, add_special_tokens=False).input_ids),
        "ratios": [float(r) for r in ratios],
        "jacap_prompt": {k: v for k, v in vars(JacapPromptPress()).items() if k not in ("compression_ratio", "trace")},
        "jacap": {k: v for k, v in method_options(build_press("jacap", ratios[0])).items() if k != "compression_ratio"},
        "baselines": "kvpress defaults (random: seed 0)",
        "seed": 0,
        **provenance(model, model_name=model_name),
    }
    return files.write_results(out or data_path("live", "kl_table.json", must_exist=False), config, rows)
