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
# # How logits processing works
#
# A language model does not write text; it scores every token of its vocabulary as the next
# one. Everything between those scores and the token that gets written is *logits
# processing*. This notebook shows it on a real model, SmolLM2-135M-Instruct:
#
# - what logits are, and how they become probabilities;
# - what each family of processors does to a real next-token distribution (temperature,
#   truncation, penalties, token rules, randomness), with a bar chart before and after;
# - how to write a stateless processor from a plain function with `Stateless`;
# - how to write a stateful one from scratch, a tiny finite-state machine that forces a date
#   format, and why its state must keep its shape inside `jax.lax.while_loop`;
# - how processors compose in `generate`.
#
# **Before this:** [The KV cache and resumable generation](../kv_cache/) (prefill and decode)
# and [Tokens and tokenization](../tokenization/) (the vocabulary the logits score). Terms are
# defined on [Words we use](../../concepts/wording/).

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import functional_gen as fg
from functional_gen import processors as P

TOP = 12  # tokens shown in each chart
SEED = 0

model, tokenizer = fg.load_model()

# %% [markdown]
# ## What logits are
#
# We [prefill](../../concepts/wording/#prefill) a prompt (one model call over all its tokens, which fills the key/value cache)
# and look at the scores for the token that comes next. `init_state` does exactly that and
# keeps those scores in `state.logits`: one float per vocabulary entry.

# %%
prompt = "My favourite fruit is the"
prompt_ids = tokenizer(prompt)["input_ids"]
state = fg.init_state(model, [prompt_ids], max_new_tokens=1)
logits = state.logits  # [batch=1, vocab]
print(logits.shape, logits.dtype)
print("min", float(logits.min()), "max", float(logits.max()))

# %% [markdown]
# These are **logits**: unnormalised scores, any real numbers. Softmax turns them into
# probabilities, and `log_softmax` into **logprobs**. Adding the same constant to every logit
# changes nothing after softmax: only differences between logits matter.

# %%
probs = jax.nn.softmax(logits[0])
shifted = jax.nn.softmax(logits[0] + 100.0)
print("probabilities sum to", float(probs.sum()))
print("shift-invariant:", bool(jnp.allclose(probs, shifted, atol=1e-6)))


def top_tokens(logits_row, k=TOP):
    """The k most likely tokens: (labels, probabilities)."""
    p = np.asarray(jax.nn.softmax(logits_row))
    ids = np.argsort(-p)[:k]
    labels = [repr(tokenizer.decode([int(i)])) for i in ids]
    return ids, labels, p[ids]


ids, labels, p = top_tokens(logits[0])
for label, value in zip(labels, p):
    print(f"{label:>14} {value:.3f}")

# %% [markdown]
# The distribution has a head of likely tokens and a long tail over the other 49,000.
# A chart helper: the probabilities of the `TOP` tokens that were most likely *before*
# processing, before and after, so bars can be compared one to one.


# %%
def show(processors, title, logits=logits, token_ids=None, prompt_length=None, key=None):
    """Bar charts of the top tokens' probabilities before and after `processors`."""
    token_ids = jnp.asarray([prompt_ids]) if token_ids is None else token_ids
    after = P.apply(processors, logits, token_ids, prompt_length=prompt_length, key=key)
    ids, labels, before_p = top_tokens(logits[0])
    after_p = np.asarray(jax.nn.softmax(after[0]))[ids]
    kept = int(np.isfinite(np.asarray(after[0])).sum())
    _, ax = plt.subplots(figsize=(9, 2.6))
    x = np.arange(len(ids))
    ax.bar(x - 0.2, before_p, 0.4, label="before")
    ax.bar(x + 0.2, after_p, 0.4, label="after")
    ax.set_xticks(x, labels, rotation=45, ha="right")
    ax.set_ylabel("probability")
    ax.set_title(f"{title}  ({kept} of {after.shape[-1]} tokens still possible)")
    ax.legend()
    plt.show()
    return after


# %% [markdown]
# ## Temperature: sharpen or flatten
#
# `Temperature(t)` divides the logits by `t`. Below 1 the gaps between logits grow and the
# head gets more of the mass; above 1 they shrink and the tail gains. No token is removed.

# %%
_ = show([P.Temperature(0.5)], "Temperature(0.5)")
_ = show([P.Temperature(1.5)], "Temperature(1.5)")

# %% [markdown]
# Those charts show 12 tokens of 49,152. The tail is the rest: every token sorted from most to
# least likely, on log scales, so that a probability of 1e-9 is as visible as one of 0.5. At
# `T = 1.5` the whole curve tilts up: the head loses mass and tens of thousands of tail tokens
# gain it (the legend gives the mass outside the top 12 at each `T`); at `T = 0.5` that mass
# shrinks to a fraction, and the far tail drops by many orders of magnitude.

# %%
ranks = np.arange(1, logits.shape[-1] + 1)
fig, ax = plt.subplots(figsize=(7, 3.6))
for t in (0.5, 1.0, 1.5):
    p_sorted = np.sort(np.asarray(jax.nn.softmax(logits[0] / t)))[::-1]
    tail = p_sorted[TOP:].sum()
    ax.loglog(ranks, p_sorted, label=f"T = {t}: mass outside the top {TOP} = {tail:.2f}")
ax.axvline(TOP, color="gray", lw=0.8, ls="--")
ax.set_xlabel("rank of the token (1 = most likely)")
ax.set_ylabel("probability")
ax.set_title("The whole distribution, sorted: the tail")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Truncation: cut the tail
#
# Truncation processors set unlikely tokens to `-inf` (probability exactly zero) and leave
# the rest, which softmax renormalises. They differ in how they decide where the tail starts:
#
# - `TopK(k)` keeps the k largest logits;
# - `TopP(p)` (nucleus) keeps the smallest set of top tokens whose probabilities reach p;
# - `MinP(p)` keeps tokens at least p times as likely as the top one;
# - `TypicalP`, `EpsilonCutoff`, `EtaCutoff` and `TopNSigma` use the entropy, an absolute
#   probability floor, an entropy-scaled floor, and the logits' standard deviation.

# %%
_ = show([P.TopK(5)], "TopK(5)")
_ = show([P.TopP(0.5)], "TopP(0.5)")
_ = show([P.MinP(0.2)], "MinP(0.2)")

# %% [markdown]
# How many tokens each rule keeps on this distribution:

# %%
for proc in [
    P.TopK(5),
    P.TopP(0.9),
    P.MinP(0.05),
    P.TypicalP(0.9),
    P.EpsilonCutoff(3e-4),
    P.EtaCutoff(3e-4),
    P.TopNSigma(1.0),
]:
    out = P.apply([proc], logits, jnp.asarray([prompt_ids]))
    print(f"{type(proc).__name__:>14}: {int(np.isfinite(np.asarray(out)).sum()):>6} tokens kept")

# %% [markdown]
# ## Penalties: discourage repetition
#
# Penalties look at the tokens so far (`context.token_ids`). We take a text that already
# mentions some fruit and ask which fruit comes next.

# %%
seen_text = "I like apple pie, apple juice and apple jam. My favourite fruit is the"
seen_ids = jnp.asarray([tokenizer(seen_text)["input_ids"]])
seen_logits = fg.init_state(model, [seen_ids[0].tolist()], max_new_tokens=1).logits
_ = show([P.RepetitionPenalty(1.5)], "RepetitionPenalty(1.5)", seen_logits, seen_ids)

# %% [markdown]
# `RepetitionPenalty` (transformers, CTRL) scales the logit of every token already present,
# prompt included. `PresencePenalty` and `FrequencyPenalty` (OpenAI, vLLM) subtract a fixed
# amount, or an amount per occurrence, and count *generated* tokens only. To see them act we
# declare the first five tokens the prompt, so the rest counts as generated:

# %%
_ = show([P.FrequencyPenalty(1.0)], "FrequencyPenalty(1.0)", seen_logits, seen_ids, prompt_length=5)

# %% [markdown]
# `NoRepeatNGram(n)` forbids any token that would repeat an n-gram already in the text, and
# llama.cpp's `DRY` penalises tokens that would extend a repeated sequence, more the longer it
# is. Here the 2-gram "the apple" is not repeatable, so after "... the" ... "apple" is banned:

# %%
ngram_ids = jnp.asarray([tokenizer("I ate the apple. Then I ate the")["input_ids"]])
ngram_logits = fg.init_state(model, [ngram_ids[0].tolist()], max_new_tokens=1).logits
_ = show([P.NoRepeatNGram(2)], "NoRepeatNGram(2)", ngram_logits, ngram_ids)

# %% [markdown]
# ## Token rules: forbid, force, bias
#
# Some processors act on named tokens: `SuppressTokens` forbids them, `LogitBias` adds a
# bias to them, `BadWords` forbids token *sequences*, `MinNewTokens` forbids the EOS tokens
# until enough tokens were generated. Token ids come from the tokenizer.

# %%
banana = tokenizer(" banana")["input_ids"][0]
apple = tokenizer(" apple")["input_ids"][0]
_ = show([P.LogitBias({banana: 3.0, apple: -100.0})], "LogitBias(+3 ' banana', -100 ' apple')")

# %% [markdown]
# ## Randomness inside a processor
#
# `XTC` (llama.cpp's "exclude top choices") sometimes removes the *most* likely tokens (all
# those above `xtc_threshold` but the least likely of them), to push the model off its most
# predictable path. Whether it fires is random, with probability `xtc_probability`: it draws
# from the row's `context.key`, which differs at every step and for every row.

# %%
xtc = P.XTC(xtc_threshold=0.03, xtc_probability=0.5)  # tokens above 3% are "top choices"
for seed in range(6):
    out = P.apply([xtc], logits, jnp.asarray([prompt_ids]), key=jax.random.key(seed))
    removed = int(jnp.isinf(out[0]).sum())
    print(
        f"key {seed}: {removed} top choices removed, most likely now {tokenizer.decode([int(jnp.argmax(out[0]))])!r}"
    )

# %% [markdown]
# ## A stateless processor from a function
#
# Any function `fn(logits, context) -> logits` written for one row is a processor: wrap it in
# `Stateless`, or just put it in the list. Here: no token containing a letter "e". The mask is
# computed once, outside, and the function closes over it.

# %%
has_e = jnp.asarray(["e" in tokenizer.decode([i]).lower() for i in range(model.config.vocab_size)])


def no_letter_e(logits, context):
    return jnp.where(has_e, -jnp.inf, logits)


_ = show([P.Stateless(no_letter_e)], "Stateless(no_letter_e)")
result = fg.generate(
    model, tokenizer, ["A short story about a cat:"], processors=[no_letter_e], max_new_tokens=16
)
print(result.texts[0])

# %% [markdown]
# ## A stateful processor from scratch: forcing a date format
#
# Some rules depend on what was generated so far. A date in the form `YYYY-MM-DD` is a
# regular language, so a finite-state machine (FSM) can enforce it: in each state, some tokens
# are allowed and each allowed token leads to a next state. SmolLM2 writes digits and `-` as
# one-character tokens, so the machine works token by token:

# %%
digits = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789"]
dash = tokenizer.convert_tokens_to_ids("-")
print("digit ids", digits, "dash id", dash)

# token classes: 0 = anything else, 1..10 = the digits 0..9, 11 = "-"
token_class = np.zeros(model.config.vocab_size, np.int32)
for d, t in enumerate(digits):
    token_class[t] = 1 + d
token_class[dash] = 11

# next_state[state, class], -1 = not allowed. States: 0-3 year digits, 4 "-", 5 month tens,
# 6 month units after "0", 7 month units after "1", 8 "-", 9 day tens, 10 day units after 0-2,
# 11 day units after "3", 12 done (only EOS allowed).
DONE = 12
next_state = -np.ones((13, 12), np.int32)


def allow(state, chars, target):
    for c in chars:
        next_state[state, 11 if c == "-" else 1 + int(c)] = target


for s in range(4):
    allow(s, "0123456789", s + 1)
allow(4, "-", 5)
allow(5, "0", 6)
allow(5, "1", 7)
allow(6, "123456789", 8)
allow(7, "012", 8)
allow(8, "-", 9)
allow(9, "012", 10)
allow(9, "3", 11)
allow(10, "0123456789", DONE)
allow(11, "01", DONE)
print(next_state[5:8])

# %% [markdown]
# The processor keeps the FSM state in its **state**. The token chosen at step *t* is only
# known after `process` returned, so the processor advances on it at the start of step *t+1*,
# reading `context.last_token_id` (at the very first step that is the prompt's last token,
# which is skipped). The tables are **fields** of the processor, shared by all rows, not part
# of the per-row state.


# %%
import equinox as eqx  # noqa: E402


class DateFormat(P.AbstractLogitsProcessor):
    token_class: jax.Array
    next_state: jax.Array
    eos_token_id: tuple[int, ...] = eqx.field(static=True)

    def init(self, context):
        return jnp.zeros((), jnp.int32)  # state 0: expecting the first year digit

    def process(self, state, logits, context):
        # 1. advance on the token chosen at the previous step (none before the first step)
        moved = self.next_state[state, self.token_class[context.last_token_id]]
        state = jnp.where(context.num_generated > 0, moved, state)
        # 2. allow what the current state allows
        allowed = self.next_state[state][self.token_class] >= 0
        allowed = allowed & (self.token_class > 0)  # class 0 never allowed
        is_eos = jnp.zeros_like(allowed).at[jnp.asarray(self.eos_token_id)].set(True)
        allowed = jnp.where(state == DONE, is_eos, allowed)
        return state, jnp.where(allowed, logits, -jnp.inf)


date_format = DateFormat(
    jnp.asarray(token_class), jnp.asarray(next_state), model.config.eos_token_id
)
question = [
    {"role": "user", "content": "When did the first person walk on the Moon? Give the date."}
]
result = fg.generate(model, tokenizer, [question], processors=[date_format], max_new_tokens=16)
print(repr(result.texts[0]), result.finish_reasons[0])

# %% [markdown]
# The answer has the form `YYYY-MM-DD` whatever the model would have preferred, and the row
# ended on EOS as soon as the date was complete. The same machine works for a whole batch:
# every row carries its own int32 state.
#
# ### Why the state must keep its shape
#
# `generate` runs the steps inside [`jax.lax.while_loop`](../../concepts/wording/#while-loop), whose carry (the whole generation
# state, processor states included) must have the same structure, shapes and dtypes at every
# iteration: the loop is compiled once, for those shapes. A state that changes (a Python list
# that grows, an int that becomes a float) cannot be a carry:


# %%
def grows(carry):
    history, step = carry
    return jnp.concatenate([history, step[None]]), step + 1


try:
    jax.lax.while_loop(lambda c: c[1] < 3, grows, (jnp.zeros((0,), jnp.int32), jnp.int32(0)))
except TypeError as error:
    print(type(error).__name__ + ":", str(error).splitlines()[0])

# %% [markdown]
# That is why `init` must return the final-shape state (here one int32), why anything large
# and shared goes into fields, and why the library tests every processor for it. The same
# rule lets beam search or forking reorder all states at once with one gather.
#
# ## Composing processors in `generate`
#
# A list of processors runs in order, each on the previous one's logits; their states form a
# tuple. Float parameters may also be given per row: one compiled batch can sample each row
# with its own temperature.

# %%
chain = [
    P.RepetitionPenalty(1.2),
    P.Temperature(jnp.asarray([0.3, 1.3])),  # one temperature per row
    P.TopK(40),
    P.TopP(0.95),
]
result = fg.generate(
    model,
    tokenizer,
    ["The ocean at night", "The ocean at night"],
    processors=chain,
    sampler=fg.samplers.Multinomial(),
    key=jax.random.key(SEED),
    max_new_tokens=16,
)
for t, text in zip([0.3, 1.3], result.texts):
    print(f"temperature {t}: {text!r}")

# %% [markdown]
# ## Next
#
# [Sampling: temperature, top-k, top-p and what a logprob says](../sampling/): the processors
# above as sampling knobs, swept and compared, and what greedy decoding does wrong.
