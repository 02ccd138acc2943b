"""Member counts (`minProperties`/`maxProperties`) in any order; `pattern` / `format` together
with `minLength` / `maxLength`, and numbers with decimal bounds, at the schema level: a document is accepted exactly when `jsonschema` (with its format checker)
says it is valid, among the texts generation may write (the canonical JSON spelling,
`ensure_ascii=False`; `pattern`'s `\\d\\w\\s` narrowed to ASCII, see `patterns`)."""

import itertools
import json
import random
import re

import jsonschema
import pytest

from functional_gen.structured import UnsupportedSchemaError, json_schema as js, json_schema_regex
from functional_gen.structured.formats import EMAIL
from functional_gen.structured.json_schema import budgets
from functional_gen.structured.pushdown import PushdownAutomaton
from functional_gen.structured.vocabulary import TokenVocabulary

from .helpers import format_checker

BYTES = TokenVocabulary(tuple(bytes([b]) for b in range(256)) + (None,), (256,), "bytes-only")
"""Single-byte tokens (EOS 256): the automaton's byte language is what is compared."""

WORDS = {  # MaskBench Github_medium o74461, with smaller bounds
    "type": "string",
    "pattern": "^[a-zA-Z0-9\\-]+(\\s[a-zA-Z0-9\\-]+)*$",
    "minLength": 2,
    "maxLength": 5,
}
FEW_WORDS = {  # MaskBench Github_hard o21075, with smaller bounds
    "type": "string",
    "pattern": "^(?:\\S+\\s+){0,2}\\S+$",
    "maxLength": 5,
}
UNANCHORED = {"type": "string", "pattern": "é.", "minLength": 3, "maxLength": 4}
CONTROLS = {"type": "string", "pattern": "^[\\x00-\\x7e]*x$", "maxLength": 3}
"""Explicit control characters: written `\\u0001`, six bytes for one character."""

CASES = {
    "words": (WORDS, "ab-1 \t"),
    "few_words": (FEW_WORDS, 'ab"\\ \t'),
    "unanchored_multibyte": (UNANCHORED, 'aé€😀"\\'),
    "controls": (CONTROLS, 'x\x01\t"'),
}
"""Alphabets without a newline: Python's `$` (jsonschema's) also matches before a final `\n`,
ECMA-262's does not, and the translation follows ECMA-262."""


def _values(alphabet: str, longest: int, count: int = 1500):
    rng = random.Random(len(alphabet))
    out = {""}
    for n in range(1, longest + 1):
        if len(alphabet) ** n <= 400:
            out.update("".join(p) for p in itertools.product(alphabet, repeat=n))
        else:
            out.update("".join(rng.choice(alphabet) for _ in range(n)) for _ in range(count // 4))
    return sorted(out)


def _accepts(automaton, text: str) -> bool:
    data = text.encode("utf-8")
    if isinstance(automaton, PushdownAutomaton):
        return automaton.accepts(data)
    return bool(automaton.accepting[automaton.walk(data)])


def _valid(document, schema) -> bool:
    return jsonschema.Draft202012Validator(schema, format_checker=format_checker()).is_valid(
        document
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_length_bounded_pattern_is_exact(name):
    schema, alphabet = CASES[name]
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    lengths = [0, 0]
    for value in _values(alphabet, schema["maxLength"] + 2):
        text = json.dumps(value, ensure_ascii=False)
        valid = _valid(value, schema)
        assert _accepts(automaton, text) == valid, (value, text, valid)
        lengths[valid] += 1
    assert lengths[0] and lengths[1]  # both sides are exercised


def test_lengths_count_decoded_characters():
    automaton = js.json_schema_compile(CONTROLS, BYTES, cache=False)
    assert _accepts(automaton, r'"\u0001\nx"')  # 3 characters, 9 bytes
    assert not _accepts(automaton, r'"\u0001\n\"x"')  # 4 characters
    multibyte = js.json_schema_compile(UNANCHORED, BYTES, cache=False)
    assert _accepts(multibyte, '"😀é€😀"')  # 4 characters, 15 bytes
    assert not _accepts(multibyte, '"😀é€😀a"')
    assert not _accepts(multibyte, '"é€"')  # 2 characters


def test_format_with_length_is_exact():
    schema = {"type": "string", "format": "email", "maxLength": 7}
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    accepted = 0
    for value in _values("ab.@", 9):
        text = json.dumps(value)
        expected = bool(re.fullmatch(EMAIL, value)) and len(value) <= 7  # the strict format
        assert _accepts(automaton, text) == expected, value
        if expected:
            accepted += 1
            assert _valid(value, schema)
    assert accepted
    assert _accepts(automaton, '"a@b.cd"') and not _accepts(automaton, '"abc@b.cd"')


def test_strings_in_an_array_and_an_object():
    # one call site per counted item: the string's automaton is spliced in at each
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": WORDS, "maxItems": 2}, "n": FEW_WORDS},
        "required": ["tags"],
        "additionalProperties": False,
    }
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    values = _values("a -", 6, 60)
    rng = random.Random(0)
    for _ in range(400):
        document = {"tags": [rng.choice(values) for _ in range(rng.randint(0, 3))]}
        if rng.random() < 0.5:
            document["n"] = rng.choice(values)
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        assert _accepts(automaton, text) == _valid(document, schema), text


def test_a_spliced_automaton_estimated_too_large_is_refused_before_it_is_built(monkeypatch):
    """MaskBench o74461 in small: a 128-character `hostname` (30,445 states, too many for any
    grammar form) beside an array of up to 100 counted strings. The whole regex's DFA would have
    about 120,000 states before the hostname is spliced in: refused from the regex's weight,
    before that DFA is built (10 s before). With 2 items it compiles, the hostname spliced in."""

    def schema(max_items):
        return {
            "type": "object",
            "properties": {
                "website": {"type": "string", "format": "hostname", "maxLength": 128},
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 120},
                    "maxItems": max_items,
                },
            },
            "required": ["website"],
            "additionalProperties": False,
        }

    small = js.json_schema_compile(schema(2), BYTES, cache=False)
    assert _accepts(small, '{"website":"a.b","tags":["x","y"]}')
    assert _accepts(small, '{"tags":["x","y"],"website":"a.b"}')  # any order, the default
    assert not _accepts(small, '{"website":"a..b"}')
    assert not _accepts(small, json.dumps({"website": "a" * 64}, separators=(",", ":")))

    def not_built(*args):
        raise AssertionError("the spliced DFA was built")

    monkeypatch.setattr(js.compiling, "spliced_dfa", not_built)  # where it is called
    # the estimate, on the schema-order regex (in any order, the default, `tags` is written
    # twice, before and after `website`: its regex's weight is over `SINGLE_REGEX_WEIGHT`, so
    # there is no single regex to splice into, and the hostname's 30,445 states alone are
    # too many for a grammar form: refused before any automaton, below)
    with pytest.raises(UnsupportedSchemaError, match="estimated from its regex") as info:
        js.json_schema_compile(schema(100), BYTES, cache=False, property_order="schema")
    assert info.value.path == "#/properties/website"
    with (
        pytest.warns(UserWarning, match="no pushdown automaton"),
        pytest.raises(js.TooManyPositions, match="#/properties/website has 30,445 states"),
    ):
        js.json_schema_compile(schema(100), BYTES, cache=False)


def test_grammar_form_calls_the_string_automaton():
    schema = {
        "type": "object",
        "properties": {"a": WORDS, "b": {"type": "array", "items": WORDS}},
        "required": ["a"],
        "additionalProperties": False,
    }
    grammar = js.json_schema_grammar(schema, BYTES)
    assert isinstance(grammar, PushdownAutomaton)
    values = _values("a -", 6, 60)
    rng = random.Random(1)
    for _ in range(300):
        document = {"a": rng.choice(values)}
        if rng.random() < 0.5:
            document["b"] = [rng.choice(values) for _ in range(rng.randint(0, 3))]
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        assert grammar.accepts(text.encode()) == _valid(document, schema), text


def test_distributed_alternation_stays_a_regex():
    # MaskBench Github_hard o9917 with a small maxLength: each branch bounded in the regex
    schema = {
        "type": "string",
        "maxLength": 30,
        "pattern": "^data:image/(jpg|jpeg|png|svg\\+xml);base64,[0-9a-zA-Z+/=]*$",
    }
    regex = re.compile(json_schema_regex(schema))
    for kind, payload in itertools.product(["jpg", "jpeg", "png", "svg+xml", "gif"], range(12)):
        value = f"data:image/{kind};base64," + "A" * payload
        assert bool(regex.fullmatch(json.dumps(value))) == _valid(value, schema), value


@pytest.mark.parametrize(
    "schema,keyword,message",
    [
        ({"type": "string", "format": "email", "maxLength": 100_000}, "maxLength", "100,000"),
        ({"type": "string", "pattern": "^[a-z]*$", "maxLength": 20_000}, "pattern", "20,000"),
        (
            {"type": "string", "pattern": "^(?:\\S+\\s+){0,29}\\S+$", "maxLength": 400},
            "pattern",
            "states",
        ),
        ({"anyOf": [WORDS, {"type": "string", "maxLength": 1}]}, "pattern", "anyOf"),
    ],
)
def test_too_large_or_ambiguous_is_refused_with_sizes(schema, keyword, message):
    with pytest.raises(UnsupportedSchemaError, match=message) as info:
        js.json_schema_compile(schema, BYTES, cache=False)
    assert info.value.keyword == keyword


def test_regex_only_interface_refuses_string_automata():
    with pytest.raises(UnsupportedSchemaError, match="json_schema_compile"):
        json_schema_regex(WORDS)


NUMBER_TEXTS = [
    "0", "0.4", "0.49", "0.4999999", "0.5", "0.50", "0.500", "0.5000001", "0.51", "0.6",
    "1", "1.0", "2.25", "2.2499", "2.2500", "2.251", "-0.5", "-0.50", "-0.5001", "-0.4999",
    "-1", "-0", "10", "0.05",
]  # fmt: skip


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number", "minimum": 0.5},  # MaskBench Github_medium o90648
        {"type": "number", "minimum": -0.5, "exclusiveMaximum": 2.25},
        {"type": "number", "exclusiveMinimum": 0.5, "maximum": 2.25},
        {"type": "number", "minimum": -0.5, "maximum": -0.5},
        {"type": "integer", "minimum": 0.5, "maximum": 2.25},
    ],
)
def test_decimal_number_bounds_are_exact(schema):
    regex = re.compile(json_schema_regex(schema))
    for text in NUMBER_TEXTS:
        valid = _valid(json.loads(text), schema) and text != "-0"  # "-0" is never generated
        if schema["type"] == "integer" and "." in text:
            valid = False  # integers are written without a fraction
        assert bool(regex.fullmatch(text)) == valid, text
    for exponent in ("5e-1", "5E-1", "1e0"):
        assert not regex.fullmatch(exponent)  # bounded numbers are written without exponents


def test_free_form_values_and_string_automata_go_through_the_grammar_form():
    schema = {"type": "object", "properties": {"w": WORDS}, "required": ["w"]}
    automaton = js.json_schema_compile(schema, BYTES, cache=False, free_form_depth=None)
    assert isinstance(automaton, PushdownAutomaton)
    for document in (
        {"w": "ab c"},
        {"w": "ab cd"},
        {"w": "a"},
        {"w": "ab", "x": [[[1]]]},
        {"w": "ab-c", "x": {"y": [{"z": None}]}},
        {"w": "a  b"},
    ):
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        assert automaton.accepts(text.encode()) == _valid(document, schema), text


def test_long_plain_string_is_a_counted_automaton_as_exact_as_the_regex():
    # over `COUNTED_STRING_MIN` characters a plain string is an automaton, not a counted repeat
    lo, hi = js.budgets.COUNTED_STRING_MIN + 1, js.budgets.COUNTED_STRING_MIN + 40
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": lo, "maxLength": hi}},
        "required": ["s"],
        "additionalProperties": False,
    }
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    regex = re.compile(json_schema_regex(schema))  # the regex-only interface keeps the repeat
    rng = random.Random(1)
    seen = [0, 0]
    for _ in range(300):
        n = rng.choice([lo - 1, lo, rng.randint(lo, hi), hi, hi + 1])
        value = "".join(rng.choice('ab é€😀"\\\n\t') for _ in range(n))
        text = json.dumps({"s": value}, ensure_ascii=False, separators=(",", ":"))
        valid = _valid({"s": value}, schema)
        assert _accepts(automaton, text) == valid == bool(regex.fullmatch(text)), (n, text)
        seen[valid] += 1
    assert seen[0] and seen[1]


def test_plain_string_over_the_counter_limit_is_a_counter_rule(monkeypatch):
    # over `MAX_STRING_STATES` a plain string is a counter rule (issue 55: a register counts
    # its characters, `counter_strings`; with `COUNTER_STRINGS` off: refused); with a
    # `minLength` of at most `COUNTER_MIN_LENGTH` too, and over it it is refused or dropped
    schema = {"type": "string", "maxLength": 8192}
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    assert isinstance(automaton, PushdownAutomaton) and automaton.has_register
    assert _accepts(automaton, json.dumps("é" * 8192, ensure_ascii=False))
    assert not _accepts(automaton, json.dumps("x" * 8193))
    monkeypatch.setattr(budgets, "COUNTER_STRINGS", False)
    with pytest.raises(UnsupportedSchemaError, match="states"):
        js.json_schema_compile(schema, BYTES, cache=False)
    monkeypatch.setattr(budgets, "COUNTER_STRINGS", True)
    schema = {"type": "string", "minLength": 1, "maxLength": 8192}
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    assert automaton.has_register and not _accepts(automaton, '""')
    assert _accepts(automaton, json.dumps("x" * 8192)) and not _accepts(
        automaton, '"' + "x" * 8193 + '"'
    )
    schema = {"type": "string", "minLength": budgets.COUNTER_MIN_LENGTH + 1, "maxLength": 8192}
    with pytest.raises(UnsupportedSchemaError, match="states") as info:
        js.json_schema_compile(schema, BYTES, cache=False)
    assert info.value.keyword == "maxLength"
    with pytest.warns(UserWarning, match="maxLength"):
        automaton = js.json_schema_compile(schema, BYTES, cache=False, strict=False)
    assert _accepts(automaton, json.dumps("x" * 9000))  # the bound was dropped, as warned


def test_pattern_no_string_matches_within_the_lengths_is_no_value():
    # five digits in at most three characters: the property cannot be present (jsonschema agrees)
    digits = {"type": "string", "pattern": "^[0-9]{5}$", "maxLength": 3}
    schema = {"type": "object", "properties": {"a": digits, "b": {"type": "integer"}}}
    regex = re.compile(json_schema_regex(schema))
    for document in ({"b": 1}, {"a": "12345", "b": 1}, {"a": "123"}, {}):
        text = json.dumps(document, separators=(",", ":"))
        assert bool(regex.fullmatch(text)) == _valid(document, schema), text
    with pytest.raises(UnsupportedSchemaError, match="no JSON value satisfies"):
        json_schema_regex({**schema, "required": ["a"]})


def test_format_and_pattern_are_intersected():
    # MaskBench refused `pattern` beside `format`; the automata are intersected instead
    schema = {"type": "string", "format": "date", "pattern": "^20(1[5-9]|2[0-4])-0[1-3]"}
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    seen = [0, 0]
    for year in ("2014", "2015", "2019", "2024", "2025", "1999"):
        for month in ("01", "02", "03", "04", "13"):
            for day in ("01", "29", "30", "31", "32"):
                value = f"{year}-{month}-{day}"
                valid = _valid(value, schema)
                assert _accepts(automaton, json.dumps(value)) == valid, value
                seen[valid] += 1
    assert seen[0] and seen[1]
    bounded = {"type": "string", "format": "email", "pattern": "^a", "maxLength": 6}
    automaton = js.json_schema_compile(bounded, BYTES, cache=False)
    for value in ("a@b.co", "a@b.com", "b@c.de", "ab@c.d", "a@bcde", "a@b.c"):
        expected = bool(re.fullmatch(EMAIL, value)) and value.startswith("a") and len(value) <= 6
        assert _accepts(automaton, json.dumps(value)) == expected, value
    never = {"type": "object", "properties": {"d": {**schema, "pattern": "^x"}}}
    automaton = js.json_schema_compile(never, BYTES, cache=False)  # no date starts with x
    assert _accepts(automaton, "{}") and not _accepts(automaton, '{"d":"x"}')


NOT_STRINGS = {
    # MaskBench Github_easy o83707: any league but one
    "plain": {"type": "string", "not": {"enum": ["intramural", "ab"]}},
    "bounded": {"type": "string", "maxLength": 3, "not": {"const": "abc"}},
    "pattern": {"type": "string", "pattern": "^[abc/]+$", "not": {"enum": ["a", "b/"]}},
    # MaskBench Github_medium o24621 (yotta module names): the pattern with lengths is a string
    # automaton already; its `not` was taken from a placeholder's text, rejecting every string
    "pattern and lengths": {
        "type": "string",
        "pattern": "^[a-c]+[a-c/]*$",
        "minLength": 2,
        "maxLength": 3,
        "not": {"enum": ["ab", "test"]},
    },
    "untyped": {"not": {"const": "a"}},  # every non-string value is valid
    "member": {
        "type": "object",
        "properties": {"k": {"type": "string", "not": {"$ref": "#/$defs/taken"}}},
        "required": ["k"],
        "additionalProperties": False,
        "$defs": {"taken": {"type": "string", "enum": ["a", "b"]}},
    },
}


@pytest.mark.parametrize("name", sorted(NOT_STRINGS))
def test_not_of_listed_strings_is_exact(name):
    # the strings other than the listed ones, in every JSON spelling of them (`\/`, `\u0061`)
    schema = NOT_STRINGS[name]
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    values = _values("abc/", 4) + ["intramural", "intramurals", 1, None, [], True]
    if name == "member":
        values = [{"k": v} for v in values] + [{}, {"k": "a", "x": 1}]
    _assert_decides_as_jsonschema(automaton, schema, values)
    if name == "plain":  # other spellings of an excluded value are excluded too
        assert not _accepts(automaton, r'"\u0061b"')
        assert not _accepts(automaton, r'"intramur\u0061l"')


def test_not_of_every_string_leaves_no_string():
    automaton = js.json_schema_compile(
        {"type": ["string", "integer"], "enum": ["a", 1], "not": {"const": "a"}},
        BYTES,
        cache=False,
    )
    assert _accepts(automaton, "1") and not _accepts(automaton, '"a"')


def test_a_single_if_on_an_unlisted_property_takes_its_complement():
    # MaskBench Github_medium o39097: `if` tests `type == "action"`, whose own schema is any
    # string; the `else` side is the complement (`type` present and another string; a
    # non-string `type` is invalid under the property's own schema anyway)
    schema = {
        "type": "object",
        "properties": {"type": {"type": "string"}, "c": {"type": "string"}},
        "additionalProperties": False,
        "if": {"properties": {"type": {"const": "ab"}}},
        "then": {"required": ["c"]},
        "else": {"properties": {"c": {"maxLength": 1}}},
    }
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    documents = [{}, {"c": "a"}, {"c": "ab"}, {"type": "ab"}, {"type": "ab", "c": "abc"}]
    documents += [{"type": "b"}, {"type": "b", "c": "a"}, {"type": "b", "c": "ab"}, {"type": "abc"}]
    _assert_decides_as_jsonschema(automaton, schema, documents)


def _assert_decides_as_jsonschema(automaton, schema, documents):
    """The automaton accepts each document's canonical text exactly when jsonschema validates
    it, and both verdicts occur."""
    verdicts = set()
    for document in documents:
        valid = _valid(document, schema)
        assert _accepts(automaton, json.dumps(document, ensure_ascii=False)) == valid, document
        verdicts.add(valid)
    assert verdicts == {True, False}


def test_other_strings_regex_excludes_exactly_the_listed_values():
    # the regex form of `not` for plain strings, over random small sets of values with
    # characters that JSON escapes (`"`, `\`, newline), one with two spellings (`/`, `\/`) and
    # class metacharacters; every text of ANY_STRING of up to 3 characters, both spellings
    from functional_gen.structured.byte_dfa import regex_byte_dfa
    from functional_gen.structured.formats import ANY_STRING

    alphabet = 'ab/"\\\n-]^é'
    any_string = re.compile('"' + ANY_STRING + '"')
    rng = random.Random(0)
    texts = {}
    for n in range(4):
        for chars in itertools.product(alphabet, repeat=n):
            value = "".join(chars)
            plain = json.dumps(value, ensure_ascii=False)
            texts[plain] = texts[plain.replace("/", "\\/")] = value
    texts = {t: v for t, v in texts.items() if any_string.fullmatch(t)}
    for _ in range(40):
        size = rng.randint(1, 3)
        excluded = sorted(
            {"".join(rng.choices(alphabet, k=rng.randint(0, 3))) for _ in range(size)}
        )
        regex = js.other_strings_regex(excluded)
        regex_byte_dfa(regex)  # outlines-core compiles it
        pattern = re.compile(regex)
        for text, value in texts.items():
            assert bool(pattern.fullmatch(text)) == (value not in excluded), (excluded, text)


def test_member_counts_in_any_order_match_jsonschema():
    # minProperties / maxProperties in any order (the default): random objects of two to four
    # listed members (some required), closed or with additional members, every subset of
    # members in every order with up to two additional keys: accepted exactly when jsonschema
    # validates the document (before, such objects kept the schema's order)
    rng = random.Random(55)
    for _ in range(10):
        names = rng.sample("abcd", rng.randint(2, 4))
        low = rng.randint(0, 3)
        schema = {
            "type": "object",
            "properties": {n: {"type": "integer"} for n in names},
            "required": rng.sample(names, rng.randint(0, 1)),
            "additionalProperties": rng.choice([False, {"type": "string"}]),
            "minProperties": low,
        }
        if rng.random() < 0.7:
            schema["maxProperties"] = low + rng.randint(0, 2)
        validator = jsonschema.Draft202012Validator(schema)
        try:
            regex = re.compile(json_schema_regex(schema))
        except UnsupportedSchemaError as e:  # no object fits: none of the documents is valid
            assert "no JSON value" in str(e)
            regex = re.compile("(?!)")
        extras = [{}, {"x": "s"}, {"x": "s", "y": "t"}, {"x": 1}]
        for k in range(len(names) + 1):
            for keys in itertools.permutations(names, k):
                for extra in extras:
                    document = {**dict.fromkeys(keys, 1), **extra}
                    for value in (document, dict(reversed(document.items()))):
                        text = json.dumps(value, separators=(",", ":"))
                        expected = validator.is_valid(value)
                        assert bool(regex.fullmatch(text)) == expected, (schema, text, expected)


def test_prefix_items_with_counts_match_jsonschema():
    # `prefixItems` need not be written in full and `items` follow them (outlines-core's
    # regex required every prefix item and nothing after: `[]` and `[1, "a"]` were refused)
    for extra in (
        {"items": {"type": "string"}},
        {},
        {"items": False},
        {"minItems": 1, "maxItems": 3},
        {"minItems": 3},
    ):
        schema = {
            "type": "array",
            "prefixItems": [{"type": "integer"}, {"type": "string"}],
            **extra,
        }
        regex = re.compile(json_schema_regex(schema))
        validator = jsonschema.Draft202012Validator(schema)
        verdicts = set()
        for n in range(5):
            for values in itertools.product([1, "a", None], repeat=n):
                text = json.dumps(list(values), separators=(",", ":"))
                expected = validator.is_valid(list(values))
                assert bool(regex.fullmatch(text)) == expected, (schema, text, expected)
                verdicts.add(expected)
        assert verdicts == {True, False}
