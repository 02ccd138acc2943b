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
# # Speculative decoding
#
# Decoding a small model on a CPU is bound by memory bandwidth: every token reads every weight
# once. Scoring `k + 1` tokens in one call reads the weights once too, so it costs about the
# same as producing one. **Speculative decoding** exploits this: something cheap guesses the
# next `k` tokens, the model scores all of them in one call, and every guess it agrees with is
# a token for free. Done right, the output is exactly what the model alone would have produced
# (greedy) or has exactly its distribution (sampling).
#
# This notebook:
#
# - derives the acceptance rule that makes sampling lossless, and checks it numerically;
# - runs prompt-lookup decoding on an editing task and plots the tokens accepted per step;
# - compares the measured speed-up with the cost model, as a function of `k` and the
#   acceptance rate.
#
# In `functional_gen`, speculation is a *search* (beside sampling and beam search): one step of
# the compiled loop proposes, verifies and advances every row by its own count; the processors
# run position by position and each row keeps the processor state of its last accepted position.
#
# **Before this:** [The KV cache and resumable generation](../kv_cache/) (prefill against decode,
# [memory bandwidth](../../concepts/wording/#memory-bandwidth)), [Sampling](../sampling/) (what sampling from a
# distribution means) and [Model families](../model_families/) (tokens per second against the
# bandwidth bound). Terms are defined on [Words we use](../../concepts/wording/).
# %%
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import functional_gen as fg
from functional_gen.generation.speculative import verify_widths
from functional_gen.speculative.cost import choose_width, verify_cost

model, tokenizer = fg.load_model()

# %% [markdown]
# ## The acceptance rule
#
# The proposer drew a guess `d` from its distribution `q`; the model's distribution is `p`.
# Accept `d` with probability `min(1, p(d) / q(d))`; on rejection draw from the residual
# `r = max(p - q, 0) / Z`. The probability that token `x` comes out is
#
# - as an accepted guess: `q(x) · min(1, p(x)/q(x)) = min(p(x), q(x))`;
# - after a rejection: `P(reject) · r(x)`, where `P(reject) = 1 - Σ_y min(p(y), q(y)) =
#   Σ_y max(p(y) - q(y), 0) = Z`, so this is `max(p(x) - q(x), 0)`.
#
# The sum is `min(p, q) + max(p - q, 0) = p`: the guess changes how fast, never what. After `n`
# accepted guesses of `k` the same holds for the next position; when all `k` are accepted, the
# model's distribution after the last guess gives one more ("bonus") token. Greedy decoding is
# the limit of one-hot `p`: accept while the guess equals the model's argmax.
#
# Numerically, with `p` and `q` over five tokens:

# %%
p = jnp.asarray([0.4, 0.3, 0.15, 0.1, 0.05])
q = jnp.asarray([0.1, 0.5, 0.2, 0.15, 0.05])
accepted_part = q * jnp.minimum(1.0, p / q)  # draw d ~ q, keep it with prob min(1, p/q)
rejected_mass = 1.0 - accepted_part.sum()
out = accepted_part + rejected_mass * fg.speculative.residual(p, q, jnp.asarray(0))
print("p              ", np.round(np.asarray(p), 4))
print("output of rule ", np.round(np.asarray(out), 4))

# %% [markdown]
# ## Prompt lookup on an editing task
#
# When the answer copies the prompt (rewriting, extracting, editing code), the row's own text is
# a good guesser: find the last few tokens earlier in the row and guess what followed them
# (`PromptLookup`, transformers' `prompt_lookup_num_tokens`; transformers takes the first
# earlier occurrence, the adaptive `PromptLookup` the latest, which replayed along real outputs
# got a few more guesses accepted: `benchmarks/replay_lookup.py`). We stream the answer:
# `fg.stream` runs the same compiled step from Python, one step at a time, and records how many
# tokens each step added to each row (`tokens_per_step`); its final `state` keeps the search's
# counts of guesses proposed and accepted.

# %%
code = "def total(items):\n    s = 0\n    for i in items:\n        s = s + i\n    return s\n"
prompt = [{"role": "user", "content": f"Rename `items` to `values` in this code:\n\n{code}"}]
K = 7  # guesses per step: a call over 8 positions, the widest this run needs to compile
spec = fg.speculative.PromptLookup(num_tokens=K, max_ngram_size=3)
streamed = fg.stream(model, tokenizer, prompt, max_new_tokens=48, speculative=spec)
print("".join(streamed))
per_step = streamed.tokens_per_step[0]

# %% [markdown]
# Each bar is one call of the model. Runs of 8 tokens (7 accepted guesses plus the model's own
# next token) are spans copied from the code; single tokens are where the answer says something
# new. A step's call is only as wide as the guesses need and the search's cost model allows
# (1, 4 or 8 positions for 7 guesses; see the last section): after rejections a row's
# acceptance estimate falls and the cost model verifies fewer of its guesses or none, so bars
# of 1 are often plain decode steps (a row refused for 16 steps is verified once anyway, to
# check its estimate). The last bar may be 0: a row that ends on the model's own token takes
# one more call to put that token into the cache, so that a `SequenceState` can continue from
# it.

# %%
spec_state = streamed.state.search_state
rate = int(spec_state.accepted[0]) / max(int(spec_state.proposed[0]), 1)
fig, ax = plt.subplots(figsize=(9, 3))
ax.bar(range(len(per_step)), per_step, color="tab:blue")
ax.set_xlabel("step (one call of the model)")
ax.set_ylabel("tokens added")
ax.set_title(
    f"{sum(per_step)} tokens in {len(per_step)} calls; acceptance rate {rate:.2f} "
    f"({int(spec_state.accepted[0])} of {int(spec_state.proposed[0])} guesses)"
)
plt.show()

# %% [markdown]
# ## Speed-up against the cost model
#
# With acceptance rate `α` per guess (independent guesses) a step emits on average
# `E(k, α) = (1 - α^(k+1)) / (1 - α)` tokens (Leviathan et al. 2023). A step costs one call of
# the model over `k + 1` positions — on a bandwidth-bound CPU about `1 + c·k` times a plain
# decode step, `c` small — plus the proposer's cost (nothing for prompt lookup). The speed-up is
# `E(k, α) / (1 + c·k)`. We measure `c` here: the time of one call of the model over 8
# positions (a verification of 7 guesses) against a call over 1 position (a plain decode step),
# both on a cache that already holds a 64-token prompt (the median of 3 calls each, after one
# that compiles: the figures are this machine's and noisy).


# %%
prompt_ids = jnp.arange(100, 164)[None]  # any 64 tokens: the cost does not depend on them
# the model is an argument, not a constant closed over: its weights stay jit inputs
_, cache = eqx.filter_jit(lambda m, ids: m.prefill(ids, jnp.arange(64)[None], max_len=128))(
    model, prompt_ids
)
call = eqx.filter_jit(lambda m, ids, positions, cache: m(ids, positions, cache)[0])


def seconds_per_call(width, repeats=3):
    """Median seconds of one jitted model call over `width` new positions after the 64-token
    prompt (the cache is not advanced: every call writes the same slots)."""
    ids, positions = jnp.full((1, width), 200), jnp.arange(64, 64 + width)[None]
    jax.block_until_ready(call(model, ids, positions, cache))  # compile
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(call(model, ids, positions, cache))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


plain_call = seconds_per_call(1)
verify_call = seconds_per_call(8)
c = (verify_call / plain_call - 1) / 7
print(f"plain step {1e3 * plain_call:.1f} ms, verifying 8 positions {1e3 * verify_call:.1f} ms")
print(f"cost model: a step over k + 1 positions costs 1 + {c:.3f} k plain steps")

# %% [markdown]
# The curves are the cost model's speed-up `E(k, α) / (1 + c·k)` with the `c` just measured;
# the dot is the editing run above (its tokens per call divided by the same cost).

# %%
ks = np.arange(1, 17)
fig, ax = plt.subplots(figsize=(7, 4))
for alpha in (0.5, 0.7, 0.8, 0.9):
    tokens = (1 - alpha ** (ks + 1)) / (1 - alpha)
    ax.plot(ks, tokens / (1 + c * ks), label=f"α = {alpha}")
measured_tokens = sum(per_step) / len(per_step)
predicted = (1 - rate ** (K + 1)) / (1 - rate) / (1 + c * K)
ax.scatter(
    [K],
    [measured_tokens / (1 + c * K)],
    color="black",
    zorder=3,
    label=f"editing task, α = {rate:.2f}: tokens/step ÷ cost",
)
ax.axhline(1.0, color="gray", lw=0.8)
ax.set_xlabel("k (guesses per step)")
ax.set_ylabel("speed-up over plain decoding")
ax.legend()
plt.show()
print(f"the cost model predicts {predicted:.2f}x for α = {rate:.2f}, k = {K} (independent guesses)")
print(f"the run gave {measured_tokens:.2f} tokens per call, {measured_tokens / (1 + c * K):.2f}x")

# %% [markdown]
# Guesses of prompt lookup are not independent: a copied span is accepted whole, then the next
# guess fails whole, so the measured tokens per step sit above the i.i.d. curve at the same
# `α`. Large `k` pays off only while verification stays cheap: the measured `c` above is what
# decides it. On this CPU it is not zero: XLA's matrix products over 9 columns cost more than
# the matrix-vector products of a plain step (the design notes measured 2.4x for 8 columns of the
# output head), so a step over `k + 1` positions is not free, and the break-even acceptance rate
# grows with `k`. Speculation helps most where the answer copies its input (α high) and at
# batch 1; at larger batches the plain step is itself a matrix product and the gain shrinks.

# %% [markdown]
# ## The search's own cost model
#
# `Speculative` applies the same arithmetic at every step, for adaptive `PromptLookup`: the cost
# of a call over `w + 1` positions comes from a table measured on this CPU per precision and
# batch (`fg.speculative.cost.VERIFY_COST`), the acceptance `a` from each row's recent guesses
# (by the size of the n-gram match that made them), and the step takes the width with the most
# expected tokens per unit of cost; width 0, a plain decode step, is always a candidate. A row
# whose estimate stays below the threshold would never be verified again, so it is planned
# optimistically (acceptance 0.6) for one step after 16 refused ones: exploration. With 8
# rows a call over 4 positions already costs about 3 plain steps (the step is no longer a
# matrix-vector product), so only rows that keep nearly every guess make verification pay:

# %%
for batch in (1, 8):
    widths = verify_widths(10, batch)
    costs = tuple(verify_cost("float32", batch, w + 1) for w in widths)
    rows = jnp.ones((batch,), bool)
    for a in (0.2, 0.5, 0.8, 0.95):
        chosen = choose_width(
            widths, costs, jnp.full((batch,), a), jnp.full((batch,), 10, jnp.int32), rows
        )
        print(f"batch {batch}, acceptance {a}: verify {widths[int(chosen)]} of 10 guesses")

# %% [markdown]
# ## Next
#
# [Serving many callers](../serving/): continuous batching, the engine's three pure functions,
# and a timeline of requests sharing slots.
