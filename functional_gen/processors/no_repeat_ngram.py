"""`NoRepeatNGram`: never generate the same n-gram twice."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import int_param
from .base import AbstractStatelessLogitsProcessor, Context


class NoRepeatNGram(AbstractStatelessLogitsProcessor):
    """Set to `-inf` every token that would complete an n-gram (of `no_repeat_ngram_size`
    tokens) that already occurs in the sequence, prompt included.

    The last `no_repeat_ngram_size - 1` tokens are matched against every earlier window; each
    window that starts with them bans the token that followed. No state is needed: the sequence
    itself is the record (`O(max_len * no_repeat_ngram_size)` comparisons per step).

    Source: transformers' `NoRepeatNGramLogitsProcessor` (fairseq's `no_repeat_ngram_size`),
    same semantics.

    **Attributes:** `no_repeat_ngram_size`: n, static (it decides the window shape); 1 bans every
    token already in the sequence.

    **Raises:** `ValueError` if `no_repeat_ngram_size` is not a positive integer.
    """

    no_repeat_ngram_size: int = eqx.field(static=True)

    def __init__(self, no_repeat_ngram_size: int):
        self.no_repeat_ngram_size = int_param("no_repeat_ngram_size", no_repeat_ngram_size, low=1)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        n = self.no_repeat_ngram_size
        vocab = logits.shape[-1]
        ids = context.token_ids
        max_len = ids.shape[0]
        padded = jnp.concatenate([ids, jnp.zeros((n,), ids.dtype)])
        # The window starting at i is ids[i : i + n]; it is complete if i + n <= length.
        starts = jnp.arange(max_len)
        match = starts + n <= context.length
        prefix_start = context.length - (n - 1)
        for j in range(n - 1):
            prefix_token = padded[jnp.clip(prefix_start + j, 0, max_len - 1)]
            match = match & (padded[j : j + max_len] == prefix_token)
        banned_ids = jnp.where(match, padded[n - 1 : n - 1 + max_len], vocab)
        banned = jnp.zeros((vocab,), bool).at[banned_ids].set(True, mode="drop")
        return jnp.where(banned, -jnp.inf, logits)
