"""The size budgets of compiling a JSON Schema: each bounds one thing the compiler builds
(a regex, an automaton, a count of rules, positions or branches), says what, and the
measurement that set it where one did. One module, so that the limits are read together.
Each constant has a one-line comment: what it bounds, and the measurement that set it, or "not
measured" where none did (`git log -S NAME` found none).
"""

# Bounds a schema's JSON text (bytes); measured: MaskBench's largest dev schema is 938,085 bytes (kb_1161, check_schema 2.6 s), 10 MB ran minutes.
MAX_SCHEMA_BYTES = 1_048_576
"""Most bytes of a schema's JSON text (a string's UTF-8 bytes; a dict's compact JSON text),
checked before the text is parsed or `check_schema` runs: a larger schema is refused with
`SchemaTooLargeError` at once. 1 MiB admits all 9,681 MaskBench dev schemas (the largest,
Kubernetes kb_1161, 938,085 bytes: `check_schema` alone 2.6 s on the 2-core machine under load;
a synthetic 1.28 MB object of 10,000 properties 4.9 s); a 10 MB schema ran for minutes before
this limit (issue 43, item 5), and is now refused in about 0.03 s (its text counted only up to
the limit, `dialect.check_schema_size`)."""

# Bounds the memo of schemas `check_schema` passed; size not measured (the memo itself: MaskBench kb_1161 9.2 -> 3.1 s, 9fc1d6b).
MAX_CHECKED = 64
"""Most schemas `check_schema` remembers as passed (`dialect.CHECKED`, least recently used out)."""

# Bounds the `anyOf` branches of a negated `required`; not measured.
MAX_NEGATION_CHOICES = 32
"""Most `anyOf` branches of a negated `required` (`conditionals.negation`)."""

# Bounds the copies of the item a `minContains` regex writes; not measured.
MAX_CONTAINS = 8
"""Largest `minContains` written out (the regex repeats the item `minContains` times)."""

# Bounds the `anyOf` branches of a discriminated `if`/`then`/`else`; not measured.
MAX_CONDITIONAL_BRANCHES = 64
"""Most `anyOf` branches `conditionals.conditionals_as_branches` writes (one per group of discriminator
values that select the same `then`/`else` parts, plus absent and non-object values)."""

# Bounds `dependentRequired` entries per object (2^k branches); not measured.
MAX_DEPENDENCIES = 3
"""Most `dependentRequired` entries one object may have (2^k alternatives)."""

# Bounds one object's regex (characters); not measured beyond 'about 100 optional properties take minutes'.
MAX_OBJECT_REGEX = 2_000_000
"""Longest regex an object may become (about 100 optional properties): beyond, compiling it
would take minutes, so the schema is refused with the reason instead."""

# Bounds the plain decimal spelling of a float constant (digits); not measured.
MAX_PLAIN_DIGITS = 40
"""Longest plain decimal spelling `scalars.number_regex` offers for a float beside its exponent form
(`1e-50` is not also written with 50 zeros); integers are always written in full, as JSON
serialisers write them."""

# Bounds the regex of the keys no `patternProperties` pattern matches (characters); not measured.
MAX_KEY_REGEX = 20_000
"""Most characters of the regex of the keys no `patternProperties` pattern matches."""

# Bounds the key automaton written back as a regex (states); not measured (53bf542).
MAX_KEY_REGEX_STATES = 300
"""Most states of a minimal key automaton that `patterns.dfa_regex` writes back as a regex
(larger ones widen the patterns first, `keys.KEY_PREFIX_DEPTHS`)."""

# Bounds the automata built for unmatched keys (states); not measured.
MAX_KEY_STATES = 4_000
"""Most states of the automata `keys.unmatched_keys` builds on the way to that regex."""

# Bounds a schema's whole regex (characters); measured: regex -> DFA takes tens of seconds to minutes beyond (MaskBench sample, b85760e).
MAX_REGEX = 1_000_000
"""Characters of a schema's whole regex beyond which it is refused at once: the regex -> byte
DFA step then takes tens of seconds to minutes (measured on the MaskBench sample)."""

# Bounds the schema nodes `$ref` inlining may produce; not measured.
MAX_INLINED_NODES = 100_000
"""How many schema nodes reference inlining may produce: beyond, the schema is refused with the
reason (mutually recursive definitions grow exponentially with `max_recursion_depth`)."""

# Bounds merges of a recursive target's subtree in one rewrite; not measured.
MAX_RECURSIVE_MERGES = 64
"""How many times the rewrite may merge a recursive target's subtree with other keywords
(`merging.merge`): a recursion through such merges (`{"$ref": "#", "required": [..]}` inside
the target) would inline it forever; beyond, the recursion is unrolled instead."""

# Bounds one string automaton (states); measured: 0.05-0.1 ms per state spliced, o82849 75,927 states in 7.2 s.
MAX_STRING_STATES = 64_000
"""Most states of a string terminal's automaton (`patterns.length_bounded_dfa`). Spliced into
the schema's token automaton (`regex_form.spliced_dfa`), it costs about 0.05-0.1 ms per state to build and
lift (a grammar-form rule costs more: its positions are limited to `MAX_GRAMMAR_POSITIONS` in
all). A plain string takes 12 states per character: maxLength 5,000 (16 MaskBench schemas) is
60,001 states and a 50 MiB token table (MaskBench Github_hard o82849, 75,927 states in all: 7.2 s
to compile, 15.4 s before `lift` built a dense class table); MaskBench's larger bounds (8,192, 32,767, 65,535, ...)
would need a counter register on the device, not a chain of states.
Measured: 437 states for MaskBench's `^[a-zA-Z0-9\\-]+(\\s[a-zA-Z0-9\\-]+)*$` with maxLength 64,
1,593 for `format: email` with maxLength 100, 18,225 with maxLength 1,024, 56,571 for
`^(?:\\S+\\s+){0,29}\\S+$` with maxLength 300."""

# Bounds the properties of an any-order object; measured on five splits: compile p50 114 -> 177 ms with any order (adac40c).
ANY_ORDER_MAX = 6
"""Most members of an object tracked as a set in `unordered_members` (`2 ** n` copies in the
byte DFA, `n!` paths in the regex text)."""

# Bounds an unordered object's regex text (characters, markers expanded); see `unordered_members`.
# 60,000: four required members of an open object (its additional key regex, ~800 characters,
# copied once per path: 53,000) stay in any order; not measured further.
UNORDERED_BUDGET = 60_000
"""Most characters of an object's members written in any order (`unordered_members`) with the
set of members tracked exactly, before the next, smaller form is tried."""

# Bounds an unordered object's regex relative to its members' (schema order); see `unordered_members`.
UNORDERED_FACTOR = 4
"""An unordered object's form is kept while its regex (markers expanded) is at most this many
times its members' own size (or within `UNORDERED_BUDGET`); else the next form, and the
schema order last."""

# Bounds the expanded members of a two-order object (characters); measured: unbounded, o65883 compiled 9.7x slower.
SECOND_ORDER_BUDGET = 8_000
"""Most characters of an object's expanded members for `"schema_or_required_first"`: the union
of two orders doubles an object's automaton, and nested objects multiply (unbounded, one
MaskBench schema, o65883, compiled 9.7x slower: 4,196 -> 8,394 states)."""

# Bounds the `anyOf` branches of a `oneOf` of `required`-only branches; not measured.
MAX_PRESENCE_CHOICES = 32
"""Most `anyOf` branches of a `oneOf` of `required`-only branches (`exclusive_presence`)."""

# Sets the length bound from which a plain string is a marker of its own; measured: o61653 28 s -> 5.3 s (b45259b).
SHARED_COUNT_MIN = 64
"""A plain string with a length bound from this up to `COUNTED_STRING_MIN` is a marker of its
own (`Rewriter.repeat_weight`): strings of the same bounds become one rule of the grammar form
when they are used in several places, and their counted repeats count in the choice of that
form."""

# Turns on the counter rules of long plain strings (issue 55); measured: MaskBench o6176, o9862 compile (2.8 s), o9784 refused in 2.5 s, o69969 4.8 -> 2.6 s.
COUNTER_STRINGS = True
"""Whether a plain string whose `maxLength` is over `COUNTED_STRING_MIN` (with a `minLength` of
at most `COUNTER_MIN_LENGTH`) compiles as a counter rule of the grammar form (`counter_strings`:
a per-frame register counts its characters) instead of a spliced automaton of 12 states per
character, refused over what `MAX_STRING_STATES` allows (`False`: as before 2026-12-03). Counter
rules for every such string, not only those over `MAX_STRING_STATES`, since 2026-12-04
(MaskBench: o69969's 55,314-state token automaton became a 3,335-position grammar, 4.8 -> 2.6 s;
o54613's valid documents in another member order, 2/4 -> 4/4 accepted; Snowplow sp_2 and sp_7
(4,096 characters) compile instead of being refused). On since the
grammar form's fallback (`nest_instead`) no longer retries the call form from an uncounted
rewrite, which wrote such a string as a regex repeat (MaskBench o9784: 220 s in `minimize`, now
refused in 2.5 s: its 1,000 24-digit ids are 28,003 positions)."""


# Bounds the `minLength` of a counter rule's string (characters); MaskBench: 0 (45 schemas), 1 (18), 4 (7), 50 (9), 500 (1).
COUNTER_MIN_LENGTH = 64
"""Most `minLength` beside a `maxLength` that makes a plain string a counter rule
(`counter_strings.counter_string_dfa(limit, minimum)`): its first `minimum` characters are a
chain of about 12 states each in the rule, not counted by the register (and no row of
`PushdownAutomaton.counted`); over it the string is a spliced automaton, as without
`COUNTER_STRINGS` (refused over `MAX_STRING_STATES`).
Measured: minLength 50 is a 503-state rule."""


# Sets the length bound from which a plain string is an automaton; measured: maxLength 2,000 4.0 -> 1.6 s, 5,000 30 -> 5.3 s (fafeaa7).
COUNTED_STRING_MIN = 256
"""A plain string (no `pattern` or `format`) whose `maxLength` is larger is a counter rule
(`COUNTER_STRINGS`, with a `minLength` up to `COUNTER_MIN_LENGTH`); otherwise, with a larger
`minLength` or `maxLength`, it is compiled by `json_schema_compile` as a string automaton (`patterns.length_bounded_dfa`, spliced),
not as outlines-core's counted repeat `"[^"...]{0,N}"`, whose regex -> DFA and minimisation
grow quadratically (a schema with one such string, maxLength 2,000: 4.0 s; 5,000: 30 s; as an
automaton 0.6 and 3.5 s)."""

# States per character of a plain string's automaton; measured (maxLength 1,000: 12,001 states).
PLAIN_STRING_STATES = 12
"""States per counted character of a plain string's automaton (`length_bounded_dfa` of
`ANY_STRING`: the UTF-8 and escape states of the body; maxLength 1,000: 12,001 states)."""

# Bounds a schema's automaton with strings spliced in (states); measured: 51-76k states took 3.3-7.2 s (MaskBench sample of 1,000).
MAX_SPLICED_STATES = 150_000
"""Most states of a schema's automaton with its string automata spliced in (`regex_form.spliced_dfa`):
one copy of a string's automaton per place that calls it, so an array of such strings whose
items are counted (`maxItems`) multiplies it. About 0.05-0.1 ms per state to build and lift (the
four largest of a 1,000-schema MaskBench sample, 51-76k states: 3.3-7.2 s a compile)."""

# Estimates states from a regex's weight before its DFA is built; measured 4.3-4.4 characters a state (o1052, o74461).
WEIGHT_PER_STATE = 4
"""Characters of a regex's weight (`Rewriter.weight`: its counted copies written out) per state
of its byte DFA, as a spliced DFA's size is estimated before it is built (`regex_form.spliced_too_large`):
4.3-4.4 in the two MaskBench schemas with spliced strings whose regexes weigh most (o1052:
290,119 -> 66,238 states, compiled; o74461: 852,372 -> 192,318, refused). 5 let an array of 100
strings of up to 120 characters (522,723) through to a refusal after the DFA was built."""

# Bounds the regex of a `multipleOf` remainder automaton (characters); measured 2026-11-24: steps 7/12 80-95k, 9/11/13/16 over 200k.
MAX_MULTIPLE_REGEX = 20_000
"""Characters of the regex of the multiples of a `multipleOf` step (`multiple_terminal`): 2, 3,
4, 5, 6, 8, 10, 15, 20, 25, 1.5, 2.5 take 70-2,400; 7 and 12 about 80,000-95,000; 9, 11, 13,
16 over 200,000 (measured on 2026-11-24)."""

# Sets when a counted array's item becomes a rule (characters); not measured (a call is 3 characters).
REPEATED_RULE_REGEX = 24
"""The items of an array with a large item count (`Rewriter.item_repeats`) become a rule from
this many characters: the counted repeat then writes a 3-character call per copy."""

# Sets the item count from which copies are measured; measured: o12622 (minItems 600) 23.6 s before (13e13e4).
COUNTED_ITEMS_MIN = 16
"""An item count (`minItems`/`maxItems`) from which the copies of the item that the counted
repeat writes out are measured (`arrays.counted_items`)."""

# Bounds the single regex before the grammar form is tried (characters); measured: five splits 0.67x compile time vs 250,000.
GRAMMAR_REGEX = 100_000
"""Characters of a schema's whole regex beyond which `JsonSchema` compiles the grammar form
(`json_schema_grammar`) first instead of one regex. 250,000 until 2026-11-23; once the keys of
open objects were written compactly (`keys.key_not_in`), schemas of 100,000-250,000 characters
compiled 2-3x faster as grammars (five splits, `--limit 24`: compile time summed over the
schemas 0.67x of the 250,000 setting's, p99 2.7 s against 3.3 s)."""

# Bounds the single-regex fallback (characters); measured: o21378 8.6 s; timeouts at 0.4-8.9 M characters.
SINGLE_REGEX = 250_000
"""Characters up to which a schema whose grammar form is refused (too many positions, a call
that one byte cannot choose) still compiles as one regex (MaskBench o21378: 8.6 s). The
MaskBench schemas whose single regex timed out at 30 s had 0.4-8.9 million characters."""

# Bounds the single-regex fallback's written-out weight; measured: compiled up to 646k (3.8 s), timed out at 2.3-4.5 M.
SINGLE_REGEX_WEIGHT = 1_000_000
"""Most characters of a schema's single regex with its counted copies written out
(`Rewriter.weight`) for that regex to be the fallback of a refused grammar form: the regex
is short, but outlines-core's DFA has a state per written-out character or so. On the whole
MaskBench dev file the single regexes that compiled weighed up to 646,000 characters (o7515:
3.8 s; sp_408: 155,000, 6 s; slack-app-manifest: 254,000, 12.9 s) and those over 30 s
2.3-4.5 million (o9853, o9925, o9958: arrays of up to 100 objects of two 255-character
strings and 1,000 ids), which this limit refuses at once, as before 2026-11-24."""

# Sets the regex length from which a subschema becomes a rule; not measured (4c57435 chose it).
RULE_REGEX = 20_000
"""A subschema whose regex (its own rules called, not expanded) is longer becomes a rule."""

# Sets the regex length from which a shared subschema becomes a rule; measured: o62820 9.0 s -> 5.1 s at 150 (2,000 before).
SHARED_RULE_REGEX = 150
"""A subschema used in more than one place becomes a rule from this many characters: a uuid
pattern (103 characters, 39 states) used 300 times, or a small object used in several places,
is then one rule instead of a copy per use. (2,000 before: MaskBench Github_hard o62820 had
9,166 positions and 9.0 s of token tables with it, 4,497 and 5.1 s with 150; at 60 the
tables of o62820 and o52904 took longer again: small rules called from many places give their
positions many return slots.)"""

ORDER_AUTOMATON_MAX = 10
"""Most members tracked as a set by `order_automata.any_order_dfa` (`2 ** n` sets, one small
regex each: 1,024 regexes of about 1.6 ms each at most); its positions budget
(`MAX_GRAMMAR_POSITIONS`) usually refuses before."""

ORDER_VALUE_RULE_REGEX = 100
"""A member value of an object read in any order by its automaton (`order_automata`,
`Rewriter.order_values`) becomes a rule from this many characters: the automaton has a copy of
each member per set of members written, so a value written inline costs its states that many
times (MaskBench o54613: two small objects of about 150 states each, inlined, made 25,760
states of 7 members' 128 sets); a plain string value (about 60 characters) stays inline."""

# Bounds a grammar form's positions; measured: 0.27-0.45 ms per position for the tables (o21316 8,219 positions 2.2 s).
MAX_GRAMMAR_POSITIONS = 10_000
"""Most positions (states of all the rules' byte DFAs) of a grammar form: its token tables walk
the vocabulary from every position. Since the walk shares the trie's subtrees between positions
and slots (`pushdown.token_tables`) that takes 0.27-0.45 ms per position on the 2-core development
machine at load 2 (MaskBench Github_hard o21316, 8,219 positions: 2.2 s for the tables, 11 s
before, 664 s before that, 7 s for the whole compile; o21251, 6,148: 1.8 s; Kubernetes kb_594,
2,392: 1.0 s; `benchmarks/bench_pda_tables.py`), so up to this the tables take under about 5 s;
beyond it the schema is refused with the reason."""

# Scales the positions limit where the single regex is the alternative; measured: o25423 14,443 positions 4.8 s vs 16.5 s.
OVER_REGEX_SCALE = 2
"""How many times `MAX_GRAMMAR_POSITIONS` (and `MAX_POSITIONS_BEFORE_TAILS`) the positions
limit is for a grammar form that `json_schema_compile` would otherwise replace by the schema's
single regex (over `GRAMMAR_REGEX` characters): that regex's automaton inlines every rule, so
it is at least as large and no faster to build per state (MaskBench
Github_ultra o25423: grammar form 14,443 positions, 4.8 s; its single regex, 49,305 positions,
16.5 s; Github_hard o48425: 14,552 positions against a 140,901-character regex, 13 s)."""

# Bounds positions before shared tails; measured: tails save 0-8% (17 forms), detekt-1.22.0 34 s -> 7 s to its refusal.
MAX_POSITIONS_BEFORE_TAILS = 5 * MAX_GRAMMAR_POSITIONS // 4
"""Positions of a grammar form's rules, before shared tails (`grammar_form._shared_tails`) are taken out,
beyond which it is refused as soon as its automata get there: on the 17 MaskBench grammar forms
that took over 0.8 s (two dev samples), shared tails saved 0-8% of the positions, so 1.25 times
the limit cannot come under it. (JsonSchemaStore detekt-1.22.0: 35,966 positions in 100 rules,
refused after building all of them twice in 34 s; 13 s at twice the limit, 7 s at 1.25 times.
Github_ultra o21378's recursive attempt, 16,283 positions after tails: refused after 5 s at
twice the limit, at once at 1.25 times; the whole compile 12.9 -> 7.8 s.)"""

# Bounds how small a subschema may be to become a rule (characters); not measured.
MIN_RULE_REGEX = 300
"""The smallest subschema regex that becomes a rule so that a larger one fits `RULE_REGEX`."""

# Bounds the rules of one grammar form; not measured.
MAX_RULES = 256
"""Most rules of one grammar form: `rule_plan.plan_rules` makes no more (larger subschemas stay
inlined) and refuses more recursive targets (`RecursionRefused`); no shared tail beyond it."""

# Bounds the rule-automaton memo (states, about 100 MiB); measured: one MaskBench compile keeps up to 37,000 (bamboo-spec).
RULE_EDGES_STATES = 100_000
"""`rule_automata.rule_edges`' memo, least recently used first, and the states it keeps at most (about
100 MiB of tables; one MaskBench compile leaves up to 37,000: bamboo-spec)."""

# Bounds the threads that build rule automata ahead; measured: o48866 9.5-10.1 -> 7.8-8.0 s on 2 cores (49c5ca4).
MAX_COMPILE_THREADS = 4
"""Most threads that build a plan's rule automata ahead (one per core up to this)."""

# Bounds how small a shared tail may be to become a rule (positions saved); not measured.
MIN_SHARED_TAIL = 16
"""Fewest positions a shared tail must save to become a rule of its own (`grammar_form._shared_tails`)."""

# Bounds the shared tails taken out of one grammar form; not measured.
MAX_SHARED_TAILS = 32
"""Most tails `grammar_form._shared_tails` extracts from one grammar form."""

# Bounds the candidate tails tried per step; not measured.
SHARED_TAIL_TRIES = 4
"""Candidates `grammar_form._shared_tails` tries per step before it stops (the largest estimates first)."""

# Bounds exact `oneOf` (exact_one_of); not measured beyond the tests' schemas (tens of states).
MAX_ONE_OF_STATES = 64_000
"""Most reachable states of the product automaton of a `oneOf`'s overlapping scalar branches
(`dfa_operations.exactly_one_dfa`, then its intersection with the canonical spellings)."""

MAX_ONE_OF_REGEX = 100_000
"""Most characters of the regex `patterns.dfa_regex` writes for that automaton: state
elimination can write an exponentially long regex (beyond, the `oneOf` is refused)."""
