"""JSON Schema: every document the automaton can produce validates (jsonschema, with formats;
pydantic for models); what cannot be enforced is refused with the keyword named."""

import json

import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured import UnsupportedSchemaError, json_schema_regex, regex_automaton
from functional_gen.structured.json_schema import schema_as_dict

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
        ({"not": {"type": "string"}}, "not"),
        ({"type": "integer", "multipleOf": 3}, "multipleOf"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "string", "format": "hostname"}, "format"),
        ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, "patternProperties"),
        ({"if": {"type": "string"}, "then": {"minLength": 2}}, "if"),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, "required"),
        ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, "oneOf"),
        ({"type": "number", "minimum": 0.5}, "minimum"),
        ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength"),
        ({"type": "string", "pattern": "(?=a)"}, "pattern"),
        ({"$ref": "https://example.com/schema.json"}, "$ref"),
        ({"type": "array", "contains": {"const": 1}}, "contains"),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 2}, "minProperties"),
        ({"type": "strnig"}, "type"),
        ({"tpye": "string"}, "tpye"),
        ({"$defs": {"n": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}, "required": ["n"]}},
          "$ref": "#/$defs/n"}, "$ref"),
    ],
)
def test_unsupported_keywords_are_named(tokenizer, schema, keyword):
    with pytest.raises(UnsupportedSchemaError, match=f"keyword `{keyword.replace('$', '[$]')}`") as info:
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

    assert re.fullmatch(regex, "120") and not re.fullmatch(regex, "121") and not re.fullmatch(regex, "-1")
    merged = json_schema_regex(SCHEMAS["all_of"][1])
    assert re.fullmatch(merged, '{"name":"A","age":3,"title":"B"}') and "}{" not in merged.replace("\\}\\{", "}{")
    tree = json_schema_regex(SCHEMAS["tree"][1], max_recursion_depth=1)
    assert re.fullmatch(tree, '{"value":1,"children":[]}') and not re.fullmatch(tree, '{"value":1,}')


def test_enum_values_of_other_types_are_dropped():
    import re

    regex = json_schema_regex({"type": "string", "enum": ["a", 1, None, "b"]})
    assert re.fullmatch(regex, '"a"') and not re.fullmatch(regex, "1") and not re.fullmatch(regex, "null")


def test_schema_inputs(tokenizer):
    from .cases import Movie

    as_dict = schema_as_dict(Movie)
    assert as_dict["properties"]["year"]["minimum"] == 1900
    text_schema = json.dumps(SCHEMAS["sentiment"][1])
    a = fg.processors.JsonSchema(text_schema, tokenizer)
    b = fg.processors.JsonSchema(SCHEMAS["sentiment"][1], tokenizer)
    np.testing.assert_array_equal(np.asarray(a.transitions), np.asarray(b.transitions))
