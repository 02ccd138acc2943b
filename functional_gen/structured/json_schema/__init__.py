"""`JsonSchema`: generated text that is a JSON document valid under a JSON Schema.

The package's modules: `errors`, `keywords` (the schema vocabulary), `dialect`
(`check_schema`), `references` (`$ref`, `$id`), `keys` (object keys), `scalars` (strings and
numbers as regexes), `budgets` (every size limit, with the measurement that set it). This
module still holds the rest (about 4,400 lines: rewriting by JSON type, property order, the
regex, grammar and pushdown forms, compiling, `JsonSchema`) until it is split by concept as
well (issue 39, item 4); it re-exports the public names.

The schema is first checked against its dialect's metaschema (`jsonschema`'s `check_schema`),
its `$ref`s are resolved with the `referencing` library (`$id`, `$anchor`, JSON pointers) and
inlined, then it becomes a regex: outlines-core's `build_regex_from_schema` for the simple
nodes, our own regexes where outlines-core's would let invalid documents through or refuse:

| keyword | outlines-core alone | here |
|---|---|---|
| integer/number `minimum`, `maximum`, `exclusive*` | ignored | exact range regex (`ranges`), decimal bounds too (`minimum: 0.5`) |
| string `format` | loose (`2023-02-31`, `\\d`), few formats | strict regexes (`formats`): date, time, date-time, email, uuid, ipv4, ipv6, hostname, uri, uri-reference, uri-template, byte, duration, regex |
| string `pattern` | copied between quotes: `.` can write a raw `"` | JSON-escaped translation, searched as in ECMA-262 (`patterns`), intersected exactly with `minLength`/`maxLength` (below) |
| `type: [..]` with per-type keywords | keywords of the other types lost | split into `anyOf` |
| `allOf` | regexes concatenated: invalid JSON | merged into one schema (object members together: each side's `additionalProperties` covers the keys its own `properties`/`patternProperties` leave, `_merge_members`; a later part that lists properties is merged into each branch of an earlier part's `anyOf`/`oneOf`, so a branch's members come first, in the order of the parts, as llguidance writes them, `_Rewriter.into_branches`) |
| `anyOf` beside a branch that allows a whole type (`{"type": "object"}`, annotations only) | every branch kept | the branches whose values are all of that type left out (the same union; one byte could not choose between an open object's value call and another object's string: MaskBench o69208), and not checked for unsupported keywords |
| `oneOf` | treated as `anyOf` | `anyOf` when the branches are provably disjoint (types, listed discriminators, a property both require whose values cannot be equal, also one level down, a closed object against a required name, `required` also in `allOf`; as llguidance), or made disjoint exactly: finite branches -> the values exactly one lists, a type two branches accept whole taken out, `required`-only branches -> presence choices; else refused |
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
(`_spliced_dfa`, a token automaton), or, in the grammar form, calls it as a rule; the regex
interface (`json_schema_regex`, `JsonSchema` with one schema per row) refuses it. MaskBench:
`^[a-zA-Z0-9\\-]+(\\s[a-zA-Z0-9\\-]+)*$` with maxLength 64 is 437 states, `format: email` with
maxLength 1,024 is 18,309 (the schema compiles in about 6 s), a `{0,29}`-word pattern with
maxLength 300 63,212; refused with the sizes: the same with maxLength 400, a repeat to 32,745
characters. A plain string (no `pattern` or `format`) with a bound over `COUNTED_STRING_MIN`
(256) characters takes the same path in `json_schema_compile` (12 states per character: cheaper
than outlines-core's counted repeat, whose DFA takes 30 s for maxLength 5,000); over
`MAX_STRING_STATES` states (maxLength 5,333) it is refused at once. MaskBench's larger bounds
(8,192; 32,767: 75 schemas; 65,535: 46) would need a counter register on the device.

Keywords: unknown keywords are annotations and are ignored (JSON Schema 2020-12 core §4.3.1,
as every validator does: `id`, `_format`, `javaName`, ...), and so is a `format` that JSON
Schema does not define (`"int64"`, `"password"`). "Unknown" is relative to the schema's own
dialect (its `$schema`, default 2020-12), as `jsonschema` reads it (`in_dialect`): under draft 4
`const`, `contains`, `propertyNames` and `if` assert nothing; before 2019-09 neither do
`dependentRequired` nor the keywords beside a `$ref` (draft 7 core §8.3), before 2020-12 neither
does `prefixItems`; from 2019-09 `dependencies` asserts nothing, and in 2020-12 neither does
`additionalItems`. Known assertions that no regular constraint can enforce raise
`UnsupportedSchemaError` naming the keyword and where it is, before anything is compiled:
`not` (except where its complement is a schema, `_negation`: a type, or `required` names of
which one must then be absent; and a `not` of listed strings, which excludes them, in every
JSON spelling, from the node's strings), `if`/`then`/`else` (except a discriminated union,
`_conditionals_as_branches`: every `if` tests one property, whose own
schema lists its values, against listed values; or a single `if` whose complement is a schema;
`then`/`else` without `if` assert nothing and are ignored), `dependentSchemas`,
`dependencies` whose value is a schema, `contains` beside item counts, `maxContains`,
`multipleOf` whose remainders no compact regex writes (7, 9, 11, 12, 13, 16, ... on an
unbounded range; `0.01` is "at most two fraction digits", 5 or 2.5 a remainder automaton written
as a regex, `multiple_terminal`),
`uniqueItems: true` (for more than one item),
`unevaluated*`, overlapping `oneOf` branches, string lengths whose automaton would be too
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
the definition) becomes one more rule that each of them tail-calls (`_shared_tails`). The
grammar form is refused (`ConstraintError`, at once) when its rules' automata have more than
`MAX_GRAMMAR_POSITIONS` states in all: the pushdown token tables would take too long.

**Recursive `$ref`s.** `json_schema_compile` (unless given an integer `max_recursion_depth`)
first tries the grammar form with each recursive reference kept as a call (`inline_references(recursive=True)`: a reference met again inside its
own expansion becomes a placeholder; `_Rewriter.recursive_call` makes it a marker whose
substitution is the rewritten target, a rule that `_plan_rules` keeps), so a schema like
an expression tree nests as deep as the stack allows, whatever `max_recursion_depth` says, at the
size of one copy of each recursive definition. Where a one-byte lookahead cannot choose a
recursive call (`anyOf` of a recursive object and another object), the `anyOf` is the rule
instead, one automaton holding both (`_cycle_breakers`, `_merge_equal_markers`). It falls back
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
`oneOf` becomes `anyOf` only when provably equivalent. Where we differ: unanchored `pattern`s
are searched (the spec's semantics; llguidance anchors them), and a `format` JSON Schema does
not define is ignored rather than refused.

Whitespace between tokens follows outlines-core's default (`[ ]?`: none or one space) unless a
`whitespace_pattern` is given.
"""

import collections
import concurrent.futures
import contextlib
import decimal
import hashlib
import itertools
import json
import math
import os
import re
import typing
import uuid
import warnings
from collections.abc import Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from ...processors.base import per_row_field
from ..automaton import ConstraintError, cache_key, cached, unique_columns
from ..byte_dfa import (
    REJECT,
    ByteDFA,
    lift,
    minimize,
    reachable_states,
    refine_changed,
    refine_exact,
    regex_automaton,
    regex_byte_dfa,
    relabel_states,
    trim,
)
from ..formats import ANY_STRING, FORMATS, SPEC_FORMATS
from ..grammar_syntax import Alt, GrammarSpec, Ref, Repeat, Seq, Terminal
from ..patterns import (
    LengthBoundError,
    NoStringError,
    bounded_length,
    dfa_regex,
    difference_dfas,
    intersect_dfas,
    json_string_pattern,
    length_bounded_dfa,
)
from ..processor import (
    AbstractConstraint,
    ConstraintTables,
    automata_tables,
    pushdown_tables,
    register_token_recipe,
    rows_of,
)
from ..pushdown import DEFAULT_STACK_DEPTH, NotDeterministic, PushdownAutomaton, build_pushdown
from ..ranges import integer_range_regex, multiple_of_dfa, number_range_regex
from ..regex_syntax import escape
from ..vocabulary import TokenVocabulary, vocabulary_from_tokenizer
from .errors import InvalidSchemaError as InvalidSchemaError
from .errors import (
    KeysTooComplex,
    NoCommonType,
    NotTokenAutomaton,
    RecursionRefused,
    RegexTooLarge,
    TooLarge,
    TooManyPositions,
    UnsupportedSchemaError,
)
from .keywords import (
    JSON_TYPES,
    KNOWN,
    NOT_STRINGS,
    TYPE_KEYWORDS,
    UNSUPPORTED,
    asserts,
)
from .dialect import (
    check_schema,
    in_dialect,
    schema_as_dict,
)
from .references import (
    NEVER,
    RECURSIVE,
    applicator_first,
    inline_references,
)
from .keys import (
    key_not_in,
    literal_key,
    name_checker,
    overlap,
    unmatched_keys,
)
from .scalars import (
    INTEGER,
    NUMBER,
    STRING,
    excluded_strings,
    json_spellings,
    number_regex,
    other_strings_regex,
)
from .budgets import (
    ANY_ORDER_BUDGET,
    ANY_ORDER_MAX,
    COUNTED_ITEMS_MIN,
    COUNTED_STRING_MIN,
    GRAMMAR_REGEX,
    MAX_COMPILE_THREADS,
    MAX_CONDITIONAL_BRANCHES,
    MAX_CONTAINS,
    MAX_DEPENDENCIES,
    MAX_GRAMMAR_POSITIONS,
    MAX_MULTIPLE_REGEX,
    MAX_NEGATION_CHOICES,
    MAX_OBJECT_REGEX,
    MAX_POSITIONS_BEFORE_TAILS,
    MAX_PRESENCE_CHOICES,
    MAX_RECURSIVE_MERGES,
    MAX_REGEX,
    MAX_RULES,
    MAX_SHARED_TAILS,
    MAX_SPLICED_STATES,
    MAX_STRING_STATES,
    MIN_RULE_REGEX,
    MIN_SHARED_TAIL,
    OVER_REGEX_SCALE,
    PLAIN_STRING_STATES,
    REPEATED_RULE_REGEX,
    RULE_EDGES_STATES,
    RULE_REGEX,
    SECOND_ORDER_BUDGET,
    SHARED_COUNT_MIN,
    SHARED_RULE_REGEX,
    SHARED_TAIL_TRIES,
    SINGLE_REGEX,
    SINGLE_REGEX_WEIGHT,
    WEIGHT_PER_STATE,
)

# Nested helpers that run per byte, state or schema node are `@typing.no_type_check`: the
# tests' jaxtyping import hook would wrap every call of them (30-40 us each, and a fresh
# wrapper per definition), which was most of the structured tests' time.

DEFAULT_MAX_RECURSION_DEPTH = 3
"""How many times a recursive `$ref` is unrolled (outlines-core's default)."""

KNOWN.add(NOT_STRINGS)


def _listed_values(schema):
    """A schema that lists its values (`enum` or `const` at the top, or in a branch of a
    top-level `allOf`) beside other keywords: `{"enum": [the listed values the whole schema
    accepts]}`, each value judged by `jsonschema` (the schema's own draft, formats asserted as
    this module asserts them), so that every keyword is exact on a finite set of values, those
    a regex cannot enforce (`not`, `if`, `contains`, `uniqueItems`, ...) included. The MaskBench
    `Synthesized` split is made of such schemas (`allOf` of a one-value `enum` and a test of the
    JSON Schema test suite). Any other schema, or one whose values `jsonschema` cannot judge
    (an external `$ref`), is returned unchanged."""
    if not isinstance(schema, Mapping):
        return schema
    lists = []
    for branch in (
        [schema, *schema.get("allOf", [])] if isinstance(schema.get("allOf"), list) else [schema]
    ):
        if isinstance(branch, Mapping):
            if "const" in branch:
                lists.append([branch["const"]])
            elif isinstance(branch.get("enum"), list):
                lists.append(branch["enum"])
    if not lists or {k for k in schema if asserts(k)} <= {"enum", "const"}:
        return schema  # nothing listed, or nothing beside the list
    # deferred on purpose: jsonschema loads only to check a schema
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        kept = [value for value in min(lists, key=len) if validator.is_valid(value)]
    except Exception:  # e.g. referencing's `Unresolvable` (an external `$ref`): the rewriter
        return schema  # then refuses or compiles the schema as it would without a list
    return {"enum": kept}


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value == math.floor(value) and math.isfinite(value) else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _first_present(node: dict, branches: list) -> list:
    """`anyOf: [{"required": [x1]}, {"required": [x2]}, ...]` (at least one of the names,
    annotations aside) as "the first of them present is x_i": branch i also makes the names
    before x_i absent (`properties: {x_j: false}`), in the order the object writes its members
    (`node`'s `properties`, then the others). The union is the same, but the branches no longer
    overlap, so an automaton reading the members in order follows one branch once a name is
    seen, where the overlapping form followed every subset of the names still possible:
    MaskBench o21108's 8 names made outlines-core's DFA 302,634 states. Other `anyOf`s, and
    those of fewer than 3 names (small either way), are returned as they are."""
    names = []
    for branch in branches:
        if not isinstance(branch, Mapping) or {k for k in branch if asserts(k)} != {"required"}:
            return branches
        required = branch["required"]
        if not isinstance(required, list) or len(required) != 1:
            return branches
        names.append(required[0])
    if (
        len(names) < 3
        or len(set(names)) != len(names)
        or not all(isinstance(n, str) for n in names)
    ):
        return branches
    listed = (
        list(node.get("properties") or {}) if isinstance(node.get("properties"), Mapping) else []
    )
    rank = {name: i for i, name in enumerate(listed)}
    names.sort(key=lambda name: rank.get(name, len(listed)))
    return [
        {"required": [name], **({"properties": dict.fromkeys(names[:i], False)} if i else {})}
        for i, name in enumerate(names)
    ]


def _whole_type(schema, closed_objects: bool) -> str | None:
    """The JSON type whose every value `schema` allows and nothing else (`{"type": "string"}`,
    `{"type": ["object"], "properties": {}, "title": ...}`: annotations and keywords that
    assert nothing beside the `type`), else `None`. An object is not whole with
    `closed_objects` (it then allows only `{}`)."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, list) and len(kind) == 1:
        kind = kind[0]
    if not isinstance(kind, str) or kind not in JSON_TYPES:
        return None
    if kind == "object" and closed_objects:
        return None
    for key, value in schema.items():
        if key == "type" or not asserts(key):
            continue
        if key in ("properties", "patternProperties", "required") and not value:
            continue
        if key in ("additionalProperties", "items") and (value is True or value == {}):
            continue
        return None
    return kind


def _value_types(schema) -> set[str] | None:
    """The JSON types a schema's values may have, as far as its `const`, `enum` or `type`
    says (`integer` for integral numbers), else `None`."""
    if not isinstance(schema, Mapping):
        return None
    if "const" in schema:
        return {_json_type(schema["const"])}
    if isinstance(schema.get("enum"), list):
        return {_json_type(value) for value in schema["enum"]}
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list) and all(isinstance(k, str) for k in kind):
        return set(kind)
    return None


def _negation(schema):
    """A schema equal to `{"not": schema}` where the complement is one, else `None`:

    - `true`/`{}` -> `false`; `false` -> `true`;
    - `{"type": T}` -> the other JSON types (`integer`'s complement is not a type: `None`);
    - `{"required": R}` (beside vacuous `properties`) -> an object that lacks one of `R` (its
      property schema `false`); `{"anyOf": [{"required": R1}, ...]}` -> an object that lacks
      one of each `Ri` (at most `MAX_NEGATION_CHOICES` choices). `required` holds only for
      objects, so every other value matches it and fails the `not`.

    Annotations are ignored. MaskBench's docker-compose schemas use the `required` forms."""
    if schema is True or schema == {}:
        return False
    if schema is False:
        return True
    if not isinstance(schema, Mapping):
        return None
    keys = {k for k in schema if asserts(k)}
    if keys == {"type"}:
        t = schema["type"]
        types = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
        if not types or not types <= JSON_TYPES or types & {"integer", "number"} == {"integer"}:
            return None
        rest = sorted(JSON_TYPES - types - {"integer", "number"})
        if not types & {"number", "integer"}:
            rest.append("number")
        return {"type": rest} if rest else False

    @typing.no_type_check
    def required_sets(part):
        if not isinstance(part, Mapping):
            return None
        vacuous = all(v is True or v == {} for v in part.get("properties", {}).values())
        names = part.get("required")
        if (
            {k for k in part if asserts(k)} <= {"required", "properties"}
            and vacuous
            and isinstance(names, list)
            and all(isinstance(n, str) for n in names)
        ):
            return [list(dict.fromkeys(names))]
        return None

    if keys == {"anyOf"} and isinstance(schema["anyOf"], list):
        sets = []
        for part in schema["anyOf"]:
            found = required_sets(part)
            if found is None:
                return None
            sets += found
    else:
        sets = required_sets(schema)
    if not sets:
        return None
    if any(not names for names in sets):  # `required: []` holds for every value
        return False
    choices = list(itertools.islice(itertools.product(*sets), MAX_NEGATION_CHOICES + 1))
    if len(choices) > MAX_NEGATION_CHOICES:
        return None
    branches = [{"properties": dict.fromkeys(absent, False)} for absent in choices]
    return {"type": "object", **({"anyOf": branches} if len(branches) > 1 else branches[0])}


def _conditional(part):
    """`(if, then, else)` of an `allOf` part that holds only a conditional (and annotations),
    else `None`; `then`/`else` default to `true`."""
    if not isinstance(part, Mapping) or "if" not in part:
        return None
    if {k for k in part if asserts(k)} - {"if", "then", "else"}:
        return None
    return part["if"], part.get("then", True), part.get("else", True)


def _discriminator(condition):
    """`(name, values, required, object_only)` when `condition` (an `if` schema) tests one
    property against listed values: `{"properties": {name: {"const": v}}}` (or `enum`, a
    `type` beside them; `"required": [name]` and `"type": "object"` optional), else `None`.
    `values`: the canonical keys (`_canonical`) of the values that pass the test."""
    if not isinstance(condition, Mapping):
        return None
    properties = condition.get("properties")
    if {k for k in condition if asserts(k)} - {"properties", "required", "type"}:
        return None
    if not isinstance(properties, Mapping) or len(properties) != 1:
        return None
    if condition.get("type", "object") != "object":
        return None
    (name, schema), required = next(iter(properties.items())), condition.get("required", [])
    if required not in ([], [name]) or not isinstance(schema, Mapping):
        return None
    if {k for k in schema if asserts(k)} - {"const", "enum", "type"}:
        return None
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if not isinstance(values, list):
        return None
    types = schema.get("type", sorted(JSON_TYPES))
    types = {types} if isinstance(types, str) else set(types)
    if "number" in types:
        types.add("integer")
    keys = {_canonical(v) for v in values if _json_type(v) in types}
    if "const" in schema and "enum" in schema:
        keys &= {_canonical(v) for v in schema["enum"]}
    return name, keys, bool(required), "type" in condition


def _discriminator_negation(condition):
    """A schema equal to `{"not": condition}` for a discriminator `if` (`_discriminator`), or
    `None`: an object that has the property with a value the `if` does not list (`not` of the
    listed values: compiled for strings, `excluded_strings`), or lacks it where the `if`
    requires it, or a non-object value where the `if` says `"type": "object"`."""
    found = _discriminator(condition)
    if found is None:
        return None
    name, keys, required, object_only = found
    schema = condition["properties"][name]
    values = [schema["const"]] if "const" in schema else schema["enum"]
    listed = [v for v in values if _canonical(v) in keys]
    if not listed:
        return None
    branches = [
        {"type": "object", "required": [name], "properties": {name: {"not": {"enum": listed}}}}
    ]
    if required:
        branches.append({"type": "object", "properties": {name: False}})
    if object_only:
        branches.append({"type": sorted(JSON_TYPES - {"object", "integer"})})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _conditionals_as_branches(node: dict) -> dict:
    """`node` with its conditionals (`if`/`then`/`else` of its own and of `allOf` parts that
    hold only one) rewritten as an exact `anyOf`, when every `if` tests the same property
    against listed values (`_discriminator`: the discriminated unions of JSON Schema Store,
    `allOf: [{if: {properties: {type: {const: "a"}}}, then: A}, ...]`) and the property's own
    schema lists its values: one branch per group of values that select the same `then`/`else`
    parts, one where the property is absent, one for values that are not objects (where an
    `if` of `properties` holds vacuously). A single `if` whose complement is a schema
    (`_negation`) becomes `anyOf: [allOf: [if, then], allOf: [not if, else]]`. `then`/`else`
    without `if` assert nothing (JSON Schema 2020-12 core §10.2.2) and are dropped. Otherwise
    `node` is returned with its conditionals, which the rewrite then refuses."""
    node = dict(node)
    if "if" not in node:
        node.pop("then", None)
        node.pop("else", None)
    rest = {k: v for k, v in node.items() if k not in ("if", "then", "else", "allOf")}
    conditionals, kept = [], []
    if "if" in node:
        conditionals.append((node["if"], node.get("then", True), node.get("else", True)))
    for part in node.get("allOf", []):
        found = _conditional(part)
        (kept if found is None else conditionals).append(part if found is None else found)
    if not conditionals:
        return node
    found = [_discriminator(condition) for condition, _, _ in conditionals]
    if len(conditionals) == 1 and found[0] is None:
        condition, then, otherwise = conditionals[0]
        negated = _negation(condition)
        if negated is None:
            return node
        branches = [{"allOf": [condition, then]}, {"allOf": [negated, otherwise]}]
        return {**rest, "allOf": [*kept, {"anyOf": branches}]}
    if any(f is None for f in found) or len({f[0] for f in found}) != 1:
        return node
    name = found[0][0]
    properties = node.get("properties")
    own = properties.get(name) if isinstance(properties, Mapping) else None
    if isinstance(own, Mapping) and {k for k in own if asserts(k)} == {"type"}:
        # the finite types list their values
        finite = {"boolean": [False, True], "null": [None]}
        types = [own["type"]] if isinstance(own["type"], str) else own["type"]
        if isinstance(types, list) and types and all(t in finite for t in types):
            own = {"enum": [v for t in types for v in finite[t]]}
    listed = _listed_values(own) if isinstance(own, Mapping) else None
    if isinstance(listed, Mapping) and "const" in listed and len(listed) == 1:
        listed = {"enum": [listed["const"]]}
    if not isinstance(listed, Mapping) or set(listed) != {"enum"}:
        # values beyond the listed ones: a single `if` takes the complement of its test
        negated = _discriminator_negation(conditionals[0][0]) if len(conditionals) == 1 else None
        if negated is None:
            return node
        condition, then, otherwise = conditionals[0]
        branches = [{"allOf": [condition, then]}, {"allOf": [negated, otherwise]}]
        return {**rest, "allOf": [*kept, {"anyOf": branches}]}

    @typing.no_type_check
    def branch(base: dict, selected) -> dict:
        parts = []
        for i, (_, then, otherwise) in enumerate(conditionals):
            part = then if i in selected else otherwise
            if part is not True and part != {}:
                parts.append(part)
        return {**base, "allOf": parts} if parts else base

    groups: dict = {}  # the conditionals whose `if` holds -> the values for which they do
    for value in listed["enum"]:
        key = _canonical(value)
        groups.setdefault(tuple(i for i, f in enumerate(found) if key in f[1]), []).append(value)
    branches = [
        branch({"type": "object", "required": [name], "properties": {name: {"enum": v}}}, s)
        for s, v in groups.items()
    ]
    # the property absent: an `if` without `required` holds; not an object: one without
    # `"type": "object"` holds
    absent = {i for i, f in enumerate(found) if not f[2]}
    branches.append(branch({"type": "object", "properties": {name: False}}, absent))
    vacuous = {i for i, f in enumerate(found) if not f[3]}
    branches.append(branch({"type": sorted(JSON_TYPES - {"object", "integer"})}, vacuous))
    if len(branches) > MAX_CONDITIONAL_BRANCHES:
        return node
    return {**rest, "allOf": [*kept, {"anyOf": branches}]}


def _forbidden_names(schema) -> set:
    """Names an object under `schema` cannot have: property schemas `false` (also inside an
    `allOf`, as `merge` writes them), and those of a `not` of `required` with one choice."""

    @typing.no_type_check
    def never(prop) -> bool:
        return prop is False or (
            isinstance(prop, Mapping)
            and isinstance(prop.get("allOf"), list)
            and any(p is False for p in prop["allOf"])
        )

    if not isinstance(schema, Mapping):
        return set()
    names = {n for n, p in schema.get("properties", {}).items() if never(p)}
    parts = [_negation(schema["not"])] if "not" in schema else []
    parts += schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []
    for part in parts:
        if isinstance(part, Mapping) and "anyOf" not in part and "not" not in part:
            names |= _forbidden_names(part)
    return names


def _listed_value_keys(schema) -> set | None:
    """The canonical keys (`_canonical`) of the values `schema` may take when it lists them
    (`const`, `enum`, or such a schema among `allOf`'s parts: the intersection), else `None`."""
    if not isinstance(schema, Mapping):
        return None
    found = []
    if "const" in schema:
        found.append({_canonical(schema["const"])})
    elif isinstance(schema.get("enum"), list):
        found.append({_canonical(v) for v in schema["enum"]})
    for part in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        values = _listed_value_keys(part)
        if values is not None:
            found.append(values)
    for combinator in ("anyOf", "oneOf"):  # listed when every branch lists: the union
        if isinstance(schema.get(combinator), list):
            parts = [_listed_value_keys(part) for part in schema[combinator]]
            if parts and all(p is not None for p in parts):
                found.append(set().union(*parts))
    return set.intersection(*found) if found else None


def _canonical(value) -> str:
    """A key equal for equal JSON values (`1` and `1.0` alike, `true` apart from `1`)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = float(value)
        return repr(int(value)) if value.is_integer() else repr(value)
    return json.dumps(value, sort_keys=True)


_DEFAULT_WHITESPACE = "[ ]?"
"""outlines-core's default whitespace between JSON tokens: none or one space."""


_FALLBACK_DEPTHS = (2, 1)
"""The depths the fallback tries in turn when no pushdown automaton can be built: 2 only as the
token automaton of a single regex within `SINGLE_REGEX` (its grammar form is not attempted),
else `NESTED_FREE_FORM_DEPTH` as before. On the 60 fallbacks among MaskBench's dev schemas, 59
nest 2 levels, their compile times summed +8% (median per schema 1.08, at most +0.6 s, the
slowest 2.8 s), and the valid documents of o9795 and sp_193 that nest 2 levels are accepted."""


NESTED_FREE_FORM_DEPTH = 1
"""How deep a free-form value (`{}`, `true`, a schema without type information, the value of an
additional property) nests arrays and objects where it is a regex (`json_schema_regex`, a list
of schemas in `JsonSchema`, `per_row`, and the last fallback when no pushdown automaton can be
built, after depth 2, `_FALLBACK_DEPTHS`): 1 allows `[1, "a"]` and `{"a": null}` but not
`{"a": [1]}` (an open object is itself a level: its additional values may be such one-level
values). Each level makes the regex much longer (a free value alone, measured when this default
was set: depth 2 about 2 s, depth 3 over a minute through outlines-core's byte DFA; inside
large MaskBench schemas depth 2 now adds about 8%, depth 3 is often refused as too large)."""
DEFAULT_FREE_FORM_DEPTH = None
"""`JsonSchema`'s and `json_schema_compile`'s default `free_form_depth`: free-form values nest
as deep as the pushdown automaton's stack (`json_schema_pushdown`, or calls of the JSON value
rule in the grammar form), as the JSON Schema spec allows; where no pushdown automaton can be
built (a value beside other text that starts the same way nested deeper than
`_inline_value_calls` reads it in place, `_VALUE_CALL_LEVELS`; a grammar form over its position
limit) they nest 2 levels where that is a single regex's token automaton, else
`NESTED_FREE_FORM_DEPTH` level(s) (`_FALLBACK_DEPTHS`), with a `UserWarning` that says why
and how deep.

Measured on 2026-11-23 (the five MaskBench splits, `--limit 24`, each schema compiled cold, the
regex cache emptied, depth 1 and `None` interleaved, the box quiet): both compile 114 of 120,
compile p50 94 ms (depth 1) against 89 ms (`None`), median per-schema ratio 1.03, total 57.0 s
against 52.6 s; small schemas pay up to 15 ms (kb_432 17 -> 30 ms), large open ones compile up
to 2x faster (o41296 1.29 -> 0.63 s). Every valid instance that depth 1 rejected for nesting is
accepted (o13687, o21865, o12281, kb_688). Depth 1 was the default while the pushdown tables
cost 60-90 ms more per schema; the token walk that remembers each (function, byte class) step
(`pushdown.token_tables`) removed that."""
FREE_VALUE_CALL = "\x01"
"""Stands for a free-form value in a schema's regex on the pushdown path: a control character,
which JSON text never holds raw (strings escape it; whitespace is space, tab, CR, LF)."""


class _FreeValueCall:
    """The type of `_CALL`: `json_schema_regex(free_form_depth=_CALL)` writes free-form values as
    `FREE_VALUE_CALL`, which the grammar form turns into a call of its JSON value rule (where
    such a call competes with other text for a byte, `_inline_value_calls` reads the value in
    place there)."""


_CALL = _FreeValueCall()


def free_value(depth: int, ws: str = _DEFAULT_WHITESPACE, innermost: str | None = None) -> str:
    """The regex of any JSON value whose arrays and objects nest at most `depth` levels
    (`depth=0`: strings, numbers, `true`, `false`, `null` only), `ws` between tokens; with
    `innermost`, the values `depth` levels down are that regex instead of scalars (`depth=0`:
    `innermost` itself)."""
    scalar = f"(?:{STRING}|{NUMBER}|true|false|null)"
    if depth <= 0:
        return scalar if innermost is None else innermost
    inner = free_value(depth - 1, ws, innermost)
    array = rf"\[{ws}(?:{inner}(?:{ws},{ws}{inner})*)?{ws}\]"
    member = f"{STRING}{ws}:{ws}{inner}"
    obj = rf"\{{{ws}(?:{member}(?:{ws},{ws}{member})*)?{ws}\}}"
    return f"(?:{scalar}|{array}|{obj})"


def _own_constant(value) -> bool:
    """Whether a constant's JSON text is written by `_Rewriter.constant_regex` rather than by
    outlines-core: it is or holds an object (outlines-core leaves keys unescaped) or a number
    (outlines-core writes one spelling: `1.0` rejects `1`, `1e-07` is written `1e-7`)."""
    if isinstance(value, Mapping):
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    return isinstance(value, list) and any(_own_constant(v) for v in value)


_MEMBER_BLOCK = 32
"""Members of an object nested in one `_listed_members` regex before they are grouped in blocks."""


def _listed_members(items, sep: str) -> tuple[str | None, bool]:
    """The listed members of an object, in order, at least one of them: `(regex, empty)`, where
    `regex` matches every non-empty subsequence of `items` (the regex of each `"key": value` and
    whether it is required) that keeps the required ones, members separated by `sep`, and
    `empty` says whether no member at all is also allowed (nothing is required). `regex` is
    `None` when there are no items.

    Linear in the members' total size (each member's regex appears at most twice per level of
    `_MEMBER_BLOCK` blocks), built from
    the front: after the members before `i`, either something was written (`written`) or, while
    nothing is required, nothing was; an optional member `i` extends it to `(?:written(?:sep
    member)?|member)`, a required one to `(?:written sep)?member` and ends the "nothing
    written" case. (Written from the back as "the rest after member `i`", the same language
    copies each rest into every earlier member's alternative: quadratic in the member count,
    185,000 characters for an object of 60 optional properties, which outlines-core turns into
    an automaton in seconds or cannot at all.)"""
    if len(items) > _MEMBER_BLOCK:
        # nesting grows by one group per optional member: in blocks, each block's members as
        # one unit (required when one of them is), so that the regex stays within the parser's
        # nesting limit (250 in Rust's `regex-syntax`)
        blocks = [items[i : i + _MEMBER_BLOCK] for i in range(0, len(items), _MEMBER_BLOCK)]
        units = [
            (f"(?:{_listed_members(block, sep)[0]})", any(r for _, r in block)) for block in blocks
        ]
        return _listed_members(units, sep)
    written: str | None = None  # the non-empty subsequences of the members so far
    empty = True  # whether writing none of the members so far is allowed
    for regex, required in items:
        if written is None:
            written = regex
        elif required:
            written = f"(?:{written}{sep})?{regex}" if empty else f"{written}{sep}{regex}"
        elif empty:  # `written` is one member or a group: no top-level `|`
            written = f"(?:{written}(?:{sep}{regex})?|{regex})"
        else:
            written = f"{written}(?:{sep}{regex})?"
        if required:
            empty = False
    if written is not None and len(written) > MAX_OBJECT_REGEX:
        raise TooLarge(len(written))
    return written, empty


def _members_any_order(items, sep: str) -> tuple[str | None, bool]:
    """As `_listed_members`, in any order: `(regex, empty)`, `regex` matching every non-empty
    set of `items` (each member's regex and whether it is required) that keeps the required
    ones, written in any order, members separated by `sep`. The regex follows the set written so
    far, so each member appears `2 ** (n - 1)` times: for small objects only (`ANY_ORDER_MAX`,
    `ANY_ORDER_BUDGET`). Deterministic: each member starts with its own key."""
    if not items:
        return None, True
    n = len(items)
    required = sum(1 << i for i, (_, r) in enumerate(items) if r)
    memo: dict[int, str] = {}

    @typing.no_type_check
    def after(mask: int) -> str:
        if mask not in memo:
            alternatives = [
                f"{sep}{items[i][0]}{after(mask | 1 << i)}" for i in range(n) if not mask >> i & 1
            ]
            if not alternatives:
                memo[mask] = ""
            else:
                body = "|".join(f"(?:{a})" for a in alternatives)
                memo[mask] = f"(?:{body})" + ("?" if mask & required == required else "")
        return memo[mask]

    first = "|".join(f"(?:{items[i][0]}{after(1 << i)})" for i in range(n))
    return f"(?:{first})", required == 0


def _members_two_orders(items, order, sep: str) -> tuple[str | None, bool]:
    """As `_listed_members`, in two orders: `items` as listed, or permuted by `order` (a list of
    indices into `items`): `(regex, empty)`, the union of the two languages. Each order's
    regex is linear in the members' size, so the union is at most twice an object's."""
    first, empty = _listed_members(items, sep)
    second, _ = _listed_members([items[i] for i in order], sep)
    if first is None or first == second:
        return first, empty
    return f"(?:(?:{first})|(?:{second}))", empty


def _object_regex(
    items,
    extra,
    ws: str,
    min_count: int,
    max_count: int | None,
    any_order: bool = False,
    second_order: list[int] | None = None,
) -> str | None:
    """The regex of an object: `items` (the regex of each listed `"key": value`, and whether it
    is required) in order, then `extra` (the regex of one additional `"key": value`, or `None`)
    repeated; the number of members between `min_count` and `max_count`. `None` when no
    object fits. Without bounds beyond "at least one member", the listed members are
    `_listed_members` (linear size); otherwise a table of "rest of the object after member i,
    with c members written", where c saturates at the largest bound that matters. With
    `any_order`, the listed members of the first two cases come in any order
    (`_members_any_order`)."""
    sep = f"{ws},{ws}"
    if any_order:
        members = _members_any_order
    elif second_order is not None:
        members = lambda items, sep: _members_two_orders(items, second_order, sep)  # noqa: E731
    else:
        members = _listed_members
    n = len(items)
    top = max(min_count, max_count if max_count is not None else 0, 1)
    memo: dict = {}

    @typing.no_type_check
    def rest(i: int, c: int):
        if (i, c) in memo:
            return memo[(i, c)]
        if i == n:
            lo = max(0, min_count - c)
            hi = None if max_count is None else max_count - c
            if extra is None or hi == 0:
                out = "" if lo == 0 else None
            elif c > 0:
                out = f"(?:{sep}(?:{extra})){{{lo},{'' if hi is None else hi}}}"
            else:
                tail = f"(?:{sep}(?:{extra})){{{max(lo - 1, 0)},{'' if hi is None else hi - 1}}}"
                out = f"(?:{extra}){tail}" + ("?" if lo == 0 else "")
                if lo == 0:
                    out = f"(?:(?:{extra}){tail})?"
        else:
            regex, required = items[i]
            if not required and c > 0 and min(c + 1, top) == c and max_count is None:
                # the count no longer matters: an optional member, then the same rest (linear size)
                after = rest(i + 1, c)
                memo[(i, c)] = None if after is None else f"(?:{sep}{regex})?{after}"
                return memo[(i, c)]
            alternatives = []
            if max_count is None or c < max_count:
                after = rest(i + 1, min(c + 1, top))
                if after is not None:
                    alternatives.append((sep if c > 0 else "") + regex + after)
            if not required:
                skip = rest(i + 1, c)
                if skip is not None:
                    alternatives.append(skip)
            if not alternatives:
                out = None
            elif len(alternatives) == 1:
                out = alternatives[0]
            else:
                out = "(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")"
        if out is not None and len(out) > MAX_OBJECT_REGEX:
            raise TooLarge(len(out))
        memo[(i, c)] = out
        return out

    if min_count <= 1 and max_count is None and extra is None:
        # no count that matters beyond "at least one": the listed members in linear size
        listed, empty = members(items, sep)
        if listed is None:
            body = None if min_count else ""
        else:
            body = f"(?:{listed})?" if empty and not min_count else listed
        return None if body is None else rf"\{{{ws}{body}{ws}\}}"
    if min_count == 0 and max_count is None and extra is not None and items:
        # the usual case, in linear size: the listed members (at least one), then the additional
        # ones, or the additional ones alone when nothing is required
        listed, _ = members(items, sep)
        alternatives = [] if listed is None else [f"{listed}(?:{sep}(?:{extra}))*"]
        if not any(required for _, required in items):
            alternatives.append(f"(?:(?:{extra})(?:{sep}(?:{extra}))*)?")
        body = "(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")"
    else:
        body = rest(0, 0)
    return None if body is None else rf"\{{{ws}{body}{ws}\}}"


_OBJECT_MEMBERS = ("properties", "patternProperties", "additionalProperties")
"""An object's member keywords: `additionalProperties` applies to the keys that its own schema's
`properties` and `patternProperties` leave, so two schemas' members merge together
(`_merge_members`), never keyword by keyword."""


def _both(x, y):
    """The schema of `x` AND `y`, written simply where one of them says nothing or forbids all."""
    if x is True or x == {}:
        return y
    if y is True or y == {} or x == y:
        return x
    if x is False or y is False:
        return False
    return {"allOf": [x, y]}


def _flat_all_of(branches, path: str) -> list:
    """`(path, branch)` for each of the `allOf` `branches`, a branch's own `allOf` spliced in
    beside its other keywords, in the order of the branch's text as llguidance reads it: after
    them (its properties first: a `$ref` beside siblings, inlined as `{"allOf": [target,
    siblings]}`, lists the target's properties first at every level of nesting), or before
    them where `allOf` comes before `properties` (`applicator_first`). Merging them in this
    order is the same schema (`allOf` is associative)."""
    if not isinstance(branches, list):
        return [(path, branches)]
    out = []
    for i, branch in enumerate(branches):
        where = f"{path}/{i}"
        if isinstance(branch, Mapping) and isinstance(branch.get("allOf"), list):
            own = {k: v for k, v in branch.items() if k != "allOf"}
            nested = _flat_all_of(branch["allOf"], f"{where}/allOf")
            if applicator_first(branch, "allOf"):
                out.extend(nested)
                if own:
                    out.append((where, own))
            else:
                if own:
                    out.append((where, own))
                out.extend(nested)
        else:
            out.append((where, branch))
    return out


def _searches(pattern: str, name: str) -> bool:
    """Whether `pattern` matches somewhere in `name` (`False` for a pattern Python cannot
    compile: `_object` refuses it with its location)."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def _merge_members(a: Mapping, b: Mapping, path: str) -> dict:
    """`properties`, `patternProperties` and `additionalProperties` of the schema `a` AND `b`:
    each listed name gets both sides' schemas for it (a side that does not list it gives the
    schemas of its patterns that match the name, or its `additionalProperties`, `{}` by
    default); each pattern of one side is combined with the other side's
    `additionalProperties`; the keys neither lists nor matches get both `additionalProperties`.
    Exact when at most one side has `patternProperties`, or both have but neither restricts its
    additional keys.

    **Raises:** `UnsupportedSchemaError` when both sides have `patternProperties` and one also
    restricts its additional keys (the keys one side's patterns leave to the other's
    `additionalProperties` would need a pattern difference)."""
    sides = []
    for x in (a, b):
        sides.append(
            (
                dict(x.get("properties", {})),
                dict(x.get("patternProperties", {})),
                x.get("additionalProperties", True),
            )
        )
    (pa, qa, xa), (pb, qb, xb) = sides
    if qa and qb and not (_both(xa, True) is True and _both(xb, True) is True):
        raise UnsupportedSchemaError(
            "patternProperties",
            path,
            "in both schemas of an allOf, where one also restricts `additionalProperties`",
        )

    @typing.no_type_check
    def side_of(name, listed, patterns, additional):
        if name in listed:
            return listed[name]
        matched = [s for p, s in patterns.items() if _searches(p, name)]
        if not matched:
            return additional
        out = matched[0]
        for schema in matched[1:]:
            out = _both(out, schema)
        return out

    out: dict = {}
    names = list(dict.fromkeys([*pa, *pb]))
    if names:
        out["properties"] = {
            n: _both(side_of(n, pa, qa, xa), side_of(n, pb, qb, xb)) for n in names
        }
    patterns = {p: _both(s, xb) for p, s in qa.items()}
    for p, s in qb.items():
        patterns[p] = _both(patterns[p], s) if p in patterns else _both(xa, s)
    if patterns:
        out["patternProperties"] = patterns
    additional = _both(xa, xb)
    if additional is not True and additional != {}:
        out["additionalProperties"] = additional
    return out


class _Rewriter:
    """One pass over a schema: checks keywords, rewrites nodes outlines-core gets wrong."""

    def __init__(
        self,
        root: dict,
        *,
        strict: bool = True,
        closed_objects: bool = False,
        whitespace_pattern: str | None = None,
        max_recursion_depth: int = DEFAULT_MAX_RECURSION_DEPTH,
        free_form_depth: "int | _FreeValueCall | None" = NESTED_FREE_FORM_DEPTH,
        counted_strings: bool = False,
        property_order: str = "schema",
        expansions: Sequence = (),
    ):
        self.root = root
        self.property_order = property_order
        self.expansions = list(expansions)
        """The recursive targets' subtrees (`inline_references(recursive=True)`): target `k`'s
        rule body, called by its placeholders (`recursive_call`)."""
        self.bodies = {id(body): k for k, body in enumerate(self.expansions)}
        self.recursive: dict[int, str] = {}
        """Target index -> the marker of its rule, whose substitution is the regex of the
        rewritten target (filled by `fill_recursive` when the target itself is rewritten)."""
        self.filled: set[int] = set()
        self.body_regex: dict[int, str] = {}
        """Target index -> the regex of the rewritten target (its rule's body)."""
        self.recursive_merges = 0
        self.counted_strings = counted_strings
        """Write a plain string with a length bound over `COUNTED_STRING_MIN` as an automaton
        (`bounded_string`) instead of a counted regex repeat (only `json_schema_compile`, which
        splices it, sets this)."""
        self.substitutions: dict[str, str] = {}
        self.names: dict[str, str] = {}
        self.item_repeats: dict[str, tuple[str, int]] = {}
        """Per marker of an array with a large item count (`counted_items`): the marker of its
        items and how many more copies of them its counted repeat writes out."""
        self.repeat_weight: dict[str, int] = {}
        """Per marker of a counted plain string (`SHARED_COUNT_MIN`), the characters its
        counted repeat would add written out (`(count - 1)` times the repeated atom): what its
        automaton costs beyond the regex's length, for `weight` and `_plan_rules`."""
        self.tag = uuid.uuid4().hex[:12]
        self.strict, self.closed_objects = strict, closed_objects
        self.whitespace_pattern, self.max_recursion_depth = whitespace_pattern, max_recursion_depth
        self.ws = _DEFAULT_WHITESPACE if whitespace_pattern is None else f"(?:{whitespace_pattern})"
        self.dropped: list[str] = []
        if isinstance(free_form_depth, _FreeValueCall):
            free_form_depth = None
        self.free_form_depth = free_form_depth
        self.dfa_terminals: dict[str, tuple[str, str, str]] = {}
        """Markers of strings given as automata (`bounded_string`): name -> (placeholder,
        path, keyword)."""
        self.dfa_texts: dict[str, ByteDFA] = {}
        """The quoted string DFA of each placeholder of `dfa_terminals`."""

    def refuse(self, keyword: str, path: str, reason: str) -> None:
        """A keyword that cannot be enforced: raise (`strict`), or remember it as dropped."""
        if self.strict:
            raise UnsupportedSchemaError(keyword, path, reason)
        self.dropped.append(f"`{keyword}` at {path} ({reason})")

    def any_value(self) -> dict:
        """Any JSON value, nested at most `free_form_depth` levels (a marker of `free_value`),
        or, with `free_form_depth=None`, the character `FREE_VALUE_CALL` that the pushdown
        automaton turns into a call of its recursive JSON value rule."""
        if self.free_form_depth is None:
            return self.marker(escape(FREE_VALUE_CALL))
        return self.marker(free_value(self.free_form_depth, self.ws))

    def regex_of(self, schema) -> str:
        """The regex of a rewritten schema (markers left in, substituted at the end)."""
        # deferred on purpose: the Rust extension loads only when a regex compiles
        from outlines_core.json_schema import build_regex_from_schema

        if schema is NEVER:
            raise RuntimeError("internal error: the regex of NEVER")
        try:
            return (
                "(?:"
                + build_regex_from_schema(
                    json.dumps(schema), self.whitespace_pattern, self.max_recursion_depth
                )
                + ")"
            )
        except (ValueError, RuntimeError) as e:
            raise ConstraintError(
                f"outlines-core cannot convert the JSON Schema: {str(e).splitlines()[0]}"
            ) from None

    def marker(self, regex: str) -> dict:
        """A `const` standing for `regex` (one name per distinct regex, so that a definition
        used in many places is one marker: one rule of the grammar form)."""
        name = self.names.get(regex)
        if name is None:
            name = self.names[regex] = f"FGSUB{len(self.substitutions)}X{self.tag}"
            self.substitutions[name] = regex
        return {"const": name}

    def substitute(self, regex: str, limit: int = MAX_REGEX) -> str:
        """`regex` with every marker (outlines-core's regex of the marker's `const`, the name
        between quotes) replaced by its regex, markers inside those expanded too: one pass per
        distinct marker, each expanded once (replacing them one at a time over the whole regex
        is quadratic: 9 s for a schema with 17,000 markers).

        **Raises:** `RegexTooLarge` (a `ConstraintError`) when the result would have more than
        `limit` characters (checked before it is built)."""
        found = re.compile(f'"(FGSUB[0-9]+X{self.tag})"')
        if (total := self._expanded_size(regex)) > limit:
            raise RegexTooLarge(total, limit)
        expanded: dict[str, str] = {}

        @typing.no_type_check
        def expand(match) -> str:
            name = match.group(1)
            if name not in expanded:
                expanded[name] = "(?:" + found.sub(expand, self.substitutions[name]) + ")"
            return expanded[name]

        regex = found.sub(expand, regex)
        if f"X{self.tag}" in regex:
            raise RuntimeError("internal error: a marker survived in the regex")
        return regex

    # ------------------------------------------------------------------ nodes

    def node(self, node, path: str):
        """The rewritten schema, or `NEVER` when no value can satisfy it."""
        if isinstance(node, Mapping) and RECURSIVE in node:
            return self.recursive_call(node[RECURSIVE])
        k = self.bodies.get(id(node)) if isinstance(node, Mapping) else None
        if k is not None and k not in self.filled:  # a recursive target: its rule's body too
            self.filled.add(k)
            rewritten = self.node(dict(node), path)
            self.fill_recursive(k, rewritten, path)
            return rewritten
        if node is True or node == {}:
            return self.any_value()
        if node is False or node is NEVER:
            return NEVER
        if not isinstance(node, Mapping):
            raise UnsupportedSchemaError(
                str(node), path, f"a schema must be an object or a boolean, got {node!r}"
            )
        node = dict(node)
        if isinstance(node.get("dependencies"), Mapping):
            # draft 4-7: a list of names is `dependentRequired`, a schema `dependentSchemas`
            dependencies = node.pop("dependencies")
            for key, value in dependencies.items():
                kind = "dependentRequired" if isinstance(value, list) else "dependentSchemas"
                node[kind] = {**node.get(kind, {}), key: value}
        if "not" in node:
            negated = _negation(node["not"])
            excluded = (
                None if negated is not None else excluded_strings(self.deref(node["not"], path))
            )
            if negated is not None:  # `not` of a shape whose complement is a schema: exact
                node.pop("not")
                node["allOf"] = [*node.get("allOf", []), negated]
            elif excluded is not None:  # `not` of listed strings: the other strings
                node.pop("not")
                node = self.merge(node, {NOT_STRINGS: excluded}, path)
        if {"if", "then", "else"} & node.keys() or any(
            _conditional(part) is not None for part in node.get("allOf", ())
        ):
            node = _conditionals_as_branches(node)
        for key in list(node):
            if key in UNSUPPORTED:
                self.refuse(key, path, UNSUPPORTED[key])
            if key not in KNOWN:  # an annotation or an unknown keyword: asserts nothing
                del node[key]
        if "dependentRequired" in node:
            return self.node(self.dependent_required(node, path), path)
        return self.structural(node, path)

    def recursive_call(self, k: int) -> dict:
        """The marker of the rule of recursive target `k` (a placeholder of
        `inline_references(recursive=True)`). Markers are named after their regexes, which the
        target's is not yet: this one is named for the target, and its substitution is filled
        when the target is rewritten (`fill_recursive`, `finish_recursive`)."""
        name = self.recursive.get(k)
        if name is None:
            name = self.recursive[k] = f"FGSUB{len(self.substitutions)}X{self.tag}"
            # the body when the target was rewritten already (a placeholder in another copy
            # of it); else filled by fill_recursive
            self.substitutions[name] = self.body_regex.get(k, "")
        return {"const": name}

    def fill_recursive(self, k: int, rewritten, path: str) -> None:
        """Make `rewritten` (recursive target `k`, rewritten) the body of `k`'s rule.

        **Raises:** `RecursionRefused` when no value satisfies the target (its recursion never
        ends; the unrolled path cuts it where it may)."""
        if rewritten is NEVER:
            raise RecursionRefused(f"no value satisfies the recursive target at {path}")
        self.filled.add(k)
        self.body_regex[k] = self.regex_of(rewritten)
        if k in self.recursive:
            self.substitutions[self.recursive[k]] = self.body_regex[k]

    def finish_recursive(self) -> None:
        """Rewrite the recursive targets whose rules are called but whose subtrees the pass
        over the schema did not rewrite as they are (only merged into others: `allOf`, a
        `$ref` with sibling keywords), until every called rule has its body."""
        while pending := [k for k in self.recursive if k not in self.filled]:
            for k in pending:
                self.filled.add(k)
                body = self.expansions[k]
                self.fill_recursive(k, self.node(dict(body), f"(recursive target {k})"), "")
        if any(not self.substitutions[name] for name in self.recursive.values()):
            raise RuntimeError("internal error: a recursive rule without a body")

    def dependent_required(self, node: dict, path: str) -> dict:
        """`dependentRequired` as an `anyOf` of objects: for each dependency `name: [needed]`,
        either `name` is absent (its schema `false`) or it and `needed` are required. Regular:
        at most `MAX_DEPENDENCIES` dependencies (2^k branches)."""
        dependencies = node.pop("dependentRequired")
        if not isinstance(dependencies, Mapping) or not all(
            isinstance(v, list) and all(isinstance(n, str) for n in v)
            for v in dependencies.values()
        ):
            raise UnsupportedSchemaError(
                "dependentRequired",
                path,
                f"must map property names to lists of names, got {dependencies!r}",
            )
        dependencies = {k: v for k, v in dependencies.items() if v}
        if len(dependencies) > MAX_DEPENDENCIES:
            self.refuse(
                "dependentRequired",
                path,
                f"{len(dependencies)} dependencies (at most "
                f"{MAX_DEPENDENCIES}: each doubles the alternatives)",
            )
            return node
        branches = [node]
        for name, needed in dependencies.items():
            expanded = []
            for branch in branches:
                required = list(branch.get("required", []))
                if name not in required:  # `name` absent
                    expanded.append(
                        {**branch, "properties": {**branch.get("properties", {}), name: False}}
                    )
                expanded.append(
                    {**branch, "required": list(dict.fromkeys([*required, name, *needed]))}
                )
            branches = expanded
        return branches[0] if len(branches) == 1 else {"anyOf": branches}

    def structural(self, node: dict, path: str):
        if "allOf" in node:
            # the node's own members after the parts where `allOf` comes first in its text
            # (llguidance's order, `applicator_first`), else before them
            own = (
                {k: node.pop(k) for k in _OBJECT_MEMBERS if k in node}
                if applicator_first(node, "allOf")
                else {}
            )
            keys = list(node)
            parts_first = any(  # the node's own `anyOf`/`oneOf` came after `allOf`
                k in node and keys.index("allOf") < keys.index(k) for k in ("anyOf", "oneOf")
            )
            merged = node
            for where, branch in _flat_all_of(node.pop("allOf"), f"{path}/allOf"):
                if branch is NEVER or branch is False:
                    return NEVER
                try:
                    into = self.into_branches(merged, branch, where, parts_first)
                    merged = into if into is not None else self.merge(merged, branch, where)
                except NoCommonType:  # types that share no value: the schema has none
                    return NEVER
            if own:
                try:
                    merged = self.merge(merged, own, path)
                except NoCommonType:
                    return NEVER
            return self.node(merged, path)
        if "anyOf" in node and "oneOf" in node and isinstance(node["anyOf"], list):
            # (a1 | a2) & oneOf(O) = (a1 & oneOf(O)) | (a2 & oneOf(O)). (As one `allOf` of the
            # two, the merge put both back side by side and this recursed forever: MaskBench
            # Github_hard o12454.) A branch's own `anyOf` is distributed the same way, deeper.
            one_of = node.pop("oneOf")
            node["anyOf"] = [{"allOf": [branch, {"oneOf": one_of}]} for branch in node["anyOf"]]
            return self.structural(node, path)
        for combinator in ("anyOf", "oneOf"):
            if combinator in node:
                # a branch's members before the node's own where the combinator comes first
                # in the node's text (llguidance's order, `applicator_first`)
                branch_first = applicator_first(node, combinator)
                branches = node.pop(combinator)
                if not isinstance(branches, list) or not branches:
                    raise UnsupportedSchemaError(
                        combinator, path, "must be a non-empty list of schemas"
                    )
                if combinator == "oneOf":
                    branches = self.exclusive_branches(node, branches, path)
                else:
                    branches = _first_present(node, branches)
                merged = []
                for i, branch in enumerate(branches):
                    where = f"{path}/{combinator}/{i}"
                    if branch is NEVER or branch is False:
                        continue
                    try:
                        if not node:
                            merged.append((where, branch))
                        elif branch_first and isinstance(branch, Mapping):
                            merged.append((where, self.merge(branch, node, where)))
                        else:
                            merged.append((where, self.merge(node, branch, where)))
                    except NoCommonType:  # e.g. a non-object branch of an object: no value
                        continue
                if combinator == "anyOf":
                    merged = self.absorbed(merged)
                combined, originals = [], []
                for where, original in merged:
                    rewritten = self.node(original, where)
                    if rewritten is not NEVER:
                        combined.append(rewritten)
                        originals.append(original)
                if not combined:
                    return NEVER
                if combinator == "oneOf":
                    try:
                        self.check_disjoint(
                            originals, path
                        )  # markers would all look like constants
                    except UnsupportedSchemaError as e:
                        self.refuse("oneOf", path, e.reason + " (kept as `anyOf`)")
                if len(combined) == 1:
                    return combined[0]
                calls = set(self.recursive.values())
                if any(branch.get("const") in calls for branch in combined):
                    # its own marker: where a one-byte lookahead cannot choose between the
                    # recursive targets, the `anyOf` is the rule instead (`_cycle_breakers`)
                    return self.marker(self.regex_of({"anyOf": combined}))
                return {"anyOf": combined}
        if "const" in node or "enum" in node:
            return self.enumeration(node, path)
        types = node.get("type")
        if types is None:
            types = self.infer_types(node)
        if isinstance(types, list):
            if not types:
                raise UnsupportedSchemaError("type", path, "an empty list of types allows no value")
            if len(types) == 1:
                return self.typed(types[0], node, path)
            branches = [
                b
                for i, t in enumerate(types)
                if (b := self.typed(t, node, f"{path}/type/{i}")) is not NEVER
            ]
            return (
                NEVER
                if not branches
                else branches[0]
                if len(branches) == 1
                else {"anyOf": branches}
            )
        return self.typed(types, node, path)

    def absorbed(self, branches: list) -> list:
        """The `(path, schema)` branches of an `anyOf` without those whose values are all of
        types that another branch allows whole (`{"type": "object"}`, `{"type": "string"}`,
        ... with annotations only, `_whole_type`): the union is the same. Where a branch is an
        open object without properties, the objects beside it would otherwise start alike with
        different continuations, a value call where the others read a string (MaskBench
        o69208's `requirements`: one byte cannot choose). An absorbed branch is not rewritten,
        so nothing in it is refused."""
        whole: dict[str, int] = {}
        for i, (_, schema) in enumerate(branches):
            kind = _whole_type(schema, self.closed_objects)
            if kind is not None:
                whole.setdefault(kind, i)
        if not whole:
            return branches
        kept = set(whole.values())
        out = []
        for i, branch in enumerate(branches):
            kinds = _value_types(branch[1])
            covered = kinds is not None and all(
                kind in whole or (kind == "integer" and "number" in whole) for kind in kinds
            )
            if i in kept or not covered:
                out.append(branch)
        return out

    def infer_types(self, node: dict):
        """No `type`: every JSON type is allowed, and each type-specific keyword constrains only
        values of its type (`{"properties": {...}}` also accepts `"text"` or `3`), as validators
        read it. `None` when no type-specific keyword is present (any value)."""
        present = [t for t, keys in TYPE_KEYWORDS.items() if keys & node.keys() and t != "integer"]
        if not present:
            return None
        return present + [
            t
            for t in ("object", "array", "string", "number", "boolean", "null")
            if t not in present
        ]

    def typed(self, kind, node: dict, path: str):
        if kind is None:  # no type information: any JSON value
            return self.any_value()
        if kind not in JSON_TYPES:
            raise UnsupportedSchemaError("type", path, f"unknown type {kind!r}")
        keys = {k: v for k, v in node.items() if k in TYPE_KEYWORDS[kind]}
        return self.BY_TYPE[kind](self, keys, path)

    def multiple_of(self, node: dict, path: str, integer: bool = False):
        """How `multipleOf` is written: `(places, step)`. `places` is `d` for a power of ten
        `10 ** -d` (`0.01`: 2; `1`: 0), a count of fraction digits; `step` is any other value
        (`5`, `2.5`; `0.25` for a number), a remainder automaton (`multiple_terminal`). Both
        `None` without `multipleOf`, or for an `integer` when every integer is a multiple
        (`1 / multipleOf` an integer: `0.25`).

        **Raises:** `UnsupportedSchemaError` for a `multipleOf` that is not a positive number."""
        if "multipleOf" not in node:
            return None, None
        m = node["multipleOf"]
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0:
            raise UnsupportedSchemaError(
                "multipleOf", path, f"must be a positive number, got {m!r}"
            )
        exact = decimal.Decimal(repr(m)) if isinstance(m, float) else decimal.Decimal(m)
        if integer and (1 / exact) == (1 / exact).to_integral_value():
            return None, None
        digits = exact.normalize().as_tuple()
        if digits.digits == (1,) and digits.exponent <= 0:
            return -digits.exponent, None
        return None, m

    def multiple_terminal(self, regex: str, step, integer: bool, path: str):
        """The numbers of `regex` (a range, or any number) that are multiples of `step`: the
        intersection of its automaton with the remainder automaton `multiple_of_dfa`, written
        back as a regex (`dfa_regex`). `NEVER` when no multiple lies in the range. Steps whose
        regex would exceed `MAX_MULTIPLE_REGEX` characters (7, 9, 11, 12, 13, 16 and most
        larger ones: the remainders form a cycle that state elimination writes out) are refused
        (with `strict=False`: dropped, `None`: the caller writes the node without it)."""
        try:
            dfa = intersect_dfas(
                regex_byte_dfa(regex),
                multiple_of_dfa(step, integer=integer),
                max_states=MAX_STRING_STATES,
            )
            return self.marker(dfa_regex(minimize(dfa), max_chars=MAX_MULTIPLE_REGEX))
        except ConstraintError:
            return NEVER
        except ValueError as e:
            self.refuse(
                "multipleOf",
                path,
                f"{step!r}: the remainders modulo the step need a longer regex than "
                f"{MAX_MULTIPLE_REGEX:,} characters ({e})",
            )
            return None

    def _integer(self, node: dict, path: str):
        _, step = self.multiple_of(node, path, integer=True)
        lo, hi = self.integer_bounds(node, path)
        if lo is None and hi is None and step is None:
            return {"type": "integer"}
        try:
            regex = integer_range_regex(lo, hi) if (lo, hi) != (None, None) else None
        except ValueError as e:
            raise UnsupportedSchemaError("minimum", path, str(e)) from None
        if step is not None:
            multiples = self.multiple_terminal(regex or INTEGER, step, True, path)
            if multiples is not None:
                return multiples
        return {"type": "integer"} if regex is None else self.marker(regex)

    def _number(self, node: dict, path: str):
        places, step = self.multiple_of(node, path)
        if step is not None:
            lo, lo_excl, hi, hi_excl = self.number_bounds(node, path)
            try:
                regex = number_range_regex(lo, hi, lo_exclusive=lo_excl, hi_exclusive=hi_excl)
            except ValueError as e:
                keyword = "minimum" if "lower" in str(e) or hi is None else "maximum"
                raise UnsupportedSchemaError(keyword, path, str(e)) from None
            multiples = self.multiple_terminal(regex, step, False, path)
            if multiples is not None:
                return multiples
        if not {k for k in node if k != "multipleOf"} and places is None:
            return {"type": "number"}
        lo, lo_excl, hi, hi_excl = self.number_bounds(node, path)
        try:
            return self.marker(
                number_range_regex(
                    lo, hi, lo_exclusive=lo_excl, hi_exclusive=hi_excl, places=places
                )
            )
        except ValueError as e:
            keyword = "minimum" if "lower" in str(e) or hi is None else "maximum"
            raise UnsupportedSchemaError(keyword, path, str(e)) from None

    def integer_bounds(self, node: dict, path: str):
        """`(lo, hi)`: the smallest and largest integers the node's bounds allow (`None`: open)."""
        lo, lo_excl, hi, hi_excl = self.number_bounds(node, path)
        if lo is not None:
            lo = math.floor(lo) + 1 if lo_excl else math.ceil(lo)
        if hi is not None:
            hi = math.ceil(hi) - 1 if hi_excl else math.floor(hi)
        if lo is not None and hi is not None and hi < lo:
            raise UnsupportedSchemaError(
                "maximum", path, f"no integer lies between the bounds of {node}"
            )
        return lo, hi

    def number_bounds(self, node: dict, path: str):
        @typing.no_type_check
        def number(key):
            value = node.get(key)
            if value is None or isinstance(value, bool):
                return value
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UnsupportedSchemaError(key, path, f"must be a finite number, got {value!r}")
            return value

        lo, hi = number("minimum"), number("maximum")
        lo_excl = hi_excl = False
        emin, emax = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
        if isinstance(emin, bool):  # draft 4: a flag on `minimum`
            lo_excl = emin and lo is not None
        elif emin is not None:
            emin = number("exclusiveMinimum")
            if lo is None or emin >= lo:
                lo, lo_excl = emin, True
        if isinstance(emax, bool):
            hi_excl = emax and hi is not None
        elif emax is not None:
            emax = number("exclusiveMaximum")
            if hi is None or emax <= hi:
                hi, hi_excl = emax, True
        return lo, lo_excl, hi, hi_excl

    def _string(self, node: dict, path: str):
        if NOT_STRINGS in node:
            node = dict(node)
            excluded = node.pop(NOT_STRINGS)
            return self.excluding(self._string(node, path), excluded, path)
        fmt, pattern = node.get("format"), node.get("pattern")
        lengths = {k: node[k] for k in ("minLength", "maxLength") if k in node}
        for k, v in lengths.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UnsupportedSchemaError(k, path, f"must be a non-negative integer, got {v!r}")
        if (
            "minLength" in lengths
            and "maxLength" in lengths
            and lengths["maxLength"] < lengths["minLength"]
        ):
            return NEVER
        if fmt is not None and fmt not in FORMATS:
            if fmt in SPEC_FORMATS:
                self.refuse(
                    "format", path, f"format {fmt!r} is not supported; supported: {sorted(FORMATS)}"
                )
            fmt = None  # not a JSON Schema format: an annotation
        if fmt is not None and pattern is not None:
            terminal = self.format_and_pattern(fmt, pattern, lengths, path)
            if terminal is not None:
                return terminal
            pattern = None  # refused with strict=False: the format is kept
        if fmt is not None:
            if lengths:
                bounded = bounded_length(
                    FORMATS[fmt], lengths.get("minLength", 0), lengths.get("maxLength")
                )
                if bounded is None:  # the format's automaton times a character counter
                    terminal = self.bounded_string(FORMATS[fmt], lengths, path, next(iter(lengths)))
                    if terminal is not None:
                        return terminal
                    bounded = FORMATS[fmt]  # refused with strict=False: the format is kept
                return self.marker('"' + bounded + '"')
            return self.marker('"' + FORMATS[fmt] + '"')
        if pattern is not None:
            try:
                body = json_string_pattern(
                    pattern,
                    min_length=lengths.get("minLength", 0),
                    max_length=lengths.get("maxLength"),
                )
            except NoStringError:  # no value here: left out where the schema allows it
                return NEVER
            except LengthBoundError:  # the pattern's automaton times a character counter
                try:
                    body = json_string_pattern(pattern)
                except ValueError as e:
                    self.refuse("pattern", path, str(e))
                    return {"type": "string", **lengths}
                terminal = self.bounded_string(body, lengths, path)
                return {"type": "string", **lengths} if terminal is None else terminal
            except ValueError as e:
                self.refuse("pattern", path, str(e))
                return {"type": "string", **lengths}
            return self.marker('"' + body + '"')
        if self.counted_strings and max(lengths.values(), default=0) > COUNTED_STRING_MIN:
            keyword = "maxLength" if "maxLength" in lengths else "minLength"
            states = PLAIN_STRING_STATES * max(lengths.values())
            if states > MAX_STRING_STATES:  # refused before building it
                self.refuse(
                    keyword,
                    path,
                    f"a string of {lengths} needs an automaton of about {states:,} states (the "
                    f"limit is {MAX_STRING_STATES:,})",
                )
                return {"type": "string"}
            terminal = self.bounded_string(ANY_STRING, lengths, path, keyword)
            return {"type": "string"} if terminal is None else terminal  # None: bounds dropped
        if self.counted_strings and max(lengths.values(), default=0) >= SHARED_COUNT_MIN:
            # one marker per distinct bounds, so that the grammar form may call one rule for
            # every such string instead of a copy of its counter per use (MaskBench o61653:
            # 40 strings of maxLength 256 in one object, 98,812 states spliced, 28 s)
            regex = self.regex_of({"type": "string", **lengths})
            marker = self.marker(regex)
            self.repeat_weight[marker["const"]] = (max(lengths.values()) - 1) * len(ANY_STRING)
            return marker
        return {"type": "string", **lengths}

    def markers(self, regex: str) -> set[str]:
        """The markers `regex` holds, directly or inside the regexes of those it holds."""
        found = re.compile(f'"(FGSUB[0-9]+X{self.tag})"')
        seen: set[str] = set()
        todo = [regex]
        while todo:
            for match in found.finditer(todo.pop()):
                if match.group(1) not in seen:
                    seen.add(match.group(1))
                    todo.append(self.substitutions[match.group(1)])
        return seen

    def weight(self, regex: str) -> int:
        """The length of `regex` with its markers expanded and the counted repeats of plain
        strings written out (`repeat_weight`): a measure of its automaton's size that, unlike
        its length, sees a `{1,256}` (recursive rules count nothing)."""
        return self._expanded_size(regex, weighted=True)

    def _expanded_size(self, regex: str, weighted: bool = False) -> int:
        """The length of `regex` with every marker expanded (each distinct marker measured
        once), without building it; `weighted`: plus `repeat_weight` per expanded marker, and
        recursive markers count nothing instead of raising `RecursionRefused` (a recursive
        rule has no single regex)."""
        found = re.compile(f'"(FGSUB[0-9]+X{self.tag})"')
        sizes: dict[str, int] = {}
        calls = set(self.recursive.values())

        @typing.no_type_check
        def size(text: str) -> int:
            total = len(text)
            for match in found.finditer(text):
                name = match.group(1)
                if name in calls and not weighted:
                    raise RecursionRefused("a recursive rule has no single regex")
                if name not in sizes:
                    sizes[name] = 0  # a recursion reached again counts nothing more
                    if name not in calls:
                        sizes[name] = 4 + size(self.substitutions[name])
                        if weighted:
                            sizes[name] += self.repeat_weight.get(name, 0)
                            item, copies = self.item_repeats.get(name, (None, 0))
                            sizes[name] += copies * sizes.get(item, 0)
                total += sizes[name] - len(match.group(0))
            return total

        return size(regex)

    def format_and_pattern(self, fmt: str, pattern: str, lengths: dict, path: str):
        """A string in format `fmt` that `pattern` matches (and within `lengths`): the
        intersection of the two body automata (`patterns.intersect_dfas`), then the character
        counter of `length_bounded_dfa` if there are lengths, as a string automaton (see
        `bounded_string`). `NEVER` when no string is both; `None` when it cannot be built and
        `strict=False` dropped `pattern` (with `strict=True`, `UnsupportedSchemaError`)."""
        try:
            body = intersect_dfas(
                regex_byte_dfa(FORMATS[fmt]),
                regex_byte_dfa(json_string_pattern(pattern)),
                max_states=MAX_STRING_STATES,
            )
        except ConstraintError:  # no string is in the format and matches the pattern
            return NEVER
        except ValueError as e:
            self.refuse("pattern", path, f"together with `format` {fmt!r}: {e}")
            return None
        if lengths:
            return self.bounded_string(body, lengths, path, next(iter(lengths)))
        return self.dfa_terminal(body, f"{fmt}\0{pattern}", path, "pattern")

    def dfa_terminal(
        self, body: ByteDFA, source: str, path: str, keyword: str, *, quoted: bool = False
    ) -> dict:
        """A marker for the string whose body automaton is `body` (`quoted`: the automaton of
        the whole string, quotes included; `source` names it for the placeholder's digest):
        spliced by `json_schema_compile`, a rule of the grammar form."""
        digest = hashlib.sha1(source.encode()).hexdigest()[:24]
        placeholder = f"{_DFA_TERMINAL}{digest}"
        marker = self.marker(placeholder)
        self.dfa_terminals[marker["const"]] = (placeholder, path, keyword)
        if placeholder not in self.dfa_texts:  # the same automaton: quoted once (o39210:
            # 398 strings of the same three lengths took 8.6 s)
            self.dfa_texts[placeholder] = body if quoted else _quoted(body)
        return marker

    def excluding(self, terminal, excluded: list[str], path: str):
        """The string `terminal` (what `_string` returned) without the values `excluded`: the
        difference of its automaton and that of every JSON spelling of them
        (`patterns.difference_dfas`), a string automaton (`dfa_terminal`). `NEVER` when no
        string is left; with `strict=False`, `terminal` itself when it cannot be built."""
        if terminal is NEVER:
            return NEVER
        if terminal == {"type": "string"}:  # any string: a regex does it
            return self.marker(other_strings_regex(excluded))
        regex = self.substitute(self.regex_of(terminal))
        inner = regex  # a string automaton's placeholder, in the groups of marker and const
        while inner not in self.dfa_texts and inner.startswith("(?:") and inner.endswith(")"):
            inner = inner[3:-1]
        strings = self.dfa_texts.get(inner)
        source = f"not\0{regex}\0{json.dumps(excluded)}"
        try:
            strings = strings if strings is not None else regex_byte_dfa(regex)
            forbidden = regex_byte_dfa("|".join(map(json_spellings, excluded)))
            rest = difference_dfas(strings, forbidden, max_states=MAX_STRING_STATES)
        except ConstraintError:  # every string of `terminal` is excluded
            return NEVER
        except ValueError as e:
            self.refuse("not", path, f"the strings other than {excluded}: {e}")
            return terminal
        return self.dfa_terminal(rest, source, path, "not", quoted=True)

    def bounded_string(self, body, lengths: dict, path: str, keyword: str = "pattern"):
        """A string whose body matches the regex `body` and whose length lies within
        `lengths` (`minLength`/`maxLength`), when no regex writes that compactly: a marker whose
        regex is a placeholder and whose automaton is `length_bounded_dfa`'s, quoted
        (`dfa_terminals`; only the grammar form can call it, `_dfa_rule`). `NEVER` when no
        string has the lengths; `None` when the automaton would exceed `MAX_STRING_STATES`
        states and `strict=False` dropped the bounds (with `strict=True`,
        `UnsupportedSchemaError` naming `keyword` and the sizes)."""
        lo, hi = lengths.get("minLength", 0), lengths.get("maxLength")
        try:
            dfa = length_bounded_dfa(body, lo, hi, max_states=MAX_STRING_STATES)
        except ConstraintError:  # no string of these lengths matches
            return NEVER
        except ValueError as e:
            self.refuse(keyword, path, str(e))
            return None
        if isinstance(body, ByteDFA):  # named by its states, as equal automata are equal
            body = hashlib.sha1(body.delta.tobytes() + body.accepting.tobytes()).hexdigest()
        return self.dfa_terminal(dfa, f"{body}\0{lo}\0{hi}", path, keyword)

    def _array(self, node: dict, path: str):
        out = {"type": "array"}
        for k in ("minItems", "maxItems"):
            if k in node:
                v = node[k]
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise UnsupportedSchemaError(
                        k, path, f"must be a non-negative integer, got {v!r}"
                    )
                out[k] = v
        if node.get("uniqueItems") and out.get("maxItems", 2) > 1:
            self.refuse(
                "uniqueItems",
                path,
                "unique items cannot be enforced by a regular constraint (set maxItems: 1 or drop it)",
            )
        items = node.get("items")
        prefix = node.get("prefixItems")
        if isinstance(items, list):  # draft 4-2019 tuple form
            prefix, items = items, node.get("additionalItems")
        if prefix is not None:
            rewritten = []
            for i, schema in enumerate(prefix):
                r = self.node(schema, f"{path}/prefixItems/{i}")
                if r is NEVER:  # the array stops before this position
                    out["maxItems"] = min(out.get("maxItems", i), i)
                    items = False
                    break
                rewritten.append(r)
            if rewritten:
                out["prefixItems"] = rewritten
        if items is None and prefix is None:
            items = True  # any items: our bounded free-form value, not outlines-core's generic one
        if items is not None:
            r = self.node(items, f"{path}/items")
            if r is NEVER:  # no item beyond the prefix
                out["maxItems"] = min(
                    out.get("maxItems", len(out.get("prefixItems", []))),
                    len(out.get("prefixItems", [])),
                )
                if "prefixItems" in out:
                    out["items"] = False
            else:
                out["items"] = r
        if out.get("minItems", 0) > out.get("maxItems", out.get("minItems", 0)):
            return NEVER
        if out.get("maxItems") == 0:
            out.pop("items", None)
            out.pop("prefixItems", None)
        if "contains" in node:
            return self.contains(node, out, path)
        return self.counted_items(out)

    def counted_items(self, out: dict):
        """An array `out` whose item count (`minItems` or `maxItems`) reaches
        `COUNTED_ITEMS_MIN`: a marker for it, its items a marker too, and `item_repeats`
        records the copies of the item that the counted repeat writes out (outlines-core's
        `(,item){0,999}`), so that the size measures see them (`weight`: such a schema goes to
        the grammar form first) and the grammar form makes the item a rule, called from each
        copy (`_plan_rules`). Without it, `"maxItems": 1000` of an object made a single-regex
        automaton of 1,000 object copies that took minutes (MaskBench o9943, o12622). Other
        arrays are returned as they are."""
        count = max(out.get("minItems", 0), out.get("maxItems") or 0)
        item = out.get("items")
        if count < COUNTED_ITEMS_MIN or not isinstance(item, Mapping):
            return out
        if set(item) != {"const"} or item["const"] not in self.substitutions:
            item = out["items"] = self.marker(self.regex_of(item))
        array = self.marker(self.regex_of(out))
        self.item_repeats[array["const"]] = (item["const"], count - 1)
        return array

    def contains(self, node: dict, out: dict, path: str):
        """An array (`out`, rewritten: `items`, no bounds or prefix) of which at least
        `minContains` (default 1) items also match `contains`: our own regex, every item the
        `items` regex and `minContains` of them the regex of `items` AND `contains`, in any
        places. `NEVER` when no item can match both. Bounds on the item count, `prefixItems`
        and `maxContains` beside it are refused."""
        count = node.get("minContains", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise UnsupportedSchemaError(
                "minContains", path, f"must be a non-negative integer, got {count!r}"
            )
        if count == 0:
            return out
        if {"minItems", "maxItems", "prefixItems"} & out.keys() or count > MAX_CONTAINS:
            self.refuse(
                "contains",
                path,
                f"together with item counts or `prefixItems`, or minContains over {MAX_CONTAINS}",
            )
            return out
        items = node.get("items", True)
        both = self.node(self.merge({} if items is True else items, node["contains"], path), path)
        if both is NEVER:
            return NEVER
        item = self.regex_of(out.get("items", self.any_value()))
        match, sep = self.regex_of(both), f"{self.ws},{self.ws}"
        repeat = f"(?:{sep}(?:{item}{sep})*{match}){{{count - 1}}}" if count > 1 else ""
        return self.marker(
            rf"\[{self.ws}(?:{item}{sep})*{match}{repeat}(?:{sep}{item})*{self.ws}\]"
        )

    def _object(self, node: dict, path: str):
        """An object as a marker of our own regex: the listed properties in schema order (the
        optional ones may be left out), then any additional properties: keys matching a
        `patternProperties` pattern with its schema's value, or (when `additionalProperties`
        is not `false` and there is no `patternProperties`) any other key with the
        `additionalProperties` schema (any value by default), bounded by min/maxProperties."""
        properties = node.get("properties", {})
        required = list(dict.fromkeys(node.get("required", [])))
        additional = node.get("additionalProperties", True)
        patterns = node.get("patternProperties", {})
        names_schema = node.get("propertyNames")
        min_count = node.get("minProperties", 0)
        max_count = node.get("maxProperties")
        named = dict(properties)
        closed = additional is False or additional is NEVER or self.closed_objects
        for (
            name
        ) in required:  # required without a listed schema: what an additional property may be
            if name not in named:
                if any(re.search(p, name) for p in patterns):
                    named[name] = {}  # the pattern's schema is merged below
                else:
                    named[name] = (
                        False if closed else additional if isinstance(additional, Mapping) else {}
                    )
        if names_schema is not None:
            names_schema = self.node(names_schema, f"{path}/propertyNames")
            check = name_checker(names_schema, self.substitute)
            if check is None:
                self.refuse(
                    "propertyNames",
                    f"{path}/propertyNames",
                    "the listed property names cannot be checked against it",
                )
                check = lambda name: True  # noqa: E731 (dropped: every listed name kept)
            for name in list(named):
                if not check(name):
                    if name in required:
                        return NEVER
                    del named[name]
        # a listed property whose name a pattern matches must satisfy both schemas
        for pattern, schema in patterns.items():
            try:
                compiled = re.compile(pattern)
            except re.error as e:
                raise UnsupportedSchemaError(
                    "patternProperties", path, f"pattern {pattern!r} is not a valid regex: {e}"
                ) from None
            for name in named:
                if compiled.search(name):
                    named[name] = {"allOf": [named[name], schema]}
        items, item_names = [], []
        for name, schema in named.items():
            r = self.node(schema, f"{path}/properties/{name}")
            if r is NEVER:
                if name in required:
                    return NEVER
                continue
            key = literal_key(name)
            items.append((f"{key}{self.ws}:{self.ws}{self.regex_of(r)}", name in required))
            item_names.append(name)
        extras = []
        if patterns:
            bodies = []  # every pattern's key body: the keys left to additionalProperties
            for pattern, schema in patterns.items():
                r = self.node(schema, f"{path}/patternProperties/{pattern}")
                try:
                    body = json_string_pattern(pattern)
                except ValueError as e:
                    self.refuse("patternProperties", path, str(e))
                    bodies = None  # keys of unknown extent: no complement
                    continue
                if bodies is not None:
                    bodies.append(body)
                if r is NEVER:
                    continue
                key = '"' + body + '"'
                if any(re.fullmatch(key, literal_key(n)) for n in named):
                    # the pattern's keys but the listed ones (printable ASCII keys only)
                    try:
                        body = unmatched_keys((), tuple(named), within=body)
                    except KeysTooComplex as e:
                        self.refuse(
                            "patternProperties",
                            path,
                            f"pattern {pattern!r} also matches a listed property, and its other "
                            f"keys are too complex to write ({e})",
                        )
                        continue
                    if body is None:  # only listed names match it
                        continue
                    key = f'"{body}"'
                extras.append((key, r, schema))
            if len(
                {json.dumps(s, sort_keys=True, default=str) for _, _, s in extras}
            ) > 1 and overlap([k for k, _, _ in extras]):
                self.refuse(
                    "patternProperties",
                    path,
                    "keys may match several patterns with different schemas",
                )
            extras = [f"{k}{self.ws}:{self.ws}{self.regex_of(r)}" for k, r, _ in extras]
            other = NEVER
            if not closed:
                other = (
                    self.any_value()
                    if additional is True
                    else self.node(additional, f"{path}/additionalProperties")
                )
            if other is not NEVER and names_schema is not None:
                self.refuse(
                    "propertyNames",
                    path,
                    "together with `patternProperties` and open additional properties; "
                    "only the listed properties and the pattern keys are generated",
                )
            elif other is not NEVER and bodies is not None:
                try:
                    body = unmatched_keys(tuple(bodies), tuple(named))
                except KeysTooComplex as e:
                    self.refuse(
                        "additionalProperties",
                        path,
                        "the keys that no `patternProperties` pattern matches are too complex "
                        f"to write ({e}); only the listed properties and the pattern keys are "
                        "generated",
                    )
                    body = None
                if body is not None:
                    extras.append(f'"{body}"{self.ws}:{self.ws}{self.regex_of(other)}')
        elif not closed:
            other = (
                self.any_value()
                if additional is True
                else self.node(additional, f"{path}/additionalProperties")
            )
            if other is not NEVER:
                if names_schema is not None:
                    key = self.regex_of(names_schema)
                    if named:
                        self.refuse(
                            "propertyNames",
                            path,
                            "together with listed properties and open additional "
                            "properties; only the listed properties are generated",
                        )
                        key = None
                else:
                    key = '"' + key_not_in(list(named)) + '"'
                if key is not None:
                    extras.append(f"{key}{self.ws}:{self.ws}{self.regex_of(other)}")
        for k, v in (("minProperties", min_count), ("maxProperties", max_count)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise UnsupportedSchemaError(k, path, f"must be a non-negative integer, got {v!r}")
        try:
            regex = _object_regex(
                items,
                "|".join(extras) if extras else None,
                self.ws,
                min_count,
                max_count,
                any_order=self.any_order(items),
                second_order=self.second_order(items, item_names, required),
            )
        except TooLarge as e:
            raise UnsupportedSchemaError(
                "properties",
                path,
                f"{len(items)} properties ({sum(not r for _, r in items)} optional) make a "
                f"regex of over {e.args[0]:,} characters, too large to compile in reasonable time; make more "
                "of them required or bound fewer of them with minProperties/maxProperties",
            ) from None
        if regex is None:
            return NEVER
        return self.marker(regex)

    def second_order(self, items, names: list[str], required: list[str]) -> list[int] | None:
        """With `property_order="schema_or_required_first"`: the indices of an object's listed
        members (`items`, their `names`, in schema order) with the required ones first, in the
        order of `required`, then the others in schema order; `None` when that is the schema
        order, or when the members' regexes, expanded, exceed `SECOND_ORDER_BUDGET`
        characters (the object is then in schema order only)."""
        if self.property_order != "schema_or_required_first":
            return None
        index = {n: i for i, n in enumerate(names)}
        first = [index[n] for n in required if n in index]
        order = first + [i for i in range(len(names)) if i not in set(first)]
        if order == list(range(len(names))):
            return None
        try:
            size = sum(len(self.substitute(r, limit=SECOND_ORDER_BUDGET)) for r, _ in items)
        except RegexTooLarge:
            return None
        return order if size <= SECOND_ORDER_BUDGET else None

    def any_order(self, items) -> bool:
        """Whether an object's listed members (`items`) may come in any order: with
        `property_order="any"`, 2 to `ANY_ORDER_MAX` members whose regexes, expanded and
        copied once per set of the others (`_members_any_order`), stay within
        `ANY_ORDER_BUDGET` characters."""
        if self.property_order != "any" or not 2 <= len(items) <= ANY_ORDER_MAX:
            return False
        try:
            size = sum(len(self.substitute(r, limit=ANY_ORDER_BUDGET)) for r, _ in items)
        except RegexTooLarge:
            return False
        return size << (len(items) - 1) <= ANY_ORDER_BUDGET

    def _boolean(self, node: dict, path: str):
        return {"type": "boolean"}

    def _null(self, node: dict, path: str):
        return {"type": "null"}

    BY_TYPE: typing.ClassVar[dict] = {
        "integer": _integer,
        "number": _number,
        "string": _string,
        "array": _array,
        "object": _object,
        "boolean": _boolean,
        "null": _null,
    }
    """The rewrite of a node of each JSON type (`typed`): `(rewriter, keywords, path) -> node`."""

    def enumeration(self, node: dict, path: str):
        values = [node["const"]] if "const" in node else node["enum"]
        if not isinstance(values, list):
            raise UnsupportedSchemaError("enum", path, "must be a list")
        if "enum" in node and "const" in node:
            listed = {_canonical(v) for v in node["enum"]}
            values = [v for v in values if _canonical(v) in listed]
        types = node.get("type")
        if types is not None:
            allowed = set([types] if isinstance(types, str) else types)
            if "number" in allowed:
                allowed.add("integer")
            values = [v for v in values if _json_type(v) in allowed]
        excluded = node.get(NOT_STRINGS, ())
        values = [v for v in values if not (isinstance(v, str) and v in excluded)]
        if {k for k in node if asserts(k)} - {"enum", "const", "type", NOT_STRINGS}:
            values = self.values_valid_under(node, values, path)
        if not values:  # an empty enum, or no value of the type / in both: nothing matches
            return NEVER
        if any(_own_constant(v) for v in values):
            # outlines-core writes object keys of constants unescaped (`"$a.b"`: `$` an anchor,
            # `.` any character) and numbers in one spelling, so those constants are written here
            return self.marker("|".join(f"(?:{self.constant_regex(v, path)})" for v in values))
        return {"enum": values} if len(values) > 1 else {"const": values[0]}

    def values_valid_under(self, node: dict, values: list, path: str) -> list:
        """The listed `values` that the other keywords beside `enum`/`const` accept (`minLength`,
        `pattern`, `minimum`, `not`, ...), each judged by `jsonschema` with the root's draft
        and format checker: a list needs no automaton of those keywords. `values` unchanged,
        with `refuse("enum")`, when `jsonschema` cannot judge them."""
        # deferred on purpose: jsonschema loads only to check a schema
        import jsonschema

        cls = jsonschema.validators.validator_for(
            self.root, default=jsonschema.Draft202012Validator
        )
        schema = {k: v for k, v in node.items() if k != NOT_STRINGS}
        try:
            check = cls(schema, format_checker=cls.FORMAT_CHECKER)
            return [v for v in values if check.is_valid(v)]
        except Exception as e:  # e.g. an unresolvable `$ref` inside
            self.refuse("enum", path, f"the listed values cannot be judged by jsonschema: {e}")
            return values

    def constant_regex(self, value, path: str = "") -> str:
        """The regex of the JSON text of one constant value, `self.ws` between its tokens; keys
        in the value's order, numbers by `number_regex`, other scalars as outlines-core
        writes them."""
        ws = self.ws
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return number_regex(value, path)
        if isinstance(value, Mapping):
            members = [
                f"{literal_key(k)}{ws}:{ws}{self.constant_regex(v, path)}" for k, v in value.items()
            ]
            return rf"\{{{ws}" + f"{ws},{ws}".join(members) + (rf"{ws}\}}" if members else r"\}")
        if isinstance(value, list):
            items = [self.constant_regex(v, path) for v in value]
            return rf"\[{ws}" + f"{ws},{ws}".join(items) + (rf"{ws}\]" if items else r"\]")
        return self.regex_of({"const": value})

    # ------------------------------------------------------------------ combinators

    def deref(self, node, path: str):
        """`node` itself (references are inlined before the rewrite, `inline_references`), or
        for a recursive placeholder its target's subtree."""
        if isinstance(node, Mapping) and RECURSIVE in node:
            return self.expansions[node[RECURSIVE]]
        return node

    def into_branches(self, node: dict, part, path: str, part_first: bool = False) -> dict | None:
        """`node` AND `part` for an `allOf` whose earlier parts gave `node` an `anyOf` or
        `oneOf` and whose later `part` lists properties: `part` merged into each branch, so that
        a branch's properties come before `part`'s, in the order of the parts, as llguidance
        distributes them (MaskBench Github_trivial o64859: `allOf: [{oneOf: [..]}, {properties:
        {builder, id, target}}]`, whose documents list a branch's members first); with
        `part_first` (the node's `allOf` came before its `anyOf`/`oneOf` in the text), `part`'s
        before the branch's. The same schema as merging `part` into `node` (`(B1 | B2) & P =
        (B1 & P) | (B2 & P)`). `None` where that does not apply (no single such combinator,
        `part` lists no properties or has the same combinator, a recursive reference, a branch
        without a common type)."""
        keys = [k for k in ("anyOf", "oneOf") if k in node]
        if (
            len(keys) != 1
            or not isinstance(part, Mapping)
            or keys[0] in part
            or not any(k in part for k in _OBJECT_MEMBERS)
            or RECURSIVE in part
            or not isinstance(node[keys[0]], list)
            or not all(isinstance(b, Mapping) and RECURSIVE not in b for b in node[keys[0]])
        ):
            return None
        try:
            if part_first:
                branches = [self.merge(part, b, path) for b in node[keys[0]]]
            else:
                # the node's own members before `part`'s where they come after its branches'
                # (`applicator_first`): llguidance read the node whole before `part`
                own = (
                    {k: node[k] for k in _OBJECT_MEMBERS if k in node}
                    if applicator_first(node, keys[0])
                    else {}
                )
                branches = [
                    self.merge(self.merge(b, own, path) if own else b, part, path)
                    for b in node[keys[0]]
                ]
                node = {k: v for k, v in node.items() if k not in own}
        except NoCommonType:
            return None
        return {**node, keys[0]: branches}

    def merge(self, a, b, path: str) -> dict:
        """The schema of `a` AND `b` (for `allOf` and sibling keywords)."""
        if any(isinstance(x, Mapping) and RECURSIVE in x for x in (a, b)):
            # a recursive target merged with other keywords: its subtree, one level inlined
            # (its own references still call the target's rule); a recursion through such
            # merges would unroll forever, so their number is bounded
            a, b = self.deref(a, path), self.deref(b, path)
            if a != {} and b is not True and b != {}:
                self.recursive_merges += 1
            if self.recursive_merges > MAX_RECURSIVE_MERGES:
                raise RecursionRefused(
                    f"a recursive reference merged with other keywords at {path}"
                )
        if b is True or b == {}:
            return dict(a)
        if not isinstance(b, Mapping):
            raise UnsupportedSchemaError("allOf", path, f"cannot combine with {b!r}")
        out = dict(a)
        for key, value in b.items():
            if not asserts(key):  # an annotation: the first one is kept, nothing to combine
                out.setdefault(key, value)
            elif key not in out:
                out[key] = value
            elif key == "required":
                out[key] = list(dict.fromkeys([*out[key], *value]))
            elif key == NOT_STRINGS:
                out[key] = sorted({*out[key], *value})
            elif (
                key in ("items", "propertyNames")
                and isinstance(out[key], (Mapping, bool))
                and isinstance(value, (Mapping, bool))
                and "prefixItems" not in a
                and "prefixItems" not in b
            ):
                # every item (name) matches both schemas: their `allOf` (with `prefixItems` on
                # a side, `items` would start at different indices)
                out[key] = {"allOf": [out[key], value]}
            elif key in ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"):
                out[key] = max(out[key], value)
            elif key in ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"):
                out[key] = min(out[key], value)
            elif key == "type":
                left = set([out[key]] if isinstance(out[key], str) else out[key])
                right = set([value] if isinstance(value, str) else value)
                if "number" in left and "integer" in right:
                    left.add("integer")
                if "number" in right and "integer" in left:
                    right.add("integer")
                both = sorted(left & right)
                if not both:
                    raise NoCommonType(
                        "allOf", path, f"types {out[key]!r} and {value!r} have no value in common"
                    )
                out[key] = both[0] if len(both) == 1 else both
            elif key == "allOf":
                out[key] = [*out[key], *value]
            elif (
                key == "anyOf"
                and isinstance(out[key], list)
                and isinstance(value, list)
                and len(out[key]) * len(value) <= MAX_CONDITIONAL_BRANCHES
            ):
                # (x1 | x2) & (y1 | y2) = (x1 & y1) | (x1 & y2) | ...: e.g. a discriminated
                # union (`_conditionals_as_branches`) beside an `anyOf` of the schema's own
                out[key] = [{"allOf": [x, y]} for x in out[key] for y in value]
            elif key == "enum" and isinstance(out[key], list) and isinstance(value, list):
                right = {_canonical(v) for v in value}
                out[key] = [v for v in out[key] if _canonical(v) in right]  # [] matches nothing
            elif key == "const" and _canonical(out[key]) != _canonical(value):
                out["enum"] = []  # two different constants: no value
            elif key in _OBJECT_MEMBERS:
                continue  # below, from both sides at once
            elif out[key] != value:
                raise UnsupportedSchemaError(
                    key,
                    path,
                    f"cannot combine two different `{key}` ({out[key]!r} and {value!r}) in allOf",
                )
        if any(k in a for k in _OBJECT_MEMBERS) and any(k in b for k in _OBJECT_MEMBERS):
            out.update(_merge_members(a, b, path))
        return out

    def exclusive_branches(self, node: dict, branches: list, path: str) -> list:
        """`oneOf`'s branches with what two of them always share taken out, exactly:

        - all branches finite (`enum`/`const`): one `enum` of the listed values exactly one
          branch accepts (each judged by `jsonschema`);
        - a JSON type that two or more branches accept whole (no keyword of theirs constrains
          it, e.g. the strings under two object-only branches without `type`): no value of it
          can match exactly one branch, so every branch is restricted to the other types.

        Other branches are returned unchanged (`check_disjoint` then decides). `node`: the
        keywords beside `oneOf` (merged into each branch by the caller)."""
        branches = [self.absorb_negation(b, path) for b in branches]
        merged = [
            self.merge(node, b, path) if isinstance(b, Mapping) else b
            for b in branches
            if b is not NEVER and b is not False
        ]
        if not merged or not all(isinstance(b, Mapping) for b in merged):
            return branches
        if all("const" in b or isinstance(b.get("enum"), list) for b in merged):
            values = self.exclusive_values(merged)
            return branches if values is None else [values]
        presence = self.exclusive_presence(branches)
        if presence is not None:
            return presence
        kinds = ("null", "boolean", "object", "array", "string", "integer", "fraction")
        type_keywords = {"type"}.union(*TYPE_KEYWORDS.values())
        free = []  # per branch: the kinds of value it accepts whole
        for b in merged:
            asserting = {k for k in b if asserts(k)}
            if not asserting <= type_keywords:  # e.g. `enum`, `anyOf`: nothing is known whole
                free.append(set())
                continue
            declared = b.get("type", sorted(JSON_TYPES))
            declared = {declared} if isinstance(declared, str) else set(declared)
            accepted = {k for k in kinds if k in declared}
            if "number" in declared:
                accepted |= {"integer", "fraction"}
            constrained = {t for t, keys in TYPE_KEYWORDS.items() if keys & asserting}
            if constrained & {"number", "integer"}:
                constrained |= {"integer", "fraction"}
            free.append(accepted - constrained)
        shared = {k for k in kinds if sum(k in f for f in free) >= 2}
        if not shared or ("integer" in shared and "fraction" not in shared):
            return branches  # nothing shared whole, or "numbers but not integers": no `type`
        kept = sorted(t for t in JSON_TYPES - {"number", "integer"} if t not in shared)
        if "integer" not in shared:
            kept.append("integer" if "fraction" in shared else "number")
        out = []
        for b in branches:
            if b is NEVER or b is False:
                continue
            try:
                out.append(self.merge(b if isinstance(b, Mapping) else {}, {"type": kept}, path))
            except UnsupportedSchemaError:  # none of its types is left: it matches nothing alone
                continue
        return out or [NEVER]

    def absorb_negation(self, branch, path: str):
        """`branch` with a `not` whose complement is one schema without `anyOf` (`_negation`:
        a type, a name that must be absent) merged in, so that its type and forbidden names are
        visible to the disjointness proof; `NEVER` when nothing is left."""
        if not isinstance(branch, Mapping) or "not" not in branch:
            return branch
        negated = _negation(branch["not"])
        if negated is False:
            return NEVER
        if not isinstance(negated, Mapping) or "anyOf" in negated:
            return branch
        try:
            return self.merge({k: v for k, v in branch.items() if k != "not"}, negated, path)
        except UnsupportedSchemaError:  # e.g. no type left in common
            return NEVER

    def exclusive_presence(self, branches: list) -> list | None:
        """Branches that only require properties (`{"required": [...]}`, the "exactly one of
        these fields" idiom): an object matches exactly branch `i` when it has `R_i` and, for
        every other branch `j`, lacks one of `R_j` (a property schema `false`). One `anyOf` of
        those choices (at most `MAX_PRESENCE_CHOICES`); `None` when the branches are not of
        this form (a non-object value matches all of them or none: objects only)."""
        sets = []
        for b in branches:
            if not isinstance(b, Mapping) or b.get("type", "object") != "object":
                return None
            required = b.get("required")
            if not {k for k in b if asserts(k)} <= {"required", "type"} or not (
                isinstance(required, list) and all(isinstance(n, str) for n in required)
            ):
                return None
            sets.append(list(dict.fromkeys(required)))
        if len(sets) < 2:
            return None
        choices = []
        for i, mine in enumerate(sets):
            others = [
                [n for n in theirs if n not in mine] for j, theirs in enumerate(sets) if j != i
            ]
            if any(not names for names in others):
                continue  # having `mine` means having another branch's names too
            for absent in itertools.product(*others):
                choices.append({"required": mine, "properties": dict.fromkeys(absent, False)})
                if len(choices) > MAX_PRESENCE_CHOICES:
                    return None
        return [{"type": "object", "anyOf": choices}] if choices else [NEVER]

    def exclusive_values(self, merged: list):
        """`{"enum": [...]}` of the values exactly one of the finite branches `merged` accepts
        (judged by `jsonschema` with the root's draft and format checker), or `None` when
        `jsonschema` cannot judge a branch."""
        # deferred on purpose: jsonschema loads only to check a schema
        import jsonschema

        cls = jsonschema.validators.validator_for(
            self.root, default=jsonschema.Draft202012Validator
        )
        candidates: dict = {}
        for b in merged:
            for v in [b["const"]] if "const" in b else b["enum"]:
                candidates.setdefault(_canonical(v), v)
        try:
            validators = [cls(b, format_checker=cls.FORMAT_CHECKER) for b in merged]
            return {
                "enum": [
                    v
                    for v in candidates.values()
                    if sum(bool(check.is_valid(v)) for check in validators) == 1
                ]
            }
        except Exception:  # e.g. a branch holding a cut recursion (`NEVER`)
            return None

    def check_disjoint(self, branches: list, path: str) -> None:
        """`oneOf` needs exactly one branch to match: accept it when no two branches can match
        the same value (different JSON types, different constants, or objects with a property
        both require whose values cannot be equal: different constants, different types, or
        such a property again one level down; or a required name the other cannot have)."""
        signatures = [self.signature(b, path) for b in branches]
        for i in range(len(branches)):
            for j in range(i + 1, len(branches)):
                if not self.disjoint(signatures[i], signatures[j]):
                    raise UnsupportedSchemaError(
                        "oneOf",
                        path,
                        f"branches {i} and {j} may both match one value, so `oneOf` cannot be enforced; "
                        "use `anyOf` or make them disjoint (different types or a const discriminator)",
                    )

    def signature(self, node, path: str, depth: int = 0):
        node = self.deref(node, path)
        if not isinstance(node, Mapping) or depth > 8:
            return None
        for combinator in ("anyOf", "oneOf"):  # a value of either matches one of its branches
            if isinstance(node.get(combinator), list):
                parts = [self.signature(b, path, depth + 1) for b in node[combinator]]
                if all(p is not None for p in parts):
                    return ("union", parts)
                # else the node's own keywords (its `type`, ...) still hold for its values: judge
                # by them alone, a superset (o76546: a string, or an object with an `anyOf` of
                # `required`)
        if "const" in node or "enum" in node:
            values = [node["const"]] if "const" in node else node["enum"]
            return ("values", [_canonical(v) for v in values], {_json_type(v) for v in values})
        t = node.get("type")
        if t is None:
            return None
        types = set([t] if isinstance(t, str) else t)
        if "number" in types:
            types.add("integer")
        discriminators, required, closed, values_of = {}, set(), None, {}
        if types == {"object"}:
            required = self.required_names(node, path)
            properties = node.get("properties", {})
            for name in required:
                values = _listed_value_keys(properties.get(name, {}))
                if values is not None:
                    discriminators[name] = values
                if isinstance(properties, Mapping) and name in properties:
                    values_of[name] = (properties[name], depth + 1)  # its signature, when needed
            if node.get("additionalProperties") is False and not node.get("patternProperties"):
                closed = set(node.get("properties", {}))  # the only names it may have
        forbidden = _forbidden_names(node)
        return ("types", types, discriminators, required, closed, forbidden, values_of, path)

    def required_names(self, node, path: str, depth: int = 0) -> set:
        """The names every object valid under `node` has: its `required`, and those of its
        `allOf` members (MaskBench Github_medium o6249: a `oneOf` of closed objects whose
        `required` sits in an `allOf`)."""
        names = set(node.get("required", [])) if isinstance(node.get("required"), list) else set()
        if isinstance(node.get("allOf"), list) and depth < 8:
            for member in node["allOf"]:
                member = self.deref(member, path)
                if isinstance(member, Mapping):
                    names |= self.required_names(member, path, depth + 1)
        return {n for n in names if isinstance(n, str)}

    def disjoint(self, a, b) -> bool:
        if a is None or b is None:
            return False
        if a[0] == "union":
            return all(self.disjoint(p, b) for p in a[1])
        if b[0] == "union":
            return all(self.disjoint(a, p) for p in b[1])
        if a[0] == "values" and b[0] == "values":
            return not set(a[1]) & set(b[1])
        if a[0] == "values" or b[0] == "values":
            values, typed = (a, b) if a[0] == "values" else (b, a)
            return not values[2] & typed[1]
        if not a[1] & b[1]:
            return True
        if a[1] == b[1] == {"object"}:
            return (
                any(name in b[2] and not a[2][name] & b[2][name] for name in a[2])
                or (b[4] is not None and bool(a[3] - b[4]))  # `a` requires what `b` cannot have
                or (a[4] is not None and bool(b[3] - a[4]))
                or bool(a[3] & b[5])  # ... or forbids
                or bool(b[3] & a[5])
                or any(  # a property both require, whose values cannot be equal (nested)
                    name in b[6]
                    and self.disjoint(
                        self.signature(a[6][name][0], a[7], a[6][name][1]),
                        self.signature(b[6][name][0], b[7], b[6][name][1]),
                    )
                    for name in a[6]
                )
            )
        return False


def json_schema_regex(
    schema,
    *,
    whitespace_pattern: str | None = None,
    max_recursion_depth: int = DEFAULT_MAX_RECURSION_DEPTH,
    strict: bool = True,
    closed_objects: bool = False,
    free_form_depth: int | _FreeValueCall | None = NESTED_FREE_FORM_DEPTH,
    property_order: str = "schema",
) -> str:
    """The regex of the JSON documents valid under `schema` (see the module docstring).

    **Arguments:** `schema`: a dict, a JSON string or a pydantic model class;
    `whitespace_pattern`: regex for the whitespace allowed between tokens (default `[ ]?`);
    `max_recursion_depth`: how many times a recursive `$ref` is unrolled; `strict`: refuse
    keywords that cannot be enforced (`False`: drop them, with one `UserWarning` listing them);
    `closed_objects`: allow no property beyond the listed ones (and `patternProperties`), as if
    every object had `"additionalProperties": false`; `free_form_depth`: how deep a free-form
    value may nest (see `NESTED_FREE_FORM_DEPTH`); `property_order`: `"schema"` (default),
    `"schema_or_required_first"` (or the required properties first) or `"any"` (the listed
    properties of small objects in any order); see `PROPERTY_ORDERS`.

    **Raises:** `InvalidSchemaError` for a schema its metaschema rejects;
    `UnsupportedSchemaError` naming the keyword and its location for what a regular constraint
    cannot enforce (with `strict=True`), and for a string whose length bounds need an
    automaton that no compact regex writes (`pattern` with `maxLength` where the pattern has
    several variable parts: `json_schema_compile` compiles those); `ValueError` /
    `TypeError` for a schema that is not a schema.

    Source: outlines-core's `build_regex_from_schema` plus the rewrites above.
    """
    rewriter, regex = _rewrite(
        schema,
        whitespace_pattern=whitespace_pattern,
        max_recursion_depth=max_recursion_depth,
        strict=strict,
        closed_objects=closed_objects,
        free_form_depth=free_form_depth,
        property_order=property_order,
    )
    regex = rewriter.substitute(regex)
    _refuse_dfa_terminals(rewriter, regex)
    _warn_dropped(rewriter)
    return regex


_DFA_TERMINAL = "\x03FGDFA"
"""Starts the placeholder regex of a string given as an automaton (`_Rewriter.bounded_string`):
a control character no schema regex holds, then a digest of the string's regex and lengths."""


PROPERTY_ORDERS = ("schema", "schema_or_required_first", "any")
"""Values of `property_order`:

- `"schema"` (the default): always the order of `properties`, as llguidance, outlines and
  XGrammar generate.
- `"schema_or_required_first"`: that order, or the required properties first (in the order of
  `required`) and then the others in schema order, for objects whose members stay within
  `SECOND_ORDER_BUDGET`. Schemas often list `properties` alphabetically while `required`
  keeps the author's order, and documents follow either: of MaskBench's valid instances, the
  objects of two or more listed properties whose two orders differ follow the schema order
  6,745 times, required-first 147 times, neither 79 times (dev file, all splits). On the five
  splits (24 each): valid instances accepted 145 -> 148 of 157, automaton states +17%, so
  opt-in (the compile p50 target is 100 ms).
- `"any"`: small objects (`ANY_ORDER_MAX` listed properties or fewer, within
  `ANY_ORDER_BUDGET`) in any order; larger ones in schema order. Measured on the five splits
  (24 each, same process, order schema / any): compile p50 114 / 177 ms, total 111 / 159 s,
  automaton states +27%, valid instances accepted 143 / 144 of 157 (the rest list large
  objects out of order): opt-in."""


def _quoted(body: ByteDFA) -> ByteDFA:
    """The DFA of `"` + `body` + `"`: a JSON string from the DFA of its body, which reads a `"`
    only inside an escape (`\\"`), never where it may end."""
    quote = ord('"')
    if (body.delta[body.accepting, quote] != REJECT).any():
        raise RuntimeError("internal error: a string body DFA reads a raw quote where it may end")
    n = body.num_states
    delta = np.full((n + 2, body.delta.shape[1]), REJECT, np.int32)
    delta[1 : n + 1] = np.where(body.delta != REJECT, body.delta + 1, REJECT)
    delta[0, quote] = body.initial + 1
    delta[1 + np.flatnonzero(body.accepting), quote] = n + 1
    accepting = np.zeros(n + 2, bool)
    accepting[n + 1] = True
    return trim(ByteDFA(delta, accepting, 0))  # minimal when `body` is: no minimisation


def _dfa_placeholders(rewriter: "_Rewriter", regex: str) -> list[str]:
    """The placeholders of strings given as automata (`_Rewriter.dfa_texts`) in `regex`."""
    return [p for p in rewriter.dfa_texts if p in regex]


def _terminal_origin(rewriter: "_Rewriter", placeholder: str) -> tuple[str, str]:
    """The schema path and keyword of the string automaton behind `placeholder` (for errors)."""
    return next((path, kw) for p, path, kw in rewriter.dfa_terminals.values() if p == placeholder)


def _spliced_too_large(
    rewriter: "_Rewriter", regex: str, weight: int
) -> UnsupportedSchemaError | None:
    """The refusal `_spliced_dfa` would reach, known before the schema's DFA is built: each
    string automaton in `regex` is spliced in once at least, beside the rest of the schema's
    automaton, about `weight / WEIGHT_PER_STATE` states (`weight`: `_Rewriter.weight` of the
    schema's regex with its markers). MaskBench o74461, a 128-character `hostname` of 30,445
    states beside arrays of 100 counted strings: refused in 0.15 s instead of 10 s, after a
    192,318-state DFA. `None` when the estimate is within `MAX_SPLICED_STATES`."""
    placeholders = _dfa_placeholders(rewriter, regex)
    if not placeholders:
        return None
    sizes = {p: rewriter.dfa_texts[p].num_states for p in placeholders}
    estimate = weight // WEIGHT_PER_STATE + sum(sizes.values())
    if estimate <= MAX_SPLICED_STATES:
        return None
    largest = max(sizes, key=sizes.__getitem__)
    path, keyword = _terminal_origin(rewriter, largest)
    return UnsupportedSchemaError(
        keyword,
        path,
        f"its string automaton ({sizes[largest]:,} states) beside the rest of the schema's "
        f"automaton (about {weight // WEIGHT_PER_STATE:,} states, estimated from its regex) "
        f"would be over {MAX_SPLICED_STATES:,} states in all",
    )


def _spliced_dfa(rewriter: "_Rewriter", regex: str) -> ByteDFA:
    """The minimal byte DFA of a schema's whole `regex` whose strings given as automata
    (placeholders of `_Rewriter.dfa_texts`) are spliced in: each placeholder is compiled as a
    call (`_rule_call`, three control characters no JSON text holds), and each call edge
    `q -> r` becomes a copy of the string's quoted DFA entered by the `"` that `q` reads and
    leaving into `r` after the closing `"` (one copy per distinct `(string, r)`). The token
    automaton of the result is exact and needs no pushdown: a length-bounded string is a
    counter, a few thousand states that lift to the vocabulary's tokens in about a second
    (18,227 states, `format: email` with maxLength 1,024: 1.8 s, 82 token classes).

    **Raises:** `UnsupportedSchemaError` when a state that calls a string also reads `"`
    another way (an `anyOf` of it and another string: the splice would not be deterministic).
    """
    placeholders = _dfa_placeholders(rewriter, regex)
    text = regex
    for i, placeholder in enumerate(placeholders):
        text = text.replace(placeholder, _rule_call(i))
    dfa = minimize(regex_byte_dfa(text))
    delta, accepting = dfa.delta, dfa.accepting
    quote = ord('"')
    pieces, extra_accepting, offset = [], [], dfa.num_states
    copies: dict[tuple[int, int], int] = {}
    new_delta = delta.copy()
    for q in np.flatnonzero(delta[:, _RULE_CALL] != REJECT):
        first = delta[q, _RULE_CALL]
        new_delta[q, _RULE_CALL] = REJECT
        for high in np.flatnonzero(delta[first, 0x10:0x20] != REJECT):
            second = delta[first, 0x10 + high]
            for low in np.flatnonzero(delta[second, 0x10:0x20] != REJECT):
                i, r = 16 * int(high) + int(low), int(delta[second, 0x10 + low])
                if new_delta[q, quote] != REJECT:
                    path, keyword = _terminal_origin(rewriter, placeholders[i])
                    raise UnsupportedSchemaError(
                        keyword,
                        path,
                        "a length-bounded string automaton where another value may also "
                        'start with `"` (e.g. `anyOf` with another string) is not supported',
                    )
                if (i, r) not in copies:
                    string = rewriter.dfa_texts[placeholders[i]]
                    if offset + string.num_states > MAX_SPLICED_STATES:
                        path, keyword = _terminal_origin(rewriter, placeholders[i])
                        raise UnsupportedSchemaError(
                            keyword,
                            path,
                            f"its string automaton ({string.num_states:,} states) is needed at "
                            f"{len(copies) + 1} or more places of the schema's automaton (e.g. "
                            f"array items counted by maxItems): over {MAX_SPLICED_STATES:,} "
                            "states in all",
                        )
                    final = np.flatnonzero(string.accepting)
                    if final.size != 1 or (string.delta[final[0]] != REJECT).any():
                        raise RuntimeError("internal error: a quoted string DFA has no single end")
                    keep = np.flatnonzero(np.arange(string.num_states) != final[0])
                    number = np.full(string.num_states, REJECT, np.int64)
                    number[keep] = offset + np.arange(keep.size)
                    number[final[0]] = r
                    rows = string.delta[keep]
                    pieces.append(relabel_states(rows, number))
                    extra_accepting.append(np.zeros(keep.size, bool))
                    copies[i, r] = int(number[string.delta[string.initial, quote]])
                    offset += keep.size
                new_delta[q, quote] = copies[i, r]  # the opening quote enters the copy
    spliced = ByteDFA(
        np.concatenate([new_delta, *pieces]).astype(np.int32),
        np.concatenate([accepting, *extra_accepting]),
        dfa.initial,
    )
    # Not minimised: the pieces are, and Moore's refinement takes one round per counted
    # character (seconds for a counter of a thousand).
    return trim(spliced)


def _refuse_dfa_terminals(rewriter: "_Rewriter", regex: str) -> None:
    """`UnsupportedSchemaError` when `regex` (a whole schema's) holds a string given as an
    automaton: only the grammar form (`json_schema_compile`, `JsonSchema` with one schema)
    can call it."""
    for placeholder, path, keyword in rewriter.dfa_terminals.values():
        if placeholder in regex:
            raise UnsupportedSchemaError(
                keyword,
                path,
                f"this {'exclusion' if keyword == 'not' else 'length bound'} needs a string "
                "automaton that no compact regex writes; "
                "only the grammar form calls it (`json_schema_compile`, or `JsonSchema` with "
                "one schema), not `json_schema_regex` or a list of schemas",
            )


def _rewrite(
    schema,
    *,
    whitespace_pattern: str | None = None,
    max_recursion_depth: int = DEFAULT_MAX_RECURSION_DEPTH,
    strict: bool = True,
    closed_objects: bool = False,
    free_form_depth: int | _FreeValueCall | None = NESTED_FREE_FORM_DEPTH,
    counted_strings: bool = False,
    property_order: str = "schema",
    recursive: bool = False,
) -> tuple[_Rewriter, str] | None:
    """The rewriter after its pass over `schema` and the schema's regex with the markers left
    in (`_Rewriter.substitute` expands them; the grammar form makes rules of some). Arguments and
    errors as `json_schema_regex`; `recursive=True` keeps recursive references as markers of
    rules (`inline_references(recursive=True)`, `_Rewriter.recursive`: only the grammar form
    can compile them) instead of unrolling them; then `None` when nothing recurses (before the
    rewrite: the caller takes the unrolled path)."""
    if (
        isinstance(max_recursion_depth, bool)
        or not isinstance(max_recursion_depth, int)
        or max_recursion_depth < 1
    ):
        raise ValueError(
            f"`max_recursion_depth` must be an integer >= 1, got {max_recursion_depth!r}"
        )
    schema = schema_as_dict(schema)
    check_schema(schema)
    schema = _listed_values(in_dialect(schema))
    expansions = ()
    if recursive:
        root, expansions = inline_references(schema, max_recursion_depth, recursive=True)
        if not expansions:
            return None
    else:
        root = inline_references(schema, max_recursion_depth)
    if not isinstance(free_form_depth, _FreeValueCall) and (
        isinstance(free_form_depth, bool)
        or not isinstance(free_form_depth, int)
        or free_form_depth < 0
    ):
        raise ValueError(f"`free_form_depth` must be an integer >= 0, got {free_form_depth!r}")
    if property_order not in PROPERTY_ORDERS:
        raise ValueError(
            f"`property_order` must be one of {PROPERTY_ORDERS}, got {property_order!r}"
        )
    rewriter = _Rewriter(
        root,
        strict=strict,
        closed_objects=closed_objects,
        whitespace_pattern=whitespace_pattern,
        max_recursion_depth=max_recursion_depth,
        free_form_depth=free_form_depth,
        counted_strings=counted_strings,
        property_order=property_order,
        expansions=expansions,
    )
    normalized = rewriter.node(root, "#")
    rewriter.finish_recursive()
    if normalized is NEVER:
        raise UnsupportedSchemaError(
            "$ref",
            "#",
            "no JSON value satisfies the schema (within "
            f"max_recursion_depth={max_recursion_depth} if it is recursive)",
        )
    return rewriter, rewriter.regex_of(normalized)


def _warn_dropped(rewriter: _Rewriter) -> None:
    """One `UserWarning` listing the keywords a `strict=False` rewrite dropped."""
    if rewriter.dropped:
        warnings.warn(
            f"JSON Schema: {len(rewriter.dropped)} keyword(s) cannot be enforced and were dropped "
            f"(strict=False): " + "; ".join(rewriter.dropped),
            UserWarning,
            stacklevel=3,
        )


def json_schema_automaton(schema, vocabulary, *, cache: bool = True, **options):
    """The `TokenAutomaton` of the JSON documents valid under `schema`, for `vocabulary`.

    **Arguments:** `schema`: a dict, JSON text or a pydantic model class; `vocabulary`: from
    `vocabulary_from_tokenizer`; `cache`: use the memory and disk caches; `options`: those of
    `json_schema_regex`.

    **Raises:** as `json_schema_regex`, and `ConstraintError` when the vocabulary cannot write
    any valid document.
    """
    regex = json_schema_regex(schema, **options)
    return regex_automaton(
        regex, vocabulary, cache=cache, description=f"json schema {_describe(schema)}"
    )


def _free_value_grammar(ws: str) -> GrammarSpec:
    """Any JSON value with `ws` between tokens, as a grammar whose rule `value` recurses."""
    space, string, number = Terminal(ws), Terminal(STRING), Terminal(NUMBER)
    member = Seq((string, space, Terminal(":"), space, Ref("value")))

    @typing.no_type_check
    def listing(opener: str, item, closer: str):
        more = Repeat(Seq((space, Terminal(","), space, item)), 0, None)
        return Seq(
            (Terminal(opener), space, Repeat(Seq((item, more)), 0, 1), space, Terminal(closer))
        )

    value = Alt(
        (
            listing(r"\{", member, r"\}"),
            listing(r"\[", Ref("value"), r"\]"),
            string,
            number,
            Terminal("true"),
            Terminal("false"),
            Terminal("null"),
        )
    )
    return GrammarSpec(rules={"start": Ref("value"), "value": value}, ignore=[], start="start")


def _call_edges(regex: str) -> tuple[ByteDFA, np.ndarray]:
    """The minimal byte DFA of a schema regex whose free-form values are `FREE_VALUE_CALL`, with
    each path over that character's bytes replaced by a call edge: `(dfa, call)`, `call[q]` the
    state after a value read from `q` (`REJECT`: none). JSON text never holds the raw control
    character, so every edge on it is a value."""
    dfa = regex_byte_dfa(regex)  # minimised once below, with the calls as a 257th symbol
    byte = FREE_VALUE_CALL.encode("utf-8")[0]
    call = dfa.delta[:, byte].copy()
    delta = dfa.delta.copy()
    delta[:, byte] = REJECT
    joined = minimize(
        ByteDFA(np.concatenate([delta, call[:, None]], axis=1), dfa.accepting, dfa.initial)
    )
    return ByteDFA(joined.delta[:, :256], joined.accepting, joined.initial), joined.delta[:, 256]


def json_schema_pushdown(
    schema,
    vocabulary: TokenVocabulary,
    *,
    stack_depth: int = DEFAULT_STACK_DEPTH,
    whitespace_pattern: str | None = None,
    cache: bool = True,
    **options,
) -> PushdownAutomaton | None:
    """The `PushdownAutomaton` of a JSON Schema whose free-form values (`{}`, `true`, the values
    of open objects' additional properties, arrays without `items`) nest as deep as the stack
    allows: the schema's regex is built as by `json_schema_regex`, each free-form value written
    as one `FREE_VALUE_CALL` character; the regex's byte DFA, with those characters turned into
    calls, is the bottom frame of a pushdown automaton whose recursive rule is any JSON value.
    Memoised in this process (the last 16 automata).

    **Arguments:** `schema`, `vocabulary`; `stack_depth`: stack slots (nesting depth of the
    free-form values); `whitespace_pattern` and `options`: as for `json_schema_regex`
    (`free_form_depth` excluded); `cache`: `False` builds the automaton afresh, neither reading
    nor filling the memo.

    **Returns:** the automaton, or `None` when the schema has no free-form value (the token
    automaton of `json_schema_automaton` is then exact and smaller).

    **Raises:** as `json_schema_regex`; `NotDeterministic` when a position can start both a
    free-form value and other text nested deeper than `_inline_value_calls` reads the value in
    place there (`_VALUE_CALL_LEVELS`; `anyOf` of a string and `{}` is read in place).
    """
    regex = json_schema_regex(
        schema, whitespace_pattern=whitespace_pattern, free_form_depth=_CALL, **options
    )

    if escape(FREE_VALUE_CALL) not in regex:
        return None
    return _pushdown_of_regex(regex, schema, vocabulary, stack_depth, whitespace_pattern, cache)


def _pushdown_of_regex(
    regex: str, schema, vocabulary, stack_depth: int, whitespace_pattern, cache: bool
) -> PushdownAutomaton:
    """`json_schema_pushdown` from the schema's regex with `FREE_VALUE_CALL`s (what
    `json_schema_compile` has already built: the schema is not rewritten again)."""
    key = cache_key("json-pda", f"{stack_depth}\0{regex}", vocabulary)
    if cache and key in _PUSHDOWN_CACHE:
        return _PUSHDOWN_CACHE[key]
    ws = _DEFAULT_WHITESPACE if whitespace_pattern is None else f"(?:{whitespace_pattern})"
    dfa, call = _call_edges(regex)
    dfa, calls = _inline_value_calls(dfa, call[:, None], ws)
    call = calls[:, 0]
    automaton = build_pushdown(
        _free_value_grammar(ws),
        vocabulary,
        stack_depth=stack_depth,
        top=(dfa, call, "value"),
        description=f"json schema {_describe(schema)} (pushdown)",
    )
    if not cache:
        return automaton
    if len(_PUSHDOWN_CACHE) >= 16:
        _PUSHDOWN_CACHE.pop(next(iter(_PUSHDOWN_CACHE)))
    _PUSHDOWN_CACHE[key] = automaton
    return automaton


# ------------------------------------------------------------------ grammar form

_RULE_CALL = 0x02
"""The byte that starts a rule call in a grammar-form regex, followed by two digit bytes
`0x10 + i // 16`, `0x10 + i % 16` (rule `i`): control characters, which JSON text never holds
raw (strings escape them, whitespace is space, tab, CR and LF)."""
_VALUE_FIRST = np.zeros(256, bool)
_VALUE_FIRST[list(b'{["-0123456789tfn')] = True  # the first bytes of any JSON value


def _rule_call(i: int) -> str:
    """The regex of the call of schema rule `i` (three control characters)."""
    return f"\\x{_RULE_CALL:02x}\\x{0x10 + i // 16:02x}\\x{0x10 + i % 16:02x}"


def _plan_rules(
    rewriter: _Rewriter,
    regex: str,
    banned: set,
    promoted: dict[str, str] | None = None,
    frozen: dict[str, set] | None = None,
) -> tuple[str, list[str], list[str]]:
    """Which markers of `rewriter` become rules, and every regex with them called.

    Bottom-up over the markers (a DAG: one marker per distinct regex): a marker's size is its
    regex with its non-rule markers expanded and its rules called; it becomes a rule when that
    size exceeds `RULE_REGEX`, or `SHARED_RULE_REGEX` when it is used in more than one place,
    unless it is `banned` (a call that would not be deterministic). A marker over `RULE_REGEX`
    first calls its largest subschemas (down to `MIN_RULE_REGEX` characters) until it fits;
    `promoted` (filled when given) maps each subschema called that way to that marker. A marker
    in `frozen` calls only the subschemas listed for it there (those it called in the previous
    plan that were not banned): when some of its calls were not deterministic, the next largest
    are alternatives of the same kind (MaskBench o21378: an `anyOf` of 23 objects, 11 banned
    in one plan and the other 12 in the next, a 76,760-character rule built in vain, 2 s).
    The markers of recursive targets (`_Rewriter.recursive`) are always rules, numbered first:
    every cycle of the marker graph passes through one of them, so the graph without their
    out-edges is a DAG and the bottom-up pass measures the others first.
    Returns `(root regex, rule
    names, rule regexes)`, the regexes with each rule's marker replaced by `_rule_call`.

    **Raises:** `NotDeterministic` when a recursive target's rule is `banned` (it cannot be
    inlined); `RecursionRefused` beyond `MAX_RULES` recursive targets."""
    found = re.compile(f'"(FGSUB[0-9]+X{rewriter.tag})"')
    uses: dict[str, int] = {}
    order: list[str] = []
    seen: set = set()
    recursive = _cycle_breakers(rewriter, regex, banned)
    calls = set(recursive)
    if len(recursive) > MAX_RULES:
        raise RecursionRefused(f"more than {MAX_RULES} recursive targets")

    @typing.no_type_check
    def visit(text: str) -> None:
        for match in found.finditer(text):
            name = match.group(1)
            uses[name] = uses.get(name, 0) + 1
            if name not in seen:
                seen.add(name)
                if name not in calls:
                    visit(rewriter.substitutions[name])
                    order.append(name)  # after its children

    visit(regex)
    for name in recursive:  # after everything they call: their sizes are not needed
        seen.add(name)
        visit(rewriter.substitutions[name])
    repeated = {
        item for array, (item, _) in rewriter.item_repeats.items() if array in uses and item in uses
    }
    size: dict[str, int] = {}
    index: dict[str, int] = {name: i for i, name in enumerate(recursive)}
    call_size = len(_rule_call(0))

    @typing.no_type_check
    def one(name: str) -> int:
        return call_size if name in index else size[name] + 4

    @typing.no_type_check
    def measured(text: str, name: str) -> int:
        total = len(text) + rewriter.repeat_weight.get(name, 0)
        for match in found.finditer(text):
            total += one(match.group(1)) - len(match.group(0))
        if name in rewriter.item_repeats:
            item, copies = rewriter.item_repeats[name]
            total += copies * one(item)
        return total

    for name in order:
        if _dfa_rule(rewriter, name, index, banned):
            continue
        text = rewriter.substitutions[name]
        size[name] = measured(text, name)
        if size[name] > RULE_REGEX:
            # too large to be one regex: call its largest subschemas instead, until it fits
            children = sorted(
                {m.group(1) for m in found.finditer(text)} - index.keys() - banned,
                key=lambda child: -size[child],
            )
            if frozen is not None and name in frozen:
                children = [child for child in children if child in frozen[name]]
            for child in children:
                if size[name] <= RULE_REGEX or size[child] < MIN_RULE_REGEX:
                    break
                if len(index) < MAX_RULES:
                    index[child] = len(index)
                    size[name] = measured(text, name)
                    if promoted is not None:
                        promoted[child] = name
        limit = (
            REPEATED_RULE_REGEX
            if name in repeated  # one call per copy of a counted repeat instead of the item
            else SHARED_RULE_REGEX
            if uses[name] > 1
            else RULE_REGEX
        )
        if size[name] > limit and name not in banned and len(index) < MAX_RULES:
            index[name] = len(index)
    expanded: dict[str, str] = {}

    @typing.no_type_check
    def expand(match) -> str:
        name = match.group(1)
        if name in index:
            return _rule_call(index[name])
        if name not in expanded:
            expanded[name] = "(?:" + found.sub(expand, rewriter.substitutions[name]) + ")"
        return expanded[name]

    rules = list(index)
    texts = [found.sub(expand, regex)] + [
        "(?:" + found.sub(expand, rewriter.substitutions[name]) + ")" for name in rules
    ]
    for text in texts:
        if len(text) > MAX_REGEX:
            raise RegexTooLarge(len(text), MAX_REGEX)
    return texts[0], rules, texts[1:]


def _merge_equal_markers(rewriter: _Rewriter, regex: str) -> str:
    """For the grammar form of a recursive schema: one marker for markers of the same regex
    once their callees are merged, and none for a marker whose regex is another marker alone
    (a recursive target's rule is `(?:"X")` when its body was rewritten as marker X), until
    nothing changes; `regex` with the merged names. Each unrolled copy of a recursive definition
    names its own callees, so a tree of `anyOf` items of two definitions has several markers of
    the same `anyOf` whose rules, merged into one automaton, would call different rules at the
    same state; merged, they call one. Markers of string automata and counted items keep their
    names (their sizes are recorded by name). Updates `rewriter` in place."""
    found = re.compile(f'"(FGSUB[0-9]+X{rewriter.tag})"')
    alone = re.compile(f'\\(\\?:"(FGSUB[0-9]+X{rewriter.tag})"\\)')
    pinned = {*rewriter.dfa_terminals, *rewriter.item_repeats, *rewriter.repeat_weight}
    alias: dict[str, str] = {}

    def resolve(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    def renamed(text: str) -> str:
        return found.sub(lambda m: f'"{resolve(m.group(1))}"', text)

    changed = True
    while changed:
        changed, first = False, {}
        for name, text in list(rewriter.substitutions.items()):
            if name in alias:
                continue
            text = rewriter.substitutions[name] = renamed(text)
            if name not in pinned:
                single = alone.fullmatch(text)
                target = single.group(1) if single else first.get(text)
                if target is not None and resolve(target) != name:
                    alias[name] = resolve(target)
                    changed = True
                    continue
            first.setdefault(text, name)
    for name in alias:
        del rewriter.substitutions[name]
    rewriter.recursive = {k: resolve(name) for k, name in rewriter.recursive.items()}
    rewriter.item_repeats = {
        array: (resolve(item), copies) for array, (item, copies) in rewriter.item_repeats.items()
    }
    return renamed(regex)


def _cycle_breakers(rewriter: _Rewriter, regex: str, banned: set) -> list[str]:
    """For `_plan_rules`: the markers that must be rules so that every cycle of the marker graph
    (from `regex`) passes through one, none of them `banned`. These are the recursive targets
    (`_Rewriter.recursive`) unless one is banned: a tree whose items are an `anyOf` of two
    recursive objects (`{"anyOf": [{"$ref": "#/definitions/Leaf"}, {"$ref":
    "#/definitions/Branch"}]}`, both starting with `{`) cannot call either, so each cycle
    through a banned target is broken at its nearest marker before it that is not banned (the
    `anyOf` itself: one rule whose automaton holds both objects, called where the items start).

    **Raises:** `NotDeterministic` when a cycle has only banned markers."""
    recursive = list(dict.fromkeys(rewriter.recursive.values()))
    if not banned & set(recursive):
        return recursive
    found = re.compile(f'"(FGSUB[0-9]+X{rewriter.tag})"')
    children: dict[str, list[str]] = {}
    pending = found.findall(regex)
    while pending:
        name = pending.pop()
        if name not in children:
            children[name] = list(dict.fromkeys(found.findall(rewriter.substitutions[name])))
            pending += children[name]
    breakers = [name for name in recursive if name not in banned]
    while (cycle := _marker_cycle(children, set(breakers))) is not None:
        at = next(i for i, name in enumerate(cycle) if name in banned)
        before = [cycle[at - j] for j in range(1, len(cycle)) if cycle[at - j] not in banned]
        if not before:
            raise NotDeterministic(
                "a recursive reference is called where one byte cannot choose it"
            )
        breakers.append(before[0])
    return breakers


def _marker_cycle(children: dict[str, list[str]], cut: set) -> list[str] | None:
    """A cycle of the marker graph `children` that passes through none of `cut` (its markers in
    order, each one's successor the next, the last one's the first), or `None`: an iterative
    depth-first search."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for start in children:
        if start in cut or start in state:
            continue
        path, iterators = [start], [iter(children[start])]
        state[start] = 1
        while path:
            child = next(iterators[-1], None)
            if child is None:
                state[path.pop()] = 2
                iterators.pop()
            elif child in cut or state.get(child) == 2:
                continue
            elif state.get(child) == 1:
                return path[path.index(child) :]
            else:
                state[child] = 1
                path.append(child)
                iterators.append(iter(children[child]))
    return None


def _dfa_rule(rewriter: _Rewriter, name: str, index: dict, banned: set) -> bool:
    """For `_plan_rules`: make marker `name` a rule (`index[name]`) if it is a string given as
    an automaton (`_Rewriter.dfa_terminals`), which cannot be inlined as a regex; whether it is.

    **Raises:** `UnsupportedSchemaError` when it is `banned` (called where one byte of
    lookahead cannot choose it, e.g. an `anyOf` of it and another string);
    `ConstraintError` beyond `MAX_RULES` rules."""
    if name not in rewriter.dfa_terminals:
        return False
    _, path, keyword = rewriter.dfa_terminals[name]
    if name in banned:
        raise UnsupportedSchemaError(
            keyword,
            path,
            "a length-bounded string automaton is called where another value may also start "
            "(e.g. `anyOf` with another string): the grammar form cannot choose it",
        )
    if name not in index:
        if len(index) >= MAX_RULES:
            raise ConstraintError(f"the schema needs more than {MAX_RULES} grammar rules")
        index[name] = len(index)
    return True


def _rule_automaton(rewriter: _Rewriter, text: str, rules: int, free_value: bool):
    """`_rule_edges(text, rules, free_value)`, or for a rule that is a string given as an
    automaton (its text the placeholder of `_Rewriter.dfa_texts`) that automaton, without
    calls."""
    dfa = rewriter.dfa_texts.get(text[3:-1]) if text.startswith("(?:") else None
    if dfa is None:
        return _rule_edges(text, rules, free_value)
    return dfa, np.full((dfa.num_states, rules + free_value), REJECT, np.int32)


def _rule_edges(regex: str, rules: int, free_value: bool) -> tuple[ByteDFA, np.ndarray]:
    """The minimal byte DFA of a grammar-form regex with its calls as call columns: `(dfa,
    calls)`, `calls[q, r]` the state after a call of rule `r` from `q` (`REJECT`: none); the
    callables are the `rules` schema rules, then the free-form JSON value when `free_value`.
    Memoised by `(regex, free_value)` (`_RULE_EDGES`): the attempts of one compile (the call,
    then depth 1; each plan after a ban; the recursive form, then unrolled) rebuild most rules
    with the same text (MaskBench bamboo-spec: 321 rule automata, 115 distinct texts)."""
    hit = _RULE_EDGES.get((regex, free_value))
    if hit is None:
        future = _RULE_EDGES_AHEAD.pop((regex, free_value), None)
        if future is not None and not future.cancel():
            hit = future.result()  # its error, if any, is raised here, as it would be inline
        else:
            hit = _rule_edges_of(regex, free_value)
        _RULE_EDGES[regex, free_value] = hit
        _RULE_EDGES.move_to_end((regex, free_value))
        while sum(dfa.num_states for dfa, _, _ in _RULE_EDGES.values()) > RULE_EDGES_STATES:
            _RULE_EDGES.popitem(last=False)
    else:
        _RULE_EDGES.move_to_end((regex, free_value))
    dfa, rule_calls, value_calls = hit
    if rule_calls.shape[1] > rules:
        raise RuntimeError(f"internal error: a rule regex calls rule {rule_calls.shape[1] - 1}")
    calls = np.full((dfa.num_states, rules + free_value), REJECT, np.int32)
    calls[:, : rule_calls.shape[1]] = rule_calls
    if free_value:
        calls[:, rules] = value_calls
    return dfa, calls


def _inlined_rule_edges(regex: str, rules: int, ws: str) -> tuple[ByteDFA, np.ndarray]:
    """`_rule_edges(regex, rules, True)` with the free-form value's calls that compete read in
    place (`_inline_value_calls` with whitespace `ws`). Memoised by its arguments
    (`_INLINED_RULE_EDGES`, least recently used dropped past `RULE_EDGES_STATES` states): the
    attempts of one compile build many rules again with the same text (MaskBench o7573: each of
    9 rules twice, up to 10,900 sets of states each; its refusal 5.6 -> 4.5 s)."""
    key = (regex, rules, ws)
    hit = _INLINED_RULE_EDGES.get(key)
    if hit is None:
        hit = _INLINED_RULE_EDGES[key] = _inline_value_calls(*_rule_edges(regex, rules, True), ws)
        while sum(dfa.num_states for dfa, _ in _INLINED_RULE_EDGES.values()) > RULE_EDGES_STATES:
            _INLINED_RULE_EDGES.popitem(last=False)
    _INLINED_RULE_EDGES.move_to_end(key)
    return hit


_INLINED_RULE_EDGES: "collections.OrderedDict[tuple[str, int, str], tuple]" = (
    collections.OrderedDict()
)
"""`_inlined_rule_edges`' memo."""


_RULE_EDGES: "collections.OrderedDict[tuple[str, bool], tuple]" = collections.OrderedDict()


_RULE_EDGES_AHEAD: "dict[tuple[str, bool], concurrent.futures.Future]" = {}
"""`_rule_edges_of` results being built ahead by `_build_ahead`'s threads, by `(regex,
free_value)`: `_rule_edges` takes (or cancels and builds) them."""


def _compile_threads() -> "concurrent.futures.ThreadPoolExecutor | None":
    """The threads that build rule automata ahead (`_build_ahead`): one per core this process may
    run on, at most `MAX_COMPILE_THREADS`; `None` with a single core. One pool per process: a
    child forked after the pool started has none of its threads, so it starts its own."""
    pid = os.getpid()
    if pid not in _POOLS:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        workers = min(cores or 1, MAX_COMPILE_THREADS)
        _POOLS.clear()
        _POOLS[pid] = (
            concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="functional_gen")
            if workers >= 2
            else None
        )
    return _POOLS[pid]


_POOLS: dict = {}


@contextlib.contextmanager
def _build_ahead(regexes: list[str], free_value: bool):
    """Build the rule automata of `regexes` (`_rule_edges_of`) on `_compile_threads`, in that
    order, while the caller takes them one by one through `_rule_edges`; those it has not taken
    when it leaves (a refused plan) are cancelled unless already running. outlines-core builds a
    regex's DFA without holding the GIL, so two cores build two rules at once: on 2 cores,
    MaskBench o48866 9.5-10.1 -> 7.8-8.0 s, o7573 7.6-8.4 -> 6.3-6.4 s, bamboo-spec 8.1-8.3 ->
    7.4-7.8 s; 180 sampled schemas 5% less in total, p50 unchanged. Results and errors are
    those of building in order, one at a time: the caller still takes and checks them in
    order."""
    pool = _compile_threads()
    keys = []
    if pool is not None:
        for regex in regexes:
            key = (regex, free_value)
            if key not in _RULE_EDGES and key not in _RULE_EDGES_AHEAD:
                _RULE_EDGES_AHEAD[key] = pool.submit(_rule_edges_of, regex, free_value)
                keys.append(key)
    try:
        yield
    finally:
        for key in keys:
            future = _RULE_EDGES_AHEAD.pop(key, None)
            if future is not None:
                future.cancel()


def _rule_edges_of(regex: str, free_value: bool):
    """`(dfa, rule_calls, value_calls)` for `_rule_edges`: the call columns of the rules that
    `regex` calls (`rule_calls[:, r]`, up to its largest rule called) and, when `free_value`,
    of the free-form value (`value_calls`, else `None`)."""
    dfa = minimize(regex_byte_dfa(regex))
    delta = dfa.delta.copy()
    edges = []  # (state, rule, state after the call)
    for q in np.flatnonzero(delta[:, _RULE_CALL] != REJECT):
        first = delta[q, _RULE_CALL]
        for high in np.flatnonzero(delta[first, 0x10:0x20] != REJECT):
            second = delta[first, 0x10 + high]
            for low in np.flatnonzero(delta[second, 0x10:0x20] != REJECT):
                edges.append((q, 16 * high + low, delta[second, 0x10 + low]))
    delta[:, _RULE_CALL] = REJECT
    calls = np.full((dfa.num_states, 1 + max((r for _, r, _ in edges), default=-1)), REJECT)
    for q, r, after in edges:
        calls[q, r] = after
    if free_value:
        byte = FREE_VALUE_CALL.encode("utf-8")[0]
        calls = np.concatenate([calls, delta[:, byte, None]], axis=1)
        delta[:, byte] = REJECT
    joined = minimize(
        ByteDFA(np.concatenate([delta, calls], axis=1).astype(np.int32), dfa.accepting, dfa.initial)
    )
    columns = joined.delta[:, 256:]
    return (
        ByteDFA(joined.delta[:, :256], joined.accepting, joined.initial),
        columns[:, : columns.shape[1] - free_value],
        columns[:, -1] if free_value else None,
    )


def _check_productive(automata: list, rules: int) -> None:
    """Refuse a grammar form in which some rule or state cannot finish (a recursion with no
    way out, `{"required": ["next"], "properties": {"next": {"$ref": "#"}}}`): the pushdown
    automaton would offer text that can never end. A least fixed point: a state can finish when
    it accepts, or reads a byte or calls a rule that can finish into a state that can; a rule
    can finish when its initial state can. Computed in phases: the states that reach an
    accepting state of their automaton over bytes and calls of the rules known to finish (one
    backward breadth-first search of all automata at once, `byte_dfa.reachable_states`), then the
    rules that finish with them, until no rule is added (at most `rules + 1` phases).

    **Arguments:** as `_nondeterministic_calls` (the free-form value, call column `rules`
    when present, always finishes).

    **Raises:** `RecursionRefused` naming the first rule that cannot finish."""

    offsets = np.cumsum([0] + [dfa.num_states for dfa, _ in automata])
    total = int(offsets[-1])
    byte_src, byte_dst, call_src, call_dst, call_rule = [], [], [], [], []
    for (dfa, calls), offset in zip(automata, offsets):
        q, b = np.nonzero(dfa.delta != REJECT)
        byte_src.append(q + offset)
        byte_dst.append(dfa.delta[q, b].astype(np.int64) + offset)
        q, c = np.nonzero(calls != REJECT)
        call_src.append(q + offset)
        call_dst.append(calls[q, c].astype(np.int64) + offset)
        call_rule.append(c)
    byte_src, byte_dst = np.concatenate(byte_src), np.concatenate(byte_dst)
    call_src, call_dst = np.concatenate(call_src), np.concatenate(call_dst)
    call_rule = np.concatenate(call_rule)
    accepting = np.flatnonzero(np.concatenate([dfa.accepting for dfa, _ in automata]))
    initial = np.array(
        [offsets[1 + r] + automata[1 + r][0].initial for r in range(rules)], np.int64
    )
    productive = np.zeros(rules + 1, bool)
    productive[rules:] = True
    while True:
        usable = productive[np.minimum(call_rule, rules)]
        # reversed edges (target -> source) as a CSR graph
        src = np.concatenate([byte_dst, call_dst[usable]])
        dst = np.concatenate([byte_src, call_src[usable]])
        order = np.argsort(src, kind="stable")
        indptr = np.searchsorted(src[order], np.arange(total + 1))
        done = reachable_states(indptr, dst[order], accepting, total)
        now = np.append(done[initial], True)
        if np.array_equal(now, productive):
            break
        productive = now
    for a in range(len(automata)):
        if not done[offsets[a] : offsets[a + 1]].all():
            name = "the schema" if a == 0 else f"rule {a - 1}"
            raise RecursionRefused(f"{name} has text that can never end (endless recursion)")


_VALUE_CALL_LEVELS = 8
"""How many levels deep `_inline_value_calls` reads free-form values in place (a level read in
place may hold calls that compete again, one level down) before it leaves a call competing
(for `_check_value_calls` to refuse)."""


def _inline_value_calls(
    dfa: ByteDFA, calls: np.ndarray, ws: str, levels: int = _VALUE_CALL_LEVELS
) -> tuple[ByteDFA, np.ndarray]:
    """`(dfa, calls)` (a rule automaton as `_rule_edges` gives it, the free-form value's call in
    the last column of `calls`) with each call of the JSON value rule that competes with bytes
    read beside it (`{"anyOf": [{"maxItems": 1}, {}]}`: the first branch's strings, numbers and
    objects are written in place, the second is a call) replaced by one level of the value read
    in place (`free_value(1, ws, innermost=call)`: a scalar, or an array or object whose
    members are calls), merged with the bytes beside it. A call inside that level that competes
    again (the regular side nests deeper) is replaced the same way, at most `levels` levels
    down. Calls that compete with nothing stay calls, so where the regular text beside them
    ends, the calls meet again (the same call, from one state). The language is the same: a
    call reads any value, and so does the level read in place. (Replacing every call of the
    schema by one or two levels read in place, which `json_schema_compile` tried until
    2026-11-25, does not resolve a conflict whose regular side is an object or array of free
    values: both sides move down together.)

    Built as a subset construction over the automaton and copies of the level's automaton, one
    per state returned to, made as they are needed: in a set of states that reads one of a
    value's first bytes, each state that calls the value enters a copy instead (the state
    after its call is the copy's state returned to); a copy's accepting state also stands for
    its state returned to. Then minimised. MaskBench o24467 (an `anyOf` of 12 open objects
    whose untyped members are constrained in some branches and free in others): every attempt
    conflicted before, and the schema fell back to free values nested 1 level (6.2 s, both
    valid instances rejected); now its pushdown automaton in 0.75 s, both accepted.

    **Returns:** the new `(dfa, calls)`; the same objects when no call competes."""
    states = np.flatnonzero(calls[:, -1] != REJECT)
    if not ((dfa.delta[states] != REJECT) & _VALUE_FIRST).any():
        return dfa, calls

    level_dfa, _, level_value = _rule_edges_of(
        free_value(1, ws, innermost=escape(FREE_VALUE_CALL)), True
    )
    n, width = dfa.num_states, 256 + calls.shape[1] - 1  # symbols: bytes, then rule calls
    level_table = np.full((level_dfa.num_states, width), REJECT, np.int64)
    level_table[:, :256] = level_dfa.delta
    table = np.concatenate([dfa.delta, calls[:, :-1]], axis=1).astype(np.int64)
    columns, column_class = unique_columns(np.concatenate([table, level_table]))
    rows, level_rows = columns[:n].tolist(), columns[n:].tolist()
    value_first = ((dfa.delta != REJECT) & _VALUE_FIRST).any(axis=1).tolist()
    level_first = ((level_dfa.delta != REJECT) & _VALUE_FIRST).any(axis=1).tolist()
    value, level_value = calls[:, -1].tolist(), level_value.tolist()
    level_accepting = level_dfa.accepting.tolist()
    # nondeterministic states: 0..n-1 the automaton's; then copies' states (returned to,
    # level state, depth), numbered as they are made
    copies: dict[tuple[int, int], int] = {}
    copy_of: list[tuple[int, int, int]] = []

    def copy(back: int, v: int) -> int:
        index = copies.get((back, v))
        if index is None:
            depth = 1 + (copy_of[back - n][2] if back >= n else 0)
            index = copies[back, v] = n + len(copy_of)
            copy_of.append((back, v, depth))
        return index

    def closure(members) -> tuple:
        """With every copy's accepting state, the state it returns to (transitively)."""
        seen = set(members)
        todo = [q for q in seen if q >= n]
        while todo:
            back, v, _ = copy_of[todo.pop() - n]
            if level_accepting[v] and back not in seen:
                seen.add(back)
                if back >= n:
                    todo.append(back)
        return tuple(sorted(seen))

    num_columns = columns.shape[1]
    level_edges = [[(c, t) for c, t in enumerate(r) if t != REJECT] for r in level_rows]
    state_edges: dict[int, list] = {}

    def edges(q: int) -> list:
        """The (column, target) pairs of state `q`'s row that are not `REJECT`."""
        found = state_edges.get(q)
        if found is None:
            found = state_edges[q] = [(c, t) for c, t in enumerate(rows[q]) if t != REJECT]
        return found

    # each state of the automaton alone is the set of its own number
    order: list[tuple] = [(q,) for q in range(n)]
    subsets = {members: q for q, members in enumerate(order)}
    out_rows, out_calls, out_accepting = [], [], []
    for members in order:  # grows while it is read
        if len(members) == 1 and members[0] < n:
            q = members[0]
            if value[q] == REJECT or not value_first[q]:  # as it was
                out_rows.append(rows[q])
                out_calls.append(value[q])
                out_accepting.append(bool(dfa.accepting[q]))
                continue
        callers = []
        reads_first = False
        for q in members:
            if q < n:
                reads_first = reads_first or value_first[q]
                if value[q] != REJECT:
                    callers.append(value[q])
            else:
                back, v, _ = copy_of[q - n]
                reads_first = reads_first or level_first[v]
                if level_value[v] != REJECT:
                    callers.append(copy(back, level_value[v]))
        everyone = list(members)
        returns = []
        for after in callers:
            deep = copy_of[after - n][2] if after >= n else 0
            if reads_first and deep < levels:
                everyone.append(copy(after, level_dfa.initial))
            else:
                returns.append(after)
        by_column: dict[int, set] = {}  # each member's edges, not every column of each
        for q in everyone:
            if q < n:
                for c, t in edges(q):
                    by_column.setdefault(c, set()).add(t)
            else:
                back, v, _ = copy_of[q - n]
                for c, t in level_edges[v]:
                    by_column.setdefault(c, set()).add(copy(back, t))
        row = [REJECT] * num_columns
        for c in sorted(by_column):  # in column order, as the sets were always numbered
            row[c] = _subset_index(closure(by_column[c]), subsets, order)
        out_rows.append(row)
        out_calls.append(_subset_index(closure(returns), subsets, order) if returns else REJECT)
        out_accepting.append(any(q < n and dfa.accepting[q] for q in members))
    merged = np.array(out_rows, np.int64)[:, column_class]
    joined = minimize(
        ByteDFA(
            np.concatenate([merged, np.array(out_calls, np.int64)[:, None]], axis=1).astype(
                np.int32
            ),
            np.array(out_accepting, bool),
            dfa.initial,
        )
    )
    return ByteDFA(joined.delta[:, :256], joined.accepting, joined.initial), joined.delta[:, 256:]


def _subset_index(members: tuple, subsets: dict, order: list) -> int:
    """The number of a set of states in `_inline_value_calls`' construction (a new one
    appended to `order`)."""
    index = subsets.get(members)
    if index is None:
        index = subsets[members] = len(order)
        order.append(members)
    return index


def _check_value_calls(dfa: ByteDFA, calls: np.ndarray, name: str) -> None:
    """Refuse at once a rule automaton (`_rule_edges`, the free-form value's call in the last
    column) with a state that both calls the JSON value rule and reads one of a value's first
    bytes itself (what `_inline_value_calls` left: text nested deeper beside the call than it
    reads in place): no plan of the other rules can change that, and `build_pushdown` would refuse
    it only after every rule's automaton and the shared tails (seconds on a large schema, for
    each free-form depth `json_schema_compile` tries).

    **Raises:** `NotDeterministic` naming the rule and the byte, as `build_pushdown` does."""
    states = np.flatnonzero(calls[:, -1] != REJECT)
    clash = (dfa.delta[states] != REJECT) & _VALUE_FIRST
    if clash.any():
        byte = bytes([int(np.flatnonzero(clash.any(axis=0))[0])])
        raise NotDeterministic(
            f"in rule {name!r} the byte {byte!r} can be read in 2 ways (itself, a call of 'value')"
        )


def _nondeterministic_calls(automata: list, rules: int) -> set[int]:
    """The schema rules called where a one-byte lookahead cannot choose: a call whose first
    bytes another call or a byte edge of the same state also reads, or a rule that matches the
    empty string. `automata`: `(dfa, calls)` per regex (the root first, then rule `i` at
    `1 + i`)."""
    first: dict[int, np.ndarray] = {}

    @typing.no_type_check
    def first_bytes(r: int, busy: frozenset = frozenset()) -> np.ndarray:
        if r == rules:
            return _VALUE_FIRST
        if r not in first:
            dfa, calls = automata[1 + r]
            out = dfa.delta[dfa.initial] != REJECT
            for c in np.flatnonzero(calls[dfa.initial] != REJECT):
                if int(c) not in busy and int(c) != r:
                    out = out | first_bytes(int(c), busy | {r})
            first[r] = out
        return first[r]

    bad = {r for r in range(rules) if automata[1 + r][0].accepting[automata[1 + r][0].initial]}
    for dfa, calls in automata:
        for q in np.flatnonzero((calls != REJECT).any(axis=1)):
            called = [int(c) for c in np.flatnonzero(calls[q] != REJECT)]
            reads = dfa.delta[q] != REJECT
            for c in called:
                mine = first_bytes(c)
                others = reads.copy()
                for d in called:
                    if d != c:
                        others |= first_bytes(d)
                if (mine & others).any() and c < rules:
                    bad.add(c)
    return bad


def _joint_blocks(automata: list) -> np.ndarray:
    """The states of every automaton (`(dfa, calls)` each), numbered one after another, grouped
    by their residual language: Moore's refinement of the union, a call edge labelled by its
    callee (hashed signatures, checked exactly as `byte_dfa.minimize` does). Returns each joint
    state's block."""

    offsets = np.cumsum([0] + [dfa.num_states for dfa, _ in automata])
    rows, accepting = [], []
    for (dfa, calls), offset in zip(automata, offsets):
        table = np.concatenate([dfa.delta, calls], axis=1)
        rows.append(np.where(table != REJECT, table + offset, REJECT))
        accepting.append(dfa.accepting)
    columns, _ = unique_columns(np.concatenate(rows))
    accepting = np.concatenate(accepting)
    blocks, count = refine_changed(columns, accepting)
    representative = np.zeros(count, np.int64)
    representative[blocks] = np.arange(blocks.size)
    successor = np.where(columns != REJECT, blocks[np.maximum(columns, 0)], REJECT)
    if not (
        np.array_equal(successor, successor[representative[blocks]])
        and np.array_equal(accepting, accepting[representative[blocks]])
    ):  # a hash collision merged different states
        blocks, _ = refine_exact(columns, accepting)
    return blocks


def _reach(dfa: ByteDFA, calls: np.ndarray, start: int) -> np.ndarray:
    """The states of one automaton reachable from `start` over bytes and calls (a mask)."""
    seen = np.zeros(dfa.num_states, bool)
    seen[start] = True
    frontier = np.array([start])
    while frontier.size:
        nxt = np.concatenate([dfa.delta[frontier].ravel(), calls[frontier].ravel()])
        nxt = np.unique(nxt[nxt != REJECT])
        frontier = nxt[~seen[nxt]]
        seen[frontier] = True
    return seen


def _shared_tails(automata: list, rules: int, free_value: bool) -> tuple[list, int]:
    """Fewer positions for a grammar form: a tail that several automata share (states whose
    residual languages, up to the end of their rule, are equal: the properties after a
    recursive one in each unrolled copy of a recursive definition, an object's last members in
    two similar definitions) becomes a rule of its own, and each copy's first state a tail call
    of it (a call whose return position is a final state with no edges: it pushes nothing).

    Greedy: the joint partition of every state (`_joint_blocks`), then the shared block with
    the most positions to save (its states reachable from the block, once per automaton beyond
    the first) becomes a rule (its states copied from one automaton; an existing rule when the
    block holds a rule's initial state), each automaton is minimised again, and so on while a
    tail saves `MIN_SHARED_TAIL` positions, at most `MAX_SHARED_TAILS` times. Equal residual
    languages make the language the same; an accepting block is never a tail (a rule may not
    match the empty string).

    **Arguments:** `automata`: `(dfa, calls)` per regex of the grammar form, the root first,
    rule `i` at `1 + i` (as `_rule_edges` gives them); `rules`: the schema rules; `free_value`:
    whether the last call column is the free-form JSON value.

    **Returns:** `(automata, rules)`, the new rules after the old ones (their call columns
    inserted before the free-form value's).
    """
    automata = list(automata)
    for _ in range(MAX_SHARED_TAILS):
        if rules >= MAX_RULES:
            break
        blocks = _joint_blocks(automata)
        offsets = np.cumsum([0] + [dfa.num_states for dfa, _ in automata])
        owner = np.repeat(np.arange(len(automata)), np.diff(offsets))
        accepting = np.concatenate([dfa.accepting for dfa, _ in automata])
        members: dict[int, list[int]] = {}
        for state in np.flatnonzero(~accepting):
            members.setdefault(int(blocks[state]), []).append(int(state))
        # Only entries are candidates: the blocks below a shared block are shared too (as
        # often or more), so a block is looked at when it is a state's first shared one, where
        # an edge comes from a block shared fewer or more times (or it holds an initial state)
        count = np.bincount(blocks, minlength=int(blocks.max()) + 1)
        rows = []
        for (dfa, calls), offset in zip(automata, offsets):
            row = np.concatenate([dfa.delta, calls], axis=1)
            rows.append(np.where(row != REJECT, row + offset, REJECT))
        table = np.concatenate(rows)
        source, _ = np.nonzero(table != REJECT)
        target = table[table != REJECT]
        entry = np.zeros(count.size, bool)
        entry[blocks[target[count[blocks[source]] != count[blocks[target]]]]] = True
        for a, (dfa, _) in enumerate(automata):
            entry[blocks[offsets[a] + dfa.initial]] = True
        candidates = []
        for block, states in members.items():
            if len(states) < 2 or not entry[block]:
                continue
            a = int(owner[states[0]])
            dfa, calls = automata[a]
            size = int(_reach(dfa, calls, states[0] - int(offsets[a])).sum())
            saving = (len(states) - 1) * size - len(states) - 1
            if saving >= MIN_SHARED_TAIL:
                candidates.append((-saving, block))
        total = int(offsets[-1])
        for _, block in sorted(candidates)[:SHARED_TAIL_TRIES]:
            new, grew = _extract_tail(automata, rules, free_value, members[block], owner, offsets)
            if sum(dfa.num_states for dfa, _ in new) <= total - MIN_SHARED_TAIL:
                break  # the estimate counted states that other paths still reach: check
        else:
            break
        rules += grew
        automata = new
    return automata, rules


def _extract_tail(automata: list, rules: int, free_value: bool, states, owner, offsets):
    """`_shared_tails`' step: the joint `states` (one shared block) become tail calls of one rule.
    Returns the new automata and how many rules were added (0 or 1)."""
    initial = [
        int(owner[x]) - 1
        for x in states
        if owner[x] > 0 and x - offsets[owner[x]] == automata[owner[x]][0].initial
    ]
    if initial:  # an existing rule is the tail: call it
        callee, source = initial[0], None
    else:
        callee, source = rules, states[0]
    new = []
    for dfa, calls in automata:
        if callee == rules:  # one more call column, before the free-form value's
            calls = np.insert(calls, rules, REJECT, axis=1)
        new.append((dfa, calls))
    if source is not None:
        a = int(owner[source])
        dfa, calls = new[a]
        keep = _reach(dfa, calls, source - int(offsets[a]))
        renumber = np.cumsum(keep) - 1
        delta = dfa.delta[keep]
        sub_calls = calls[keep]
        delta = np.where(delta != REJECT, renumber[np.maximum(delta, 0)], REJECT)
        sub_calls = np.where(sub_calls != REJECT, renumber[np.maximum(sub_calls, 0)], REJECT)
        tail = ByteDFA(
            delta.astype(np.int32),
            dfa.accepting[keep],
            int(renumber[source - int(offsets[a])]),
        )
        new.append((tail, sub_calls.astype(np.int32)))
    by_automaton: dict[int, list[int]] = {}
    for x in states:
        if int(owner[x]) != 1 + callee:
            by_automaton.setdefault(int(owner[x]), []).append(int(x - offsets[owner[x]]))
    for a, qs in by_automaton.items():  # all of one automaton's states before it is renumbered
        dfa, calls = new[a]
        sink = dfa.num_states
        delta = np.concatenate([dfa.delta, np.full((1, 256), REJECT, np.int32)])
        calls = np.concatenate([calls, np.full((1, calls.shape[1]), REJECT, np.int32)])
        delta[qs] = REJECT
        calls[qs] = REJECT
        calls[qs, callee] = sink
        joined = minimize(
            ByteDFA(
                np.concatenate([delta, calls], axis=1),
                np.concatenate([dfa.accepting, [True]]),
                dfa.initial,
            )
        )
        new[a] = (
            ByteDFA(joined.delta[:, :256], joined.accepting, joined.initial),
            joined.delta[:, 256:],
        )
    return new, int(callee == rules)


def json_schema_grammar(
    schema,
    vocabulary: TokenVocabulary,
    *,
    stack_depth: int = DEFAULT_STACK_DEPTH,
    _rewritten: tuple | None = None,
    _over_regex: bool = False,
    **options,
) -> PushdownAutomaton:
    """The grammar form of a JSON Schema: a `PushdownAutomaton` whose rules are its large
    subschemas, so that a definition used in many places, or the values of an object with many
    optional properties, are compiled once instead of copied into one regex.

    The schema is rewritten as for `json_schema_regex` (one marker per distinct subschema
    regex); a marker whose regex (its own rules called) exceeds `RULE_REGEX` characters, or
    `SHARED_RULE_REGEX` when it is used more than once, becomes a rule: in its callers' regexes
    it is a call (three control characters, `_rule_call`), and its own regex becomes a byte DFA
    with call edges (`_rule_edges`), as the free-form value's call does in
    `json_schema_pushdown`. Only terminals stay regexes: strings with patterns and formats,
    number ranges, keys. A call that a one-byte lookahead cannot choose (an `anyOf` of two
    objects, both starting with `{`) is inlined instead (the rule is banned and the rules are
    planned again). Then a tail several automata share becomes a rule they tail-call
    (`_shared_tails`: fewer positions, the same language). This is how llguidance and XGrammar
    scale to large schemas (a lexer of regex terminals under a grammar of rules). Memoised in
    this process.

    **Arguments:** `schema`, `vocabulary`; `stack_depth`: stack slots (nested rule calls,
    free-form values included); `options`: those of `json_schema_regex` (`free_form_depth=None`
    calls a free-form JSON value rule, as `json_schema_pushdown`); `_over_regex` (internal):
    the form stands in for a single regex over `GRAMMAR_REGEX` characters, so its positions
    limit is `OVER_REGEX_SCALE` times larger.

    **Raises:** as `json_schema_regex`; `ConstraintError` (`RegexTooLarge`) when a single rule
    would still exceed `MAX_REGEX` characters, or when the rules' automata have more than
    `MAX_GRAMMAR_POSITIONS` states in all (too slow to build the token tables); `NotDeterministic` when the rules cannot run
    deterministically even with the conflicting calls inlined.

    Source: the rule/terminal split of llguidance (github.com/guidance-ai/llguidance,
    `docs/json_schema.md`) and XGrammar (Dong et al. 2024, arXiv 2411.15100).
    """
    free = options.get("free_form_depth", DEFAULT_FREE_FORM_DEPTH)
    if free is None:
        options["free_form_depth"] = _CALL
    scale = OVER_REGEX_SCALE if _over_regex else 1
    max_positions, max_before_tails = (
        scale * MAX_GRAMMAR_POSITIONS,
        scale * MAX_POSITIONS_BEFORE_TAILS,
    )
    rewriter, regex = _rewritten if _rewritten is not None else _rewrite(schema, **options)
    _warn_dropped(rewriter)
    if rewriter.recursive:
        regex = _merge_equal_markers(rewriter, regex)
    ws = rewriter.ws
    banned: set = set()
    dfas: dict[tuple[str, int, bool], tuple] = {}

    frozen: dict[str, set] = {}
    for _ in range(8):
        promoted: dict[str, str] = {}
        root, rules, texts = _plan_rules(rewriter, regex, banned, promoted, frozen)
        every = [root, *texts]
        call = escape(FREE_VALUE_CALL)
        value = any(call in text for text in every)
        key = cache_key("json-grammar", f"{stack_depth}\0" + "\0".join(every), vocabulary)
        if key in _PUSHDOWN_CACHE:
            return _PUSHDOWN_CACHE[key]
        built: dict[int, tuple] = {}
        # Strings given as automata first (built already: their positions alone may refuse the
        # form, MaskBench o1052's 60,003 states before a 9 s rule), then the regexes that call a
        # free-form value: their check may refuse the plan.
        given = [text.startswith("(?:") and text[3:-1] in rewriter.dfa_texts for text in every]
        order = sorted(range(len(every)), key=lambda a: (not given[a], call not in every[a]))
        # the rules not built by an earlier plan (kept in `dfas`; maybe gone from the memo)
        ahead = [
            every[a] for a in order if not given[a] and (every[a], len(rules), value) not in dfas
        ]
        with _build_ahead(ahead, value):
            for a in order:
                text = every[a]
                if (text, len(rules), value) not in dfas:
                    dfas[text, len(rules), value] = (
                        _inlined_rule_edges(text, len(rules), ws)
                        if value and call in text
                        else _rule_automaton(rewriter, text, len(rules), value)
                    )
                built[a] = dfas[text, len(rules), value]
                if call in text:
                    _check_value_calls(*built[a], "schema" if a == 0 else f"rule{a - 1}")
                positions = sum(dfa.num_states for dfa, _ in built.values())
                if positions > max_before_tails:  # refused before the other rules
                    raise TooManyPositions(positions, len(rules), max_positions)
        automata = [built[a] for a in range(len(every))]
        bad = _nondeterministic_calls(automata, len(rules))
        if not bad:
            if rewriter.recursive:
                _check_productive(automata, len(rules))
            break
        banned |= {rules[r] for r in bad}
        for r in bad:
            if rules[r] in promoted:
                parent = promoted[rules[r]]
                frozen[parent] = {c for c, p in promoted.items() if p == parent} - banned
    else:
        raise NotDeterministic("the schema's rules cannot be called deterministically")
    plain = automata
    # Sharing tails keeps every state of the largest automaton (its head stays, its tail
    # becomes a rule): over the limit already, the form is refused before that search, which
    # takes minutes on 60,000 states (MaskBench o82710's 5,000-character string).
    largest = max(dfa.num_states for dfa, _ in automata)
    if largest > max_positions:
        raise TooManyPositions(
            sum(dfa.num_states for dfa, _ in automata), len(automata) - 1, max_positions
        )
    automata, _ = _shared_tails(automata, len(rules), value)
    positions = sum(dfa.num_states for dfa, _ in automata)
    if positions > max_positions:
        raise TooManyPositions(positions, len(automata) - 1, max_positions)

    def build(automata: list):
        names = ["schema"] + [f"rule{i}" for i in range(len(automata) - 1)]
        return build_pushdown(
            _free_value_grammar(ws) if value else None,
            vocabulary,
            stack_depth=stack_depth,
            rules=[(name, dfa, calls) for name, (dfa, calls) in zip(names, automata)],
            description=f"json schema {_describe(schema)} (grammar, {len(automata) - 1} rules)",
        )

    try:
        automaton = build(automata)
    except NotDeterministic:
        # a shared tail returns to the return positions of all its callers together, where a
        # one-byte lookahead may no longer decide when to return: the rules without them
        if automata is plain:
            raise
        automaton = build(plain)
    if len(_PUSHDOWN_CACHE) >= 16:
        _PUSHDOWN_CACHE.pop(next(iter(_PUSHDOWN_CACHE)))
    _PUSHDOWN_CACHE[key] = automaton
    return automaton


def json_schema_compile(
    schema,
    vocabulary: TokenVocabulary,
    *,
    cache: bool = True,
    stack_depth: int = DEFAULT_STACK_DEPTH,
    **options,
):
    """The automaton `JsonSchema` runs for one schema, chosen automatically: the token
    automaton of the schema's single regex (`json_schema_automaton`: smaller and faster) while
    that regex has at most `GRAMMAR_REGEX` characters (with the automata of length-bounded
    strings that no compact regex writes spliced in, `_spliced_dfa`), else the grammar form
    (`json_schema_grammar`, a `PushdownAutomaton`), whose free-form values nest as deep as the
    stack unless `free_form_depth=0` (a call of its JSON value rule, where that stays
    deterministic; else nested `free_form_depth` levels as in the regex). With
    `free_form_depth=None` (the default, `DEFAULT_FREE_FORM_DEPTH`), the pushdown automaton of
    `json_schema_pushdown` when the schema has free-form values; an integer nests them that
    many levels in the token automaton.

    **Arguments:** `schema`, `vocabulary`; `cache`: use the caches (the token automaton's
    memory and disk caches; the pushdown automata are memoised in memory only: `False` empties
    that memo first for the grammar form and bypasses it for `json_schema_pushdown`);
    `stack_depth`: of a
    pushdown automaton; `options`: those of `json_schema_regex`.

    With `max_recursion_depth=None` (`JsonSchema`'s default; absent counts as `None`), a
    schema with recursive references compiles first to the grammar form with each recursive
    reference a call of its target's rule (`_recursive_grammar`): nesting is bounded by
    `stack_depth`; when that fails (a call one byte cannot choose, a recursion that never
    ends, one through `allOf` merges) the references are unrolled
    `DEFAULT_MAX_RECURSION_DEPTH` times and compiled as above, with the same result as without
    the attempt. An integer `max_recursion_depth` unrolls that many times, as
    `json_schema_regex` does (a token automaton while the regex is small: what `per_row`
    needs).

    **Returns:** a `TokenAutomaton` or a `PushdownAutomaton`.

    **Raises:** as `json_schema_regex` and `json_schema_grammar`. (With `free_form_depth=None`,
    a free-form value whose call competes with other text for a byte is read in place there,
    level by level while it competes (`_inline_value_calls`); if a call still competes
    `_VALUE_CALL_LEVELS` levels down, or the grammar form is too large, it falls back to depth
    2, else `NESTED_FREE_FORM_DEPTH` (`_FALLBACK_DEPTHS`), with a `UserWarning` that names the
    depth, as `JsonSchema` does.)
    """
    token_only = options.pop("_token_automaton_only", False)
    if not cache:
        _PUSHDOWN_CACHE.clear()
    if options.get("max_recursion_depth") is None:
        options.pop("max_recursion_depth", None)
        recursive = _recursive_grammar(schema, vocabulary, stack_depth, options)
        if recursive is not None:
            return recursive
    free = options.get("free_form_depth", DEFAULT_FREE_FORM_DEPTH)
    call = _CALL if free is None else None
    rewriter, regex = _rewrite(
        schema,
        **{**options, "free_form_depth": call if call is not None else free},
        counted_strings=True,
    )

    def nest_instead(
        error: NotDeterministic | TooManyPositions | RegexTooLarge, dropped_warned=False
    ):
        """A free-form value's call competes with other text for its first byte deeper than
        `_inline_value_calls` reads it in place (`error` a `NotDeterministic`), or the grammar
        form is too large: the values nested 2 levels where that is a token automaton of a
        single regex within `SINGLE_REGEX`, else `NESTED_FREE_FORM_DEPTH` level(s)
        (`_FALLBACK_DEPTHS`), with a warning that names the depth. A recursive schema is not
        tried deeper: its fallback may still be a pushdown automaton whose recursion nests as
        deep as the stack, which a token automaton would unroll `DEFAULT_MAX_RECURSION_DEPTH`
        times. `dropped_warned`: the
        `strict=False` warning was given already (not repeated)."""

        def warn(depth: int):
            warnings.warn(
                f"JSON Schema: no pushdown automaton ({error}); free-form values nest at most "
                f"{depth} level(s)",
                UserWarning,
                stacklevel=4,
            )

        depths = (NESTED_FREE_FORM_DEPTH,) if _recurses(schema) else _FALLBACK_DEPTHS
        for depth in depths:
            deeper = depth != depths[-1]
            try:
                with warnings.catch_warnings():
                    if dropped_warned:
                        warnings.filterwarnings("ignore", r"JSON Schema: \d+ keyword\(s\) cannot")
                    automaton = json_schema_compile(
                        schema,
                        vocabulary,
                        cache=cache,
                        stack_depth=stack_depth,
                        **{**options, "free_form_depth": depth},
                        **({"_token_automaton_only": True} if deeper else {}),
                    )
            except (ConstraintError, NotDeterministic):
                if deeper:  # too large that deep: the last depth's result or refusal stands
                    continue
                warn(depth)  # (the refusal follows)
                raise
            warn(depth)
            return automaton
        raise AssertionError("unreachable")

    full: str | None
    try:
        full = rewriter.substitute(regex, limit=SINGLE_REGEX)
        if (
            call is not None
            and _dfa_placeholders(rewriter, full)
            and escape(FREE_VALUE_CALL) in full
        ):
            full = None  # the grammar form calls both
    except RegexTooLarge:
        full = None
    weight = rewriter.weight(regex)
    if full is not None and weight > SINGLE_REGEX_WEIGHT:
        full = None  # its counted copies written out are too many states for outlines-core
    if token_only and full is None:
        raise NotTokenAutomaton("the single regex is too large for a token automaton")
    if not token_only and (full is None or len(full) > GRAMMAR_REGEX or weight > GRAMMAR_REGEX):
        if not cache:
            _PUSHDOWN_CACHE.clear()
        hopeless = _strings_too_large(rewriter, regex, full is not None)
        if free and call is None and hopeless is None:
            # The grammar form is a pushdown automaton already: its free-form values are a call
            # of the JSON value rule, nested as deep as the stack, at no cost over depth 1
            # (15 MaskBench grammar forms: positions -54 each, compile times within noise;
            # Kubernetes kb_972's valid instance with a deeper value accepted).
            try:
                return json_schema_grammar(
                    schema,
                    vocabulary,
                    stack_depth=stack_depth,
                    **{**options, "free_form_depth": None},
                )
            except (NotDeterministic, RegexTooLarge):
                pass  # a free-form value where other text may also start (or, its rules
                # inlined where their calls compete, too large: MaskBench jsonld)
        try:
            if hopeless is not None:
                raise hopeless
            return json_schema_grammar(
                schema,
                vocabulary,
                stack_depth=stack_depth,
                _rewritten=(rewriter, regex),
                _over_regex=full is not None,
                **options,
            )
        except (TooManyPositions, NotDeterministic, RegexTooLarge) as e:
            if full is not None:
                pass  # the single regex is within `SINGLE_REGEX`: compiled below
            elif call is None:
                raise
            else:
                # A string automaton spliced beside a free-form value (the token automaton
                # cannot call) made the grammar form too large, or a call competes with other
                # text (or its rules, inlined where their calls compete, are too large:
                # MaskBench jsonld): nest the values as the default does.
                return nest_instead(e)
    assert full is not None
    _warn_dropped(rewriter)
    if _dfa_placeholders(rewriter, full):
        too_large = _spliced_too_large(rewriter, full, weight)
        if too_large is not None:
            raise too_large
        description = f"json schema {_describe(schema)}"
        return cached(
            "json-spliced",
            full,
            vocabulary,
            lambda: lift(_spliced_dfa(rewriter, full), vocabulary, description),
            cache=cache,
        )
    if call is not None and escape(FREE_VALUE_CALL) in full:
        options.pop("free_form_depth", None)
        try:
            # `full` is `json_schema_regex(free_form_depth=_CALL)`'s regex: it has no spliced
            # automaton, so the counted strings are the same counted repeats.
            return _pushdown_of_regex(
                full,
                schema,
                vocabulary,
                stack_depth,
                options.get("whitespace_pattern"),
                cache,
            )
        except NotDeterministic as e:
            return nest_instead(e, dropped_warned=True)
    return regex_automaton(
        full, vocabulary, cache=cache, description=f"json schema {_describe(schema)}"
    )


def _strings_too_large(
    rewriter: _Rewriter, regex: str, over_regex: bool
) -> TooManyPositions | None:
    """The refusal of every grammar form of `regex` that its strings given as automata
    (`_Rewriter.dfa_terminals`) already imply, before any rule is built: one of them alone has
    more states than the positions a form may have before its tails are shared
    (`MAX_POSITIONS_BEFORE_TAILS`, times `OVER_REGEX_SCALE` when `over_regex`). Each is a rule
    of the grammar form, and written as a counted regex it needs as many states inside its
    rule: no form can do with fewer (MaskBench o1052, a 5,000-character string of 60,003
    states: refused in 2 s instead of after a 7.5 s rule). `None` when no string is that large.
    """
    limit = (OVER_REGEX_SCALE if over_regex else 1) * MAX_POSITIONS_BEFORE_TAILS
    for name in sorted(rewriter.markers(regex) & rewriter.dfa_terminals.keys()):
        placeholder, path, keyword = rewriter.dfa_terminals[name]
        states = rewriter.dfa_texts[placeholder].num_states
        if states > limit:
            what = f"the string automaton of `{keyword}` at {path} has {states:,} states"
            return TooManyPositions(states, 1, limit, what)
    return None


def _recurses(schema) -> bool:
    """Whether `schema` (as `json_schema_compile` takes it) has a recursive reference: a quick
    test before the checks and the rewrite (most schemas have no `$ref` at all; the others are
    inlined once more, without the metaschema check). `False` for a schema these steps refuse
    (the unrolled path then reports it)."""
    try:
        schema = schema_as_dict(schema)
        if '"$ref"' not in json.dumps(schema):
            return False
        return bool(inline_references(schema, 1, recursive=True)[1])
    except (ValueError, TypeError, RecursionError):
        return False


def _recursive_grammar(schema, vocabulary, stack_depth: int, options: dict):
    """For `json_schema_compile`: the grammar form of a schema with recursive references, each
    recursive target a rule and each recursive reference a call of it
    (`inline_references(recursive=True)`), so that recursion nests as deep as the stack
    (`stack_depth`) instead of `max_recursion_depth` unrolled levels; free-form values are
    calls of the JSON value rule too (unless `free_form_depth=0`; where a call competes with
    other text, read in place there, `_inline_value_calls`); when that form is refused, an
    integer `free_form_depth` is tried next, its values nested that many levels.

    **Returns:** the `PushdownAutomaton`, or `None` when the schema has no recursive reference
    or its recursion cannot be rules (a recursive call that a one-byte lookahead cannot choose,
    `NotDeterministic`; a recursion that never ends; any other error of the grammar form, which
    the unrolled path then reports or avoids): the caller unrolls it as before, so every schema
    that compiles unrolled still compiles. Warnings of an attempt that returns `None` are
    dropped (the unrolled path gives its own)."""
    if not _recurses(schema):
        return None
    free = options.get("free_form_depth", DEFAULT_FREE_FORM_DEPTH)
    attempts = [_CALL] if free is None else [_CALL, free] if free else [0]
    for depth in attempts:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                rewritten = _rewrite(
                    schema,
                    **{**options, "free_form_depth": depth},
                    counted_strings=True,
                    recursive=True,
                )
                if rewritten is None or not rewritten[0].recursive:
                    return None  # nothing recurses (or every recursive call was left out)
                rewriter, regex = rewritten
                automaton = json_schema_grammar(
                    schema,
                    vocabulary,
                    stack_depth=stack_depth,
                    _rewritten=(rewriter, regex),
                    **{
                        **options,
                        "free_form_depth": None if isinstance(depth, _FreeValueCall) else depth,
                    },
                )
            except (NotDeterministic, RegexTooLarge):
                continue  # a call one byte cannot choose, or rules inlined too large
            except (ValueError, RecursionError):  # ConstraintError, GrammarError, too deep
                return None
        for warning in caught:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
        return automaton
    return None


_PUSHDOWN_CACHE: dict = {}


class JsonSchema(AbstractConstraint):
    """Constrain the generated text to be a JSON document valid under a JSON Schema.

    The schema is checked and turned into a regex (`json_schema_regex`: outlines-core's
    conversion plus exact integer/number ranges, strict formats, JSON-safe string patterns,
    merged `allOf`), then compiled like `Regex`. Properties come in the order of the schema
    (members beside `allOf`/`anyOf`/`oneOf`/`$ref` in the order of those keywords in its text,
    as llguidance orders them;
    `property_order="schema_or_required_first"` also accepts the required ones first,
    `"any"` any order for small objects);
    optional properties may be left out; whitespace between tokens is none or one space by
    default. Recursive `$ref`s are calls of a rule of a pushdown automaton, nested as deep as
    `stack_depth` allows, where that runs deterministically (`json_schema_compile`); otherwise,
    for a list of schemas, and with an integer `max_recursion_depth`, they are unrolled:
    deeper nesting is not offered, so the output stays valid.

    Every row ends inside the language: the device mask only offers tokens after which the
    document can still be closed within the row's remaining `max_new_tokens` (when the
    schema's shortest document fits the budget at all; otherwise the row ends with finish
    reason `"constraint"`).

    !!! Example
        ```python
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                  "required": ["name", "age"]}
        person = fg.processors.JsonSchema(schema, tokenizer)
        ```

    **Arguments:**

    - `schema`: a dict, a JSON string or a pydantic model class; or a list with one per row
      (`None`: unconstrained row).
    - `tokenizer`, `eos_token_id`, `vocab_size`: as in `Regex`.
    - `whitespace_pattern`: regex of the whitespace allowed between JSON tokens (default
      `[ ]?`). Pass `""` for compact JSON.
    - `max_recursion_depth`: `None` (default): recursive references are rules, as deep as the
      stack, where that is deterministic (a pushdown automaton, which `per_row` cannot combine
      with other constraints), else unrolled `DEFAULT_MAX_RECURSION_DEPTH` (3) times; an
      integer: unrolled that many times (a token automaton for a small schema).
    - `free_form_depth`: how deep free-form values (`{}`, additional properties of open
      objects, arrays without `items`) nest. `None` (default, `DEFAULT_FREE_FORM_DEPTH`): as
      deep as the stack of a pushdown automaton allows (`json_schema_pushdown`), when the
      schema has such values and one can be built (otherwise 2 levels in a token automaton
      where its single regex is small enough, else `NESTED_FREE_FORM_DEPTH` = 1, with a
      `UserWarning` that says why and how deep); an integer: that many levels in the token
      automaton; a list of schemas nests them 1 level. The grammar form below, a pushdown
      automaton anyway, nests them as deep as the stack for any depth but 0. The pushdown
      form keeps `max_new_tokens` as the token automaton does (rows end inside the language),
      its decode step costs the same within noise and it compiles as fast as depth 1 (see
      `DEFAULT_FREE_FORM_DEPTH`). `per_row` uses its token form (with a warning).
    - `stack_depth`: stack slots of the pushdown automaton (default 32).
    - `property_order`: `"schema"` (default), `"schema_or_required_first"` or `"any"`, see
      `PROPERTY_ORDERS`.

    The automaton is chosen automatically (`json_schema_compile`): a single schema whose regex
    would exceed `GRAMMAR_REGEX` characters compiles to its grammar form, a pushdown
    automaton whose rules are its large subschemas (`json_schema_grammar`); a list of schemas
    (one per row) always uses token automata. A `pattern` or `format` with
    `minLength`/`maxLength` is exact (lengths in decoded characters): when no compact regex
    writes it, its automaton (the string's DFA times a character counter) is spliced into the
    schema's, which a list of schemas cannot do (refused there with the reason). Numbers with
    decimal bounds (`minimum: 0.5`) are exact too, written without exponents. The grammar
    form's rule automata are built on one thread per core (at most 4; outlines-core builds a
    DFA without the GIL): the result is the same as built one by one.

    **Raises:** `UnsupportedSchemaError` (a `ValueError`) naming the keyword and its location
    (e.g. `not`, `uniqueItems`, `multipleOf: 5`, an unknown `format`) before any compilation,
    or naming a length-bounded string whose automaton, spliced in, would take the schema's over
    150,000 states (`MAX_SPLICED_STATES`; estimated from the regex before its DFA is built);
    `ConstraintError` for a schema too large even for the grammar form (over 10,000 automaton
    positions, `MAX_GRAMMAR_POSITIONS`: its token tables would take more than seconds);
    `ValueError` for invalid JSON text; `TypeError` for a schema of another type.

    Source: outlines-core `json_schema.build_regex_from_schema`; JSON Schema 2020-12.
    """

    tables: ConstraintTables
    constraint_id: Int[Array, "*rows"] = per_row_field()

    def __init__(
        self,
        schema,
        tokenizer,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        vocab_size: int | None = None,
        whitespace_pattern: str | None = None,
        max_recursion_depth: int | None = None,
        strict: bool = True,
        closed_objects: bool = False,
        free_form_depth: int | None = DEFAULT_FREE_FORM_DEPTH,
        stack_depth: int = DEFAULT_STACK_DEPTH,
        property_order: str = "schema",
    ):
        @typing.no_type_check
        def is_single(s):
            return isinstance(s, (Mapping, str, bool)) or (
                isinstance(s, type) and hasattr(s, "model_json_schema")
            )

        schemas, ids = rows_of(
            schema,
            is_single,
            "schema",
            "a JSON Schema (a dict, JSON text or a pydantic model class)",
        )
        if len(schemas) == 1:
            vocabulary = vocabulary_from_tokenizer(
                tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size
            )
            automaton = json_schema_compile(
                schemas[0],
                vocabulary,
                stack_depth=stack_depth,
                whitespace_pattern=whitespace_pattern,
                max_recursion_depth=max_recursion_depth,
                strict=strict,
                closed_objects=closed_objects,
                free_form_depth=free_form_depth,
                property_order=property_order,
            )
            self.constraint_id = jnp.asarray(ids, jnp.int32)
            if isinstance(automaton, PushdownAutomaton):
                options = dict(
                    whitespace_pattern=whitespace_pattern,
                    strict=strict,
                    closed_objects=closed_objects,
                    property_order=property_order,
                    free_form_depth=(
                        NESTED_FREE_FORM_DEPTH if free_form_depth is None else free_form_depth
                    ),
                    max_recursion_depth=(
                        DEFAULT_MAX_RECURSION_DEPTH
                        if max_recursion_depth is None
                        else max_recursion_depth
                    ),
                )
                source = schemas[0]
                recipe = register_token_recipe(
                    lambda: regex_automaton(
                        json_schema_regex(source, **options),
                        vocabulary,
                        description=f"json schema {_describe(source)}",
                    ),
                    f"free-form values nest {options['free_form_depth']} level(s), recursive "
                    f"references unrolled {options['max_recursion_depth']} times",
                )
                self.tables = pushdown_tables(automaton, ids, token_recipe=recipe)
            else:
                self.tables = automata_tables([automaton])
            return
        if free_form_depth is None:
            free_form_depth = NESTED_FREE_FORM_DEPTH  # one token automaton per row
        if max_recursion_depth is None:
            max_recursion_depth = DEFAULT_MAX_RECURSION_DEPTH  # unrolled in token automata
        regexes = [
            json_schema_regex(
                s,
                whitespace_pattern=whitespace_pattern,
                max_recursion_depth=max_recursion_depth,
                strict=strict,
                closed_objects=closed_objects,
                free_form_depth=free_form_depth,
                property_order=property_order,
            )
            for s in schemas
        ]
        vocabulary = vocabulary_from_tokenizer(
            tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size
        )
        automata = [
            regex_automaton(r, vocabulary, description=f"json schema {_describe(s)}")
            for s, r in zip(schemas, regexes)
        ]
        self.tables = automata_tables(automata)
        self.constraint_id = jnp.asarray(ids, jnp.int32)


def _describe(schema) -> str:
    if isinstance(schema, type):
        return schema.__name__
    text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
