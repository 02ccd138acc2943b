"""`LlamaConfig`: the hyperparameters of a Llama-family decoder, under Hugging Face's names.

One config class covers every architecture the Equinox decoder in `functional_gen.models.llama`
runs: Llama 1/2/3 (including Llama 3.1's `llama3` RoPE scaling), Mistral, Qwen2 and SmolLM2. The
field names are exactly those of `config.json` / `transformers.LlamaConfig`, so a checkpoint's
config maps one to one. What a checkpoint asks for that the decoder cannot do (another activation,
another RoPE type, a quantized checkpoint, ...) raises `UnsupportedConfigError` naming the key, the
value and what is supported: nothing is silently ignored. The check is an allow-list, as
penzai's: every key of `config.json` is either read here (`USED_CONFIG_KEYS`), known not to change
the forward pass (`IGNORED_CONFIG_KEYS`), or an error that names it, so a field that a later
transformers adds, or that another architecture needs, cannot pass unnoticed.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
"""`model_type` values of `config.json` that `LlamaConfig.from_hf` accepts."""

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
"""RoPE variants the decoder implements (`rope_parameters["rope_type"]`)."""


class UnsupportedConfigError(ValueError):
    """A checkpoint asks for an architecture or a config value that the decoder does not implement."""


USED_CONFIG_KEYS = frozenset(
    {
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",  # must be SiLU
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "partial_rotary_factor",  # must be 1.0
        "max_position_embeddings",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "sliding_window",  # Mistral, Qwen2 (with use_sliding_window); must be null for Llama
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "pretraining_tp",  # must be 1
        "rope_interleaved",  # must be false (SmolLM2's config.json has it)
        "quantization_config",  # must be absent
        "auto_map",  # must not name custom modeling code
    }
)
"""`config.json` keys that `LlamaConfig.from_hf` reads (some only to check their value)."""

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


def check_config_keys(d: Mapping[str, Any]) -> None:
    """Refuse any `config.json` key that is neither read (`USED_CONFIG_KEYS`) nor known to be
    irrelevant to the forward pass (`IGNORED_CONFIG_KEYS`).

    **Raises:** `UnsupportedConfigError` naming every unknown key and its value.
    """
    unknown = sorted(k for k in d if k not in USED_CONFIG_KEYS and k not in IGNORED_CONFIG_KEYS)
    if unknown:
        listed = ", ".join(f"{k}={d[k]!r}" for k in unknown)
        raise UnsupportedConfigError(
            f"unknown config.json key(s) for model_type={d.get('model_type')!r}: {listed}. The "
            "decoder does not know what they do, so the checkpoint may not run as intended; "
            "known keys are functional_gen.models.config.USED_CONFIG_KEYS and IGNORED_CONFIG_KEYS"
        )


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Hyperparameters of a Llama-family decoder-only language model.

    Field names and meanings are those of Hugging Face's `LlamaConfig` (`config.json`). The
    config is immutable and hashable: the model keeps it as a static field.

    **Attributes:**

    - `vocab_size`: number of token ids (rows of the embedding).
    - `hidden_size`: width of the residual stream.
    - `intermediate_size`: width of the SwiGLU MLP.
    - `num_hidden_layers`: number of decoder layers.
    - `num_attention_heads`: query heads.
    - `num_key_value_heads`: key/value heads (grouped-query attention when fewer than query heads;
      1 is multi-query attention).
    - `head_dim`: width of one head (`hidden_size // num_attention_heads` unless the checkpoint says).
    - `rms_norm_eps`: epsilon inside RMSNorm.
    - `rope_theta`: RoPE base wavelength.
    - `rope_type`: `"default"`, `"linear"` or `"llama3"`.
    - `rope_factor`, `rope_low_freq_factor`, `rope_high_freq_factor`,
      `rope_original_max_position_embeddings`: the scaling parameters of `linear` / `llama3` RoPE.
    - `max_position_embeddings`: the longest sequence (prompt + generated tokens) the model supports.
    - `tie_word_embeddings`: the output head reuses the input embedding matrix.
    - `attention_bias`: the q/k/v projections have biases (Llama's `attention_bias`, always on in Qwen2).
    - `attention_out_bias`: the output projection `o_proj` has a bias (Llama's `attention_bias`; off in Qwen2).
    - `mlp_bias`: the MLP projections have biases.
    - `sliding_window`: per layer, the attention window in tokens, or `None` for full attention
      (Mistral's `sliding_window`, Qwen2's `layer_types`). A tuple with one entry per layer.
    - `model_type`: the architecture name from `config.json`.
    - `bos_token_id`, `pad_token_id`: special token ids, or `None`.
    - `eos_token_id`: every token id that ends generation (a tuple; may be empty).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    sliding_window: tuple[int | None, ...] = ()
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self):
        if not self.sliding_window:
            object.__setattr__(self, "sliding_window", (None,) * self.num_hidden_layers)
        object.__setattr__(self, "sliding_window", tuple(self.sliding_window))
        object.__setattr__(self, "eos_token_id", tuple(int(i) for i in self.eos_token_id))
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"`num_attention_heads` ({self.num_attention_heads}) must be a multiple of "
                f"`num_key_value_heads` ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"`head_dim` must be even for RoPE, got {self.head_dim}")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedConfigError(
                f"RoPE type {self.rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
            )
        if len(self.sliding_window) != self.num_hidden_layers:
            raise ValueError(
                f"`sliding_window` needs one entry per layer ({self.num_hidden_layers}), "
                f"got {len(self.sliding_window)}"
            )

    @classmethod
    def from_hf(cls, hf_config: Any, *, extra_eos_token_ids: Sequence[int] = ()) -> "LlamaConfig":
        """Build a config from a Hugging Face config.

        **Arguments:**

        - `hf_config`: a `transformers.PretrainedConfig` (e.g. from `AutoConfig.from_pretrained`)
          or the plain dict of a `config.json`.
        - `extra_eos_token_ids`: more ids that end generation (e.g. from `generation_config.json`),
          merged with the config's own `eos_token_id`.

        **Returns:** a `LlamaConfig`.

        **Raises:** `UnsupportedConfigError` for a `model_type` outside `SUPPORTED_MODEL_TYPES`, a
        RoPE type outside `SUPPORTED_ROPE_TYPES`, an activation other than SiLU, partial or
        interleaved rotary embeddings, a sliding window on a Llama model, custom modeling code
        (`auto_map`), a quantized checkpoint (`quantization_config`), or any key that is
        neither read nor known to be irrelevant (see `check_config_keys`).
        """
        d = dict(hf_config) if isinstance(hf_config, Mapping) else hf_config.to_dict()
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = d.get("architectures")
            raise UnsupportedConfigError(
                f"unknown architecture: model_type={model_type!r} (architectures={archs!r}); "
                f"supported model types: {SUPPORTED_MODEL_TYPES}"
            )
        check_config_keys(d)
        if d.get("rope_interleaved"):
            raise UnsupportedConfigError(
                "rope_interleaved=True is not supported; the decoder rotates halves (rotate_half)"
            )
        if model_type == "llama" and d.get("sliding_window") is not None:
            raise UnsupportedConfigError(
                f"sliding_window={d['sliding_window']!r} on a Llama model is not supported; "
                "expected null (Mistral and Qwen2 models have sliding windows)"
            )
        custom = sorted(k for k in d.get("auto_map") or {} if k.startswith("AutoModel"))
        if custom:
            raise UnsupportedConfigError(
                f"auto_map names custom modeling code for {custom}; only the standard "
                f"{SUPPORTED_MODEL_TYPES} architectures are supported"
            )
        if d.get("quantization_config"):
            method = d["quantization_config"].get("quant_method", "?")
            raise UnsupportedConfigError(
                f"quantized checkpoints are not supported (quantization_config.quant_method="
                f"{method!r}); use a float16/bfloat16/float32 checkpoint or a GGUF file"
            )
        act = d.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise UnsupportedConfigError(
                f"hidden_act={act!r} is not supported; the decoder implements SwiGLU ('silu')"
            )
        if d.get("pretraining_tp", 1) not in (None, 1):
            raise UnsupportedConfigError(
                f"pretraining_tp={d['pretraining_tp']!r} is not supported; expected 1"
            )

        rope = _rope_parameters(d)
        if d.get("partial_rotary_factor") is not None:
            rope.setdefault("partial_rotary_factor", d["partial_rotary_factor"])
        if rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise UnsupportedConfigError(
                f"partial_rotary_factor={rope['partial_rotary_factor']!r} is not supported; "
                "expected 1.0 (RoPE over the whole head)"
            )
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedConfigError(
                f"rope_scaling type {rope_type!r} is not supported; supported: "
                f"{SUPPORTED_ROPE_TYPES}"
            )

        num_heads = d["num_attention_heads"]
        hidden = d["hidden_size"]
        head_dim = d.get("head_dim") or hidden // num_heads
        num_layers = d["num_hidden_layers"]
        max_pos = d.get("max_position_embeddings", 2048)

        if model_type == "qwen2":
            qkv_bias, out_bias, mlp_bias = True, False, False
            window = d.get("sliding_window") if d.get("use_sliding_window") else None
            layer_types = d.get("layer_types") or [
                "sliding_attention"
                if window is not None and i >= d.get("max_window_layers", num_layers)
                else "full_attention"
                for i in range(num_layers)
            ]
            sliding = tuple(window if t == "sliding_attention" else None for t in layer_types)
        else:
            qkv_bias = out_bias = bool(d.get("attention_bias", False))
            mlp_bias = bool(d.get("mlp_bias", False))
            window = d.get("sliding_window") if model_type == "mistral" else None
            sliding = (window,) * num_layers

        eos = d.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        for i in extra_eos_token_ids:
            if i not in eos_ids:
                eos_ids.append(int(i))

        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=hidden,
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_type=rope_type,
            rope_factor=float(rope.get("factor", 1.0)),
            rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
            rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
            rope_original_max_position_embeddings=int(
                rope.get("original_max_position_embeddings", max_pos)
            ),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            attention_out_bias=out_bias,
            mlp_bias=mlp_bias,
            sliding_window=sliding,
            model_type=model_type,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=tuple(eos_ids),
            pad_token_id=d.get("pad_token_id"),
        )

    def to_hf_dict(self) -> dict:
        """The equivalent Hugging Face `config.json` contents (used to write cached checkpoints).

        **Returns:** a JSON-serialisable dict that `LlamaConfig.from_hf` maps back to this config,
        and that `transformers.AutoConfig` reads.
        """
        rope: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.rope_type == "linear":
            rope["factor"] = self.rope_factor
        elif self.rope_type == "llama3":
            rope.update(
                factor=self.rope_factor,
                low_freq_factor=self.rope_low_freq_factor,
                high_freq_factor=self.rope_high_freq_factor,
                original_max_position_embeddings=self.rope_original_max_position_embeddings,
            )
        eos: int | list[int] | None = list(self.eos_token_id) or None
        if eos is not None and len(eos) == 1:
            eos = eos[0]
        d = {
            "model_type": self.model_type,
            "architectures": [_ARCHITECTURES[self.model_type]],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
        }
        if self.model_type == "qwen2":
            windows = {w for w in self.sliding_window if w is not None}
            d["use_sliding_window"] = bool(windows)
            d["sliding_window"] = windows.pop() if windows else None
            d["layer_types"] = [
                "full_attention" if w is None else "sliding_attention" for w in self.sliding_window
            ]
        else:
            d["attention_bias"] = self.attention_bias
            d["mlp_bias"] = self.mlp_bias
            if self.model_type == "mistral":
                d["sliding_window"] = self.sliding_window[0]
        return d

    def rope_inv_freq(self) -> np.ndarray:
        """Inverse frequencies of RoPE, one per pair of head dimensions: float32 `[head_dim // 2]`.

        `default`: `1 / theta^(2i/head_dim)`; `linear`: divided by `rope_factor`; `llama3`: the
        Llama 3.1 piecewise scaling. Computed in float32 as transformers does
        (`modeling_rope_utils._compute_llama3_parameters`; Meta's `apply_scaling` in llama-models).
        """
        dim = self.head_dim
        inv = 1.0 / (np.float32(self.rope_theta) ** (np.arange(0, dim, 2).astype(np.float32) / dim))
        if self.rope_type == "linear":
            return (inv / np.float32(self.rope_factor)).astype(np.float32)
        if self.rope_type == "llama3":
            factor = np.float32(self.rope_factor)
            low, high = self.rope_low_freq_factor, self.rope_high_freq_factor
            old = self.rope_original_max_position_embeddings
            low_wavelen, high_wavelen = old / low, old / high
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
            smooth = (old / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        return inv.astype(np.float32)


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


def _rope_parameters(d: Mapping[str, Any]) -> dict[str, Any]:
    """RoPE settings from either transformers-5 `rope_parameters` or older `rope_theta`/`rope_scaling`."""
    params = dict(d.get("rope_parameters") or {})
    scaling = d.get("rope_scaling")
    if scaling:
        params = {**dict(scaling), **params}
    if "rope_theta" not in params and d.get("rope_theta") is not None:
        params["rope_theta"] = d["rope_theta"]
    return params
