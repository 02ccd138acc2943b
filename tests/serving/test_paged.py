"""The serving engine's paged KV cache (`Engine(block_size=...)`): the host block allocator
(`serving.blocks`, vLLM's block manager with prefix caching) under random traces, and the paged
engine against `fg.generate` alone on a tiny random model."""

import asyncio
import random

import jax
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.serving.blocks import BlockAllocator, block_key

from .test_lockstep import VOCAB, alone, prompt, tiny_gemma  # noqa: F401 (a fixture)


def _trace(seed: int, num_blocks: int, block_size: int, slots: int, max_blocks: int):
    """Random arrivals and finishes over a small pool; prompts drawn from a few shared
    prefixes so the prefix cache is hit, grown step by step like decoding requests. Checks the
    invariants after every operation; returns the allocator."""
    rng = random.Random(seed)
    alloc = BlockAllocator(num_blocks, block_size, slots, max_blocks)
    prefixes = [[rng.randrange(50) for _ in range(3 * block_size)] for _ in range(3)]
    live: dict[int, list[int]] = {}  # slot -> [tokens written, max_tokens]
    waited = admitted = 0
    for _ in range(300):
        free_slots = [s for s in range(slots) if s not in live]
        if free_slots and rng.random() < 0.5:
            slot = rng.choice(free_slots)
            shared = rng.choice(prefixes)[: rng.randrange(0, 3 * block_size + 1)]
            prompt = shared + [rng.randrange(50) for _ in range(rng.randrange(1, 2 * block_size))]
            max_tokens = min(
                len(prompt) + rng.randrange(1, 3 * block_size), max_blocks * block_size
            )
            if len(prompt) > max_tokens:
                continue
            before = alloc.blocks_in_use, alloc.available
            got = alloc.admit(slot, prompt, max_tokens)
            if got is None:
                waited += 1
                assert (alloc.blocks_in_use, alloc.available) == before  # nothing changed
            else:
                admitted += 1
                assert got.cached_tokens % block_size == 0 and got.cached_tokens < len(prompt)
                table = alloc.block_tables[slot]
                assert np.all(table[: alloc.blocks_needed(len(prompt))] >= 0)
                alloc.register(got)
                live[slot] = [len(prompt), max_tokens]
        elif live:
            slot = rng.choice(sorted(live))
            if rng.random() < 0.3:
                alloc.free(slot)
                del live[slot]
            else:  # a dispatch of a few decode steps
                written, cap = live[slot]
                live[slot][0] = min(written + rng.randrange(1, 6), cap)
                alloc.extend(slot, live[slot][0])
                held = int(np.sum(alloc.block_tables[slot] >= 0))
                assert held == alloc.blocks_needed(live[slot][0])  # never refused: reserved
        alloc.check()
    for slot in list(live):
        alloc.free(slot)
    alloc.check()
    return alloc, waited, admitted


@pytest.mark.parametrize("seed", range(6))
def test_allocator_random_traces_keep_every_block_accounted(seed):
    """Random arrival/finish traces: reference counts equal the table entries, a block is in
    two live tables only as a registered prefix, admissions that do not fit wait without
    changing anything, and after every request finished no block is referenced: each is free
    or cached with count 0."""
    alloc, waited, admitted = _trace(seed, num_blocks=12, block_size=4, slots=4, max_blocks=8)
    assert admitted > 10 and waited > 0  # the pool was full at times
    assert alloc.blocks_in_use == 0 and not alloc.ref_counts.any()
    assert alloc.available == alloc.num_blocks
    assert alloc.prefix_cache_hits > 0


def test_prefix_blocks_are_shared_counted_and_evicted_least_recently_used():
    """Hand-checked: two prompts with the same first two blocks share them (count 2, two hits);
    the prompt's last token is never taken from the cache; freed prefix blocks stay cached and
    are evicted oldest first when the free list runs out."""
    alloc = BlockAllocator(num_blocks=6, block_size=2, max_slots=3, max_blocks_per_slot=4)
    a = alloc.admit(0, [1, 2, 3, 4, 5], max_tokens=6)  # blocks for 3 positions pairs
    assert a.cached_tokens == 0 and len(a.keys) == 2
    assert a.keys[1] == block_key(block_key(None, [1, 2]), [3, 4])
    alloc.register(a)
    b = alloc.admit(1, [1, 2, 3, 4, 9], max_tokens=5)
    assert b.cached_tokens == 4 and alloc.prefix_cache_hits == 2
    assert list(alloc.block_tables[1, :2]) == list(alloc.block_tables[0, :2])
    assert list(alloc.ref_counts[alloc.block_tables[0, :2]]) == [2, 2]
    c = alloc.admit(2, [1, 2, 3, 4], max_tokens=4)  # whole prompt cached: last block computed
    assert c.cached_tokens == 2
    alloc.check()
    for slot in range(3):
        alloc.free(slot)
    alloc.check()
    assert alloc.cached_blocks == 2 and alloc.blocks_in_use == 0
    # six fresh blocks: the four free ones, then the two cached ones, oldest first
    first, second = (alloc._block_of[k] for k in a.keys)
    d = alloc.admit(0, [7] * 8, max_tokens=8)
    assert d.cached_tokens == 0
    alloc.extend(0, 8)
    assert alloc.cached_blocks == 2  # 4 blocks came from the free list
    e = alloc.admit(1, [8] * 3, max_tokens=4)
    alloc.extend(1, 4)
    assert set(alloc.block_tables[1, :2].tolist()) == {first, second}  # both evicted
    assert alloc.cached_blocks == 0
    assert alloc.admit(2, [1, 2, 3, 4, 5], max_tokens=6) is None  # full: waits
    assert e.cached_tokens == 0
    alloc.check()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 4, 1, 1), "num_blocks"),
        ((4, 0, 1, 1), "block_size"),
        ((4, 4, True, 1), "max_slots"),
    ],
)
def test_allocator_arguments_are_checked(args, match):
    with pytest.raises(ValueError, match=match):
        BlockAllocator(*args)


def test_admission_errors_name_the_value():
    alloc = BlockAllocator(4, 4, 2, 2)
    with pytest.raises(ValueError, match="slot 2"):
        alloc.admit(2, [1], 2)
    with pytest.raises(ValueError, match="max_tokens"):
        alloc.admit(0, [1, 2, 3], 9)
    alloc.admit(0, [1], 2)
    with pytest.raises(ValueError, match="already holds"):
        alloc.admit(0, [1], 2)


# ---- the paged engine on a tiny random Gemma 3 (sliding window 8, its rings crossed) ---------

BLOCK = 8


@pytest.fixture(scope="module")
def paged(request):
    """One paged engine for the module, on test_lockstep's `tiny_gemma`: 3 slots of 64 tokens,
    blocks of 8, a pool of 14 blocks (fewer than the 24 that three full slots would take)."""
    model, tokenizer = request.getfixturevalue("tiny_gemma")
    return fg.serving.Engine(
        model, tokenizer, max_slots=3, max_len=64, block_size=BLOCK, num_blocks=14
    )


def sampled_alone(model, tokenizer, ids, n, temperature, seed):
    """`fg.generate`'s tokens for `ids` alone, sampled at `temperature` with `key(seed)`."""
    state = fg.SequenceState.from_token_ids([ids], vocab_size=VOCAB, tokenizer=tokenizer)
    out = fg.generate(model, tokenizer, state, max_new_tokens=n, temperature=temperature,
                      do_sample=True, key=jax.random.key(seed))  # fmt: skip
    k = int(out.state.arrays.length[0]) - len(ids)
    return [int(t) for t in out.token_ids[0, :k]]


def serve_paged(engine, schedule, on_dispatch=lambda: None):
    """Run `schedule` (`(dispatch, slot, request)`: admit, prefill and insert `request` into
    `slot` before dispatch number `dispatch`) until every request is done, releasing each slot's
    blocks when it finishes and checking the allocator after every dispatch (then calling
    `on_dispatch()`); per request its tokens."""
    state = engine.init_decode_state()
    got: dict[int, list[int]] = {i: [] for i in range(len(schedule))}
    running: dict[int, int] = {}
    dispatch = 0
    while dispatch <= max(d for d, _, _ in schedule) or running:
        for i, (d, slot, request) in enumerate(schedule):
            if d == dispatch:
                admission = engine.admit(request, slot)
                assert admission is not None
                state = engine.insert(engine.prefill(request, admission, state), state, slot)
                running[slot] = i
        state, out = engine.generate(state)
        for slot, i in list(running.items()):
            got[i] += [t for t in out.token_ids[:, slot].tolist() if t >= 0]
            if bool(out.done[slot]):
                del running[slot]
                engine.release(slot)
        engine.paged.allocator.check()
        on_dispatch()
        dispatch += 1
    return [got[i] for i in range(len(schedule))]


async def tokens(handle):
    """Every token id of an orchestrator `Handle`'s events, in order."""
    ids = []
    async for event in handle.events():
        ids += getattr(event, "token_ids", [])
    return ids


N = 21  # new tokens of every greedy request: one compiled `fg.generate` for the references


def test_paged_engine_equals_generate_across_blocks(paged):
    """Requests starting and ending mid-block (prompts of 11-15 tokens, 21 new tokens, blocks
    of 8), arriving at different dispatches, one into a slot freed by another, greedy and
    seeded sampling: every request's tokens equal `fg.generate` alone; the allocator's
    invariants hold after every dispatch, and after the run no block is referenced."""
    engine = paged
    model, tokenizer = engine.model, engine.tokenizer
    prompts = [prompt(11, 1), prompt(13, 2), prompt(15, 3), prompt(12, 4)]
    requests = [
        engine.request(prompts[0], N),
        engine.request(prompts[1], N, temperature=0.9, seed=5),
        engine.request(prompts[2], N),
        engine.request(prompts[3], N),
    ]
    got = serve_paged(engine, [(0, 0, requests[0]), (1, 1, requests[1]), (2, 2, requests[2]),
                               (7, 0, requests[3])])  # fmt: skip
    assert got[1] == sampled_alone(model, tokenizer, prompts[1], N, 0.9, 5)
    for i in (0, 2, 3):
        assert got[i] == alone(model, tokenizer, prompts[i], N)[0], i
    assert all(len(g) > BLOCK for g in got)  # every request crossed blocks while decoding
    alloc = engine.paged.allocator
    assert alloc.blocks_in_use == 0 and alloc.available == alloc.num_blocks


def test_prefix_cache_hits_give_the_cold_tokens_and_skip_their_prefill(paged):
    """Three prompts sharing their first block (8 tokens): the second and third (the first
    again) arrive while the first decodes, share its block (counted as hits, reference count
    3), prefill only their tokens after it, and give `fg.generate`'s cold tokens."""
    engine = paged
    model, tokenizer = engine.model, engine.tokenizer
    shared = prompt(BLOCK, 9)
    prompts = [shared + prompt(5, 10), shared + prompt(7, 11), shared + prompt(5, 10)]
    requests = [engine.request(p, N) for p in prompts]
    prefilled = engine.paged.prefilled_tokens
    seen = []  # the largest reference count after each dispatch
    got = serve_paged(
        engine,
        [(0, 0, requests[0]), (1, 1, requests[1]), (1, 2, requests[2])],
        lambda: seen.append(int(engine.paged.allocator.ref_counts.max())),
    )
    alloc = engine.paged.allocator  # serve_paged's fresh pool: nothing cached before
    assert alloc.prefix_cache_hits == 2 and max(seen) == 3
    assert engine.paged.prefilled_tokens - prefilled == 13 + 7 + 5  # not 13 + 15 + 13
    for p, g in zip(prompts, got):
        assert g == alone(model, tokenizer, p, N)[0]
    assert alloc.blocks_in_use == 0


def test_a_finished_request_leaves_its_generated_blocks_in_the_prefix_cache(paged):
    """A conversation's next turn through the orchestrator: request A (6-token prompt, 21 new
    tokens) finishes; its full blocks of written tokens (prompt and generated, all but the last
    token: 26 positions = 3 blocks of 8) stay cached, so request B, whose prompt is A's prompt,
    A's answer and 3 more tokens (30), takes those 3 blocks (the prompt alone fills none) and
    prefills only its last 6 tokens; B's tokens equal `fg.generate`'s cold ones."""
    model, tokenizer = paged.model, paged.tokenizer
    engine = fg.serving.Engine(  # `paged`'s shapes: its compiled programs
        model, tokenizer, max_slots=3, max_len=64, block_size=BLOCK, num_blocks=14
    )
    first = prompt(6, 30)
    answer = alone(model, tokenizer, first, N)[0]
    assert len(answer) == N  # no EOS: the answer runs 21 positions past the prompt
    follow = first + answer + prompt(3, 31)

    async def run():
        loop = asyncio.get_running_loop()
        got = await tokens(engine.orchestrator.submit(engine.request(first, N), loop=loop))
        hits, prefilled = engine.paged.allocator.prefix_cache_hits, engine.paged.prefilled_tokens
        second = await tokens(engine.orchestrator.submit(engine.request(follow, N), loop=loop))
        return (
            got,
            second,
            engine.paged.allocator.prefix_cache_hits - hits,
            (engine.paged.prefilled_tokens - prefilled),
        )

    try:
        got, second, hits, prefilled = asyncio.run(run())
    finally:
        engine.close()
    assert got == answer
    assert hits == (len(first) + N - 1) // BLOCK == 3
    assert prefilled == len(follow) - 3 * BLOCK == 6
    assert second == alone(model, tokenizer, follow, N)[0]
    engine.paged.allocator.check()
    assert engine.paged.allocator.blocks_in_use == 0


def test_a_plan_that_reads_blocks_in_place_decodes_without_a_gather(paged, monkeypatch):
    """Under `paged_attention="pallas_interpret"` (the GPU plan's Pallas paged-attention kernel,
    interpreted on the CPU; the tiny Gemma 3's global layer runs it, its sliding layers gather
    per layer) the engine hands the model its pools and tables (`paged_decode`): its decode
    dispatches call the engine's `gather` not once (so one decode program, not one per gather
    bucket), and greedy and seeded requests across
    blocks, one arriving mid-run, equal `fg.generate` alone (CPU plan)."""
    from functional_gen.serving import paged as paged_module

    model = paged.model.with_plan(paged.model.plan.replace(paged_attention="pallas_interpret"))
    assert model.paged_decode and not paged.model.paged_decode
    engine = fg.serving.Engine(
        model, paged.tokenizer, max_slots=3, max_len=64, block_size=BLOCK, num_blocks=14
    )
    assert engine.paged.gather_buckets == (8,) != paged.paged.gather_buckets  # one program
    calls = []
    original = paged_module.gather

    def counted(*args, **kwargs):
        calls.append(args[1].shape)
        return original(*args, **kwargs)

    prompts = [prompt(11, 1), prompt(13, 2), prompt(12, 4)]
    requests = [engine.request(prompts[0], N), engine.request(prompts[1], N, temperature=0.9,
                seed=5), engine.request(prompts[2], N)]  # fmt: skip
    monkeypatch.setattr(paged_module, "gather", counted)
    got = serve_paged(engine, [(0, 0, requests[0]), (0, 1, requests[1]), (2, 2, requests[2])])
    assert not calls  # prompts prefilled cold (no cached prefix): nothing gathers
    model, tokenizer = paged.model, paged.tokenizer
    assert got[1] == sampled_alone(model, tokenizer, prompts[1], N, 0.9, 5)
    for i in (0, 2):
        assert got[i] == alone(model, tokenizer, prompts[i], N)[0], i
    assert all(len(g) > BLOCK for g in got)


def test_an_admission_waits_for_blocks_and_completes(paged):
    """Without preemption (`Engine(preemption=False)`: each admission reserves its worst case),
    through the orchestrator: four concurrent requests of 5 blocks each (13-15 + 21 tokens) in
    a pool of 14 blocks: never more than two hold blocks at once, the others wait in the queue
    (counted in `waits`) and are admitted as blocks return; every request completes with
    `fg.generate`'s tokens. Then a request cancelled after its first tokens gives its blocks
    back: after the next request, none is in use. (tests/serving/test_preemption.py: the
    default, which preempts instead.)"""
    model, tokenizer = paged.model, paged.tokenizer
    engine = fg.serving.Engine(  # `paged`'s shapes: its compiled programs
        model, tokenizer, max_slots=3, max_len=64, block_size=BLOCK, num_blocks=14,
        preemption=False,
    )  # fmt: skip
    assert not engine.preemption
    prompts = [prompt(13 + i % 3, 20 + i) for i in range(4)]
    waits = engine.paged.waits
    live = []  # slots holding blocks at each dispatch
    dispatch = engine.paged.generate

    def spy(*args):
        live.append(int((engine.paged.allocator.block_tables[:, 0] >= 0).sum()))
        return dispatch(*args)

    async def run():
        loop = asyncio.get_running_loop()
        submit = engine.orchestrator.submit
        handles = [submit(engine.request(p, N), loop=loop) for p in prompts]
        got = await asyncio.gather(*(tokens(h) for h in handles))
        cancelled = submit(engine.request(prompts[0], N), loop=loop)
        await anext(cancelled.events())
        cancelled.cancel()
        await tokens(submit(engine.request(prompts[1], 3), loop=loop))
        return got

    engine.paged.generate = spy
    try:
        got = asyncio.run(run())
    finally:
        engine.close()
        del engine.paged.generate
    assert engine.paged.waits > waits and max(live) == 2
    for p, g in zip(prompts, got):
        assert g == alone(model, tokenizer, p, N)[0]
    engine.paged.allocator.check()
    assert engine.paged.allocator.blocks_in_use == 0


def test_metrics_report_blocks_in_use_and_prefix_cache_hits(paged):
    """`/metrics` of a server over the paged engine: `functional_gen_kv_blocks_in_use` and
    `functional_gen_prefix_cache_hits_total` are the allocator's counts, read while a request
    holds blocks (one of them taken from the prefix cache) and after it ended;
    `functional_gen_preemptions_total` is the engine's count."""
    pytest.importorskip("uvicorn")
    from functional_gen.serving import app as serving_app

    from .test_server import metrics, run_server

    engine = paged
    app = serving_app.create_app(engine, model_name="tiny")
    shared = prompt(BLOCK, 30)
    requests = [engine.request(shared + prompt(5, 31 + i), N) for i in range(2)]

    async def first_piece(request):  # submit, wait for its first tokens, return the handle
        handle = engine.orchestrator.submit(request, loop=asyncio.get_running_loop())
        events = handle.events()
        await anext(events)
        return handle, events

    async def drain(events):
        async for _ in events:
            pass

    async def run(base):
        handles = [await first_piece(r) for r in requests]
        during = metrics(base)
        for _, events in handles:
            await drain(events)
        return during

    server = run_server(app)
    base = next(server)
    try:
        before = metrics(base)
        during = asyncio.run(run(base))
        after = metrics(base)
    finally:
        next(server, None)  # stops it
    assert before["functional_gen_kv_blocks_in_use"] == 0
    alloc = engine.paged.allocator
    assert alloc.prefix_cache_hits == 1
    assert after["functional_gen_prefix_cache_hits_total"] == 1
    # both requests hold their 2 prompt blocks (one shared) and the first decode blocks
    assert 3 <= during["functional_gen_kv_blocks_in_use"] <= 10
    assert after["functional_gen_kv_blocks_in_use"] == 0
    assert after["functional_gen_kv_blocks"] == 14
    assert after["functional_gen_preemptions_total"] == engine.paged.preemptions
