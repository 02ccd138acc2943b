"""`make_step`: one pure generation step, `GenerationState -> GenerationState`.

A step processes the pending logits (processors vmapped per row), samples one token per row,
appends it, updates the finished flags (EOS, `max_new_tokens`), and runs the model on the new
tokens (decode) to get the next logits. It does no host work, so `generate` runs it inside one
jitted `jax.lax.while_loop`, and `stream` calls it from Python one token at a time.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from ..models.base import AbstractCausalLM
from ..processors.base import (
    AbstractLogitsProcessor,
    Context,
    as_processors,
    process_all,
    vmap_rows,
)
from .beam_search import BeamSearch, beam_step
from .samplers import AbstractSampler, Greedy
from .state import CONSTRAINT, EOS, LENGTH, STOP_STRING, GenerationState
from .stop_strings import StopStrings


class Step(eqx.Module):
    """A generation step as a pytree (build it with `make_step`).

    Being a module, its arrays (model weights, float knobs of processors) are ordinary jit
    arguments, not constants baked into the compiled program: `eqx.filter_jit(step)(state)`
    compiles once and reuses the program for new weights or new temperatures.

    **Attributes:** `model` (an `AbstractCausalLM`), `processors` (a tuple), `sampler`,
    `stop_strings` (a `StopStrings` or `None`), `eos_token_id` (static tuple: every token id that
    ends a row), `pad_token_id` (static: written after a row ends), `top_logprobs` (static:
    how many most likely alternatives to record per token, 0 for none), `logprobs_mode` (static:
    `"processed"`, the distribution after the processors that the token was drawn from, or
    `"raw"`, the model's own, as vLLM's `logprobs_mode`).
    """

    model: AbstractCausalLM
    processors: tuple[AbstractLogitsProcessor, ...]
    sampler: AbstractSampler
    stop_strings: StopStrings | None
    eos_token_id: tuple[int, ...] = eqx.field(static=True)
    pad_token_id: int = eqx.field(static=True)
    top_logprobs: int = eqx.field(static=True, default=0)
    logprobs_mode: str = eqx.field(static=True, default="processed")

    def __call__(self, state: GenerationState) -> GenerationState:
        """Advance every unfinished row by one token; finished rows are left unchanged.

        A row finishes on an EOS token (`"eos"`, the EOS kept as its last token), when its
        generated text contains a stop string (`"stop_string"`), on reaching
        `max_new_tokens` (`"length"`), or when the processors leave no token possible, every
        logit `-inf` (`"constraint"`; no token is appended, so nothing is sampled from an empty
        distribution and no NaN appears).

        **Arguments:** `state`, a `GenerationState` (from `init_state` or a previous step).

        **Returns:** the next `GenerationState`, with the same tree structure, shapes and dtypes.
        """
        if isinstance(self.sampler, BeamSearch):
            return beam_step(self, state)
        batch = state.batch_size
        rows = jnp.arange(batch)
        n_generated = state.num_generated
        processor_states, logits, sample_keys = process_rows(self, state, state.logits)
        tokens = jax.vmap(lambda lg, k: self.sampler(lg, key=k))(logits, sample_keys)
        scored = logits if self.logprobs_mode == "processed" else state.logits
        all_logprobs = jax.nn.log_softmax(scored, axis=-1)
        chosen_logprobs = jnp.take_along_axis(all_logprobs, tokens[:, None], axis=1)[:, 0]

        # A row whose processors left no token possible (every logit -inf, e.g. a constraint
        # that cannot continue) ends here, with finish reason "constraint" and no token.
        dead_end = ~state.done & jnp.all(logits == -jnp.inf, axis=-1)
        active = ~state.done & ~dead_end
        tokens = jnp.where(active, tokens, self.pad_token_id).astype(jnp.int32)
        write_col = jnp.where(active, state.length, state.token_ids.shape[1])  # done: dropped
        token_ids = state.token_ids.at[rows, write_col].set(tokens, mode="drop")
        logprob_col = jnp.where(active, n_generated, state.logprobs.shape[1])
        logprobs = state.logprobs.at[rows, logprob_col].set(chosen_logprobs, mode="drop")
        top_ids, top_values = state.top_token_ids, state.top_logprobs
        if self.top_logprobs:
            values, ids = jax.lax.top_k(all_logprobs, self.top_logprobs)
            top_ids = top_ids.at[rows, logprob_col].set(ids.astype(jnp.int32), mode="drop")
            top_values = top_values.at[rows, logprob_col].set(values, mode="drop")
        length = state.length + active.astype(jnp.int32)

        is_eos = active & jnp.isin(tokens, jnp.asarray(self.eos_token_id, jnp.int32))
        stop_state, hit_stop = state.stop_state, jnp.zeros_like(active)
        if self.stop_strings is not None:
            advanced, matched = self.stop_strings.advance(state.stop_state, tokens)
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
        next_logits, cache = self.model(tokens[:, None], positions[:, None], state.cache)
        # A row that did not take a token keeps the logits after its last token (a finished
        # row's are then still right when a `SequenceState` continues it).
        next_logits = jnp.where(active[:, None], next_logits[:, -1, :], state.logits)

        return GenerationState(
            token_ids=token_ids,
            length=length,
            prompt_length=state.prompt_length,
            start_length=state.start_length,
            max_new_tokens=state.max_new_tokens,
            done=done,
            finish_reason=finish_reason,
            logits=next_logits,
            logprobs=logprobs,
            top_token_ids=top_ids,
            top_logprobs=top_values,
            cache=cache,
            processor_states=processor_states,
            stop_state=stop_state,
            key=state.key,
            key_step=state.key_step,
            beam=state.beam,
        )


def process_rows(step: Step, state: GenerationState, logits):
    """Run the step's processors on every row's `logits` (`Float[Array, "batch vocab"]`).

    Each row gets its own per-step key, `fold_in(row key, key_step + generated)`, split into a
    processor key and a sampling key, so rows never depend on their batch mates. Finished rows
    keep their processor states as they were when they finished.

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


def make_step(
    model: AbstractCausalLM,
    processors: Sequence[Any] | None = (),
    sampler: AbstractSampler | None = None,
    *,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    stop_strings: StopStrings | None = None,
    top_logprobs: int = 0,
    logprobs_mode: str = "processed",
) -> Step:
    """Build the pure step function `step(state) -> state` of a generation.

    **Arguments:**

    - `model`: an `AbstractCausalLM` (e.g. `functional_gen.models.LlamaForCausalLM`).
    - `processors`: logits processors (or plain functions, wrapped in `Stateless`), applied in
      order to each row's logits.
    - `sampler`: picks the token from the processed logits; default `Greedy()`.
    - `eos_token_id`: token id(s) that end a row; default: all of `model.eos_token_id`.
    - `pad_token_id`: id written after a row ends; default: the model's pad id, else its first
      EOS id, else 0.
    - `stop_strings`: a `StopStrings` matcher (`StopStrings.build(strings, tokenizer, vocab)`),
      or `None`.
    - `top_logprobs`: record the `k` most likely tokens and their logprobs at every step.
    - `logprobs_mode`: `"processed"` (default) or `"raw"` (see `Step`).

    **Returns:** a `Step` module; call it as `step(state)`.

    **Raises:** `TypeError` for a model that is not an `AbstractCausalLM`, a processor entry
    that is neither a processor nor callable, or a sampler that is not an `AbstractSampler`;
    `ValueError` for a negative `top_logprobs` or an unknown `logprobs_mode`.
    """
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 0:
        raise ValueError(f"`top_logprobs` must be a non-negative integer, got {top_logprobs!r}")
    if top_logprobs > model.vocab_size:
        raise ValueError(
            f"`top_logprobs`={top_logprobs} exceeds the vocabulary size {model.vocab_size}"
        )
    if logprobs_mode not in ("processed", "raw"):
        raise ValueError(f"`logprobs_mode` must be 'processed' or 'raw', got {logprobs_mode!r}")
    if not isinstance(model, AbstractCausalLM):
        raise TypeError(
            "`model` must implement functional_gen.models.AbstractCausalLM (e.g. a model from "
            f"functional_gen.load_model), got {type(model).__name__}"
        )
    if sampler is None:
        sampler = Greedy()
    if not isinstance(sampler, AbstractSampler):
        raise TypeError(
            f"`sampler` must be a functional_gen.samplers sampler (e.g. Greedy(), Multinomial()), "
            f"got {type(sampler).__name__}"
        )
    if eos_token_id is None:
        eos_token_id = model.eos_token_id
    elif isinstance(eos_token_id, int):
        eos_token_id = (eos_token_id,)
    eos_token_id = tuple(int(i) for i in eos_token_id)
    if pad_token_id is None:
        pad_token_id = model.pad_token_id
        if pad_token_id is None:
            pad_token_id = eos_token_id[0] if eos_token_id else 0
    return Step(
        model=model,
        processors=as_processors(processors),
        sampler=sampler,
        stop_strings=stop_strings,
        eos_token_id=eos_token_id,
        pad_token_id=int(pad_token_id),
        top_logprobs=top_logprobs,
        logprobs_mode=logprobs_mode,
    )
