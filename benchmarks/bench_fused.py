"""Fused q/k/v and gate/up projections against separate ones: one decode step, interleaved.

    .venv/bin/python benchmarks/bench_fused.py [--calls 40] [--batches 1 8] [--cache-len 256]
        [--formats float32 bfloat16 int8] [--prefill 512]

Loads the default model (SmolLM2-135M-Instruct) in each weight format and builds a variant whose
layers compute q/k/v with ONE matmul over the row-concatenated `[q; k; v]` weight (int8: the int8
rows and their `[out, blocks]` scales concatenated) and gate/up with one over `[gate; up]`, the
outputs split by rows. Both are timed as a jitted decode step (`model(token, position, cache)`
plus the greedy argmax, the cache donated, as inside `generate`), A and B alternating call by
call; the figure is the median of `--calls` calls each, reported as the ratio fused / separate
(< 1: fused is faster). The logits of both are compared first.

Measured 2026-11-23 (issue 13; shared 2-core box, medians of 40 interleaved calls, 256-slot
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

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import functional_gen as fg
from functional_gen.models import llama


class _Given(eqx.Module):
    """A stand-in `Linear` that returns an output computed before (a slice of a fused one)."""

    y: jax.Array

    def __call__(self, x):
        return self.y


def _fuse(linears):
    w = jnp.concatenate([m.weight for m in linears], axis=0)
    s = None if linears[0].scale is None else jnp.concatenate([m.scale for m in linears], axis=0)
    b = None if linears[0].bias is None else jnp.concatenate([m.bias for m in linears], axis=0)
    return llama.Linear(w, b, s)


def _split(y, sizes):
    return [y[a : a + n] for a, n in zip(np.cumsum((0, *sizes[:-1])), sizes)]


class FusedAttention(eqx.Module):
    qkv_proj: llama.Linear
    o_proj: llama.Linear
    sizes: tuple[int, int, int] = eqx.field(static=True)
    num_heads: int = eqx.field(static=True)
    num_kv_heads: int = eqx.field(static=True)
    head_dim: int = eqx.field(static=True)
    sliding_window: int | None = eqx.field(static=True)

    def __call__(self, x, *args, **kwargs):
        q, k, v = _split(self.qkv_proj(x), self.sizes)
        inner = llama.Attention(
            _Given(q),
            _Given(k),
            _Given(v),
            self.o_proj,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.sliding_window,
        )
        return inner(x, *args, **kwargs)


class FusedMLP(eqx.Module):
    gate_up_proj: llama.Linear
    down_proj: llama.Linear
    size: int = eqx.field(static=True)

    def __call__(self, x):
        g, u = _split(self.gate_up_proj(x), (self.size, self.size))
        return llama.MLP(_Given(g), _Given(u), self.down_proj)(x)


def fused(model):
    def layer(d):
        a, m = d.self_attn, d.mlp
        attn = FusedAttention(
            _fuse([a.q_proj, a.k_proj, a.v_proj]),
            a.o_proj,
            tuple(p.weight.shape[0] for p in (a.q_proj, a.k_proj, a.v_proj)),
            a.num_heads,
            a.num_kv_heads,
            a.head_dim,
            a.sliding_window,
        )
        mlp = FusedMLP(_fuse([m.gate_proj, m.up_proj]), m.down_proj, m.gate_proj.weight.shape[0])
        return llama.DecoderLayer(attn, mlp, d.input_layernorm, d.post_attention_layernorm)

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
    args = parser.parse_args(argv)
    rows = []
    for fmt in args.formats:
        kw = {"quantization": "int8"} if fmt == "int8" else {"dtype": fmt}
        model, _ = fg.load_model(**kw)
        model_b = fused(model)
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
        print(
            f"{fmt:<9} {what:<13} {ta * 1e3:>11.2f} {tb * 1e3:>9.2f} {tb / ta:>9.3f} {diff:>12.2e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
