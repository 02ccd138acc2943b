"""`RepetitionPenalty`: make tokens already in the sequence less likely."""

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ._validation import float_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


def seen_tokens(context: Context, vocab: int) -> Bool[Array, " vocab"]:
    """`True` for every token id that occurs in the valid part of `context.token_ids`."""
    ids = jnp.where(context.valid_mask, context.token_ids, vocab)  # out of range -> dropped
    return jnp.zeros((vocab,), bool).at[ids].set(True, mode="drop")


class RepetitionPenalty(AbstractStatelessLogitsProcessor):
    """Penalise every token that already occurs in the sequence (prompt included): a positive
    logit is divided by `repetition_penalty`, a negative one multiplied by it.

    Source: Keskar et al. 2019, "CTRL" (section 4.1); transformers' `RepetitionPenaltyLogitsProcessor`.

    **Attributes:** `repetition_penalty`: > 0 (or one value per row); 1.0 is no penalty, values
    above 1 discourage repetition.

    **Raises:** `ValueError` for a non-positive penalty.
    """

    repetition_penalty: Float[Array, "*rows"] = per_row_field()

    def __init__(self, repetition_penalty):
        self.repetition_penalty = float_param(
            "repetition_penalty", repetition_penalty, low=0.0, low_inclusive=False
        )

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        seen = seen_tokens(context, logits.shape[-1])
        p = self.repetition_penalty
        penalised = jnp.where(logits < 0, logits * p, logits / p)
        return jnp.where(seen, penalised, logits)
