"""`argmax` over a long last axis, in two passes that XLA's CPU backend runs fast.

`jnp.argmax` lowers to a variadic `reduce` (value and index carried together), which XLA's CPU
backend emits as a scalar loop: over Gemma 3's 262,144-token vocabulary it took 9.2 ms at batch 8
(1.2 ms a row), as long as a sixth of a whole float32 decode step, while a plain `max` over the
same array took 0.21 ms (`benchmarks/bench_argmax.py`, 2026-11-26, best of 20, this 2-core
machine under load). Here the axis is cut into blocks: the maximum of each block (a plain
reduction, and whether it holds a NaN), the first block holding the overall maximum
(`jnp.argmax` over a few hundred values), then the first position of the maximum inside that
one block (`jnp.argmax` over one block): 0.3-0.5 ms for the same array (inside `generate`,
Gemma 3 float32 greedy decode 1.08x at batch 1 and 1.19x at batch 8; SmolLM2 batch 8 1.5x),
and the same index as `jnp.argmax` in every case, ties
(the first one wins), `-inf` rows (index 0) and NaN (the first NaN, which `jnp.argmax` treats as
the largest value) included.

`categorical` draws one index from `softmax(logits)` by inverse transform sampling over the same
blocks (block sums, then one block's running sum): two uniform numbers per row where
`jax.random.categorical`'s Gumbel-max draw needs one per vocabulary entry (the threefry noise of
8 x 262,144 logits took ~40 ms on this machine, as long as a Gemma 3 270M decode step).

`chosen_logprobs` gives `log_softmax(logits)` at the chosen tokens only (a reduction and a
gather, not a `[batch, vocab]` array written out and read back).

A small neutral module (it imports only JAX): samplers, speculative decoding and processors may
all use it.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray, Shaped

BLOCK = 1024
"""Block length of the two-pass `argmax`; axes shorter than `2 * BLOCK` use `jnp.argmax`."""


def argmax(x: Shaped[Array, "..."], axis: int = -1) -> Int[Array, "..."]:
    """The index of the largest value along `axis` (the first one on ties), exactly as
    `jnp.argmax(x, axis=axis)`, computed blockwise when the axis is long and `x` is floating
    point (see the module docstring for why and how much faster).

    **Arguments:** `x`: any shape; `axis`: the axis to reduce (negative counts from the end).

    **Returns:** integer indices (`jnp.argmax`'s dtype), the shape of `x` without `axis`.

    **Raises:** `ValueError` when `axis` is out of range or has length 0 (as `jnp.argmax`).

    Source: `jnp.argmax` semantics (NumPy's: first occurrence; JAX: NaN counts as the largest).
    """
    x = jnp.asarray(x)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"argmax: axis {axis} is out of range for an array of rank {x.ndim}")
    n = x.shape[axis]
    if n < 2 * BLOCK or not jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.argmax(x, axis=axis)
    x = jnp.moveaxis(x, axis, -1)
    blocks = -(-n // BLOCK)
    if blocks * BLOCK != n:  # pad the tail with -inf: never before a real maximum on ties
        pad = [(0, 0)] * (x.ndim - 1) + [(0, blocks * BLOCK - n)]
        x = jnp.pad(x, pad, constant_values=-jnp.inf)
    x = x.reshape(x.shape[:-1] + (blocks, BLOCK))
    # XLA's CPU `max` may drop NaN (fast min/max), while `jnp.argmax` ranks NaN above all: a
    # block holding a NaN gets NaN as its key, so that the first such block wins.
    keys = jnp.where(jnp.any(jnp.isnan(x), axis=-1), jnp.nan, jnp.max(x, axis=-1))
    block = jnp.argmax(keys, axis=-1)  # the first block holding the maximum
    inside = jnp.take_along_axis(x, block[..., None, None], axis=-2)[..., 0, :]
    return block * BLOCK + jnp.argmax(inside, axis=-1)


def chosen_logprobs(
    logits: Float[Array, "*batch vocab"],
    token_ids: Int[Array, " *batch"],
    best: Float[Array, " *batch"] | None = None,
) -> Float[Array, " *batch"]:
    """`jax.nn.log_softmax(logits)` at `token_ids` (one index per row), computed as
    `log_softmax` computes it (the logit less the row maximum, less the log of the sum of the
    shifted exponentials: the same float32 operations, so the same values up to the order in
    which a compiled program sums, ~1e-7 relative) without writing out
    the whole `[..., vocab]` array of log-probabilities: a reduction and a gather.

    Over Gemma 3's `[8, 262144]` logits this saved ~0.5-0.9 ms a decode step against
    `take_along_axis(log_softmax(logits), ...)` (2026-11-26, this 2-core machine, medians of 31
    interleaved calls, with the sampler's draw in the same jitted function).

    **Arguments:** `logits`: `[..., vocab]`; `token_ids`: integer `[...]`, each in
    `[0, vocab)`; `best` (optional): `jnp.max(logits, axis=-1)` when already at hand.

    **Returns:** `[...]`, natural log; NaN for a row whose logits are all `-inf` (as
    `log_softmax`).

    Source: `jax.nn.log_softmax`'s formula (`shifted - log(sum(exp(shifted)))`).
    """
    best = jnp.max(logits, axis=-1) if best is None else best
    shifted_logsumexp = jnp.log(jnp.sum(jnp.exp(logits - best[..., None]), axis=-1))
    chosen = jnp.take_along_axis(logits, token_ids[..., None], axis=-1)[..., 0]
    return (chosen - best) - shifted_logsumexp


def _first_above(running: Float[Array, " n"], threshold: Float[Array, ""]) -> Int[Array, ""]:
    """The first index whose nondecreasing running sum is strictly greater than `threshold`,
    clamped to the last index where the sum grows (its term is nonzero): never an index whose
    own term is zero, also when float rounding leaves `threshold` at or above the total."""
    n = running.shape[0]
    first = jnp.sum(running <= threshold)  # the running sum is nondecreasing: a count suffices
    grows = running > jnp.concatenate([jnp.zeros((1,), running.dtype), running[:-1]])
    last = jnp.max(jnp.where(grows, jnp.arange(n), -1))
    return jnp.maximum(jnp.minimum(first, last), 0)


def categorical(key: PRNGKeyArray, logits: Float[Array, " vocab"]) -> Int[Array, ""]:
    """One index drawn with probability `softmax(logits)`: exact inverse transform sampling with
    two uniform numbers, done hierarchically over blocks of `BLOCK` entries for float32 accuracy.

    With `p = exp(logits - max(logits))` (unnormalized), a block is drawn with probability
    proportional to its sum (the first block whose running block sum exceeds `u1 * total`), then
    an entry of that block with probability proportional to its `p` (the first whose running sum
    inside the block exceeds `u2 * block_sum`). Both comparisons are strict and the rounding edge
    (a threshold at or above the total) falls back to the last nonzero term, so an entry with
    `p == 0` (a `-inf` logit, e.g. masked by `TopP`, `TopK` or a constraint) is never drawn.
    The probability resolution is float32's uniform step (2^-23) of the block's share and of the
    entry's share in its block, not of the whole vocabulary.

    Pure and jittable; vmap it over rows (a row's draw depends only on its key and its logits).
    The draw is not `jax.random.categorical`'s for the same key (that one is the Gumbel-max draw,
    one random number per entry); the distribution is the same.

    **Arguments:** `key`: a JAX PRNG key; `logits`: `[vocab]` floating point (computed in
    float32), any finite values and `-inf`.

    **Returns:** an int32 scalar in `[0, vocab)`; `0` when every logit is `-inf` (as
    `jax.random.categorical` and `argmax` give). A `+inf` logit is drawn (the first, if several);
    NaN logits give an unspecified index.

    **Raises:** `ValueError` when `logits` is not one-dimensional, empty, or not floating point.

    Source: inverse transform sampling (Devroye, *Non-Uniform Random Variate Generation*, 1986,
    ch. II.2), as transformers draws with `torch.multinomial(softmax(logits), 1)` and llama.cpp
    with a cumulative sum over its candidates (`std::discrete_distribution`).
    """
    x, probs = _blocks("categorical", logits)
    running = jnp.cumsum(jnp.sum(probs(x), axis=-1))
    u = jax.random.uniform(key, (2,), jnp.float32)
    b = _first_above(running, u[0] * running[-1])
    inside = jnp.cumsum(probs(jax.lax.dynamic_index_in_dim(x, b, keepdims=False)))
    i = _first_above(inside, u[1] * inside[-1])
    return (b * x.shape[1] + i).astype(jnp.int32)


def categorical_without_replacement(
    key: PRNGKeyArray, logits: Float[Array, " vocab"], k: int
) -> Int[Array, " k"]:
    """`k` distinct indices drawn one after another with probability `softmax(logits)` among
    those not drawn yet (successive sampling without replacement), each draw `categorical`'s
    two-level inverse transform with two uniform numbers: `2 k` random numbers in all.

    This is the distribution, in draw order, of the Gumbel-top-k trick (the `k` largest of
    `logits + gumbel_noise`, one random number per entry) and of transformers' beam sampling
    (`torch.multinomial(probs, num_samples=k)`, without replacement). After a draw its entry
    is zeroed and only its block's sum recomputed, so the block sums stay exact sums.

    **Arguments:** `key`: a JAX PRNG key; `logits`: `[vocab]` floating point (computed in
    float32), finite values and `-inf`; `k`: static, `1 <= k <= vocab`.

    **Returns:** int32 `[k]`, in draw order; `-1` for each draw after the nonzero entries ran
    out (fewer than `k` finite logits), so a caller can tell those apart.

    **Raises:** `ValueError` for `logits` that are not one nonempty floating point row, or `k`
    outside `[1, vocab]`.

    Source: successive sampling (Vieira, "Gumbel-max trick and weighted reservoir sampling",
    2014; Kool et al., "Stochastic Beams and Where to Find Them", ICML 2019) by inverse
    transform sampling as `categorical`.
    """
    x, probs = _blocks("categorical_without_replacement", logits)
    if not 1 <= k <= logits.shape[0]:
        raise ValueError(
            f"categorical_without_replacement: k={k} must be in [1, vocab={logits.shape[0]}]"
        )
    block = x.shape[1]
    sums = jnp.sum(probs(x), axis=-1)
    u = jax.random.uniform(key, (k, 2), jnp.float32)
    offsets = jnp.arange(block, dtype=jnp.int32)

    def draw(j, carry):
        sums, drawn = carry
        running = jnp.cumsum(sums)
        b = _first_above(running, u[j, 0] * running[-1])
        flat = b * block + offsets
        row = probs(jax.lax.dynamic_index_in_dim(x, b, keepdims=False))
        row = jnp.where(jnp.any(flat[:, None] == drawn[None, :], axis=-1), 0.0, row)
        inside = jnp.cumsum(row)
        i = _first_above(inside, u[j, 1] * inside[-1])
        drawn = drawn.at[j].set(jnp.where(inside[-1] > 0, b * block + i, -1))
        sums = sums.at[b].set(jnp.sum(row.at[i].set(0.0)))
        return sums, drawn

    drawn = jnp.full((k,), -1, jnp.int32)
    return jax.lax.fori_loop(0, k, draw, (sums, drawn))[1]


def _blocks(name: str, logits):
    """Checks one row of logits; returns it in float32 as `[blocks, block]` (padded with
    `-inf`) and the function `v -> exp(v - max)` on its entries (the maximum's entries exactly 1,
    also for a `+inf` maximum; all 0 for an all `-inf` row)."""
    logits = jnp.asarray(logits)
    if logits.ndim != 1 or logits.shape[0] == 0:
        raise ValueError(
            f"{name}: logits must be one row [vocab] with vocab > 0, got shape {logits.shape}"
            " (vmap over the batch)"
        )
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"{name}: logits must be floating point, got dtype {logits.dtype}")
    n = logits.shape[0]
    block = min(BLOCK, n)
    blocks = -(-n // block)
    x = logits.astype(jnp.float32)
    if blocks * block != n:  # pad with -inf: probability 0
        x = jnp.pad(x, (0, blocks * block - n), constant_values=-jnp.inf)
    x = x.reshape(blocks, block)
    top = jnp.max(x)
    shift = jnp.where(jnp.isneginf(top), jnp.inf, top)

    def probs(v):
        return jnp.where(v == top, jnp.where(jnp.isneginf(top), 0.0, 1.0), jnp.exp(v - shift))

    return x, probs
