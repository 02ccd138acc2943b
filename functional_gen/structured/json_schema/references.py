"""References inside a JSON Schema: `$id` and `$ref` resolved with `referencing` against the
root (`ROOT_URI`), and `inline_references`, which replaces every reference by its target
(recursive ones unrolled, or kept as placeholders for the grammar form). `NEVER` is the
schema that matches nothing.
"""

import contextlib
import typing
from collections.abc import Mapping

from .budgets import MAX_INLINED_NODES
from .errors import UnsupportedSchemaError
from .keywords import SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_VALUES, asserts


class Never:
    """The schema that no value satisfies (`false`), e.g. a recursion cut at its depth bound."""

    def __repr__(self):
        return "NEVER"


NEVER = Never()


ROOT_URI = "urn:functional-gen:root"


def root_resolver(root):
    """A `referencing` resolver for `root`, in the dialect its `$schema` names (default 2020-12),
    with every embedded resource (`$id`, draft-4 `id`) and `$anchor` registered."""
    # deferred on purpose: referencing loads only for schemas with `$ref`
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012, specification_with

    dialect = root.get("$schema") if isinstance(root, Mapping) else None
    specification = (
        specification_with(dialect, default=DRAFT202012)
        if isinstance(dialect, str)
        else DRAFT202012
    )
    resource = specification.create_resource(root)
    base = resource.id() or ROOT_URI
    registry = Registry().with_resource(base, resource)
    if base != ROOT_URI:
        registry = registry.with_resource(ROOT_URI, resource)
    # `referencing` reads a subschema's id in the dialect of its own `$schema`: a draft-4
    # subschema holding a boolean schema (`"items": true`, draft 6+) makes that a TypeError
    # (JsonSchemaStore config.json). Uncrawled, references by JSON pointer and to the root
    # still resolve; one to an embedded `$id` then fails with `UnsupportedSchemaError`.
    with contextlib.suppress(TypeError, AttributeError):
        registry = registry.crawl()
    return registry.resolver(base_uri=base), specification


def id_of(specification, node) -> str | None:
    """The base URI `node` declares (`$id`, draft 4's `id`), or `None`: also where that keyword
    is no string, as when a subschema lists properties without `properties` (MaskBench o28532:
    `"items": {"id": {"type": "string"}, ...}`), which `referencing` would fail on."""
    key = "id" if specification.name.endswith(("draft-04", "draft-03")) else "$id"
    if not isinstance(node.get(key, ""), str):
        return None
    return specification.id_of(node)


RECURSIVE = "$fgRecursive"
"""The key of `inline_references(recursive=True)`'s placeholder for a recursive reference: its
value is the index of the reference's target in the returned expansions."""


def inline_references(
    root, max_recursion_depth: int, *, recursive: bool = False, origins: dict | None = None
):
    """`root` with every `$ref` replaced by (a copy of) its target, resolved by the
    `referencing` library as `jsonschema` resolves it (`$id` / draft-4 `id` base URIs,
    `$anchor`, JSON pointers, percent-encoding). A reference met again inside its own expansion
    is expanded at most `max_recursion_depth` times on one path; beyond, it becomes `NEVER` (the
    value is then left out where the schema allows it: an optional property, an empty array,
    another `anyOf` branch).

    outlines-core unrolls recursion itself but cuts it by dropping the property, which leaves a
    dangling comma (`{"value": 1, }`); we cut it where JSON stays valid instead.

    With `recursive=True` nothing is unrolled or cut (`max_recursion_depth` is not used): a
    reference met again inside its own expansion (the root counts as the expansion of `#`)
    becomes the placeholder `{"$fgRecursive": k}`, and the subtree built where target `k` was
    expanded (any of them: none is cut, so they all mean the target) is `expansions[k]`. The
    grammar form makes each such target a rule and each placeholder a call of it
    (`Rewriter.recursive_call`), so recursion nests as deep as the pushdown stack.

    With `origins` (a dict), each inlined target is recorded there as `id(subtree) ->
    (subtree, location)`: the JSON pointer of the target in `root` where the reference is
    written (`#/$defs/x`), so that an error found in it names the subschema itself, not the
    place that references it (the reference as written where the target is not in `root`).

    **Returns:** the inlined schema; with `recursive=True`, `(schema, expansions)`,
    `expansions` a list of the recursive targets' subtrees (empty when nothing recurses).

    **Raises:** `UnsupportedSchemaError` for remote (not embedded) or unresolvable references,
    and when the expansion exceeds `MAX_INLINED_NODES` schema nodes.
    """
    # deferred on purpose: referencing loads only for schemas with `$ref`
    from referencing.exceptions import Unresolvable

    resolver, specification = root_resolver(root)
    pointers: dict[int, str] = {}  # id of a node of `root` -> its JSON pointer (on first use)

    @typing.no_type_check
    def index(node, pointer: str) -> None:
        if isinstance(node, Mapping):
            pointers.setdefault(id(node), pointer)
            for key, value in node.items():
                index(value, f"{pointer}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                index(value, f"{pointer}/{i}")

    @typing.no_type_check
    def location(contents, ref: str) -> str:
        if not pointers:
            index(root, "#")
        return pointers.get(id(contents), ref)

    count = [0]
    targets: dict[int, int] = {}  # id of a recursive target's contents -> its index
    expansions: dict[int, object] = {}

    @typing.no_type_check
    def walk(node, path: str, stack: tuple, resolver):
        if not isinstance(node, Mapping):
            return node
        count[0] += 1
        if count[0] > MAX_INLINED_NODES:
            raise UnsupportedSchemaError(
                "$ref",
                path,
                f"the references expand to more than {MAX_INLINED_NODES:,} schema nodes "
                f"(max_recursion_depth={max_recursion_depth}); lower max_recursion_depth",
            )
        node = dict(node)
        if node is not root and id_of(specification, node):
            resolver = resolver.in_subresource(specification.create_resource(node))
        if "$ref" in node:
            # siblings' properties first where they come before the `$ref` in the text
            # (llguidance's order, `applicator_first`), else the target's
            siblings_first = bool(node.get("properties")) and not applicator_first(node, "$ref")
            ref = node.pop("$ref")
            if not isinstance(ref, str):
                raise UnsupportedSchemaError("$ref", path, f"must be a string, got {ref!r}")
            try:
                resolved = resolver.lookup(ref)
            except Unresolvable as e:
                raise UnsupportedSchemaError(
                    "$ref",
                    path,
                    f"the reference {ref!r} does not resolve within the schema "
                    f"(remote references are not fetched): {type(e).__name__}",
                ) from None
            key = id(resolved.contents)
            if recursive and key in stack:
                target = {RECURSIVE: targets.setdefault(key, len(targets))}
            elif stack.count(key) >= max_recursion_depth:
                return NEVER
            else:
                target = walk(resolved.contents, f"{path}/$ref", stack + (key,), resolved.resolver)
                if origins is not None and isinstance(target, Mapping):
                    origins[id(target)] = (target, location(resolved.contents, ref))
                if key in targets:
                    expansions.setdefault(targets[key], target)
            siblings = {k: v for k, v in node.items() if asserts(k)}
            if not siblings:
                return target
            parts = [target, walk(siblings, path, stack, resolver)]
            return {"allOf": parts[::-1] if siblings_first else parts}
        for key in SCHEMA_MAPS:
            if (
                key in node
                and isinstance(node[key], Mapping)
                and key not in ("$defs", "definitions")
            ):
                node[key] = {
                    k: walk(v, f"{path}/{key}/{k}", stack, resolver) for k, v in node[key].items()
                }
        node.pop("$defs", None)
        node.pop("definitions", None)
        for key in SCHEMA_LISTS:
            if key in node and isinstance(node[key], list):
                node[key] = [
                    walk(v, f"{path}/{key}/{i}", stack, resolver) for i, v in enumerate(node[key])
                ]
        if "items" in node:
            items = node["items"]
            node["items"] = (
                [walk(v, f"{path}/items/{i}", stack, resolver) for i, v in enumerate(items)]
                if isinstance(items, list)
                else walk(items, f"{path}/items", stack, resolver)
            )
        for key in SCHEMA_VALUES:
            if key in node:
                node[key] = walk(node[key], f"{path}/{key}", stack, resolver)
        return node

    if not recursive:
        return walk(root, "#", (), resolver)
    schema = walk(root, "#", (id(root),), resolver)
    if id(root) in targets:
        expansions.setdefault(targets[id(root)], schema)
    return schema, [expansions[k] for k in range(len(targets))]


def applicator_first(node: Mapping, keyword: str) -> bool:
    """Whether the in-place applicator `keyword` (`allOf`, `anyOf`, `oneOf`, `$ref`) comes
    before the node's own `properties` (and its `additionalProperties`) in the schema's text,
    so that its members are listed before the node's own, as llguidance 1.9 orders them: it
    reads a schema's keywords in their order, each applicator intersected with what the
    keywords before it gave, and an object intersection keeps the left side's properties first;
    an `additionalProperties` read before the applicator brings the names of `properties` with
    it (llguidance's "dummy" properties), so they come first then too. `False` without both
    `keyword` and a non-empty `properties`."""
    if keyword not in node or not isinstance(node.get("properties"), Mapping):
        return False
    if not node["properties"]:
        return False
    keys = list(node)
    members = [keys.index(k) for k in ("properties", "additionalProperties") if k in node]
    return keys.index(keyword) < min(members)
