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
