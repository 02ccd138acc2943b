"""Gemma 2 and Gemma 3 text (transformers' `modeling_gemma2.py`, `modeling_gemma3.py`; the
`gemma3` GGUF architecture is `gemma3_text`).

Their differences from Llama, all declared as `DecoderConfig` fields: RMSNorm scaled by
`(1 + weight)`; a norm after attention and after the MLP as well as before
(`post_attention_layernorm`, `pre_feedforward_layernorm`, `post_feedforward_layernorm`); GeGLU
(`gelu_pytorch_tanh`); embeddings times `sqrt(hidden_size)`; scores scaled by
`query_pre_attn_scalar ** -0.5`; attention-logit and final-logit soft-capping (Gemma 2);
alternating sliding-window and global layers (`layer_types`), and in Gemma 3 per-head q/k
RMSNorm and a RoPE of its own for the sliding layers (`rope_local_base_freq`, or
`rope_parameters["sliding_attention"]` in transformers 5). The weight names are the decoder's.
"""

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

MODEL_TYPES = ("gemma2", "gemma3_text")
"""`model_type` values this module maps."""

USED_KEYS = COMMON_USED_KEYS | {
    "hidden_act",  # transformers 4's older name of hidden_activation
    "hidden_activation",
    "attention_bias",
    "query_pre_attn_scalar",
    "sliding_window",
    "sliding_window_pattern",  # superseded by layer_types
    "_sliding_window_pattern",
    "layer_types",
    "final_logit_softcapping",
    "attn_logit_softcapping",  # Gemma 2; must be null for Gemma 3
    "rope_local_base_freq",  # Gemma 3, transformers 4
    "use_bidirectional_attention",  # must be false/null (EmbeddingGemma)
    "cache_implementation",  # "hybrid": how PyTorch caches, not what it computes
}
"""`config.json` keys read for Gemma 2 / Gemma 3 text (see `common.check_config_keys`)."""


def config_fields(
    d: Mapping[str, Any], extra_eos_token_ids: Sequence[int], supported: Sequence[str]
) -> dict[str, Any]:
    """`DecoderConfig` keyword arguments for a Gemma 2 or Gemma 3 text `config.json` `d`.

    **Raises:** `UnsupportedConfigError` for an unknown key, an activation other than GELU-tanh
    or SiLU, bidirectional attention, RoPE scaling on the sliding layers, an unsupported RoPE
    type.
    """
    check_config_keys(d, USED_KEYS)
    check_common(d, supported)
    if d.get("use_bidirectional_attention"):
        raise UnsupportedConfigError(
            "use_bidirectional_attention=True (an embedding model) is not supported"
        )
    key = "hidden_activation" if d.get("hidden_activation") else "hidden_act"
    act = activation(d, key, "gelu_pytorch_tanh")
    gemma3 = d["model_type"] == "gemma3_text"
    n = d["num_hidden_layers"]
    if not d.get("layer_types"):
        pattern = d.get("sliding_window_pattern") or d.get("_sliding_window_pattern")
        pattern = pattern or (6 if gemma3 else 2)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        d = {**d, "layer_types": types}
    fields = {
        **size_fields(d),
        **rope_fields(rope_parameters(d, "full_attention"), d),
        **token_fields(d, extra_eos_token_ids),
        "attention_bias": bool(d.get("attention_bias", False)),
        "attention_out_bias": bool(d.get("attention_bias", False)),
        "hidden_act": act,
        "rms_norm_unit_offset": True,
        "sandwich_norms": True,
        "scale_embeddings": True,
        "query_pre_attn_scalar": float(d.get("query_pre_attn_scalar") or fields_head_dim(d)),
        "final_logit_softcapping": _optional_float(d.get("final_logit_softcapping")),
        "attn_logit_softcapping": _optional_float(d.get("attn_logit_softcapping")),
        "sliding_window": layer_windows(d, d.get("sliding_window")),
    }
    if gemma3:
        local = rope_parameters(d, "sliding_attention")
        if isinstance((d.get("rope_parameters") or {}).get("sliding_attention"), Mapping):
            local_fields = rope_fields(local, d)
            if local_fields["rope_type"] != "default":
                raise UnsupportedConfigError(
                    f"rope_parameters['sliding_attention'] rope_type="
                    f"{local_fields['rope_type']!r} is not supported; expected 'default'"
                )
            theta = local_fields["rope_theta"]
        else:
            theta = float(d.get("rope_local_base_freq") or 10000.0)
        fields.update(qk_norm=True, local_rope_theta=theta)
    return fields


def fields_head_dim(d: Mapping[str, Any]) -> int:
    """`head_dim`, or `hidden_size // num_attention_heads` when the config leaves it out."""
    return d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]


def _optional_float(x: Any) -> float | None:
    return None if x is None else float(x)


def hf_weights(weights: Mapping[str, Any], num_hidden_layers: int) -> Mapping[str, Any]:
    """The checkpoint's weights under the decoder's names: the same names (no change)."""
    return weights
