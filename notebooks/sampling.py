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
# # Sampling: temperature, top-k, top-p and what a logprob says
#
# The previous tutorial showed what each processor does to one distribution. This one asks how
# to choose them:
#
# - temperature as a sweep: the probability of the most likely token and the entropy of the
#   distribution against `T`, from `T → 0` (greedy) to `T → ∞` (uniform);
# - top-k against top-p on a peaked and on a flat distribution: a fixed count of tokens
#   against a fixed share of the probability;
# - greedy decoding's repetition loop on the real model, and what the logprobs and the
#   perplexity of a text say (and do not say) about it.
#
# **Before this:** [How logits processing works](../logits_processing/) (logits, softmax,
# `Temperature`, `TopK`, `TopP`, `fg.processors.apply`). Terms are defined on
# [Words we use](../../concepts/wording/), among them [entropy](../../concepts/wording/#entropy)
# and [perplexity](../../concepts/wording/#perplexity).

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import functional_gen as fg
from functional_gen import processors as P

model, tokenizer = fg.load_model()


def next_token_logits(prompts):
    """The next-token logits of each prompt (one prefill, no generation)."""
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    return fg.init_state(model, ids, max_new_tokens=1).logits


peaked_prompt, flat_prompt = "The capital of France is", "My favourite fruit is the"
logits = next_token_logits([peaked_prompt, flat_prompt])

# %% [markdown]
# ## Temperature, swept
#
# `Temperature(T)` samples from `softmax(logits / T)`. Two numbers describe what it does: the
# probability of the most likely token, and the [entropy](../../concepts/wording/#entropy)
# `H = -Σ p log p`, which is 0 when one token is certain and `log(49,152) ≈ 10.8` nats when all
# are equally likely. As `T → 0` the largest logit wins outright: sampling becomes greedy
# decoding. As `T → ∞` every logit divided by `T` goes to 0: the distribution becomes uniform
# over the whole vocabulary, junk included.

# %%
temperatures = np.logspace(-2, 2, 41)
vocab = logits.shape[-1]
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
for row, name in enumerate([f"peaked: {peaked_prompt!r}", f"flat: {flat_prompt!r}"]):
    top1, entropy = [], []
    for t in temperatures:
        logprobs = jax.nn.log_softmax(logits[row] / t)
        top1.append(float(jnp.exp(logprobs.max())))
        entropy.append(
            float(-(jnp.exp(logprobs) * jnp.where(jnp.isfinite(logprobs), logprobs, 0)).sum())
        )
    axes[0].semilogx(temperatures, top1, label=name)
    axes[1].semilogx(temperatures, entropy, label=name)
axes[0].axhline(1 / vocab, color="gray", ls=":", label="uniform: 1 / vocab")
axes[1].axhline(np.log(vocab), color="gray", ls=":", label="uniform: log(vocab)")
for ax in axes:
    ax.axvline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("temperature T (log scale)")
axes[0].set_ylabel("probability of the top token")
axes[1].set_ylabel("entropy (nats)")
axes[0].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Both curves go from greedy on the left to uniform on the right (entropy `log(49,152) ≈ 10.8`
# nats from about `T = 5`), but not at the same pace. The peaked distribution is effectively
# greedy up to `T ≈ 0.5` and loses its answer between 1 and 2. The flat one, whose first few
# fruits have nearly equal logits, is far from greedy even at `T = 0.1`: `T → 0` reaches greedy
# only once `T` is small against the gaps between the top logits. The useful range is narrow,
# around 0.5–1.5, and the same `T` does different things to the two prompts. That is why
# temperature alone is not enough, and why truncation comes next.
#
# ## Top-k against top-p
#
# `TopK(k)` keeps a fixed **number** of tokens, `TopP(p)` the smallest set of top tokens whose
# probabilities reach a fixed **share** `p`. On each prompt's distribution, sorted, the dashed
# line is where `TopK(20)` cuts and the dotted one where `TopP(0.9)` cuts:

# %%
K, TOP_P = 20, 0.9
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5), sharey=True)
for row, (ax, prompt) in enumerate(zip(axes, [peaked_prompt, flat_prompt])):
    p_sorted = np.sort(np.asarray(jax.nn.softmax(logits[row])))[::-1]
    ids = jnp.asarray([tokenizer(prompt)["input_ids"]])
    kept = {}
    for name, proc in [(f"TopK({K})", P.TopK(K)), (f"TopP({TOP_P})", P.TopP(TOP_P))]:
        out = np.asarray(P.apply([proc], logits[row : row + 1], ids))
        kept[name] = int(np.isfinite(out).sum())
    ranks = np.arange(1, 1001)
    ax.loglog(ranks, p_sorted[:1000], color="black")
    ax.axvline(kept[f"TopK({K})"], color="tab:blue", ls="--")
    ax.axvline(kept[f"TopP({TOP_P})"], color="tab:orange", ls=":")
    ax.set_title(
        f"{prompt!r}\nTopK({K}) keeps {kept[f'TopK({K})']} tokens "
        f"({p_sorted[:K].sum():.0%} of the mass); TopP({TOP_P}) keeps {kept[f'TopP({TOP_P})']}",
        fontsize=9,
    )
    ax.set_xlabel("rank of the token")
axes[0].set_ylabel("probability")
plt.tight_layout()
plt.show()

# %% [markdown]
# On the peaked distribution top-p keeps a handful of tokens, while top-k keeps 20 whatever
# happens, including tokens the model gives well under 1%: renormalised, they get sampled now
# and then, and one bad token can derail a text. On the flat distribution top-p keeps far more
# than 20 plausible continuations, while top-k throws most of them away. Top-p adapts to the
# model's confidence; top-k does not. (`MinP`, cut at a fraction of the top token's probability,
# adapts too, and is cheaper than sorting.)
#
# ## Greedy's repetition loop
#
# Greedy decoding looks safe: always the most likely token. On open-ended text it often falls
# into a loop, because once a phrase repeats, repeating it again becomes the most likely
# continuation. We decode one short raw prompt greedily and by plain sampling (`T = 1`, no
# truncation), and look at the logprob of every chosen token.

# %%
prompt = "I went to the market and"
greedy = fg.generate(model, tokenizer, [prompt], max_new_tokens=32, eos_token_id=())
sampled = fg.generate(
    model,
    tokenizer,
    [prompt],
    max_new_tokens=32,
    eos_token_id=(),
    sampler=fg.samplers.Multinomial(),
    key=jax.random.key(0),
)
print("greedy :", repr(greedy.texts[0]))
print("sampled:", repr(sampled.texts[0]))

# %% [markdown]
# With no processors, `result.logprobs` are the model's own logprobs of the chosen tokens. The
# [perplexity](../../concepts/wording/#perplexity) of a text is `exp(-mean logprob)`: 1 when the
# model was certain of every token, larger the more it hesitated.

# %%
fig, ax = plt.subplots(figsize=(10, 3.2))
for name, out in [("greedy", greedy), ("sampled, T = 1", sampled)]:
    lp = np.asarray(out.logprobs[0, : int(out.num_tokens[0])])
    whole, last = np.exp(-lp.mean()), np.exp(-lp[-16:].mean())
    ax.plot(lp, marker=".", label=f"{name}: perplexity {whole:.2f} (last 16 tokens {last:.2f})")
ax.set_xlabel("generated token")
ax.set_ylabel("logprob of the chosen token")
ax.set_title("Once the loop starts, the model is sure of every token")
ax.legend(loc="lower left")
plt.show()

# %% [markdown]
# Greedy's logprobs climb to nearly 0 once it repeats itself: the model becomes more and more
# certain of the loop, and the perplexity of the repeated part is close to 1. The sampled text
# has a far higher perplexity, and is the more varied text. So a low perplexity, or high logprobs, say that the model found
# the text predictable, not that the text is good; a run of logprobs near 0 after varied ones is
# a cheap signal of a loop. The remedies are the ones of the previous tutorial: sample (with
# `Temperature` and `TopP` or `MinP`), or penalise repetition (`RepetitionPenalty`,
# `NoRepeatNGram`, `DRY`); beam search, next, makes loops *more* likely unless it is given
# such a penalty.

# %% [markdown]
# ## Next
#
# [Beam search](../beam_search/): keep several whole sequences instead of one token at a time.
