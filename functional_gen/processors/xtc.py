"""`XTC`: "exclude top choices", remove the most likely tokens with some probability."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import float_param, int_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class XTC(AbstractStatelessLogitsProcessor):
    """Exclude top choices: with probability `xtc_probability` (drawn per row and per step from
    `context.key`), remove every token whose probability is at least `xtc_threshold` **except
    the least likely of them**, so the choice falls to a less obvious but still viable token.

    Semantics of llama.cpp's `llama_sampler_init_xtc`: nothing happens when fewer than two
    tokens reach the threshold (so a threshold above 0.5 disables it), when fewer than two
    tokens are finite, or when removing them would leave fewer than `min_tokens_to_keep`.
    Probabilities are those of the current logits (after earlier processors); `-inf` logits are
    not candidates. Among tokens tied at the least probability above the threshold, the one with
    the lowest id is kept.

    Source: llama.cpp `src/llama-sampling.cpp` (XTC); p-e-w, text-generation-webui PR #6335,
    which recommends `xtc_threshold=0.1`, `xtc_probability=0.5`.

    **Attributes:** `xtc_threshold`: a probability in [0, 1] (or one per row);
    `xtc_probability`: the chance per step to apply, in [0, 1] (or one per row);
    `min_tokens_to_keep`: static, at least 1.

    **Raises:** `ValueError` for values outside those ranges.
    """

    xtc_threshold: Float[Array, "*rows"] = per_row_field()
    xtc_probability: Float[Array, "*rows"] = per_row_field()
    min_tokens_to_keep: int = eqx.field(static=True)

    def __init__(self, xtc_threshold=0.1, xtc_probability=0.5, min_tokens_to_keep: int = 1):
        self.xtc_threshold = float_param("xtc_threshold", xtc_threshold, low=0.0, high=1.0)
        self.xtc_probability = float_param("xtc_probability", xtc_probability, low=0.0, high=1.0)
        self.min_tokens_to_keep = int_param("min_tokens_to_keep", min_tokens_to_keep, low=1)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        probs = jax.nn.softmax(logits)
        finite = logits != -jnp.inf
        above = finite & (probs >= self.xtc_threshold)
        num_above = jnp.sum(above)
        keep = jnp.argmin(jnp.where(above, probs, jnp.inf))  # least likely of the top choices
        remove = above & (jnp.arange(logits.shape[-1]) != keep)
        chance = jax.random.uniform(context.key)
        applies = (
            (self.xtc_probability > 0)
            & (chance <= self.xtc_probability)
            & (jnp.sum(finite) >= 2)
            & (num_above >= 2)
            & (jnp.sum(finite) - (num_above - 1) >= self.min_tokens_to_keep)
        )
        return jnp.where(applies & remove, -jnp.inf, logits)
