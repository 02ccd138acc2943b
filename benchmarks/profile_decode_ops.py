"""Where one decode step's time goes, per compiled XLA op (jax.profiler), for any model and batch.

    .venv/bin/python benchmarks/profile_decode_ops.py [--model gemma-3-270m] [--batch 8]
        [--quantization int8] [--dtype float32] [--cache-len 128] [--steps 5] [--top 25]
        [--no-head]

The prompt (32 tokens) is prefilled into a cache of `--cache-len` slots, then one decode step
(`model(token, position, cache)`, jitted, the logits returned; `--no-head`: the decoder stack
only, `model.model`) is run `--steps` times under `jax.profiler.trace`. The trace's op events
are summed per name and divided by the step count: dots (`ynn_fusion*`, XLA's YNNPACK dot
fusions), copies, conditionals and loops (`cond*`, `while*`: attention behind its conditional,
the row-blocked output head), and the other fusions; then the `--top` single ops.

A loop's or conditional's time includes the ops inside it, which are also counted under their
own kinds, so the kinds do not add up to the step. Durations are wall time per op on the thunk executor, which may run independent ops at once:
an op that waits for a core (a shared machine, or ops running concurrently) looks longer. This
is how the int8 decode at batch 8 was found to dequantize every layer's weights before the
first layer (docs/concepts/weights.md, "Row blocks"). The cache is not donated, so the
`copy.*` of every cache buffer (about 1 MB per layer at batch 8) are this script's, not
`generate`'s.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen

import equinox as eqx
import jax
import jax.numpy as jnp

import functional_gen as fg

_RUNTIME = ("ThunkExecutor", "$", "PjitFunction", "CommonPjRt", "ParseArguments", "Slinky")


def category(name: str) -> str:
    """The kind of a traced XLA op, by its name."""
    if name.startswith("ynn"):
        return "dots (ynn fusions)"
    if name.startswith("copy."):
        return "copies"
    if name.startswith(("while", "cond", "conditional")):
        return "loops and conditionals"
    return "other fusions"


def trace_ops(run, steps: int) -> tuple[collections.Counter, collections.Counter]:
    """Trace `run()` (which runs `steps` steps) with `jax.profiler` and return each compiled op's
    time in ms per step and its calls, runtime events left out."""
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            run()
        (path,) = glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True)
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(_RUNTIME):
            total[e["name"]] += e["dur"] / steps / 1e3  # ms per step
            count[e["name"]] += 1
    return total, count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cache-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-head", action="store_true", help="the decoder stack only")
    args = parser.parse_args(argv)
    if args.cache_len <= 32:
        parser.error("--cache-len must exceed the 32-token prompt")

    model, _ = fg.load_model(args.model, dtype=args.dtype, quantization=args.quantization)
    b = args.batch
    ids = jnp.asarray([[2] + list(range(1000, 1031))] * b)
    positions = jnp.broadcast_to(jnp.arange(32), (b, 32))
    prefill = eqx.filter_jit(lambda m, x, p: m.prefill(x, p, max_len=args.cache_len))
    _, cache = prefill(model, ids, positions)
    params, static = eqx.partition(model, eqx.is_array)
    token, position = jnp.full((b, 1), 42), jnp.full((b, 1), 32)

    @jax.jit
    def step(params, cache, token, position):
        m = eqx.combine(params, static)
        if args.no_head:
            return m.model(token, position, cache)
        return m(token, position, cache)

    for _ in range(3):  # compile and warm up
        jax.block_until_ready(step(params, cache, token, position))

    def run():
        for _ in range(args.steps):
            jax.block_until_ready(step(params, cache, token, position))

    total, count = trace_ops(run, args.steps)
    kinds = collections.Counter()
    for name, ms in total.items():
        kinds[category(name)] += ms
    what = "decoder stack" if args.no_head else "model (stack and head)"
    print(
        f"\n{args.model}, {model.weight_format} weights, batch {b}, {args.cache_len}-slot cache: "
        f"one decode step of the {what}, ms per step summed over {args.steps} traced steps"
    )
    for kind, ms in kinds.most_common():
        print(f"  {kind:<26} {ms:9.2f}")
    print(f"\nthe {args.top} longest ops (ms per step, calls per step):")
    for name, ms in total.most_common(args.top):
        print(f"  {ms:9.3f}  {count[name] // args.steps:4d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
