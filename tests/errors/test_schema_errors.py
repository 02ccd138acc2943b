"""JSON Schemas that are too large, admit no value or break their metaschema are refused with an
error that names the size or the place, before anything is compiled (issue 43, items 5 and 6).

Each class of error has one test: the size refusal (timed loosely: the point is that a 10 MB
schema is not read in full, checked against its metaschema and compiled for minutes), each
pair of keywords that excludes every value at a nested location, the same reached through a
`$ref` (the location of the subschema itself, not of the reference), and a metaschema failure
translated into `InvalidSchemaError` with `jsonschema`'s error as its `__cause__`.
"""

import json
import time

import jsonschema
import pytest

from functional_gen.structured.json_schema import (
    InvalidSchemaError,
    SchemaTooLargeError,
    UnsatisfiableSchemaError,
    budgets,
    json_schema_compile,
    json_schema_regex,
)
from functional_gen.structured.vocabulary import TokenVocabulary

from .compilations import count_compilations

BYTES = TokenVocabulary(tuple(bytes([b]) for b in range(256)) + (None,), (256,), "bytes-only")
"""A vocabulary of the 256 single bytes (and EOS 256): enough for `json_schema_compile`."""


def _huge_schema(megabytes: int) -> dict:
    """An object schema of about `megabytes` MB of JSON text: properties with long descriptions."""
    count = megabytes * 10_000
    return {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "x" * 90} for i in range(count)},
    }


@pytest.mark.parametrize("as_text", [False, True])
def test_a_schema_over_the_size_limit_is_refused_at_once(as_text, monkeypatch):
    schema = _huge_schema(10)
    if as_text:
        schema = json.dumps(schema)
    checked = []
    monkeypatch.setattr(
        jsonschema.Draft202012Validator,
        "check_schema",
        classmethod(lambda cls, s, *a, **k: checked.append(s)),
    )
    start = time.perf_counter()
    with count_compilations() as compiled, pytest.raises(SchemaTooLargeError) as refused:
        json_schema_compile(schema, BYTES, cache=False)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"the refusal took {elapsed:.2f} s"
    assert checked == []  # before `jsonschema.check_schema`
    assert compiled == []
    message = str(refused.value)
    assert f"limit of {budgets.MAX_SCHEMA_BYTES:,} bytes" in message
    assert f"{refused.value.size:,}" in message
    assert refused.value.limit == budgets.MAX_SCHEMA_BYTES
    assert refused.value.size > budgets.MAX_SCHEMA_BYTES


def test_a_schema_just_under_the_size_limit_is_read():
    # The limit is on the schema's JSON text; a schema under it goes on to its checks (here:
    # a property whose schema has a wrong type, named by the metaschema).
    schema = {"type": "object", "properties": {"a": {"type": "strnig"}}}
    schema["description"] = "x" * (budgets.MAX_SCHEMA_BYTES - len(json.dumps(schema)) - 100)
    with pytest.raises(InvalidSchemaError, match="#/properties/a/type"):
        json_schema_regex(schema)


NESTED = [
    ({"enum": []}, "enum", "enum is empty"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "maxLength", "minLength 5 > maxLength 2"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "maxItems", "minItems 3 > maxItems 1"),
    ({"type": "integer", "minimum": 3, "maximum": 1}, "maximum", "minimum 3 > maximum 1"),
    ({"type": "number", "minimum": 3.5, "maximum": 1}, "maximum", "minimum 3.5 > maximum 1"),
    (
        {"type": "object", "minProperties": 2, "maxProperties": 1},
        "maxProperties",
        "minProperties 2 > maxProperties 1",
    ),
    (
        {"type": "string", "const": 1},
        "const",
        "no value listed by `const` is valid under the node's other keywords",
    ),
    ({"type": "integer", "minimum": 1.5, "maximum": 1.7}, "maximum", "no integer lies within"),
    (
        {"type": "number", "exclusiveMinimum": 1, "maximum": 1},
        "maximum",
        "exclusiveMinimum 1 >= maximum 1",
    ),
]


@pytest.mark.parametrize(("subschema", "keyword", "reason"), NESTED)
def test_a_nested_subschema_that_admits_no_value_is_named_with_its_keyword(
    subschema, keyword, reason
):
    schema = {
        "type": "object",
        "properties": {
            "outer": {
                "type": "object",
                "properties": {"a": subschema},
                "required": ["a"],
            }
        },
        "required": ["outer"],
    }
    with count_compilations() as compiled, pytest.raises(UnsatisfiableSchemaError) as refused:
        json_schema_compile(schema, BYTES, cache=False)
    assert compiled == []
    error = refused.value
    assert error.path == "#/properties/outer/properties/a"
    assert error.keyword == keyword
    assert str(error).startswith(f"#/properties/outer/properties/a: {reason}")


@pytest.mark.parametrize(("subschema", "keyword", "reason"), NESTED)
def test_the_location_is_the_subschema_reached_through_ref_not_the_reference(
    subschema, keyword, reason
):
    schema = {
        "$defs": {"x": subschema},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/x"}},
        "required": ["a"],
    }
    with pytest.raises(UnsatisfiableSchemaError) as refused:
        json_schema_regex(schema)
    assert refused.value.path == "#/$defs/x"
    assert str(refused.value).startswith(f"#/$defs/x: {reason}")
    assert "$ref at #" not in str(refused.value)


def test_an_optional_property_that_admits_no_value_is_left_out_not_refused():
    # The schema as a whole admits objects without `a`: nothing to refuse.
    schema = {"type": "object", "properties": {"a": {"enum": []}}, "additionalProperties": False}
    assert json_schema_regex(schema)


def test_a_metaschema_failure_is_translated_with_its_location_and_cause():
    schema = {"type": "object", "properties": {"a": {"type": "array", "minItems": -1}}}
    with count_compilations() as compiled, pytest.raises(InvalidSchemaError) as refused:
        json_schema_compile(schema, BYTES, cache=False)
    assert compiled == []
    error = refused.value
    assert error.path == "#/properties/a/minItems"
    assert error.schema_path  # where in the metaschema, e.g. .../minItems/minimum
    assert "#/properties/a/minItems" in str(error)
    assert isinstance(error.__cause__, jsonschema.exceptions.SchemaError)
    assert error.reason == error.__cause__.message
