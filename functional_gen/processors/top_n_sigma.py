"""`TopNSigma`: keep the logits within `n` standard deviations of the largest."""

import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import float_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class TopNSigma(AbstractStatelessLogitsProcessor):
    """Top-nσ: set to `-inf` every token whose logit is below `max - top_n_sigma * σ`, where
    `max` and `σ` (population standard deviation) are taken over the finite logits.

    It works on logits, not probabilities, so it is invariant to temperature applied before it.
    Source: Tang et al. 2024, "Top-nσ: Not All Logits Are You Need"; llama.cpp's
    `llama_sampler_init_top_n_sigma` (same semantics: `-inf` logits are left out of the mean and
    σ; `top_n_sigma <= 0` or fewer than two finite logits leaves the logits unchanged).

    **Attributes:** `top_n_sigma`: `>= 0` (or one value per row), in standard deviations
    (llama.cpp's `top_n_sigma`); 0 keeps every token. The paper uses 1.0.

    **Raises:** `ValueError` for a negative or non-finite `top_n_sigma`.
    """

    top_n_sigma: Float[Array, "*rows"] = per_row_field()

    def __init__(self, top_n_sigma):
        self.top_n_sigma = float_param("top_n_sigma", top_n_sigma, low=0.0)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        finite = logits != -jnp.inf
        count = jnp.sum(finite, dtype=logits.dtype)  # a float: divides float sums below
        values = jnp.where(finite, logits, 0.0)
        mean = jnp.sum(values) / jnp.maximum(count, 1)
        sigma = jnp.sqrt(
            jnp.sum(jnp.where(finite, (logits - mean) ** 2, 0.0)) / jnp.maximum(count, 1)
        )
        filtered = jnp.where(logits < jnp.max(logits) - self.top_n_sigma * sigma, -jnp.inf, logits)
        active = (self.top_n_sigma > 0) & (count > 1)
        return jnp.where(active, filtered, logits)
