"""Property order: an object's members as a regex in the order of `properties`
(`object_regex`), optional members listed in blocks, and the orders `property_order` allows
(`PROPERTY_ORDERS`: the schema's, required first as a second order, or any order).
"""

import typing

from . import budgets
from .errors import (
    RegexTooLarge,
    TooLarge,
)

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter


_MEMBER_BLOCK = 32
"""Members of an object nested in one `_listed_members` regex before they are grouped in blocks."""


def _listed_members(items, sep: str) -> tuple[str | None, bool]:
    """The listed members of an object, in order, at least one of them: `(regex, empty)`, where
    `regex` matches every non-empty subsequence of `items` (the regex of each `"key": value` and
    whether it is required) that keeps the required ones, members separated by `sep`, and
    `empty` says whether no member at all is also allowed (nothing is required). `regex` is
    `None` when there are no items.

    Linear in the members' total size (each member's regex appears at most twice per level of
    `_MEMBER_BLOCK` blocks), built from
    the front: after the members before `i`, either something was written (`written`) or, while
    nothing is required, nothing was; an optional member `i` extends it to `(?:written(?:sep
    member)?|member)`, a required one to `(?:written sep)?member` and ends the "nothing
    written" case. (Written from the back as "the rest after member `i`", the same language
    copies each rest into every earlier member's alternative: quadratic in the member count,
    185,000 characters for an object of 60 optional properties, which outlines-core turns into
    an automaton in seconds or cannot at all.)"""
    if len(items) > _MEMBER_BLOCK:
        # nesting grows by one group per optional member: in blocks, each block's members as
        # one unit (required when one of them is), so that the regex stays within the parser's
        # nesting limit (250 in Rust's `regex-syntax`)
        blocks = [items[i : i + _MEMBER_BLOCK] for i in range(0, len(items), _MEMBER_BLOCK)]
        units = [
            (f"(?:{_listed_members(block, sep)[0]})", any(r for _, r in block)) for block in blocks
        ]
        return _listed_members(units, sep)
    written: str | None = None  # the non-empty subsequences of the members so far
    empty = True  # whether writing none of the members so far is allowed
    for regex, required in items:
        if written is None:
            written = regex
        elif required:
            written = f"(?:{written}{sep})?{regex}" if empty else f"{written}{sep}{regex}"
        elif empty:  # `written` is one member or a group: no top-level `|`
            written = f"(?:{written}(?:{sep}{regex})?|{regex})"
        else:
            written = f"{written}(?:{sep}{regex})?"
        if required:
            empty = False
    if written is not None and len(written) > budgets.MAX_OBJECT_REGEX:
        raise TooLarge(len(written))
    return written, empty


def _members_any_order(items, sep: str) -> tuple[str | None, bool]:
    """As `_listed_members`, in any order: `(regex, empty)`, `regex` matching every non-empty
    set of `items` (each member's regex and whether it is required) that keeps the required
    ones, written in any order, members separated by `sep`. The regex follows the set written so
    far, so each member appears `2 ** (n - 1)` times: for small objects only (`ANY_ORDER_MAX`,
    `ANY_ORDER_BUDGET`). Deterministic: each member starts with its own key."""
    if not items:
        return None, True
    n = len(items)
    required = sum(1 << i for i, (_, r) in enumerate(items) if r)
    memo: dict[int, str] = {}

    @typing.no_type_check
    def after(mask: int) -> str:
        if mask not in memo:
            alternatives = [
                f"{sep}{items[i][0]}{after(mask | 1 << i)}" for i in range(n) if not mask >> i & 1
            ]
            if not alternatives:
                memo[mask] = ""
            else:
                body = "|".join(f"(?:{a})" for a in alternatives)
                memo[mask] = f"(?:{body})" + ("?" if mask & required == required else "")
        return memo[mask]

    first = "|".join(f"(?:{items[i][0]}{after(1 << i)})" for i in range(n))
    return f"(?:{first})", required == 0


def _members_two_orders(items, order, sep: str) -> tuple[str | None, bool]:
    """As `_listed_members`, in two orders: `items` as listed, or permuted by `order` (a list of
    indices into `items`): `(regex, empty)`, the union of the two languages. Each order's
    regex is linear in the members' size, so the union is at most twice an object's."""
    first, empty = _listed_members(items, sep)
    second, _ = _listed_members([items[i] for i in order], sep)
    if first is None or first == second:
        return first, empty
    return f"(?:(?:{first})|(?:{second}))", empty


def object_regex(
    items,
    extra,
    ws: str,
    min_count: int,
    max_count: int | None,
    any_order: bool = False,
    second_order: list[int] | None = None,
) -> str | None:
    """The regex of an object: `items` (the regex of each listed `"key": value`, and whether it
    is required) in order, then `extra` (the regex of one additional `"key": value`, or `None`)
    repeated; the number of members between `min_count` and `max_count`. `None` when no
    object fits. Without bounds beyond "at least one member", the listed members are
    `_listed_members` (linear size); otherwise a table of "rest of the object after member i,
    with c members written", where c saturates at the largest bound that matters. With
    `any_order`, the listed members of the first two cases come in any order
    (`_members_any_order`)."""
    sep = f"{ws},{ws}"
    if any_order:
        members = _members_any_order
    elif second_order is not None:
        members = lambda items, sep: _members_two_orders(items, second_order, sep)  # noqa: E731
    else:
        members = _listed_members
    n = len(items)
    top = max(min_count, max_count if max_count is not None else 0, 1)
    memo: dict = {}

    @typing.no_type_check
    def rest(i: int, c: int):
        if (i, c) in memo:
            return memo[(i, c)]
        if i == n:
            lo = max(0, min_count - c)
            hi = None if max_count is None else max_count - c
            if extra is None or hi == 0:
                out = "" if lo == 0 else None
            elif c > 0:
                out = f"(?:{sep}(?:{extra})){{{lo},{'' if hi is None else hi}}}"
            else:
                tail = f"(?:{sep}(?:{extra})){{{max(lo - 1, 0)},{'' if hi is None else hi - 1}}}"
                out = f"(?:{extra}){tail}" + ("?" if lo == 0 else "")
                if lo == 0:
                    out = f"(?:(?:{extra}){tail})?"
        else:
            regex, required = items[i]
            if not required and c > 0 and min(c + 1, top) == c and max_count is None:
                # the count no longer matters: an optional member, then the same rest (linear size)
                after = rest(i + 1, c)
                memo[(i, c)] = None if after is None else f"(?:{sep}{regex})?{after}"
                return memo[(i, c)]
            alternatives = []
            if max_count is None or c < max_count:
                after = rest(i + 1, min(c + 1, top))
                if after is not None:
                    alternatives.append((sep if c > 0 else "") + regex + after)
            if not required:
                skip = rest(i + 1, c)
                if skip is not None:
                    alternatives.append(skip)
            if not alternatives:
                out = None
            elif len(alternatives) == 1:
                out = alternatives[0]
            else:
                out = "(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")"
        if out is not None and len(out) > budgets.MAX_OBJECT_REGEX:
            raise TooLarge(len(out))
        memo[(i, c)] = out
        return out

    if min_count <= 1 and max_count is None and extra is None:
        # no count that matters beyond "at least one": the listed members in linear size
        listed, empty = members(items, sep)
        if listed is None:
            body = None if min_count else ""
        else:
            body = f"(?:{listed})?" if empty and not min_count else listed
        return None if body is None else rf"\{{{ws}{body}{ws}\}}"
    if min_count == 0 and max_count is None and extra is not None and items:
        # the usual case, in linear size: the listed members (at least one), then the additional
        # ones, or the additional ones alone when nothing is required
        listed, _ = members(items, sep)
        alternatives = [] if listed is None else [f"{listed}(?:{sep}(?:{extra}))*"]
        if not any(required for _, required in items):
            alternatives.append(f"(?:(?:{extra})(?:{sep}(?:{extra}))*)?")
        body = "(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")"
    else:
        body = rest(0, 0)
    return None if body is None else rf"\{{{ws}{body}{ws}\}}"


def second_order(
    rewriter: "Rewriter", items, names: list[str], required: list[str]
) -> list[int] | None:
    """With `property_order="schema_or_required_first"`: the indices of an object's listed
    members (`items`, their `names`, in schema order) with the required ones first, in the
    order of `required`, then the others in schema order; `None` when that is the schema
    order, or when the members' regexes, expanded, exceed `SECOND_ORDER_BUDGET`
    characters (the object is then in schema order only)."""
    if rewriter.property_order != "schema_or_required_first":
        return None
    index = {n: i for i, n in enumerate(names)}
    first = [index[n] for n in required if n in index]
    order = first + [i for i in range(len(names)) if i not in set(first)]
    if order == list(range(len(names))):
        return None
    try:
        size = sum(len(rewriter.substitute(r, limit=budgets.SECOND_ORDER_BUDGET)) for r, _ in items)
    except RegexTooLarge:
        return None
    return order if size <= budgets.SECOND_ORDER_BUDGET else None


def any_order(rewriter: "Rewriter", items) -> bool:
    """Whether an object's listed members (`items`) may come in any order: with
    `property_order="any"`, 2 to `ANY_ORDER_MAX` members whose regexes, expanded and
    copied once per set of the others (`_members_any_order`), stay within
    `ANY_ORDER_BUDGET` characters."""
    if rewriter.property_order != "any" or not 2 <= len(items) <= budgets.ANY_ORDER_MAX:
        return False
    try:
        size = sum(len(rewriter.substitute(r, limit=budgets.ANY_ORDER_BUDGET)) for r, _ in items)
    except RegexTooLarge:
        return False
    return size << (len(items) - 1) <= budgets.ANY_ORDER_BUDGET


PROPERTY_ORDERS = ("schema", "schema_or_required_first", "any")
"""Values of `property_order`:

- `"schema"` (the default): always the order of `properties`, as llguidance, outlines and
  XGrammar generate.
- `"schema_or_required_first"`: that order, or the required properties first (in the order of
  `required`) and then the others in schema order, for objects whose members stay within
  `SECOND_ORDER_BUDGET`. Schemas often list `properties` alphabetically while `required`
  keeps the author's order, and documents follow either: of MaskBench's valid instances, the
  objects of two or more listed properties whose two orders differ follow the schema order
  6,745 times, required-first 147 times, neither 79 times (dev file, all splits). On the five
  splits (24 each): valid instances accepted 145 -> 148 of 157, automaton states +17%, so
  opt-in (the compile p50 target is 100 ms).
- `"any"`: small objects (`ANY_ORDER_MAX` listed properties or fewer, within
  `ANY_ORDER_BUDGET`) in any order; larger ones in schema order. Measured on the five splits
  (24 each, same process, order schema / any): compile p50 114 / 177 ms, total 111 / 159 s,
  automaton states +27%, valid instances accepted 143 / 144 of 157 (the rest list large
  objects out of order): opt-in."""
