"""Searches: how one generation step advances the rows (the extension point beside samplers).

A sampler (`functional_gen.samplers`) picks ONE row's next token from its processed logits. A
search decides how the whole batch moves forward in one step of the compiled loop: `Sample`
advances every row on its own by one token its sampler picks (greedy or multinomial decoding);
`BeamSearch` (`functional_gen.generation.beam_search`) advances the `num_beams` rows of a prompt
together and reorders them. `Step.__call__` calls its search; nothing dispatches on the
search's type.

Equinox's abstract/final pattern: `AbstractSearch` declares abstract methods only, and every
concrete search is final.

**A third search, speculative decoding**, fits the same interface: its `__call__(step, state)`
proposes `k` tokens per row (a draft model, a prompt lookup, the model's own first layers), runs
`step.model` ONCE over the `k + 1` positions (`model(token_ids[:, k + 1], positions[:, k + 1],
cache)`), runs the processors position by position with `process_rows` on a copy of each row's
states (so every accepted position has its own processor state, and the state after the last
accepted token is the one kept), accepts per row the longest prefix the target distribution
agrees with, and advances each row by its own count: `GenerationState.length`, the written
columns and the done flags are already per row, and `max_new_tokens` is checked against
`length - start_length`, so rows that accept different numbers of tokens need no other change.
Its own carry (a draft model's `KVCache`, acceptance counts) is what its `init` returns; it lives
in `GenerationState.search_state` and is reordered with the rows like every other leaf.
"""

import abc
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key, PyTree

from ..processors.base import Context, process_all, vmap_rows
from .state import GenerationState


class AbstractSearch(eqx.Module):
    """Base class of searches: `search(step, state) -> state`, one step for the whole batch.

    Subclasses implement every member below (none is concrete here):

    - `needs_key` (a field or a property): whether the search draws random numbers (then
      `generate` requires a `key`).
    - `num_beams` (a field or a property): rows per prompt that advance together (the loop forks
      each prompt's prefilled row this many times); 0 when every row advances on its own.
    - `sampler` (a field or a property): what picks the tokens, i.e. what `make_step(sampler=...)`
      was given: the `AbstractSampler` a search applies per row (`Sample`, speculative decoding),
      or the search itself when it picks tokens for whole groups of rows (`BeamSearch`).
    """

    needs_key: eqx.AbstractVar[bool]
    num_beams: eqx.AbstractVar[int]
    sampler: eqx.AbstractVar[Any]

    @abc.abstractmethod
    def init(self, rows: int, steps: int) -> PyTree:
        """The search's own carry before the first step (`GenerationState.search_state`), for
        `rows` loop rows and `steps` logprob columns; `None` when it needs none."""

    @abc.abstractmethod
    def __call__(self, step: Any, state: GenerationState) -> GenerationState:
        """Advance every unfinished row of `state` (a `GenerationState`) by one step of `step`
        (the `Step`: model, processors, stop strings, EOS and pad ids); finished rows stay as
        they are. Returns a state with the same tree structure, shapes and dtypes."""


def process_rows(
    step: Any, state: GenerationState, logits: Float[Array, "batch vocab"]
) -> tuple[tuple[PyTree, ...], Float[Array, "batch vocab"], Key[Array, " batch"]]:
    """Run the step's processors on every row's `logits` (`Float[Array, "batch vocab"]`).

    Each row gets its own per-step key, `fold_in(row key, key_step + generated)`, split into a
    processor key and a sampling key, so rows never depend on their batch mates. Finished rows
    keep their processor states as they were when they finished.

    **Arguments:** `step`: the `Step` (its `processors` are used); `state`: the
    `GenerationState`; `logits`: what the processors start from (the model's logits, or their
    `log_softmax` under beam search).

    **Returns:** `(processor_states, processed logits, sampling keys)`.
    """
    batch = state.batch_size
    step_keys = jax.vmap(jax.random.fold_in)(state.key, state.key_step + state.num_generated)
    process_keys, sample_keys = jax.vmap(lambda k: tuple(jax.random.split(k)))(step_keys)
    contexts = Context(
        token_ids=state.token_ids,
        length=state.length,
        prompt_length=state.prompt_length,
        max_new_tokens=state.start_length - state.prompt_length + state.max_new_tokens,
        key=process_keys,
    )
    processor_states, logits = vmap_rows(process_all, step.processors, batch)(
        state.processor_states, logits, contexts
    )
    processor_states = jax.tree.map(
        lambda new, old: jnp.where(state.done.reshape((batch,) + (1,) * (new.ndim - 1)), old, new),
        processor_states,
        state.processor_states,
    )
    return processor_states, logits, sample_keys
