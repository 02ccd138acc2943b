"""XLA CPU compiler options, per program, against the default: a decode step at each batch, a
prefill, and their compile times, in ONE process with the variants alternating.

    .venv/bin/python benchmarks/bench_compiler_options.py [--model gemma-3-270m]
        [--quantization int8] [--batches 1 8] [--prefill 512] [--rounds 15]
        [--variants default noynn ynn_all ynn_individual xnnpack split8 O1 O2 no_expensive]

Each variant is one `compiler_options` dict given to `jax.jit(...).lower(...).compile()` (the
per-program form of `XLA_FLAGS`; jaxlib 0.10.2 accepts every option below per program). For
each batch: the decode step (one token per row against a 160-slot cache, `logits_to_keep=1`,
the cache donated) is compiled `--compile-reps` times per variant (fresh lowering each time,
best kept); its logits are compared with the default's (max abs difference, same argmax); the
compiled HLO is compared with the default's and its custom fusions counted (`__ynn_fusion`:
YNNPACK, `__onednn_fusion`: oneDNN); then `--rounds` rounds of `--steps` steps, the variants
alternating (order reversed every other round): best and median ms per step, and each as a
ratio to the first variant. `--prefill N` does the same for one prefill of N tokens.

Options and the values that exist (the help text of `xla/debug_options_flags.cc`; the enum
names are `LIBRARY_FUSION_TYPE_{DOT,ELTWISE,REDUCE,INDIVIDUAL_DOT,INDIVIDUAL_CONVOLUTION}`,
only in that spelling, comma-separated; `dot` or `DOT` are refused):

- `xla_cpu_experimental_ynn_fusion_type`: YNNPACK (XNNPACK's successor). ON by default in
  jaxlib 0.10.2: every dot of a decode step is already a `__ynn_fusion`. `""` turns it off.
- `xla_cpu_use_xnnpack`, `xla_cpu_experimental_xnn_fusion_type`,
  `xla_cpu_experimental_xnn_graph_fusion_mode`: the same HLO as the default (YNNPACK claims the
  dots first); with YNNPACK off, still no XNNPACK fusion appears.
- `xla_cpu_use_onednn` + `xla_cpu_experimental_onednn_fusion_type=LIBRARY_FUSION_TYPE_DOT`
  (YNNPACK off): `__onednn_fusion`s on a lone dot, but a whole SmolLM2 generate ABORTS the
  process ("partition compile failed", a fatal error in oneDNN's graph compiler): unusable.
- `xla_cpu_parallel_codegen_split_count`, `xla_backend_optimization_level`,
  `xla_llvm_disable_expensive_passes`: the same HLO; they change LLVM code generation only.

Results (2026-11-26, 15:33-15:55 UTC, this 2-core machine under a load of 7-10 from other
work, so single figures are noisy; best-of ratios to the default, 11-25 rounds of 4 steps):

| model, weights | variant | decode B1 | decode B8 | prefill 512 |
|---|---|---|---|---|
| SmolLM2 f32 | YNNPACK off | 0.98x | 0.77x | 0.77x |
| SmolLM2 f32 | YNNPACK dot+eltwise+reduce | 1.00x | 0.95x | 1.00x |
| SmolLM2 f32 | YNNPACK individual dots | 0.90x | 0.97x | 1.04x |
| SmolLM2 f32 | xnnpack + graph fusion (HLO = default) | 0.91x | 0.97x | 1.13x |
| SmolLM2 f32 | optimization level 0 | 0.64x | 0.81x | 0.66x |
| SmolLM2 f32 | level 1 / level 2 / no expensive passes | 0.98 / 1.01 / 0.94x | 0.87 / 0.85 / 0.99x | 1.02 / 0.98 / 0.98x |
| Gemma 3 f32 | YNNPACK off | 0.84x | 0.95x | 0.89x |
| Gemma 3 f32 | YNNPACK individual dots | 0.78x | 0.87x (25 rounds) | 0.90x |
| Gemma 3 f32 | no expensive passes / level 2 | 0.87 / 0.85x | 0.88 / 0.86x (25 rounds) | 0.90 / 0.84x |
| SmolLM2 int8 | YNNPACK off | 1.09x | 0.63x | |
| SmolLM2 int8 | YNNPACK dot+eltwise+reduce | 0.02x (585 ms a step) | 0.56x | |
| SmolLM2 int8 | YNNPACK individual dots | 0.96x | 0.93x | |
| Gemma 3 int8 | YNNPACK off | 1.00x (median, 25 rounds) | 0.61x | |
| Gemma 3 int8 | YNNPACK dot+eltwise+reduce | 0.01x (2.3 s a step) | 0.37x | |
| Gemma 3 int8 | YNNPACK individual dots | 1.00x (median; HLO = default) | 0.98x | |

How noisy "best" is under that load: Gemma 3 int8 at batch 1, YNNPACK individual dots compiles
to the default's very HLO at batch 1, yet its best step came out 2.28x the default's (medians
1.000x); trust a ratio only where it is large and has the same sign in best and median.

No option beats the default anywhere; the default is YNNPACK for the dots already, and every
alternative is slower or the same program. Compile times (best of 3 fresh compiles): the decode
step of Gemma 3 at batch 8 3.2-3.8 s for every variant (default 3.56 s); only optimization
level 0 cuts compile time markedly (SmolLM2 decode B1 5.9 -> 3.4 s, prefill 6.9 -> 4.1 s) and
it makes decode 0.64x and prefill 0.66x: no option halves compile time with decode within 3 %.
So functional_gen passes no compiler options (there is no `compiler_options` module to set).
"""

import argparse
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

_T = "LIBRARY_FUSION_TYPE_"
VARIANTS = {
    "default": {},
    "noynn": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "ynn_all": {"xla_cpu_experimental_ynn_fusion_type": f"{_T}DOT,{_T}ELTWISE,{_T}REDUCE"},
    "ynn_individual": {"xla_cpu_experimental_ynn_fusion_type": f"{_T}INDIVIDUAL_DOT"},
    "xnnpack": {
        "xla_cpu_use_xnnpack": True,
        "xla_cpu_experimental_xnn_graph_fusion_mode": "XNN_GRAPH_FUSION_MODE_GREEDY",
    },
    "onednn": {  # aborts the process on a whole model: run it alone, last
        "xla_cpu_experimental_ynn_fusion_type": "",
        "xla_cpu_use_onednn": True,
        "xla_cpu_experimental_onednn_fusion_type": f"{_T}DOT",
    },
    "split8": {"xla_cpu_parallel_codegen_split_count": 8},
    "O0": {"xla_backend_optimization_level": 0},
    "O1": {"xla_backend_optimization_level": 1},
    "O2": {"xla_backend_optimization_level": 2},
    "no_expensive": {"xla_llvm_disable_expensive_passes": True},
}
CACHE_SLOTS = 160


def fusions(hlo: str) -> dict[str, int]:
    """How many custom fusions of each kind (`__ynn_fusion`, ...) a compiled HLO text holds."""
    count: dict[str, int] = {}
    for part in hlo.split('"kind":"')[1:]:
        kind = part.split('"')[0]
        count[kind] = count.get(kind, 0) + 1
    return count


def compile_variants(fn, args, variants, reps, donate=()):
    """`{variant: (compiled, best compile seconds)}`, each compiled `reps` times from a fresh
    lowering, the variants alternating."""
    out = {}
    for rep in range(reps):
        for v in variants if rep % 2 == 0 else variants[::-1]:
            lowered = jax.jit(lambda *a: fn(*a), donate_argnums=donate).lower(*args)
            t = time.perf_counter()
            compiled = lowered.compile(compiler_options=VARIANTS[v])
            seconds = time.perf_counter() - t
            out[v] = (compiled, min(seconds, out.get(v, (None, float("inf")))[1]))
    return out


def report(label, times, variants):
    best0, med0 = min(times[variants[0]]), statistics.median(times[variants[0]])
    for v in variants:
        best, med = min(times[v]), statistics.median(times[v])
        print(
            f"{label} {v:15s} best {best * 1e3:8.2f} ms ({best0 / best:5.3f}x)  "
            f"median {med * 1e3:8.2f} ms ({med0 / med:5.3f}x)",
            flush=True,
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--variants", nargs="*", default=["default", "noynn", "ynn_individual"])
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    parser.add_argument("--prefill", type=int, default=0, help="prompt length (0: none)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--compile-reps", type=int, default=3)
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    variants = args.variants
    kwargs = {"quantization": args.quantization} if args.quantization else {}
    model, _ = fg.load_model(args.model, **kwargs)
    params, static = eqx.partition(model, eqx.is_array)

    def decode(p, ids, pos, cache):
        return eqx.combine(p, static)(ids, pos, cache, logits_to_keep=1)

    for batch in args.batches:
        ids = jnp.ones((batch, 1), jnp.int32)
        pos = jnp.full((batch, 1), 100, jnp.int32)
        cache = model.init_cache(batch, CACHE_SLOTS)
        compiled = compile_variants(
            decode, (params, ids, pos, cache), variants, args.compile_reps, 3
        )
        caches = {v: model.init_cache(batch, CACHE_SLOTS) for v in variants}
        ref_logits, ref_hlo = None, compiled[variants[0]][0].as_text()
        for v in variants:
            fn, seconds = compiled[v]
            logits, caches[v] = fn(params, ids, pos, caches[v])
            logits = np.asarray(logits)
            ref_logits = logits if ref_logits is None else ref_logits
            hlo = fn.as_text()
            print(
                f"B{batch} {v:15s} compile {seconds:5.2f} s  logits max diff "
                f"{np.abs(logits - ref_logits).max():.2e}  same argmax "
                f"{bool((logits.argmax(-1) == ref_logits.argmax(-1)).all())}  same HLO "
                f"{hlo == ref_hlo}  fusions {fusions(hlo)}",
                flush=True,
            )
        times = {v: [] for v in variants}
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else variants[::-1]:
                fn, c = compiled[v][0], caches[v]
                t = time.perf_counter()
                for _ in range(args.steps):
                    logits, c = fn(params, ids, pos, c)
                logits.block_until_ready()
                times[v].append((time.perf_counter() - t) / args.steps)
                caches[v] = c
        report(f"decode B{batch}", times, variants)
        del caches, compiled
    if args.prefill:
        n = args.prefill
        ids, pos = jnp.ones((1, n), jnp.int32), jnp.arange(n)[None]

        def prefill(p, ids, pos):
            return eqx.combine(p, static).prefill(ids, pos, max_len=n + 1)[0]

        compiled = compile_variants(prefill, (params, ids, pos), variants, args.compile_reps)
        ref = np.asarray(compiled[variants[0]][0](params, ids, pos))
        for v in variants:
            diff = np.abs(np.asarray(compiled[v][0](params, ids, pos)) - ref).max()
            print(
                f"prefill {n} {v:15s} compile {compiled[v][1]:5.2f} s  logits max diff {diff:.2e}"
            )
        times = {v: [] for v in variants}
        for r in range(max(3, args.rounds // 3)):
            for v in variants if r % 2 == 0 else variants[::-1]:
                t = time.perf_counter()
                compiled[v][0](params, ids, pos).block_until_ready()
                times[v].append(time.perf_counter() - t)
        report(f"prefill {n}", times, variants)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
