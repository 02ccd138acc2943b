"""tests/oracle_cache.py: transformers' model of a GGUF file read back from the run's cache equals
the model transformers builds from the file (every tensor bit for bit, the config, the logits),
so the tests whose oracle comes from the cache compare with the same reference as before."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from . import helpers
from .loading.test_gguf import VOCAB, write_tiny_gguf
from .oracle_cache import TORCH_GGUF_CACHE, cache_entry, torch_model_from_gguf

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")


def fresh_from_gguf(path):
    """transformers' model of the file as the tests built it before the cache."""
    from transformers import AutoModelForCausalLM

    with helpers.transformers_reads_gguf_with_plain_arrays():
        return AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()


def assert_same_model(ours, reference):
    assert type(ours) is type(reference)
    assert not ours.training
    mine, theirs = ours.state_dict(), reference.state_dict()
    assert list(mine) == list(theirs)
    for name in theirs:
        assert mine[name].dtype == theirs[name].dtype, name
        assert torch.equal(mine[name], theirs[name]), name
    config = reference.config.to_dict()
    config.pop("quantization_config")  # the GGUF quantizer's record, dropped before saving
    assert ours.config.to_dict() == config
    assert ours.generation_config.to_dict() == reference.generation_config.to_dict()
    ids = torch.as_tensor(np.random.default_rng(0).integers(0, VOCAB, (2, 7)))
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, reference(ids).logits)


@pytest.mark.parametrize("tied", [True, False])
def test_a_read_back_oracle_equals_the_model_transformers_builds(tmp_path, monkeypatch, tied):
    path = tmp_path / "files" / "tiny.gguf"
    path.parent.mkdir()
    write_tiny_gguf(path, Q.Q4_K, tied=tied)
    reference = fresh_from_gguf(path)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv(TORCH_GGUF_CACHE, str(cache))

    built = torch_model_from_gguf(path, dtype=torch.float32)
    entry = cache_entry(path, torch.float32)
    assert entry.is_dir() and entry.parent == cache
    assert sorted(p.name for p in cache.iterdir()) == sorted([entry.name, f"{entry.name}.lock"])
    assert_same_model(built, reference)

    def not_again():
        raise AssertionError("the oracle was built again instead of read from the cache")

    # a copy of the file elsewhere has the same entry: read back, not built
    copy = tmp_path / "elsewhere" / "tiny.gguf"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    monkeypatch.setattr(helpers, "transformers_reads_gguf_with_plain_arrays", not_again)
    read_back = torch_model_from_gguf(copy, dtype=torch.float32)
    assert read_back.config._name_or_path == str(copy.parent)
    read_back.config._name_or_path = reference.config._name_or_path
    assert_same_model(read_back, reference)


def test_without_a_cache_directory_the_oracle_is_built(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, Q.Q8_0, tied=True)
    monkeypatch.delenv(TORCH_GGUF_CACHE, raising=False)
    assert cache_entry(path, torch.float32) is None
    assert_same_model(torch_model_from_gguf(path, dtype=torch.float32), fresh_from_gguf(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]
