"""Reading Lark grammars: the subset we accept and the errors for the rest."""

import re

import pytest

from functional_gen.structured.grammar_syntax import (
    Alt,
    GrammarError,
    Ref,
    Repeat,
    Seq,
    Terminal,
    parse_grammar,
)

from .cases import ARITHMETIC, JSON_GRAMMAR


def test_parses_the_test_grammars():
    spec = parse_grammar(ARITHMETIC)
    assert set(spec.rules) == {"start", "expr", "term", "factor"}
    assert spec.ignore == [r"[ \t]+"]
    spec = parse_grammar(JSON_GRAMMAR)
    assert spec.start == "start" and "pair" in spec.rules
    # terminals are inlined as regexes
    assert isinstance(spec.rules["string"], Terminal) and re.fullmatch(spec.rules["string"].regex, r'"a\"b"')


def test_operators_ranges_and_flags():
    spec = parse_grammar('start: "a".."c" ~ 2..3 ["x"] "y"? "z"+ ("u" | "v")* "k"i WORD\n%import common.WORD')
    body = spec.rules["start"]
    assert isinstance(body, Seq) and len(body.items) == 7
    assert body.items[0] == Repeat(Terminal("[a-c]"), 2, 3)
    assert body.items[1] == Repeat(Terminal("x"), 0, 1) and body.items[2] == Repeat(Terminal("y"), 0, 1)
    assert body.items[3] == Repeat(Terminal("z"), 1, None)
    assert body.items[4] == Repeat(Alt((Terminal("u"), Terminal("v"))), 0, None)
    assert body.items[5] == Terminal("(?i:k)")


def test_multiline_alternatives_aliases_priorities_and_comments():
    spec = parse_grammar(
        """
        // a comment
        start.2: a        -> first
               | b        // trailing comment
        a: "a" (
             "b" | "c")
        b: "/"
        """
    )
    assert spec.rules["start"] == Alt((Ref("a"), Ref("b")))
    assert spec.rules["b"] == Terminal("/")


@pytest.mark.parametrize(
    "text,message",
    [
        ("start: a", "rule 'a' is not defined"),
        ("start: A", "terminal A is not defined"),
        ("start: A\nA: B\nB: A", "recursive"),
        ('rule: "x"', "start rule"),
        ('start: "a"\n%declare X', "directive %declare"),
        ('start: "a"\n%import foo.BAR', "only `%import common.NAME`"),
        ('start: "a"\n%import common.NOPE', "not available"),
        ('start: "a" )', "unexpected"),
        ('start: "a" ~ 3..2', "empty repetition"),
        ('start: /x/m', "regex flags ['m']"),
        ('start: "a"\nstart: "b"', "defined twice"),
        ('start: "a" $', "unexpected character"),
    ],
)
def test_errors_name_the_problem(text, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        parse_grammar(text)


def test_error_names_the_line():
    with pytest.raises(GrammarError, match="line 3"):
        parse_grammar('start: a\na: "x"\nb: "y" )')
