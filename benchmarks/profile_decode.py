"""Where the time of one batch-1 decode step goes (SmolLM2-135M-Instruct, float32 by default).

    .venv/bin/python benchmarks/profile_decode.py [--cache-len 160] [--repeats 30]
        [--dtype float32|bfloat16] [--quantization int8]

The step is timed whole (`model(token, position, cache)` plus the greedy argmax, jitted, the
cache donated, as inside `generate`), then each kind of work is timed alone with the model's own
modules and weights, each as one jitted function over all 30 layers:

- weight reads: every projection (q, k, v, o, gate, up, down) of every layer and the output head,
  chained through a residual as in the model (the part the bandwidth bound counts);
- attention over the cache: scores, mask, softmax and the weighted sum, `cache-len` slots;
- cache writes: the 60 `dynamic_update_slice`s of the new key/value (donated buffers);
- norms, RoPE and the rest: 61 RMSNorms, the rotation of q/k, SiLU and residual adds;
- the sampling tail: the argmax over the 49,152 logits.

Figures are the fastest of `--repeats` calls (the machine is shared; interference only adds),
next to the bandwidth bound (weight bytes / a jitted 1 GiB sum's bandwidth).
"""

import argparse
import functools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen

import equinox as eqx
import jax
import jax.numpy as jnp

import functional_gen as fg
from functional_gen.models.llama import RotaryEmbedding

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generate import measure_bandwidth


def fastest(fn, *args, repeats):
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-len", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default=None)
    args = parser.parse_args(argv)
    model, _ = fg.load_model(dtype=args.dtype, quantization=args.quantization)
    c = model.config
    layers = model.model.layers
    length = args.cache_len
    cache = model.init_cache(1, length)
    cache = eqx.tree_at(lambda k: k.length, cache, jnp.full((1,), length - 1, jnp.int32))
    cache = eqx.tree_at(
        lambda k: k.positions,
        cache,
        jnp.where(jnp.arange(length) < length - 1, jnp.arange(length), -1)[None],
    )
    token = jnp.asarray([[42]])
    position = jnp.asarray([[length - 1]])

    params, static = eqx.partition(model, eqx.is_array)

    @functools.partial(jax.jit, donate_argnums=(1,))  # the cache is donated, as in `generate`
    def step(params, cache, token, position):
        logits, cache = eqx.combine(params, static)(token, position, cache)
        return jnp.argmax(logits[:, -1], axis=-1), cache

    def whole():
        nonlocal cache
        out, cache = step(params, cache, token, position)
        return out

    x0 = jax.random.normal(jax.random.key(0), (c.hidden_size, 1)) * 0.1

    @eqx.filter_jit
    def weight_reads(model, x):
        for layer in model.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            qkv = a.qkv_proj(x)
            qd, kvd = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
            q, k, v = qkv[:qd], qkv[qd : qd + kvd], qkv[qd + kvd :]
            x = x + a.o_proj(
                q + jnp.tile(k + v, (c.num_attention_heads // c.num_key_value_heads, 1))
            )
            gate_up = mlp.gate_up_proj(x)
            half = gate_up.shape[0] // 2
            x = x + mlp.down_proj(gate_up[:half] * gate_up[half:])
        head = model.model.embed_tokens if model.lm_head is None else model.lm_head
        from functional_gen.models.quantization import matmul

        return matmul(head.weight, head.scale, x)

    q0 = jax.random.normal(
        jax.random.key(1),
        (c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim, 1, 1),
    )

    @eqx.filter_jit
    def attention(layers, cache, q):
        out = 0.0
        for layer, k_cache, v_cache in zip(layers, cache.k, cache.v):
            out = out + layer.self_attn._attend(
                q, k_cache, v_cache, cache.positions, position, None
            )
        return out

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def cache_writes(ks, vs, kv):
        write = cache.length[0]
        ks = tuple(jax.lax.dynamic_update_slice(k, kv, (0, 0, write, 0)) for k in ks)
        vs = tuple(jax.lax.dynamic_update_slice(v, kv, (0, 0, write, 0)) for v in vs)
        return ks, vs

    kv_new = jnp.ones((1, c.num_key_value_heads, 1, c.head_dim))
    kv_state = [
        tuple(jnp.zeros_like(k) for k in cache.k),
        tuple(jnp.zeros_like(v) for v in cache.v),
    ]

    def writes():
        kv_state[:] = cache_writes(kv_state[0], kv_state[1], kv_new)
        return kv_state[0][0]

    @eqx.filter_jit
    def norms_rope_rest(model, x):
        rope = model.model.rotary_emb.cos_sin(position.reshape(-1))
        for layer in model.model.layers:
            h = layer.input_layernorm(x)
            q = RotaryEmbedding.rotate(h[: c.head_dim].reshape(1, c.head_dim, 1), rope)
            x = x + layer.post_attention_layernorm(x + q.reshape(-1, 1).sum())
            x = x + jax.nn.silu(x) * x
        return model.model.norm(x)

    logits0 = jax.random.normal(jax.random.key(2), (1, c.vocab_size))
    tail = jax.jit(lambda logits: jnp.argmax(logits, axis=-1))

    r = args.repeats
    parts = {
        "weight reads (all projections + head)": fastest(weight_reads, model, x0, repeats=r),
        f"attention over {length} cache slots": fastest(attention, layers, cache, q0, repeats=r),
        "cache writes (60 dynamic_update_slice)": fastest(writes, repeats=r),
        "norms, RoPE, SiLU, residuals": fastest(norms_rope_rest, model, x0, repeats=r),
        "sampling tail (argmax)": fastest(tail, logits0, repeats=r),
    }
    total = fastest(whole, repeats=r)
    bandwidth = measure_bandwidth()
    weight_bytes = sum(w.nbytes for w in model.named_weights().values())
    bound = weight_bytes / (bandwidth * 1e9)
    print(
        f"\ndecode step, batch 1, {model.weight_format} weights ({weight_bytes / 1e6:.0f} MB), "
        f"{length}-slot cache; fastest of {r}; bandwidth {bandwidth:.1f} GB/s"
    )
    print(f"{'part':<42} {'ms':>8} {'% of step':>9}")
    for name, t in parts.items():
        print(f"{name:<42} {t * 1e3:>8.2f} {t / total:>9.0%}")
    print(
        f"{'sum of the parts':<42} {sum(parts.values()) * 1e3:>8.2f} {sum(parts.values()) / total:>9.0%}"
    )
    print(f"{'whole step (model + argmax, jitted)':<42} {total * 1e3:>8.2f} {1:>9.0%}")
    print(f"{'bandwidth bound (weight bytes / BW)':<42} {bound * 1e3:>8.2f} {bound / total:>9.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
