"""Regexes for JSON Schema's string `format`s, strict enough that every match is valid.

outlines-core's own format regexes let through impossible dates (`2023-02-31`), Unicode digits
(`\\d`), times without a UTC offset and, for `email`, control characters that JSON must escape.
These regexes match only values that the reference checkers accept: `date` and `date-time` with
the right number of days per month (leap years included) and a year from 0001, `time` with an
offset as RFC 3339's `full-time` requires, lower- or upper-case UUIDs with the dashes where
`uuid.UUID` and `jsonschema` expect them, IPv4 addresses without leading zeros.

Each value is the body of the JSON string, without the quotes; all of them are plain ASCII that
JSON needs no escape for.

Sources: RFC 3986 (URI), RFC 6570 (URI template), RFC 4291 §2.2 (IPv6 text forms), RFC 1123 (hostnames), ISO 8601 /
JSON Schema 2020-12 Appendix A (duration), RFC 3339 §5.6 (`full-date`, `full-time`, `date-time`), RFC 4122 (UUID), the
`jsonschema` package's `FormatChecker`, Python's `datetime.date.fromisoformat`.
"""

_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = (
    r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])"  # every month has days 1-28
    r"|(?:0[13-9]|1[0-2])-(?:29|30)"  # all but February have 29 and 30
    r"|(?:0[13578]|1[02])-31)"  # the long months have 31
)
DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_HOUR = r"(?:[01][0-9]|2[0-3])"
TIME = rf"{_HOUR}:[0-5][0-9]:[0-5][0-9](?:\.[0-9]{{1,6}})?(?:Z|[+-]{_HOUR}:[0-5][0-9])"
DATE_TIME = rf"{DATE}T{TIME}"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
EMAIL = rf"[a-zA-Z0-9_+-]+(?:\.[a-zA-Z0-9_+-]+)*@(?:{_LABEL}\.)+[a-zA-Z]{{2,12}}"
_HEX = "[0-9a-fA-F]"
UUID = rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"(?:{_OCTET}\.){{3}}{_OCTET}"

_H16 = "[0-9a-fA-F]{1,4}"
IPV6 = (
    rf"(?:(?:{_H16}:){{7}}{_H16}|(?:{_H16}:){{1,7}}:|(?:{_H16}:){{1,6}}:{_H16}"
    rf"|(?:{_H16}:){{1,5}}(?::{_H16}){{1,2}}|(?:{_H16}:){{1,4}}(?::{_H16}){{1,3}}"
    rf"|(?:{_H16}:){{1,3}}(?::{_H16}){{1,4}}|(?:{_H16}:){{1,2}}(?::{_H16}){{1,5}}"
    rf"|{_H16}:(?::{_H16}){{1,6}}|:(?:(?::{_H16}){{1,7}}|:))"
)
_HOST_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,60}[a-zA-Z0-9])?"
HOSTNAME = (
    rf"{_HOST_LABEL}(?:\.{_HOST_LABEL}){{0,3}}"  # at most 4 labels of 62: under 253 characters
)
# RFC 3986 Appendix A: unreserved and sub-delims (`-` last in each class), percent-encodings
_URI_CHARS = r"A-Za-z0-9._~!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_URI_CHARS}:@-]|{_PCT})"
# authority = [ userinfo "@" ] host [ ":" port ]; host a reg-name (an IPv4 address is one too)
_AUTHORITY = rf"(?:(?:[{_URI_CHARS}:-]|{_PCT})*@)?(?:[{_URI_CHARS}-]|{_PCT})*(?::[0-9]*)?"
_PATH_ABEMPTY = rf"(?:/{_PCHAR}*)*"
_PATH_ABSOLUTE = rf"/(?:{_PCHAR}+{_PATH_ABEMPTY})?"
_QUERY = rf"(?:{_PCHAR}|[/?])*"  # also the fragment
_URI_END = rf"(?:\?{_QUERY})?(?:#{_QUERY})?"
URI = (
    rf"[a-zA-Z][a-zA-Z0-9+.-]*:"  # scheme
    rf"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PCHAR}+{_PATH_ABEMPTY})?{_URI_END}"
)
_RELATIVE_REF = (  # a first segment without ":" (path-noscheme), else it would read as a scheme
    rf"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}"
    rf"|(?:[{_URI_CHARS}@-]|{_PCT})+{_PATH_ABEMPTY})?{_URI_END}"
)
URI_REFERENCE = rf"(?:{URI}|{_RELATIVE_REF})"
_VARNAME = r"[A-Za-z0-9_](?:\.?[A-Za-z0-9_])*"
_VARSPEC = rf"{_VARNAME}(?::[1-9][0-9]{{0,2}}|\*)?"
URI_TEMPLATE = (
    r"(?:[A-Za-z0-9._~!$&()*+,;=:@/?#\[\]-]|%[0-9A-Fa-f]{2}"  # literals
    rf"|\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\}})*"  # expressions
)
_DURATION_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
DURATION = (
    rf"P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:{_DURATION_TIME})?"
    rf"|{_DURATION_TIME}|[0-9]+W)"
)
ANY_STRING = r'(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*'
"""outlines-core's JSON string body (no `\\u` escapes), for formats that only name a string."""

FORMATS = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "email": EMAIL,
    "uuid": UUID,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "hostname": HOSTNAME,
    "uri": URI,
    "uri-reference": URI_REFERENCE,
    "duration": DURATION,
    "uri-template": URI_TEMPLATE,
    "regex": ANY_STRING,
}
"""The asserted `format` values and the regex of each (the JSON string's body): only formats
JSON Schema 2020-12 defines (`SPEC_FORMATS`); any other (OpenAPI's `byte`, `int64`, ...) is an
annotation, so a value under it is any string (MaskBench's valid documents put PEM text under
`format: byte`). `regex` is any string (not checked to be a valid
ECMA-262 regex); `uri`/`uri-reference` are RFC 3986's grammar (Appendix A), the language of
`rfc3986_validator`, which `jsonschema` checks them with, except IP-literal hosts (`[::1]`):
those would multiply the automaton's states by 5 for a rare form; `hostname` has at
most four labels so that it stays under 253 characters (RFC 1123); `ipv6` has no embedded IPv4
form; `uri-template` is RFC 6570's level-4 syntax (literals from RFC 3986's unreserved and
reserved characters or percent-encoded, expressions with an operator out of `+#./;?&` and
variables with a prefix of 1-999 characters or an explode `*`; the `uri_template` package that
`jsonschema` checks with refuses 4-digit prefixes)."""

SPEC_FORMATS = frozenset(
    {
        "date-time",
        "date",
        "time",
        "duration",
        "email",
        "idn-email",
        "hostname",
        "idn-hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "iri",
        "iri-reference",
        "uuid",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
        "regex",
    }
)
"""The formats JSON Schema 2020-12 defines (§7.3 of the validation vocabulary). A `format` outside
this set (`"int64"`, `"password"`, `"color"`, ...) is an annotation and is ignored, as validators
do; one inside it that `FORMATS` lacks cannot be enforced."""
