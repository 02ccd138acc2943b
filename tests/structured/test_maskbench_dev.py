"""Complete masks: every valid document's own tokens pass the mask at every step and end in EOS,
every invalid one is cut, on MaskBench's development data (a fixed subset; the whole set is
`benchmarks/bench_json_schema.py`) and on random schemas of the shapes that refused valid
documents (keys sharing prefixes, enums of strings, optional and additional properties, any
order of the members)."""

import json
import random
import warnings

import jsonschema
import pytest

from functional_gen.structured.automaton import ConstraintError
from functional_gen.structured.json_schema import UnsupportedSchemaError, json_schema_compile

from .helpers import format_checker
from .maskbench import DEV_DATA, dev_records, refused_at

# Glaive's `calculate_area` schemas list `dimensions` first and their documents `shape` first
ORDER_FILE = "calculate_area_87069d3b.json"


def _compile(schema, vocabulary):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return json_schema_compile(schema, vocabulary, cache=False)


def _check_record(record, tokenizer, vocabulary) -> int:
    """Compile `record`'s schema (skipped when refused) and check every test document; the
    number of documents checked."""
    try:
        automaton = _compile(record["schema"], vocabulary)
    except (UnsupportedSchemaError, ConstraintError):  # refused by name: not a mask question
        return 0
    eos = vocabulary.eos_token_id[0]
    for test in record["tests"]:
        text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
        where = refused_at(automaton, tokenizer.encode(text, add_special_tokens=False), eos)
        if test["valid"]:
            assert where is None, (record["file"], text[:200], where)
        else:
            assert where is not None, (record["file"], text[:200])
    return len(record["tests"])


@pytest.mark.skipif(not DEV_DATA.exists(), reason="MaskBench's development data is not here")
def test_dev_subset_valid_tokens_pass_and_invalid_ones_are_cut(tokenizer, vocabulary):
    # 8 schemas of at most 800 characters drawn with a fixed seed (33 documents), and one whose
    # documents list properties in another order than the schema (refused before); 16 of
    # 1,500 characters and both `calculate_area` schemas took 13 minutes on a loaded box
    records = dev_records(8, seed=55, max_schema_chars=800)
    records += [r for r in dev_records(10**6) if r["file"].endswith(ORDER_FILE)]
    checked = sum(_check_record(r, tokenizer, vocabulary) for r in records)
    assert checked >= 30


WORDS = ("Framework", "FrameworkVersion", "name", "names", "id", "ids", "kind", "value", "v")


def _random_schema(rng: random.Random) -> dict:
    """An object whose keys share prefixes, with enums of strings, optional properties, open or
    closed, maybe a nested object of the same kind."""
    names = rng.sample(WORDS, rng.randint(2, 5))
    properties = {}
    for name in names:
        kind = rng.choice(("enum", "string", "integer", "nested"))
        if kind == "enum":
            properties[name] = {"type": "string", "enum": rng.sample(["a", "ab", "b", "Django"], 2)}
        elif kind == "nested":
            inner = rng.sample(WORDS, 2)
            properties[name] = {
                "type": "object",
                "properties": {n: {"enum": ["x", "xy"]} for n in inner},
                "required": inner[:1],
                "additionalProperties": False,
            }
        else:
            properties[name] = {"type": kind}
    schema = {
        "type": "object",
        "properties": properties,
        "required": rng.sample(names, rng.randint(0, len(names))),
    }
    # closed, or additional integers (regular: a token automaton, quicker to build than the
    # pushdown automaton of free-form values, which the development subset covers)
    schema["additionalProperties"] = rng.choice([False, {"type": "integer"}])
    return schema


def _random_value(rng: random.Random, schema: dict):
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if schema.get("type") == "object":
        return _random_document(rng, schema)
    return rng.randint(-5, 50) if schema.get("type") == "integer" else rng.choice(["", "x y"])


def _random_document(rng: random.Random, schema: dict) -> dict:
    """Some of the properties (the required ones usually), in a random order, maybe an extra."""
    properties = schema["properties"]
    names = [n for n in properties if n in schema.get("required", []) or rng.random() < 0.5]
    if rng.random() < 0.15 and names:
        names.pop(rng.randrange(len(names)))  # a required one may go: invalid
    if rng.random() < 0.3:
        names.append(rng.choice(["extra", "Frame", "idx"]))  # additional: invalid when closed
    rng.shuffle(names)
    return {n: _random_value(rng, properties.get(n, {"type": "integer"})) for n in names}


@pytest.mark.parametrize("seed", range(5))
def test_random_schemas_tokens_pass_exactly_for_valid_documents(tokenizer, vocabulary, seed):
    rng = random.Random(seed)
    schema = _random_schema(rng)
    automaton = _compile(schema, vocabulary)
    validator = jsonschema.Draft202012Validator(schema, format_checker=format_checker())
    eos = vocabulary.eos_token_id[0]
    outcomes = set()
    for _ in range(12):
        document = _random_document(rng, schema)
        for separators in ((",", ":"), (", ", ": ")):
            text = json.dumps(document, separators=separators)
            where = refused_at(automaton, tokenizer.encode(text, add_special_tokens=False), eos)
            valid = validator.is_valid(document)
            assert (where is None) == valid, (schema, text, where)
            outcomes.add(valid)
    assert True in outcomes
