"""`not` and `if`/`then`/`else` where they are exact as schemas: the complement of a shape
(`negation`) and discriminated unions (`conditionals_as_branches`).
"""

import itertools
import typing
from collections.abc import Mapping

from . import budgets
from .enums import canonical, json_type, listed_values
from .keywords import (
    JSON_TYPES,
    asserts,
)


def negation(schema):
    """A schema equal to `{"not": schema}` where the complement is one, else `None`:

    - `true`/`{}` -> `false`; `false` -> `true`;
    - `{"type": T}` -> the other JSON types (`integer`'s complement is not a type: `None`);
    - `{"required": R}` (beside vacuous `properties`) -> an object that lacks one of `R` (its
      property schema `false`); `{"anyOf": [{"required": R1}, ...]}` -> an object that lacks
      one of each `Ri` (at most `MAX_NEGATION_CHOICES` choices). `required` holds only for
      objects, so every other value matches it and fails the `not`.

    Annotations are ignored. MaskBench's docker-compose schemas use the `required` forms."""
    if schema is True or schema == {}:
        return False
    if schema is False:
        return True
    if not isinstance(schema, Mapping):
        return None
    keys = {k for k in schema if asserts(k)}
    if keys == {"type"}:
        t = schema["type"]
        types = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
        if not types or not types <= JSON_TYPES or types & {"integer", "number"} == {"integer"}:
            return None
        rest = sorted(JSON_TYPES - types - {"integer", "number"})
        if not types & {"number", "integer"}:
            rest.append("number")
        return {"type": rest} if rest else False

    @typing.no_type_check
    def required_sets(part):
        if not isinstance(part, Mapping):
            return None
        vacuous = all(v is True or v == {} for v in part.get("properties", {}).values())
        names = part.get("required")
        if (
            {k for k in part if asserts(k)} <= {"required", "properties"}
            and vacuous
            and isinstance(names, list)
            and all(isinstance(n, str) for n in names)
        ):
            return [list(dict.fromkeys(names))]
        return None

    if keys == {"anyOf"} and isinstance(schema["anyOf"], list):
        sets = []
        for part in schema["anyOf"]:
            found = required_sets(part)
            if found is None:
                return None
            sets += found
    else:
        sets = required_sets(schema)
    if not sets:
        return None
    if any(not names for names in sets):  # `required: []` holds for every value
        return False
    choices = list(itertools.islice(itertools.product(*sets), budgets.MAX_NEGATION_CHOICES + 1))
    if len(choices) > budgets.MAX_NEGATION_CHOICES:
        return None
    branches = [{"properties": dict.fromkeys(absent, False)} for absent in choices]
    return {"type": "object", **({"anyOf": branches} if len(branches) > 1 else branches[0])}


def conditional(part):
    """`(if, then, else)` of an `allOf` part that holds only a conditional (and annotations),
    else `None`; `then`/`else` default to `true`."""
    if not isinstance(part, Mapping) or "if" not in part:
        return None
    if {k for k in part if asserts(k)} - {"if", "then", "else"}:
        return None
    return part["if"], part.get("then", True), part.get("else", True)


def _discriminator(condition):
    """`(name, values, required, object_only)` when `condition` (an `if` schema) tests one
    property against listed values: `{"properties": {name: {"const": v}}}` (or `enum`, a
    `type` beside them; `"required": [name]` and `"type": "object"` optional), else `None`.
    `values`: the canonical keys (`canonical`) of the values that pass the test."""
    if not isinstance(condition, Mapping):
        return None
    properties = condition.get("properties")
    if {k for k in condition if asserts(k)} - {"properties", "required", "type"}:
        return None
    if not isinstance(properties, Mapping) or len(properties) != 1:
        return None
    if condition.get("type", "object") != "object":
        return None
    (name, schema), required = next(iter(properties.items())), condition.get("required", [])
    if required not in ([], [name]) or not isinstance(schema, Mapping):
        return None
    if {k for k in schema if asserts(k)} - {"const", "enum", "type"}:
        return None
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if not isinstance(values, list):
        return None
    types = schema.get("type", sorted(JSON_TYPES))
    types = {types} if isinstance(types, str) else set(types)
    if "number" in types:
        types.add("integer")
    keys = {canonical(v) for v in values if json_type(v) in types}
    if "const" in schema and "enum" in schema:
        keys &= {canonical(v) for v in schema["enum"]}
    return name, keys, bool(required), "type" in condition


def _discriminator_negation(condition):
    """A schema equal to `{"not": condition}` for a discriminator `if` (`_discriminator`), or
    `None`: an object that has the property with a value the `if` does not list (`not` of the
    listed values: compiled for strings, `excluded_strings`), or lacks it where the `if`
    requires it, or a non-object value where the `if` says `"type": "object"`."""
    found = _discriminator(condition)
    if found is None:
        return None
    name, keys, required, object_only = found
    schema = condition["properties"][name]
    values = [schema["const"]] if "const" in schema else schema["enum"]
    listed = [v for v in values if canonical(v) in keys]
    if not listed:
        return None
    branches = [
        {"type": "object", "required": [name], "properties": {name: {"not": {"enum": listed}}}}
    ]
    if required:
        branches.append({"type": "object", "properties": {name: False}})
    if object_only:
        branches.append({"type": sorted(JSON_TYPES - {"object", "integer"})})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def conditionals_as_branches(node: dict) -> dict:
    """`node` with its conditionals (`if`/`then`/`else` of its own and of `allOf` parts that
    hold only one) rewritten as an exact `anyOf`, when every `if` tests the same property
    against listed values (`_discriminator`: the discriminated unions of JSON Schema Store,
    `allOf: [{if: {properties: {type: {const: "a"}}}, then: A}, ...]`) and the property's own
    schema lists its values: one branch per group of values that select the same `then`/`else`
    parts, one where the property is absent, one for values that are not objects (where an
    `if` of `properties` holds vacuously). Where the property's own schema does not list its
    values (`{"type": "string"}`), the groups are those of the values the `if`s list, and one
    more branch has every `else` part for the property with any other value (`not` of the
    listed values: compiled for strings, `excluded_strings`; JSON Schema Store's typo3.json). A single `if` whose complement is a schema
    (`negation`) becomes `anyOf: [allOf: [if, then], allOf: [not if, else]]`. `then`/`else`
    without `if` assert nothing (JSON Schema 2020-12 core §10.2.2) and are dropped. Otherwise
    `node` is returned with its conditionals, which the rewrite then refuses."""
    node = dict(node)
    if "if" not in node:
        node.pop("then", None)
        node.pop("else", None)
    rest = {k: v for k, v in node.items() if k not in ("if", "then", "else", "allOf")}
    conditionals, kept = [], []
    if "if" in node:
        conditionals.append((node["if"], node.get("then", True), node.get("else", True)))
    for part in node.get("allOf", []):
        found = conditional(part)
        (kept if found is None else conditionals).append(part if found is None else found)
    if not conditionals:
        return node
    found = [_discriminator(condition) for condition, _, _ in conditionals]
    if len(conditionals) == 1 and found[0] is None:
        condition, then, otherwise = conditionals[0]
        negated = negation(condition)
        if negated is None:
            return node
        branches = [{"allOf": [condition, then]}, {"allOf": [negated, otherwise]}]
        return {**rest, "allOf": [*kept, {"anyOf": branches}]}
    if any(f is None for f in found) or len({f[0] for f in found}) != 1:
        return node
    name = found[0][0]
    properties = node.get("properties")
    own = properties.get(name) if isinstance(properties, Mapping) else None
    if isinstance(own, Mapping) and {k for k in own if asserts(k)} == {"type"}:
        # the finite types list their values
        finite = {"boolean": [False, True], "null": [None]}
        types = [own["type"]] if isinstance(own["type"], str) else own["type"]
        if isinstance(types, list) and types and all(t in finite for t in types):
            own = {"enum": [v for t in types for v in finite[t]]}
    listed = listed_values(own) if isinstance(own, Mapping) else None
    if isinstance(listed, Mapping) and "const" in listed and len(listed) == 1:
        listed = {"enum": [listed["const"]]}
    open_values = not isinstance(listed, Mapping) or set(listed) != {"enum"}
    if open_values and len(conditionals) == 1:
        # values beyond the listed ones: a single `if` takes the complement of its test
        negated = _discriminator_negation(conditionals[0][0])
        if negated is None:
            return node
        condition, then, otherwise = conditionals[0]
        branches = [{"allOf": [condition, then]}, {"allOf": [negated, otherwise]}]
        return {**rest, "allOf": [*kept, {"anyOf": branches}]}
    tested = []  # open values: those the `if`s list, in order, then "none of them" below
    if open_values:
        for condition, _, _ in conditionals:
            schema = condition["properties"][name]
            values = [schema["const"]] if "const" in schema else schema["enum"]
            keys = {canonical(v) for v in tested}
            tested += [v for v in values if canonical(v) not in keys]
        if not tested:
            return node
        listed = {"enum": tested}

    @typing.no_type_check
    def branch(base: dict, selected) -> dict:
        parts = []
        for i, (_, then, otherwise) in enumerate(conditionals):
            part = then if i in selected else otherwise
            if part is not True and part != {}:
                parts.append(part)
        return {**base, "allOf": parts} if parts else base

    groups: dict = {}  # the conditionals whose `if` holds -> the values for which they do
    for value in listed["enum"]:
        key = canonical(value)
        groups.setdefault(tuple(i for i, f in enumerate(found) if key in f[1]), []).append(value)
    branches = [
        branch({"type": "object", "required": [name], "properties": {name: {"enum": v}}}, s)
        for s, v in groups.items()
    ]
    if open_values:  # the property with a value no `if` lists: every `else`
        other = {"not": {"enum": tested}}
        branches.append(
            branch({"type": "object", "required": [name], "properties": {name: other}}, set())
        )
    # the property absent: an `if` without `required` holds; not an object: one without
    # `"type": "object"` holds
    absent = {i for i, f in enumerate(found) if not f[2]}
    branches.append(branch({"type": "object", "properties": {name: False}}, absent))
    vacuous = {i for i, f in enumerate(found) if not f[3]}
    branches.append(branch({"type": sorted(JSON_TYPES - {"object", "integer"})}, vacuous))
    if len(branches) > budgets.MAX_CONDITIONAL_BRANCHES:
        return node
    return {**rest, "allOf": [*kept, {"anyOf": branches}]}
