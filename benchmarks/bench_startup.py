"""Start-up time of the command line: a first call (empty compilation cache) against a repeated
call that finds its compiled programs in JAX's persistent compilation cache.

Run: `python benchmarks/bench_startup.py [--repeats 2] [--new-tokens 8]`

Each call is a fresh process, `functional-gen generate PROMPT -n N --verbose`, on the default
model, as a user types it. The cache directory is a temporary copy that holds only the converted
default model (so conversion is not timed); the first call starts with no compiled programs, the
repeated ones find them there. The table gives the wall time of the process and the compile
time the CLI reports (tracing + lowering + XLA compilation, or loading from the cache); the
ratios compare each repeated call with the first, measured in this run. On a shared machine the
absolute figures move between runs; the ratios are what to compare.
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="repeated calls after the first")
    parser.add_argument("--new-tokens", type=int, default=8)
    args = parser.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
