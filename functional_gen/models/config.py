"""`DecoderConfig`: the hyperparameters of the one decoder, under Hugging Face's names, with
every way a supported family differs from Llama declared as a field.

`LlamaConfig` is the same class under its older name (the Llama family is the decoder with every
optional field at its default). `config_from_hf` (also `DecoderConfig.from_hf`) reads any
supported `config.json` by its `model_type`, through the family modules of
`functional_gen.models.families`: every key is either read, known not to change the forward pass,
or an `UnsupportedConfigError` that names it. What a checkpoint asks for that the decoder cannot
do (another activation, another RoPE type, a quantized checkpoint, ...) is refused, never
silently ignored.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .families import SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES, config_fields
from .families.common import (
    IGNORED_CONFIG_KEYS as IGNORED_CONFIG_KEYS,
    SUPPORTED_ACTIVATIONS as SUPPORTED_ACTIVATIONS,
    SUPPORTED_ROPE_TYPES as SUPPORTED_ROPE_TYPES,
    UnsupportedConfigError as UnsupportedConfigError,
)


class _Verbatim:
    """An object whose `repr` is the given text (a fingerprint part)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Hyperparameters of the decoder-only language model of `functional_gen.models.decoder`.

    Field names and meanings are those of Hugging Face's `config.json` where one exists. The
    config is immutable and hashable: the model keeps it as a static field, so every optional
    feature below is decided at trace time and costs nothing when off.

    **Attributes (every family):**

    - `vocab_size`: number of token ids (rows of the embedding).
    - `hidden_size`: width of the residual stream.
    - `intermediate_size`: width of the gated MLP.
    - `num_hidden_layers`: number of decoder layers.
    - `num_attention_heads`: query heads.
    - `num_key_value_heads`: key/value heads (grouped-query attention when fewer than query heads;
      1 is multi-query attention).
    - `head_dim`: width of one head (`hidden_size // num_attention_heads` unless the checkpoint says).
    - `rms_norm_eps`: epsilon inside RMSNorm.
    - `rope_theta`: RoPE base wavelength (of the global layers when `local_rope_theta` is set).
    - `rope_type`: `"default"`, `"linear"`, `"llama3"` or `"longrope"`.
    - `rope_factor`, `rope_low_freq_factor`, `rope_high_freq_factor`,
      `rope_original_max_position_embeddings`: the scaling parameters of `linear` / `llama3`
      RoPE (and `longrope`'s context ratio and pretraining length).
    - `max_position_embeddings`: the longest sequence (prompt + generated tokens) the model supports.
    - `tie_word_embeddings`: the output head reuses the input embedding matrix.
    - `attention_bias`: the q/k/v projections have biases (Llama's `attention_bias`, always on in Qwen2).
    - `attention_out_bias`: the output projection `o_proj` has a bias (Llama's `attention_bias`; off in Qwen2).
    - `mlp_bias`: the MLP projections have biases.
    - `sliding_window`: per layer, the attention window in tokens, or `None` for full attention
      (Mistral's `sliding_window`, the `"sliding_attention"` entries of `layer_types` in Qwen2,
      Qwen3, Gemma 2/3, SmolLM3). A tuple with one entry per layer.
    - `model_type`: the architecture name from `config.json`.
    - `bos_token_id`, `pad_token_id`: special token ids, or `None`.
    - `eos_token_id`: every token id that ends generation (a tuple; may be empty).

    **Declared differences (defaults: Llama):**

    - `hidden_act`: the gate activation of the MLP, `"silu"` (SwiGLU) or `"gelu_pytorch_tanh"`
      (GeGLU, Gemma: `Gemma2MLP`'s `ACT2FN[config.hidden_activation]`).
    - `rms_norm_unit_offset`: RMSNorm multiplies by `(1 + weight)` instead of `weight` (Gemma:
      `Gemma3RMSNorm.forward`'s `output * (1.0 + self.weight.float())`).
    - `qk_norm`: an RMSNorm over each head of the queries and keys before RoPE, weights
      `self_attn.q_norm` / `self_attn.k_norm` of `head_dim` (Qwen3: `Qwen3Attention.forward`'s
      `self.q_norm(self.q_proj(hidden_states).view(hidden_shape))`; Gemma 3 likewise).
    - `sandwich_norms`: norms after attention and after the MLP too, weights
      `post_attention_layernorm` (on the attention output), `pre_feedforward_layernorm`,
      `post_feedforward_layernorm` (Gemma 2/3: `Gemma2DecoderLayer.forward`). Without it,
      `post_attention_layernorm` is Llama's norm before the MLP.
    - `scale_embeddings`: embeddings multiplied by `sqrt(hidden_size)` rounded to the
      activations' dtype (Gemma: `Gemma3TextScaledWordEmbedding`, `embed_scale =
      hidden_size**0.5`; activations are float32 here).
    - `query_pre_attn_scalar`: scores scaled by `query_pre_attn_scalar ** -0.5` instead of
      `head_dim ** -0.5` (Gemma: `self.scaling = config.query_pre_attn_scalar**-0.5`); `None`:
      `head_dim`.
    - `attn_logit_softcapping`: scores become `cap * tanh(scores / cap)` after scaling, before
      the mask (Gemma 2: `eager_attention_forward`'s `softcap`); `None`: off.
    - `final_logit_softcapping`: the same on the output logits (Gemma 2:
      `Gemma2ForCausalLM.forward`); `None`: off.
    - `local_rope_theta`: the RoPE base of the sliding-window layers, plain (`default`) RoPE,
      while the global layers keep `rope_theta` and its scaling (Gemma 3:
      `rope_parameters["sliding_attention"]`, `rope_local_base_freq` in transformers 4); `None`:
      every layer uses the same RoPE.
    - `use_rope`: per layer, whether RoPE is applied (SmolLM3: `no_rope_layers[layer_idx]`,
      `SmolLM3Attention.use_rope`); `()`: every layer.
    - `partial_rotary_factor`: RoPE rotates the first `int(head_dim * factor)` dimensions of each
      head and passes the rest (Phi-3/Phi-4-mini: `apply_rotary_pos_emb`'s `q_rot, q_pass`).
    - `rope_short_factor`, `rope_long_factor`, `rope_attention_factor`: `longrope` (`su`) scaling
      (Phi-3.5, Phi-4-mini: `modeling_rope_utils._compute_longrope_parameters`). As
      transformers' `longrope_frequency_update`, a model call uses the long factors for every
      token of a row once the row's largest position + 1 exceeds
      `rope_original_max_position_embeddings`, else the short ones (`RotaryEmbedding.cos_sin`);
      keys cached by earlier calls keep their factors, as in transformers' cache; and
      `rope_attention_factor` scales `cos` and `sin` as there.
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
    hidden_act: str = "silu"
    rms_norm_unit_offset: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    scale_embeddings: bool = False
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    local_rope_theta: float | None = None
    use_rope: tuple[bool, ...] = ()
    partial_rotary_factor: float = 1.0
    rope_short_factor: tuple[float, ...] = ()
    rope_long_factor: tuple[float, ...] = ()
    rope_attention_factor: float = 1.0

    def fingerprint_parts(self, model_class: str) -> tuple[str, Any]:
        """`(class name, config)` for `DecoderForCausalLM.config_fingerprint`, stable across the
        move from `LlamaConfig` to `DecoderConfig`: a config that uses none of the fields the
        other families added (every Llama, Mistral and Qwen2 checkpoint) is named and printed as
        `LlamaForCausalLM` / `LlamaConfig(...)` with only the fields that class had, so a
        `SequenceState` saved before the move still matches its model."""
        unused = {f.name: f.default for f in dataclasses.fields(self)[len(LEGACY_FIELDS) :]}
        unused["use_rope"] = (True,) * self.num_hidden_layers  # `()` as `__post_init__` fills it
        if any(getattr(self, name) != value for name, value in unused.items()):
            return model_class, self
        legacy = {name: getattr(self, name) for name in LEGACY_FIELDS}
        text = ", ".join(f"{name}={value!r}" for name, value in legacy.items())
        return "LlamaForCausalLM", _Verbatim(f"LlamaConfig({text})")

    def __post_init__(self):
        if not self.sliding_window:
            object.__setattr__(self, "sliding_window", (None,) * self.num_hidden_layers)
        object.__setattr__(self, "sliding_window", tuple(self.sliding_window))
        if not self.use_rope:
            object.__setattr__(self, "use_rope", (True,) * self.num_hidden_layers)
        object.__setattr__(self, "use_rope", tuple(bool(u) for u in self.use_rope))
        object.__setattr__(self, "eos_token_id", tuple(int(i) for i in self.eos_token_id))
        object.__setattr__(self, "rope_short_factor", tuple(self.rope_short_factor))
        object.__setattr__(self, "rope_long_factor", tuple(self.rope_long_factor))
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
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise UnsupportedConfigError(
                f"hidden_act={self.hidden_act!r} is not supported; supported: "
                f"{SUPPORTED_ACTIVATIONS}"
            )
        for name in ("sliding_window", "use_rope"):
            if len(getattr(self, name)) != self.num_hidden_layers:
                raise ValueError(
                    f"`{name}` needs one entry per layer ({self.num_hidden_layers}), "
                    f"got {len(getattr(self, name))}"
                )
        rotary = self.rotary_dim
        if not 0 < self.partial_rotary_factor <= 1 or rotary % 2:
            raise UnsupportedConfigError(
                f"partial_rotary_factor={self.partial_rotary_factor!r} gives {rotary} rotary "
                f"dimensions of a {self.head_dim}-wide head; expected an even number > 0"
            )
        for kind in ("short", "long"):
            factors = getattr(self, f"rope_{kind}_factor")
            if self.rope_type == "longrope" and len(factors) != rotary // 2:
                raise UnsupportedConfigError(
                    f"longrope {kind}_factor has {len(factors)} entries; expected "
                    f"{rotary // 2} (half the rotary dimensions)"
                )

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that RoPE rotates: `int(head_dim * partial_rotary_factor)`."""
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf(cls, hf_config: Any, *, extra_eos_token_ids: Sequence[int] = ()) -> "DecoderConfig":
        """Build a config from a Hugging Face config of any supported `model_type`.

        **Arguments:**

        - `hf_config`: a `transformers.PretrainedConfig` (e.g. from `AutoConfig.from_pretrained`)
          or the plain dict of a `config.json` (`{"model_type": ..., <config.json keys>}`).
        - `extra_eos_token_ids`: more ids that end generation (e.g. from `generation_config.json`),
          merged with the config's own `eos_token_id`.

        **Returns:** a `DecoderConfig`.

        **Raises:** `UnsupportedConfigError` for a `model_type` outside `SUPPORTED_MODEL_TYPES`, a
        RoPE type outside `SUPPORTED_ROPE_TYPES`, an activation outside
        `SUPPORTED_ACTIVATIONS`, what a family does not support (e.g. partial rotary on Llama, a
        sliding window on a Llama model), interleaved rotary embeddings, custom modeling code
        (`auto_map`), a quantized checkpoint (`quantization_config`), or any key that is
        neither read nor known to be irrelevant (`families.common.check_config_keys`).
        """
        d = dict(hf_config) if isinstance(hf_config, Mapping) else hf_config.to_dict()
        return cls(**config_fields(d, extra_eos_token_ids))

    def to_hf_dict(self) -> dict:
        """The equivalent Hugging Face `config.json` contents (used to write cached checkpoints).

        **Returns:** a JSON-serialisable dict that `DecoderConfig.from_hf` maps back to this
        config, and that `transformers.AutoConfig` reads.

        **Raises:** `NotImplementedError` for a model type other than llama, mistral or qwen2.
        """
        if self.model_type not in _ARCHITECTURES:
            raise NotImplementedError(
                f"to_hf_dict writes llama, mistral and qwen2 configs, not {self.model_type!r}"
            )
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

    def rope_inv_freq(self, local: bool = False, long: bool = False) -> np.ndarray:
        """Inverse frequencies of RoPE, one per pair of rotary dimensions: float32
        `[rotary_dim // 2]`.

        `default`: `1 / theta^(2i/rotary_dim)`; `linear`: divided by `rope_factor`; `llama3`: the
        Llama 3.1 piecewise scaling; `longrope`: divided by `rope_short_factor`, or with
        `long=True` by `rope_long_factor` (used past the original context, see the class
        docstring; `long` is ignored for the other types). With `local=True` and `local_rope_theta` set: the sliding layers' plain
        RoPE of base `local_rope_theta`. Computed in float32 as transformers does
        (`modeling_rope_utils._compute_llama3_parameters`, `_compute_longrope_parameters`;
        Meta's `apply_scaling` in llama-models).
        """
        dim = self.rotary_dim
        exponent = np.arange(0, dim, 2).astype(np.float32) / dim
        if local and self.local_rope_theta is not None:
            return (1.0 / (np.float32(self.local_rope_theta) ** exponent)).astype(np.float32)
        inv = 1.0 / (np.float32(self.rope_theta) ** exponent)
        if self.rope_type == "linear":
            return (inv / np.float32(self.rope_factor)).astype(np.float32)
        if self.rope_type == "longrope":
            factors = self.rope_long_factor if long else self.rope_short_factor
            factors = np.asarray(factors, np.float32)
            return (1.0 / (factors * np.float32(self.rope_theta) ** exponent)).astype(np.float32)
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


LlamaConfig = DecoderConfig
"""The older name of `DecoderConfig`: the Llama family is the decoder with every declared
difference at its default, and `LlamaConfig.from_hf` reads every supported `model_type`."""


def config_from_hf(hf_config: Any, *, extra_eos_token_ids: Sequence[int] = ()) -> DecoderConfig:
    """The `DecoderConfig` of a Hugging Face config of any supported `model_type`: the one entry
    point for checkpoint directories and GGUF metadata (which builds a `config.json`-style dict
    with HF key names). Same as `DecoderConfig.from_hf`.

    **Arguments:** `hf_config`: a `transformers.PretrainedConfig` or a `config.json` dict;
    `extra_eos_token_ids`: more ids that end generation.

    **Raises:** `UnsupportedConfigError` as `DecoderConfig.from_hf`.
    """
    return DecoderConfig.from_hf(hf_config, extra_eos_token_ids=extra_eos_token_ids)


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}


LEGACY_FIELDS = tuple(f.name for f in dataclasses.fields(DecoderConfig))[:24]
"""The fields of `LlamaConfig` before the families joined (up to `pad_token_id`), in order: the
fingerprint of a config that needs no other field is computed from them alone."""
