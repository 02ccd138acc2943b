"""A GGUF file's metadata, read with a `gguf.GGUFReader`: the model config (one small function
per architecture turns `{arch}.*` keys into a Hugging Face `config.json` dict), the generation
config (`general.sampling.*`) and the tokenizer's metadata (`tokenizer.*`).

`functional_gen.loading.gguf_file` reads the tensors and builds the model and the tokenizer from
these. A missing key raises `CheckpointError` naming the file and the key.
"""

import numpy as np

from ..models.config import DecoderConfig, UnsupportedConfigError, config_from_hf
from ..tokenization import END_OF_GENERATION_TEXTS
from .errors import CheckpointError

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
"""`general.architecture` values whose metadata and tensor names are read (llama.cpp writes
Mistral models as `llama`; `gemma3` is the `gemma3_text` family)."""

CONFIG_TENSORS = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
"""Tensors that are config, not weights: Llama 3.1's RoPE divisors (returned as `rope_freqs`),
Phi-3's longrope factors (read into the config by `gguf_hf_config`)."""

# Gemma 3's local layers: llama.cpp's defaults where the converter writes no key
# (llama-model.cpp, LLM_ARCH_GEMMA3: `hparams.set_swa_pattern(6)`,
# `hparams.rope_freq_base_train_swa = 10000.0f`), which are also transformers'
# `Gemma3TextConfig` defaults (`sliding_window_pattern=6`, `rope_local_base_freq=10000`).
_GEMMA3_SLIDING_WINDOW_PATTERN = 6
_GEMMA3_LOCAL_ROPE_BASE = 10000.0


def metadata_field(reader, key, default=None):
    """The value of metadata `key` of a `gguf.GGUFReader`, or `default` when absent."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def gguf_file_name(reader) -> str:
    """The reader's file name, for messages."""
    name = getattr(reader, "filename", None) or getattr(reader.data, "filename", None)
    return str(name or "the GGUF file")


def require_field(reader, key: str):
    """The value of metadata `key`; a `CheckpointError` naming the file and the key if absent."""
    value = metadata_field(reader, key)
    if value is None:
        raise CheckpointError(f"{gguf_file_name(reader)}: missing key `{key}` in the GGUF metadata")
    return value


def _rope_scaling(reader, arch: str, rope: dict) -> dict:
    """`rope` with the linear RoPE scaling of `{arch}.rope.scaling.*`, if any."""
    scaling = metadata_field(reader, f"{arch}.rope.scaling.type")
    if scaling in ("linear",):
        factor = float(require_field(reader, f"{arch}.rope.scaling.factor"))
        return {**rope, "rope_type": "linear", "factor": factor}
    if scaling not in (None, "none"):
        raise UnsupportedConfigError(
            f"GGUF rope.scaling.type {scaling!r} is not supported; supported: none, linear "
            "(and llama3 scaling stored as rope_freqs.weight)"
        )
    return rope


def _llama_keys(reader, arch, d, tensor_names):
    rope = {
        "rope_type": "default",
        "rope_theta": float(metadata_field(reader, f"{arch}.rope.freq_base", 10000.0)),
    }
    d["rope_parameters"] = _rope_scaling(reader, arch, rope)
    window = metadata_field(reader, f"{arch}.attention.sliding_window")
    if arch == "qwen2":
        d["model_type"] = "qwen2"
        if window is not None:
            d.update(use_sliding_window=True, sliding_window=int(window), max_window_layers=0)
    elif window is not None:
        d.update(model_type="mistral", sliding_window=int(window))
    else:
        d["model_type"] = "llama"


def _qwen3_keys(reader, arch, d, tensor_names):
    rope = {
        "rope_type": "default",
        "rope_theta": float(metadata_field(reader, f"{arch}.rope.freq_base", 1000000.0)),
    }
    d.update(model_type="qwen3", rope_parameters=_rope_scaling(reader, arch, rope))
    window = metadata_field(reader, f"{arch}.attention.sliding_window")
    d.update(
        use_sliding_window=window is not None,
        sliding_window=None if window is None else int(window),
    )


def _gemma3_keys(reader, arch, d, tensor_names):
    layers, hidden, heads = d["num_hidden_layers"], d["hidden_size"], d["num_attention_heads"]
    pattern = metadata_field(
        reader, f"{arch}.attention.sliding_window_pattern", _GEMMA3_SLIDING_WINDOW_PATTERN
    )
    if isinstance(pattern, list):  # newer llama.cpp: one flag per layer, true = sliding window
        sliding = [bool(x) for x in pattern]
    else:
        sliding = [(i + 1) % int(pattern) != 0 for i in range(layers)]
    if len(sliding) != layers:
        raise CheckpointError(
            f"{gguf_file_name(reader)}: `{arch}.attention.sliding_window_pattern` has "
            f"{len(sliding)} flags for {layers} layers"
        )
    global_rope = {
        "rope_type": "default",
        "rope_theta": float(metadata_field(reader, f"{arch}.rope.freq_base", 1000000.0)),
    }
    local_base = float(
        metadata_field(reader, f"{arch}.rope.freq_base_swa", _GEMMA3_LOCAL_ROPE_BASE)
    )
    d.update(
        model_type="gemma3_text",
        hidden_activation="gelu_pytorch_tanh",
        sliding_window=int(require_field(reader, f"{arch}.attention.sliding_window")),
        layer_types=["sliding_attention" if flag else "full_attention" for flag in sliding],
        rope_parameters={
            # linear scaling (Gemma 3 4B and larger) applies to the global layers only
            "full_attention": _rope_scaling(reader, arch, global_rope),
            "sliding_attention": {"rope_type": "default", "rope_theta": local_base},
        },
        # llama.cpp's `f_attention_scale`: 1/sqrt(hidden/heads) for the 27B model (62 layers),
        # 1/sqrt(head_dim) for the others, i.e. transformers' query_pre_attn_scalar.
        query_pre_attn_scalar=hidden // heads if layers == 62 else d["head_dim"],
        final_logit_softcapping=metadata_field(reader, f"{arch}.final_logit_softcapping"),
        attn_logit_softcapping=metadata_field(reader, f"{arch}.attn_logit_softcapping"),
    )


def _phi3_keys(reader, arch, d, tensor_names):
    head_dim = d["hidden_size"] // d["num_attention_heads"]
    rotary = int(metadata_field(reader, f"{arch}.rope.dimension_count", head_dim))
    rope = {
        "rope_type": "default",
        "rope_theta": float(metadata_field(reader, f"{arch}.rope.freq_base", 10000.0)),
    }
    if "rope_factors_long.weight" in tensor_names:
        # Phi-3 128k / Phi-3.5 / Phi-4-mini: llama.cpp's converter writes longrope's factors as
        # tensors (`Phi3MiniModel.generate_extra_tensors`).
        factors = {
            t.name: [float(x) for x in np.asarray(t.data).reshape(-1)]
            for t in reader.tensors
            if t.name in CONFIG_TENSORS
        }
        rope.update(
            rope_type="longrope",
            long_factor=factors["rope_factors_long.weight"],
            short_factor=factors.get(
                "rope_factors_short.weight", factors["rope_factors_long.weight"]
            ),
        )
    original = int(
        metadata_field(
            reader, f"{arch}.rope.scaling.original_context_length", d["max_position_embeddings"]
        )
    )
    if rope["rope_type"] == "longrope":
        # transformers 5's form: longrope's attention factor follows from this ratio
        rope["factor"] = d["max_position_embeddings"] / original
    else:
        rope = _rope_scaling(reader, arch, rope)
    if rotary != head_dim:
        rope["partial_rotary_factor"] = rotary / head_dim
    window = metadata_field(reader, f"{arch}.attention.sliding_window")
    d.update(
        model_type="phi3",
        head_dim=head_dim,
        rope_parameters=rope,
        original_max_position_embeddings=original,
        sliding_window=int(window) if window else None,
    )


# Per architecture: the keys of its Hugging Face `config.json` that differ from the common ones.
_ARCH_CONFIG = {
    "llama": _llama_keys,
    "qwen2": _llama_keys,
    "qwen3": _qwen3_keys,
    "gemma3": _gemma3_keys,
    "phi3": _phi3_keys,
}


def gguf_hf_config(reader) -> dict:
    """The Hugging Face `config.json` dict (`{"model_type": ..., ...}`, transformers 5 names:
    `rope_parameters`, `layer_types`) described by a GGUF file's metadata, for the
    architectures in `SUPPORTED_GGUF_ARCHITECTURES`, as llama.cpp's `convert_hf_to_gguf.py`
    writes them.

    `gemma3` becomes `model_type="gemma3_text"`: `sliding_window` from the file, 5 local + 1
    global layers (`layer_types`; llama.cpp's pattern of 6), RoPE base 1M on global and 10k on
    local layers (llama.cpp's defaults where the file has no key), `query_pre_attn_scalar`,
    GELU-tanh, soft-capping when the file has it. `phi3`: `partial_rotary_factor` from
    `rope.dimension_count`, longrope factors from `rope_factors_long/short.weight`. The output
    head is tied when the file has no `output.weight`.

    EOS ids follow llama.cpp: `tokenizer.ggml.eos_token_id`, `eot_token_id`, `eom_token_id`, plus
    the control tokens whose text llama.cpp treats as end of generation (`<|im_end|>`,
    `<|endoftext|>`, `<end_of_turn>`, ...).

    **Arguments:** `reader`: a `gguf.GGUFReader` (see `open_gguf`).

    **Raises:** `UnsupportedConfigError` for an architecture outside
    `SUPPORTED_GGUF_ARCHITECTURES` or an unsupported RoPE scaling type; `CheckpointError`
    naming the file and the key when a required metadata key is missing.
    """
    arch = metadata_field(reader, "general.architecture")
    if arch is None:
        require_field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise UnsupportedConfigError(
            f"unknown GGUF architecture {arch!r}; supported: {SUPPORTED_GGUF_ARCHITECTURES}"
        )
    tensor_names = {t.name for t in reader.tensors}

    def meta(key, default=None):
        return metadata_field(reader, f"{arch}.{key}", default)

    def required(key):
        return require_field(reader, f"{arch}.{key}")

    tokens = metadata_field(reader, "tokenizer.ggml.tokens") or []
    hidden = int(required("embedding_length"))
    heads = int(required("attention.head_count"))
    eos = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = metadata_field(reader, f"tokenizer.ggml.{key}")
        if value is not None and int(value) not in eos:
            eos.append(int(value))
    for i, text in enumerate(tokens):
        if text in END_OF_GENERATION_TEXTS and i not in eos:
            eos.append(i)
    d = {
        "vocab_size": int(meta("vocab_size", len(tokens) or _embedding_rows(reader))),
        "hidden_size": hidden,
        "intermediate_size": int(required("feed_forward_length")),
        "num_hidden_layers": int(required("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": int(
            meta("attention.key_length", meta("rope.dimension_count", hidden // heads))
        ),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(meta("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "bos_token_id": metadata_field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": metadata_field(reader, "tokenizer.ggml.padding_token_id"),
    }
    _ARCH_CONFIG[arch](reader, arch, d, tensor_names)
    return d


def _embedding_rows(reader) -> int:
    """The vocabulary size as the rows of `token_embd.weight` (GGML lists a tensor's dimensions
    innermost first: `[hidden, vocab]`), for a file without `tokenizer.ggml.tokens`; 0 without it."""
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            return int(t.shape[-1])
    return 0


def model_config_from_hf(d: dict) -> DecoderConfig:
    """The model config of a Hugging Face config dict: the one call between a GGUF's metadata
    (`gguf_hf_config`) and the decoder (`functional_gen.models.config_from_hf`, which picks the
    family by `model_type`).

    **Raises:** `UnsupportedConfigError` for a config value the decoder does not implement.
    """
    return config_from_hf(d)


def read_gguf_config(reader) -> DecoderConfig:
    """The model config described by a GGUF file's metadata: `model_config_from_hf` of
    `gguf_hf_config(reader)`.

    **Raises:** `UnsupportedConfigError` for an architecture outside
    `SUPPORTED_GGUF_ARCHITECTURES`, one the decoder does not run yet, or an unsupported RoPE
    scaling type; `CheckpointError` for a missing metadata key.
    """
    return model_config_from_hf(gguf_hf_config(reader))


# llama.cpp's general.sampling.* keys (written from generation_config.json by its converter) and
# the GenerationConfig attributes they stand for.
_SAMPLING_KEYS = {
    "temp": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "penalty_repeat": "repetition_penalty",
    "xtc_probability": "xtc_probability",
    "xtc_threshold": "xtc_threshold",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "penalty_last_n": "penalty_last_n",
}


def read_gguf_generation_config(reader, config: DecoderConfig):
    """A `transformers.GenerationConfig` from the GGUF's token ids and `general.sampling.*` keys.

    Sampling keys turn sampling on (`do_sample=True`), as the checkpoint's own
    `generation_config.json` did when llama.cpp's converter wrote them.
    """
    return gguf_generation_config(config, gguf_sampling(reader))


def gguf_sampling(reader) -> dict:
    """The GGUF's `general.sampling.*` values under `GenerationConfig` names."""
    sampling = {}
    for key, name in _SAMPLING_KEYS.items():
        value = metadata_field(reader, f"general.sampling.{key}")
        if value is not None:
            sampling[name] = value
    return sampling


def gguf_generation_config(config, sampling: dict):
    """A `transformers.GenerationConfig` of the model config's token ids and `sampling` (values
    under `GenerationConfig` names, which turn sampling on)."""
    from transformers import GenerationConfig

    values = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_id) or None,
        "pad_token_id": config.pad_token_id,
    }
    if sampling:
        values.update(do_sample=True, **sampling)
    return GenerationConfig(**values)


# GGUF token-id keys and the tokenizer attributes they name (as transformers' GGUF integration
# reads them in `transformers.integrations.gguf.gguf_tokenizer_mapping.get_gguf_tokenizer`).
_SPECIAL_TOKEN_KEYS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def gguf_tokenizer_metadata(reader) -> tuple[str, dict, dict]:
    """`(architecture, tokenizer_dict, tokenizer_config)` from a GGUF file's `tokenizer.*` metadata.

    The same grouping as transformers' `get_gguf_tokenizer` (driven by its public
    `GGUF_TOKENIZER_MAPPING`), but read with `gguf.GGUFReader`: transformers' own GGUF reader
    imports torch, this does not. `tokenizer_dict` holds the vocabulary, merges, token types and
    special ids under transformers' names; `tokenizer_config` the chat template, the BOS/EOS flags
    and the special tokens' texts.
    """
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING

    grouped = {}
    for group, renames in GGUF_TOKENIZER_MAPPING.items():
        grouped[group] = {}
        for key, name in renames.items():
            value = metadata_field(reader, f"tokenizer.{key}")
            if value is not None:
                grouped[group][name] = value
    tokenizer, tokenizer_config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":
        # Older files have no flag; llama.cpp adds BOS to a sentencepiece vocabulary by default.
        tokenizer_config.setdefault("add_bos_token", True)
    elif tokenizer.get("tokenizer_type") == "gemma4":
        # Its chat template writes <bos> itself (transformers follows the reference tokenizer).
        tokenizer_config["add_bos_token"] = False
    tokens = tokenizer.get("tokens") or []
    for name, key in _SPECIAL_TOKEN_KEYS.items():
        token_id = metadata_field(reader, f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokens[int(token_id)] if token_id is not None else None
    return metadata_field(reader, "general.architecture"), tokenizer, tokenizer_config
