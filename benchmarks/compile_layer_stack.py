"""Compile time against step time of a SmolLM2-sized 30-layer stack of matrix products, unrolled,
by the number of token columns: why a batch-1 decode step costs the most to compile.

A layer here is SmolLM2-135M's seven projections (q 576x576, k and v 192x576, o 576x576, gate
and up 1536x576, down 576x1536, float32, feature-major `weight @ x` as the decoder computes them)
with two RMS norms and stand-in elementwise work; no attention and no cache. With one token
column XLA's CPU backend emits every matrix-vector dot as its own tiled LLVM IR loop (compiled
per dot, per layer); from two columns on it calls Eigen's matrix product, which compiles in a
fraction of the time but runs a batch-1 step slower (see docs/concepts/long_prompts.md).
Process-wide XLA options can be tried with `XLA_FLAGS`, e.g.
`XLA_FLAGS=--xla_backend_extra_options=xla_llvm_dot_tiling_factor=1`.

Run: `python benchmarks/compile_layer_stack.py [--tokens 1 2 16] [--layers 30] [--repeats 2]`.
Printed per token count and repeat: compile wall and CPU seconds (`jax.clear_caches()` first)
and the median and best step time over 5 x 20 calls. On the shared machine, repeat and compare
within one run.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

HIDDEN, INTERMEDIATE, Q, KV = 576, 1536, 576, 192


def random_layers(num_layers: int) -> list[dict[str, jax.Array]]:
    """`num_layers` dicts of SmolLM2-shaped float32 projection weights, torch `(out, in)` layout."""
    rng = np.random.default_rng(0)

    def weight(out, inp):
        return jnp.asarray(rng.standard_normal((out, inp), np.float32) * 0.02)

    shapes = {
        "q": (Q, HIDDEN),
        "k": (KV, HIDDEN),
        "v": (KV, HIDDEN),
        "o": (HIDDEN, Q),
        "g": (INTERMEDIATE, HIDDEN),
        "u": (INTERMEDIATE, HIDDEN),
        "d": (HIDDEN, INTERMEDIATE),
    }
    return [{n: weight(*s) for n, s in shapes.items()} for _ in range(num_layers)]


def _norm(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, 0, keepdims=True) + 1e-6)


def stack(layers: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    """Every layer in turn, unrolled: `x` is `Float[Array, "hidden tokens"]`, same shape out."""
    for p in layers:
        h = _norm(x)
        q, k, v = p["q"] @ h, p["k"] @ h, p["v"] @ h
        x = x + p["o"] @ (jnp.tanh(q) * jnp.concatenate([k, v, k], 0))
        h = _norm(x)
        x = x + p["d"] @ (jax.nn.silu(p["g"] @ h) * (p["u"] @ h))
    return x


def measure(layers, tokens: int) -> tuple[float, float, float, float]:
    """`(compile wall s, compile CPU s, median step s, best step s)` of `stack` on `tokens`
    columns, compiled after `jax.clear_caches()`."""
    jax.clear_caches()
    x = jnp.ones((HIDDEN, tokens), jnp.float32)
    w0, c0 = time.perf_counter(), time.process_time()
    compiled = jax.jit(stack).lower(layers, x).compile()
    w1, c1 = time.perf_counter(), time.process_time()
    compiled(layers, x).block_until_ready()
    steps = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20):
            y = compiled(layers, x)
        y.block_until_ready()
        steps.append((time.perf_counter() - start) / 20)
    return w1 - w0, c1 - c0, statistics.median(steps), min(steps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 2, 16])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    layers = random_layers(args.layers)
    print("| tokens | compile wall (s) | compile CPU (s) | step median (ms) | step best (ms) |")
    print("|---|---|---|---|---|")
    for _ in range(args.repeats):
        for tokens in args.tokens:
            wall, cpu, median, best = measure(layers, tokens)
            print(
                f"| {tokens} | {wall:.2f} | {cpu:.2f} | {median * 1e3:.2f} | {best * 1e3:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
