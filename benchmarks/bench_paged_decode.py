"""Decode throughput of the serving engine's paged KV cache: this checkout against a git
revision (`--rev`, default `main`), interleaved in one run, with the lockstep cache's as a
control (issue 56: the paged dispatch's attention should read only the written columns).

    .venv/bin/python benchmarks/bench_paged_decode.py [--rev main] [--slots 4] [--prompt 40]
        [--block-size 16] [--max-len 2048] [--num-steps 8] [--dispatches 6] [--rounds 4]
        [--no-lockstep] [--quantization int8]

Two worker subprocesses, one per side: this checkout's `functional_gen`, and the package at
`--rev` (`git archive` into a temporary folder, imported through `PYTHONPATH`). Each builds
the same engines (`Engine(max_slots=--slots, max_len=--max-len, num_steps=--num-steps)`, paged
with `block_size=--block-size`, and without it for the lockstep control) on the same model and
prompts, and answers one measurement at a time, so only one side runs at once; the sides
alternate (ABBA) for `--rounds` rounds after one untimed round each (the compiles).

One measurement: a fresh decode state, one greedy request of `--prompt` tokens (English
prose, a different stretch per slot, EOS suppressed with `logit_bias`) prefilled and inserted
into every slot, one untimed dispatch, then `--dispatches` timed dispatches of `--num-steps`
steps, each read back to the host (as the orchestrator reads them): decode tokens/s = tokens
taken / wall seconds of the timed dispatches, and per CPU second of the worker (all its
threads: less moved than the wall time by other jobs on a shared machine). Printed: per side
and engine the median over rounds, and the medians' ratio this checkout / `--rev`, with each
round's ratio (the shared machine's load drifts: compare ratios, not absolute figures). Default model:
SmolLM2-135M-Instruct, float32.

Measured 2026-12-03 on the 2-core CPU while another job ran (load average 2.3-3.8), the
defaults with `--rev d865359 --rounds 8` (the paged dispatch wrote from the table's end there,
its attention reading all 2,056 columns every step; here from the longest slot's length, 64
columns), 7 min:

| engine | per | d865359 | this change | new / old | per round |
|---|---|---|---|---|---|
| paged | wall s | 31.7 | 48.7 | 1.54 | 2.03, 2.14, 1.44, 1.74, 1.21, 0.74, 1.99, 1.26 |
| paged | CPU s | 30.5 | 40.0 | 1.31 | 1.20, 1.35, 1.42, 1.70, 1.49, 1.12, 1.28, 1.37 |
| lockstep | wall s | 62.6 | 62.9 | 1.01 | 1.11, 0.89, 1.01, 1.02, 0.84, 1.00, 0.73, 0.98 |
| lockstep | CPU s | 61.7 | 63.3 | 1.03 | 1.11, 0.96, 1.01, 1.03, 1.08, 1.01, 1.15, 0.97 |

What still separated the paged engine from the lockstep one there was the gather: it copied
every slot's whole table once per dispatch (`serving.paged.gather` alone, jitted, these shapes:
130-150 ms, ~17 ms of every step of an 8-step dispatch).

Measured 2026-12-03 again (load average 5.1-6.4: the test suite ran beside it), the defaults
with `--rev main --rounds 4`, main at 24fd646 (the whole tables gathered) against the gather
buckets (`PagedKV.gather_buckets`: these slots gather 16 of their 128 blocks, 256 columns):

| engine | per | 24fd646 | gather buckets | new / old | per round |
|---|---|---|---|---|---|
| paged | wall s | 30.2 | 60.6 | 2.00 | 1.71, 2.01, 2.02, 1.77 |
| paged | CPU s | 44.2 | 66.3 | 1.50 | 1.43, 1.57, 1.68, 1.44 |
| lockstep | wall s | 60.5 | 56.8 | 0.94 | 0.85, 0.84, 0.78, 1.25 |
| lockstep | CPU s | 74.3 | 64.6 | 0.87 | 0.92, 0.79, 0.95, 0.98 |

The paged engine now decodes as fast as the lockstep one here (60.6 against 56.8 tokens per
wall second in the same run). Its attention reads all 264 gathered columns (under 512 the CPU
plan compiles one attention length), not the 64 of the whole table's shortest branch.
"""

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
TEXT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city of Rome "
    "to the fall of Constantinople. Historians often divide it into periods, and each one has "
    "its own emperors, wars, buildings and writers. "
) * 20


def worker(args) -> int:
    """Answer measurements on stdin (`paged` / `lockstep`, one a line) with JSON lines on
    stdout (`{"tokens": n, "seconds": wall s, "cpu_seconds": the process's CPU s}`)."""
    import jax
    import numpy as np

    import functional_gen as fg

    model, tokenizer = fg.load_model(quantization=args.quantization)
    ids = tokenizer(TEXT)["input_ids"]
    eos = sorted({int(i) for i in model.eos_token_id})
    prompts = [ids[11 * s : 11 * s + args.prompt] for s in range(args.slots)]
    common = dict(max_len=args.max_len, num_steps=args.num_steps)
    engines = {
        "paged": fg.serving.Engine(
            model, tokenizer, args.slots, block_size=args.block_size, **common
        ),
        "lockstep": fg.serving.Engine(model, tokenizer, args.slots, **common),
    }
    new_tokens = args.num_steps * (args.dispatches + 1)

    def measure(engine):
        state = engine.init_decode_state()
        for slot, p in enumerate(prompts):
            request = engine.request(p, new_tokens, logit_bias=[(i, -100.0) for i in eos])
            if engine.paged is None:
                prefix = engine.prefill(request)
            else:
                prefix = engine.prefill(request, engine.admit(request, slot), state)
            state = engine.insert(prefix, state, slot)
        state, out = engine.generate(state)
        jax.device_get(out.token_ids)
        tokens, start, cpu = 0, time.perf_counter(), time.process_time()
        for _ in range(args.dispatches):
            state, out = engine.generate(state)
            tokens += int(np.sum(jax.device_get(out.token_ids) >= 0))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        for slot in range(args.slots):
            engine.release(slot)
        return {"tokens": tokens, "seconds": seconds, "cpu_seconds": cpu}

    print(json.dumps({"ready": fg.__file__}), flush=True)
    for line in sys.stdin:
        print(json.dumps(measure(engines[line.strip()])), flush=True)
    return 0


def baseline_folder(rev: str) -> str:
    """A temporary folder holding `functional_gen` at git revision `rev` of this checkout.

    **Raises:** `subprocess.CalledProcessError` when `rev` is not in this checkout's history."""
    archive = subprocess.run(
        ["git", "archive", rev, "functional_gen"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    folder = tempfile.mkdtemp(prefix="fg-baseline-")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


class Side:
    """A worker subprocess importing `functional_gen` from `path`."""

    def __init__(self, name: str, path: str, argv: list[str]):
        self.name = name
        env = {**os.environ, "PYTHONPATH": path}
        command = [sys.executable, __file__, "--worker", *argv]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.package = self._read()["ready"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited ({self.process.wait()})")
        return json.loads(line)

    def measure(self, engine: str) -> tuple[float, float]:
        """Decode tokens per wall second and per CPU second of one measurement of `engine`
        (`paged` / `lockstep`)."""
        self.process.stdin.write(engine + "\n")
        self.process.stdin.flush()
        result = self._read()
        return result["tokens"] / result["seconds"], result["tokens"] / result["cpu_seconds"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(60)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="main")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--num-steps", type=int, default=8)
    parser.add_argument("--dispatches", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--no-lockstep", action="store_true")
    parser.add_argument("--quantization", choices=("int8",), default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    passed = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--no-lockstep"]
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.rev], cwd=ROOT, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "functional_gen"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    folder = baseline_folder(args.rev)
    engines = ["paged"] + ([] if args.no_lockstep else ["lockstep"])
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    sides = []
    try:
        sides = [
            Side(f"{args.rev} ({rev})", folder, passed),
            Side(f"this checkout ({head}{'+' if dirty else ''})", str(ROOT), passed),
        ]
        for side in sides:
            print(f"{side.name}: {side.package}", flush=True)
            for engine in engines:  # compiles
                side.measure(engine)
        rates = {(s.name, e): [] for s in sides for e in engines}
        for r in range(args.rounds):
            for engine in engines:
                for side in sides if r % 2 == 0 else sides[::-1]:
                    rates[side.name, engine].append(side.measure(engine))
            print(f"round {r + 1}/{args.rounds} done (load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        for side in sides:
            side.close()
        shutil.rmtree(folder, ignore_errors=True)
    old, new = (s.name for s in sides)
    print(
        f"\n{args.slots} slots, {args.prompt}-token prompts, max_len {args.max_len}, "
        f"{args.num_steps}-step dispatches x {args.dispatches}, paged blocks of "
        f"{args.block_size}; decode tokens/s, median of {args.rounds} rounds\n"
    )
    print(f"| engine | per | {old} | {new} | new / old | per round |\n|---|---|---|---|---|---|")
    for engine in engines:
        for i, per in enumerate(("wall s", "CPU s")):
            a = [x[i] for x in rates[old, engine]]
            b = [x[i] for x in rates[new, engine]]
            per_round = ", ".join(f"{y / x:.2f}" for x, y in zip(a, b))
            print(
                f"| {engine} | {per} | {statistics.median(a):.1f} | {statistics.median(b):.1f} "
                f"| {statistics.median(b) / statistics.median(a):.2f} | {per_round} |"
            )
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
