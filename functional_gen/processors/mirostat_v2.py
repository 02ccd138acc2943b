"""`MirostatV2`: adaptive truncation that steers the surprise of sampled tokens to a target."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

from ..reductions import argmax
from ._validation import float_param, int_param
from .base import AbstractLogitsProcessor, Context, per_row_field


class MirostatV2State(eqx.Module):
    """The state of `MirostatV2` for one row.

    **Attributes:**

    - `mu`: `Float[Array, ""]`, the current surprise bound in bits (starts at `2 * mirostat_tau`).
    - `logprobs`: `Float[Array, " vocab"]`, the logprobs of the truncated distribution this
      processor returned at the previous step (to measure the sampled token's surprise).
    - `has_previous`: `Bool[Array, ""]`, whether `logprobs` holds a previous step yet.
    """

    mu: Float[Array, ""]
    logprobs: Float[Array, " vocab"]
    has_previous: Bool[Array, ""]


class MirostatV2(AbstractLogitsProcessor):
    """Mirostat 2.0: keep only the tokens whose surprise `-log2 p` is at most `mu` (at least the
    most likely one), and adapt `mu` after every sampled token so that the average surprise
    approaches `mirostat_tau`: `mu -= mirostat_eta * (surprise - mirostat_tau)`, where
    `surprise` is the sampled token's `-log2` probability under the truncated, renormalised
    distribution.

    **Lagged update.** A processor runs before the sampler, so it cannot see the token drawn from
    its output. The state keeps the truncated logprobs this processor returned; at the start of
    the next `process`, the token sampled in between is `context.last_token_id`, and `mu` is
    updated from its logprob then. This is exactly llama.cpp's update, one call later (the first
    `process` after `init` makes no update). Put `MirostatV2` last (before the sampler), as in
    llama.cpp where it is the sampler: the update measures surprise under its own output. A
    sampled token outside that output (e.g. forced by a later processor) leaves `mu` unchanged.

    Source: Basu et al. 2021, "Mirostat: A Neural Text Decoding Algorithm that Directly Controls
    Perplexity"; llama.cpp `llama_sampler_init_mirostat_v2` (same truncation and update, `mu`
    starting at `2 * tau`).

    **Attributes:**

    - `mirostat_tau`: target surprise in bits, `>= 0` (or one per row); llama.cpp default 5.0.
    - `mirostat_eta`: learning rate, `>= 0` (or one per row); llama.cpp default 0.1.
    - `vocab_size`: the number of logits (static; sizes the state), e.g.
      `model.config.vocab_size`.

    **Raises:** `ValueError` for a negative or non-finite `mirostat_tau` / `mirostat_eta`, or a
    non-positive `vocab_size`; a `vocab_size` different from the logits raises when the processor
    first runs.
    """

    mirostat_tau: Float[Array, "*rows"] = per_row_field()
    mirostat_eta: Float[Array, "*rows"] = per_row_field()
    vocab_size: int = eqx.field(static=True)

    def __init__(self, mirostat_tau=5.0, mirostat_eta=0.1, *, vocab_size: int):
        self.mirostat_tau = float_param("mirostat_tau", mirostat_tau, low=0.0)
        self.mirostat_eta = float_param("mirostat_eta", mirostat_eta, low=0.0)
        self.vocab_size = int_param("vocab_size", vocab_size, low=1)

    def init(self, context: Context) -> MirostatV2State:
        return MirostatV2State(
            mu=jnp.asarray(2.0 * self.mirostat_tau, jnp.float32),
            logprobs=jnp.zeros((self.vocab_size,), jnp.float32),
            has_previous=jnp.asarray(False),
        )

    def process(
        self, state: MirostatV2State, logits: Float[Array, " vocab"], context: Context
    ) -> tuple[MirostatV2State, Float[Array, " vocab"]]:
        if logits.shape[-1] != self.vocab_size:
            raise ValueError(
                f"MirostatV2 was built with vocab_size={self.vocab_size} but got "
                f"{logits.shape[-1]} logits"
            )
        # Lagged update from the token sampled after the previous step.
        surprise = -state.logprobs[context.last_token_id] / math.log(2)
        update = state.has_previous & jnp.isfinite(surprise)
        mu = jnp.where(
            update, state.mu - self.mirostat_eta * (surprise - self.mirostat_tau), state.mu
        )

        # Truncate: keep tokens with surprise <= mu, at least the most likely one.
        surprises = -jax.nn.log_softmax(logits) / math.log(2)
        keep = surprises <= mu
        keep = keep.at[argmax(logits)].set(True)  # jnp.argmax's index, blockwise (fast on CPU)
        logits = jnp.where(keep, logits, -jnp.inf)
        new_state = MirostatV2State(
            mu=mu.astype(jnp.float32),
            logprobs=jax.nn.log_softmax(logits).astype(jnp.float32),
            has_previous=jnp.asarray(True),
        )
        return new_state, logits
