"""`RepetitionPenalty`: make tokens already in the sequence less likely."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ._validation import float_param, int_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


def seen_tokens(context: Context, vocab: int, mask=None) -> Bool[Array, " vocab"]:
    """`True` for every token id that occurs in the valid part of `context.token_ids` (or, given
    `mask: Bool[Array, " max_len"]`, at the positions it marks)."""
    mask = context.valid_mask if mask is None else mask
    ids = jnp.where(mask, context.token_ids, vocab)  # out of range -> dropped
    return jnp.zeros((vocab,), bool).at[ids].set(True, mode="drop")


class RepetitionPenalty(AbstractStatelessLogitsProcessor):
    """Penalise every token that already occurs in the sequence (prompt included): a positive
    logit is divided by `repetition_penalty`, a negative one multiplied by it.

    Source: Keskar et al. 2019, "CTRL" (section 4.1); transformers' `RepetitionPenaltyLogitsProcessor`.

    With `penalty_last_n` only the last `penalty_last_n` tokens of the sequence count, as in
    llama.cpp's `penalty_last_n` (`repeat_last_n`, source: llama.cpp `llama_sampler_penalties`);
    transformers has no window, and the default `-1` (the whole sequence) is its behaviour.

    **Attributes:**

    - `repetition_penalty`: > 0 (or one value per row); 1.0 is no penalty, values above 1
      discourage repetition.
    - `penalty_last_n`: static int, how many of the last tokens (prompt included) count; -1 =
      all of them, 0 = none (the processor then does nothing).

    **Raises:** `ValueError` for a non-positive penalty or a `penalty_last_n` below -1.
    """

    repetition_penalty: Float[Array, "*rows"] = per_row_field()
    penalty_last_n: int = eqx.field(static=True)

    def __init__(self, repetition_penalty, penalty_last_n: int = -1):
        self.repetition_penalty = float_param(
            "repetition_penalty", repetition_penalty, low=0.0, low_inclusive=False
        )
        self.penalty_last_n = int_param("penalty_last_n", penalty_last_n, low=-1)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        if self.penalty_last_n == 0:
            return logits
        if self.penalty_last_n < 0:
            seen = seen_tokens(context, logits.shape[-1])
        else:
            i = jnp.arange(context.token_ids.shape[0])
            window = context.valid_mask & (i >= context.length - self.penalty_last_n)
            seen = seen_tokens(context, logits.shape[-1], window)
        p = self.repetition_penalty
        penalised = jnp.where(logits < 0, logits * p, logits / p)
        return jnp.where(seen, penalised, logits)
