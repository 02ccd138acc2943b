"""Qwen3 (transformers' `modeling_qwen3.py`): the Llama layout plus an RMSNorm over each head of
the queries and keys before RoPE (`self_attn.q_norm`, `self_attn.k_norm`), `attention_bias` on
all four projections, and Qwen2's per-layer sliding windows (`use_sliding_window`,
`layer_types`)."""

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

MODEL_TYPES = ("qwen3",)
"""`model_type` values this module maps."""

USED_KEYS = COMMON_USED_KEYS | {
    "hidden_act",
    "attention_bias",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",  # superseded by layer_types in transformers 5
    "layer_types",
}
"""`config.json` keys read for Qwen3 (see `common.check_config_keys`)."""


def config_fields(
    d: Mapping[str, Any], extra_eos_token_ids: Sequence[int], supported: Sequence[str]
) -> dict[str, Any]:
    """`DecoderConfig` keyword arguments for a Qwen3 `config.json` `d`.

    **Raises:** `UnsupportedConfigError` for an unknown key, an activation other than SiLU, an
    unsupported RoPE type.
    """
    check_config_keys(d, USED_KEYS)
    check_common(d, supported)
    if activation(d, "hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(f"hidden_act={d['hidden_act']!r} is not supported for Qwen3")
    sliding = qwen_windows(d)
    bias = bool(d.get("attention_bias", False))
    return {
        **size_fields(d),
        **rope_fields(rope_parameters(d), d),
        **token_fields(d, extra_eos_token_ids),
        "attention_bias": bias,
        "attention_out_bias": bias,
        "qk_norm": True,
        "sliding_window": sliding,
    }


def hf_weights(weights: Mapping[str, Any], num_hidden_layers: int) -> Mapping[str, Any]:
    """The checkpoint's weights under the decoder's names: the same names (no change)."""
    return weights
