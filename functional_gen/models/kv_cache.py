"""`KVCache`: preallocated key/value buffers of a decoder, as an explicit pytree.

Every leaf has the batch axis first, so reordering rows (beam search, `num_return_sequences`,
forking a generation) is one `jax.tree.map(lambda x: x[idx], cache)`.

Slots and positions. The cache has `max_len` slots per row. A model call with `seq` tokens writes
them to slots `[length, length + seq)` of every row (rows advance in lockstep: a batch is
left-padded, so all rows share one write index) and records each token's RoPE position in
`positions`. Padding tokens and never-written slots have position `-1` and are masked out of
attention, so a left-padded row attends to exactly the tokens it would attend to alone.
"""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .config import LlamaConfig


class KVCache(eqx.Module):
    """Per-layer key/value buffers plus the RoPE position of every slot.

    **Attributes:**

    - `k`, `v`: one array per layer, `Float[Array, "batch kv_heads max_len head_dim"]`: keys
      (after RoPE) and values of every written slot.
    - `positions`: `Int[Array, "batch max_len"]`, the 0-based RoPE position of the token in each
      slot; `-1` for padding and for slots not written yet.
    - `length`: `Int[Array, " batch"]`, slots written so far in each row, padding included. Rows
      of one cache always hold the same value (they are written in lockstep); it is stored per
      row so that every leaf has a leading batch axis.

    A model may add axes between the batch and the rest (the batched classifier-free guidance
    keeps a conditional and an unconditional branch per row: `k` is then `[batch, 2, kv_heads,
    max_len, head_dim]` and `positions` `[batch, 2, max_len]`); the slot axis is always `-2` of
    `k`/`v` and `-1` of `positions`.
    """

    # `*branch`: the axes a model may add after the batch (none, or (2,) for guidance pairs)
    k: tuple[Float[Array, "batch *branch kv_heads max_len head_dim"], ...]
    v: tuple[Float[Array, "batch *branch kv_heads max_len head_dim"], ...]
    positions: Int[Array, "batch *branch max_len"]
    length: Int[Array, " batch"]

    @classmethod
    def init(
        cls, config: LlamaConfig, batch_size: int, max_len: int, dtype=jnp.float32
    ) -> "KVCache":
        """An empty cache.

        **Arguments:**

        - `config`: the model's config (number of layers, key/value heads, head width).
        - `batch_size`: rows.
        - `max_len`: slots per row: the longest padded prompt plus `max_new_tokens`.
        - `dtype`: dtype of the key/value buffers (the model's dtype).

        **Returns:** a `KVCache` with zeroed buffers, every position `-1` and `length` 0.

        **Raises:** `ValueError` if `batch_size` or `max_len` is not positive.
        """
        if batch_size <= 0 or max_len <= 0:
            raise ValueError(
                f"`batch_size` and `max_len` must be positive, got {batch_size} and {max_len}"
            )
        shape = (batch_size, config.num_key_value_heads, max_len, config.head_dim)
        layers = range(config.num_hidden_layers)
        return cls(
            k=tuple(jnp.zeros(shape, dtype) for _ in layers),
            v=tuple(jnp.zeros(shape, dtype) for _ in layers),
            positions=jnp.full((batch_size, max_len), -1, jnp.int32),
            length=jnp.zeros((batch_size,), jnp.int32),
        )

    def extend(self, max_len: int) -> "KVCache":
        """The same cache with room for `max_len` slots per row (new slots empty, position -1).

        Prefill writes a prompt into a cache of exactly its length (attention then reads no empty
        slots) and extends it afterwards for the generated tokens.

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

        return KVCache(
            k=tuple(grow(k, -2) for k in self.k),
            v=tuple(grow(v, -2) for v in self.v),
            positions=grow(self.positions, -1, -1),
            length=self.length,
        )

    @property
    def max_len(self) -> int:
        """Slots per row (a static shape)."""
        return self.positions.shape[-1]

    @property
    def batch_size(self) -> int:
        """Rows (a static shape)."""
        return self.positions.shape[0]
