"""`ForcedEOS`: force an EOS token at the last allowed step."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import token_ids_param
from .base import AbstractStatelessLogitsProcessor, Context


class ForcedEOS(AbstractStatelessLogitsProcessor):
    """At the last step a row may generate (`num_generated == max_new_tokens - 1`), set the EOS
    logits to 0 and every other logit to `-inf`, so a row cut by the budget still ends on EOS.

    Source: transformers' `ForcedEOSTokenLogitsProcessor` (`GenerationConfig.forced_eos_token_id`).
    transformers forces when the sequence length (prompt included) is `max_length - 1`; with
    `max_length = prompt_length + max_new_tokens`, as `generate(max_new_tokens=...)` sets it, that
    is the same step. Here the budget comes from `Context.max_new_tokens`, one per row.

    **Attributes:** `forced_eos_token_id`: the EOS id(s) (static tuple); with several, all of them
    get logit 0 (equally likely), as in transformers.

    **Raises:** `ValueError` for no ids or negative ids.
    """

    forced_eos_token_id: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, forced_eos_token_id):
        self.forced_eos_token_id = token_ids_param("forced_eos_token_id", forced_eos_token_id)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        is_eos = jnp.isin(jnp.arange(logits.shape[-1]), jnp.asarray(self.forced_eos_token_id))
        only_eos = jnp.where(is_eos, 0.0, -jnp.inf).astype(logits.dtype)
        last_step = context.num_generated == context.max_new_tokens - 1
        return jnp.where(last_step, only_eos, logits)
