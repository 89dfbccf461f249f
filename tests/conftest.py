"""Shared fixtures: tiny randomly initialised causal LMs with grouped-query attention (no downloads)."""
from __future__ import annotations

import pytest

from jacap_lib.measure.kvpress_grid import tiny_model


@pytest.fixture(scope="session")
def tiny_llama():
    return tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_qwen3():
    return tiny_model("qwen3")
