"""Grammars: the bounded-depth automaton accepts exactly the grammar's texts of nesting depth at
most `max_depth` (checked against lark's parser), and random token walks parse."""

import itertools
import re

import lark
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured import GrammarError, grammar_automaton, parse_grammar
from functional_gen.structured.grammar import cut_rules, grammar_byte_dfa

from .cases import ARITHMETIC, GRAMMARS, JSON_GRAMMAR
from .helpers import random_walk


def test_recursion_is_cut_at_one_rule():
    assert cut_rules(parse_grammar(JSON_GRAMMAR)) == ["value"]
    assert cut_rules(parse_grammar(ARITHMETIC)) == ["factor"]
    assert cut_rules(parse_grammar('start: "a"+')) == []


def _factor_depth(tree) -> int:
    """Most `factor` nodes on one root-to-leaf path: the calls of the cut rule."""
    if not isinstance(tree, lark.Tree):
        return 0
    inner = max((_factor_depth(c) for c in tree.children), default=0)
    return inner + (tree.data == "factor")


@pytest.mark.parametrize("max_depth", [1, 2, 3])
def test_arithmetic_language_is_exact_up_to_the_depth(max_depth):
    # Every string over "1+-()" up to 6 characters: accepted iff lark parses it and its factor
    # nesting is at most max_depth. (The grammar without `?` keeps every factor in the tree.)
    parser = lark.Lark(re.sub(r"^\?", "", ARITHMETIC, flags=re.MULTILINE), parser="lalr")
    dfa = grammar_byte_dfa(parse_grammar(ARITHMETIC), max_depth)
    accepted = 0
    for n in range(1, 7):
        for chars in itertools.product("1+-()", repeat=n):
            text = "".join(chars)
            try:
                expected = _factor_depth(parser.parse(text)) <= max_depth
            except lark.exceptions.LarkError:
                expected = False
            assert dfa.matches(text.encode()) == expected, text
            accepted += expected
    assert accepted > 10


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_random_token_walks_parse(vocabulary, name):
    _, grammar, depth = GRAMMARS[name]
    parser = lark.Lark(grammar, parser="earley", lexer="dynamic_complete")
    automaton = grammar_automaton(grammar, vocabulary, max_depth=depth)
    rng = np.random.default_rng(0)
    for _ in range(8):
        text = random_walk(automaton, vocabulary, rng, budget=int(automaton.distance[1]) + 30)
        parser.parse(text)  # raises if the text is not in the grammar


def _container_depth(tree) -> int:
    if not isinstance(tree, lark.Tree):
        return 0
    inner = max((_container_depth(c) for c in tree.children), default=0)
    return inner + (tree.data in ("object", "array"))


def test_deeper_nesting_is_cut_off(vocabulary):
    # max_depth=2: at most two values open at once (`value` is the recursive rule), so a
    # container inside a container must be empty.
    parser = lark.Lark(JSON_GRAMMAR, parser="earley", lexer="dynamic_complete")
    dfa = grammar_byte_dfa(parse_grammar(JSON_GRAMMAR), 2)
    for text, inside in [
        (b'{"a": []}', True),
        (b"[1, {}, [ ]]", True),
        (b"[[]]", True),
        (b'{"a": [1]}', False),
        (b"[[1]]", False),
        (b"[[[]]]", False),
        (b'{"a": {"b": 1}}', False),
        (b"7", True),
    ]:
        assert dfa.matches(text) == inside, text
        parser.parse(text.decode())  # all of them are JSON: only the depth differs
    automaton = grammar_automaton(JSON_GRAMMAR, vocabulary, max_depth=2)
    rng = np.random.default_rng(1)
    for _ in range(10):
        text = random_walk(automaton, vocabulary, rng, budget=60)
        assert _container_depth(parser.parse(text)) <= 2


def test_processor_arguments(tokenizer, tmp_path):
    path = tmp_path / "calc.lark"
    path.write_text(ARITHMETIC)
    from_file = fg.processors.Grammar(path, tokenizer, max_depth=2)
    from_text = fg.processors.Grammar(ARITHMETIC, tokenizer, max_depth=2)
    np.testing.assert_array_equal(
        np.asarray(from_file.transitions), np.asarray(from_text.transitions)
    )
    with pytest.raises(ValueError, match="max_depth"):
        fg.processors.Grammar(ARITHMETIC, tokenizer, max_depth=-1)
    with pytest.raises(GrammarError, match="raise max_depth"):
        fg.processors.Grammar(ARITHMETIC, tokenizer, max_depth=0)
    with pytest.raises(GrammarError, match="line 1"):
        fg.processors.Grammar("start: (", tokenizer)
    with pytest.raises(GrammarError, match="cannot read"):
        fg.processors.Grammar(tmp_path / "missing.lark", tokenizer)
