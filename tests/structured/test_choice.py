"""`Choice`: exactly one of the options, prefixes included; bad option lists are refused."""

import re

import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured import choice_regex, regex_automaton

from ..helpers import without_runtime_type_checks


def test_every_option_and_nothing_else(vocabulary):
    options = ["cat", "category", "dog", "日本", "a|b", "x.y"]
    pattern = choice_regex(options)
    for text in options:
        assert re.fullmatch(pattern, text)
    for text in ["ca", "categor", "dogs", "a", "xzy", "日"]:
        assert not re.fullmatch(pattern, text)
    # With leftmost-first alternation "cat|category" could never finish "category": both must
    # be reachable token by token.
    automaton = regex_automaton(pattern, vocabulary)
    for text in options:
        ids = [vocabulary.byte_map[bytes([b])][0] for b in text.encode()]
        state = automaton.walk(ids)
        assert automaton.accepting[state], text


@pytest.mark.parametrize(
    "options,error,message",
    [
        ([], ValueError, "empty"),
        (["a", "a"], ValueError, "duplicates"),
        (["a", ""], ValueError, "non-empty"),
        (["a", 3], TypeError, "`options`"),
        ("abc", TypeError, "list of strings"),
    ],
)
def test_bad_options(tokenizer, options, error, message):
    with pytest.raises(error, match=message), without_runtime_type_checks():
        fg.processors.Choice(options, tokenizer)


def test_one_option_list_per_row(tokenizer):
    p = fg.processors.Choice([["yes", "no"], None, ["yes", "no"], ["red", "green"]], tokenizer)
    assert p.num_constraints == 2  # equal lists are compiled once
    np.testing.assert_array_equal(np.asarray(p.constraint_id), [0, -1, 0, 1])
