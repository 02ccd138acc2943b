"""`pattern` translation: what the regex generates is JSON text whose decoded value matches the
pattern under Python's `re` (the engine `jsonschema` uses)."""

import itertools
import json
import random
import re

import numpy as np
import pytest

from functional_gen.structured.byte_dfa import ByteDFA, minimize, regex_byte_dfa
from functional_gen.structured.patterns import (
    LengthBoundError,
    RegexTooLargeError,
    dfa_regex,
    difference_dfas,
    json_string_pattern,
    length_bounded_dfa,
)

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


def test_unanchored_alternatives_share_one_prefix_and_suffix():
    # `.*a.*|.*b.*|...`: a DFA that tracks which of the alternatives matched so far, 2^k
    # subsets (MaskBench o47657's 11 time zone areas: over 30 s in outlines-core). One `.*`
    # around all of them: a few states per word, the same language (checked with `re`).
    areas = ["Africa", "America", "Antarctica", "Arctic", "Asia", "Atlantic", "Australia"]
    pattern = "UTC|" + "|".join(f"({area}/[A-Za-z]+)" for area in areas) + "|^x|y$"
    body = json_string_pattern(pattern)
    assert regex_byte_dfa(body).num_states < 2_000  # before minimisation
    translated, python = re.compile('"' + body + '"'), re.compile(pattern)
    rng = random.Random(1)
    words = ["UTC", "Asia/", "Arctic/X", "x", "y", "Q", "/", "Africa/b", "z"]
    for _ in range(2000):
        value = "".join(rng.choice(words) for _ in range(rng.randrange(4)))
        expected = bool(python.search(value))
        assert bool(translated.fullmatch(json.dumps(value))) == expected, value


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


LENGTH_CASES = [
    (r"^[a-z]+( [a-z]+)*$", 2, 5),
    (r"^(ab)+$", 0, 5),
    (r"a", 2, 4),  # unanchored: `.*a.*`
    (r"^.*é", 3, None),  # a lower bound only: the counter saturates
    (r"^(?:\S+\s+){0,2}\S+$", 1, 4),
    (r"^$|^.+$", 1, 2),
    (r'^["\\\n]*$', 2, 3),  # escapes: two bytes, one character
]


@pytest.mark.parametrize("pattern,lo,hi", LENGTH_CASES)
def test_length_bounded_dfa_is_the_exact_intersection(pattern, lo, hi):
    # Against two independent references: the translation's own regex (Python `re`) with the
    # decoded length checked in Python, and, for soundness, Python's search of the pattern.
    body = json_string_pattern(pattern)
    dfa = length_bounded_dfa(body, lo, hi, max_states=10_000)
    translated, python = re.compile(body), re.compile(pattern)
    seen = [0, 0]
    for value in _json_strings():
        text = json.dumps(value, ensure_ascii=False)[1:-1]
        inside = lo <= len(value) and (hi is None or len(value) <= hi)
        expected = bool(translated.fullmatch(text)) and inside
        assert dfa.matches(text.encode()) == expected, (pattern, value)
        if expected:
            assert python.search(value)
        seen[expected] += 1
    assert seen[0] and seen[1]


def test_length_bounded_dfa_counts_unicode_escapes_and_refuses_surrogates():
    dfa = length_bounded_dfa(r"(?:[a-z]|\\u00[0-9a-f]{2}|\\ud[0-9a-f]{3})*", 2, 2, max_states=100)
    assert dfa.matches(rb"\u00e9a") and dfa.matches(rb"ab")
    assert not dfa.matches(rb"\u00e9") and not dfa.matches(rb"\u00e9ab")
    assert not dfa.matches(rb"\ud83d\ude00")  # a surrogate pair: never generated here
    assert dfa.matches(rb"\ud7ffa")  # just below the surrogates


def test_length_bounded_dfa_is_memoised_for_regex_bodies_only():
    # a schema whose pushdown form is refused is rewritten again with the same strings
    body = r"(?:[a-z]|\\n)*"
    first = length_bounded_dfa(body, 1, 40, max_states=1_000)
    assert length_bounded_dfa(body, 1, 40, max_states=1_000) is first
    assert length_bounded_dfa(body, 1, 41, max_states=1_000) is not first
    assert length_bounded_dfa(first, 1, 40, max_states=1_000) is not first  # an automaton body
    assert first.matches(b"ab\\n") and not first.matches(b"")


def test_fixed_width_alternations_are_distributed():
    pattern = r"^data:image/(jpg|jpeg|png|svg\+xml);base64,[0-9a-zA-Z+/=]*$"
    regex = re.compile(json_string_pattern(pattern, max_length=30))  # no LengthBoundError
    for kind in ("jpg", "jpeg", "png", "svg+xml"):
        prefix = f"data:image/{kind};base64,"
        fits = 30 - len(prefix)  # 4 to 11 payload characters
        assert regex.fullmatch(prefix + "A" * fits), kind
        assert not regex.fullmatch(prefix + "A" * (fits + 1)), kind


def test_unwritable_bounds_and_sizes():
    with pytest.raises(LengthBoundError, match="no regex bound"):
        json_string_pattern(r"^[a-z]+( [a-z]+)*$", max_length=10)
    with pytest.raises(ValueError, match="count to 20,000") as info:
        json_string_pattern(r"^[a-z]*$", max_length=20_000)
    assert not isinstance(info.value, LengthBoundError)
    with pytest.raises(ValueError, match=r"20,000 characters \(the limit is 10,000\)"):
        length_bounded_dfa("[a-z]*", 0, 20_000, max_states=10**6)
    with pytest.raises(ValueError, match="states"):
        length_bounded_dfa(json_string_pattern(r"^(?:\S+\s+){0,29}\S+$"), 0, 300, max_states=5000)


def _ascii_strings(alphabet: str, longest: int):
    yield ""
    for length in range(1, longest + 1):
        for chars in itertools.product(alphabet, repeat=length):
            yield "".join(chars)


@pytest.mark.parametrize(
    "keep,drop",
    [
        (r"[a-z_\-]*", r"[a-z_]+"),
        (r"[a-z0-9\-]{0,4}", r".*[0-9]{2,}.*"),
        (r"(?:ab|b)*x?", r"b.*"),
        (r"[ab]*", r"(?:a|ba)*"),
    ],
)
def test_difference_and_its_regex_are_exact(keep, drop):
    # Against Python's `re` on every string of up to 4 characters over a small alphabet: the
    # difference automaton accepts exactly keep-and-not-drop, and `dfa_regex` writes the same
    # language back.
    dfa = minimize(difference_dfas(regex_byte_dfa(keep), regex_byte_dfa(drop), max_states=1000))
    written = re.compile(dfa_regex(dfa, max_chars=10_000))
    written_dfa = regex_byte_dfa(dfa_regex(dfa, max_chars=10_000))  # outlines-core reads it too
    keep_re, drop_re = re.compile(keep), re.compile(drop)
    seen = [0, 0]
    for text in _ascii_strings("ab_-0x9", 4):
        expected = bool(keep_re.fullmatch(text)) and not drop_re.fullmatch(text)
        assert dfa.matches(text.encode()) == expected, text
        assert bool(written.fullmatch(text)) == expected, text
        assert written_dfa.matches(text.encode()) == expected, text
        seen[expected] += 1
    assert seen[0] and seen[1]


def test_dfa_regex_refuses_other_bytes_and_large_regexes():
    # a lone continuation byte is no UTF-8 text (UTF-8 automata: test_one_of_exact.py)
    lone = np.full((2, 256), -1, np.int32)
    lone[0, 0x80] = 1
    with pytest.raises(ValueError, match="valid UTF-8"):
        dfa_regex(ByteDFA(lone, np.array([False, True])), max_chars=100)
    with pytest.raises(RegexTooLargeError, match="exceed 50"):
        dfa_regex(regex_byte_dfa("[a-f]{3}x|[0-9]{5}y"), max_chars=50)
