"""Rewriting the applicators `allOf`, `anyOf`, `oneOf` (`structural`): a node's branches, its
type(s) (`infer_types`), branches absorbed by a whole type, and `oneOf` made provably disjoint
(`exclusive_branches`, `check_disjoint`).
"""

import itertools
import typing
from collections.abc import Mapping

from . import budgets
from .conditionals import negation
from .enums import canonical, enumeration, json_type
from .errors import (
    NoCommonType,
    UnsupportedSchemaError,
)
from .exact_one_of import exact_one_of
from .keywords import (
    AT_LEAST_ONE,
    JSON_TYPES,
    TYPE_KEYWORDS,
    asserts,
)
from .merging import OBJECT_MEMBERS, flat_all_of, into_branches, merge
from .references import (
    NEVER,
    applicator_first,
)

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter


def _single_required_names(branches: list) -> list | None:
    """The names of `anyOf: [{"required": [x1]}, {"required": [x2]}, ...]` (at least one of
    the names, annotations aside), else `None` (also for repeated or non-string names)."""
    names = []
    for branch in branches:
        if not isinstance(branch, Mapping) or {k for k in branch if asserts(k)} != {"required"}:
            return None
        required = branch["required"]
        if not isinstance(required, list) or len(required) != 1:
            return None
        names.append(required[0])
    if len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
        return None
    return names


def _first_present(node: dict, branches: list) -> list:
    """`anyOf: [{"required": [x1]}, {"required": [x2]}, ...]` (at least one of the names,
    annotations aside) as "the first of them present is x_i": branch i also makes the names
    before x_i absent (`properties: {x_j: false}`), in the order the object writes its members
    (`node`'s `properties`, then the others). The union is the same, but the branches no longer
    overlap, so an automaton reading the members in order follows one branch once a name is
    seen, where the overlapping form followed every subset of the names still possible:
    MaskBench o21108's 8 names made outlines-core's DFA 302,634 states. Other `anyOf`s, and
    those of fewer than 3 names (small either way), are returned as they are. (With
    `property_order="any"` the object holds the names instead, `AT_LEAST_ONE`.)"""
    names = _single_required_names(branches)
    if names is None or len(names) < 3:
        return branches
    listed = (
        list(node.get("properties") or {}) if isinstance(node.get("properties"), Mapping) else []
    )
    rank = {name: i for i, name in enumerate(listed)}
    names.sort(key=lambda name: rank.get(name, len(listed)))
    return [
        {"required": [name], **({"properties": dict.fromkeys(names[:i], False)} if i else {})}
        for i, name in enumerate(names)
    ]


def _whole_type(schema, closed_objects: bool) -> str | None:
    """The JSON type whose every value `schema` allows and nothing else (`{"type": "string"}`,
    `{"type": ["object"], "properties": {}, "title": ...}`: annotations and keywords that
    assert nothing beside the `type`), else `None`. An object is not whole with
    `closed_objects` (it then allows only `{}`)."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, list) and len(kind) == 1:
        kind = kind[0]
    if not isinstance(kind, str) or kind not in JSON_TYPES:
        return None
    if kind == "object" and closed_objects:
        return None
    for key, value in schema.items():
        if key == "type" or not asserts(key):
            continue
        if key in ("properties", "patternProperties", "required") and not value:
            continue
        if key in ("additionalProperties", "items") and (value is True or value == {}):
            continue
        return None
    return kind


def _value_types(schema) -> set[str] | None:
    """The JSON types a schema's values may have, as far as its `const`, `enum` or `type`
    says (`integer` for integral numbers), else `None`."""
    if not isinstance(schema, Mapping):
        return None
    if "const" in schema:
        return {json_type(schema["const"])}
    if isinstance(schema.get("enum"), list):
        return {json_type(value) for value in schema["enum"]}
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list) and all(isinstance(k, str) for k in kind):
        return set(kind)
    return None


def _forbidden_names(schema) -> set:
    """Names an object under `schema` cannot have: property schemas `false` (also inside an
    `allOf`, as `merge` writes them), and those of a `not` of `required` with one choice."""

    @typing.no_type_check
    def never(prop) -> bool:
        return prop is False or (
            isinstance(prop, Mapping)
            and isinstance(prop.get("allOf"), list)
            and any(p is False for p in prop["allOf"])
        )

    if not isinstance(schema, Mapping):
        return set()
    names = {n for n, p in schema.get("properties", {}).items() if never(p)}
    parts = [negation(schema["not"])] if "not" in schema else []
    parts += schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []
    for part in parts:
        if isinstance(part, Mapping) and "anyOf" not in part and "not" not in part:
            names |= _forbidden_names(part)
    return names


def _listed_value_keys(schema) -> set | None:
    """The canonical keys (`canonical`) of the values `schema` may take when it lists them
    (`const`, `enum`, or such a schema among `allOf`'s parts: the intersection), else `None`."""
    if not isinstance(schema, Mapping):
        return None
    found = []
    if "const" in schema:
        found.append({canonical(schema["const"])})
    elif isinstance(schema.get("enum"), list):
        found.append({canonical(v) for v in schema["enum"]})
    for part in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        values = _listed_value_keys(part)
        if values is not None:
            found.append(values)
    for combinator in ("anyOf", "oneOf"):  # listed when every branch lists: the union
        if isinstance(schema.get(combinator), list):
            parts = [_listed_value_keys(part) for part in schema[combinator]]
            if parts and all(p is not None for p in parts):
                found.append(set().union(*parts))
    return set.intersection(*found) if found else None


def structural(rewriter: "Rewriter", node: dict, path: str):
    """The node after its applicators: `allOf` merged into one schema, `anyOf`/`oneOf` as
    branches (`oneOf` made disjoint, `exclusive_branches`), `enum`/`const` listed, else the
    node of its type(s) (`Rewriter.typed`). `NEVER` when no value satisfies it."""
    if "allOf" in node:
        # the node's own members after the parts where `allOf` comes first in its text
        # (llguidance's order, `applicator_first`), else before them
        own = (
            {k: node.pop(k) for k in OBJECT_MEMBERS if k in node}
            if applicator_first(node, "allOf")
            else {}
        )
        keys = list(node)
        parts_first = any(  # the node's own `anyOf`/`oneOf` came after `allOf`
            k in node and keys.index("allOf") < keys.index(k) for k in ("anyOf", "oneOf")
        )
        merged = node
        for where, branch in flat_all_of(node.pop("allOf"), f"{path}/allOf"):
            if branch is NEVER or branch is False:
                return NEVER
            try:
                into = into_branches(rewriter, merged, branch, where, parts_first)
                merged = into if into is not None else merge(rewriter, merged, branch, where)
            except NoCommonType as e:  # types that share no value: the schema has none
                return rewriter.admits_none("allOf", e.path, e.reason)
        if own:
            try:
                merged = merge(rewriter, merged, own, path)
            except NoCommonType as e:
                return rewriter.admits_none("allOf", e.path, e.reason)
        return rewriter.node(merged, path)
    if "anyOf" in node and "oneOf" in node and isinstance(node["anyOf"], list):
        # (a1 | a2) & oneOf(O) = (a1 & oneOf(O)) | (a2 & oneOf(O)). (As one `allOf` of the
        # two, the merge put both back side by side and this recursed forever: MaskBench
        # Github_hard o12454.) A branch's own `anyOf` is distributed the same way, deeper.
        one_of = node.pop("oneOf")
        node["anyOf"] = [{"allOf": [branch, {"oneOf": one_of}]} for branch in node["anyOf"]]
        return structural(rewriter, node, path)
    for combinator in ("anyOf", "oneOf"):
        if combinator in node:
            # a branch's members before the node's own where the combinator comes first
            # in the node's text (llguidance's order, `applicator_first`)
            branch_first = applicator_first(node, combinator)
            branches = node.pop(combinator)
            if not isinstance(branches, list) or not branches:
                raise UnsupportedSchemaError(
                    combinator, path, "must be a non-empty list of schemas"
                )
            names = _single_required_names(branches) if combinator == "anyOf" else None
            if (
                names is not None
                and len(names) > 1
                and rewriter.property_order == "any"
                and not {"const", "enum", AT_LEAST_ONE} & node.keys()
            ):
                # at least one of the names, in any order: the object tracks them itself
                # (`unordered_members`); as branches of their own, each object in any order,
                # their automata would multiply
                node[AT_LEAST_ONE] = names
                continue
            if combinator == "oneOf":
                branches = exclusive_branches(rewriter, node, branches, path)
            else:
                branches = _first_present(node, branches)
            merged = []
            for i, branch in enumerate(branches):
                where = f"{path}/{combinator}/{i}"
                if branch is NEVER or branch is False:
                    continue
                try:
                    if not node:
                        merged.append((where, branch))
                    elif branch_first and isinstance(branch, Mapping):
                        merged.append((where, merge(rewriter, branch, node, where)))
                    else:
                        merged.append((where, merge(rewriter, node, branch, where)))
                except NoCommonType:  # e.g. a non-object branch of an object: no value
                    continue
            if combinator == "anyOf":
                merged = absorbed(rewriter, merged)
            combined, originals = [], []
            for where, original in merged:
                rewritten = rewriter.node(original, where)
                if rewritten is not NEVER:
                    combined.append(rewritten)
                    originals.append((where, original))
            if not combined:
                return NEVER
            if combinator == "oneOf":
                try:  # judged on the schemas: markers would all look like constants
                    check_disjoint(rewriter, [original for _, original in originals], path)
                except UnsupportedSchemaError as e:
                    # overlapping: exactly one branch's values, kind by kind, where regular
                    exact = exact_one_of(rewriter, originals, path, e.reason)
                    if exact is not None:
                        if not exact:
                            return rewriter.admits_none(
                                "oneOf", path, "no value matches exactly one branch"
                            )
                        combined = exact
            if len(combined) == 1:
                return combined[0]
            calls = set(rewriter.recursive.values())
            if any(branch.get("const") in calls for branch in combined):
                # its own marker: where a one-byte lookahead cannot choose between the
                # recursive targets, the `anyOf` is the rule instead (`_cycle_breakers`)
                return rewriter.marker(rewriter.regex_of({"anyOf": combined}))
            return {"anyOf": combined}
    if "const" in node or "enum" in node:
        return enumeration(rewriter, node, path)
    types = node.get("type")
    if types is None:
        types = infer_types(rewriter, node)
    if isinstance(types, list):
        if not types:
            raise UnsupportedSchemaError("type", path, "an empty list of types allows no value")
        if len(types) == 1:
            return rewriter.typed(types[0], node, path)
        branches = [
            b
            for i, t in enumerate(types)
            if (b := rewriter.typed(t, node, f"{path}/type/{i}")) is not NEVER
        ]
        return NEVER if not branches else branches[0] if len(branches) == 1 else {"anyOf": branches}
    return rewriter.typed(types, node, path)


def absorbed(rewriter: "Rewriter", branches: list) -> list:
    """The `(path, schema)` branches of an `anyOf` without those whose values are all of
    types that another branch allows whole (`{"type": "object"}`, `{"type": "string"}`,
    ... with annotations only, `_whole_type`): the union is the same. Where a branch is an
    open object without properties, the objects beside it would otherwise start alike with
    different continuations, a value call where the others read a string (MaskBench
    o69208's `requirements`: one byte cannot choose). An absorbed branch is not rewritten,
    so nothing in it is refused."""
    whole: dict[str, int] = {}
    for i, (_, schema) in enumerate(branches):
        kind = _whole_type(schema, rewriter.closed_objects)
        if kind is not None:
            whole.setdefault(kind, i)
    if not whole:
        return branches
    kept = set(whole.values())
    out = []
    for i, branch in enumerate(branches):
        kinds = _value_types(branch[1])
        covered = kinds is not None and all(
            kind in whole or (kind == "integer" and "number" in whole) for kind in kinds
        )
        if i in kept or not covered:
            out.append(branch)
    return out


def infer_types(rewriter: "Rewriter", node: dict):
    """No `type`: every JSON type is allowed, and each type-specific keyword constrains only
    values of its type (`{"properties": {...}}` also accepts `"text"` or `3`), as validators
    read it. `None` when no type-specific keyword is present (any value)."""
    present = [t for t, keys in TYPE_KEYWORDS.items() if keys & node.keys() and t != "integer"]
    if not present:
        return None
    return present + [
        t for t in ("object", "array", "string", "number", "boolean", "null") if t not in present
    ]


def exclusive_branches(rewriter: "Rewriter", node: dict, branches: list, path: str) -> list:
    """`oneOf`'s branches with what two of them always share taken out, exactly:

    - all branches finite (`enum`/`const`): one `enum` of the listed values exactly one
      branch accepts (each judged by `jsonschema`);
    - a JSON type that two or more branches accept whole (no keyword of theirs constrains
      it, e.g. the strings under two object-only branches without `type`): no value of it
      can match exactly one branch, so every branch is restricted to the other types.

    Other branches are returned unchanged (`check_disjoint` then decides). `node`: the
    keywords beside `oneOf` (merged into each branch by the caller)."""
    branches = [absorb_negation(rewriter, b, path) for b in branches]
    merged = [
        merge(rewriter, node, b, path) if isinstance(b, Mapping) else b
        for b in branches
        if b is not NEVER and b is not False
    ]
    if not merged or not all(isinstance(b, Mapping) for b in merged):
        return branches
    if all("const" in b or isinstance(b.get("enum"), list) for b in merged):
        values = exclusive_values(rewriter, merged)
        return branches if values is None else [values]
    presence = exclusive_presence(rewriter, branches)
    if presence is not None:
        return presence
    kinds = ("null", "boolean", "object", "array", "string", "integer", "fraction")
    type_keywords = {"type"}.union(*TYPE_KEYWORDS.values())
    free = []  # per branch: the kinds of value it accepts whole
    for b in merged:
        asserting = {k for k in b if asserts(k)}
        if not asserting <= type_keywords:  # e.g. `enum`, `anyOf`: nothing is known whole
            free.append(set())
            continue
        declared = b.get("type", sorted(JSON_TYPES))
        declared = {declared} if isinstance(declared, str) else set(declared)
        accepted = {k for k in kinds if k in declared}
        if "number" in declared:
            accepted |= {"integer", "fraction"}
        constrained = {t for t, keys in TYPE_KEYWORDS.items() if keys & asserting}
        if constrained & {"number", "integer"}:
            constrained |= {"integer", "fraction"}
        free.append(accepted - constrained)
    shared = {k for k in kinds if sum(k in f for f in free) >= 2}
    if not shared or ("integer" in shared and "fraction" not in shared):
        return branches  # nothing shared whole, or "numbers but not integers": no `type`
    kept = sorted(t for t in JSON_TYPES - {"number", "integer"} if t not in shared)
    if "integer" not in shared:
        kept.append("integer" if "fraction" in shared else "number")
    out = []
    for b in branches:
        if b is NEVER or b is False:
            continue
        try:
            out.append(merge(rewriter, b if isinstance(b, Mapping) else {}, {"type": kept}, path))
        except UnsupportedSchemaError:  # none of its types is left: it matches nothing alone
            continue
    return out or [NEVER]


def absorb_negation(rewriter: "Rewriter", branch, path: str):
    """`branch` with a `not` whose complement is one schema without `anyOf` (`negation`:
    a type, a name that must be absent) merged in, so that its type and forbidden names are
    visible to the disjointness proof; `NEVER` when nothing is left."""
    if not isinstance(branch, Mapping) or "not" not in branch:
        return branch
    negated = negation(branch["not"])
    if negated is False:
        return NEVER
    if not isinstance(negated, Mapping) or "anyOf" in negated:
        return branch
    try:
        return merge(rewriter, {k: v for k, v in branch.items() if k != "not"}, negated, path)
    except UnsupportedSchemaError:  # e.g. no type left in common
        return NEVER


def exclusive_presence(rewriter: "Rewriter", branches: list) -> list | None:
    """Branches that only require properties (`{"required": [...]}`, the "exactly one of
    these fields" idiom): an object matches exactly branch `i` when it has `R_i` and, for
    every other branch `j`, lacks one of `R_j` (a property schema `false`). One `anyOf` of
    those choices (at most `MAX_PRESENCE_CHOICES`); `None` when the branches are not of
    this form (a non-object value matches all of them or none: objects only)."""
    sets = []
    for b in branches:
        if not isinstance(b, Mapping) or b.get("type", "object") != "object":
            return None
        required = b.get("required")
        if not {k for k in b if asserts(k)} <= {"required", "type"} or not (
            isinstance(required, list) and all(isinstance(n, str) for n in required)
        ):
            return None
        sets.append(list(dict.fromkeys(required)))
    if len(sets) < 2:
        return None
    choices = []
    for i, mine in enumerate(sets):
        others = [[n for n in theirs if n not in mine] for j, theirs in enumerate(sets) if j != i]
        if any(not names for names in others):
            continue  # having `mine` means having another branch's names too
        for absent in itertools.product(*others):
            choices.append({"required": mine, "properties": dict.fromkeys(absent, False)})
            if len(choices) > budgets.MAX_PRESENCE_CHOICES:
                return None
    return [{"type": "object", "anyOf": choices}] if choices else [NEVER]


def exclusive_values(rewriter: "Rewriter", merged: list):
    """`{"enum": [...]}` of the values exactly one of the finite branches `merged` accepts
    (judged by `jsonschema` with the root's draft and format checker), or `None` when
    `jsonschema` cannot judge a branch."""
    # deferred on purpose: jsonschema loads only to check a schema
    import jsonschema

    cls = jsonschema.validators.validator_for(
        rewriter.root, default=jsonschema.Draft202012Validator
    )
    candidates: dict = {}
    for b in merged:
        for v in [b["const"]] if "const" in b else b["enum"]:
            candidates.setdefault(canonical(v), v)
    try:
        validators = [cls(b, format_checker=cls.FORMAT_CHECKER) for b in merged]
        return {
            "enum": [
                v
                for v in candidates.values()
                if sum(bool(check.is_valid(v)) for check in validators) == 1
            ]
        }
    except Exception:  # e.g. a branch holding a cut recursion (`NEVER`)
        return None


def check_disjoint(rewriter: "Rewriter", branches: list, path: str) -> None:
    """`oneOf` needs exactly one branch to match: accept it when no two branches can match
    the same value (different JSON types, different constants, or objects with a property
    both require whose values cannot be equal: different constants, different types, or
    such a property again one level down; or a required name the other cannot have)."""
    signatures = [signature(rewriter, b, path) for b in branches]
    for i in range(len(branches)):
        for j in range(i + 1, len(branches)):
            if not disjoint(rewriter, signatures[i], signatures[j]):
                raise UnsupportedSchemaError(
                    "oneOf", path, f"branches {i} and {j} may both match one value"
                )


def signature(rewriter: "Rewriter", node, path: str, depth: int = 0):
    """A summary of the values `node` admits for `disjoint` (its types, listed values,
    required names and their values, one level down), or `None` where none is known."""
    node = rewriter.deref(node, path)
    if not isinstance(node, Mapping) or depth > 8:
        return None
    for combinator in ("anyOf", "oneOf"):  # a value of either matches one of its branches
        if isinstance(node.get(combinator), list):
            parts = [signature(rewriter, b, path, depth + 1) for b in node[combinator]]
            if all(p is not None for p in parts):
                return ("union", parts)
            # else the node's own keywords (its `type`, ...) still hold for its values: judge
            # by them alone, a superset (o76546: a string, or an object with an `anyOf` of
            # `required`)
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        return ("values", [canonical(v) for v in values], {json_type(v) for v in values})
    t = node.get("type")
    if t is None:
        return None
    types = set([t] if isinstance(t, str) else t)
    if "number" in types:
        types.add("integer")
    discriminators, required, closed, values_of = {}, set(), None, {}
    if types == {"object"}:
        required = required_names(rewriter, node, path)
        properties = node.get("properties", {})
        for name in required:
            values = _listed_value_keys(properties.get(name, {}))
            if values is not None:
                discriminators[name] = values
            if isinstance(properties, Mapping) and name in properties:
                values_of[name] = (properties[name], depth + 1)  # its signature, when needed
        if node.get("additionalProperties") is False and not node.get("patternProperties"):
            closed = set(node.get("properties", {}))  # the only names it may have
    forbidden = _forbidden_names(node)
    return ("types", types, discriminators, required, closed, forbidden, values_of, path)


def required_names(rewriter: "Rewriter", node, path: str, depth: int = 0) -> set:
    """The names every object valid under `node` has: its `required`, and those of its
    `allOf` members (MaskBench Github_medium o6249: a `oneOf` of closed objects whose
    `required` sits in an `allOf`)."""
    names = set(node.get("required", [])) if isinstance(node.get("required"), list) else set()
    if isinstance(node.get("allOf"), list) and depth < 8:
        for member in node["allOf"]:
            member = rewriter.deref(member, path)
            if isinstance(member, Mapping):
                names |= required_names(rewriter, member, path, depth + 1)
    return {n for n in names if isinstance(n, str)}


def disjoint(rewriter: "Rewriter", a, b) -> bool:
    """Whether two `signature`s provably share no value (`False` where unknown)."""
    if a is None or b is None:
        return False
    if a[0] == "union":
        return all(disjoint(rewriter, p, b) for p in a[1])
    if b[0] == "union":
        return all(disjoint(rewriter, a, p) for p in b[1])
    if a[0] == "values" and b[0] == "values":
        return not set(a[1]) & set(b[1])
    if a[0] == "values" or b[0] == "values":
        values, typed = (a, b) if a[0] == "values" else (b, a)
        return not values[2] & typed[1]
    if not a[1] & b[1]:
        return True
    if a[1] == b[1] == {"object"}:
        return (
            any(name in b[2] and not a[2][name] & b[2][name] for name in a[2])
            or (b[4] is not None and bool(a[3] - b[4]))  # `a` requires what `b` cannot have
            or (a[4] is not None and bool(b[3] - a[4]))
            or bool(a[3] & b[5])  # ... or forbids
            or bool(b[3] & a[5])
            or any(  # a property both require, whose values cannot be equal (nested)
                name in b[6]
                and disjoint(
                    rewriter,
                    signature(rewriter, a[6][name][0], a[7], a[6][name][1]),
                    signature(rewriter, b[6][name][0], b[7], b[6][name][1]),
                )
                for name in a[6]
            )
        )
    return False
