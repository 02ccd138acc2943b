"""Array helpers shared by several processors (one row at a time)."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .base import Context


def kth_largest(logits: Float[Array, " vocab"], k: int) -> Float[Array, ""]:
    """The `k`-th largest logit (`k` static, clipped to the vocabulary size).

    Written as the minimum of the `k` largest, not `top_k(...)[0][-1]`: XLA on CPU turns a
    `top_k` whose output is indexed into a full sort (10 ms instead of 0.1 ms for 49,152 logits).
    """
    k = min(k, logits.shape[-1])
    if k == 1:
        return jnp.max(logits)
    return jnp.min(jax.lax.top_k(logits, k)[0])


def keep_top(
    remove: Bool[Array, " vocab"], logits: Float[Array, " vocab"], min_tokens_to_keep: int
) -> Bool[Array, " vocab"]:
    """`remove`, except for the `min_tokens_to_keep` largest logits (ties with the last one kept)."""
    return remove & (logits < kth_largest(logits, min_tokens_to_keep))


def token_counts(context: Context, vocab: int, *, generated_only: bool) -> Int[Array, " vocab"]:
    """How often each token id occurs in the valid (or only the generated) part of the row."""
    mask = context.generated_mask if generated_only else context.valid_mask
    ids = jnp.where(mask, context.token_ids, vocab)  # out of range -> dropped
    return jnp.zeros((vocab,), jnp.int32).at[ids].add(1, mode="drop")


def entropy(logits: Float[Array, " vocab"]) -> Float[Array, ""]:
    """Shannon entropy (nats) of `softmax(logits)`; `-inf` logits contribute 0."""
    logprobs = jax.nn.log_softmax(logits)
    probs = jnp.exp(logprobs)
    return -jnp.sum(jnp.where(probs > 0, probs * logprobs, 0.0))


def _ordered_key(x: Float[Array, "*shape"]) -> Array:
    """float32 -> uint32 with the same order (the radix-sort key: flip the sign bit of
    non-negative floats, every bit of negative ones)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where((bits >> 31) == 1, ~bits, bits | jnp.uint32(0x80000000))


def _from_ordered_key(key: Array) -> Float[Array, "*shape"]:
    bits = jnp.where((key >> 31) == 1, key & jnp.uint32(0x7FFFFFFF), ~key)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def smallest_reaching(
    values: Float[Array, " vocab"],
    weights: Float[Array, " vocab"],
    target: Float[Array, ""],
    *,
    inclusive: bool,
) -> Float[Array, ""]:
    """The smallest `v` among `values` whose cumulative weight `sum(weights[values <= v])` is
    `> target` (or `>= target` when `inclusive`); `+inf` if none is.

    This is the cut of a cumulative sum over `values` sorted ascending, found without sorting:
    a bisection over the 2**32 float32 values (32 passes over `values`, exact, since the
    cumulative weight only changes at the given values). For 49,152 logits it takes about a
    tenth of the time of `jnp.sort`.
    """

    def reaches(v):
        mass = jnp.sum(jnp.where(values <= v, weights, 0.0))
        return mass >= target if inclusive else mass > target

    # The answer lies in (low, high]: `low` is below every value and never evaluated (it may
    # be a NaN bit pattern), so `mid` is rounded up.
    low = _ordered_key(jnp.min(values)) - 1
    high = _ordered_key(jnp.max(values))

    def bisect(_, bounds):
        low, high = bounds
        mid = high - (high - low) // 2
        ok = reaches(_from_ordered_key(mid))
        return jnp.where(ok, low, mid), jnp.where(ok, mid, high)

    _, high = jax.lax.fori_loop(0, 32, bisect, (low, high))
    return jnp.where(reaches(jnp.max(values)), _from_ordered_key(high), jnp.inf)
