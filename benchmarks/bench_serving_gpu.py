"""Serving on one GPU (issue 56's device benchmark): our paged continuous-batching engine against
transformers' own continuous batching on the same GPU, in one process, on a seeded request
trace over random-weight checkpoints of real shapes; our static batch-64 decode rate; and the
cost of a speculative verification call, composed with prompt lookup's tokens per step.

    python benchmarks/bench_serving_gpu.py --tokenizer DIR [--shapes llama-3.1-8b llama-3.2-1b]
        [--requests 512] [--slots 64] [--moderate-rate R] [--budget-s 470] [--max-run-s 150]
        [--out DIR] [--scratch DIR] [--tiny] [--only TASK ...] [--seed 0]
    python benchmarks/bench_serving_gpu.py --tiny                  # a CPU check of the script
    python benchmarks/bench_serving_gpu.py --measure-tokens-per-step   # CPU, the real model

**Shapes and checkpoints** come from `bench_gpu.py` (`SHAPES`, `make_checkpoint`: the published
configs' numbers, random bfloat16 weights made by transformers on the machine, the tokenizer of
`--tokenizer` copied beside them; nothing is downloaded). `--tiny` gives each shape 2 layers of
hidden size 64 (`bench_gpu.TINY`). The shapes run in the order given, each task by priority
(below), so the 8B shape's figures come first.

**The trace** (`make_trace`, seeded by `--seed`): `--requests` requests (512), exactly half of
them (a seeded random half) starting with one shared 1,024-token system prompt. Cold prompts
are 64-2,048 tokens long (uniform); shared ones 1,088-2,048 (the system prompt plus 64-1,024
tokens of their own), so that their own part spans what a cold prompt of the same total
length would; outputs are 32-512 tokens (uniform). Tokens are random ids of the tokenizer's
vocabulary (any repeated text would make the cold prompts share blocks). Arrivals: saturating,
every request at t=0; moderate, a Poisson process at `--moderate-rate` requests/s, by default
half our saturated throughput in requests/s (512 / the saturated run's wall time, halved:
stated in the table), the same arrival times for both systems. Greedy, EOS off on both sides,
so every request makes exactly its output length (checked: "exact" in the JSON).

**Systems:**

- `ours`: `fg.load_model(path, dtype="bfloat16", kv_cache_dtype="bfloat16")` under the GPU
  plan (float32 weights and cache under the CPU plan on a CPU; the GPU plan's decode reads the
  paged blocks with jax's Pallas paged-attention kernel, `--paged-attention gather` for the
  CPU form's gather; a kernel that fails to compile there falls back to the gather, its error
  in the JSON's `paged_attention_error`), then `fg.serving.Engine(model,
  tokenizer, max_slots=--slots, max_len=..., block_size=16, kv_cache_dtype=...)`, its EOS ids
  emptied (`engine.eos_token_id = ()`), `engine.precompile()` timed before anything is served.
  Then one untimed warm-up request per kind of prefill the trace holds (cold or behind the
  system prompt, by the padded width of its uncached tokens; 2 tokens each): `precompile()`
  compiles the prefill over one cached block only, and a prompt behind the system prompt's
  64 blocks compiled a program of its own per width on first use (seen on the CPU), which the
  timed runs must not pay; the same requests warm transformers up (after its `warmup()`), so
  both start with the system prompt in their prefix cache. Every task's log line counts the
  XLA compilations it caused (`jax.monitoring`): a timed run should show none.
  Driven through `engine.orchestrator.submit(request, loop=...)` and each handle's async
  `events()`, as the HTTP server drives it (no HTTP): a token's time is when its `Piece`
  reaches the event loop. KV blocks in use: `engine.paged.allocator.blocks_in_use`, sampled
  every 20 ms while the trace runs (max and mean; the pool's size beside it).
- `hf-cb`: transformers' continuous batching manager (`model.init_continuous_batching`, the
  engine behind `generate_batch`) on the torch model that made the checkpoint, attention
  `"paged|sdpa"` (transformers 5.17's name; `"paged|flash_attention_2"` when `flash_attn` is
  importable), `GenerationConfig(do_sample=False)`, its `ContinuousBatchingConfig` defaults
  (sized from the free GPU memory; the resolved values are in the JSON), `warmup()` timed
  (its CUDA graphs), then `start()`. Requests are added at their arrival times by a thread
  (`add_request(ids, max_new_tokens=n, eos_token_id=-1, record_timestamps=True)`); a token's
  time is transformers' own per-token timestamp (`GenerationOutput.timestamps`, taken in its
  generation loop when the token is known on the host, so a little earlier than a server
  would see it). Its blocks in use: its cache's `num_blocks - get_num_free_blocks()`
  (transformers' blocks hold 256 tokens by default, ours 16: compare tokens, also given).

**Figures per system and rate:** output tokens/s (every generated token / (last token - first
arrival)); TTFT p50 / p99 from the request's arrival, over all requests and for the cold and
shared halves (and the cold prompts of at least the shared ones' shortest length, for a
like-for-like "cold, long"); ITL p50 / p99 over requests, each request's (last token - first
token) / (tokens - 1) (`bench_serving.py`'s definition: our engine hands out `num_steps`
tokens per dispatch, so gaps between pieces would overstate it); blocks in use. A run still
going at its deadline (`--max-run-s`, or the budget's end) is cut: its requests are cancelled
and the row is marked with the requests finished.

**Static batch-64 decode** (`bench_gpu.decode_times`, its N1/N2 method): `fg.generate_token_ids`
at batch `--static-batch` (64) with a 32-token prompt, `B * (N2 - N1) / (T(N2) - T(N1))`, N1=16,
N2=80; also with a `--static-context` (1,024) token prompt, closer to the trace's contexts.

**Speculative verification** (`verify_costs`): the target model's call over `[B, k]` tokens
(k = `--verify-positions`, 1 4 8: the row's last token plus k - 1 guesses, the widths
`generation.speculative.verify_widths` compiles at batch 1 and 8) against the one-position
call, B = 1 and 8, over a cache holding `--verify-context` (1,024) tokens; each call runs `n`
times inside one jitted `fori_loop` (compiled with the plan's XLA options, as the decode loop
is), timed at two `n` (N1/N2 again), the median of `--repeats`. Tokens per verify step come
from `--tokens-per-step` (default `TOKENS_PER_STEP`, measured on the 2-core CPU with the real
default model by `--measure-tokens-per-step`: greedy acceptance does not depend on the device).
**Speed-up = tokens per step / (verify call cost / plain step cost)**: it counts every step
as a verification of the full width (steps that found no guess cost one plain step in truth,
so it understates the gain slightly) and leaves out the step's own work besides the model call
(proposing, accepting: measured on the CPU as part of `profile_speculative_step.py`).

**Time.** Tasks run in priority order (per shape: checkpoint, load, static decode, engine
precompile, ours saturated, transformers saturated, verification costs, ours moderate,
transformers moderate, static decode at the long context) and none starts once its reserve
does not fit in `--budget-s`; a trace run is cut at `--max-run-s` or the budget's end. Every
figure goes to `--out/bench_serving_gpu.json` as it is measured; the tables are printed last
(and saved to `bench_serving_gpu.md`). `--only TASK ...` runs a subset (names as in the log).

How a session runs it on a lent GPU: `sh benchmarks/gpu_run.sh device-serving` (see its header).
"""

import argparse
import asyncio
import dataclasses
import gc
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's functional_gen
sys.path.insert(0, str(Path(__file__).resolve().parent))

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from bench_gpu import SHAPES, Budget, Ours, decode_times, make_checkpoint
from serving_trace import make_trace, with_poisson_arrivals

import functional_gen as fg
from functional_gen.generation.buckets import bucket_length
from functional_gen.serving.orchestrator import Error, Piece

TOKENS_PER_STEP = {
    (1, 4): 1.779,
    (1, 5): 1.864,
    (1, 8): 2.020,
    (1, 9): 2.075,
    (8, 4): 1.777,
    (8, 5): 1.861,
    (8, 8): 2.014,
    (8, 9): 2.072,
}
"""`{(batch, k positions): tokens per target step}` of greedy prompt lookup with every guess
verified (`PromptLookup(num_tokens=k - 1, max_ngram_size=3, adaptive=False)`), measured by
`--measure-tokens-per-step` on the shared 2-core CPU, 2026-12-03 07:32-07:48 UTC (949 s), jax
0.10.2, SmolLM2-135M-Instruct float32, the 24 prompts of `bench_speculative.GROUNDED`, at most
128 new tokens, EOS ending a row: 1,297 tokens in all (54 a prompt on average). Per (batch, k):
target steps / guesses verified / guesses kept (acceptance):

| batch | k = 4 | k = 5 | k = 8 | k = 9 |
|---|---|---|---|---|
| 1 | 729 / 1,484 / 576 (0.39) | 696 / 1,844 / 608 (0.33) | 642 / 2,830 / 661 (0.23) | 625 / 3,091 / 679 (0.22) |
| 8 | 730 / 1,481 / 575 (0.39) | 697 / 1,832 / 607 (0.33) | 644 / 2,816 / 659 (0.23) | 626 / 3,051 / 678 (0.22) |

A step is every target call of a row (those that found no guess included); at batch 8 the
figure is per row-step, sums over the rows (the rows' greedy outputs are the same as alone, so
it matches batch 1 up to float rounding). k = 5 and 9 are the `[B, g + 1]` reading of "g = 4
and 8 guesses" (`--verify-positions 1 4 5 8 9` measures their cost too)."""

COMPILES = {"count": 0, "seconds": 0.0}
"""XLA compilations in this process so far (`jax.monitoring`'s backend-compile events): each task's
log line gives those it caused, so a trace run that compiled is visible."""


def _count_compile(name, duration, **kwargs):
    if name == "/jax/core/compile/backend_compile_duration":
        COMPILES["count"] += 1
        COMPILES["seconds"] += duration


jax.monitoring.register_event_duration_secs_listener(_count_compile)

TASKS = (
    "checkpoint",
    "load",
    "static",
    "precompile",
    "ours saturated",
    "hf-cb saturated",
    "verify",
    "ours moderate",
    "hf-cb moderate",
    "static long",
)


# ---------------------------------------------------------------- figures of a run


def percentile(values, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def summarise(trace, records, start: float, samples, cut: bool, pool: dict) -> dict:
    """The figures of one run: `records[i]` is request `i`'s `{"first", "last", "tokens",
    "error"}` (perf_counter seconds), `start` the trace's t=0, `samples` the blocks-in-use and
    busy-request readings, `cut` whether the run was stopped before its end."""
    shortest_shared = min((len(r.token_ids) for r in trace if r.shared), default=0)
    ttft = {"all": [], "cold": [], "shared": [], "cold_long": []}
    itl, ends, tokens, exact, errors = [], [], 0, 0, []
    for r, rec in zip(trace, records):
        tokens += rec["tokens"]
        if rec["error"]:
            errors.append(rec["error"])
        if rec["first"] is None:
            continue
        t = rec["first"] - (start + r.arrival)
        ttft["all"].append(t)
        ttft["shared" if r.shared else "cold"].append(t)
        if not r.shared and len(r.token_ids) >= shortest_shared:
            ttft["cold_long"].append(t)
        ends.append(rec["last"])
        if rec["tokens"] > 1:
            itl.append((rec["last"] - rec["first"]) / (rec["tokens"] - 1))
        exact += rec["tokens"] == r.max_new_tokens
    wall = (max(ends) - start) if ends else float("nan")
    blocks = [b for b, _ in samples]
    busy = [s for _, s in samples]
    out = {
        "requests": len(trace),
        "finished_exact": exact,
        "cut_short": cut,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "output_tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall if ends and wall > 0 else float("nan"),
        "requests_per_s": exact / wall if ends and wall > 0 else float("nan"),
        "itl_ms": {"p50": 1e3 * percentile(itl, 50), "p99": 1e3 * percentile(itl, 99)},
        "blocks_in_use": {
            "max": max(blocks) if blocks else None,
            "mean": statistics.fmean(blocks) if blocks else None,
            "samples": len(blocks),
        }
        | pool,
        "busy_requests": {
            "max": max(busy) if busy else None,
            "mean": statistics.fmean(busy) if busy else None,
        },
    }
    out["ttft_s"] = {
        k: {"p50": percentile(v, 50), "p99": percentile(v, 99), "n": len(v)}
        for k, v in ttft.items()
    }
    return out


# ---------------------------------------------------------------- ours: the serving engine


def make_engine(model, tokenizer, slots, max_len, block_size, kv_cache_dtype, prefill_chunk):
    """The paged engine with EOS off (every request makes exactly its `max_new_tokens`)."""
    engine = fg.serving.Engine(
        model,
        tokenizer,
        max_slots=slots,
        max_len=max_len,
        block_size=block_size,
        kv_cache_dtype=kv_cache_dtype,
        prefill_chunk=prefill_chunk,
    )
    engine.eos_token_id = ()  # random weights emit an EOS id now and then: never stop on one
    return engine


def wait_idle(engine, timeout: float = 60.0) -> bool:
    """Wait until the orchestrator holds no request (after a cut run's cancellations)."""
    orch = engine.orchestrator
    deadline = time.perf_counter() + timeout
    while orch.busy_slots or orch.queue_length:
        if time.perf_counter() > deadline:
            return False
        time.sleep(0.05)
    return True


def start_engine(engine, timeout: float = 120.0) -> None:
    """Start the orchestrator's thread and wait for its decode state: it makes a fresh pool and
    allocator (`PagedKV.init_state`), which the figures must read, not precompile's."""
    before = engine.paged.allocator
    engine.orchestrator  # noqa: B018 - starts the thread
    deadline = time.perf_counter() + timeout
    while engine.paged.allocator is before and time.perf_counter() < deadline:
        time.sleep(0.01)


def warm_up_requests(trace, system_length: int, width, seed: int = 0) -> list[list]:
    """Waves of warm-up requests (2 new tokens each, at t=0) for the kinds of prefill `trace`
    will run: cold or behind the shared system prompt, by the padded width `width(n)` of the `n`
    tokens not cached. `engine.precompile()` compiles the prefill over ONE cached block only; a
    prompt behind the system prompt's blocks compiles a program of its own per width on first
    use (seen on the CPU), which a timed run must not pay. The first wave is one shared prompt
    (it puts the system prompt in the prefix cache), the second one request of each kind; their
    own tokens are fresh random ids (so that no timed prompt finds its own blocks cached)."""
    rng = np.random.default_rng(seed + 99)
    kinds = {}
    for r in trace:
        own = len(r.token_ids) - (system_length if r.shared else 0)
        kinds.setdefault((r.shared, width(own)), r)

    def fresh(r):
        keep = system_length if r.shared else 0
        ids = r.token_ids[:keep] + tuple(rng.integers(100, 49000, len(r.token_ids) - keep).tolist())
        return dataclasses.replace(r, token_ids=ids, max_new_tokens=2)

    second = [fresh(r) for r in kinds.values()]
    first = [fresh(r) for r in kinds.values() if r.shared][:1]
    return [first, second] if first else [second]


def serve_ours(engine, trace, deadline: float) -> dict:
    """Run `trace` through the engine's orchestrator until done or `deadline` (perf_counter)."""
    orch = engine.orchestrator
    orch.max_queue = max(orch.max_queue, len(trace) + 8)
    paged = engine.paged
    alloc = paged.allocator  # the orchestrator's (see `start_engine`)
    before = dict(
        hits=alloc.prefix_cache_hits,
        prefilled=paged.prefilled_tokens,
        mixed=paged.chunks_mixed,
        alone=paged.chunks_alone,
        waits=paged.waits,
    )
    engine.timer.reset()
    records = [dict(first=None, last=None, tokens=0, error=None) for _ in trace]
    samples, refused = [], []

    async def drive():
        loop = asyncio.get_running_loop()
        handles = []
        stop = asyncio.Event()

        async def sample():
            while not stop.is_set():
                samples.append((paged.allocator.blocks_in_use, orch.busy_slots))
                await asyncio.sleep(0.02)

        async def one(i, r):
            await asyncio.sleep(max(0.0, start + r.arrival - time.perf_counter()))
            handle = orch.submit(engine.request(r.token_ids, r.max_new_tokens), loop=loop)
            handles.append(handle)
            rec = records[i]
            async for event in handle.events():
                now = time.perf_counter()
                if isinstance(event, Piece) and event.token_ids:
                    if rec["first"] is None:
                        rec["first"] = now
                    rec["last"] = now
                    rec["tokens"] += len(event.token_ids)
                elif isinstance(event, Error):
                    rec["error"] = event.message

        start = time.perf_counter()
        sampler = asyncio.create_task(sample())
        tasks = [asyncio.create_task(one(i, r)) for i, r in enumerate(trace)]
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
        for task in done:  # a request refused by the engine (too long, say)
            if task.exception() is not None:
                refused.append(repr(task.exception()))
        for handle in handles:
            handle.cancel()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        stop.set()
        await sampler
        return start, bool(pending)

    start, cut = asyncio.run(drive())
    idle = wait_idle(engine)
    pool = {"pool_blocks": alloc.num_blocks, "block_tokens": engine.block_size}
    out = summarise(trace, records, start, samples, cut, pool)
    out["engine"] = dict(
        prefix_cache_hits=alloc.prefix_cache_hits - before["hits"],
        prefilled_tokens=paged.prefilled_tokens - before["prefilled"],
        chunks_mixed=paged.chunks_mixed - before["mixed"],
        chunks_alone=paged.chunks_alone - before["alone"],
        admission_waits=paged.waits - before["waits"],
        phase_seconds={k: round(v, 3) for k, v in engine.timer.seconds.items()},
        phase_counts=dict(engine.timer.counts),
        idle_after=idle,
        refused=len(refused),
        first_refusal=refused[0] if refused else None,
    )
    return out


# ---------------------------------------------------------------- transformers' continuous batching


class HFContinuousBatching:
    """transformers' `ContinuousBatchingManager` on `model` (a torch model), started and warmed
    up; `run(trace, deadline)` serves a trace, `close()` stops it."""

    def __init__(self, model, device: str, trace, tiny: bool):
        from transformers import ContinuousBatchingConfig, GenerationConfig

        try:
            from transformers.generation.continuous_batching.utils import WorkloadHints
        except ImportError:  # not in every version: the manager's own defaults
            WorkloadHints = None
        self.model = model
        self.attention = "paged|sdpa"
        if device == "cuda":
            try:
                import flash_attn  # noqa: F401

                self.attention = "paged|flash_attention_2"
            except ImportError:
                pass
        self.previous_attention = getattr(model.config, "_attn_implementation", "sdpa")
        model.set_attn_implementation(self.attention)
        config = GenerationConfig(
            do_sample=False,
            eos_token_id=-1,
            pad_token_id=0,
            max_new_tokens=max(r.max_new_tokens for r in trace),
        )
        sizes = {}
        if device != "cuda":  # no free-memory probe on a CPU
            longest = max(len(r.token_ids) + r.max_new_tokens for r in trace)
            sizes = dict(num_blocks=4 * len(trace) * -(-longest // 256), max_batch_tokens=512)
        hints = {}
        if WorkloadHints is not None:
            hints["workload_hints"] = WorkloadHints(
                max_prompt_length=max(len(r.token_ids) for r in trace),
                max_generated_length=max(r.max_new_tokens for r in trace),
                num_requests=len(trace),
            )
        t = time.perf_counter()
        self.manager = model.init_continuous_batching(
            generation_config=config,
            continuous_batching_config=ContinuousBatchingConfig(**sizes),
            **hints,
        )
        self.manager.warmup()
        self.warmup_s = time.perf_counter() - t
        self.manager.start()
        self.runs = 0

    def resolved_config(self) -> dict:
        config = getattr(self.manager, "continuous_batching_config", None)
        if config is None:
            return {}
        fields = getattr(config, "__dataclass_fields__", None) or vars(config)
        return {k: str(getattr(config, k, None)) for k in fields}

    def _blocks(self):
        processor = self.manager.batch_processor
        cache = getattr(processor, "cache", None)
        if cache is None:
            return None, None, None
        total = cache.num_blocks
        return total - cache.get_num_free_blocks(), total, getattr(cache, "block_size", None)

    def run(self, trace, deadline: float) -> dict:
        manager = self.manager
        self.runs += 1
        prefix = f"run{self.runs}-"
        records = [dict(first=None, last=None, tokens=0, error=None) for _ in trace]
        samples, pool = [], {}
        done = threading.Event()

        def sample():
            while not done.is_set():
                try:
                    used, total, size = self._blocks()
                    if used is not None:
                        state = manager.batch_processor.scheduler
                        active = len(getattr(state, "active_requests", ()) or ())
                        samples.append((used, active))
                        pool.update(pool_blocks=total, block_tokens=size)
                except Exception:  # read while its thread mutates it: skip the sample
                    pass
                time.sleep(0.02)

        def submit():
            for i, r in enumerate(trace):
                wait = start + r.arrival - time.perf_counter()
                if wait > 0 and done.wait(wait):
                    return
                manager.add_request(
                    list(r.token_ids),
                    request_id=f"{prefix}{i}",
                    max_new_tokens=r.max_new_tokens,
                    record_timestamps=True,
                    eos_token_id=-1,
                )

        start = time.perf_counter()
        threads = [threading.Thread(target=f, daemon=True) for f in (sample, submit)]
        for thread in threads:
            thread.start()
        results = {}
        while len(results) < len(trace) and time.perf_counter() < deadline:
            result = manager.get_result(timeout=0.2)
            if result is None:
                if not manager.is_running():
                    break
                continue
            if result.is_finished() and result.request_id.startswith(prefix):
                results[result.request_id] = result
        cut = len(results) < len(trace)
        done.set()
        for thread in threads:
            thread.join(timeout=5)
        if cut:  # the rest cancelled, and their results drained
            for i in range(len(trace)):
                if f"{prefix}{i}" not in results:
                    manager.cancel_request(f"{prefix}{i}")
            stop = time.perf_counter() + 30
            while manager.get_result(timeout=0.5) is not None and time.perf_counter() < stop:
                pass
        for i in range(len(trace)):
            result = results.get(f"{prefix}{i}")
            if result is None:
                continue
            rec, stamps = records[i], result.timestamps or []
            rec["tokens"] = len(result.generated_tokens)
            rec["error"] = result.error
            if stamps:
                rec["first"], rec["last"] = stamps[0], stamps[-1]
        return summarise(trace, records, start, samples, cut, pool)

    def close(self) -> None:
        try:
            self.manager.stop(block=True, timeout=30)
            self.manager.destroy()
        finally:
            self.model.set_attn_implementation(self.previous_attention)


# ---------------------------------------------------------------- speculative verification


def verify_costs(model, batches, positions, context: int, counts, repeats: int) -> dict:
    """ms per model call over `[B, k]` tokens for each `k` in `positions` (1 first: the plain
    step) and its ratio to `k = 1`, per batch `B`, over a cache holding `context` tokens: each
    call `n` times in one jitted `fori_loop` (the plan's XLA options), `(T(N2) - T(N1)) / (N2 -
    N1)` with `counts = (N1, N2)`, median of `repeats`."""
    options = dict(model.compiler_options)
    n1, n2 = counts

    def loop(model, cache, n, width):
        rows = cache.length.shape[0]
        ids = jnp.ones((rows, width), jnp.int32)

        def body(i, carry):
            cache, acc = carry
            pos = context + i * width + jnp.arange(width, dtype=jnp.int32)
            logits, cache = model(ids, jnp.broadcast_to(pos, (rows, width)), cache)
            return cache, acc + jnp.argmax(logits, axis=-1).sum()

        return jax.lax.fori_loop(0, n, body, (cache, jnp.int32(0)))[1]

    program = eqx.filter_jit(loop, compiler_options=options) if options else eqx.filter_jit(loop)
    prefill = eqx.filter_jit(lambda m, x, p, n: m.prefill(x, p, max_len=n)[1])
    out = {}
    for batch in batches:
        cache_len = context + n2 * max(positions) + 8
        ids = jnp.ones((batch, context), jnp.int32)
        pos = jnp.broadcast_to(jnp.arange(context, dtype=jnp.int32), ids.shape)
        cache = prefill(model, ids, pos, cache_len)
        times = {}
        for width in positions:
            for n in (n1, n2):
                jax.block_until_ready(program(model, cache, n, width))  # compile, warm
        for _ in range(repeats):
            for width in positions:
                for n in (n1, n2):
                    t = time.perf_counter()
                    jax.block_until_ready(program(model, cache, jnp.int32(n), width))
                    times.setdefault((width, n), []).append(time.perf_counter() - t)
        per_call = {
            w: (statistics.median(times[(w, n2)]) - statistics.median(times[(w, n1)])) / (n2 - n1)
            for w in positions
        }
        base = per_call[positions[0]]
        out[batch] = {
            w: {"ms": 1e3 * per_call[w], "x_plain": per_call[w] / base if base > 0 else math.nan}
            for w in positions
        }
        del cache
    return out


def measure_tokens_per_step(batches=(1, 8), positions=(4, 5, 8, 9), new_tokens=128, limit=None):
    """Tokens per target step of greedy prompt lookup with the real default model (SmolLM2-135M,
    float32, on the machine it runs on), every guess verified: `PromptLookup(num_tokens=k - 1,
    max_ngram_size=3, adaptive=False)` for each verify width `k` in `positions`, on
    `bench_speculative.GROUNDED` (24 prompts that rewrite, repeat or edit a given passage or
    code snippet, chat template), `new_tokens` at most (EOS ends a row), `batch` rows per call.

    **Returns:** `{(batch, k): {"tokens", "steps", "accepted", "proposed", "tokens_per_step",
    "acceptance", "seconds"}}`, sums over rows (a row's steps are its target calls)."""
    from bench_speculative import GROUNDED, run_ours

    model, tokenizer = fg.load_model()
    prompts = GROUNDED[:limit] if limit else GROUNDED
    systems = {
        k: fg.speculative.PromptLookup(num_tokens=k - 1, max_ngram_size=3, adaptive=False)
        for k in positions
    }
    out = {}
    for batch in batches:
        got = run_ours(model, tokenizer, prompts, batch, new_tokens, systems)
        for k, (tokens, seconds, accepted, proposed, steps) in got.items():
            out[(batch, k)] = dict(
                tokens=tokens,
                steps=steps,
                accepted=accepted,
                proposed=proposed,
                tokens_per_step=tokens / steps if steps else math.nan,
                acceptance=accepted / proposed if proposed else math.nan,
                seconds=seconds,
            )
            print(f"batch {batch}, {k} positions: {out[(batch, k)]}", flush=True)
    return out


def speculative_table(costs: dict, tokens_per_step: dict) -> list[dict]:
    """Rows `{batch, positions, verify_ms, plain_ms, cost, tokens_per_step, speedup}`: the
    speed-up is tokens per step / (the verify call's cost in plain steps)."""
    rows = []
    for batch, widths in costs.items():
        plain = widths.get(1, {}).get("ms")
        for k, c in widths.items():
            if k == 1:
                continue
            tps = tokens_per_step.get((int(batch), int(k)))
            rows.append(
                dict(
                    batch=int(batch),
                    positions=int(k),
                    verify_ms=c["ms"],
                    plain_ms=plain,
                    cost=c["x_plain"],
                    tokens_per_step=tps,
                    speedup=tps / c["x_plain"] if tps and c["x_plain"] > 0 else None,
                )
            )
    return rows


# ---------------------------------------------------------------- the run


def parse_tokens_per_step(values) -> dict:
    """`B:K=T` items (batch, verify positions, tokens per step) into `{(B, K): T}`."""
    out = dict(TOKENS_PER_STEP)
    for item in values or ():
        key, value = item.split("=")
        batch, k = key.split(":")
        out[(int(batch), int(k))] = float(value)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, help="a saved tokenizer folder")
    parser.add_argument(
        "--shapes", nargs="+", default=["llama-3.1-8b", "llama-3.2-1b"], choices=list(SHAPES)
    )
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--prefill-chunk", type=int, default=256, help="Engine(prefill_chunk=)")
    parser.add_argument(
        "--paged-attention",
        choices=("gather", "pallas"),
        help="our engine's ExecutionPlan.paged_attention (default: the plan's, pallas on a GPU; "
        "a kernel that fails to compile falls back to gather, noted in the JSON)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--moderate-rate",
        type=float,
        help="requests/s of the moderate run (default: half our saturated requests/s)",
    )
    parser.add_argument("--static-batch", type=int, default=64)
    parser.add_argument("--static-context", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, nargs=2, default=[16, 80], metavar=("N1", "N2"))
    parser.add_argument("--verify-positions", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--verify-batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--verify-context", type=int, default=1024)
    parser.add_argument("--verify-calls", type=int, nargs=2, default=[8, 40], metavar=("N1", "N2"))
    parser.add_argument(
        "--tokens-per-step",
        nargs="+",
        metavar="B:K=T",
        help="tokens per verify step at batch B over K positions (default: TOKENS_PER_STEP)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=470.0)
    parser.add_argument("--max-run-s", type=float, default=150.0, help="a trace run's longest")
    parser.add_argument("--only", nargs="+", choices=TASKS, help="run only these tasks")
    parser.add_argument("--no-hf", action="store_true", help="leave transformers out")
    parser.add_argument("--out", type=Path, default=Path("bench_serving_gpu_out"))
    parser.add_argument("--scratch", type=Path, help="where the checkpoints go (default: temp)")
    parser.add_argument(
        "--tiny", action="store_true", help="2-layer shapes, a short trace: a CPU test"
    )
    parser.add_argument(
        "--measure-tokens-per-step",
        action="store_true",
        help="measure TOKENS_PER_STEP with the default model here and exit",
    )
    args = parser.parse_args(argv)
    if args.measure_tokens_per_step:
        got = measure_tokens_per_step()
        print("TOKENS_PER_STEP = {")
        for (batch, k), v in got.items():
            print(f"    ({batch}, {k}): {v['tokens_per_step']:.3f},")
        print("}")
        return 0
    given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
    if args.tiny:  # everything short, unless asked for
        tiny = dict(
            shapes=["llama-3.2-1b"],
            requests=16,
            slots=4,
            static_batch=4,
            static_context=48,
            new_tokens=[4, 12],
            verify_context=48,
            repeats=1,
            budget_s=1800.0,
            max_run_s=300.0,
        )
        for name, value in tiny.items():
            if "--" + name.replace("_", "-") not in given:
                setattr(args, name, value)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    backend = jax.default_backend()
    plan = "gpu" if backend == "gpu" else "cpu"
    dtype = "bfloat16" if backend == "gpu" else "float32"
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="bench_serving_gpu_"))
    budget = Budget(args.budget_s)
    tokens_per_step = parse_tokens_per_step(args.tokens_per_step)
    scale = 0.05 if args.tiny else 1.0

    tokenizer_dir = args.tokenizer
    if tokenizer_dir is None:
        tokenizer_dir = scratch / "tokenizer"
        fg.load_model()[1].save_pretrained(tokenizer_dir)
    if args.tiny:
        shape = dict(prompt_lengths=(8, 64), output_lengths=(4, 16), system_length=32)
    else:
        shape = dict(prompt_lengths=(64, 2048), output_lengths=(32, 512), system_length=1024)
    trace = make_trace(args.requests, seed=args.seed, **shape)
    longest = max(len(r.token_ids) for r in trace)
    chunk = args.prefill_chunk

    def prefill_width(n):  # `Engine.prefill_width`: the cache slots a prompt of n tokens takes
        return -(-n // chunk) * chunk if n > chunk else bucket_length(n)

    max_len = prefill_width(longest) + shape["output_lengths"][1]
    max_len = -(-max_len // args.block_size) * args.block_size

    results = {
        "device": torch.cuda.get_device_name()
        if device == "cuda"
        else f"CPU ({os.cpu_count()} cores)",
        "jax": jax.__version__,
        "jax_backend": backend,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "plan": plan,
        "dtype": dtype,
        "tiny": args.tiny,
        "settings": vars(args) | {"out": str(args.out), "scratch": str(scratch)},
        "trace": dict(
            shape,
            requests=len(trace),
            shared=sum(r.shared for r in trace),
            prompt_tokens=sum(len(r.token_ids) for r in trace),
            output_tokens=sum(r.max_new_tokens for r in trace),
            seed=args.seed,
        ),
        "engine": dict(
            max_slots=args.slots,
            max_len=max_len,
            block_size=args.block_size,
            prefill_chunk=chunk,
            kv_cache_dtype=dtype,
        ),
        "tokens_per_step": {f"{b}:{k}": v for (b, k), v in tokens_per_step.items()},
        "shapes": {},
        "skipped": [],
        "errors": {},
        "compiles": {},
        "log": [],
    }

    def save():
        (args.out / "bench_serving_gpu.json").write_text(json.dumps(results, indent=1, default=str))

    print(
        f"{results['device']}, jax {jax.__version__} ({backend}), plan {plan!r}, torch "
        f"{torch.__version__}, transformers {results['transformers']}; trace {results['trace']}; "
        f"engine {results['engine']}; budget {args.budget_s:.0f} s",
        flush=True,
    )

    def run_shape(shape_name):
        """Every task of one shape, in priority order, within the budget."""
        entry = results["shapes"].setdefault(shape_name, {"label": SHAPES[shape_name]["label"]})
        held = {}  # this shape's torch model, our model, engine, transformers' manager
        big = 3.0 if "8b" in shape_name else 1.0

        def checkpoint():
            held["torch"] = make_checkpoint(
                shape_name, scratch / shape_name, tokenizer_dir, args.tiny, device
            )
            return "made"

        def load():
            held["ours"] = Ours(scratch / shape_name, plan, kv_cache_dtype=dtype, dtype=dtype)
            entry["ours"] = dict(
                weight_bytes=held["ours"].weight_bytes,
                kv_bytes_per_token=held["ours"].kv_bytes_per_token,
                notes=held["ours"].notes,
            )
            return f"{held['ours'].weight_bytes / 1e9:.2f} GB"

        def static(context=32, key="static"):
            ours = held["ours"]
            prompt = list(range(100, 100 + context))
            r = decode_times(ours, prompt, args.static_batch, args.new_tokens, args.repeats)
            r.pop("tokens_row0", None)
            entry[key] = r | {"batch": args.static_batch, "prompt_tokens": context}
            return f"B{args.static_batch} {r['tok_s']:,.0f} tok/s, {r['ms_step']:.2f} ms/step"

        def precompile():
            ours = held["ours"]
            if args.paged_attention and ours.model.plan.paged_attention != args.paged_attention:
                plan_now = ours.model.plan.replace(paged_attention=args.paged_attention)
                ours.model = ours.model.with_plan(plan_now)

            def build():
                return make_engine(
                    ours.model, ours.tokenizer, args.slots, max_len, args.block_size, dtype, chunk
                )

            engine = build()
            t = time.perf_counter()
            try:
                engine.precompile(progress=False)
            except Exception as error:  # the Pallas kernel did not compile: measure the gather
                if not ours.model.paged_decode:
                    raise
                entry["paged_attention_error"] = f"{type(error).__name__}: {error}"[:4000]
                print(f"  the Pallas paged attention failed ({entry['paged_attention_error'][:300]})"
                      "; the engine gathers instead", flush=True)  # fmt: skip
                ours.model = ours.model.with_plan(ours.model.plan.replace(paged_attention="gather"))
                engine = build()
                t = time.perf_counter()
                engine.precompile(progress=False)
            entry["paged_attention"] = ours.model.plan.paged_attention
            entry["precompile_s"] = time.perf_counter() - t
            start_engine(engine)
            held["engine"] = engine
            t, compiles = time.perf_counter(), COMPILES["count"]
            waves = [serve_ours(engine, wave, deadline()) for wave in warm_requests()]
            entry["ours warm-up"] = dict(
                requests=sum(w["requests"] for w in waves),
                exact=sum(w["finished_exact"] for w in waves),
                seconds=time.perf_counter() - t,
                compiles=COMPILES["count"] - compiles,
            )
            return (
                f"{entry['precompile_s']:.1f} s, then a warm-up of "
                f"{entry['ours warm-up']['requests']} requests "
                f"(one per prefill kind) {entry['ours warm-up']['seconds']:.1f} s, "
                f"{entry['ours warm-up']['compiles']} compilations"
            )

        def warm_requests():  # the same for both systems, by ours' prefill widths
            return warm_up_requests(trace, shape["system_length"], prefill_width, args.seed)

        def deadline():
            return min(budget.start + budget.seconds, time.perf_counter() + args.max_run_s)

        def moderate_rate():
            if args.moderate_rate:
                return args.moderate_rate, "--moderate-rate"
            sat = entry.get("ours saturated", {})
            rps = sat.get("requests_per_s")
            if not rps or not math.isfinite(rps):
                raise RuntimeError(
                    "no saturated run of ours to set the rate from (--moderate-rate)"
                )
            return rps / 2, f"half ours' saturated {rps:.2f} requests/s"

        def run_ours(rate_name):
            if rate_name == "saturated":
                run_trace, rate, why = trace, math.inf, "all at t=0"
            else:
                rate, why = moderate_rate()
                run_trace = with_poisson_arrivals(trace, rate, args.seed)
            r = serve_ours(held["engine"], run_trace, deadline())
            entry[f"ours {rate_name}"] = r | {"rate": rate, "rate_from": why}
            return line(r)

        def run_hf(rate_name):
            if "hf" not in held:
                held["hf"] = HFContinuousBatching(held["torch"], device, trace, args.tiny)
                t = time.perf_counter()
                waves = [held["hf"].run(wave, deadline()) for wave in warm_requests()]
                entry["hf-cb"] = dict(
                    warmup_s=held["hf"].warmup_s,
                    attention=held["hf"].attention,
                    config=held["hf"].resolved_config(),
                    warm_up_requests=sum(w["requests"] for w in waves),
                    warm_up_s=time.perf_counter() - t,
                )
            if rate_name == "saturated":
                run_trace, rate, why = trace, math.inf, "all at t=0"
            else:
                rate, why = moderate_rate()
                run_trace = with_poisson_arrivals(trace, rate, args.seed)
            r = held["hf"].run(run_trace, deadline())
            entry[f"hf-cb {rate_name}"] = r | {"rate": rate, "rate_from": why}
            return line(r)

        def verify():
            costs = verify_costs(
                held["ours"].model,
                args.verify_batches,
                sorted(set([1] + args.verify_positions)),
                args.verify_context,
                args.verify_calls,
                max(args.repeats, 3),
            )
            entry["verify"] = {str(b): {str(k): v for k, v in c.items()} for b, c in costs.items()}
            entry["speculative"] = speculative_table(costs, tokens_per_step)
            return "; ".join(
                f"B{b} " + ", ".join(f"k{k} {v['x_plain']:.2f}x" for k, v in c.items() if k != 1)
                for b, c in costs.items()
            )

        tasks = [
            ("checkpoint", 40 * big, checkpoint),
            ("load", 30 * big, load),
            ("static", 30 * big, static),
            ("precompile", 60 * big, precompile),
            ("ours saturated", 40, lambda: run_ours("saturated")),
            ("hf-cb saturated", 60, lambda: run_hf("saturated")),
            ("verify", 30 * big, verify),
            ("ours moderate", 40, lambda: run_ours("moderate")),
            ("hf-cb moderate", 40, lambda: run_hf("moderate")),
            ("static long", 30 * big, lambda: static(args.static_context, "static long")),
        ]
        needs = {  # what a task cannot run without
            "load": "torch",
            "static": "ours",
            "precompile": "ours",
            "ours saturated": "engine",
            "ours moderate": "engine",
            "verify": "ours",
            "static long": "ours",
            "hf-cb saturated": "torch",
            "hf-cb moderate": "torch",
        }
        for name, reserve, fn in tasks:
            label = f"{shape_name}: {name}"
            if args.only and name not in args.only and name not in ("checkpoint", "load"):
                continue
            if args.no_hf and name.startswith("hf-cb"):
                continue
            if needs.get(name) and needs[name] not in held:
                results["skipped"].append(f"{label} (needs {needs[name]})")
                continue
            if not budget.fits(reserve * scale):
                results["skipped"].append(f"{label} (time budget)")
                print(f"[{budget.elapsed():6.1f} s] {label}: skipped (time budget)", flush=True)
                continue
            t, compiles = time.perf_counter(), dict(COMPILES)
            try:
                said = fn()
            except Exception as e:  # recorded; the run goes on
                said = f"FAILED {type(e).__name__}: {str(e)[:300]}"
                results["errors"][label] = traceback.format_exc()[-3000:]
            n = COMPILES["count"] - compiles["count"]
            spent = COMPILES["seconds"] - compiles["seconds"]
            results["compiles"][label] = dict(count=n, seconds=spent)
            text = (
                f"[{budget.elapsed():6.1f} s] {label}: {said} ({time.perf_counter() - t:.1f} s; "
                f"{n} compilations, {spent:.1f} s)"
            )
            results["log"].append(text)
            print(text, flush=True)
            save()
        for key in ("hf", "engine"):
            if key in held:
                try:
                    held[key].close()
                except Exception as e:
                    results["errors"][f"{shape_name}: closing {key}"] = repr(e)
        held.clear()
        gc.collect()
        jax.clear_caches()
        if device == "cuda":
            torch.cuda.empty_cache()

    for shape_name in args.shapes:
        run_shape(shape_name)
    results["total_s"] = budget.elapsed()
    save()
    text = report(results)
    (args.out / "bench_serving_gpu.md").write_text(text + "\n")
    print(text, flush=True)
    if not args.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def line(r: dict) -> str:
    """One run in a log line."""
    t = r["ttft_s"]
    return (
        f"{r['tok_s']:,.0f} tok/s, TTFT p50 {t['all']['p50']:.3f} s (cold {t['cold']['p50']:.3f},"
        f" shared {t['shared']['p50']:.3f}), ITL p50 {r['itl_ms']['p50']:.1f} ms, "
        f"{r['finished_exact']}/{r['requests']} exact" + (" CUT" if r["cut_short"] else "")
    )


def report(results: dict) -> str:
    """The markdown tables: one row per shape x system x rate, then the ratios, then the
    speculative composition."""
    tr = results["trace"]
    lines = [
        "",
        f"{results['device']}; jax {results['jax']} ({results['jax_backend']}), plan "
        f"{results['plan']!r}, {results['dtype']} weights and KV cache; torch {results['torch']}, "
        f"transformers {results['transformers']}",
        f"Trace: {tr['requests']} requests ({tr['shared']} sharing a {tr['system_length']}-token "
        f"system prompt), prompts {tr['prompt_lengths'][0]}-{tr['prompt_lengths'][1]} tokens, "
        f"outputs {tr['output_lengths'][0]}-{tr['output_lengths'][1]} ({tr['output_tokens']:,} "
        f"output tokens), seed {tr['seed']}; greedy, EOS off. Ours: {results['engine']}.",
        "",
        "| shape | system | rate (req/s) | output tok/s | TTFT p50 / p99 (s) | TTFT p50 cold / "
        "cold long / shared (s) | shared / cold | ITL p50 / p99 (ms) | blocks in use max / mean "
        "(pool; tokens per block) | exact |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios, spec, notes = [], [], []
    f = lambda x, spec=".3f": "-" if x is None or not math.isfinite(x) else format(x, spec)  # noqa: E731
    for e in results["shapes"].values():
        for system in ("ours", "hf-cb"):
            for rate_name in ("saturated", "moderate"):
                r = e.get(f"{system} {rate_name}")
                if not r:
                    continue
                t, b = r["ttft_s"], r["blocks_in_use"]
                cold, shared = t["cold"]["p50"], t["shared"]["p50"]
                rate = "inf" if r["rate"] == math.inf else f"{r['rate']:.2f}"
                lines.append(
                    f"| {e['label']} | {system} | {rate} | {f(r['tok_s'], ',.0f')} | "
                    f"{f(t['all']['p50'])} / {f(t['all']['p99'])} | {f(cold)} / "
                    f"{f(t['cold_long']['p50'])} / {f(shared)} | "
                    f"{f(shared / cold if cold else None, '.2f')} | {f(r['itl_ms']['p50'], '.1f')} / "
                    f"{f(r['itl_ms']['p99'], '.1f')} | {b['max']} / {f(b['mean'], '.0f')} "
                    f"({b.get('pool_blocks')}; {b.get('block_tokens')}) | "
                    f"{r['finished_exact']}/{r['requests']}"
                    + (" cut" if r["cut_short"] else "")
                    + " |"
                )
                if r["rate_from"] != "all at t=0":
                    notes.append(f"- {e['label']} {system} moderate rate: {r['rate_from']}")
        sat = e.get("ours saturated")
        for key, what in (("static", "32-token prompt"), ("static long", "long prompt")):
            s = e.get(key)
            if sat and s:
                ratios.append(
                    f"- {e['label']}: ours saturated / static B{s['batch']} decode ({what}, "
                    f"{s['prompt_tokens']} tokens: {s['tok_s']:,.0f} tok/s) = "
                    f"{sat['tok_s'] / s['tok_s']:.2f}"
                )
        for rate_name in ("saturated", "moderate"):
            a, c = e.get(f"ours {rate_name}"), e.get(f"hf-cb {rate_name}")
            if a and c:
                ratios.append(
                    f"- {e['label']} {rate_name}: ours / transformers' continuous batching = "
                    f"{a['tok_s'] / c['tok_s']:.2f}x tokens/s; TTFT p50 theirs / ours "
                    f"{c['ttft_s']['all']['p50'] / a['ttft_s']['all']['p50']:.2f}x"
                )
        if e.get("precompile_s") is not None:
            notes.append(f"- {e['label']}: engine.precompile() {e['precompile_s']:.1f} s")
        if e.get("hf-cb"):
            notes.append(
                f"- {e['label']}: transformers warmup {e['hf-cb']['warmup_s']:.1f} s, attention "
                f"{e['hf-cb']['attention']!r}"
            )
        for row in e.get("speculative", []):
            spec.append(
                f"| {e['label']} | {row['batch']} | {row['positions']} | {f(row['verify_ms'])} | "
                f"{f(row['plain_ms'])} | {f(row['cost'], '.2f')} | {f(row['tokens_per_step'], '.2f')} "
                f"| {f(row['speedup'], '.2f')} |"
            )
    for label, c in results.get("compiles", {}).items():
        if label.endswith(("saturated", "moderate")):
            notes.append(
                f"- {label}: {c['count']} XLA compilations during the run ({c['seconds']:.1f} s)"
            )
    for e in results["shapes"].values():
        if e.get("ours warm-up"):
            w = e["ours warm-up"]
            notes.append(
                f"- {e['label']}: warm-up before the timed runs, {w['requests']} requests (one per "
                f"prefill kind, 2 tokens each), {w['seconds']:.1f} s, {w['compiles']} compilations"
            )
    lines += ["", "Ratios:", *ratios]
    if spec:
        lines += [
            "",
            "Speculative decoding: speed-up = tokens per verify step (prompt lookup, every guess "
            "verified, greedy, grounded prompts, the real SmolLM2-135M on a CPU: device-"
            "independent) / verify cost (the call over k positions in plain steps, this device)",
            "",
            "| shape | batch | k positions | verify ms | plain ms | cost (x plain) | tokens / step | "
            "speed-up |",
            "|---|---|---|---|---|---|---|---|",
            *spec,
        ]
    if notes:
        lines += ["", "Notes:", *notes]
    if results["skipped"]:
        lines += ["", "Skipped: " + "; ".join(results["skipped"])]
    if results["errors"]:
        lines += ["", "Failed: " + "; ".join(results["errors"])]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
