"""`JsonSchema`: generated text that is a JSON document valid under a JSON Schema.

The package's modules, one concept each (this file only re-exports their public names):

- the schema: `errors`, `keywords` (the schema vocabulary), `dialect` (`check_schema`),
  `references` (`$ref`, `$id`), `budgets` (every size limit, with the measurement that set it);
- the rewrite, by JSON type: `rewriter` (the traversal core, `Rewriter`, and its handlers by
  type, `BY_TYPE`), `numbers`, `strings`, `arrays`, `objects`, `property_order`, `enums`
  (listed values), `branches` (`allOf`/`anyOf`/`oneOf`), `exact_one_of` (overlapping `oneOf`
  branches enforced exactly), `merging` (`allOf` merged),
  `conditionals` (`not`, `if`), `keys` (object keys) and `scalars` (strings and numbers as
  regexes), `free_values` (free-form JSON values);
- the forms: `regex_form` (one regex, strings given as automata spliced in), `pushdown_form`
  (free-form values as deep as the stack), the grammar form (`rule_plan`, `rule_automata`,
  `grammar_form`);
- `compiling` (the attempt chain, `json_schema_compile`) and `constraint` (`JsonSchema`).

The schema is first checked against its dialect's metaschema (`jsonschema`'s `check_schema`),
its `$ref`s are resolved with the `referencing` library (`$id`, `$anchor`, JSON pointers) and
inlined, then it becomes a regex: outlines-core's `build_regex_from_schema` for the simple
nodes, our own regexes where outlines-core's would let invalid documents through or refuse:

| keyword | outlines-core alone | here |
|---|---|---|
| integer/number `minimum`, `maximum`, `exclusive*` | ignored | exact range regex (`ranges`), decimal bounds too (`minimum: 0.5`) |
| string `format` | loose (`2023-02-31`, `\\d`), few formats | strict regexes (`formats`): date, time, date-time, email, uuid, ipv4, ipv6, hostname, uri, uri-reference, uri-template, duration, regex (only formats JSON Schema defines: OpenAPI's `byte` and other names are annotations) |
| string `pattern` | copied between quotes: `.` can write a raw `"` | JSON-escaped translation, searched as in ECMA-262 (`patterns`), intersected exactly with `minLength`/`maxLength` (below) |
| `type: [..]` with per-type keywords | keywords of the other types lost | split into `anyOf` |
| `allOf` | regexes concatenated: invalid JSON | merged into one schema (object members together: each side's `additionalProperties` covers the keys its own `properties`/`patternProperties` leave, `_merge_members`; a later part that lists properties is merged into each branch of an earlier part's `anyOf`/`oneOf`, so a branch's members come first, in the order of the parts, as llguidance writes them, `into_branches`) |
| `anyOf` beside a branch that allows a whole type (`{"type": "object"}`, annotations only) | every branch kept | the branches whose values are all of that type left out (the same union; one byte could not choose between an open object's value call and another object's string: MaskBench o69208), and not checked for unsupported keywords |
| `oneOf` | treated as `anyOf` | `anyOf` when the branches are provably disjoint (types, listed discriminators, a property both require whose values cannot be equal, also one level down, a closed object against a required name, `required` also in `allOf`; as llguidance), or made disjoint exactly: finite branches -> the values exactly one lists, a type two branches accept whole taken out, `required`-only branches -> presence choices; else exact where the overlapping values are regular (`exact_one_of`: per kind of value, the texts exactly one branch's automaton accepts, their canonical spellings only, compact for objects and arrays; objects only where read in any order with no key twice: closed, at most 6 listed members; no other engine enforces `oneOf` exactly: llguidance, XGrammar and outlines treat it as `anyOf`); overlapping objects with additional members or in one order, recursive branches, cut recursion and free-form values refused, naming the branches and why |
| objects | closed: no property beyond `properties` | open unless `additionalProperties: false` (JSON Schema's default; `closed_objects=True` closes them); `patternProperties` (a key no pattern matches is an additional property: its key language is the complement automaton, written back as a regex, `unmatched_keys`), `propertyNames`, `minProperties`/`maxProperties`, `required` names without a schema (any value) |
| free-form values (`{}`) | nested 3 levels, a 14,000-character regex that takes minutes to compile | as deep as the stack (default `free_form_depth=None`: a pushdown automaton); nested `free_form_depth` levels for an integer |
| `enum`/`const` at the top (or in a top-level `allOf` branch) beside other keywords | the other keywords' regexes joined | the enum of the listed values `jsonschema` accepts under the whole schema (`not`, `if`, `contains`, ... exact on them) |
| recursive `$ref` | unrolled `max_recursion_depth` times, the property dropped at the bound: dangling `,` | `json_schema_compile` (`max_recursion_depth=None`, `JsonSchema`'s default): a call of a grammar rule for its target, nested as deep as the stack (`stack_depth`, default 32); with an integer `max_recursion_depth`, where that cannot run deterministically, and in `json_schema_regex`, unrolled `max_recursion_depth` times with the bottom value left out where JSON stays valid |

A rewritten node is replaced by a `const` marker string; after outlines-core has built the
regex, each marker's regex is substituted by ours.

**Lengths of strings with a `pattern` or `format`.** `minLength`/`maxLength` count decoded
characters (a `\\n` or `\\u00e9` escape, a multi-byte UTF-8 character: one each). Where it is
exact and compact, the bounds go into the string's regex (`patterns.json_string_pattern`: the
pattern's own lengths already within them, or one repeated character per alternative after
distributing fixed-width alternations, `^(png|jpeg):[a-z]*$`); otherwise the string's byte DFA
is intersected with a character counter (`patterns.length_bounded_dfa`, up to
`MAX_STRING_STATES` states and counts up to `patterns.MAX_COUNTED_REPEAT`). Such a string has
no compact regex: `json_schema_compile` splices its automaton into the schema's byte DFA
(`spliced_dfa`, a token automaton), or, in the grammar form, calls it as a rule; the regex
interface (`json_schema_regex`, `JsonSchema` with one schema per row) refuses it. MaskBench:
`^[a-zA-Z0-9\\-]+(\\s[a-zA-Z0-9\\-]+)*$` with maxLength 64 is 437 states, `format: email` with
maxLength 1,024 is 18,309 (the schema compiles in about 6 s), a `{0,29}`-word pattern with
maxLength 300 63,212; refused with the sizes: the same with maxLength 400, a repeat to 32,745
characters. A plain string (no `pattern` or `format`) with a `maxLength` over `COUNTED_STRING_MIN`
(256) characters and a `minLength` of at most `budgets.COUNTER_MIN_LENGTH` (64) is a *counter
rule* of the grammar form in `json_schema_compile` (`counter_strings`: a per-frame register
counts its characters, run by `RegisterPushdownConstraint`; a `minLength` is a chain of states
before the counted loop; never spliced into a token automaton nor a regex): MaskBench's bounds
of 300-2,000 (which spliced automata of 12 states per character made 30,000-66,000-state token
automata) and the larger ones (8,192; 32,767: 75 schemas; 65,535: 46). It is refused where the
grammar form cannot call it (called where another string may start: an `anyOf` of it and an
enum). Where a token of the vocabulary is longer than `maxLength - minLength` bytes, the string
is no counter rule (a token entering the string would pass the limit unseen; SmolLM2's longest
is 81 bytes, Gemma 3's 48: `counter_strings.LONGEST_TOKEN`). Any other plain string with a bound over
`COUNTED_STRING_MIN` takes the path of the strings above (12 states per character: cheaper than
outlines-core's counted repeat, whose DFA takes 30 s for maxLength 5,000), refused at once over
`MAX_STRING_STATES` states (a `minLength` alone, or over 64 beside a `maxLength` over 5,333).

Keywords: unknown keywords are annotations and are ignored (JSON Schema 2020-12 core §4.3.1,
as every validator does: `id`, `_format`, `javaName`, ...), and so is a `format` that JSON
Schema does not define (`"int64"`, `"password"`). "Unknown" is relative to the schema's own
dialect (its `$schema`, default 2020-12), as `jsonschema` reads it (`in_dialect`): under draft 4
`const`, `contains`, `propertyNames` and `if` assert nothing; before 2019-09 neither do
`dependentRequired` nor the keywords beside a `$ref` (draft 7 core §8.3), before 2020-12 neither
does `prefixItems`; from 2019-09 `dependencies` asserts nothing, and in 2020-12 neither does
`additionalItems`. Known assertions that no regular constraint can enforce raise
`UnsupportedSchemaError` naming the keyword and where it is, before anything is compiled:
`not` (except where its complement is a schema, `negation`: a type, or `required` names of
which one must then be absent; and a `not` of listed strings, which excludes them, in every
JSON spelling, from the node's strings), `if`/`then`/`else` (except a discriminated union,
`conditionals_as_branches`: every `if` tests one property against listed values, and the
property's own schema lists its values or, for strings, the other values take every `else`; or a
single `if` whose complement is a schema;
`then`/`else` without `if` assert nothing and are ignored), `dependentSchemas`,
`dependencies` whose value is a schema, `contains` beside item counts, `maxContains`,
`multipleOf` whose remainders no compact regex writes (7, 9, 11, 12, 13, 16, ... on an
unbounded range; `0.01` is "at most two fraction digits", 5 or 2.5 a remainder automaton written
as a regex, `multiple_terminal`),
`uniqueItems: true` (for more than one item),
`unevaluated*`, `oneOf` branches whose objects or arrays overlap and are not read exactly (`exact_one_of`), string lengths whose automaton would be too
large (named with its size), the JSON Schema
formats we lack (`idn-email`, `iri`, ...), `propertyNames` beside `patternProperties` in an open object,
more than three `dependentRequired` entries in one object (each doubles the alternatives; up to
three become an `anyOf`: the property absent, or it and its dependencies present; draft 4-7's
`dependencies` with a list of names is `dependentRequired`), and remote
`$ref`s. With `strict=False` they are dropped instead (the output may then violate
them), with one warning that lists them all, like llguidance's lenient mode. Beside `patternProperties`, the additional
properties of an open object (any value unless `additionalProperties` says otherwise) have the
keys no pattern matches and no listed property names: the byte automaton of printable-ASCII
keys minus each pattern's, written back as a regex (`unmatched_keys`). Known gaps, not
refused (valid documents rejected, never invalid ones generated): such additional keys are
printable ASCII without `"` and `\\` (where the pattern translation is exact); a pattern whose
complement is too large to write (MaskBench's BCP 47 language tags) leaves only the keys that
do not start like one of its keys; a pattern that also matches a listed property keeps its
printable-ASCII keys other than the listed names. A schema whose
whole regex would exceed `MAX_REGEX` (a million characters: many optional properties, or
definitions used many times) makes `json_schema_regex` raise `ConstraintError` at once, before
the regex is built.

**Grammar form.** `JsonSchema` (through `json_schema_compile`) uses the single regex's token
automaton while that regex has at most `GRAMMAR_REGEX` characters (100,000); beyond, it
compiles the schema's *grammar form* (`json_schema_grammar`; when that is refused, the single
regex up to `SINGLE_REGEX` characters, 250,000): each large subschema (its regex
over `RULE_REGEX` characters, or over `SHARED_RULE_REGEX` when used in several places: a
definition referenced many times) becomes a rule of a pushdown automaton, called from its
users' regexes instead of copied into them; only terminals (strings with patterns, formats and
lengths, number ranges, keys) and small subschemas stay inlined regexes. A call site where one
byte cannot choose between two rules (an `anyOf` of two objects) inlines them there. A tail that
several rules' automata share (the members after a recursive property, in each unrolled copy of
the definition) becomes one more rule that each of them tail-calls (`_shared_tails`). An
object whose members one regex cannot track in any order is a rule whose automaton is built
from its members: one copy of them per set written (`order_automata`), or, for more members
than those sets can track, one copy and a register of the members written (`register_objects`,
run by `pushdown.register_walk`: a `}` before every required member is refused). The
grammar form is refused (`ConstraintError`, at once) when its rules' automata have more than
`MAX_GRAMMAR_POSITIONS` states in all: the pushdown token tables would take too long.

**Recursive `$ref`s.** `json_schema_compile` (unless given an integer `max_recursion_depth`)
first tries the grammar form with each recursive reference kept as a call (`inline_references(recursive=True)`: a reference met again inside its
own expansion becomes a placeholder; `Rewriter.recursive_call` makes it a marker whose
substitution is the rewritten target, a rule that `plan_rules` keeps), so a schema like
an expression tree nests as deep as the stack allows, whatever `max_recursion_depth` says, at the
size of one copy of each recursive definition. Where a one-byte lookahead cannot choose a
recursive call (`anyOf` of a recursive object and another object), the `anyOf` is the rule
instead, one automaton holding both (`_cycle_breakers`, `merge_equal_markers`). It falls back
to the unrolled path (and its result or error) when the recursion cannot be rules: a cycle of
calls none of which one byte can choose, a recursion through `allOf` merges
(`{"$ref": "#", "required": [..]}` inside the target), a recursion that never ends, or any
other error of the grammar form. `json_schema_regex` (one regex) always unrolls.

Where we follow llguidance (`docs/json_schema.md`): properties come in the order of
`properties`; where an object's members come from several places (its own `properties` beside
`allOf`, `anyOf`, `oneOf` or `$ref`), in the order of those keywords in the schema's text, as
llguidance 1.9 reads them (`applicator_first`: `{"anyOf": [..], "properties": {..}}` lists a
branch's members first, `{"properties": {..}, "anyOf": [..]}` the node's own; its docs call
this order unstable, MaskBench's documents follow it); additional properties come after the
listed ones; `format` is enforced;
`oneOf` becomes `anyOf` only when provably equivalent. Where we differ: overlapping regular
`oneOf` branches are enforced exactly (llguidance refuses them, or treats them as `anyOf` with
`coerce_one_of`); unanchored `pattern`s
are searched (the spec's semantics; llguidance anchors them), and a `format` JSON Schema does
not define is ignored rather than refused.

Whitespace between tokens follows outlines-core's default (`[ ]?`: none or one space) unless a
`whitespace_pattern` is given.
"""

from . import (
    arrays as arrays,
    branches as branches,
    budgets as budgets,
    compiling as compiling,
    conditionals as conditionals,
    constraint as constraint,
    dialect as dialect,
    enums as enums,
    errors as errors,
    free_values as free_values,
    grammar_form as grammar_form,
    keys as keys,
    keywords as keywords,
    merging as merging,
    numbers as numbers,
    objects as objects,
    property_order as property_order,
    pushdown_form as pushdown_form,
    references as references,
    regex_form as regex_form,
    rewriter as rewriter,
    rule_automata as rule_automata,
    rule_plan as rule_plan,
    scalars as scalars,
    strings as strings,
)
from .errors import InvalidSchemaError as InvalidSchemaError
from .errors import KeysTooComplex as KeysTooComplex
from .errors import NoCommonType as NoCommonType
from .errors import NotTokenAutomaton as NotTokenAutomaton
from .errors import RecursionRefused as RecursionRefused
from .errors import RegexTooLarge as RegexTooLarge
from .errors import SchemaTooLargeError as SchemaTooLargeError
from .errors import TooLarge as TooLarge
from .errors import TooManyPositions as TooManyPositions
from .errors import UnsatisfiableSchemaError as UnsatisfiableSchemaError
from .errors import UnsupportedSchemaError as UnsupportedSchemaError
from .keywords import JSON_TYPES as JSON_TYPES
from .keywords import KNOWN as KNOWN
from .keywords import NOT_STRINGS as NOT_STRINGS
from .keywords import TYPE_KEYWORDS as TYPE_KEYWORDS
from .keywords import UNSUPPORTED as UNSUPPORTED
from .keywords import asserts as asserts
from .dialect import check_schema as check_schema
from .dialect import check_schema_size as check_schema_size
from .dialect import in_dialect as in_dialect
from .dialect import schema_as_dict as schema_as_dict
from .references import NEVER as NEVER
from .references import RECURSIVE as RECURSIVE
from .references import applicator_first as applicator_first
from .references import inline_references as inline_references
from .budgets import UNORDERED_BUDGET as UNORDERED_BUDGET
from .budgets import UNORDERED_FACTOR as UNORDERED_FACTOR
from .budgets import ANY_ORDER_MAX as ANY_ORDER_MAX
from .budgets import COUNTED_ITEMS_MIN as COUNTED_ITEMS_MIN
from .budgets import COUNTED_STRING_MIN as COUNTED_STRING_MIN
from .budgets import GRAMMAR_REGEX as GRAMMAR_REGEX
from .budgets import MAX_COMPILE_THREADS as MAX_COMPILE_THREADS
from .budgets import MAX_CONDITIONAL_BRANCHES as MAX_CONDITIONAL_BRANCHES
from .budgets import MAX_CONTAINS as MAX_CONTAINS
from .budgets import MAX_DEPENDENCIES as MAX_DEPENDENCIES
from .budgets import MAX_GRAMMAR_POSITIONS as MAX_GRAMMAR_POSITIONS
from .budgets import MAX_MULTIPLE_REGEX as MAX_MULTIPLE_REGEX
from .budgets import MAX_NEGATION_CHOICES as MAX_NEGATION_CHOICES
from .budgets import MAX_OBJECT_REGEX as MAX_OBJECT_REGEX
from .budgets import MAX_POSITIONS_BEFORE_TAILS as MAX_POSITIONS_BEFORE_TAILS
from .budgets import MAX_PRESENCE_CHOICES as MAX_PRESENCE_CHOICES
from .budgets import MAX_RECURSIVE_MERGES as MAX_RECURSIVE_MERGES
from .budgets import MAX_REGEX as MAX_REGEX
from .budgets import MAX_RULES as MAX_RULES
from .budgets import MAX_SCHEMA_BYTES as MAX_SCHEMA_BYTES
from .budgets import MAX_SHARED_TAILS as MAX_SHARED_TAILS
from .budgets import MAX_SPLICED_STATES as MAX_SPLICED_STATES
from .budgets import MAX_STRING_STATES as MAX_STRING_STATES
from .budgets import MIN_RULE_REGEX as MIN_RULE_REGEX
from .budgets import MIN_SHARED_TAIL as MIN_SHARED_TAIL
from .budgets import OVER_REGEX_SCALE as OVER_REGEX_SCALE
from .budgets import PLAIN_STRING_STATES as PLAIN_STRING_STATES
from .budgets import REPEATED_RULE_REGEX as REPEATED_RULE_REGEX
from .budgets import RULE_EDGES_STATES as RULE_EDGES_STATES
from .budgets import RULE_REGEX as RULE_REGEX
from .budgets import SECOND_ORDER_BUDGET as SECOND_ORDER_BUDGET
from .budgets import SHARED_COUNT_MIN as SHARED_COUNT_MIN
from .budgets import SHARED_RULE_REGEX as SHARED_RULE_REGEX
from .budgets import SHARED_TAIL_TRIES as SHARED_TAIL_TRIES
from .budgets import SINGLE_REGEX as SINGLE_REGEX
from .budgets import SINGLE_REGEX_WEIGHT as SINGLE_REGEX_WEIGHT
from .budgets import WEIGHT_PER_STATE as WEIGHT_PER_STATE
from .keys import key_not_in as key_not_in
from .keys import literal_key as literal_key
from .keys import name_checker as name_checker
from .keys import overlap as overlap
from .keys import unmatched_keys as unmatched_keys
from .scalars import INTEGER as INTEGER
from .scalars import NUMBER as NUMBER
from .scalars import STRING as STRING
from .scalars import excluded_strings as excluded_strings
from .scalars import json_spellings as json_spellings
from .scalars import number_regex as number_regex
from .scalars import other_strings_regex as other_strings_regex
from .free_values import DEFAULT_FREE_FORM_DEPTH as DEFAULT_FREE_FORM_DEPTH
from .free_values import FREE_VALUE_CALL as FREE_VALUE_CALL
from .free_values import NESTED_FREE_FORM_DEPTH as NESTED_FREE_FORM_DEPTH
from .free_values import free_value as free_value
from .rewriter import DEFAULT_MAX_RECURSION_DEPTH as DEFAULT_MAX_RECURSION_DEPTH
from .property_order import PROPERTY_ORDERS as PROPERTY_ORDERS
from .regex_form import json_schema_automaton as json_schema_automaton
from .regex_form import json_schema_regex as json_schema_regex
from .pushdown_form import json_schema_pushdown as json_schema_pushdown
from .grammar_form import json_schema_grammar as json_schema_grammar
from .compiling import json_schema_compile as json_schema_compile
from .constraint import JsonSchema as JsonSchema
