"""`SuppressTokensAtBegin`: forbid some tokens as the first generated token."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import int_param, token_ids_param
from .base import AbstractStatelessLogitsProcessor, Context


class SuppressTokensAtBegin(AbstractStatelessLogitsProcessor):
    """Set the logits of `begin_suppress_tokens` to `-inf` at one step only: when exactly
    `begin_index` tokens have been generated (default 0, the first generated token).

    Source: transformers' `SuppressTokensAtBeginLogitsProcessor`
    (`GenerationConfig.begin_suppress_tokens`, from Whisper). transformers' `begin_index` is an
    absolute length (the prompt length, plus one after a forced BOS token); here it counts
    generated tokens only, so rows with different prompt lengths share it: transformers'
    `begin_index = prompt_length + begin_index`.

    **Attributes:** `begin_suppress_tokens`: token ids (static tuple); `begin_index`: number of
    generated tokens before the suppressed step (static int, use 1 after a `ForcedBOS`).

    **Raises:** `ValueError` for negative ids or a negative `begin_index`.
    """

    begin_suppress_tokens: tuple[int, ...] = eqx.field(static=True)
    begin_index: int = eqx.field(static=True)

    def __init__(self, begin_suppress_tokens, begin_index: int = 0):
        self.begin_suppress_tokens = token_ids_param(
            "begin_suppress_tokens", begin_suppress_tokens, allow_empty=True
        )
        self.begin_index = int_param("begin_index", begin_index, low=0)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        if not self.begin_suppress_tokens:
            return logits
        masked = logits.at[jnp.asarray(self.begin_suppress_tokens)].set(-jnp.inf, mode="drop")
        return jnp.where(context.num_generated == self.begin_index, masked, logits)
