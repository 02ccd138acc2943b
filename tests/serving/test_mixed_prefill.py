"""Chunked prefill mixed with decode (`Engine(block_size=..., mixed_prefill=True)`): a long
prompt is prefilled chunk by chunk straight into its slot's blocks, each chunk inside the decode
dispatch of the other slots (`serving.paged._paged_mixed`). On test_lockstep's tiny random Gemma
3 (sliding window 8): every request's tokens equal `fg.generate` alone, and the mixed program
really ran (its chunks are counted)."""

import asyncio
import threading

import pytest

import functional_gen as fg

from ..helpers import without_runtime_type_checks
from .test_lockstep import alone, prompt, tiny_gemma  # noqa: F401 (a fixture)
from .test_paged import BLOCK, N, sampled_alone, tokens

CHUNK = 6  # chunks of 6 tokens cross the 8-token blocks
# Prompts of 13-16 tokens and N new tokens: test_paged's references (`fg.generate` at bucket 16)
# and its engine's decode program, compiled once for both files in a run.


@pytest.fixture(scope="module")
def engine(request):
    """test_paged's paged engine on `tiny_gemma` (3 slots of 64 tokens, 14 blocks of 8), with
    chunks of 6 tokens."""
    model, tokenizer = request.getfixturevalue("tiny_gemma")
    return fg.serving.Engine(
        model, tokenizer, max_slots=3, max_len=64, block_size=BLOCK, num_blocks=14,
        prefill_chunk=CHUNK,
    )  # fmt: skip


def test_long_prompts_ride_in_decode_dispatches_with_unchanged_tokens(engine):
    """A 14-token greedy prompt is prefilled into slot 0 on its own (3 chunks, `run_chunk`: no
    slot decodes yet) and decodes; meanwhile a 16-token prompt (3 chunks, the first
    left-padded) is prefilled into slot 1 inside the dispatches, then a seeded sampled prompt
    that shares its first block (prefix cache hit: 8 tokens cached, 7 left, 2 chunks, the first
    starting at position 8) into slot 2. Each of those chunks rides in a dispatch (counted), slot
    0 takes its `num_steps` tokens in every one, and every request's tokens equal `fg.generate`
    alone."""
    model, tokenizer = engine.model, engine.tokenizer
    short, long = prompt(14, 40), prompt(16, 41)
    shared = long[:BLOCK] + prompt(7, 42)
    state = engine.init_decode_state()
    paged = engine.paged
    mixed, alone_ = paged.chunks_mixed, paged.chunks_alone
    hits = paged.allocator.prefix_cache_hits
    requests = [
        engine.request(short, N),
        engine.request(long, N),
        engine.request(shared, N, temperature=0.8, seed=3),
    ]
    first = engine.block_prefill(requests[0], engine.admit(requests[0], 0))
    while first.pending:
        state = engine.run_chunk(state, first)
    state = engine.insert(engine.block_prefix(first), state, 0)
    got = {0: [], 1: [], 2: []}
    queue = [1, 2]
    prefill = None
    running = {0}
    steps_of_short = []  # tokens slot 0 took per dispatch while a chunk rode along
    while running or queue or prefill is not None:
        if prefill is None and queue:
            slot = queue.pop(0)
            prefill = engine.block_prefill(requests[slot], engine.admit(requests[slot], slot))
            assert prefill is not None and prefill.num_chunks == 3 - (slot == 2)
            assert prefill.admission.cached_tokens == BLOCK * (slot == 2)
        if prefill is not None and not prefill.pending:
            slot = prefill.admission.slot
            state = engine.insert(engine.block_prefix(prefill), state, slot)
            running.add(slot)
            prefill = None
            continue
        carried = prefill if prefill is not None else None
        state, out = engine.generate(state, prefill=carried)
        for slot in list(running):
            new = [t for t in out.token_ids[:, slot].tolist() if t >= 0]
            got[slot] += new
            if slot == 0 and carried is not None:
                steps_of_short.append(len(new))
            if bool(out.done[slot]):
                running.discard(slot)
                engine.release(slot)
        paged.allocator.check()
    assert paged.chunks_mixed - mixed == 5  # 3 + 2 chunks, all inside dispatches
    assert paged.chunks_alone - alone_ == 3
    assert paged.allocator.prefix_cache_hits - hits == 1
    assert steps_of_short and all(n == engine.num_steps for n in steps_of_short[:-1])
    assert got[0] == alone(model, tokenizer, short, N)[0]
    assert got[1] == alone(model, tokenizer, long, N)[0]
    assert got[2] == sampled_alone(model, tokenizer, shared, N, 0.8, 3)
    assert paged.allocator.blocks_in_use == 0


def test_orchestrator_mixes_chunks_into_the_dispatches(engine):
    """Through the orchestrator: two prompts (11 and 10 tokens) submitted to an idle engine are
    prefilled on their own (2 chunks each: nobody waits for them); a 16-token prompt submitted
    while they decode (held at their first dispatch until it is queued) is prefilled inside
    their next dispatches (3 mixed chunks; the three requests' 4 + 4 + 5 blocks fit the pool's
    14, so it does not wait); every request's tokens equal `fg.generate` alone."""
    model, tokenizer = engine.model, engine.tokenizer
    shorts, long = [prompt(11, 50), prompt(10, 51)], prompt(16, 52)
    paged = engine.paged
    entered, queued = threading.Event(), threading.Event()
    dispatch = engine.generate

    def held(*args, **kwargs):  # the first dispatch waits for the long prompt to be queued
        entered.set()
        queued.wait(30)
        return dispatch(*args, **kwargs)

    async def run():
        loop = asyncio.get_running_loop()
        submit = engine.orchestrator.submit
        first = [submit(engine.request(p, N), loop=loop) for p in shorts]
        await asyncio.to_thread(entered.wait, 30)
        late = submit(engine.request(long, N), loop=loop)
        queued.set()
        return await asyncio.gather(*(tokens(h) for h in [*first, late]))

    alone_, mixed = paged.chunks_alone, paged.chunks_mixed
    engine.generate = held
    try:
        got = asyncio.run(run())
    finally:
        engine.close()
        del engine.generate
    assert entered.is_set() and queued.is_set()
    assert paged.chunks_alone - alone_ == 4 and paged.chunks_mixed - mixed == 3
    for p, g in zip([*shorts, long], got):
        assert g == alone(model, tokenizer, p, N)[0]
    assert paged.allocator.blocks_in_use == 0


def test_mixed_prefill_must_be_a_bool(tiny_gemma):  # noqa: F811
    model, tokenizer = tiny_gemma
    with (
        without_runtime_type_checks(),
        pytest.raises(ValueError, match="`mixed_prefill` must be True or False, got 'yes'"),
    ):
        fg.serving.Engine(model, tokenizer, block_size=8, mixed_prefill="yes")
