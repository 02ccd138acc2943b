"""Self-attention of the decoder: rotary position embedding, the per-layer slice of the `KVCache`,
and grouped-query attention over the written cache slots, for prefill (query blocks, or one
`jax.nn.dot_product_attention` call) and decode (attention-length branches, or the whole cache):
which form runs is the model's `ExecutionPlan` (`functional_gen.models.execution_plan`), given
to every call as the static `plan` (the CPU plan by default).

Source: Vaswani et al. 2017 (scaled dot-product attention), Ainslie et al. 2023 (grouped-query
attention), Su et al. 2021 (RoPE); the reference implementation is transformers'
`modeling_llama.py` (`LlamaAttention`, `apply_rotary_pos_emb`), with each family's differences
(q/k norms, `query_pre_attn_scalar`, soft-capping, sliding windows, partial rotary) declared in
`DecoderConfig` and read here as static fields. Split out of `functional_gen.models.decoder`
(which re-exports these names) so that the decoder module holds the layers and the model; the
rotary embedding itself is `functional_gen.models.rope` (re-exported here).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from .execution_plan import CPU_PLAN, ExecutionPlan
from .norms import RMSNorm
from .paged_cache import (
    PagedLayerCache,
    check_paged_call,
    gather_blocks,
    gather_window_blocks,
    pallas_attention,
    write_blocks,
    written_length,
)
from .quantization import Linear
from .rope import RotaryEmbedding as RotaryEmbedding

_PREFILL_CHUNK = 128  # smallest query block of prefill attention (tokens)
_PREFILL_MAX_CHUNKS = 16  # longer prompts get longer blocks (`prefill_block`)


def prefill_block(seq: int) -> int:
    """The query block of a prefill of `seq` tokens: `_PREFILL_CHUNK` (128) tokens, or for prompts
    of more than `_PREFILL_MAX_CHUNKS` (16) such blocks, the multiple of 128 that makes 16 blocks.

    Each block is traced separately (it reads only the key slots causality allows, a static
    length), so the block count sets the compile time of prefill attention. SmolLM2, 4,096
    tokens, layers scanned, one run on the shared 2-core machine: 32 blocks of 128 compiled in
    19.7 s and ran in 55.5 s; 8 blocks of 512 compiled in 5.7 s and ran in 58.6 s (the keys
    read grow from `(n + 1) / 2n` of the full square to 56% at 8 blocks); 16 blocks of 256
    sit between. (The blocks of global layers; a sliding-window layer's prefill reads a band
    of keys per block instead, `window_band`.)"""
    blocks = -(-seq // _PREFILL_CHUNK)
    if blocks <= _PREFILL_MAX_CHUNKS:
        return _PREFILL_CHUNK
    return _PREFILL_CHUNK * -(-blocks // _PREFILL_MAX_CHUNKS)


PREFILL_WINDOW_BLOCK: int | None = 128
"""Query block (tokens) of a sliding-window layer's prefill (`window_band`): each block reads
the keys of its own block and of the `ceil((window - 1) / block)` blocks before it. `None`: the
local layers' blocks read every earlier key of the call, as the global layers' do (the path
before the band; kept to compare against). 128 was the fastest of 64, 128 and 256 on Gemma 3 at
4,096 tokens (docs/concepts/long_prompts.md)."""


def window_band(seq: int, window: int) -> tuple[int, int] | None:
    """`(block, lookback)` of a sliding-window layer's prefill of `seq` tokens: query blocks of
    `block = min(PREFILL_WINDOW_BLOCK, window)` tokens, each reading its own key block and the
    `lookback = ceil((window - 1) / block)` blocks before it (the oldest key a query at column
    `c` sees is column `c - window + 1`); `None` for prompts shorter than twice that band (the
    causal blocks of `Attention._prefill` then read about as many keys), or when
    `PREFILL_WINDOW_BLOCK` is `None`.

    Gemma 3 (window 512): blocks of 128 reading 640 keys; at 4,096 tokens the causal blocks of
    256 read 2,176 keys per query on average.
    """
    if PREFILL_WINDOW_BLOCK is None:
        return None
    block = min(PREFILL_WINDOW_BLOCK, window)
    lookback = -(-(window - 1) // block)
    if seq < 2 * (lookback + 1) * block:
        return None
    return block, lookback


def _standard_promotion():
    """jax's standard dtype promotion for a `jax.nn.dot_product_attention` call: its XLA path
    promotes a bfloat16 query with float32 implicitly (`jnp.promote_types` of its logits), which
    `jax_numpy_dtype_promotion="strict"` (the test suite's setting) refuses."""
    return jax.numpy_dtype_promotion("standard")


ATTENTION_BLOCK = 256
"""Decode attention reads the cache in static lengths: multiples of `ATTENTION_BLOCK`, then
doublings, with `SHORT_ATTENTION_LENGTHS` below it (see `attention_lengths`)."""

SHORT_ATTENTION_LENGTHS = (64, 128)
"""The static lengths below `ATTENTION_BLOCK` that decode attention may read in a cache of at
least `2 * ATTENTION_BLOCK` slots and a batch of at least 2 rows (`attention_lengths`): the
serving engine's lockstep cache (8 slots of 512) with a short conversation written reads 64 or
128 slots, not 256."""


def attention_lengths(max_len: int, batch: int = 1) -> tuple[int, ...]:
    """The static cache lengths attention may read for a cache of `max_len` slots per row and
    `batch` rows: `SHORT_ATTENTION_LENGTHS` (64, 128; only for `batch >= 2`), multiples of
    `ATTENTION_BLOCK` (256, 512, 768, 1024), then doubling (2048, 4096, ...), each at most half
    of `max_len`, then `max_len` itself (just `(max_len,)` for a cache of fewer than 512 slots,
    so `fg.generate`'s usual short cache compiles one attention per layer).

    Fine steps where a conversation usually is (a chat passing 512 slots reads 768, not 1024),
    doubling beyond, so the number of compiled branches stays logarithmic and the slots read
    within 2x of the written ones. A shorter branch slices the cache, which XLA copies (a
    strided copy of every head); above half of `max_len` that copy costs more than reading the
    whole cache in place (batch 1, 1,024 slots, 600 written: 25.0 ms per step with a 768-slot
    branch, 23.5 ms reading all 1,024). The 64- and 128-slot branches (2026-11-26, SmolLM2-135M,
    2-core CPU loaded ~8-10x, one process, interleaved, `benchmarks/bench_decode_attention.py`):
    the bare decode loop at 8 rows over 512 slots with 40 / 100 / 200 written took 0.84x /
    0.94x / 1.03x (the same 256 branch: noise) the time with 256 as the shortest read, over
    2,048 slots with 32 / 100 / 400 written 0.72x / 0.90x / 1.03x; the serving engine's
    program (8 slots, 512) in two runs 0.90x / 0.98x (<= 64 written), 0.67x / 0.89x (<= 128)
    and 0.95x / 1.01x (<= 256, the same branch: noise); at 1 row
    1.04-1.11x over 512 and 2,048 slots with 32-400 written (within this run-to-run noise, the
    same for the same branch; a cache under 512 slots, `fg.generate`'s usual one, is
    unchanged), but the decode program of a cache of >= 512 slots compiles ~20-30% longer (two
    more branches per layer): hence the short lengths only where they paid, at several rows; a
    batch-1 long prompt (docs/concepts/long_prompts.md) compiles the branches it had.
    Attention over 128-slot blocks in a `fori_loop` with an online softmax (flash-decoding, no
    static branches) was no faster at run time (8 rows, 512 slots: 1.00x at 32 written, 1.12x
    at 200; 1 row: 0.97-1.09x) but compiled in 0.6x the time at 2,048 slots.

    **Arguments:** `max_len`: the cache's slots per row; `batch`: the rows of the call.

    **Returns:** the lengths, ascending, the last one `max_len`.
    """
    short = max_len >= 2 * ATTENTION_BLOCK and batch >= 2
    lengths = [n for n in SHORT_ATTENTION_LENGTHS if short]
    n = ATTENTION_BLOCK
    while 2 * n <= max_len:
        lengths.append(n)
        n = n + ATTENTION_BLOCK if n < 4 * ATTENTION_BLOCK else 2 * n
    return (*lengths, max_len)


class LayerCache(eqx.Module):
    """One layer's view of the `KVCache` during a model call.

    **Attributes:**

    - `k`, `v`: `Float[Array, "batch kv_heads max_len head_dim"]`, this layer's buffers.
    - `positions`: `Int[Array, "batch max_len"]`, the RoPE position of every slot, this call's
      tokens already recorded (shared by all layers; `-1` = padding or empty).
    - `write_index`: `Int[Array, ""]`, the first slot this call writes (all rows in lockstep).
    - `ring_slots`: for a ring layer (`KVCache.ring_layers`), `Int[Array, "batch seq"]`: the ring
      slot of each of this call's tokens (`position % ring`; `ring`, past the end, for padding
      and for tokens a longer call pushes out again); `None` for a layer of `max_len` slots.
    - `ring_before`, `ring_after`: `Int[Array, "batch ring"]`, the positions the ring slots hold
      before and after this call's write (`KVCache.ring_positions`), or `None`.
    """

    k: Float[Array, "batch kv_heads _slots head_dim"]
    v: Float[Array, "batch kv_heads _slots head_dim"]
    positions: Int[Array, "batch max_len"]
    write_index: Int[Array, ""]
    ring_slots: Int[Array, "batch seq"] | None = None
    ring_before: Int[Array, "batch ring"] | None = None
    ring_after: Int[Array, "batch ring"] | None = None


def ring_write(
    buffer: Float[Array, "batch kv_heads ring head_dim"],
    new: Float[Array, "batch kv_heads seq head_dim"],
    slots: Int[Array, "batch seq"],
) -> Float[Array, "batch kv_heads ring head_dim"]:
    """`buffer` with `new[:, :, i]` written at ring slot `slots[:, i]` of each row (slots past
    the end are dropped: padding, and tokens a longer write pushes out again)."""
    ring = buffer.shape[2]
    if new.shape[2] == 1:  # decode: an in-place update of one slot (kept as is for padding)

        def one(b, n, s):
            slot = jnp.minimum(s[0], ring - 1)
            n = jnp.where(s[0] < ring, n, jax.lax.dynamic_slice_in_dim(b, slot, 1, axis=1))
            return jax.lax.dynamic_update_slice(b, n, (0, slot, 0))

        return jax.vmap(one)(buffer, new.astype(buffer.dtype), slots)
    return jax.vmap(lambda b, n, s: b.at[:, s].set(n, mode="drop"))(
        buffer, new.astype(buffer.dtype), slots
    )


class Attention(eqx.Module):
    """Grouped-query self-attention over the `KVCache` of one layer.

    Multi-head when `num_key_value_heads == num_attention_heads`, multi-query when it is 1
    (Ainslie et al. 2023, "GQA"). Scores are scaled by `head_dim ** -0.5` (or
    `query_pre_attn_scalar ** -0.5`), optionally soft-capped, masked by the slot positions
    (causal, padding, optional sliding window, optional bidirectional prefix) and softmaxed in
    float32.

    **Attributes:** `qkv_proj`: the query, key and value projections fused into one matrix
    (rows: `num_heads * head_dim` query rows, then the keys' and the values'
    `num_kv_heads * head_dim` each, as transformers' Phi-3 stores them; every family's separate
    `q_proj`/`k_proj`/`v_proj` are concatenated on load, see `fuse_projections`; the properties
    `q_proj`, `k_proj`, `v_proj` are read-only views of its rows); `o_proj`: the output
    projection; `num_heads`, `num_kv_heads`, `head_dim` (static); `sliding_window` (static): the
    window in tokens or `None`; `q_norm`, `k_norm`: per-head `RMSNorm`s before RoPE, or `None`
    (`DecoderConfig.qk_norm`); `use_rope` (static, `DecoderConfig.use_rope`);
    `query_pre_attn_scalar`, `softcap` (static, `DecoderConfig.query_pre_attn_scalar` and
    `attn_logit_softcapping`, `None` when off).
    """

    qkv_proj: Linear
    o_proj: Linear
    num_heads: int = eqx.field(static=True)
    num_kv_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    sliding_window: int | None = eqx.field(static=True)
    q_norm: RMSNorm | None = None
    k_norm: RMSNorm | None = None
    use_rope: bool = eqx.field(static=True, default=True)
    query_pre_attn_scalar: float | None = eqx.field(static=True, default=None)
    softcap: float | None = eqx.field(static=True, default=None)

    @property
    def q_proj(self) -> Linear:
        """The query projection (`num_heads * head_dim` rows of `qkv_proj`), a read-only view
        under its Hugging Face name; change the weights through `qkv_proj`."""
        return self.qkv_proj.rows(0, self.num_heads * self.head_dim)

    @property
    def k_proj(self) -> Linear:
        """The key projection (`num_kv_heads * head_dim` rows of `qkv_proj`), read-only view."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.qkv_proj.rows(q, q + kv)

    @property
    def v_proj(self) -> Linear:
        """The value projection (the last `num_kv_heads * head_dim` rows of `qkv_proj`), read-only
        view."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.qkv_proj.rows(q + kv, q + 2 * kv)

    def __call__(
        self,
        x: Float[Array, "hidden tokens"],
        positions: Int[Array, "batch seq"],
        rope: tuple[Float[Array, "rotary_dim tokens"], Float[Array, "rotary_dim tokens"]],
        cache: LayerCache | PagedLayerCache,
        *,
        prefix_length: Int[Array, " batch"] | None = None,
        prefill_chunk: int | None = None,
        plan: ExecutionPlan = CPU_PLAN,
    ) -> tuple[Float[Array, "hidden tokens"], LayerCache | PagedLayerCache]:
        """Attend from this call's tokens to every valid cache slot, this call's tokens included.

        **Arguments:**

        - `x`: `Float[Array, "hidden tokens"]`, the normed residual stream, feature-major, the
          `batch * seq` tokens of all rows flattened (row-major).
        - `positions`: `Int[Array, "batch seq"]`, RoPE positions of the tokens, `-1` for padding.
        - `rope`: `(cos, sin)` of the positions (from `RotaryEmbedding.cos_sin`): the model's
          global RoPE, or the sliding layers' own (`DecoderModel.rotary_emb_local`); unused when
          `use_rope` is off.
        - `cache`: this layer's `LayerCache`; the new keys/values are written at `write_index`.
          Or a `PagedLayerCache` (decode over a `PagedKVCache`, `_paged`): each token's key and
          value go to its own position's block.
        - `prefix_length`: per row, positions below it attend bidirectionally (prefix-LM);
          `None`: causal.
        - `prefill_chunk`: static; when set, the cache holds exactly this call's tokens (slot i =
          column i) and queries are processed in blocks of this many tokens, each reading only the
          slots causality allows (with `prefix_length`, all slots).
        - `plan`: static, the model's `ExecutionPlan` (fences, decode length branches, prefill
          attention form, bfloat16 compute); the CPU plan by default.

        **Returns:** `(out, cache)`: `Float[Array, "hidden tokens"]` (after `o_proj`) and the
        layer cache with this call's keys/values written.
        """
        batch, seq = positions.shape
        kvh, hd = self.num_kv_heads, self.head_dim
        groups = self.num_heads // kvh

        # One product for q, k and v: fewer, larger matmuls compile faster (see `fuse_projections`).
        qkv = self.qkv_proj(x, plan)
        q_rows, kv_rows = self.num_heads * hd, kvh * hd
        q = qkv[:q_rows].reshape(self.num_heads, hd, -1)
        if self.q_norm is not None:
            q = self.q_norm.over_axis(q, 1)
        if self.use_rope:
            q = RotaryEmbedding.rotate(q, rope)
        k = qkv[q_rows : q_rows + kv_rows].reshape(kvh, hd, -1)
        if self.k_norm is not None:
            k = self.k_norm.over_axis(k, 1)
        if self.use_rope:
            k = RotaryEmbedding.rotate(k, rope)
        v = qkv[q_rows + kv_rows :].reshape(kvh, hd, -1)

        # Write this call's keys/values into slots [write_index, write_index + seq) of every row.
        def to_cache(t):  # [kv_heads, head_dim, batch*seq] -> [batch, kv_heads, seq, head_dim]
            t = t.reshape(kvh, hd, batch, seq).transpose(2, 0, 3, 1).astype(cache.k.dtype)
            if not plan.cache_write_fence:
                return t
            # Fenced: with the transpose fused in, XLA's CPU backend rewrote every slot of the
            # cache instead of updating it in place (0.11 ms per layer and step at batch 8).
            return jax.lax.optimization_barrier(t)

        q = q.reshape(kvh, groups, hd, batch, seq)
        if isinstance(cache, PagedLayerCache):
            check_paged_call(prefill_chunk, prefix_length)
            return self._paged(x, q, to_cache(k), to_cache(v), positions, cache, plan)
        if cache.ring_slots is not None:
            return self._ring(
                x, q, to_cache(k), to_cache(v), positions, cache, prefix_length, prefill_chunk, plan
            )

        start = (0, 0, cache.write_index, 0)
        k_cache = jax.lax.dynamic_update_slice(cache.k, to_cache(k), start)
        v_cache = jax.lax.dynamic_update_slice(cache.v, to_cache(v), start)

        if prefill_chunk is None:
            out = self._attend_written(
                q,
                k_cache,
                v_cache,
                cache.positions,
                positions,
                prefix_length,
                cache.write_index + seq,
                plan,
            )
        else:
            # The cache holds exactly this call's tokens, slot i = column i.
            out = self._prefill(
                q, k_cache, v_cache, cache.positions, positions, prefix_length, prefill_chunk, plan
            )
        out = out.reshape(self.num_heads * hd, batch * seq).astype(x.dtype)
        new_cache = LayerCache(k_cache, v_cache, cache.positions, cache.write_index)
        return self.o_proj(out, plan), new_cache

    def _paged(self, x, q, k_new, v_new, positions, cache: PagedLayerCache, plan):
        """Decode over a `PagedKVCache` layer (`functional_gen.models.paged_cache`): this call's
        keys and values written into their blocks (`write_blocks`), then each query attends to
        its row's positions up to its own through the block tables: with `plan.paged_attention`
        `"pallas"` (`"pallas_interpret"`), jax's Pallas paged-attention kernel reads the pool
        in place (`pallas_attention`; a sliding-window layer keeps the gather, the kernel has no
        window); with `"gather"`, the rows' blocks are gathered and attended as a contiguous
        cache (`_attend`, masks by position as for a `KVCache`). A sliding-window layer gathers
        only the blocks its window can reach (`gather_window_blocks`), under either plan."""
        k_pool = write_blocks(cache.k, k_new, cache.block_tables, positions)
        v_pool = write_blocks(cache.v, v_new, cache.block_tables, positions)
        length = written_length(cache.length, positions)
        kvh, groups, hd, batch, seq = q.shape
        if plan.paged_attention != "gather" and self.sliding_window is None:
            scale = (self.query_pre_attn_scalar or self.head_dim) ** -0.5
            heads = q.transpose(3, 4, 0, 1, 2).reshape(batch, seq, kvh * groups, hd) * scale
            interpret = plan.paged_attention == "pallas_interpret"
            out = pallas_attention(
                heads, k_pool, v_pool, cache.block_tables, positions, self.softcap, interpret
            )
            out = out.reshape(batch, seq, kvh, groups, hd).transpose(2, 3, 4, 0, 1)
        elif self.sliding_window is not None:  # only the blocks the window can reach
            window = (cache.block_tables, length, positions, self.sliding_window)
            k_rows, kv_positions = gather_window_blocks(k_pool, *window)
            v_rows, _ = gather_window_blocks(v_pool, *window)
            out = self._attend(q, k_rows, v_rows, kv_positions, positions, None, plan)
        else:
            k_rows, kv_positions = gather_blocks(k_pool, cache.block_tables, length)
            v_rows, _ = gather_blocks(v_pool, cache.block_tables, length)
            out = self._attend(q, k_rows, v_rows, kv_positions, positions, None, plan)
        out = out.reshape(self.num_heads * hd, batch * seq).astype(x.dtype)
        return self.o_proj(out, plan), PagedLayerCache(k_pool, v_pool, cache.block_tables, length)

    def _ring(self, x, q, k_new, v_new, positions, cache, prefix_length, prefill_chunk, plan):
        """Attention of a ring layer (`KVCache.ring_layers`): the keys it may read are this
        call's and the ring's, masked by position (window included); the ring then keeps the
        newest of them.

        - prefill (`prefill_chunk`): the ring starts empty; query blocks read this call's keys
          directly (`_prefill`: each block the band of keys its window sees), so a prompt
          longer than the ring is attended to in full before only its last `ring` tokens are
          stored;
        - decode (one token): the token is written first, then the whole ring is read (it holds
          the window: `ring >= sliding_window`); one static length, no length branches; behind
          a conditional only under `plan.attention_fence` (the CPU plan);
        - other calls of several tokens (continuing a state with new text, speculative
          verification): the ring as it was plus this call's keys, then the write.
        """
        batch, seq = positions.shape
        k_cache = ring_write(cache.k, k_new, cache.ring_slots)
        v_cache = ring_write(cache.v, v_new, cache.ring_slots)
        if prefill_chunk is not None:
            out = self._prefill(
                q,
                k_new,
                v_new,
                positions.astype(jnp.int32),
                positions,
                prefix_length,
                prefill_chunk,
                plan,
            )
        elif seq == 1 and not plan.attention_fence:
            out = self._attend(
                q, k_cache, v_cache, cache.ring_after, positions, prefix_length, plan
            )
        elif seq == 1:

            def attend(*operands):
                return self._attend(*operands, plan)

            # behind a conditional for the reason given in `_attend_written`
            out = jax.lax.cond(
                jnp.all(cache.write_index >= 0),
                attend,
                attend,
                q,
                k_cache,
                v_cache,
                cache.ring_after,
                positions,
                prefix_length,
            )
        else:
            out = self._attend(
                q,
                jnp.concatenate([cache.k, k_new.astype(cache.k.dtype)], axis=2),
                jnp.concatenate([cache.v, v_new.astype(cache.v.dtype)], axis=2),
                jnp.concatenate([cache.ring_before, positions.astype(jnp.int32)], axis=-1),
                positions,
                prefix_length,
                plan,
            )
        out = out.reshape(self.num_heads * self.head_dim, batch * seq).astype(x.dtype)
        new_cache = LayerCache(
            k_cache,
            v_cache,
            cache.positions,
            cache.write_index,
            cache.ring_slots,
            cache.ring_before,
            cache.ring_after,
        )
        return self.o_proj(out, plan), new_cache

    def _prefill(
        self,
        q: Float[Array, "kv_heads groups head_dim batch seq"],
        k: Float[Array, "batch kv_heads seq head_dim"],
        v: Float[Array, "batch kv_heads seq head_dim"],
        kv_positions: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        prefix_length: Int[Array, " batch"] | None,
        chunk: int,
        plan: ExecutionPlan = CPU_PLAN,
    ) -> Float[Array, "kv_heads groups head_dim batch seq"]:
        """Prefill attention of this call's queries over this call's keys (key column i = query
        column i), in query blocks that skip the keys they cannot see, or, under a plan whose
        `prefill_attention` is `"dot_product_attention"`, in one `jax.nn.dot_product_attention`
        call (`_dot_product_prefill`; not with soft-capping, which it cannot express).

        A global layer (or any layer with `prefix_length`) cuts the queries into static blocks of
        `chunk` tokens; block `[c0, c0 + chunk)` reads keys `[0, c0 + chunk)` (all keys with a
        prefix), so the masked upper triangle costs nothing. A sliding-window layer reads, per
        block of `window_band(seq, sliding_window)[0]` queries, only the band of keys the window
        lets it see (`_attend_band`), when that band is shorter than the prompt.
        """
        if plan.prefill_attention == "dot_product_attention" and self.softcap is None:
            return self._dot_product_prefill(q, k, v, kv_positions, positions, prefix_length, plan)
        seq = positions.shape[1]
        band = None
        if self.sliding_window is not None and prefix_length is None:
            band = window_band(seq, self.sliding_window)
        if band is not None:
            return self._attend_band(q, k, v, kv_positions, positions, *band, plan)

        def upto(c0):
            return seq if prefix_length is not None else min(seq, c0 + chunk)

        return jnp.concatenate(
            [
                self._attend(
                    q[..., c0 : c0 + chunk],
                    k[:, :, : upto(c0)],
                    v[:, :, : upto(c0)],
                    kv_positions[:, : upto(c0)],
                    positions[:, c0 : c0 + chunk],
                    prefix_length,
                    plan,
                )
                for c0 in range(0, seq, chunk)
            ],
            axis=-1,
        )

    def _dot_product_prefill(
        self,
        q: Float[Array, "kv_heads groups head_dim batch seq"],
        k: Float[Array, "batch kv_heads seq head_dim"],
        v: Float[Array, "batch kv_heads seq head_dim"],
        kv_positions: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        prefix_length: Int[Array, " batch"] | None,
        plan: ExecutionPlan,
    ) -> Float[Array, "kv_heads groups head_dim batch seq"]:
        """Prefill attention (key column i = query column i) as one
        `jax.nn.dot_product_attention` call (grouped-query: `[batch, seq, kv_heads, head_dim]`
        keys for `[batch, seq, heads, head_dim]` queries), scaled by `head_dim ** -0.5` (or
        `query_pre_attn_scalar ** -0.5`). The query is cast to the keys' (the cache's) dtype.

        Which mask goes which way (jax 0.10.2's `dot_product_attention`; its cuDNN path takes
        `is_causal`, `local_window_size` with a right window of 0, and right padding as
        `query_seq_lengths` / `key_value_seq_lengths`, but a `mask`/`bias` only as a full
        `[.., seq, seq]` bias it would materialise):

        - causal, sliding window, left padding: every row's tokens are rotated to the front
          (a gather by the row's first non-padding column), so that its padding sits on the
          right, and the call is `is_causal=True` with the rows' token counts as sequence
          lengths (and `local_window_size=(window - 1, 0)` for a sliding-window layer), with
          `implementation=plan.attention_implementation`; the output is rotated back. Exact
          when each row's tokens are contiguous (padding only before and after them, as every
          prefill of the library has) with positions growing by one per column, so that
          column order is position order. cuDNN is used only where it can run: a bfloat16 or
          float16 cache and a head dimension that is a multiple of 8, at most 256; otherwise
          `"xla"`.
        - prefix-LM (`prefix_length`): an explicit boolean `mask` from the positions (as
          `_attend` builds it) with `implementation="xla"` (`None` when the plan's is `None`).

        Padding queries get zeros (they attend to nothing; the blocks path gives them a mean of
        the values): their outputs are never read, and zeros keep them finite.
        Soft-capping cannot be expressed (`_prefill` keeps the blocks path for it).
        """
        kvh, groups, hd, batch, seq = q.shape
        query = q.transpose(3, 4, 0, 1, 2).reshape(batch, seq, kvh * groups, hd).astype(k.dtype)
        key, value = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        scale = (self.query_pre_attn_scalar or self.head_dim) ** -0.5
        positions = positions.astype(jnp.int32)
        valid = positions >= 0  # [batch, seq]
        xla = None if plan.attention_implementation is None else "xla"
        if prefix_length is not None:
            allowed = self._allowed(kv_positions, positions, prefix_length)
            with _standard_promotion():
                out = jax.nn.dot_product_attention(
                    query, key, value, mask=allowed[:, None], scale=scale, implementation=xla
                )
        else:
            implementation = plan.attention_implementation
            if implementation == "cudnn" and not (
                jnp.dtype(key.dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
                and hd % 8 == 0
                and hd <= 256
            ):
                implementation = "xla"
            first = jnp.argmax(valid, axis=1).astype(jnp.int32)  # first token column of a row
            count = jnp.sum(valid, axis=1).astype(jnp.int32)
            columns = jnp.arange(seq, dtype=jnp.int32)

            def rotate(x, shift):  # x[b, (j + shift[b]) % seq] at column j
                index = (columns[None, :] + shift[:, None]) % seq
                return jnp.take_along_axis(x, index[:, :, None, None], axis=1)

            window = None
            if self.sliding_window is not None:
                window = (self.sliding_window - 1, 0)
            with _standard_promotion():
                out = jax.nn.dot_product_attention(
                    rotate(query, first),
                    rotate(key, first),
                    rotate(value, first),
                    scale=scale,
                    is_causal=True,
                    query_seq_lengths=count,
                    key_value_seq_lengths=count,
                    local_window_size=window,
                    implementation=implementation,
                )
            out = rotate(out, -first)
        out = jnp.where(valid[:, :, None, None], out, 0).astype(jnp.float32)
        return out.reshape(batch, seq, kvh, groups, hd).transpose(2, 3, 4, 0, 1)

    def _attend_band(
        self,
        q: Float[Array, "kv_heads groups head_dim batch seq"],
        k: Float[Array, "batch kv_heads seq head_dim"],
        v: Float[Array, "batch kv_heads seq head_dim"],
        kv_positions: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        block: int,
        lookback: int,
        plan: ExecutionPlan = CPU_PLAN,
    ) -> Float[Array, "kv_heads groups head_dim batch seq"]:
        """Sliding-window prefill attention as a banded block structure: the queries in blocks
        of `block` columns, block `i` reading key blocks `i - lookback .. i` (a fixed
        `(lookback + 1) * block` keys, zero blocks with position `-1` before the prompt), all
        blocks at once (`_attend` vmapped over the block axis, one traced copy at any length).

        Exact: the keys left out are `window` or more columns before every query of their
        block, and in a prefill a row's positions grow by one per column after its left padding
        (`-1` positions are never attended to), so the window masks them anyway. The keys read
        stay within `window + block` per query, against up to the whole prompt before.
        """
        kvh, groups, hd, batch, seq = q.shape
        blocks = -(-seq // block)
        pad = blocks * block - seq
        before = lookback * block

        def banded(x, axis):  # the slot axis of x -> [blocks, ..., span, ...] (axis kept in place)
            width = [(0, 0)] * x.ndim
            width[axis] = (before, pad)
            x = jnp.pad(x, width, constant_values=-1 if x.dtype == jnp.int32 else 0)
            x = x.reshape(x.shape[:axis] + (blocks + lookback, block) + x.shape[axis + 1 :])
            taken = [jax.lax.slice_in_dim(x, j, j + blocks, axis=axis) for j in range(lookback + 1)]
            x = jnp.concatenate(taken, axis=axis + 1)  # [..., blocks, span, ...]
            return jnp.moveaxis(x, axis, 0)

        q_blocks = jnp.pad(q, [(0, 0)] * 4 + [(0, pad)]).reshape(
            kvh, groups, hd, batch, blocks, block
        )
        q_blocks = jnp.moveaxis(q_blocks, 4, 0)
        q_pos = jnp.pad(positions.astype(jnp.int32), ((0, 0), (0, pad)), constant_values=-1)
        q_pos = jnp.moveaxis(q_pos.reshape(batch, blocks, block), 1, 0)
        out = jax.vmap(self._attend, in_axes=(0, 0, 0, 0, 0, None, None))(
            q_blocks,
            banded(k, 2),
            banded(v, 2),
            banded(kv_positions.astype(jnp.int32), 1),
            q_pos,
            None,
            plan,
        )  # [blocks, kv_heads, groups, head_dim, batch, block]
        out = jnp.moveaxis(out, 0, 4).reshape(kvh, groups, hd, batch, blocks * block)
        return out[..., :seq]

    def _attend_written(
        self, q, k_cache, v_cache, kv_positions, positions, prefix_length, used, plan=CPU_PLAN
    ):
        """`_attend` over the slots `[0, used)` only, rounded up to a static length
        (`plan.attention_length_buckets`, the CPU plan), or over every slot (the GPU plan: no
        branch, so no host round trip; see `ExecutionPlan`).

        Slots at and after `write_index + seq` hold no token yet (rows are written in lockstep,
        `KVCache`), so attending over them only adds masked work: a decode step over a
        4,096-slot cache took 1.5x (batch 1) to 3x (batch 4) the time of one over 256 slots.
        The lengths `attention_lengths(max_len, batch)` are static; `lax.switch` picks the shortest
        one that holds `used` slots at run time, so the result equals attention over every
        slot (the skipped ones have weight exactly 0) at the cost of the written part.
        """
        lengths = (k_cache.shape[-2],)
        if plan.attention_length_buckets:
            lengths = attention_lengths(k_cache.shape[-2], k_cache.shape[0])
        if len(lengths) == 1 and not plan.attention_fence:
            return self._attend(q, k_cache, v_cache, kv_positions, positions, prefix_length, plan)
        if len(lengths) == 1:
            # Behind a conditional (both branches the same) so that the updated cache is one
            # materialised operand: called directly, XLA's CPU fusion duplicated each
            # `dynamic_update_slice` into the dot's operand fusion and copied every key and value
            # buffer 4 times per step (240 copies at batch 1; 3-4% of a 160-slot decode step,
            # 6x the step time at 2,048 slots).
            def attend(*operands):
                return self._attend(*operands, plan)

            return jax.lax.cond(
                used >= 0,
                attend,
                attend,
                q,
                k_cache,
                v_cache,
                kv_positions,
                positions,
                prefix_length,
            )

        def upto(n):
            def attend(q, k_cache, v_cache, kv_positions, positions, prefix_length):
                return self._attend(
                    q,
                    k_cache[..., :n, :],
                    v_cache[..., :n, :],
                    kv_positions[..., :n],
                    positions,
                    prefix_length,
                    plan,
                )

            return attend

        index = jnp.searchsorted(jnp.asarray(lengths, jnp.int32), used.astype(jnp.int32))
        index = jnp.minimum(index, len(lengths) - 1)
        return jax.lax.switch(
            index,
            [upto(n) for n in lengths],
            q,
            k_cache,
            v_cache,
            kv_positions,
            positions,
            prefix_length,
        )

    def _attend(
        self,
        q: Float[Array, "kv_heads groups head_dim batch seq"],
        k_cache: Float[Array, "batch kv_heads kv_seq head_dim"],
        v_cache: Float[Array, "batch kv_heads kv_seq head_dim"],
        kv_positions: Int[Array, "batch kv_seq"],
        positions: Int[Array, "batch seq"],
        prefix_length: Int[Array, " batch"] | None,
        plan: ExecutionPlan = CPU_PLAN,
    ) -> Float[Array, "kv_heads groups head_dim batch seq"]:
        """Masked softmax attention of queries over cache slots (scores in float32).

        Under `plan.bf16_compute` (the GPU plan) the query is cast to the cache's dtype, so a
        bfloat16 cache multiplies bfloat16 operands with float32 accumulation in both products
        (scores, then the probabilities cast to the cache's dtype times the values); with a
        float32 cache both plans compute the same."""
        # Keys [slots, head_dim] as the row-major left operand: XLA's CPU dot reads them in place.
        # As the right operand (one `kgdbs,bktd` einsum) it copied every key into a [head_dim,
        # slots] layout first: 1.6 ms per decode step over 768 slots at batch 1.
        kvh, groups, hd, batch, seq = q.shape
        q_cols = q.transpose(3, 0, 2, 1, 4).reshape(batch, kvh, hd, groups * seq)
        if plan.bf16_compute:
            q_cols = q_cols.astype(k_cache.dtype)
        scores = jnp.matmul(k_cache, q_cols, preferred_element_type=jnp.float32)
        scores = scores.reshape(batch, kvh, -1, groups, seq).transpose(0, 1, 3, 4, 2)
        scores = scores * ((self.query_pre_attn_scalar or self.head_dim) ** -0.5)
        if self.softcap is not None:
            scores = self.softcap * jnp.tanh(scores / self.softcap)
        allowed = self._allowed(kv_positions, positions, prefix_length)
        scores = jnp.where(allowed[:, None, None], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(v_cache.dtype)
        # Written with the cache's slot axis contracted as the major axis of a row-major [t, d]
        # operand: XLA's CPU dot then reads the values in place. The `kgdbs` output in one
        # einsum made XLA copy every value slot into a [d, t] layout first (2 ms per decode
        # step at 1,024 slots, batch 1).
        if plan.bf16_compute:
            out = jnp.einsum(
                "bkgst,bktd->bkgsd", probs, v_cache, preferred_element_type=jnp.float32
            )
        else:
            out = jnp.einsum("bkgst,bktd->bkgsd", probs, v_cache)
        return out.transpose(1, 2, 4, 0, 3)

    def _allowed(
        self,
        kv_positions: Int[Array, "batch kv_seq"],
        positions: Int[Array, "batch seq"],
        prefix_length: Int[Array, " batch"] | None,
    ) -> Bool[Array, "batch seq kv_seq"]:
        """Which slots each query may attend to, by position: written (`>= 0`), not after the
        query (or inside the row's prefix, prefix-LM), within the sliding window."""
        kv_pos = kv_positions[:, None, :]  # [batch, 1, kv_seq]
        q_pos = positions[:, :, None]  # [batch, seq, 1]
        visible = kv_pos <= q_pos
        if prefix_length is not None:
            # prefix-LM: a prefix token sees the whole prefix; later tokens see it anyway.
            in_prefix = (kv_pos < prefix_length[:, None, None]) & (q_pos >= 0)
            visible = visible | in_prefix
        allowed = (kv_pos >= 0) & visible
        if self.sliding_window is not None:
            allowed = allowed & (q_pos - kv_pos < self.sliding_window)
        return allowed
