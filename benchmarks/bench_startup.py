"""Start-up time of the command line: a first call (empty compilation cache) against a repeated
call that finds its compiled programs in JAX's persistent compilation cache.

Run: `python benchmarks/bench_startup.py [--repeats 2] [--new-tokens 8]
[--models smollm2-135m-instruct gemma-3-270m] [--baseline PATH] [--skip-cli] [--breakdown]`

Each call is a fresh process, `functional-gen generate PROMPT -n N --verbose`, on the default
model, as a user types it. The cache directory is a temporary copy that holds only the converted
default model (so conversion is not timed); the first call starts with no compiled programs, the
repeated ones find them there. The table gives the wall time of the process and the compile
time the CLI reports (tracing + lowering + XLA compilation, or loading from the cache); the
ratios compare each repeated call with the first, measured in this run. On a shared machine the
absolute figures move between runs; the ratios are what to compare.

A second table gives, per named model (`--models`; default SmolLM2-135M and Gemma 3 270M), the
compile time of the first `fg.generate` call in a fresh Python process (the first call's wall
time minus the best of two repeated calls; no persistent compilation cache) and the decode
tokens/s at batch 1 (`128 / (T_129 - T_1)`, greedy, EOS disabled). With `--baseline PATH` (a
checkout of another commit, e.g. `git worktree add ../base main`) the same figures are measured
from that checkout's `functional_gen` in the same run, the two alternating, and the ratios
printed: this is how a change to compile time is reported.

With `--breakdown`, a third table says where that compile time goes, per model (and per
checkout with `--baseline`), each part compiled in a fresh process after `jax.clear_caches()`
from the arguments of the first generate's program (`run_generation`, captured): tracing and
lowering against XLA's compilation, wall and CPU seconds (CPU seconds of this process move less
than wall seconds when other jobs share the machine), for the whole program (prefill + the
`while_loop` of decode steps), the prefill and initialisation alone (`program.start`), and the
whole program of the model cut to its first layer (`first_layers(1)`): the difference, divided
by the other layers, is the compile cost of one layer (its prefill and decode copies). Its
first row lists every program the first generate compiled (`jax_log_compiles`) with XLA's wall
seconds; its last columns split each part's XLA compilation with XLA's own timers (VLOG 1 of
`hlo_pass_pipeline`, `ir_compiler` and `cpu_compiler`): the HLO passes (wall seconds, one thread) against the
LLVM modules (wall seconds summed over the codegen threads, their number, and the seconds of
the modules that hold a dot: a batch-1 decode step's matrix-vector products are emitted as
LLVM loops, one module per dot and layer).
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's functional_gen

from functional_gen.loading.default_model import (  # noqa: E402 (after the sys.path line)
    converted_default_dir,
    ensure_default_checkpoint,
)

PROMPT = "What is the capital of France?"


def run_cli(cache: Path, new_tokens: int) -> tuple[float, float]:
    """`(wall seconds, reported compile seconds)` of one CLI process."""
    env = {**os.environ, "FUNCTIONAL_GEN_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "functional_gen.cli",
            "generate",
            PROMPT,
            "-n",
            str(new_tokens),
            "--verbose",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    compile_ms = float(re.search(r"compile time =\s+([0-9.]+) ms", proc.stderr).group(1))
    return wall, compile_ms / 1e3


PROBE = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import jax
import functional_gen as fg
model, tokenizer = fg.load_model(sys.argv[2])
def call(n):
    start = time.perf_counter()
    result = fg.generate(model, tokenizer, sys.argv[3], max_new_tokens=n,
                         sampler=fg.samplers.Greedy(), eos_token_id=[])
    jax.block_until_ready(result.token_ids)
    return time.perf_counter() - start
first = call(8)
again = min(call(8) for _ in range(2))
call(129)
t1 = min(call(1) for _ in range(3))
tn = min(call(129) for _ in range(3))
print(first - again, 128 / (tn - t1))
"""


def probe(checkout: Path, model: str) -> tuple[float, float]:
    """`(compile seconds of the first generate, decode tokens/s at batch 1)` of `model` with the
    `functional_gen` of `checkout`, in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["PYTHONPATH"] = str(checkout)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(checkout), model, PROMPT],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    compile_s, tokens_per_s = proc.stdout.split()[-2:]
    return float(compile_s), float(tokens_per_s)


BREAKDOWN = r"""
import logging, os, re, sys, time
sys.path.insert(0, sys.argv[1])
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import equinox as eqx
import jax
import functional_gen as fg
from functional_gen.generation import program
model, tokenizer = fg.load_model(sys.argv[2])
programs = []
class Programs(logging.Handler):
    def emit(self, record):
        found = re.search(r"Finished XLA compilation of (\S+) in ([0-9.e-]+) sec", record.getMessage())
        if found:
            programs.append((found.group(1), float(found.group(2))))
jax.config.update("jax_log_compiles", True)
logging.getLogger("jax").addHandler(Programs())
captured = []
run_generation = program.run_generation
def spy(*args, **kwargs):
    captured.append((args, kwargs))
    return run_generation(*args, **kwargs)
program.run_generation = spy
fg.generate(model, tokenizer, sys.argv[3], max_new_tokens=8, sampler=fg.samplers.Greedy(),
            eos_token_id=[])
program.run_generation = run_generation
jax.config.update("jax_log_compiles", False)
print("programs", len(programs), sum(s for _, s in programs),
      ";".join(f"{n}:{s:.3f}" for n, s in programs))
args, kwargs = captured[0]
step = args[0]
one_layer = (eqx.tree_at(lambda s: s.model, step, step.model.first_layers(1)), *args[1:])
parts = [("whole", program._generate_jit, args), ("prefill", program.start, args),
         ("whole_1_layer", program._generate_jit, one_layer)]
for name, fn, fn_args in parts:
    jax.clear_caches()
    jitted = eqx.filter_jit(fn)
    w0, c0 = time.perf_counter(), time.process_time()
    lowered = jitted.lower(*fn_args, **kwargs)
    w1, c1 = time.perf_counter(), time.process_time()
    lowered.compile()
    w2, c2 = time.perf_counter(), time.process_time()
    print(name, w1 - w0, c1 - c0, w2 - w1, c2 - c1, step.model.config.num_hidden_layers)
"""

# XLA's own timers (VLOG 1 of these files): every HLO pass, every LLVM module, every compilation
XLA_TIMERS = {
    "TF_CPP_MIN_LOG_LEVEL": "0",
    "TF_CPP_VMODULE": "hlo_pass_pipeline=1,ir_compiler=1,cpu_compiler=1",
}


def xla_phases(stderr: str) -> list[tuple[float, float, int, float]]:
    """Per XLA compilation logged in `stderr` (VLOG of `XLA_TIMERS`), in order: `(HLO pass wall
    s, LLVM module wall s summed over the codegen threads, LLVM modules, of which in modules of
    a dot s)`. Units in the log are us, ms or s."""
    unit = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    out, passes, llvm, modules, dots = [], 0.0, 0.0, 0, 0.0
    for line in stderr.splitlines():
        found = re.search(r"HLO pass: \S+ time: ([0-9.]+) (us|ms|s) ", line)
        if found:
            passes += float(found.group(1)) * unit[found.group(2)]
        found = re.search(r"Compiled LLVM module: (\S+) time: ([0-9.]+) (us|ms|s) ", line)
        if found:
            seconds = float(found.group(2)) * unit[found.group(3)]
            llvm += seconds
            modules += 1
            dots += seconds if re.search(r"_dot\.?\d*_", found.group(1)) else 0.0
        if "Compiling [" in line and " for CPU" in line:
            out.append((passes, llvm, modules, dots))
            passes, llvm, modules, dots = 0.0, 0.0, 0, 0.0
    return out


def breakdown(checkout: Path, model: str) -> dict[str, tuple[float, ...]]:
    """Where the first generate's compile time goes, with the `functional_gen` of `checkout`
    in a fresh process: part -> `(trace+lower wall s, its CPU s, XLA compile wall s, its CPU s,
    layers, HLO pass wall s, LLVM module wall s summed over threads, LLVM modules, LLVM s in dot
    modules)` for the parts `"whole"`, `"prefill"` and `"whole_1_layer"` (see the module
    docstring); `"programs"`: `(number of programs the first generate compiled, their XLA
    compile wall s)`, and `"names"` the programs as `name:seconds;...`."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(XLA_TIMERS, PYTHONPATH=str(checkout))
    proc = subprocess.run(
        [sys.executable, "-c", BREAKDOWN, str(checkout), model, PROMPT],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    out = {}
    for line in proc.stdout.splitlines():
        name, *values = line.split()
        if name in ("whole", "prefill", "whole_1_layer"):
            out[name] = tuple(float(v) for v in values)
        elif name == "programs":
            out["programs"] = (float(values[0]), float(values[1]))
            out["names"] = values[2] if len(values) > 2 else ""
    # the three parts are the last three compilations of the process
    for name, phases in zip(("whole", "prefill", "whole_1_layer"), xla_phases(proc.stderr)[-3:]):
        out[name] = out[name] + phases
    return out


def breakdown_table(models: list[str], baseline: Path | None) -> None:
    """Print `breakdown` of each model (and of the baseline checkout)."""
    print(
        "\n| model | checkout | part | trace+lower wall (s) | trace+lower CPU (s) "
        "| XLA compile wall (s) | XLA compile CPU (s) | of which HLO passes wall (s) "
        "| LLVM modules: wall (s) summed over threads, count, in dot modules (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    checkouts = [("this", ROOT)] + ([("baseline", baseline)] if baseline else [])
    for model in models:
        for label, checkout in checkouts:
            parts = breakdown(checkout, model)
            whole, prefill, one = parts["whole"], parts["prefill"], parts["whole_1_layer"]
            count, seconds = parts["programs"]
            print(
                f"| {model} | {label} | first generate compiled {count:.0f} programs in "
                f"{seconds:.2f} s: {parts['names']} | | | | | | |"
            )
            layers = int(whole[4])
            rows = [
                ("whole program", whole),
                ("prefill + init only", prefill),
                ("decode loop (whole - prefill)", [w - p for w, p in zip(whole, prefill)]),
                ("model cut to 1 layer", one),
                ("per further layer", [(w - o) / (layers - 1) for w, o in zip(whole, one)]),
            ]
            for part, v in rows:
                xla = f"{v[5]:.2f} | {v[6]:.2f}, {v[7]:.0f}, {v[8]:.2f}" if len(v) == 9 else "- | -"
                print(
                    f"| {model} | {label} | {part} | {v[0]:.2f} | {v[1]:.2f} | {v[2]:.2f} "
                    f"| {v[3]:.2f} | {xla} |",
                    flush=True,
                )


def compile_table(models: list[str], baseline: Path | None) -> None:
    """Print the compile time of the first generate and decode tokens/s of each model (and of
    the baseline checkout, alternating, with ratios)."""
    print("\n| model | checkout | compile of first generate (s) | decode tok/s, batch 1 |")
    print("|---|---|---|---|")
    for model in models:
        ours = probe(ROOT, model)
        print(f"| {model} | this | {ours[0]:.2f} | {ours[1]:.1f} |", flush=True)
        if baseline is None:
            continue
        base = probe(baseline, model)
        print(f"| {model} | baseline | {base[0]:.2f} | {base[1]:.1f} |", flush=True)
        print(
            f"| {model} | this / baseline | {ours[0] / base[0]:.2f} | {ours[1] / base[1]:.3f} |",
            flush=True,
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="repeated calls after the first")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--models", nargs="*", default=["smollm2-135m-instruct", "gemma-3-270m"])
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout")
    parser.add_argument("--skip-cli", action="store_true", help="only the per-model table")
    parser.add_argument(
        "--breakdown", action="store_true", help="also where the compile time goes, per part"
    )
    args = parser.parse_args(argv)
    if args.skip_cli:
        compile_table(args.models, args.baseline)
        if args.breakdown:
            breakdown_table(args.models, args.baseline)
        return 0
    source = ensure_default_checkpoint()
    with tempfile.TemporaryDirectory(prefix="fg-startup-") as tmp:
        cache = Path(tmp)
        # the converted default model only: no compiled programs yet
        os.environ["FUNCTIONAL_GEN_CACHE"] = str(cache)
        shutil.copytree(source, converted_default_dir())
        first = run_cli(cache, args.new_tokens)
        repeats = [run_cli(cache, args.new_tokens) for _ in range(args.repeats)]
    wall = statistics.median(r[0] for r in repeats)
    comp = statistics.median(r[1] for r in repeats)
    print(
        f"functional-gen generate {PROMPT!r} -n {args.new_tokens} (default model, CPU, shared machine)\n"
    )
    print("| call | process wall time (s) | compile time (s) |")
    print("|---|---|---|")
    print(f"| first (empty compilation cache) | {first[0]:.1f} | {first[1]:.1f} |")
    print(f"| repeated (median of {args.repeats}) | {wall:.1f} | {comp:.1f} |")
    print(f"| repeated / first | {wall / first[0]:.2f} | {comp / first[1]:.2f} |")
    compile_table(args.models, args.baseline)
    if args.breakdown:
        breakdown_table(args.models, args.baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
