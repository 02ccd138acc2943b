"""`TopP`: nucleus filtering."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import float_param, int_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class TopP(AbstractStatelessLogitsProcessor):
    """Nucleus filtering: keep the smallest set of most likely tokens whose probabilities add up
    to at least `top_p`; set the others to `-inf`. Typical values are 0.9-0.95.

    Same computation as transformers' `TopPLogitsWarper`: sort ascending, remove the tokens whose
    ascending cumulative probability is `<= 1 - top_p`, always keep the `min_tokens_to_keep` most
    likely ones. Source: Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration".

    **Attributes:** `top_p`: in (0, 1] (or one value per row); `min_tokens_to_keep` (static).

    **Raises:** `ValueError` for `top_p` outside (0, 1] or a non-positive `min_tokens_to_keep`.
    """

    top_p: Float[Array, "*rows"] = per_row_field()
    min_tokens_to_keep: int = eqx.field(static=True)

    def __init__(self, top_p, min_tokens_to_keep: int = 1):
        self.top_p = float_param("top_p", top_p, low=0.0, high=1.0, low_inclusive=False)
        self.min_tokens_to_keep = int_param("min_tokens_to_keep", min_tokens_to_keep, low=1)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        vocab = logits.shape[-1]
        ascending = jnp.sort(logits)
        cumulative = jnp.cumsum(jax.nn.softmax(ascending))
        # The removed tokens form a prefix of the ascending order; the first kept one sets the bar.
        num_removed = jnp.sum(cumulative <= 1 - self.top_p)
        num_removed = jnp.minimum(num_removed, vocab - min(self.min_tokens_to_keep, vocab))
        threshold = ascending[num_removed]
        return jnp.where(logits < threshold, -jnp.inf, logits)
