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
# # Tokens and tokenization
#
# A language model never sees characters. The tokenizer cuts text into **tokens**, pieces from
# a fixed vocabulary, and the model reads and writes their ids. Most surprises of text
# generation at the edges (an odd first word, a `�` in a stream, a chat that rambles) come from
# this step. This notebook, on the default model's tokenizer (SmolLM2, byte-level BPE, 49,152
# tokens):
#
# - cuts words and texts into tokens, and counts how many characters a token holds per script;
# - renders a chat template, the text a chat prompt really is;
# - shows the prompt-boundary problem (a prompt that ends in the middle of what would be one
#   token) on the real model, and token healing, the fix a user can apply with a processor;
# - shows tokens that hold half a UTF-8 character, and how a stream holds them back.
#
# **Before this:** the [Quickstart](../quickstart/), which generates from raw text and from a
# chat. This tutorial comes right after it because everything that follows counts in tokens:
# the prefill is a call over the prompt's tokens, the logits score every token of the
# vocabulary, constraints allow or forbid tokens. Words are defined on
# [Words we use](../../concepts/wording/).

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import functional_gen as fg

model, tokenizer = fg.load_model()

# %% [markdown]
# ## A word is often several tokens
#
# Byte-pair encoding (BPE) starts from single bytes and merges the pairs that were most frequent
# in its training text into new tokens, until the vocabulary is full. Frequent words are one
# token; rarer ones are built from pieces. A leading space belongs to the token after it (`Ġ`
# in the tokenizer's own spelling stands for the space byte), so `" cat"` and `"cat"` are
# different tokens.

# %%
for word in [
    " cat",
    "cat",
    " Constantinople",
    " tokenization",
    " unbelievably",
    " antidisestablishmentarianism",
]:
    ids = tokenizer(word)["input_ids"]
    print(f"{word!r:32} {len(ids)} token(s): {tokenizer.convert_ids_to_tokens(ids)}  ids {ids}")

# %% [markdown]
# How much text a token holds depends on what the tokenizer was trained on. SmolLM2's was
# mostly English and code; other scripts fall back to fewer characters per token, so the same
# message costs more tokens (more compute, less context) in them.

# %%
samples = {
    "English": "The weather is lovely today, so we are going for a long walk by the river.",
    "Python": "def area(radius):\n    return 3.14159 * radius ** 2\n",
    "French": "Il fait très beau aujourd'hui, alors nous allons nous promener le long du fleuve.",
    "Russian": "Сегодня прекрасная погода, поэтому мы идём на долгую прогулку вдоль реки.",
    "Chinese": "今天天气很好，所以我们要沿着河边散步很久。",
    "emoji": "🌞🌳🚶‍♀️🌊🦆🍦",
}
per_token = {name: len(text) / len(tokenizer(text)["input_ids"]) for name, text in samples.items()}
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.barh(list(per_token), list(per_token.values()))
ax.invert_yaxis()
ax.set_xlabel("characters per token")
ax.set_title("How much text one SmolLM2 token holds")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Chat templates
#
# A chat model was trained on conversations written in one exact format, with special tokens
# around each turn. The tokenizer carries that format as a Jinja template, the **chat
# template**; `fg.generate` applies it to a prompt that is a list of messages (and sends a `str`
# prompt as is). Rendered as text, a one-message chat is:

# %%
chat = [{"role": "user", "content": "Hi!"}]
rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
print(rendered)

# %% [markdown]
# Three things to notice. The template added a **system prompt** we never wrote (SmolLM2's
# default). Each turn sits between `<|im_start|>` and `<|im_end|>`, which are single special
# tokens, not the characters `<`, `|`, ...: they cannot be typed by a user in a message.
# And `add_generation_prompt=True` ends the text with the start of the assistant's turn, so the
# model's next tokens are the answer; the answer ends when the model writes `<|im_end|>`, one of
# its end-of-generation ids (the quickstart printed them).

# %%
ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
tokens = tokenizer.convert_ids_to_tokens(ids)
print(
    len(ids),
    "tokens; the special ones:",
    [(t, i) for t, i in zip(tokens, ids) if t in tokenizer.all_special_tokens],
)
print("end-of-generation ids of the model:", model.config.eos_token_id)

# %% [markdown]
# ## The prompt-boundary problem
#
# A prompt ending in a space looks harmless: `"The capital of France is "`. But the tokenizer
# puts a space at the *start* of the next word's token (`" Paris"` is one token), so the
# prompt's last token is now a lone `"Ġ"`, and in the training text a lone space token is
# almost never followed by a word. The model is asked to continue from a state it rarely saw.
# `fg.init_state` runs the prefill of both prompts and gives their next-token logits:

# %%
prompts = ["The capital of France is", "The capital of France is "]
prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
for p, ids in zip(prompts, prompt_ids):
    print(f"{p!r:30} -> {tokenizer.convert_ids_to_tokens(ids)}")
state = fg.init_state(model, prompt_ids, max_new_tokens=1)
probs = np.asarray(jax.nn.softmax(state.logits, axis=-1))

fig, axes = plt.subplots(1, 2, figsize=(10, 3))
for ax, p, row in zip(axes, prompts, probs):
    top = np.argsort(-row)[:8]
    ax.barh([repr(tokenizer.decode([int(t)])) for t in top], row[top])
    ax.invert_yaxis()
    ax.set_title(f"next token after {p!r}")
    ax.set_xlabel("probability")
plt.tight_layout()
plt.show()

# %% [markdown]
# Without the space, `" Paris"` leads. With it, the model cannot write `" Paris"` (that would
# make two spaces) and has to continue from a lone space token, which in its training text came
# mostly before numbers: digits take the head of the distribution. Greedy continuations of the
# two prompts:

# %%
rows = fg.SequenceState.from_token_ids(prompt_ids, vocab_size=model.vocab_size, tokenizer=tokenizer)
plain = fg.generate(model, tokenizer, rows, max_new_tokens=8)
for p, text in zip(prompts, plain.texts):
    print(f"{p!r:30} -> {text!r}")

# %% [markdown]
# ### Token healing
#
# The simplest fix is to strip trailing whitespace from prompts. The general one, **token
# healing** (Microsoft's guidance library; transformers' `token_healing` option), backs off the
# prompt's last token and makes the first generated token start with the text it covered, so
# the model chooses the boundary itself. `functional_gen` has no healing option, but it is a
# few lines with a processor: drop the last token, and at the first step (`num_generated == 0`)
# allow only tokens whose text starts with the removed text.

# %%
vocabulary_text = [tokenizer.decode([i]) for i in range(model.vocab_size)]


def heal(ids):
    """The prompt without its last token, and a processor that makes the first generated token
    start with that token's text."""
    removed = tokenizer.decode(ids[-1:])
    starts = jnp.asarray([t.startswith(removed) for t in vocabulary_text])

    def first_token_covers(logits, context):
        return jnp.where((context.num_generated > 0) | starts, logits, -jnp.inf)

    return ids[:-1], removed, fg.processors.Stateless(first_token_covers)


healed_ids, removed, healing = heal(prompt_ids[1])
print(
    f"removed {removed!r}; {int(sum(t.startswith(removed) for t in vocabulary_text))} tokens may start the answer"
)
healed = fg.generate(
    model,
    tokenizer,
    fg.SequenceState.from_token_ids([healed_ids], vocab_size=model.vocab_size, tokenizer=tokenizer),
    max_new_tokens=8,
    processors=[healing],
)
# the generated text now begins with the removed text: the prompt as the user wrote it, continued
print(repr(prompts[1]), "->", repr(healed.texts[0][len(removed) :]))

# %% [markdown]
# The answer is the one the prompt without the space gets. The same problem hits any prompt that
# ends inside a would-be token: `"Visit https:"` ends on `":"` where the model would write
# `"://"` as one token; healing backs off `":"` and lets the model pick `"://"`.
#
# ## Half a character in a token
#
# A byte-level BPE vocabulary is built over UTF-8 **bytes**, not characters, so a token may hold
# part of a multi-byte character. In `"🍕"` (four bytes) SmolLM2's tokens split the emoji:

# %%
# A byte-level BPE tokenizer spells each byte as one printable character (GPT-2's
# `bytes_to_unicode`: printable bytes stand for themselves, the others are moved to U+0100 on).
printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
moved = [b for b in range(256) if b not in printable]
byte_of = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(moved)}
text = "Zoë paid 5€ for 🍕"
ids = tokenizer(text)["input_ids"]
for token in tokenizer.convert_ids_to_tokens(ids):
    raw = bytes(byte_of[c] for c in token)
    print(f"{token!r:10} bytes {raw.hex(' '):14} decoded alone: {raw.decode('utf-8', 'replace')!r}")

# %% [markdown]
# `' ðŁ'` is a space and the first two bytes of the emoji, `'į'` and `'ķ'` its last two: each
# decoded alone is `�` (U+FFFD, the replacement character). A stream that printed each token's
# text as it arrived would print `�` three times. `fg.stream` decodes a short window of recent
# tokens instead and hands out only the text that is complete, holding back the bytes of an
# unfinished character until the token that completes it arrives (the incremental detokenizer
# of vLLM and text-generation-inference). The rule, in a few lines:

# %%
naive, held = [], []
start = 0  # tokens before `start` have been handed out
for n in range(1, len(ids) + 1):
    naive.append(tokenizer.decode(ids[n - 1 : n]))
    piece = tokenizer.decode(ids[start:n])
    if not piece.endswith("\ufffd"):  # complete: hand it out
        held.append(piece)
        start = n
print("token by token:", naive)
print("held back     :", held)
assert "".join(held) == text

# %% [markdown]
# ## Next
#
# [The KV cache and resumable generation](../kv_cache/): what the prefill computes for these
# tokens, why decoding keeps it, and how a generation's state is continued, forked and saved.
