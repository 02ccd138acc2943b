"""Fused q/k/v and gate/up projections against separate ones: one decode step, interleaved.

    .venv/bin/python benchmarks/bench_fused.py [--calls 40] [--batches 1 8] [--cache-len 256]
        [--formats float32 bfloat16 int8] [--prefill 512]

The decoder stores q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj` matrix (issue 40
item 6, `functional_gen.models.families.fused`). This script loads a named model (`--model`,
default SmolLM2-135M-Instruct) in each weight format and builds a variant whose layers run the
fused matrices as separate products again (`separate`: the layout before the fusion). Both are
timed as a jitted decode step (`model(token, position, cache)` plus the greedy argmax, the cache
donated, as inside `generate`), A (separate) and B (fused) alternating call by call; the figure
is the median of `--calls` calls each, reported as the ratio fused / separate (< 1: fused is
faster). The logits of both are compared first. `--compile N` first times N rounds of the first
`fg.generate` call of each (after `jax.clear_caches()`, in this process: wall and CPU seconds
beyond a repeated call).

Measured 2026-11-26 (issue 40; shared 2-core box loaded by 5 jobs, so CPU seconds are the
figure to read for compile, the wall seconds moved with the load), float32, fused / separate:

| model | compile of first generate, CPU s (2 rounds) | decode B=1 | decode B=8 |
|---|---|---|---|
| SmolLM2-135M | 6.38 / 7.97, 6.81 / 7.88 (0.80, 0.86) | 0.978 | 1.009 |
| Gemma 3 270M | 7.39 / 10.31, 7.97 / 8.84 (0.72, 0.90) | 1.061, 1.067, 0.948 | 0.992, 0.952 |

(decode: medians of 20 (SmolLM2) / 10 and 40 (Gemma, two runs) interleaved calls, 256-slot
cache; logits identical, max |delta| 0. The Gemma batch-1 ratios moved from 0.95 to 1.07 between
runs of the same code: the load of the machine, not the layout, decides them here; remeasure on a
quiet machine before reading a 3% difference into them.)

Before the fusion was merged (issue 13, the other way round: separate was the model): Measured 2026-11-23 (issue 13; shared 2-core box, medians of 40 interleaved calls, 256-slot
cache; logits identical, max |delta| 0), fused / separate:

| format | decode B=1 | decode B=8 | prefill 512 |
|---|---|---|---|
| float32 | 0.957 | 1.000 | 1.025 / 1.000 (two runs) |
| bfloat16 | 0.918 | 0.971 | 1.141 / 0.998 |
| int8 | 0.896 | 0.979 | 0.949 / 0.996 |

A fused layout was then built in `llama.py` (branch `fuse`, not merged): inside `generate`, batch
1, 96 tokens, 7 paired quiet runs, per-step time fused / separate was int8 0.928, float32 0.978,
bfloat16 1.009, and a 512-token prefill 0-6% slower at float32/bfloat16 (one 3,072-row product
runs 6-10% slower than two 1,536-row ones at 512 tokens). Not merged: the gain (int8 batch 1
0.92x -> about 0.99x llama.cpp's Q8_0 on that box) does not reach issue 13's targets, prefill gets
slower, and DESIGN.md keeps module attributes equal to the Hugging Face weight names
(`self_attn.q_proj`, `mlp.gate_proj`) so that loading is one mapping table and user code can
`eqx.tree_at` a projection.
"""

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import functional_gen as fg
from functional_gen.models.quantization import Linear


class _Separate(eqx.Module):
    """A stand-in for a fused `Linear` that runs its parts as separate products and stacks the
    outputs (XLA folds the decoder's row slices of this concatenation back into the parts, so
    this is the layout before the fusion: one matmul per Hugging Face projection)."""

    parts: tuple[Linear, ...]

    def __call__(self, x):
        return jnp.concatenate([p(x) for p in self.parts])


def _split_linear(linear, sizes):
    edges = np.cumsum((0, *sizes))

    def rows(a):
        return None if a is None else tuple(a[s:e] for s, e in itertools.pairwise(edges))

    ws, bs, ss = rows(linear.weight), rows(linear.bias), rows(linear.scale)
    return _Separate(
        tuple(
            Linear(ws[i], None if bs is None else bs[i], None if ss is None else ss[i])
            for i in range(len(sizes))
        )
    )


def separate(model):
    """`model` with every fused `qkv_proj` / `gate_up_proj` run as separate products."""
    c = model.config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    i = c.intermediate_size

    def layer(d):
        d = eqx.tree_at(
            lambda d: d.self_attn.qkv_proj, d, _split_linear(d.self_attn.qkv_proj, (q, kv, kv))
        )
        return eqx.tree_at(
            lambda d: d.mlp.gate_up_proj, d, _split_linear(d.mlp.gate_up_proj, (i, i))
        )

    layers = tuple(layer(d) for d in model.model.layers)
    return eqx.tree_at(lambda m: m.model.layers, model, layers)


def stepper(model, batch, cache_len):
    """A jitted decode step over a `cache_len`-slot cache holding `cache_len - 1` tokens."""
    params, static = eqx.partition(model, eqx.is_array)

    @functools.partial(jax.jit, donate_argnums=(1,))
    def step(params, cache, token, position):
        logits, cache = eqx.combine(params, static)(token, position, cache)
        return jnp.argmax(logits[:, -1], axis=-1), logits, cache

    cache = model.init_cache(batch, cache_len)
    filled = cache_len - 1
    cache = eqx.tree_at(lambda k: k.length, cache, jnp.full((batch,), filled, jnp.int32))
    pos = jnp.where(jnp.arange(cache_len) < filled, jnp.arange(cache_len), -1)
    cache = eqx.tree_at(lambda k: k.positions, cache, jnp.tile(pos[None], (batch, 1)))
    token = jnp.full((batch, 1), 42)
    position = jnp.full((batch, 1), filled)
    state = {"cache": cache}

    def call():
        out, logits, state["cache"] = step(params, state["cache"], token, position)
        jax.block_until_ready(out)
        return logits

    return call


def prefiller(model, length):
    f = eqx.filter_jit(lambda m, x, p: m.prefill(x, p, max_len=x.shape[1] + 1)[0])
    x = (jnp.arange(length)[None] * 7919) % model.vocab_size
    p = jnp.arange(length)[None]

    def call():
        return jax.block_until_ready(f(model, x, p))

    return call


def first_generate_compile(model, tokenizer):
    """`(wall, CPU seconds)` the first `fg.generate` call (8 greedy tokens) takes beyond a
    repeated one, after `jax.clear_caches()`: its tracing, lowering and compilation."""
    jax.clear_caches()
    times = []
    for _ in range(2):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fg.generate(
            model, tokenizer, "The capital of France is", max_new_tokens=8, eos_token_id=[]
        )
        jax.block_until_ready(result.token_ids)
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times[0][0] - times[1][0], times[0][1] - times[1][1]


def interleaved(a, b, calls):
    a(), b()  # compile
    ta, tb = [], []
    for _ in range(calls):
        for fn, ts in ((a, ta), (b, tb)):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--cache-len", type=int, default=256)
    parser.add_argument("--formats", nargs="+", default=["float32", "bfloat16", "int8"])
    parser.add_argument("--prefill", type=int, default=0, help="also time a prefill this long")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a named model")
    parser.add_argument(
        "--compile", type=int, default=0, help="rounds of first-generate compile timing"
    )
    args = parser.parse_args(argv)
    rows = []
    for fmt in args.formats:
        kw = {"quantization": "int8"} if fmt == "int8" else {"dtype": fmt}
        model, tokenizer = fg.load_model(args.model, **kw)
        model, model_b = separate(model), model  # A: separate products, B: fused (the model)
        for r in range(args.compile):
            for label, m in (("separate", model), ("fused", model_b)):
                wall, cpu = first_generate_compile(m, tokenizer)
                print(f"{fmt} compile round {r} {label}: wall {wall:.2f} s, CPU {cpu:.2f} s")
                rows.append((fmt, f"compile {label}", wall, cpu, 0.0))
        for batch in args.batches:
            a = stepper(model, batch, args.cache_len)
            b = stepper(model_b, batch, args.cache_len)
            la, lb = np.asarray(a()), np.asarray(b())
            diff = float(np.max(np.abs(la - lb)))
            ta, tb = interleaved(a, b, args.calls)
            rows.append((fmt, f"decode B={batch}", ta, tb, diff))
            print(*rows[-1], flush=True)
        if args.prefill:
            a, b = prefiller(model, args.prefill), prefiller(model_b, args.prefill)
            diff = float(np.max(np.abs(np.asarray(a()) - np.asarray(b()))))
            ta, tb = interleaved(a, b, max(5, args.calls // 4))
            rows.append((fmt, f"prefill {args.prefill}", ta, tb, diff))
            print(*rows[-1], flush=True)
        del model, model_b
    print(
        f"\n{'format':<9} {'call':<13} {'separate ms':>11} {'fused ms':>9} {'fused/sep':>9} {'max |dlogit|':>12}"
    )
    for fmt, what, ta, tb, diff in rows:
        if what.startswith("compile"):
            print(f"{fmt:<9} {what:<17} wall {ta:.2f} s, CPU {tb:.2f} s")
            continue
        print(
            f"{fmt:<9} {what:<13} {ta * 1e3:>11.2f} {tb * 1e3:>9.2f} {tb / ta:>9.3f} {diff:>12.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
