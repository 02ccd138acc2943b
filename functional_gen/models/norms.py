"""RMSNorm, the normalisation every supported family uses (Llama's `weight`, Gemma's `1 + weight`).

Its own module because both the decoder layers (`functional_gen.models.decoder`) and the
attention block's per-head q/k norms (`functional_gen.models.attention`) use it.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float


class RMSNorm(eqx.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), computed in float32 as transformers'
    `LlamaRMSNorm` does, then cast back and scaled by `weight` (or by `1 + weight`, Gemma's
    `Gemma3RMSNorm`; the same in float32 activations).

    **Attributes:** `weight`: `Float[Array, " hidden"]` (`" head_dim"` for a q/k norm); `eps`: the
    epsilon added to the mean square; `unit_offset` (static): scale by `1 + weight`
    (`DecoderConfig.rms_norm_unit_offset`).
    """

    weight: Float[Array, " hidden"]
    eps: float = eqx.field(static=True)
    unit_offset: bool = eqx.field(static=True, default=False)

    def __call__(self, x: Float[Array, "hidden tokens"]) -> Float[Array, "hidden tokens"]:
        """Normalise each column (token) of the feature-major `x` over its `hidden` features."""
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=0, keepdims=True) + self.eps)
        weight = self.weight + 1.0 if self.unit_offset else self.weight
        return weight[:, None] * x32.astype(x.dtype)

    def over_axis(self, x: Array, axis: int) -> Array:
        """Normalise `x` over `axis`, whose length is `weight`'s (e.g. `head_dim` of
        `Float[Array, "heads head_dim tokens"]` for a per-head q/k norm)."""
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axis, keepdims=True) + self.eps)
        weight = self.weight + 1.0 if self.unit_offset else self.weight
        shape = [1] * x.ndim
        shape[axis] = -1
        return weight.reshape(shape) * x32.astype(x.dtype)
