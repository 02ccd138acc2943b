"""`ForcedBOS`: force the first generated token."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import int_param
from .base import AbstractStatelessLogitsProcessor, Context


class ForcedBOS(AbstractStatelessLogitsProcessor):
    """Force `forced_bos_token_id` as the first generated token: at that step its logit is 0
    and every other logit `-inf`; later steps are unchanged.

    Source: transformers' `ForcedBOSTokenLogitsProcessor` (`GenerationConfig.forced_bos_token_id`,
    used by encoder-decoder models such as mBART to pick the target language). transformers
    forces when the sequence has length 1, i.e. the first step after an encoder-decoder's decoder
    start token; here the condition is "no token generated yet", which is the same step for
    those models and also makes sense for decoder-only prompts of any length. For a longer
    forced prefix, see `ForcedTokens`.

    **Attributes:** `forced_bos_token_id`: the token id (static).

    **Raises:** `ValueError` for a negative id.
    """

    forced_bos_token_id: int = eqx.field(static=True)

    def __init__(self, forced_bos_token_id: int):
        self.forced_bos_token_id = int_param("forced_bos_token_id", forced_bos_token_id, low=0)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        only = jnp.where(jnp.arange(logits.shape[-1]) == self.forced_bos_token_id, 0.0, -jnp.inf)
        return jnp.where(context.num_generated == 0, only.astype(logits.dtype), logits)
