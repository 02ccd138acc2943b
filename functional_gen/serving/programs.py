"""The serving engine's pure programs over its decode state, each jitted once (and donating the
state where it is replaced): `_prefill` / `_prefill_chunk` (a request's prompt), `_insert` (a
`Prefix` into a slot of the lockstep cache: right-aligned so it ends at the shared write index),
`_place` / `_free` (a slot's constraint tables in the pool), `_layout` and `_compact` (the
cache's shared write index and dead leading slots; the shift that reclaims them), `_generate`
(several decode steps in one `lax.while_loop`) and `_narrow` / `_widen` (the busy slots' rows
gathered into a narrower state for a dispatch, and written back). `functional_gen.serving.engine.Engine` calls
them; see its module docstring for the design.
"""

import dataclasses
import functools
import math
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, Key

from ..generation.state import GenerationState
from ..generation.step import make_step
from ..models.kv_cache import KVCache
from ..structured.automaton import INITIAL
from .mesh import program
from .pool import (
    ConstraintPool,
    PoolEntry,
    SlotConstraint,
)
from .slots import (
    Request as Request,
    SlotDecoding as SlotDecoding,
    SlotParams as SlotParams,
    SlotSampler,
    knobs_used,
)


class Prefix(eqx.Module):
    """One prefilled request, ready to `insert` into a slot.

    **Attributes:** `token_ids: Int[Array, " max_len"]` (the prompt from column 0, padding
    after), `length: Int[Array, ""]` (prompt tokens), `prompt_length: Int[Array, ""]`
    (`length`, or for a request resumed after a preemption its prompt's tokens without those it
    had generated: the slot's `prompt_length` and `start_length`), `max_new_tokens: Int[Array,
    ""]`, `logits: Float[Array, " vocab"]` (after the prompt's last token), `cache` (a `KVCache`
    of one row whose `kv_seq` slots hold the left-padded prompt), `key` (the row's PRNG key),
    `params` (a `SlotParams` of one row, no leading axis), `constraint_state: Int[Array, ""]`
    (the slot's automaton state: `INITIAL`, or a resumed request's).
    """

    token_ids: Int[Array, " max_len"]
    length: Int[Array, ""]
    prompt_length: Int[Array, ""]
    max_new_tokens: Int[Array, ""]
    logits: Float[Array, " vocab"]
    cache: KVCache
    key: Key[Array, ""]
    params: SlotParams
    constraint_state: Int[Array, ""]


class DecodeState(eqx.Module):
    """What `generate` carries: `generation` (a `GenerationState` over the slots; an idle slot is
    `done`), `params` (each slot's `SlotParams`) and `pool` (each slot's constraint tables, a
    `ConstraintPool`)."""

    generation: GenerationState
    params: SlotParams
    pool: ConstraintPool


def _fields(module) -> dict:
    return {f.name: getattr(module, f.name) for f in dataclasses.fields(module)}


def _step(model, eos_token_id, pad_token_id, state: DecodeState, top_logprobs, search=None):
    """The engine's step: the slots' constraint and decoding processors, and `search` (default:
    `SlotSampler`, one token per slot; the speculative engine passes its `Speculative`)."""
    if search is None:
        search = SlotSampler(sampled=jnp.any(~state.params.greedy & ~state.generation.done))
    return make_step(
        model,
        [
            SlotConstraint(
                **_fields(state.pool),
                any_constrained=jnp.any(state.pool.constrained & ~state.generation.done),
            ),
            SlotDecoding(
                **_fields(state.params), used=knobs_used(state.params, ~state.generation.done)
            ),
        ],
        search,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        top_logprobs=top_logprobs,
        logprobs_mode="raw",
    )


def _generate(
    model,
    state: DecodeState,
    num_steps: int,
    limit,
    eos_token_id,
    pad_token_id,
    until_finish: Bool[Array, ""] | None = None,
):
    """Up to `min(num_steps, limit)` decode steps in one `while_loop`, left when every slot is
    done, and, when `until_finish` is true, after the first step in which a slot that was busy
    at the start finishes (so that a waiting request gets the freed slot at once instead of the
    slot idling for the rest of the dispatch; `None`: never)."""
    k = state.generation.top_token_ids.shape[-1]
    was_done = state.generation.done
    step = _step(model, eos_token_id, pad_token_id, state, k)
    slots = state.generation.batch_size
    rows = jnp.arange(slots)

    def body(carry):
        i, gen, out = carry
        new = step(gen)
        took = new.length > gen.length
        last = jnp.maximum(new.length - 1, 0)
        col = jnp.minimum(jnp.maximum(new.num_generated - 1, 0), new.logprobs.shape[1] - 1)
        now = (
            jnp.where(took, new.token_ids[rows, last], -1),
            jnp.where(took, new.logprobs[rows, col], 0.0),
            new.top_token_ids[rows, col],
            new.top_logprobs[rows, col],
        )
        out = jax.tree.map(lambda a, b: a.at[i].set(b), out, now)
        return i + 1, new, out

    def cond(carry):
        i, gen, _ = carry
        go = (i < jnp.minimum(num_steps, limit)) & ~jnp.all(gen.done)
        if until_finish is not None:
            go = go & ~(until_finish & jnp.any(gen.done & ~was_done))
        return go

    gen = state.generation
    out = (
        jnp.full((num_steps, slots), -1, jnp.int32),
        jnp.zeros((num_steps, slots), jnp.float32),
        jnp.zeros((num_steps, slots, k), jnp.int32),
        jnp.zeros((num_steps, slots, k), jnp.float32),
    )
    _, gen, out = jax.lax.while_loop(cond, body, (jnp.asarray(0), gen, out))
    out = StepOutput(*out, done=gen.done, finish_reason=gen.finish_reason)
    return DecodeState(gen, state.params, state.pool), out


class StepOutput(eqx.Module):
    """What one `generate` dispatch hands to the host (`steps` = the dispatch's `num_steps`).

    **Attributes:** `token_ids: Int[Array, "steps batch"]` (the token each slot took at each
    step, -1 where none), `logprobs: Float[Array, "steps batch"]` (the model's raw logprob of
    each), `top_token_ids`, `top_logprobs: [steps, batch, k]` (the `k` most likely tokens,
    `Engine(top_logprobs=k)`), `done`, `finish_reason: [batch]` after the dispatch (codes of
    `FINISH_REASONS`); `verified`, `accepted: Int[Array, " batch"]`: speculative guesses each
    slot verified and accepted in the dispatch (`None` without speculation; with it, `steps` is
    the dispatch's `num_steps` times the most tokens a step emits, `serving.speculative`).
    """

    token_ids: Int[Array, "steps batch"]
    logprobs: Float[Array, "steps batch"]
    top_token_ids: Int[Array, "steps batch k"]
    top_logprobs: Float[Array, "steps batch k"]
    done: Bool[Array, " batch"]
    finish_reason: Int[Array, " batch"]
    verified: Int[Array, " batch"] | None = None
    accepted: Int[Array, " batch"] | None = None


def _insert(prefix: Prefix, state: DecodeState, slot: Int[Array, ""]) -> DecodeState:
    gen = state.generation
    cache = gen.cache
    rows = prefix.cache
    width = rows.max_len  # static: the prompt's bucket
    write = jnp.maximum(cache.length[0], width)  # the shared write index, moved up if needed
    start = write - width  # the prompt's slots: [start, write), right-aligned
    # rings (sliding-window layers) are addressed by position: regrown to the slots' ring size
    # if shorter, and copied whole
    grown = rows.extend(cache.max_len) if cache.ring_layers else rows

    def put(i, buffer, row, ring_row):  # buffer [slots, kv_heads, slots, head_dim], row [1, ...]
        if i in cache.ring_layers:
            return jax.lax.dynamic_update_slice(
                buffer, ring_row.astype(buffer.dtype), (slot, 0, 0, 0)
            )
        return jax.lax.dynamic_update_slice(buffer, row.astype(buffer.dtype), (slot, 0, start, 0))

    positions = jnp.full((cache.max_len,), -1, jnp.int32)
    positions = jax.lax.dynamic_update_slice(positions, rows.positions[0], (start,))
    cache = dataclasses.replace(
        cache,
        k=tuple(put(i, *t) for i, t in enumerate(zip(cache.k, rows.k, grown.k))),
        v=tuple(put(i, *t) for i, t in enumerate(zip(cache.v, rows.v, grown.v))),
        positions=cache.positions.at[slot].set(positions),
        length=jnp.full_like(cache.length, write),
        ring_positions=None
        if grown.ring_positions is None
        else cache.ring_positions.at[slot].set(grown.ring_positions[0]),
    )
    return _with_prefix(prefix, state, slot, cache)


def make_prefix(
    request: Request, logits, cache: KVCache, max_len: int, pad_token_id: int
) -> Prefix:
    """The `Prefix` of `request` after its prefill (`logits: Float[Array, " vocab"]` after the
    prompt, `cache` its one-row `KVCache`): its prompt in a row of `max_len` columns padded with
    `pad_token_id`, its sampling parameters, and the key `fold_in(jax.random.key(seed), 0)`
    (a seed drawn from `os.urandom` when the request has none). A resumed request
    (`request.resume`, after a preemption) keeps its slot's key, its prompt length (its
    generated tokens count as generated) and its automaton state, so it continues where it
    stopped."""
    row = np.full((max_len,), pad_token_id, np.int32)
    row[: len(request.token_ids)] = request.token_ids
    bias = np.zeros((logits.shape[-1],), np.float32)
    for token, value in request.logit_bias:
        bias[token] += value
    resume = request.resume
    if resume is not None:
        data = np.asarray(resume.key_data, np.uint32)
        key = jax.random.wrap_key_data(data, impl=resume.key_impl)
        constraint_state = resume.constraint_state
    else:
        seed = request.seed
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        key = jax.random.fold_in(jax.random.key(seed), 0)
        constraint_state = INITIAL
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    params = SlotParams(
        greedy=jnp.asarray(request.temperature == 0),
        temperature=f32(request.temperature),
        top_p=f32(request.top_p),
        min_p=f32(request.min_p),
        repetition_penalty=f32(request.repetition_penalty),
        presence_penalty=f32(request.presence_penalty),
        frequency_penalty=f32(request.frequency_penalty),
        logit_bias=jnp.asarray(bias),
        top_k=jnp.asarray(request.top_k, jnp.int32),
    )
    return Prefix(
        token_ids=jnp.asarray(row),
        length=jnp.asarray(len(request.token_ids), jnp.int32),
        prompt_length=jnp.asarray(request.prompt_length, jnp.int32),
        max_new_tokens=jnp.asarray(request.max_new_tokens, jnp.int32),
        logits=logits,
        cache=cache,
        key=key,
        params=params,
        constraint_state=jnp.asarray(constraint_state, jnp.int32),
    )


def _with_prefix(prefix: Prefix, state: DecodeState, slot: Int[Array, ""], cache) -> DecodeState:
    """`state` with `slot` taking `prefix`'s tokens, logits, key, parameters and automaton
    state (busy, not constrained: `Engine.place` constrains it), and `cache` as its
    generation's cache (the lockstep `KVCache` with the prompt
    written by `_insert`, or the paged engine's placeholder, `serving.paged`)."""
    gen = state.generation
    gen = GenerationState(
        token_ids=gen.token_ids.at[slot].set(prefix.token_ids),
        length=gen.length.at[slot].set(prefix.length),
        prompt_length=gen.prompt_length.at[slot].set(prefix.prompt_length),
        start_length=gen.start_length.at[slot].set(prefix.prompt_length),
        max_new_tokens=gen.max_new_tokens.at[slot].set(prefix.max_new_tokens),
        done=gen.done.at[slot].set(False),
        finish_reason=gen.finish_reason.at[slot].set(0),
        logits=gen.logits.at[slot].set(prefix.logits),
        logprobs=gen.logprobs,
        top_token_ids=gen.top_token_ids,
        top_logprobs=gen.top_logprobs,
        cache=cache,
        processor_states=(
            gen.processor_states[0].at[slot].set(prefix.constraint_state),
            *gen.processor_states[1:],
        ),
        stop_state=gen.stop_state,
        key=gen.key.at[slot].set(prefix.key),
        key_step=gen.key_step.at[slot].set(0),
        search_state=gen.search_state,
    )
    params = jax.tree.map(lambda a, b: a.at[slot].set(b), state.params, prefix.params)
    pool = eqx.tree_at(
        lambda p: p.constrained, state.pool, state.pool.constrained.at[slot].set(False)
    )
    return DecodeState(gen, params, pool)


def _narrow(state: DecodeState, rows: Int[Array, " width"]) -> DecodeState:
    """The decode state of the slots `rows` only, in that order (every field of the state has
    the slot axis first): what `Engine.generate` runs when `width` slots hold every busy one."""
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), state)


WIDEN_UNROLL = 8
"""`_widen` writes up to this many rows back as unrolled in-place row writes; a wider state's
rows in a `fori_loop` (one write per array in its body), so that the program's size and compile
time do not grow with the width: unrolled, the 128-row write-back of a 256-slot engine (a tiny
model, `default_decode_widths(256)`) was still compiling after 9 minutes on the loaded 2-core
CPU (XLA's in-place analysis over thousands of writes to the same buffers)."""


def _widen(
    state: DecodeState, narrow: DecodeState, out: StepOutput, rows: Int[Array, " width"]
) -> tuple[DecodeState, StepOutput]:
    """`narrow` (`_narrow(state, rows)` after a dispatch) written back into the slots `rows` of
    `state`, and the dispatch's `out` spread over every slot (`-1` / 0 for the others).

    The shared write index moves for every slot, as a step moves it: a slot outside `rows` is
    idle, its cache slots from the old index on hold position -1 (an idle slot's step writes
    nothing else there), so its row reads as if it had taken the steps."""

    def put(j, full, part):  # one row written in place (a scatter copies)
        return jax.lax.dynamic_update_index_in_dim(full, part[j], rows[j], 0)

    if rows.shape[0] <= WIDEN_UNROLL:
        for j in range(rows.shape[0]):
            state = jax.tree.map(functools.partial(put, j), state, narrow)
    else:
        state = jax.lax.fori_loop(
            0,
            rows.shape[0],
            lambda j, full: jax.tree.map(functools.partial(put, j), full, narrow),
            state,
        )
    cache = state.generation.cache
    cache = dataclasses.replace(
        cache, length=jnp.full_like(cache.length, narrow.generation.cache.length[0])
    )
    state = eqx.tree_at(lambda s: s.generation.cache, state, cache)
    slots = state.generation.batch_size

    def spread(x, fill):  # [steps, width, ...] -> [steps, slots, ...]
        full = jnp.full((x.shape[0], slots, *x.shape[2:]), fill, x.dtype)
        return full.at[:, rows].set(x)

    out = StepOutput(
        token_ids=spread(out.token_ids, -1),
        logprobs=spread(out.logprobs, 0),
        top_token_ids=spread(out.top_token_ids, 0),
        top_logprobs=spread(out.top_logprobs, 0),
        done=state.generation.done,
        finish_reason=state.generation.finish_reason,
    )
    return state, out


def _layout(state: DecodeState) -> Int[Array, "2"]:
    """`[write_index, dead]`: the shared write index, and the number of leading cache slots that
    no busy slot uses (the first slot of the busy slot that starts earliest; all of them when
    every slot is idle)."""
    cache = state.generation.cache
    write = cache.length[0]
    live = cache.positions >= 0
    first = jnp.where(jnp.any(live, axis=-1), jnp.argmax(live, axis=-1), write)
    dead = jnp.min(jnp.where(state.generation.done, write, jnp.minimum(first, write)))
    return jnp.stack([write, dead])


COMPACT_BLOCK = 64
"""`_compact` moves the live cache slots in blocks of this many (or of the largest divisor of
the cache's `max_len` below it), only as many blocks as hold live slots."""


def _compact(state: DecodeState) -> DecodeState:
    """Every row of the cache's full layers shifted left by `_layout`'s dead slots, the write
    index with them (ring layers are addressed by position and stay).

    Only the live slots move, in place: a `fori_loop` over blocks of `COMPACT_BLOCK` slots copies
    block `j` from `dead + j * block` to `j * block` for the `ceil((write - dead) / block)`
    blocks that hold live slots (reads past the cache's end are clamped to its last slot:
    padding, masked by the positions), so a compaction costs what the live slots weigh, not
    three passes over the whole cache (the concatenation and slice it replaced). SmolLM2, 8 x 512
    slots, on the loaded 2-core CPU (min of 5, one process): 120 live slots 12.8 ms (was 345),
    256 live 68 ms (was 349), 448 live 116 ms (was 307). Block `j` reads only slots after those
    that blocks `< j` wrote, so the order is safe."""
    write, dead = _layout(state)
    cache = state.generation.cache
    slots = cache.max_len
    block = math.gcd(slots, COMPACT_BLOCK)  # divides `slots`: every block's write fits
    blocks = (write - dead + block - 1) // block
    full = tuple(i for i in range(len(cache.k)) if i not in cache.ring_layers)

    def move(j, buffers):
        index = jnp.minimum(dead + j * block + jnp.arange(block), slots - 1)
        return tuple(
            jax.lax.dynamic_update_slice_in_dim(x, jnp.take(x, index, axis=2), j * block, axis=2)
            for x in buffers
        )

    moved = jax.lax.fori_loop(
        0, blocks, move, tuple(cache.k[i] for i in full) + tuple(cache.v[i] for i in full)
    )
    k, v = list(cache.k), list(cache.v)
    for n, i in enumerate(full):
        k[i], v[i] = moved[n], moved[len(full) + n]
    both = jnp.concatenate([cache.positions, cache.positions], axis=1)
    shifted = jax.lax.dynamic_slice_in_dim(both, dead, slots, axis=1)
    positions = jnp.where(jnp.arange(slots) < write - dead, shifted, -1)
    cache = dataclasses.replace(
        cache, k=tuple(k), v=tuple(v), positions=positions, length=cache.length - dead
    )
    return eqx.tree_at(lambda s: s.generation.cache, state, cache)


def _place(entry: PoolEntry, state: DecodeState, slot: Int[Array, ""]) -> DecodeState:
    pool = state.pool
    pool = ConstraintPool(
        token_class=pool.token_class.at[slot].set(entry.token_class),
        transitions=pool.transitions.at[slot].set(entry.transitions),
        distance=pool.distance.at[slot].set(entry.distance),
        constrained=pool.constrained.at[slot].set(True),
    )
    return DecodeState(state.generation, state.params, pool)


def _free(state: DecodeState, slot: Int[Array, ""]) -> DecodeState:
    gen = state.generation
    return eqx.tree_at(lambda s: s.generation.done, state, gen.done.at[slot].set(True))


def _prefill(model, token_ids, positions):
    logits, cache = model.prefill(token_ids, positions, max_len=token_ids.shape[1])
    return logits[0, -1], cache


def _prefill_chunk(model, cache, token_ids, positions):
    logits, cache = model(token_ids, positions, cache, logits_to_keep=1)
    return logits[0, -1], cache


def chunked_prefill(model, cache: KVCache, token_ids, positions, chunk: int):
    """Run `token_ids` / `positions` (numpy, `[1, width]`, left-padded) through `model` over
    `cache` in calls of `chunk` tokens (one call when `width <= chunk`; else `width` is a
    multiple of `chunk`): a generator yielding `None` between calls and returning `(logits,
    cache)`, the logits after the last token (`yield from` it)."""
    width = token_ids.shape[1]
    for start in range(0, width, chunk):
        logits, cache = prefill_chunk_jit(
            model,
            cache,
            jnp.asarray(token_ids[:, start : start + chunk]),
            jnp.asarray(positions[:, start : start + chunk]),
        )
        if start + chunk < width:
            yield None
    return logits, cache


def engine_program(fn, donate: str = "none"):
    """`fn` jitted as an engine program: `mesh.program` with the `DecodeState` layout on its
    outputs when its inputs are on a mesh (`donate`: `eqx.filter_jit`'s)."""
    return program(fn, donate=donate, state_type=DecodeState)


generate_jit = engine_program(_generate, "all-except-first")
insert_jit = engine_program(_insert, "all-except-first")
place_jit = engine_program(_place, "all-except-first")
free_jit = engine_program(_free, "all")
layout_jit = engine_program(_layout)
narrow_jit = engine_program(_narrow)
widen_jit = engine_program(_widen, "all")
compact_jit = engine_program(_compact, "all")
prefill_jit = engine_program(_prefill)
prefill_chunk_jit = engine_program(_prefill_chunk, "all-except-first")
