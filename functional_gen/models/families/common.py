"""What every family module shares: the error type, the allow-list check of `config.json` keys,
and the readers of the fields most families spell alike (sizes, RoPE, special tokens).

A family module (`llama.py`, `qwen3.py`, ...) maps one `config.json` onto the keyword
arguments of `functional_gen.models.config.DecoderConfig`, and its Hugging Face weight names
onto the decoder's module tree; everything here helps it do so without repeating itself. The
check is an allow-list, as penzai's: every key of `config.json` is read by the family
(`USED_KEYS` of the family module), known not to change the forward pass (`IGNORED_CONFIG_KEYS`),
or an error that names it, so a field that a later transformers adds cannot pass unnoticed.
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class UnsupportedConfigError(ValueError):
    """A checkpoint asks for an architecture or a config value that the decoder does not implement."""


SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
"""RoPE variants the decoder implements (`rope_parameters["rope_type"]`; `su` is read as
`longrope`, as transformers does)."""

SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
"""Activations of the gated MLP (`hidden_act` / `hidden_activation`): SwiGLU or GeGLU (tanh)."""

COMMON_USED_KEYS = frozenset(
    {
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "pretraining_tp",  # must be 1
        "rope_interleaved",  # must be false (SmolLM2's config.json has it)
        "quantization_config",  # must be absent
        "auto_map",  # must not name custom modeling code
    }
)
"""`config.json` keys every family reads (some only to check their value)."""

IGNORED_CONFIG_KEYS = frozenset(
    {
        # bookkeeping
        "_name_or_path",
        "architectures",
        "transformers_version",
        "transformers.js_config",  # settings of another runtime (SmolLM2)
        "is_llama_config",  # a nanotron export flag (SmolLM2)
        # the stored weights' dtype: the dtype is chosen at load time
        "dtype",
        "torch_dtype",
        "use_bfloat16",
        # training only
        "initializer_range",
        "attention_dropout",
        "hidden_dropout",
        "embd_pdrop",
        "resid_pdrop",
        # what a PyTorch forward returns or how it is run, not what it computes
        "use_cache",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "chunk_size_feed_forward",
        "pruned_heads",
        "tie_encoder_decoder",
        "_attn_implementation_autoset",
        # heads and tasks other than causal LM, encoder-decoder models
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "task_specific_params",
        "tokenizer_class",
        "prefix",
        "is_encoder_decoder",
        "is_decoder",
        "add_cross_attention",
        "cross_attention_hidden_size",
        "decoder_start_token_id",
        "sep_token_id",
        "tf_legacy_loss",
        # transformers 4's generation parameters kept in config.json: generation settings come
        # from generation_config.json (they do not change the forward pass)
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
    }
)
"""`config.json` keys known not to change the forward pass of a causal LM at inference."""


def check_config_keys(d: Mapping[str, Any], used: Iterable[str]) -> None:
    """Refuse any `config.json` key that is neither in `used` (the family's keys) nor known to
    be irrelevant to the forward pass (`IGNORED_CONFIG_KEYS`).

    **Raises:** `UnsupportedConfigError` naming every unknown key and its value.
    """
    known = frozenset(used) | IGNORED_CONFIG_KEYS
    unknown = sorted(k for k in d if k not in known)
    if unknown:
        listed = ", ".join(f"{k}={d[k]!r}" for k in unknown)
        raise UnsupportedConfigError(
            f"unknown config.json key(s) for model_type={d.get('model_type')!r}: {listed}. The "
            "decoder does not know what they do, so the checkpoint may not run as intended; "
            "known keys are the family module's USED_KEYS and "
            "functional_gen.models.families.common.IGNORED_CONFIG_KEYS"
        )


def check_common(
    d: Mapping[str, Any], supported: Sequence[str], *, allow_auto_map: bool = False
) -> None:
    """The refusals every family shares: interleaved rotary halves, custom modeling code
    (`auto_map`, unless `allow_auto_map`: Microsoft ships Phi-3's remote code beside the
    implementation transformers has had since 4.40, which `AutoModel` uses without
    `trust_remote_code`), a quantized checkpoint, `pretraining_tp` other than 1.

    **Raises:** `UnsupportedConfigError` naming the key and its value.
    """
    if d.get("rope_interleaved"):
        raise UnsupportedConfigError(
            "rope_interleaved=True is not supported; the decoder rotates halves (rotate_half)"
        )
    custom = sorted(k for k in d.get("auto_map") or {} if k.startswith("AutoModel"))
    if custom and not allow_auto_map:
        raise UnsupportedConfigError(
            f"auto_map names custom modeling code for {custom}; only the standard "
            f"{tuple(supported)} architectures are supported"
        )
    if d.get("quantization_config"):
        method = d["quantization_config"].get("quant_method", "?")
        raise UnsupportedConfigError(
            f"quantized checkpoints are not supported (quantization_config.quant_method="
            f"{method!r}); use a float16/bfloat16/float32 checkpoint or a GGUF file"
        )
    if d.get("pretraining_tp", 1) not in (None, 1):
        raise UnsupportedConfigError(
            f"pretraining_tp={d['pretraining_tp']!r} is not supported; expected 1"
        )


def activation(d: Mapping[str, Any], key: str, default: str) -> str:
    """The MLP activation named by `d[key]`, `"silu"` (also spelled `swish`) or
    `"gelu_pytorch_tanh"` (also `gelu_tanh`).

    **Raises:** `UnsupportedConfigError` naming `key` for any other activation.
    """
    act = d.get(key) or default
    act = {"swish": "silu", "gelu_tanh": "gelu_pytorch_tanh"}.get(act, act)
    if act not in SUPPORTED_ACTIVATIONS:
        raise UnsupportedConfigError(
            f"{key}={act!r} is not supported; supported activations: {SUPPORTED_ACTIVATIONS}"
        )
    return act


def rope_parameters(d: Mapping[str, Any], layer_type: str | None = None) -> dict[str, Any]:
    """RoPE settings from either transformers-5 `rope_parameters` or older `rope_theta` /
    `rope_scaling`; with `layer_type`, the entry of a per-layer-type `rope_parameters`
    (`{"sliding_attention": {...}, "full_attention": {...}}`, Gemma 3) when there is one."""
    params = dict(d.get("rope_parameters") or {})
    if layer_type is not None and isinstance(params.get(layer_type), Mapping):
        params = dict(params[layer_type])
    scaling = d.get("rope_scaling")
    if scaling and not any(isinstance(v, Mapping) for v in scaling.values()):
        params = {**dict(scaling), **params}
    if "rope_theta" not in params and d.get("rope_theta") is not None:
        params["rope_theta"] = d["rope_theta"]
    return params


def rope_fields(rope: Mapping[str, Any], d: Mapping[str, Any]) -> dict[str, Any]:
    """The `DecoderConfig` RoPE fields of one RoPE parameter dict (see `rope_parameters`).

    **Raises:** `UnsupportedConfigError` naming the `rope_scaling` type outside
    `SUPPORTED_ROPE_TYPES`.
    """
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    rope_type = "longrope" if rope_type == "su" else rope_type
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedConfigError(
            f"rope_scaling type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
        )
    max_pos = d.get("max_position_embeddings", 2048)
    original = int(
        rope.get("original_max_position_embeddings")
        or d.get("original_max_position_embeddings")
        or max_pos
    )
    fields: dict[str, Any] = {
        "rope_theta": float(rope.get("rope_theta", 10000.0)),
        "rope_type": rope_type,
        "rope_factor": float(rope.get("factor") or 1.0),
        "rope_low_freq_factor": float(rope.get("low_freq_factor", 1.0)),
        "rope_high_freq_factor": float(rope.get("high_freq_factor", 4.0)),
        "rope_original_max_position_embeddings": original,
    }
    if rope_type == "longrope":
        # transformers' `_compute_longrope_parameters`: `factor` defaults to the ratio of the
        # context lengths, and the attention factor to sqrt(1 + ln(factor) / ln(original)).
        factor = rope.get("factor") or max_pos / original
        attention = rope.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else (1 + math.log(factor) / math.log(original)) ** 0.5
        fields.update(
            rope_factor=float(factor),
            rope_short_factor=tuple(float(f) for f in rope["short_factor"]),
            rope_long_factor=tuple(float(f) for f in rope["long_factor"]),
            rope_attention_factor=float(attention),
        )
    return fields


def size_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """The sizes, norm epsilon, context length and tied head of `config.json` as `DecoderConfig`
    fields (`head_dim` defaults to `hidden_size // num_attention_heads`)."""
    num_heads = d["num_attention_heads"]
    return {
        "vocab_size": d["vocab_size"],
        "hidden_size": d["hidden_size"],
        "intermediate_size": d["intermediate_size"],
        "num_hidden_layers": d["num_hidden_layers"],
        "num_attention_heads": num_heads,
        "num_key_value_heads": d.get("num_key_value_heads") or num_heads,
        "head_dim": d.get("head_dim") or d["hidden_size"] // num_heads,
        "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "max_position_embeddings": d.get("max_position_embeddings", 2048),
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", False)),
        "model_type": d["model_type"],
    }


def token_fields(d: Mapping[str, Any], extra_eos_token_ids: Sequence[int]) -> dict[str, Any]:
    """`bos_token_id`, `pad_token_id` and `eos_token_id` (a tuple: the config's ids, then
    `extra_eos_token_ids` not already among them)."""
    eos = d.get("eos_token_id")
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    for i in extra_eos_token_ids:
        if i not in eos_ids:
            eos_ids.append(int(i))
    return {
        "bos_token_id": d.get("bos_token_id"),
        "eos_token_id": tuple(eos_ids),
        "pad_token_id": d.get("pad_token_id"),
    }


def layer_windows(d: Mapping[str, Any], window: int | None) -> tuple[int | None, ...]:
    """Per layer, `window` for `"sliding_attention"` layers of `layer_types` and `None` for
    full attention (every layer full when `layer_types` is absent).

    **Raises:** `UnsupportedConfigError` for a layer type other than those two.
    """
    n = d["num_hidden_layers"]
    types = d.get("layer_types") or ["full_attention"] * n
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise UnsupportedConfigError(
            f"layer_types entries {unknown} are not supported; expected 'full_attention' or "
            "'sliding_attention'"
        )
    if len(types) != n:
        raise UnsupportedConfigError(
            f"layer_types has {len(types)} entries for num_hidden_layers={n}"
        )
    return tuple(window if t == "sliding_attention" else None for t in types)


def qwen_windows(d: Mapping[str, Any]) -> tuple[int | None, ...]:
    """Per layer, the sliding window of a Qwen2/Qwen3 config: `sliding_window` where
    `use_sliding_window` is on, on the layers `layer_types` marks as sliding or, without it, the
    layers from `max_window_layers` on (transformers' `Qwen2Config.__init__`); else `None`.

    **Raises:** `UnsupportedConfigError` for an unknown `layer_types` entry.
    """
    window = d.get("sliding_window") if d.get("use_sliding_window") else None
    if d.get("layer_types"):
        return layer_windows(d, window)
    n = d["num_hidden_layers"]
    first = d.get("max_window_layers", n)
    return tuple(window if i >= first else None for i in range(n))
