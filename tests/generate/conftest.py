from __future__ import annotations

import pytest

from onnx_prepared.generate import TinyLlmConfig, generate_tiny_llm

# Tiny but structurally complete: 2 blocks, grouped KV heads (4 query heads share 2 KV heads),
# K = 64 and 128 give several INT4 blocks per row.
SMALL = TinyLlmConfig(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=256, context_length=64)


@pytest.fixture(scope="session")
def small_config() -> TinyLlmConfig:
    return SMALL


@pytest.fixture(scope="session")
def small_model(tmp_path_factory) -> str:
    """The SMALL model (genai's CPU default accuracy_level=4), generated once per session."""
    return generate_tiny_llm(tmp_path_factory.mktemp("tiny-llm"), config=SMALL)
