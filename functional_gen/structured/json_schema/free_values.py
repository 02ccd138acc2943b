"""Free-form JSON values (`{}`, `true`, an open object's additional properties): nested to a
fixed depth as a regex (`free_value`), or as deep as the stack as calls of the JSON value rule
(`FREE_VALUE_CALL`, `free_value_grammar`), and the defaults that choose between them.
"""

import typing

from ..grammar_syntax import Alt, GrammarSpec, Ref, Repeat, Seq, Terminal
from .scalars import (
    NUMBER,
    STRING,
)

DEFAULT_WHITESPACE = "[ ]?"
"""outlines-core's default whitespace between JSON tokens: none or one space."""


NESTED_FREE_FORM_DEPTH = 1
"""How deep a free-form value (`{}`, `true`, a schema without type information, the value of an
additional property) nests arrays and objects where it is a regex (`json_schema_regex`, a list
of schemas in `JsonSchema`, `per_row`, and the last fallback when no pushdown automaton can be
built, after depth 2, `_FALLBACK_DEPTHS`): 1 allows `[1, "a"]` and `{"a": null}` but not
`{"a": [1]}` (an open object is itself a level: its additional values may be such one-level
values). Each level makes the regex much longer (a free value alone, measured when this default
was set: depth 2 about 2 s, depth 3 over a minute through outlines-core's byte DFA; inside
large MaskBench schemas depth 2 now adds about 8%, depth 3 is often refused as too large)."""


DEFAULT_FREE_FORM_DEPTH = None
"""`JsonSchema`'s and `json_schema_compile`'s default `free_form_depth`: free-form values nest
as deep as the pushdown automaton's stack (`json_schema_pushdown`, or calls of the JSON value
rule in the grammar form), as the JSON Schema spec allows; where no pushdown automaton can be
built (a value beside other text that starts the same way nested deeper than
`inline_value_calls` reads it in place, `_VALUE_CALL_LEVELS`; a grammar form over its position
limit) they nest 2 levels where that is a single regex's token automaton, else
`NESTED_FREE_FORM_DEPTH` level(s) (`_FALLBACK_DEPTHS`), with a `UserWarning` that says why
and how deep.

Measured on 2026-11-23 (the five MaskBench splits, `--limit 24`, each schema compiled cold, the
regex cache emptied, depth 1 and `None` interleaved, the box quiet): both compile 114 of 120,
compile p50 94 ms (depth 1) against 89 ms (`None`), median per-schema ratio 1.03, total 57.0 s
against 52.6 s; small schemas pay up to 15 ms (kb_432 17 -> 30 ms), large open ones compile up
to 2x faster (o41296 1.29 -> 0.63 s). Every valid instance that depth 1 rejected for nesting is
accepted (o13687, o21865, o12281, kb_688). Depth 1 was the default while the pushdown tables
cost 60-90 ms more per schema; the token walk that remembers each (function, byte class) step
(`pushdown.token_walk`) removed that."""


FREE_VALUE_CALL = "\x01"
"""Stands for a free-form value in a schema's regex on the pushdown path: a control character,
which JSON text never holds raw (strings escape it; whitespace is space, tab, CR, LF)."""


class FreeValueCall:
    """The type of `CALL`: `json_schema_regex(free_form_depth=_CALL)` writes free-form values as
    `FREE_VALUE_CALL`, which the grammar form turns into a call of its JSON value rule (where
    such a call competes with other text for a byte, `inline_value_calls` reads the value in
    place there)."""


CALL = FreeValueCall()


def free_value(depth: int, ws: str = DEFAULT_WHITESPACE, innermost: str | None = None) -> str:
    """The regex of any JSON value whose arrays and objects nest at most `depth` levels
    (`depth=0`: strings, numbers, `true`, `false`, `null` only), `ws` between tokens; with
    `innermost`, the values `depth` levels down are that regex instead of scalars (`depth=0`:
    `innermost` itself)."""
    scalar = f"(?:{STRING}|{NUMBER}|true|false|null)"
    if depth <= 0:
        return scalar if innermost is None else innermost
    inner = free_value(depth - 1, ws, innermost)
    array = rf"\[{ws}(?:{inner}(?:{ws},{ws}{inner})*)?{ws}\]"
    member = f"{STRING}{ws}:{ws}{inner}"
    obj = rf"\{{{ws}(?:{member}(?:{ws},{ws}{member})*)?{ws}\}}"
    return f"(?:{scalar}|{array}|{obj})"


def free_value_grammar(ws: str) -> GrammarSpec:
    """Any JSON value with `ws` between tokens, as a grammar whose rule `value` recurses."""
    space, string, number = Terminal(ws), Terminal(STRING), Terminal(NUMBER)
    member = Seq((string, space, Terminal(":"), space, Ref("value")))

    @typing.no_type_check
    def listing(opener: str, item, closer: str):
        more = Repeat(Seq((space, Terminal(","), space, item)), 0, None)
        return Seq(
            (Terminal(opener), space, Repeat(Seq((item, more)), 0, 1), space, Terminal(closer))
        )

    value = Alt(
        (
            listing(r"\{", member, r"\}"),
            listing(r"\[", Ref("value"), r"\]"),
            string,
            number,
            Terminal("true"),
            Terminal("false"),
            Terminal("null"),
        )
    )
    return GrammarSpec(rules={"start": Ref("value"), "value": value}, ignore=[], start="start")
