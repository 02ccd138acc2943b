"""`Engine.precompile`'s job list: every program a request can run, compiled before the first
request (`precompile`), so that serving compiles nothing new (tests/serving/test_precompile.py
counts XLA's compilations while requests of every shape are served after it).

The jobs run the engine's own calls on throwaway requests in slot 0 of a fresh decode state
(the engine's counters put back as they were): one per prefill width (`Engine.prefill_width`'s
buckets up to `prefill_chunk`, then the chunked widths), each inserted, and with a paged cache
prefilled again over a cached prefix block (`_cached`); paged with `mixed_prefill`, the
block prefill's mixed and lone chunks (`_block_programs`) instead of the chunked widths; last
the decode side (`_decode_programs`): `place`, the decode dispatch (every bucket of
`PagedKV.gather_buckets`), a preemption and its resumption (`_preemption`), and the narrower
decode widths.
"""

import numpy as np

from ..generation.buckets import bucket_length
from ..progress import progress_bar
from .pool import PoolEntry
from .slots import Request
from .speculative import squeeze_jit


def precompile(engine, *, progress: bool = True) -> None:
    """Compile what `engine` (an `Engine`) can run, as `Engine.precompile` describes: one job
    per prefill width, then one for the paged cache's block prefill (with `mixed_prefill`),
    then the decode programs (a `tqdm` bar over the jobs when `progress`)."""
    widths = []
    w = bucket_length(1)
    while w <= min(engine.prefill_chunk, engine.max_len - 1):
        widths.append(w)
        w = bucket_length(w + 1)
    chunked = list(range(2 * engine.prefill_chunk, engine.max_len, engine.prefill_chunk))
    blocks = engine.paged is not None and engine.mixed_prefill
    if blocks:  # long prompts go into their blocks: two programs of fixed shapes
        chunked = ["blocks"] if chunked else []
    lengths = widths + chunked
    state = engine.init_decode_state()
    jobs = [*lengths, None]
    for n in progress_bar(jobs, desc="compiling", unit="shape") if progress else jobs:
        if n == "blocks":
            state = _block_programs(engine, state)
        elif n is None:
            state = _decode_programs(engine, state)
        elif engine.paged is None:
            state = engine.insert(engine.prefill(engine.request([0] * n, 1)), state, 0)
        else:  # cold, then over a cached block (the uncached part of the same width)
            engine.paged.allocator.prefix_caching = False
            request = engine.request([0] * n, 1)
            state = engine.insert(engine.prefill(request, engine.admit(request, 0)), state, 0)
            engine.release(0)
            engine.paged.allocator.prefix_caching = True
            state = _cached(engine, state, n, 1 + lengths.index(n))


def _block_programs(engine, state):
    """`precompile`'s block prefill: a mixed dispatch per bucket, a chunk alone, the insert
    after; `state` with the slot freed, the chunk counters as they were."""
    paged = engine.paged
    counts = paged.chunks_alone, paged.chunks_mixed
    paged.allocator.prefix_caching = False
    for blocks in paged.gather_buckets:  # a first chunk ends at position 1: any fits
        request = engine.request([0] * (engine.prefill_chunk + 1), 1)
        prefill = engine.block_prefill(request, engine.admit(request, 0))
        state, _ = paged.generate(engine, state, engine.num_steps, False, prefill, blocks=blocks)
        if blocks != paged.gather_buckets[-1]:
            engine.release(0)  # never inserted: idle in the state
    state = engine.run_chunk(state, prefill)
    state = engine.free(engine.insert(engine.block_prefix(prefill), state, 0), 0)
    engine.release(0)
    paged.allocator.prefix_caching = True
    paged.chunks_alone, paged.chunks_mixed = counts  # requests' chunks only
    return state


def _decode_programs(engine, state):
    """`precompile`'s decode side: the constraint pool's `place`, the decode dispatch (with a
    paged cache one per bucket of `PagedKV.gather_buckets`, over idle slots: no step runs), a
    preemption and its resumption (`_preemption`), the speculative squeeze, and the narrower
    decode widths' programs."""
    s, c = engine.constraint_states, engine.constraint_classes
    entry = PoolEntry(
        token_class=np.zeros((engine.model.vocab_size,), np.int32),
        transitions=np.zeros((s, c), np.int32),
        distance=np.zeros((s,), np.int32),
    )
    state = engine.free(engine.place(entry, state, 0), 0)
    if engine.paged is None:
        state, _ = engine.generate(state)
    for blocks in () if engine.paged is None else engine.paged.gather_buckets:
        state, _ = engine.paged.generate(engine, state, engine.num_steps, False, blocks=blocks)
    if engine.preemption:  # what a preemption reads, and a resumed request's insert
        state = _preemption(engine, state)
    if engine.speculation is not None and engine.paged is None:  # before a full one
        state = squeeze_jit(state)
    for w in engine.decode_widths[:-1]:  # the narrower programs: idle rows, no steps
        state, _ = engine._dispatch(state, engine.num_steps, 1, False, np.arange(w))
    return state


def _preemption(engine, state):
    """`precompile`'s preemption: a one-block request inserted into slot 0, preempted there
    (`Preemptor.preempt`: its row read in one program, its blocks registered and freed), and
    its resumed request (`Request.resume`) admitted, prefilled and inserted again; `state`
    with both freed, the counters as they were."""
    paged = engine.paged
    if engine.prefill_width(engine.block_size + 1) + 1 > engine.max_len:
        return state  # no prompt of a full block and a token fits: nothing can be preempted
    counts = paged.preemptions, paged.allocator.prefix_cache_hits
    state = _insert(engine, state, engine.request([0] * (engine.block_size + 1), 1))
    resumed = engine.preemptor.preempt(state, 0).request
    state = engine.free(state, 0)
    state = engine.free(_insert(engine, state, resumed), 0)
    engine.release(0)
    paged.preemptions, paged.allocator.prefix_cache_hits = counts
    return state


def _insert(engine, state, request: Request):
    """`request` admitted into slot 0, prefilled as the orchestrator prefills it (its chunks
    into its blocks when `block_prefill` gives them, else `prefill`) and inserted; the
    chunk counters as they were."""
    paged = engine.paged
    counts = paged.chunks_alone, paged.chunks_mixed
    admission = engine.admit(request, 0)
    chunks = engine.block_prefill(request, admission)
    if chunks is None:
        prefix = engine.prefill(request, admission, state)
    else:
        while chunks.pending:
            state = engine.run_chunk(state, chunks)
        prefix = engine.block_prefix(chunks)
    paged.chunks_alone, paged.chunks_mixed = counts  # requests' chunks only
    return engine.insert(prefix, state, 0)


def _cached(engine, state, n: int, tail: int):
    """`precompile`'s prefill of `n` uncached tokens over ONE cached block: a prompt of
    `block_size` zeros and `n` tokens `tail` (a token no other bucket's prompt uses, so that
    no block after the first is cached from an earlier one), after a prompt that registered
    the block of zeros; where such a prompt fits `max_len`. `state` with both freed."""
    bs = engine.block_size
    if engine.prefill_width(bs + n) + 1 > engine.max_len or tail >= engine.model.vocab_size:
        return state
    hits = engine.paged.allocator.prefix_cache_hits
    for ids in ([0] * bs + [tail], [0] * bs + [tail] * n):  # registers block 0, reads it
        state = _insert(engine, state, engine.request(ids, 1))
        assert len(ids) == bs + 1 or engine.paged.admissions[0].cached_tokens == bs
        state = engine.free(state, 0)
        engine.release(0)
    engine.paged.allocator.prefix_cache_hits = hits  # requests' hits only
    return state
