"""`LlamaConfig`: Hugging Face names in, supported values checked, RoPE as transformers computes it."""

import numpy as np
import pytest

from functional_gen.models import LlamaConfig, UnsupportedConfigError
from functional_gen.testing import tiny_config

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 100000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
def test_rope_inverse_frequencies_equal_transformers(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf = transformers.LlamaConfig(
        hidden_size=512, num_attention_heads=4, rope_parameters=dict(rope), max_position_embeddings=131072
    )
    if rope["rope_type"] == "default":
        expected, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(hf)
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf)
    ours = LlamaConfig.from_hf(hf).rope_inv_freq()
    np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-6)


def test_old_style_rope_scaling_keys_are_read():
    config = LlamaConfig.from_hf(
        {
            "model_type": "llama",
            "vocab_size": 10,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "rope_theta": 5e5,
            "rope_scaling": {"type": "linear", "factor": 2.0},
            "eos_token_id": [3, 4],
        }
    )
    assert (config.rope_type, config.rope_factor, config.rope_theta) == ("linear", 2.0, 5e5)
    assert config.eos_token_id == (3, 4) and config.num_key_value_heads == 2 and config.head_dim == 4


def test_qwen2_has_qkv_bias_but_no_output_bias():
    config = LlamaConfig.from_hf(
        transformers.Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    )
    assert config.attention_bias and not config.attention_out_bias


def test_hf_dict_round_trip():
    config = tiny_config(
        rope_type="llama3", rope_factor=8.0, rope_original_max_position_embeddings=64, eos_token_id=(5, 6)
    )
    again = LlamaConfig.from_hf(config.to_hf_dict())
    assert again == config


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"num_attention_heads": 4, "num_key_value_heads": 3}, ValueError, "multiple of"),
        ({"hidden_size": 0}, ValueError, "`hidden_size` must be a positive integer"),
        ({"rope_type": "dynamic"}, UnsupportedConfigError, "RoPE type 'dynamic' is not supported"),
        ({"head_dim": 15}, ValueError, "even"),
    ],
)
def test_invalid_configs_raise(overrides, error, message):
    with pytest.raises(error, match=message):
        tiny_config(**overrides)
