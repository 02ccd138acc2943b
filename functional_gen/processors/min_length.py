"""`MinLength`: forbid EOS while the sequence, prompt included, is too short."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ._validation import int_array_param, token_ids_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class MinLength(AbstractStatelessLogitsProcessor):
    """Set the EOS logits to `-inf` while the sequence has fewer than `min_length` tokens,
    **prompt included** (for a count of generated tokens only, use `MinNewTokens`).

    Source: transformers' `MinLengthLogitsProcessor` (`GenerationConfig.min_length`), same
    semantics: EOS is forbidden while `length < min_length`.

    **Attributes:** `min_length`: an int array leaf, `>= 0` (or one per row; new values do not
    recompile); `eos_token_id`: the ids to forbid (static tuple; pass all of the model's EOS ids).

    **Raises:** `ValueError` for a negative or non-integer `min_length`, or no/negative EOS ids.
    """

    min_length: Int[Array, "*rows"] = per_row_field()
    eos_token_id: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, min_length, eos_token_id):
        self.min_length = int_array_param("min_length", min_length, low=0)
        self.eos_token_id = token_ids_param("eos_token_id", eos_token_id)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        masked = logits.at[jnp.asarray(self.eos_token_id)].set(-jnp.inf, mode="drop")
        return jnp.where(context.length < self.min_length, masked, logits)
