"""The compiled program of a call: prefill, the initial `GenerationState`, the `while_loop`.

Everything here runs under `jax.jit` (`start_generation`, `run_generation`,
`finish_generation`) on the padded inputs that `functional_gen.generation.planning` prepared:

    prefill (ONE model call over every token the cache lacks; teacher-forced by `scan` under
    `prefill_mode="forced"`) -> fork rows (`num_return_sequences`, beams) -> processor states
    (`init`, or the carried ones grown) -> `GenerationState` -> step in `jax.lax.while_loop`
    until every row is done -> the `SequenceArrays` after the call.
"""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from ..processors.base import Context, extend_state, init_states, vmap_rows
from .planning import Plan
from .sequence_state import SequenceArrays
from .state import RUNNING, GenerationState
from .step import Step

_INIT_KEY_SALT = 0x7FFFFFFF  # processors' init gets fold_in(row_key, salt); steps use 0, 1, ...


def _grow(x, size, axis, value):
    extra = size - x.shape[axis]
    if extra <= 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, extra)
    return jnp.pad(x, pad, constant_values=value)


def _run_prefill(model, plan, arrays, new_ids, new_pos, pending, rows_batch):
    """Feed the pending tokens. Returns `(next-token logits, cache, prompt_logprobs)`, the last
    `Float[Array, "batch width"]`: the logprob of every fed token given the tokens before it
    (0 for padding and for a fresh prompt's first token), when `plan.prompt_logprobs`."""
    keep = 0 if plan.prompt_logprobs else 1
    all_logits = None
    if plan.fresh and plan.prefill_mode != "forced":
        prefix = arrays.length if plan.prefix_lm else None
        logits, cache = model.prefill(
            new_ids, new_pos, max_len=plan.cache_len, logits_to_keep=keep, prefix_length=prefix
        )
        last, all_logits = logits[:, -1, :], logits
    else:
        if plan.fresh:
            cache = model.init_cache(rows_batch, plan.cache_len)
        else:
            cache = arrays.cache.extend(plan.cache_len)
        if new_ids.shape[1] == 0:
            return arrays.logits, cache, jnp.zeros(new_ids.shape, jnp.float32)
        if plan.prefill_mode != "forced":
            logits, cache = model(new_ids, new_pos, cache, logits_to_keep=keep)
            last, all_logits = logits[:, -1, :], logits
        else:
            # Teacher forcing: the tokens one column at a time through the decode path.
            def feed(cache, column):
                ids, pos = column
                logits, cache = model(ids[:, None], pos[:, None], cache, logits_to_keep=1)
                return cache, logits[:, 0, :]

            cache, stacked = jax.lax.scan(feed, cache, (new_ids.T, new_pos.T))
            last, all_logits = stacked[-1], stacked.transpose(1, 0, 2)
        if not plan.fresh:
            last = jnp.where((pending > 0)[:, None], last, arrays.logits)
    prompt_lp = jnp.zeros(new_ids.shape[:1] + (0,), jnp.float32)
    if plan.prompt_logprobs:
        # token c is scored by the logits after token c - 1 (after the cached text for c = first)
        width = new_ids.shape[1]
        first = width - pending  # the column of each row's first fed token
        cols = jnp.arange(width)[None, :]
        before = jnp.concatenate([arrays.logits[:, None, :], all_logits[:, :-1, :]], axis=1)
        before = jnp.where((cols == first[:, None])[:, :, None], arrays.logits[:, None, :], before)
        lp = jax.nn.log_softmax(before, axis=-1)
        prompt_lp = jnp.take_along_axis(lp, new_ids[:, :, None], axis=-1)[:, :, 0]
        scored = (cols > first[:, None]) | ((cols == first[:, None]) & (arrays.cached > 0)[:, None])
        prompt_lp = jnp.where(scored, prompt_lp, 0.0)
    return last, cache, prompt_lp


def start(
    step: Step, plan: Plan, arrays: SequenceArrays, new_ids, new_pos, budget, padding_rows, keys
):
    """Prefill and initialise: `(prompt_logprobs, state)`, the `GenerationState` before this
    call's first step (see `_run_prefill` for the prompt logprobs)."""
    model = step.model
    pending = arrays.length - arrays.cached
    logits, cache, prompt_lp = _run_prefill(
        model, plan, arrays, new_ids, new_pos, pending, new_ids.shape[0]
    )
    if plan.repeat > 1:
        # num_return_sequences: fork every prefilled row (one gather over every leaf).
        idx = jnp.repeat(jnp.arange(arrays.length.shape[0]), plan.repeat)
        arrays, logits, cache, prompt_lp = jax.tree.map(
            lambda x: x[idx], (arrays, logits, cache, prompt_lp)
        )
        padding_rows = padding_rows[idx]
    arrays = eqx.tree_at(lambda a: a.key, arrays, keys)
    batch = arrays.length.shape[0]
    token_ids = _grow(arrays.token_ids, plan.token_len, 1, step.pad_token_id)
    length = arrays.length
    prompt_length = arrays.prompt_length if plan.carry else length
    budget = jnp.where(padding_rows, 0, budget)
    if plan.carry and arrays.processor_states is not None:
        # the same processors go on; states sized by the text's capacity grow with it
        processor_states = tuple(
            jax.vmap(lambda st, p=p: extend_state(p, st, plan.token_len))(st)
            for p, st in zip(step.processors, arrays.processor_states)
        )
    else:
        init_keys = jax.vmap(lambda k: jax.random.fold_in(k, _INIT_KEY_SALT))(arrays.key)
        contexts = Context(
            token_ids=token_ids,
            length=length,
            prompt_length=prompt_length,
            max_new_tokens=length - prompt_length + budget,
            key=init_keys,
        )
        processor_states = vmap_rows(init_states, step.processors, batch)(contexts)
    if plan.carry and arrays.stop_state is not None:
        stop_state = arrays.stop_state
    else:
        stop_state = jnp.zeros((batch, plan.num_stops), jnp.int32)
    return prompt_lp, GenerationState(
        token_ids=token_ids,
        length=length,
        prompt_length=prompt_length,
        start_length=length,
        max_new_tokens=budget,
        done=padding_rows,
        finish_reason=jnp.full((batch,), RUNNING, jnp.int32),
        logits=logits,
        logprobs=jnp.zeros((batch, plan.steps), jnp.float32),
        top_token_ids=jnp.zeros((batch, plan.steps, step.top_logprobs), jnp.int32),
        top_logprobs=jnp.zeros((batch, plan.steps, step.top_logprobs), jnp.float32),
        cache=cache,
        processor_states=processor_states,
        stop_state=stop_state,
        key=arrays.key,
        key_step=arrays.key_step,
        search_state=step.search.init(batch, plan.steps),
    )


def finish(state: GenerationState, token_logprobs) -> SequenceArrays:
    """The `SequenceArrays` after a call: every token cached, logprobs placed at their columns."""
    batch, width = state.token_ids.shape
    token_logprobs = _grow(token_logprobs, width, 1, 0.0)
    n = state.logprobs.shape[1]
    j = jnp.arange(n)[None, :]
    cols = jnp.where(j < state.num_generated[:, None], state.start_length[:, None] + j, width)
    token_logprobs = token_logprobs.at[jnp.arange(batch)[:, None], cols].set(
        state.logprobs, mode="drop"
    )
    return SequenceArrays(
        token_ids=state.token_ids,
        token_logprobs=token_logprobs,
        length=state.length,
        cached=state.length,
        prompt_length=state.prompt_length,
        logits=state.logits,
        key=state.key,
        key_step=state.key_step + state.num_generated,
        cache=state.cache,
        processor_states=state.processor_states,
        stop_state=state.stop_state,
    )


start_generation = eqx.filter_jit(start)
"""Jitted prefill and initialisation (`stream` runs its steps from here): `(prompt_logprobs,
GenerationState)` from the padded inputs that `plan_call` prepared."""


def _generate_jit(step, plan, arrays, new_ids, new_pos, budget, padding_rows, keys):
    # (the name that `jax.log_compiles` shows for the whole program; tests look for it)
    prompt_lp, state = start(step, plan, arrays, new_ids, new_pos, budget, padding_rows, keys)
    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), lambda s: step(s), state)
    return state, finish(state, repeat_rows(arrays.token_logprobs, plan.repeat)), prompt_lp


run_generation = eqx.filter_jit(_generate_jit)
"""Jitted: the whole call, prefill and the `lax.while_loop` of steps until every row is done:
`(final GenerationState, its SequenceArrays, prompt_logprobs)` from `Prepared`'s inputs. Compiled
with no per-program XLA options (the CPU plan's); see `generation_program`."""

_PROGRAMS: dict[tuple[tuple[str, str], ...], Callable] = {(): run_generation}


def generation_program(compiler_options: tuple[tuple[str, str], ...]) -> Callable:
    """`run_generation` compiled with the per-program XLA options `compiler_options`
    (`AbstractCausalLM.compiler_options`, from the model's `ExecutionPlan`): one jitted function
    per distinct set of options, made once; `()` is `run_generation` itself.

    The GPU plan's `xla_gpu_enable_command_buffer` (with `WHILE` and `CONDITIONAL`) is set per
    program this way, not through `XLA_FLAGS`, so that it reaches only the `generate` program
    and needs nothing from the user (DESIGN.md "Accelerators": the command buffers took the
    SmolLM2-135M step on an H200 from 2.94 to 2.14 ms).
    """
    program = _PROGRAMS.get(compiler_options)
    if program is None:
        program = eqx.filter_jit(_generate_jit, compiler_options=dict(compiler_options))
        _PROGRAMS[compiler_options] = program
    return program


def _step(step, state):
    return step(state)


_STEP_PROGRAMS: dict[tuple[tuple[str, str], ...], Callable] = {}


def step_program(compiler_options: tuple[tuple[str, str], ...]) -> Callable:
    """ONE step of the loop, `(step, state) -> state`, jitted with the state donated (its
    `KVCache` updated in place) and compiled with the per-program XLA options
    `compiler_options` (`AbstractCausalLM.compiler_options`): what `fg.stream` calls once per
    token. One jitted function per distinct set of options, made once, as `generation_program`
    (under the GPU plan a step's conditionals, e.g. a processor's `lax.cond`, then run inside a
    CUDA graph too).
    """
    program = _STEP_PROGRAMS.get(compiler_options)
    if program is None:
        options = {"compiler_options": dict(compiler_options)} if compiler_options else {}
        program = eqx.filter_jit(_step, donate="all-except-first", **options)
        _STEP_PROGRAMS[compiler_options] = program
    return program


def _inputs(prepared) -> tuple:
    return (
        prepared.step,
        prepared.plan,
        prepared.arrays,
        prepared.new_ids,
        prepared.new_pos,
        prepared.budget,
        prepared.padding_rows,
        prepared.keys,
    )


def run_prepared(prepared) -> tuple[GenerationState, SequenceArrays, jax.Array]:
    """`run_generation` on the inputs of a `Prepared` (the third value of `plan_call`, or
    `prepare`'s), compiled with the model's per-program XLA options (`generation_program`):
    `(final GenerationState, its SequenceArrays, prompt_logprobs)`."""
    program = generation_program(prepared.step.model.compiler_options)
    return program(*_inputs(prepared))


def start_prepared(prepared) -> tuple[jax.Array, GenerationState]:
    """`start_generation` on the inputs of a `Prepared`: `(prompt_logprobs, GenerationState
    before the first step)`, for a caller that runs the steps itself."""
    return start_generation(*_inputs(prepared))


def repeat_rows(x, n: int):
    """`x` with each row (leading axis) repeated `n` times in place (`num_return_sequences`)."""
    return x if n == 1 else jnp.repeat(x, n, axis=0)


finish_generation = eqx.filter_jit(finish)
"""Jitted: the `SequenceArrays` of a finished `GenerationState` (see `finish`)."""
