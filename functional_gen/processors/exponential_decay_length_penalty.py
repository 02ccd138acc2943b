"""`ExponentialDecayLengthPenalty`: make EOS exponentially more likely after a given length."""

from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ._validation import float_param, int_array_param, token_ids_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class ExponentialDecayLengthPenalty(AbstractStatelessLogitsProcessor):
    """Once more than `start_index` tokens were generated, raise the EOS logits: with
    `n = num_generated - start_index`, each finite EOS logit `x` becomes
    `x + |x| * (decay_factor ** n - 1)`. Sequences then tend to end soon after `start_index`
    without a hard cut.

    Source: transformers' `ExponentialDecayLengthPenalty`
    (`GenerationConfig.exponential_decay_length_penalty = (start_index, decay_factor)`), same
    semantics. transformers counts `start_index` from the prompt length passed at construction;
    here it counts generated tokens of each row, which is the same.

    **Attributes:**

    - `start_index`: generated tokens before the penalty starts (int array leaf, `>= 0`, or one
      per row).
    - `decay_factor`: `> 0` (or one per row); above 1 makes EOS more likely with every step.
    - `eos_token_id`: static tuple of EOS ids.

    Construct with `ExponentialDecayLengthPenalty((start_index, decay_factor), eos_token_id)`.

    **Raises:** `ValueError` for a malformed tuple, a negative `start_index`, a non-positive
    `decay_factor`, or no/negative EOS ids.
    """

    start_index: Int[Array, "*rows"] = per_row_field()
    decay_factor: Float[Array, "*rows"] = per_row_field()
    eos_token_id: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, exponential_decay_length_penalty, eos_token_id):
        if (
            not isinstance(exponential_decay_length_penalty, Sequence)
            or len(exponential_decay_length_penalty) != 2
        ):
            raise ValueError(
                "`exponential_decay_length_penalty` must be a pair (start_index, decay_factor), "
                f"got {exponential_decay_length_penalty!r}"
            )
        start_index, decay_factor = exponential_decay_length_penalty
        self.start_index = int_array_param(
            "exponential_decay_length_penalty[0] (start_index)", start_index, low=0
        )
        self.decay_factor = float_param(
            "exponential_decay_length_penalty[1] (decay_factor)",
            decay_factor,
            low=0.0,
            low_inclusive=False,
        )
        self.eos_token_id = token_ids_param("eos_token_id", eos_token_id)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        steps = context.num_generated - self.start_index
        eos = jnp.asarray(self.eos_token_id)
        eos_logits = logits[eos]
        factor = self.decay_factor ** steps.astype(jnp.float32) - 1.0
        penalty = jnp.where(jnp.isfinite(eos_logits), jnp.abs(eos_logits) * factor, 0.0)
        penalty = jnp.where(steps > 0, penalty, 0.0).astype(logits.dtype)
        return logits + jnp.zeros_like(logits).at[eos].set(penalty, mode="drop")
