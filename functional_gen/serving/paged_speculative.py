"""Speculative decoding over the paged KV cache (`Engine(block_size=..., speculative=...)`).

The paged engine's dispatch (`serving.paged`: gather each slot's blocks into a contiguous
`KVCache`, decode, scatter the new keys and values back) with the speculative engine's steps
(`serving.speculative`: each step is `generation.speculative.Speculative` over the slots, every
slot accepting its own run of guesses), after vLLM, whose speculative decoding runs over its
paged cache.

**Room.** A verification step writes up to `write_width` columns at the gathered cache's write
index, and rolls the rejected ones back by position (`speculative.cache.keep_below`: their
columns get position `-1`; the write index moves back to just after the last live column), so
the gathered cache gets `num_steps * write_width` empty columns beyond the slots' gathered
blocks (the first `nb` of each table, `nb` the smallest of `PagedKV.gather_buckets` holding
every busy slot's `length + num_steps * write_width` positions, as without speculation): the
dispatch never runs out of room (the search is built without its compaction branch, as in the
lockstep engine).

**Write index.** `paged.gather` sets the write index at `start = max over busy slots of
(length - pending)`: the first column after every live one (no slot's written position lies at
or beyond it), so every column a step writes, kept or rolled back, lies in the `num_steps *
write_width` columns from `start` on, the scatter reads only those (`paged.window`: one
`dynamic_slice`, a static width), not the whole gathered cache, and on the CPU a
verification's attention reads the columns up to its last guess (rounded up to one of the
plan's `attention_lengths`), not the whole table width.

**Only kept keys reach the blocks.** After the dispatch, a column of that window holding a
position `p >= 0` is a token the slot kept (accepted guesses and the tokens fed after them); a
rejected guess's column holds `-1` (`keep_below`), and `paged.scatter` drops it. Positions
below a slot's `length - pending` at the start of the dispatch (its prompt, the cached prefix
blocks shared by reference, what earlier dispatches wrote) are never written: the scatter's
`start` per slot. A slot's last token is not in the cache while `SpeculativeState.pending` is
set (the next step feeds it), so the gather reads a slot's first `length - pending` positions
only.

**Blocks.** Before a dispatch each busy slot's table is extended to cover `num_steps *
write_width` more positions (the most a dispatch can keep), never past its prompt plus
`max_new_tokens` positions (positions past them have no block, and their keys, never read, are
dropped). With preemption (`Engine(preemption=True)`, the default) the blocks come from the
pool as the slots grow and `serving.preemption` preempts the most recently admitted requests
when the pool cannot give them: the same code as without speculation, with `write_width`
positions per step (`tokens_per_step`), and a slot's written positions are `length - pending`
(`PagedKV.written`: its pending last token is fed again by the prefill of its resumed text).
Without it, `BlockAllocator.admit` reserves prompt plus `max_new_tokens` positions when it admits a
request, and an admission that does not fit waits. A draft model's cache (`DraftModel`,
`EarlyExit`) is not paged: it lives in the search's carry, as in the lockstep engine, and a slot's
row is reset at its `insert` (`serving.speculative.reset_jit`).

**Mixed prefill.** With `Engine(mixed_prefill=True)` a prompt's chunk runs first inside the
dispatch (`paged._paged_chunk`), then the speculative decode steps (`_speculative_mixed`): the
prefilling slot is idle (`done`) in the decode state, so the steps neither read nor write its
blocks.
"""

import dataclasses

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from .paged import PagedDecodeState, PagedKV, _paged_chunk, gather, scatter, window
from .programs import DecodeState, Prefix, StepOutput, engine_program
from .speculative import EngineSpeculation, _generate as speculative_generate, reset_jit


def _speculative_generate(
    fixed: tuple,
    state: PagedDecodeState,
    tables: Int[Array, "slots max_blocks"],
    num_steps: int,
    limit,
    eos_token_id,
    pad_token_id,
    until_finish: Bool[Array, ""],
    blocks: int | None = None,
) -> tuple[PagedDecodeState, StepOutput]:
    """`serving.speculative._generate` (`fixed`: `(model, spec)`, an `EngineSpeculation`) over
    the slots' gathered blocks with `num_steps * spec.write_width` empty columns, the kept keys
    and values scattered back into the blocks (see the module docstring). `blocks` (static):
    the leading blocks of every table gathered (`tables[:, :blocks]`, `None`: all; they must
    hold every busy slot's written positions: `PagedKV.generate` picks the bucket); the
    `extra` columns follow them, and the scatter goes through the whole `tables`.

    **Returns:** `(state, out)` as `serving.speculative._generate` returns them (`out`: `[num_steps
    * write_width, slots]` tokens, the guesses each slot verified and accepted)."""
    _, spec = fixed
    gen = state.generation
    extra = num_steps * spec.write_width
    pending = gen.search_state.pending
    written = jnp.where(gen.done, 0, gen.length - pending.astype(jnp.int32))
    cache = gather(state.paged, tables[:, :blocks], written, extra)  # write index: max(written)
    start = cache.length[0]
    inner = DecodeState(dataclasses.replace(gen, cache=cache), state.params, state.pool)
    inner, out = speculative_generate(
        fixed, inner, num_steps, limit, eos_token_id, pad_token_id, until_finish
    )
    written_now = window(inner.generation.cache, start, extra)  # the `extra` columns from start
    below = jnp.where(gen.done, state.paged.max_tokens, written)  # never rewritten
    paged = scatter(state.paged, written_now, tables, below)
    gen = dataclasses.replace(inner.generation, cache=gen.cache)
    return PagedDecodeState(gen, inner.params, inner.pool, paged), out


def _speculative_mixed(
    fixed: tuple,
    state: PagedDecodeState,
    tables: Int[Array, "slots max_blocks"],
    chunk,
    num_steps: int,
    limit,
    eos_token_id,
    pad_token_id,
    until_finish: Bool[Array, ""],
    blocks: int | None = None,
):
    """The mixed dispatch with speculation: one prefill chunk (`paged._paged_chunk`'s `(slot,
    token_ids, positions, written)`) into its slot's blocks, then `_speculative_generate`'s steps
    (the arguments after `chunk`: its arguments after `tables`), in ONE program; both gather
    `blocks` (static) leading blocks per table (one bucket holding the chunk's end too).

    **Returns:** `(state, out, logits)`, the logits after the chunk's last token."""
    model, _ = fixed
    state, logits = _paged_chunk(model, state, tables, *chunk, blocks)
    decode = (num_steps, limit, eos_token_id, pad_token_id, until_finish, blocks)
    state, out = _speculative_generate(fixed, state, tables, *decode)
    return state, out, logits


speculative_generate_jit = engine_program(_speculative_generate, "all-except-first")
speculative_mixed_jit = engine_program(_speculative_mixed, "all-except-first")


class SpeculativePagedKV(PagedKV):
    """A `PagedKV` whose dispatches speculate (`Engine(block_size=..., speculative=...)`):
    `generate` runs `_speculative_generate` (or `_speculative_mixed` with a chunk; `programs`),
    and `insert` resets the slot's row of the search's carry.

    **Arguments:** those of `PagedKV`, then `speculation` (the engine's `EngineSpeculation`).

    **Raises:** as `PagedKV`."""

    reads_in_place = False  # the verify steps run over gathered blocks

    def __init__(
        self,
        model,
        max_slots,
        max_len,
        block_size,
        num_blocks=None,
        *,
        speculation: EngineSpeculation,
        preemption=False,
        num_steps=1,
    ):
        self.speculation = speculation
        super().__init__(
            model,
            max_slots,
            max_len,
            block_size,
            num_blocks,
            preemption=preemption,
            num_steps=num_steps,
        )
        """The speculative search of every dispatch (`serving.speculative.EngineSpeculation`)."""

    def written(self, gen) -> Int[Array, " slots"]:
        """Per slot the positions in its blocks: `length - pending` (a pending last token is not
        in the cache yet)."""
        return gen.length - gen.search_state.pending.astype(jnp.int32)

    def insert(self, prefix: Prefix, state: PagedDecodeState, slot: int) -> PagedDecodeState:
        """`PagedKV.insert`, then the slot's row of the search's carry as `init` makes it
        (`serving.speculative.reset_jit`: nothing pending, a draft cache's row forgotten)."""
        state = super().insert(prefix, state, slot)
        return reset_jit(self.speculation, state, jnp.asarray(slot, jnp.int32))

    def programs(self) -> tuple:
        """`PagedKV.programs` of a speculating engine: `(model, speculation)` as the programs'
        first argument, `write_width` positions per step (the blocks a dispatch of `n` steps
        extends a slot by: `n * write_width`), and
        `speculative_generate_jit`, `speculative_mixed_jit`."""
        fixed = (self.model, self.speculation)
        return fixed, self.speculation.write_width, speculative_generate_jit, speculative_mixed_jit
