"""`JsonSchema`: generated text that is a JSON document valid under a JSON Schema.

The schema becomes a regex with outlines-core's `build_regex_from_schema` (objects, properties
in schema order, `required`, arrays with `minItems`/`maxItems`, `enum`, `const`, `anyOf`,
strings with `minLength`/`maxLength`). Where that regex would let invalid documents through, two
passes over the schema first rewrite it:

| keyword | outlines-core alone | here |
|---|---|---|
| integer/number `minimum`, `maximum`, `exclusive*` | ignored | exact range regex (`ranges`) |
| string `format` date/time/date-time/email/uuid/ipv4 | loose (`2023-02-31`, `\\d`) | strict regex (`formats`) |
| string `pattern` | copied between quotes: `.` can write a raw `"` | JSON-escaped translation (`patterns`) |
| `type: [..]` with per-type keywords | keywords of the other types lost | split into `anyOf` |
| `allOf` | regexes concatenated: invalid JSON | merged into one schema |
| `oneOf` | treated as `anyOf` | allowed when the branches are disjoint |
| `required` without a `properties` entry | ignored | error |
| recursive `$ref` at the depth bound | property dropped, dangling `,` | inlined here; the bottom value left out |

A rewritten node is replaced by a `const` marker string; after outlines-core has built the
regex, each marker's regex is substituted by ours. Keywords that no regex can enforce raise
`UnsupportedSchemaError` naming the keyword and where it is, before anything is compiled:
`not`, `if`/`then`/`else`, `dependentRequired`, `dependentSchemas`, `patternProperties`,
`propertyNames`, `contains`, `multipleOf`, `uniqueItems: true` (for more than one item),
`unevaluated*`, `minProperties`/`maxProperties` that the listed properties cannot guarantee,
`pattern` together with a length, non-integer numeric bounds, unknown formats, and remote
`$ref`s.

Whitespace between tokens follows outlines-core's default (`[ ]?`: none or one space) unless a
`whitespace_pattern` is given.
"""

import copy
import json
import math
import uuid
from collections.abc import Mapping, Sequence

from .automaton import ConstraintError, regex_automaton
from .formats import FORMATS
from .patterns import json_string_pattern
from .processor import AbstractConstraint, rows_of
from .ranges import integer_range_regex, number_range_regex
from .vocabulary import vocabulary_from_tokenizer

DEFAULT_MAX_RECURSION_DEPTH = 3
"""How many times a recursive `$ref` is unrolled (outlines-core's default)."""

_ANNOTATIONS = {
    "title", "description", "default", "examples", "$comment", "$schema", "$id", "$anchor",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "discriminator",
    "$defs", "definitions", "format_hint", "nullable_hint",
}
_UNSUPPORTED = {
    "not": "negation is not regular in general",
    "if": "conditional schemas are not supported",
    "then": "conditional schemas are not supported",
    "else": "conditional schemas are not supported",
    "dependentRequired": "property dependencies are not supported",
    "dependentSchemas": "property dependencies are not supported",
    "dependencies": "property dependencies are not supported",
    "patternProperties": "properties selected by pattern are not supported",
    "propertyNames": "constraints on property names are not supported",
    "unevaluatedProperties": "unevaluated* keywords are not supported",
    "unevaluatedItems": "unevaluated* keywords are not supported",
    "contains": "array `contains` is not supported",
    "minContains": "array `contains` is not supported",
    "maxContains": "array `contains` is not supported",
    "multipleOf": "`multipleOf` is not supported",
    "$dynamicRef": "dynamic references are not supported",
    "$recursiveRef": "dynamic references are not supported",
}
_KNOWN = {
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
    "additionalProperties", "items", "prefixItems", "minItems", "maxItems", "uniqueItems",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minProperties", "maxProperties", "additionalItems",
}
_TYPE_KEYWORDS = {
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"},
    "object": {"properties", "required", "additionalProperties", "minProperties", "maxProperties"},
    "boolean": set(),
    "null": set(),
}
_JSON_TYPES = set(_TYPE_KEYWORDS)


class UnsupportedSchemaError(ConstraintError):
    """A JSON Schema keyword (or value) that cannot be enforced by a regular constraint.

    **Attributes:** `keyword`: the keyword; `path`: where it is, as a JSON pointer.
    """

    def __init__(self, keyword: str, path: str, reason: str):
        self.keyword, self.path, self.reason = keyword, path, reason
        super().__init__(f"JSON Schema keyword `{keyword}` at {path} is not supported: {reason}")


def schema_as_dict(schema) -> dict:
    """A JSON Schema as a dict, from a dict, a JSON string, or a pydantic model class
    (`model_json_schema()`).

    **Raises:** `ValueError` for a string that is not JSON; `TypeError` for anything else.
    """
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"the JSON Schema string is not valid JSON: {e}") from None
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, Mapping):
        raise TypeError(
            f"a JSON Schema must be a dict, a JSON string or a pydantic model class, got {type(schema).__name__}"
        )
    return copy.deepcopy(dict(schema))


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value == math.floor(value) and math.isfinite(value) else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class _Never:
    """The schema that no value satisfies (`false`), e.g. a recursion cut at its depth bound."""

    def __repr__(self):
        return "NEVER"


NEVER = _Never()

_SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("additionalProperties", "additionalItems", "not", "if", "then", "else", "contains", "propertyNames",
                  "unevaluatedProperties", "unevaluatedItems")


def _resolve(root, ref: str, path: str):
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise UnsupportedSchemaError("$ref", path, f"only local references (#/...) are supported, got {ref!r}")
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise UnsupportedSchemaError("$ref", path, f"the reference {ref!r} does not resolve")
    return node


def inline_references(root, max_recursion_depth: int):
    """`root` with every local `$ref` replaced by (a copy of) its target. A reference met again
    inside its own expansion is expanded at most `max_recursion_depth` times on one path; beyond,
    it becomes `NEVER` (the value is then left out where the schema allows it: an optional
    property, an empty array, another `anyOf` branch).

    outlines-core unrolls recursion itself but cuts it by dropping the property, which leaves a
    dangling comma (`{"value": 1, }`); we cut it where JSON stays valid instead.

    **Raises:** `UnsupportedSchemaError` for remote or unresolvable references.
    """

    def walk(node, path: str, stack: tuple):
        if not isinstance(node, Mapping):
            return node
        node = dict(node)
        if "$ref" in node:
            ref = node.pop("$ref")
            if stack.count(ref) >= max_recursion_depth:
                return NEVER
            target = walk(_resolve(root, ref, path), f"{path}/$ref", stack + (ref,))
            siblings = {k: v for k, v in node.items() if k not in _ANNOTATIONS}
            if not siblings:
                return target
            node = {"allOf": [target, walk(siblings, path, stack)]}
            return node
        for key in _SCHEMA_MAPS:
            if key in node and isinstance(node[key], Mapping) and key not in ("$defs", "definitions"):
                node[key] = {k: walk(v, f"{path}/{key}/{k}", stack) for k, v in node[key].items()}
        node.pop("$defs", None)
        node.pop("definitions", None)
        for key in _SCHEMA_LISTS:
            if key in node and isinstance(node[key], list):
                node[key] = [walk(v, f"{path}/{key}/{i}", stack) for i, v in enumerate(node[key])]
        if "items" in node:
            items = node["items"]
            node["items"] = (
                [walk(v, f"{path}/items/{i}", stack) for i, v in enumerate(items)]
                if isinstance(items, list) else walk(items, f"{path}/items", stack)
            )
        for key in _SCHEMA_VALUES:
            if key in node:
                node[key] = walk(node[key], f"{path}/{key}", stack)
        return node

    return walk(root, "#", ())


class _Rewriter:
    """One pass over a schema: checks keywords, rewrites nodes outlines-core gets wrong."""

    def __init__(self, root: dict):
        self.root = root
        self.substitutions: dict[str, str] = {}
        self.tag = uuid.uuid4().hex[:12]

    def marker(self, regex: str) -> dict:
        name = f"FGSUB{len(self.substitutions)}X{self.tag}"
        self.substitutions[name] = regex
        return {"const": name}

    # ------------------------------------------------------------------ nodes

    def node(self, node, path: str):
        """The rewritten schema, or `NEVER` when no value can satisfy it."""
        if node is True or node == {}:
            return {}
        if node is False or node is NEVER:
            return NEVER
        if not isinstance(node, Mapping):
            raise UnsupportedSchemaError(str(node), path, f"a schema must be an object or a boolean, got {node!r}")
        node = dict(node)
        for key in node:
            if key in _UNSUPPORTED:
                raise UnsupportedSchemaError(key, path, _UNSUPPORTED[key])
            if key not in _KNOWN and key not in _ANNOTATIONS and not key.startswith("x-"):
                raise UnsupportedSchemaError(key, path, "unknown keyword")
        for key in [k for k in node if k in _ANNOTATIONS]:
            del node[key]
        return self.structural(node, path)

    def structural(self, node: dict, path: str):
        if "allOf" in node:
            branches = node.pop("allOf")
            merged = node
            for i, branch in enumerate(branches):
                if branch is NEVER or branch is False:
                    return NEVER
                merged = self.merge(merged, branch, f"{path}/allOf/{i}")
            return self.node(merged, path)
        if "anyOf" in node and "oneOf" in node:
            raise UnsupportedSchemaError("oneOf", path, "`oneOf` next to `anyOf` in one schema is not supported")
        for combinator in ("anyOf", "oneOf"):
            if combinator in node:
                branches = node.pop(combinator)
                if not isinstance(branches, list) or not branches:
                    raise UnsupportedSchemaError(combinator, path, "must be a non-empty list of schemas")
                combined = []
                for i, branch in enumerate(branches):
                    where = f"{path}/{combinator}/{i}"
                    if branch is NEVER or branch is False:
                        continue
                    rewritten = self.node(self.merge(node, branch, where) if node else branch, where)
                    if rewritten is not NEVER:
                        combined.append(rewritten)
                if not combined:
                    return NEVER
                if combinator == "oneOf":
                    self.check_disjoint(combined, path)
                return combined[0] if len(combined) == 1 else {"anyOf": combined}
        if "const" in node or "enum" in node:
            return self.enumeration(node, path)
        types = node.get("type")
        if types is None:
            types = self.infer_types(node)
        if isinstance(types, list):
            if not types:
                raise UnsupportedSchemaError("type", path, "an empty list of types allows no value")
            if len(types) == 1:
                return self.typed(types[0], node, path)
            branches = [b for i, t in enumerate(types) if (b := self.typed(t, node, f"{path}/type/{i}")) is not NEVER]
            return NEVER if not branches else branches[0] if len(branches) == 1 else {"anyOf": branches}
        return self.typed(types, node, path)

    def infer_types(self, node: dict):
        present = [t for t, keys in _TYPE_KEYWORDS.items() if keys & node.keys() and t != "number"]
        if not present:
            return None
        return present if len(present) > 1 else present[0]

    def typed(self, kind, node: dict, path: str):
        if kind is None:  # no type information: any JSON value (outlines-core's generic value)
            return {}
        if kind not in _JSON_TYPES:
            raise UnsupportedSchemaError("type", path, f"unknown type {kind!r}")
        keys = {k: v for k, v in node.items() if k in _TYPE_KEYWORDS[kind]}
        return getattr(self, "_" + kind)(keys, path)

    def _integer(self, node: dict, path: str):
        lo, hi = self.bounds(node, path, integer=True)
        if lo is None and hi is None:
            return {"type": "integer"}
        try:
            return self.marker(integer_range_regex(lo, hi))
        except ValueError as e:
            raise UnsupportedSchemaError("minimum", path, str(e)) from None

    def _number(self, node: dict, path: str):
        if not node:
            return {"type": "number"}
        lo, lo_excl, hi, hi_excl = self.number_bounds(node, path)
        try:
            return self.marker(number_range_regex(lo, hi, lo_exclusive=lo_excl, hi_exclusive=hi_excl))
        except ValueError as e:
            keyword = "minimum" if "lower" in str(e) or hi is None else "maximum"
            raise UnsupportedSchemaError(keyword, path, str(e)) from None

    def bounds(self, node: dict, path: str, integer: bool):
        lo, lo_excl, hi, hi_excl = self.number_bounds(node, path)
        if lo is not None:
            lo = math.floor(lo) + 1 if lo_excl else math.ceil(lo)
        if hi is not None:
            hi = math.ceil(hi) - 1 if hi_excl else math.floor(hi)
        if lo is not None and hi is not None and hi < lo:
            raise UnsupportedSchemaError("maximum", path, f"no integer lies between the bounds of {node}")
        return lo, hi

    def number_bounds(self, node: dict, path: str):
        def number(key):
            value = node.get(key)
            if value is None or isinstance(value, bool):
                return value
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise UnsupportedSchemaError(key, path, f"must be a finite number, got {value!r}")
            return value

        lo, hi = number("minimum"), number("maximum")
        lo_excl = hi_excl = False
        emin, emax = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
        if isinstance(emin, bool):  # draft 4: a flag on `minimum`
            lo_excl = emin and lo is not None
        elif emin is not None:
            emin = number("exclusiveMinimum")
            if lo is None or emin >= lo:
                lo, lo_excl = emin, True
        if isinstance(emax, bool):
            hi_excl = emax and hi is not None
        elif emax is not None:
            emax = number("exclusiveMaximum")
            if hi is None or emax <= hi:
                hi, hi_excl = emax, True
        return lo, lo_excl, hi, hi_excl

    def _string(self, node: dict, path: str):
        fmt, pattern = node.get("format"), node.get("pattern")
        lengths = {k: node[k] for k in ("minLength", "maxLength") if k in node}
        for k, v in lengths.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UnsupportedSchemaError(k, path, f"must be a non-negative integer, got {v!r}")
        if "minLength" in lengths and "maxLength" in lengths and lengths["maxLength"] < lengths["minLength"]:
            raise UnsupportedSchemaError("maxLength", path, f"maxLength {lengths['maxLength']} < minLength {lengths['minLength']}")
        if fmt is not None and pattern is not None:
            raise UnsupportedSchemaError("pattern", path, "`pattern` together with `format` is not supported")
        if fmt is not None:
            if fmt not in FORMATS:
                raise UnsupportedSchemaError(
                    "format", path, f"format {fmt!r} is not supported; supported: {sorted(FORMATS)}"
                )
            if lengths:
                raise UnsupportedSchemaError(next(iter(lengths)), path, "a length together with `format` is not supported")
            return self.marker('"' + FORMATS[fmt] + '"')
        if pattern is not None:
            if lengths:
                raise UnsupportedSchemaError(
                    next(iter(lengths)), path, "`pattern` together with minLength/maxLength is not supported"
                )
            try:
                return self.marker('"' + json_string_pattern(pattern) + '"')
            except ValueError as e:
                raise UnsupportedSchemaError("pattern", path, str(e)) from None
        return {"type": "string", **lengths}

    def _array(self, node: dict, path: str):
        out = {"type": "array"}
        for k in ("minItems", "maxItems"):
            if k in node:
                v = node[k]
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise UnsupportedSchemaError(k, path, f"must be a non-negative integer, got {v!r}")
                out[k] = v
        if node.get("uniqueItems") and out.get("maxItems", 2) > 1:
            raise UnsupportedSchemaError(
                "uniqueItems", path, "unique items cannot be enforced by a regular constraint (set maxItems: 1 or drop it)"
            )
        items = node.get("items")
        prefix = node.get("prefixItems")
        if isinstance(items, list):  # draft 4-2019 tuple form
            prefix, items = items, node.get("additionalItems")
        if prefix is not None:
            rewritten = []
            for i, schema in enumerate(prefix):
                r = self.node(schema, f"{path}/prefixItems/{i}")
                if r is NEVER:  # the array stops before this position
                    out["maxItems"] = min(out.get("maxItems", i), i)
                    items = False
                    break
                rewritten.append(r)
            if rewritten:
                out["prefixItems"] = rewritten
        if items is not None:
            r = self.node(items, f"{path}/items")
            if r is NEVER:  # no item beyond the prefix
                out["maxItems"] = min(out.get("maxItems", len(out.get("prefixItems", []))), len(out.get("prefixItems", [])))
                if "prefixItems" in out:
                    out["items"] = False
            else:
                out["items"] = r
        if out.get("minItems", 0) > out.get("maxItems", out.get("minItems", 0)):
            return NEVER
        if out.get("maxItems") == 0:
            out.pop("items", None)
            out.pop("prefixItems", None)
        return out

    def _object(self, node: dict, path: str):
        properties = node.get("properties", {})
        if not isinstance(properties, Mapping):
            raise UnsupportedSchemaError("properties", path, f"must be an object, got {properties!r}")
        required = node.get("required", [])
        additional = node.get("additionalProperties", True)
        for name in required:
            if name not in properties:
                raise UnsupportedSchemaError(
                    "required", path, f"required property {name!r} has no schema under `properties`"
                )
        out = {"type": "object"}
        rewritten = {}
        for name, schema in properties.items():
            r = self.node(schema, f"{path}/properties/{name}")
            if r is NEVER:
                if name in required:
                    return NEVER
                continue
            rewritten[name] = r
        properties = rewritten
        if properties:
            out["properties"] = properties
        if required:
            out["required"] = list(required)
        if isinstance(additional, Mapping) and properties:
            raise UnsupportedSchemaError(
                "additionalProperties", path, "a schema for additional properties next to `properties` is not supported"
            )
        if isinstance(additional, Mapping):
            r = self.node(additional, f"{path}/additionalProperties")
            out["additionalProperties"] = False if r is NEVER else r
        elif additional is False or additional is NEVER:
            out["additionalProperties"] = False
        if "minProperties" in node and node["minProperties"] > len(required):
            raise UnsupportedSchemaError(
                "minProperties", path, f"only {len(required)} properties are required, fewer than minProperties {node['minProperties']}"
            )
        if "maxProperties" in node and (not properties or node["maxProperties"] < len(properties)):
            raise UnsupportedSchemaError(
                "maxProperties", path, "cannot bound the number of properties beyond the listed ones"
            )
        return out

    def _boolean(self, node: dict, path: str):
        return {"type": "boolean"}

    def _null(self, node: dict, path: str):
        return {"type": "null"}

    def enumeration(self, node: dict, path: str):
        values = [node["const"]] if "const" in node else node["enum"]
        if not isinstance(values, list) or not values:
            raise UnsupportedSchemaError("enum", path, "must be a non-empty list")
        types = node.get("type")
        if types is not None:
            allowed = set([types] if isinstance(types, str) else types)
            if "number" in allowed:
                allowed.add("integer")
            values = [v for v in values if _json_type(v) in allowed]
            if not values:
                raise UnsupportedSchemaError("enum", path, f"no value of the enum has type {types!r}")
        if "enum" in node and "const" in node and node["const"] not in node["enum"]:
            raise UnsupportedSchemaError("const", path, "the const value is not in the enum")
        return {"enum": values} if len(values) > 1 else {"const": values[0]}

    # ------------------------------------------------------------------ combinators

    def deref(self, node, path: str):
        """`node` itself: references are inlined before the rewrite (`inline_references`)."""
        return node

    def merge(self, a, b, path: str) -> dict:
        """The schema of `a` AND `b` (for `allOf` and sibling keywords)."""
        if b is True or b == {}:
            return dict(a)
        if not isinstance(b, Mapping):
            raise UnsupportedSchemaError("allOf", path, f"cannot combine with {b!r}")
        out = dict(a)
        for key, value in b.items():
            if key in _ANNOTATIONS:
                out.setdefault(key, value)
            elif key not in out:
                out[key] = value
            elif key == "properties":
                props = dict(out[key])
                for name, schema in value.items():
                    if name in props and props[name] != schema:
                        props[name] = {"allOf": [props[name], schema]}
                    else:
                        props[name] = schema
                out[key] = props
            elif key == "required":
                out[key] = list(dict.fromkeys([*out[key], *value]))
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
                    raise UnsupportedSchemaError("allOf", path, f"types {out[key]!r} and {value!r} have no value in common")
                out[key] = both[0] if len(both) == 1 else both
            elif key == "allOf":
                out[key] = [*out[key], *value]
            elif out[key] != value:
                raise UnsupportedSchemaError(
                    key, path, f"cannot combine two different `{key}` ({out[key]!r} and {value!r}) in allOf"
                )
        return out

    def check_disjoint(self, branches: list, path: str) -> None:
        """`oneOf` needs exactly one branch to match: accept it when no two branches can match
        the same value (different JSON types, different constants, or objects whose required
        discriminator property has different constants)."""
        signatures = [self.signature(b, path) for b in branches]
        for i in range(len(branches)):
            for j in range(i + 1, len(branches)):
                if not self.disjoint(signatures[i], signatures[j]):
                    raise UnsupportedSchemaError(
                        "oneOf", path,
                        f"branches {i} and {j} may both match one value, so `oneOf` cannot be enforced; "
                        "use `anyOf` or make them disjoint (different types or a const discriminator)",
                    )

    def signature(self, node, path: str, depth: int = 0):
        node = self.deref(node, path)
        if not isinstance(node, Mapping) or depth > 8:
            return None
        if "anyOf" in node:
            parts = [self.signature(b, path, depth + 1) for b in node["anyOf"]]
            return None if any(p is None for p in parts) else ("union", parts)
        if "const" in node or "enum" in node:
            values = [node["const"]] if "const" in node else node["enum"]
            return ("values", [json.dumps(v, sort_keys=True) for v in values], {_json_type(v) for v in values})
        t = node.get("type")
        if t is None:
            return None
        types = set([t] if isinstance(t, str) else t)
        if "number" in types:
            types.add("integer")
        discriminators = {}
        if types == {"object"}:
            for name in node.get("required", []):
                prop = self.deref(node.get("properties", {}).get(name, {}), path)
                if isinstance(prop, Mapping) and ("const" in prop or "enum" in prop):
                    values = [prop["const"]] if "const" in prop else prop["enum"]
                    discriminators[name] = {json.dumps(v, sort_keys=True) for v in values}
        return ("types", types, discriminators)

    def disjoint(self, a, b) -> bool:
        if a is None or b is None:
            return False
        if a[0] == "union":
            return all(self.disjoint(p, b) for p in a[1])
        if b[0] == "union":
            return all(self.disjoint(a, p) for p in b[1])
        if a[0] == "values" and b[0] == "values":
            return not set(a[1]) & set(b[1])
        if a[0] == "values" or b[0] == "values":
            values, typed = (a, b) if a[0] == "values" else (b, a)
            return not values[2] & typed[1]
        if not a[1] & b[1]:
            return True
        if a[1] == b[1] == {"object"}:
            return any(name in b[2] and not a[2][name] & b[2][name] for name in a[2])
        return False


def json_schema_regex(
    schema,
    *,
    whitespace_pattern: str | None = None,
    max_recursion_depth: int = DEFAULT_MAX_RECURSION_DEPTH,
) -> str:
    """The regex of the JSON documents valid under `schema` (see the module docstring).

    **Arguments:** `schema`: a dict, a JSON string or a pydantic model class;
    `whitespace_pattern`: regex for the whitespace allowed between tokens (default `[ ]?`);
    `max_recursion_depth`: how many times a recursive `$ref` is unrolled.

    **Raises:** `UnsupportedSchemaError` naming the keyword and its location for what a regular
    constraint cannot enforce; `ValueError` / `TypeError` for a schema that is not a schema.

    Source: outlines-core's `build_regex_from_schema` plus the rewrites above.
    """
    from outlines_core.json_schema import build_regex_from_schema

    if isinstance(max_recursion_depth, bool) or not isinstance(max_recursion_depth, int) or max_recursion_depth < 1:
        raise ValueError(f"`max_recursion_depth` must be an integer >= 1, got {max_recursion_depth!r}")
    root = inline_references(schema_as_dict(schema), max_recursion_depth)
    rewriter = _Rewriter(root)
    normalized = rewriter.node(root, "#")
    if normalized is NEVER:
        raise UnsupportedSchemaError(
            "$ref", "#", f"no finite document satisfies the schema within max_recursion_depth={max_recursion_depth}"
        )
    try:
        regex = build_regex_from_schema(json.dumps(normalized), whitespace_pattern, max_recursion_depth)
    except (ValueError, RuntimeError) as e:
        raise ConstraintError(f"outlines-core cannot convert the JSON Schema: {str(e).splitlines()[0]}") from None
    for name, sub in rewriter.substitutions.items():
        marker = build_regex_from_schema(json.dumps({"const": name}))
        regex = regex.replace(marker, "(?:" + sub + ")")
        if name in regex:
            raise RuntimeError(f"internal error: marker {name} survived in the regex")
    return regex


def json_schema_automaton(schema, vocabulary, *, cache: bool = True, **options):
    """The `TokenAutomaton` of the JSON documents valid under `schema`, for `vocabulary`.

    **Arguments:** `schema`: a dict, JSON text or a pydantic model class; `vocabulary`: from
    `vocabulary_from_tokenizer`; `cache`: use the memory and disk caches; `options`: those of
    `json_schema_regex`.

    **Raises:** as `json_schema_regex`, and `ConstraintError` when the vocabulary cannot write
    any valid document.
    """
    regex = json_schema_regex(schema, **options)
    return regex_automaton(regex, vocabulary, cache=cache, description=f"json schema {_describe(schema)}")


class JsonSchema(AbstractConstraint):
    """Constrain the generated text to be a JSON document valid under a JSON Schema.

    The schema is checked and turned into a regex (`json_schema_regex`: outlines-core's
    conversion plus exact integer/number ranges, strict formats, JSON-safe string patterns,
    merged `allOf`), then compiled like `Regex`. Properties come in the order of the schema;
    optional properties may be left out; whitespace between tokens is none or one space by
    default. Recursive `$ref`s are unrolled `max_recursion_depth` times: deeper nesting is not
    offered, so the output stays valid.

    Every row ends inside the language: the device mask only offers tokens after which the
    document can still be closed within the row's remaining `max_new_tokens` (when the
    schema's shortest document fits the budget at all; otherwise the row ends with finish
    reason `"constraint"`).

    !!! Example
        ```python
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                  "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                  "required": ["name", "age"]}
        person = fg.processors.JsonSchema(schema, tokenizer)
        ```

    **Arguments:**

    - `schema`: a dict, a JSON string or a pydantic model class; or a list with one per row
      (`None`: unconstrained row).
    - `tokenizer`, `eos_token_id`, `vocab_size`: as in `Regex`.
    - `whitespace_pattern`: regex of the whitespace allowed between JSON tokens (default
      `[ ]?`). Pass `""` for compact JSON.
    - `max_recursion_depth`: unrolling depth of recursive references (default 3).

    **Raises:** `UnsupportedSchemaError` (a `ValueError`) naming the keyword and its location
    (e.g. `not`, `uniqueItems`, `multipleOf`, an unknown `format`) before any compilation;
    `ValueError` for invalid JSON text; `TypeError` for a schema of another type.

    Source: outlines-core `json_schema.build_regex_from_schema`; JSON Schema 2020-12.
    """

    def __init__(
        self,
        schema,
        tokenizer,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        vocab_size: int | None = None,
        whitespace_pattern: str | None = None,
        max_recursion_depth: int = DEFAULT_MAX_RECURSION_DEPTH,
    ):
        def is_single(s):
            return isinstance(s, (Mapping, str, bool)) or (isinstance(s, type) and hasattr(s, "model_json_schema"))

        schemas, ids = rows_of(schema, is_single, "schema", "a JSON Schema (a dict, JSON text or a pydantic model class)")
        regexes = [
            json_schema_regex(s, whitespace_pattern=whitespace_pattern, max_recursion_depth=max_recursion_depth)
            for s in schemas
        ]
        vocabulary = vocabulary_from_tokenizer(tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size)
        automata = [
            regex_automaton(r, vocabulary, description=f"json schema {_describe(s)}") for s, r in zip(schemas, regexes)
        ]
        self._set_automata(automata, ids)


def _describe(schema) -> str:
    if isinstance(schema, type):
        return schema.__name__
    text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
