"""The serving engine's decode step against `fg.generate`'s batched decode step, in one process
(compare the ratio; absolute milliseconds move with the machine).

    .venv/bin/python benchmarks/profile_serving_step.py [--slots 8] [--max-len 512]
        [--dispatches 20]

SmolLM2-135M-Instruct, float32, greedy. `Engine` (functional_gen/serving/engine.py) gets one
request per slot (short story prompts), EOS disabled so that every slot stays busy, and runs
`--dispatches` timed `generate` dispatches of `Engine.num_steps` steps after 3 warm-up ones: ms
per step = the median dispatch / its steps. `fg.generate` on the same prompts (batch `--slots`,
EOS disabled): ms per step = (time of 72 new tokens - time of 8) / 64, best of 3 each.

What it separates: the engine's step (the lockstep cache's batched model call, plus the per-slot
`SlotConstraint` pool and `SlotDecoding` parameters, plus one small host read per dispatch)
from everything else a server adds between dispatches (`bench_serving.py`'s inter-token latency:
prefill chunks, compactions, detokenization, HTTP).

Measured 2026-11-26 on a quiet 2-core machine: engine 36.3 ms/step (8 slots, max_len 512, 4
steps per dispatch, no compaction) against fg.generate 28.0 ms/step: 1.30x; bench_serving's
inter-token latency p50 in the same hour was 41-52 ms.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
import functional_gen as fg
from functional_gen.serving import Engine

ANIMALS = [
    "cat",
    "dog",
    "fox",
    "owl",
    "bee",
    "ant",
    "elk",
    "yak",
    "hen",
    "cow",
    "pig",
    "ram",
    "emu",
    "gnu",
    "bat",
    "eel",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--dispatches", type=int, default=20)
    args = parser.parse_args()
    if not 1 <= args.slots <= len(ANIMALS):
        parser.error(f"--slots must be between 1 and {len(ANIMALS)}, got {args.slots}")

    model, tokenizer = fg.load_model()
    prompts = [f"Write a long story about a {w} who travels far." for w in ANIMALS[: args.slots]]

    engine = Engine(model, tokenizer, max_slots=args.slots, max_len=args.max_len)
    engine.eos_token_id = ()  # every slot stays busy for the whole measurement
    state = engine.init_decode_state()
    budget = args.max_len - engine.prefill_width(max(len(tokenizer.encode(p)) for p in prompts))
    for slot, prompt in enumerate(prompts):
        request = engine.request(tokenizer.encode(prompt), budget)
        state = engine.insert(engine.prefill(request), state, slot)
    times = []
    for i in range(3 + args.dispatches):
        start = time.perf_counter()
        state, out = engine.generate(state)
        jax.block_until_ready(out.token_ids)
        if i >= 3:
            times.append(time.perf_counter() - start)
    engine_ms = 1e3 * statistics.median(times) / engine.num_steps

    def run(n: int) -> float:
        start = time.perf_counter()
        fg.generate(model, tokenizer, prompts, max_new_tokens=n, eos_token_id=[])
        return time.perf_counter() - start

    run(8), run(72)  # compile both lengths' programs
    short, long = min(run(8) for _ in range(3)), min(run(72) for _ in range(3))
    generate_ms = 1e3 * (long - short) / 64

    print(f"| system | ms per decode step ({args.slots} rows) | x fg.generate |")
    print("|---|---|---|")
    print(f"| fg.generate | {generate_ms:.1f} | 1.00 |")
    print(
        f"| Engine ({engine.num_steps} steps per dispatch, {engine.compactions} compactions) "
        f"| {engine_ms:.1f} | {engine_ms / generate_ms:.2f} |"
    )


if __name__ == "__main__":
    main()
