"""What a few-row product of SmolLM2-135M's real layer dots costs against a one-row product, per
formulation of the dot and per XLA CPU compiler option: whether a speculative verification over
`M` positions can cost about what a plain one-token step costs (issue 41's batch-1 bound).

    .venv/bin/python benchmarks/bench_verify_dots.py [--rows 1 2 4 8] [--rounds 8]
        [--variants W@x x@W.T ...] [--layers 30]
    .venv/bin/python benchmarks/bench_verify_dots.py --in-model [--rounds 25]

A decode step at batch 1 multiplies `M` rows (1 for a plain step, `1 + guesses` for a
verification) by every weight of the model once. On a memory-bound CPU the weights' traffic is
the same for every `M`, so a 4-row product should cost ~1.0-1.1x a 1-row one; inside the model
a 4-position call measured 1.37x and 8 positions 1.76x (`functional_gen/speculative/cost.py`).

The chain: float32 weights of SmolLM2-135M's shapes (`--layers` layers of the fused `qkv`
960x576, `o` 576x576, fused `gate_up` 3072x576 and `down` 576x1536, then the tied head
49152x576; 538 MB at 30 layers, so every weight streams from memory as in the model), each
product's input computed from the previous product's output (a residual stream with a stand-in
for attention and the SwiGLU product), in ONE jitted program per variant and row count. The
variants (`VARIANTS`):

- `W@x`: the model's formulation today (`quantization.matmul`, float32: `W[out, in] @
  x[in, M]`, activations feature-major), default compiler options.
- `x@W.T`: the token-major chain, `x[M, in] @ W.T` with W stored `[out, in]` (the tied head's
  own layout, `[vocab, hidden]`).
- `sum(W*x)`: the elementwise multiply and reduce over `in` that XLA fuses itself,
  `(W[:, :, None] * x[None]).sum(1)`; `sum(x*W)` its token-major form
  `(x[:, None, :] * W[None]).sum(-1)`.
- `dot HIGHEST`: `lax.dot_general` with `precision=HIGHEST, preferred_element_type=float32`.
- `M x (W@x_i)`: `M` separate one-row products, concatenated (reads every weight `M` times).
- `Wt[in,out].x`, `sum_in(Wt*x)`: the weights stored transposed, `[in, out]` (not the model's
  torch layout): a `dot_general` contracting the weight's leading axis, and the multiply with a
  column reduction over `in` (vectorised along `out`).
- `W@x row blocks`: `quantization.matmul_row_blocks` (a scan over blocks of 4,096 output rows;
  only the head has more than one block).
- `W@x ynn off` / `W@x ynn indiv` / `W@x ynn all`: the default formulation compiled with
  `xla_cpu_experimental_ynn_fusion_type` = `""` (YNNPACK off: XLA's own dot emitter for every
  row count), `LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT` or `DOT,ELTWISE,REDUCE`, per program
  (`jax.jit(...).lower(...).compile(compiler_options=...)`, as `bench_compiler_options.py`).
  Options that are not per-program compile options (`xla_cpu_disable_tiled_emitter`: "No such
  compile option", and as `XLA_FLAGS` "Unknown flag": a leftover string in jaxlib 0.10.2)
  cannot be tried.

Timing: `--rounds` rounds; in each, every (variant, rows) program is called once, the order
reversed every other round, so a shared machine's load moves them alike; the best call is kept
(interference only adds time). Prints ms per chain, cost(M)/cost(1) of the same variant, and
cost against today's one-row chain (`W@x`, M = 1). Compare ratios; absolute times move with
the load. Each program's output is checked against the first variant at the same M (max
relative difference printed; all within 1.3e-6).

Measured 2026-11-26 23:05-23:11 UTC, this 2-core machine shared with two other jobs (load 3-4.5),
`--rounds 16` (run A) and `--rounds 20` (run B, without the `Wt` and row-block variants); ms per
chain, best call, and the ratio to the same variant's M = 1 (the multiply-reduce forms: to
`W@x`'s M = 1, their own one-row chain takes 0.5-1 s):

| variant | M=1 ms | M=2 | M=4 | M=8 | M=2/1 | M=4/1 | M=8/1 |
|---|---|---|---|---|---|---|---|
| `W@x` (today) A / B | 18.6 / 17.8 | 30.1 / 26.5 | 25.7 / 25.9 | 36.0 / 32.6 | 1.62 / 1.49 | 1.38 / 1.46 | 1.93 / 1.83 |
| `x@W.T` | 17.0 / 17.1 | 36.0 / 33.7 | 38.3 / 38.1 | 43.6 / 40.8 | 2.12 / 1.97 | 2.26 / 2.23 | 2.57 / 2.38 |
| `sum(W*x)` (vs `W@x` M=1) | 1,016 (run 1) | 25.6 / 22.9 | 26.3 / 25.4 | 30.4 / 30.1 | 1.38 / 1.29 | 1.42 / 1.43 | 1.64 / 1.69 |
| `sum(x*W)` (vs `W@x` M=1) | 1,010 (run 1) | 42.7 / 36.4 | 48.4 / 45.2 | 53.1 / 52.1 | 2.30 / 2.05 | 2.60 / 2.54 | 2.86 / 2.93 |
| `dot HIGHEST` | 18.4 / 14.4 | 29.4 / 22.6 | 26.1 / 26.5 | 36.1 / 31.9 | 1.59 / 1.57 | 1.42 / 1.84 | 1.96 / 2.21 |
| `M x (W@x_i)` | 19.7 / 15.3 | 30.1 / 27.8 | 50.3 / 44.3 | 83.8 / 83.1 | 1.53 / 1.82 | 2.56 / 2.89 | 4.26 / 5.42 |
| `W@x row blocks` | 22.6 / 19.9 | 32.2 / 32.0 | 30.6 / 32.0 | 37.7 / 37.8 | 1.42 / 1.60 | 1.35 / 1.60 | 1.66 / 1.90 |
| `Wt[in,out].x` (A) | 19.7 | 238 | 243 | 248 | 12.1 | 12.4 | 12.6 |
| `sum_in(Wt*x)` (A, vs `W@x`) | 877 | 55.2 | 56.1 | 60.4 | 2.97 | 3.02 | 3.25 |
| `W@x ynn off` | 19.7 / 16.4 | 41.0 / 34.1 | 37.9 / 33.7 | 48.0 / 40.4 | 2.08 / 2.08 | 1.92 / 2.06 | 2.43 / 2.47 |
| `W@x ynn indiv` | 15.7 / 15.7 | 30.7 / 24.6 | 24.0 / 27.6 | 32.9 / 30.7 | 1.95 / 1.57 | 1.53 / 1.76 | 2.09 / 1.95 |
| `W@x ynn all` | 16.0 / 16.2 | 26.8 / 24.4 | 31.3 / 30.0 | 37.7 / 36.1 | 1.67 / 1.51 | 1.95 / 1.86 | 2.35 / 2.23 |

The one-row programs of `W@x`, `dot HIGHEST` and the YNNPACK options are the same XLA GEMV
(YNNPACK takes no one-row dot), so their spread, 14.4-19.7 ms, is the noise of one run. Against
the fastest one-row chain (14.4-15.7 ms) the fastest 4-row chain of any variant (24.0-25.4 ms)
costs 1.5-1.7x; no formulation and no per-program option brings 4 rows within 1.15x of one
(538 MB in 15.7 ms is 34 GB/s; the 4-row kernels reach 21-22 GB/s). Two rows cost as much as
four. The multiply-reduce `sum(W*x)` ties `W@x` at 4 rows and is 5-15 % faster at 2 and 8, but
its one-row form is 55x slower and its win is inside the noise; not wired. Issue 41's batch-1
target (prompt lookup >= 2x plain) needs a verification near one plain step's cost, and on this
CPU with jaxlib 0.10.2's kernels it is 1.4-1.6x one (the ceiling of ~1.6x overall stays).
A third chain run (`--rows 1 4 8 16 --variants W@x 'sum(W*x)' --rounds 25`, load 5): `W@x` 19.3 /
30.7 / 37.8 / 40.9 ms, `sum(W*x)` - / 26.7 / 30.7 / 42.3 ms (4 rows 1.38x today's one row).

`--in-model` (the model's own calls, best / median ratio `reduce` / `today`), 2026-11-26 23:27
and 23:29 UTC, load 5-6: batch 1, one position (the same program twice: the noise) 1.01 / 1.13
and 1.00 / 0.94; 4 positions 0.91 / 0.88 and 1.01 / 0.89; 8 positions 0.89 / 0.92 and 0.87 /
0.89; batch 8, one position 0.90 / 0.76 and 0.95 / 0.97; logits within 1.1e-4 of today's. So
`sum(W*x)` may save ~10 % of a few-token float32 call on the loaded machine, but a 4-position
call still costs ~1.4x a one-position one, and whether it wins on a quiet machine (YNNPACK's
dots use both cores; the reduce fusion's threading is unknown) is not measured: the next step
if anyone wires it (a `CANDIDATES` entry and a float32 `FORMULATIONS` row for 2-16 tokens).
"""

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
import functional_gen as fg
from functional_gen.models import quantization as q

HIDDEN, INTER, QKV, VOCAB = 576, 1536, 960, 49152


def _fm(w, x):  # feature-major: x [in, M] -> [out, M]
    return q.matmul(w, None, x)


def _fm_reduce(w, x):
    return (w[:, :, None] * x[None]).sum(1)


def _fm_highest(w, x):
    return lax.dot_general(
        w,
        x,
        (((1,), (0,)), ((), ())),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )


def _fm_split(w, x):
    return jnp.concatenate([w @ x[:, i : i + 1] for i in range(x.shape[1])], axis=1)


def _fm_blocks(w, x):  # only the head has more than one block of `q.ROW_BLOCK` rows
    return q.matmul_row_blocks(w, None, x)


def _t_dot(wt, x):  # the weight stored transposed, [in, out]: contract its leading axis
    return lax.dot_general(wt, x, (((0,), (0,)), ((), ())))


def _t_reduce(wt, x):  # y[out, M] = sum_in wt[in, out] * x[in, M]: a column reduction
    return (wt[:, :, None] * x[:, None, :]).sum(0)


def _tm(w, x):  # token-major: x [M, in] -> [M, out]
    return x @ w.T


def _tm_reduce(w, x):
    return (x[:, None, :] * w[None]).sum(-1)


SLOW_AT_ONE = ("sum(W*x)", "sum(x*W)")
"""Variants not timed at M = 1 unless `--slow`: XLA runs their one-row reduce ~55x slower than
`W@x` (1,016 ms against 17.9 ms a chain, 2026-11-26)."""

_YNN = "xla_cpu_experimental_ynn_fusion_type"
VARIANTS = {  # name: (dot, token-major?, compiler options); names with "Wt" store W as [in, out]
    "W@x": (_fm, False, {}),
    "x@W.T": (_tm, True, {}),
    "sum(W*x)": (_fm_reduce, False, {}),
    "sum(x*W)": (_tm_reduce, True, {}),
    "dot HIGHEST": (_fm_highest, False, {}),
    "M x (W@x_i)": (_fm_split, False, {}),
    "W@x row blocks": (_fm_blocks, False, {}),
    "Wt[in,out].x": (_t_dot, False, {}),
    "sum_in(Wt*x)": (_t_reduce, False, {}),
    "W@x ynn off": (_fm, False, {_YNN: ""}),
    "W@x ynn indiv": (_fm, False, {_YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}),
    "W@x ynn all": (
        _fm,
        False,
        {_YNN: "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE,LIBRARY_FUSION_TYPE_REDUCE"},
    ),
}


def chain(dot, token_major, weights, head, h):
    """The dependent chain of the model's dots; `h` is `[hidden, M]` (or `[M, hidden]`)."""
    axis = 1 if token_major else 0  # the feature axis
    for qkv, o, gate_up, down in weights:
        a = lax.slice_in_dim(dot(qkv, h), 0, HIDDEN, axis=axis)  # stand-in for attention
        h = h + dot(o, a)
        gu = dot(gate_up, h * lax.rsqrt(jnp.mean(h * h, axis=axis, keepdims=True) + 1e-6))
        g, u = jnp.split(gu, 2, axis=axis)
        h = h + dot(down, jax.nn.silu(g) * u)
    logits = dot(head, h)
    return logits if not token_major else logits.T


REDUCE = "sum(W*x)"
"""The multiply-reduce formulation `--in-model` tries for float32 dots of 2 to 16 tokens."""


def in_model(rounds: int) -> None:
    """`--in-model`: bare calls of the default model (SmolLM2-135M, float32) over 1, 4 and 8
    positions at batch 1 and one position at batch 8, on a cache holding 200 tokens, each compiled
    twice, under `quantization.FORMULATIONS` as it is (`today`) and with float32 dots of 2 to 16
    tokens run as `sum(W*x)` (`reduce`, registered in `quantization.CANDIDATES` for this run
    only); the programs taking turns call by call; best and median ms."""
    q.CANDIDATES[REDUCE] = ("float32", lambda w, s, x: _fm_reduce(w, x))
    today = dict(q.FORMULATIONS)
    tables = {
        "today": today,
        "reduce": dict(
            today, float32=((1, q._ANY, "W @ x"), (16, q._ANY, REDUCE), (q._ANY, q._ANY, "W @ x"))
        ),
    }
    model, _ = fg.load_model()
    params, static = eqx.partition(model, eqx.is_array)

    def call(params, ids, pos, cache):
        return eqx.combine(params, static)(ids, pos, cache)

    cases, text, programs = [(1, 1), (1, 4), (1, 8), (8, 1)], 200, {}
    for batch, width in cases:
        cache = model.init_cache(batch, 300)
        ids = jnp.ones((batch, text), jnp.int32)
        _, cache = jax.jit(call)(params, ids, jnp.broadcast_to(jnp.arange(text), ids.shape), cache)
        ids = jnp.ones((batch, width), jnp.int32)
        pos = jnp.broadcast_to(text + jnp.arange(width), ids.shape)
        for name, table in tables.items():
            q.FORMULATIONS.update(table)  # read at trace time
            # a fresh function: jax caches a function's trace, which would keep the first table
            compiled = jax.jit(lambda *a: call(*a)).lower(params, ids, pos, cache).compile()
            programs[name, batch, width] = functools.partial(compiled, params, ids, pos, cache)
        q.FORMULATIONS.update(today)
        a, b = (np.asarray(programs[n, batch, width]()[0]) for n in tables)
        print(f"batch {batch} width {width}: logits max abs diff {np.abs(a - b).max():.1e}")
    times = {key: [] for key in programs}
    keys = list(programs)
    for r in range(rounds):
        for key in keys if r % 2 == 0 else keys[::-1]:
            t = time.perf_counter()
            jax.block_until_ready(programs[key]())
            times[key].append(time.perf_counter() - t)
    print("| batch | width | today best / median ms | reduce best / median ms | reduce / today |")
    print("|---|---|---|---|---|")
    for batch, width in cases:
        a, b = times["today", batch, width], times["reduce", batch, width]
        ma, mb = statistics.median(a), statistics.median(b)
        print(
            f"| {batch} | {width} | {min(a) * 1e3:.1f} / {ma * 1e3:.1f} | "
            f"{min(b) * 1e3:.1f} / {mb * 1e3:.1f} | {min(b) / min(a):.2f} best, "
            f"{mb / ma:.2f} median |",
            flush=True,
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument(
        "--in-model",
        action="store_true",
        help="A/B the model's own calls: today's dots against sum(W*x) for 2-16 tokens",
    )
    parser.add_argument(
        "--slow", action="store_true", help="time the multiply-reduce forms at M = 1 too"
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    if args.in_model:
        in_model(args.rounds)
        return 0

    rng = np.random.default_rng(0)

    def w(out, inp):
        return jnp.asarray(rng.standard_normal((out, inp), np.float32) * 0.02)

    weights = [
        (w(QKV, HIDDEN), w(HIDDEN, HIDDEN), w(2 * INTER, HIDDEN), w(HIDDEN, INTER))
        for _ in range(args.layers)
    ]
    head = w(VOCAB, HIDDEN)
    if any("Wt" in name for name in args.variants):  # transposed copies (twice the memory)
        weights_t = [tuple(a.T.copy() for a in layer) for layer in weights]
        head_t = head.T.copy()
    print(
        f"jax {jax.__version__}; {args.layers} layers + head, float32; best of {args.rounds} "
        "interleaved rounds",
        flush=True,
    )
    programs, inputs, reference = {}, {}, {}
    for rows in args.rows:
        x = jnp.asarray(rng.standard_normal((HIDDEN, rows), np.float32))
        for name in args.variants:
            if rows == 1 and name in SLOW_AT_ONE and not args.slow:
                continue
            dot, tm, options = VARIANTS[name]
            xin = x.T if tm else x
            ws, hd = (weights_t, head_t) if "Wt" in name else (weights, head)

            def fn(weights, head, h, dot=dot, tm=tm):
                return chain(dot, tm, weights, head, h)

            t = time.perf_counter()
            compiled = jax.jit(fn).lower(ws, hd, xin).compile(compiler_options=options)
            compile_s = time.perf_counter() - t
            out = np.asarray(compiled(ws, hd, xin))
            reference.setdefault(rows, out)
            diff = np.abs(out - reference[rows]).max() / np.abs(reference[rows]).max()
            print(
                f"compiled {name} M={rows} in {compile_s:.1f} s; max rel diff {diff:.1e}",
                flush=True,
            )
            programs[name, rows] = functools.partial(compiled, ws, hd)
            inputs[name, rows] = xin
    best = dict.fromkeys(programs, float("inf"))
    keys = list(programs)
    for r in range(args.rounds):
        for key in keys if r % 2 == 0 else keys[::-1]:
            t = time.perf_counter()
            jax.block_until_ready(programs[key](inputs[key]))
            best[key] = min(best[key], time.perf_counter() - t)
    base = best.get((args.variants[0], args.rows[0]))
    print(
        f"\n| variant | {' | '.join(f'M={m} ms' for m in args.rows)} | "
        f"{' | '.join(f'M={m}/M={args.rows[0]}' for m in args.rows[1:])} | "
        f"{' | '.join(f'M={m}/today' for m in args.rows)} |"
    )
    print("|---" * (1 + 3 * len(args.rows) - 1) + "|")
    nan = float("nan")
    for name in args.variants:
        ms = [best.get((name, m), nan) * 1e3 for m in args.rows]
        own = [
            best.get((name, m), nan) / best.get((name, args.rows[0]), nan) for m in args.rows[1:]
        ]
        today = [best.get((name, m), nan) / base for m in args.rows]
        print(
            f"| {name} | {' | '.join(f'{t:.2f}' for t in ms)} | "
            f"{' | '.join(f'{r:.2f}' for r in own)} | {' | '.join(f'{r:.2f}' for r in today)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
