"""Preemption over the paged KV cache (`Engine(block_size=..., preemption=True)`, the default;
vLLM's recompute preemption, Kwon et al. 2023 §4.5, and its v1 scheduler,
`vllm/v1/core/sched/scheduler.py`): the host side that decides, before each dispatch, which
requests give their blocks back (`Preemptor`, one per `serving.paged.PagedKV`).

The allocator runs `on_demand`: a request is admitted when its prompt's blocks and one dispatch
of growth fit beside the next dispatch of every request already holding blocks
(`BlockAllocator.headroom`), and takes its decode blocks as it grows. Before each dispatch the
host knows how many positions every busy slot may write (`num_steps x tokens_per_step`);
`Preemptor.make_room` extends each busy slot's table by that many, oldest admission first, and
when the pool has too few blocks it preempts the most recently admitted request (LIFO, the
requesting slot itself last): its full blocks, generated ones included, are registered in the
prefix cache (`register_tokens`) and all its blocks freed, its slot marked idle, and a
`Preemption` hands back the `Request` to queue again at the FRONT: its prompt followed by the
tokens it had generated, with a `Resume` (how many were generated, the slot's PRNG key, its
automaton state). Readmitted, it is prefilled over those tokens (the blocks still cached are
taken back by reference, so often only the last partial block is recomputed) and continues as
it would have: its prompt length, generation count (`max_new_tokens`, the penalties' generated
tokens, the step keys `fold_in(key, n)`) and constraint state are the slot's. The oldest
request is never preempted while another holds blocks, and alone it fits
(`PagedKV.check_fits`), so every request completes. The decision is host work between
dispatches; no program changes (the only program here, `Preemptor.read_slot`, reads one
slot's row).
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, UInt32

from .paged import PagedDecodeState, PagedKV
from .programs import free_jit
from .slots import Request, Resume


@dataclasses.dataclass(frozen=True)
class Preemption:
    """A request `Preemptor.make_room` preempted to free its blocks (see the module docstring).

    **Attributes:** `slot` (now free: its blocks are back, and it is idle in the decode state);
    `request`: what to queue again, at the front, and admit, prefill and insert as any request
    (for a request that had started decoding: its prompt followed by its `resume.generated`
    tokens, with the `Resume`; for one preempted before its `insert`: the request it was
    admitted with, whose prefill is abandoned); `prefilling`: `True` for the latter."""

    slot: int
    request: Request
    prefilling: bool


class Preemptor:
    """The preemption of one `PagedKV` (its `preemption` on): `make_room` before each dispatch,
    `preempt` for one slot. `Engine` makes one beside its `paged` (`Engine.preemptor`).

    **Arguments:** `paged`, the `PagedKV` whose allocator, admissions and counters it works
    on (its `preemptions` counts the requests preempted here)."""

    def __init__(self, paged: PagedKV):
        self.paged = paged
        """The paged KV cache this preempts in."""
        self._read_jit = None

    def read_slot(
        self, state: PagedDecodeState, slot: Int[Array, ""]
    ) -> tuple[
        Int[Array, " max_len"],
        Int[Array, ""],
        Int[Array, ""],
        UInt32[Array, " key"],
        Int[Array, ""],
    ]:
        """What `preempt` reads of a decoding `slot` of `state`, in ONE compiled program (jitted
        per `Preemptor` on first use; `Engine.precompile` compiles it).

        **Arguments:** `state`, the decode state (not donated); `slot`, an `int32` scalar.

        **Returns:** `(token_ids, length, written, key_data, automaton)`, device arrays:
        `token_ids: Int[Array, " max_len"]` (int32), the slot's row of the state's tokens (its
        prompt and generated tokens in the first `length`, padding after); `length`, `written`:
        `int32` scalars, the tokens the slot holds and the positions whose keys and values are
        in its blocks (`PagedKV.written`: `length`, or `length - pending` under speculation);
        `key_data: UInt32[Array, " key"]`, the slot's PRNG key as `jax.random.key_data` gives
        it (`uint32[2]` for the default threefry key); `automaton`: `int32` scalar, the slot's
        constraint automaton state (`processor_states[0]`; `INITIAL` when unconstrained)."""
        if self._read_jit is None:
            paged = self.paged

            def read(state, slot):
                gen = state.generation
                return (
                    gen.token_ids[slot],
                    gen.length[slot],
                    paged.written(gen)[slot],
                    jax.random.key_data(gen.key[slot]),
                    gen.processor_states[0][slot],
                )

            self._read_jit = eqx.filter_jit(read)
        return self._read_jit(state, slot)

    def make_room(
        self, state: PagedDecodeState, num_tokens: int
    ) -> tuple[PagedDecodeState, list[Preemption]]:
        """Before a dispatch: every busy slot's blocks extended to cover `num_tokens` positions
        past its length, oldest admission first; when the pool cannot give a slot its blocks,
        the most recently admitted live request (busy, or admitted and not yet inserted) is
        preempted (`preempt`), until it can, or until the slot itself was preempted (vLLM's v1
        scheduler). Host work; while the free and cached blocks cover
        `BlockAllocator.headroom(num_tokens)` (one dispatch of every live slot: a slot grows at
        most `num_tokens` per dispatch, so its blocks already cover its length) nothing is read
        and `PagedKV.grow` extends the slots; otherwise one small transfer of the slots'
        lengths, plus one per preempted slot. `state` is donated when a slot is freed.

        **Returns:** `(state, preemptions)`, the preempted requests newest first (queue each
        again at the front in this order: the oldest ends up first)."""
        paged = self.paged
        if not paged.preemption:
            return state, []
        if paged.allocator.headroom(num_tokens) <= paged.allocator.available:
            return state, []  # every live slot's next dispatch fits: `grow` takes the blocks
        gen = state.generation
        length, done = jax.device_get((gen.length, gen.done))
        live = sorted(paged.admissions, key=paged.order.__getitem__)  # oldest first
        busy = [s for s in live if s in paged.inserted and not done[s]]
        preempted: list[Preemption] = []
        gone: set[int] = set()
        # candidates: live requests not finished (a finished one is released by its caller)
        candidates = [s for s in live if s not in paged.inserted or not done[s]]
        for slot in busy:
            if slot in gone:
                continue
            while not paged.allocator.extend(slot, int(length[slot]) + num_tokens):
                victim = next(s for s in reversed(candidates) if s not in gone)  # the newest
                preempted.append(self.preempt(state, victim))
                gone.add(victim)
                if victim == slot:
                    break
        for p in preempted:
            if not p.prefilling:
                state = free_jit(state, jnp.asarray(p.slot, jnp.int32))
        return state, preempted

    def preempt(self, state: PagedDecodeState, slot: int) -> Preemption:
        """Preempt the request in `slot`: for a decoding one, read its tokens, key and automaton
        state from `state` (`read_slot`, one small transfer) and register its full written
        blocks in the prefix cache; then free its blocks (`PagedKV.release`), counted in
        `PagedKV.preemptions`. The slot is not marked idle in `state` (`make_room` frees it)."""
        paged = self.paged
        request = paged.requests[slot]
        prefilling = slot not in paged.inserted
        if not prefilling:
            gen = state.generation
            read = jax.device_get(self.read_slot(state, jnp.asarray(slot, jnp.int32)))
            row, length, written, key, automaton = read
            tokens = tuple(int(t) for t in row[: int(length)])
            paged.allocator.register_tokens(slot, tokens[: int(written)])
            resume = Resume(
                generated=len(tokens) - request.prompt_length,
                key_data=tuple(int(x) for x in np.ravel(key)),
                key_impl=str(jax.random.key_impl(gen.key)),
                constraint_state=int(automaton),
            )
            request = dataclasses.replace(request, token_ids=tokens, resume=resume)
        paged.release(slot)
        paged.preemptions += 1
        return Preemption(slot, request, prefilling)
