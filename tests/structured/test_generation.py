"""On the real default model: every constrained output matches its regex (`re.fullmatch`),
validates under its JSON Schema (`jsonschema` with formats, pydantic), is one of its choices,
or parses with its grammar (lark). All constraints run in ONE generate call (one compilation),
one constraint per row."""

import re

import jax
import lark
import pytest

import functional_gen as fg
from functional_gen.structured import per_row

from .cases import CHOICES, GRAMMARS, REGEXES, SCHEMAS
from .helpers import validate_document

pytestmark = pytest.mark.slow


def _rows(tokenizer):
    rows = []
    for name, (what, schema) in SCHEMAS.items():
        rows.append(
            (
                "schema",
                name,
                schema,
                f"Give {what} as JSON.",
                # integer max_recursion_depth and free_form_depth: the recursive `tree`
                # unrolled and free-form values nested 1 level in a token automaton, which
                # `per_row` can share tables with (rules and deep values need a pushdown one)
                fg.processors.JsonSchema(
                    schema, tokenizer, max_recursion_depth=3, free_form_depth=1
                ),
            )
        )
    for name, (prompt, pattern) in REGEXES.items():
        rows.append(("regex", name, pattern, prompt, fg.processors.Regex(pattern, tokenizer)))
    for name, (prompt, options) in CHOICES.items():
        rows.append(("choice", name, options, prompt, fg.processors.Choice(options, tokenizer)))
    for name, (prompt, grammar, depth) in GRAMMARS.items():
        rows.append(
            (
                "grammar",
                name,
                grammar,
                prompt,
                fg.processors.Grammar(grammar, tokenizer, max_depth=depth),
            )
        )
    return rows


def _check(kind, source, text):
    if kind == "schema":
        validate_document(text, source)
    elif kind == "regex":
        assert re.fullmatch(source, text), text
    elif kind == "choice":
        assert text in source, text
    else:
        lark.Lark(source, parser="earley", lexer="dynamic_complete").parse(text)


@pytest.fixture(scope="module")
def rows(tokenizer):
    return _rows(tokenizer)


def test_every_constrained_output_is_valid(default_model, rows):
    assert sum(r[0] == "schema" for r in rows) >= 30 and sum(r[0] == "regex" for r in rows) >= 15
    model, tokenizer = default_model
    result = fg.generate(
        model,
        tokenizer,
        [[{"role": "user", "content": prompt}] for *_, prompt, _ in rows],
        max_new_tokens=96,
        processors=[per_row([p for *_, p in rows])],
    )
    failures = []
    for (kind, name, source, _, _), text, reason in zip(rows, result.texts, result.finish_reasons):
        try:
            assert reason in ("eos", "length"), reason
            _check(kind, source, text)
        except Exception as e:
            failures.append(
                f"{kind} {name}: {text!r} ({reason}): {type(e).__name__}: {str(e)[:200]}"
            )
    assert not failures, "\n".join(failures)


def test_multinomial_outputs_are_valid(default_model, rows):
    model, tokenizer = default_model
    chosen = [
        r
        for r in rows
        if r[1] in ("person", "event", "unicode", "movie", "ipv4", "price", "unicode", "arithmetic")
    ]
    result = fg.generate(
        model,
        tokenizer,
        [[{"role": "user", "content": prompt}] for *_, prompt, _ in chosen],
        max_new_tokens=48,
        processors=[per_row([p for *_, p in chosen])],
        sampler=fg.samplers.Multinomial(),
        key=jax.random.key(0),
    )
    for (kind, _, source, _, _), text in zip(chosen, result.texts):
        _check(kind, source, text)
