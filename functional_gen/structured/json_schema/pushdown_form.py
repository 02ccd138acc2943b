"""The pushdown form: a schema whose free-form values nest as deep as the stack
(`json_schema_pushdown`): its regex's automaton with calls of the JSON value rule.
"""

import numpy as np

from ..automaton import cache_key
from ..byte_dfa import (
    REJECT,
    ByteDFA,
    minimize,
    regex_byte_dfa,
)
from ..pushdown import DEFAULT_STACK_DEPTH, PushdownAutomaton, build_pushdown
from ..regex_syntax import escape
from ..vocabulary import TokenVocabulary
from .errors import describe
from .free_values import CALL, DEFAULT_WHITESPACE, FREE_VALUE_CALL, free_value_grammar
from .regex_form import json_schema_regex
from .rule_automata import inline_value_calls


def _call_edges(regex: str) -> tuple[ByteDFA, np.ndarray]:
    """The minimal byte DFA of a schema regex whose free-form values are `FREE_VALUE_CALL`, with
    each path over that character's bytes replaced by a call edge: `(dfa, call)`, `call[q]` the
    state after a value read from `q` (`REJECT`: none). JSON text never holds the raw control
    character, so every edge on it is a value."""
    dfa = regex_byte_dfa(regex)  # minimised once below, with the calls as a 257th symbol
    byte = FREE_VALUE_CALL.encode("utf-8")[0]
    call = dfa.delta[:, byte].copy()
    delta = dfa.delta.copy()
    delta[:, byte] = REJECT
    joined = minimize(
        ByteDFA(np.concatenate([delta, call[:, None]], axis=1), dfa.accepting, dfa.initial)
    )
    return ByteDFA(joined.delta[:, :256], joined.accepting, joined.initial), joined.delta[:, 256]


def json_schema_pushdown(
    schema,
    vocabulary: TokenVocabulary,
    *,
    stack_depth: int = DEFAULT_STACK_DEPTH,
    whitespace_pattern: str | None = None,
    cache: bool = True,
    **options,
) -> PushdownAutomaton | None:
    """The `PushdownAutomaton` of a JSON Schema whose free-form values (`{}`, `true`, the values
    of open objects' additional properties, arrays without `items`) nest as deep as the stack
    allows: the schema's regex is built as by `json_schema_regex`, each free-form value written
    as one `FREE_VALUE_CALL` character; the regex's byte DFA, with those characters turned into
    calls, is the bottom frame of a pushdown automaton whose recursive rule is any JSON value.
    Memoised in this process (the last 16 automata).

    **Arguments:** `schema`, `vocabulary`; `stack_depth`: stack slots (nesting depth of the
    free-form values); `whitespace_pattern` and `options`: as for `json_schema_regex`
    (`free_form_depth` excluded); `cache`: `False` builds the automaton afresh, neither reading
    nor filling the memo.

    **Returns:** the automaton, or `None` when the schema has no free-form value (the token
    automaton of `json_schema_automaton` is then exact and smaller).

    **Raises:** as `json_schema_regex`; `NotDeterministic` when a position can start both a
    free-form value and other text nested deeper than `inline_value_calls` reads the value in
    place there (`_VALUE_CALL_LEVELS`; `anyOf` of a string and `{}` is read in place).
    """
    regex = json_schema_regex(
        schema, whitespace_pattern=whitespace_pattern, free_form_depth=CALL, **options
    )

    if escape(FREE_VALUE_CALL) not in regex:
        return None
    return pushdown_of_regex(regex, schema, vocabulary, stack_depth, whitespace_pattern, cache)


def pushdown_of_regex(
    regex: str, schema, vocabulary, stack_depth: int, whitespace_pattern, cache: bool
) -> PushdownAutomaton:
    """`json_schema_pushdown` from the schema's regex with `FREE_VALUE_CALL`s (what
    `json_schema_compile` has already built: the schema is not rewritten again)."""
    key = cache_key("json-pda", f"{stack_depth}\0{regex}", vocabulary)
    if cache and key in PUSHDOWN_CACHE:
        return PUSHDOWN_CACHE[key]
    ws = DEFAULT_WHITESPACE if whitespace_pattern is None else f"(?:{whitespace_pattern})"
    dfa, call = _call_edges(regex)
    dfa, calls = inline_value_calls(dfa, call[:, None], ws)
    call = calls[:, 0]
    automaton = build_pushdown(
        free_value_grammar(ws),
        vocabulary,
        stack_depth=stack_depth,
        top=(dfa, call, "value"),
        description=f"json schema {describe(schema)} (pushdown)",
    )
    if not cache:
        return automaton
    if len(PUSHDOWN_CACHE) >= 16:
        PUSHDOWN_CACHE.pop(next(iter(PUSHDOWN_CACHE)))
    PUSHDOWN_CACHE[key] = automaton
    return automaton


PUSHDOWN_CACHE: dict = {}
