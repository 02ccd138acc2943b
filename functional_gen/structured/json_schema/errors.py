"""The errors of compiling a JSON Schema: the public `UnsupportedSchemaError` and
`InvalidSchemaError`, and the refusals that the compiler catches to try its next form
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


class InvalidSchemaError(ConstraintError):
    """A schema that is not valid under its own dialect's metaschema (`jsonschema`'s
    `check_schema`), e.g. `{"type": "strnig"}` or `{"minLength": -1}`.

    **Attributes:** `path`: where, as a JSON pointer; `reason`: the metaschema's message.
    """

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"not a valid JSON Schema at {path}: {reason}")


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
