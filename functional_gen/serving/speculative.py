"""Speculative decoding in the serving engine (`Engine(..., speculative=proposer)`).

Each decode step of a dispatch is `generation.speculative.Speculative`'s step over the slots,
the search `fg.generate(..., speculative=...)` runs: the proposer (`PromptLookup`, `DraftModel`,
`EarlyExit`) guesses up to `k` tokens per slot, the target verifies every slot's guesses in ONE
call over `[last token, guesses]`, and each slot accepts its own run (`SpeculativeState.accepted`
per row) and advances by its own count, so the slots of a dispatch advance by different numbers
of tokens. The search's carry (`SpeculativeState`: pending tokens, the proposer's carry, e.g. a
draft model's `KVCache`, and the per-slot counts) lives in the decode state's
`generation.search_state`; `reset_jit` clears a slot's row when a request is inserted.

**Greedy and sampled slots in one batch.** `Speculative` verifies with a static rule (exact match
for `Greedy`, rejection sampling for `Multinomial`); the engine's is `Multinomial`'s for every
slot. `SlotDecoding` leaves a greedy slot only its largest logit, so the rejection rule gives it
exactly its greedy tokens (a guess is kept iff it is that token, and the token after the kept
run is that one). A prompt lookup's guesses are the same either way; a draft model's guesses
for a greedy slot are then drawn from the draft, not its most likely tokens, so fewer are
accepted. (Switching to the exact-match rule while no busy slot samples doubled the dispatch's
compile time, 17.7 to 28.0 s for a tiny Llama on the 2-core CPU; a per-row proposer `sample`
flag would avoid both.)

**Lossless as `fg.generate`.** A slot's tokens are those of `fg.generate` of its request alone:
greedy, those of plain greedy decoding; sampled with a seed, those of `fg.generate(...,
speculative=proposer, key=jax.random.key(seed))` as long as both verify the same guesses at each
step (a row's guesses and keys depend on its own tokens only; an adaptive `PromptLookup` under
its cost model plans over the whole batch, and either side's cache compaction verifies nothing
for one step, so sampled runs then differ in their draws, not in their distribution).

**Cache room.** A step writes up to `write_width` slots at the shared write index. The engine's
cache gets `num_steps * write_width` slots beyond `max_len`, and before a dispatch that would not
fit, `squeeze` moves every slot's live keys and values to the front (`speculative.cache.compact`;
the lockstep `compact` only drops the leading dead slots, not the holes rejected guesses leave),
so a dispatch never runs out of room in the middle: the search is built without its
compaction branch (`Speculative(compaction=False)`, less to compile).

**Draft caches.** A draft model (`DraftModel`, `EarlyExit`) catches up on a slot's text in one
call over every column of the slots' `token_ids` (`max_len`, positions `-1` but the lagging
row's), written at its cache's shared write index: in `fg.generate` only at the first step, here
whenever a request is inserted while others run, whose live slots (up to `max_len` each) stay.
So its cache gets `2 * max_len` slots plus a step's writes (the `capacity` its `init` sizes for),
not `max_len`: with `max_len` the write was clamped to the cache's end and overwrote the running
rows' keys and values.

Source: Leviathan, Kalman & Matias 2023; vLLM's speculative decoding in its scheduler (per-request
acceptance inside one batched verification).
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..generation.samplers import Multinomial
from ..generation.speculative import (
    Speculative,
    SpeculativeState,
    speculative_search,
    verify_widths,
)
from ..models.base import AbstractCausalLM
from ..models.kv_cache import KVCache
from ..speculative.cache import compact
from ..speculative.proposers import AbstractProposer
from .programs import DecodeState, StepOutput, _step, engine_program


class EngineSpeculation(eqx.Module):
    """What an `Engine` with `speculative=proposer` holds: the `Speculative` search of the
    proposer (rejection sampling, see the module docstring) sized for its slots.

    **Arguments:** `proposer` (an `AbstractProposer`), `model` (the engine's target), `max_slots`,
    `max_len` (the slots' `token_ids` columns).

    **Raises:** as `generation.speculative.speculative_search` (`TypeError` for a proposer that
    is not one; `ValueError` for a draft of another vocabulary, an `EarlyExit` with too many
    layers, more guesses than sliding-window rings take back).
    """

    search: Speculative
    write_width: int = eqx.field(static=True)
    """The most cache slots one step writes: `verify_widths(num_tokens, max_slots)[-1] + 1`."""

    def __init__(
        self, proposer: AbstractProposer, model: AbstractCausalLM, max_slots: int, max_len: int
    ):
        search = speculative_search(proposer, Multinomial(), model)  # checks, draft's dtype
        sized = search.sized(max_len, model)  # (keeps the target for `EarlyExit`)
        # a draft's cache sized for `2 * max_len` columns: see "Draft caches" above
        self.search = Speculative(sized.proposer, sized.sampler, 2 * max_len, sized.model, False)
        self.write_width = verify_widths(search.num_tokens, max_slots)[-1] + 1

    @property
    def proposer(self) -> AbstractProposer:
        """The proposer (a `DraftModel`'s draft in the target's cache dtype)."""
        return self.search.proposer

    def init(self, slots: int) -> SpeculativeState:
        """The search's carry for `slots` idle slots (a buffer of its own per leaf: the decode
        state is donated)."""
        return jax.tree.map(jnp.copy, self.search.init(slots, 0))


def _reset(spec: EngineSpeculation, state: DecodeState, slot: Int[Array, ""]) -> DecodeState:
    """`state` with `slot`'s row of the search's carry as `init` makes it (nothing pending, the
    proposer's initial row; a proposer cache's row forgotten, its shared write index kept). The
    slot's counts are kept: they count the slot's guesses over every request it served."""
    old: SpeculativeState = state.generation.search_state
    fresh = spec.init(1)

    def put(full, new):
        if isinstance(full, KVCache):
            rows = jnp.arange(full.positions.shape[0])
            return full.forget(jnp.where(rows == slot, 0, jnp.iinfo(jnp.int32).max))
        return full.at[slot].set(new[0])

    carry = jax.tree.map(
        put, old.proposer, fresh.proposer, is_leaf=lambda x: isinstance(x, KVCache)
    )
    new = dataclasses.replace(
        old,
        pending=old.pending.at[slot].set(False),
        finished=old.finished.at[slot].set(False),
        proposer=carry,
    )
    return eqx.tree_at(lambda s: s.generation.search_state, state, new)


def _squeeze(state: DecodeState) -> DecodeState:
    """Every slot's live cache slots moved to the front (`speculative.cache.compact`)."""
    cache = compact(state.generation.cache)
    return eqx.tree_at(lambda s: s.generation.cache, state, cache)


def _generate(
    fixed: tuple[AbstractCausalLM, EngineSpeculation],
    state: DecodeState,
    num_steps: int,
    limit,
    eos_token_id,
    pad_token_id,
    until_finish: Bool[Array, ""],
) -> tuple[DecodeState, StepOutput]:
    """`programs._generate` with speculative steps: up to `min(num_steps, limit)` verification
    steps in one `while_loop`. A step emits 0 to `write_width` tokens per slot; each slot's
    tokens go to its own column of the output one after the other (`-1` after the last), so the
    output has `num_steps * write_width` rows. `StepOutput.verified` / `accepted`: the guesses
    each slot verified and accepted in this dispatch. `fixed`: `(model, spec)` (not donated)."""
    model, spec = fixed
    gen = state.generation
    k = gen.top_token_ids.shape[-1]
    was_done = gen.done
    step = _step(model, eos_token_id, pad_token_id, state, k, search=spec.search)
    slots = gen.batch_size
    rows = jnp.arange(slots)
    width = spec.write_width
    out_rows = num_steps * width
    cols, lp_cols = gen.token_ids.shape[1], gen.logprobs.shape[1]
    j = jnp.arange(width)[:, None]  # [width, 1]

    def body(carry):
        i, cursor, gen, out = carry
        new = step(gen)
        took = new.length - gen.length  # tokens each slot emitted this step
        emitted = j < took[None, :]
        at = jnp.where(emitted, cursor[None, :] + j, out_rows)  # past the end: dropped
        tok_col = jnp.minimum(gen.length[None, :] + j, cols - 1)
        lp_col = jnp.minimum(gen.num_generated[None, :] + j, lp_cols - 1)
        now = (
            new.token_ids[rows[None, :], tok_col],
            new.logprobs[rows[None, :], lp_col],
            new.top_token_ids[rows[None, :], lp_col],
            new.top_logprobs[rows[None, :], lp_col],
        )
        out = jax.tree.map(lambda a, b: a.at[at, rows[None, :]].set(b, mode="drop"), out, now)
        return i + 1, cursor + took, new, out

    def cond(carry):
        i, _, gen, _ = carry
        go = (i < jnp.minimum(num_steps, limit)) & ~jnp.all(gen.done)
        return go & ~(until_finish & jnp.any(gen.done & ~was_done))

    out = (
        jnp.full((out_rows, slots), -1, jnp.int32),
        jnp.zeros((out_rows, slots), jnp.float32),
        jnp.zeros((out_rows, slots, k), jnp.int32),
        jnp.zeros((out_rows, slots, k), jnp.float32),
    )
    before: SpeculativeState = gen.search_state
    _, _, gen, out = jax.lax.while_loop(
        cond, body, (jnp.asarray(0), jnp.zeros((slots,), jnp.int32), gen, out)
    )
    after: SpeculativeState = gen.search_state
    out = StepOutput(
        *out,
        done=gen.done,
        finish_reason=gen.finish_reason,
        verified=after.proposed - before.proposed,
        accepted=after.accepted - before.accepted,
    )
    return DecodeState(gen, state.params, state.pool), out


generate_jit = engine_program(_generate, "all-except-first")
reset_jit = engine_program(_reset, "all-except-first")
squeeze_jit = engine_program(_squeeze, "all")
