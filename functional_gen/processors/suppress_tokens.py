"""`SuppressTokens`: never generate the given tokens."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import token_ids_param
from .base import AbstractStatelessLogitsProcessor, Context


class SuppressTokens(AbstractStatelessLogitsProcessor):
    """Set the logits of `suppress_tokens` to `-inf` at every step.

    Source: transformers' `SuppressTokensLogitsProcessor` (`GenerationConfig.suppress_tokens`).

    **Attributes:** `suppress_tokens`: token ids (static tuple).

    **Raises:** `ValueError` for negative ids.
    """

    suppress_tokens: tuple[int, ...] = eqx.field(static=True, converter=tuple)

    def __check_init__(self):
        token_ids_param("suppress_tokens", self.suppress_tokens, allow_empty=True)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        if not self.suppress_tokens:
            return logits
        return logits.at[jnp.asarray(self.suppress_tokens)].set(-jnp.inf, mode="drop")
