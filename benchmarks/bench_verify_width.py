"""The cost of a model call over `w` positions against a one-position decode call: what a
speculative verification of `w - 1` guesses costs (`functional_gen.generation.speculative`).

    .venv/bin/python benchmarks/bench_verify_width.py [--batches 1 8] [--widths 1 2 4 8 11 16]
        [--precision float32] [--cache 300] [--calls 30]

SmolLM2-135M-Instruct (the default model); a cache of `--cache` slots holding 200 tokens; the
jitted `model(token_ids, positions, cache)`; median of `--calls` calls after one untimed call,
`jax.block_until_ready` on each, the widths taking turns call by call (so that a shared
machine's load moves them alike). Prints ms and the ratio to width 1 (compare ratios: the
shared machine's load moves the absolute numbers).

Measured 2026-11-26, float32, quiet 2-core machine: batch 1, 19.4 ms at width 1, 1.86x at 2
and 4, 3.2x at 6 and 11; batch 8, 78 ms, 2.2x at 2, 3.0x at 4 and 6, 3.75x at 11.
Again 2026-11-26 (later, `--calls 10`, a quieter moment): batch 1, 18.9 ms at width 1, 1.23x at
2, 1.24x at 4, 1.47x at 8, 2.35x at 11, 1.83x at 16 (an odd width costs more than a multiple of
8: `verify_widths` pads to 4, 8, 16, ...); batch 8, 37.0 ms, 1.44x at 2, 2.86x at 4, 4.26x at 8,
6.85x at 11, 7.31x at 16.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen

import equinox as eqx
import jax
import jax.numpy as jnp

import functional_gen as fg


@eqx.filter_jit
def _call(model, token_ids, positions, cache):
    return model(token_ids, positions, cache)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 11, 16])
    parser.add_argument("--precision", choices=["float32", "int8", "bfloat16"], default="float32")
    parser.add_argument("--cache", type=int, default=300)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args(argv)
    load = {"quantization": "int8"} if args.precision == "int8" else {}
    if args.precision == "bfloat16":
        load = {"dtype": "bfloat16"}
    model, _ = fg.load_model(**load)
    text = 200
    print("| precision | batch | width | ms | x width 1 |")
    print("|---|---|---|---|---|")
    for batch in args.batches:
        cache = model.init_cache(batch, args.cache)
        ids = jnp.ones((batch, text), jnp.int32)
        _, cache = _call(model, ids, jnp.broadcast_to(jnp.arange(text), ids.shape), cache)
        calls = {}
        for width in args.widths:
            ids = jnp.ones((batch, width), jnp.int32)
            pos = jnp.broadcast_to(text + jnp.arange(width), ids.shape)
            calls[width] = (ids, pos)
            jax.block_until_ready(_call(model, ids, pos, cache))  # compile
        # the widths take turns, call by call: a shared machine's load moves them alike
        times = {width: [] for width in args.widths}
        for _ in range(args.calls):
            for width, (ids, pos) in calls.items():
                t = time.perf_counter()
                jax.block_until_ready(_call(model, ids, pos, cache))
                times[width].append(time.perf_counter() - t)
        base = statistics.median(times[args.widths[0]])
        for width in args.widths:
            ms = statistics.median(times[width])
            print(
                f"| {args.precision} | {batch} | {width} | {ms * 1e3:.2f} | {ms / base:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
