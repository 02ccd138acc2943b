"""The serving engine's paged KV cache (`Engine(block_size=...)`): the device side of
`serving.blocks` (the host allocator), after vLLM (Kwon et al. 2023, "Efficient Memory
Management for Large Language Model Serving with PagedAttention").

**Layout.** Per layer ONE pool of keys and one of values, `[kv_heads, num_blocks, block_size,
head_dim]` (`PagedCache`; head-major, the layout of jax's Pallas paged-attention kernel), and a
block table `int32[max_slots, max_blocks_per_slot]` (`-1` = none): slot `s`'s position `p`
lives at `pool[:, table[s, p // block_size], p % block_size]`. Every
slot has its own length (its `GenerationState.length`); there is no shared write index, no
right-alignment and no compaction (the lockstep engine's `compact`).

**Decode.** One `generate` dispatch of `n` steps gathers each slot's first `nb` blocks through
its table into a contiguous `KVCache` row (`gather`: `[slots, kv_heads, nb * block_size + n,
head_dim]`, slot column `c` holding position `c` for `c < length`, position `-1` after), runs
the engine's ordinary decode loop on it (`programs._generate`: the `n` new tokens go to the `n`
columns from the longest busy slot's length `L` on, in lockstep, each row with its own RoPE
position; attention masks by position, so every row reads exactly its own tokens), and
scatters those `n` columns (`window`: columns `[L, L + n)`) back into the pool (`scatter`: each
key and value to `table[s, p // block_size], p % block_size`, those of idle rows dropped).
`nb` is the smallest of `PagedKV.gather_buckets` (1/8, 1/4, 1/2 or all of
`max_blocks_per_slot`) whose blocks hold every busy slot's `length + n` positions (and a mixed
dispatch's chunk's end), chosen on the host from the lengths `grow` reads anyway, and static:
one compiled program per bucket, all compiled by `Engine.precompile`. So the gather copies the
slots' blocks up to the bucket, not their whole tables: 4 slots of 40 tokens in tables of
2,048 (128 blocks of 16) gather 256 + 8 columns, not 2,056. Writing from `L`, not from the
gathered blocks' end, lets the CPU plan's decode attention read only the columns up to the
step's token, rounded up to one of its `attention_lengths` of the gathered width (which has
the shorter branches from 512 columns on; the program's shapes are the same for every `L`).
The gather is the CPU form. Under the GPU plan (`ExecutionPlan.paged_attention="pallas"`,
`AbstractCausalLM.paged_decode`) a plain decode dispatch gathers nothing: the model takes the
pools and tables as a `models.paged_cache.PagedKVCache`, each step writes its keys and values
into their blocks and attends through the tables with jax's Pallas paged-attention kernel
(`jax.experimental.pallas.ops.gpu.paged_attention`, pages `[kv_heads, num_pages, page_size,
head_dim]` with per-row lengths: the pools' layout), so the dispatch needs no copy of the
slots' caches (the gather's copy is as large as the blocks it reads). The mixed dispatch's
chunk, a cached-prefix prefill and speculative decoding keep the gather.

**Prefill.** A prompt with no cached prefix is prefilled as the lockstep engine prefills it
(the left-padded bucket, `generate`'s own call), and `insert` scatters its keys and values into
the slot's blocks. A prompt whose leading full blocks are in the prefix cache
(`BlockAllocator.admit`'s `cached_tokens`) is prefilled from its first uncached position only:
the cached blocks are gathered into a one-row cache (`gather_row`) and the rest of the prompt
runs over it in chunks (`programs._prefill_chunk`), as a long prompt does; `insert` scatters only
the new positions (the shared blocks are never written). This is where prefix caching saves
prefill time (vLLM's automatic prefix caching).

**Mixed prefill.** With `Engine(mixed_prefill=True)` (the default), a prompt whose uncached part
is longer than `prefill_chunk` is a `BlockPrefill` instead: each chunk gathers the slot's
written positions through its table row, runs over them and scatters its keys and values into
the slot's blocks (`_paged_chunk`, one fixed shape for every prompt length), either alone
(gathering the slot's whole table row: one row, a small copy beside the chunk's compute) or
first thing inside a decode dispatch (`_paged_mixed`, vLLM's chunked prefill; the row's blocks
up to the dispatch's bucket, which holds the chunk's end). The slot is idle
(`done`) in the decode state until its `insert`, so the decode steps read none of its blocks and
write none (an idle row's keys go to position `-1`, dropped by `scatter`).

**Preemption** (`Engine(preemption=True)`, the default; vLLM's recompute preemption) is
`serving.preemption`: the allocator then runs `on_demand` and, before each dispatch, the most
recently admitted requests give their blocks back when the pool runs short (host work; no
program changes).

**Speculative decoding** over these blocks (`Engine(block_size=..., speculative=...)`) is
`serving.paged_speculative`: the same gather and scatter around the speculative steps.
"""

import dataclasses
from collections.abc import Iterator, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..models.kv_cache import KVCache
from ..models.paged_cache import PagedKVCache
from .blocks import Admission, BlockAllocator
from .programs import (
    DecodeState,
    Prefix,
    _generate,
    _with_prefix,
    chunked_prefill,
    engine_program,
)
from .slots import Request

GATHER_FRACTIONS = (8, 4, 2, 1)
"""`gather_buckets`' divisors of a slot's blocks: 1/8, 1/4, 1/2 and all of them."""


def gather_buckets(max_blocks: int) -> tuple[int, ...]:
    """The block counts a paged decode dispatch may gather per slot (`PagedKV.gather_buckets`):
    `ceil(max_blocks / f)` for `f` in `GATHER_FRACTIONS`, deduplicated, ascending; the last is
    `max_blocks` (the whole table).

    Why these: each bucket is one more compiled program per dispatch kind (the decode and the
    mixed program, with or without speculation), compiled by `Engine.precompile`, so the list is
    short; halving keeps the gathered columns within 2x of the positions the busy slots hold
    (above an eighth of the table), and an eighth bounds the copy of short slots in a long
    table at 1/8 of today's. Below that the copy is small beside a decode step's weights, and a
    gathered cache under 512 columns compiles one attention length anyway
    (`models.attention.attention_lengths`). `max_blocks=128` (2,048 tokens in blocks of 16):
    `(16, 32, 64, 128)`; 160 (2,560): `(20, 40, 80, 160)`; 12: `(2, 3, 6, 12)`; 1: `(1,)`.
    The price is in `Engine.precompile`: test_precompile's tiny paged engine (tables of 12
    blocks) took 2.5x the CPU seconds to precompile (23 -> 58 s), its speculative one 3.3x
    (44 -> 145 s), on the loaded 2-core CPU.

    **Arguments:** `max_blocks`: the blocks of a slot's table, a positive integer.

    **Returns:** the bucket sizes in blocks, ascending."""
    return tuple(sorted({-(-max_blocks // f) for f in GATHER_FRACTIONS}))


class PagedCache(eqx.Module):
    """The pools of a paged KV cache and its block tables.

    **Attributes:** `k`, `v`: one array per layer, `Float[Array, "kv_heads blocks block_size
    head_dim"]` (`models.paged_cache.PagedKVCache`'s layout); `block_tables`: `Int[Array, "slots max_blocks"]`, the physical block of each
    slot's logical block (`-1` = none; copied from `BlockAllocator.block_tables` before each
    dispatch and insert)."""

    k: tuple[Float[Array, "kv_heads blocks block_size head_dim"], ...]
    v: tuple[Float[Array, "kv_heads blocks block_size head_dim"], ...]
    block_tables: Int[Array, "slots max_blocks"]

    @property
    def block_size(self) -> int:
        """Tokens per block (static)."""
        return self.k[0].shape[2]

    @property
    def num_blocks(self) -> int:
        """Blocks per pool (static)."""
        return self.k[0].shape[1]

    @property
    def max_tokens(self) -> int:
        """Positions a slot's table covers: `max_blocks * block_size` (static)."""
        return self.block_tables.shape[1] * self.block_size


class PagedDecodeState(DecodeState):
    """The paged engine's decode state: a `DecodeState` whose `generation.cache` is a one-slot
    placeholder (the keys and values live in `paged`) plus `paged`, a `PagedCache`."""

    paged: PagedCache


def gather(
    paged: PagedCache,
    tables: Int[Array, "rows max_blocks"],
    lengths: Int[Array, " rows"],
    extra: int,
) -> KVCache:
    """The rows' blocks read through `tables` as a contiguous `KVCache` (no rings), written
    from the first column after every gathered one.

    **Arguments:** `tables`: each row's block table (`-1` = none), or its first `nb` columns
    (`tables[:, :nb]`: only those blocks are read, the copy costs `nb * block_size` columns per
    row; a dispatch passes the smallest of `PagedKV.gather_buckets` covering its rows);
    `lengths`: the positions to read per row (`0` for an idle row; at most `nb * block_size`,
    larger ones are clipped to it); `extra` (static): empty columns after the table's.

    **Returns:** a `KVCache` of `len(tables)` rows and `width + extra` columns, `width = nb *
    block_size`: column `c < width` holds position `c` where `c < lengths[row]` (else `-1`,
    masked; so do the `extra` columns), and the write index (`KVCache.length`, the same for
    every row) is `max(lengths)` (clipped to `width`): a model call writes its tokens from
    there on, and a decode step's attention reads only the columns up to its last token
    (rounded up to one of the plan's `attention_lengths` of `width + extra` on the CPU), not
    the whole width. At most `width + extra - max(lengths)` columns can be written (`window`
    takes them back)."""
    rows, width = tables.shape[0], tables.shape[1] * paged.block_size
    blocks = jnp.maximum(tables, 0)

    def read(pool):  # [kvh, blocks, bs, hd] -> [rows, kvh, width + extra, hd]
        kvh, hd = pool.shape[0], pool.shape[3]
        x = pool[:, blocks].reshape(kvh, rows, width, hd).transpose(1, 0, 2, 3)
        return jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0)))

    lengths = jnp.minimum(lengths.astype(jnp.int32), width)
    columns = jnp.arange(width + extra, dtype=jnp.int32)
    positions = jnp.where(columns[None] < lengths[:, None], columns[None], -1)
    return KVCache(
        k=tuple(read(p) for p in paged.k),
        v=tuple(read(p) for p in paged.v),
        positions=positions.astype(jnp.int32),
        length=jnp.full((rows,), jnp.max(lengths), jnp.int32),
    )


def window(cache: KVCache, first: Int[Array, ""], width: int) -> KVCache:
    """The `width` (static) columns of `cache` from column `first` (dynamic) on: what a
    dispatch over a `gather`ed cache wrote, when it wrote from `first` (the gathered cache's
    write index), for `scatter` to take back by their positions.

    **Arguments:** `cache`: a `KVCache` without rings (a `gather`ed one) of at least `first +
    width` columns.

    **Returns:** a `KVCache` of `width` columns (its `length` is `cache`'s).

    **Raises:** `ValueError` for a cache with ring layers (their slots are not columns)."""
    if cache.ring_layers:
        raise ValueError("`window` takes a cache without ring layers (a gathered one)")

    def cut(x, axis):
        return jax.lax.dynamic_slice_in_dim(x, first, width, axis=axis)

    return KVCache(
        k=tuple(cut(x, 2) for x in cache.k),
        v=tuple(cut(x, 2) for x in cache.v),
        positions=cut(cache.positions, 1),
        length=cache.length,
    )


def scatter(
    paged: PagedCache,
    cache: KVCache,
    tables: Int[Array, "rows max_blocks"],
    start: Int[Array, " rows"],
) -> PagedCache:
    """`paged` with the keys and values of `cache`'s columns written to their blocks: column
    `c` of row `r`, at position `p = cache.positions[r, c]`, goes to `tables[r, p //
    block_size]`, offset `p % block_size`, when `p >= start[r]` and that block exists; the rest
    (padding, idle rows, shared prefix blocks below `start`) is dropped. A dispatch over a
    `gather`ed cache passes only the columns it wrote (`window`). A ring layer of `cache` (a
    prefill's sliding-window layer, `KVCache.ring_layers`) writes its ring slots by
    `ring_positions` instead: the window's keys, all that later queries of that layer read.
    """
    bs, nb = paged.block_size, paged.num_blocks

    def index(positions):  # [rows, cols] -> flat pool rows [rows * cols], nb * bs = dropped
        logical = jnp.clip(positions // bs, 0, tables.shape[1] - 1)
        block = jnp.take_along_axis(tables, logical, axis=1)
        keep = (positions >= 0) & (positions >= start[:, None]) & (block >= 0)
        return jnp.where(keep, block * bs + positions % bs, nb * bs).reshape(-1)

    full = index(cache.positions)
    ring = None if cache.ring_positions is None else index(cache.ring_positions)

    def write(i, pool, x):  # x [rows, kvh, cols, hd]; a ring layer's columns are ring slots
        at = ring if i in cache.ring_layers else full
        kvh, hd = pool.shape[0], pool.shape[3]
        flat = pool.reshape(kvh, nb * bs, hd)
        new = x.transpose(1, 0, 2, 3).reshape(kvh, -1, hd)
        return flat.at[:, at].set(new.astype(pool.dtype), mode="drop").reshape(pool.shape)

    return PagedCache(
        k=tuple(write(i, p, x) for i, (p, x) in enumerate(zip(paged.k, cache.k))),
        v=tuple(write(i, p, x) for i, (p, x) in enumerate(zip(paged.v, cache.v))),
        block_tables=tables,
    )


def _paged_generate(
    model,
    state: PagedDecodeState,
    tables: Int[Array, "slots max_blocks"],
    num_steps: int,
    limit,
    eos_token_id,
    pad_token_id,
    until_finish: Bool[Array, ""] | None = None,
    blocks: int | None = None,
):
    """`programs._generate` over the slots' gathered blocks, written from the longest busy
    slot's length on (`gather`'s write index), the `num_steps` columns from there scattered
    back (`window`, `scatter`; see the module docstring). A model whose plan reads blocks in
    place (`AbstractCausalLM.paged_decode`: the GPU plan's Pallas kernel) gets the pools and
    tables as a `PagedKVCache` instead: no gather, no scatter, each step writes its keys into
    their blocks.

    **Arguments:** `blocks` (static): the leading blocks of every table gathered (`tables[:,
    :blocks]`; `None`: all), which must hold every busy slot's positions (`PagedKV.generate`
    picks the smallest of `PagedKV.gather_buckets` that holds them after the dispatch); the
    scatter goes through the whole `tables`."""
    gen = state.generation
    lengths = jnp.where(gen.done, 0, gen.length)
    if model.paged_decode:  # the model reads the blocks in place (the GPU plan's kernel)
        cache = PagedKVCache(state.paged.k, state.paged.v, tables[:, :blocks], lengths)
        inner = DecodeState(dataclasses.replace(gen, cache=cache), state.params, state.pool)
        decode = (num_steps, limit, eos_token_id, pad_token_id, until_finish)
        inner, out = _generate(model, inner, *decode)
        new = inner.generation.cache
        gen = dataclasses.replace(inner.generation, cache=gen.cache)
        paged = PagedCache(new.k, new.v, tables)
        return PagedDecodeState(gen, inner.params, inner.pool, paged), out
    cache = gather(state.paged, tables[:, :blocks], lengths, num_steps)
    first = cache.length[0]
    inner = DecodeState(dataclasses.replace(gen, cache=cache), state.params, state.pool)
    inner, out = _generate(model, inner, num_steps, limit, eos_token_id, pad_token_id, until_finish)
    zeros = jnp.zeros((tables.shape[0],), jnp.int32)
    written = window(inner.generation.cache, first, num_steps)
    paged = scatter(state.paged, written, tables, zeros)
    gen = dataclasses.replace(inner.generation, cache=gen.cache)
    return PagedDecodeState(gen, inner.params, inner.pool, paged), out


def _paged_insert(
    prefix: Prefix,
    state: PagedDecodeState,
    slot: Int[Array, ""],
    tables: Int[Array, "slots max_blocks"],
    cached: Int[Array, ""],
) -> PagedDecodeState:
    """`prefix` into `slot`: its keys and values at positions `>= cached` scattered into the
    slot's blocks (`tables[slot]`), its tokens, logits, key and parameters as `_insert` puts
    them."""
    row = jax.lax.dynamic_slice_in_dim(tables, slot, 1)
    paged = scatter(state.paged, prefix.cache, row, cached[None])
    paged = dataclasses.replace(paged, block_tables=tables)
    base = _with_prefix(prefix, state, slot, state.generation.cache)
    return PagedDecodeState(base.generation, base.params, base.pool, paged)


def _gather_row(paged: PagedCache, row: Int[Array, " max_blocks"], cached, width: int) -> KVCache:
    return gather(paged, row[None], cached[None], width)


def _paged_chunk(
    model,
    state: PagedDecodeState,
    tables: Int[Array, "slots max_blocks"],
    slot: Int[Array, ""],
    token_ids: Int[Array, "1 seq"],
    positions: Int[Array, "1 seq"],
    written: Int[Array, ""],
    blocks: int | None = None,
) -> tuple[PagedDecodeState, Float[Array, " vocab"]]:
    """One prefill chunk of the request admitted into `slot`, straight into its blocks
    (`tables`: the allocator's block tables, which become the state's): the slot's first
    `written` positions gathered through its table row (`gather`: the chunk is written at
    columns `[written, written + seq)`, so its attention reads the columns up to there, rounded
    up to one of the plan's lengths, not the whole table), the model run over `token_ids` /
    `positions` (left padding at position `-1`), and the chunk's keys and values at positions
    `>= written` scattered into the slot's blocks (`window`, `scatter`; the padding is dropped).
    `blocks` (static): the leading blocks of the row gathered (`None`: all; they must hold the
    `written` positions: the mixed dispatch passes its bucket, which holds the chunk's end).

    **Returns:** the state with the chunk written and the logits after its last token."""
    row = jax.lax.dynamic_slice_in_dim(tables, slot, 1)
    seq = token_ids.shape[1]
    cache = gather(state.paged, row[:, :blocks], written[None], seq)
    first = cache.length[0]
    logits, cache = model(token_ids, positions, cache, logits_to_keep=1)
    paged = scatter(state.paged, window(cache, first, seq), row, written[None])
    paged = dataclasses.replace(paged, block_tables=tables)
    return PagedDecodeState(state.generation, state.params, state.pool, paged), logits[0, -1]


def _paged_mixed(
    model,
    state: PagedDecodeState,
    tables: Int[Array, "slots max_blocks"],
    chunk,
    num_steps: int,
    limit,
    eos_token_id,
    pad_token_id,
    until_finish: Bool[Array, ""],
    blocks: int | None = None,
):
    """The mixed dispatch: one prefill chunk (`chunk`: `_paged_chunk`'s `(slot, token_ids,
    positions, written)`) into its slot's blocks, then `_paged_generate`'s decode steps of the
    busy slots (the arguments after `chunk`: its arguments after `tables`), in ONE program (no
    host round trip between them). The prefilling slot is idle (`done`) in the decode state, so
    the decode steps neither read nor write its blocks. Both gather `blocks` (static) leading
    blocks per table: one bucket holding the chunk's end and every busy slot's positions.

    **Returns:** `(state, out, logits)`: `_paged_generate`'s, and the logits after the
    chunk's last token."""
    state, logits = _paged_chunk(model, state, tables, *chunk, blocks)
    decode = (num_steps, limit, eos_token_id, pad_token_id, until_finish, blocks)
    state, out = _paged_generate(model, state, tables, *decode)
    return state, out, logits


paged_generate_jit = engine_program(_paged_generate, "all-except-first")
paged_chunk_jit = engine_program(_paged_chunk, "all-except-first")
paged_mixed_jit = engine_program(_paged_mixed, "all-except-first")
paged_insert_jit = engine_program(_paged_insert, "all-except-first")
gather_row_jit = engine_program(_gather_row)


class BlockPrefill:
    """A prompt being prefilled chunk by chunk straight into its slot's blocks (the paged
    engine's mixed prefill, `Engine(mixed_prefill=True)`): each chunk runs either alone
    (`PagedKV.run_chunk`, while no slot decodes) or inside a decode dispatch (`PagedKV.generate`
    with `prefill=`: `_paged_mixed`), and after the last one `PagedKV.prefix` gives the `Prefix`
    to `insert` (its keys and values are already in the blocks).

    The prompt's uncached part (from `admission.cached_tokens` on) is left-padded to a multiple
    of `chunk` tokens, as `Engine.prefill_chunks` pads a long prompt, so the last chunk ends on
    the prompt's last token.

    **Attributes:** `request`, `admission`, `chunk`; `token_ids`, `positions: Int[ndarray, "1
    seq"]` (the padded prompt; padding at position `-1`); `num_chunks`, `chunks_run`; `logits:
    Float[Array, " vocab"] | None` (after the last chunk run)."""

    def __init__(self, request, admission: Admission, chunk: int, pad_token_id: int):
        self.request, self.admission, self.chunk = request, admission, chunk
        start = admission.cached_tokens
        ids = np.asarray(request.token_ids[start:], np.int32)
        n = len(ids)
        width = -(-n // chunk) * chunk
        self.token_ids = np.full((1, width), pad_token_id, np.int32)
        self.positions = np.full((1, width), -1, np.int32)
        self.token_ids[0, width - n :] = ids
        self.positions[0, width - n :] = np.arange(start, start + n)
        self.num_chunks = width // chunk
        self.chunks_run = 0
        self.logits = None

    @property
    def pending(self) -> bool:
        """Chunks are left to run."""
        return self.chunks_run < self.num_chunks

    @property
    def end(self) -> int:
        """The slot's positions written once the next chunk has run (its last token's position
        plus one; host data, no transfer): what the mixed dispatch's bucket must hold."""
        return int(self.positions[0, (self.chunks_run + 1) * self.chunk - 1]) + 1

    def take(self) -> tuple:
        """The next chunk as `_paged_chunk`'s `(slot, token_ids, positions, written)` (device
        arrays; `written`: the prompt positions before its first token), counted as run."""
        a = self.chunks_run * self.chunk
        ids, positions = (
            self.token_ids[:, a : a + self.chunk],
            self.positions[:, a : a + self.chunk],
        )
        written = max(int(positions[0, 0]), self.admission.cached_tokens)
        self.chunks_run += 1
        as32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
        return as32(self.admission.slot), as32(ids), as32(positions), as32(written)


class PagedKV:
    """The engine's paged KV cache: the `BlockAllocator` (host) and the programs over a
    `PagedDecodeState` (device). `Engine(block_size=...)` makes one and hands it its calls.

    **Arguments:** `model` (its cache dtype and shapes), `max_slots`, `max_len` (tokens per
    slot), `block_size` (tokens per block), `num_blocks` (blocks per pool; `None`: enough for
    every slot's `max_len`, `max_slots * ceil(max_len / block_size)`), `prefix_caching`;
    keyword-only `preemption` (`True`: on-demand blocks, preempted by `serving.preemption`; `False`:
    every admission reserves its worst case) and `num_steps` (the engine's steps per dispatch:
    admission keeps room for one dispatch, `lookahead`).

    **Raises:** `ValueError` for a `block_size` or `num_blocks` that is not a positive integer,
    or a model with key/value branch axes (classifier-free guidance pairs)."""

    reads_in_place = True
    """Whether the decode dispatch hands a `paged_decode` model the pools and tables as they are
    (`_paged_generate`); `serving.paged_speculative`'s dispatch always gathers."""

    def __init__(
        self,
        model,
        max_slots,
        max_len,
        block_size,
        num_blocks=None,
        prefix_caching=True,
        *,
        preemption=False,
        num_steps=1,
    ):
        for name, value in (("block_size", block_size), ("num_blocks", num_blocks)):
            if value is None and name == "num_blocks":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        self.max_blocks = -(-max_len // block_size)
        self.gather_buckets = gather_buckets(self.max_blocks)
        """The block counts a decode dispatch may gather per slot (`gather_buckets`: 1/8, 1/4,
        1/2 and all of `max_blocks`, ascending); `generate` takes the smallest that holds every
        busy slot's positions after the dispatch, and `Engine.precompile` compiles each. Only
        the whole table when the model reads the blocks in place (`paged_decode`, the GPU
        plan's kernel: it reads each row only up to its length whatever the table's width, so
        buckets would only add programs to compile) and the dispatch does not speculate."""
        if model.paged_decode and self.reads_in_place:
            self.gather_buckets = (self.max_blocks,)
        if num_blocks is None:
            num_blocks = max_slots * self.max_blocks
        self.preemption = bool(preemption)
        """On-demand blocks with preemption (`serving.preemption`), or worst-case reservations."""
        self.num_steps = num_steps
        self.allocator = BlockAllocator(
            num_blocks,
            block_size,
            max_slots,
            self.max_blocks,
            prefix_caching=prefix_caching,
            on_demand=self.preemption,
        )
        template = model.init_cache(1, 1)
        if template.k[0].ndim != 4:
            raise ValueError(
                "the paged KV cache takes caches of [batch, kv_heads, slots, head_dim]"
            )
        self.shapes = [(x.shape[1], x.shape[3], x.dtype) for x in template.k]
        self.model = model
        """The model of the paged decode and cached-prefix prefill programs (the engine's)."""
        self.rings = bool(jax.eval_shape(lambda: model.init_cache(1, 1)).ring_layers)
        """Whether the model's own caches keep sliding-window layers in rings (`KVCache`): a
        cold prefill then runs over `prefill_cache` instead, so that its blocks hold every
        position of every layer (a ring keeps only the window's last positions, and a block a
        later prompt shares must hold all of them)."""
        self.admissions: dict[int, Admission] = {}
        self.requests: dict[int, Request] = {}
        """The request each admitted slot holds (what a preemption queues again)."""
        self.order: dict[int, int] = {}
        """Each admitted slot's admission number (from 0 up): a preemption takes the newest
        first (`serving.preemption`)."""
        self._admitted = 0
        self.inserted: set[int] = set()
        """The admitted slots whose `insert` ran (the others are still prefilling)."""
        self.preemptions = 0
        """Requests preempted so far (`serving.preemption`; `/metrics`'
        `functional_gen_preemptions`)."""
        self.prefilled_tokens = 0
        """Prompt tokens prefilled so far (those taken from the prefix cache not counted)."""
        self.waits = 0
        """Admissions refused for want of blocks (each retried later)."""
        self.chunks_mixed = 0
        """`BlockPrefill` chunks run inside a decode dispatch (`generate(..., prefill=...)`)."""
        self.chunks_alone = 0
        """`BlockPrefill` chunks run on their own (`run_chunk`: no slot was decoding)."""

    def init_state(self, base: DecodeState) -> PagedDecodeState:
        """`base` (an empty lockstep state whose cache has one slot per row) with empty
        pools, and a fresh allocator (no slot holds blocks, nothing is cached)."""
        a = self.allocator  # a new pool: what the old one cached is gone
        self.allocator = BlockAllocator(
            a.num_blocks, a.block_size, a.max_slots, a.max_blocks_per_slot,
            prefix_caching=a.prefix_caching, on_demand=a.on_demand,
        )  # fmt: skip
        self.admissions.clear()
        self.requests.clear()
        self.order.clear()
        self.inserted.clear()
        nb, bs = self.allocator.num_blocks, self.allocator.block_size

        def pools():
            return tuple(jnp.zeros((h, nb, bs, d), t) for h, d, t in self.shapes)

        tables = jnp.asarray(self.allocator.block_tables)
        paged = PagedCache(pools(), pools(), tables)
        return PagedDecodeState(base.generation, base.params, base.pool, paged)

    @property
    def tokens_per_step(self) -> int:
        """The most positions one decode step writes per slot (1; a speculating engine's
        `write_width`)."""
        return self.programs()[1]

    @property
    def lookahead(self) -> int:
        """Positions one dispatch of `num_steps` steps may write per slot: `num_steps x
        tokens_per_step` (what `admit` keeps room for, `preemption` on)."""
        return self.num_steps * self.tokens_per_step

    def admit(self, request, slot: int) -> Admission | None:
        """Blocks for `request` in `slot` (`BlockAllocator.admit` with the request's tokens and
        its prompt plus `max_new_tokens` positions, and `lookahead`); `None`: it must wait."""
        a = self.allocator
        max_tokens = min(
            request.prompt_length + request.max_new_tokens, a.max_blocks_per_slot * a.block_size
        )
        admission = a.admit(slot, request.token_ids, max_tokens, lookahead=self.lookahead)
        if admission is None:
            self.waits += 1
        else:
            self.admissions[slot] = admission
            self.requests[slot] = request
            self.order[slot] = self._admitted
            self._admitted += 1
        return admission

    def release(self, slot: int, token_ids: Sequence[int] | None = None) -> None:
        """The request in `slot` ended: its blocks go back (`BlockAllocator.free`). With
        `token_ids` (the request's prompt and generated tokens whose keys and values its blocks
        hold: every token but the last one generated), their full blocks are first registered in
        the prefix cache (`BlockAllocator.register_tokens`), generated ones included, as vLLM
        caches every full block: a later prompt that continues this conversation takes them
        back instead of prefilling them again."""
        if token_ids is not None:
            self.allocator.register_tokens(slot, token_ids)
        self.admissions.pop(slot, None)
        self.requests.pop(slot, None)
        self.order.pop(slot, None)
        self.inserted.discard(slot)
        self.allocator.free(slot)

    def written(self, gen) -> Int[Array, " slots"]:
        """Per slot the positions whose keys and values are in its blocks: its `length` (a
        decode step feeds the token it takes). A preemption registers those blocks
        (`serving.preemption.Preemptor.read_slot`)."""
        return gen.length

    def check_fits(self, num_tokens: int) -> None:
        """**Raises:** `ValueError` when a request of `num_tokens` positions (prompt plus
        `max_new_tokens`) needs more blocks than the pool has (it could never be admitted)."""
        need = self.allocator.blocks_needed(num_tokens)
        if need > self.allocator.num_blocks:
            raise ValueError(
                f"the request needs {need} blocks of {self.allocator.block_size} tokens for "
                f"{num_tokens} positions; the pool has num_blocks={self.allocator.num_blocks}"
            )

    def prefill_cached(
        self, engine, request, admission: Admission, state: PagedDecodeState
    ) -> Iterator[Prefix | None]:
        """Prefill `request` from `admission.cached_tokens` on, over its cached blocks gathered
        from `state` now (at this call, before the state is donated again): the rest of the
        prompt left-padded to `engine.prefill_width` of its length and run in chunks of
        `engine.prefill_chunk`, yielding `None` between chunks and the `Prefix` last."""
        start = admission.cached_tokens
        ids = np.asarray(request.token_ids[start:], np.int32)
        n = len(ids)
        width = engine.prefill_width(n)
        token_ids = np.full((1, width), engine.pad_token_id, np.int32)
        positions = np.full((1, width), -1, np.int32)
        token_ids[0, width - n :] = ids
        positions[0, width - n :] = np.arange(start, start + n)
        row = jnp.asarray(self.allocator.block_tables[admission.slot])
        cache = gather_row_jit(state.paged, row, jnp.asarray(start, jnp.int32), width)
        self.prefilled_tokens += n

        def chunks(cache):
            logits, cache = yield from chunked_prefill(
                self.model, cache, token_ids, positions, engine.prefill_chunk
            )
            yield engine._prefix(request, logits, cache)

        return chunks(cache)

    def block_prefill(self, engine, request, admission: Admission) -> BlockPrefill | None:
        """A `BlockPrefill` for `request` (admitted by `admit`) when `engine.mixed_prefill` is on
        and the prompt's uncached part is longer than `engine.prefill_chunk`; else `None` (the
        prompt is prefilled as `Engine.prefill_chunks` does)."""
        n = len(request.token_ids) - admission.cached_tokens
        if not engine.mixed_prefill or n <= engine.prefill_chunk:
            return None
        self.prefilled_tokens += n
        return BlockPrefill(request, admission, engine.prefill_chunk, engine.pad_token_id)

    def run_chunk(self, state: PagedDecodeState, prefill: BlockPrefill) -> PagedDecodeState:
        """The next chunk of `prefill` alone (`_paged_chunk`; `state` is donated), counted in
        `chunks_alone`."""
        self.chunks_alone += 1
        tables = jnp.asarray(self.allocator.block_tables)
        state, prefill.logits = paged_chunk_jit(self.model, state, tables, *prefill.take())
        return state

    def prefix(self, engine, prefill: BlockPrefill) -> Prefix:
        """The `Prefix` of a `BlockPrefill` whose chunks have all run: its logits, and as cache a
        one-column placeholder at position `-1` (`insert` writes nothing of it: the keys and
        values are in the blocks already).

        **Raises:** `ValueError` while chunks are left."""
        if prefill.pending:
            raise ValueError(
                f"{prefill.num_chunks - prefill.chunks_run} of {prefill.num_chunks} prefill "
                "chunks have not run yet"
            )
        empty = tuple(jnp.zeros((1, h, 1, d), t) for h, d, t in self.shapes)
        placeholder = KVCache(
            k=empty,
            v=empty,
            positions=jnp.full((1, 1), -1, jnp.int32),
            length=jnp.ones((1,), jnp.int32),
        )
        return engine._prefix(prefill.request, prefill.logits, placeholder)

    def insert(self, prefix: Prefix, state: PagedDecodeState, slot: int) -> PagedDecodeState:
        """`prefix` into `slot` (admitted by `admit`): the new keys and values into its blocks,
        then its full prompt blocks registered in the prefix cache."""
        admission = self.admissions[slot]
        tables = jnp.asarray(self.allocator.block_tables)
        state = paged_insert_jit(
            prefix,
            state,
            jnp.asarray(slot, jnp.int32),
            tables,
            jnp.asarray(admission.cached_tokens, jnp.int32),
        )
        self.allocator.register(admission)
        self.inserted.add(slot)
        return state

    def prefill_cache(self, width: int) -> KVCache:
        """An empty one-row cache of `width` slots for a cold prefill whose keys and values go
        to blocks: the model's `init_cache(1, width)` with its sliding-window layers as full
        layers (`KVCache.init(..., rings=False)`: the same results, every position kept), so
        that `insert` writes every position of every layer and the prompt's full blocks can be
        shared (prefix caching) and registered on preemption. Without rings, `init_cache`'s.

        **Returns:** a `KVCache` of 1 row and `width` slots, no ring layers."""
        cache = self.model.init_cache(1, width)
        if not cache.ring_layers:
            return cache
        return KVCache.init(self.model.config, 1, width, cache.k[0].dtype, rings=False)

    def grow(self, state: PagedDecodeState, num_tokens: int) -> Int[Array, "slots max_blocks"]:
        """Before a dispatch: each busy slot's blocks extended to cover `num_tokens` positions
        past its length (`BlockAllocator.extend`, within its reservation, or with `preemption`
        from the pool; one small transfer of the slots' lengths).

        **Returns:** the block tables, on the device.

        **Raises:** `RuntimeError` (`preemption` on) when the pool cannot give a busy slot its
        blocks: call `Engine.make_room` (`serving.preemption`) before the dispatch, which
        preempts."""
        return self._grow(state, num_tokens)[0]

    def _grow(self, state: PagedDecodeState, num_tokens: int) -> tuple:
        """`grow`, and the most positions a busy slot holds after the dispatch (`length +
        num_tokens`, the largest over busy slots; `0` when none is busy), from the same
        transfer: `(tables, reach)`."""
        length, done = jax.device_get((state.generation.length, state.generation.done))
        busy = np.flatnonzero(~done).tolist()
        for slot in busy:
            if slot in self.admissions and not self.allocator.extend(
                slot, int(length[slot]) + num_tokens
            ):
                raise RuntimeError(
                    f"slot {slot} needs blocks for {num_tokens} more positions and the pool has "
                    "too few free: call Engine.make_room before Engine.generate (it preempts "
                    "the most recently admitted requests)"
                )
        reach = max((int(length[s]) + num_tokens for s in busy), default=0)
        return jnp.asarray(self.allocator.block_tables), reach

    def gather_blocks(self, positions: int) -> int:
        """The smallest of `gather_buckets` whose blocks hold `positions` positions per slot
        (`nb * block_size >= positions`), the last (every block) when none does."""
        bs = self.allocator.block_size
        return next((b for b in self.gather_buckets if b * bs >= positions), self.max_blocks)

    def generate(
        self,
        engine,
        state: PagedDecodeState,
        n: int,
        until_finish: bool,
        prefill: BlockPrefill | None = None,
        *,
        blocks: int | None = None,
    ):
        """One dispatch of `n` decode steps: each busy slot's blocks extended to cover `n` more
        positions (`n * tokens_per_step` of `programs`; within its reservation), then
        `paged_generate_jit`; with `prefill` (chunks pending) the mixed program
        `paged_mixed_jit`, which runs its next chunk first (counted in `chunks_mixed`).

        The programs gather only the first `gather_blocks(reach)` blocks of every table (a
        static argument: one compiled program per bucket), `reach` the most positions a busy
        slot holds after the dispatch (`length + n * tokens_per_step`, from `grow`'s transfer of
        the lengths) or the chunk's end (`BlockPrefill.end`), whichever is larger; so a dispatch
        copies each slot's blocks up to that bucket, not its whole table. Run it after
        `Engine.make_room`, which may extend the tables.

        **Arguments:** `blocks` (keyword-only, for `Engine.precompile`): run this bucket of
        `gather_buckets` instead of the smallest one that fits.

        **Returns:** `(state, out)`, `out` a `StepOutput`.

        **Raises:** `ValueError` for a `blocks` not in `gather_buckets` or smaller than the
        dispatch needs."""
        fixed, per_step, generate_program, mixed_program = self.programs()
        tables, reach = self._grow(state, n * per_step)
        if prefill is not None:
            reach = max(reach, prefill.end)
        need = self.gather_blocks(reach)
        if blocks is None:
            blocks = need
        elif blocks not in self.gather_buckets or blocks < need:
            raise ValueError(
                f"`blocks`={blocks!r} must be one of {self.gather_buckets}, at least {need} "
                f"(the dispatch reaches {reach} positions)"
            )
        decode = (
            n,
            jnp.asarray(n, jnp.int32),
            engine.eos_token_id,
            engine.pad_token_id,
            jnp.asarray(bool(until_finish)),
            blocks,
        )
        if prefill is None:
            return generate_program(fixed, state, tables, *decode)
        self.chunks_mixed += 1
        chunk = prefill.take()
        state, out, prefill.logits = mixed_program(fixed, state, tables, chunk, *decode)
        return state, out

    def programs(self) -> tuple:
        """What `generate` runs: `(fixed, tokens_per_step, generate_program, mixed_program)`:
        the programs' first argument (the model), the most positions a step writes per slot
        (the blocks a dispatch extends a slot by), and the decode and mixed programs
        (`paged_generate_jit`, `paged_mixed_jit`; `serving.paged_speculative` has its own)."""
        return self.model, 1, paged_generate_jit, paged_mixed_jit
