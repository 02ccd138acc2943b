"""`PagedKVCache`: keys and values in fixed-size blocks of one pool per layer, read through a
block table per row, for the model's decode steps (the serving engine's paged cache).

Source: Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with
PagedAttention" (vLLM): row `r`'s position `p` lives at `pool[:, table[r, p // block_size], p %
block_size]`. The pools are head-major, `[kv_heads, num_blocks, block_size, head_dim]`, the
layout of jax's Pallas paged-attention kernel (`jax.experimental.pallas.ops.gpu.paged_attention`),
so the GPU plan attends through the tables with no copy (`ExecutionPlan.paged_attention`).

Unlike `KVCache`, rows are not written in lockstep: every row has its own `length` and a call
writes each token at its own position (`-1`: padding, written nowhere). No ring layers: a
sliding-window layer keeps every position and masks by position (`Attention._allowed`). The
model takes a `PagedKVCache` wherever it takes a `KVCache` for decode (`DecoderModel.__call__`):
a call of `seq` tokens per row at positions `positions` writes them into their blocks and
attends from each to the positions up to it. A prefill (a `prefill_chunk`) and prefix-LM calls
take a `KVCache`.
"""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

PALLAS_BLOCK_H = 16
"""The kernel's `block_h` (query heads of one KV head per program; the kernel pads to it and
requires a multiple of 16)."""


class PagedLayerCache(eqx.Module):
    """One layer's view of a `PagedKVCache` during a model call (as `LayerCache` is a
    `KVCache`'s).

    **Attributes:** `k`, `v`: `Float[Array, "kv_heads blocks block_size head_dim"]`, this layer's
    pools; `block_tables`: `Int[Array, "batch max_blocks"]` (`-1` = no block); `length`:
    `Int[Array, " batch"]`, the positions of each row written before this call."""

    k: Float[Array, "kv_heads blocks block_size head_dim"]
    v: Float[Array, "kv_heads blocks block_size head_dim"]
    block_tables: Int[Array, "batch max_blocks"]
    length: Int[Array, " batch"]


class PagedKVCache(eqx.Module):
    """Per-layer block pools, the rows' block tables and lengths (see the module docstring).

    **Attributes:**

    - `k`, `v`: one array per layer, `Float[Array, "kv_heads blocks block_size head_dim"]`:
      keys (after RoPE) and values of every written position, in blocks.
    - `block_tables`: `Int[Array, "batch max_blocks"]`: row `r`'s logical block `j` (positions
      `[j * block_size, (j + 1) * block_size)`) is physical block `block_tables[r, j]`; `-1` =
      none (a position there is neither written nor read).
    - `length`: `Int[Array, " batch"]`: per row, the positions written so far (`[0, length)`,
      each in its block); a call moves it to one past the last position it wrote.

    **Raises:** `ValueError` (at construction, before any compilation) naming the mismatch: no
    layers, `k` and `v` of different layer counts or shapes, a pool that is not 4-D or whose
    blocks differ from the first layer's, tables that are not 2-D, or `length` not one per row.
    """

    k: tuple[Float[Array, "kv_heads blocks block_size head_dim"], ...]
    v: tuple[Float[Array, "kv_heads blocks block_size head_dim"], ...]
    block_tables: Int[Array, "batch max_blocks"]
    length: Int[Array, " batch"]

    def __check_init__(self):
        if not self.k or len(self.k) != len(self.v):
            raise ValueError(
                f"a PagedKVCache needs one key and one value pool per layer, got {len(self.k)} "
                f"key and {len(self.v)} value pools"
            )
        first = tuple(self.k[0].shape)
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            if len(k.shape) != 4 or tuple(v.shape) != tuple(k.shape) or k.shape[1:3] != first[1:3]:
                raise ValueError(
                    f"layer {i}: key pool {tuple(k.shape)} and value pool {tuple(v.shape)}; "
                    "expected equal [kv_heads, num_blocks, block_size, head_dim] pools with "
                    f"layer 0's blocks ({first[1]} of {first[2]})"
                )
        tables, length = tuple(self.block_tables.shape), tuple(self.length.shape)
        if len(tables) != 2 or length != tables[:1]:
            raise ValueError(
                f"block_tables {tables} and length {length}: expected [batch, max_blocks] "
                "tables and one length per row"
            )

    @property
    def block_size(self) -> int:
        """Positions per block."""
        return self.k[0].shape[2]

    @property
    def batch_size(self) -> int:
        """Rows (block tables)."""
        return self.block_tables.shape[0]

    def layer(self, i: int) -> PagedLayerCache:
        """Layer `i`'s view."""
        return PagedLayerCache(self.k[i], self.v[i], self.block_tables, self.length)

    def advanced(
        self,
        k: tuple[Array, ...],
        v: tuple[Array, ...],
        positions: Int[Array, "batch seq"],
    ) -> "PagedKVCache":
        """This cache with the pools `k`, `v` a call returned and each row's `length` moved
        past the last of its `positions` (`-1` = padding: no move)."""
        return PagedKVCache(
            tuple(k), tuple(v), self.block_tables, written_length(self.length, positions)
        )


def written_length(
    length: Int[Array, " batch"], positions: Int[Array, "batch seq"]
) -> Int[Array, " batch"]:
    """Per row, `length` after a call wrote its tokens at `positions`: one past the largest
    position written, never less than before (`-1` = padding)."""
    last = jnp.max(jnp.where(positions >= 0, positions + 1, 0), axis=1)
    return jnp.maximum(length, last).astype(jnp.int32)


def write_blocks(
    pool: Float[Array, "kv_heads blocks block_size head_dim"],
    new: Float[Array, "batch kv_heads seq head_dim"],
    block_tables: Int[Array, "batch max_blocks"],
    positions: Int[Array, "batch seq"],
) -> Float[Array, "kv_heads blocks block_size head_dim"]:
    """`pool` with `new[r, :, i]` written at row `r`'s position `positions[r, i]`: block
    `block_tables[r, p // block_size]`, offset `p % block_size`. Padding (`p < 0`) and positions
    without a block (`-1` in the table, or past it) are dropped."""
    kvh, nb, bs, hd = pool.shape
    logical = jnp.clip(positions // bs, 0, block_tables.shape[1] - 1)
    block = jnp.take_along_axis(block_tables, logical, axis=1)
    inside = (positions >= 0) & (positions // bs < block_tables.shape[1]) & (block >= 0)
    at = jnp.where(inside, block * bs + positions % bs, nb * bs).reshape(-1)
    flat = pool.reshape(kvh, nb * bs, hd)
    rows = new.transpose(1, 0, 2, 3).reshape(kvh, -1, hd).astype(pool.dtype)
    return flat.at[:, at].set(rows, mode="drop").reshape(pool.shape)


def gather_blocks(
    pool: Float[Array, "kv_heads blocks block_size head_dim"],
    block_tables: Int[Array, "batch max_blocks"],
    length: Int[Array, " batch"],
) -> tuple[Float[Array, "batch kv_heads slots head_dim"], Int[Array, "batch slots"]]:
    """The rows' blocks as contiguous buffers (`slots = max_blocks * block_size`; column `c`
    holds position `c`) and the position of every column (`c` where `c < length[row]`, else
    `-1`: masked), for attention over a contiguous cache (`ExecutionPlan.paged_attention ==
    "gather"`)."""
    kvh, _, bs, hd = pool.shape
    rows, mb = block_tables.shape
    x = pool[:, jnp.maximum(block_tables, 0)]  # [kvh, rows, mb, bs, hd]
    x = x.reshape(kvh, rows, mb * bs, hd).transpose(1, 0, 2, 3)
    columns = jnp.arange(mb * bs, dtype=jnp.int32)
    positions = jnp.where(columns[None] < length[:, None], columns[None], -1)
    return x, positions


def gather_window_blocks(
    pool: Float[Array, "kv_heads blocks block_size head_dim"],
    block_tables: Int[Array, "batch max_blocks"],
    length: Int[Array, " batch"],
    positions: Int[Array, "batch seq"],
    window: int,
) -> tuple[Float[Array, "batch kv_heads slots head_dim"], Int[Array, "batch slots"]]:
    """For a sliding-window layer: per row only the blocks that can hold a key its queries see,
    `span = ceil((seq + window - 2) / block_size) + 1` consecutive logical blocks (at most the
    table: the most blocks `seq - 1 + window` consecutive positions can touch) from the one
    holding its earliest query's position minus `window - 1` (so
    `slots = span * block_size`, whatever the table's width), and each column's position
    (`-1` past `length` or where the table has no block). The window itself is masked by
    position in attention (`Attention._allowed`), so the extra columns only cost their read:
    a 512-token window over 8,192-token tables reads 33 blocks of 16, not 512."""
    kvh, _, bs, hd = pool.shape
    rows, mb = block_tables.shape
    span = min(-(-(positions.shape[1] + window - 2) // bs) + 1, mb)
    earliest = jnp.min(jnp.where(positions >= 0, positions, jnp.iinfo(jnp.int32).max), axis=1)
    earliest = jnp.where(jnp.any(positions >= 0, axis=1), earliest, 0)
    first = jnp.clip((earliest - window + 1) // bs, 0, mb - span)
    logical = first[:, None] + jnp.arange(span, dtype=jnp.int32)[None]  # [rows, span]
    blocks = jnp.take_along_axis(block_tables, logical, axis=1)
    x = pool[:, jnp.maximum(blocks, 0)]  # [kvh, rows, span, bs, hd]
    x = x.reshape(kvh, rows, span * bs, hd).transpose(1, 0, 2, 3)
    columns = (logical[:, :, None] * bs + jnp.arange(bs, dtype=jnp.int32)).reshape(rows, -1)
    held = jnp.repeat(blocks >= 0, bs, axis=1)
    return x, jnp.where((columns < length[:, None]) & held, columns, -1)


def pallas_blocking(max_blocks: int) -> tuple[int, int]:
    """`(k_splits, pages_per_compute_block)` for the Pallas kernel over tables of `max_blocks`
    blocks, which must divide them (the kernel asserts `max_blocks % k_splits == 0` and
    `(max_blocks / k_splits) % pages_per_compute_block == 0`): the largest compute block of
    (8, 4, 2, 1) blocks (the kernel's default is 8), then the most splits of (16, 8, 4, 2, 1)
    (its default is 16) that allow it. A heuristic, not measured on a GPU yet."""
    for per in (8, 4, 2, 1):
        for splits in (16, 8, 4, 2, 1):
            if max_blocks % splits == 0 and (max_blocks // splits) % per == 0:
                return splits, per
    raise AssertionError("unreachable: (1, 1) always divides")


def pallas_attention(
    q: Float[Array, "batch seq heads head_dim"],
    k: Float[Array, "kv_heads blocks block_size head_dim"],
    v: Float[Array, "kv_heads blocks block_size head_dim"],
    block_tables: Int[Array, "batch max_blocks"],
    positions: Int[Array, "batch seq"],
    softcap: float | None,
    interpret: bool,
) -> Float[Array, "batch seq heads head_dim"]:
    """Causal attention of each query (already scaled) over its row's positions `[0, its
    position]`, read through the tables by jax's Pallas paged-attention kernel: the `seq`
    queries of a row become `seq` kernel rows of one token each, of lengths `position + 1`
    (padding, `-1`: length 0, output 0). Scores in float32; `softcap`: Gemma 2's
    `cap * tanh(scores / cap)`, applied by the kernel.

    Source: `jax.experimental.pallas.ops.gpu.paged_attention.paged_attention` (jax's Pallas
    port of vLLM's PagedAttention decode kernel)."""
    # imported here: only the GPU plan calls it, and the Pallas/Triton modules add ~0.1 s to
    # every process's import of functional_gen
    from jax.experimental.pallas.ops.gpu import paged_attention as kernel

    batch, seq, heads, hd = q.shape
    splits, per = pallas_blocking(block_tables.shape[1])
    tables = jnp.repeat(jnp.maximum(block_tables, 0), seq, axis=0)
    lengths = jnp.maximum(positions + 1, 0).reshape(-1).astype(jnp.int32)
    out = kernel.paged_attention(
        q.reshape(batch * seq, heads, hd).astype(k.dtype),
        k,
        v,
        tables,
        lengths,
        block_h=PALLAS_BLOCK_H,
        pages_per_compute_block=per,
        k_splits=splits,
        interpret=interpret,
        attn_logits_soft_cap=softcap,
    )
    return out.reshape(batch, seq, heads, hd)


def check_paged_call(prefill_chunk, prefix_length) -> None:
    """**Raises:** `ValueError` for a call a `PagedKVCache` does not take: a prefill chunk or
    prefix-LM (those run over a `KVCache`)."""
    if prefill_chunk is not None or prefix_length is not None:
        raise ValueError(
            "a PagedKVCache takes decode calls only (prefill_chunk=None, prefix_length=None); "
            f"got prefill_chunk={prefill_chunk!r}, prefix_length given: {prefix_length is not None}"
        )


__all__ = [
    "PagedKVCache",
    "PagedLayerCache",
    "gather_blocks",
    "gather_window_blocks",
    "pallas_attention",
    "pallas_blocking",
    "write_blocks",
    "written_length",
]
