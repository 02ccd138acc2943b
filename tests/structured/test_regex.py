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


def test_constraints_of_similar_size_share_one_compiled_program(tokenizer):
    # Table shapes are bucketed, and nothing else about the constraint is static: a new regex
    # of a similar size reuses the jitted generation loop.
    import equinox as eqx
    import jax

    a = fg.processors.Regex("[0-9]{3}-[0-9]{4}", tokenizer)
    b = fg.processors.Regex("[a-f]{2}:[a-f]{2}", tokenizer)
    arrays_a, static_a = eqx.partition(a, eqx.is_array)
    arrays_b, static_b = eqx.partition(b, eqx.is_array)
    assert jax.tree.structure(static_a) == jax.tree.structure(static_b) and static_a == static_b
    assert [x.shape for x in jax.tree.leaves(arrays_a)] == [
        x.shape for x in jax.tree.leaves(arrays_b)
    ]
    assert not np.array_equal(np.asarray(a.transitions), np.asarray(b.transitions))


@pytest.mark.parametrize("pattern", [3, [None, None], []])
def test_bad_patterns(tokenizer, pattern):
    with pytest.raises((TypeError, ValueError), match="pattern"):
        fg.processors.Regex(pattern, tokenizer)


def test_digit_and_word_classes_are_ascii_by_default(tokenizer, vocabulary):
    # ECMA-262 / JSON Schema: \d is [0-9] and \w is [0-9A-Za-z_]; Rust's regex (outlines-core)
    # would also allow U+1FBF8 or Arabic-Indic digits.
    import re

    from functional_gen.structured import regex_automaton
    from functional_gen.structured.regex import ascii_classes

    ascii_digits = regex_automaton(ascii_classes(r"\d{3}-\w"), vocabulary)
    unicode_digits = regex_automaton(r"\d{3}-\w", vocabulary)
    for text, ascii_ok in [
        ("123-a", True),
        ("٣٣٣-a", False),
        ("\U0001fbf8\U0001fbf8\U0001fbf8-a", False),
        ("123-é", False),
        ("123-_", True),
    ]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert bool(ascii_digits.accepting[ascii_digits.walk(ids)]) == ascii_ok, text
        assert unicode_digits.accepting[unicode_digits.walk(ids)], (
            text
        )  # the Unicode reading accepts all
        assert (
            bool(re.fullmatch(r"\d{3}-\w", text, re.ASCII)) == ascii_ok
        )  # Python's ASCII mode agrees
    default = fg.processors.Regex(r"[\d]{2}\D", tokenizer)
    explicit = fg.processors.Regex(r"[0-9]{2}[^0-9]", tokenizer)
    np.testing.assert_array_equal(np.asarray(default.transitions), np.asarray(explicit.transitions))
    unicode = fg.processors.Regex(r"[\d]{2}\D", tokenizer, unicode=True)
    assert not np.array_equal(np.asarray(unicode.token_class), np.asarray(default.token_class))
