"""The acceptance rule of speculative decoding, for ONE row (vmap it over the batch).

A proposer guesses `k` tokens `d_1 .. d_k`, drawn from its distributions `q_1 .. q_k` (a
deterministic proposer's `q_j` is one-hot at `d_j`). One call of the target model gives its
distributions `p_1 .. p_{k+1}` after every prefix (`p_1` after the text, `p_{j+1}` after `d_j`).

**Greedy** (`exact_match`): accept the longest prefix of guesses equal to the target's argmax;
the next token is the target's argmax after it. The tokens are exactly greedy decoding's.

**Sampling** (`rejection_sample`; Leviathan, Kalman & Matias 2023, Algorithm 1; Chen et al.
2023): accept `d_j` with probability `min(1, p_j(d_j) / q_j(d_j))`, stop at the first rejection.
After `n` accepted guesses the next token is drawn from `p_{n+1}` when all `k` were accepted (the
"bonus" token), else from the residual `max(p_{n+1} - q_{n+1}, 0)` renormalised. Why it is
lossless: a token `x` comes out at a position either as an accepted guess, with probability
`q(x) min(1, p(x)/q(x)) = min(q(x), p(x))`, or from the residual after a rejection, whose total
probability is `1 - sum_y min(q(y), p(y)) = sum_y max(p(y) - q(y), 0)`; the two add up to
`min(q(x), p(x)) + max(p(x) - q(x), 0) = p(x)`.

Shapes: `seq = k + 1` target positions, `k` guesses.

Source: transformers' `_speculative_sampling` (`generation/utils.py`) and vLLM's
`rejection_sampler.py`.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ..reductions import categorical


def exact_match(
    drafts: Int[Array, " k"], target_tokens: Int[Array, " seq"], num_guesses=None
) -> Int[Array, ""]:
    """How many leading guesses equal the target's own choices (greedy verification).

    **Arguments:** `drafts`: the guesses `d_1 .. d_k`; `target_tokens`: the target's choice
    after each prefix (`argmax p_1 .. argmax p_{k+1}`).

    `num_guesses` (default `k`): only the first `num_guesses` guesses count (a proposer may
    guess fewer than `k`).

    **Returns:** `n` in `[0, num_guesses]`; the emitted tokens are `target_tokens[: n + 1]`.
    """
    agree = (drafts == target_tokens[:-1]) & _guessed(drafts, num_guesses)
    return jnp.sum(jnp.cumprod(agree.astype(jnp.int32))).astype(jnp.int32)


def accepted_count(
    p: Float[Array, "seq vocab"],
    q: Float[Array, "k vocab"] | None,
    drafts: Int[Array, " k"],
    uniforms: Float[Array, " k"],
    num_guesses=None,
) -> Int[Array, ""]:
    """Leading guesses accepted by the rule `u_j <= p_j(d_j) / q_j(d_j)`.

    **Arguments:** `p`: the target's probabilities after each prefix; `q`: the proposer's
    probabilities of each guess's position, `None` for one-hot (a deterministic proposer:
    `q_j(d_j) = 1`); `drafts`: the guesses; `uniforms`: one `U[0, 1)` draw per guess;
    `num_guesses` (default `k`): only the first `num_guesses` guesses count.

    **Returns:** `n` in `[0, num_guesses]`.
    """
    k = drafts.shape[0]
    p_d = p[jnp.arange(k), drafts]
    q_d = jnp.ones_like(p_d) if q is None else q[jnp.arange(k), drafts]
    accept = uniforms * q_d <= p_d  # u <= p/q without dividing by a zero q
    accept = accept & (p_d > 0) & _guessed(drafts, num_guesses)  # forbidden: never accepted
    return jnp.sum(jnp.cumprod(accept.astype(jnp.int32))).astype(jnp.int32)


def residual(
    p: Float[Array, " vocab"], q: Float[Array, " vocab"] | None, draft: Int[Array, ""]
) -> Float[Array, " vocab"]:
    """The distribution to draw from after a rejection: `max(p - q, 0)` renormalised (`q`
    one-hot at `draft` when `None`). Falls back to `p` when the residual has no mass (only
    possible by rounding, `p == q`)."""
    if q is None:
        q = jax.nn.one_hot(draft, p.shape[-1], dtype=p.dtype)
    r = jnp.maximum(p - q, 0.0)
    total = jnp.sum(r)
    return jnp.where(total > 0, r / jnp.where(total > 0, total, 1.0), p)


def rejection_sample(
    p: Float[Array, "seq vocab"],
    q: Float[Array, "k vocab"] | None,
    drafts: Int[Array, " k"],
    num_guesses=None,
    *,
    key: jax.Array,
) -> tuple[Int[Array, ""], Int[Array, ""]]:
    """Speculative sampling for one row: `(n accepted guesses, the next token)`.

    **Arguments:** `p`: the target's probabilities after each of the `k + 1` prefixes (its
    processed distribution); `q`: the proposer's probabilities for the `k` guessed positions
    (`None`: one-hot at the guesses); `drafts`: the guesses; `num_guesses` (default `k`): the
    guesses that count (the position after the last one has no guess: drawn from `p`); `key`: a
    PRNG key.

    **Returns:** `n` in `[0, num_guesses]` and the token after the `n` accepted guesses, drawn
    from the residual at position `n` (or from `p_{n+1}` when all guesses were accepted) by
    `reductions.categorical` (inverse transform sampling, two uniform numbers; an entry of
    probability 0 is never drawn; token 0 when the distribution has no mass at all).
    """
    k = drafts.shape[0]
    accept_key, draw_key = jax.random.split(key)
    if k == 0:
        return jnp.zeros((), jnp.int32), categorical(draw_key, _log(p[0]))
    limit = k if num_guesses is None else num_guesses
    n = accepted_count(p, q, drafts, jax.random.uniform(accept_key, (k,)), num_guesses)
    p_n = p[n]
    draft_n = drafts[jnp.minimum(n, k - 1)]
    q_n = None if q is None else q[jnp.minimum(n, k - 1)]
    dist = jnp.where(n < limit, residual(p_n, q_n, draft_n), p_n)
    return n, categorical(draw_key, _log(dist))


def _log(dist):
    return jnp.where(dist > 0, jnp.log(jnp.where(dist > 0, dist, 1.0)), -jnp.inf)


def _guessed(drafts, num_guesses):
    if num_guesses is None:
        return jnp.ones(drafts.shape, bool)
    return jnp.arange(drafts.shape[0]) < num_guesses
