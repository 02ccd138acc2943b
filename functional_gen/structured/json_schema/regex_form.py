"""The regex form: a schema as one regex (`json_schema_regex`) and its token automaton
(`json_schema_automaton`), with strings given as automata spliced into its byte DFA
(`spliced_dfa`) where no compact regex writes them.
"""

import typing

import numpy as np

from ..byte_dfa import (
    REJECT,
    ByteDFA,
    minimize,
    regex_automaton,
    regex_byte_dfa,
    relabel_states,
    trim,
)
from ..dfa_operations import numbered_mark_edges
from . import budgets
from .errors import (
    UnsupportedSchemaError,
    describe,
)
from .free_values import NESTED_FREE_FORM_DEPTH, FreeValueCall
from .rewriter import DEFAULT_MAX_RECURSION_DEPTH, rewrite, warn_dropped, warn_order_fixed
from .rule_plan import RULE_CALL, rule_call

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter


def json_schema_regex(
    schema,
    *,
    whitespace_pattern: str | None = None,
    max_recursion_depth: int = DEFAULT_MAX_RECURSION_DEPTH,
    strict: bool = True,
    closed_objects: bool = False,
    free_form_depth: int | FreeValueCall | None = NESTED_FREE_FORM_DEPTH,
    property_order: str = "any",
) -> str:
    """The regex of the JSON documents valid under `schema` (see the module docstring).

    **Arguments:** `schema`: a dict, a JSON string or a pydantic model class;
    `whitespace_pattern`: regex for the whitespace allowed between tokens (default `[ ]?`);
    `max_recursion_depth`: how many times a recursive `$ref` is unrolled; `strict`: refuse
    keywords that cannot be enforced (`False`: drop them, with one `UserWarning` listing them);
    `closed_objects`: allow no property beyond the listed ones (and `patternProperties`), as if
    every object had `"additionalProperties": false`; `free_form_depth`: how deep a free-form
    value may nest (see `NESTED_FREE_FORM_DEPTH`); `property_order`: `"any"` (default: the
    members in any order), `"schema"` (the order of `properties`) or
    `"schema_or_required_first"` (or the required properties first); see `PROPERTY_ORDERS`.

    **Raises:** `SchemaTooLargeError` for a schema over `budgets.MAX_SCHEMA_BYTES` bytes of
    JSON text (before anything else); `InvalidSchemaError` for a schema its metaschema rejects
    (where, in the schema and in the metaschema); `UnsatisfiableSchemaError` when no value
    satisfies the schema, naming the subschema and keyword that exclude every value
    (`#/properties/a: enum is empty`); `UnsupportedSchemaError` naming the keyword and its location for what a regular constraint
    cannot enforce (with `strict=True`), and for a string whose length bounds need an
    automaton that no compact regex writes (`pattern` with `maxLength` where the pattern has
    several variable parts: `json_schema_compile` compiles those); `ValueError` /
    `TypeError` for a schema that is not a schema.

    Source: outlines-core's `build_regex_from_schema` plus the rewrites above.
    """
    rewriter, regex = rewrite(
        schema,
        whitespace_pattern=whitespace_pattern,
        max_recursion_depth=max_recursion_depth,
        strict=strict,
        closed_objects=closed_objects,
        free_form_depth=free_form_depth,
        property_order=property_order,
    )
    regex = rewriter.substitute(regex)
    _refuse_dfa_terminals(rewriter, regex)
    warn_dropped(rewriter)
    warn_order_fixed(rewriter)
    return regex


def dfa_placeholders(rewriter: "Rewriter", regex: str) -> list[str]:
    """The placeholders of strings given as automata (`Rewriter.dfa_texts`) in `regex`."""
    return [p for p in rewriter.dfa_texts if p in regex]


def _terminal_origin(rewriter: "Rewriter", placeholder: str) -> tuple[str, str]:
    """The schema path and keyword of the string automaton behind `placeholder` (for errors)."""
    return next((path, kw) for p, path, kw in rewriter.dfa_terminals.values() if p == placeholder)


def spliced_too_large(
    rewriter: "Rewriter", regex: str, weight: int
) -> UnsupportedSchemaError | None:
    """The refusal `spliced_dfa` would reach, known before the schema's DFA is built: each
    string automaton in `regex` is spliced in once at least, beside the rest of the schema's
    automaton, about `weight / WEIGHT_PER_STATE` states (`weight`: `Rewriter.weight` of the
    schema's regex with its markers). MaskBench o74461, a 128-character `hostname` of 30,445
    states beside arrays of 100 counted strings: refused in 0.15 s instead of 10 s, after a
    192,318-state DFA. `None` when the estimate is within `MAX_SPLICED_STATES`."""
    placeholders = dfa_placeholders(rewriter, regex)
    if not placeholders:
        return None
    _refuse_counters(rewriter, placeholders)
    sizes = {p: rewriter.dfa_texts[p].num_states for p in placeholders}
    estimate = weight // budgets.WEIGHT_PER_STATE + sum(sizes.values())
    if estimate <= budgets.MAX_SPLICED_STATES:
        return None
    largest = max(sizes, key=sizes.__getitem__)
    path, keyword = _terminal_origin(rewriter, largest)
    return UnsupportedSchemaError(
        keyword,
        path,
        f"its string automaton ({sizes[largest]:,} states) beside the rest of the schema's "
        f"automaton (about {weight // budgets.WEIGHT_PER_STATE:,} states, estimated from its regex) "
        f"would be over {budgets.MAX_SPLICED_STATES:,} states in all",
    )


def spliced_dfa(rewriter: "Rewriter", regex: str) -> ByteDFA:
    """The minimal byte DFA of a schema's whole `regex` whose strings given as automata
    (placeholders of `Rewriter.dfa_texts`) are spliced in: each placeholder is compiled as a
    call (`rule_call`, three control characters no JSON text holds), and each call edge
    `q -> r` becomes a copy of the string's quoted DFA entered by the `"` that `q` reads and
    leaving into `r` after the closing `"` (one copy per distinct `(string, r)`). The token
    automaton of the result is exact and needs no pushdown: a length-bounded string is a
    counter, a few thousand states that lift to the vocabulary's tokens in about a second
    (18,227 states, `format: email` with maxLength 1,024: 1.8 s, 82 token classes).

    **Raises:** `UnsupportedSchemaError` when a state that calls a string also reads `"`
    another way (an `anyOf` of it and another string: the splice would not be deterministic).
    """
    placeholders = dfa_placeholders(rewriter, regex)
    _refuse_counters(rewriter, placeholders)
    text = regex
    for i, placeholder in enumerate(placeholders):
        text = text.replace(placeholder, rule_call(i))
    dfa = minimize(regex_byte_dfa(text))
    delta, accepting = dfa.delta, dfa.accepting
    quote = ord('"')
    pieces, extra_accepting, offset = [], [], dfa.num_states
    copies: dict[tuple[int, int], int] = {}
    new_delta = delta.copy()
    new_delta[:, RULE_CALL] = REJECT
    for q, i, r in numbered_mark_edges(delta, RULE_CALL):
        if new_delta[q, quote] != REJECT:
            path, keyword = _terminal_origin(rewriter, placeholders[i])
            raise UnsupportedSchemaError(
                keyword,
                path,
                "a length-bounded string automaton where another value may also "
                'start with `"` (e.g. `anyOf` with another string) is not supported',
            )
        if (i, r) not in copies:
            string = rewriter.dfa_texts[placeholders[i]]
            if offset + string.num_states > budgets.MAX_SPLICED_STATES:
                path, keyword = _terminal_origin(rewriter, placeholders[i])
                raise UnsupportedSchemaError(
                    keyword,
                    path,
                    f"its string automaton ({string.num_states:,} states) is needed at "
                    f"{len(copies) + 1} or more places of the schema's automaton (e.g. "
                    f"array items counted by maxItems): over {budgets.MAX_SPLICED_STATES:,} "
                    "states in all",
                )
            final = np.flatnonzero(string.accepting)
            if final.size != 1 or (string.delta[final[0]] != REJECT).any():
                raise RuntimeError("internal error: a quoted string DFA has no single end")
            keep = np.flatnonzero(np.arange(string.num_states) != final[0])
            number = np.full(string.num_states, REJECT, np.int64)
            number[keep] = offset + np.arange(keep.size)
            number[final[0]] = r
            rows = string.delta[keep]
            pieces.append(relabel_states(rows, number))
            extra_accepting.append(np.zeros(keep.size, bool))
            copies[i, r] = int(number[string.delta[string.initial, quote]])
            offset += keep.size
        new_delta[q, quote] = copies[i, r]  # the opening quote enters the copy
    spliced = ByteDFA(
        np.concatenate([new_delta, *pieces]).astype(np.int32),
        np.concatenate([accepting, *extra_accepting]),
        dfa.initial,
    )
    # Not minimised: the pieces are, and Moore's refinement takes one round per counted
    # character (seconds for a counter of a thousand).
    return trim(spliced)


def counter_placeholders(rewriter: "Rewriter", regex: str) -> list[str]:
    """The placeholders of counter rules (`Rewriter.counter_texts`) in `regex`."""
    return [p for p in rewriter.counter_texts if p in regex]


def _refuse_counters(rewriter: "Rewriter", placeholders: list[str]) -> None:
    """`UnsupportedSchemaError` when one of `placeholders` is a counter rule: its DFA has no
    limit (the register counts), so it is never spliced into a token automaton."""
    for placeholder in placeholders:
        if placeholder in rewriter.counter_texts:
            path, keyword = _terminal_origin(rewriter, placeholder)
            raise UnsupportedSchemaError(
                keyword,
                path,
                "a string this long is counted by a register: only the grammar form calls it, "
                "and it could not be built for this schema",
            )


def _refuse_dfa_terminals(rewriter: "Rewriter", regex: str) -> None:
    """`UnsupportedSchemaError` when `regex` (a whole schema's) holds a string given as an
    automaton: only the grammar form (`json_schema_compile`, `JsonSchema` with one schema)
    can call it."""
    for placeholder, path, keyword in rewriter.dfa_terminals.values():
        if placeholder in regex:
            raise UnsupportedSchemaError(
                keyword,
                path,
                f"this {'exclusion' if keyword == 'not' else 'length bound'} needs a string "
                "automaton that no compact regex writes; "
                "only the grammar form calls it (`json_schema_compile`, or `JsonSchema` with "
                "one schema), not `json_schema_regex` or a list of schemas",
            )


def json_schema_automaton(schema, vocabulary, *, cache: bool = True, **options):
    """The `TokenAutomaton` of the JSON documents valid under `schema`, for `vocabulary`.

    **Arguments:** `schema`: a dict, JSON text or a pydantic model class; `vocabulary`: from
    `vocabulary_from_tokenizer`; `cache`: use the memory and disk caches; `options`: those of
    `json_schema_regex`.

    **Raises:** as `json_schema_regex`, and `ConstraintError` when the vocabulary cannot write
    any valid document.
    """
    regex = json_schema_regex(schema, **options)
    return regex_automaton(
        regex, vocabulary, cache=cache, description=f"json schema {describe(schema)}"
    )
