"""Property order: an object's members as a regex in the order of `properties`
(`object_regex`), optional members listed in blocks, and the orders `property_order` allows
(`PROPERTY_ORDERS`: any order, the default, `unordered_members`; the schema's; required first
as a second order).
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


UNORDERED_FORMS = ("exact", "required", "chained")
"""The forms `unordered_members` tries, in order."""
ORDER_CALL_FORMS = ("required", "exact", "chained")
"""The forms tried with `Rewriter.order_calls` (an object that did not fit as one regex): the
required members tracked first, which accepts the same documents with `2 ** required` member
sets instead of `2 ** members` (the grammar form's positions, not the regex, are then the
limit)."""


@typing.no_type_check  # called per object, with five helpers nested: jaxtyping's hook would
# wrap each of them again at every call (measured: 87 of 115 s of a 4,095-object schema)
def unordered_members(
    items,
    extra: str | None,
    sep: str,
    sizes: list[int],
    budget: int,
    forms: tuple[str, ...] = UNORDERED_FORMS,
    at_least_one: list[int] | None = None,
) -> tuple[str | None, bool, str]:
    """The members of an object in any order: `(regex, empty, form)`, `regex` matching every
    non-empty sequence of `items` (each listed `"key": value` regex and whether it is required)
    and of additional members (`extra`, the regex of one, or `None`) that holds every required
    item, members separated by `sep`; `empty` says whether no member at all is allowed;
    `sizes[i]` is item `i`'s regex length with its markers expanded (`extra` last); `forms`:
    those to try, in order (tests force one); `at_least_one`: indices of items of which at
    least one must be written (an `anyOf` of single `required` names, `AT_LEAST_ONE`;
    ignored when one of them is required anyway).

    The first form whose expanded regex stays within `budget` characters or
    `UNORDERED_FACTOR` times the members' own (each member
    regex is copied once per path of the automaton through the set of members written, so the
    text grows factorially with the members tracked, while the byte DFA has one copy of each
    member per *set*, `2 ** tracked`):

    - `"exact"`: every listed item at most once, in any order, additional members anywhere
      (the language of JSON Schema: exactly the valid documents);
    - `"required"`: the required items exactly once each, in any order; the optional ones and
      the additional members in any order and number (an optional key written twice parses
      to its last value, which also satisfies its schema: no document outside the schema's
      language after `json.loads`, but a repeated key is accepted);
    - `"chained"`: as `"required"`, the required items in the listed order among themselves
      (their position among the others free);
    - `"schema"` (`regex` `None`: the caller writes the listed order) when none fits.

    `at_least_one` costs the exact form nothing (the set written says whether one of them
    is in it) and the other two one bit (whether one of them was written: each state of
    the form at most twice), where `anyOf` branches "the first present is x_i" as
    objects of their own in any order made the union of their automata a product
    (measured: 5 of 6 names, 7,426 DFA states against 239 without the `anyOf`).

    Deterministic regexes are not needed: the byte DFA is built from the regex."""
    required_mask = sum(1 << i for i, (_, r) in enumerate(items) if r)
    group = sorted(set(at_least_one or ()))
    if any(required_mask >> i & 1 for i in group):
        group = []  # a required one is written anyway
    if not items and extra is None:
        return None, True, "exact"
    regexes = [r for r, _ in items] + ([extra] if extra is not None else [])
    place = [f"\x00{i}\x00" for i in range(len(regexes))]
    place_group = f"\x00{len(regexes)}\x00"  # one of the `group` items
    group_text = "(?:" + "|".join(f"(?:{place[i]})" for i in group) + ")"

    def build(tracked: list[int], free: list[int], chained: bool) -> str:
        # `group` items among the free ones: a flag says whether one of them was written
        flagged = bool(group) and not set(group) <= set(tracked)
        group_bits = sum(1 << k for k, i in enumerate(tracked) if i in group)

        def body(members: list[int]) -> str:
            return "|".join(f"(?:{place[i]})" for i in members)

        def star(members: list[int]) -> str:
            return f"(?:{sep}(?:{body(members)}))*" if members else ""

        before = [i for i in free if i not in group] if flagged else free  # no group item yet
        need = sum(1 << k for k, i in enumerate(tracked) if required_mask >> i & 1)
        memo: dict[tuple[int, bool], str] = {}

        def next_of(mask: int) -> list[int]:
            left = [k for k in range(len(tracked)) if not mask >> k & 1]
            return left[:1] if chained else left

        def after(mask: int, seen: bool) -> str:
            if (mask, seen) not in memo:
                alternatives = [
                    f"{sep}{place[tracked[k]]}{after(mask | 1 << k, seen)}" for k in next_of(mask)
                ]
                if flagged and not seen:
                    alternatives.append(f"{sep}{place_group}{after(mask, True)}")
                done = mask & need == need and (seen or not group or bool(mask & group_bits))
                rest = star(free if seen or not flagged else before)
                if not alternatives:  # every tracked member written (and a group one)
                    memo[(mask, seen)] = rest
                else:
                    alternatives_text = "(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")"
                    memo[(mask, seen)] = rest + alternatives_text + ("?" if done else "")
            return memo[(mask, seen)]

        # free members first, then the first tracked one (each tracked subtree written once)
        lead = f"(?:(?:{body(before)})(?:{sep}(?:{body(before)}))*{sep})?" if before else ""
        firsts = [f"{place[tracked[k]]}{after(1 << k, False)}" for k in next_of(0)]
        if flagged:
            firsts.append(f"{place_group}{after(0, True)}")
        alternatives = [lead + "(?:" + "|".join(f"(?:{f})" for f in firsts) + ")"] if firsts else []
        if free and not need and not group:  # only free members
            alternatives.append(f"(?:{body(free)})(?:{sep}(?:{body(free)}))*")
        return "(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")"

    everything = list(range(len(items)))
    required = [i for i in everything if required_mask >> i & 1]
    optional = [i for i in everything if not required_mask >> i & 1]
    extras = [len(items)] if extra is not None else []
    shapes = {
        "exact": (everything, extras, False),
        "required": (required, optional + extras, False),
        "chained": (required, optional + extras, True),
    }
    for form in forms:
        tracked, free, chained = shapes[form]
        if form != "chained" and len(tracked) > budgets.ANY_ORDER_MAX:
            continue
        text = build(tracked, free, chained).replace(place_group, group_text)
        size = len(text) + sum(
            text.count(place[i]) * (sizes[i] - len(place[i])) for i in range(len(regexes))
        )
        if size <= max(budget, budgets.UNORDERED_FACTOR * sum(sizes)):
            for i, r in enumerate(regexes):
                text = text.replace(place[i], r)
            return text, required_mask == 0 and not group, form
    return None, required_mask == 0 and not group, "schema"


@typing.no_type_check  # called per object, helpers nested (see `unordered_members`)
def counted_members(
    items,
    extra: str | None,
    sep: str,
    sizes: list[int],
    budget: int,
    min_count: int,
    max_count: int | None,
) -> tuple[str | None, bool] | None:
    """The members of an object in any order, their number between `min_count` and
    `max_count` (`minProperties`/`maxProperties`): `(regex, empty)` as `unordered_members`'
    exact form (`regex` the non-empty member sequences, `None` when only the empty object
    fits; `empty`: whether no member at all is allowed), or `None` when it does not fit
    (more than `ANY_ORDER_MAX` listed items, or the regex, markers expanded, over `budget`
    characters and `UNORDERED_FACTOR` times the members' own size).

    Exact: every listed item at most once, in any order, and the additional members
    (`extra`) anywhere. The state is the set of listed items written and the number of
    additional members written; that number saturates where it stops mattering (at
    `min_count` when there is no `max_count`, the additional members are then a free
    repeat). Without additional members the set alone tells the count (`2 ** n` states for
    `n` items at most); with them and a `max_count` `m`, at most `2 ** n * (m + 1)`.

    Source: JSON Schema 2020-12 validation, sections 6.5.1-6.5.2 (`maxProperties`,
    `minProperties` count the members whatever their order)."""
    n = len(items)
    if n > budgets.ANY_ORDER_MAX:
        return None
    required = sum(1 << i for i, (_, r) in enumerate(items) if r)
    regexes = [r for r, _ in items] + ([extra] if extra is not None else [])
    limit = max(budget, budgets.UNORDERED_FACTOR * sum(sizes))
    memo: dict[tuple[int, int], tuple[str, int] | None] = {}

    def key(mask: int, extras: int) -> tuple[int, int]:
        # without a maximum, additional members beyond the minimum change nothing
        return (mask, extras if max_count is not None else min(extras, min_count))

    def accepts(mask: int, extras: int) -> bool:
        return mask & required == required and mask.bit_count() + extras >= min_count

    def moves(mask: int, extras: int) -> list[tuple[int, tuple[int, int]]]:
        """`(member index, next state)` of each member that may come next (`n`: one
        additional member)."""
        count = mask.bit_count() + extras
        if max_count is not None and count >= max_count:
            return []
        out = [(k, key(mask | 1 << k, extras)) for k in range(n) if not mask >> k & 1]
        free = max_count is None and count >= min_count  # additional members: a repeat
        if extra is not None and not free:
            out.append((n, key(mask, extras + 1)))
        return out

    def joined(pieces: list[tuple[str, int]], optional: bool) -> tuple[str, int]:
        text = "(?:" + "|".join(f"(?:{t})" for t, _ in pieces) + ")" + ("?" if optional else "")
        size = sum(z for _, z in pieces) + 3 * len(pieces) + 5
        if size > limit:
            raise TooLarge(size)
        return text, size

    def after(state: tuple[int, int]) -> tuple[str, int] | None:
        """The rest of the object after the members of `state` (at least one written), and
        its size with the members' regexes expanded; `None` when nothing valid follows."""
        if state not in memo:
            mask, extras = state
            repeat, repeat_size = "", 0
            if extra is not None and max_count is None and mask.bit_count() + extras >= min_count:
                repeat, repeat_size = f"(?:{sep}(?:{extra}))*", sizes[n] + 2 * len(sep) + 9
            pieces = []
            for k, target in moves(mask, extras):
                rest = after(target)
                if rest is not None:
                    pieces.append(
                        (f"{sep}(?:{regexes[k]}){rest[0]}", len(sep) + sizes[k] + rest[1])
                    )
            if not pieces:
                memo[state] = (repeat, repeat_size) if accepts(mask, extras) else None
            else:
                text, size = joined(pieces, accepts(mask, extras))
                memo[state] = (repeat + text, repeat_size + size)
        return memo[state]

    empty = accepts(0, 0)
    try:
        firsts = []
        for k, target in moves(0, 0):
            rest = after(target)
            if rest is not None:
                firsts.append((f"(?:{regexes[k]}){rest[0]}", sizes[k] + rest[1]))
        if not firsts:
            return None, empty
        return joined(firsts, False)[0], empty
    except TooLarge:
        return None


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
    second_order: list[int] | None = None,
    unordered: tuple[list[int], int, tuple[str, ...]] | None = None,
    at_least_one: list[int] | None = None,
    fixed: list[str] | None = None,
) -> tuple[str | None, bool]:
    """The regex of an object and whether it is exact, `(regex, exact)`: `items` (the regex of each listed `"key": value`, and whether it
    is required) in order, then `extra` (the regex of one additional `"key": value`, or `None`)
    repeated; the number of members between `min_count` and `max_count`. `None` when no
    object fits. Without bounds beyond "at least one member", the listed members are
    `_listed_members` (linear size); otherwise a table of "rest of the object after member i,
    with c members written", where c saturates at the largest bound that matters. With
    `unordered = (sizes, budget, forms)` (`property_order="any"`), the
    members of the first two cases, additional ones included, come in any order
    (`unordered_members`, `sizes` the expanded length of each item's regex and of `extra`).
    `at_least_one`: indices of items of which at least one is written (`AT_LEAST_ONE`): in
    any order, tracked by `unordered_members`; where that does not fit, as "the first of
    them written is item i" (the items before it in `at_least_one` absent, item i
    required), one object per i (in the listed order, an automaton reading the members in
    order follows one of them once a name is seen). With bounds (`min_count` over 1 or a
    `max_count`) in any order, `counted_members` where it fits, else the listed order.

    `fixed` (a list, with `unordered`): `object_regex` appends the form it fell back to
    (`"chained"`, or `"listed"` for the schema's order) when the members of an object of two or
    more of them cannot all come in any order (too large to track): a valid document in
    another order is refused there (`Rewriter.order_fixed`).

    `exact` says that the regex accepts a text of an object exactly when its value is such
    an object (up to the spelling of its strings and numbers): every order of the members,
    no key twice. It is not where additional members may come (a key may repeat), in the
    listed order of two or more items, or in `unordered_members`' smaller forms; exact
    `oneOf` needs it (`exact_one_of`)."""
    sep = f"{ws},{ws}"
    few = len(items) <= 1 and extra is None  # no order, no repeated key
    if at_least_one and not any(items[i][1] for i in at_least_one):
        if unordered is not None and min_count <= 1 and max_count is None:
            sizes, budget, forms = unordered
            listed, _, form = unordered_members(
                items, extra, sep, sizes, budget, forms, at_least_one=at_least_one
            )
            if listed is not None:
                _note_fixed(fixed, form, items)
                return rf"\{{{ws}{listed}{ws}\}}", form == "exact" and extra is None
        group = sorted(at_least_one)
        objects, exact = [], True
        for k, first in enumerate(group):
            absent = set(group[:k])
            kept = [(r, req or i == first) for i, (r, req) in enumerate(items) if i not in absent]
            # (each in any order where it fits alone: the union then tracks more, but
            # accepts what one object in any order would)
            alone = None
            if unordered is not None:
                sizes, budget, forms = unordered
                alone = ([n for i, n in enumerate(sizes) if i not in absent], budget, forms)
            regex, one_exact = object_regex(
                kept, extra, ws, min_count, max_count, unordered=alone, fixed=fixed
            )
            if regex is not None:
                objects.append(regex)
                exact = exact and one_exact
        if not objects:
            return None, True
        if len(objects) == 1:
            return objects[0], exact
        return "(?:" + "|".join(f"(?:{o})" for o in objects) + ")", exact
    if second_order is not None:
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

    if unordered is not None and min_count <= 1 and max_count is None:
        sizes, budget, forms = unordered
        listed, empty, form = unordered_members(items, extra, sep, sizes, budget, forms)
        if listed is not None:
            _note_fixed(fixed, form, items)
            body = f"(?:{listed})?" if empty and not min_count else listed
            return rf"\{{{ws}{body}{ws}\}}", form == "exact" and extra is None
    if unordered is not None and (min_count > 1 or max_count is not None):
        # bounds on the member count, in any order
        sizes, budget, _ = unordered
        counted = counted_members(items, extra, sep, sizes, budget, min_count, max_count)
        if counted is not None:
            listed, empty = counted
            if listed is None:
                return (rf"\{{{ws}{ws}\}}" if empty else None), True
            body = f"(?:{listed})?" if empty else listed
            return rf"\{{{ws}{body}{ws}\}}", extra is None
    if unordered is not None and fixed is not None and len(items) + (extra is not None) > 1:
        fixed.append("listed")  # the listed order below: too large in any order
    if min_count <= 1 and max_count is None and extra is None:
        # no count that matters beyond "at least one": the listed members in linear size
        listed, empty = members(items, sep)
        if listed is None:
            body = None if min_count else ""
        else:
            body = f"(?:{listed})?" if empty and not min_count else listed
        return (None if body is None else rf"\{{{ws}{body}{ws}\}}"), few
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
    return (None if body is None else rf"\{{{ws}{body}{ws}\}}"), few


def _note_fixed(fixed: list[str] | None, form: str, items) -> None:
    """For `object_regex`: append `form` to `fixed` when it keeps some order of the members
    (`"chained"`: the required ones in the listed order among themselves, two or more)."""
    if fixed is not None and form == "chained" and sum(required for _, required in items) > 1:
        fixed.append(form)


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


def unordered(
    rewriter: "Rewriter", items, extras: list[str]
) -> tuple[list[int], int, tuple[str, ...]] | None:
    """With `property_order="any"` (the default): `(sizes, budget, forms)` for `object_regex`'s
    `unordered`, `sizes` the weight (`Rewriter.weight`: markers expanded; with
    `Rewriter.order_calls`, `called_weight`: large member values as calls) of each listed
    member's regex (`items`) and of the additional members' (`extras`, joined); else `None`."""
    if rewriter.property_order != "any":
        return None
    weight = rewriter.called_weight if rewriter.order_calls else rewriter.weight
    sizes = [weight(r) for r, _ in items]
    if extras:
        sizes.append(weight("|".join(extras)))
    return (
        sizes,
        budgets.UNORDERED_BUDGET,
        ORDER_CALL_FORMS if rewriter.order_calls else UNORDERED_FORMS,
    )


PROPERTY_ORDERS = ("any", "schema", "schema_or_required_first")
"""Values of `property_order` (JSON Schema does not order an object's members):

- `"any"` (the default): members in any order, additional ones among the listed ones
  (`unordered_members`): exactly the valid orders where the object's members, tracked as a
  set, stay within `ANY_ORDER_MAX` members and `UNORDERED_BUDGET` characters; beyond, the
  required members are tracked (each exactly once, in any order; in the listed order among
  themselves when there are more than `ANY_ORDER_MAX` of them or the regex would exceed the
  budget) and the optional and additional ones may come anywhere, also twice. Objects with
  `minProperties` over 1 or a `maxProperties` count their members in any order
  (`counted_members`: the set of listed members and the number of additional ones) where
  they stay within `ANY_ORDER_MAX` listed members and the same budget; beyond, they keep
  the schema order (a valid document in another order is then refused). Where the budget
  kept an order, `json_schema_compile` first tries the grammar form with large member
  values as rule calls (`Rewriter.order_calls`, `ORDER_CALL_FORMS`), and there builds the
  automaton of each object that still does not fit from its members directly
  (`order_automata`: up to `ORDER_AUTOMATON_MAX` members tracked, within the positions;
  beyond, one loop over the members with a register of those written, `register_objects`,
  up to `REGISTER_BITS` required members: issue 55).
- `"schema"`: always the order of `properties` (then the additional members), as
  llguidance, outlines and XGrammar generate; smaller automata, but a valid document whose
  members come in another order is refused.
- `"schema_or_required_first"`: that order, or the required properties first (in the order of
  `required`) and then the others in schema order, for objects whose members stay within
  `SECOND_ORDER_BUDGET`. Of MaskBench's valid instances, the objects of two or more listed
  properties whose two orders differ follow the schema order 6,745 times, required-first 147
  times, neither 79 times (dev file, all splits)."""
