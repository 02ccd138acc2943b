"""`Regex` inputs: escaping, one pattern per row, and type errors."""

import re

import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured.regex import escape


def test_escape_matches_the_literal_text():
    for text in ["a.b", "(x)|[y]{z}", "1+1=2?", "tab\there\nnewline", "#&~-^$\\", "ünï"]:
        assert re.fullmatch(escape(text), text)


def test_one_pattern_per_row(tokenizer):
    p = fg.processors.Regex(["[0-9]+", None, "[a-z]+", "[0-9]+"], tokenizer)
    assert p.num_constraints == 2
    np.testing.assert_array_equal(np.asarray(p.constraint_id), [0, -1, 1, 0])
    assert p.descriptions == ("[0-9]+", "[a-z]+")


@pytest.mark.parametrize("pattern", [3, [None, None], []])
def test_bad_patterns(tokenizer, pattern):
    with pytest.raises((TypeError, ValueError), match="pattern"):
        fg.processors.Regex(pattern, tokenizer)
