"""Prefill of a sliding-window model with and without the windowed key band of its local layers
(`functional_gen.models.attention.window_band`), in one process, runs interleaved.

    python benchmarks/bench_window_prefill.py [--model gemma-3-270m] [--lengths 512 4096 8192]
        [--repeats 3]

For each prompt length, both programs are lowered and compiled (compile seconds printed), then
run `--repeats` times alternately (banded, causal, banded, ...): the table gives the median run
of each and their ratio. "causal" is `PREFILL_WINDOW_BLOCK = None`: every query block of a local
layer reads every earlier key of the call, as the global layers' blocks do (the path before the
band). The prompt is random token ids (prefill's cost does not depend on them), batch 1, the
next-token logits only (as `bench_generate.py --prefill` measures).
"""

import argparse
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import functional_gen as fg
from functional_gen.models import attention


def compiled_prefill(model, seq: int, block: int | None):
    """The prefill of `seq` tokens compiled with `PREFILL_WINDOW_BLOCK = block`, and its compile
    seconds (tracing and XLA)."""
    params, static = eqx.partition(model, eqx.is_array)

    def prefill(params, token_ids, positions):
        return eqx.combine(params, static).prefill(token_ids, positions, max_len=seq + 1)[0]

    ids = jax.ShapeDtypeStruct((1, seq), jnp.int32)
    saved = attention.PREFILL_WINDOW_BLOCK
    attention.PREFILL_WINDOW_BLOCK = block
    try:
        t = time.perf_counter()
        program = jax.jit(prefill).lower(params, ids, ids).compile()
        return program, params, time.perf_counter() - t
    finally:
        attention.PREFILL_WINDOW_BLOCK = saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    model, _ = fg.load_model(args.model)
    modes = {"banded": attention.PREFILL_WINDOW_BLOCK, "causal": None}
    print(f"{args.model}, window {max(w or 0 for w in model.config.sliding_window)}")
    print("| tokens | program | compile s | prefill s (median) | runs | banded / causal |")
    print("|---|---|---|---|---|---|")
    for seq in args.lengths:
        rng = np.random.default_rng(seq)
        token_ids = jnp.asarray(rng.integers(1000, 200_000, (1, seq)), jnp.int32)
        positions = jnp.arange(seq, dtype=jnp.int32)[None]
        programs = {name: compiled_prefill(model, seq, b) for name, b in modes.items()}
        runs = {name: [] for name in modes}
        outputs = {}
        for name, (program, params, _) in programs.items():  # warm-up, and the logits compared
            outputs[name] = np.asarray(program(params, token_ids, positions))
        for _ in range(args.repeats):
            for name, (program, params, _) in programs.items():
                t = time.perf_counter()
                jax.block_until_ready(program(params, token_ids, positions))
                runs[name].append(time.perf_counter() - t)
        median = {name: statistics.median(r) for name, r in runs.items()}
        for name, (_, _, compile_s) in programs.items():
            ratio = f"{median['banded'] / median['causal']:.2f}" if name == "banded" else ""
            samples = ", ".join(f"{r:.2f}" for r in runs[name])
            print(
                f"| {seq} | {name} | {compile_s:.1f} | {median[name]:.3f} | {samples} | {ratio} |"
            )
        diff = np.max(np.abs(outputs["banded"] - outputs["causal"]))
        print(f"|   | max abs logit difference | {diff:.2e} | | | |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
