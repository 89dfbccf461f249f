"""Named settings of Jacap's presses: one literal table, each row saying where its values came from.

A press's class defaults are its own (``JacapPromptPress()``, ``JacapPress()``); the settings the evaluation tuned,
published or measured are rows of :data:`PRESETS`. A row names a registry method and *every* option that changes
what the press does, so it means one press whatever the class defaults become; :meth:`Preset.spec` writes it as a
method spec (the one written-out form, :func:`~jacap_lib.presses.registry.explicit_spec`) and :meth:`Preset.press`
builds it. Two rows are the class defaults themselves (``jacap_prompt_default``, ``jacap_default``): a test fails
when a class default moves without its row.

>>> from jacap_lib.presses.presets import PRESETS
>>> PRESETS["algorithm1_as_published"].spec()
'jacap_prompt[backend=auto,beta=none,centre=tempered,eps=1e-06,gqa=pool,n_future_positions=512,n_queries=none,n_sink=4,noise=1,tau=10,use_out_proj=false,window=32]'
>>> press = PRESETS["algorithm1_as_published"].press(0.75)
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Preset", "PRESETS", "preset", "list_presets"]


@dataclass(frozen=True)
class Preset:
    """One named setting: registry ``method`` with ``options`` (every option that changes the press), and
    ``source``, where the values came from (the paper, a tune rule's choice and its record)."""

    method: str
    options: dict = field(hash=False)
    source: str

    def spec(self, method: str | None = None, **change) -> str:
        """The written-out spec of this setting, ``change`` applied; ``method`` names another registry method of
        the same options (``jacap_prompt_adakv`` on Algorithm 1's settings)."""
        from .registry import explicit_spec

        return explicit_spec(method or self.method, {**self.options, **change})

    def press(self, compression_ratio: float, **change):
        """The press of :meth:`spec` at ``compression_ratio``."""
        from .registry import press_from_spec

        return press_from_spec(self.spec(**change), compression_ratio)


_PUBLISHED = {"backend": "auto", "beta": None, "centre": "tempered", "eps": 1e-6, "gqa": "pool",
              "n_future_positions": 512, "n_queries": None, "n_sink": 4, "noise": 1, "tau": 10,
              "use_out_proj": False, "window": 32}
_CONTEXT_FIRST = {"budget": "global", "centre": "observed", "chunk_size": 2048, "eps": 1e-6,
                  "kvzip_plus_normalization": False, "layerwise": False, "n_sink": 4, "noise": 1, "summary": "jacap",
                  "tau": 3, "window": 0}

#: name -> preset. Literal: each row is written here, not computed from a default.
PRESETS: dict[str, Preset] = {
    "algorithm1_as_published": Preset("jacap_prompt", _PUBLISHED, (
        "Yang et al., Algorithm 1: tau 10 (the paper's ablation), channel noise sigma^2 = 1, flat prompt statistics "
        "(beta none), the tempered centre; with the protection and query summary the protocol's first grids "
        "measured (4 sinks, a 32-token recent window, queries RoPE-averaged over 512 future positions, one "
        "Gaussian per KV head). Every Jacap setting of the first search space is this row with the options it "
        "names changed (experiments.protocol.rules.SEARCH_SPACE); the dev job runs it beside the tuned choice.")),
    "algorithm1_as_ablated": Preset("jacap_prompt", {**_PUBLISHED, "tau": 3, "beta": 0.9}, (
        "Algorithm 1 as tuned when the one-knob ablations ran (the library's defaults then): the first rounds' "
        "tune choice of Algorithm 1's grid, tau 3 with EMA statistics (beta 0.9), at the 32-token window it was "
        "measured with (data/results/eval/choices.json). Every one-knob ablation changes one option of it "
        "(data/results/eval/ablation.jsonl).")),
    "jacap_prompt_default": Preset("jacap_prompt", {
        "backend": "auto", "beta": 0.9, "centre": "observed", "eps": 1e-6, "gqa": "pool", "n_future_positions": 512,
        "n_queries": None, "n_sink": 4, "noise": 1, "tau": 3, "use_out_proj": False, "window": 16}, (
        "JacapPromptPress()'s defaults: the observed centre with a 16-token window, the tune choice of the "
        "capacity press with that centre (jacap_obs, data/results/eval/choices.json), which beat the tempered "
        "centre at tau 3, beta 0.9 in every cell of the dev documents; tau is unused with the observed centre.")),
    "context_as_first_tuned": Preset("jacap", _CONTEXT_FIRST, (
        "JacapPress's defaults on 2026-12-04, when its first grid was tuned: the observed centre, one budget across "
        "layers and heads, KVzip's 4 sinks and one reconstruction chunk of 2,048 tokens, no recent window. Every "
        "setting of the context search space is this row with the options it names changed "
        "(experiments.protocol.rules.CONTEXT_SPACE).")),
    "jacap_default": Preset("jacap", {**_CONTEXT_FIRST, "window": 64}, (
        "JacapPress()'s defaults: the context search space's tune choice by the protocol's rule, a 64-token recent "
        "window (fourth round; data/results/eval/context/choices.json), the other options those of "
        "context_as_first_tuned; the candidate list's default (data/results/eval/candidates.json).")),
}


def preset(name: str) -> Preset:
    """The row ``name`` of :data:`PRESETS` (a ``ValueError`` naming the rows otherwise)."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {name!r}")
    return PRESETS[name]


def list_presets() -> list[str]:
    """The preset names, in the table's order."""
    return list(PRESETS)
