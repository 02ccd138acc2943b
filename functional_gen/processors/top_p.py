"""`TopP`: nucleus filtering."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ._common import kth_largest, smallest_reaching
from ._validation import float_param, int_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field

CANDIDATES = 64
"""How many of the largest logits `TopP` examines before it searches the whole vocabulary."""


class TopP(AbstractStatelessLogitsProcessor):
    """Nucleus filtering: keep the smallest set of most likely tokens whose probabilities add up
    to at least `top_p`; set the others to `-inf`. Typical values are 0.9-0.95.

    Same computation as transformers' `TopPLogitsWarper`: in ascending order of probability,
    remove the tokens whose cumulative probability is `<= 1 - top_p`, and always keep the
    `min_tokens_to_keep` most likely ones. Tokens tied with the least likely kept token are kept.
    Source: Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration".

    **Speed.** transformers sorts the whole vocabulary, the slow part (about 10 ms for 49,152
    logits on a CPU core). `TopP` first takes the 64 largest logits with `lax.top_k` (see
    `CANDIDATES`): if the mass outside them is `<= 1 - top_p` (all of it is removed anyway:
    after a `TopK` of at most 64, or for any peaked distribution), the cut is found among them.
    Otherwise it finds the cut by bisection over the logit values (`smallest_reaching`, about a
    tenth of a sort), inside a `lax.while_loop` that runs zero times or once: under `vmap` the
    search runs only at steps where some row needs it (a `lax.cond` would become a `select` and
    search at every step). Both ways compute the same cut as the sort, up to float rounding of
    the cumulative sums.

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
        if self.min_tokens_to_keep <= CANDIDATES < vocab:
            found, threshold = self._threshold_among_top_k(logits, CANDIDATES)
            threshold = _unless_found(self._threshold_by_search, found, threshold, logits)
        else:
            threshold = self._threshold_by_search(logits)
        return jnp.where(logits < threshold, -jnp.inf, logits)

    def _threshold_by_search(self, logits: Float[Array, " vocab"]) -> Float[Array, ""]:
        """The smallest kept logit: the first in ascending order whose cumulative probability
        exceeds `1 - top_p`, lowered to keep `min_tokens_to_keep` tokens."""
        first_kept = smallest_reaching(
            logits, jax.nn.softmax(logits), 1 - self.top_p, inclusive=False
        )
        return jnp.minimum(first_kept, kth_largest(logits, self.min_tokens_to_keep))

    def _threshold_among_top_k(
        self, logits: Float[Array, " vocab"], k: int
    ) -> tuple[Bool[Array, ""], Float[Array, ""]]:
        """`(found, threshold)`: the smallest kept logit, if the cut lies among the `k` largest.

        Only reductions over the `top_k` output, never `top[i]`: XLA on CPU replaces a top_k
        whose output is indexed by a full sort.
        """
        top = jax.lax.top_k(logits, k)[0]  # descending
        largest, smallest = jnp.max(top), jnp.min(top)
        unnormalised = jnp.exp(logits - largest)
        norm = jnp.sum(unnormalised)
        below = jnp.sum(jnp.where(logits < smallest, unnormalised, 0.0)) / norm
        # Ascending cumulative probability at each candidate: the mass below all candidates
        # plus the candidates from it downwards.
        cumulative = below + jnp.cumsum(jnp.exp(top - largest)[::-1] / norm)[::-1]
        limit = 1 - self.top_p
        num_kept = jnp.maximum(k - jnp.sum(cumulative <= limit), self.min_tokens_to_keep)
        threshold = jnp.min(jnp.where(jnp.arange(k) < num_kept, top, jnp.inf))
        return below <= limit, threshold


def _unless_found(search, found, threshold, logits):
    """`search(logits)` where `found` is false, in a `while_loop` that runs at most once. The
    logits travel in the carry through an optimisation barrier: were the search loop-invariant,
    XLA would hoist it out of the loop (as it does under `vmap`) and run it at every step."""

    def body(carry):
        _, _, x = carry
        x = jax.lax.optimization_barrier(x)
        return jnp.asarray(True), search(x), x

    _, threshold, _ = jax.lax.while_loop(lambda carry: ~carry[0], body, (found, threshold, logits))
    return threshold
