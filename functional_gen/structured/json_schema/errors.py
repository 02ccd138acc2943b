"""The errors of compiling a JSON Schema: the public `UnsupportedSchemaError`,
`UnsatisfiableSchemaError`, `InvalidSchemaError` and `SchemaTooLargeError`, and the refusals that the compiler catches to try its next form
(`RegexTooLarge`, `TooManyPositions`, ...).
"""

import json

from ..automaton import ConstraintError


class UnsupportedSchemaError(ConstraintError):
    """A JSON Schema keyword (or value) that cannot be enforced by a regular constraint.

    **Attributes:** `keyword`: the keyword; `path`: where it is, as a JSON pointer.
    """

    def __init__(self, keyword: str, path: str, reason: str):
        self.keyword, self.path, self.reason = keyword, path, reason
        super().__init__(f"JSON Schema keyword `{keyword}` at {path} is not supported: {reason}")


class UnsatisfiableSchemaError(UnsupportedSchemaError):
    """A schema that no JSON value satisfies, named by the subschema that excludes every value
    and its keyword(s): `#/properties/a: enum is empty`, `#/$defs/x: minimum 3 > maximum 1` (a
    subschema reached through a `$ref` is named where it is written, not where it is used).

    A subclass of `UnsupportedSchemaError` (which it was before it named the place), so that
    code catching that still catches it.

    **Attributes:** `keyword`: the keyword; `path`: the subschema, as a JSON pointer;
    `reason`: why it admits no value; `others`: further `(path, keyword, reason)` of the same
    schema that admit no value either (e.g. every branch of an `anyOf`).
    """

    def __init__(self, keyword: str, path: str, reason: str, others: tuple = ()):
        self.keyword, self.path, self.reason, self.others = keyword, path, reason, tuple(others)
        more = "".join(f"; {p}: {r}" for p, _, r in self.others)
        ConstraintError.__init__(
            self, f"{path}: {reason}{more} (no JSON value satisfies the schema)"
        )


class InvalidSchemaError(ConstraintError):
    """A schema that is not valid under its own dialect's metaschema (`jsonschema`'s
    `check_schema`), e.g. `{"type": "strnig"}` or `{"minLength": -1}`; `jsonschema`'s
    `SchemaError` is its `__cause__`.

    **Attributes:** `path`: where in the schema, as a JSON pointer (`SchemaError.json_path`'s
    place); `schema_path`: where in the metaschema, as a JSON pointer (the metaschema keyword
    that failed, `SchemaError.schema_path`); `reason`: the metaschema's message.
    """

    def __init__(self, path: str, reason: str, schema_path: str = ""):
        self.path, self.reason, self.schema_path = path, reason, schema_path
        where = f" (metaschema: {schema_path})" if schema_path else ""
        super().__init__(f"not a valid JSON Schema at {path}: {reason}{where}")


class SchemaTooLargeError(ConstraintError):
    """A schema whose JSON text is over `budgets.MAX_SCHEMA_BYTES`, refused before it is parsed
    (a string) or checked against its metaschema.

    **Attributes:** `size`: its size in bytes (a JSON string's UTF-8 bytes; for a dict, the
    bytes of its compact JSON text counted until they passed the limit: a lower bound);
    `limit`: the limit in bytes.
    """

    def __init__(self, size: int, limit: int, exact: bool = True):
        self.size, self.limit = size, limit
        amount = f"{size:,} bytes" if exact else f"at least {size:,} bytes (counting stopped there)"
        super().__init__(
            f"the JSON Schema's JSON text is {amount}, over the limit of {limit:,} bytes "
            "(budgets.MAX_SCHEMA_BYTES): checking and compiling it would take minutes"
        )


class NotTokenAutomaton(ConstraintError):
    """The fallback's deeper attempt would need the grammar form (its regex is too large)."""


class KeysTooComplex(ValueError):
    """The keys no pattern matches need a regex over `MAX_KEY_REGEX` characters."""


class RegexTooLarge(ConstraintError):
    """A schema's single regex would exceed a size limit (`MAX_REGEX`, or `GRAMMAR_REGEX`
    where the grammar form is tried): `JsonSchema` then compiles the grammar form."""

    def __init__(self, size: int, limit: int):
        self.size, self.limit = size, limit
        super().__init__(
            f"the schema's regex would have {size:,} characters (the limit is {limit:,}): "
            "too large to compile into an automaton in reasonable time"
        )


class TooManyPositions(ConstraintError):
    """A grammar form would have more automaton positions than its limit
    (`MAX_GRAMMAR_POSITIONS`, times `OVER_REGEX_SCALE` in place of a single regex)."""

    def __init__(self, positions: int, rules: int, limit: int, what: str | None = None):
        what = what or (
            f"the schema's grammar form has {positions:,} automaton positions in {rules} rules"
        )
        super().__init__(
            f"{what} (the limit is {limit:,}): its token tables would take too long to build"
        )


class RecursionRefused(ConstraintError):
    """Internal: the grammar form cannot keep this schema's recursion as rules
    (`json_schema_compile` then unrolls it)."""


class NoCommonType(UnsupportedSchemaError):
    """`allOf` of schemas whose types share no value (`_Rewriter.merge`): no value satisfies
    it (`NEVER`: an `anyOf` branch or an optional property that cannot be)."""


class TooLarge(Exception):
    """An object regex over `MAX_OBJECT_REGEX` characters (caught by `_Rewriter._object`)."""


def describe(schema) -> str:
    """`schema` (a dict, JSON text or a type) in at most 80 characters, for messages and cache keys."""
    if isinstance(schema, type):
        return schema.__name__
    text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
