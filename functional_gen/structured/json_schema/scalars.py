"""JSON scalars as regexes: the string, integer and number syntaxes (`STRING`, `INTEGER`,
`NUMBER`), a number written as JSON serialisers write it (`number_regex`), and a string other
than the listed ones (`excluded_strings`, `other_strings_regex`, with each string's JSON
spellings, `json_spellings`).
"""

import decimal
import math
import typing
from collections.abc import Mapping

from ..formats import ANY_STRING
from ..regex_syntax import escape
from .budgets import MAX_PLAIN_DIGITS
from .errors import InvalidSchemaError
from .keywords import asserts


def excluded_strings(schema) -> list[str] | None:
    """The values of a `not` whose schema lists strings only (`const` or `enum`, beside
    `"type": "string"` at most): a value is then valid exactly when it is not one of them (every
    non-string value is), or `None` for any other `not`."""
    if not isinstance(schema, Mapping) or not {k for k in schema if asserts(k)} <= {
        "const",
        "enum",
        "type",
    }:
        return None
    if "const" in schema and "enum" in schema:
        return None
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    kind = schema.get("type", "string")
    if not isinstance(values, list) or kind not in ("string", ["string"]):
        return None
    if not values or not all(isinstance(v, str) for v in values):
        return None
    return sorted(set(values))


def json_spellings(value: str) -> str:
    """A regex of the JSON texts whose value is the string `value`: each character written
    as itself (where JSON allows it raw), as its short escape, or as a `\\u` escape in either
    case (a pair of them beyond the BMP)."""

    @typing.no_type_check
    def u_escape(unit: int) -> str:
        digits = "".join(d if d.isdigit() else f"[{d}{d.upper()}]" for d in f"{unit:04x}")
        return escape("\\u") + digits

    parts = []
    for c in value:
        code = ord(c)
        alternatives = [] if c in '"\\' or code < 0x20 else [escape(c)]
        if c in SHORT_ESCAPES:
            alternatives.append(escape("\\" + SHORT_ESCAPES[c]))
        if code <= 0xFFFF:
            alternatives.append(u_escape(code))
        else:
            high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
            alternatives.append(u_escape(high) + u_escape(low))
        parts.append("(?:" + "|".join(alternatives) + ")")
    return '"' + "".join(parts) + '"'


SHORT_ESCAPES = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "\b": "b",
    "\f": "f",
    "\n": "n",
    "\r": "r",
    "\t": "t",
}
"""The characters JSON writes with a two-character escape, and the escape's letter."""


def other_strings_regex(excluded: list[str]) -> str:
    """A regex of the JSON strings (`ANY_STRING`'s spellings, quotes included) whose value is
    none of `excluded`: over the trie of the excluded values, at each node the text may end
    (unless a value ends there), go on with a character no value continues with and then
    anything, or follow a child. Linear in the values' length (a regex, so a plain string
    beside it in an `anyOf` stays a regex)."""

    @typing.no_type_check
    def raw(c: str) -> bool:  # written as itself in ANY_STRING
        code = ord(c)
        return c not in '"\\' and code >= 0x20 and not 0x7F <= code <= 0x9F

    @typing.no_type_check
    def spellings(c: str) -> list[str]:
        out = [escape(c)] if raw(c) else []
        if c in SHORT_ESCAPES:
            out.append(escape("\\" + SHORT_ESCAPES[c]))
        return out

    @typing.no_type_check
    def other_unit(chars) -> str:  # one character not in `chars`
        excluded_raw = "".join(escape(c) for c in sorted(chars) if raw(c))
        letters = "".join(escape(letter) for c, letter in SHORT_ESCAPES.items() if c not in chars)
        parts = [f'[^"\\\\\\x00-\\x1F\\x7F-\\x9F{excluded_raw}]']
        if letters:
            parts.append(f"\\\\[{letters}]")
        return "(?:" + "|".join(parts) + ")"

    trie: dict = {}
    for value in excluded:
        node = trie
        for c in value:
            node = node.setdefault(c, {})
        node[None] = True  # a value ends here

    @typing.no_type_check
    def rest(node) -> str:
        children = [c for c in node if c is not None]
        alternatives = [other_unit(children) + ANY_STRING]
        for c in children:
            spelled = spellings(c)
            if spelled:
                alternatives.append("(?:" + "|".join(spelled) + ")" + rest(node[c]))
        body = "(?:" + "|".join(alternatives) + ")"
        return body if None in node else body + "?"

    return '"' + rest(trie) + '"'


STRING = r'"(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*"'


INTEGER = r"-?(?:0|[1-9][0-9]*)"


NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"


def number_regex(value: int | float, path: str = "") -> str:
    """The regex of the JSON texts of numbers equal to `value` as serialisers write them: the
    shortest round-trip form (`json.dumps`, `repr`), the same without an exponent where that
    is short (`1e-07` -> `0.0000001`), an exponent with or without its leading zero and `+`
    (`1e-07` and JavaScript's `1e-7`; `1e+20`, `1e20`) in `e` or `E`, and for an integral value
    the integer and the integer with `.0` (`1` and `1.0` are one number in JSON Schema).
    Equality is numeric, as JSON Schema's `const`/`enum` require; other spellings of the same
    number (`1.00`, `10e-1`) are not accepted, so generation never loops on zeros.

    **Raises:** `InvalidSchemaError` for a value that is not finite (not a JSON number)."""

    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidSchemaError(path, f"the constant {value!r} is not a JSON number")
    exact = decimal.Decimal(repr(value) if isinstance(value, float) else value)
    negative = exact < 0 or (exact == 0 and math.copysign(1.0, float(value)) < 0)
    magnitude = abs(exact)
    sign = "-?" if magnitude == 0 else "-" if negative else ""
    spellings = []
    if magnitude == magnitude.to_integral_value():
        digits = str(int(magnitude))
        if len(digits) <= MAX_PLAIN_DIGITS or not isinstance(value, float):
            spellings.append(digits + r"(?:\.0)?")
    else:
        plain = format(magnitude, "f")
        if len(plain) <= MAX_PLAIN_DIGITS:
            spellings.append(escape(plain))
    short = repr(float(magnitude)) if isinstance(value, float) else ""
    if "e" in short:
        mantissa, exponent = short.split("e")
        power = int(exponent)
        mark = r"\+?" if power >= 0 else "-"
        pad = "0?" if abs(power) < 10 else ""
        spellings.append(f"{escape(mantissa)}[eE]{mark}{pad}{abs(power)}")
    return sign + (spellings[0] if len(spellings) == 1 else f"(?:{'|'.join(spellings)})")
