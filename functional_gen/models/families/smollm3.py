"""SmolLM3 (transformers' `modeling_smollm3.py`): the Llama layout with RoPE left out on some
layers (`no_rope_layers[i] == 0`; by default every fourth, `no_rope_layer_interval`), and
optional per-layer sliding windows (`use_sliding_window`, `layer_types`)."""

from collections.abc import Mapping, Sequence
from typing import Any

from .common import (
    COMMON_USED_KEYS,
    UnsupportedConfigError,
    activation,
    check_common,
    check_config_keys,
    layer_windows,
    rope_fields,
    rope_parameters,
    size_fields,
    token_fields,
)

MODEL_TYPES = ("smollm3",)
"""`model_type` values this module maps."""

USED_KEYS = COMMON_USED_KEYS | {
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "no_rope_layers",
    "no_rope_layer_interval",
}
"""`config.json` keys read for SmolLM3 (see `common.check_config_keys`)."""


def config_fields(
    d: Mapping[str, Any], extra_eos_token_ids: Sequence[int], supported: Sequence[str]
) -> dict[str, Any]:
    """`DecoderConfig` keyword arguments for a SmolLM3 `config.json` `d`.

    **Raises:** `UnsupportedConfigError` for an unknown key, an activation other than SiLU, an
    unsupported RoPE type, `no_rope_layers` of the wrong length.
    """
    check_config_keys(d, USED_KEYS)
    check_common(d, supported)
    if activation(d, "hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(f"hidden_act={d['hidden_act']!r} is not supported for SmolLM3")
    n = d["num_hidden_layers"]
    interval = d.get("no_rope_layer_interval") or 4
    no_rope = d.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if len(no_rope) != n:
        raise UnsupportedConfigError(f"no_rope_layers has {len(no_rope)} entries for {n} layers")
    window = d.get("sliding_window") if d.get("use_sliding_window") else None
    bias = bool(d.get("attention_bias", False))
    return {
        **size_fields(d),
        **rope_fields(rope_parameters(d), d),
        **token_fields(d, extra_eos_token_ids),
        "attention_bias": bias,
        "attention_out_bias": bias,
        "mlp_bias": bool(d.get("mlp_bias", False)),
        "use_rope": tuple(bool(u) for u in no_rope),
        "sliding_window": layer_windows(d, window),
    }


def hf_weights(weights: Mapping[str, Any], num_hidden_layers: int) -> Mapping[str, Any]:
    """The checkpoint's weights under the decoder's names: the same names (no change)."""
    return weights
