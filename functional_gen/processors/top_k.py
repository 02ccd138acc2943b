"""`TopK`: keep the `top_k` largest logits."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._common import kth_largest
from ._validation import int_param
from .base import AbstractStatelessLogitsProcessor, Context


class TopK(AbstractStatelessLogitsProcessor):
    """Keep the `top_k` tokens with the largest logits; set the others to `-inf`.

    Tokens tied with the `top_k`-th largest logit are kept, as in transformers.
    Source: transformers' `TopKLogitsWarper`; Fan et al. 2018, "Hierarchical Neural Story Generation".

    **Attributes:** `top_k`: tokens to keep (static: it decides a shape; at least 1);
    `min_tokens_to_keep`: lower bound on `top_k` (transformers' parameter).

    **Raises:** `ValueError` if `top_k` or `min_tokens_to_keep` is not a positive integer.
    """

    top_k: int = eqx.field(static=True)
    min_tokens_to_keep: int = eqx.field(static=True, default=1)

    def __check_init__(self):
        int_param("top_k", self.top_k, low=1)
        int_param("min_tokens_to_keep", self.min_tokens_to_keep, low=1)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        threshold = kth_largest(logits, max(self.top_k, self.min_tokens_to_keep))
        return jnp.where(logits < threshold, -jnp.inf, logits)
