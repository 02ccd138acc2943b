"""Objects read in any order as automata built from their members, not from a regex
(`any_order_text`, `any_order_dfa`): the grammar form's rule of an object whose members, tracked
as a set, make a regex too large to write.

A regex that reads the members of an object in any order writes each member once per path
through the sets of members written: its text grows with `n!` for `n` members tracked, while
the minimal automaton has one copy of each member per set, `2 ** n`. Seven required members of
short string values (MaskBench Github_easy o54575) are a 300,000-character regex but 128 member
sets of a few hundred states. So, for the grammar form only (`Rewriter.order_calls`), such an
object is a marker whose text lists its members (`any_order_text`; `rule_plan.plan_rules`
makes it a rule, expanding the members' own markers as usual), and its rule's byte DFA is built
here: one small regex per member set, "a separator, then one of the members not yet written,
then a mark naming it, or the end of the object", compiled by outlines-core as any rule is,
the marks then joined to the next set's start (`any_order_dfa`). The member values that are
rules stay calls (`rule_automata` turns the call bytes into call edges afterwards).
"""

import numpy as np

from ..automaton import ConstraintError
from ..byte_dfa import REJECT, ByteDFA, minimize, regex_byte_dfa, trim
from ..dfa_operations import numbered_mark, numbered_mark_edges
from . import budgets
from .errors import TooManyPositions

SENTINEL = "\x00FGORDER"
"""How an object's text (`any_order_text`) starts: raw NUL characters, which no regex text of a
schema holds (JSON text escapes control characters, and regexes write them as escapes)."""

_SEPARATOR = "\x00"

MARK = 0x03
"""The byte that leads a member's end mark in `any_order_dfa`'s per-set regexes
(`numbered_mark(MARK, j)` for member `j`): a control character that neither
`rule_plan.RULE_CALL` (0x02) nor `byte_dfa`'s prefix (0x01) uses."""


class OrderAutomatonInlined(ConstraintError):
    """An object read in any order by its automaton (`any_order_text`) was to be written into a
    regex (`Rewriter.substitute`: the regex form, exact `oneOf`): only the grammar form can
    call it. `json_schema_compile`'s grammar-form attempt then keeps the previous rewrite."""


def any_order_text(items, extra: str | None, ws: str) -> str:
    """The text of an object read in any order by its automaton (the substitution of its
    marker): `SENTINEL`, one flag per member (`r` required, `o` optional, `x` the additional
    members, last), then the whitespace regex `ws` and each member's regex (`items`: the
    `(regex, required)` of each listed `"key": value`; `extra`: the regex of one additional
    member, or `None`), separated by NUL characters. `rule_plan.plan_rules` expands the markers
    inside the members like any other text's, so the members' values are called or inlined as
    elsewhere."""
    flags = "".join("r" if required else "o" for _, required in items) + ("x" if extra else "")
    parts = [r for r, _ in items] + ([extra] if extra else [])
    return _SEPARATOR.join([SENTINEL + flags, ws, *parts])


def is_any_order_text(regex: str) -> bool:
    """Whether `regex` is a rule text `(?:...)` of `any_order_text` (as `plan_rules` writes a
    rule)."""
    return regex.startswith("(?:" + SENTINEL)


def _parse(regex: str) -> tuple[str, str, list[str]]:
    head, ws, *parts = regex[3:-1].split(_SEPARATOR)[1:]
    flags = head[len(SENTINEL) - 1 :]
    if len(flags) != len(parts):
        raise RuntimeError("internal error: an any-order object's text lost a member")
    return flags, ws, parts


def _forms(flags: str) -> list[tuple[str, list[int]]]:
    """The forms `any_order_dfa` may build, in order, each `(name, tracked members)`: every
    listed member at most once (`"exact"`, the language of JSON Schema), or only the required
    ones tracked (`"required"`: an optional key may then repeat, as `unordered_members`'
    form of that name), each within `budgets.ORDER_AUTOMATON_MAX`."""
    listed = [j for j, f in enumerate(flags) if f in "ro"]
    required = [j for j, f in enumerate(flags) if f == "r"]
    forms = []
    if len(listed) <= budgets.ORDER_AUTOMATON_MAX:
        forms.append(("exact", listed))
    if len(required) <= budgets.ORDER_AUTOMATON_MAX and required != listed:
        forms.append(("required", required))
    return forms


def any_order_dfa(
    regex: str, max_states: int = budgets.MAX_GRAMMAR_POSITIONS, form: str | None = None
) -> ByteDFA:
    """The minimal byte DFA of an object read in any order (`regex`: `any_order_text` as a rule,
    its markers expanded): `{`, whitespace, the members separated by `,` (whitespace around
    it), each listed member at most once and every required one (the `"exact"` form; where
    its estimate is over `max_states` or over twice the other's, the `"required"` form: only
    the required members tracked, the others free to repeat), additional members anywhere,
    then `}`. Call bytes
    (`rule_plan.rule_call`) and free-value calls in the members stay as they are: the caller
    makes them call edges. `form` (`"exact"` or `"required"`): that form only (tests).

    Built per set of tracked members written (breadth-first from none): the regex "whitespace,
    a comma, whitespace, then one of the members that may come next followed by its mark
    (`MARK`), or whitespace and `}` once every required member is in the set" (the first set:
    `{`, whitespace, then a member or, when none is required, `}`), compiled as any regex
    (`regex_byte_dfa`); then each state that reads a mark takes the first byte row of the
    next set's start (the set with the member added, or the same set for a member not
    tracked). The joined automaton is deterministic when a member's end cannot go on with
    whitespace, `,` or `}` (a complete JSON value never does). The estimate, before any set
    is built: each member's own states times the sets from which it may come next (up to 1.5
    times `max_states`: it overshoots by about a third); the automaton built has at most
    `max_states`.

    **Raises:** `TooManyPositions` when no form's estimate is within `max_states`;
    `ConstraintError` when a member's end could go on like the next set's start."""
    flags, ws, parts = _parse(regex)
    sizes = [minimize(regex_byte_dfa(p)).num_states for p in parts]
    estimates = []
    for name, tracked in _forms(flags):
        if form is not None and name != form:
            continue
        free = [j for j in range(len(parts)) if j not in tracked]
        sets = 1 << len(tracked)
        estimate = sum(sizes[j] for j in tracked) * sets // 2 + sum(sizes[j] for j in free) * sets
        estimates.append((estimate, tracked))
    if len(estimates) == 2 and 2 * estimates[1][0] < estimates[0][0]:
        estimates.reverse()  # the exact form over twice the required one's states
    # (the estimate overshoots: members share their keys' first bytes; measured 0.65-0.71)
    chosen = next((t for estimate, t in estimates if 2 * estimate <= 3 * max_states), None)
    estimate = min((e for e, _ in estimates), default=0)
    if chosen is None:
        raise TooManyPositions(
            estimate,
            0,
            max_states,
            f"an object of {len(parts)} members read in any order would have an automaton of "
            f"about {estimate:,} states",
        )
    bit = {j: 1 << t for t, j in enumerate(chosen)}
    need = sum(bit[j] for j, f in enumerate(flags) if f == "r" and j in bit)

    def set_regex(mask: int | None) -> str:
        lead = "" if mask is None else f"{ws},{ws}"
        alternatives = [
            f"(?:{lead}(?:{part}){numbered_mark(MARK, j)})"
            for j, part in enumerate(parts)
            if mask is None or not mask & bit.get(j, 0)
        ]
        if mask is None:
            if not need:
                alternatives.append(r"\}")
            return rf"\{{{ws}(?:{'|'.join(alternatives)})"
        if mask & need == need:
            alternatives.append(rf"(?:{ws}\}})")
        return f"(?:{'|'.join(alternatives)})"

    automata: dict[int | None, ByteDFA] = {}
    offsets: dict[int | None, int] = {}
    marks: list[tuple[int | None, int, int]] = []  # (set, state, next set)
    pending: list[int | None] = [None]
    total = 0
    while pending:
        mask = pending.pop(0)
        if mask in automata:
            continue
        dfa = automata[mask] = minimize(regex_byte_dfa(set_regex(mask)))
        offsets[mask] = total
        total += dfa.num_states
        if total > 2 * max_states:  # (mark and call bytes: about half of them go)
            raise TooManyPositions(total, 0, max_states, "an object read in any order")
        for q, j, _ in numbered_mark_edges(dfa.delta, MARK):
            following = (mask or 0) | bit.get(j, 0)
            marks.append((mask, q, following))
            if following not in automata:
                pending.append(following)
    delta = np.concatenate(
        [np.where(d.delta != REJECT, d.delta + offsets[m], REJECT) for m, d in automata.items()]
    ).astype(np.int32)
    accepting = np.concatenate([d.accepting for d in automata.values()])
    start = {m: offsets[m] + d.initial for m, d in automata.items()}
    rows = {m: delta[s].copy() for m, s in start.items()}  # before any row is joined
    for mask, q, following in marks:
        state = offsets[mask] + q
        delta[state, MARK] = REJECT
        row = rows[following]
        clash = (row != REJECT) & (delta[state] != REJECT)
        if clash.any():
            raise ConstraintError(
                "an object read in any order: a member's end may go on with "
                f"{bytes([int(np.flatnonzero(clash)[0])])!r}, as the next member's separator does"
            )
        delta[state] = np.where(row != REJECT, row, delta[state])
        accepting[state] |= accepting[start[following]]
    joined = minimize(trim(ByteDFA(delta, accepting, start[None])))
    if joined.num_states > max_states:
        raise TooManyPositions(joined.num_states, 0, max_states, "an object read in any order")
    return joined
