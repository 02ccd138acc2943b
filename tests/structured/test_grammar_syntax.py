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
    gbnf_to_lark,
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
    assert isinstance(spec.rules["string"], Terminal) and re.fullmatch(
        spec.rules["string"].regex, r'"a\"b"'
    )


def test_operators_ranges_and_flags():
    spec = parse_grammar(
        'start: "a".."c" ~ 2..3 ["x"] "y"? "z"+ ("u" | "v")* "k"i WORD\n%import common.WORD'
    )
    body = spec.rules["start"]
    assert isinstance(body, Seq) and len(body.items) == 7
    assert body.items[0] == Repeat(Terminal("[a-c]"), 2, 3)
    assert body.items[1] == Repeat(Terminal("x"), 0, 1) and body.items[2] == Repeat(
        Terminal("y"), 0, 1
    )
    assert body.items[3] == Repeat(Terminal("z"), 1, None)
    assert body.items[4] == Repeat(Alt((Terminal("u"), Terminal("v"))), 0, None)
    assert body.items[5] == Terminal("(?i:k)")


def test_multiline_alternatives_aliases_priorities_and_comments():
    spec = parse_grammar(
        """
        // a comment
        start.2: a        -> first
               | b        // trailing comment
        a: "a" ("b"
             | "c")
        b: "/"
        """
    )
    assert spec.rules["start"] == Alt((Ref("a"), Ref("b")))
    assert spec.rules["b"] == Terminal("/")


@pytest.mark.parametrize(
    "text,message",
    [
        ("start: a", "Rule 'a' used but not defined"),  # lark's own messages
        ("start: A\nA: B\nB: A", "Recursion in terminal 'A'"),
        ('start: "a" )', "Unexpected token"),
        ('start: "a"\nstart: "b"', "defined more than once"),
        ('start: "a" $', "Unexpected input at line 1"),
        ('rule: "x"', "start rule"),  # ours: what we do not support, by name
        ("start: X\n%declare X", "%declare is not supported"),
        ('start: "a"\n%import foo.BAR', "cannot %import"),
        ('start: "a" ~ 3..2', "empty repetition"),
        ("start: /x/m", "regex flags ['m']"),
        ('start: x{"a"}\nx{p}: p p', "templates are not supported"),
    ],
)
def test_errors_name_the_problem(text, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        parse_grammar(text)


def test_error_names_the_line():
    with pytest.raises(GrammarError, match="line 3"):
        parse_grammar('start: a\na: "x"\nb: "y" )')


def test_an_undefined_gbnf_rule_is_a_grammar_error_naming_it():
    """llguidance raises a bare `Exception` for an undefined rule; we raise `GrammarError`
    naming the rule, llguidance's exception kept as the cause."""
    with pytest.raises(GrammarError, match="'digit' not found") as info:
        gbnf_to_lark('root ::= "(" digit ")"')
    assert type(info.value.__cause__) is Exception
    with pytest.raises(GrammarError, match="not a valid GBNF grammar"):
        gbnf_to_lark("root ::= (")


def test_lark_features_override_extend_and_imports():
    # lark's loader resolves %override / %extend and imports of its own grammars.
    spec = parse_grammar('start: WORD\n%import common.WORD\n%override WORD: "z"+')
    assert re.fullmatch(spec.rules["start"].regex, "zzz") and not re.fullmatch(
        spec.rules["start"].regex, "ab"
    )
    spec = parse_grammar('start: NUM\nNUM: "1"\n%extend NUM: "2"')
    assert all(re.fullmatch(spec.rules["start"].regex, t) for t in ("1", "2"))
    spec = parse_grammar("start: CNAME\n%import common (CNAME, WS)\n%ignore WS")
    assert spec.ignore == [r"[ \t\f\r\n]+"]
