"""Preemption in the paged serving engine (`Engine(block_size=..., preemption=True)`, the
default: vLLM's recompute preemption). The host allocator on demand (`BlockAllocator(
on_demand=True)`) under random traces that preempt, and the engine on test_lockstep's tiny
random Gemma 3 with a pool too small for its requests' worst cases but large enough for their
prompts: requests are preempted (counted), queued again with the tokens they had generated,
recomputed, and every request's tokens (and logprobs) equal `fg.generate` alone, greedy,
seeded sampling and penalties over generated tokens; no block leaks."""

import asyncio
import random

import jax
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.serving.blocks import BlockAllocator
from functional_gen.serving.slots import request_processors

from ..helpers import without_runtime_type_checks
from .test_lockstep import VOCAB, prompt, tiny_gemma  # noqa: F401 (a fixture)
from .test_paged import BLOCK, N

# ---- the allocator on demand (pure Python) ----------------------------------------------------


def test_on_demand_admission_keeps_one_dispatch_of_room_and_extension_fails_cleanly():
    """Hand-checked, blocks of 2: an admission takes only its prompt's blocks and needs room
    for them plus one dispatch (`lookahead`) beside one dispatch of every live slot
    (`headroom`); an extension the pool cannot give returns `False` and takes nothing;
    `register_tokens` keeps a preempted slot's full blocks, generated ones included, as
    prefix-cache hits for its readmission over the same tokens."""
    alloc = BlockAllocator(6, 2, max_slots=3, max_blocks_per_slot=6, on_demand=True)
    a = alloc.admit(0, [1, 2, 3], max_tokens=12, lookahead=2)
    assert a.cached_tokens == 0 and alloc.blocks_in_use == 2  # the prompt's 2 blocks only
    assert alloc.available == 4 and alloc.headroom(2) == 1
    # 5 tokens + 2 = 4 blocks, and 1 more for slot 0's next dispatch: 4 + 1 > 4
    assert alloc.admit(1, [4, 5, 6, 7, 8], max_tokens=12, lookahead=2) is None
    b = alloc.admit(1, [4, 5], max_tokens=12, lookahead=2)  # 2 blocks + 1 headroom <= 4
    assert b is not None and alloc.blocks_in_use == 3
    assert alloc.extend(0, 7) and alloc.blocks_in_use == 5  # 4 blocks for 7 positions
    assert alloc.extend(1, 4) and alloc.available == 0
    before = alloc.block_tables.copy()
    assert not alloc.extend(0, 9)  # a fifth block: none free
    assert np.array_equal(alloc.block_tables, before)
    alloc.check()
    # slot 1 preempted after 2 generated tokens: its 2 full blocks registered, then freed
    # last block first, so that its tail is evicted before its head
    alloc.register_tokens(1, [4, 5, 7, 8])
    head, tail = alloc.block_tables[1, :2].tolist()
    alloc.free(1)
    assert alloc.cached_blocks == 2 and alloc.extend(0, 9)  # one evicted for slot 0: the tail
    assert alloc.block_tables[0, 4] == tail
    assert alloc.admit(1, [4, 5, 7, 8, 9], max_tokens=12, lookahead=0) is None  # full
    alloc.free(0)
    resumed = alloc.admit(1, [4, 5, 7, 8, 9], max_tokens=12, lookahead=0)
    assert resumed.cached_tokens == 2 and alloc.block_tables[1, 0] == head  # a hit
    alloc.check()
    alloc.free(1)
    alloc.check()
    assert alloc.blocks_in_use == 0 and alloc.available == alloc.num_blocks


def _preempting_trace(seed: int, num_blocks=12, block_size=4, slots=4, lookahead=3):
    """A scheduler over an on-demand allocator, as `Preemptor.make_room` and the orchestrator
    run it: random arrivals (prompts from a few shared prefixes) admitted first come first served,
    each dispatch growing every running request by up to `lookahead` tokens, oldest admission
    first; a request that cannot get its blocks makes the most recently admitted one be
    preempted (its written full blocks registered, freed, queued again at the front with its
    tokens). Checks the invariants after every operation, and that no dispatch right after an
    admission preempts (the admission kept room for it). **Returns:** `(allocator,
    preemptions, completed, requests)`."""
    rng = random.Random(seed)
    alloc = BlockAllocator(num_blocks, block_size, slots, 8, on_demand=True)
    prefixes = [[rng.randrange(50) for _ in range(2 * block_size)] for _ in range(3)]
    pending = []  # (arrival step, prompt, total tokens)
    for _ in range(30):
        shared = rng.choice(prefixes)[: rng.randrange(0, 2 * block_size + 1)]
        tokens = shared + [rng.randrange(50) for _ in range(rng.randrange(1, 2 * block_size))]
        total = min(len(tokens) + rng.randrange(1, 5 * block_size), 8 * block_size)
        pending.append((rng.randrange(0, 60), tokens, total))
    pending.sort(key=lambda r: r[0])
    queue: list[list] = []  # [tokens so far, total]
    running: dict[int, list] = {}  # slot -> [tokens so far, total, admission number]
    preemptions = completed = admitted = 0
    for step in range(2000):
        while pending and pending[0][0] <= step:
            _, tokens, total = pending.pop(0)
            queue.append([list(tokens), total])
        admitted_now = False
        while queue and len(running) < slots:
            slot = min(set(range(slots)) - set(running))
            tokens, total = queue[0]
            got = alloc.admit(slot, tokens, total, lookahead=lookahead)
            if got is None:
                assert running, "the pool is empty and the head of the queue does not fit"
                break
            alloc.register(got)
            running[slot] = [*queue.pop(0), admitted]
            admitted += 1
            admitted_now = True
            alloc.check()
        order = sorted(running, key=lambda s: running[s][2])
        gone = set()
        for slot in order:  # make_room
            if slot in gone:
                continue
            while not alloc.extend(slot, len(running[slot][0]) + lookahead):
                assert not admitted_now, "an admission forced a preemption at once"
                victim = next(s for s in reversed(order) if s not in gone)
                alloc.register_tokens(victim, running[victim][0])
                alloc.free(victim)
                gone.add(victim)
                preemptions += 1
                alloc.check()
                if victim == slot:
                    break
        for victim in sorted(gone, key=lambda s: -running[s][2]):  # newest first, to the front
            queue.insert(0, running.pop(victim)[:2])
        for slot in list(running):  # the dispatch: every request writes up to `lookahead`
            tokens, total = running[slot][:2]
            tokens += [rng.randrange(50) for _ in range(min(lookahead, total - len(tokens)))]
            assert alloc.blocks_needed(len(tokens)) <= int(np.sum(alloc.block_tables[slot] >= 0))
            if len(tokens) == total or rng.random() < 0.02:  # its length, or an early EOS
                alloc.free(slot)
                del running[slot]
                completed += 1
        alloc.check()
        if not (pending or queue or running):
            break
    return alloc, preemptions, completed, 30


@pytest.mark.parametrize("seed", range(6))
def test_on_demand_random_traces_preempt_complete_and_keep_every_block_accounted(seed):
    """Random traces on demand: preemptions happen, never in the dispatch right after an
    admission, the invariants hold after every operation, the queue's head is never stuck while nothing runs, every request completes
    however often it was preempted, and after the run no block is referenced."""
    alloc, preemptions, completed, requests = _preempting_trace(seed)
    assert preemptions > 0 and completed == requests
    assert alloc.blocks_in_use == 0 and not alloc.ref_counts.any()
    assert alloc.available == alloc.num_blocks


# ---- the engine on a tiny random Gemma 3 ------------------------------------------------------

NUM_BLOCKS = 10  # 80 positions: 3 prompts of 11-15 tokens fit, 3 worst cases (32-36) do not


@pytest.fixture(scope="module")
def engine(request):
    """A paged engine on test_lockstep's `tiny_gemma`: 3 slots of 64 tokens, blocks of 8, a pool
    of `NUM_BLOCKS`, preemption on (the default)."""
    model, tokenizer = request.getfixturevalue("tiny_gemma")
    engine = fg.serving.Engine(
        model, tokenizer, max_slots=3, max_len=64, block_size=BLOCK, num_blocks=NUM_BLOCKS
    )
    assert engine.preemption
    return engine


def reference(model, tokenizer, request):
    """`fg.generate` of `request` alone with its processors and sampler (`request_processors`,
    the key `jax.random.key(seed)`): its tokens (an EOS included) and raw logprobs."""
    processors, sampler = request_processors(request)
    ids = list(request.token_ids)
    state = fg.SequenceState.from_token_ids([ids], vocab_size=VOCAB, tokenizer=tokenizer)
    out = fg.generate(
        model, tokenizer, state, processors=processors, sampler=sampler,
        key=jax.random.key(request.seed or 0), max_new_tokens=request.max_new_tokens,
        logprobs_mode="raw",
    )  # fmt: skip
    k = int(out.state.arrays.length[0]) - len(ids)
    return [int(t) for t in out.token_ids[0, :k]], np.asarray(out.logprobs[0, :k])


def serve_preempting(engine, schedule, entries=None):
    """Run `schedule` (`(dispatch, request)`: queued before dispatch number `dispatch`) through
    the engine's own calls: queued requests admitted first come first served into free slots
    (the head waits while it does not fit), prefilled, inserted; `make_room` before every
    dispatch, each preempted request queued again at the front with the tokens it had
    generated (checked against those delivered); each slot released when its request ends; the
    allocator checked before and after every dispatch. `entries`: request index -> its
    constraint's `PoolEntry` (`Engine.constraint_entry`), placed after each of its inserts.

    **Returns:** per request its tokens and logprobs, and the `(request index, tokens
    generated)` of every preemption."""
    state = engine.init_decode_state()
    alloc = engine.paged.allocator  # a fresh pool (`init_decode_state`)
    got = {i: ([], []) for i in range(len(schedule))}
    queue: list = []  # (request index, request to admit)
    running: dict[int, int] = {}  # slot -> request index
    preempted = []
    dispatch = 0
    while dispatch <= max(d for d, _ in schedule) or queue or running:
        queue += [(i, r) for i, (d, r) in enumerate(schedule) if d == dispatch]
        while queue and len(running) < engine.max_slots:
            slot = min(set(range(engine.max_slots)) - set(running))
            i, request = queue[0]
            admission = engine.admit(request, slot)
            if admission is None:
                break
            state = engine.insert(engine.prefill(request, admission, state), state, slot)
            if i in (entries or {}):
                state = engine.place(entries[i], state, slot)
            running[slot] = queue.pop(0)[0]
        assert running, "nothing runs and the queue's head cannot be admitted"
        state, preemptions = engine.make_room(state)
        for p in preemptions:  # newest first: the oldest ends up at the front
            i = running.pop(p.slot)
            assert not p.prefilling
            assert list(p.request.token_ids) == [*schedule[i][1].token_ids, *got[i][0]]
            assert p.request.resume.generated == len(got[i][0])
            preempted.append((i, len(got[i][0])))
            queue.insert(0, (i, p.request))
        alloc.check()
        state, out = engine.generate(state)
        for slot, i in list(running.items()):
            for t, lp in zip(out.token_ids[:, slot].tolist(), out.logprobs[:, slot].tolist()):
                if t >= 0:
                    got[i][0].append(t)
                    got[i][1].append(lp)
            if bool(out.done[slot]):
                del running[slot]
                engine.release(slot)
        alloc.check()
        dispatch += 1
    assert alloc.blocks_in_use == 0 and alloc.available == alloc.num_blocks
    return [got[i] for i in range(len(schedule))], preempted


def test_preempted_requests_resume_with_generate_tokens_and_logprobs(engine):
    """Five requests of 11-15 prompt tokens and 21 new ones in a pool of 10 blocks of 8 (three
    worst cases take 13-15): the newest running request is preempted when the others need
    blocks, the one with repetition, presence and frequency penalties and a seeded sampled one
    (top_p too) among them, after generating tokens (so the resumed slot's key, step count and
    generated tokens for the penalties must be the ones it had); a preempted request's blocks
    are taken back from the prefix cache at its readmission; each request's tokens and raw
    logprobs equal `fg.generate` alone."""
    model, tokenizer = engine.model, engine.tokenizer
    penalties = dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3)
    requests = [
        engine.request(prompt(13, 50), N),
        engine.request(prompt(12, 53), N, temperature=0.8, seed=7),
        engine.request(prompt(11, 51), N, **penalties),
        engine.request(prompt(14, 54), N),
        engine.request(prompt(15, 52), N, temperature=0.9, top_p=0.9, seed=7),
    ]
    before = engine.paged.preemptions
    got, preempted = serve_preempting(engine, [(0, r) for r in requests])
    assert engine.paged.preemptions - before == len(preempted)
    assert {i for i, _ in preempted} >= {2, 4}, preempted
    assert all(n > 0 for _, n in preempted)  # each had generated tokens
    assert engine.paged.allocator.prefix_cache_hits > 0  # its own blocks, taken back
    for i, (request, (tokens_, logprobs)) in enumerate(zip(requests, got)):
        want, want_lps = reference(model, tokenizer, request)
        assert len(want) == N and tokens_ == want, i
        np.testing.assert_allclose(logprobs, want_lps, atol=1e-4)


def test_a_preempted_constrained_request_resumes_its_automaton(engine):
    """A regex-constrained request in the constraint pool (at least 10 tokens of `t1`-`t3`),
    the newest of three, is preempted after generating tokens and resumed with its slot's
    automaton state (the state after the tokens it had generated, not the initial one): its
    tokens equal `fg.generate` with `fg.processors.Regex` alone, and they match the regex."""
    model, tokenizer = engine.model, engine.tokenizer
    regex = fg.processors.Regex("(t[1-3] ?){10,40}", tokenizer)
    entry = engine.constraint_entry(regex)
    assert entry is not None  # pooled, not run alone
    requests = [engine.request(prompt(13, 50), N), engine.request(prompt(12, 56), N)]
    constrained = engine.request(prompt(15, 57), N)
    got, preempted = serve_preempting(
        engine, [(0, r) for r in [*requests, constrained]], {2: entry}
    )
    assert 2 in {i for i, n in preempted if n > 0}, preempted
    ids = [constrained.token_ids]
    state = fg.SequenceState.from_token_ids([list(ids[0])], vocab_size=VOCAB, tokenizer=tokenizer)
    out = fg.generate(model, tokenizer, state, processors=[regex], max_new_tokens=N)
    k = int(out.state.arrays.length[0]) - len(ids[0])
    want = [int(t) for t in out.token_ids[0, :k]]
    assert got[2][0] == want and len(want) >= 10
    assert all(t in (1, 2, 3) for t in want if t != VOCAB - 1)
    for i, request in enumerate(requests):
        assert got[i][0] == reference(model, tokenizer, request)[0], i


@pytest.mark.parametrize("seed", range(2))
def test_random_arrivals_with_preemption_equal_generate(engine, seed):
    """Random arrival traces (6 requests of 9-16 prompt tokens, greedy or seeded sampling,
    arriving over the first 6 dispatches) in the small pool: whatever is preempted, each
    request's tokens equal `fg.generate` alone and no block leaks."""
    model, tokenizer = engine.model, engine.tokenizer
    rng = random.Random(seed)
    schedule = []
    for i in range(6):
        sampled = rng.random() < 0.5
        knobs = dict(temperature=0.9, seed=rng.randrange(100)) if sampled else {}
        request = engine.request(prompt(rng.randrange(9, 17), 60 + 10 * seed + i), N, **knobs)
        schedule.append((rng.randrange(6), request))
    got, preempted = serve_preempting(engine, schedule)
    assert preempted
    for i, ((_, request), (tokens_, _)) in enumerate(zip(schedule, got)):
        assert tokens_ == reference(model, tokenizer, request)[0], i


def test_a_request_admitted_and_not_inserted_is_preempted_first(engine):
    """Engine level: two requests decode while a third is admitted (its blocks taken) and not
    yet inserted, as a prefill that spans dispatches is: when the decoding ones need blocks,
    that newest admission is preempted (`prefilling`, its own request handed back unchanged,
    its blocks freed) before either of them; readmitted later, it completes; all three give
    `fg.generate`'s tokens."""
    model, tokenizer = engine.model, engine.tokenizer
    requests = [engine.request(prompt(13, 80), N), engine.request(prompt(11, 81), N)]
    late = engine.request(prompt(15, 82), N)
    state = engine.init_decode_state()
    alloc = engine.paged.allocator
    for slot, request in enumerate(requests):
        state = engine.insert(engine.prefill(request, engine.admit(request, slot)), state, slot)
    admission = engine.admit(late, 2)  # its prefill has not run
    assert admission is not None and alloc.block_tables[2, 1] >= 0
    got = {0: [], 1: [], 2: []}
    preempted = []
    while not preempted:
        state, preempted = engine.make_room(state)
        state, out = engine.generate(state)
        for slot in (0, 1):
            got[slot] += [t for t in out.token_ids[:, slot].tolist() if t >= 0]
        alloc.check()
    (p,) = preempted
    assert p.slot == 2 and p.prefilling and p.request is late
    assert np.all(alloc.block_tables[2] == -1) and 2 not in engine.paged.admissions
    running = {0, 1}
    while running or late is not None:
        if late is not None and (admission := engine.admit(late, 2)) is not None:
            state = engine.insert(engine.prefill(late, admission, state), state, 2)
            running.add(2)
            late = None
        state, preempted = engine.make_room(state)
        assert not preempted  # the two decoding ones fit
        state, out = engine.generate(state)
        for slot in list(running):
            got[slot] += [t for t in out.token_ids[:, slot].tolist() if t >= 0]
            if bool(out.done[slot]):
                running.discard(slot)
                engine.release(slot)
        alloc.check()
    for slot, request in enumerate([*requests, p.request]):
        assert got[slot] == reference(model, tokenizer, request)[0], slot
    assert alloc.blocks_in_use == 0


def test_the_orchestrator_queues_preempted_requests_at_the_front_with_their_stream(engine):
    """`Orchestrator._make_room` (not started; `Engine.make_room` replaced): a decoding victim
    leaves its slot and goes to the front of the queue with its `_Slot` (text, stream) kept in
    its handle and the resumed request to admit; a prefilling victim's prefill is abandoned and
    it goes to the front too; the older victim (the last in the list) ends up first."""
    from functional_gen.serving.orchestrator import Handle, Orchestrator, _Slot
    from functional_gen.serving.preemption import Preemption

    loop = asyncio.new_event_loop()
    try:
        orchestrator = Orchestrator(engine)
        waiting, decoding, prefilling = (
            Handle(engine.request(prompt(5, 90 + i), 4), (), loop) for i in range(3)
        )
        orchestrator._queue.append(waiting)
        host = _Slot(decoding, engine.tokenizer, set(engine.eos_token_id))
        host.push(7, -0.5, [])
        orchestrator._slots[0] = host
        orchestrator._prefilling, orchestrator._paged_slot = (prefilling, iter(())), 1
        resumed = engine.request([*decoding.request.token_ids, 7], 4)
        victims = [Preemption(1, prefilling.request, True), Preemption(0, resumed, False)]
        engine.make_room = lambda state: (state, victims)
        try:
            assert orchestrator._make_room("state") == "state"
        finally:
            del engine.make_room
    finally:
        loop.close()
    assert list(orchestrator._queue) == [decoding, prefilling, waiting]
    assert orchestrator._slots[0] is None and orchestrator._prefilling is None
    assert decoding.host_slot is host and decoding.pending_request is resumed
    assert prefilling.host_slot is None and prefilling.pending_request is prefilling.request
    assert waiting.pending_request is waiting.request
    assert orchestrator.queue_length == 3 and orchestrator.busy_slots == 0


async def events(handle):
    """An orchestrator `Handle`'s events: its token ids (in order), text pieces, and the
    `Finished`."""
    ids, texts = [], []
    async for event in handle.events():
        if isinstance(event, fg.serving.orchestrator.Finished):
            return ids, texts, event
        ids += event.token_ids
        texts.append(event.text)
    raise AssertionError("no Finished event")


def test_orchestrator_preempts_streams_and_stops_without_duplicates(engine):
    """Through the orchestrator (the server's path): five requests at once in the small pool.
    Requests are preempted and queued again at the front, and each stream delivers exactly
    `fg.generate`'s tokens once (none twice, none lost), its pieces concatenating to its
    text, `completion_tokens` counting the tokens before and after a preemption; a stop
    string taken from late in a request's reference text cuts it there as without
    preemption. Afterwards no block is in use."""
    model, tokenizer = engine.model, engine.tokenizer
    requests = [
        engine.request(prompt(13 + i % 3, 70 + i), N, **({"temperature": 0.9, "seed": i} if i % 2 else {}))
        for i in range(5)
    ]  # fmt: skip
    wants = [reference(model, tokenizer, r)[0] for r in requests]
    text = tokenizer.decode(wants[4])
    stop = text[-8:-3]  # late in the text: after a preemption, likely
    cut = text[: text.index(stop)]
    before = engine.paged.preemptions

    async def run():
        loop = asyncio.get_running_loop()
        submit = engine.orchestrator.submit
        handles = [submit(r, (stop,) if i == 4 else (), loop=loop) for i, r in enumerate(requests)]
        return await asyncio.gather(*(events(h) for h in handles))

    try:
        results = asyncio.run(run())
    finally:
        engine.close()
    assert engine.paged.preemptions > before
    for i, ((ids, texts, finished), want) in enumerate(zip(results, wants)):
        if i == 4:
            assert "".join(texts) == finished.text == cut
            assert finished.finish_reason == "stop" and ids == want[: len(ids)]
            continue
        assert ids == want, i
        assert finished.completion_tokens == len(want)
        assert (
            "".join(texts) == finished.text == tokenizer.decode([t for t in want if t != VOCAB - 1])
        )
        assert finished.prompt_tokens == len(requests[i].token_ids)
    engine.paged.allocator.check()
    assert engine.paged.allocator.blocks_in_use == 0


def test_a_request_larger_than_the_pool_is_refused_and_preemption_needs_blocks(engine):
    """A request whose prompt alone (or prompt plus `max_new_tokens`) needs more blocks than the
    pool has is refused when it is made, naming the blocks: it could never run, even alone.
    `preemption` is checked: a bool, and only with a paged cache."""
    model, tokenizer = engine.model, engine.tokenizer
    engine = fg.serving.Engine(
        model, tokenizer, max_slots=2, max_len=64, block_size=8, num_blocks=4
    )
    with pytest.raises(ValueError, match="needs 5 blocks of 8 tokens for 40 positions"):
        engine.request(prompt(39, 1), 1)  # its prompt alone: 39 of the 32 positions
    with pytest.raises(ValueError, match=r"needs 5 blocks .* num_blocks=4"):
        engine.request(prompt(20, 1), 20)
    assert engine.request(prompt(20, 1), 12).max_new_tokens == 12  # 32 positions: 4 blocks
    with pytest.raises(ValueError, match="needs a `block_size`"):
        fg.serving.Engine(model, tokenizer, preemption=True)
    with (
        without_runtime_type_checks(),
        pytest.raises(ValueError, match="`preemption` must be True or False, got 'yes'"),
    ):
        fg.serving.Engine(model, tokenizer, block_size=8, preemption="yes")
