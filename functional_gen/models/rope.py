"""`RotaryEmbedding`: rotary position embedding of queries and keys, the model's global one and
Gemma 3's local one (`DecoderModel.rotary_emb_local`), with `longrope`'s per-row choice of
factors.

Source: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding";
the reference implementation is transformers' `modeling_llama.py` (`LlamaRotaryEmbedding`,
`rotate_half`, `apply_rotary_pos_emb`) and `modeling_rope_utils.py` (scaling types). Split out
of `functional_gen.models.attention`, which re-exports it.
"""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


class RotaryEmbedding(eqx.Module):
    """Rotary position embedding (Su et al. 2021, "RoFormer"), in transformers' `rotate_half`
    convention (the two halves of a head, not interleaved pairs).

    **Attributes:** `inv_freq`: `Float[Array, " rotary_dim/2"]`, from
    `DecoderConfig.rope_inv_freq` (default, linear, llama3 or longrope scaling; `rotary_dim` is
    `head_dim` unless `partial_rotary_factor` < 1). Not a checkpoint weight.
    `attention_scaling` (static): the factor on `cos` and `sin` (`longrope`'s attention factor,
    else 1). `long_inv_freq`, `original_max_position_embeddings` (static, `longrope` only, else
    `None`): the long factors' inverse frequencies (`rope_inv_freq(long=True)`) and the context
    length past which a call uses them (see `cos_sin`).
    """

    inv_freq: Float[Array, " half_rotary_dim"]
    attention_scaling: float = eqx.field(static=True, default=1.0)
    long_inv_freq: tuple[float, ...] | None = eqx.field(static=True, default=None)
    original_max_position_embeddings: int | None = eqx.field(static=True, default=None)

    @classmethod
    def of_config(cls, config) -> "RotaryEmbedding":
        """The global RoPE of a `DecoderConfig`: its `rope_inv_freq()` and attention factor,
        and for `longrope` the long factors' frequencies and the original context length."""
        long = None
        if config.rope_type == "longrope":
            long = tuple(float(f) for f in config.rope_inv_freq(long=True))
        return cls(
            jnp.asarray(config.rope_inv_freq()),
            config.rope_attention_factor,
            long,
            config.rope_original_max_position_embeddings if long is not None else None,
        )

    def cos_sin(
        self, positions: Int[Array, "*batch seq"]
    ) -> tuple[Float[Array, "rotary_dim tokens"], Float[Array, "rotary_dim tokens"]]:
        """The rotation of each position: `cos` and `sin` of `position * inv_freq`, both halves,
        for the positions flattened (`tokens = batch * seq`; negative positions are padding).

        `longrope` (`long_inv_freq` set): a row whose largest position + 1 exceeds
        `original_max_position_embeddings` is rotated with the long factors, every token of it,
        else with the short ones, as transformers' `longrope_frequency_update` chooses per
        forward call from `max(position_ids) + 1` (transformers over the whole batch; here per
        row, so that a row does not depend on its batch mates: the same at batch 1). With a KV
        cache, the keys written by earlier calls keep the factors they were rotated with, as in
        transformers' cache: a prompt within the original context decoded past it has short
        keys and long queries from then on, in both.
        """
        if self.long_inv_freq is not None:
            rows = positions.reshape(-1, positions.shape[-1])
            long = jnp.max(rows, axis=-1) + 1 > self.original_max_position_embeddings
            inv = jnp.where(
                long[:, None], jnp.asarray(self.long_inv_freq, jnp.float32), self.inv_freq
            )  # [rows, half]
            angles = inv[:, :, None] * rows[:, None, :].astype(jnp.float32)
            angles = jnp.moveaxis(angles, 0, 1).reshape(inv.shape[1], -1)  # [half, tokens]
        else:
            angles = self.inv_freq[:, None] * positions.reshape(-1)[None, :].astype(jnp.float32)
        angles = jnp.concatenate([angles, angles], axis=0)  # [rotary_dim, tokens]
        if self.attention_scaling != 1.0:
            return jnp.cos(angles) * self.attention_scaling, jnp.sin(
                angles
            ) * self.attention_scaling
        return jnp.cos(angles), jnp.sin(angles)

    @staticmethod
    def rotate(
        x: Float[Array, "heads head_dim tokens"],
        cos_sin: tuple[Float[Array, "rotary_dim tokens"], Float[Array, "rotary_dim tokens"]],
    ) -> Float[Array, "heads head_dim tokens"]:
        """Rotate `x` by angles from `cos_sin` (computed once per forward, shared by all layers).

        With fewer rotary dimensions than `head_dim` (partial rotary, Phi-3's
        `apply_rotary_pos_emb`), only the first `rotary_dim` of each head rotate; the rest pass.
        """
        cos, sin = (t.astype(x.dtype) for t in cos_sin)
        if cos.shape[0] < x.shape[1]:
            rotary = cos.shape[0]
            turned = RotaryEmbedding.rotate(x[:, :rotary], (cos, sin))
            return jnp.concatenate([turned, x[:, rotary:]], axis=1)
        half = x.shape[1] // 2
        rotated = jnp.concatenate([-x[:, half:], x[:, :half]], axis=1)
        return x * cos + rotated * sin
