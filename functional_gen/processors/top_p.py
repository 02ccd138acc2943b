"""`TopP`: nucleus filtering."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import float_param, int_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field

CANDIDATES = 256
"""How many of the largest logits `TopP` examines before it falls back to sorting them all."""


class TopP(AbstractStatelessLogitsProcessor):
    """Nucleus filtering: keep the smallest set of most likely tokens whose probabilities add up
    to at least `top_p`; set the others to `-inf`. Typical values are 0.9-0.95.

    Same computation as transformers' `TopPLogitsWarper`: in ascending order of probability,
    remove the tokens whose cumulative probability is `<= 1 - top_p`, and always keep the
    `min_tokens_to_keep` most likely ones. Tokens tied with the least likely kept token are kept.
    Source: Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration".

    **Speed.** Sorting the whole vocabulary is the slow part (about 10 ms for 49,152 logits on a
    CPU core), so `TopP` first takes the `CANDIDATES` (256) largest logits with `lax.top_k`. If
    the mass outside them is `<= 1 - top_p` (every one of them is removed anyway, e.g. after a
    `TopK`, or for any peaked distribution), the cut is found among the candidates, with the
    same formula. Only otherwise does it sort everything, inside a `lax.while_loop` that runs
    zero or one time: under `vmap` the sort then runs only at steps where some row needs it
    (a `lax.cond` would become a `select` and sort at every step).

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
        k = max(CANDIDATES, self.min_tokens_to_keep)
        if k >= vocab:
            threshold = self._threshold_by_sorting(logits)
        else:
            found, threshold = self._threshold_among_top_k(logits, k)
            _, threshold, _ = jax.lax.while_loop(
                lambda carry: ~carry[0], lambda carry: self._sort_once(carry), (found, threshold, logits)
            )
        return jnp.where(logits < threshold, -jnp.inf, logits)

    def _sort_once(self, carry):
        """The fallback's loop body. The logits travel in the carry, through an optimisation
        barrier: were the sort loop-invariant, XLA would hoist it out of the loop (as it does
        under `vmap`) and run it at every step."""
        _, _, logits = carry
        logits = jax.lax.optimization_barrier(logits)
        return jnp.asarray(True), self._threshold_by_sorting(logits), logits

    def _threshold_by_sorting(self, logits: Float[Array, " vocab"]) -> Float[Array, ""]:
        """The smallest kept logit, from the whole vocabulary sorted ascending."""
        vocab = logits.shape[-1]
        ascending = jnp.sort(logits)
        cumulative = jnp.cumsum(jax.nn.softmax(ascending))
        # The removed tokens form a prefix of the ascending order; the first kept one sets the bar.
        num_removed = jnp.sum(cumulative <= 1 - self.top_p)
        num_removed = jnp.minimum(num_removed, vocab - min(self.min_tokens_to_keep, vocab))
        return ascending[num_removed]

    def _threshold_among_top_k(self, logits: Float[Array, " vocab"], k: int):
        """`(found, threshold)`: the smallest kept logit, if the cut lies among the `k` largest."""
        top = jax.lax.top_k(logits, k)[0]  # descending
        log_norm = jax.nn.logsumexp(logits)
        # Ascending cumulative probability at each candidate: the mass below all candidates
        # plus the candidates from it downwards.
        below = jnp.sum(jnp.where(logits < jnp.min(top), jnp.exp(logits - log_norm), 0.0))
        cumulative = below + jnp.cumsum(jnp.exp(top - log_norm)[::-1])[::-1]
        limit = 1 - self.top_p
        num_kept = jnp.maximum(k - jnp.sum(cumulative <= limit), self.min_tokens_to_keep)
        # Reductions over `top`, never `top[i]`: XLA on CPU turns a top_k whose output is
        # indexed into a full sort.
        threshold = jnp.min(jnp.where(jnp.arange(k) < num_kept, top, jnp.inf))
        return below <= limit, threshold
