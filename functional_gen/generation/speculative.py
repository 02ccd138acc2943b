"""`Speculative`: the search of speculative decoding (a third search beside `Sample` and beams).

One step of the compiled loop, for every row at once:

1. the proposer (`functional_gen.speculative`) guesses `k` tokens per row;
   a constraint (`functional_gen.structured`) is walked over the guesses first
   (`functional_gen.speculative.guard`): a draft model draws only tokens it allows, and every
   row's guesses are cut at the first one it forbids, so no verification is spent on them;
2. the target model runs ONCE over `k + 1` positions per row: the row's last token (when the
   previous step emitted it without feeding it) and the `k` guesses; the call is as wide as the
   widest row's guesses (a few static widths, `verify_widths`, one `switch_in_place` branch
   each), and for an adaptive `PromptLookup` only as wide as the cost model says pays
   (`functional_gen.speculative.cost`: expected tokens per unit of the measured cost; width 0
   is a plain decode step; where no acceptance could pay, the lookup itself is skipped);
3. the processors run position by position (a `lax.scan` of `process_rows`), each position
   from the state the previous one left, so every position has its own processor and
   constraint state;
4. each row accepts the longest prefix of guesses the target agrees with (`exact_match` when
   greedy, `rejection_sample` when sampling) and emits it plus one token of the target's;
5. EOS, stop strings and `max_new_tokens` cut inside the emitted run; the row keeps the
   processor and stop-string states of its last emitted position (selected, no rollback) and
   advances by its own count;
6. the target's cache forgets the rejected guesses by position (`keep_below`), the
   proposer's carry likewise (`AbstractProposer.update`).

The last emitted token of a row is usually the target's own (a correction or a bonus token): it
is not in the cache yet and is fed at the start of the next step (`SpeculativeState.pending`).
A row that finishes on such a token takes one more step, feeding only that token, so that the
finished state has every token cached and the logits after the last one, exactly as `Sample`
leaves it (a `SequenceState` continues from it).

Source: Leviathan, Kalman & Matias 2023 (Algorithm 1); Chen et al. 2023; transformers'
`_assisted_decoding` (one batch row, outside a compiled loop).
"""

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int, PyTree

from ..models.base import AbstractCausalLM
from ..models.kv_cache import RING_RESERVE
from ..reductions import argmax, chosen_logprobs
from ..speculative.acceptance import exact_match, rejection_sample
from ..speculative.cache import compact, keep_below, switch_in_place
from ..speculative.cost import choose_width, model_precision, verify_cost
from ..speculative.guard import ProposalGuard
from ..speculative.proposers import (
    EXPLORE_TOKENS,
    AbstractProposer,
    DraftModel,
    EarlyExit,
    LookupCarry,
)
from .samplers import AbstractSampler, Greedy, Multinomial
from .search import AbstractSearch, process_rows
from .state import CONSTRAINT, EOS, LENGTH, STOP_STRING, GenerationState

_DRAFT_SALT = 0x5EED01  # the proposer's keys: fold_in(step key, salt)
_ACCEPT_SALT = 0x5EED02  # the acceptance draws


def verify_widths(num_tokens: int, batch: int = 1) -> tuple[int, ...]:
    """The static numbers of guess slots a step verifies: 0 (a plain decode step), then
    `EXPLORE_TOKENS` (3), 7, 15, 23, ... up to the first that holds `num_tokens` guesses, so that
    the target call is 1, 4 or a multiple of 8 positions wide (the row's last token and the guess
    slots). A step takes the smallest that holds every row's guesses (`switch_in_place`); slots beyond
    a row's guesses are dead (position `-1`: never attended to, accepted or kept in the cache).

    On this 2-core CPU (XLA, float32) a matmul over a multiple of 8 positions is cheap and an odd
    width is not (the 49152x576 head: 8 positions 3.6 ms, 11 positions 5.2 ms, 16 positions
    4.4 ms). The default model at batch 1: a call over 4 / 8 / 11 / 16 positions cost 1.24 /
    1.47 / 2.35 / 1.83x a one-position call (`benchmarks/bench_verify_width.py`, 2026-11-26).

    That ladder is for a batch of 1. With `batch` rows a call covers `batch * positions`
    tokens, and past about 16 tokens a matmul costs in proportion to them: the widths are then
    0, `min(EXPLORE_TOKENS, num_tokens)` and `num_tokens`, each call rounded up only so that
    `batch * positions` is a multiple of 8 (batch 4, `num_tokens=10`: calls of 4 and 12
    positions; batch 8: 4 and 11). Measured 2026-11-26, 4 rows, grounded tasks: padding 11
    positions to 16 made prompt lookup 0.53x plain, against 0.73x unpadded.

    **Raises:** `ValueError` for a `num_tokens` below 1.
    """
    if num_tokens < 1:
        raise ValueError(f"`num_tokens` must be at least 1, got {num_tokens}")
    if batch > 1:
        unit = 8 // math.gcd(batch, 8)  # positions whose multiples make batch * positions % 8 == 0
        calls = {min(EXPLORE_TOKENS, num_tokens) + 1, num_tokens + 1}
        return tuple(sorted({0} | {-(-c // unit) * unit - 1 for c in calls}))
    widths = [0, EXPLORE_TOKENS]
    while widths[-1] < num_tokens:
        widths.append((len(widths) - 1) * 8 - 1)
    return tuple(widths)


class SpeculativeState(eqx.Module):
    """The search's carry (`GenerationState.search_state`).

    **Attributes:** `pending` (`Bool[Array, " batch"]`: the row's last token is not in the
    target's cache, and `GenerationState.logits` are not yet the logits after it); `finished`
    (the row has finished but its last token is still to be fed); `proposer` (the proposer's
    carry); `proposed`, `accepted`, `steps` (`Int[Array, " batch"]`: guesses verified, guesses
    emitted, verification steps; `accepted / proposed` is the acceptance rate and
    `generated / steps` the tokens per step); `forbidden` (`Int[Array, " batch"]`: verified
    guesses that the target's processed logits forbid, i.e. wasted verification; guesses a
    constraint forbids are cut before verification, so with a constraint alone it stays 0).
    """

    pending: Bool[Array, " batch"]
    finished: Bool[Array, " batch"]
    proposer: PyTree
    proposed: Int[Array, " batch"]
    forbidden: Int[Array, " batch"]
    accepted: Int[Array, " batch"]
    steps: Int[Array, " batch"]


class Speculative(AbstractSearch):
    """Speculative decoding: every row advances by the guesses the target accepts, plus one.

    Lossless: greedy output equals `Sample(Greedy())` token for token, sampled output has the
    distribution of `Sample(Multinomial())`, with any processors and constraints.

    **Arguments:** `proposer` (an `AbstractProposer`: `PromptLookup`, `DraftModel`,
    `EarlyExit`); `sampler` (`Greedy()` or `Multinomial()`); `capacity` (static: the columns of
    the rows' `token_ids`, set when a call is planned, `sized`); `model` (the target, for
    proposers that build their draft from it, set by `sized`); `compaction` (static, default
    `True`: a step whose writes would not fit the target's cache compacts it first and verifies
    nothing; `False`: no such branch, less to compile; the caller guarantees room for every
    step's writes, `verify_widths(num_tokens, batch)[-1] + 1` slots, as the serving engine does).

    **Raises:** `TypeError` for a proposer that is not an `AbstractProposer` or a sampler other
    than `Greedy` or `Multinomial` (other samplers have no rejection rule here).
    """

    proposer: AbstractProposer
    sampler: AbstractSampler
    capacity: int = eqx.field(static=True, default=0)
    model: AbstractCausalLM | None = None
    compaction: bool = eqx.field(static=True, default=True)

    def __check_init__(self):
        if not isinstance(self.proposer, AbstractProposer):
            raise TypeError(
                "`speculative` must be a functional_gen.speculative proposer (PromptLookup, "
                f"DraftModel, EarlyExit), got {type(self.proposer).__name__}"
            )
        if not isinstance(self.sampler, (Greedy, Multinomial)):
            raise TypeError(
                "speculative decoding verifies greedy (Greedy) or sampled (Multinomial) "
                f"decoding, got the sampler {type(self.sampler).__name__}"
            )

    @property
    def needs_key(self) -> bool:
        """Whether the sampler is random."""
        return self.sampler.needs_key

    @property
    def num_beams(self) -> int:
        """0: rows advance on their own."""
        return 0

    @property
    def num_tokens(self) -> int:
        """Guesses per step, `k`."""
        return self.proposer.num_tokens

    @property
    def cache_slots(self) -> int:
        """Extra target-cache slots a call reserves: the widest verification's writes
        (`verify_widths`) twice over (compaction frees dead slots when they run out)."""
        return 2 * (verify_widths(self.num_tokens)[-1] + 1)

    def sized(self, capacity: int, model: AbstractCausalLM) -> "Speculative":
        """This search for rows of `capacity` columns, decoding `model` (kept only for
        `EarlyExit`, whose draft cache is shaped by it)."""
        keep = model if isinstance(self.proposer, EarlyExit) else None
        return Speculative(self.proposer, self.sampler, capacity, keep, self.compaction)

    def init(self, rows: int, steps: int) -> SpeculativeState:
        """Nothing pending, no counts yet, the proposer's initial carry."""
        del steps
        zeros = jnp.zeros((rows,), jnp.int32)
        return SpeculativeState(
            pending=jnp.zeros((rows,), bool),
            finished=jnp.zeros((rows,), bool),
            proposer=self.proposer.init(self.model, rows, self.capacity),
            proposed=zeros,
            forbidden=zeros,
            accepted=zeros,
            steps=zeros,
        )

    def __call__(self, step, state: GenerationState) -> GenerationState:
        """One verification step for every row (see the module docstring).

        An adaptive `PromptLookup` under its cost model first asks whether any verification
        could pay this step (`LookupCarry.ceiling`: every row offering `num_tokens` guesses at
        the highest acceptance its estimates allow); where none could, the step skips the
        lookup and is a plain decode step (`_skip_lookup`): what the cost model would have
        chosen whatever the lookup found, without its cost.

        **Arguments:** `step`, the `Step`; `state`, a `GenerationState` whose `search_state` is
        a `SpeculativeState`.

        **Returns:** the next `GenerationState`, with the same tree structure, shapes and dtypes.
        """
        carry = state.search_state.proposer
        if not (isinstance(carry, LookupCarry) and self.proposer.cost_model):
            return self._speculate(step, state)
        batch, k = state.batch_size, self.num_tokens
        widths = verify_widths(k, batch)
        precision = model_precision(step.model)
        costs = tuple(verify_cost(precision, batch, w + 1) for w in widths)
        active = ~state.done & ~state.search_state.finished
        offered = jnp.full((batch,), k, jnp.int32)
        worth = choose_width(widths, costs, carry.ceiling(), offered, active) > 0
        # a full cache is compacted by `_speculate` (its own branch, whatever it verifies)
        full = state.cache.length[0] + 1 > state.cache.max_len
        # no row to feed (the first step: the prefill fed every token): no target call at all
        fed = jnp.any(state.search_state.pending & ~state.done)
        branch = jnp.where(worth | full, 1, jnp.where(fed, 0, 2))
        return switch_in_place(
            branch,
            [
                lambda s: self._skip_lookup(step, s),
                lambda s: self._speculate(step, s),
                lambda s: self._skip_lookup(step, s, call=False),
            ],
            state,
        )

    def _skip_lookup(self, step, state: GenerationState, *, call: bool = True) -> GenerationState:
        """A plain decode step for every row of an adaptive `PromptLookup` whose guesses could
        not pay for their verification this step (no lookup; the cache has room for one write).
        Each active row counts the step as idle (`LookupCarry.idle`: the lookup might have found
        guesses), so that exploration comes due as if it had. `call=False` (static): no row's
        last token is pending, so the target is not called (its logits are at hand)."""
        spec: SpeculativeState = state.search_state
        active = ~state.done & ~spec.finished
        settle = ~state.done & spec.finished
        carry = dataclasses.replace(
            spec.proposer,
            guesses=jnp.full_like(spec.proposer.guesses, -1),
            found=active.astype(jnp.int32),
        )
        state = dataclasses.replace(state, search_state=dataclasses.replace(spec, proposer=carry))
        step_keys = jax.vmap(jax.random.fold_in)(state.key, state.key_step + state.num_generated)
        none = jnp.zeros((state.batch_size, 0), jnp.int32)
        no_guesses = jnp.zeros((state.batch_size,), jnp.int32)
        return self._verify(
            state, step, none, None, no_guesses, active, settle, step_keys, width=0, call=call
        )

    def _speculate(self, step, state: GenerationState) -> GenerationState:
        """Guess, choose the verification width, verify (steps 1-6 of the module docstring)."""
        k = self.num_tokens
        spec: SpeculativeState = state.search_state
        length, token_ids = state.length, state.token_ids
        active = ~state.done & ~spec.finished
        settle = ~state.done & spec.finished
        step_keys = jax.vmap(jax.random.fold_in)(state.key, state.key_step + state.num_generated)
        salted = jax.vmap(jax.random.fold_in, (0, None))
        greedy = not self.sampler.needs_key

        # 1. guesses, masked by the rows' constraints (a draft model draws only admissible ones)
        guard, guard_state = ProposalGuard.of(
            step.processors,
            state.processor_states,
            token_ids,
            length,
            state.prompt_length,
            state.start_length - state.prompt_length + state.max_new_tokens,
            step_keys,
            state.logits.shape[-1],
        )
        carry, drafts, q = self.proposer.propose(
            spec.proposer,
            step.model,
            token_ids,
            length,
            active,
            key=salted(step_keys, _DRAFT_SALT),
            sample=not greedy,
            guard=guard,
            guard_state=guard_state,
        )

        # a proposer may guess fewer than k tokens (-1: no guess); the target call is as wide as
        # the most guesses of a row, rounded up to `verify_widths` (none: a plain decode step)
        widths = verify_widths(k, state.batch_size)
        top = widths[-1]
        drafts = jnp.pad(drafts, ((0, 0), (0, top - k)), constant_values=-1)  # dead slots
        q = None if q is None else jnp.pad(q, ((0, 0), (0, top - k), (0, 0)))
        num_guesses = jnp.sum(jnp.cumprod((drafts >= 0).astype(jnp.int32), axis=1), axis=1)
        num_guesses = jnp.where(active, num_guesses, 0)
        if guard is not None:  # cut at the first guess the constraint forbids: never verified
            num_guesses = guard.admissible(guard_state, drafts, num_guesses)
        if isinstance(carry, LookupCarry) and self.proposer.cost_model:
            # an acceptance estimate: verify only as wide as pays for its call (`cost`); the
            # carry keeps only the verified guesses, so that it learns from those alone
            precision = model_precision(step.model)
            costs = tuple(verify_cost(precision, state.batch_size, w + 1) for w in widths)
            chosen = choose_width(widths, costs, carry.acceptance(), num_guesses, active)
            num_guesses = jnp.minimum(num_guesses, jnp.asarray(widths, jnp.int32)[chosen])
            verified = jnp.arange(k)[None, :] < num_guesses[:, None]
            carry = dataclasses.replace(carry, guesses=jnp.where(verified, carry.guesses, -1))
        last = jnp.take_along_axis(token_ids, jnp.maximum(length - 1, 0)[:, None], axis=1)
        drafts = jnp.where(drafts >= 0, drafts, last)
        # the branches update the state in place (`switch_in_place`): the proposer's new carry
        # (a draft model's cache) goes in with it, not beside it
        state = dataclasses.replace(state, search_state=dataclasses.replace(spec, proposer=carry))
        args = (step, drafts, q, num_guesses, active, settle, step_keys)
        branch = jnp.searchsorted(jnp.asarray(widths, jnp.int32), jnp.max(num_guesses))
        branch = jnp.minimum(branch, len(widths) - 1)
        # A cache without room for the call's writes is compacted first, in a branch of its own
        # that verifies nothing (a plain decode step; the guesses are dropped, which is lossless):
        # a `lax.cond` around the cache inside every branch copied every buffer of the cache
        # twice per step (XLA's CPU backend; batch 8, a 320-slot cache: 118 MB a copy).
        branches = [lambda s, width=width: self._verify(s, *args, width=width) for width in widths]
        if self.compaction:
            room = state.cache.max_len - state.cache.length[0]
            full = jnp.asarray(widths, jnp.int32)[branch] + 1 > room
            branch = jnp.where(full, len(widths), branch)
            no_guesses = jnp.zeros_like(num_guesses)
            compacting = (step, drafts, q, no_guesses, active, settle, step_keys)
            branches.append(lambda s: self._verify(s, *compacting, width=0, compact_first=True))
        return switch_in_place(branch, branches, state)

    def _verify(
        self,
        state,
        step,
        drafts,
        q,
        num_guesses,
        active,
        settle,
        step_keys,
        *,
        width,
        compact_first=False,
        call=True,
    ):
        """Verify the first `width` guesses of every row (static; 0: a plain decode step), the
        target's cache compacted first when `compact_first` (static). `call=False` (static, only
        at width 0 when no row's last token is pending): the target is not called, its logits
        after every row's text are `state.logits` already."""
        k = width
        drafts = drafts[:, :k]
        q = None if q is None else q[:, :k]
        num_guesses = jnp.minimum(num_guesses, k)
        batch = state.batch_size
        rows = jnp.arange(batch)
        spec: SpeculativeState = state.search_state
        carry = spec.proposer  # the proposer's carry after this step's `propose`
        length, token_ids = state.length, state.token_ids
        cols = token_ids.shape[1]
        salted = jax.vmap(jax.random.fold_in, (0, None))
        greedy = not self.sampler.needs_key

        # 2. one target call over [last token, guesses]
        last = jnp.take_along_axis(token_ids, jnp.maximum(length - 1, 0)[:, None], axis=1)
        ids = jnp.concatenate([last, drafts], axis=1)
        first_pos = jnp.where(spec.pending & (active | settle), length - 1, -1)
        guessed = jnp.arange(k)[None, :] < num_guesses[:, None]
        draft_pos = jnp.where(guessed, length[:, None] + jnp.arange(k)[None, :], -1)
        positions = jnp.concatenate([first_pos[:, None], draft_pos], axis=1)
        cache = compact(state.cache) if compact_first else state.cache
        if call:
            out, cache = step.model(ids, positions, cache)
        else:  # nothing to feed: `first` below takes `state.logits` for every row
            out = state.logits[:, None, :]
        first = jnp.where(spec.pending[:, None], out[:, 0], state.logits)
        raw = jnp.concatenate([first[:, None], out[:, 1:]], axis=1)  # [batch, k+1, vocab]

        # 3. processors, position by position, from the row's state
        draft_cols = jnp.where(active[:, None], length[:, None] + jnp.arange(k)[None, :], cols)
        ext_ids = token_ids.at[rows[:, None], draft_cols].set(drafts, mode="drop")

        def process(states, j):
            at_j = eqx.tree_at(
                lambda s: (s.token_ids, s.length, s.processor_states, s.done),
                state,
                (ext_ids, length + j, states, ~active),
            )
            states, logits, _ = process_rows(step, at_j, raw[:, j])
            return states, (states, logits)

        if step.processors:
            _, (states_at, processed) = jax.lax.scan(
                process, state.processor_states, jnp.arange(k + 1)
            )
            processed = processed.transpose(1, 0, 2)  # [batch, k+1, vocab]
        else:  # nothing to process: no scan over the positions (`process_rows` is the identity)
            states_at, processed = (), raw
        best = jnp.max(processed, axis=-1)  # [batch, k+1]
        dead = best == -jnp.inf  # no token possible at that position
        guessed_logits = jnp.take_along_axis(processed[:, :k], drafts[..., None], axis=-1)[..., 0]
        forbidden = jnp.sum(guessed & (guessed_logits == -jnp.inf), axis=1).astype(jnp.int32)

        # 4. acceptance
        if greedy:
            targets = jnp.where(dead, -1, argmax(processed, axis=-1)).astype(jnp.int32)
            n = jax.vmap(exact_match)(drafts, targets, num_guesses)
            next_token = targets[rows, n]
        else:
            p = jnp.where(dead[..., None], 0.0, jax.nn.softmax(processed, axis=-1))
            n, next_token = jax.vmap(
                lambda p, q, d, num, key: rejection_sample(p, q, d, num, key=key),
                in_axes=(0, None if q is None else 0, 0, 0, 0),
            )(p, q, drafts, num_guesses, salted(step_keys, _ACCEPT_SALT))
        dead_n = dead[rows, n]
        emitted = n + (~dead_n).astype(jnp.int32)  # before any cut
        tokens = jnp.concatenate([drafts, jnp.zeros((batch, 1), jnp.int32)], axis=1)
        tokens = tokens.at[rows, n].set(next_token)

        # 5. cuts: EOS, stop strings, max_new_tokens (the first one ends the run)
        j = jnp.arange(k + 1)[None, :]
        is_eos = jnp.isin(tokens, jnp.asarray(step.eos_token_id, jnp.int32))
        out_of_budget = (
            length[:, None] - state.start_length[:, None] + j + 1 >= (state.max_new_tokens[:, None])
        )
        if step.stop_strings is not None:

            def advance(stop_state, column):
                stop_state, matched = step.stop_strings.advance(stop_state, column)
                return stop_state, (stop_state, matched)

            _, (stop_states, hit_stop) = jax.lax.scan(advance, state.stop_state, tokens.T)
            hit_stop = hit_stop.T
        else:
            stop_states = jnp.broadcast_to(state.stop_state, (k + 1, *state.stop_state.shape))
            hit_stop = jnp.zeros_like(is_eos)
        ends = (is_eos | hit_stop | out_of_budget) & (j < emitted[:, None])
        cut = jnp.argmax(ends, axis=1)  # the first end, if any
        has_end = jnp.any(ends, axis=1)
        count = jnp.where(has_end, cut + 1, emitted)
        count = jnp.where(active, count, 0)
        at_cut = (rows, cut)
        reason = jnp.select(
            [is_eos[at_cut], hit_stop[at_cut], out_of_budget[at_cut]], [EOS, STOP_STRING, LENGTH]
        )
        reason = jnp.where(has_end, reason, CONSTRAINT)
        finishing = active & (has_end | dead_n)
        finish_reason = jnp.where(finishing, reason, state.finish_reason).astype(jnp.int32)

        # write the emitted tokens and their logprobs
        write = j < count[:, None]
        new_ids = token_ids.at[rows[:, None], jnp.where(write, length[:, None] + j, cols)].set(
            tokens, mode="drop"
        )
        scored = processed if step.logprobs_mode == "processed" else raw
        chosen = chosen_logprobs(scored, tokens, best if scored is processed else None)
        steps_cols = state.logprobs.shape[1]
        lp_cols = jnp.where(write, state.num_generated[:, None] + j, steps_cols)
        logprobs = state.logprobs.at[rows[:, None], lp_cols].set(chosen, mode="drop")
        top_ids, top_values = state.top_token_ids, state.top_logprobs
        if step.top_logprobs:
            values, top = jax.lax.top_k(jax.nn.log_softmax(scored, axis=-1), step.top_logprobs)
            top_ids = top_ids.at[rows[:, None], lp_cols].set(top.astype(jnp.int32), mode="drop")
            top_values = top_values.at[rows[:, None], lp_cols].set(values, mode="drop")
        new_length = length + count

        # the states of the last processed position (a constraint's dead end is processed too)
        used = count - 1 + (active & ~has_end & dead_n).astype(jnp.int32)
        used = jnp.clip(used, 0, k)
        processor_states = jax.tree.map(lambda x: jnp.moveaxis(x, 0, 1)[rows, used], states_at)
        if not step.processors:
            processor_states = state.processor_states
        stop_state = jnp.where(
            (active & (count > 0))[:, None],
            jnp.moveaxis(stop_states, 0, 1)[rows, jnp.maximum(count - 1, 0)],
            state.stop_state,
        )

        # 6. caches: what is fed, and the logits after the last token
        fed_last = active & (count > 0) & (count <= n)  # the run ends on an accepted guess
        pending = jnp.where(active, (count > 0) & ~fed_last, jnp.where(settle, False, spec.pending))
        logits = jnp.where(
            (active | settle)[:, None], raw[rows, jnp.minimum(count, k)], state.logits
        )
        logits = jnp.where(settle[:, None], raw[:, 0], logits)
        cache = keep_below(cache, new_length - pending.astype(jnp.int32))
        carry = self.proposer.update(carry, new_ids, new_length)

        done = state.done | settle | (finishing & ~pending)
        finished = spec.finished | (finishing & pending)
        accepted = jnp.minimum(n, count)
        spec = SpeculativeState(
            pending=pending,
            finished=finished,
            proposer=carry,
            proposed=spec.proposed + num_guesses,
            forbidden=spec.forbidden + forbidden,
            accepted=spec.accepted + jnp.where(active, accepted, 0),
            steps=spec.steps + active.astype(jnp.int32),
        )
        return dataclasses.replace(
            state,
            token_ids=new_ids,
            length=new_length,
            done=done,
            finish_reason=finish_reason,
            logits=logits,
            logprobs=logprobs,
            top_token_ids=top_ids,
            top_logprobs=top_values,
            cache=cache,
            processor_states=processor_states,
            stop_state=stop_state,
            search_state=spec,
        )


def speculative_search(
    proposer: AbstractProposer, sampler: AbstractSampler | AbstractSearch | None, model
) -> Speculative:
    """The `Speculative` search of a call that asks for `speculative=proposer`, checked against
    the target `model` before anything compiles.

    **Arguments:** `proposer`: the call's `speculative` option; `sampler`: the call's sampler or
    search (`None`: greedy; a search, e.g. a continued state's `Sample` or `Speculative`: its
    declared `sampler`, which for `BeamSearch` is the search itself, refused); `model`: the
    target.

    **Raises:** `ValueError` for beam search (named with speculative decoding), a draft model
    whose vocabulary size differs from the target's, or an `EarlyExit` with as many layers as
    the target or more; `TypeError` for a proposer that is not one, or a sampler that cannot
    be verified (see `Speculative`).
    """
    if isinstance(sampler, AbstractSearch):
        sampler = (
            sampler.sampler
        )  # a continued state's search (`Sample`, `Speculative`): its sampler
    if sampler is None:
        sampler = Greedy()
    if isinstance(sampler, AbstractSearch):
        raise ValueError(
            f"speculative decoding ({type(proposer).__name__}) cannot be combined with "
            f"{type(sampler).__name__}: it verifies one row's greedy or sampled tokens; drop "
            "`speculative` or use Greedy()/Multinomial()"
        )
    if isinstance(proposer, DraftModel) and proposer.draft.vocab_size != model.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary has {proposer.draft.vocab_size} tokens, the "
            f"target's {model.vocab_size}: a draft must share the target's vocabulary"
        )
    if isinstance(proposer, EarlyExit):
        if proposer.num_layers >= model.num_layers:
            raise ValueError(
                f"EarlyExit(num_layers={proposer.num_layers}) must use fewer layers than the "
                f"target's {model.num_layers}"
            )
        proposer.draft_of(model)  # refuses a model without `first_layers`
    _check_ring_reserve(proposer, model)
    return Speculative(_draft_in_cache_dtype(proposer, model), sampler)


def _draft_in_cache_dtype(proposer: AbstractProposer, model: AbstractCausalLM):
    """A `DraftModel` whose draft makes its caches in the target's `kv_cache_dtype` (every
    cache of a call has one dtype); a draft that cannot choose (no `kv_cache_dtype` field)
    keeps its own. `EarlyExit`'s draft is the target's first layers: its dtype already."""
    if not isinstance(proposer, DraftModel):
        return proposer
    try:
        draft = proposer.draft.with_kv_cache_dtype(model.kv_cache_dtype)
    except ValueError:  # a draft without a `kv_cache_dtype` field
        return proposer
    if draft is proposer.draft:  # already in the target's dtype: the proposer as given
        return proposer
    return eqx.tree_at(lambda p: p.draft, proposer, draft)


def _check_ring_reserve(proposer: AbstractProposer, model: AbstractCausalLM) -> None:
    """Refuse more guesses per step than a sliding-window ring can take back: a ring keeps
    `sliding_window + RING_RESERVE` slots (`KVCache`), and the rejected guesses of a step
    overwrite the oldest ones, which are still in the window when more than `RING_RESERVE`
    guesses are written (the target's cache, and a draft model's own)."""
    models = [("the target", model)]
    if isinstance(proposer, DraftModel):
        models.append(("the draft model", proposer.draft))
    if proposer.num_tokens <= RING_RESERVE:
        return
    for who, m in models:
        # shapes only (no buffers): the cache's layout says whether its model keeps rings
        if jax.eval_shape(lambda m=m: m.init_cache(1, 1 << 16)).ring_layers:
            raise ValueError(
                f"{type(proposer).__name__}(num_tokens={proposer.num_tokens}) guesses more "
                f"tokens per step than {who}'s sliding-window rings can take back "
                f"(RING_RESERVE = {RING_RESERVE}); use num_tokens <= {RING_RESERVE}"
            )
