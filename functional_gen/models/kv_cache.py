"""`KVCache`: preallocated key/value buffers of a decoder, as an explicit pytree.

Every leaf has the batch axis first, so reordering rows (beam search, `num_return_sequences`,
forking a generation) is one `jax.tree.map(lambda x: x[idx], cache)`.

Slots and positions. The cache has `max_len` slots per row. A model call with `seq` tokens writes
them to slots `[length, length + seq)` of every row (rows advance in lockstep: a batch is
left-padded, so all rows share one write index) and records each token's RoPE position in
`positions`. Padding tokens and never-written slots have position `-1` and are masked out of
attention, so a left-padded row attends to exactly the tokens it would attend to alone.

Rings. A sliding-window layer (Mistral, Gemma 2/3's local layers) never attends further back than
its window, so its keys and values live in a ring buffer of `ring_length = sliding_window +
RING_RESERVE` slots instead of `max_len` (fewer while `max_len` is smaller). A ring is addressed
by RoPE position, per row: the token at position `p` goes to ring slot `p % ring_length`, and
`ring_positions` records which position each ring slot holds (`-1`: none). Ring layers therefore
do not take part in the lockstep slot layout of the other layers (dead slots left by speculative
decoding cost them nothing). Gemma 3 (5 local layers of window 512 per global one) at 8,192 slots
keeps 22% of the keys and values a cache of full layers would (`ring_length` 544).

Dtype. The key/value buffers are float32 or bfloat16 (`KV_CACHE_DTYPES`), whatever the weights
and activations: a model chooses it (`kv_cache_dtype`, `resolve_kv_cache_dtype`), by default
bfloat16 on a GPU (half the bytes a decode step reads per cached token, and the operand type of
the tensor cores) and float32 elsewhere (XLA's CPU bfloat16 products are 10-20x slower than
float32 ones, research/environment.md §6). Keys and values are rounded to it when written.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from .config import LlamaConfig

RING_RESERVE = 32
"""Ring slots beyond the sliding window. A model call that writes `seq` tokens and is then rolled
back (speculative verification writes `num_tokens + 1` tokens and keeps some,
`functional_gen.speculative.cache.keep_below`) overwrites the ring slots of the `seq` positions
`ring_length` earlier; with `ring_length >= sliding_window + seq - 1` those are outside the window
of every later query, so a rejected write never costs a key still needed. 32 covers speculative
steps of up to 32 proposed tokens (`PromptLookup` proposes 10 by default, `DraftModel` 4); more
are not checked and would lose keys of the window."""

KV_CACHE_DTYPES = ("float32", "bfloat16")
"""The dtypes a `KVCache`'s key/value buffers may have (by name)."""


def default_kv_cache_dtype() -> str:
    """The cache dtype of `"auto"`: `"bfloat16"` when `jax.default_backend()` is a GPU (`"gpu"`,
    `"cuda"`, `"rocm"`), else `"float32"`."""
    return "bfloat16" if jax.default_backend() in ("gpu", "cuda", "rocm") else "float32"


def resolve_kv_cache_dtype(value, name: str = "kv_cache_dtype") -> str:
    """The name (`"float32"` or `"bfloat16"`) of a requested key/value cache dtype.

    **Arguments:** `value`: `"float32"`, `"bfloat16"`, a dtype (`jnp.bfloat16`,
    `np.dtype("float32")`), or `"auto"` / `None` for `default_kv_cache_dtype()`; `name`: the
    argument's name in the error.

    **Raises:** `ValueError` naming `value` for anything else (another dtype, e.g. float16 or
    int8, or a value that is no dtype).
    """
    if value is None or (isinstance(value, str) and value == "auto"):
        return default_kv_cache_dtype()
    dtype = None
    if not isinstance(value, (bool, int, float, complex, np.number)):  # numbers are no dtypes
        try:
            dtype = jnp.dtype(value).name
        except (TypeError, ValueError):
            dtype = None
    if dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"`{name}` must be one of {KV_CACHE_DTYPES + ('auto',)} (or the jnp dtype), got "
            f"{value!r}"
        )
    return dtype


class KVCache(eqx.Module):
    """Per-layer key/value buffers plus the RoPE position of every slot.

    **Attributes:**

    - `k`, `v`: one array per layer, `Float[Array, "batch kv_heads max_len head_dim"]`: keys
      (after RoPE) and values of every written slot; a ring layer (`ring_layers`) has
      `ring` slots instead of `max_len`.
    - `positions`: `Int[Array, "batch max_len"]`, the 0-based RoPE position of the token in each
      slot; `-1` for padding and for slots not written yet.
    - `length`: `Int[Array, " batch"]`, slots written so far in each row, padding included. Rows
      of one cache always hold the same value (they are written in lockstep); it is stored per
      row so that every leaf has a leading batch axis.
    - `ring_positions`: `Int[Array, "batch ring"]`, the position held by each slot of the ring
      layers (shared by all of them; `-1` = none), or `None` without rings.
    - `ring_layers` (static): indices of the layers whose buffers are rings (sliding-window
      layers), `()` when none.
    - `sliding_window` (static): the widest window of those layers (0 without rings);
      `ring_capacity = sliding_window + RING_RESERVE` is the most slots a ring gets.

    A model may add axes between the batch and the rest (the batched classifier-free guidance
    keeps a conditional and an unconditional branch per row: `k` is then `[batch, 2, kv_heads,
    max_len, head_dim]` and `positions` `[batch, 2, max_len]`); the slot axis is always `-2` of
    `k`/`v` and `-1` of `positions` and `ring_positions`.
    """

    # `*branch`: the axes a model may add after the batch (none, or (2,) for guidance pairs)
    k: tuple[Float[Array, "batch *branch kv_heads _slots head_dim"], ...]
    v: tuple[Float[Array, "batch *branch kv_heads _slots head_dim"], ...]
    positions: Int[Array, "batch *branch max_len"]
    length: Int[Array, " batch"]
    ring_positions: Int[Array, "batch *branch ring"] | None = None
    ring_layers: tuple[int, ...] = eqx.field(static=True, default=())
    sliding_window: int = eqx.field(static=True, default=0)

    @classmethod
    def init(
        cls,
        config: LlamaConfig,
        batch_size: int,
        max_len: int,
        dtype=jnp.float32,
        *,
        rings: bool = True,
    ) -> "KVCache":
        """An empty cache.

        **Arguments:**

        - `config`: the model's config (number of layers, key/value heads, head width, the
          per-layer `sliding_window`).
        - `batch_size`: rows.
        - `max_len`: slots per row: the longest padded prompt plus `max_new_tokens`.
        - `dtype`: dtype of the key/value buffers (float32 or bfloat16, `KV_CACHE_DTYPES`; a
          model passes its `kv_cache_dtype`).
        - `rings`: keyword-only; `True` (default): sliding-window layers get ring buffers of
          `min(max_len, sliding_window + RING_RESERVE)` slots; `False`: every layer gets
          `max_len` slots (the layout before rings; the same results, more memory).

        **Returns:** a `KVCache` with zeroed buffers, every position `-1` and `length` 0.

        **Raises:** `ValueError` if `batch_size` or `max_len` is not positive.
        """
        if batch_size <= 0 or max_len <= 0:
            raise ValueError(
                f"`batch_size` and `max_len` must be positive, got {batch_size} and {max_len}"
            )
        windows = [w for w in config.sliding_window if w is not None] if rings else []
        window = max(windows, default=0)
        ring_layers = tuple(i for i, w in enumerate(config.sliding_window) if w is not None)
        ring_layers = ring_layers if windows else ()
        ring = min(max_len, window + RING_RESERVE)

        def shape(i):
            slots = ring if i in ring_layers else max_len
            return (batch_size, config.num_key_value_heads, slots, config.head_dim)

        layers = range(config.num_hidden_layers)
        return cls(
            k=tuple(jnp.zeros(shape(i), dtype) for i in layers),
            v=tuple(jnp.zeros(shape(i), dtype) for i in layers),
            positions=jnp.full((batch_size, max_len), -1, jnp.int32),
            length=jnp.zeros((batch_size,), jnp.int32),
            ring_positions=jnp.full((batch_size, ring), -1, jnp.int32) if ring_layers else None,
            ring_layers=ring_layers,
            sliding_window=window,
        )

    def extend(self, max_len: int) -> "KVCache":
        """The same cache with room for `max_len` slots per row (new slots empty, position -1).

        Prefill writes a prompt into a cache of exactly its length (attention then reads no empty
        slots) and extends it afterwards for the generated tokens. A ring smaller than
        `ring_capacity` grows to `min(max_len, ring_capacity)` slots (its tokens move to their
        slots `position % ring` of the larger ring).

        **Raises:** `ValueError` if `max_len` is smaller than the current `max_len`.
        """
        extra = max_len - self.max_len
        if extra < 0:
            raise ValueError(f"cannot shrink a KVCache of {self.max_len} slots to {max_len}")
        if extra == 0:
            return self

        def grow(x, axis, value=0):  # the slot axis: -2 of k/v, -1 of positions
            pad = [(0, 0)] * x.ndim
            pad[x.ndim + axis] = (0, extra)
            return jnp.pad(x, pad, constant_values=value)

        ring_positions = self.ring_positions
        ring = min(max_len, self.ring_capacity)
        rings = {}
        if self.ring_layers and ring > self.ring_positions.shape[-1]:
            # each held position p moves to slot p % ring (distinct: a ring holds < ring of them)
            old = self.ring_positions
            slots = jnp.where(old >= 0, old % ring, ring).reshape(-1, old.shape[-1])
            moved = jnp.full(slots.shape[:1] + (ring,), -1, jnp.int32)
            moved = jax.vmap(lambda m, s, p: m.at[s].set(p, mode="drop"))(
                moved, slots, old.reshape(slots.shape)
            )
            ring_positions = moved.reshape(old.shape[:-1] + (ring,))

            def regrow(x):
                flat = x.reshape((-1,) + x.shape[-3:])  # [rows, kv_heads, slots, head_dim]
                fresh = jnp.zeros(flat.shape[:2] + (ring,) + flat.shape[3:], x.dtype)
                fresh = jax.vmap(lambda f, s, t: f.at[:, s].set(t, mode="drop"))(fresh, slots, flat)
                return fresh.reshape(x.shape[:-2] + (ring, x.shape[-1]))

            rings = {i: (regrow(self.k[i]), regrow(self.v[i])) for i in self.ring_layers}

        def layer(i, x, which):
            if i in self.ring_layers:
                return rings[i][which] if rings else x
            return grow(x, -2)

        return dataclasses.replace(
            self,
            k=tuple(layer(i, k, 0) for i, k in enumerate(self.k)),
            v=tuple(layer(i, v, 1) for i, v in enumerate(self.v)),
            positions=grow(self.positions, -1, -1),
            ring_positions=ring_positions,
        )

    def forget(self, start: Int[Array, " batch"]) -> "KVCache":
        """The cache without the tokens at positions `>= start` of each row (their slots get
        position `-1`, in the ring layers too; `length` is unchanged).

        **Arguments:** `start`: `Int[Array, " batch"]`, per row the first position to forget
        (a cache without branch axes).
        """
        positions = jnp.where(self.positions >= start[:, None], -1, self.positions)
        ring_positions = self.ring_positions
        if ring_positions is not None:
            ring_positions = jnp.where(ring_positions >= start[:, None], -1, ring_positions)
        return dataclasses.replace(self, positions=positions, ring_positions=ring_positions)

    def holds_window(self, length: Int[Array, " batch"]) -> Bool[Array, " batch"]:
        """Per row, whether the rings still hold every token a query at position `length` may
        attend to (positions `[length - sliding_window + 1, length)`): after `forget(length)`,
        always true without rings. A crop further back than a ring reaches is false: the row must
        be prefilled again (`SequenceState.crop` does so).

        **Arguments:** `length`: `Int[Array, " batch"]`, the next position of each row.
        """
        if not self.ring_layers:
            return jnp.ones(length.shape, bool)
        low = jnp.maximum(length - self.sliding_window + 1, 0)
        rp = self.ring_positions
        held = jnp.sum((rp >= low[:, None]) & (rp < length[:, None]), axis=-1)
        return held == length - low

    @property
    def ring_capacity(self) -> int:
        """The most slots a ring gets: `sliding_window + RING_RESERVE` (0 without rings)."""
        return self.sliding_window + RING_RESERVE if self.ring_layers else 0

    @property
    def max_len(self) -> int:
        """Slots per row (a static shape)."""
        return self.positions.shape[-1]

    @property
    def batch_size(self) -> int:
        """Rows (a static shape)."""
        return self.positions.shape[0]
