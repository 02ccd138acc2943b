"""Rewriting `type: object`: `properties`, `required`, `patternProperties`,
`additionalProperties`, `propertyNames`, `min`/`maxProperties` (`rewrite_object`), and
`dependentRequired` as an `anyOf` (`dependent_required`).
"""

import json
import re
import typing
from collections.abc import Mapping

from ..patterns import (
    json_string_pattern,
)
from . import budgets
from .errors import (
    KeysTooComplex,
    TooLarge,
    UnsupportedSchemaError,
)
from .keys import (
    key_not_in,
    literal_key,
    name_checker,
    overlap,
    unmatched_keys,
)
from .keywords import AT_LEAST_ONE
from .order_automata import any_order_text
from .property_order import object_regex, second_order, unordered
from .references import (
    NEVER,
)

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter


def dependent_required(rewriter: "Rewriter", node: dict, path: str) -> dict:
    """`dependentRequired` as an `anyOf` of objects: for each dependency `name: [needed]`,
    either `name` is absent (its schema `false`) or it and `needed` are required. Regular:
    at most `MAX_DEPENDENCIES` dependencies (2^k branches)."""
    dependencies = node.pop("dependentRequired")
    if not isinstance(dependencies, Mapping) or not all(
        isinstance(v, list) and all(isinstance(n, str) for n in v) for v in dependencies.values()
    ):
        raise UnsupportedSchemaError(
            "dependentRequired",
            path,
            f"must map property names to lists of names, got {dependencies!r}",
        )
    dependencies = {k: v for k, v in dependencies.items() if v}
    if len(dependencies) > budgets.MAX_DEPENDENCIES:
        rewriter.refuse(
            "dependentRequired",
            path,
            f"{len(dependencies)} dependencies (at most "
            f"{budgets.MAX_DEPENDENCIES}: each doubles the alternatives)",
        )
        return node
    branches = [node]
    for name, needed in dependencies.items():
        expanded = []
        for branch in branches:
            required = list(branch.get("required", []))
            if name not in required:  # `name` absent
                expanded.append(
                    {**branch, "properties": {**branch.get("properties", {}), name: False}}
                )
            expanded.append({**branch, "required": list(dict.fromkeys([*required, name, *needed]))})
        branches = expanded
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def rewrite_object(rewriter: "Rewriter", node: dict, path: str):
    """An object as a marker of our own regex: the listed properties in schema order (the
    optional ones may be left out), then any additional properties: keys matching a
    `patternProperties` pattern with its schema's value, or (when `additionalProperties`
    is not `false` and there is no `patternProperties`) any other key with the
    `additionalProperties` schema (any value by default), bounded by min/maxProperties."""
    properties = node.get("properties", {})
    required = list(dict.fromkeys(node.get("required", [])))
    additional = node.get("additionalProperties", True)
    patterns = node.get("patternProperties", {})
    names_schema = node.get("propertyNames")
    min_count = node.get("minProperties", 0)
    max_count = node.get("maxProperties")
    named = dict(properties)
    closed = additional is False or additional is NEVER or rewriter.closed_objects
    # at least one of these names (`AT_LEAST_ONE`), unless one of them is required anyway
    at_least_one = [] if set(required) & set(node.get(AT_LEAST_ONE, ())) else node.get(AT_LEAST_ONE)
    for name in [*required, *(at_least_one or ())]:
        # required (or one of `at_least_one`) without a listed schema: what an additional
        # property may be
        if name not in named:
            if any(re.search(p, name) for p in patterns):
                named[name] = {}  # the pattern's schema is merged below
            else:
                named[name] = (
                    False if closed else additional if isinstance(additional, Mapping) else {}
                )
    if names_schema is not None:
        names_schema = rewriter.node(names_schema, f"{path}/propertyNames")
        check = name_checker(names_schema, rewriter.substitute)
        if check is None:
            rewriter.refuse(
                "propertyNames",
                f"{path}/propertyNames",
                "the listed property names cannot be checked against it",
            )
            check = lambda name: True  # noqa: E731 (dropped: every listed name kept)
        for name in list(named):
            if not check(name):
                if name in required:
                    return rewriter.admits_none(
                        "propertyNames",
                        path,
                        f"required property {name!r} is not a name `propertyNames` allows",
                    )
                del named[name]
    # a listed property whose name a pattern matches must satisfy both schemas
    for pattern, schema in patterns.items():
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise UnsupportedSchemaError(
                "patternProperties", path, f"pattern {pattern!r} is not a valid regex: {e}"
            ) from None
        for name in named:
            if compiled.search(name):
                named[name] = {"allOf": [named[name], schema]}
    items, item_names = [], []
    for name, schema in named.items():
        r = rewriter.node(schema, f"{path}/properties/{name}")
        if r is NEVER:
            if name in required and schema is False:
                return rewriter.admits_none(
                    "required", path, f"required property {name!r} is not allowed"
                )
            if name in required:
                return NEVER
            continue
        key = literal_key(name)
        items.append((f"{key}{rewriter.ws}:{rewriter.ws}{rewriter.regex_of(r)}", name in required))
        item_names.append(name)
    extras = []
    if patterns:
        bodies = []  # every pattern's key body: the keys left to additionalProperties
        for pattern, schema in patterns.items():
            r = rewriter.node(schema, f"{path}/patternProperties/{pattern}")
            try:
                body = json_string_pattern(pattern)
            except ValueError as e:
                rewriter.refuse("patternProperties", path, str(e))
                bodies = None  # keys of unknown extent: no complement
                continue
            if bodies is not None:
                bodies.append(body)
            if r is NEVER:
                continue
            key = '"' + body + '"'
            if any(re.fullmatch(key, literal_key(n)) for n in named):
                # the pattern's keys but the listed ones (printable ASCII keys only)
                try:
                    body = unmatched_keys((), tuple(named), within=body)
                except KeysTooComplex as e:
                    rewriter.refuse(
                        "patternProperties",
                        path,
                        f"pattern {pattern!r} also matches a listed property, and its other "
                        f"keys are too complex to write ({e})",
                    )
                    continue
                if body is None:  # only listed names match it
                    continue
                key = f'"{body}"'
            extras.append((key, r, schema))
        if len({json.dumps(s, sort_keys=True, default=str) for _, _, s in extras}) > 1 and overlap(
            [k for k, _, _ in extras]
        ):
            rewriter.refuse(
                "patternProperties",
                path,
                "keys may match several patterns with different schemas",
            )
        extras = [f"{k}{rewriter.ws}:{rewriter.ws}{rewriter.regex_of(r)}" for k, r, _ in extras]
        other = NEVER
        if not closed:
            other = (
                rewriter.any_value()
                if additional is True
                else rewriter.node(additional, f"{path}/additionalProperties")
            )
        if other is not NEVER and names_schema is not None:
            rewriter.refuse(
                "propertyNames",
                path,
                "together with `patternProperties` and open additional properties; "
                "only the listed properties and the pattern keys are generated",
            )
        elif other is not NEVER and bodies is not None:
            try:
                body = unmatched_keys(tuple(bodies), tuple(named))
            except KeysTooComplex as e:
                rewriter.refuse(
                    "additionalProperties",
                    path,
                    "the keys that no `patternProperties` pattern matches are too complex "
                    f"to write ({e}); only the listed properties and the pattern keys are "
                    "generated",
                )
                body = None
            if body is not None:
                extras.append(f'"{body}"{rewriter.ws}:{rewriter.ws}{rewriter.regex_of(other)}')
    elif not closed:
        other = (
            rewriter.any_value()
            if additional is True
            else rewriter.node(additional, f"{path}/additionalProperties")
        )
        if other is not NEVER:
            if names_schema is not None:
                key = rewriter.regex_of(names_schema)
                if named:
                    rewriter.refuse(
                        "propertyNames",
                        path,
                        "together with listed properties and open additional "
                        "properties; only the listed properties are generated",
                    )
                    key = None
            else:
                key = '"' + key_not_in(list(named)) + '"'
            if key is not None:
                extras.append(f"{key}{rewriter.ws}:{rewriter.ws}{rewriter.regex_of(other)}")
    for k, v in (("minProperties", min_count), ("maxProperties", max_count)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise UnsupportedSchemaError(k, path, f"must be a non-negative integer, got {v!r}")
    if max_count is not None and min_count > max_count:
        return rewriter.admits_none(
            "maxProperties", path, f"minProperties {min_count} > maxProperties {max_count}"
        )
    if max_count is not None and len(required) > max_count:
        return rewriter.admits_none(
            "maxProperties",
            path,
            f"{len(required)} required properties > maxProperties {max_count}",
        )
    group = None
    if at_least_one:  # those that may be present at all
        group = [item_names.index(n) for n in at_least_one if n in item_names]
        if not group:
            return rewriter.admits_none(
                "anyOf", path, f"none of the names {at_least_one} (one is required) is allowed"
            )
    fixed: list[str] = []
    try:
        regex, exact = object_regex(
            items,
            "|".join(extras) if extras else None,
            rewriter.ws,
            min_count,
            max_count,
            second_order=second_order(rewriter, items, item_names, required),
            unordered=unordered(rewriter, items, extras),
            at_least_one=group,
            fixed=fixed,
        )
    except TooLarge as e:
        raise UnsupportedSchemaError(
            "properties",
            path,
            f"{len(items)} properties ({sum(not r for _, r in items)} optional) make a "
            f"regex of over {e.args[0]:,} characters, too large to compile in reasonable time; make more "
            "of them required or bound fewer of them with minProperties/maxProperties",
        ) from None
    if (
        fixed
        and rewriter.order_by_automata
        and regex is not None
        and group is None
        and min_count == 0
        and max_count is None
        and rewriter.property_order == "any"
    ):
        # the grammar form's attempt: the object's automaton built from its members, every
        # order (`order_automata`; refused there when too large, then this attempt is)
        marker = rewriter.marker(any_order_text(items, "|".join(extras) or None, rewriter.ws))
        rewriter.order_automata.add(marker["const"])
        found = re.compile(f'"(FGSUB[0-9]+X{rewriter.tag})"')
        for text in [r for r, _ in items] + extras:
            rewriter.order_values.update(found.findall(text))
        rewriter.inexact[marker["const"]] = f"its objects at {path} are read by an automaton"
        return marker
    if fixed:
        rewriter.order_fixed.append(path)
    if regex is None:
        return NEVER
    marker = rewriter.marker(regex)
    if not exact:
        rewriter.inexact[marker["const"]] = f"its objects at {path} are read " + (
            "with additional members, whose keys may repeat"
            if extras
            else "in one order of their members, or with a key written twice"
        )
    return marker
