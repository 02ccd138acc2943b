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
# # Classifier-free guidance
#
# Classifier-free guidance (CFG) came from diffusion models and was carried over to language
# models by Sanchez et al. 2023, "Stay on topic with Classifier-Free Guidance"
# (arXiv 2306.17806). At every step it compares two next-token distributions of the same
# model:
#
# - the **conditional** one, given the prompt: $\log P(w \mid \text{prompt})$;
# - the **unconditional** one, given almost nothing (transformers' default: only the prompt's
#   last token) or given a **negative prompt**: $\log P(w \mid \text{negative})$;
#
# and extrapolates from the second towards the first by the guidance scale $s$:
#
# $$\log P_\text{cfg}(w) = \log P(w \mid \text{negative}) + s \,\big(\log P(w \mid \text{prompt}) - \log P(w \mid \text{negative})\big)$$
#
# $s = 1$ is plain decoding; $s > 1$ favours the tokens that the prompt makes *more* likely
# than the negative prompt does (the text stays on the prompt's topic, or away from the
# negative prompt); $s = 0$ decodes from the negative prompt alone, which then acts as a
# positive prompt. Both branches are `log_softmax`ed before mixing.
#
# `fg.processors.ClassifierFreeGuidance(model, guidance_scale, negative_prompt_ids=None,
# rescale=None)` computes the unconditional branch itself: it holds the model, keeps the
# negative branch's `KVCache` in its processor state, and runs one more decode call per row and
# step. It must come first in the processor chain (it needs the raw conditional logits).
#
# **Before this:** [How logits processing works](../logits_processing/) (the processor
# protocol: `init`, `process`, a state per row) and [The KV cache and resumable
# generation](../kv_cache/) (a cache per row); [Beam search](../beam_search/) comes just before
# it, and CFG works under it. Terms are defined on [Words we use](../../concepts/wording/).
# %%
import time

import jax
import matplotlib.pyplot as plt
import numpy as np

import functional_gen as fg
from functional_gen import processors as P

model, tokenizer = fg.load_model()
CFG = P.ClassifierFreeGuidance
TOP = 10  # tokens shown in each chart

# %% [markdown]
# ## One real step, three distributions
#
# We take transformers' CFG example prompt and the negative prompt of its documentation, and
# look at the first generated token. `P.apply` runs a processor chain once, outside generation;
# with one row per scale, scale 1 gives the conditional distribution, scale 0 the
# unconditional (negative-prompt) one, and scale 3 the guided one.

# %%
prompt = "Today, a dragon flew over Paris, France,"
negative = "A very happy event happened,"
prompt_ids = tokenizer(prompt)["input_ids"]
negative_ids = tokenizer(negative)["input_ids"]

cond_logits = fg.init_state(model, [prompt_ids], max_new_tokens=1).logits[0]  # [vocab]
scales = [1.0, 0.0, 3.0]
rows = P.apply(
    [CFG(model, scales, negative_prompt_ids=negative_ids)],
    np.stack([cond_logits] * 3),
    np.asarray([prompt_ids] * 3),
)
names = ["conditional (s = 1)", "negative prompt (s = 0)", "guided (s = 3)"]

fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=False)
for ax, name, row in zip(axes, names, rows):
    p = np.asarray(jax.nn.softmax(row))
    ids = np.argsort(-p)[:TOP]
    ax.barh([repr(tokenizer.decode([int(i)])) for i in ids][::-1], p[ids][::-1])
    ax.set_title(name)
    ax.set_xlabel("probability")
fig.tight_layout()
plt.show()

# %% [markdown]
# The guided distribution is not a mixture of the other two: it sharpens the tokens that the
# prompt favours *relative to* the negative prompt and pushes down those that a happy event
# would make likely. With scale 3 the log-probability differences are tripled, so the chart
# is also peakier than the conditional one.
#
# ## How the text changes with the scale and a negative prompt
#
# One batch, one compiled program: `guidance_scale` and `negative_prompt_ids` are per-row
# values. A row's negative prompt equal to its prompt's last token is exactly transformers'
# default (no negative prompt), so rows with and without a negative prompt share the batch.

# %%
settings = [
    ("plain decoding (s = 1)", 1.0, prompt_ids[-1:]),
    ("s = 1.5", 1.5, prompt_ids[-1:]),
    ("s = 3", 3.0, prompt_ids[-1:]),
    ("s = 2, negative: happy event", 2.0, negative_ids),
    ("s = 0, 'negative' as a positive prompt", 0.0, negative_ids),
]
start = time.perf_counter()
result = fg.generate(
    model,
    tokenizer,
    [prompt] * len(settings),
    max_new_tokens=16,
    processors=[CFG(model, [s for _, s, _ in settings], [n for *_, n in settings])],
)
print(f"({time.perf_counter() - start:.1f} s, compilation included)\n")
for (label, _, _), text in zip(settings, result.texts):
    print(f"{label:>40}: {text!r}")

# %% [markdown]
# ## Does CFG keep the text on topic?
#
# A small measurement in the spirit of the paper: 8 prompts, each naming a topic, and a
# continuation of 24 greedy tokens without and with guidance ($s = 1.5$, the paper's usual
# value). A continuation counts as *on topic* when it mentions one of the topic's keywords.
# This is a crude judge on a 135M-parameter model, not a benchmark: read the table as an
# illustration of the measurement, not as a result about CFG.

# %%
TOPICS = [
    ("The best way to cook pasta is", ["pasta", "water", "boil", "salt", "sauce"]),
    ("My favourite thing about winter is", ["winter", "snow", "cold", "frost", "christmas"]),
    ("The main cause of ocean tides is", ["moon", "tide", "gravit"]),
    ("The planet Mars is known for", ["mars", "red", "planet"]),
    ("The most important rule of chess is", ["chess", "king", "piece", "move", "board"]),
    ("Bees are important to farmers because", ["bee", "pollin", "flower", "crop", "honey"]),
    ("Volcanoes erupt when", ["magma", "lava", "volcan", "pressure", "erupt"]),
    ("The secret to baking bread is", ["bread", "dough", "yeast", "flour", "bak"]),
]
GUIDED = 1.5
prompts = [p for p, _ in TOPICS] * 2
scales = [1.0] * len(TOPICS) + [GUIDED] * len(TOPICS)
start = time.perf_counter()
result = fg.generate(
    model,
    tokenizer,
    prompts,
    max_new_tokens=24,
    processors=[CFG(model, scales)],
)
print(f"{len(prompts)} continuations in {time.perf_counter() - start:.1f} s (compilation included)")


def on_topic(text, keywords):
    return any(k in text.lower() for k in keywords)


hits = np.asarray([on_topic(t, kw) for t, (_, kw) in zip(result.texts, TOPICS * 2)]).reshape(
    2, len(TOPICS)
)
print(f"\n{'decoding':>24} | on-topic continuations")
print("-" * 50)
for label, row in zip(["plain (s = 1)", f"CFG (s = {GUIDED})"], hits):
    print(f"{label:>24} | {row.sum():>2} / {len(TOPICS)} ({row.mean():.0%})")

# %% [markdown]
# The rows where the two decodings disagree show what guidance did to the text:

# %%
for i, (p, _) in enumerate(TOPICS):
    if hits[0, i] != hits[1, i]:
        print(
            f"{p}\n   s = 1  : {result.texts[i]!r}\n   s = {GUIDED}: {result.texts[len(TOPICS) + i]!r}\n"
        )

# %% [markdown]
# ## Cost and caveats
#
# - The processor form runs a second decode call per step, so a guided step costs about twice
#   a plain one (see `benchmarks/bench_cfg.py`); the negative branch's cache lives in the
#   processor state and is reordered with the rows, like every other state.
# - `rescale=r` blends the guided distribution back with the conditional one,
#   `log_softmax(r * log_softmax(cfg) + (1 - r) * cond)` (the first implementation in the
#   transformers issue used `r = 0.7`), which keeps fluency at high scales.
# - High scales sharpen the distribution a lot: with sampling, combine CFG with a temperature
#   or a `MinP` filter after it, and keep it first in the chain.

# %% [markdown]
# ## Next
#
# [Structured generation on the device](../structured_generation/): constraints (a regex, a
# JSON Schema, a grammar) as processors whose state is a few integers.
