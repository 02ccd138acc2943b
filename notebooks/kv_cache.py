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
# # The KV cache, prefill, and resumable generation
#
# A decoder predicts the next token from every token before it. Done naively, each new token
# re-reads the whole text; with a **KV cache** each token's keys and values are computed once
# and kept. This notebook:
#
# - generates without a cache, then derives the cache step by step and checks both agree;
# - compares the one-pass **prefill** (the whole prompt in one model call) with feeding the
#   prompt token by token, and plots the times;
# - draws the causal attention mask next to the **prefix-LM** one (the prompt attends to
#   itself in both directions);
# - uses `fg.SequenceState`, the resumable result of every generation: continue it, append a
#   chat turn (only the new turn is prefilled), fork it, save it and resume it.
#
# **Before this:** the [Quickstart](../quickstart/) (`fg.generate`, a chat prompt, greedy and
# sampled decoding) and [Tokens and tokenization](../tokenization/) (a prompt is a list of
# token ids). Terms are defined on [Words we use](../../concepts/wording/).

# %%
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import functional_gen as fg
from functional_gen.testing import tiny_config

# %% [markdown]
# ## Attention without a cache
#
# We start with a tiny random Llama (2 layers, 101 tokens) so that every step is instant. A
# model call takes token ids, their RoPE positions and a `KVCache`; giving it a fresh cache
# each time means "no cache": all tokens so far are run again to predict one more. (`jax.jit`
# compiles the forward pass once per sequence length: one XLA program instead of one per
# operation.)

# %%
tiny = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(0), std=0.2)
prompt = [5, 17, 42, 8]


@jax.jit
def forward_without_cache(x):
    n = x.shape[1]
    logits, _ = tiny(x, jnp.arange(n)[None], tiny.init_cache(1, n))
    return logits[0, -1]


def next_logits_without_cache(ids):
    return forward_without_cache(jnp.asarray([ids]))


steps = 4  # each step is a new sequence length, so a new compilation
ids = list(prompt)
no_cache_logits = []
for _ in range(steps):
    logits = next_logits_without_cache(ids)
    no_cache_logits.append(logits)
    ids.append(int(jnp.argmax(logits)))
print("greedy, no cache:", ids)

# %% [markdown]
# ## The cache, step by step
#
# Now the cache: the prompt goes in once (prefill); afterwards each step feeds only the newest
# token, at its position, and the model appends its keys and values to the cache. The logits
# are the same as without the cache, up to float rounding, but each step now costs one token
# (and, the cache having a fixed size, every step has the same shapes: one compiled program).

# %%
prefill = jax.jit(lambda token_ids, positions: tiny.prefill(token_ids, positions, max_len=16))
decode = jax.jit(lambda token_ids, positions, cache: tiny(token_ids, positions, cache))
logits, cache = prefill(jnp.asarray([prompt]), jnp.arange(len(prompt))[None])
cached_ids, cached_logits = list(prompt), []
for _ in range(steps):
    cached_logits.append(logits[0, -1])
    token = int(jnp.argmax(logits[0, -1]))
    cached_ids.append(token)
    position = jnp.asarray([[len(cached_ids) - 1]])
    logits, cache = decode(jnp.asarray([[token]]), position, cache)
print("greedy, with cache:", cached_ids)
difference = max(float(jnp.abs(a - b).max()) for a, b in zip(no_cache_logits, cached_logits))
print(f"largest logit difference: {difference:.2e}")
assert cached_ids == ids and difference < 1e-4

# %% [markdown]
# The cache is an ordinary [pytree](../../concepts/wording/#pytree): per layer a key and a value buffer of shape
# `[batch, kv_heads, max_len, head_dim]`, plus the RoPE position of every slot (`-1` marks a
# slot that holds nothing, or padding) and how many slots are written.

# %%
print(len(cache.k), "layers; k[0]:", cache.k[0].shape, "; positions:", cache.positions[0, :12])

# %% [markdown]
# ## What a cached token costs in memory
#
# Every token keeps one key and one value vector per layer and per key/value head, so a
# cache's bytes per token are
#
# `bytes per token = 2 × layers × kv_heads × head_dim × bytes per value`
#
# SmolLM2-135M (loaded below) uses [**grouped-query attention**](../../concepts/wording/#gqa) (GQA): its 9 query
# heads share 3 key/value heads, three queries per group, so its cache is 3 times smaller than
# with multi-head attention, where every query head has its own keys and values
# (`kv_heads = heads`). We compute the formula from the config and check it against the bytes of a
# real cache's buffers (the `k` and `v` arrays only; the int32 positions add 4 bytes per slot).

# %%
model, tokenizer = fg.load_model()
cfg = model.config
print(
    f"{cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query heads, "
    f"{cfg.num_key_value_heads} key/value heads, head_dim {cfg.head_dim}"
)


def bytes_per_token(kv_heads, dtype_bytes):
    return 2 * cfg.num_hidden_layers * kv_heads * cfg.head_dim * dtype_bytes


slots = 1024
shapes = jax.eval_shape(lambda: model.init_cache(1, slots))  # shapes only, nothing allocated
measured = sum(x.size * x.dtype.itemsize for x in shapes.k + shapes.v) / slots
print(
    f"formula {bytes_per_token(cfg.num_key_value_heads, 4):,} bytes, cache buffers {measured:,.0f}"
)
assert measured == bytes_per_token(cfg.num_key_value_heads, 4)

# %%
context = np.array([512, 2048, 8192])
fig, ax = plt.subplots(figsize=(7, 3.2))
variants = [
    (f"multi-head ({cfg.num_attention_heads} kv heads), float32", cfg.num_attention_heads, 4),
    (f"GQA ({cfg.num_key_value_heads} kv heads), float32", cfg.num_key_value_heads, 4),
    (f"GQA ({cfg.num_key_value_heads} kv heads), bfloat16", cfg.num_key_value_heads, 2),
]
width = 0.27
for i, (name, kv_heads, dtype_bytes) in enumerate(variants):
    per_token = bytes_per_token(kv_heads, dtype_bytes)
    ax.bar(
        np.arange(3) + (i - 1) * width,
        context * per_token / 2**20,
        width,
        label=f"{name}: {per_token / 1024:.0f} KiB/token",
    )
ax.set_xticks(np.arange(3), [f"{n} tokens" for n in context])
ax.set_ylabel("MiB per sequence")
ax.set_title("SmolLM2-135M's KV cache for one sequence")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# At 8,192 tokens one sequence's float32 cache is 360 MiB with GQA (1.05 GiB with multi-head
# attention), against the model's 540 MB of float32 weights: two such sequences outweigh the
# model. The cache, not the weights, decides how many sequences a server can hold (the serving
# tutorial), and every decode step reads all of it.

# %% [markdown]
# ## One-pass prefill against a teacher-forced prompt
#
# Why one call? A model call must read every weight from memory, and on this CPU reading is the
# bottleneck: [**memory bandwidth**](../../concepts/wording/#memory-bandwidth), the bytes per second memory can
# deliver (about 26–31 GB/s here), bounds a call over one token at about
# `540 MB of weights ÷ 28 GB/s ≈ 20 ms`, however little arithmetic it does. Decoding is
# therefore *memory-bound*. A call over many tokens reads the weights once for all of them, so
# its matrix multiplications have enough arithmetic per byte read to run near the processor's
# peak.
#
# `fg.generate` prefills a prompt in ONE model call: every prompt token is a query at once. The
# "fast way" of the flax discussion feeds the prompt through the decode step one token at a time
# (`prefill_mode="forced"`): the same cache, the same logits, but one weight read per token.
# We time both on the default model, SmolLM2-135M, for a 16-token prompt (the first call of
# each mode compiles, so we time the best of the next three; the figures are this machine's and
# noisy, the ratio is the point). Every call below asks for at most 16 new tokens, so they share
# compiled programs (`max_new_tokens` is rounded up to a [bucket](../../concepts/wording/#bucket) too).

# %%
text = "The history of the Roman Empire spans many centuries, from the founding of Rome. " * 2
n, times = 16, {}
state = fg.SequenceState.from_token_ids(
    [tokenizer(text)["input_ids"][:n]], vocab_size=model.vocab_size
)
for mode in ("one_pass", "forced"):
    runs = []
    for _ in range(4):  # the first call compiles
        start = time.perf_counter()
        out = fg.generate(model, tokenizer, state, max_new_tokens=1, prefill_mode=mode)
        jax.block_until_ready(out.state.arrays)
        runs.append(time.perf_counter() - start)
    times[mode] = min(runs[1:])
    print(f"{mode:8s} prompt of {n} tokens: {times[mode]:.3f} s")

# %%
fig, ax = plt.subplots(figsize=(5, 3))
ax.bar(["one-pass prefill", "token by token"], [times["one_pass"], times["forced"]])
ax.set_ylabel("seconds")
ax.set_title(f"Filling the cache with a {n}-token prompt")
plt.show()

# %% [markdown]
# ## The prefix-LM mask
#
# In a causal decoder, token `i` attends to tokens `0..i`. A **prefix-LM** (the "cache-init"
# mode of flax PR #1316) lets the prompt attend to itself in both directions, like a small
# encoder, while generated tokens stay causal. In the model, this is one extra term in the
# attention mask: `kv_position < prefix_length`. `fg.generate(..., prefix_lm=True)` uses it.

# %%
seq, prefix = 10, 6
q, k = np.arange(seq)[:, None], np.arange(seq)[None, :]
causal = k <= q
prefix_lm = causal | ((k < prefix) & (q < prefix))
fig, axes = plt.subplots(1, 2, figsize=(7, 3.4))
for ax, mask, title in [
    (axes[0], causal, "causal"),
    (axes[1], prefix_lm, f"prefix-LM (prompt of {prefix})"),
]:
    ax.imshow(mask, cmap="Blues")
    ax.set_title(title)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
plt.tight_layout()
plt.show()

# %%
# (13 tokens: like the 16 above, a 16-token prompt bucket and 32 token columns, so the causal
# call reuses the one-pass program compiled above)
prompt_ids = tokenizer("Berlin is the capital of Germany. The capital of France is")["input_ids"]
for flag in (False, True):
    out = fg.generate(
        model,
        tokenizer,
        fg.SequenceState.from_token_ids(
            [prompt_ids], vocab_size=model.vocab_size, tokenizer=tokenizer
        ),
        max_new_tokens=8,
        prefix_lm=flag,
    )
    print(f"prefix_lm={flag}: {out.texts[0]!r}")

# %% [markdown]
# SmolLM2 was trained causally, so the bidirectional prompt is out of its training
# distribution and the continuation changes; prefix-LM models (T5-style decoders, PaliGemma)
# are trained this way.
#
# ## `SequenceState`: continue, append, fork, save
#
# Every generation returns its state: token ids, the KV cache, per-row keys and processor
# states. Continuing it prefills nothing, and 8 + 8 tokens equal 16 tokens in one call.

# %%
chat = [{"role": "user", "content": "Name a famous Roman emperor."}]
first = fg.generate(model, tokenizer, [chat], max_new_tokens=8)
more = fg.generate(model, tokenizer, first.state, max_new_tokens=8)
whole = fg.generate(model, tokenizer, [chat], max_new_tokens=16)  # the same program as `first`
print(repr(first.texts[0]), "+", repr(more.texts[0]))
print("prefilled on the continuation:", more.prefill_tokens)
assert first.texts[0] + more.texts[0] == whole.texts[0]

# %% [markdown]
# A chat goes on by adding a message: `state + [{"role": "user", ...}]` appends the chat
# template's continuation (the end of the assistant's turn, the new user turn, the start of the
# next assistant turn). Only those tokens are prefilled.

# %%
answer = fg.generate(model, tokenizer, [chat], max_new_tokens=16)
turn = answer.state + [{"role": "user", "content": "When did he live?"}]
reply = fg.generate(model, tokenizer, turn, max_new_tokens=16)
print("assistant:", answer.texts[0])
print("assistant:", reply.texts[0])
print(
    "tokens in the conversation:",
    len(turn.row_token_ids()[0]),
    "- prefilled for the new turn:",
    reply.prefill_tokens[0],
)

# %% [markdown]
# Forking shares the prefill: `state.repeat(3)` copies every row (cache included) and gives
# each copy its own key, so three samples branch from one prefix. `num_return_sequences=3` in
# `generate` does the same.

# %%
forks = fg.generate(
    model,
    tokenizer,
    answer.state[:, : len(answer.state.row_token_ids()[0]) - 8].repeat(3),
    max_new_tokens=16,
    processors=[fg.processors.Temperature(0.9)],
    sampler=fg.samplers.Multinomial(),
)
for text in forks.texts:
    print("->", repr(text))

# %% [markdown]
# Finally, a state is a file: `save` writes its arrays and a small header (format version,
# the model's config fingerprint) to safetensors, and `SequenceState.load` reads it back, in
# this process or another; a model with another config refuses it.

# %%
# (the state of `first` above: its continuation `more` is the reference; the loaded state has
# the same arrays and shapes but not the settings of the call that made it, so continuing it
# compiles a program of its own, a few seconds here, and gives the same tokens)
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "chat.safetensors"
    first.state.save(path)
    print(f"{path.stat().st_size / 2**20:.1f} MiB on disk")
    restored = fg.SequenceState.load(path, tokenizer=tokenizer)
    again = fg.generate(model, tokenizer, restored, max_new_tokens=8)
    print(repr(more.texts[0]), "==", repr(again.texts[0]))
    assert again.texts == more.texts
    np.testing.assert_array_equal(np.asarray(again.token_ids), np.asarray(more.token_ids))

# %% [markdown]
# ## Next
#
# [How logits processing works](../logits_processing/): what happens to the logits of each step
# (the ones the cache made cheap) before a token is chosen.
