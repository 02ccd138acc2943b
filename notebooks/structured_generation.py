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
# # Structured generation on the device
#
# A constraint (a regex, a JSON Schema, a list of choices, a grammar) decides, at every step,
# which tokens may come next. This notebook builds one from the ground up and runs it inside
# the jitted generation loop of SmolLM2-135M-Instruct:
#
# - from a regex to a DFA over bytes;
# - from bytes to tokens: the same DFA over the tokenizer's vocabulary, stored as a few small
#   arrays;
# - the mask of allowed tokens as a bitmask row, and the cheaper way we compute it;
# - why a row's constraint state is ONE int32, and what that buys (jit, batching, beams);
# - a JSON Schema, on the real model, with the output checked;
# - a pushdown automaton for recursive grammars: the stack drawn as it moves through a nested
#   JSON value.
#
# **Before this:** [How logits processing works](../logits_processing/) (a processor with a
# state, the `DateFormat` finite-state machine, is this notebook's starting point) and
# [Tokens and tokenization](../tokenization/) (tokens are byte strings, some of them half a
# character). [Beam search](../beam_search/) and [classifier-free
# guidance](../classifier_free_guidance/) come before it in the course; it does not need them.
# Terms are defined on [Words we use](../../concepts/wording/).

# %%
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

import functional_gen as fg
from functional_gen.structured import (
    json_schema_regex,
    per_row,
    regex_automaton,
    vocabulary_from_tokenizer,
)
from functional_gen.structured.byte_dfa import minimize, regex_byte_dfa

SEED = 0
MAX_NEW_TOKENS = 48
TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]"  # a 24-hour time, our running example

model, tokenizer = fg.load_model()

# %% [markdown]
# ## From a regex to a DFA
#
# A regex describes a set of strings. A deterministic finite automaton (DFA) recognises the
# same set one character at a time: it has states, a start state, accepting states, and a
# table saying where each input leads. We work on **bytes**, not characters, because that is
# what tokens are made of. outlines-core compiles the regex (with the Rust `regex` engine);
# we read its table into an array of shape `[states, 256]`, `-1` meaning "this byte is not
# allowed here", and minimise it.

# %%
dfa = minimize(regex_byte_dfa(TIME))
print("states:", dfa.num_states, "table:", dfa.delta.shape, dfa.delta.dtype)
print("start state:", dfa.initial, "accepting:", np.flatnonzero(dfa.accepting).tolist())

# %% [markdown]
# Seven states for `HH:MM`: one per position, plus a second state after the first digit,
# because after a `2` only `0`-`3` may follow. From the start, only `0`, `1` and `2` are
# allowed. Let us run a few inputs through it byte by byte.

# %%
start_row = dfa.delta[dfa.initial]
print("allowed first bytes:", [chr(b) for b in np.flatnonzero(start_row >= 0)])
for text in ["09:30", "23:59", "24:00", "7:15"]:
    print(f"{text!r:>8} ->", dfa.matches(text.encode()))

# %% [markdown]
# ## From bytes to tokens
#
# The model does not write bytes; it writes tokens, each a byte string from its vocabulary.
# SmolLM2 uses byte-level BPE, so some tokens hold only part of a UTF-8 character: we take
# every token's **raw bytes** (never its decoded string, which would turn half a character
# into `U+FFFD`).

# %%
vocabulary = vocabulary_from_tokenizer(tokenizer)
print("tokens:", vocabulary.vocab_size, "end-of-generation ids:", vocabulary.eos_token_id)
for token_id in tokenizer("12:45 café")["input_ids"]:
    print(f"{token_id:>6} {vocabulary.token_bytes[token_id]!r}")
partial = next(i for i, b in enumerate(vocabulary.token_bytes) if b and b[-1] >= 0xC0)
print("a partial character:", partial, vocabulary.token_bytes[partial])

# %% [markdown]
# Lifting the DFA to tokens means: from each state, walk each token's bytes through the DFA;
# if no byte is rejected, the token is allowed and leads to the state after its last byte.
# A dense `[states, vocab]` table of next states would cost `states x 49,152 x 4` bytes. But
# most tokens behave identically: in the time regex, every token that contains a letter is
# rejected everywhere. Tokens with the same column (the same next state from every state) form
# a **class**, and we store a `[states, classes]` table plus one class per token.

# %%
automaton = regex_automaton(TIME, vocabulary)
print(automaton)
print("token_class:", automaton.token_class.shape, "transitions:", automaton.transitions.shape)
print("dense table would be", automaton.num_states * vocabulary.vocab_size * 4 / 2**20, "MiB")

# %% [markdown]
# An `8 x 8` table instead of an `8 x 49,152` one (the extra state is the dead state 0; the
# initial state is 1). The last array, `distance`, is the fewest tokens from each state to an
# accepting one (0 where generation may stop):

# %%
print("distance:", automaton.distance.tolist())
first = np.flatnonzero(automaton.allowed(1))
print(len(first), "tokens allowed first, e.g.", [vocabulary.token_bytes[t] for t in first[:8]])

# %% [markdown]
# ## The mask as a bitmask row
#
# At each step the sampler needs a yes/no per token: the **mask** of the current state.
# Packed as bits, one row is `49,152 / 32 = 1,536` 32-bit words (6 KiB); a table of such rows,
# one per state, is the classic layout (outlines, xgrammar).

# %%
mask = automaton.allowed(1)
bits = np.packbits(mask.reshape(-1, 32)[:, ::-1], axis=1, bitorder="big").view(">u4").reshape(-1)
print(
    "mask:",
    mask.shape,
    mask.dtype,
    "-> bitmask row:",
    bits.shape,
    bits.dtype,
    f"{bits.nbytes} bytes",
)
print("non-zero words:", np.flatnonzero(bits)[:6], "...")
unpacked = ((bits[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(bool).reshape(-1)
print("round trip:", bool((unpacked == mask).all()))

# %% [markdown]
# We do not store those rows. The device computes the mask from the class table with two
# gathers: the state's row of next states (`classes` entries), their distances, then one
# value per token through `token_class`. That costs about the same as unpacking a bitmask,
# uses `[states, classes]` memory instead of `[states, 1,536]`, and it can also take the
# **remaining budget** into account: a token is allowed only if an accepting state is at most
# `remaining - 1` tokens away after it. Rows then always end inside the language, even when
# `max_new_tokens` runs out.


# %%
def device_mask(transitions, distance, token_class, state, remaining):
    after = distance[transitions[state]]  # [classes]
    return (after <= remaining - 1)[token_class]  # [vocab]


m = device_mask(
    jnp.asarray(automaton.transitions),
    jnp.asarray(automaton.distance),
    jnp.asarray(automaton.token_class),
    1,
    remaining=5,
)
print("same as the bitmask:", bool((np.asarray(m) == mask).all()))
tight = device_mask(
    jnp.asarray(automaton.transitions),
    jnp.asarray(automaton.distance),
    jnp.asarray(automaton.token_class),
    1,
    remaining=4,
)
print("allowed with 5 tokens left:", int(m.sum()), "- with 4 left:", int(tight.sum()))

# %% [markdown]
# SmolLM2 writes digits one token each, so `HH:MM` takes five tokens (`distance[1] = 5`). With
# five left, the three possible first digits still fit; with four, nothing does, and such a
# row ends at once with finish reason `"constraint"` instead of writing half a time.
#
# ## Why the state is one int32
#
# Everything large (the tables) is a field of the processor, shared by all rows. What changes
# per row is only *where it is* in the automaton: one integer. That makes the state trivial
# to carry through [`jax.lax.while_loop`](../../concepts/wording/#while-loop) (its shape never changes), to batch (`[batch]`), and
# to reorder for beam search (one gather). The processor advances it from the previous token
# at the start of each step (the first step keeps the initial state: the previous token is
# the prompt's).

# %%
time_processor = fg.processors.Regex(TIME, tokenizer)
tokens = tokenizer("09:30")["input_ids"]
prompt = tokenizer("The meeting is at ")["input_ids"]
state = None


def context_after(tokens, n: int, width: int = 8):
    """The `Context` of a row whose prompt is `prompt` and which generated `tokens[:n]`."""
    return fg.processors.Context(
        token_ids=jnp.asarray(prompt + tokens[:n] + [0] * (width - n)),
        length=jnp.asarray(len(prompt) + n),
        prompt_length=jnp.asarray(len(prompt)),
        max_new_tokens=jnp.asarray(MAX_NEW_TOKENS),
        key=jax.random.key(SEED),
    )


for n in range(len(tokens) + 1):
    context = context_after(tokens, n)
    if state is None:
        state = time_processor.init(context)
    state, logits = time_processor.process(state, jnp.zeros(vocabulary.vocab_size), context)
    eos_allowed = bool(jnp.isfinite(logits[vocabulary.eos_token_id[0]]))
    print(
        f"after {tokenizer.decode(tokens[:n])!r:9} state={int(state):2d} {state.dtype} {state.shape}"
        f" allowed={int(jnp.isfinite(logits).sum()):5d} EOS allowed={eos_allowed}"
    )

# %% [markdown]
# The state is a scalar `int32` at every step, and EOS becomes allowed exactly once `09:30`
# is complete. A batch of rows can follow different constraints: `per_row` puts their
# automata in one state space (each owns a block of rows of the table) and gives each row a
# constraint id, so one compiled program serves them all.
#
# ## A JSON Schema on the real model
#
# `JsonSchema` turns the schema into a regex (with exact integer ranges, strict formats and
# patterns that stay valid JSON), compiles it like any regex, and runs it on the device. We
# generate two documents in one call, one row per schema. JSON Schema objects are open unless
# `"additionalProperties": false` (any other key may follow the listed ones); we close this one.

# %%
person = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "languages": {
            "type": "array",
            "items": {"enum": ["English", "French", "Japanese"]},
            "maxItems": 2,
        },
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
print(json_schema_regex(person)[:160], "...")
constraint = per_row([fg.processors.JsonSchema(person, tokenizer), time_processor])
result = fg.generate(
    model,
    tokenizer,
    [
        [{"role": "user", "content": "Describe a famous writer as JSON."}],
        [{"role": "user", "content": "When does the train leave?"}],
    ],
    max_new_tokens=MAX_NEW_TOKENS,
    processors=[constraint],
    sampler=fg.samplers.Multinomial(),
    key=jax.random.key(SEED),
)
for text, reason in zip(result.texts, result.finish_reasons):
    print(reason, text)

# %% [markdown]
# The first row is a JSON document of the schema, the second an `HH:MM` time. Let us check
# the document against the schema's constraints by hand.

# %%
document = json.loads(result.texts[0])
assert set(document) == {"name", "age", "languages"}
assert 0 <= document["age"] <= 120 and len(document["name"]) <= 24
assert all(lang in ("English", "French", "Japanese") for lang in document["languages"])
assert dfa.matches(result.texts[1].encode())
print("valid:", document)

# %% [markdown]
# ## A pushdown automaton for recursive grammars
#
# A regex cannot count brackets: `{"a": [1, {"b": [true]}]}` nests four levels, and a DFA that
# accepts every nesting depth would need infinitely many states. The bounded-depth DFA that
# `Grammar(..., max_depth=4)` builds unrolls the recursion, and its states double with every
# level of JSON. A **pushdown automaton** keeps the recursion instead: each recursive rule (for
# JSON, `value`) is its own small automaton, and entering it pushes the place to come back to on
# a stack. Each row carries `(position, stack, stack_pointer)`: two int32 scalars and an
# `int32[32]` array, whatever the depth.
#
# We build the pushdown automaton of Lark's JSON grammar. Its positions are the states of two
# automata, one for the start rule and one for `value`; the tables hold, per position, a
# bitmask of the tokens whose bytes never leave the current rule (they do not depend on the
# stack) and a short list of *candidate* tokens that return from it and are checked against the
# row's actual stack on the device.

# %%
from functional_gen.structured import pushdown_automaton  # noqa: E402

JSON_GRAMMAR = r"""
?start: value
?value: object | array | string | SIGNED_NUMBER -> number | "true" -> true | "false" -> false | "null" -> null
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""
pda = pushdown_automaton(JSON_GRAMMAR, vocabulary)
print(pda)
for rule, name in enumerate(pda.rule_names):
    print(f"rule {name!r}: {int((pda.position_rule == rule).sum())} positions")
real = (pda.candidates < pda.vocab_size).sum(-1)
print("stack-dependent candidates per (position, top of stack): at most", int(real.max()))


# %% [markdown]
# Now we feed the nested value one byte at a time through the host copy of the tables
# (`PushdownAutomaton.step` does what the device does) and draw the stack after each byte:
# one column per byte, the bottom of the stack at the bottom, each box a return position
# (its number; its colour the rule it returns into), and the current position in a dashed box
# on top. An opening bracket is read
# by a call of `value`: the place after the call is pushed. A closing bracket that the inner
# `value` cannot read pops that place and is read there. The start rule ends with optional
# whitespace, so even the outermost value is a call.


# %%
def label(position: int) -> str:
    return f"{pda.rule_names[pda.position_rule[position]]}:{position}"


nested = b'{"a": [1, {"b": [true]}]}'
configs = [(pda.initial, ())]
for byte in nested:
    configs.append(pda.step(configs[-1], byte))
print("may end here:", pda.can_end(configs[-1]))

colours = plt.get_cmap("tab10")
fig, ax = plt.subplots(figsize=(12, 3.6))
for x, (position, stack) in enumerate(configs):
    for depth, place in enumerate(stack):  # bottom of the stack at depth 0
        rule = int(pda.position_rule[place])
        ax.add_patch(
            Rectangle(
                (x - 0.45, depth), 0.9, 0.9, facecolor=colours(rule), alpha=0.55, edgecolor="k"
            )
        )
        ax.text(x, depth + 0.45, str(place), ha="center", va="center", fontsize=7)
    # the current position, above the stack, in a dashed box
    ax.add_patch(Rectangle((x - 0.45, len(stack)), 0.9, 0.9, fill=False, ls="--", edgecolor="gray"))
    ax.text(x, len(stack) + 0.45, str(position), ha="center", va="center", fontsize=7, color="gray")
ax.set_xlim(-0.6, len(configs) - 0.4)
ax.set_ylim(0, max(len(stack) for _, stack in configs) + 1.2)
ax.set_xticks(range(len(configs)), ["start"] + [chr(b) for b in nested])
ax.set_xlabel("after reading this byte")
ax.set_ylabel("stack depth")
ax.legend(
    handles=[
        Patch(facecolor=colours(r), alpha=0.55, label=f"return into {n!r}")
        for r, n in enumerate(pda.rule_names)
    ]
    + [Patch(fill=False, ls="--", edgecolor="gray", label="current position")],
    loc="upper left",
    bbox_to_anchor=(1.0, 1.0),
    fontsize=8,
)
ax.set_title("The pushdown automaton's stack while reading a nested JSON value")
plt.show()

# %% [markdown]
# The first `{` pushes the start rule's place (the outer value is a call too: the blue box), and
# every value nested inside it pushes the place after it in its container (orange boxes: one
# place after a member's value, another after an array element, so their numbers alternate as
# objects and arrays nest): five boxes at the innermost `true`, four levels of nesting. Each
# closing bracket pops one. At the end the one box left is a place where the start
# rule may end, so end-of-generation is allowed.
#
# On the device the same happens per token inside `process`: the previous token's bytes are
# applied in a `while_loop`, then the mask is the bitmask row gathered by the position (and by
# the top of the stack and the free stack slots) plus the candidates walked from the row's
# stack. The state keeps its shapes at every step, as the generation loop's carry must.

# %%
grammar = fg.processors.Grammar(
    JSON_GRAMMAR, tokenizer
)  # a recursive grammar: a pushdown automaton
tokens = tokenizer(nested.decode())["input_ids"]
# one compiled step for every n (the context keeps its width); the processor is an argument, so
# its tables stay jit inputs
process = eqx.filter_jit(lambda processor, *args: processor.process(*args))
state = None
for n in range(len(tokens) + 1):
    context = context_after(tokens, n, width=24)
    if state is None:
        state = grammar.init(context)
    state, logits = process(grammar, state, jnp.zeros(vocabulary.vocab_size), context)
    position, stack, pointer = state
    boxes = " ".join(f"[{label(int(p))}]" for p in np.asarray(stack)[: int(pointer)]) or "(empty)"
    print(
        f"after {tokenizer.decode(tokens[:n])!r:28} allowed={int(jnp.isfinite(logits).sum()):5d} "
        f"stack={boxes}"
    )
print("state shapes:", [(x.shape, str(x.dtype)) for x in state])

# %% [markdown]
# Finally the real model writes JSON under the grammar. The stack lets it nest as deep as 32
# levels, where the bounded DFA would stop at 4; we check the output with lark's own parser
# (when the row finished before `max_new_tokens`).

# %%
import lark  # noqa: E402

result = fg.generate(
    model,
    tokenizer,
    [
        [
            {
                "role": "user",
                "content": "Give a nested JSON value about a cat: an object with a list of objects.",
            }
        ]
    ],
    max_new_tokens=MAX_NEW_TOKENS,
    processors=[grammar],
    sampler=fg.samplers.Multinomial(),
    key=jax.random.key(SEED),
)
text, reason = result.texts[0], result.finish_reasons[0]
print(reason, text)
if reason == "eos":
    lark.Lark(JSON_GRAMMAR, parser="earley").parse(text)
    print("lark parses it")

# %% [markdown]
# ## Objects in any order: a register of the members written
#
# JSON Schema does not order an object's members, and real documents often list them in
# another order than the schema's `properties`. An automaton that takes them in any order *and*
# refuses the `}` until every required member has come must remember which members it has
# seen: one copy of the members per set written, `2 ** n` copies. Up to ten members that is
# affordable; an object of 14 members, 9 of them required, would need about 170,000 states.
#
# Beyond that, the frame of the pushdown automaton that reads the object carries a 32-bit
# **register**: the byte after a required member's key sets its bit, the object's `}` is
# refused until every required bit is set, and a call into a nested object saves the register
# beside its return position (each object has its own). Only the tokens that read such a `}`
# depend on the register, so the device walks just those exactly; every other token comes from
# the register-blind bitmask rows. (A listed member may be written twice: a JSON parser keeps
# the last value, which is valid for its key, and refusing it would make every token that
# spells a key depend on the register.)

# %%
from functional_gen.structured.json_schema import json_schema_compile  # noqa: E402

wide = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string", "maxLength": 12},
        "names": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
        "colour": {"enum": ["red", "green", "blue"]},
        "active": {"type": "boolean"},
        "size": {"type": "integer", "minimum": 1, "maximum": 9},
        "kind": {"enum": ["cat", "dog"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 12}},
            "required": ["name"],
            "additionalProperties": False,
        },
        "tag": {"type": "string", "maxLength": 6},
        "title": {"type": "string", "maxLength": 6},
        "total": {"type": "integer"},
        "weight": {"type": "integer"},
        "notes": {"type": "string", "maxLength": 6},
    },
    "required": ["id", "name", "colour", "active", "size", "kind", "age", "owner", "tag"],
    "additionalProperties": False,
}
wide_automaton = json_schema_compile(wide, vocabulary)
print(wide_automaton)
print("reads a register:", wide_automaton.has_register)
print(
    "tokens walked exactly with the register:",
    int((wide_automaton.register_tokens < wide_automaton.vocab_size).sum()),
)
order = b'{"tag":"a","age":3,"size":2,"kind":"cat","owner":{"name":"Ann"},"colour":"red","active":true,"name":"Tom","id":7}'
print("a document in another order:", wide_automaton.accepts(order))
print("one required member missing:", wide_automaton.accepts(order.replace(b',"id":7', b"")))

# %% [markdown]
# The token budget has to follow the register too. `max_new_tokens` is a promise that the
# row ends inside the language; a row 20 tokens from its end with five required members
# missing must be steered to write them, not offered a `}` it can never read. The *need* of a
# register frame therefore counts the tokens of every required member still missing (the most
# one more member takes, from any place a value ends), plus what finishes the current value and
# closes the object; it is an upper bound, and the token the mask always keeps lowers it by at
# least one (`pushdown.register_budget`). Inside such an object it is counted in one-byte
# tokens (the device always checks those exactly), so it is about one per byte there: this
# object's shortest documents are about 40 of SmolLM2's tokens but over 100 bytes. We give the
# model only a dozen tokens more than that bound, then walk its tokens on the host and draw the
# need beside the tokens left.

# %%
start = wide_automaton.initial_config()
shortest = wide_automaton.need(start)
budget = shortest + 12
result = fg.generate(
    model,
    tokenizer,
    [[{"role": "user", "content": "Describe a pet as JSON."}]],
    max_new_tokens=budget,
    processors=[fg.processors.JsonSchema(wide, tokenizer)],
    sampler=fg.samplers.Multinomial(),
    key=jax.random.key(SEED),
)
print(result.finish_reasons[0], result.texts[0])
document = json.loads(result.texts[0])
assert set(wide["required"]) <= set(document) <= set(wide["properties"])


def members_missing(config) -> int:
    """Required members of the outermost object not yet written: its frame is the register
    frame nearest the bottom of the stack (`frames` lists them top first)."""
    held = [g for p, _, g in wide_automaton.frames(config) if wide_automaton.register_index[p] >= 0]
    return len(wide["required"]) - (bin(held[-1]).count("1") if held else 0)


config, needs, missing = start, [], []
for token in np.asarray(result.token_ids[0])[: result.num_tokens[0]]:
    needs.append(wide_automaton.need(config))
    missing.append(members_missing(config))
    if int(token) in vocabulary.eos_token_id:
        break
    config = wide_automaton.walk(vocabulary.token_bytes[int(token)], config)
left = [budget - i for i in range(len(needs))]
assert all(n <= r for n, r in zip(needs, left))

fig, ax = plt.subplots(figsize=(9, 3.4))
ax.plot(left, label="tokens left (max_new_tokens - generated)", color="gray", ls="--")
ax.plot(needs, label="need: tokens that still end the document", color="C0")
ax.set_xlabel("tokens generated")
ax.set_ylabel("tokens")
twin = ax.twinx()
twin.step(range(len(missing)), missing, where="post", color="C3", alpha=0.6)
twin.set_ylabel("required members missing", color="C3")
ax.legend(loc="upper right", fontsize=8)
ax.set_title(
    f"A 14-member object under a tight budget ({budget} tokens; need {shortest} at the start)"
)
plt.show()

# %% [markdown]
# The need (blue) never rises above the tokens left (dashed): where they meet, only tokens
# that keep the document finishable remain, and the row ends with a valid object inside
# `max_new_tokens`. Each step down in the red line is a required member's key: that member no
# longer has to be written, and the need falls with it (the member's cost leaves the sum while
# the rest of its value comes in). Counting in tokens rather than bytes inside these objects
# (each member's cheapest *tokens*, and a best token per member checked on the device) would
# bring the bound down to the tokens a document really takes.

# %% [markdown]
# ## Long strings: a counter in the frame
#
# `maxLength` counts characters (code points: `é`, `中` and an escape `\n` are one each). A byte
# automaton can only count by being in a different state after each character, about 12 states
# per character once UTF-8 sequences and escapes are spelled out, so a `maxLength` of 1,000 is
# a 12,000-state string and one of 32,767 (common in real schemas: a database column's size) is
# out of reach. The grammar form instead makes such a string a rule of its own, a *counter
# rule*: its automaton is the string's body looping (a few dozen states whatever the bound), and
# the frame that reads it uses the same 32-bit register as the objects above as a counter: each
# byte that starts a character adds one, and a byte that would start character `maxLength + 1`
# is refused. Tokens that may write several characters are checked on the device against the
# characters left (one `int16` row per token: how many characters it writes from that place).
# Every plain string with a `maxLength` over 256 is compiled this way; below, one such
# property beside a short title, for growing bounds.

# %%
import time  # noqa: E402

from functional_gen.structured.formats import ANY_STRING  # noqa: E402
from functional_gen.structured.patterns import length_bounded_dfa  # noqa: E402

limits = [300, 1000, 4096, 32767]
positions, seconds = [], []
for limit in limits:
    long_text = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 40},
            "body": {"type": "string", "maxLength": limit},
        },
        "required": ["title", "body"],
        "additionalProperties": False,
    }
    start_time = time.perf_counter()
    long_automaton = json_schema_compile(long_text, vocabulary, cache=False)
    seconds.append(time.perf_counter() - start_time)
    positions.append(long_automaton.num_positions)
    print(f"maxLength {limit:>6,}: {long_automaton.num_positions} positions, {seconds[-1]:.1f} s")
spliced = [length_bounded_dfa(ANY_STRING, 0, n, max_states=64_000).num_states for n in limits[:2]]
print("the string alone as a counted byte automaton:", spliced, "states")


def body_document(n: int) -> bytes:
    return json.dumps({"title": "t", "body": "é" * n}, ensure_ascii=False).encode()


print("32,767 characters:", long_automaton.accepts(body_document(32767)))
print("32,768 characters:", long_automaton.accepts(body_document(32768)))

# %% [markdown]
# The automaton's size does not move with the bound (left), where the counted byte automaton
# grows by 12 states a character until it is refused at 64,000 states (a `maxLength` of about
# 5,333); the compile time is the vocabulary's walk over those few positions (right). A
# `minLength` of up to 64 beside the `maxLength` becomes a short chain of states before the
# counted loop; a larger one keeps the counted byte automaton.

# %%
fig, (left_ax, right_ax) = plt.subplots(1, 2, figsize=(10, 3.2))
left_ax.plot(limits, positions, "o-", label="counter rule: positions of the whole schema")
left_ax.plot(limits[:2], spliced, "s-", color="C3", label="counted byte automaton of the string")
largest = 64_000 // 12  # the longest string a counted byte automaton may count
left_ax.plot([1000, largest], [12_001, 12 * largest + 1], ":", color="C3", label="(12 a character)")
left_ax.axhline(64_000, color="gray", ls=":", label="refused above (MAX_STRING_STATES)")
left_ax.set_xscale("log")
left_ax.set_yscale("log")
left_ax.set_xlabel("maxLength (characters)")
left_ax.set_ylabel("states / positions")
left_ax.legend(fontsize=7)
right_ax.bar([f"{n:,}" for n in limits], seconds, color="C0")
right_ax.set_xlabel("maxLength")
right_ax.set_ylabel("compile seconds")
right_ax.set_title("compiling the schema over SmolLM2's vocabulary", fontsize=9)
fig.suptitle("A long string as a counter rule: the bound costs nothing")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Next
#
# [Model families](../model_families/): Llama, Qwen3, Gemma 3 and Phi-3 in one decoder, and
# what their differences cost in memory and speed.
