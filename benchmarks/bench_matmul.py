"""Which matmul formulation XLA's CPU backend runs fastest, per weight format and token count.

    .venv/bin/python benchmarks/bench_matmul.py [--tokens 1 8 512] [--repeats 15] [--shapes ...]
        [--formats ...] [--names ...] [--rounds 2]

The model's projections are `y[out, tokens] = W[out, in] @ x[in, tokens]` (feature-major
activations, see `functional_gen/models/llama.py`). XLA picks very different kernels for
mathematically equal formulations (environment notes §6: a bfloat16 dot runs 10-20x slower than
float32 in most layouts, and 2x faster in a few), so `functional_gen/models/quantization.py`
chooses one per weight format and token count from the table this script prints.

Every figure is the time of ONE matmul of a SmolLM2-135M shape (576->576 attention, 576->1536
MLP, 1536->576 down, the tied 49152x576 output head; `--shapes` adds the fused projections and
Gemma 3 270M's), measured as a chain of as many distinct
weights as make 256 MB of float32 (so weights stream from memory as in the model, instead of
sitting in the 32 MB L3), each product's `x` depending on the previous product (as a layer's
input does; independent products let XLA run every int8 dequantization before any dot, and
made one-block int8 products look 10x slower than float32), divided by the chain length: the fastest of up to `--repeats` calls of
one jitted function after a warm-up (interference from other processes only adds time). The machine may be shared: compare rows of one run.
"""

import argparse
import functools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
from functional_gen.models import quantization as q

SHAPES = {  # name: (out, in)
    "attn 576x576": (576, 576),
    "mlp 1536x576": (1536, 576),
    "down 576x1536": (576, 1536),
    "head 49152x576": (49152, 576),
    # the fused projections as the models store them (`Attention.qkv_proj`, `MLP.gate_up_proj`)
    "qkv 960x576": (960, 576),
    "gate_up 3072x576": (3072, 576),
    # Gemma 3 270M (hidden 640, 4 heads of 256 over 1 KV head, MLP 2048, vocabulary 262,144)
    "gemma qkv 1536x640": (1536, 640),
    "gemma o 640x1024": (640, 1024),
    "gemma gate_up 4096x640": (4096, 640),
    "gemma down 640x2048": (640, 2048),
    "gemma head 262144x640": (262144, 640),
}
DEFAULT_SHAPES = ["attn 576x576", "mlp 1536x576", "down 576x1536", "head 49152x576"]


def make_weights(fmt, out, inp, count, key):
    keys = jax.random.split(key, count)
    ws, ss = [], []
    for k in keys:
        w = jax.random.normal(k, (out, inp), jnp.float32) * 0.02
        if fmt == "int8-split":  # the BatchedInt8 copy's layout, `with_batched_int8`'s parts
            parts = 6 if out > 10_000 else q.LAYER_PARTS  # the head's best int8 copy
            blocks, s = q.split_int8(np.asarray(w), parts)
            ws.append(tuple(jnp.asarray(b) for b in blocks))
            ss.append(jnp.asarray(s))
        elif fmt in ("int8", "int8-block"):
            wq, s = q.quantize_int8(w, block=q.BLOCK if fmt == "int8-block" else None)
            ws.append(jnp.asarray(wq))
            ss.append(jnp.asarray(s))
        else:
            ws.append(w.astype(fmt))
            ss.append(None)
    return ws, ss


def time_formulation(fn, ws, ss, x, repeats):
    @jax.jit
    def chain(ws, ss, x):
        total = jnp.zeros((), jnp.float32)
        for w, s in zip(ws, ss):  # distinct weights: each streams from memory
            # each product's `x` depends on the previous product, as a layer's input does in
            # the model: with independent products XLA's thunk executor may run the first
            # half of every product (an int8 weight's dequantization) before any second half,
            # and the whole of each product is summed so that no part of it can be skipped
            total = total + jnp.sum(fn(w, s, x))
            x = x + total * 1e-30
        return total

    chain(ws, ss, x).block_until_ready()
    samples = []
    deadline = time.perf_counter() + 3.0
    for i in range(repeats):
        t = time.perf_counter()
        chain(ws, ss, x).block_until_ready()
        samples.append(time.perf_counter() - t)
        if i >= 2 and time.perf_counter() > deadline:
            break
    return min(samples) / len(ws)  # the machine is shared: interference only adds time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 512])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--formats",
        nargs="+",
        default=["float32", "bfloat16", "int8", "int8-block", "int8-split"],
    )
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, choices=list(SHAPES))
    parser.add_argument(
        "--names", nargs="+", default=None, help="time only these CANDIDATES (default: all)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="time the candidates this many times, interleaved"
    )
    parser.add_argument("--megabytes", type=float, default=256.0, help="float32 MB per chain")
    args = parser.parse_args(argv)

    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}; time per matmul in ms; "
        "(best): fastest of the row, (chosen): what quantization.FORMULATIONS picks"
    )
    for shape_name in args.shapes:
        out, inp = SHAPES[shape_name]
        count = max(1, int(args.megabytes * 1e6 / (out * inp * 4)))
        for fmt in args.formats:
            ws, ss = make_weights(fmt, out, inp, count, jax.random.key(0))
            for tokens in args.tokens:
                if tokens >= 256 and out * inp * count > 30e6:
                    ws_, ss_ = ws[:2], ss[:2]  # compute-bound: no need to stream
                else:
                    ws_, ss_ = ws, ss
                x = jax.random.normal(jax.random.key(1), (inp, tokens), jnp.float32)
                results = {}
                names = [
                    n
                    for n, (f, _) in q.CANDIDATES.items()
                    if f == fmt and (args.names is None or n in args.names)
                ]
                for _ in range(args.rounds):  # interleaved: the load moves between candidates
                    for name in names:
                        fn = functools.partial(q.run_formulation, name)  # as the model runs it
                        t = time_formulation(fn, ws_, ss_, x, args.repeats) * 1e3
                        results[name] = min(t, results.get(name, t))
                if not results:
                    continue
                best = min(results, key=results.get)
                chosen = q.formulation_name(fmt, tokens, out)
                cells = "  ".join(
                    f"{n}{' (best)' if n == best else ''}{' (chosen)' if n == chosen else ''}: "
                    f"{t:.3f}"
                    for n, t in results.items()
                )
                print(f"{shape_name:<15} {fmt:<8} tokens={tokens:<4} {cells}", flush=True)
            del ws, ss
    return 0


if __name__ == "__main__":
    sys.exit(main())
