"""`MinNewTokens`: forbid EOS until enough tokens were generated."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from ._validation import int_param, token_ids_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class MinNewTokens(AbstractStatelessLogitsProcessor):
    """Set the EOS logits to `-inf` while fewer than `min_new_tokens` tokens were generated
    (the prompt does not count).

    Source: transformers' `MinNewTokensLengthLogitsProcessor`.

    **Attributes:** `min_new_tokens`: an int array leaf (new values do not recompile);
    `eos_token_id`: the token ids to forbid (static tuple; pass all of the model's EOS ids,
    `model.config.eos_token_id`).

    **Raises:** `ValueError` for a negative `min_new_tokens` or no/negative EOS ids.
    """

    min_new_tokens: Int[Array, "*rows"] = per_row_field()
    eos_token_id: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, min_new_tokens: int | Int[ArrayLike, " rows"], eos_token_id):
        if isinstance(min_new_tokens, (int, np.integer)):
            min_new_tokens = int_param("min_new_tokens", min_new_tokens, low=0)
        values = np.asarray(min_new_tokens)
        if values.ndim > 1 or values.dtype.kind not in "iu" or np.any(values < 0):
            raise ValueError(
                f"`min_new_tokens` must be a non-negative integer or one per row, got {min_new_tokens!r}"
            )
        self.min_new_tokens = jnp.asarray(values, jnp.int32)
        self.eos_token_id = token_ids_param("eos_token_id", eos_token_id)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        too_short = context.num_generated < self.min_new_tokens
        masked = logits.at[jnp.asarray(self.eos_token_id)].set(-jnp.inf, mode="drop")
        return jnp.where(too_short, masked, logits)
