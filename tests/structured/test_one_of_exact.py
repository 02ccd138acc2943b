"""Exact `oneOf` over overlapping regular branches (`json_schema/exact_one_of.py`) and the
byte-DFA operations under it (`dfa_operations.py`, `patterns.dfa_regex` over UTF-8), judged
by `jsonschema` on documents sampled from the automata and on hand-made boundary values."""

import decimal
import itertools
import json
import re

import jsonschema
import numpy as np
import pytest

from functional_gen.structured.automaton import ConstraintError
from functional_gen.structured.byte_dfa import REJECT, minimize, regex_byte_dfa, trim
from functional_gen.structured.dfa_operations import (
    canonical_json_dfa,
    compact_json_dfa,
    exactly_one_dfa,
    spaced_json_dfa,
)
from functional_gen.structured.json_schema import (
    UnsupportedSchemaError,
    json_schema_compile,
    json_schema_regex,
)
from functional_gen.structured.patterns import dfa_regex, intersect_dfas

from .helpers import random_walk

ONE_OF = {
    # integers against numbers from 5: 5, 6, ... match both
    "integer_vs_minimum": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 5}]},
    # no `type` in the second: its non-numbers (free-form objects and arrays included) are its
    # own, only the numbers overlap
    "integer_vs_untyped_minimum": {"oneOf": [{"type": "integer"}, {"minimum": 5}]},
    "overlapping_ranges": {
        "oneOf": [
            {"type": "integer", "minimum": 0, "maximum": 20},
            {"type": "integer", "minimum": 10},
            {"type": "number", "exclusiveMaximum": 3},
        ]
    },
    "overlapping_patterns": {
        "oneOf": [
            {"type": "string", "pattern": "^a"},
            {"type": "string", "pattern": "b$"},
            {"type": "string", "maxLength": 2},
        ]
    },
    "strings_and_constants": {
        "oneOf": [{"type": "string"}, {"enum": ["x", 3, None]}, {"type": ["null", "boolean"]}]
    },
}

BOUNDARIES = {
    "integer_vs_minimum": [4, 5, 6, 4.5, 5.5, 5.0, -7, 0, "5", None],
    "integer_vs_untyped_minimum": [4, 5, 4.5, 5.5, "s", None, True, [1], {"a": 1}],
    "overlapping_ranges": [-1, 0, 2, 2.5, 3, 9, 10, 20, 21, -0.5, 10.5],
    "overlapping_patterns": ["", "a", "b", "ab", "ba", "abc", "axb", "cb", "é", "aéb", "x"],
    "strings_and_constants": ["x", "y", 3, 4, None, True, False, [], {}],
}


OBJECTS = {
    # `{}` and `{"t": "a", ...}` match both or neither: t required, or t "a" if present
    "closed_required_vs_const": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"t": {"type": "string"}, "n": {"type": "integer"}},
        "oneOf": [{"required": ["t"]}, {"properties": {"t": {"const": "a"}}}],
    },
    # a count against a required name, three members in any order
    "count_vs_required": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "null"}},
        "oneOf": [{"minProperties": 2}, {"required": ["a"], "maxProperties": 2}],
    },
    # nested: the inner objects of both overlap where they hold one member
    "nested": {
        "type": "object",
        "additionalProperties": False,
        "required": ["p"],
        "properties": {
            "p": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"x": {"type": "integer"}, "y": {"type": "boolean"}},
            }
        },
        "oneOf": [
            {"properties": {"p": {"maxProperties": 1}}},
            {"properties": {"p": {"required": ["y"]}}},
        ],
    },
    # arrays: integers up to three, or an integer from 2 then strings
    "arrays": {
        "oneOf": [
            {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
            {
                "type": "array",
                "prefixItems": [{"type": "integer", "minimum": 2}],
                "items": {"type": "string"},
            },
        ]
    },
}

_MEMBERS = {"t": ["a", "b"], "n": [1], "a": [1], "b": ["s"], "c": [None], "p": [{}]}


def _object_boundaries(name):
    """Every subset of the schema's listed members, in every order, with each listed value
    (compact texts), and a few arrays."""
    if name == "arrays":
        return [[], [1], [5], [1, 2, 3], [1, 2, 3, 4], [5, "x"], [1, "x"], ["x"], [5, "x", "y"]]
    if name == "nested":
        inner = {"x": 1, "y": True}
        return [
            {"p": {k: inner[k] for k in keys}}
            for n in range(3)
            for keys in itertools.permutations(inner, n)
        ] + [{}]
    names = list(OBJECTS[name]["properties"])
    out = []
    for n in range(len(names) + 1):
        for keys in itertools.permutations(names, n):
            for values in itertools.product(*(_MEMBERS[k] for k in keys)):
                out.append(dict(zip(keys, values)))
    return out


_WEIGHTS = np.full(256, 0.2)
_WEIGHTS[0x20:0x7F] = 1.0
_WEIGHTS[list(b'ab05"')] = 30.0  # the bytes the schemas' boundaries turn on, often


def _sample(dfa, rng, *, stop: float = 0.25, soft_limit: int = 24) -> bytes:
    """A random path of a trimmed byte DFA from its initial state to an accepting one: at an
    accepting state it stops with probability `stop`; each step takes a uniformly random
    allowed byte (`_WEIGHTS`), after `soft_limit` bytes one that gets nearest to acceptance."""
    delta, accepting = dfa.delta, dfa.accepting
    distance = np.where(accepting, 0, np.iinfo(np.int64).max)
    for _ in range(dfa.num_states):  # Bellman-Ford rounds of "one byte to a nearer state"
        reach = np.where(delta != REJECT, distance[np.maximum(delta, 0)], np.iinfo(np.int64).max)
        better = np.minimum(distance, np.where(reach.min(1) < 2**62, reach.min(1) + 1, 2**62))
        if (better == distance).all():
            break
        distance = better
    state, out = dfa.initial, bytearray()
    while True:
        allowed = np.flatnonzero(delta[state] != REJECT)
        ending = rng.random() < stop or len(out) >= soft_limit or not allowed.size
        if accepting[state] and ending:
            return bytes(out)
        if len(out) >= soft_limit:
            nearest = distance[delta[state, allowed]]
            allowed = allowed[nearest == nearest.min()]
        weights = _WEIGHTS[allowed] / _WEIGHTS[allowed].sum()
        byte = int(rng.choice(allowed, p=weights))
        out.append(byte)
        state = int(delta[state, byte])


def _value(text):
    """The JSON value of `text`, numbers with a fraction exact (`Decimal`: JSON numbers have
    arbitrary precision, and `5061918279454995.4` is no integer though its float is)."""
    return json.loads(text, parse_float=decimal.Decimal)


def _dfa(schema):
    return trim(minimize(regex_byte_dfa(json_schema_regex(schema))))


@pytest.mark.parametrize("name", sorted(ONE_OF))
def test_sampled_documents_match_exactly_one_branch(name):
    # every document sampled from the exact automaton is valid (exactly one branch matches);
    # every canonical document sampled from the same schema read as `anyOf` (every candidate)
    # is accepted exactly when jsonschema says it matches exactly one branch
    schema = ONE_OF[name]
    validator = jsonschema.Draft202012Validator(schema)
    exact = _dfa(schema)
    union = _dfa({"anyOf": schema["oneOf"]})
    rng = np.random.default_rng(0)
    for _ in range(150):
        text = _sample(exact, rng).decode()
        assert validator.is_valid(_value(text)), text
    verdicts = set()
    for _ in range(300):
        data = _sample(union, rng)
        if not canonical_json_dfa().matches(data):
            continue  # a non-canonical spelling (`5.0`): refused by the exact form, see below
        valid = validator.is_valid(_value(data))
        assert exact.matches(data) == valid, (data, valid)
        verdicts.add(valid)
    assert verdicts == {True, False}  # both sides exercised


def _assert_decided_as_jsonschema(schema, values):
    """The schema's regex accepts each value's compact text, and an object's or array's text
    spaced as `json.dumps` spaces it by default (`{"a": [1, 2]}`), exactly when jsonschema
    validates it, and both verdicts occur."""
    validator = jsonschema.Draft202012Validator(schema)
    regex = re.compile(json_schema_regex(schema))
    verdicts = set()
    for value in values:
        valid = validator.is_valid(value)
        for separators in ((",", ":"), (", ", ": ")):
            text = json.dumps(value, separators=separators, ensure_ascii=False)
            assert bool(regex.fullmatch(text)) == valid, (text, valid)
        verdicts.add(valid)
    assert verdicts == {True, False}


@pytest.mark.parametrize("name", sorted(BOUNDARIES))
def test_boundary_values_are_decided_as_jsonschema_does(name):
    _assert_decided_as_jsonschema(ONE_OF[name], BOUNDARIES[name])


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_overlapping_objects_and_arrays_are_exact_in_any_order(name):
    # hand-made boundaries: every member subset in every order; then documents sampled from
    # the exact automaton (all valid) and from the `anyOf` reading (compact ones accepted
    # exactly when jsonschema says one branch matches)
    schema = OBJECTS[name]
    _assert_decided_as_jsonschema(schema, _object_boundaries(name))
    validator = jsonschema.Draft202012Validator(schema)
    exact, union = _dfa(schema), _dfa({**schema, "anyOf": schema["oneOf"], "oneOf": [{}]})
    rng = np.random.default_rng(2)
    for _ in range(60):
        text = _sample(exact, rng, soft_limit=40).decode()
        assert validator.is_valid(_value(text)), text
    union = trim(intersect_dfas(union, compact_json_dfa(), max_states=10**5))
    for _ in range(150):  # (both verdicts: the boundaries above)
        data = _sample(union, rng, soft_limit=40)
        valid = validator.is_valid(_value(data))
        assert exact.matches(data) == valid, (data, valid)


def test_non_canonical_spellings_of_an_overlap_are_refused():
    # 5.0 is an integer to jsonschema (it matches both branches) though no integer regex
    # reads it; -0 is 0; "\u0061" is "a": the exact form keeps only canonical spellings where
    # branches overlap, never accepting a value that matches two
    regex = re.compile(json_schema_regex(ONE_OF["integer_vs_minimum"]))
    assert not regex.fullmatch("5.0") and not regex.fullmatch("5.50")
    assert not regex.fullmatch("5e0") and regex.fullmatch("5.5")
    strings = {"oneOf": [{"const": "a"}, {"type": "string", "maxLength": 3}]}
    validator = jsonschema.Draft202012Validator(strings)
    regex = re.compile(json_schema_regex(strings))
    assert not validator.is_valid("a") and not regex.fullmatch('"a"')
    assert not regex.fullmatch('"\\u0061"') and not regex.fullmatch('"\\/"')
    assert regex.fullmatch('"ab"') and regex.fullmatch('"\\n"')


def test_token_automaton_of_the_default_compile_samples_valid_documents(vocabulary):
    # the default form (free-form values as calls of the pushdown form) with an exact `oneOf`
    # of numbers beside the untyped branch's free-form objects and arrays
    schema = ONE_OF["integer_vs_untyped_minimum"]
    automaton = json_schema_compile(schema, vocabulary)
    validator = jsonschema.Draft202012Validator(schema)
    rng = np.random.default_rng(1)
    kinds = set()
    for _ in range(40):
        text = _token_walk(automaton, vocabulary, rng, budget=12)
        assert validator.is_valid(_value(text)), text
        kinds.add(type(_value(text)).__name__)
    assert {"int", "float"} & kinds and len(kinds) >= 3  # numbers and the branch's others


def _token_walk(automaton, vocabulary, rng, *, budget: int) -> str:
    """A uniformly random token path through a `PushdownAutomaton` (as `random_walk` for a
    `TokenAutomaton`), ending at EOS or when the budget is spent."""
    if not hasattr(automaton, "can_end"):
        return random_walk(automaton, vocabulary, rng, budget=budget)
    config, out = (automaton.initial, ()), b""
    for step in range(budget):
        token = int(rng.choice(np.flatnonzero(automaton.allowed(config, budget - step))))
        if token in vocabulary.eos_token_id:
            break
        out += vocabulary.token_bytes[token]
        config = automaton.walk(vocabulary.token_bytes[token], config)
    assert automaton.can_end(config)
    return out.decode()


def test_overlapping_objects_and_recursion_are_refused_by_name(vocabulary):
    open_objects = {
        "type": "object",
        "oneOf": [
            {"properties": {"t": {"enum": ["a"]}}},
            {"properties": {"t": {"enum": ["b"]}}},
        ],
    }
    with pytest.raises(UnsupportedSchemaError, match="free-form value") as caught:
        json_schema_regex(open_objects)
    assert "#/oneOf/0" in str(caught.value) and "#/oneOf/1" in str(caught.value)
    # closed objects are exact in any order (`OBJECTS`), not when read in the schema's order
    # only, nor where additional members may repeat a key
    closed = OBJECTS["closed_required_vs_const"]
    with pytest.raises(UnsupportedSchemaError, match="objects of #/oneOf/0, #/oneOf/1") as caught:
        json_schema_regex(closed, property_order="schema")
    assert "in one order" in str(caught.value)
    with pytest.raises(UnsupportedSchemaError, match="does not match the empty text"):
        json_schema_regex(closed, whitespace_pattern="[ ]")  # compact texts: none
    typed_extras = {**closed, "additionalProperties": {"type": "integer"}}
    with pytest.raises(UnsupportedSchemaError, match="keys may repeat"):
        json_schema_regex(typed_extras)
    listed = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "p": {"type": "object"}},
        "oneOf": [{"properties": {"p": {"const": {"a": 1, "b": 2}}}}, {"required": ["n"]}],
    }
    with pytest.raises(UnsupportedSchemaError, match="order of their keys"):
        json_schema_regex(listed, closed_objects=True)
    recursive = {
        "$defs": {"tree": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
        "oneOf": [{"$ref": "#/$defs/tree"}, {"type": "array", "maxItems": 1}],
    }
    # unrolled to a depth, the tree's deeper values would be refused by its automaton
    with pytest.raises(UnsupportedSchemaError, match="cut at max_recursion_depth"):
        json_schema_regex(
            {**recursive, "oneOf": [{"$ref": "#/$defs/tree"}, {"type": "array", "items": False}]}
        )
    # (its recursion as rules is refused, then unrolled: arrays of both branches overlap)
    with pytest.raises(UnsupportedSchemaError, match="arrays of #/oneOf/0, #/oneOf/1"):
        json_schema_compile(recursive, vocabulary)
    # strict=False keeps it as `anyOf`, with the reason in the warning
    with pytest.warns(UserWarning, match="oneOf"):
        json_schema_regex(open_objects, strict=False)


def test_exactly_one_dfa_against_brute_force():
    regexes = ["a*b?", "(ab)*", "a{1,3}|b", "[ab]{2}"]
    dfas = [regex_byte_dfa(r) for r in regexes]
    words = [
        "".join(w) for n in range(6) for w in itertools.product("ab", repeat=n)
    ]  # every word over {a, b} up to 5 letters
    for chosen in [dfas[:2], dfas[1:], dfas]:
        exact = exactly_one_dfa(chosen, max_states=1000)
        for word in words:
            count = sum(d.matches(word.encode()) for d in chosen)
            assert exact.matches(word.encode()) == (count == 1), word
    with pytest.raises(ConstraintError):
        exactly_one_dfa([dfas[0], dfas[0]], max_states=1000)
    with pytest.raises(ValueError, match="product states"):
        exactly_one_dfa(dfas, max_states=3)


def test_dfa_regex_writes_utf8_automata_as_code_point_classes():
    source = "(é|[а-я]+|😀x|[^\\x00-\\x7f]{2})z?"
    dfa = minimize(regex_byte_dfa(source))
    written = dfa_regex(dfa, max_chars=10_000)
    again = minimize(regex_byte_dfa(written))  # outlines-core reads it
    python = re.compile(written)  # and so does Python's `re`
    for text in ["é", "éz", "абв", "😀x", "😀", "ñ€z", "a", "ée", "ж"]:
        expected = re.fullmatch(source, text) is not None
        assert dfa.matches(text.encode()) == expected
        assert again.matches(text.encode()) == expected, text
        assert (python.fullmatch(text) is not None) == expected, text


def test_canonical_json_dfa_accepts_one_spelling_per_value():
    canonical = canonical_json_dfa()
    values = ['a\n\u0001"\\/é', 5, -5, 0.5, -0.5, 1.25, 100, [1, {"k": None}], True]
    for value in values:
        text = json.dumps(value, ensure_ascii=False)
        assert canonical.matches(text.encode()), text
    for other in ['"\\u0061"', '"\\/"', '"\\u001F"', '"\\u000a"', "5.0", "1e3", "-0", "0.10"]:
        assert not canonical.matches(other.encode()), other


def test_spaced_json_dfa_reads_the_schemas_whitespace_beside_structural_characters_only():
    compact = regex_byte_dfa(r'\{"a":\[(?:(?:-?[0-9]+|true)(?:,(?:-?[0-9]+|true))*)?\]\}')
    spaced = spaced_json_dfa(compact, "[ ]?", max_states=10**5)
    for value in ({"a": []}, {"a": [1, 23, True]}, {"a": [-4]}):
        for separators in ((",", ":"), (", ", ": ")):
            assert spaced.matches(json.dumps(value, separators=separators).encode())
    for text in (
        '{ "a" : [ 1 , true ] }',  # one space on either side of each structural character
        '{"a":[1 ]}',
    ):
        assert spaced.matches(text.encode()), text
    for text in (
        '{"a":[1 2]}',  # not 12: no whitespace inside a number
        '{"a":[tr ue]}',
        '{"a":[- 1]}',
        ' {"a":[]}',  # the enclosing regex writes what comes before and after
        '{"a":[]} ',
        '{"a":  []}',  # two spaces: one `[ ]?` between two tokens
        '{"a":\n[]}',
        '{"a":[1,2,]}',  # what the compact automaton refuses stays refused
    ):
        assert not spaced.matches(text.encode()), text
