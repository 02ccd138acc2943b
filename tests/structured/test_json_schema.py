"""JSON Schema: every document the automaton can produce validates (jsonschema, with formats;
pydantic for models); what cannot be enforced is refused with the keyword named."""

import collections
import itertools
import json
import re

import jsonschema
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured import UnsupportedSchemaError, json_schema_regex, regex_automaton
from functional_gen.structured.json_schema import InvalidSchemaError, schema_as_dict
from functional_gen.structured.json_schema.property_order import (
    UNORDERED_FORMS,
    unordered_members,
)

from .cases import SCHEMAS
from .helpers import random_walk, validate_document


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_random_documents_validate(vocabulary, name):
    # Uniformly random tokens (multi-byte characters, escapes, odd spacing): a stress test of the
    # schema rewrites, independent of any model.
    schema = SCHEMAS[name][1]
    automaton = regex_automaton(json_schema_regex(schema), vocabulary)
    rng = np.random.default_rng(sum(map(ord, name)))
    for _ in range(6):
        text = random_walk(automaton, vocabulary, rng, budget=int(automaton.distance[1]) + 40)
        validate_document(text, schema)


@pytest.mark.parametrize(
    "schema,keyword",
    [
        ({"not": {"type": "string", "pattern": "a"}}, "not"),
        ({"type": "integer", "multipleOf": 7}, "multipleOf"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "string", "format": "idn-hostname"}, "format"),
        (
            {
                "type": "object",
                "patternProperties": {"^x": {"type": "integer"}},
                "propertyNames": {"maxLength": 3},
            },
            "propertyNames",
        ),
        ({"if": {"minLength": 3}, "then": {"maxLength": 5}}, "if"),
        (  # overlapping objects (overlapping numbers are exact: test_one_of_exact.py)
            {"type": "object", "oneOf": [{"required": ["a"]}, {"properties": {"a": {"const": 1}}}]},
            "oneOf",
        ),
        ({"type": "number", "minimum": float("inf")}, "minimum"),
        ({"type": "string", "pattern": "^(ab)+$", "maxLength": 50_000}, "pattern"),
        ({"type": "string", "pattern": "(?=a)"}, "pattern"),
        ({"$ref": "https://example.com/schema.json"}, "$ref"),
        ({"type": "array", "contains": {"const": 1}, "maxContains": 2}, "maxContains"),
        (
            {"type": "object", "dependentRequired": {k: ["z"] for k in "abcd"}},
            "dependentRequired",
        ),  # > 3
        (
            {
                "$defs": {
                    "n": {
                        "type": "object",
                        "properties": {"n": {"$ref": "#/$defs/n"}},
                        "required": ["n"],
                    }
                },
                "$ref": "#/$defs/n",
            },
            "$ref",
        ),
    ],
)
def test_unsupported_keywords_are_named(tokenizer, schema, keyword):
    with pytest.raises(
        UnsupportedSchemaError, match=f"keyword `{keyword.replace('$', '[$]')}`"
    ) as info:
        fg.processors.JsonSchema(schema, tokenizer)
    assert info.value.keyword == keyword


def test_bad_schema_values(tokenizer):
    with pytest.raises(ValueError, match="not valid JSON"):
        fg.processors.JsonSchema('{"type": ', tokenizer)
    with pytest.raises(TypeError, match="JSON Schema"):
        fg.processors.JsonSchema(42, tokenizer)


def test_outlines_core_gaps_are_closed():
    # outlines-core alone: integer bounds ignored, allOf concatenated, a recursion cut leaving
    # "{... ,}"; here each becomes exact.
    regex = json_schema_regex({"type": "integer", "minimum": 0, "maximum": 120})
    import re

    assert (
        re.fullmatch(regex, "120")
        and not re.fullmatch(regex, "121")
        and not re.fullmatch(regex, "-1")
    )
    merged = json_schema_regex(SCHEMAS["all_of"][1])
    assert re.fullmatch(merged, '{"name":"A","age":3,"title":"B"}') and "}{" not in merged.replace(
        "\\}\\{", "}{"
    )
    tree = json_schema_regex(SCHEMAS["tree"][1], max_recursion_depth=1)
    assert re.fullmatch(tree, '{"value":1,"children":[]}') and not re.fullmatch(
        tree, '{"value":1,}'
    )


def test_enum_values_of_other_types_are_dropped():
    import re

    regex = json_schema_regex({"type": "string", "enum": ["a", 1, None, "b"]})
    assert (
        re.fullmatch(regex, '"a"')
        and not re.fullmatch(regex, "1")
        and not re.fullmatch(regex, "null")
    )


def test_schema_inputs(tokenizer):
    from .cases import Movie

    as_dict = schema_as_dict(Movie)
    assert as_dict["properties"]["year"]["minimum"] == 1900
    text_schema = json.dumps(SCHEMAS["sentiment"][1])
    a = fg.processors.JsonSchema(text_schema, tokenizer)
    b = fg.processors.JsonSchema(SCHEMAS["sentiment"][1], tokenizer)
    np.testing.assert_array_equal(np.asarray(a.transitions), np.asarray(b.transitions))


def test_unknown_keywords_are_annotations():
    # JSON Schema 2020-12 core §4.3.1: unknown keywords are ignored (as jsonschema does).
    plain = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    noisy = {
        "type": "object",
        "id": "x",
        "_format": "y",
        "tpye": "string",
        "x-extra": 1,
        "properties": {"a": {"type": "integer", "javaName": "A", "_uniqueItems": True}},
        "required": ["a"],
    }
    assert json_schema_regex(noisy) == json_schema_regex(plain)


def test_a_draft_4_subschema_holding_a_boolean_schema_compiles():
    # JsonSchemaStore config.json: a draft-7 root whose subschemas name draft 4 in `$schema` and
    # hold `true`; `referencing` crawled them in draft 4's terms and raised a TypeError
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema",
        "type": "object",
        "properties": {
            "a": {
                "$schema": "http://json-schema.org/draft-04/schema",
                "type": "object",
                "properties": {"b": True, "c": {"type": "integer"}},
                "required": ["c"],
                "additionalProperties": False,
            }
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    regex = re.compile(json_schema_regex(schema))
    for doc in ({"a": {"b": [1, "y"], "c": 2}}, {"a": {"c": -1}}, {"a": {"b": "x", "c": 0}}):
        jsonschema.validate(doc, schema)
        assert regex.fullmatch(json.dumps(doc, separators=(",", ":"))), doc
    for doc in ({"a": {"b": 1}}, {"a": {"c": 1.5}}, {}):
        assert not regex.fullmatch(json.dumps(doc, separators=(",", ":"))), doc


def test_invalid_schema_is_refused_by_its_metaschema():
    with pytest.raises(InvalidSchemaError, match="strnig") as info:
        json_schema_regex({"type": "object", "properties": {"a": {"type": "strnig"}}})
    assert info.value.path == "#/properties/a/type"
    with pytest.raises(InvalidSchemaError, match="minLength"):
        json_schema_regex({"type": "string", "minLength": -1})


def test_a_schema_that_passed_its_metaschema_is_not_checked_again(monkeypatch):
    """`check_schema` remembers the JSON texts that passed (a compile checks once per form it
    tries: MaskBench kb_1161 spent 2.4 s in two checks); an invalid schema is refused every
    time, and a changed schema is checked again."""
    import jsonschema

    from functional_gen.structured import json_schema as js

    calls = []
    original = jsonschema.Draft202012Validator.check_schema.__func__

    def counted(cls, schema, *args, **kwargs):
        calls.append(json.dumps(schema, sort_keys=True))
        return original(cls, schema, *args, **kwargs)

    monkeypatch.setattr(jsonschema.Draft202012Validator, "check_schema", classmethod(counted))
    monkeypatch.setattr(js.dialect, "CHECKED", collections.OrderedDict())
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}}
    js.check_schema(schema)
    js.check_schema({"properties": {"a": {"minimum": 3, "type": "integer"}}, "type": "object"})
    assert len(calls) == 1  # the same schema, keys in another order
    js.check_schema({**schema, "required": ["a"]})
    assert len(calls) == 2
    bad = {"type": "string", "minLength": -1}
    for _ in range(2):
        with pytest.raises(InvalidSchemaError, match="minLength"):
            js.check_schema(bad)
    assert len(calls) == 4


def test_the_keys_other_than_listed_names_are_written_once_per_list():
    """`key_not_in` is memoised by the names in order (MaskBench kb_1161's `$ref` expansion
    writes 12,725 open objects from a few hundred property lists: 9.2 -> 3.9 s with the memo)."""
    from functional_gen.structured.json_schema.keys import key_not_in, key_not_in_memo

    names = [f"memoKey{i}" for i in range(40)]
    before = key_not_in_memo.cache_info()
    first = key_not_in(names)
    assert key_not_in(list(names)) is first
    after = key_not_in_memo.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    assert re.fullmatch(key_not_in(names[::-1]), "memoKey7") is None


def test_strict_false_drops_unenforceable_keywords_with_one_warning():
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "multipleOf": 7}, "s": {"not": {"pattern": "x"}}},
    }
    with pytest.raises(UnsupportedSchemaError):
        json_schema_regex(schema)
    with pytest.warns(UserWarning, match="2 keyword") as record:
        regex = json_schema_regex(schema, strict=False)
    assert (
        len(record) == 1
        and "multipleOf" in str(record[0].message)
        and "`not`" in str(record[0].message)
    )
    assert regex == json_schema_regex(
        {"type": "object", "properties": {"n": {"type": "integer"}, "s": {}}}
    )


# Objects: every candidate document is accepted by the regex exactly when jsonschema accepts it
# (documents list the properties in schema order, additional ones after them).
OBJECT_CASES = {
    # constants holding objects: their keys are written escaped (outlines-core leaves `$`, `.`
    # and `(` in them raw: MaskBench o-schemas with `{"const": {"$data": ...}}` did not compile)
    "constant_objects_with_metacharacters_in_keys": (
        {
            "type": "object",
            "properties": {
                "a": {"const": {"$data": "1/x", "a.b": [1, {}], "e": []}},
                "b": {"enum": [{"(k": None}, "x"]},
            },
            "required": ["a"],
        },
        [
            {"a": {"$data": "1/x", "a.b": [1, {}], "e": []}},
            {"a": {"$data": "1/x", "aXb": [1, {}], "e": []}},
            {"a": {"$data": "1/y", "a.b": [1, {}], "e": []}},
            {"a": {"$data": "1/x", "a.b": [1, {}], "e": []}, "b": {"(k": None}},
            {"a": {"$data": "1/x", "a.b": [1, {}], "e": []}, "b": "x"},
            {"a": {"$data": "1/x", "a.b": [1, {}], "e": []}, "b": {"(k": 1}},
        ],
    ),
    # numeric constants are equal by value: outlines-core wrote `9.0` only as `9\.0` (rejecting
    # the integer 9, which JSON Schema counts as equal) and `1e-07` as `1e\-7` (rejecting
    # `json.dumps`'s `1e-07`); MaskBench has such enums in 41 schemas
    "numeric_constants_equal_by_value": (
        {
            "type": "object",
            "properties": {
                "a": {"const": 9.0},
                "b": {"enum": [1, -2.5, "x", True]},
                "c": {"enum": [1e-07, 1e308, 9007199254740992.0]},
                "d": {"const": [0, {"k": 2.0}]},
            },
        },
        [
            {"a": 9},
            {"a": 9.0},
            {"a": 9.5},
            {"a": 90},
            {"b": 1.0},
            {"b": -2.5},
            {"b": True},
            {"b": -2.4},
            {"b": 1.5},
            {"c": 1e-07},
            {"c": 1e-06},
            {"c": 1e308},
            {"c": 9007199254740992},
            {"d": [0.0, {"k": 2}]},
            {"d": [False, {"k": 2}]},
        ],
    ),
    "open_by_default": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        [
            {"a": 1},
            {"a": 1, "b": 2},
            {"a": 1, "b": {"c": "x"}},
            {"b": 2},
            {"a": "x"},
            {"a": 1, "ab": None},
        ],
    ),
    "additional_schema": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "additionalProperties": {"type": "string"},
        },
        [{}, {"a": 1}, {"a": 1, "b": "x"}, {"a": 1, "b": 2}, {"b": "x", "c": "y"}, {"a": "x"}],
    ),
    "closed": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        [{}, {"a": 1}, {"a": 1, "b": 2}],
    ),
    "required_without_schema": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
        [{"a": 1, "b": [1, "x", None]}, {"a": 1, "b": "s"}, {"a": 1}, {"b": 1}],
    ),
    "pattern_properties": (
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "patternProperties": {"^x_[a-z]+$": {"type": "boolean"}},
            "additionalProperties": False,
        },
        [
            {"id": 1},
            {"id": 1, "x_a": True},
            {"x_ab": False, "x_b": True},
            {"x_a": 1},
            {"y": True},
            {"x_1": True},
        ],
    ),
    "pattern_properties_open": (  # a key no pattern matches: any value (o48094)
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "patternProperties": {"^x_[a-z]+$": {"type": "boolean"}, "^[0-9]+$": False},
        },
        [
            {"id": 1, "x_a": True},
            {"x_a": 1},
            {"example-schema": [1, "a"]},
            {"x_1": "s", "y": None},
            {"id": "s"},
            {"12": 1},
            {"1a": 1},
            {"": 0},
        ],
    ),
    "pattern_properties_and_additional_schema": (
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "boolean"}},
            "additionalProperties": {"type": "number"},
        },
        [{"x-a": True}, {"x-a": 1}, {"y": 2.5}, {"y": "s"}, {"x": 1, "x-": False}],
    ),
    "pattern_matching_a_listed_property": (  # both schemas apply to the listed one
        {
            "type": "object",
            "properties": {"abc": {"type": "string"}, "n": {"type": "integer"}},
            "patternProperties": {"^[a-z]+$": {"type": "integer"}},
        },
        [
            {"abc": "s"},
            {"abc": 1},
            {"n": 1},
            {"de": 2},
            {"de": "s"},
            {"D-E": "s"},
            {"n": 1, "d": 2},
        ],
    ),
    "property_names": (
        {
            "type": "object",
            "propertyNames": {"pattern": "^[a-z]{1,3}$"},
            "additionalProperties": {"type": "integer"},
        },
        [{}, {"ab": 1}, {"abcd": 1}, {"A": 1}, {"a": 1, "b": 2}, {"a": "x"}],
    ),
    "property_names_of_listed": (  # a listed name the pattern refuses is never generated
        {
            "type": "object",
            "properties": {"ab": {"type": "integer"}, "Cd": {}, "ef": {"type": "string"}},
            "required": ["ab"],
            "additionalProperties": False,
            "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 2},
        },
        [{"ab": 1}, {"ab": 1, "ef": "x"}, {"ab": 1, "Cd": 2}, {}, {"ef": "x"}, {"ab": "x"}],
    ),
    # `anyOf` beside `oneOf` (MaskBench o12454 recursed forever): each anyOf branch AND the oneOf
    "any_of_beside_one_of": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {}},
            "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
            "oneOf": [{"required": ["b"]}, {"required": ["c"]}],
        },
        [
            {},
            {"a": 1},
            {"b": "x"},
            {"c": True},
            {"a": 1, "b": "x"},
            {"a": 1, "c": None},
            {"b": "x", "c": 2},
            {"a": 1, "b": "x", "c": 2},
            {"a": "x", "c": 2},
        ],
    ),
    "min_max_properties": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "minProperties": 1,
            "maxProperties": 2,
        },
        [
            {},
            {"a": 1},
            {"b": 1},
            {"a": 1, "b": 2},
            {"a": 1, "b": 2, "c": 3},
            {"c": 3},
            {"c": 3, "d": 4},
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(OBJECT_CASES))
@pytest.mark.parametrize("closed_objects", [False, True])
def test_objects_accept_exactly_what_jsonschema_accepts(name, closed_objects):
    import re

    import jsonschema

    schema, documents = OBJECT_CASES[name]
    if closed_objects and name == "required_without_schema":  # `b` would be an additional property
        with pytest.raises(UnsupportedSchemaError, match="no JSON value"):
            json_schema_regex(schema, closed_objects=closed_objects)
        return
    regex = re.compile(json_schema_regex(schema, closed_objects=closed_objects))
    oracle = dict(schema, additionalProperties=False) if closed_objects else schema
    if closed_objects and "propertyNames" in schema and "properties" not in schema:
        oracle = {**schema, "maxProperties": 0}  # closed and nothing listed: only {}
    for document in documents:
        for text in (json.dumps(document, separators=(",", ":")), json.dumps(document)):
            valid = jsonschema.Draft202012Validator(oracle).is_valid(document)
            assert bool(regex.fullmatch(text)) == valid, (text, valid)


def test_number_constants_accept_the_spellings_of_other_serialisers():
    import re

    regex = re.compile(json_schema_regex({"enum": [1e-07, 1e20, 3, -0.0]}))
    for text in ["1e-07", "1e-7", "1E-07", "0.0000001", "1e+20", "1e20", "100000000000000000000",
                 "3", "3.0", "0", "-0", "0.0"]:  # fmt: skip
        assert regex.fullmatch(text), text
    for text in ["1e-70", "1e-08", "0.000001", "1e21", "3.5", "30", "-3", "2"]:
        assert not regex.fullmatch(text), text
    with pytest.raises(InvalidSchemaError, match="inf"):
        json_schema_regex({"const": float("inf")})
    big = re.compile(json_schema_regex({"const": 10**50}))  # integers in full, however long
    assert big.fullmatch(str(10**50)) and not big.fullmatch("") and not big.fullmatch("1e50")


@pytest.mark.parametrize(
    "names",
    [
        [],
        [""],
        ["a"],
        ["", "a", "ab", "b"],
        ["a b", "a~", "[x]", "-", "ab-c", "abd"],
        [f"allow{w}{i}" for w in ("Cloud", "Camera", "Chat") for i in range(12)],
    ],
)
def test_additional_keys_of_plain_names_are_the_same_language_as_the_general_form(names):
    """`key_not_in` writes the keys other than plain ASCII names with shared tails (about a
    tenth of the automaton); the language is the general trie form's."""
    from functional_gen.structured.automaton import ConstraintError
    from functional_gen.structured.byte_dfa import minimize, regex_byte_dfa
    from functional_gen.structured.json_schema.keys import key_not_in, key_not_in_units
    from functional_gen.structured.patterns import difference_dfas

    fast = minimize(regex_byte_dfa(key_not_in(names)))
    general = minimize(regex_byte_dfa(key_not_in_units(names)))
    assert key_not_in(names) != key_not_in_units(names)
    for a, b in ((fast, general), (general, fast)):
        with pytest.raises(ConstraintError):  # nothing in one and not in the other
            difference_dfas(a, b, max_states=10**6)
    keys = re.compile(key_not_in(names))
    for text in [*names, "", "a", "ab", "zz", "é", "a\\n", "allowCloud1x", "allowCloud11"]:
        assert bool(keys.fullmatch(text)) == (text not in names), text


ALLOF_MEMBERS = {  # schema -> documents; `additionalProperties` is each subschema's own
    # MaskBench Github_medium o77739: the root is `$ref` car plus `track`, car is `$ref` vehicle
    # plus `ins`; the instance lists vehicle's, car's, then the root's properties (each `$ref`
    # target before its siblings), which the schema order must accept (the inner `allOf` was
    # merged last: `track` first, then `reg`, `ins`)
    "nested_ref_siblings_list_the_target_properties_first": (
        {
            "$defs": {
                "vehicle": {"type": "object", "properties": {"reg": {"type": "string"}}},
                "car": {"$ref": "#/$defs/vehicle", "properties": {"ins": {"type": "boolean"}}},
            },
            "$ref": "#/$defs/car",
            "properties": {"track": {"type": "string"}},
            "required": ["reg"],
        },
        [
            {"reg": "a", "ins": True, "track": "m"},
            {"reg": "a", "track": "m"},
            {"reg": "a", "ins": True},
            {"ins": True, "track": "m"},
            {"reg": "a", "ins": True, "track": 3},
            {"reg": 1, "ins": True, "track": "m"},
        ],
    ),
    "both_closed": (  # MaskBench Github_hard o61085: a package item allOf a closed definition
        {
            "allOf": [{"properties": {"w": {"type": "integer"}}, "additionalProperties": False}],
            "properties": {"id": {"type": "string"}},
            "additionalProperties": False,
        },
        [{}, {"w": 1}, {"id": "a"}, {"w": 1, "id": "a"}],
    ),
    "one_closed": (
        {
            "allOf": [{"properties": {"w": {"type": "integer"}}, "additionalProperties": False}],
            "properties": {"w": {"minimum": 3}, "id": {"type": "string"}},
        },
        [{}, {"w": 1}, {"w": 4}, {"id": "a"}, {"z": 1}],
    ),
    "patterns_on_one_side": (
        {
            "allOf": [
                {"patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False}
            ],
            "properties": {"x1": {"minimum": 3}, "id": {"type": "string"}},
        },
        [{}, {"x1": 1}, {"x1": 4}, {"x2": "s"}, {"x2": 5}, {"id": "a"}, {"z": 1}],
    ),
    "additional_schema": (
        {
            "allOf": [
                {
                    "properties": {"a": {"type": "integer"}},
                    "additionalProperties": {"type": "string"},
                }
            ],
            "properties": {"b": {"type": "string", "maxLength": 2}},
            "patternProperties": {"^c": {"maxLength": 1}},
        },
        [{"a": 1}, {"b": "xx"}, {"b": "xxx"}, {"c": "x"}, {"c": "xy"}, {"c": 1}, {"d": "s"}],
    ),
}


@pytest.mark.parametrize("name", sorted(ALLOF_MEMBERS))
def test_allof_merges_object_members_exactly(name):
    import re

    import jsonschema

    schema, documents = ALLOF_MEMBERS[name]
    regex = re.compile(json_schema_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    seen = set()
    for document in documents:
        for text in (json.dumps(document, separators=(",", ":")), json.dumps(document)):
            valid = validator.is_valid(document)
            assert bool(regex.fullmatch(text)) == valid, (text, valid)
            seen.add(valid)
    assert seen == {True, False}


def test_allof_lists_a_branch_members_before_those_of_a_later_part():
    # `allOf: [{oneOf: [A, B]}, P]`: a document lists A's (or B's) members, then P's, in the
    # order of the parts, as llguidance writes them (MaskBench Github_trivial o64859); every
    # document is still accepted exactly when `jsonschema` validates it in that order
    import re

    import jsonschema

    schema = {
        "allOf": [
            {
                "oneOf": [
                    {
                        "properties": {"state": {"const": "run"}, "done": {"type": "integer"}},
                        "required": ["state"],
                    },
                    {
                        "properties": {"state": {"const": "stop"}, "why": {"type": "string"}},
                        "required": ["state"],
                    },
                ]
            },
            {"properties": {"id": {"type": "integer"}}, "required": ["id"]},
        ],
        "type": "object",
    }
    regex = re.compile(json_schema_regex(schema, free_form_depth=1, property_order="schema"))
    validator = jsonschema.Draft202012Validator(schema)
    in_order = [
        {"state": "run", "done": 3, "id": 1},
        {"state": "run", "id": 1},
        {"state": "stop", "why": "x", "id": 2},
        {"state": "stop", "why": 5, "id": 2},  # invalid: `why` is a string
        {"state": "run", "done": 3},  # invalid: no `id`
        {"state": "walk", "id": 2},  # invalid: no branch
    ]
    for document in in_order:
        text = json.dumps(document, separators=(",", ":"))
        assert bool(regex.fullmatch(text)) == validator.is_valid(document), text
    # the later part's members first: not the order of the parts
    assert not regex.fullmatch('{"id":1,"state":"run","done":3}')


_I = {"type": "integer"}
_A, _C = {"properties": {"a": _I}}, {"properties": {"c": _I}}
_ORDER_CASES = {
    # the keywords' order in the text decides which members come first (llguidance 1.9)
    "anyOf, properties": {"anyOf": [_A], "properties": {"b": _I}},
    "properties, anyOf": {"properties": {"b": _I}, "anyOf": [_A]},
    "allOf, properties": {"allOf": [_A], "properties": {"b": _I}},
    "properties, allOf": {"properties": {"b": _I}, "allOf": [_A]},
    "allOf of two, properties": {"allOf": [_A, _C], "properties": {"b": _I}},
    "properties, allOf of two": {"properties": {"b": _I}, "allOf": [_A, _C]},
    "$ref, properties": {"$defs": {"A": _A}, "$ref": "#/$defs/A", "properties": {"b": _I}},
    "properties, $ref": {"$defs": {"A": _A}, "properties": {"b": _I}, "$ref": "#/$defs/A"},
    "properties, oneOf": {"properties": {"b": _I}, "oneOf": [_A]},
    "oneOf, properties": {"oneOf": [_A], "properties": {"b": _I}},
    "type, anyOf, properties": {"type": "object", "anyOf": [_A], "properties": {"b": _I}},
    "anyOf, allOf, properties": {"anyOf": [_A], "allOf": [_C], "properties": {"b": _I}},
    "allOf, anyOf, properties": {"allOf": [_C], "anyOf": [_A], "properties": {"b": _I}},
    "properties, allOf of anyOf": {"properties": {"b": _I}, "allOf": [{"anyOf": [_A]}, _C]},
    "allOf of (properties, anyOf)": {"allOf": [{"properties": {"b": _I}, "anyOf": [_A]}, _C]},
    "allOf of (anyOf, properties)": {"allOf": [{"anyOf": [_A], "properties": {"b": _I}}, _C]},
    "required, anyOf, properties": {"required": ["b"], "anyOf": [_A], "properties": {"b": _I}},
    # `additionalProperties` read first brings the names of `properties` with it
    "additionalProperties, anyOf, properties": {
        "additionalProperties": True,
        "anyOf": [_A],
        "properties": {"b": _I},
    },
    "additionalProperties, allOf, properties": {
        "additionalProperties": True,
        "allOf": [_A],
        "properties": {"b": _I},
    },
    "additionalProperties, $ref, properties": {
        "$defs": {"A": _A},
        "additionalProperties": True,
        "$ref": "#/$defs/A",
        "properties": {"b": _I},
    },
    # MaskBench Github_easy o10011's shape: closed, the branches between the two
    "additionalProperties false, anyOf, properties": {
        "additionalProperties": False,
        "anyOf": [
            {"properties": {"g": {"enum": ["x"]}, "r": {"enum": ["code"]}}, "required": ["g"]},
            {"properties": {"g": {"enum": ["y"]}, "r": {"enum": ["token"]}}, "required": ["g"]},
        ],
        "properties": {"g": {"type": "string"}, "u": _I, "r": {"type": "string"}},
    },
}


@pytest.mark.parametrize("name", sorted(_ORDER_CASES))
def test_members_beside_an_applicator_come_in_llguidance_order(name):
    # Which orders of the members a document may list: exactly those llguidance accepts
    # (MaskBench normalised its documents to llguidance's order; Github_hard o60038,
    # JsonSchemaStore coffeelint, ... list an `anyOf` branch's members before the node's own).
    import llguidance

    schema = _ORDER_CASES[name]
    names = ["a", "b", "c"] if "c" in json.dumps(schema) else ["a", "b"]
    if "g" in schema.get("properties", {}):
        values = {"g": "x", "u": 1, "r": "code"}
    else:
        values = {n: i for i, n in enumerate(names)}
    tokenizer = llguidance.LLTokenizer("byte")
    matcher_grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    assert not llguidance.LLMatcher.validate_grammar(matcher_grammar, tokenizer)

    def llguidance_accepts(text: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, matcher_grammar, log_level=0)
        return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()

    regex = re.compile(json_schema_regex(schema, free_form_depth=1, property_order="schema"))
    accepted = {True: [], False: []}
    for order in itertools.permutations(values):
        text = json.dumps({k: values[k] for k in order}, separators=(",", ":"))
        expected = llguidance_accepts(text)
        assert bool(regex.fullmatch(text)) == expected, (name, text, expected)
        accepted[expected].append(text)
    assert accepted[True], name  # some order is accepted, and (below) not every one
    assert accepted[False], name


def test_allof_of_two_pattern_sides_with_restricted_keys_is_refused():
    schema = {
        "allOf": [{"patternProperties": {"^a": {}}, "additionalProperties": False}],
        "patternProperties": {"^b": {}},
    }
    with pytest.raises(UnsupportedSchemaError, match="patternProperties"):
        json_schema_regex(schema)


_LANGUAGE_TAG = (  # MaskBench's BCP 47 pattern: its complement is too large to write exactly
    "^(description_(((([A-Za-z]{2,3}(-([A-Za-z]{3}(-[A-Za-z]{3}){0,2}))?)|[A-Za-z]{4}|"
    "[A-Za-z]{5,8})(-([A-Za-z]{4}))?(-([A-Za-z]{2}|[0-9]{3}))?(-([A-Za-z0-9]{5,8}|"
    "[0-9][A-Za-z0-9]{3}))*(-([0-9A-WY-Za-wy-z](-[A-Za-z0-9]{2,8})+))*(-(x(-[A-Za-z0-9]{1,8})+))?)|"
    "(x(-[A-Za-z0-9]{1,8})+)))$"
)


def test_complex_pattern_properties_leave_keys_that_do_not_start_like_them():
    import re

    import jsonschema

    from functional_gen.structured.json_schema.keys import KEY_PREFIX_DEPTHS

    schema = {
        "type": "object",
        "properties": {"description": {"type": "string"}},
        "patternProperties": {_LANGUAGE_TAG: {"type": "string"}},
    }
    regex = re.compile(json_schema_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    accepted = [
        {"description": "a", "description_en": "b", "description_de-CH": "c"},
        {"other": 1, "descriptio": [2], "description_": None},
    ]
    for document in accepted:
        assert validator.is_valid(document) and regex.fullmatch(json.dumps(document)), document
    rejected = [{"description_en": 1}, {"description": 1}, {"description_x-ab": 2}]
    for document in rejected:
        assert not validator.is_valid(document) and not regex.fullmatch(json.dumps(document))
    # the documented gap: a key that starts like a language tag but is none (the pattern does
    # not match it, so any value is valid) is not offered; nothing invalid is
    # (its first `KEY_PREFIX_DEPTHS[0]` characters start a language tag)
    assert len("description_abcd") == KEY_PREFIX_DEPTHS[0]
    gap = {"description_abcd-x": 1, "description_zz-": 2}
    assert validator.is_valid(gap) and not regex.fullmatch(json.dumps(gap))
    assert regex.fullmatch(json.dumps({"description_zz-": 2}))  # shorter: decided exactly


def test_pattern_with_length_bounds_is_the_intersection():
    import re

    schema = {"type": "string", "pattern": "^[a-c]+$", "minLength": 2, "maxLength": 4}
    regex = re.compile(json_schema_regex(schema))
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    for length in range(7):
        for text in ("abc" * 3)[:length], "x" * length, ("a" * length):
            assert bool(regex.fullmatch(json.dumps(text))) == validator.is_valid(text), text


def test_unanchored_pattern_is_searched():
    import re

    regex = re.compile(json_schema_regex({"type": "string", "pattern": "[0-9]{3}"}))
    assert (
        regex.fullmatch('"ab123cd"') and regex.fullmatch('"123"') and not regex.fullmatch('"12a"')
    )


@pytest.mark.parametrize(
    "fmt,check",
    [
        ("ipv6", lambda v: __import__("ipaddress").IPv6Address(v)),
        ("hostname", lambda v: len(v) <= 253 and all(0 < len(p) <= 63 for p in v.split("."))),
        ("uri", lambda v: __import__("urllib.parse").parse.urlsplit(v).scheme or 1 / 0),
        ("duration", lambda v: re_duration(v)),
        ("uri-template", lambda v: __import__("uri_template").validate(v) or 1 / 0),
    ],
)
def test_new_formats_generate_valid_values(vocabulary, fmt, check):
    automaton = regex_automaton(json_schema_regex({"type": "string", "format": fmt}), vocabulary)
    rng = np.random.default_rng(len(fmt))
    for _ in range(20):
        check(
            json.loads(
                random_walk(automaton, vocabulary, rng, budget=int(automaton.distance[1]) + 12)
            )
        )


def re_duration(value: str):
    """JSON Schema 2020-12 Appendix A's ABNF for `duration`, written independently."""
    import re

    assert re.fullmatch(
        r"P(\d+W|(?=\d|T)(\d+Y)?(\d+M)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+S)?)?)", value
    ), value
    # ABNF: date parts are consecutive (no Y then D without M)
    date = re.match(r"P((\d+)Y)?((\d+)M)?((\d+)D)?", value)
    assert not (date.group(1) and date.group(5) and not date.group(3)), value


def test_unsatisfiable_object_is_refused():
    with pytest.raises(ValueError, match="no JSON value"):
        json_schema_regex(
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "minProperties": 2,
                "additionalProperties": False,
            }
        )


@pytest.mark.parametrize("draft", ["2020-12", "draft-07"])
def test_dependent_required_matches_jsonschema(draft):
    # Every subset of {a, b, c, d} (listed order), compact: accepted iff jsonschema validates it.
    # Draft 7's `dependencies` with lists of names is the same keyword (MaskBench has it).
    import re

    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "integer"},
            "c": {"type": "integer"},
        },
    }
    if draft == "2020-12":
        schema["dependentRequired"] = {"a": ["b"], "c": ["a", "d"]}
    else:
        schema["$schema"] = "http://json-schema.org/draft-07/schema#"
        schema["dependencies"] = {"a": ["b"], "c": ["a", "d"]}
    for closed in (False, True):
        regex = re.compile(json_schema_regex(schema, closed_objects=closed))
        full = {**schema, **({"additionalProperties": False} if closed else {})}
        validator = jsonschema.validators.validator_for(full)(full)
        accepted = 0
        for n in range(5):
            for keys in itertools.combinations("abcd", n):
                doc = dict.fromkeys(keys, 1)
                text = json.dumps(doc, separators=(",", ":"))
                assert bool(regex.fullmatch(text)) == validator.is_valid(doc), (closed, text)
                accepted += validator.is_valid(doc)
        assert accepted >= 3


def test_free_form_values_nest_free_form_depth_levels():
    import re

    shallow = re.compile(json_schema_regex({"type": "object"}))
    deep = re.compile(json_schema_regex({"type": "object"}, free_form_depth=2))
    for text, depth in [
        ('{"a":1}', 1),
        ('{"a":[1,"x"],"b":{"c":null}}', 2),
        ('{"a":{"b":[1]}}', 3),
    ]:
        assert bool(shallow.fullmatch(text)) == (depth <= 2), (
            text
        )  # the open object is a level itself
        assert bool(deep.fullmatch(text)) == (depth <= 3), text


def test_many_optional_properties_compile_to_a_moderate_regex():
    # outlines-core writes 100 optional properties as an 8.9-million-character regex
    import re

    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer"} for i in range(100)},
        "additionalProperties": False,
    }
    regex = json_schema_regex(schema)
    assert len(regex) < 1_000_000
    assert re.fullmatch(regex, '{"p99":1}') and re.fullmatch(regex, '{"p3":1,"p50":2}')
    assert re.fullmatch(regex, '{"p50":2,"p3":1}')  # any order (the default)
    ordered = json_schema_regex(schema, property_order="schema")
    assert len(ordered) < 1_000_000 and not re.fullmatch(ordered, '{"p50":2,"p3":1}')


def test_one_of_overlap_is_judged_on_the_schemas_not_their_regexes():
    # both branches become regex markers; 5 matches both, so `oneOf` cannot become `anyOf`:
    # it is enforced exactly (test_one_of_exact.py), 0..10 matching both
    schema = {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]}
    _assert_regex_decides_as_jsonschema(schema, [-1, 0, 5, 10, 11, 3.5])
    assert json_schema_regex({"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]})


def test_keywords_without_type_constrain_only_their_type():
    # MaskBench Github_medium o69887: `"items": {"required": [], "properties": {}}` and the
    # strings "season1", "season2" are valid items (the object keywords do not apply to them).
    import re

    import jsonschema

    schema = {
        "type": "array",
        "items": {"required": ["a"], "properties": {"a": {"type": "integer"}}, "minimum": 1},
    }
    regex = re.compile(json_schema_regex(schema))
    for document in (
        ["season1", 2.5, None, True, [1]],
        [{"a": 1}],
        [{"b": 1}],
        [0.5],
        [{"a": "x"}],
        [[1, 2]],
    ):
        text = json.dumps(document, separators=(",", ":"))
        assert bool(regex.fullmatch(text)) == jsonschema.Draft202012Validator(schema).is_valid(
            document
        ), text


def test_a_schema_whose_regex_explodes_is_refused_at_once():
    # Ten definitions that each use the one below twice: 1,024 copies of a date-time regex,
    # over a million characters. Refused before the regex is built (the markers' sizes are
    # summed first), not after minutes of regex -> DFA compilation.
    import time

    defs = {"a0": {"type": "string", "format": "date-time"}}
    for i in range(1, 11):
        below = {"$ref": f"#/$defs/a{i - 1}"}
        defs[f"a{i}"] = {
            "type": "object",
            "properties": {"x": below, "y": below},
            "required": ["x", "y"],
        }
    start = time.perf_counter()
    with pytest.raises(fg.structured.ConstraintError, match="too large"):
        json_schema_regex({"$defs": defs, "$ref": "#/$defs/a10"})
    assert time.perf_counter() - start < 20  # 0.5 s alone, 4 s under the runtime type checks


def test_enums_without_a_common_value_match_nothing():
    # An enum none of whose values has the node's type, or two enums / consts in `allOf` with
    # nothing in common, allow no value: an optional property with such a schema is left out
    # (MaskBench: `{"enum": ["MODIFIABLE", ...], "type": "object"}`); enums in `allOf` intersect.
    import re

    import jsonschema

    schema = {
        "type": "object",
        "properties": {
            "a": {"enum": ["x", "y"], "type": "object"},
            "b": {"allOf": [{"enum": ["x", "y", 1]}, {"enum": ["y", 1.0, "z"]}]},
            "c": {"allOf": [{"const": "x"}, {"const": "y"}]},
            "d": {"const": 2, "enum": [1, 2]},
        },
        "additionalProperties": False,
    }
    regex = re.compile(json_schema_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    for doc in (
        {},
        {"a": "x"},
        {"a": {}},
        {"b": "y"},
        {"b": 1},
        {"b": "x"},
        {"b": "z"},
        {"c": "x"},
        {"d": 2},
        {"d": 1},
    ):
        text = json.dumps(doc, separators=(",", ":"))
        assert bool(regex.fullmatch(text)) == validator.is_valid(doc), text
    with pytest.raises(UnsupportedSchemaError, match="no JSON value"):
        json_schema_regex({"enum": ["x"], "type": "integer"})


@pytest.mark.parametrize("required", ["", "0", "2", "4", "13", "024"])
def test_listed_members_are_exactly_the_ordered_subsets_that_keep_the_required(required):
    # Every arrangement of up to 5 members (orders, repeats and omissions included) against
    # the definition: a subsequence of the members in order, the required ones kept.
    import re

    from functional_gen.structured.json_schema.property_order import _listed_members

    names = "abcde"
    items = [(f'"{n}":{i}', str(i) in required) for i, n in enumerate(names)]
    regex, empty = _listed_members(items, ",")
    assert empty == (not required)
    compiled = re.compile(regex)
    for length in range(0, 6):
        for chosen in itertools.product(range(5), repeat=length):
            text = ",".join(items[i][0] for i in chosen)
            expected = (
                length > 0
                and list(chosen) == sorted(set(chosen))
                and all(int(r) in chosen for r in required)
            )
            assert bool(compiled.fullmatch(text)) == expected, (text, regex)


def test_many_optional_members_give_a_linear_regex_within_the_nesting_limit():
    # 600 optional properties (one required in the middle): blocks of `_MEMBER_BLOCK` keep the
    # regex's nesting below the Rust parser's limit, and its size linear (the back-to-front
    # form had a quadratic one: 185,000 characters for 60 optional properties).
    import re

    from functional_gen.structured import json_schema as js
    from functional_gen.structured.byte_dfa import minimize, regex_byte_dfa

    items = [(f'"p{i}":[0-9]', i == 300) for i in range(600)]
    regex, empty = js.property_order._listed_members(items, ",")
    half, _ = js.property_order._listed_members(items[:300], ",")
    assert not empty and len(regex) < 2.5 * len(half)  # linear, not quadratic
    dfa = minimize(regex_byte_dfa(regex))  # outlines-core parses it
    assert dfa.num_states > 600
    assert re.fullmatch(regex, '"p300":1') and re.fullmatch(regex, '"p0":1,"p300":2,"p599":3')
    assert (
        re.fullmatch(regex, ",".join(f'"p{i}":{i % 10}' for i in range(0, 600, 7)) + ',"p300":0')
        is None
    )  # out of order
    assert re.fullmatch(
        regex, ",".join(f'"p{i}":{i % 10}' for i in range(0, 600, 5))
    )  # 300 is a multiple of 5
    assert not re.fullmatch(regex, '"p0":1,"p599":3')  # the required one is missing


def test_listed_values_are_judged_by_jsonschema_whatever_else_the_schema_says():
    import re

    import jsonschema

    # `not`, `uniqueItems` and `if`/`then` are not regular in general, but on a listed set of
    # values each one is decided by jsonschema: the schema becomes the enum of the values kept.
    schema = {
        "allOf": [
            {"enum": [[1, 2, 3], [1, 1], "x", {"a": 1}, {"a": "y"}, 7]},
            {"not": {"type": "string"}},
            {"uniqueItems": True},
            {"if": {"type": "object"}, "then": {"properties": {"a": {"type": "integer"}}}},
        ]
    }
    regex = re.compile(json_schema_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    candidates = [[1, 2, 3], [1, 1], "x", {"a": 1}, {"a": "y"}, 7, 8, [1, 2], {"a": 2}, None]
    for value in candidates:
        text = json.dumps(value, separators=(",", ":"))
        assert bool(regex.fullmatch(text)) == validator.is_valid(value), text
    assert sum(validator.is_valid(v) for v in candidates) == 3  # [1, 2, 3], {"a": 1}, 7
    # a `const` beside a keyword that fails it leaves nothing: refused, not silently accepted
    with pytest.raises(UnsupportedSchemaError, match="no JSON value"):
        json_schema_regex({"const": "abc", "not": {"type": "string"}})
    # without a list, `not` is still refused by name
    with pytest.raises(UnsupportedSchemaError, match="not"):
        json_schema_regex({"type": "integer", "not": {"const": 3}})


def test_annotations_never_conflict_when_schemas_are_combined():
    # `default`, unknown keywords (`_id`, `x-taplo`) and draft 4's `id` assert nothing: an
    # `allOf` or a `$ref` with siblings that differ only in them combines (MaskBench had schemas
    # refused with "cannot combine two different `_id`")
    schema = {
        "$defs": {"n": {"type": "integer", "default": 1, "_id": "a", "x-taplo": {"hidden": True}}},
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/n", "default": 2, "_id": "b", "minimum": 0},
            "b": {"allOf": [{"$ref": "#/$defs/n"}, {"default": 3, "x-taplo": {}, "maximum": 5}]},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    regex = re.compile(json_schema_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    for a in (-1, 0, 7):
        for b in (-2, 5, 6):
            text = json.dumps({"a": a, "b": b}, separators=(",", ":"))
            assert bool(regex.fullmatch(text)) == validator.is_valid({"a": a, "b": b}), text


ONE_OF_CASES = {
    # "exactly one of these fields" (MaskBench o68297, o54553): required-only branches
    "presence": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {}},
            "oneOf": [{"required": ["a", "b"]}, {"required": ["c"]}],
        },
        [dict.fromkeys(keys, 1) for r in range(4) for keys in itertools.combinations("abc", r)]
        + [{"a": 1, "b": 1, "d": 2}, {"c": 1, "d": 2}, {"d": 2}],
    ),
    # branches without `type` (o10013): a string or a number matches both, so none is valid
    "typeless_discriminated": (
        {
            "oneOf": [
                {"properties": {"k": {"enum": ["x"]}}, "required": ["k"]},
                {"properties": {"k": {"enum": ["y"]}}, "required": ["k"]},
            ],
            "properties": {"k": {"type": "string"}},
        },
        [{"k": "x"}, {"k": "y"}, {"k": "z"}, {}, "x", 1, 2.5, None, True, [1]],
    ),
    # finite branches: the values exactly one lists (1 and 1.0 are one value)
    "finite": (
        {"oneOf": [{"enum": ["blue", 1, "red"]}, {"enum": ["red", 1.0, 6]}, {"const": "green"}]},
        ["blue", "red", 1, 1.0, 6, "green", "pink", 2],
    ),
    # a closed object cannot have what the other branch requires (o53110)
    "closed_versus_required": (
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"g": {"type": "integer"}},
                    "required": ["g"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"gs": {"type": "array", "items": {"type": "integer"}}},
                    "additionalProperties": False,
                },
            ]
        },
        [{}, {"g": 1}, {"gs": [1]}, {"g": 1, "gs": []}, {"h": 1}],
    ),
    # a discriminator listed through a nested oneOf (o9957)
    "nested_one_of": (
        {
            "oneOf": [
                {"oneOf": [{"type": "string", "enum": ["A", "B"]}, {"enum": ["N"]}]},
                {
                    "type": "object",
                    "properties": {"t": {"oneOf": [{"enum": ["A", "B"]}, {"enum": ["N"]}]}},
                    "required": ["t"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"t": {"enum": ["T"]}, "v": {"type": "integer"}},
                    "required": ["t"],
                    "additionalProperties": False,
                },
            ]
        },
        ["A", "N", "C", {"t": "A"}, {"t": "N"}, {"t": "T"}, {"t": "T", "v": 1}, {"t": "A", "v": 1}],
    ),
    # closed objects whose `required` sits in an `allOf` (o6249)
    "required_in_all_of": (
        {
            "type": "object",
            "oneOf": [
                {
                    "properties": {"s": {"type": "string"}, "f": {"type": "string"}},
                    "allOf": [{"required": ["s"]}, {"required": ["f"]}],
                    "additionalProperties": False,
                },
                {
                    "properties": {"s": {"type": "string"}, "m": {"type": "string"}},
                    "allOf": [{"required": ["s", "m"]}],
                    "additionalProperties": False,
                },
            ],
        },
        [{"s": "a", "f": "b"}, {"s": "a", "m": "b"}, {"s": "a", "f": "b", "m": "c"}, {"s": "a"}],
    ),
    # a discriminator one level down: `config.align` (o85188)
    "nested_discriminator": (
        {
            "type": "object",
            "oneOf": [
                {
                    "properties": {
                        "config": {
                            "type": "object",
                            "properties": {"align": {"enum": [side]}},
                            "required": ["align"],
                        }
                    },
                    "required": ["config"],
                }
                for side in ("left", "right")
            ],
        },
        [
            {"config": {"align": "left"}},
            {"config": {"align": "right"}},
            {"config": {"align": "up"}},
            {"config": {}},
            {},
        ],
    ),
    # a string, or an object whose own `anyOf` the proof cannot read (o76546)
    "typed_beside_any_of": (
        {
            "oneOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "properties": {"t": {"type": "string"}, "u": {"type": "string"}},
                    "anyOf": [{"required": ["t"]}, {"required": ["u"]}],
                },
            ]
        },
        ["MIT", {"t": "x"}, {"u": "y"}, {}, 1],
    ),
    # a property both require, of different types in each (sp_337)
    "required_of_different_types": (
        {
            "type": "object",
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"where": {"type": "array", "items": {"type": "string"}}},
                    "required": ["where"],
                },
                {
                    "type": "object",
                    "properties": {"where": {"type": ["string", "null"]}},
                    "required": ["where"],
                },
            ],
        },
        [{"where": ["a"]}, {"where": "a"}, {"where": None}, {"where": 1}, {}],
    ),
}


@pytest.mark.parametrize("name", sorted(ONE_OF_CASES))
def test_one_of_that_can_be_made_exclusive_is_exact(name):
    schema, documents = ONE_OF_CASES[name]
    _assert_regex_decides_as_jsonschema(schema, documents)  # compiled: no `oneOf` refusal


def _assert_regex_decides_as_jsonschema(schema, documents):
    """The schema's regex accepts each document's compact text exactly when jsonschema
    validates the document, and both verdicts occur."""
    regex = re.compile(json_schema_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    valid = 0
    for document in documents:
        text = json.dumps(document, separators=(",", ":"))
        expected = validator.is_valid(document)
        assert bool(regex.fullmatch(text)) == expected, (text, expected)
        valid += expected
    assert 0 < valid < len(documents)  # both sides exercised


def test_one_of_that_truly_overlaps_is_still_refused():
    # `{}` matches both branches (nothing required): not "exactly one" by construction
    schema = {
        "type": "object",
        "oneOf": [
            {"properties": {"t": {"enum": ["a"]}}},
            {"properties": {"t": {"enum": ["b"]}}},
        ],
    }
    with pytest.raises(UnsupportedSchemaError, match="oneOf"):
        json_schema_regex(schema)
    # a property both require whose values may be equal ("a" is a string of both branches)
    nested = {
        "type": "object",
        "oneOf": [
            {"properties": {"t": {"type": "string"}}, "required": ["t"]},
            {"properties": {"t": {"type": ["string", "null"]}}, "required": ["t"]},
        ],
    }
    with pytest.raises(UnsupportedSchemaError, match="oneOf"):
        json_schema_regex(nested)


_ABC = {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}
NOT_CASES = {
    "not_required": {"type": "object", "properties": _ABC, "not": {"required": ["a", "b"]}},
    "not_any_required": {
        "properties": _ABC,
        "not": {"anyOf": [{"required": ["a"]}, {"required": ["b", "c"]}]},
    },
    "not_type": {"not": {"type": ["string", "object"]}},
    # MaskBench's docker-compose schemas: exactly one of two fields, written with `not`
    "one_of_with_not": {
        "properties": _ABC,
        "oneOf": [
            {"required": ["a"], "not": {"required": ["b"]}},
            {"required": ["b"], "not": {"required": ["a"]}},
        ],
    },
}


@pytest.mark.parametrize("name", sorted(NOT_CASES))
def test_not_whose_complement_is_a_schema_is_exact(name):
    documents = [dict.fromkeys(k, 1) for r in range(4) for k in itertools.combinations("abc", r)]
    _assert_regex_decides_as_jsonschema(NOT_CASES[name], documents + ["x", 1, 2.5, None, True, [1]])


def test_not_of_other_shapes_is_still_refused():
    with pytest.raises(UnsupportedSchemaError, match="not"):
        json_schema_regex({"type": "string", "not": {"pattern": "^a"}})


@pytest.mark.parametrize("extra", [False, True])
def test_objects_accept_their_properties_in_any_order_by_default(extra):
    # MaskBench's valid instances list properties in other orders than the schema (Glaive
    # `calculate_area` ones: "shape" first); every order of every subset, additional
    # properties among the listed ones, against jsonschema
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "string"},
            "c": {"type": "null"},
            "d": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["a", "c"],
        "additionalProperties": extra,
    }
    regex = re.compile(json_schema_regex(schema))
    validator = jsonschema.Draft202012Validator(schema)
    values = {"a": 1, "b": "x", "c": None, "d": [1], "e": 2}
    seen = [0, 0]
    for r in range(6):
        for keys in itertools.permutations("abcde", r):
            document = {k: values[k] for k in keys}
            text = json.dumps(document, separators=(",", ":"))
            expected = validator.is_valid(document)
            assert bool(regex.fullmatch(text)) == expected, text
            seen[expected] += 1
    assert seen[0] and seen[1]
    ordered = re.compile(json_schema_regex(schema, property_order="schema"))
    assert ordered.fullmatch('{"a":1,"c":null}') and not ordered.fullmatch('{"c":null,"a":1}')


def test_large_objects_accept_any_order_and_the_schema_order_is_an_option():
    # seven optional properties: over `ANY_ORDER_MAX` tracked as a set, so the "required" form
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(7)}}
    regex = re.compile(json_schema_regex(schema))
    assert regex.fullmatch('{"p0":1,"p6":2}') and regex.fullmatch('{"p6":2,"p0":1}')
    assert not regex.fullmatch('{"p6":"x","p0":1}')
    ordered = re.compile(json_schema_regex(schema, property_order="schema"))
    assert ordered.fullmatch('{"p0":1,"p6":2}') and not ordered.fullmatch('{"p6":2,"p0":1}')
    with pytest.raises(ValueError, match="property_order"):
        json_schema_regex(schema, property_order="sorted")


@pytest.mark.parametrize("form", UNORDERED_FORMS)
@pytest.mark.parametrize("extra", [None, "e"])
@pytest.mark.parametrize("required", list(itertools.product([False, True], repeat=3)))
@pytest.mark.parametrize("at_least_one", [None, [0, 2]], ids=["", "a-or-c"])
def test_each_unordered_form_is_the_language_it_promises(form, extra, required, at_least_one):
    # members `a`, `b`, `c` (each required or not) and additional members `e`, every sequence
    # of up to six: "exact" is JSON Schema's language; "required" repeats optional and
    # additional members; "chained" also keeps the required ones in the listed order; with
    # `at_least_one`, `a` or `c` must also be written (an `anyOf` of `required: [a]`, `[c]`)
    items = [(name, r) for name, r in zip("abc", required)]
    regex, empty, got = unordered_members(
        items, extra, ",", [1] * 4, 10**9, forms=(form,), at_least_one=at_least_one
    )
    assert got == form
    need = [name for name, r in items if r]
    for n in range(7):
        for sequence in itertools.product("abc" + ("e" if extra else ""), repeat=n):
            has_required = all(sequence.count(x) == 1 for x in need)
            if at_least_one is not None:
                has_required &= any("abc"[i] in sequence for i in at_least_one)
            once = all(sequence.count(x) <= 1 for x in "abc")
            expected = {
                "exact": has_required and once,
                "required": has_required,
                "chained": has_required and [x for x in sequence if x in need] == need,
            }[form]
            accepted = bool(re.fullmatch(regex, ",".join(sequence))) if n else empty
            assert accepted == expected, (form, sequence)


def test_unordered_objects_fall_back_to_the_schema_order_past_the_budget():
    items = [(name, True) for name in "abcdefgh"]  # eight required: chained, or the schema order
    regex, _, form = unordered_members(items, None, ",", [1] * 8, 10**9)
    assert form == "chained" and re.fullmatch(regex, "a,b,c,d,e,f,g,h")
    assert not re.fullmatch(regex, "b,a,c,d,e,f,g,h")
    # additional members copied between each two required ones: over the budget
    assert unordered_members(items, "x", ",", [1] * 8 + [10**6], 0) == (None, False, "schema")


def test_schema_or_required_first_accepts_exactly_the_two_orders():
    # MaskBench lists `properties` alphabetically while `required` keeps the author's order
    # (Glaive `calculate_area`: "shape" first); documents follow either order
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "string"},
            "c": {"type": "null"},
            "d": {
                "type": "object",
                "properties": {"y": {"type": "null"}, "x": {"type": "null"}},
                "required": ["x"],
            },
        },
        "required": ["c", "a"],
        "additionalProperties": False,
    }
    regex = re.compile(json_schema_regex(schema, property_order="schema_or_required_first"))
    validator = jsonschema.Draft202012Validator(schema)
    values = {"a": 1, "b": "x", "c": None}
    names = list(schema["properties"])
    accepted = 0
    for r in range(5):
        for keys in itertools.permutations("abcd", r):
            for inner in (("y", "x"), ("x", "y"), ("x",)):
                document = {k: values[k] if k != "d" else dict.fromkeys(inner) for k in keys}
                text = json.dumps(document, separators=(",", ":"))
                listed = list(keys)
                required_first = ["c", "a"] + [k for k in names if k in keys and k not in "ca"]
                in_order = listed in (sorted(listed, key=names.index), required_first)
                # inside `d` both orders of y and x are one of the two
                expected = validator.is_valid(document) and in_order
                assert bool(regex.fullmatch(text)) == expected, text
                accepted += expected
    assert accepted
    # nested objects too: `d` accepts "x" (required) before "y"
    assert regex.fullmatch('{"c":null,"a":1,"d":{"x":null,"y":null}}')
    assert not regex.fullmatch('{"a":1,"c":null,"b":"x"}')  # neither order
    ordered = re.compile(json_schema_regex(schema, property_order="schema"))
    assert ordered.fullmatch('{"a":1,"c":null}') and not ordered.fullmatch('{"c":null,"a":1}')


_KXY = {"kind": {"enum": ["a", "b", "c"]}, "x": {"type": "integer"}, "y": {"type": "string"}}
IF_CASES = {
    # JSON Schema Store's discriminated unions: one `if` per value of a listed property
    "discriminated_union": {
        "type": "object",
        "properties": _KXY,
        "additionalProperties": False,
        "allOf": [
            {"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]}},
            {
                "if": {"properties": {"kind": {"const": "b"}}, "required": ["kind"]},
                "then": {"required": ["y"]},
                "else": {"properties": {"y": False}},
            },
        ],
    },
    # no `type`: an `if` of `properties` holds for every non-object, so `then` applies
    "untyped_enum_condition": {
        "properties": _KXY,
        "if": {"properties": {"kind": {"enum": ["a", "c"]}}},
        "then": {"required": ["x"]},
        "else": {"not": {"required": ["x"]}},
    },
    # an `if` typed `object` is false for other values: `else` applies there
    "typed_condition": {
        "properties": _KXY,
        "if": {"type": "object", "properties": {"kind": {"const": "c"}}},
        "then": {"required": ["y"]},
        "else": {"type": ["object", "integer"]},
    },
    # conditions whose complement is a schema: a type, a `not` of `required`
    "type_condition": {"if": {"type": "string"}, "then": {"minLength": 2}},
    "required_condition": {
        "type": "object",
        "properties": _KXY,
        "if": {"required": ["x"]},
        "then": {"required": ["y"]},
        "else": {"properties": {"y": False}},
    },
}


@pytest.mark.parametrize("name", sorted(IF_CASES))
def test_conditionals_that_test_listed_values_are_exact(name):
    documents = [
        {k: kind if k == "kind" else {"x": 1, "y": "s"}[k] for k in keys}
        for r in range(4)
        for keys in itertools.combinations(["kind", "x", "y"], r)
        for kind in ("a", "b", "c")
    ]
    _assert_regex_decides_as_jsonschema(IF_CASES[name], documents + ["x", 1, 2.5, None, [1]])


def test_then_and_else_without_if_assert_nothing():
    schema = {"type": "integer", "then": {"minimum": 5}, "else": False}
    regex = re.compile(json_schema_regex(schema))
    assert regex.fullmatch("1") and regex.fullmatch("7")


def test_a_single_conditional_on_an_unlisted_string_is_exact():
    # the tested property's own values are not listed: the `else` side is "any string but
    # 'a'" (`not` of listed strings) or no `kind`... which the `if` holds for (o39097)
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "x": {"type": "integer"}},
        "if": {"properties": {"kind": {"const": "a"}}},
        "then": {"required": ["x"]},
    }
    documents = [{}, {"x": 1}, {"kind": "a"}, {"kind": "a", "x": 1}, {"kind": "b"}]
    documents += [{"kind": "ab", "x": 2}, {"kind": ""}, {"kind": 1}]
    _assert_regex_decides_as_jsonschema(schema, documents)


def test_several_conditionals_on_an_unlisted_string_are_exact():
    # JSON Schema Store's typo3.json: one `if` per value of a `type` property that lists no
    # values of its own: a branch per value the `if`s test, and one with every `else` for any
    # other string (a `not` of the listed strings), beside the absent and non-object branches
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "x": {"type": "integer"}, "y": {}},
        "allOf": [
            {"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]}},
            {
                "if": {"properties": {"kind": {"enum": ["b", "c"]}}, "required": ["kind"]},
                "then": {"required": ["y"]},
                "else": {"properties": {"y": False}},
            },
            {"if": {"properties": {"kind": {"const": "c"}}}, "then": {"properties": {"x": False}}},
        ],
    }
    documents = [
        {k: {"kind": kind, "x": 1, "y": None}[k] for k in keys}
        for r in range(4)
        for keys in itertools.combinations(["kind", "x", "y"], r)
        for kind in ("a", "b", "c", "d", "ab", "")
    ]
    _assert_regex_decides_as_jsonschema(schema, documents + [{"kind": 1}, "x", 1])


def test_conditionals_that_cannot_be_exact_are_still_refused():
    two_properties = {
        "type": "object",
        "properties": _KXY,
        "allOf": [
            {"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]}},
            {"if": {"properties": {"x": {"const": 1}}}, "then": {"required": ["y"]}},
        ],
    }
    with pytest.raises(UnsupportedSchemaError, match="if"):
        json_schema_regex(two_properties)


def test_a_boolean_discriminator_and_an_any_of_beside_the_conditionals():
    # content-patcher (MaskBench o32451): `if AllowBlank is false then Default is required`;
    # the schema's own `anyOf` is distributed over the conditional's branches
    schema = {
        "type": "object",
        "properties": {"blank": {"type": "boolean"}, "x": {"type": "integer"}, "y": {}},
        "additionalProperties": False,
        "anyOf": [{"required": ["x"]}, {"required": ["y"]}],
        "allOf": [{"if": {"properties": {"blank": {"const": False}}}, "then": {"required": ["x"]}}],
    }
    documents = [
        {k: {"blank": blank, "x": 1, "y": None}[k] for k in keys}
        for r in range(4)
        for keys in itertools.combinations(["blank", "x", "y"], r)
        for blank in (False, True)
    ]
    _assert_regex_decides_as_jsonschema(schema, documents)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "multipleOf": 0.01},  # money: at most two fraction digits
        {"type": "number", "multipleOf": 0.1, "minimum": 0, "exclusiveMaximum": 3},
        {"type": "number", "multipleOf": 1.0, "minimum": -2},  # integer values
        {"type": ["number", "null"], "multipleOf": 0.001, "maximum": 1},
        {"type": "integer", "multipleOf": 0.25, "maximum": 7},  # every integer is a multiple
        {"multipleOf": 0.1},  # untyped: other types unconstrained
        {"type": "number", "multipleOf": 0.01, "minimum": 0.5},  # decimal bounds too (o46322)
        {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 2.95},
        # other steps: a remainder automaton, written as a regex
        {"type": "integer", "multipleOf": 5},
        {"type": "integer", "multipleOf": 3, "minimum": -3, "maximum": 12},
        {"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 30},  # a finite range
        {"type": "number", "multipleOf": 0.25},
        {"type": "number", "multipleOf": 2.5, "exclusiveMinimum": 0},
        {"type": "number", "multipleOf": 1.5, "maximum": 3},
        {"type": ["integer", "string"], "multipleOf": 10},
    ],
)
def test_multiple_of_is_exact(schema):
    # The reference: jsonschema for the other keywords, exact decimal division for
    # `multipleOf` (the spec's "division results in an integer"; jsonschema divides floats,
    # and 100.1 / 0.1 = 1000.9999999999999 fails there)
    from decimal import Decimal

    texts = ["0", "1", "2", "7", "12", "-1", "-3", "0.5", "1.25", "1.50", "2.999", "0.001"]
    texts += ["0.0001", "3", "2.95", "-1.1", "1.0", "8", "100.10", "1.2345", "null", '"x"']
    texts += ["5", "10", "-15", "21", "28", "0.75", "7.5", "7.50", "4.5", "-1.5", "12.25", "60"]
    if schema.get("type") == "integer":  # (integers are generated without a fraction)
        texts = [t for t in texts if "." not in t]
    regex = re.compile(json_schema_regex(schema))
    others = jsonschema.Draft202012Validator({k: v for k, v in schema.items() if k != "multipleOf"})
    step = Decimal(repr(schema["multipleOf"]))
    verdicts = set()
    for text in texts:
        value = json.loads(text)
        multiple = not isinstance(value, (int, float)) or Decimal(text) % step == 0
        expected = others.is_valid(value) and multiple
        assert bool(regex.fullmatch(text)) == expected, (schema, text)
        verdicts.add(expected)
    assert verdicts == {True, False}


def test_multiples_without_a_compact_regex_are_refused_by_name():
    for schema in (
        {"type": "number", "multipleOf": 0.07},
        {"type": "integer", "multipleOf": 11},
    ):
        with pytest.raises(UnsupportedSchemaError, match="multipleOf"):
            json_schema_regex(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}},
        {"type": "array", "contains": {"type": "string"}},
        {
            "type": "array",
            "items": {"enum": [1, 2, "a"]},
            "contains": {"const": 2},
            "minContains": 2,
        },
        {"contains": {"const": 1}},  # untyped: other types unconstrained
        {"type": "array", "contains": {"const": 1}, "minContains": 0},  # no constraint
    ],
)
def test_contains_is_exact(schema):
    documents = [
        list(p) for r in range(4) for p in itertools.product([1, 2, 5, "a", None], repeat=r)
    ]
    _assert_regex_decides_as_jsonschema(schema, documents + [3, "s", {}])


def test_contains_with_item_counts_or_max_contains_is_refused():
    for schema in (
        {"type": "array", "contains": {"const": 1}, "maxItems": 3},
        {"type": "array", "contains": {"const": 1}, "maxContains": 2},
    ):
        with pytest.raises(UnsupportedSchemaError, match="ontains"):
            json_schema_regex(schema)


def test_items_and_property_names_in_both_schemas_of_an_all_of_are_both_enforced():
    # MaskBench Github_medium o39097: `items` of one side, `items: {required: [...]}` of the
    # other (was "cannot combine two different `items`")
    schema = {
        "allOf": [
            {"type": "array", "items": {"type": "object", "properties": {"t": {"type": "string"}}}},
            {"items": {"required": ["t"]}, "maxItems": 2},
        ]
    }
    documents = [[], [{"t": "a"}], [{"t": 1}], [{}], [{"t": "a"}, {"t": "b", "u": 2}]]
    documents += [[{"t": "a"}, {"u": 1}], [{"t": "a"}] * 3, [1]]
    _assert_regex_decides_as_jsonschema(schema, documents)
    names = {
        "allOf": [
            {"type": "object", "propertyNames": {"maxLength": 1}, "maxProperties": 2},
            {"propertyNames": {"enum": ["t", "uu", "v"]}},
        ]
    }
    documents = [{}, {"t": 1}, {"t": 1, "v": 2}, {"uu": 1}, {"w": 1}, {"t": 1, "w": 2}]
    _assert_regex_decides_as_jsonschema(names, documents)


def test_a_nested_list_of_values_obeys_the_keywords_beside_it():
    # `enum` beside `maxLength` / `minimum` / `pattern` inside an object: each listed value is
    # kept only if the other keywords accept it (they were ignored below the top level)
    schema = {
        "type": "object",
        "properties": {
            "k": {"enum": ["t", "uu", 5, 7], "maxLength": 1, "minimum": 6},
            "p": {"type": "string", "enum": ["ab", "cd"], "pattern": "^a"},
        },
        "required": ["k"],
        "additionalProperties": False,
    }
    documents = [{"k": v} for v in ("t", "uu", 5, 7, "x")]
    documents += [{"k": "t", "p": v} for v in ("ab", "cd", "a")]
    _assert_regex_decides_as_jsonschema(schema, documents)


def test_conditionals_under_a_draft_before_7_are_annotations():
    # `if`/`then`/`else` came with draft 7: under draft 4 or 6 they assert nothing, as
    # jsonschema reads them (MaskBench o39097, a draft-04 schema, labels by that reading)
    for dialect in (
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-06/schema#",
    ):
        schema = {
            "$schema": dialect,
            "type": "object",
            "properties": {"kind": {"type": "string"}, "x": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "a"}}},
            "then": {"required": ["x"]},
            "allOf": [{"if": {"required": ["x"]}, "then": {"required": ["kind"]}}],
        }
        regex = re.compile(json_schema_regex(schema))
        validator = jsonschema.validators.validator_for(schema)(schema)
        for document in [{}, {"kind": "a"}, {"x": 1}, {"kind": "b", "x": 1}, {"kind": 1}]:
            text = json.dumps(document, separators=(",", ":"))
            assert bool(regex.fullmatch(text)) == validator.is_valid(document), (dialect, text)
        assert regex.fullmatch('{"kind":"a"}')  # what draft 7 would reject


_DRAFT_04 = "http://json-schema.org/draft-04/schema#"
_DRAFT_07 = "http://json-schema.org/draft-07/schema#"
DIALECT_CASES = {
    # draft 4-7: the keywords beside a `$ref` are ignored (GOV.UK's content schemas in
    # MaskBench put `"maxItems": 1` there); from 2019-09 they apply
    "draft-07 $ref siblings": (
        {
            "$schema": _DRAFT_07,
            "type": "object",
            "properties": {"links": {"$ref": "#/definitions/links", "maxItems": 1}},
            "definitions": {"links": {"type": "array", "items": {"type": "integer"}}},
        },
        [{"links": [1]}, {"links": [1, 2]}, {"links": ["a"]}],
    ),
    "2020-12 $ref siblings": (
        {
            "type": "object",
            "properties": {"links": {"$ref": "#/$defs/links", "maxItems": 1}},
            "$defs": {"links": {"type": "array", "items": {"type": "integer"}}},
        },
        [{"links": [1]}, {"links": [1, 2]}, {"links": ["a"]}],
    ),
    # keywords of later drafts are annotations under an earlier `$schema`
    "draft-04 const, propertyNames, contains": (
        {
            "$schema": _DRAFT_04,
            "type": "object",
            "properties": {
                "kind": {"type": "string", "const": "a"},
                "tags": {"type": "array", "contains": {"type": "integer"}},
            },
            "propertyNames": {"maxLength": 1},
        },
        [{"kind": "a"}, {"kind": "b", "tags": ["x"]}, {"kind": 1}, {"tags": "x"}],
    ),
    "draft-07 prefixItems, dependentRequired": (
        {
            "$schema": _DRAFT_07,
            "type": "object",
            "properties": {
                "a": {"type": "array", "prefixItems": [{"type": "string"}]},
                "b": {"type": "integer"},
            },
            "dependentRequired": {"a": ["b"]},
        },
        [{"a": [1]}, {"a": ["x"], "b": 1}, {"b": "x"}],
    ),
    # and keywords of earlier drafts under 2020-12 (the default)
    "2020-12 dependencies": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependencies": {"a": ["b"]},
        },
        [{"a": 1}, {"a": 1, "b": 2}, {"a": "x"}],
    ),
}


@pytest.mark.parametrize("name", sorted(DIALECT_CASES))
def test_keywords_follow_the_dialect_of_the_schema(name):
    # What the schema's own dialect does not assert is an annotation, as jsonschema reads it
    # (MaskBench's labels follow the declared `$schema`; `in_dialect`).
    schema, documents = DIALECT_CASES[name]
    regex = re.compile(json_schema_regex(schema))
    validator = jsonschema.validators.validator_for(schema)(schema)
    verdicts = set()
    for document in documents:
        text = json.dumps(document, separators=(",", ":"))
        assert bool(regex.fullmatch(text)) == validator.is_valid(document), text
        verdicts.add(validator.is_valid(document))
    assert verdicts == {True, False}


def test_a_subschema_whose_id_is_no_string_is_read_as_an_annotation():
    # MaskBench o28532: a `$ref` into an unknown member whose `items` lists properties without
    # `properties`, one named `id`: draft 4's base-URI keyword with an object value, which
    # `referencing` failed on (AttributeError) while reading base URIs
    schema = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"cats": {"$ref": "#/lists/cats"}},
        "required": ["cats"],
        "lists": {"cats": {"type": "array", "items": {"id": {"type": "integer"}}}},
    }
    regex = re.compile(json_schema_regex(schema))
    validator = jsonschema.validators.validator_for(schema)(schema)
    for document in [{"cats": []}, {"cats": 1}, {}]:
        text = json.dumps(document, separators=(",", ":"))
        assert bool(regex.fullmatch(text)) == validator.is_valid(document), text
    # (jsonschema itself fails on the items: by hand, `id` asserts nothing, any item is valid)
    assert regex.fullmatch(json.dumps({"cats": [1, "a", {"id": "x"}]}, separators=(",", ":")))


def test_at_least_one_of_these_required_is_exact_and_small():
    # `anyOf` of single `required` names (217 MaskBench schemas; o21108 has 8) is rewritten as
    # "the first present is x_i": the same documents, and a DFA that follows one branch once a
    # name is seen instead of every subset of names still possible (measured: 8 names, DFA
    # 302,634 states before)
    from functional_gen.structured.byte_dfa import regex_byte_dfa

    names = ["e", "b", "d", "a", "c"]  # not in the properties' order
    schema = {
        "type": "object",
        "properties": {n: {"type": "array", "items": {"enum": [1, 2]}} for n in "abcdef"},
        "additionalProperties": False,
        "anyOf": [{"required": [n], "title": "one"} for n in names],
    }
    documents = []
    for present in itertools.product([False, True], repeat=6):
        document = {n: [1, 2][: i % 3] for i, n in enumerate("abcdef") if present[i]}
        documents += [document, dict(reversed(document.items()))]  # any order, the default
    _assert_regex_decides_as_jsonschema(schema, documents + [{"a": [3]}, {"g": [1]}])
    # in any order (the default) the object tracks whether one of the names was written: at
    # most twice its states without the `anyOf` (as five `anyOf` branches, each an object in
    # any order, the union's DFA was 7,426 states against 239); in schema order, the first
    # name present chooses one branch
    for order in ("any", "schema"):
        dfa = regex_byte_dfa(json_schema_regex(schema, property_order=order))
        without = regex_byte_dfa(json_schema_regex({**schema, "anyOf": [{}]}, property_order=order))
        assert dfa.num_states < 4 * without.num_states, (order, dfa.num_states, without.num_states)
    # where the object keeps the schema order (a count: `maxProperties`), the names as
    # "the first present is x_i" there
    bounded = {**schema, "maxProperties": 5}
    ordered = [d for d in documents[::2] if len(d) != 6] + [documents[-2]]
    _assert_regex_decides_as_jsonschema(bounded, ordered + [{"a": [3]}, {"f": [1]}])


def test_at_least_one_past_the_budget_is_one_object_per_first_name(monkeypatch):
    # where the object with the names tracked does not fit (`unordered_members` refuses it),
    # "the first present is x_i", each of those objects in any order where it fits alone:
    # still every valid document in every order
    from functional_gen.structured.json_schema import property_order

    tracked = property_order.unordered_members

    def refused_with_names(*args, at_least_one=None, **kwargs):
        if at_least_one:
            return None, False, "schema"
        return tracked(*args, **kwargs)

    monkeypatch.setattr(property_order, "unordered_members", refused_with_names)
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in "abcd"},
        "additionalProperties": False,
        "anyOf": [{"required": [n]} for n in "dba"],
    }
    documents = [
        {n: i for i, n in enumerate(keys)}
        for k in range(5)
        for keys in itertools.permutations("abcd", k)
    ]
    _assert_regex_decides_as_jsonschema(schema, documents + [{"a": "x"}])
