"""`LlamaConfig`: Hugging Face names in, supported values checked, RoPE as transformers computes it."""

import dataclasses

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
        hidden_size=512,
        num_attention_heads=4,
        rope_parameters=dict(rope),
        max_position_embeddings=131072,
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
    assert (
        config.eos_token_id == (3, 4) and config.num_key_value_heads == 2 and config.head_dim == 4
    )


def test_qwen2_has_qkv_bias_but_no_output_bias():
    config = LlamaConfig.from_hf(
        transformers.Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    )
    assert config.attention_bias and not config.attention_out_bias


def test_hf_dict_round_trip():
    config = tiny_config(
        rope_type="llama3",
        rope_factor=8.0,
        rope_original_max_position_embeddings=64,
        eos_token_id=(5, 6),
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


SMALL = {
    "vocab_size": 10,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}


@pytest.mark.parametrize("cls", ["LlamaConfig", "MistralConfig", "Qwen2Config"])
def test_every_key_transformers_writes_is_known(cls, tmp_path):
    """`save_pretrained` of transformers' own config classes writes only keys we know, and
    `AutoConfig` reading them back (with all of `PretrainedConfig`'s attributes) passes too."""
    hf = getattr(transformers, cls)(**SMALL)
    hf.save_pretrained(str(tmp_path))
    import json

    LlamaConfig.from_hf(json.loads((tmp_path / "config.json").read_text()))
    LlamaConfig.from_hf(transformers.AutoConfig.from_pretrained(str(tmp_path)))
    LlamaConfig.from_hf(hf.to_dict())


def test_smollm2_hub_config_json_is_accepted():
    """The keys of HuggingFaceTB/SmolLM2-135M-Instruct's config.json as published on the Hub
    (nanotron leftovers and transformers.js settings included)."""
    published = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 576,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": 1536,
        "is_llama_config": True,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": 9,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
        "pad_token_id": 2,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_interleaved": False,
        "rope_scaling": None,
        "rope_theta": 100000,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}},
        "transformers_version": "4.42.3",
        "use_cache": True,
        "vocab_size": 49152,
    }
    config = LlamaConfig.from_hf(published)
    assert (config.num_key_value_heads, config.rope_theta, config.eos_token_id) == (3, 1e5, (2,))


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"attn_logit_softcapping": 50.0}, r"unknown config.json key.*attn_logit_softcapping=50.0"),
        ({"some_future_field": 1, "another": "x"}, r"another='x', some_future_field=1"),
        ({"rope_interleaved": True}, "rope_interleaved=True is not supported"),
        ({"sliding_window": 4096}, "sliding_window=4096 on a Llama model"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        (
            {"auto_map": {"AutoModelForCausalLM": "m.Model"}},
            r"custom modeling code.*AutoModelForCausalLM",
        ),
        ({"quantization_config": {"quant_method": "gptq"}}, "quant_method='gptq'"),
    ],
)
def test_unknown_or_unsupported_config_keys_raise_naming_them(extra, message):
    with pytest.raises(UnsupportedConfigError, match=message):
        LlamaConfig.from_hf({"model_type": "llama", **SMALL, **extra})


def test_unknown_key_in_a_checkpoint_is_refused_before_loading_weights(tmp_path):
    import json

    import functional_gen as fg

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", **SMALL, "attn_logit_softcapping": 30.0})
    )
    with pytest.raises(UnsupportedConfigError, match=r"attn_logit_softcapping=30\.0"):
        fg.load_model(tmp_path)


def test_fingerprint_parts_keep_the_llama_name_only_when_no_new_field_is_used():
    """A Llama-family config is fingerprinted as the `LlamaConfig` it was before the families
    joined (saved `SequenceState`s keep matching); any family-specific field makes it a
    `DecoderConfig` fingerprint, so two configs that differ in one never share one."""
    config = tiny_config()
    name, printed = config.fingerprint_parts("DecoderForCausalLM")
    assert name == "LlamaForCausalLM"
    assert repr(printed).startswith("LlamaConfig(vocab_size=")
    assert "qk_norm" not in repr(printed)
    for change in (
        {"qk_norm": True},
        {"hidden_act": "gelu_pytorch_tanh"},
        {"final_logit_softcapping": 30.0},
        {"use_rope": (False,) + (True,) * (config.num_hidden_layers - 1)},
        {
            "rope_type": "longrope",
            "rope_short_factor": (1.0,) * (config.head_dim // 2),
            "rope_long_factor": (2.0,) * (config.head_dim // 2),
        },
    ):
        other = dataclasses.replace(config, **change)
        assert other.fingerprint_parts("DecoderForCausalLM") == ("DecoderForCausalLM", other)
