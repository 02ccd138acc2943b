"""`RemoveInvalidValues`: replace NaN and infinite logits by finite ones."""

import jax.numpy as jnp
from jaxtyping import Array, Float

from .base import AbstractStatelessLogitsProcessor, Context


class RemoveInvalidValues(AbstractStatelessLogitsProcessor):
    """Replace NaN logits by 0, `+inf` by the largest finite value of the dtype and `-inf` by
    the smallest, so sampling cannot fail on them.

    Note that this also turns the `-inf` of earlier filters into a very small finite value: put
    it before filters (transformers applies it with the processors, before the warpers), and
    use it only when needed.

    Source: transformers' `InfNanRemoveLogitsProcessor` (`GenerationConfig.remove_invalid_values`),
    same semantics.
    """

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        info = jnp.finfo(logits.dtype)
        logits = jnp.where(jnp.isnan(logits), 0.0, logits)
        logits = jnp.where(logits == jnp.inf, info.max, logits)
        return jnp.where(logits == -jnp.inf, info.min, logits).astype(logits.dtype)
