"""Serving a request trace: our server (`functional-gen serve`) against llama.cpp's server
(llama-cpp-python) and against sequential `fg.stream` calls, in one run.

    .venv/bin/python benchmarks/bench_serving.py [--requests 32] [--rates 1,2,inf] [--slots 8]
        [--llama-cpp-python /work/llamacpp-venv/bin/python] [--quick] [--max-output 128]
        [--sequential-rates 2] [--no-sequential] [--quantization int8] [--decode-widths 1 2 4]
        [--block-size 16]

Duration (estimated for the 2-core CPU, quiet): the default run generates about 2,300 tokens per
rate and system; our server at 8 slots (~100 tok/s) and llama.cpp's one-request-at-a-time
server (~140 tok/s) take 20-35 s per rate, start-up and `--precompile` (max_len 512) ~3 min,
and the sequential baseline runs only at the highest rate (`--sequential-rates`; at ~50 tok/s
it is capacity-bound at every default rate, so its throughput there is its throughput at all
of them) ~1 min, after compiling its 9 prompt buckets (~2 min): ~9 min in all.

The rates: `inf` sends the whole trace at t=0, so the slots stay full and the throughput is the
server's capacity (what the issue's "throughput at 8 slots" asks); at 1 and 2 requests/s (32
requests of ~72 output tokens) the trace is arrival-limited for a server of ~150 tok/s or more.
After the table, a second one gives at each rate our throughput over llama.cpp's at the same
rate and over the sequential baseline's (at the same rate, or at the highest rate it ran).
`--requests`, `--rates`, `--max-output` and `--no-sequential` shorten it; `--quick` is 8 short
requests at one rate, to check that everything runs.

The trace: `--requests` requests, prompt lengths (16-256 tokens of English prose) and output
lengths (16-128 tokens, EOS ignored: `max_tokens` exactly, by suppressing the EOS ids with
`logit_bias`) drawn from `--seed`, arriving as a Poisson process at each rate (requests per
second). Greedy decoding. Every system sees the same trace:

- `functional_gen`: a `functional-gen serve --precompile --max-slots S` subprocess, streamed
  through the OpenAI client (warmed up with one request first);
- `llama.cpp`: `python -m llama_cpp.server` of the given interpreter on the same GGUF file
  (`--n_parallel`-style slots are not offered by llama-cpp-python's server: it serves one
  request at a time; the row is skipped with a note when the interpreter is absent);
- `sequential`: `fg.stream` in this process, one request after another in arrival order.

Reported per system and rate: output tokens per second (all generated tokens / wall time from
the first arrival to the last token), time to first token p50/p99 (from the request's arrival),
inter-token latency p50/p99 (per request, (last token - first token) / (tokens - 1): our
server hands out several tokens per dispatch, so gaps between chunks would overstate it). Default model: SmolLM2-135M-Instruct.
"""

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

import functional_gen as fg
from functional_gen.generation.buckets import bucket_length
from functional_gen.loading import default_gguf_path

TEXT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city of Rome "
    "to the fall of Constantinople. Historians often divide it into periods, and each one has "
    "its own emperors, wars, buildings and writers. "
) * 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_trace(tokenizer, n: int, rate: float, seed: int, short: bool, max_output: int = 128):
    rng = np.random.default_rng(seed)
    ids = tokenizer(TEXT)["input_ids"]
    high_prompt, high_out = (48, min(24, max_output)) if short else (256, max_output)
    prompt_lengths = rng.integers(16, high_prompt + 1, n)
    output_lengths = rng.integers(8 if short else 16, high_out + 1, n)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    arrivals -= arrivals[0]
    starts = rng.integers(0, len(ids) - high_prompt, n)
    prompts = [tokenizer.decode(ids[s : s + p]) for s, p in zip(starts, prompt_lengths)]
    return list(zip(arrivals.tolist(), prompts, output_lengths.tolist()))


def start_server(command, env=None):
    """A server subprocess whose output goes to a temporary file (a pipe nobody reads would fill
    up and block the server)."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - open as long as the server runs
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), log


def wait_healthy(url: str, process, log, timeout: float) -> None:
    deadline = time.time() + timeout
    while True:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the server exited:\n{log.read().decode()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            if time.time() > deadline:
                raise RuntimeError(f"{url} did not answer in {timeout} s") from None
            time.sleep(1)


async def run_trace(base: str, model: str, trace, eos: list[int]):
    """`(output tokens, wall seconds, ttfts, inter-token latencies)` of the trace on a server."""
    import openai

    client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=600)
    bias = {str(i): -100 for i in eos}
    start = time.perf_counter()
    ttfts, itls, counts = [], [], []

    async def one(arrival, prompt, max_tokens):
        await asyncio.sleep(max(0.0, start + arrival - time.perf_counter()))
        sent = start + arrival
        last, first, tokens = None, None, 0
        stream = await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            logit_bias=bias,
            stream=True,
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                if first is None:
                    first = now
                    ttfts.append(now - sent)
                last = now
            if getattr(chunk, "usage", None) is not None:
                tokens = chunk.usage.completion_tokens
        tokens = tokens or max_tokens
        if tokens > 1 and first is not None:
            itls.append((last - first) / (tokens - 1))
        counts.append(tokens)
        return last or time.perf_counter()

    ends = await asyncio.gather(*(one(*r) for r in trace))
    await client.close()
    return sum(counts), max(ends) - start, ttfts, itls


def run_sequential(model, tokenizer, trace, eos: list[int]):
    """The trace through `fg.stream`, one request after another. Every call asks for the trace's
    longest output and stops reading after its own `max_tokens` pieces (one piece per token for
    this ASCII prose), so the calls share one output bucket; every prompt bucket is compiled
    before the clock starts (our server is precompiled too)."""
    longest = max(m for _, _, m in trace)

    def stream(prompt):
        return fg.stream(model, tokenizer, prompt, max_new_tokens=longest,
                         processors=[fg.processors.SuppressTokens(eos)])  # fmt: skip

    shapes = {}
    for _, prompt, _ in trace:
        shapes.setdefault(bucket_length(len(tokenizer(prompt)["input_ids"])), prompt)
    for prompt in shapes.values():
        for _ in stream(prompt):
            break
    start = time.perf_counter()
    ttfts, itls, total = [], [], 0
    for arrival, prompt, max_tokens in trace:
        time.sleep(max(0.0, start + arrival - time.perf_counter()))
        sent, first, last, count = start + arrival, None, None, 0
        for _ in stream(prompt):
            now = time.perf_counter()
            if first is None:
                first = now
                ttfts.append(now - sent)
            last = now
            count += 1
            if count >= max_tokens:
                break
        if count > 1:
            itls.append((last - first) / (count - 1))
        total += count
    return total, time.perf_counter() - start, ttfts, itls


def row(name, rate, result):
    tokens, wall, ttfts, itls = result
    p = lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan")  # noqa: E731
    print(
        f"| {name} | {rate:g} | {tokens / wall:7.1f} | {p(ttfts, 50):6.2f} | {p(ttfts, 99):6.2f} "
        f"| {1000 * p(itls, 50):6.0f} | {1000 * p(itls, 99):6.0f} |",
        flush=True,
    )
    return tokens / wall


def ratios(throughputs: dict[tuple[str, float], float], ours: str) -> None:
    """Print, per rate of `ours`, its throughput over llama.cpp's at the same rate and over the
    sequential baseline's at the same rate (or at the highest rate it ran, marked `*`)."""
    sequential = {r: t for (name, r), t in throughputs.items() if name == "sequential"}
    print("\n| rate (req/s) | ours tok/s | x llama.cpp | x sequential |\n|---|---|---|---|")
    for (name, rate), value in throughputs.items():
        if name != ours:
            continue
        llama = throughputs.get(("llama.cpp", rate))
        versus = f"{value / llama:.2f}" if llama else "-"
        if rate in sequential:
            base = f"{value / sequential[rate]:.2f}"
        elif sequential:
            top = max(sequential)
            base = f"{value / sequential[top]:.2f}*"
        else:
            base = "-"
        print(f"| {rate:g} | {value:.1f} | {versus} | {base} |")
    if sequential and any(r not in sequential for (n, r) in throughputs if n == ours):
        print(f"(* against the sequential baseline at rate {max(sequential):g}, its capacity "
              "when requests come faster than it serves them)")  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=None, help="default 32 (8 with --quick)")
    parser.add_argument(
        "--rates",
        default="1,2,inf",
        help="arrival rates, requests per second (inf: every request at t=0)",
    )
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--llama-cpp-python",
        default="/work/llamacpp-venv/bin/python",
        help="a Python with llama-cpp-python[server] installed",
    )
    parser.add_argument("--no-sequential", action="store_true")
    parser.add_argument(
        "--sequential-rates",
        default=None,
        help="rates the sequential baseline runs at (default: the highest of --rates)",
    )
    parser.add_argument(
        "--max-output", type=int, default=128, help="longest output of the trace (at least 17)"
    )
    parser.add_argument(
        "--quantization",
        choices=("int8",),
        default=None,
        help="our server's weights as int8 (weight-only, a scale per 32 inputs) instead of "
        "float32: closer to the precision llama.cpp serves (the same Q4_1 GGUF)",
    )
    parser.add_argument(
        "--decode-widths",
        type=int,
        nargs="+",
        default=None,
        help="our server's narrower decode widths (`functional-gen serve --decode-widths`; "
        "default: the server's default)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="our server on a paged KV cache of blocks of this many tokens (`functional-gen "
        "serve --block-size`; default: the lockstep cache)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="8 requests, short prompts and outputs, one rate: to see it works",
    )
    args = parser.parse_args(argv)
    if args.max_output < 17:
        parser.error(f"--max-output {args.max_output}: at least 17")
    if args.requests is None:
        args.requests = 8 if args.quick else 32
    if args.quick:
        args.rates = args.rates.split(",")[0]
    rates = [float(r) for r in args.rates.split(",")]
    sequential_rates = (
        [max(rates)]
        if args.sequential_rates is None
        else [float(r) for r in args.sequential_rates.split(",")]
    )
    model, tokenizer = fg.load_model(quantization=args.quantization)
    eos = list(model.eos_token_id)
    name = "SmolLM2-135M-Instruct"
    max_len = 128 if args.quick else 512

    print(
        "| system | rate (req/s) | output tok/s | TTFT p50 (s) | TTFT p99 (s) | ITL p50 (ms) "
        "| ITL p99 (ms) |\n|---|---|---|---|---|---|---|"
    )
    servers = []
    throughputs: dict[tuple[str, float], float] = {}
    port = free_port()
    ours, log = start_server(
        [
            sys.executable,
            "-m",
            "functional_gen.cli",
            "serve",
            "--port",
            str(port),
            "--max-slots",
            str(args.slots),
            "--max-len",
            str(max_len),
            "--precompile",
            "--quiet",
            *(["--quantization", args.quantization] if args.quantization else []),
            *(["--decode-widths", *map(str, args.decode_widths)] if args.decode_widths else []),
            *(["--block-size", str(args.block_size)] if args.block_size else []),
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    label = "functional_gen" + (f" {args.quantization}" if args.quantization else "")
    if args.decode_widths:
        label += " widths " + ",".join(map(str, args.decode_widths))
    if args.block_size:
        label += f" paged {args.block_size}"
    our_label = label
    servers.append((label, f"http://127.0.0.1:{port}", ours, log, name))
    llama_python = Path(args.llama_cpp_python)
    if llama_python.exists():
        lport = free_port()
        llama, llama_log = start_server(
            [
                str(llama_python),
                "-m",
                "llama_cpp.server",
                "--model",
                str(default_gguf_path()),
                "--port",
                str(lport),
                "--n_ctx",
                str(max_len * args.slots),
                "--verbose",
                "false",
            ],
        )
        servers.append(
            ("llama.cpp", f"http://127.0.0.1:{lport}", llama, llama_log, str(default_gguf_path()))
        )
    else:
        print(f"(note: no llama-cpp-python at {llama_python}: the llama.cpp rows are skipped)")
    try:
        for label, base, process, log, model_name in servers:
            wait_healthy(
                base + ("/health" if label.startswith("functional_gen") else "/v1/models"),
                process,
                log,
                900,
            )
            warm = make_trace(tokenizer, 2, 100.0, args.seed + 1, True)
            asyncio.run(run_trace(base + "/v1", model_name, warm, eos))
            for rate in rates:
                trace = make_trace(
                    tokenizer, args.requests, rate, args.seed, args.quick, args.max_output
                )
                throughputs[label, rate] = row(
                    f"{label} ({args.slots} slots)"
                    if label.startswith("functional_gen")
                    else label,
                    rate,
                    asyncio.run(run_trace(base + "/v1", model_name, trace, eos)),
                )
            if label.startswith("functional_gen"):
                scraped = urllib.request.urlopen(base + "/metrics").read().decode()
                counts = [
                    line.split()[-1]
                    for line in scraped.splitlines()
                    if line.startswith("functional_gen_cache_compactions_total")
                ]
                print(f"(note: our server compacted its cache {counts[0]} times in this run)")
    finally:
        for _, _, process, _, _ in servers:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    if not args.no_sequential:
        for rate in sequential_rates:
            trace = make_trace(
                tokenizer, args.requests, rate, args.seed, args.quick, args.max_output
            )
            throughputs["sequential", rate] = row(
                "sequential fg.stream" + (f" {args.quantization}" if args.quantization else ""),
                rate,
                run_sequential(model, tokenizer, trace, eos),
            )
    ratios(throughputs, our_label)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
