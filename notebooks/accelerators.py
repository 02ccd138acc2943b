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
# # Accelerators: what a decode step costs
#
# **Before this:** [The KV cache and resumable generation](../kv_cache/) (what a decode step
# reads: the weights and every row's cache) and [Serving many callers](../serving/) (many rows
# in one step). Terms are defined on [Words we use](../../concepts/wording/).
#
# A decode step makes one token per row. On a GPU its time is set by three things, in this
# order of likelihood: the **bytes** it must read (every weight once, plus each row's KV cache),
# the **launches** (each kernel costs a few microseconds to start), and the **host round
# trips** (a conditional or a loop test that the GPU must hand back to the CPU to decide). This
# notebook:
#
# - counts the bytes of one decode step of the default model, from the loaded model itself;
# - counts the products and the conditionals in the program of one step under the CPU plan and
#   the GPU plan of the same model (`fg.models.ExecutionPlan`);
# - draws the roofline of batch size against tokens/s from the measurements on one H200, with
#   the bandwidth bound;
# - says why the two plans differ;
# - reads the serving engine's paged KV cache through its block tables with the GPU plan's
#   Pallas kernel (interpreted on the CPU) and checks it against the contiguous cache.
#
# Everything here runs on a CPU: the GPU plan is traced, not run (the paged-attention kernel
# runs in Pallas's interpret mode).

# %%
import collections

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr

import functional_gen as fg

# %% [markdown]
# ## The bytes of one step
#
# At batch 1 a step multiplies one token's activations by every weight matrix once: each weight
# is read from memory once and used for two floating-point operations, so the step is bound by
# memory bandwidth, not arithmetic. The embedding table is a lookup (one row read) except when
# it is also the output head (tied embeddings, as here), which reads all of it. Each row also
# reads its own KV cache: a key and a value vector per layer, key-value head and past token.
# We read all of these sizes off the loaded model, not off a table.

# %%
model, tokenizer = fg.load_model()  # SmolLM2-135M-Instruct, float32 weights on the CPU
config = model.config
named = model.named_weights()
parameters = sum(w.size for w in named.values())
tied = not any(k.startswith("lm_head.") for k in named)
table = named["model.embed_tokens.weight"].size
read_per_step = parameters if tied else parameters - table  # parameters each step reads

cache = jax.eval_shape(lambda: model.init_cache(1, 1024))
kv_elements_per_token = sum(x.size for x in jax.tree.leaves(cache) if x.ndim >= 3) / 1024
print(f"{parameters / 1e6:.1f} M parameters, tied embeddings: {tied}")
print(
    f"{config.num_hidden_layers} layers x {config.num_key_value_heads} key-value heads x "
    f"head size {config.head_dim} x 2 (key and value) = {kv_elements_per_token:.0f} cache "
    "numbers per token"
)
for name, itemsize in (("float32", 4), ("bfloat16", 2), ("int8 (+ scales)", 1 + 4 / 32)):
    print(f"  weights in {name:<16}: {read_per_step * itemsize / 1e6:6.1f} MB read per step")
for name, itemsize in (("float32", 4), ("bfloat16", 2)):
    print(
        f"  KV cache in {name:<15}: {kv_elements_per_token * itemsize / 1e3:6.1f} kB per past token"
    )

# %% [markdown]
# At batch B and a context of L tokens a step reads the weights once and B·L tokens of cache.
# With a bfloat16 model and cache, the cache overtakes the weights once B·L passes the ratio
# printed below: long contexts and big batches are cache-bound, short ones weight-bound.

# %%
weight_bytes = read_per_step * 2
kv_bytes = kv_elements_per_token * 2
print(f"cache = weights at B*L = {weight_bytes / kv_bytes:,.0f} tokens (bfloat16 both)")
for batch, length in ((1, 1024), (8, 1024), (64, 1024), (64, 8192)):
    total = weight_bytes + batch * length * kv_bytes
    print(
        f"  B={batch:>2}, L={length:>5}: {total / 1e6:7.1f} MB per step, "
        f"{batch * length * kv_bytes / total:.0%} of it cache"
    )

# %% [markdown]
# ## Launches and round trips: the CPU plan against the GPU plan
#
# The same model can be traced into different programs. `fg.models.ExecutionPlan` is the one
# place that holds the choices that depend on the machine: `ExecutionPlan.for_backend("cpu")`
# and `for_backend("gpu")`, picked from `jax.default_backend()` when a model is loaded and
# overridable with `model.with_plan(plan)`. Here both plans trace one decode step (one token,
# a cache of 256 slots) into a jaxpr, JAX's program before compilation, and we count what is
# in it: the products (`dot_general`, each at least one kernel launch on a GPU), the
# conditionals (`cond`, which is also what `lax.switch` becomes), the cache writes and the
# fusion barriers. Anything nested in a `scan` counts once per iteration; of a conditional's
# branches we count the largest. (The `while` loop of `generate` sits around the step: one per
# call, not per step.)


# %%
def count_primitives(jaxpr: Jaxpr, times: int = 1) -> collections.Counter:
    """How many times each primitive runs in one call of `jaxpr` (conditionals: their largest
    branch; scans: their body times their length)."""
    counts = collections.Counter()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        counts[name] += times
        inner = times * eqn.params.get("length", 1) if name == "scan" else times
        subs = [
            x.jaxpr if isinstance(x, ClosedJaxpr) else x
            for v in eqn.params.values()
            for x in (v if isinstance(v, (tuple, list)) else [v])
            if isinstance(x, (ClosedJaxpr, Jaxpr))
        ]
        if name == "cond":
            largest = collections.Counter()
            for sub in subs:
                largest |= count_primitives(sub, inner)
            counts += largest
        else:
            for sub in subs:
                counts += count_primitives(sub, inner)
    return counts


def decode_step_counts(plan) -> collections.Counter:
    planned = model.with_plan(plan)
    step_cache = planned.init_cache(1, 256)
    token, position = jnp.asarray([[42]]), jnp.asarray([[100]])
    closed = eqx.filter_make_jaxpr(lambda m, c: m(token, position, c))(planned, step_cache)[0]
    return count_primitives(closed.jaxpr)


plans = {name: fg.models.ExecutionPlan.for_backend(name) for name in ("cpu", "gpu")}
counts = {name: decode_step_counts(plan) for name, plan in plans.items()}
rows = [
    ("products (dot_general)", "dot_general"),
    ("conditionals (cond / switch)", "cond"),
    ("cache writes (dynamic_update_slice)", "dynamic_update_slice"),
    ("fusion barriers (optimization_barrier)", "optimization_barrier"),
]
print(f"one decode step of {config.num_hidden_layers} layers     CPU plan   GPU plan")
for label, primitive in rows:
    print(f"  {label:<40} {counts['cpu'][primitive]:>6} {counts['gpu'][primitive]:>10}")

# %% [markdown]
# Under the CPU plan every layer's attention sits behind a conditional (a fusion barrier for
# XLA's CPU backend, and a `switch` over attention lengths, so that a short context reads only
# the slots it has written). On a GPU a conditional's predicate lives in device memory, and
# without command buffers the host must read it back to know which kernels to launch next: a
# round trip per conditional per step. Measured on one H200 for the 135M model at batch 1:
# calling attention directly took a step from 2.94 to 2.27 ms; recording the `while` loop and
# conditionals into CUDA graphs (`xla_gpu_enable_command_buffer` with `WHILE,CONDITIONAL`, which
# the GPU plan sets per program) from 2.94 to 2.14 ms; both together 1.86 ms. The two plans'
# fields, side by side:

# %%
for field in plans["cpu"].__dataclass_fields__:
    cpu, gpu = getattr(plans["cpu"], field), getattr(plans["gpu"], field)
    print(f"{field:<26} cpu: {cpu!s:<14} gpu: {gpu}" + ("" if cpu != gpu else "   (same)"))

# %% [markdown]
# ## The roofline of batch size
#
# A step reads the weights once whatever the batch, so up to a point B rows cost what one row
# costs and tokens/s grows with B: the bound is **B × bandwidth / bytes per step**. It stops
# growing where the step becomes arithmetic-bound, at **peak FLOP/s / (2 × parameters)** tokens
# per second: on an H200 (about 4.3 TB/s copied, about 790 TFLOP/s in bf16 products, both
# measured on such a machine) the knee sits near B = 790 / 4.3 ≈ 180 for bf16 weights. The points
# are the figures measured on one H200 (jax 0.11.2, CUDA 13; random-weight checkpoints of each
# shape, bf16 weights, greedy, 32-token prompt; DESIGN.md "Accelerators"), ours before the GPU
# plan existed, against transformers eager on the same GPU in the same run.

# %%
BANDWIDTH = 4.3e12  # bytes/s, a device-to-device copy on an H200
PEAK = 790e12  # FLOP/s, bf16 products on random data on an H200
shapes = {  # label: (parameters read per step, ours tok/s, transformers tok/s at B = 1, 8, 64)
    "SmolLM2-135M": (134.5e6, (338, 4058, 27753), (48, 325, 2500)),
    "Llama-3.2-1B": (1.236e9, (456, 4840, 30843), (95, 469, 4963)),
    "Llama-3.1-8B": (7.505e9, (149, 1424, 8343), (51, 370, 2701)),
}
batches = np.array([1, 8, 64])
grid = np.logspace(0, np.log10(512), 60)
fig, ax = plt.subplots(figsize=(8, 5))
for (label, (params, ours, theirs)), color in zip(shapes.items(), ("C0", "C1", "C2")):
    bound = np.minimum(grid * BANDWIDTH / (2 * params), PEAK / (2 * params))
    ax.plot(grid, bound, color=color, lw=1, ls="--", label=f"{label}: bound")
    ax.plot(batches, ours, "o-", color=color, label=f"{label}: ours (before the GPU plan)")
    ax.plot(batches, theirs, "x:", color=color, label=f"{label}: transformers eager")
ax.set(
    xscale="log",
    yscale="log",
    xlabel="batch size (rows per step)",
    ylabel="decode tokens/s",
    title="Decode on one H200, bf16 weights: measured against the roofline",
)
ax.legend(fontsize=7, ncol=1, loc="upper left")
plt.show()

for label, (params, ours, _) in shapes.items():
    fractions = [r / (b * BANDWIDTH / (2 * params)) for r, b in zip(ours, batches)]
    print(f"{label}: " + ", ".join(f"B={b} {f:.0%}" for b, f in zip(batches, fractions)))

# %% [markdown]
# The 8B model reached about half of its bound at batch 1: its 15 GB of weights take 3.5 ms to
# read, so the launches and round trips of a step cost about as much again. The small models
# are far from theirs, and the 135M step (2.9 ms) was slower than the 1B one (2.2 ms) although
# it reads a ninth of the bytes: those steps are bound by launches and round trips, which is
# what the GPU plan removes. The bound ignores the KV cache (about 7% of the 8B step's bytes at
# batch 64 and a 100-token context, more at long contexts). `benchmarks/bench_gpu.py` measures
# all of this again, with the bound from a copy measured in the same run.
#
# ## Why the CPU and the GPU plans differ
#
# - **Conditionals.** On a CPU a `lax.cond` costs nothing to decide and stops XLA's CPU fusion
#   from duplicating the cache update into the attention product (the CPU plan uses that as a
#   fence), and a `switch` over attention lengths saves reading empty cache slots. On a GPU each
#   is a host round trip unless it is recorded into a CUDA graph: the GPU plan has none inside
#   the layer stack and reads the whole cache (sized to the prompt plus the new tokens).
# - **Precision.** XLA's CPU backend runs most bfloat16 products 10–20× slower than float32
#   ones, so the CPU plan upcasts a bfloat16 weight; a GPU's tensor cores run bfloat16 operands
#   with float32 accumulation at their full rate, so the GPU plan keeps them bfloat16 (norms,
#   softmax and logits stay float32 on both).
# - **Prefill attention.** The CPU has no fused attention: the CPU plan splits the prompt into
#   query blocks that read only the keys causality allows. On a GPU one
#   `jax.nn.dot_product_attention` call per layer lets cuDNN's flash attention run the masked
#   square on tensor cores.
# - **Compiler options.** The GPU plan asks XLA, per compiled program, to record `while` loops
#   and conditionals into command buffers, so that the whole `generate` loop replays as CUDA
#   graphs instead of returning to the host each iteration.

# %% [markdown]
# ## Paged attention: the serving engine's blocks read in place
#
# The serving engine (`fg.serving.Engine(..., block_size=16)`) keeps every request's keys and
# values in fixed-size blocks of one pool per layer, with a block table per request, as vLLM
# does ([Serving many callers](../serving/)). Attention must then read each row's keys through
# its table. The CPU plan gathers the busy rows' blocks into a contiguous copy once per
# dispatch (XLA's CPU dot reads the copy in place); on a GPU that copy is as large as the
# blocks it reads, and its two extra passes cost bandwidth, so the GPU plan
# (`ExecutionPlan.paged_attention="pallas"`) hands the model the pools and tables as a
# `fg.models.PagedKVCache` and attends with jax's Pallas paged-attention kernel, which reads
# the blocks where they are. On a CPU the same kernel runs in Pallas's interpret mode
# (`"pallas_interpret"`): slow, but the same arithmetic. Below, the first two layers of the
# default model read a 24-token prompt from blocks of 4 scattered over a pool, under both
# forms, against the contiguous cache's logits.

# %%
small = model.first_layers(2)
text = (
    "The capital of France is Paris, the capital of Italy is Rome, the capital of Spain is "
    "Madrid, and the capital of Portugal is"
)
prompt = jnp.asarray(tokenizer(text)["input_ids"][:24])[None]
n = prompt.shape[1]
assert n == 24
positions = jnp.arange(n, dtype=jnp.int32)[None]
reference = eqx.filter_jit(lambda m: m.prefill(prompt, positions, max_len=n, logits_to_keep=0)[0])(
    small
)

block, blocks = 4, 16
table = np.random.default_rng(0).permutation(blocks)[: -(-n // block)]  # scattered physical blocks
tables = jnp.full((1, 8), -1, jnp.int32).at[0, : table.size].set(table)
pools = tuple(
    jnp.zeros((config.num_key_value_heads, blocks, block, config.head_dim)) for _ in range(2)
)
paged = fg.models.PagedKVCache(pools, pools, tables, jnp.zeros((1,), jnp.int32))
for form in ("gather", "pallas_interpret"):
    plan = small.plan.replace(paged_attention=form)
    logits, after = eqx.filter_jit(lambda m, c: m(prompt, positions, c))(
        small.with_plan(plan), paged
    )
    error = float(jnp.abs(logits - reference).max())
    print(
        f"{form:>16}: logits within {error:.1e} of the contiguous cache; length {int(after.length[0])}"
    )

# %% [markdown]
# Where the prompt's keys went: each of the 24 positions in the physical block its table names
# (a white cell: a block no row holds). Any free block serves; that is what lets memory follow
# the tokens in use.

# %%
owner = np.full((blocks, block), np.nan)
for j, physical in enumerate(table):
    owner[physical] = np.arange(j * block, (j + 1) * block)
owner[owner >= n] = np.nan
fig, ax = plt.subplots(figsize=(7, 2.2))
ax.imshow(owner.T, cmap="viridis", aspect="auto")
ax.set_xlabel("physical block of the pool")
ax.set_ylabel("offset in block")
ax.set_title("prompt position held by each slot of the pool (colour: 0 dark, 23 light)")
plt.show()

# %% [markdown]
# ## Next
#
# This is the last tutorial. [Running on GPU](../../gpu/) says how to install the CUDA build,
# which dtypes to choose for the weights and the cache, and how to run the benchmark on a GPU.
