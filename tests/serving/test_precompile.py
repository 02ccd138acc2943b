"""`Engine.precompile` keeps its promise: after it, serving requests of every prompt length
(short prompts of each prefill bucket, prompts longer than a chunk, sampled and greedy ones, two
at once) through the orchestrator compiles no program at all, for the lockstep engine, the paged
one (with its mixed prefill) with a pool small enough that requests are preempted and resumed,
and the paged speculative one. Counted with JAX's own compile
events (`/jax/core/compile/backend_compile_duration`), which fire for every XLA compilation,
small host-side operations included. With a paged cache, prompts that share their first block
with an earlier one (prefilled over the cached block, `PagedKV.prefill_cached`) too, and the
dispatches gather several of `PagedKV.gather_buckets` (each bucket is a program of its own).

Two paged engines, not three: the paged one preempts (a pool of 7 blocks), since a paged engine
whose default pool holds every slot's worst case runs the same programs (of another pool size)
and the same host paths minus the preemptions, so it would check nothing the preempting one
does not. It keeps the default four gather buckets; the speculative one, whose programs
compile slowest (4 buckets x 2 dispatch kinds were 8 compilations of 5-12 s each on the loaded
2-core machine, most of its 64 CPU s), keeps the last two (`gather_buckets[-2:]`, still ending
at the whole table, both used by its requests): precompile's bucket loop is one for every
paged kind."""

import asyncio

import jax
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.testing import tiny_config

from ..helpers import tiny_tokenizer

VOCAB = 128
COMPILES = [0]


def _count(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
        COMPILES[0] += 1


jax.monitoring.register_event_duration_secs_listener(_count)


def tiny(i: int):
    """`(model, tokenizer)`: a tiny random Llama of one layer whose MLP width (`72 + 8 * i`) no
    other test uses, so that no program it compiles is already in this process's caches (a
    program some other test compiled would hide a gap in `precompile`)."""
    config = tiny_config(vocab_size=VOCAB, num_hidden_layers=1, intermediate_size=72 + 8 * i)
    return fg.LlamaForCausalLM(config, key=jax.random.key(0)), tiny_tokenizer(VOCAB)


def _spy_buckets(paged) -> list[int]:
    """The static `blocks` argument (the last one) of every dispatch program `paged` runs from
    now on (its `programs` wrapped on the instance)."""
    seen: list[int] = []
    real = paged.programs

    def programs():
        fixed, per_step, *dispatches = real()

        def spy(program):
            def call(*args):
                seen.append(args[-1])
                return program(*args)

            return call

        return fixed, per_step, *(spy(p) for p in dispatches)

    paged.programs = programs
    return seen


async def _serve(engine, requests):
    """Every request submitted at once; per request its token ids."""
    loop = asyncio.get_running_loop()
    handles = [engine.orchestrator.submit(r, loop=loop) for r in requests]

    async def ids(handle):
        out = []
        async for event in handle.events():
            assert not isinstance(event, fg.serving.orchestrator.Error), event
            out += getattr(event, "token_ids", [])
        return out

    return await asyncio.gather(*(ids(h) for h in handles))


@pytest.mark.parametrize(
    "kind, options",
    [
        ("lockstep", {}),
        ("paged, preempting", {"block_size": 8, "num_blocks": 7}),
        ("paged speculative", {"block_size": 8, "speculative": "lookup"}),
    ],
)
def test_after_precompile_serving_compiles_nothing(kind, options):
    kinds = ["lockstep", "paged, preempting", "paged speculative"]
    model, tokenizer = tiny(kinds.index(kind))
    if options.get("speculative") == "lookup":
        options = {**options, "speculative": fg.speculative.PromptLookup(num_tokens=3)}
    engine = fg.serving.Engine(
        model, tokenizer, max_slots=2, max_len=96, num_steps=4, prefill_chunk=32, **options
    )
    if "speculative" in options:  # two buckets: (6, 12) of the default (2, 3, 6, 12)
        engine.paged.gather_buckets = engine.paged.gather_buckets[-2:]
    start = COMPILES[0]
    engine.precompile(progress=False)
    assert COMPILES[0] > start  # the events are seen (this model's programs are new)
    rng = np.random.default_rng(0)
    new = 16 if "num_blocks" in options else 6  # long enough to outgrow the small pool
    lengths = [1, 3, 7, 12, 16, 21, 30, 37]  # every bucket up to a chunk, then a chunked one
    requests = [
        engine.request(
            rng.integers(2, VOCAB - 2, n).tolist(),
            new,
            **({"temperature": 0.8, "seed": i} if i % 3 == 1 else {}),
        )
        for i, n in enumerate(lengths)
    ]
    if engine.paged is not None:  # prompts sharing their first block, after one that fills it
        shared = rng.integers(2, VOCAB - 2, 8).tolist()
        # uncached parts of every bucket up to a chunk (16, 24, 32) and a chunked one
        tails = [rng.integers(2, VOCAB - 2, n).tolist() for n in (1, 12, 20, 30, 33)]
        later = [engine.request(shared + t, 6) for t in tails]
    buckets = [] if engine.paged is None else _spy_buckets(engine.paged)
    before = COMPILES[0]
    try:
        got = asyncio.run(_serve(engine, requests))
        if engine.paged is not None:
            hits = engine.paged.allocator.prefix_cache_hits
            got += asyncio.run(_serve(engine, [engine.request(shared + [3], 6)]))
            got += asyncio.run(_serve(engine, later))
            assert engine.paged.allocator.prefix_cache_hits >= hits + len(later)
    finally:
        engine.close()
    assert all(len(g) > 0 for g in got), got
    if "num_blocks" in options:  # 7 blocks of 8 for two slots of up to 53 positions each
        assert engine.paged.preemptions > 0
    if engine.paged is not None:  # buckets (2, 3, 6, 12) of 8-token blocks, or (6, 12)
        assert len(set(buckets)) >= 2, buckets
        assert set(buckets) <= set(engine.paged.gather_buckets), buckets
    assert COMPILES[0] == before, f"{kind}: {COMPILES[0] - before} compilations after precompile"
