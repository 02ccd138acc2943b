# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Serving many callers: continuous batching
#
# `fg.generate` runs one batch until its longest row ends: a second caller waits, and a row that
# finishes early leaves its place in the batch idle. A server batches **continuously** instead:
# the batch is a fixed number of [**slots**](../../concepts/wording/#slot), and a request enters a slot as soon as one frees.
# This notebook:
#
# - draws slot occupancy over time for static and continuous batching on the same requests;
# - runs the engine's three pure functions (`prefill`, `insert`, `generate`) on a toy model;
# - keeps the KV cache in blocks (a paged cache): the blocks a trace of requests holds against
#   a reservation per slot, a shared system prompt taken from the prefix cache, and a pool too
#   small for every request, where requests are preempted and resumed with the same tokens;
# - streams a few requests at once through the real engine (`engine.stream`), as the
#   OpenAI-compatible server (`functional-gen serve`) does, and draws their timeline.
#
# **Before this:** [The KV cache and resumable generation](../kv_cache/) (prefill and decode, a
# cache per row and what it costs in memory) and [Sampling](../sampling/) (per-request
# temperature and `top_p`); [Speculative decoding](../speculative_decoding/) comes just before
# it. Terms are defined on [Words we use](../../concepts/wording/).

# %%
import asyncio
import concurrent.futures
import time

import jax
import matplotlib.pyplot as plt
import numpy as np

import functional_gen as fg
from functional_gen.testing import tiny_config

# %% [markdown]
# ## Static and continuous batching on one request trace
#
# Twelve requests arrive over time, each wanting a different number of tokens. With **static**
# batching the server takes up to 4 waiting requests, runs them until the longest is done, then
# takes the next ones. With **continuous** batching each of the 4 slots takes the next waiting
# request the step after its own request ends. One decode step produces one token per busy
# slot; we count steps, not seconds.

# %%
rng = np.random.default_rng(0)
arrivals = np.sort(rng.integers(0, 40, size=12))
lengths = rng.integers(5, 40, size=12)
SLOTS = 4


def simulate(continuous: bool):
    """Slot occupancy `[slots, steps]` (request index or -1) and each request's finish step."""
    waiting, slots, remaining = list(range(12)), [-1] * SLOTS, {}
    grid, finish, t = [], {}, 0
    while len(finish) < 12:
        arrived = [r for r in waiting if arrivals[r] <= t]
        if continuous or all(s == -1 for s in slots):
            for i in range(SLOTS):
                if slots[i] == -1 and arrived:
                    r = arrived.pop(0)
                    waiting.remove(r)
                    slots[i], remaining[r] = r, lengths[r]
        grid.append(list(slots))
        for i, r in enumerate(slots):
            if r >= 0:
                remaining[r] -= 1
                if remaining[r] == 0:
                    finish[r], slots[i] = t, -1
        t += 1
    return np.array(grid).T, finish


fig, axes = plt.subplots(2, 1, figsize=(10, 4), sharex=True)
for ax, continuous in zip(axes, (False, True)):
    grid, finish = simulate(continuous)
    shown = np.ma.masked_where(grid < 0, grid)
    ax.imshow(shown, aspect="auto", cmap="tab20", interpolation="nearest")
    busy = (grid >= 0).mean()
    latency = np.mean([finish[r] - arrivals[r] for r in range(12)])
    name = "continuous" if continuous else "static"
    ax.set_title(
        f"{name}: {grid.shape[1]} steps, slots busy {busy:.0%}, mean latency {latency:.0f}"
    )
    ax.set_ylabel("slot")
axes[1].set_xlabel("decode step (colour = request)")
plt.tight_layout()

# %% [markdown]
# The static batch waits for its longest request while the other slots stay empty (white);
# continuous batching fills them, so the same trace ends sooner and each request waits less.
#
# ## The engine's three functions, on a toy model
#
# `fg.serving.Engine` follows [JetStream's design](../../concepts/wording/#jetstream) (Google's JAX inference server):
# three pure functions, so that prefill and decode can be scheduled, batched and even run on
# different devices independently. `prefill(request)` runs one prompt and returns
# a `Prefix` (its KV cache, next-token logits, sampling parameters and key); `insert(prefix,
# decode_state, slot)` writes it into one slot of the decode state; `generate(decode_state,
# num_steps)` advances every busy slot by up to `num_steps` tokens in one compiled
# `while_loop` and returns the tokens as `[num_steps, slots]` (-1 where a slot took none). All
# three are jitted and [donate](../../concepts/wording/#donate) the decode state: XLA writes the new state into the
# old one's buffers in place instead of allocating a second copy of every slot's KV cache (the
# old state must not be used afterwards, which is why each call returns the new one). A tiny random model (2 layers, 101 tokens) makes
# every call instant; it needs no tokenizer for these three.

# %%
tiny = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(0), std=0.2)
# 4 slots, every dispatch over all of them (`decode_widths=()`: see "Narrow dispatches" below)
engine = fg.serving.Engine(tiny, None, max_slots=4, max_len=48, num_steps=4, decode_widths=())
state = engine.init_decode_state()
state = engine.insert(engine.prefill(engine.request([5, 17, 42], 6)), state, slot=0)
state = engine.insert(engine.prefill(engine.request([8, 9], 10, temperature=1.0, seed=1)), state, 2)
for dispatch in range(3):
    state, out = engine.generate(state)
    print(f"dispatch {dispatch}:\n{np.asarray(out.token_ids)}  done={np.asarray(out.done)}")

# %% [markdown]
# Slots 1 and 3 are idle (they were never filled: their columns are -1). Slots 0 and 2 end on their own, each
# at its `max_new_tokens` or at an EOS token, while the other goes on: a freed slot could take a
# new request at the next dispatch, without waiting for the rest. Each slot carries its own
# temperature, `top_p`, penalties, seed and `max_new_tokens`, so the rows never influence each
# other: a request gets the same tokens in any slot, next to any other requests.
#
# ### Narrow dispatches
#
# On a CPU a decode step over 8 rows costs about 2x (float32) to 4x (int8) a step over one row
# (SmolLM2-135M; `benchmarks/bench_decode_widths.py`), so a request alone in an 8-slot engine
# would pay for 7 idle rows. An engine of 4 slots or more therefore also compiles narrower
# programs (`decode_widths`, default the powers of two below `max_slots`: 1, 2, 4 for 8 slots):
# when the busy slots fit a narrower width, `generate` gathers their rows into a state of that
# width, runs it and writes them back. The output keeps every slot's column, and the tokens are
# those of the full-width program (checked below on the toy model; on real models they can
# differ only where float rounding moves a near tie).

# %%
wide = engine  # the engine above: 4 slots, no narrower programs
narrow = fg.serving.Engine(tiny, None, max_slots=4, max_len=48, num_steps=4)
print("decode widths:", wide.decode_widths, narrow.decode_widths)
columns = {}
for name, eng in (("all 4 rows", wide), ("1 row", narrow)):
    state = eng.insert(eng.prefill(eng.request([5, 17, 42], 6)), eng.init_decode_state(), slot=2)
    state, out = eng.generate(state)
    columns[name] = np.asarray(out.token_ids)
    print(f"{name}:\n{columns[name]}")
assert (columns["all 4 rows"] == columns["1 row"]).all()

# %% [markdown]
# ## A paged KV cache
#
# The engines above give every slot a [KV cache](../../concepts/wording/#kv-cache) row of
# `max_len` positions, whether its request uses 6 of them or all: the cache is `max_slots x
# max_len` from the start. `Engine(..., block_size=8)` keeps the keys and values in **blocks**
# of 8 positions instead, one pool of blocks per layer, as vLLM does (PagedAttention): each
# slot has a block table (its positions' blocks, in order), a request takes blocks as it grows
# and gives them back when it ends. A caller of the three functions makes three calls more:
# `admit` takes a request's blocks before its `prefill` (`None`: the pool is full, the request
# waits), `release` returns them when it ends, and `make_room` before each `generate` gives the
# busy slots their next blocks (it matters when the pool is small, below). `serve` drives a
# trace of requests through those calls, first come first served, as the server's loop does,
# and records after each dispatch how many blocks are in use.


# %%
def serve(engine, trace):
    """Run `trace` (`(dispatch, request)`: the request arrives before that dispatch) through a
    paged engine. **Returns:** per request its tokens; per dispatch the blocks in use and the
    busy slots; the dispatches at which a request was preempted."""
    state = engine.init_decode_state()
    queue, running, got = [], {}, {i: [] for i in range(len(trace))}
    blocks, busy, preempted = [], [], []
    dispatch = 0
    while dispatch <= max(d for d, _ in trace) or queue or running:
        queue += [(i, r) for i, (d, r) in enumerate(trace) if d == dispatch]
        while queue and len(running) < engine.max_slots:  # admit into free slots, in order
            slot = min(set(range(engine.max_slots)) - set(running))
            i, request = queue[0]
            admission = engine.admit(request, slot)
            if admission is None:  # no blocks for it now: it waits at the head of the queue
                break
            state = engine.insert(engine.prefill(request, admission, state), state, slot)
            running[slot] = queue.pop(0)[0]
        state, preemptions = engine.make_room(state)
        for p in preemptions:  # (see "Preemption" below) back to the front of the queue
            queue.insert(0, (running.pop(p.slot), p.request))
            preempted.append(dispatch)
        state, out = engine.generate(state)
        blocks.append(engine.paged.allocator.blocks_in_use)
        busy.append(len(running))
        for slot, i in list(running.items()):
            got[i] += [t for t in out.token_ids[:, slot].tolist() if t >= 0]
            if bool(out.done[slot]):
                del running[slot]
                engine.release(slot)
        dispatch += 1
    return [got[i] for i in range(len(trace))], np.array(blocks), np.array(busy), preempted


def alone(ids, max_new_tokens, temperature=None, seed=0):
    """`fg.generate`'s tokens for the prompt `ids` alone (sampled with `key(seed)` when
    `temperature` is given). Always 40 new tokens, cut to `max_new_tokens` (one compiled program
    for every request: the first tokens of a longer run are those of a shorter one)."""
    state = fg.SequenceState.from_token_ids([list(ids)], vocab_size=tiny.vocab_size)
    sampling = {} if temperature is None else dict(temperature=temperature, do_sample=True)
    out = fg.generate(tiny, None, state, max_new_tokens=40, key=jax.random.key(seed), **sampling)
    k = int(out.state.arrays.length[0]) - len(ids)  # up to its EOS, if it took one
    return [int(t) for t in out.token_ids[0, : min(k, max_new_tokens)]]


# %% [markdown]
# The trace is the twelve requests of the first plot (their arrival step and length), with
# prompts of 2 to 8 random tokens; every third request samples at temperature 1 with a seed of
# its own. The paged engine has 4 slots of 64 positions (8 blocks each) and a pool of 16
# blocks, half of what the 4 slots' `max_len` would take (`num_blocks`; by default the pool
# holds them all). Each request's tokens are those of `fg.generate` on its prompt alone.

# %%
paged = fg.serving.Engine(
    tiny, None, max_slots=4, max_len=64, num_steps=4, block_size=8, num_blocks=16
)
prompts = [rng.integers(2, 100, rng.integers(2, 9)).tolist() for _ in range(12)]
knobs = [dict(temperature=1.0, seed=i) if i % 3 == 2 else {} for i in range(12)]
trace = [
    (int(a) // paged.num_steps, paged.request(p, int(n), **k))  # arrival step -> dispatch
    for a, p, n, k in zip(arrivals, prompts, lengths, knobs)
]
tokens, blocks, busy, preempted = serve(paged, trace)
longest = [alone(p, 40, **k) for p, k in zip(prompts, knobs)]  # (used again below)
assert tokens == [full[:n] for full, n in zip(longest, lengths)]
assert not preempted  # this trace fits the pool (see "Preemption" below for one that does not)
print("pool:", paged.paged.allocator.num_blocks, "blocks of", paged.block_size, "positions")
print("tokens equal fg.generate alone for all", len(tokens), "requests")

# %% [markdown]
# How many blocks that trace held, dispatch by dispatch, against what the same busy slots
# would hold if each reserved its worst case (`max_len`: 8 blocks per busy slot), and what
# the engines above hold all the time (`max_slots x max_len`, 32 blocks' worth):

# %%
per_slot = paged.max_len // paged.block_size
fig, ax = plt.subplots(figsize=(10, 3))
ax.axhline(paged.max_slots * per_slot, color="grey", ls=":", label="max_slots x max_len")
ax.step(range(len(blocks)), busy * per_slot, where="post", label="busy slots x max_len")
ax.step(range(len(blocks)), blocks, where="post", label="paged: blocks in use")
ax.set_ylim(0, paged.max_slots * per_slot + 2)
ax.set_xlabel("dispatch (4 decode steps)")
ax.set_ylabel("blocks of 8 positions")
ax.set_title("KV cache held for the same twelve requests")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
plt.tight_layout()
plt.show()
print(
    f"paged: {blocks.mean():.1f} blocks on average, worst-case reservation: "
    f"{(busy * per_slot).mean():.1f}"
)

# %% [markdown]
# The paged cache holds what the requests have written (rounded up to a block) plus the next
# dispatch's room: here about 40% of what a reservation of `max_len` per busy slot would hold,
# and never more than the 16 blocks of its pool, where those reservations would need 32. In the
# same memory, more than twice as many requests can run. On the CPU each dispatch gathers
# the busy slots' blocks into a contiguous cache and scatters the new keys back; a
# paged-attention kernel that reads the blocks in place is the GPU's next step (see [the
# serving page](../../serving/#paged-kv-cache)).
#
# ### Prefix caching
#
# Requests to one application often start with the same system prompt. A full block is keyed
# by the hash of its tokens and of every block before it (vLLM's hash chain), so a later prompt
# that starts with the same blocks takes them by reference: their keys and values are not
# computed again, only the rest of the prompt is prefilled. Blocks nobody uses stay cached until
# the pool needs them, least recently used first. Six requests share a 24-token system prompt
# (3 blocks) and differ after it:

# %%
system = rng.integers(2, 100, 24).tolist()
questions = [rng.integers(2, 100, rng.integers(3, 8)).tolist() for _ in range(6)]
hits, prefilled = paged.paged.allocator.prefix_cache_hits, paged.paged.prefilled_tokens
shared = [(i, paged.request(system + q, 8)) for i, q in enumerate(questions)]
tokens, _, _, _ = serve(paged, shared)
assert tokens == [alone(system + q, 8) for q in questions]
prompt_tokens = sum(len(system) + len(q) for q in questions)
print("prefix-cache hits (blocks):", paged.paged.allocator.prefix_cache_hits - hits)
print(f"prompt tokens prefilled: {paged.paged.prefilled_tokens - prefilled} of {prompt_tokens}")

# %% [markdown]
# The first request computes the system prompt; each of the five after it takes its 3 blocks
# from the cache (15 hits) and prefills only its own few tokens, and the tokens are still those
# of `fg.generate` alone. (A prompt's last token is always computed, for its next-token
# logits.) A long prompt whose uncached part exceeds `prefill_chunk` is prefilled chunk by
# chunk straight into its blocks, each chunk inside the next decode dispatch of the other slots
# (chunked prefill; the same tokens again).
#
# ### Preemption: when the pool runs out
#
# Taking blocks as requests grow lets the pool be smaller than `max_slots x max_len`, as this
# one is; then requests can outgrow it. With `block_size` the engine **preempts** by default
# (`Engine(preemption=True)`, vLLM's recompute preemption). A request is admitted when its
# prompt's blocks and one dispatch of growth fit; before each dispatch `make_room` gives every
# busy slot its next blocks, oldest request first, and when the pool runs out it preempts the
# most recently admitted request: its full blocks go to the prefix cache, all its blocks are
# freed, and it comes back as a request to queue again at the front, its prompt followed by
# the tokens it had generated (with its PRNG key and step count). Readmitted, it takes back the
# blocks still cached, prefills the rest and goes on where it stopped. The twelve prompts
# again, all arriving at once this time and each asking for 40 tokens (5 to 6 blocks each):

# %%
preemptions = paged.paged.preemptions
burst = [(0, paged.request(p, 40, **k)) for p, k in zip(prompts, knobs)]
tokens, blocks, busy, preempted = serve(paged, burst)
assert tokens == longest  # sampled requests too: each resumes with its own key
print("preemptions:", paged.paged.preemptions - preemptions, "at dispatches", preempted)

pool = paged.paged.allocator.num_blocks
fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 4), sharex=True, height_ratios=(2, 1))
top.axhline(pool, color="grey", ls=":", label="pool")
top.step(range(len(blocks)), blocks, where="post", color="tab:orange", label="blocks in use")
top.plot(preempted, [pool + 1] * len(preempted), "v", color="tab:red", label="a preemption")
top.set_ylim(0, pool + 2.5)
top.set_ylabel("blocks")
top.set_title(f"Twelve requests at once in {pool} blocks: preempted and resumed")
top.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
bottom.step(range(len(busy)), busy, where="post", color="tab:green")
bottom.set_ylim(0, paged.max_slots + 0.5)
bottom.set_ylabel("busy slots")
bottom.set_xlabel("dispatch (4 decode steps)")
plt.tight_layout()
plt.show()

# %% [markdown]
# The pool stays nearly full; requests that do not fit wait, or are preempted and recomputed
# later, yet every request's tokens, the sampled ones included, equal `fg.generate` alone.
# Without preemption (`Engine(preemption=False)`) each admission would reserve its worst case
# (prompt plus `max_new_tokens`) and wait until that fits: never preempted, fewer requests
# running at once. A request that could not fit even alone (more blocks than the whole pool)
# is refused when it is made. A direct user of `admit` / `generate`, as `serve` is, must call
# `make_room` before each `generate` and queue what it hands back (`generate` raises when a
# slot cannot get its blocks); the orchestrator behind `engine.stream` and the server does it.


# %% [markdown]
# ## Streams on the real engine
#
# `engine.stream(prompt, options)` is an async generator of text pieces. Behind it, one thread
# owns the device: it admits queued requests into free slots (long prompts prefilled in chunks
# between decode dispatches), runs `generate`, and hands each request its pieces (never half a
# UTF-8 character, stop strings cut on the host). Three requests with different options run
# concurrently here on 2 slots, so the third starts when the first slot frees.

# %%
model, tokenizer = fg.load_model()
real = fg.serving.Engine(model, tokenizer, max_slots=2, max_len=96)
requests = [
    ("The capital of France is", fg.GenerationOptions(max_new_tokens=8)),
    ("Once upon a time", fg.GenerationOptions(max_new_tokens=16, temperature=0.8, top_p=0.9)),
    # prompts of one length bucket share the engine's prefill program (one compilation)
    ("My favourite fruit is", fg.GenerationOptions(max_new_tokens=12)),
]


async def collect(i, prompt, options, events):
    events.append((time.perf_counter(), i, "arrival"))
    pieces = []
    async for piece in real.stream(prompt, options, seed=i):
        events.append((time.perf_counter(), i, "piece"))
        pieces.append(piece)
    return "".join(pieces)


async def main():
    # a first round compiles the engine's programs (prefill buckets, decode widths); the
    # timeline below is the second round's, as a warm server would serve it
    await asyncio.gather(*(collect(i, p, o, []) for i, (p, o) in enumerate(requests)))
    events = []
    texts = await asyncio.gather(*(collect(i, p, o, events) for i, (p, o) in enumerate(requests)))
    return texts, events


# (a notebook already runs an event loop: run ours in a thread)
with concurrent.futures.ThreadPoolExecutor(1) as pool:
    texts, events = pool.submit(asyncio.run, main()).result()
for (prompt, _), text in zip(requests, texts):
    print(repr(prompt), "->", repr(text))

# %% [markdown]
# The timeline of those events: one bar per request from its arrival to its last piece, the
# first piece (the time to first token) marked. All three arrive together; the third waits
# for a free slot, and its first token comes only after one of the first two has finished.

# %%
t0 = min(t for t, _, _ in events)
fig, ax = plt.subplots(figsize=(9, 2.6))
for i in range(len(requests)):
    arrival = min(t for t, r, kind in events if r == i and kind == "arrival") - t0
    pieces = [t - t0 for t, r, kind in events if r == i and kind == "piece"]
    ax.barh(i, max(pieces) - arrival, left=arrival, color="tab:blue", alpha=0.35)
    ax.plot(pieces, [i] * len(pieces), "|", color="tab:blue", ms=10)
    ax.plot(min(pieces), i, "o", color="tab:red", label="first token" if i == 0 else None)
ax.set_yticks(range(len(requests)), [f"request {i}" for i in range(len(requests))])
ax.invert_yaxis()
ax.set_xlabel("seconds since the first arrival (ticks: pieces of text)")
ax.set_title("Three requests on 2 slots")
ax.legend(loc="upper right")
plt.show()
finished = [max(t for t, r, kind in events if r == i and kind == "piece") - t0 for i in (0, 1)]
third_first = min(t for t, r, kind in events if r == 2 and kind == "piece") - t0
print(f"requests 0 and 1 finished at {finished[0]:.2f} s and {finished[1]:.2f} s")
print(f"request 2's first piece at {third_first:.2f} s")

# %% [markdown]
# Each text is the one `fg.generate` gives for the same prompt and options (with
# `key=jax.random.key(seed)`): the engine computes a request as a one-prompt call would
# (`tests/serving` checks this, and that a request's tokens do not depend on its neighbours).

# %%
real.close()

# %% [markdown]
# The HTTP server wraps this engine: `functional-gen serve` (see the serving page of the docs)
# answers OpenAI's `/v1/completions` and `/v1/chat/completions`, so any OpenAI client can use it.

# %% [markdown]
# ## Next
#
# [Accelerators](../accelerators/): the same engine and generation loop on a GPU, and what
# changes there.
