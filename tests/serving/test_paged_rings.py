"""The paged engine with a sliding-window model whose prompt is longer than a ring: the prompt's
full blocks are shared with a later prompt (prefix caching), so they must hold EVERY position of
every layer. A cold prefill through the model's own cache keeps a sliding layer's keys and
values in a ring of `sliding_window + RING_RESERVE` slots (8 + 32 here): the blocks of the
positions the ring dropped were never written, and a later prompt sharing them read whatever
the pool held there (its tokens differed from `fg.generate`'s). The paged engine prefills over a
cache without rings (`PagedKV.prefill_cache`)."""

import functional_gen as fg

from .test_lockstep import alone, prompt, tiny_gemma  # noqa: F401 (a fixture)
from .test_paged import serve_paged


def test_blocks_shared_after_a_prefill_longer_than_the_ring(tiny_gemma):  # noqa: F811
    """A 90-token prompt (one prefill call: `prefill_chunk` 128; past its 40-slot rings), then a
    prompt sharing its first 24 tokens (3 blocks of 8, taken from the prefix cache) and one
    sharing 32 (4 blocks): each gives `fg.generate`'s tokens alone."""
    model, tokenizer = tiny_gemma
    engine = fg.serving.Engine(
        model, tokenizer, max_slots=3, max_len=160, block_size=8, prefill_chunk=128
    )
    assert engine.paged.rings
    first = prompt(90, 1)
    later = [first[:24] + prompt(3, 2), first[:32] + prompt(5, 3)]
    requests = [engine.request(first, 8), *(engine.request(p, 8) for p in later)]
    hits = engine.paged.allocator.prefix_cache_hits
    got = serve_paged(engine, [(0, 0, requests[0]), (1, 1, requests[1]), (1, 2, requests[2])])
    assert engine.paged.allocator.prefix_cache_hits - hits == 3 + 4  # blocks shared
    for ids, tokens in zip([first, *later], got):
        assert tokens == alone(model, tokenizer, ids, 8)[0]
