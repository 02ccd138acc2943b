"""Speculative decoding over the paged KV cache (`Engine(block_size=..., speculative=...)`,
`serving.paged_speculative`), on test_engine_speculative's tiny random Llama: every request's
tokens equal `fg.generate` of its prompt alone (greedy: plain greedy decoding; seeded sampling:
`fg.generate` with the same proposer and seed), with requests starting and ending mid-block,
inserted while others run, sharing cached prefix blocks and waiting for blocks; guesses were
verified AND accepted; and after every dispatch the only pool entries that changed are the
positions the slots kept, each holding the keys and values a prefill of the slot's final text
computes (a rejected guess's keys written anywhere fail it)."""

import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg

from .test_engine_speculative import PROPOSERS, alone, repetitive, tiny  # noqa: F401 (a fixture)
from .test_paged import tokens

BLOCK = 4
MAX_NEW = 16  # test_engine_speculative's: its references compile once for both files
MAX_LEN = 48


@pytest.fixture(scope="module")
def llama(request):
    """test_engine_speculative's `tiny`: a random 2-layer Llama and a word-level tokenizer."""
    return request.getfixturevalue("tiny")


def speculating_engine(llama, proposer: str, **kwargs):
    """A paged engine of 3 slots of `MAX_LEN` tokens in blocks of `BLOCK`, speculating with
    test_engine_speculative's `PROPOSERS[proposer]`; `kwargs` go to `Engine`. **Returns:**
    `(engine, proposer)`."""
    model, tok = llama
    spec = PROPOSERS[proposer](model)
    engine = fg.serving.Engine(
        model, tok, max_slots=3, max_len=MAX_LEN, block_size=BLOCK, speculative=spec, **kwargs
    )
    return engine, spec


def written(state):
    """Per slot the positions whose keys and values are in its blocks (`length - pending`: the
    last token is not while it is pending), host numpy (read for busy slots only)."""
    gen = state.generation
    length, pending = jax.device_get((gen.length, gen.search_state.pending))
    return length - pending


def pools(state):
    """The keys' and values' pools of every layer, host numpy `[layers * 2, kv_heads, blocks,
    block_size, head_dim]`."""
    return np.stack(jax.device_get([*state.paged.k, *state.paged.v]))


def serve(engine, schedule):
    """Run `schedule` (`(dispatch, request)`: queued before dispatch number `dispatch`) until
    every request is done: queued requests are admitted first come first served into free
    slots (one that gets no blocks waits, and so do those behind it), prefilled, inserted;
    each slot's blocks are released when its request ends and the allocator is checked after
    every dispatch. With preemption (`Engine.preemption`, the default) `make_room` runs before
    every dispatch and each preempted request is queued again at the front with the tokens it
    had generated (checked against those delivered).

    After every dispatch, the pool entries that changed must be those of positions the busy
    slots kept in it (`[written before, written after)` through their tables): each such entry
    is recorded and compared at the end with the keys and values of a prefill of its request's
    final text.

    **Returns:** per request its tokens, the guesses verified and accepted over the run, the
    admissions that waited, and the index of each preempted request."""
    state = engine.init_decode_state()
    alloc = engine.paged.allocator  # a fresh pool (`init_decode_state`)
    got = {i: [] for i in range(len(schedule))}
    queue: list[int] = []
    running: dict[int, int] = {}  # slot -> request index
    kept: dict[int, list] = {i: [] for i in range(len(schedule))}  # (position, entry values)
    resumed: dict[int, object] = {}  # request index -> the request a preemption gave back
    preempted: list[int] = []  # the index of each preempted request
    verified = accepted = waits = dispatch = 0
    while dispatch <= max(d for d, _ in schedule) or queue or running:
        queue += [i for i, (d, _) in enumerate(schedule) if d == dispatch]
        while queue and len(running) < engine.max_slots:
            slot = min(set(range(engine.max_slots)) - set(running))
            request = resumed.get(queue[0], schedule[queue[0]][1])
            admission = engine.admit(request, slot)
            if admission is None:
                waits += 1
                break
            state = engine.insert(engine.prefill(request, admission, state), state, slot)
            running[slot] = queue.pop(0)
        assert running, "nothing runs and the queue's head cannot be admitted"
        state, preemptions = engine.make_room(state)
        for p in preemptions:  # newest first: the oldest ends up at the front
            i = running.pop(p.slot)
            assert list(p.request.token_ids) == [*schedule[i][1].token_ids, *got[i]]
            resumed[i] = p.request
            queue.insert(0, i)
            preempted.append(i)
        before, pool_before = written(state), pools(state)
        state, out = engine.generate(state)
        after, pool_after = written(state), pools(state)
        tables = alloc.block_tables
        allowed = np.zeros(pool_after.shape[2:4], bool)  # [blocks, block_size]
        for slot, i in running.items():
            for p in range(before[slot], after[slot]):
                block, offset = tables[slot, p // BLOCK], p % BLOCK
                allowed[block, offset] = True
                kept[i].append((p, pool_after[:, :, block, offset]))
        changed = np.any(pool_after != pool_before, axis=(0, 1, 4))
        assert not np.any(changed & ~allowed), np.argwhere(changed & ~allowed)
        verified += int(np.sum(out.verified))
        accepted += int(np.sum(out.accepted))
        for slot, i in list(running.items()):
            got[i] += [t for t in out.token_ids[:, slot].tolist() if t >= 0]
            if bool(out.done[slot]):
                del running[slot]
                engine.release(slot)
        alloc.check()
        dispatch += 1
    for i, (_, request) in enumerate(schedule):  # the kept keys and values: a prefill's
        text = [*request.token_ids, *got[i]]
        ids = np.zeros((1, MAX_LEN), np.int32)
        ids[0, : len(text)] = text
        positions = np.where(np.arange(MAX_LEN) < len(text), np.arange(MAX_LEN), -1)[None]
        _, cache = engine.model.prefill(
            jnp.asarray(ids), jnp.asarray(positions, jnp.int32), max_len=MAX_LEN
        )
        reference = np.stack(jax.device_get([*cache.k, *cache.v]))[:, 0]  # [L2, kvh, seq, hd]
        assert kept[i], i
        for p, entry in kept[i]:
            np.testing.assert_allclose(entry, reference[:, :, p], atol=1e-4, rtol=1e-4)
    assert alloc.blocks_in_use == 0 and alloc.available == alloc.num_blocks
    return [got[i] for i in range(len(schedule))], verified, accepted, waits, preempted


def test_paged_draft_model_equals_generate_and_writes_only_kept_keys(llama):
    """A draft model (its own contiguous cache, caught up when a request is inserted while others
    run) over blocks of 4 tokens in a pool of 14 (two of these requests at once,
    not three): greedy and seeded sampled requests of 5-14 prompt tokens and 16 new ones
    (starting and ending mid-block), one sharing the first two blocks of a running one
    (prefix-cache hits), one waiting for blocks and inserted while others run: each request's
    tokens equal `fg.generate` alone, guesses were verified and accepted, only kept positions
    were written (each with a prefill's keys and values), and every block is back after the
    run."""
    model, tok = llama
    engine, spec = speculating_engine(llama, "draft_model", num_blocks=14)
    first = repetitive(9, 0)
    sampled = {1: 1, 3: 3}  # request -> seed
    prompts = [first, first[:8] + repetitive(3, 1), repetitive(14, 2), repetitive(7, 3)]
    requests = [
        engine.request(p, MAX_NEW, temperature=0.7 if i in sampled else 0.0, seed=sampled.get(i))
        for i, p in enumerate(prompts)
    ]
    got, verified, accepted, waits, _ = serve(
        engine, [(0, requests[0]), (1, requests[1]), (1, requests[2]), (2, requests[3])]
    )
    assert verified > 0 and accepted > 0, (verified, accepted)
    assert waits > 0 and engine.paged.allocator.prefix_cache_hits == 2
    for i, (request, tokens_) in enumerate(zip(requests, got)):
        if i in sampled:
            kwargs = dict(speculative=spec, do_sample=True, temperature=0.7)
            want = alone(model, tok, request, key=jax.random.key(sampled[i]), **kwargs)
        else:
            want = alone(model, tok, request)
        assert tokens_ == want, i


def test_paged_draft_model_preempts_and_resumes_with_generate_tokens(llama):
    """Preemption under speculation (`preemption=True`, the default): the draft model over a
    pool of 14 blocks of 4, one step per dispatch (a dispatch extends a slot by `write_width` =
    8 positions; with 4 steps a dispatch's 32 would be a request's whole budget, and admission
    alone would keep these requests apart), a greedy request of 32 new tokens (10 blocks) and
    two seeded sampled ones of 16 (6-7 blocks) admitted together: the newer ones are preempted
    when the older need blocks, queued again with their tokens (a pending last token fed by
    the prefill of the resumed text) and recomputed; each request's tokens equal `fg.generate`
    alone (greedy: plain greedy decoding; sampled: with the same proposer and seed), only kept
    positions were written (each with a prefill's keys and values), and every block is
    back."""
    model, tok = llama
    engine, spec = speculating_engine(llama, "draft_model", num_blocks=14, num_steps=1)
    assert engine.paged.lookahead == engine.speculation.write_width == 8
    sampled = {1: 3, 2: 1}  # request -> seed; the sampled prompts of the test above
    requests = [
        engine.request(repetitive(6, 16), 32),
        engine.request(repetitive(7, 3), MAX_NEW, temperature=0.7, seed=3),
        engine.request(repetitive(9, 0)[:8] + repetitive(3, 1), MAX_NEW, temperature=0.7, seed=1),
    ]
    got, verified, _, _, preempted = serve(engine, [(0, r) for r in requests])
    assert 2 in preempted and engine.paged.preemptions == len(preempted) and verified > 0
    for i, (request, tokens_) in enumerate(zip(requests, got)):
        if i in sampled:
            kwargs = dict(speculative=spec, do_sample=True, temperature=0.7)
            want = alone(model, tok, request, key=jax.random.key(sampled[i]), **kwargs)
        else:
            want = alone(model, tok, request)
        assert tokens_ == want, i


def test_paged_prompt_lookup_with_mixed_prefill_through_the_orchestrator(llama):
    """Prompt lookup over blocks of 4, with prompts longer than `prefill_chunk=6` prefilled chunk
    by chunk inside the speculative dispatches (`mixed_prefill`): four greedy requests through
    the orchestrator on 3 slots (the fourth inserted while others run) each get plain greedy
    decoding's tokens alone, chunks rode in dispatches, guesses were verified and accepted, and
    no block is in use after them. (Seeded sampling with prompt lookup accepts next to nothing
    on this tiny model: the draft model's test above covers sampled slots.)"""
    model, tok = llama
    engine, _ = speculating_engine(llama, "prompt_lookup", prefill_chunk=6)
    requests = [engine.request(repetitive(n, i), MAX_NEW) for i, n in enumerate((9, 5, 14, 12))]

    async def run():
        loop = asyncio.get_running_loop()
        handles = [engine.orchestrator.submit(r, loop=loop) for r in requests]
        return await asyncio.gather(*(tokens(h) for h in handles))

    try:
        got = asyncio.run(run())
        orchestrator = engine.orchestrator
        assert orchestrator.verified_tokens > 0 and orchestrator.accepted_tokens > 0
    finally:
        engine.close()
    assert engine.paged.chunks_mixed > 0
    for i, (request, tokens_) in enumerate(zip(requests, got)):
        assert tokens_ == alone(model, tok, request), i
    engine.paged.allocator.check()
    assert engine.paged.allocator.blocks_in_use == 0
