"""Damaged files of a Hugging Face checkpoint directory raise `CheckpointError` naming the file
and what is wrong ("truncated", "not JSON", "missing key"), with the library's own exception as
`__cause__` (issue 43, item 4). The damaged files are written by the tests from a real
checkpoint (a tiny transformers Llama saved with `save_pretrained`)."""

import json

import pytest

import functional_gen as fg
from functional_gen.loading.errors import CheckpointError

from ..helpers import save_checkpoint, tiny_hf_model
from .compilations import count_compilations

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def hf_model():
    return tiny_hf_model("llama")


@pytest.fixture
def checkpoint(hf_model, tmp_path):
    return save_checkpoint(hf_model, tmp_path / "ckpt")


def load_error(path) -> CheckpointError:
    with count_compilations() as compiled, pytest.raises(CheckpointError) as err:
        fg.load_model(path)
    assert compiled == [], "a damaged checkpoint must be refused before anything is compiled"
    return err.value


def truncate(file, keep):
    data = file.read_bytes()
    file.write_bytes(data[: keep if keep >= 0 else len(data) + keep])


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_a_truncated_json_file_says_truncated(checkpoint, name):
    file = checkpoint / name
    truncate(file, len(file.read_bytes()) // 2)
    err = load_error(checkpoint)
    assert str(file) in str(err)
    assert "truncated" in str(err)
    assert isinstance(err.__cause__, json.JSONDecodeError)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"model_type: llama\nhidden_size: 64\n", "not JSON"),
        (b'{"model_type": "llama",, "hidden_size": 64}', "not JSON"),
        (b"", "empty"),
        (b"  \n", "empty"),
        (b'["model_type", "llama"]', "not a JSON object"),
        (b'{"model_type": "ll\xff\xfeama"}', "not UTF-8"),
    ],
)
def test_a_config_json_that_is_not_a_json_object_is_named(checkpoint, content, says):
    (checkpoint / "config.json").write_bytes(content)
    err = load_error(checkpoint)
    assert str(checkpoint / "config.json") in str(err)
    assert says in str(err)


def test_not_json_names_the_line_and_column(checkpoint):
    (checkpoint / "config.json").write_text('{\n  "model_type": "llama"\n  "hidden_size": 64\n}')
    err = load_error(checkpoint)
    assert "not JSON" in str(err)
    assert "line 3, column 3" in str(err)
    assert err.__cause__.lineno == 3


def test_the_error_is_still_a_value_error(checkpoint):
    (checkpoint / "config.json").write_text("{")
    with pytest.raises(ValueError, match="truncated"):
        fg.load_model(checkpoint)


@pytest.fixture
def sharded(hf_model, tmp_path):
    path = save_checkpoint(hf_model, tmp_path / "sharded", max_shard_size="60KB")
    assert (path / "model.safetensors.index.json").is_file()
    return path


def test_a_truncated_index_is_named(sharded):
    index = sharded / "model.safetensors.index.json"
    truncate(index, -20)
    err = load_error(sharded)
    assert str(index) in str(err) and "truncated" in str(err)
    assert isinstance(err.__cause__, json.JSONDecodeError)


def test_an_index_without_a_weight_map_names_the_key(sharded):
    index = sharded / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 10}}))
    err = load_error(sharded)
    assert str(index) in str(err)
    assert "missing key `weight_map`" in str(err)


@pytest.mark.parametrize("cut", ["data", "header", "length"])
def test_a_truncated_safetensors_file_says_truncated(checkpoint, cut):
    from safetensors import SafetensorError

    file = checkpoint / "model.safetensors"
    size = len(file.read_bytes())
    keep = {"data": size - 1000, "header": 40, "length": 5}[cut]
    truncate(file, keep)
    err = load_error(checkpoint)
    assert str(file) in str(err)
    assert "truncated" in str(err)
    assert f"{keep} bytes" in str(err)
    assert isinstance(err.__cause__, SafetensorError)


def test_a_truncated_shard_is_named(sharded):
    shard = sorted(sharded.glob("*.safetensors"))[-1]
    truncate(shard, -1)
    err = load_error(sharded)
    assert str(shard) in str(err) and "truncated" in str(err)


def test_a_file_that_is_not_safetensors_is_named(checkpoint):
    file = checkpoint / "model.safetensors"
    file.write_bytes(b"PK\x03\x04 this is a zip archive, not safetensors " * 4)
    err = load_error(checkpoint)
    assert str(file) in str(err)
    assert "not a safetensors file" in str(err)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_damaged_tokenizer_file_is_named(checkpoint, name):
    file = checkpoint / name
    truncate(file, len(file.read_bytes()) // 3)
    err = load_error(checkpoint)
    assert str(file) in str(err)
    assert "truncated" in str(err)
    assert isinstance(err.__cause__, json.JSONDecodeError)
