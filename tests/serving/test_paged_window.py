"""The paged engine's dispatches write from the longest busy slot's length, not from the table's
end (`serving.paged.gather`'s write index, `window`, `scatter`; issue 56): on the CPU plan a
decode step's attention then reads only the columns up to its token, rounded up to one of
`attention_lengths`. Checked on test_lockstep's tiny random Gemma 3 with tables of 512 tokens
(so the plan's shorter attention branches exist: 64, 128, 256 and the whole 516 columns at 2
rows): the gathered cache's layout and the scatter by hand, the write index of real dispatches,
and the tokens of slots of very different lengths sharing dispatches (one near the table's
end, one short), crossing blocks, against `fg.generate` alone."""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.models.attention import attention_lengths
from functional_gen.models.kv_cache import KVCache
from functional_gen.serving import paged as paged_module
from functional_gen.serving.paged import PagedCache, gather, scatter, window

from .test_engine_speculative import PROPOSERS
from .test_lockstep import VOCAB, alone, prompt, tiny_gemma  # noqa: F401 (a fixture)
from .test_paged import sampled_alone

BLOCK = 16
MAX_LEN = 512
CHUNK = 96  # the long prompt's 478 tokens: 5 chunks (480 padded), each at another write index


def test_gather_writes_from_the_longest_row_and_scatter_puts_keys_by_position():
    """By hand, one layer, blocks of 4, tables of 4 blocks (16 positions), rows of 5, 0 (idle)
    and 13 positions: the gathered cache holds each row's positions in their columns and `-1`
    elsewhere, its write index is 13 for every row; three steps written at columns 13-15
    (positions 5-7 for row 0, 13-15 for row 2, `-1` for the idle row) and taken back with
    `window` land in exactly those positions' blocks, nothing else changes."""
    bs, kvh, hd = 4, 1, 2
    pool = jnp.arange(10 * bs * kvh * hd, dtype=jnp.float32).reshape(kvh, 10, bs, hd)
    tables = jnp.asarray([[3, 1, -1, -1], [-1, -1, -1, -1], [0, 5, 7, 2]], jnp.int32)
    paged = PagedCache((pool,), (-pool,), tables)
    lengths = jnp.asarray([5, 0, 13], jnp.int32)
    cache = gather(paged, tables, lengths, 3)
    assert cache.k[0].shape == (3, kvh, 19, hd)
    assert cache.length.tolist() == [13, 13, 13]
    columns = np.arange(19)
    for r, n in enumerate([5, 0, 13]):
        np.testing.assert_array_equal(cache.positions[r], np.where(columns < n, columns, -1))
        for c in range(n):
            table = np.asarray(tables)[r]
            want = np.asarray(pool)[:, table[c // bs], c % bs]
            np.testing.assert_array_equal(cache.k[0][r, :, c], want)
    new = 1000 + jnp.arange(3 * kvh * 3 * hd, dtype=jnp.float32).reshape(3, kvh, 3, hd)
    steps = jnp.asarray([[5, 6, 7], [-1, -1, -1], [13, 14, 15]], jnp.int32)
    after = KVCache(
        k=(jax.lax.dynamic_update_slice(cache.k[0], new, (0, 0, 13, 0)),),
        v=(jax.lax.dynamic_update_slice(cache.v[0], -new, (0, 0, 13, 0)),),
        positions=cache.positions.at[:, 13:16].set(steps),
        length=cache.length + 3,
    )
    out = scatter(paged, window(after, cache.length[0], 3), tables, jnp.zeros(3, jnp.int32))
    want = np.asarray(pool).copy()
    for r, row in ((0, [5, 6, 7]), (2, [13, 14, 15])):
        for j, p in enumerate(row):
            want[:, np.asarray(tables)[r, p // bs], p % bs] = np.asarray(new)[r, :, j]
    np.testing.assert_array_equal(out.k[0], want)
    np.testing.assert_array_equal(out.v[0], -want)


def test_window_refuses_a_cache_with_rings():
    """`window` cuts columns; a ring layer's slots are not columns: `ValueError`."""
    ring = KVCache(
        k=(jnp.zeros((1, 1, 4, 2)),),
        v=(jnp.zeros((1, 1, 4, 2)),),
        positions=jnp.full((1, 8), -1, jnp.int32),
        length=jnp.zeros((1,), jnp.int32),
        ring_positions=jnp.full((1, 4), -1, jnp.int32),
        ring_layers=(0,),
        sliding_window=2,
    )
    with pytest.raises(ValueError, match="ring"):
        window(ring, jnp.asarray(0), 2)


@pytest.fixture(scope="module")
def engine(request):
    """A paged engine on `tiny_gemma`: 2 slots of 512 tokens, blocks of 16, chunks of 96."""
    model, tokenizer = request.getfixturevalue("tiny_gemma")
    return fg.serving.Engine(
        model, tokenizer, max_slots=2, max_len=MAX_LEN, block_size=BLOCK, prefill_chunk=CHUNK
    )


def test_the_decode_attention_has_shorter_branches_to_take(engine):
    """The premise of the other tests: at this table width the CPU plan compiles attention
    branches shorter than the gathered cache (so a wrong write index would cut keys), and the
    paged engine's model keeps them."""
    assert engine.paged.model.plan.attention_length_buckets
    assert attention_lengths(MAX_LEN + engine.num_steps, 2) == (64, 128, 256, 516)


def _probe(model, state, tables, *decode):
    """`paged._paged_generate`, and the write index of the cache its decode loop ran over (the
    loop's input, recorded while tracing)."""
    seen = []
    real = paged_module._generate

    def spy(model, inner, *args):
        seen.append(inner.generation.cache.length)
        return real(model, inner, *args)

    paged_module._generate = spy
    try:
        out = paged_module._paged_generate(model, state, tables, *decode)
    finally:
        paged_module._generate = real
    return out, seen[0]


def test_a_dispatch_writes_from_the_longest_busy_slot(engine):
    """Dispatch by dispatch (`_paged_generate`, jitted with the write index of its inner cache
    as an extra output): the write index is the largest length of the busy slots, for a short
    slot alone, with a 200-token slot beside it, and after that slot finished (its length,
    still in the state, is ignored), never the table's end."""
    probe = eqx.filter_jit(_probe)
    paged = engine.paged
    n = engine.num_steps
    state = engine.init_decode_state()
    short = engine.request(prompt(5, 50), 6 * n)
    long = engine.request(prompt(200, 51), n)
    schedule = {0: (0, short), 1: (1, long)}
    seen, wanted, done_lengths = [], [], []
    for dispatch in range(6):
        if dispatch in schedule:
            slot, request = schedule[dispatch]
            admission = engine.admit(request, slot)
            state = engine.insert(engine.prefill(request, admission, state), state, slot)
        length, done = jax.device_get((state.generation.length, state.generation.done))
        wanted.append(int(np.max(np.where(done, 0, length))))
        done_lengths.append(int(np.max(np.where(done, length, 0))))
        tables = paged.grow(state, n)
        decode = (n, jnp.asarray(n, jnp.int32), engine.eos_token_id, engine.pad_token_id)
        (state, out), write = probe(paged.model, state, tables, *decode, jnp.asarray(False))
        seen.append(int(write[0]))
        for slot in np.flatnonzero(np.asarray(out.done)).tolist():
            if slot in paged.admissions:
                engine.release(slot)
    assert seen == wanted, (seen, wanted)
    assert wanted[0] == 5 and wanted[1] == 200 and wanted[2] == 5 + 2 * n  # short, long, short
    assert max(done_lengths) == 200 + n and all(w < 64 for w in wanted[2:])  # long: done


def _spy_buckets(paged) -> list[int]:
    """Record the static `blocks` argument (the last one) of every dispatch program `paged`
    runs, in order (its `programs` wrapped on the instance)."""
    seen: list[int] = []
    real = paged.programs

    def programs():
        fixed, per_step, generate_program, mixed_program = real()

        def spy(program):
            def call(*args):
                seen.append(args[-1])
                return program(*args)

            return call

        return fixed, per_step, spy(generate_program), spy(mixed_program)

    paged.programs = programs
    return seen


def _smallest_bucket(engine, state, prefill) -> int:
    """The bucket a dispatch from `state` (with `prefill`'s next chunk, or none) must gather,
    computed here from the state and the chunk: the smallest of `gather_buckets` whose blocks
    hold every busy slot's `length + num_steps x tokens_per_step` and the chunk's end."""
    paged = engine.paged
    reach = engine.num_steps * paged.tokens_per_step
    length, done = jax.device_get((state.generation.length, state.generation.done))
    need = max([int(length[s]) + reach for s in range(engine.max_slots) if not done[s]], default=0)
    if prefill is not None:  # the chunk's last position, plus one
        end = (prefill.chunks_run + 1) * engine.prefill_chunk
        need = max(need, int(prefill.positions[0, end - 1]) + 1)
    return min(b for b in paged.gather_buckets if b * BLOCK >= min(need, MAX_LEN))


@pytest.mark.parametrize("speculative", [None, "prompt_lookup"])
def test_a_long_and_a_short_slot_share_dispatches_with_generates_tokens(engine, speculative):
    """A 5-token prompt decodes in slot 0 (66 tokens, to its EOS) while a 478-token prompt (5
    chunks of 96 riding in its dispatches, at write indices 0 to 384) is prefilled into slot 1
    and then decodes 32 tokens, to position 509 of its 512 (crossing blocks at 480 and 496);
    slot 0 crosses blocks too, and (without speculation) decodes on alone after slot 1
    finished (its attention back to 64 and 128 columns). Each request's tokens equal
    `fg.generate` alone, with and without speculation (prompt lookup, greedy: plain greedy
    decoding's tokens; guesses verified), and each dispatch's program got the smallest of
    `gather_buckets` that holds its slots (`_smallest_bucket`; speculating, a slot's room per
    dispatch is `num_steps x write_width`), rising with the chunks under slot 0. (Under speculation
    the bucket rule is checked here only, not on the trace of the bucket test below too: a
    speculative engine's programs take 5-20 s each to compile.)"""
    model, tokenizer = engine.model, engine.tokenizer
    if speculative is not None:
        engine = fg.serving.Engine(
            model, tokenizer, max_slots=2, max_len=MAX_LEN, block_size=BLOCK,
            prefill_chunk=CHUNK, speculative=PROPOSERS[speculative](model),
        )  # fmt: skip
    short, long = prompt(5, 60), prompt(478, 61)
    requests = [engine.request(short, 80), engine.request(long, 32)]
    state = engine.init_decode_state()
    paged = engine.paged
    seen, wanted = _spy_buckets(paged), []
    mixed = paged.chunks_mixed
    admission = engine.admit(requests[0], 0)
    state = engine.insert(engine.prefill(requests[0], admission, state), state, 0)
    prefill = engine.block_prefill(requests[1], engine.admit(requests[1], 1))
    assert prefill is not None and prefill.num_chunks == 5
    got, running, verified, alone_from = {0: [], 1: []}, {0}, 0, None
    while running or prefill is not None:
        if prefill is not None and not prefill.pending:
            state = engine.insert(engine.block_prefix(prefill), state, 1)
            running.add(1)
            prefill = None
            continue
        wanted.append(_smallest_bucket(engine, state, prefill))
        state, out = engine.generate(state, prefill=prefill)
        verified += int(np.sum(out.verified)) if out.verified is not None else 0
        for slot in list(running):
            got[slot] += [t for t in out.token_ids[:, slot].tolist() if t >= 0]
            if bool(out.done[slot]):
                running.discard(slot)
                engine.release(slot)
                if slot == 1:
                    alone_from = len(got[0])
        paged.allocator.check()
    assert paged.chunks_mixed - mixed == 5  # every chunk rode in a dispatch of slot 0
    del paged.programs  # the spy off the module's engine
    assert seen == wanted, (seen, wanted)
    assert len(set(seen)) >= 3 and seen[: seen.index(32)] == sorted(seen[: seen.index(32)])
    assert got[1] == alone(model, tokenizer, long, 32)[0]
    assert got[0] == alone(model, tokenizer, short, 80)[0]
    assert len(got[1]) == 32  # to position 509: no EOS
    if speculative is None:  # (speculating, slot 0 runs ahead: it ends first)
        assert len(short) + alone_from + engine.num_steps <= 64  # slot 0 alone: 64 columns,
        assert len(short) + len(got[0]) > 64  # then 128
    assert speculative is None or verified > 0
    assert paged.allocator.blocks_in_use == 0


def test_gather_buckets_are_few_ascending_and_end_at_the_whole_table(engine):
    """`gather_buckets`: an eighth, a quarter, a half and all of a slot's blocks, rounded up and
    deduplicated; `gather_blocks` takes the smallest that holds the positions (the whole table
    past it). This engine's tables of 32 blocks of 16: 64, 128, 256 and 512 positions."""
    assert paged_module.gather_buckets(32) == (4, 8, 16, 32)
    assert paged_module.gather_buckets(12) == (2, 3, 6, 12)
    assert paged_module.gather_buckets(3) == (1, 2, 3)
    assert paged_module.gather_buckets(1) == (1,)
    paged = engine.paged
    assert paged.gather_buckets == (4, 8, 16, 32)
    got = [paged.gather_blocks(p) for p in (0, 1, 64, 65, 128, 129, 256, 257, 512, 600)]
    assert got == [4, 4, 4, 8, 8, 16, 16, 32, 32, 32]


def test_each_dispatch_gathers_the_smallest_bucket_holding_its_slots(engine):
    """A seeded sampled 5-token prompt decodes 80 tokens in slot 0 while a 100-token greedy
    prompt is prefilled into slot 1 inside its dispatches (2 chunks of 96, ending at positions
    4 and 100) and decodes 40 tokens: the bucket rises with the chunks and from 8 blocks (128
    positions) to 16 while slot 1 decodes; after slot 1 ends it falls back to what slot 0
    needs. Each dispatch's program got the smallest of `gather_buckets` whose blocks hold
    every busy slot's `length + num_steps x tokens_per_step` and the chunk's end
    (`_smallest_bucket`), and each request's tokens equal `fg.generate` alone. (With
    speculation: the test above.)"""
    model, tokenizer = engine.model, engine.tokenizer
    paged = engine.paged
    seen = _spy_buckets(paged)
    short, long = prompt(5, 70), prompt(100, 71)
    requests = [engine.request(short, 80, temperature=0.8, seed=7), engine.request(long, 40)]
    state = engine.init_decode_state()
    admission = engine.admit(requests[0], 0)
    state = engine.insert(engine.prefill(requests[0], admission, state), state, 0)
    prefill = engine.block_prefill(requests[1], engine.admit(requests[1], 1))
    assert prefill is not None and prefill.num_chunks == 2
    got, running, wanted, busy_sets = {0: [], 1: []}, {0}, [], []
    while running or prefill is not None:
        if prefill is not None and not prefill.pending:
            state = engine.insert(engine.block_prefix(prefill), state, 1)
            running.add(1)
            prefill = None
            continue
        wanted.append(_smallest_bucket(engine, state, prefill))
        busy_sets.append(frozenset(running))
        state, out = engine.generate(state, prefill=prefill)
        for slot in list(running):
            got[slot] += [t for t in out.token_ids[:, slot].tolist() if t >= 0]
            if bool(out.done[slot]):
                running.discard(slot)
                engine.release(slot)
        paged.allocator.check()
    assert seen == wanted, (seen, wanted)
    assert len(set(seen)) >= 3
    pairs = itertools.pairwise(zip(seen, busy_sets))
    assert any(a < b and 0 in p and 0 in q for (a, p), (b, q) in pairs)  # rose under slot 0
    # slot 1 itself crosses from 128 to 256 positions as it decodes
    both = [b for b, busy in zip(seen, busy_sets) if busy == {0, 1}]
    assert both[0] == 8 and both[-1] == 16 and both == sorted(both), both
    assert got[0] == sampled_alone(model, tokenizer, short, 80, 0.8, 7)
    assert got[1] == alone(model, tokenizer, long, 40)[0]
    assert len(got[1]) == 40  # no EOS: it reaches position 140
    assert paged.allocator.blocks_in_use == 0
