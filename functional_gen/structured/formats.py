"""Regexes for JSON Schema's string `format`s, strict enough that every match is valid.

outlines-core's own format regexes let through impossible dates (`2023-02-31`), Unicode digits
(`\\d`), times without a UTC offset and, for `email`, control characters that JSON must escape.
These regexes match only values that the reference checkers accept: `date` and `date-time` with
the right number of days per month (leap years included) and a year from 0001, `time` with an
offset as RFC 3339's `full-time` requires, lower- or upper-case UUIDs with the dashes where
`uuid.UUID` and `jsonschema` expect them, IPv4 addresses without leading zeros.

Each value is the body of the JSON string, without the quotes; all of them are plain ASCII that
JSON needs no escape for.

Sources: RFC 3339 §5.6 (`full-date`, `full-time`, `date-time`), RFC 4122 (UUID), the
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

FORMATS = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "email": EMAIL,
    "uuid": UUID,
    "ipv4": IPV4,
}
"""The supported `format` values and the regex of each (the JSON string's body)."""
