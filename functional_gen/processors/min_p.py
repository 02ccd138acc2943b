"""`MinP`: keep tokens at least `min_p` times as likely as the most likely one."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._common import keep_top
from ._validation import float_param, int_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class MinP(AbstractStatelessLogitsProcessor):
    """Remove every token whose probability is below `min_p` times the top token's probability.
    Typical values are 0.01-0.2.

    Source: Nguyen et al. 2024, "Turning Up the Heat: Min-p Sampling for Creative and Coherent
    LLM Outputs"; transformers' `MinPLogitsWarper` (same semantics, `min_tokens_to_keep` most
    likely tokens always kept).

    **Attributes:** `min_p`: in [0, 1] (or one value per row); `min_tokens_to_keep` (static).

    **Raises:** `ValueError` for `min_p` outside [0, 1] or a non-positive `min_tokens_to_keep`.
    """

    min_p: Float[Array, "*rows"] = per_row_field()
    min_tokens_to_keep: int = eqx.field(static=True)

    def __init__(self, min_p, min_tokens_to_keep: int = 1):
        self.min_p = float_param("min_p", min_p, low=0.0, high=1.0)
        self.min_tokens_to_keep = int_param("min_tokens_to_keep", min_tokens_to_keep, low=1)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        # probs < min_p * max(probs)  <=>  logits < max(logits) + log(min_p): no softmax needed.
        # The largest logit is never removed (min_p <= 1), so one token is always kept.
        remove = logits < jnp.max(logits) + jnp.log(self.min_p)
        if self.min_tokens_to_keep > 1:
            remove = keep_top(remove, logits, self.min_tokens_to_keep)
        return jnp.where(remove, -jnp.inf, logits)
