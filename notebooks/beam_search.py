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
# # Beam search
#
# Greedy decoding commits to the most likely token at every step. **Beam search** keeps the
# `num_beams` most likely *sequences* instead: at each step every beam proposes continuations,
# and the best `num_beams` of all of them survive. This notebook:
#
# - compares greedy decoding with beam search on the default model;
# - draws the search tree of a short generation, with the hypotheses that were kept and the ones
#   that were pruned;
# - shows what `length_penalty` does to finished hypotheses;
# - runs beam search under a JSON-Schema constraint.
#
# In `functional_gen` the beams are rows of the batch, the whole search runs inside the
# compiled loop, and reordering the beams is one gather over every per-row array: the KV cache,
# the processor states and the keys move with their beams without any code of their own.
#
# **Before this:** [Sampling](../sampling/) (greedy decoding and its repetition loop; logprobs)
# and [The KV cache and resumable generation](../kv_cache/) (rows, caches, forking). Terms are
# defined on [Words we use](../../concepts/wording/).
# %%
import json

import matplotlib.pyplot as plt
import numpy as np

import functional_gen as fg
from functional_gen.samplers import BeamSearch

model, tokenizer = fg.load_model()
NEW_TOKENS = 16  # one max_new_tokens bucket (16) for the calls that can share compiled programs
NUM_BEAMS = 3  # one beam width throughout, so the searches below share compiled programs

# %% [markdown]
# ## Greedy against beam search
#
# The same prompt, decoded greedily and with 3 beams. `sequences_scores` is each returned
# hypothesis's summed log-probability divided by its length (`length_penalty=1.0`), exactly as
# transformers computes it.

# %%
prompt = "The three most important inventions in history are"
greedy = fg.generate(
    model, tokenizer, prompt, max_new_tokens=NEW_TOKENS, sampler=fg.samplers.Greedy()
)
beams = fg.generate(
    model,
    tokenizer,
    prompt,
    max_new_tokens=NEW_TOKENS,
    sampler=BeamSearch(NUM_BEAMS),
    num_return_sequences=2,
)
print("greedy:", repr(greedy.texts[0]), f"(sum of logprobs {float(greedy.logprobs.sum()):.2f})")
for text, score, logprobs in zip(beams.texts, beams.sequences_scores, beams.logprobs):
    print(
        f"beam:   {text!r} (score {float(score):.3f}, sum of logprobs {float(logprobs.sum()):.2f})"
    )

# %% [markdown]
# ## The search tree
#
# To see the search, we run it by hand for a few steps with the library's pieces: a
# `SequenceState` per hypothesis and `generate(..., max_new_tokens=1, top_logprobs=k)`, which
# returns each hypothesis's `k` most likely next tokens with their log-probabilities (computed on
# the device). Each step keeps the best 3 of all continuations; the others are pruned.

# %%
num_beams, depth, fanout = NUM_BEAMS, 4, 4
# 12 tokens: with the 4 steps' tokens and the 16-token bucket of `max_new_tokens`, every step's
# rows fit the same 32 token columns (a 7-token start needed 24 columns, then 32: two programs)
start = tokenizer("Once upon a time, in a small village, a little")["input_ids"]
beam_rows = [(start, 0.0, 0)]  # (token ids, cumulative logprob, node id)
nodes = {0: dict(step=0, label="<prompt>", score=0.0, parent=None, kept=True)}
for step in range(1, depth + 1):
    rows = [ids for ids, _, _ in beam_rows]
    # the first step has one row: pad it to num_beams rows (copies, ignored below) so that every
    # step runs at the same batch size, one compiled program
    rows += rows[:1] * (num_beams - len(rows))
    state = fg.SequenceState.from_token_ids(rows, vocab_size=model.vocab_size)
    out = fg.generate(
        model,
        tokenizer,
        state,
        max_new_tokens=1,
        top_logprobs=fanout,
        logprobs_mode="raw",
        eos_token_id=(),
    )
    candidates = []
    for (ids, score, node), top_ids, top_lps in zip(
        beam_rows, np.asarray(out.top_token_ids), np.asarray(out.top_logprobs)
    ):
        for token, lp in zip(top_ids[0].tolist(), top_lps[0].tolist()):
            candidates.append((ids + [token], score + lp, node, token))
    candidates.sort(key=lambda c: -c[1])
    beam_rows = []
    for rank, (ids, score, parent, token) in enumerate(candidates):
        node = len(nodes)
        nodes[node] = dict(
            step=step,
            label=tokenizer.decode([token]),
            score=score,
            parent=parent,
            kept=rank < num_beams,
        )
        if rank < num_beams:
            beam_rows.append((ids, score, node))
best = tokenizer.decode(beam_rows[0][0][len(start) :])
print("best after", depth, "steps:", repr(best))

# %%
fig, ax = plt.subplots(figsize=(11, 6))
order = {}
for step in range(depth + 1):
    at_step = sorted(
        (n for n, d in nodes.items() if d["step"] == step), key=lambda n: -nodes[n]["score"]
    )
    for i, n in enumerate(at_step):
        order[n] = (step, -i)
for n, d in nodes.items():
    x, y = order[n]
    if d["parent"] is not None:
        px, py = order[d["parent"]]
        ax.plot(
            [px, x],
            [py, y],
            color="tab:blue" if d["kept"] else "lightgray",
            lw=1.5 if d["kept"] else 0.8,
            zorder=1,
        )
    ax.scatter([x], [y], color="tab:blue" if d["kept"] else "lightgray", s=25, zorder=2)
    ax.annotate(
        f"{d['label']!r} {d['score']:.2f}",
        (x, y),
        xytext=(4, 2),
        textcoords="offset points",
        fontsize=7,
        color="black" if d["kept"] else "gray",
    )
ax.set_xlabel("step")
ax.set_xticks(range(depth + 1))
ax.set_yticks([])
ax.set_title(
    f"Beam search tree ({num_beams} beams, {fanout} candidates per beam): kept in blue, pruned in grey"
)
plt.show()

# %% [markdown]
# The library's `BeamSearch` does the same search inside one compiled loop (over all
# `num_beams * vocab` continuations rather than the top 4 per beam) and finds the same best
# hypothesis:

# %%
library = fg.generate(
    model,
    tokenizer,
    fg.SequenceState.from_token_ids([start], vocab_size=model.vocab_size),
    max_new_tokens=depth,
    sampler=BeamSearch(num_beams),
    eos_token_id=(),
)
print(repr(library.texts[0]), "==", repr(best))
assert library.texts[0] == best

# %% [markdown]
# ## Length penalty
#
# A finished hypothesis is scored `sum(logprobs) / length ** length_penalty`. Log-probabilities
# are negative, so a larger penalty divides by more and favours longer hypotheses; a penalty
# below 1 favours shorter ones. `length_penalty` is an array in the sampler, so changing it does
# not recompile.

# %%
chat = [{"role": "user", "content": "Describe the sea in a few words."}]
rows = []
for penalty in (0.0, 1.0, 3.0):
    out = fg.generate(
        model,
        tokenizer,
        [chat],
        # longer, and one beam more: some hypotheses must finish before the budget for the
        # penalty to matter (this chat prompt has its own length bucket: its own program anyway)
        max_new_tokens=24,
        sampler=BeamSearch(4, length_penalty=penalty),
    )
    rows.append((penalty, out.num_tokens[0], float(out.sequences_scores[0]), out.texts[0]))
print(f"{'penalty':>8} {'tokens':>6} {'score':>8}  text")
for penalty, n, score, text in rows:
    print(f"{penalty:8.1f} {n:6d} {score:8.3f}  {text!r}")

# %% [markdown]
# ## Beam search under a JSON Schema
#
# A structured constraint is a processor with a per-row automaton state. Under beam search, its
# state rows are gathered with the beams like everything else, so every returned hypothesis is
# valid JSON for the schema.

# %%
schema = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "country": {"type": "string", "maxLength": 12},
    },
    "required": ["city", "country"],
    "additionalProperties": False,
}
out = fg.generate(
    model,
    tokenizer,
    [[{"role": "user", "content": "Give a famous city and its country as JSON."}]],
    max_new_tokens=32,
    processors=[fg.processors.JsonSchema(schema, tokenizer)],
    sampler=BeamSearch(NUM_BEAMS),
    num_return_sequences=NUM_BEAMS,
)
for text, score in zip(out.texts, out.sequences_scores):
    print(f"{float(score):7.3f}  {json.loads(text)}")

# %% [markdown]
# ## Next
#
# [Classifier-free guidance](../classifier_free_guidance/): a processor that holds the model and
# a second KV cache, to steer every step towards the prompt or away from a negative one.
