"""Rolling a `KVCache` back by positions, and compacting it (speculative decoding).

A `KVCache` is written in lockstep: every row's new tokens go to the same slots (`KVCache`).
When rows of one batch accept different numbers of proposed tokens, the slots of the rejected
ones are not copied away: their RoPE position becomes `-1`, which attention never reads
(`Attention._attend` masks `position < 0`). Attention is a masked sum over slots, so the order
of the slots does not matter, only their positions; dead slots in the middle of a row are
harmless. The write index (`KVCache.length`) then moves back to just after the last slot that
any row still uses.

Dead slots take room. When the next write would pass the end of the buffers, `compact` moves
every row's live slots to the front (one gather, as rare as the buffers are full).
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from ..models.kv_cache import KVCache

T = TypeVar("T")


def keep_below(cache: KVCache, valid_length: Int[Array, " batch"]) -> KVCache:
    """Drop every cached token at position `>= valid_length` of its row, and move the write
    index back to just after the last slot any row still uses.

    **Arguments:** `cache`: a `KVCache` without branch axes (`positions: [batch, max_len]`);
    `valid_length`: `Int[Array, " batch"]`, per row the number of leading tokens (positions
    `0 .. valid_length - 1`) whose keys and values are right.

    **Returns:** the `KVCache` with those slots at position `-1` and `length` (the same for
    every row) the smallest write index that overwrites no live slot.
    """
    cache = cache.forget(valid_length)  # rings too (`KVCache.ring_layers`)
    slots = jnp.arange(cache.positions.shape[-1], dtype=jnp.int32)
    used = jnp.max(jnp.where(cache.positions >= 0, slots[None, :] + 1, 0))
    return dataclasses.replace(cache, length=jnp.full_like(cache.length, used))


def compact(cache: KVCache) -> KVCache:
    """Every row's live slots (position `>= 0`) moved to the front, in their order.

    **Returns:** a `KVCache` holding the same tokens at the same positions, `length` the most
    live slots of any row. One gather over every buffer: call it only when the cache is full
    (`make_room`).
    """
    dead = cache.positions < 0
    order = jnp.argsort(dead, axis=-1, stable=True).astype(jnp.int32)  # live first, in order
    positions = jnp.take_along_axis(cache.positions, order, axis=-1)
    index = order[:, None, :, None]
    rings = cache.ring_layers  # addressed by position, not by slot: nothing to move

    def move(i, x):
        return x if i in rings else jnp.take_along_axis(x, index, axis=2)

    k = tuple(move(i, x) for i, x in enumerate(cache.k))
    v = tuple(move(i, x) for i, x in enumerate(cache.v))
    live = jnp.max(jnp.sum(~dead, axis=-1)).astype(jnp.int32)
    return dataclasses.replace(
        cache, k=k, v=v, positions=positions, length=jnp.full_like(cache.length, live)
    )


def make_room(cache: KVCache, slots: int) -> KVCache:
    """`cache`, compacted first when fewer than `slots` slots are left after its write index.

    **Arguments:** `slots`: static, the width of the next write.

    **Raises:** `ValueError` when the cache has fewer than `slots` slots at all.
    """
    if slots > cache.max_len:
        raise ValueError(f"a write of {slots} slots cannot fit a KVCache of {cache.max_len}")
    full = cache.length[0] + slots > cache.max_len
    return switch_in_place(full.astype(jnp.int32), [lambda c: c, compact], cache)


def switch_in_place(index: Int[Array, ""], branches: Sequence[Callable[[T], T]], operand: T) -> T:
    """`branches[index](operand)`, like `jax.lax.switch`, but without copying `operand`'s
    buffers: every branch must return a pytree of `operand`'s structure, shapes and dtypes.

    Each branch runs as a `lax.while_loop` of at most one trip (its condition: `index` is the
    branch's), one after the other. XLA updates a while loop's carry in place, while the CPU
    backend copies every buffer a `conditional` branch updates (into the branch, and out of it
    into the enclosing loop's carry): with a `KVCache` of batch 8 (60 buffers of 2 MB) a
    `lax.switch` whose branches write the cache copied 124 MB twice per step, 0.9x a plain
    decode step (`benchmarks/profile_speculative_step.py`, HLO: 120 copies of cache buffers
    per step; with this function none). An `index` outside `[0, len(branches))` runs nothing.

    **Arguments:** `index`: `Int[Array, ""]`; `branches`: functions `operand -> operand`;
    `operand`: the pytree the branches update (closed-over arrays are read only).

    **Returns:** the chosen branch's result.
    """
    carry = (jnp.asarray(index, jnp.int32), operand)
    for i, branch in enumerate(branches):
        carry = jax.lax.while_loop(
            lambda c, i=i: c[0] == i,
            lambda c, branch=branch: (jnp.full((), -1, jnp.int32), branch(c[1])),
            carry,
        )
    return carry[1]
