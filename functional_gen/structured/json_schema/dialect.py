"""The dialect of a JSON Schema and its validity: `check_schema` (the metaschema of the schema's
own `$schema`, memoised), `in_dialect` (older drafts read as 2020-12), `schema_as_dict`
(a dict, JSON text or pydantic model class as a dict) and `check_schema_size` (the size limit,
checked by `schema_as_dict` before anything else reads the schema).
"""

import collections
import copy
import json
import typing
from collections.abc import Mapping

from . import budgets
from .budgets import MAX_CHECKED
from .errors import InvalidSchemaError, SchemaTooLargeError
from .keywords import SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_VALUES, asserts


def check_schema(schema) -> None:
    """Check `schema` against the metaschema of its dialect (`$schema`, default 2020-12) with
    `jsonschema.validators.validator_for(schema).check_schema`.

    A schema that passed is remembered by its JSON text (`CHECKED`): one compile checks it
    once per attempt of a form (MaskBench kb_1161: 1.2 s a check).

    **Raises:** `InvalidSchemaError` naming the place in the schema (`path`) and in the
    metaschema (`schema_path`) and the metaschema's complaint, `jsonschema`'s `SchemaError` as
    its `__cause__`.
    """
    # deferred on purpose: jsonschema loads only to check a schema
    import jsonschema

    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        text = None  # not JSON (e.g. a non-string key): `check_schema` says what
    if text is not None and text in CHECKED:
        CHECKED.move_to_end(text)
        return
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        raise InvalidSchemaError(
            _pointer(e.absolute_path), e.message[:300], _pointer(e.absolute_schema_path)
        ) from e
    except jsonschema.exceptions.UnknownType as e:  # pragma: no cover - defensive
        raise InvalidSchemaError("#", str(e)) from e
    if text is not None:
        CHECKED[text] = None
        while len(CHECKED) > MAX_CHECKED:
            CHECKED.popitem(last=False)


CHECKED: collections.OrderedDict[str, None] = collections.OrderedDict()
"""JSON texts of the schemas `check_schema` passed, least recently used first."""


def _pointer(parts) -> str:
    """A JSON pointer (RFC 6901, `~` and `/` escaped) from a path's parts, `#` first."""
    return "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def check_schema_size(schema) -> None:
    """Refuse a schema whose JSON text is over `budgets.MAX_SCHEMA_BYTES` bytes, cheaply: a
    string by its UTF-8 length, before it is parsed; a dict (or list) by its compact JSON text,
    encoded piece by piece and counted only until the count passes the limit, so a 10 MB schema
    is refused after encoding about 1 MB of it (0.03 s), not serialised in full.

    **Raises:** `SchemaTooLargeError` naming the size and the limit. A value that is not JSON is
    left to the checks that follow (`check_schema` names it).
    """
    limit = budgets.MAX_SCHEMA_BYTES
    if isinstance(schema, (str, bytes)):
        size = len(schema.encode()) if isinstance(schema, str) else len(schema)
        if size > limit:
            raise SchemaTooLargeError(size, limit)
        return
    if not isinstance(schema, (Mapping, list)):
        return
    encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
    size = 0
    try:
        for piece in encoder.iterencode(schema):
            size += len(piece) if piece.isascii() else len(piece.encode())
            if size > limit:
                break
    except (TypeError, ValueError, RecursionError):
        return  # not JSON: `check_schema` says what
    if size > limit:
        raise SchemaTooLargeError(size, limit, exact=False)


def in_dialect(schema):
    """`schema` with the keywords its dialect does not assert removed, as `jsonschema` reads
    it (the dialect its `$schema` names, default 2020-12): a keyword that is no validator of
    that dialect is an annotation there, e.g. `const`, `contains` and `propertyNames` under
    draft 4, `if`/`then`/`else` before draft 7, `dependentRequired` before 2019-09, `prefixItems`
    before 2020-12, `dependencies` from 2019-09 and `additionalItems` in 2020-12 (draft 3/4's
    `exclusiveMinimum`/`exclusiveMaximum` stay: they modify `minimum`/`maximum`). Before
    2019-09, the keywords beside a `$ref` are ignored too ("All other properties in a "$ref"
    object MUST be ignored", draft 7 core §8.3): only annotations and `definitions` stay there.

    Subschemas are visited where a keyword of any dialect holds them (`properties`, `items`,
    `allOf`, `definitions`, ...); a subschema only a `$ref` into another member reaches keeps
    its keywords (stricter, never looser). `schema` is modified in place and returned.
    """
    # deferred on purpose: jsonschema loads only to check a schema
    import jsonschema

    if not isinstance(schema, Mapping):
        return schema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    if cls is jsonschema.Draft3Validator:
        return schema  # another language (`required` per property, `extends`, ...): as is
    # the keywords `jsonschema` reads inside another one's validator: `minimum`'s (draft 4),
    # `if`'s and `contains`'s
    known = set(cls.VALIDATORS) | {"exclusiveMinimum", "exclusiveMaximum"}
    if "if" in known:
        known |= {"then", "else"}
    if "contains" in known and cls not in (jsonschema.Draft6Validator, jsonschema.Draft7Validator):
        known |= {"minContains", "maxContains"}
    legacy = cls in (
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
    )

    @typing.no_type_check
    def visit(node) -> None:
        if not isinstance(node, dict):
            return
        for key in [k for k in node if asserts(k)]:
            if key not in known or (legacy and "$ref" in node and key != "$ref"):
                del node[key]
        for key in (*SCHEMA_MAPS, "dependencies"):
            if isinstance(node.get(key), dict):
                for value in node[key].values():
                    visit(value)
        for key in (*SCHEMA_VALUES, "items"):
            visit(node.get(key))
        for key in (*SCHEMA_LISTS, "items"):
            if isinstance(node.get(key), list):
                for value in node[key]:
                    visit(value)

    visit(schema)
    return schema


def schema_as_dict(schema) -> dict:
    """A JSON Schema as a dict, from a dict, a JSON string, or a pydantic model class
    (`model_json_schema()`).

    **Raises:** `SchemaTooLargeError` for a schema over `budgets.MAX_SCHEMA_BYTES` bytes of
    JSON text (`check_schema_size`, before a string is parsed); `ValueError` for a string that
    is not JSON; `TypeError` for anything else.
    """
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
        check_schema_size(schema)
        return schema
    check_schema_size(schema)
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
