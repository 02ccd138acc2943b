"""Exact `oneOf` where its branches may overlap (`exact_one_of`): per JSON kind of value, the
texts that exactly one branch's automaton accepts, written back as a regex.

A value's kind (null, boolean, number, string, object, array) is told by its first byte, so
`oneOf` is enforced kind by kind: a kind that one branch alone admits is that branch's values
of the kind as they are; where two or more branches admit a kind, their automata's product
keeps the texts exactly one of them accepts (`dfa_operations.exactly_one_dfa`: the union minus
the pairwise intersections), intersected with the canonical spellings
(`dfa_operations.canonical_json_dfa`), on which each branch's automaton accepts a text exactly
when `jsonschema` validates its value (`5.0` is an integer to `jsonschema`, not to an integer
regex; `"\\u0061"` is `"a"`). No other engine enforces `oneOf` exactly: llguidance, XGrammar
and outlines treat it as `anyOf`.

Objects and arrays are compared on their compact canonical texts (`compact_json_dfa`: no
whitespace outside strings, whose spelling the branches' automata may not share), and the
result is then read with the schema's whitespace beside each structural character
(`spaced_json_dfa`; compact only where that is over budget): a branch's
automaton judges such a text as `jsonschema` judges its value when every object in it is
read in any order of its members and no key twice (`object_regex`'s `exact`: closed objects
of at most `ANY_ORDER_MAX` listed members in the exact form) and nothing in it is cut. Refused
by name, per branch: an object read in one order (`property_order="schema"`, the smaller
forms of larger objects), additional members (their keys may repeat: `{"x": 1, "x": "s"}`
is `{"x": "s"}`), a listed object constant of two or more keys, a recursive `$ref` cut at
`max_recursion_depth`, and, as before, recursive branches and free-form values (read by
calls of the pushdown form, or nested without bound), which are not regular.
"""

import typing
from collections.abc import Sequence

from ..automaton import ConstraintError
from ..byte_dfa import minimize, regex_byte_dfa
from ..dfa_operations import (
    canonical_json_dfa,
    compact_json_dfa,
    exactly_one_dfa,
    spaced_json_dfa,
)
from ..patterns import dfa_regex, intersect_dfas
from . import budgets
from .errors import NoCommonType
from .merging import merge
from .references import NEVER
from .strings import string_automaton

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter

KINDS = ("null", "boolean", "number", "string", "object", "array")
"""The kinds of JSON value a first byte tells apart (integers are numbers)."""

_SCALARS = ("null", "boolean", "number", "string")


class NotRegular(ValueError):
    """A branch's values of one kind have no finite automaton (recursion, free-form values,
    a string automaton inside a larger value) or it is too large."""


def exact_one_of(
    rewriter: "Rewriter", branches: Sequence[tuple[str, dict]], path: str, overlap: str
) -> list | None:
    """The rewritten pieces (one per kind of value, an `anyOf` of them is the `oneOf`) of the
    values that exactly one of `branches` admits, each `(location, schema)` with the keywords
    beside `oneOf` merged in (`structural`'s `originals`).

    **Arguments:** `overlap`: why the branches were not proved disjoint (`check_disjoint`),
    repeated in a refusal.

    **Returns:** the pieces (empty when no value matches exactly one branch), or `None` when
    the `oneOf` cannot be enforced exactly and `strict=False` dropped it (the caller keeps it
    as `anyOf`).

    **Raises:** `UnsupportedSchemaError` (with `strict=True`) naming, per kind, the branches
    whose values of that kind make exact enforcement impossible and why.
    """
    pieces, refusals = [], []
    for kind in KINDS:
        parts, schemas = [], []
        for where, branch in branches:
            part = _kind_part(rewriter, branch, kind, where)
            if part is not NEVER:
                parts.append((where, part))
                schemas.append(branch)
        if len(parts) == 1:
            pieces.append(parts[0][1])
        if len(parts) < 2:
            continue
        names = ", ".join(where for where, _ in parts)
        if kind not in _SCALARS:
            reasons: dict[str, list[str]] = {}
            for (where, part), branch in zip(parts, schemas):
                for reason in _inexact(rewriter, part, branch):
                    reasons.setdefault(reason, []).append(where)
            if reasons:
                why = "; ".join(f"{', '.join(w)}: {r}" for r, w in reasons.items())
                refusals.append(
                    f"{kind}s of {names} overlap and cannot be told apart exactly ({why})"
                )
                continue
        # objects and arrays: compact texts only, on which no branch's whitespace differs
        spelling = canonical_json_dfa() if kind in _SCALARS else compact_json_dfa()
        try:
            dfas = [_spelled(_automaton(rewriter, where, part), spelling) for where, part in parts]
            dfas = [dfa for dfa in dfas if dfa is not None]
            if not dfas:
                continue
            exact = dfas[0]
            if len(dfas) > 1:
                exact = minimize(exactly_one_dfa(dfas, max_states=budgets.MAX_ONE_OF_STATES))
            pieces.append(rewriter.marker(_written(exact, kind, rewriter.ws)))
        except ConstraintError:  # no value of this kind matches exactly one branch
            continue
        except ValueError as e:  # NotRegular, or a product or regex over its budget
            refusals.append(f"{kind}s of {names}: {e}")
    if refusals:
        rewriter.refuse(
            "oneOf",
            path,
            f"{overlap}, and exact `oneOf` is impossible here: "
            + "; ".join(refusals)
            + " (use `anyOf`, or make the branches disjoint: different types or a const "
            "discriminator; kept as `anyOf`)",
        )
        return None
    return pieces


def _written(exact, kind: str, ws: str) -> str:
    """The regex of `exact` (the automaton of the values of `kind` that exactly one branch
    admits, on canonical texts): an object's or array's compact texts spaced as the schema's
    whitespace `ws` allows elsewhere (`spaced_json_dfa`: `{"a": 1}` as well as `{"a":1}`), or
    compact only where the spaced automaton or its regex is over budget.

    **Raises:** `ValueError` when even the compact regex is over `MAX_ONE_OF_REGEX`."""
    if kind not in _SCALARS:
        try:
            spaced = spaced_json_dfa(exact, ws, max_states=budgets.MAX_ONE_OF_STATES)
            return dfa_regex(spaced, max_chars=budgets.MAX_ONE_OF_REGEX)
        except ValueError:
            pass  # compact only: a valid document spaced otherwise is refused there
    return dfa_regex(exact, max_chars=budgets.MAX_ONE_OF_REGEX)


def _kind_part(rewriter: "Rewriter", branch, kind: str, where: str):
    """The rewritten values of `kind` that `branch` admits (`NEVER` where none)."""
    try:
        typed = merge(rewriter, branch, {"type": kind}, where)
    except NoCommonType:
        return NEVER
    return rewriter.node(typed, where)


def _irregular(rewriter: "Rewriter", part) -> str | None:
    """Why the rewritten `part` has no finite automaton (a recursive rule, a free-form value),
    else `None`."""
    markers = rewriter.markers(rewriter.regex_of(part))
    if markers & set(rewriter.recursive.values()):
        return "it recurses (a recursive `$ref`: a pushdown rule, not a finite automaton)"
    if rewriter.any_value()["const"] in markers:
        return (
            "it holds a free-form value (any JSON value: an open object's additional "
            "properties, `{}`), which nests without bound (close the objects with "
            "`additionalProperties: false` or `closed_objects=True`, or give the values a schema)"
        )
    return None


def _spelled(dfa, spelling):
    """The minimal DFA of the texts both `dfa` and `spelling` accept, `None` when none."""
    try:
        return minimize(intersect_dfas(dfa, spelling, max_states=budgets.MAX_ONE_OF_STATES))
    except ConstraintError:
        return None


def _inexact(rewriter: "Rewriter", part, branch) -> list[str]:
    """Why the automaton of the rewritten object or array `part` (of the branch schema
    `branch`) may judge a compact, canonically spelled text otherwise than `jsonschema`
    judges its value: recursion, free-form values (`_irregular`), objects read in one order
    of their members or with repeatable keys (`Rewriter.inexact`), a recursive `$ref` cut at
    `max_recursion_depth` (its deeper values refused), whitespace that cannot be empty. An
    empty list when it judges exactly."""
    reason = _irregular(rewriter, part)
    if reason is not None:
        return [reason]
    reasons = [
        rewriter.inexact[m]
        for m in rewriter.markers(rewriter.regex_of(part))
        if m in rewriter.inexact
    ]
    if _holds_cut(branch):
        reasons.append(
            "a recursive `$ref` in it is cut at max_recursion_depth, so deeper values it "
            "admits are refused"
        )
    if not regex_byte_dfa(rewriter.ws).matches(b""):
        reasons.append(f"the whitespace pattern {rewriter.ws!r} does not match the empty text")
    return sorted(set(reasons))


def _holds_cut(schema) -> bool:
    """Whether `schema` holds `NEVER` (a recursive `$ref` cut by `inline_references`)."""
    seen, todo = set(), [schema]
    while todo:
        node = todo.pop()
        if node is NEVER:
            return True
        if isinstance(node, (dict, list)) and id(node) not in seen:
            seen.add(id(node))
            todo.extend(node.values() if isinstance(node, dict) else node)
    return False


def _automaton(rewriter: "Rewriter", where: str, part):
    """The minimal byte DFA of the rewritten `part` (a scalar, or an object or array that
    `_inexact` found regular).

    **Raises:** `NotRegular` naming `where` when it has none here."""
    reason = _irregular(rewriter, part)
    if reason is not None:
        raise NotRegular(f"{where}: {reason}")
    regex = rewriter.substitute(rewriter.regex_of(part))
    strings = string_automaton(rewriter, regex)
    if strings is not None:
        return strings
    if any(placeholder in regex for placeholder in rewriter.dfa_texts):
        raise NotRegular(f"{where}: a length-bounded string automaton inside a larger value")
    return minimize(regex_byte_dfa(regex))
