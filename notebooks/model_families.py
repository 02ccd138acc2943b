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
# # Model families: Llama, Qwen3, Gemma 3 and Phi-3 in one decoder
#
# Most decoder-only language models of 2026 are the same machine: embeddings, a stack of
# (norm, attention, norm, gated MLP) layers with residual connections, a final norm and an
# output head. What makes a *family* is a handful of small differences. `functional_gen` runs
# all of them with **one** decoder, `DecoderForCausalLM`, built from a `DecoderConfig` whose
# fields declare each difference; a family module only maps its `config.json` and weight names
# onto those fields. This notebook shows the differences that matter, on the two real models
# installed here (SmolLM2-135M, a Llama; Gemma 3 270M) and on tiny random configs:
#
# - which config fields each family sets;
# - the norms: `weight` against Gemma's `(1 + weight)`;
# - the attention pattern: Gemma 3's 5 sliding-window layers per global one, drawn as masks;
# - soft-capping (Gemma 2), a smooth clamp of the scores;
# - the cache memory of a local and a global layer;
# - tokens per second of the two real models.
#
# **Before this:** [The KV cache and resumable generation](../kv_cache/) (the cache's bytes per
# token, GQA, memory bandwidth) and the [Quickstart](../quickstart/). The other tutorials run
# SmolLM2 only; this one opens the decoder. Terms are defined on [Words we use](../../concepts/wording/).
# %%
import dataclasses
import math
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import transformers

import functional_gen as fg
from functional_gen.models import DecoderForCausalLM, config_from_hf

# %% [markdown]
# ## What each family declares
#
# We build each family's configuration with transformers' **own** config class (tiny sizes, the
# family's defaults for everything else) and read it with `config_from_hf`, the function
# `fg.load_model` uses for a checkpoint's `config.json`. Printing the fields that differ from
# the Llama configuration of the same size lists, family by family, everything the decoder
# does differently. Special token ids are left out: they name tokens, they change no
# computation.

# %%
SIZES = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
hf_configs = {
    "llama": transformers.LlamaConfig(**SIZES, head_dim=16),
    "qwen3": transformers.Qwen3Config(**SIZES, head_dim=16),
    "gemma3_text": transformers.Gemma3TextConfig(**SIZES, head_dim=16, sliding_window=8),
    "phi3": transformers.Phi3Config(
        **SIZES, partial_rotary_factor=0.5, eos_token_id=None, pad_token_id=None
    ),
}
configs = {name: config_from_hf(c) for name, c in hf_configs.items()}
TOKEN_FIELDS = {"bos_token_id", "eos_token_id", "pad_token_id", "model_type"}


def differences(config, reference):
    """The fields of `config` whose values differ from `reference`'s (token ids left out)."""
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if f.name not in TOKEN_FIELDS and getattr(config, f.name) != getattr(reference, f.name)
    }


for name, config in configs.items():
    print(f"{name:12s}", differences(config, configs["llama"]) or "(the defaults)")

# %% [markdown]
# Qwen3 adds one thing: an RMSNorm over every query and key head before RoPE (`qk_norm`).
# Phi-3 rotates only part of each head (`partial_rotary_factor`) and, in its checkpoints,
# fuses `qkv_proj` and `gate_up_proj`: the decoder's own layout for every family (the others'
# separate projections are concatenated on load: 4 matmuls per layer instead of 7).
# Gemma 3 changes the most: GELU-tanh instead of SiLU, `(1 + weight)` norms, norms on both
# sides of attention and of the MLP (`sandwich_norms`), embeddings scaled by
# `sqrt(hidden_size)`, its own attention scale, per-head q/k norms, and sliding-window layers
# with their own RoPE base (`local_rope_theta`).
#
# The same comparison between the two real models we have:

# %%
smollm, smollm_tokenizer = fg.load_model("smollm2-135m-instruct")
gemma, gemma_tokenizer = fg.load_model("gemma-3-270m")
for name, model in [("SmolLM2-135M", smollm), ("Gemma 3 270M", gemma)]:
    c = model.config
    print(
        f"{name}: {c.model_type}, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
        f"{c.num_attention_heads} query / {c.num_key_value_heads} key-value heads of "
        f"{c.head_dim}, vocabulary {c.vocab_size:,}"
    )
SIZE_FIELDS = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
    "rope_original_max_position_embeddings",
}  # fmt: skip
declared = differences(gemma.config, smollm.config)
print("Gemma 3 270M differs from SmolLM2 (a Llama), sizes aside, in:")
for field, value in declared.items():
    # (an explicit all-True `use_rope` says what the default `()` says: RoPE on every layer)
    if field not in SIZE_FIELDS and not (field == "use_rope" and all(value)):
        print(f"  {field} = {value!r}")

# %% [markdown]
# ## Norms: `weight` or `1 + weight`
#
# RMSNorm divides each token's vector by its root mean square and multiplies by a learned
# per-channel scale. Llama stores that scale as `weight`; Gemma stores `weight` and multiplies
# by `1 + weight`, so a freshly initialised Gemma norm (weights 0) is the identity. Both stored
# forms, read from the real checkpoints with `named_weights()`:

# %%
smollm_norm = np.asarray(smollm.named_weights()["model.norm.weight"])
gemma_norm = np.asarray(gemma.named_weights()["model.norm.weight"])
fig, ax = plt.subplots(1, 2, figsize=(10, 3))
ax[0].hist(smollm_norm, bins=60)
ax[0].set_title("SmolLM2 final norm: stored weight (the scale)")
ax[1].hist(gemma_norm, bins=60, color="tab:orange")
ax[1].set_title("Gemma 3 final norm: stored weight (scale = 1 + weight)")
plt.tight_layout()
print(
    f"SmolLM2 median scale {np.median(smollm_norm):.2f}; Gemma median 1 + w {1 + np.median(gemma_norm):.2f}"
)

# %% [markdown]
# The two formulas side by side on one vector, written out in NumPy: the declared field
# `rms_norm_unit_offset` is the only switch between them.

# %%
x = np.array([1.0, -2.0, 3.0, 0.5])
w = np.array([0.1, 0.0, -0.5, 2.0])
normed = x / np.sqrt(np.mean(x**2) + 1e-6)
print("Llama  (weight):    ", normed * w)
print("Gemma  (1 + weight):", normed * (1 + w))

# %% [markdown]
# ## Attention patterns: 5 local layers per global one
#
# A **global** layer lets each token attend to every earlier token (the causal mask). A
# **sliding-window** (local) layer lets it attend to the last `sliding_window` tokens only,
# itself included (transformers: key `j` is visible to query `i` when `0 <= i - j < window`).
# Gemma 3 interleaves them: five local layers, then one global. The per-layer windows are a
# config field, `sliding_window` (`None` = global):

# %%
windows = gemma.config.sliding_window
print("Gemma 3 270M windows per layer:", windows)
kinds = np.array([[0 if w is None else 1 for w in windows]])
plt.figure(figsize=(8, 1.2))
plt.imshow(kinds, cmap="coolwarm", aspect="auto")
plt.yticks([])
plt.xticks(range(len(windows)))
plt.xlabel("layer (red: sliding window of 512, blue: global)")
plt.show()

# %% [markdown]
# The two masks drawn for 24 tokens, with a window of 6 so that it shows (Gemma's is 512).
# Rows are queries, columns keys; yellow is "may attend".

# %%
n, window = 24, 6
i, j = np.arange(n)[:, None], np.arange(n)[None, :]
causal = j <= i
local = causal & (i - j < window)
fig, ax = plt.subplots(1, 2, figsize=(8, 4))
ax[0].imshow(causal)
ax[0].set_title("global layer (causal)")
ax[1].imshow(local)
ax[1].set_title(f"local layer (window {window})")
for a in ax:
    a.set_xlabel("key position")
    a.set_ylabel("query position")
plt.tight_layout()

# %% [markdown]
# The decoder really applies that mask. A one-layer Gemma 3 with random weights and one local
# layer of window 4: changing the first token can only change the outputs of the positions that
# see it, 0 to 3. With a global layer, every later position changes.


# %%
def positions_that_see_token_0(layer_types):
    hf = transformers.Gemma3TextConfig(
        **{**SIZES, "num_hidden_layers": 1}, head_dim=16, sliding_window=4, layer_types=layer_types
    )
    model = DecoderForCausalLM(config_from_hf(hf), key=jax.random.key(0), std=0.2)
    ids = jnp.arange(10, 22)[None]
    changed = ids.at[0, 0].set(99)
    positions = jnp.arange(12)[None]
    # one compiled call instead of op-by-op dispatch; the model is an argument (jit inputs)
    forward = eqx.filter_jit(lambda m, x: m(x, positions, m.init_cache(1, 12))[0])
    a, b = forward(model, ids), forward(model, changed)
    return np.flatnonzero(np.abs(np.asarray(a - b)[0]).max(-1) > 1e-6).tolist()


print("local layer :", positions_that_see_token_0(["sliding_attention"]))
print("global layer:", positions_that_see_token_0(["full_attention"]))

# %% [markdown]
# ## Soft-capping (Gemma 2)
#
# Gemma 2 keeps attention scores and final logits from growing without bound by passing them
# through `cap * tanh(x / cap)`: the identity near 0, a smooth clamp at `±cap`. Its defaults are
# 50 for the attention scores and 30 for the final logits (`attn_logit_softcapping`,
# `final_logit_softcapping`); Gemma 3 replaced it with the q/k norms and sets neither.

# %%
gemma2 = transformers.Gemma2Config()
caps = {
    "attention": gemma2.attn_logit_softcapping,
    "final logits": gemma2.final_logit_softcapping,
}
s = np.linspace(-120, 120, 400)
plt.figure(figsize=(6, 4))
plt.plot(s, s, "k:", label="no cap")
for label, cap in caps.items():
    plt.plot(s, cap * np.tanh(s / cap), label=f"{label}: cap {cap:g}")
plt.ylim(-70, 70)
plt.xlabel("score before capping")
plt.ylabel("after")
plt.legend()
plt.show()
print("Gemma 3 270M:", gemma.config.attn_logit_softcapping, gemma.config.final_logit_softcapping)

# %% [markdown]
# ## Cache memory of a local and a global layer
#
# Each layer caches a key and a value vector per token, per key-value head:
# `2 x kv_heads x head_dim x 4 bytes` (float32) per token. A global layer needs every token of
# the sequence; a local layer never needs more than its window. For an 8,192-token sequence of
# Gemma 3 270M (1 key-value head of 256):

# %%
c = gemma.config
per_token = 2 * c.num_key_value_heads * c.head_dim * 4
length = 8192
needed = [per_token * (length if w is None else min(w, length)) for w in c.sliding_window]
cache = jax.eval_shape(lambda: gemma.init_cache(1, length))  # shapes only: nothing allocated
floats = [x for x in jax.tree.leaves(cache) if jnp.issubdtype(x.dtype, jnp.floating)]
allocated = sum(math.prod(x.shape) * x.dtype.itemsize for x in floats)
print(
    f"a global layer needs {per_token * length / 2**20:.1f} MiB, a local layer "
    f"{per_token * c.sliding_window[0] / 2**20:.1f} MiB"
)
print(
    f"all 18 layers need {sum(needed) / 2**20:.1f} MiB; full attention everywhere "
    f"{per_token * length * c.num_hidden_layers / 2**20:.1f} MiB"
)
print(f"init_cache(1, {length}) allocates {allocated / 2**20:.1f} MiB today")
plt.figure(figsize=(8, 3))
plt.bar(range(c.num_hidden_layers), np.array(needed) / 2**20)
plt.axhline(allocated / c.num_hidden_layers / 2**20, color="k", ls=":", label="allocated per layer")
plt.xlabel("layer")
plt.ylabel("MiB needed at 8,192 tokens")
plt.legend()
plt.show()

# %% [markdown]
# The local layers need 1/16 of a global layer's memory at 8,192 tokens, so the whole cache
# needs about a fifth of the full-attention figure. Where the printed allocation equals the
# full-attention figure, the local layers still keep every slot and the window is only a mask;
# a ring buffer of the window per local layer is what brings the allocation down to the need.
#
# ## Tokens per second
#
# Decoding one token reads every weight once, so at batch 1 the speed is bounded by memory
# bandwidth: bytes of weights / bandwidth. We time 16 greedy tokens for both real models (the
# faster of two calls, after a first call that compiles: the figures are this machine's, and
# noisy on a shared one). Gemma 3 270M has twice SmolLM2's parameters, and 168 M of its
# 268 M are the embedding of its 262,144-token vocabulary; its output head is that same matrix
# (tied), read in full for every token.


# %%
def tokens_per_second(model, tokenizer, new_tokens=16, repeats=2):
    """Greedy tokens per second at batch 1 (the fastest of `repeats` calls after a first one
    that compiles), and the text."""
    kw = dict(max_new_tokens=new_tokens, eos_token_id=(), sampler=fg.samplers.Greedy())
    fg.generate(model, tokenizer, ["The capital of France is"], **kw)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fg.generate(model, tokenizer, ["The capital of France is"], **kw)
        seconds.append(time.perf_counter() - start)
    return new_tokens / min(seconds), out.texts[0]


texts = {}
for name, model, tokenizer in [
    ("SmolLM2-135M", smollm, smollm_tokenizer),
    ("Gemma 3 270M", gemma, gemma_tokenizer),
]:
    weights = sum(x.nbytes for x in model.named_weights().values())
    rate, texts[name] = tokens_per_second(model, tokenizer)
    print(
        f"{name}: {rate:5.1f} tokens/s at batch 1; {weights / 2**20:.0f} MiB of float32 "
        f"weights, bound at 30 GB/s: {30e9 / weights:.0f} tokens/s"
    )

# %% [markdown]
# Tokens per second depend on the sizes (weights read per token, the vocabulary of the output
# head), not on which family the layers come from: a norm with `1 + weight` or a q/k norm costs
# next to nothing beside the matrix products. Both models generate from the same compiled loop,
# processors, samplers and structured constraints; what changed between them is one config.
# What each wrote, greedily, after "The capital of France is":

# %%
for name, text in texts.items():
    print(f"{name}: {text!r}")

# %% [markdown]
# ## Next
#
# [Speculative decoding](../speculative_decoding/): since a decode step is bound by memory
# bandwidth, score several guessed tokens in one call and keep the ones the model agrees with.
