"""The Llama family: Llama 1/2/3 (Llama 3.1's `llama3` RoPE, Llama 3.2's tied head), SmolLM2,
Mistral and Qwen2: transformers' `modeling_llama.py`, `modeling_mistral.py`, `modeling_qwen2.py`.

The decoder's defaults are this family: RMSNorm times `weight`, SwiGLU, RoPE over the whole
head, one norm before attention and one before the MLP. Weight names are the decoder's own.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from .common import (
    COMMON_USED_KEYS,
    UnsupportedConfigError,
    activation,
    check_common,
    check_config_keys,
    qwen_windows,
    rope_fields,
    rope_parameters,
    size_fields,
    token_fields,
)

MODEL_TYPES = ("llama", "mistral", "qwen2")
"""`model_type` values this module maps."""

USED_KEYS = COMMON_USED_KEYS | {
    "hidden_act",  # must be SiLU
    "partial_rotary_factor",  # must be 1.0
    "attention_bias",
    "mlp_bias",
    "sliding_window",  # Mistral, Qwen2 (with use_sliding_window); must be null for Llama
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
}
"""`config.json` keys read for these model types (see `common.check_config_keys`)."""


def config_fields(
    d: Mapping[str, Any], extra_eos_token_ids: Sequence[int], supported: Sequence[str]
) -> dict[str, Any]:
    """`DecoderConfig` keyword arguments for a Llama, Mistral or Qwen2 `config.json` `d`.

    **Raises:** `UnsupportedConfigError` for an unknown key, an activation other than SiLU,
    partial rotary, a sliding window on a Llama model, an unsupported RoPE type.
    """
    check_config_keys(d, USED_KEYS)
    check_common(d, supported)
    model_type = d["model_type"]
    if model_type == "llama" and d.get("sliding_window") is not None:
        raise UnsupportedConfigError(
            f"sliding_window={d['sliding_window']!r} on a Llama model is not supported; "
            "expected null (Mistral and Qwen2 models have sliding windows)"
        )
    act = activation(d, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedConfigError(
            f"hidden_act={act!r} is not supported for model_type={model_type!r}; the Llama "
            "family uses SwiGLU ('silu')"
        )
    rope = rope_parameters(d)
    if d.get("partial_rotary_factor") is not None:
        rope.setdefault("partial_rotary_factor", d["partial_rotary_factor"])
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedConfigError(
            f"partial_rotary_factor={rope['partial_rotary_factor']!r} is not supported for "
            f"model_type={model_type!r}; expected 1.0 (RoPE over the whole head)"
        )
    num_layers = d["num_hidden_layers"]
    if model_type == "qwen2":
        qkv_bias, out_bias, mlp_bias = True, False, False
        sliding = qwen_windows(d)
    else:
        qkv_bias = out_bias = bool(d.get("attention_bias", False))
        mlp_bias = bool(d.get("mlp_bias", False))
        window = d.get("sliding_window") if model_type == "mistral" else None
        sliding = (window,) * num_layers
    return {
        **size_fields(d),
        **rope_fields(rope, d),
        **token_fields(d, extra_eos_token_ids),
        "attention_bias": qkv_bias,
        "attention_out_bias": out_bias,
        "mlp_bias": mlp_bias,
        "sliding_window": sliding,
    }


def hf_weights(weights: Mapping[str, Any], num_hidden_layers: int) -> Mapping[str, Any]:
    """The checkpoint's weights under the decoder's names: the same names (no change)."""
    return weights
