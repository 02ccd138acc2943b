"""`allOf` merged into one schema (`merge`): two schemas' keywords intersected, object members
together (`_merge_members`), a part merged into each branch of an earlier `anyOf`/`oneOf`
(`into_branches`).
"""

import re
import typing
from collections.abc import Mapping

from . import budgets
from .enums import canonical
from .errors import (
    NoCommonType,
    RecursionRefused,
    UnsupportedSchemaError,
)
from .keywords import (
    NOT_STRINGS,
    asserts,
)
from .references import (
    RECURSIVE,
    applicator_first,
)

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter


OBJECT_MEMBERS = ("properties", "patternProperties", "additionalProperties")
"""An object's member keywords: `additionalProperties` applies to the keys that its own schema's
`properties` and `patternProperties` leave, so two schemas' members merge together
(`_merge_members`), never keyword by keyword."""


def _both(x, y):
    """The schema of `x` AND `y`, written simply where one of them says nothing or forbids all."""
    if x is True or x == {}:
        return y
    if y is True or y == {} or x == y:
        return x
    if x is False or y is False:
        return False
    return {"allOf": [x, y]}


def flat_all_of(branches, path: str) -> list:
    """`(path, branch)` for each of the `allOf` `branches`, a branch's own `allOf` spliced in
    beside its other keywords, in the order of the branch's text as llguidance reads it: after
    them (its properties first: a `$ref` beside siblings, inlined as `{"allOf": [target,
    siblings]}`, lists the target's properties first at every level of nesting), or before
    them where `allOf` comes before `properties` (`applicator_first`). Merging them in this
    order is the same schema (`allOf` is associative)."""
    if not isinstance(branches, list):
        return [(path, branches)]
    out = []
    for i, branch in enumerate(branches):
        where = f"{path}/{i}"
        if isinstance(branch, Mapping) and isinstance(branch.get("allOf"), list):
            own = {k: v for k, v in branch.items() if k != "allOf"}
            nested = flat_all_of(branch["allOf"], f"{where}/allOf")
            if applicator_first(branch, "allOf"):
                out.extend(nested)
                if own:
                    out.append((where, own))
            else:
                if own:
                    out.append((where, own))
                out.extend(nested)
        else:
            out.append((where, branch))
    return out


def _searches(pattern: str, name: str) -> bool:
    """Whether `pattern` matches somewhere in `name` (`False` for a pattern Python cannot
    compile: `_object` refuses it with its location)."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def _merge_members(a: Mapping, b: Mapping, path: str) -> dict:
    """`properties`, `patternProperties` and `additionalProperties` of the schema `a` AND `b`:
    each listed name gets both sides' schemas for it (a side that does not list it gives the
    schemas of its patterns that match the name, or its `additionalProperties`, `{}` by
    default); each pattern of one side is combined with the other side's
    `additionalProperties`; the keys neither lists nor matches get both `additionalProperties`.
    Exact when at most one side has `patternProperties`, or both have but neither restricts its
    additional keys.

    **Raises:** `UnsupportedSchemaError` when both sides have `patternProperties` and one also
    restricts its additional keys (the keys one side's patterns leave to the other's
    `additionalProperties` would need a pattern difference)."""
    sides = []
    for x in (a, b):
        sides.append(
            (
                dict(x.get("properties", {})),
                dict(x.get("patternProperties", {})),
                x.get("additionalProperties", True),
            )
        )
    (pa, qa, xa), (pb, qb, xb) = sides
    if qa and qb and not (_both(xa, True) is True and _both(xb, True) is True):
        raise UnsupportedSchemaError(
            "patternProperties",
            path,
            "in both schemas of an allOf, where one also restricts `additionalProperties`",
        )

    @typing.no_type_check
    def side_of(name, listed, patterns, additional):
        if name in listed:
            return listed[name]
        matched = [s for p, s in patterns.items() if _searches(p, name)]
        if not matched:
            return additional
        out = matched[0]
        for schema in matched[1:]:
            out = _both(out, schema)
        return out

    out: dict = {}
    names = list(dict.fromkeys([*pa, *pb]))
    if names:
        out["properties"] = {
            n: _both(side_of(n, pa, qa, xa), side_of(n, pb, qb, xb)) for n in names
        }
    patterns = {p: _both(s, xb) for p, s in qa.items()}
    for p, s in qb.items():
        patterns[p] = _both(patterns[p], s) if p in patterns else _both(xa, s)
    if patterns:
        out["patternProperties"] = patterns
    additional = _both(xa, xb)
    if additional is not True and additional != {}:
        out["additionalProperties"] = additional
    return out


def into_branches(
    rewriter: "Rewriter", node: dict, part, path: str, part_first: bool = False
) -> dict | None:
    """`node` AND `part` for an `allOf` whose earlier parts gave `node` an `anyOf` or
    `oneOf` and whose later `part` lists properties: `part` merged into each branch, so that
    a branch's properties come before `part`'s, in the order of the parts, as llguidance
    distributes them (MaskBench Github_trivial o64859: `allOf: [{oneOf: [..]}, {properties:
    {builder, id, target}}]`, whose documents list a branch's members first); with
    `part_first` (the node's `allOf` came before its `anyOf`/`oneOf` in the text), `part`'s
    before the branch's. The same schema as merging `part` into `node` (`(B1 | B2) & P =
    (B1 & P) | (B2 & P)`). `None` where that does not apply (no single such combinator,
    `part` lists no properties or has the same combinator, a recursive reference, a branch
    without a common type)."""
    keys = [k for k in ("anyOf", "oneOf") if k in node]
    if (
        len(keys) != 1
        or not isinstance(part, Mapping)
        or keys[0] in part
        or not any(k in part for k in OBJECT_MEMBERS)
        or RECURSIVE in part
        or not isinstance(node[keys[0]], list)
        or not all(isinstance(b, Mapping) and RECURSIVE not in b for b in node[keys[0]])
    ):
        return None
    try:
        if part_first:
            branches = [merge(rewriter, part, b, path) for b in node[keys[0]]]
        else:
            # the node's own members before `part`'s where they come after its branches'
            # (`applicator_first`): llguidance read the node whole before `part`
            own = (
                {k: node[k] for k in OBJECT_MEMBERS if k in node}
                if applicator_first(node, keys[0])
                else {}
            )
            branches = [
                merge(rewriter, merge(rewriter, b, own, path) if own else b, part, path)
                for b in node[keys[0]]
            ]
            node = {k: v for k, v in node.items() if k not in own}
    except NoCommonType:
        return None
    return {**node, keys[0]: branches}


def merge(rewriter: "Rewriter", a, b, path: str) -> dict:
    """The schema of `a` AND `b` (for `allOf` and sibling keywords)."""
    if any(isinstance(x, Mapping) and RECURSIVE in x for x in (a, b)):
        # a recursive target merged with other keywords: its subtree, one level inlined
        # (its own references still call the target's rule); a recursion through such
        # merges would unroll forever, so their number is bounded
        a, b = rewriter.deref(a, path), rewriter.deref(b, path)
        if a != {} and b is not True and b != {}:
            rewriter.recursive_merges += 1
        if rewriter.recursive_merges > budgets.MAX_RECURSIVE_MERGES:
            raise RecursionRefused(f"a recursive reference merged with other keywords at {path}")
    if b is True or b == {}:
        return dict(a)
    if not isinstance(b, Mapping):
        raise UnsupportedSchemaError("allOf", path, f"cannot combine with {b!r}")
    out = dict(a)
    for key, value in b.items():
        if not asserts(key):  # an annotation: the first one is kept, nothing to combine
            out.setdefault(key, value)
        elif key not in out:
            out[key] = value
        elif key == "required":
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == NOT_STRINGS:
            out[key] = sorted({*out[key], *value})
        elif (
            key in ("items", "propertyNames")
            and isinstance(out[key], (Mapping, bool))
            and isinstance(value, (Mapping, bool))
            and "prefixItems" not in a
            and "prefixItems" not in b
        ):
            # every item (name) matches both schemas: their `allOf` (with `prefixItems` on
            # a side, `items` would start at different indices)
            out[key] = {"allOf": [out[key], value]}
        elif key in ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"):
            out[key] = max(out[key], value)
        elif key in ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"):
            out[key] = min(out[key], value)
        elif key == "type":
            left = set([out[key]] if isinstance(out[key], str) else out[key])
            right = set([value] if isinstance(value, str) else value)
            if "number" in left and "integer" in right:
                left.add("integer")
            if "number" in right and "integer" in left:
                right.add("integer")
            both = sorted(left & right)
            if not both:
                raise NoCommonType(
                    "allOf", path, f"types {out[key]!r} and {value!r} have no value in common"
                )
            out[key] = both[0] if len(both) == 1 else both
        elif key == "allOf":
            out[key] = [*out[key], *value]
        elif (
            key == "anyOf"
            and isinstance(out[key], list)
            and isinstance(value, list)
            and len(out[key]) * len(value) <= budgets.MAX_CONDITIONAL_BRANCHES
        ):
            # (x1 | x2) & (y1 | y2) = (x1 & y1) | (x1 & y2) | ...: e.g. a discriminated
            # union (`conditionals_as_branches`) beside an `anyOf` of the schema's own
            out[key] = [{"allOf": [x, y]} for x in out[key] for y in value]
        elif key == "enum" and isinstance(out[key], list) and isinstance(value, list):
            right = {canonical(v) for v in value}
            out[key] = [v for v in out[key] if canonical(v) in right]  # [] matches nothing
        elif key == "const" and canonical(out[key]) != canonical(value):
            out["enum"] = []  # two different constants: no value
        elif key in OBJECT_MEMBERS:
            continue  # below, from both sides at once
        elif out[key] != value:
            raise UnsupportedSchemaError(
                key,
                path,
                f"cannot combine two different `{key}` ({out[key]!r} and {value!r}) in allOf",
            )
    if any(k in a for k in OBJECT_MEMBERS) and any(k in b for k in OBJECT_MEMBERS):
        out.update(_merge_members(a, b, path))
    return out
