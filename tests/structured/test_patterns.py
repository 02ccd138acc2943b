"""`pattern` translation: what the regex generates is JSON text whose decoded value matches the
pattern under Python's `re` (the engine `jsonschema` uses)."""

import json
import random
import re

import pytest

from functional_gen.structured.patterns import json_string_pattern

# pattern -> a value it matches that the translation must still offer
PATTERNS = {
    r"^[a-z]+$": "abc",
    r"a.b": "a€b",
    r"[^abc]{2}": "x\\",
    r"\d{3}-\d{4}": "123-4567",
    r"^(foo|bar)$": "bar",
    r'["\\]x': '"x',
    r"\w+@\w+": "a_1@b",
    r"[^\d]": "-",
    r"\D\S\W": "a\\.",
    "x\n": "x\n",
    r"^[A-Z]{2}[0-9]{4}$": "AB1234",
    r"\s": "\t",
    r"[é-ü]+": "éü",
    r"^a|b$": "b",
    r"^$|(^(?:\S+\s+){0,3}\S+$)": "ab cd",  # anchors inside a group (MaskBench)
    r"^([0-9x]+\.[0-9x]+$|\%VERSION\%)": "%VERSION% 1",
    r"(a|^b)c": "bc",
}


def _json_strings():
    rng = random.Random(0)
    alphabet = 'ab"\\\n\t x-09AZ_é€😀\x01.@'
    for length in range(5):
        for _ in range(400):
            yield "".join(rng.choice(alphabet) for _ in range(length))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_translation_matches_json_text_of_matching_strings(pattern):
    translated = re.compile('"' + json_string_pattern(pattern) + '"')
    python = re.compile(pattern)

    for value in _json_strings():
        text = json.dumps(value, ensure_ascii=False)
        if translated.fullmatch(text):
            assert python.search(value), (pattern, value)  # sound: only valid strings
    example = PATTERNS[pattern]
    assert python.search(example) and translated.fullmatch(
        json.dumps(example, ensure_ascii=False)
    ), example
    # JSON-escape forms of quote and backslash are the only way to write them
    assert not translated.fullmatch('"a"b"')


@pytest.mark.parametrize("pattern", [r"^$|(^a+ b$)", r"^(ab$|x)", r"(a|^b)c", r"((^a))$"])
def test_anchors_inside_groups_are_distributed_exactly(pattern):
    # `^(A$|B)` is `^A$|^B`: the translation accepts exactly the strings Python's `re` finds
    # the pattern in (no class here has a Unicode meaning the translation would narrow).
    translated = re.compile('"' + json_string_pattern(pattern) + '"')
    python = re.compile(pattern)
    for value in _json_strings():
        if any(c in value for c in "\n\t\x01"):
            continue  # no control character is generated (module docstring)
        text = json.dumps(value, ensure_ascii=False)
        assert bool(translated.fullmatch(text)) == bool(python.search(value)), (pattern, value)


def test_translation_keeps_plain_matches():
    assert re.fullmatch(json_string_pattern(r"^[A-Z]{2}[0-9]{4}$"), "AB1234")
    assert re.fullmatch(json_string_pattern(r'["\\]x'), r"\"x")
    assert re.fullmatch(json_string_pattern(r"a.b"), "a€b")
    assert not re.fullmatch(json_string_pattern(r"a.b"), 'a"b')  # a raw quote would end the string
    assert re.fullmatch(json_string_pattern("x\n"), r"x\n")


@pytest.mark.parametrize(
    "pattern,what",
    [
        ("(?i)abc", "flag"),
        ("a(?=b)", "look-around"),
        (r"(a)\1", "backreference"),
        ("a^b", "anchor"),
        (r"\bx", "boundary"),
        ("[", "not a valid regex"),
    ],
)
def test_unsupported_patterns_raise(pattern, what):
    with pytest.raises(ValueError, match=re.escape(repr(pattern))) as info:
        json_string_pattern(pattern)
    assert what.split()[0] in str(info.value)
