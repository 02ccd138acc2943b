"""The one decoder in Equinox, for every supported family: Llama 2/3 and SmolLM2, Mistral, Qwen2,
Qwen3, Gemma 2, Gemma 3 (text), Phi-3 / Phi-4-mini, SmolLM3.

Source: Touvron et al. 2023, "LLaMA" (RMSNorm, RoPE, SwiGLU) and "Llama 2" (grouped-query
attention); the reference implementation is transformers' `modeling_llama.py`, which the tests
compare against logit for logit, as they compare each family against its own modeling file.
How a family differs from Llama is declared in `DecoderConfig` (norms, activation, q/k norms,
soft-capping, per-layer attention kind and RoPE, partial rotary, ...); each difference is a
static field read by a Python `if` at trace time, so it costs nothing where it is off. The
family modules (`functional_gen.models.families`) map `config.json` and weight names onto it.

Module attribute names are the Hugging Face weight keys (`model.embed_tokens`,
`model.layers.{n}.self_attn.q_proj`, `model.layers.{n}.mlp.gate_proj`, `model.norm`, `lm_head`,
...), so loading a checkpoint is matching names (see `DecoderForCausalLM.from_weights`), and every
`Linear.weight` has torch's `(out, in)` layout: no transposes.

One call path serves **prefill** (the whole prompt in one call, writing the `KVCache`) and
**decode** (one token per row): `model(token_ids, positions, cache) -> (logits, cache)`.

Note on layout: inside the model, activations are *feature-major*, `[hidden, tokens]`, where the
tokens of all rows are flattened. Every projection is then `weight @ x`, whose output layout XLA's
CPU backend computes about twice as fast as `x @ weight.T` for the few-token matmuls of batched
decoding (see `benchmarks/`); the public inputs and outputs are ordinary `[batch, seq, ...]`.
Every plan (`ExecutionPlan`, the per-backend choices) keeps this layout: XLA's GPU backend
assigns the layouts of a dot's operands itself, so the `weight @ x` form costs it nothing.

Words: `seq` is the number of tokens in this call, `max_len` the cache slots per row, `kv_seq`
the slots attended over (= `max_len`).
"""

import copy
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from . import quantization as _quantization
from .attention import (
    ATTENTION_BLOCK as ATTENTION_BLOCK,
    Attention as Attention,
    LayerCache as LayerCache,
    RotaryEmbedding as RotaryEmbedding,
    attention_lengths as attention_lengths,
    prefill_block as prefill_block,
)
from .base import AbstractCausalLM, fingerprint
from .config import DecoderConfig
from .execution_plan import CPU_PLAN, ExecutionPlan, check_plan
from .families import hf_weights, split_projections
from .kv_cache import KVCache, resolve_kv_cache_dtype
from .norms import RMSNorm as RMSNorm
from .paged_cache import PagedKVCache, PagedLayerCache, check_paged_call
from .quantization import Embedding, Linear
from .weight_tree import fill_weights, path_name


class MLP(eqx.Module):
    """Gated feed-forward block (Shazeer 2020): `down_proj(act(gate) * up)` with
    `[gate; up] = gate_up_proj(x)`, SwiGLU with `act = silu`, GeGLU with the tanh approximation
    of GELU (Gemma's `gelu_pytorch_tanh`).

    **Attributes:** `gate_up_proj`: the gate and up projections fused into one matrix of
    `2 * intermediate` rows (gate first, as transformers' Phi-3 stores `mlp.gate_up_proj`; every
    family's separate `gate_proj`/`up_proj` are concatenated on load, see `fuse_projections`; the
    properties `gate_proj`, `up_proj` are read-only views of its rows); `down_proj`; `hidden_act` (static): `"silu"` or `"gelu_pytorch_tanh"`
    (`DecoderConfig.hidden_act`).
    """

    gate_up_proj: Linear
    down_proj: Linear
    hidden_act: str = eqx.field(static=True, default="silu")

    def __call__(
        self, x: Float[Array, "hidden tokens"], plan: ExecutionPlan = CPU_PLAN
    ) -> Float[Array, "hidden tokens"]:
        """The block's output for feature-major tokens `x` (same shape); the products as
        `plan` (an `ExecutionPlan`, static) computes them."""
        gate_up = self.gate_up_proj(x, plan)  # one product: see `fuse_projections`
        half = gate_up.shape[0] // 2
        gate, up = gate_up[:half], gate_up[half:]
        if self.hidden_act == "gelu_pytorch_tanh":
            gate = jax.nn.gelu(gate, approximate=True)
        else:
            gate = jax.nn.silu(gate)
        return self.down_proj(gate * up, plan)

    @property
    def gate_proj(self) -> Linear:
        """The gate projection (the first `intermediate` rows of `gate_up_proj`), a read-only view
        under its Hugging Face name; change the weights through `gate_up_proj`."""
        return self.gate_up_proj.rows(0, self.gate_up_proj.weight.shape[0] // 2)

    @property
    def up_proj(self) -> Linear:
        """The up projection (the last `intermediate` rows of `gate_up_proj`), read-only view."""
        out = self.gate_up_proj.weight.shape[0]
        return self.gate_up_proj.rows(out // 2, out)


class DecoderLayer(eqx.Module):
    """Pre-norm transformer block: `x + attn(norm(x))`, then `x + mlp(norm(x))`; with sandwich
    norms (Gemma 2/3, `DecoderConfig.sandwich_norms`) `x + norm(attn(norm(x)))`, then
    `x + norm(mlp(norm(x)))`.

    **Attributes:** `self_attn`, `mlp`; `input_layernorm` (before attention);
    `post_attention_layernorm`: before the MLP (Llama), or on the attention output when
    `pre_feedforward_layernorm` is set (Gemma); `pre_feedforward_layernorm`,
    `post_feedforward_layernorm`: Gemma's norms before and after the MLP, else `None`.
    """

    self_attn: Attention
    mlp: MLP
    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm
    pre_feedforward_layernorm: RMSNorm | None = None
    post_feedforward_layernorm: RMSNorm | None = None

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
        """One block on the feature-major residual stream `x` (`batch * seq` tokens).

        **Arguments:** as `Attention.__call__`. **Returns:** `(x, cache)`: the new residual
        stream (same shape) and the layer cache with this call's keys/values.
        """
        h, cache = self.self_attn(
            self.input_layernorm(x),
            positions,
            rope,
            cache,
            prefix_length=prefix_length,
            prefill_chunk=prefill_chunk,
            plan=plan,
        )
        if self.pre_feedforward_layernorm is None:
            x = x + h
            return x + self.mlp(self.post_attention_layernorm(x), plan), cache
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x), plan)
        return x + self.post_feedforward_layernorm(h), cache


class DecoderModel(eqx.Module):
    """The decoder stack without the output head (transformers' `LlamaModel`, `Gemma3TextModel`, ...).

    **Attributes:** `embed_tokens`, `layers` (a tuple, one `DecoderLayer` per layer; kept as
    separate arrays rather than stacked, since slicing stacked weights inside XLA's loops copies
    them: decode runs them unrolled, and a prefill of at least `SCAN_MIN_TOKENS` tokens stacks
    them for the call and runs a `jax.lax.scan`, see `_scan_layers`), `norm`, `rotary_emb`; `rotary_emb_local`: the sliding-window layers' own RoPE
    (`DecoderConfig.local_rope_theta`, Gemma 3) or `None`; `embed_scale` (static): the factor on
    the embeddings (`sqrt(hidden_size)` with `DecoderConfig.scale_embeddings`) or `None`.
    """

    embed_tokens: Embedding
    layers: tuple[DecoderLayer, ...]
    norm: RMSNorm
    rotary_emb: RotaryEmbedding
    rotary_emb_local: RotaryEmbedding | None = None
    embed_scale: float | None = eqx.field(static=True, default=None)

    def __call__(
        self,
        token_ids: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        cache: KVCache | PagedKVCache,
        *,
        prefix_length: Int[Array, " batch"] | None = None,
        prefill_chunk: int | None = None,
        plan: ExecutionPlan = CPU_PLAN,
    ) -> tuple[Float[Array, "hidden tokens"], KVCache | PagedKVCache]:
        """Embed `seq` new tokens per row, run every layer against `cache`, and norm.

        **Arguments:** `token_ids`, `positions` (`-1` = padding), `cache` (the new tokens go to
        slots `[cache.length, cache.length + seq)`; a `PagedKVCache`: each to its own position's
        block, decode only), `prefix_length`, `prefill_chunk` and `plan` as in
        `Attention.__call__` (`plan.scan_min_tokens` also sets when a prefill scans).

        **Returns:** `(hidden, cache)`: the final normed hidden states, feature-major
        `Float[Array, "hidden tokens"]` with `tokens = batch * seq` in row-major order, and the
        updated cache (a `KVCache`'s `length` advanced by `seq`; a `PagedKVCache`'s past each
        row's last position).

        **Raises:** `ValueError` for a `PagedKVCache` with `prefill_chunk` or `prefix_length`.
        """
        _, seq = token_ids.shape
        x = self.embed_tokens(token_ids.reshape(-1))  # [hidden, batch*seq]
        if self.embed_scale is not None:
            # Gemma: `hidden_size**0.5` rounded to the activations' dtype, then multiplied.
            x = x * jnp.asarray(self.embed_scale, x.dtype)
        rope = self.rotary_emb.cos_sin(positions)  # per row: longrope's choice of factors
        local_rope = rope
        if self.rotary_emb_local is not None:
            local_rope = self.rotary_emb_local.cos_sin(positions.reshape(-1))
        if isinstance(cache, PagedKVCache):
            check_paged_call(prefill_chunk, prefix_length)
            new_k, new_v = [], []
            for i, layer in enumerate(self.layers):
                local = layer.self_attn.sliding_window is not None
                x, view = layer(x, positions, (rope, local_rope)[local], cache.layer(i), plan=plan)
                new_k.append(view.k)
                new_v.append(view.v)
            return self.norm(x), cache.advanced(tuple(new_k), tuple(new_v), positions)
        write_index = cache.length[0]
        slot_positions = jax.lax.dynamic_update_slice(
            cache.positions, positions.astype(jnp.int32), (0, write_index)
        )
        ring = _ring_update(cache, positions)
        tokens = token_ids.size
        period = layer_period(self.layers)
        threshold = SCAN_MIN_TOKENS if plan.scan_min_tokens is None else plan.scan_min_tokens
        scan = prefill_chunk is not None and tokens >= threshold and period is not None
        run = self._scan_layers if scan else self._unrolled_layers
        x, new_k, new_v = run(
            x,
            positions,
            (rope, local_rope),
            cache,
            slot_positions,
            write_index,
            ring,
            prefix_length=prefix_length,
            prefill_chunk=prefill_chunk,
            plan=plan,
        )
        new_cache = dataclasses.replace(
            cache,
            k=tuple(new_k),
            v=tuple(new_v),
            positions=slot_positions,
            length=cache.length + seq,
            ring_positions=cache.ring_positions if ring is None else ring[2],
        )
        return self.norm(x), new_cache

    def _unrolled_layers(self, x, positions, ropes, cache, slot_positions, write_index, ring, **kw):
        """Every layer in turn, one traced copy per layer (decode, and short prefills)."""
        new_k, new_v = [], []
        for i, (layer, k, v) in enumerate(zip(self.layers, cache.k, cache.v)):
            x, view = layer(
                x,
                positions,
                ropes[layer.self_attn.sliding_window is not None],
                LayerCache(
                    k,
                    v,
                    slot_positions,
                    write_index,
                    *(ring if i in cache.ring_layers else ()),
                ),
                **kw,
            )
            new_k.append(view.k)
            new_v.append(view.v)
        return x, new_k, new_v

    def _scan_layers(self, x, positions, ropes, cache, slot_positions, write_index, ring, **kw):
        """The layers as a `jax.lax.scan` over groups of `layer_period(layers)` layers (1 for
        Llama, 6 for Gemma 3's 5 local + 1 global), so XLA compiles one group instead of every
        layer (Equinox's scan-over-layers: `eqx.partition` into arrays and static parts, the
        arrays stacked along a leading `layers / period` axis, `eqx.combine` in the body).

        The stacked weights are a copy made in this call (the model keeps one array per layer),
        which XLA's CPU backend would also make per layer inside the loop (a `dynamic-slice` of a
        stacked weight is materialised before its dot): negligible against a long prefill's
        arithmetic, but it would slow decode (see `SCAN_MIN_TOKENS`). Same result as
        `_unrolled_layers`."""
        period = layer_period(self.layers)
        groups = len(self.layers) // period

        def stack(*xs):
            return jnp.stack(xs)

        params, statics = [], []
        for j in range(period):
            members = [self.layers[g * period + j] for g in range(groups)]
            arrays = [eqx.filter(m, eqx.is_array) for m in members]
            params.append(jax.tree.map(stack, *arrays))
            statics.append(eqx.partition(members[0], eqx.is_array)[1])

        def body(x, params):
            out_k, out_v = [], []
            for j, (p, static) in enumerate(zip(params, statics)):
                layer = eqx.combine(p, static)
                # a prefill's cache is empty (`DecoderForCausalLM.prefill`): zeros made here
                # instead of the given ones stacked (same values, less to compile and copy)
                k, v = jnp.zeros_like(cache.k[j]), jnp.zeros_like(cache.v[j])
                x, view = layer(
                    x,
                    positions,
                    ropes[layer.self_attn.sliding_window is not None],
                    LayerCache(
                        k,
                        v,
                        slot_positions,
                        write_index,
                        *(ring if j in cache.ring_layers else ()),
                    ),
                    **kw,
                )
                out_k.append(view.k)
                out_v.append(view.v)
            return x, (tuple(out_k), tuple(out_v))

        x, (out_k, out_v) = jax.lax.scan(body, x, tuple(params))
        order = [(g, j) for g in range(groups) for j in range(period)]
        new_k = [out_k[j][g] for g, j in order]
        new_v = [out_v[j][g] for g, j in order]
        return x, new_k, new_v


def _ring_update(cache: KVCache, positions: Int[Array, "batch seq"]):
    """Where this call's tokens go in the rings of `cache` (`KVCache.ring_layers`), and the
    positions the ring slots hold before and after: `(slots, before, after)`, or `None` without
    rings. A token at position `p` goes to slot `p % ring`; padding (`p < 0`) and the tokens of a
    row older than its newest `ring` ones in this call go past the end (dropped)."""
    if not cache.ring_layers:
        return None
    before = cache.ring_positions
    ring = before.shape[-1]
    positions = positions.astype(jnp.int32)
    newest = jnp.max(positions, axis=-1, keepdims=True)  # [batch, 1]
    kept = (positions >= 0) & (positions > newest - ring)
    slots = jnp.where(kept, positions % ring, ring)
    after = jax.vmap(lambda r, s, p: r.at[s].set(p, mode="drop"))(before, slots, positions)
    return slots, before, after


SCAN_MIN_TOKENS = 1024
"""Prefill calls of at least this many tokens (`batch * seq`) run the layers as a `lax.scan`
(`DecoderModel._scan_layers`); shorter calls and every decode step run them unrolled.

Scanning compiles one layer group instead of every layer (SmolLM2, 1,024 tokens, one run on the
shared machine: 4.7 s against 18.4 s), but XLA's CPU backend copies each layer's weights out of
the stacked array before its matmuls (a `dynamic-slice` fusion per weight and layer). In a
prefill that copy and the stacking cost ~9% of the run time at 1,024 tokens (3.47 s against
3.17 s), less for longer prompts; in a decode step, which reads each weight once, it cost 25-30%
(a 30-layer SmolLM2-sized matvec stack), so decode stays unrolled. At 512 tokens the scan made
`bench_generate.py`'s float32 prefill 21% slower (0.537 s against 0.443 s unrolled, same machine,
one session) and its first call no faster (4.74 s against 4.27 s), so the threshold is 1,024
(it was 256). See `docs/concepts/long_prompts.md`."""


def layer_period(layers: tuple["DecoderLayer", ...]) -> int | None:
    """The smallest `p` dividing `len(layers)` such that layer `i` has the structure (static
    fields, `None` parts, shapes and dtypes) of layer `i % p`: 1 for Llama, Qwen3 or Phi-3, 6 for
    Gemma 3's 5 local + 1 global pattern over 18 layers; `None` when no `p < len(layers)` fits
    (then scanning would save nothing)."""

    def signature(layer):
        arrays, static = eqx.partition(layer, eqx.is_array)
        shapes = [(a.shape, a.dtype) for a in jax.tree.leaves(arrays)]
        return jax.tree.structure(arrays), static, shapes

    signatures = [signature(layer) for layer in layers]
    n = len(layers)
    for p in range(1, n):
        if n % p == 0 and all(signatures[i] == signatures[i % p] for i in range(p, n)):
            return p
    return None


class DecoderForCausalLM(AbstractCausalLM):
    """A causal language model of any supported family: decoder plus output head.

    Construct it with `DecoderForCausalLM.from_weights(config, weights)` (what the loaders do;
    Hugging Face weight names of any family) or, for tests, with random weights:
    `DecoderForCausalLM(config, key=jax.random.key(0))`. `LlamaForCausalLM` is the same class.

    **Attributes:**

    - `config`: the `DecoderConfig` (static).
    - `model`: the `DecoderModel`.
    - `lm_head`: the output `Linear`, or `None` when `config.tie_word_embeddings` (the output head
      is then `model.embed_tokens.weight`).
    - `generation_config`: the checkpoint's default generation settings (a
      `transformers.GenerationConfig`, static), or `None`; `functional_gen.generate` uses them
      when it is given no processors or sampler.
    - `plan`: the `ExecutionPlan` (static) the program is traced with:
      `ExecutionPlan.for_backend()` (the default backend's) unless given; change it with
      `with_plan`. Not part of `config_fingerprint`.
    - `kv_cache_dtype`: the dtype of the key/value buffers `init_cache` makes, by name
      (`"float32"` or `"bfloat16"`, static): by default bfloat16 when `jax.default_backend()` is
      a GPU, else float32; change it with `with_kv_cache_dtype`. Not part of
      `config_fingerprint`.
    """

    config: DecoderConfig = eqx.field(static=True)
    model: DecoderModel
    kv_cache_dtype: str = eqx.field(static=True, default="float32")
    lm_head: Linear | None
    generation_config: Any = eqx.field(static=True)
    plan: ExecutionPlan = eqx.field(static=True)

    def __init__(
        self,
        config: DecoderConfig,
        *,
        key: PRNGKeyArray,
        dtype=jnp.float32,
        kv_cache_dtype="auto",
        std: float = 0.02,
        generation_config=None,
        quantization: str | None = None,
        plan: ExecutionPlan | None = None,
    ):
        """Random weights: normal with standard deviation `std`, norm weights 1, biases normal.

        **Arguments:** `config`; `key` (keyword-only PRNG key); `dtype` of the matrices
        (`jnp.float32` or `jnp.bfloat16`; norms and biases stay float32); `kv_cache_dtype`
        (`"float32"`, `"bfloat16"`, a jnp dtype, or `"auto"`: bfloat16 on a GPU, float32
        elsewhere; an unsupported one raises `ValueError`); `std`;
        `generation_config` (a `transformers.GenerationConfig` or `None`); `quantization`:
        `None` or `"int8"` (every matrix, embedding included, quantized per output channel with
        `quantization.quantize_int8`; `dtype` is then unused); `plan`: the `ExecutionPlan`,
        `None` for `ExecutionPlan.for_backend()`.

        **Raises:** `ValueError` for an unknown `quantization` or an unsupported `dtype`;
        `TypeError` for a `plan` that is not an `ExecutionPlan`.
        """
        c = config
        _quantization.check_quantization(quantization)
        self.plan = check_plan(ExecutionPlan.for_backend() if plan is None else plan)
        matrix_format = _quantization.weight_format(jnp.zeros((), dtype))
        if matrix_format == "int8":
            raise ValueError(
                "`dtype` must be float32 or bfloat16; use quantization='int8' for int8"
            )
        keys = iter(jax.random.split(key, 16 * c.num_hidden_layers + 4))

        def normal(*shape):
            return std * jax.random.normal(next(keys), shape, jnp.float32)

        def matrix(out_features, in_features):
            w = normal(out_features, in_features)
            if quantization == "int8":
                return _quantization.quantize_int8(w)
            return w.astype(dtype), None

        def linear(out_features, in_features, bias):
            w, scale = matrix(out_features, in_features)
            return Linear(w, normal(out_features) if bias else None, scale)

        def fused_linear(sizes, in_features, bias):
            # the parts drawn one by one, in their order (the keys, hence the random weights,
            # are those of the separate projections the decoder had before the fusion)
            parts = [linear(n, in_features, bias) for n in sizes]

            def cat(xs):
                return None if xs[0] is None else jnp.concatenate(xs)

            return Linear(
                *(cat([getattr(p, f) for p in parts]) for f in ("weight", "bias", "scale"))
            )

        def norm(size=c.hidden_size):
            # ones for `weight`, zeros for `1 + weight`: the identity scale either way
            init = jnp.zeros if c.rms_norm_unit_offset else jnp.ones
            return RMSNorm(init((size,), jnp.float32), c.rms_norm_eps, c.rms_norm_unit_offset)

        qd, kvd = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        layers = tuple(
            DecoderLayer(
                self_attn=Attention(
                    qkv_proj=fused_linear((qd, kvd, kvd), c.hidden_size, c.attention_bias),
                    o_proj=linear(c.hidden_size, qd, c.attention_out_bias),
                    num_heads=c.num_attention_heads,
                    num_kv_heads=c.num_key_value_heads,
                    head_dim=c.head_dim,
                    sliding_window=c.sliding_window[i],
                    q_norm=norm(c.head_dim) if c.qk_norm else None,
                    k_norm=norm(c.head_dim) if c.qk_norm else None,
                    use_rope=c.use_rope[i],
                    query_pre_attn_scalar=c.query_pre_attn_scalar,
                    softcap=c.attn_logit_softcapping,
                ),
                mlp=MLP(
                    gate_up_proj=fused_linear(
                        (c.intermediate_size,) * 2, c.hidden_size, c.mlp_bias
                    ),
                    down_proj=linear(c.hidden_size, c.intermediate_size, c.mlp_bias),
                    hidden_act=c.hidden_act,
                ),
                input_layernorm=norm(),
                post_attention_layernorm=norm(),
                pre_feedforward_layernorm=norm() if c.sandwich_norms else None,
                post_feedforward_layernorm=norm() if c.sandwich_norms else None,
            )
            for i in range(c.num_hidden_layers)
        )
        self.config = config
        local = c.local_rope_theta is not None and any(w is not None for w in c.sliding_window)
        self.model = DecoderModel(
            embed_tokens=Embedding(*matrix(c.vocab_size, c.hidden_size)),
            layers=layers,
            norm=norm(),
            rotary_emb=RotaryEmbedding.of_config(c),
            rotary_emb_local=RotaryEmbedding(jnp.asarray(c.rope_inv_freq(local=True)))
            if local
            else None,
            embed_scale=c.hidden_size**0.5 if c.scale_embeddings else None,
        )
        self.lm_head = None if c.tie_word_embeddings else linear(c.vocab_size, c.hidden_size, False)
        self.generation_config = generation_config
        self.kv_cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype)

    def with_plan(self, plan: ExecutionPlan) -> "DecoderForCausalLM":
        """This model traced under another `ExecutionPlan` (e.g. the GPU plan's program on a
        CPU, for tests and benchmarks). Weights are shared, not copied; `config_fingerprint` is
        unchanged (a `SequenceState` saved under one plan resumes under the other).

        **Raises:** `TypeError` if `plan` is not an `ExecutionPlan`.
        """
        model = copy.copy(self)
        object.__setattr__(model, "plan", check_plan(plan))  # a static field
        return model

    @property
    def compiler_options(self) -> tuple[tuple[str, str], ...]:
        """The plan's per-program XLA options (`ExecutionPlan.compiler_options`): none under the
        CPU plan; under the GPU plan XLA's command buffers for `while` and conditionals, so that
        `generate`'s loop of steps replays as CUDA graphs instead of returning to the host every
        iteration."""
        return self.plan.compiler_options

    @property
    def paged_decode(self) -> bool:
        """`True` when the plan reads a `PagedKVCache` with a kernel (`ExecutionPlan.
        paged_attention` `"pallas"` / `"pallas_interpret"`: the GPU plan), so that the serving
        engine passes its blocks as they are; under `"gather"` (CPU) the engine gathers them
        once per dispatch, cheaper there than a gather in every layer and step."""
        return self.plan.paged_attention != "gather"

    @property
    def dtype(self):
        """The dtype of the activations and the logits: always float32 (the weights may be
        stored as bfloat16 or int8, see `weight_format`; the `KVCache` as `kv_cache_dtype`)."""
        return jnp.float32

    @property
    def weight_format(self) -> str:
        """How the matrices are stored: `"float32"`, `"bfloat16"` or `"int8"` (per-output-channel
        int8 with float32 scales; see `functional_gen.models.quantization`)."""
        return _quantization.weight_format(self.model.embed_tokens.weight)

    def init_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty `KVCache` for this model: `batch_size` rows of `max_len` slots, the
        sliding-window layers in rings of at most `sliding_window + RING_RESERVE` slots (see
        `KVCache.init`), keys and values in `kv_cache_dtype`."""
        return KVCache.init(self.config, batch_size, max_len, jnp.dtype(self.kv_cache_dtype))

    @property
    def vocab_size(self) -> int:
        """`config.vocab_size`."""
        return self.config.vocab_size

    @property
    def eos_token_id(self) -> tuple[int, ...]:
        """`config.eos_token_id`: every id that ends a row (config and generation config merged)."""
        return self.config.eos_token_id

    @property
    def pad_token_id(self) -> int | None:
        """`config.pad_token_id`."""
        return self.config.pad_token_id

    @property
    def max_position_embeddings(self) -> int | None:
        """`config.max_position_embeddings`."""
        return self.config.max_position_embeddings

    @property
    def config_fingerprint(self) -> str:
        """Digest of the class, the `DecoderConfig` and the weight dtype (see
        `DecoderConfig.fingerprint_parts`: unchanged for Llama-family configs since the
        families joined)."""
        return fingerprint(*self.config.fingerprint_parts(type(self).__name__), str(self.dtype))

    def __call__(
        self,
        token_ids: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        cache: KVCache | PagedKVCache,
        *,
        logits_to_keep: int = 0,
        prefix_length: Int[Array, " batch"] | None = None,
    ) -> tuple[Float[Array, "batch keep vocab"], KVCache | PagedKVCache]:
        """Run the decoder on `seq` new tokens per row, reading and extending `cache`.

        Decode passes one token per row; prefill passes the whole (left-padded) prompt (see also
        `prefill`, which starts from an empty cache). The tokens are written to cache slots
        `[cache.length, cache.length + seq)` of every row.

        **Arguments:**

        - `token_ids`: `Int[Array, "batch seq"]`, the new tokens.
        - `positions`: `Int[Array, "batch seq"]`, their 0-based RoPE positions; `-1` marks padding
          (never attended to).
        - `cache`: the `KVCache` holding the earlier tokens; it must have at least `seq` free slots.
          Or (decode) a `PagedKVCache` (`functional_gen.models.paged_cache`): every token goes to
          its own position's block, which its row's table must hold.
        - `logits_to_keep`: static; `0` returns logits for every new token, `n > 0` only for the
          last `n` per row (prefill needs just the last one).
        - `prefix_length`: `Int[Array, " batch"]` or `None`; tokens at positions below it attend
          to each other bidirectionally (prefix-LM, "cache-init" mode of flax PR #1316), every
          other token causally. `None` (default): causal everywhere.

        **Returns:** `(logits, cache)`: `logits` is float32 `[batch, keep, vocab]` (unnormalised
        next-token scores for the token after each kept position; `keep` is `seq` or
        `logits_to_keep`), and the updated cache.

        Writing past `max_len` is not checked here (shapes are static inside `jit`);
        `functional_gen.generate` sizes the cache before it calls the model.
        """
        return self._forward(token_ids, positions, cache, logits_to_keep, None, prefix_length)

    def prefill(
        self,
        token_ids: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        *,
        max_len: int,
        logits_to_keep: int = 1,
        prefix_length: Int[Array, " batch"] | None = None,
    ) -> tuple[Float[Array, "batch keep vocab"], KVCache]:
        """Prefill: ONE call over whole (left-padded) prompts that fills a new `KVCache`.

        Equal to `model(token_ids, positions, model.init_cache(batch, max_len))`, but faster: the
        prompt goes into a cache of exactly `seq` slots, so attention reads no empty slots and
        skips the blocks that causality masks out, and the cache is then extended to `max_len`.

        **Arguments:** `token_ids`, `positions`, `prefix_length` as in `__call__`; `max_len`
        (static): slots of the returned cache, at least `seq`; `logits_to_keep` (static): as in
        `__call__`, default 1 (the next-token logits only).

        **Returns:** `(logits, cache)` as in `__call__`.

        **Raises:** `ValueError` if `max_len < seq`.
        """
        batch, seq = token_ids.shape
        if max_len < seq:
            raise ValueError(f"`max_len` ({max_len}) must be at least the prompt length ({seq})")
        cache = self.init_cache(batch, seq)
        logits, cache = self._forward(
            token_ids, positions, cache, logits_to_keep, prefill_block(seq), prefix_length
        )
        return logits, cache.extend(max_len)

    def _forward(self, token_ids, positions, cache, logits_to_keep, prefill_chunk, prefix_length):
        batch, seq = token_ids.shape
        x, new_cache = self.model(
            token_ids,
            positions,
            cache,
            prefix_length=prefix_length,
            prefill_chunk=prefill_chunk,
            plan=self.plan,
        )
        keep = seq if logits_to_keep == 0 else min(logits_to_keep, seq)
        if keep != seq:
            x = x.reshape(-1, batch, seq)[:, :, seq - keep :].reshape(-1, batch * keep)
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        # [vocab, batch*keep], float32 under every plan
        logits = _quantization.matmul(head.weight, head.scale, x, head.batched, self.plan)
        if self.plan.logits_fence:
            # Fenced: otherwise XLA folds the transpose below into the dot and computes the
            # token-major [batch*keep, vocab] product, whose CPU kernel took 43 ms at 2-4 tokens
            # (3 ms fenced; profile of a decode step with jax.profiler, 2026-11-22).
            logits = jax.lax.optimization_barrier(logits)
        cap = self.config.final_logit_softcapping
        if cap is not None:  # Gemma 2: `Gemma2ForCausalLM.forward`'s final soft-capping
            logits = cap * jnp.tanh(logits / cap)
        return logits.T.reshape(batch, keep, -1), new_cache

    @classmethod
    def from_weights(
        cls,
        config: DecoderConfig,
        weights: Mapping[str, np.ndarray | Array],
        *,
        dtype=jnp.float32,
        generation_config=None,
        quantization: str | None = None,
        plan: ExecutionPlan | None = None,
    ) -> "DecoderForCausalLM":
        """Build the model of any supported family from a mapping of Hugging Face weight names
        to arrays.

        The names are the module paths (`model.layers.0.self_attn.q_proj.weight`, ...), so the
        mapping table is the module tree itself, after the family's own renames
        (`functional_gen.models.families`), and the separate q/k/v and gate/up projections of
        every family fused into `qkv_proj` and `gate_up_proj` (`fuse_projections`; Phi-3's
        come fused; either form is accepted). `lm_head.weight` may be absent when the
        embeddings are tied, and is ignored then.

        **Arguments:**

        - `config`: the `DecoderConfig` (e.g. from `config_from_hf`).
        - `weights`: name -> array (numpy or JAX, any float dtype), in torch layout. For an int8
          model a matrix may also come already quantized: an int8 `....weight` with its float32
          `[out, blocks]` `....scale` (what the GGUF loader passes); float matrices are quantized
          here, one at a time.
        - `dtype`: dtype of the matrices (`jnp.float32` or `jnp.bfloat16`); norms and biases are
          float32.
        - `generation_config`: the checkpoint's `transformers.GenerationConfig`, or `None`.
        - `quantization`: `None` or `"int8"` (per-output-channel int8 matrices, see
          `functional_gen.models.quantization`).
        - `plan`: the `ExecutionPlan`; `None` for `ExecutionPlan.for_backend()`.

        **Returns:** the `DecoderForCausalLM`.

        **Raises:** `ValueError` naming the missing or unexpected weights, the weight whose
        shape differs from the config's (a fused one: `...qkv_proj.weight`), the parts of a
        fused weight given only in part, or an unknown `quantization`.
        """
        _quantization.check_quantization(quantization)
        weights = hf_weights(config.model_type, weights, config.num_hidden_layers)
        skeleton = eqx.filter_eval_shape(
            cls,
            config,
            key=jax.random.key(0),
            dtype=dtype,
            generation_config=generation_config,
            quantization=quantization,
            plan=plan,
        )
        return fill_weights(skeleton, config, weights)

    def first_layers(self, num_layers: int) -> "DecoderForCausalLM":
        """The model truncated to its first `num_layers` decoder layers, with the same final norm,
        output head, embeddings and RoPE: the draft of early-exit (self-speculative) decoding
        (Elhoushi et al. 2024, "LayerSkip"). Weights are shared, not copied.

        **Arguments:** `num_layers`: how many layers to keep, `1 <= num_layers <=
        config.num_hidden_layers`.

        **Returns:** a `DecoderForCausalLM` whose config has `num_hidden_layers=num_layers` (and the
        first `num_layers` entries of the per-layer `sliding_window` and `use_rope`); its
        `init_cache` makes a cache of that many layers.

        **Raises:** `ValueError` if `num_layers` is out of range.
        """
        total = self.config.num_hidden_layers
        if isinstance(num_layers, bool) or not isinstance(num_layers, int):
            raise ValueError(f"`num_layers` must be an int, got {num_layers!r}")
        if not 1 <= num_layers <= total:
            raise ValueError(f"`num_layers` must be between 1 and {total}, got {num_layers}")
        config = dataclasses.replace(
            self.config,
            num_hidden_layers=num_layers,
            sliding_window=self.config.sliding_window[:num_layers],
            use_rope=self.config.use_rope[:num_layers],
        )
        model = eqx.tree_at(lambda m: m.model.layers, self, self.model.layers[:num_layers])
        model = copy.copy(model)
        object.__setattr__(model, "config", config)  # a static field: not reachable by tree_at
        return model

    def named_weights(self) -> dict[str, Array]:
        """The weights under their Hugging Face names (the inverse of `from_weights`).

        **Returns:** name -> array, under Hugging Face's separate names for every family: the
        fused `qkv_proj` and `gate_up_proj` split by rows into `q_proj`, `k_proj`, `v_proj`,
        `gate_proj`, `up_proj` (`functional_gen.models.families.split_projections`; slices of
        the stored arrays); the computed `model.rotary_emb.inv_freq` and
        `model.rotary_emb_local.inv_freq` are left out.
        """
        leaves = jax.tree_util.tree_flatten_with_path(self)[0]
        out = {path_name(path): leaf for path, leaf in leaves}
        out.pop("model.rotary_emb.inv_freq", None)
        out.pop("model.rotary_emb_local.inv_freq", None)
        c = self.config
        return split_projections(
            out,
            c.num_hidden_layers,
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        )


def num_parameters(model: DecoderForCausalLM) -> int:
    """Number of weights (the tied output head counted once)."""
    return sum(math.prod(w.shape) for w in model.named_weights().values())


LlamaForCausalLM = DecoderForCausalLM
"""The older name of `DecoderForCausalLM` (the Llama family is the decoder with every declared
difference of `DecoderConfig` at its default)."""

LlamaModel = DecoderModel
"""The older name of `DecoderModel`."""
