"""Rewriting `type: array`: `items`, `prefixItems`, item counts (`counted_items` for large
ones) and `contains`.
"""

import typing
from collections.abc import Mapping

from . import budgets
from .errors import (
    UnsupportedSchemaError,
)
from .merging import merge
from .references import (
    NEVER,
)

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter


def rewrite_array(rewriter: "Rewriter", node: dict, path: str):
    """`type: array` (`BY_TYPE`): `prefixItems`, `items`, `minItems`/`maxItems`, `contains`,
    as a node outlines-core writes or a marker. `NEVER` when no array satisfies the counts."""
    out = {"type": "array"}
    for k in ("minItems", "maxItems"):
        if k in node:
            v = node[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UnsupportedSchemaError(k, path, f"must be a non-negative integer, got {v!r}")
            out[k] = v
    if node.get("uniqueItems") and out.get("maxItems", 2) > 1:
        rewriter.refuse(
            "uniqueItems",
            path,
            "unique items cannot be enforced by a regular constraint (set maxItems: 1 or drop it)",
        )
    items = node.get("items")
    prefix = node.get("prefixItems")
    if isinstance(items, list):  # draft 4-2019 tuple form
        prefix, items = items, node.get("additionalItems")
    if prefix is not None:
        rewritten = []
        for i, schema in enumerate(prefix):
            r = rewriter.node(schema, f"{path}/prefixItems/{i}")
            if r is NEVER:  # the array stops before this position
                out["maxItems"] = min(out.get("maxItems", i), i)
                items = False
                break
            rewritten.append(r)
        if rewritten:
            out["prefixItems"] = rewritten
    if items is None and prefix is None:
        items = True  # any items: our bounded free-form value, not outlines-core's generic one
    if items is not None:
        r = rewriter.node(items, f"{path}/items")
        if r is NEVER:  # no item beyond the prefix
            out["maxItems"] = min(
                out.get("maxItems", len(out.get("prefixItems", []))),
                len(out.get("prefixItems", [])),
            )
            if "prefixItems" in out:
                out["items"] = False
        else:
            out["items"] = r
    if out.get("minItems", 0) > out.get("maxItems", out.get("minItems", 0)):
        listed = "maxItems" if "maxItems" in node else "prefixItems"  # (items: false after it)
        return rewriter.admits_none(
            listed, path, f"minItems {out['minItems']} > {listed} {out['maxItems']}"
        )
    if out.get("maxItems") == 0:
        out.pop("items", None)
        out.pop("prefixItems", None)
    if "contains" in node:
        return contains(rewriter, node, out, path)
    if "prefixItems" in out:
        return prefixed_items(rewriter, out)
    return counted_items(rewriter, out)


def prefixed_items(rewriter: "Rewriter", out: dict):
    """An array `out` (rewritten) with `prefixItems`: our own regex, each prefix item at its
    position, then `items` (any value when absent, none when `false`), the array ending
    anywhere its count allows (between `minItems` and `maxItems`: a prefix need not be
    written in full). outlines-core requires every prefix item and nothing after them
    (`[]` and `[1, "x"]` refused for `prefixItems: [integer], items: string`). A count from
    `COUNTED_ITEMS_MIN` records its item's copies in `item_repeats`, as `counted_items`.

    Source: JSON Schema 2020-12 core, section 10.3.1.1-10.3.1.2 (`prefixItems`, `items`)."""
    ws, sep = rewriter.ws, f"{rewriter.ws},{rewriter.ws}"
    prefix = [rewriter.regex_of(p) for p in out["prefixItems"]]
    n, low, high = len(prefix), out.get("minItems", 0), out.get("maxItems")
    rest = out.get("items")
    item = None
    if rest is not False:
        item = rest if rest is not None else rewriter.any_value()
        count = max(low, high or 0)
        if count >= budgets.COUNTED_ITEMS_MIN and not (
            isinstance(item, Mapping)
            and set(item) == {"const"}
            and item["const"] in rewriter.substitutions
        ):
            item = rewriter.marker(rewriter.regex_of(item))
    item_regex = None if item is None else rewriter.regex_of(item)

    def after(k: int) -> str:
        """The rest of the array after its first `k` elements (`k` at least 1)."""
        if high is not None and k >= high:
            return ""
        if k < n:
            following = f"{sep}(?:{prefix[k]}){after(k + 1)}"
        elif item_regex is None:
            return ""
        else:  # items only: a counted repeat (`min` reaches no further: counted below)
            repeat = f"{{{max(0, low - k)},{'' if high is None else high - k}}}"
            return f"(?:{sep}(?:{item_regex})){repeat}"
        return following if k < low else f"(?:{following})?"

    first = f"(?:{prefix[0]}){after(1)}"
    body = first if low > 0 else f"(?:{first})?"
    array = rewriter.marker(rf"\[{ws}{body}{ws}\]")
    if item is not None and max(low, high or 0) >= budgets.COUNTED_ITEMS_MIN:
        copies = max(0, max(low, high or 0) - n - 1)
        rewriter.item_repeats[array["const"]] = (item["const"], copies)
    return array


def counted_items(rewriter: "Rewriter", out: dict):
    """An array `out` whose item count (`minItems` or `maxItems`) reaches
    `COUNTED_ITEMS_MIN`: a marker for it, its items a marker too, and `item_repeats`
    records the copies of the item that the counted repeat writes out (outlines-core's
    `(,item){0,999}`), so that the size measures see them (`weight`: such a schema goes to
    the grammar form first) and the grammar form makes the item a rule, called from each
    copy (`plan_rules`). Without it, `"maxItems": 1000` of an object made a single-regex
    automaton of 1,000 object copies that took minutes (MaskBench o9943, o12622). Other
    arrays are returned as they are."""
    count = max(out.get("minItems", 0), out.get("maxItems") or 0)
    item = out.get("items")
    if count < budgets.COUNTED_ITEMS_MIN or not isinstance(item, Mapping):
        return out
    if set(item) != {"const"} or item["const"] not in rewriter.substitutions:
        item = out["items"] = rewriter.marker(rewriter.regex_of(item))
    array = rewriter.marker(rewriter.regex_of(out))
    rewriter.item_repeats[array["const"]] = (item["const"], count - 1)
    return array


def contains(rewriter: "Rewriter", node: dict, out: dict, path: str):
    """An array (`out`, rewritten: `items`, no bounds or prefix) of which at least
    `minContains` (default 1) items also match `contains`: our own regex, every item the
    `items` regex and `minContains` of them the regex of `items` AND `contains`, in any
    places. `NEVER` when no item can match both. Bounds on the item count, `prefixItems`
    and `maxContains` beside it are refused."""
    count = node.get("minContains", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise UnsupportedSchemaError(
            "minContains", path, f"must be a non-negative integer, got {count!r}"
        )
    if count == 0:
        return out
    if {"minItems", "maxItems", "prefixItems"} & out.keys() or count > budgets.MAX_CONTAINS:
        rewriter.refuse(
            "contains",
            path,
            f"together with item counts or `prefixItems`, or minContains over {budgets.MAX_CONTAINS}",
        )
        return out
    items = node.get("items", True)
    both = rewriter.node(
        merge(rewriter, {} if items is True else items, node["contains"], path), path
    )
    if both is NEVER:
        return NEVER
    item = rewriter.regex_of(out.get("items", rewriter.any_value()))
    match, sep = rewriter.regex_of(both), f"{rewriter.ws},{rewriter.ws}"
    repeat = f"(?:{sep}(?:{item}{sep})*{match}){{{count - 1}}}" if count > 1 else ""
    return rewriter.marker(
        rf"\[{rewriter.ws}(?:{item}{sep})*{match}{repeat}(?:{sep}{item})*{rewriter.ws}\]"
    )
