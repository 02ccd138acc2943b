"""Listed values: `enum` and `const` as regexes (`enumeration`), the listed values a whole schema
accepts (`listed_values`), and a JSON value's type and canonical spelling.
"""

import json
import math
import typing
from collections.abc import Mapping

from .errors import (
    UnsupportedSchemaError,
)
from .keys import (
    literal_key,
)
from .keywords import (
    NOT_STRINGS,
    asserts,
)
from .scalars import (
    number_regex,
)

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter


def listed_values(schema):
    """A schema that lists its values (`enum` or `const` at the top, or in a branch of a
    top-level `allOf`) beside other keywords: `{"enum": [the listed values the whole schema
    accepts]}`, each value judged by `jsonschema` (the schema's own draft, formats asserted as
    this module asserts them), so that every keyword is exact on a finite set of values, those
    a regex cannot enforce (`not`, `if`, `contains`, `uniqueItems`, ...) included. The MaskBench
    `Synthesized` split is made of such schemas (`allOf` of a one-value `enum` and a test of the
    JSON Schema test suite). Any other schema, or one whose values `jsonschema` cannot judge
    (an external `$ref`), is returned unchanged."""
    if not isinstance(schema, Mapping):
        return schema
    lists = []
    for branch in (
        [schema, *schema.get("allOf", [])] if isinstance(schema.get("allOf"), list) else [schema]
    ):
        if isinstance(branch, Mapping):
            if "const" in branch:
                lists.append([branch["const"]])
            elif isinstance(branch.get("enum"), list):
                lists.append(branch["enum"])
    if not lists or {k for k in schema if asserts(k)} <= {"enum", "const"}:
        return schema  # nothing listed, or nothing beside the list
    # deferred on purpose: jsonschema loads only to check a schema
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        kept = [value for value in min(lists, key=len) if validator.is_valid(value)]
    except Exception:  # e.g. referencing's `Unresolvable` (an external `$ref`): the rewriter
        return schema  # then refuses or compiles the schema as it would without a list
    return {"enum": kept}


def json_type(value) -> str:
    """The JSON type of a Python value (`"integer"` for an integral float, as JSON Schema counts it)."""
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


def canonical(value) -> str:
    """A key equal for equal JSON values (`1` and `1.0` alike, `true` apart from `1`)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = float(value)
        return repr(int(value)) if value.is_integer() else repr(value)
    return json.dumps(value, sort_keys=True)


def _fixed_order(value) -> bool:
    """Whether `value` is or holds an object of two or more members (`constant_regex` reads
    them in the value's order only)."""
    if isinstance(value, Mapping):
        return len(value) > 1 or any(_fixed_order(v) for v in value.values())
    return isinstance(value, list) and any(_fixed_order(v) for v in value)


def _own_constant(value) -> bool:
    """Whether a constant's JSON text is written by `constant_regex` rather than by
    outlines-core: it is or holds an object (outlines-core leaves keys unescaped) or a number
    (outlines-core writes one spelling: `1.0` rejects `1`, `1e-07` is written `1e-7`)."""
    if isinstance(value, Mapping):
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    return isinstance(value, list) and any(_own_constant(v) for v in value)


def enumeration(rewriter: "Rewriter", node: dict, path: str):
    """`enum`/`const` (beside `type` and other keywords): the listed values the node accepts,
    as `enum`/`const` or a marker of their regexes. `NEVER` (`admits_none`) when none is left."""
    values = [node["const"]] if "const" in node else node["enum"]
    if not isinstance(values, list):
        raise UnsupportedSchemaError("enum", path, "must be a list")
    if "enum" in node and "const" in node:
        listed = {canonical(v) for v in node["enum"]}
        values = [v for v in values if canonical(v) in listed]
    types = node.get("type")
    if types is not None:
        allowed = set([types] if isinstance(types, str) else types)
        if "number" in allowed:
            allowed.add("integer")
        values = [v for v in values if json_type(v) in allowed]
    excluded = node.get(NOT_STRINGS, ())
    values = [v for v in values if not (isinstance(v, str) and v in excluded)]
    if {k for k in node if asserts(k)} - {"enum", "const", "type", NOT_STRINGS}:
        values = values_valid_under(rewriter, node, values, path)
    if not values:  # an empty enum, or no value of the type / in both: nothing matches
        if node.get("enum") == [] and "const" not in node:
            return rewriter.admits_none("enum", path, "enum is empty")
        keyword = "const" if "const" in node else "enum"
        return rewriter.admits_none(
            keyword,
            path,
            f"no value listed by `{keyword}` is valid under the node's other keywords",
        )
    if any(_own_constant(v) for v in values):
        # outlines-core writes object keys of constants unescaped (`"$a.b"`: `$` an anchor,
        # `.` any character) and numbers in one spelling, so those constants are written here
        marker = rewriter.marker(
            "|".join(f"(?:{constant_regex(rewriter, v, path)})" for v in values)
        )
        if any(_fixed_order(v) for v in values):
            rewriter.inexact[marker["const"]] = (
                f"its listed objects at {path} are read in the order of their keys"
            )
        return marker
    return {"enum": values} if len(values) > 1 else {"const": values[0]}


def values_valid_under(rewriter: "Rewriter", node: dict, values: list, path: str) -> list:
    """The listed `values` that the other keywords beside `enum`/`const` accept (`minLength`,
    `pattern`, `minimum`, `not`, ...), each judged by `jsonschema` with the root's draft
    and format checker: a list needs no automaton of those keywords. `values` unchanged,
    with `refuse("enum")`, when `jsonschema` cannot judge them."""
    # deferred on purpose: jsonschema loads only to check a schema
    import jsonschema

    cls = jsonschema.validators.validator_for(
        rewriter.root, default=jsonschema.Draft202012Validator
    )
    schema = {k: v for k, v in node.items() if k != NOT_STRINGS}
    try:
        check = cls(schema, format_checker=cls.FORMAT_CHECKER)
        return [v for v in values if check.is_valid(v)]
    except Exception as e:  # e.g. an unresolvable `$ref` inside
        rewriter.refuse("enum", path, f"the listed values cannot be judged by jsonschema: {e}")
        return values


def constant_regex(rewriter: "Rewriter", value, path: str = "") -> str:
    """The regex of the JSON text of one constant value, `self.ws` between its tokens; keys
    in the value's order, numbers by `number_regex`, other scalars as outlines-core
    writes them."""
    ws = rewriter.ws
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return number_regex(value, path)
    if isinstance(value, Mapping):
        members = [
            f"{literal_key(k)}{ws}:{ws}{constant_regex(rewriter, v, path)}"
            for k, v in value.items()
        ]
        return rf"\{{{ws}" + f"{ws},{ws}".join(members) + (rf"{ws}\}}" if members else r"\}")
    if isinstance(value, list):
        items = [constant_regex(rewriter, v, path) for v in value]
        return rf"\[{ws}" + f"{ws},{ws}".join(items) + (rf"{ws}\]" if items else r"\]")
    return rewriter.regex_of({"const": value})
