"""What a decode step costs at 1, 2, 4 and 8 rows: the measurement behind the serving engine's
`decode_widths` (`functional_gen.serving.engine.default_decode_widths`).

    .venv/bin/python benchmarks/bench_decode_widths.py [--quantization int8] [--widths 1 2 4 8]
        [--written 200] [--max-len 512] [--rounds 6]

The bare model's jitted loop of 8 greedy decode steps (`bench_decode_attention.program`: the
model and an argmax in a `while_loop`, the cache donated) over a cache of `--max-len` slots with
`--written` of them filled, one compiled program per row count, the row counts alternated for
`--rounds` rounds in one process; ms per step = the fastest round / 8. Beside each: the step's
cost over the narrowest's and the tokens/s gained by the extra rows, and the bandwidth bound of
one step (weight bytes / the measured read bandwidth; a step of any row count reads the weights
once). Default model: SmolLM2-135M-Instruct (float32, or `--quantization int8`).
"""

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_decode_attention as attention_bench
from bench_generate import measure_bandwidth

import functional_gen as fg


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quantization", choices=("int8",), default=None)
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--written", type=int, default=200)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    if not 0 < args.written < args.max_len - 8:
        parser.error(f"--written {args.written}: between 1 and --max-len - 9")
    model, _ = fg.load_model(quantization=args.quantization)
    steps = 8
    programs = {}
    for width in args.widths:
        cache = attention_bench.filled_cache(
            model, width, args.max_len, args.written, jax.random.key(0)
        )
        token = jnp.zeros((width, 1), jnp.int32)
        compiled = attention_bench.program(model, cache, token, steps, args.written)
        programs[width] = (compiled, cache, token)
    best = {}
    for _ in range(args.rounds):
        for width, (compiled, cache, token) in programs.items():
            fresh = jax.tree.map(lambda x: x.copy(), cache)  # the program donates its cache
            start = time.perf_counter()
            jax.block_until_ready(compiled(model, fresh, token.copy()))
            took = (time.perf_counter() - start) / steps
            best[width] = min(best.get(width, float("inf")), took)
    weight_bytes = sum(
        x.nbytes for x in jax.tree.leaves(model) if isinstance(x, jax.Array) and x.ndim >= 2
    )
    bandwidth = measure_bandwidth()
    bound = 1e3 * weight_bytes / (bandwidth * 1e9)
    name = args.quantization or "float32"
    print(
        f"\nSmolLM2-135M-Instruct {name}, {args.written} of {args.max_len} cache slots written; "
        f"memory bandwidth {bandwidth:.1f} GB/s, weights {weight_bytes / 1e6:.0f} MB: "
        f"bandwidth bound {bound:.1f} ms per step\n"
    )
    narrowest = min(best)
    base = best[narrowest]
    print(f"| rows | ms per step | x the {narrowest}-row step | tokens/s | x its tokens/s |")
    print("|---|---|---|---|---|")
    for width, took in best.items():
        gain = (width / took) / (narrowest / base)
        print(
            f"| {width} | {1e3 * took:.1f} | {took / base:.2f} | {width / took:.0f} | {gain:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
