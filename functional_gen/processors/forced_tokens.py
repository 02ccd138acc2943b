"""`ForcedTokens`: a stateful processor that forces a token sequence at the start of generation."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ._validation import token_ids_param
from .base import AbstractLogitsProcessor, Context


class ForcedTokens(AbstractLogitsProcessor):
    """Force the first generated tokens to be `token_ids`, then leave the logits alone.

    The example of a stateful processor (after Bumblebee's stateful-processor work): its state is
    the index of the next token to force, an `int32` scalar that `init` sets to 0 and every
    `process` advances by one. The state keeps its shape, so it can be a `while_loop` carry, and
    reordering rows (beam search) reorders it with everything else.

    While forcing, every logit but the forced token's is `-inf` and the forced token's is 0 (as
    transformers' `ForcedBOSTokenLogitsProcessor` does).

    Source: Bumblebee's `forced_token_ids` and transformers' former `forced_decoder_ids`, which
    force given tokens at given steps; here the steps are the first `len(token_ids)` generated.

    **Attributes:** `token_ids`: the tokens to force (static tuple).

    **Raises:** `ValueError` for an empty sequence or negative ids.
    """

    token_ids: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, token_ids):
        self.token_ids = token_ids_param("token_ids", token_ids)

    def init(self, context: Context) -> Int[Array, ""]:
        return jnp.zeros((), jnp.int32)

    def process(
        self, state: Int[Array, ""], logits: Float[Array, " vocab"], context: Context
    ) -> tuple[Int[Array, ""], Float[Array, " vocab"]]:
        forced = jnp.asarray(self.token_ids, jnp.int32)
        target = forced[jnp.minimum(state, len(self.token_ids) - 1)]
        only_target = jnp.where(jnp.arange(logits.shape[-1]) == target, 0.0, -jnp.inf)
        logits = jnp.where(state < len(self.token_ids), only_target.astype(logits.dtype), logits)
        return state + 1, logits
