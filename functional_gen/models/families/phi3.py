"""Phi-3 / Phi-3.5 / Phi-4-mini (transformers' `modeling_phi3.py`): the Llama layout with fused
weights, `self_attn.qkv_proj` (queries, keys, values stacked by rows) and `mlp.gate_up_proj`
(gate, then up), the decoder's own layout (every other family's are fused on load, see
`functional_gen.models.families.fused`); partial
rotary (`partial_rotary_factor`, Phi-4-mini: RoPE on the first 3/4 of each head); `longrope`
(`su`) scaling (Phi-3.5, Phi-4-mini); one sliding window for every layer when
`sliding_window` is set (Phi-3-mini)."""

from collections.abc import Mapping, Sequence
from typing import Any

from .common import (
    COMMON_USED_KEYS,
    UnsupportedConfigError,
    activation,
    check_common,
    check_config_keys,
    rope_fields,
    rope_parameters,
    size_fields,
    token_fields,
)

MODEL_TYPES = ("phi3",)
"""`model_type` values this module maps."""

USED_KEYS = COMMON_USED_KEYS | {
    "hidden_act",
    "partial_rotary_factor",
    "original_max_position_embeddings",
    "sliding_window",
    # knobs of Microsoft's remote code (Phi-4-mini's config.json) that transformers' Phi3 does
    # not read; accepted at the values that mean "off" only (`REMOTE_CODE_DEFAULTS`)
    "attention_bias",
    "mlp_bias",
    "lm_head_bias",
    "full_attn_mod",
    "interpolate_factor",
}
"""`config.json` keys read for Phi-3 (see `common.check_config_keys`)."""

REMOTE_CODE_DEFAULTS = {
    "attention_bias": False,
    "mlp_bias": False,
    "lm_head_bias": False,
    "full_attn_mod": 1,
    "interpolate_factor": 1,
}
"""The only accepted value of each remote-code knob in a Phi-3 `config.json`."""


def config_fields(
    d: Mapping[str, Any], extra_eos_token_ids: Sequence[int], supported: Sequence[str]
) -> dict[str, Any]:
    """`DecoderConfig` keyword arguments for a Phi-3 `config.json` `d`.

    **Raises:** `UnsupportedConfigError` for an unknown key, an activation other than SiLU, an
    unsupported RoPE type.
    """
    check_config_keys(d, USED_KEYS)
    check_common(d, supported, allow_auto_map=True)
    if activation(d, "hidden_act", "silu") != "silu":
        raise UnsupportedConfigError(f"hidden_act={d['hidden_act']!r} is not supported for Phi-3")
    for key, off in REMOTE_CODE_DEFAULTS.items():
        if d.get(key, off) not in (off, None):
            raise UnsupportedConfigError(
                f"{key}={d[key]!r} is not supported for Phi-3; expected {off!r} (transformers' "
                "Phi3 has no such option)"
            )
    rope = rope_parameters(d)
    if d.get("partial_rotary_factor") is not None:
        rope.setdefault("partial_rotary_factor", d["partial_rotary_factor"])
    window = d.get("sliding_window")
    return {
        **size_fields(d),
        **rope_fields(rope, d),
        **token_fields(d, extra_eos_token_ids),
        "partial_rotary_factor": float(rope.get("partial_rotary_factor", 1.0)),
        "sliding_window": (window,) * d["num_hidden_layers"],
    }


def hf_weights(weights: Mapping[str, Any], num_hidden_layers: int) -> Mapping[str, Any]:
    """The checkpoint's weights under the decoder's names: unchanged (`self_attn.qkv_proj` and
    `mlp.gate_up_proj` are the decoder's own modules; their shapes are checked against the config
    by `DecoderForCausalLM.from_weights`)."""
    return weights
