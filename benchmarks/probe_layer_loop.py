"""Probe: can a batch-1 decode layer loop read stacked weights in place? A SmolLM2-sized stack
of 30 layers of the decoder's 4 fused projections (qkv 960x576, o 576x576, gate_up 3072x576,
down 576x1536, float32, one token column), three ways: unrolled dots over per-layer arrays (what
the decoder does), a `fori_loop` over stacked weights with dots (XLA:CPU copies each weight out
of the stack first), and the same loop with each matrix-vector product as multiply-and-reduce
(the dynamic slice fuses into the reduction: no copy). Prints compile CPU/wall seconds and step
times (median and best of 30), each variant twice, alternating.

Run: `python benchmarks/probe_layer_loop.py`. Result 2026-11-26 (loaded 2-core box): unrolled
1.46 / 1.61 s CPU, best 13.5 / 13.9 ms; loop with dots 0.25 / 0.28 s, 24.5 / 24.6 ms; loop with
multiply-reduce 0.19 / 0.22 s, 34.8 / 35.9 ms (docs/concepts/long_prompts.md)."""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

H, INTER, QKV = 576, 1536, 960
L = 30
rng = np.random.default_rng(0)


def w(o, i):
    return jnp.asarray(rng.standard_normal((L, o, i), np.float32) * 0.02)


W = {"qkv": w(QKV, H), "o": w(H, 576), "gu": w(2 * INTER, H), "d": w(H, INTER)}
x0 = jnp.asarray(rng.standard_normal((H, 1), np.float32))


def layer(x, mm, i):
    h = mm("qkv", i, x)
    x = x + mm("o", i, jnp.tanh(h[:576]))
    g = mm("gu", i, x)
    return x + mm("d", i, jax.nn.silu(g[:INTER]) * g[INTER:])


Wl = [{n: W[n][i] for n in W} for i in range(L)]


def unrolled(Wl, x):
    for i in range(L):
        x = layer(x, lambda n, i, v: Wl[i][n] @ v, i)
    return x


def loop_dot(W, x):
    return jax.lax.fori_loop(0, L, lambda i, x: layer(x, lambda n, i, v: W[n][i] @ v, i), x)


def loop_reduce(W, x):
    return jax.lax.fori_loop(
        0,
        L,
        lambda i, x: layer(
            x, lambda n, i, v: jnp.sum(W[n][i] * v[:, 0][None, :], axis=1, keepdims=True), i
        ),
        x,
    )


for name, f in (
    ("unrolled", unrolled),
    ("loop_dot", loop_dot),
    ("loop_reduce", loop_reduce),
    ("unrolled", unrolled),
    ("loop_dot", loop_dot),
    ("loop_reduce", loop_reduce),
):
    W_ = Wl if name == "unrolled" else W
    for rep in range(1):
        jax.clear_caches()
        c, t = time.process_time(), time.perf_counter()
        g = jax.jit(f).lower(W_, x0).compile()
        cc, ct = time.process_time() - c, time.perf_counter() - t
        g(W_, x0).block_until_ready()
        ts = []
        for _ in range(30):
            s = time.perf_counter()
            g(W_, x0).block_until_ready()
            ts.append(time.perf_counter() - s)
        print(
            f"{name} rep {rep}: compile CPU {cc:.2f} s wall {ct:.2f}; step median {statistics.median(ts) * 1e3:.2f} ms best {min(ts) * 1e3:.2f}",
            flush=True,
        )
ref = np.asarray(jax.jit(unrolled)(Wl, x0))
print("max diff reduce", float(np.max(np.abs(np.asarray(jax.jit(loop_reduce)(W, x0)) - ref))))
