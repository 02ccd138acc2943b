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
inter-token latency p50 in the same hour was 41-52 ms. Where the step's excess is (CPU time per
step, `time.process_time`, min of 4 dispatches, one process, the 2-core CPU loaded ~10x): not
in the per-slot processors (both `SlotConstraint` and `SlotDecoding` removed: 58.6 -> 59.7 ms,
noise), not in the attention read length (256 vs 512 slots read: 57 vs 58-61 ms); a cache of
`max_len` 96 instead of 512: 52 vs 60 ms; `fg.generate` (88-slot cache): 43 ms.

    .venv/bin/python benchmarks/profile_serving_step.py --ops [--dispatches 20]

`--ops`: the engine's jitted 4-step program against a bare loop of 4 decode steps (model and
argmax only), op by op under `jax.profiler` (see `ops`), and the copies in the program's
optimized HLO. Found with it on 2026-11-26 (8 greedy slots, max_len 512): two full-vocabulary
reductions ran every step beside the model, `Multinomial`'s Gumbel noise (two logarithms of
8 x 49,152 uniforms fused into an argmax, ~8 ms per step on the loaded CPU, needed by no greedy
slot) and XLA CPU's variadic `argmax` reduce (~2-3 ms per call; `first_argmax` does it in a
fifth); both are skipped or replaced now (`serving.slots.SlotSampler`), and the constraint
pool's tables are read only when a busy slot is constrained (4% of a step). Interleaved 4-step
dispatches in one process, min ms per step (machine loaded ~3-8x): before 105.2 vs after 94.2
(1.12x); the constraint switch 51.4 vs 49.4; the engine then ran within noise of the bare loop
(233 vs 228 ms per dispatch in one profile, 144 vs 125 ms per step in another at load ~8). The
HLO has no cache- or table-sized copy; the largest are 5 of the `[8, 49152]` logits (the
conditionals' operands) and the attention's small transposes. `bench_serving.py --requests 16
--rates inf --no-sequential` (load ~7-8, one run each): 38.2 -> 48.0 tok/s, 0.58x -> 0.77x
llama.cpp's server measured in the same run, ITL p50 143 -> 107 ms. This script's default
mode in the same hour (load ~10): engine / fg.generate per step 1.29x before, 1.18x after.

What is left of that 1.18x is attention's read length, in `models/` (not the engine's program):
the engine at max_len 512 reads a 256-slot slice of every layer's cache (`attention_lengths`;
XLA copies the slice, the `wrapped_slice` ops), `fg.generate` here ~96 slots in place. The
same 8 slots at max_len 512 / 256 / 128 (one process, alternated, min of 8 dispatches, load
~10): 56.1 / 53.9 / 49.4 ms per step. Since then attention also reads 64- or 128-slot slices
at batch >= 2 in caches of >= 512 slots (`SHORT_ATTENTION_LENGTHS`; the engine's program
0.67-0.98x with <= 128 written, `benchmarks/bench_decode_attention.py --engine`); a read without
the slice copy (a cache layout with slots major) is the lever left.

Admission (task of 2026-11-26, the same loaded machine, one process, min of 4-5): the engine's
prefill of a prompt costs what `generate`'s `model.prefill` of it costs (prompts of 40 / 110 /
200 tokens: 0.90-1.07x, the same logits); `insert` 1.3 ms. Prefilling 8 waiting prompts as one
batch instead of 8 batch-1 calls: 0.47x the time at 16 tokens, 0.68x at 48, but 1.17x at 128
and 1.26x at 256 (prefill is compute-bound there on this CPU), so the engine prefills one
prompt per call; `bench_serving.py`'s prompts (16-256 tokens) would gain little. Bucket padding
is 16% of its prompt tokens (multiples of 32 above 64 would make it 8%, but `generate` pads to
the same buckets, which keeps the prefill's logits equal to its).

    .venv/bin/python benchmarks/profile_serving_step.py --orchestrator [--requests 16]
        [--num-steps 4] [--prefill-budgets 1,256,1024] [--rounds 2] [--sync] [--sequential 4]

`--orchestrator`: `bench_serving.py`'s trace sent at once through the orchestrator's Python API
(no HTTP), wall seconds per phase of its loop (`serving.phases.PhaseTimer`), dispatches and
busy slot-steps (tokens / (dispatches x steps x slots)). Measured 2026-11-26, 16 requests
(1,241 tokens), 8 slots, max_len 512, the 2-core CPU loaded 8-13x (so tok/s is noise; the
dispatch counts are not):

- with `--sync` (each phase waits for its device work), 4 steps per dispatch: admission
  (prefill + insert) 8.5 s, decode dispatches 35.7 s, cache layout reads 0.10 s, compaction
  0.08 s, device-to-host reads 0.02 s, detokenization and delivery 0.06 s: the host work
  between dispatches is under 1% of the wall time; prefill ~19%, decode ~80%;
- steps per dispatch 4 / 8 / 16 (before the admission change): 55 / 31 / 21 dispatches, busy
  slot-steps 70% / 63% / 46%: a longer dispatch leaves finished slots idle longer while
  requests wait, and saves only the ~3 ms of host work per dispatch (of 500-700 ms here);
- admission filling every free slot while no slot decodes: 51 dispatches instead of 55 (76%
  busy slot-steps); the prefill budget per turn while slots decode (1, 256, 1,024 tokens)
  changed nothing on this trace (51 each): slots free one at a time.
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
from functional_gen.serving.orchestrator import Error, Finished

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


PHASES = ("cancel", "admit", "layout", "compact", "dispatch", "transfer", "deliver", "idle")


def serve_trace(engine: Engine, requests) -> tuple[int, float]:
    """Every `(request, stop strings)` submitted at once through the orchestrator's Python API
    (no HTTP); waits for all of them. **Returns:** `(generated tokens, wall seconds)`."""
    import asyncio

    async def run():
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        handles = [engine.orchestrator.submit(r, stops, loop) for r, stops in requests]
        tokens = 0
        for handle in handles:
            async for event in handle.events():
                if isinstance(event, Error):
                    raise RuntimeError(event.message)
                if isinstance(event, Finished):
                    tokens += event.completion_tokens
        return tokens, time.perf_counter() - start

    return asyncio.run(run())


def orchestrator(model, tokenizer, args) -> None:
    """`--orchestrator`: `--requests` requests of `bench_serving.py`'s trace (prompts of 16-256
    tokens, 16-128 output tokens, EOS suppressed, greedy) submitted at once (a saturating rate)
    through `Engine.orchestrator`, for each `--num-steps` and `--prefill-budgets`, `--rounds`
    times alternated; with `--sync` once more with `PhaseTimer(sync=True)`, so that each phase's
    device work is timed in that phase. Prints output tokens/s and the wall seconds per phase of the loop, and the first
    `--sequential` requests served one by one by `fg.stream` (the bench's sequential baseline)."""
    from bench_serving import make_trace

    eos = list(model.eos_token_id)
    trace = make_trace(tokenizer, args.requests, float("inf"), 0, False)
    bias = tuple((int(e), -100.0) for e in eos)
    engine = Engine(model, tokenizer, max_slots=args.slots, max_len=args.max_len)
    requests = [
        (engine.request(tokenizer(p)["input_ids"], m, temperature=0.0, logit_bias=bias), ())
        for _, p, m in trace
    ]
    engine.precompile(progress=False)
    steps = [int(n) for n in args.num_steps.split(",")]
    budgets = [int(b) for b in args.prefill_budgets.split(",")]
    settings = [(n, b, False) for _ in range(args.rounds) for n in steps for b in budgets]
    settings += [(steps[0], budgets[-1], True)] if args.sync else []
    rows = []
    for n, budget, sync in settings:  # alternated, so that a changing load hits all of them
        engine.num_steps = n
        engine.orchestrator.prefill_budget = budget
        if n not in {row[0] for row in rows}:
            serve_trace(engine, requests[: args.slots])  # compiles this num_steps' program
        engine.timer.reset()
        engine.timer.sync = sync
        compactions = engine.compactions
        tokens, wall = serve_trace(engine, requests)
        seconds, counts = dict(engine.timer.seconds), dict(engine.timer.counts)
        rows.append(
            (n, budget, sync, tokens, wall, engine.compactions - compactions, seconds, counts)
        )
        engine.timer.sync = False
    engine.close()

    sequential = None
    if args.sequential:
        longest = max(m for _, _, m in trace[: args.sequential])

        def stream(prompt):
            return fg.stream(model, tokenizer, prompt, max_new_tokens=longest,
                             processors=[fg.processors.SuppressTokens(eos)])  # fmt: skip

        for _, prompt, _ in trace[: args.sequential]:  # compile every prompt bucket
            next(iter(stream(prompt)))
        start, count = time.perf_counter(), 0
        for _, prompt, max_tokens in trace[: args.sequential]:
            for i, _ in enumerate(stream(prompt), 1):
                if i >= max_tokens:
                    break
            count += i
        sequential = count / (time.perf_counter() - start)

    print(f"{args.requests} requests at once, {args.slots} slots, max_len {args.max_len}; "
          f"wall seconds per phase of the orchestrator's loop (dispatches: the count of "
          f"'dispatch')\n")  # fmt: skip
    print("| steps/dispatch | prefill budget | sync | tok/s | x sequential | dispatches "
          "| busy slot-steps | compactions | " + " | ".join(PHASES) + " |")  # fmt: skip
    print("|---" * (8 + len(PHASES)) + "|")
    for n, budget, sync, tokens, wall, compactions, seconds, counts in rows:
        ratio = f"{tokens / wall / sequential:.2f}" if sequential else "-"
        print(f"| {n} | {budget} | {'yes' if sync else 'no'} | {tokens / wall:.1f} | {ratio} "
              f"| {counts.get('dispatch', 0)} "
              f"| {tokens / max(1, counts.get('dispatch', 0) * n * args.slots):.0%} "
              f"| {compactions} | "
              + " | ".join(f"{seconds.get(p, 0.0):.2f}" for p in PHASES) + " |")  # fmt: skip
    if sequential:
        print(f"\nsequential fg.stream, first {args.sequential} requests: {sequential:.1f} tok/s")


def ops(model, tokenizer, args) -> None:
    """`--ops`: the engine's jitted 4-step `generate` program (8 busy greedy slots) against a
    bare loop of the same 4 decode steps (the model and an argmax, nothing else), alternated,
    each `--dispatches` times under `jax.profiler.trace`: the compiled ops summed per kind
    (`profile_decode_ops.category`) and the longest ops that are not dots, in ms per dispatch,
    and the `copy` ops of the engine's optimized HLO by shape (a cache- or table-sized copy there
    is a buffer copied in or out of a loop or conditional)."""
    import collections
    import glob
    import gzip
    import json
    import re
    import tempfile

    import equinox as eqx
    import jax.numpy as jnp
    from profile_decode_ops import _RUNTIME, category

    from functional_gen.serving import programs

    prompts = [f"Write a long story about a {w} who travels far." for w in ANIMALS[: args.slots]]
    engine = Engine(model, tokenizer, max_slots=args.slots, max_len=args.max_len)
    engine.eos_token_id = ()
    state = engine.init_decode_state()
    budget = args.max_len - engine.prefill_width(max(len(tokenizer.encode(p)) for p in prompts))
    for slot, prompt in enumerate(prompts):
        state = engine.insert(engine.prefill(engine.request(tokenizer.encode(prompt), budget)),
                              state, slot)  # fmt: skip
    n, b = engine.num_steps, args.slots

    def call():  # the dispatch's arguments after the state (the step limit is donated too)
        return n, jnp.asarray(n, jnp.int32), engine.eos_token_id, engine.pad_token_id

    hlo = programs.generate_jit.lower(model, state, *call()).compile().compiled.as_text()
    copies = collections.Counter(re.findall(r"= (\w+\[[\d,]*\])\{[^}]*\} copy\(", hlo))

    ids = jnp.asarray([[2] + list(range(1000, 1031))] * b)
    positions = jnp.broadcast_to(jnp.arange(32), (b, 32))
    _, cache = eqx.filter_jit(lambda m, x, p: m.prefill(x, p, max_len=args.max_len))(
        model, ids, positions
    )

    @eqx.filter_jit(donate="all-except-first")
    def bare(m, cache, token):
        def body(carry):
            i, cache, token = carry
            logits, cache = m(token, jnp.full((b, 1), 32) + i, cache)
            return i + 1, cache, jnp.argmax(logits[:, -1], -1)[:, None].astype(jnp.int32)

        return jax.lax.while_loop(lambda c: c[0] < n, body, (0, cache, token))[1:]

    held = {"engine": [state], "bare": [cache, jnp.full((b, 1), 42, jnp.int32)]}

    def run(name):
        h = held[name]
        if name == "engine":
            h[0], out = programs.generate_jit(model, h[0], *call())
            jax.block_until_ready(out.token_ids)
        else:
            h[0], h[1] = bare(model, h[0], h[1])
            jax.block_until_ready(h[1])

    for name in held:  # compile and warm up
        for _ in range(3):
            run(name)
    tables = {}
    for name in ("engine", "bare", "engine", "bare"):  # alternated: a changing load hits both
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            with jax.profiler.trace(folder):
                for _ in range(args.dispatches):
                    run(name)
            wall = (time.perf_counter() - start) / args.dispatches
            (path,) = glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True)
            with gzip.open(path) as f:
                events = json.load(f)["traceEvents"]
        total = collections.Counter()
        for e in events:
            if e.get("ph") == "X" and "dur" in e and not e["name"].startswith(_RUNTIME):
                total[e["name"]] += e["dur"] / args.dispatches / 1e3
        if name not in tables or wall < tables[name][0]:
            tables[name] = (wall, total)
    for name, (wall, total) in tables.items():
        kinds = collections.Counter()
        for op, ms in total.items():
            kinds[category(op)] += ms
        print(f"\n{name}: {1e3 * wall / n:.1f} ms per step (wall, traced, the faster of 2 runs); "
              f"ms per {n}-step dispatch by kind:")  # fmt: skip
        for kind, ms in kinds.most_common():
            print(f"  {kind:<26} {ms:9.2f}")
        print("  longest ops other than dots:")
        for op, ms in [
            (o, t) for o, t in total.most_common() if category(o) != "dots (ynn fusions)"
        ][:12]:
            print(f"    {ms:8.2f}  {op}")
    print("\nthe engine program's copy ops by shape:", dict(copies.most_common()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--dispatches", type=int, default=20)
    parser.add_argument(
        "--orchestrator",
        action="store_true",
        help="serve a request trace through the orchestrator instead (see `orchestrator`)",
    )
    parser.add_argument(
        "--ops",
        action="store_true",
        help="the engine's generate program against a bare decode loop, op by op (see `ops`)",
    )
    parser.add_argument("--requests", type=int, default=16, help="--orchestrator: trace size")
    parser.add_argument(
        "--num-steps",
        default="4",
        help="--orchestrator: decode steps per dispatch to compare (comma-separated)",
    )
    parser.add_argument(
        "--prefill-budgets",
        default="1,256,1024",
        help="--orchestrator: `Orchestrator.prefill_budget` values to compare (1: one prefill "
        "chunk per turn)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="--orchestrator: runs per setting")
    parser.add_argument(
        "--sync", action="store_true", help="--orchestrator: also a PhaseTimer(sync=True) run"
    )
    parser.add_argument(
        "--sequential",
        type=int,
        default=4,
        help="--orchestrator: requests of the trace served one by one by fg.stream (0: none)",
    )
    args = parser.parse_args()
    if not 1 <= args.slots <= len(ANIMALS):
        parser.error(f"--slots must be between 1 and {len(ANIMALS)}, got {args.slots}")

    model, tokenizer = fg.load_model()
    if args.orchestrator:
        orchestrator(model, tokenizer, args)
        return
    if args.ops:
        ops(model, tokenizer, args)
        return
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
