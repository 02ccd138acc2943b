"""Samplers: turn one row's processed logits into the next token id.

A sampler is an immutable `equinox.Module` called per row (vmapped over the batch by the
generation loop, through the `Sample` search) with that row's key for this step.

`BeamSearch` is a search, not a sampler (it advances a prompt's beams together, see
`functional_gen.generation.search`); it is re-exported here because `generate(...,
sampler=fg.samplers.BeamSearch(...))` is where users pass it.
"""

import abc

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ..reductions import argmax, categorical


class AbstractSampler(eqx.Module):
    """Base class of samplers: `sampler(logits, key=key) -> token id` for ONE sequence.

    Subclasses implement `__call__` and `needs_key` (a field or a property: whether the
    sampler is random, then `generate` requires a `key`).
    """

    needs_key: eqx.AbstractVar[bool]

    @abc.abstractmethod
    def __call__(self, logits: Float[Array, " vocab"], *, key: PRNGKeyArray) -> Int[Array, ""]:
        """The next token id, an int32 scalar, drawn from the processed `logits` of one row."""


class Greedy(AbstractSampler):
    """Greedy decoding: the token with the largest logit (the first one on ties, like `torch.argmax`).

    The index is `functional_gen.reductions.argmax`'s: the same as `jnp.argmax`, about 40x
    faster over a 262,144-token vocabulary on XLA's CPU backend.

    Source: transformers' `generate(do_sample=False)`.
    """

    def __call__(self, logits: Float[Array, " vocab"], *, key: PRNGKeyArray) -> Int[Array, ""]:
        return argmax(logits).astype(jnp.int32)

    @property
    def needs_key(self) -> bool:
        """`False`: greedy decoding is deterministic."""
        return False


class Multinomial(AbstractSampler):
    """Ancestral sampling: draw a token with probability `softmax(logits)`.

    Tokens whose logit is `-inf` are never drawn. The draw is `functional_gen.reductions.
    categorical`'s: exact inverse transform sampling with two uniform numbers per row (block
    sums over the vocabulary, then the running sum inside the chosen block), with the row's own
    key, so a row's draw does not depend on its batch mates. It replaced the Gumbel-max draw of
    `jax.random.categorical` (one random number per vocabulary entry): 4-10x faster per draw over
    8 x 262,144 and 8 x 49,152 logits on XLA's CPU backend (`benchmarks/bench_sampler.py`).
    Seeded samples differ from `jax.random.categorical`'s; the distribution is the same.

    Source: transformers' `generate(do_sample=True)` (`torch.multinomial(softmax(logits), 1)`,
    inverse transform sampling, one uniform per row).
    """

    def __call__(self, logits: Float[Array, " vocab"], *, key: PRNGKeyArray) -> Int[Array, ""]:
        return categorical(key, logits)

    @property
    def needs_key(self) -> bool:
        """`True`: every draw uses the row's key."""
        return True


from .beam_search import BeamSearch as BeamSearch  # noqa: E402  (a search, passed as `sampler`)
