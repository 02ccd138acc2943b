"""The vocabulary of JSON Schema as the compiler reads it: the keywords it enforces (`KNOWN`),
those it refuses (`UNSUPPORTED`), the keywords of each JSON type (`TYPE_KEYWORDS`) and where
subschemas sit (`SCHEMA_MAPS`, `SCHEMA_LISTS`, `SCHEMA_VALUES`).
"""

UNSUPPORTED = {
    "not": "negation is not regular in general",
    "if": "conditional schemas are supported only as discriminated unions (every `if` tests "
    "one property whose own schema lists its values) or where the `if` has a complement",
    "then": "conditional schemas are not supported here (see `if`)",
    "else": "conditional schemas are not supported here (see `if`)",
    "dependentSchemas": "property dependencies are not supported",
    "dependencies": "property dependencies are not supported",  # (lists become dependentRequired)
    "unevaluatedProperties": "unevaluated* keywords are not supported",
    "unevaluatedItems": "unevaluated* keywords are not supported",
    "maxContains": "an upper bound on the items that match `contains` is not supported",
    "$dynamicRef": "dynamic references are not supported",
    "$recursiveRef": "dynamic references are not supported",
}
"""Keywords JSON Schema defines as assertions that no regular constraint here enforces: refused
with `strict=True`, dropped (with one warning) with `strict=False`."""


KNOWN = {
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minProperties",
    "maxProperties",
    "additionalItems",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "multipleOf",
    "contains",
    "minContains",
}
"""Keywords that are enforced. Every other keyword that is not in `UNSUPPORTED` is an
annotation (JSON Schema 2020-12 core §4.3.1: unknown keywords are ignored) and is dropped."""


NOT_STRINGS = "\x03notStrings"
"""Internal keyword (a control character no schema key holds): the strings a `not` of listed
strings excludes (`_excluded_strings`), enforced on the node's string values (`_string`)."""


AT_LEAST_ONE = "\x03atLeastOne"
"""Internal keyword: the names of which an object has at least one (an `anyOf` of single
`required` names with `property_order="any"`, `structural`), enforced by its members' regex
(`rewrite_object`, `unordered_members`)."""


def asserts(keyword) -> bool:
    """Whether `keyword` asserts anything (enforced, or refused as unenforceable): every other
    keyword (`title`, `default`, `x-taplo`, draft 4's `id`, ...) is an annotation, ignored when
    schemas are combined (`allOf`, a `$ref` with siblings) as when they are checked."""
    return keyword in KNOWN or keyword in UNSUPPORTED


TYPE_KEYWORDS = {
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "string": {"minLength", "maxLength", "pattern", "format", NOT_STRINGS},
    "array": {
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
    },
    "object": {
        "properties",
        "required",
        "additionalProperties",
        "minProperties",
        "maxProperties",
        "patternProperties",
        "propertyNames",
        AT_LEAST_ONE,
    },
    "boolean": set(),
    "null": set(),
}


JSON_TYPES = set(TYPE_KEYWORDS)


SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")


SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


SCHEMA_VALUES = (
    "additionalProperties",
    "additionalItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)
