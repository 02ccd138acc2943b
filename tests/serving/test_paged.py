"""The serving engine's paged KV cache (`Engine(block_size=...)`): the host block allocator
(`serving.blocks`, vLLM's block manager with prefix caching) under random traces, and the paged
engine against `fg.generate` alone on a tiny random model."""

import random

import numpy as np
import pytest

from functional_gen.serving.blocks import BlockAllocator, block_key


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
