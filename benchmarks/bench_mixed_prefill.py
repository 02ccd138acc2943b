"""Chunked prefill mixed with decode, on the paged engine: the gaps the running streams see while
long prompts are admitted, with the chunks inside the decode dispatches (`Engine(mixed_prefill=
True)`) and between them (`False`), in one run.

    .venv/bin/python benchmarks/bench_mixed_prefill.py [--slots 4] [--decoders 3] [--new 48]
        [--long 2] [--long-tokens 600] [--chunk 128] [--block-size 16] [--max-len 768]
        [--quantization int8] [--repeats 2]

The trace, per engine: `--decoders` greedy requests of short prompts (16 tokens) decoding
`--new` tokens each; once each has its first token, `--long` prompts of `--long-tokens` tokens
(each `--long-tokens / --chunk` chunks) are submitted one after another, with 8 new tokens each.
The trace runs once to compile (not timed), then `--repeats` times; the table gives the
median over repeats of: the largest gap between two pieces of a running stream (the pause a
client sees while a chunk runs; p50 over the gaps too), the long prompts' time to first token,
the wall time of the whole trace, and the chunks each way (`chunks_mixed` / `chunks_alone`).

On the CPU a chunk costs the same inside or outside a dispatch (the programs run one after the
other either way), so expect equal figures within noise: the mixed dispatch saves a host round
trip per chunk (a few ms). The issue's win is on the GPU (one model call over chunk and decode
tokens, not built yet: docs/serving.md). Default model: SmolLM2-135M-Instruct.

Measured 2026-11-29 on the 2-core CPU while other jobs ran (load average 8-10, so only the
direction means anything), `--slots 2 --decoders 1 --new 32 --long 1 --long-tokens 180 --chunk
64 --max-len 256 --repeats 2` (7 min with compiles):

| chunks | stream gap max (ms) | gap p50 (ms) | long TTFT (s) | wall (s) | chunks mixed / alone |
|---|---|---|---|---|---|
| inside dispatches | 2108 | 1086 | 7.78 | 11.12 | 3 / 0 |
| between dispatches | 2935 | 1384 | 8.92 | 15.84 | 0 / 0 |
"""

import argparse
import asyncio
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

import functional_gen as fg


async def trace(engine, args, rng):
    """One run of the trace; returns (stream gaps in s, long TTFTs in s, wall s)."""
    loop = asyncio.get_running_loop()
    submit = engine.orchestrator.submit
    vocab = engine.model.vocab_size

    def ids(n):
        return rng.integers(100, vocab - 100, n).tolist()

    start = time.perf_counter()
    gaps, ttfts = [], []

    async def stream(request, on_first, record_gaps):
        handle = submit(request, loop=loop)
        last = None
        async for event in handle.events():
            if not getattr(event, "token_ids", None):
                continue
            now = time.perf_counter()
            if last is None:
                on_first(now - handle.submitted)
            elif record_gaps:
                gaps.append(now - last)
            last = now

    first = asyncio.Event()
    decoders = [
        asyncio.create_task(stream(engine.request(ids(16), args.new), lambda t: first.set(), True))
        for _ in range(args.decoders)
    ]
    await first.wait()
    for _ in range(args.long):
        await stream(engine.request(ids(args.long_tokens), 8), ttfts.append, False)
    await asyncio.gather(*decoders)
    return gaps, ttfts, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--decoders", type=int, default=3)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--long", type=int, default=2)
    parser.add_argument("--long-tokens", type=int, default=600)
    parser.add_argument("--chunk", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=768)
    parser.add_argument("--quantization", choices=("int8",), default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    args = parser.parse_args(argv)
    if args.decoders >= args.slots:
        parser.error("--decoders must leave a slot free for the long prompts")
    model, tokenizer = fg.load_model(args.model, quantization=args.quantization)
    print(
        "| chunks | stream gap max (ms) | gap p50 (ms) | long TTFT (s) | wall (s) "
        "| chunks mixed / alone |\n|---|---|---|---|---|---|"
    )
    for mixed in (True, False):
        engine = fg.serving.Engine(
            model, tokenizer, max_slots=args.slots, max_len=args.max_len,
            block_size=args.block_size, prefill_chunk=args.chunk, mixed_prefill=mixed,
        )  # fmt: skip
        rows = []
        for repeat in range(args.repeats + 1):  # the first run compiles
            rng = np.random.default_rng(repeat)
            before = engine.paged.chunks_mixed, engine.paged.chunks_alone
            gaps, ttfts, wall = asyncio.run(trace(engine, args, rng))
            counts = (
                engine.paged.chunks_mixed - before[0],
                engine.paged.chunks_alone - before[1],
            )
            engine.close()
            if repeat:
                rows.append((max(gaps), statistics.median(gaps), max(ttfts), wall, counts))
        med = [statistics.median(r[i] for r in rows) for i in range(4)]
        label = "inside dispatches" if mixed else "between dispatches"
        print(
            f"| {label} | {med[0] * 1e3:.0f} | {med[1] * 1e3:.0f} | {med[2]:.2f} | "
            f"{med[3]:.2f} | {rows[-1][4][0]} / {rows[-1][4][1]} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
