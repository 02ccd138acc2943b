"""`Sample`: the search of greedy and multinomial decoding (every row advances on its own).

Each step: the processors run on every row's logits (vmapped), the row's sampler picks one token
with the row's own key, the token is appended, the done flags are updated (EOS, stop strings,
`max_new_tokens`, a constraint's dead end), and the model runs on the new tokens (decode).
"""

import dataclasses

import jax
import jax.numpy as jnp

from ..reductions import chosen_logprobs
from .samplers import AbstractSampler
from .search import AbstractSearch, process_rows
from .state import CONSTRAINT, EOS, LENGTH, STOP_STRING, GenerationState


class Sample(AbstractSearch):
    """Advance every row by one token that `sampler` picks from its processed logits.

    **Arguments:** `sampler`: an `AbstractSampler` (`Greedy()`, `Multinomial()`), called per row
    with that row's key for this step.

    Source: transformers' `GenerationMixin._sample` (greedy search and multinomial sampling).
    """

    sampler: AbstractSampler

    @property
    def needs_key(self) -> bool:
        """Whether the sampler is random."""
        return self.sampler.needs_key

    @property
    def num_beams(self) -> int:
        """0: rows advance on their own."""
        return 0

    def init(self, rows: int, steps: int) -> None:
        """No carry of its own."""
        del rows, steps
        return None

    def __call__(self, step, state: GenerationState) -> GenerationState:
        """Advance every unfinished row by one token; finished rows are left unchanged.

        A row finishes on an EOS token (`"eos"`, the EOS kept as its last token), when its
        generated text contains a stop string (`"stop_string"`), on reaching
        `max_new_tokens` (`"length"`), or when the processors leave no token possible, every
        logit `-inf` (`"constraint"`; no token is appended, so nothing is sampled from an empty
        distribution and no NaN appears).

        **Arguments:** `step`, the `Step`; `state`, a `GenerationState`.

        **Returns:** the next `GenerationState`, with the same tree structure, shapes and dtypes.
        """
        batch = state.batch_size
        rows = jnp.arange(batch)
        n_generated = state.num_generated
        processor_states, logits, sample_keys = process_rows(step, state, state.logits)
        tokens = jax.vmap(lambda lg, k: self.sampler(lg, key=k))(logits, sample_keys)
        scored = logits if step.logprobs_mode == "processed" else state.logits
        # only the chosen tokens' logprobs, unless the alternatives are wanted as well
        chosen = chosen_logprobs(scored, tokens)

        # A row whose processors left no token possible (every logit -inf, e.g. a constraint
        # that cannot continue) ends here, with finish reason "constraint" and no token.
        dead_end = ~state.done & jnp.all(logits == -jnp.inf, axis=-1)
        active = ~state.done & ~dead_end
        tokens = jnp.where(active, tokens, step.pad_token_id).astype(jnp.int32)
        write_col = jnp.where(active, state.length, state.token_ids.shape[1])  # done: dropped
        token_ids = state.token_ids.at[rows, write_col].set(tokens, mode="drop")
        logprob_col = jnp.where(active, n_generated, state.logprobs.shape[1])
        logprobs = state.logprobs.at[rows, logprob_col].set(chosen, mode="drop")
        top_ids, top_values = state.top_token_ids, state.top_logprobs
        if step.top_logprobs:
            values, ids = jax.lax.top_k(jax.nn.log_softmax(scored, axis=-1), step.top_logprobs)
            top_ids = top_ids.at[rows, logprob_col].set(ids.astype(jnp.int32), mode="drop")
            top_values = top_values.at[rows, logprob_col].set(values, mode="drop")
        length = state.length + active.astype(jnp.int32)

        is_eos = active & jnp.isin(tokens, jnp.asarray(step.eos_token_id, jnp.int32))
        stop_state, hit_stop = state.stop_state, jnp.zeros_like(active)
        if step.stop_strings is not None:
            advanced, matched = step.stop_strings.advance(state.stop_state, tokens)
            stop_state = jnp.where(active[:, None], advanced, state.stop_state)
            hit_stop = active & matched
        out_of_budget = active & (length - state.start_length >= state.max_new_tokens)
        finish_reason = jnp.select(
            [is_eos, hit_stop, out_of_budget, dead_end],
            [EOS, STOP_STRING, LENGTH, CONSTRAINT],
            state.finish_reason,
        ).astype(jnp.int32)
        done = state.done | is_eos | hit_stop | out_of_budget | dead_end

        # Decode: feed the new tokens. Rows that had already finished feed padding (position -1,
        # never attended to) because all rows of the cache advance in lockstep.
        positions = jnp.where(active, length - 1, -1)
        next_logits, cache = step.model(tokens[:, None], positions[:, None], state.cache)
        # A row that did not take a token keeps the logits after its last token (a finished
        # row's are then still right when a `SequenceState` continues it).
        next_logits = jnp.where(active[:, None], next_logits[:, -1, :], state.logits)

        return dataclasses.replace(
            state,
            token_ids=token_ids,
            length=length,
            done=done,
            finish_reason=finish_reason,
            logits=next_logits,
            logprobs=logprobs,
            top_token_ids=top_ids,
            top_logprobs=top_values,
            cache=cache,
            processor_states=processor_states,
            stop_state=stop_state,
        )
