"""Regexes for numeric ranges: the JSON integers and numbers between two bounds.

JSON Schema's `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum` are not regular
in general, but for integer bounds they are: the integers in `[lo, hi]` are a finite union of
digit patterns (split by length, then by leading digits, as in the `to-regex-range` algorithm),
and a decimal `I.F` lies in `[lo, hi]` when its integer part `I` does, with the one end case
`I = hi` (only a zero fraction) and, for exclusive bounds, `I = lo` (a non-zero fraction).

Decimal bounds are regular too (`number_range_regex`): `x >= 0.5` is an integer part of at
least 1 with any fraction, or `0` with a fraction `.F` whose digits compare at least `5`
left to right (`.5`, `.50`, `.51`, `.6`, but not `.49` or `.4999`). The fraction comparison
reads one digit of the bound per level (`_fraction_regex`). Bounds are compared as the exact
decimals the schema writes (a float bound is its shortest `repr`: `0.1` is one tenth); a
validator that parses numbers into doubles (Python's `json`, hence `jsonschema`) agrees on every
number written with at most 15 significant digits, and may differ beyond, where the double
rounds the text (`0.50000000000000001` is `0.5` as a double).

All regexes here match JSON's number grammar (no leading zeros, no `+`, no exponent: a number
with bounds is generated in plain decimal notation, a subset of the valid JSON texts) and use
the syntax common to Rust's `regex` and Python's `re`.
"""

import typing
from decimal import Decimal

import numpy as np

from .byte_dfa import REJECT, ByteDFA, minimize, trim

# Nested helpers that run per byte, state or schema node are `@typing.no_type_check`: the
# tests' jaxtyping import hook would wrap every call of them (30-40 us each, and a fresh
# wrapper per definition), which was most of the structured tests' time.


def _same_length(lo: str, hi: str) -> list[str]:
    """Alternatives matching the digit strings from `lo` to `hi` (equal lengths, lo <= hi)."""
    n = len(lo)
    if lo == hi:
        return [lo]
    if n == 1:
        return [f"[{lo}-{hi}]"]
    if lo[0] == hi[0]:
        return [lo[0] + alt for alt in _group(_same_length(lo[1:], hi[1:]))]
    out = []
    first, last = int(lo[0]), int(hi[0])
    if lo[1:] != "0" * (n - 1):  # lo's leading digit only partly covered
        out += [lo[0] + alt for alt in _group(_same_length(lo[1:], "9" * (n - 1)))]
        first += 1
    tail = []
    if hi[1:] != "9" * (n - 1):
        tail = [hi[0] + alt for alt in _group(_same_length("0" * (n - 1), hi[1:]))]
        last -= 1
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        out.append(digit + ("[0-9]" if n == 2 else f"[0-9]{{{n - 1}}}"))
    return out + tail


def _group(alternatives: list[str]) -> list[str]:
    return alternatives if len(alternatives) == 1 else ["(?:" + "|".join(alternatives) + ")"]


def _natural_alternatives(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the naturals in `[lo, hi]` (`hi=None`: unbounded), `lo >= 0`."""
    out = []
    while hi is None or lo <= hi:
        digits = len(str(lo))
        top = 10**digits - 1
        if hi is None and lo == 10 ** (digits - 1) and digits > 1:
            out.append(f"[1-9][0-9]{{{digits - 1},}}")
            return out
        if hi is None and lo == 0:
            return out + ["0", "[1-9][0-9]*"]
        end = top if hi is None else min(hi, top)
        out += _same_length(str(lo), str(end))
        if hi is None and end == top:
            out.append(f"[1-9][0-9]{{{digits},}}")
            return out
        lo = end + 1
    return out


def natural_range_regex(lo: int, hi: int | None) -> str:
    """Regex of the decimal naturals in `[lo, hi]` (`hi=None`: no upper bound), `0 <= lo`,
    without leading zeros.

    **Raises:** `ValueError` for `lo < 0` or `hi < lo`.
    """
    if lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"bad natural range [{lo}, {hi}]")
    alternatives = _natural_alternatives(lo, hi)
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


def integer_range_regex(lo: int | None, hi: int | None) -> str:
    """Regex of the integers in `[lo, hi]`, either bound `None` for unbounded, as JSON writes
    them (`-` sign, no leading zeros, no `-0`).

    **Raises:** `ValueError` when the range is empty.
    """
    if lo is not None and hi is not None and hi < lo:
        raise ValueError(f"empty integer range [{lo}, {hi}]")
    parts = []
    if lo is None or lo < 0:  # negative part: magnitudes in [max(1, -hi), -lo]
        low_magnitude = 1 if hi is None or hi >= 0 else -hi
        parts.append("-" + natural_range_regex(low_magnitude, None if lo is None else -lo))
    if hi is None or hi >= 0:
        parts.append(natural_range_regex(max(lo or 0, 0) if lo is not None else 0, hi))
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


_FRACTION = r"(?:\.[0-9]+)?"
_NONZERO_FRACTION = r"\.[0-9]*[1-9][0-9]*"
_ZERO_FRACTION = r"(?:\.0+)?"


def _fractions(places: int | None) -> tuple[str, str | None]:
    """`(any, nonzero)`: the regexes of an optional fraction and of a non-zero one, of at most
    `places` significant digits (`None`: any; trailing zeros are always allowed). `nonzero` is
    `None` when there is none (`places=0`)."""
    if places is None:
        return _FRACTION, _NONZERO_FRACTION
    if places == 0:
        return _ZERO_FRACTION, None
    head = "" if places == 1 else f"[0-9]{{0,{places - 1}}}"
    return rf"(?:\.[0-9]{{1,{places}}}0*)?", rf"\.{head}[1-9]0*"


def _magnitude_regex(
    lo: int, lo_exclusive: bool, hi: int | None, hi_exclusive: bool, places: int | None = None
) -> str | None:
    """Decimals `I(.F)?` with value in the interval from `lo >= 0` to `hi` (None: unbounded),
    with at most `places` significant fraction digits (`None`: any)."""
    fraction, nonzero = _fractions(places)
    parts = []
    if hi is not None and lo == hi:
        return None if lo_exclusive or hi_exclusive else str(lo) + _ZERO_FRACTION
    if lo_exclusive:
        if nonzero is not None:
            parts.append(str(lo) + nonzero)  # lo < I.F < lo + 1
        first_full = lo + 1
    else:
        first_full = lo
    last_full = None if hi is None else hi - 1
    if last_full is None or first_full <= last_full:
        parts.append(natural_range_regex(first_full, last_full) + fraction)
    if hi is not None and not hi_exclusive:
        parts.append(str(hi) + _ZERO_FRACTION)
    return "(?:" + "|".join(parts) + ")" if parts else None


def _as_decimal(bound, name: str) -> Decimal:
    """A bound as the exact decimal its JSON text writes: an `int` as it is, a `float` as its
    shortest `repr` (`0.1` is one tenth, the number the schema's author wrote, not the nearest
    binary double), a `Decimal` as it is.

    **Raises:** `ValueError` for an infinite or NaN bound, another type, or more than
    `MAX_FRACTION_DIGITS` fraction digits."""
    if isinstance(bound, bool) or not isinstance(bound, (int, float, Decimal)):
        raise ValueError(f"the {name} bound {bound!r} of a number must be an int, float or Decimal")
    if isinstance(bound, int):
        return Decimal(bound)
    value = Decimal(repr(bound)) if isinstance(bound, float) else bound
    if not value.is_finite():
        raise ValueError(f"the {name} bound {bound!r} of a number is not a finite number")
    fraction = _split(abs(value))[1]
    if len(fraction) > MAX_FRACTION_DIGITS:
        raise ValueError(
            f"the {name} bound {bound!r} of a number has {len(fraction)} fraction digits (at most "
            f"{MAX_FRACTION_DIGITS}: each nests the range's regex one level deeper)"
        )
    return value


MAX_FRACTION_DIGITS = 80
"""Most digits after the decimal point of a number bound (`1e-300` has 300): the fraction
comparison nests two groups per digit, and outlines-core's regex parser stops at 250 levels."""


def _split(value: Decimal) -> tuple[int, str]:
    """`value >= 0` as its integer part and its fraction's digits without trailing zeros
    (`Decimal("12.50")` -> `(12, "5")`, `Decimal("1E-3")` -> `(0, "001")`)."""
    whole, _, fraction = format(value, "f").partition(".")
    return int(whole), fraction.rstrip("0")


def _digit_class(digits: list[int]) -> str:
    if len(digits) == 1:
        return str(digits[0])
    if digits == list(range(digits[0], digits[-1] + 1)):
        return f"[{digits[0]}-{digits[-1]}]"
    return "[" + "".join(map(str, digits)) + "]"


def _fraction_regex(lower, lower_inclusive: bool, upper, upper_inclusive: bool, places=None):
    """The fraction digit strings `F` (the `F` of `I.F`, read as the number `0.F`) with
    `0.F` at least `0.lower` (more, unless `lower_inclusive`) and at most `0.upper` (less, unless
    `upper_inclusive`); `lower`/`upper` are digit strings without trailing zeros, `None` for no
    bound; `places`: at most this many significant digits (only zeros after them; `None`: any).
    Returns `(regex of the non-empty F, or None when there is none; whether no fraction at all,
    the value 0, is inside)`.

    A left-to-right comparison, one digit at a time: a digit above the lower bound's digit
    settles that bound, one equal to it leaves the rest of the bound to compare, one below it
    leaves the interval (the upper bound mirrored). Digits with the same outcome share one
    character class, so the regex has one level per digit of the bounds. With `places`, the
    state also counts the digits left (`left`); at 0 only zeros may follow, which change
    neither the value nor any comparison."""
    memo: dict = {}

    @typing.no_type_check
    def normal(state):
        lo, lo_in, hi, hi_in, left = state
        if lo == "" and lo_in:
            lo = None  # 0.F >= 0: no constraint
        if hi == "" and not hi_in:
            return None  # 0.F < 0: nothing
        if lo == "" and hi == "":
            return None  # 0 < 0.F <= 0
        return (
            lo,
            lo_in if lo is not None else True,
            hi,
            hi_in if hi is not None else True,
            left,
        )

    @typing.no_type_check
    def empty_ok(state) -> bool:
        lo, lo_in, hi, hi_in, _ = state
        return (lo is None or (lo == "" and lo_in)) and (hi is None or hi != "" or hi_in)

    @typing.no_type_check
    def nonempty(state):
        if state in memo:
            return memo[state]
        lo, _, hi, _, left = state
        if left == 0:
            out = "0+" if empty_ok(state) else None  # trailing zeros only
        elif lo is None and hi is None:
            out = "[0-9]+" if left is None else f"[0-9]{{1,{left}}}0*"
        elif lo is None and hi == "":
            out = "0+"
        elif lo == "" and hi is None:  # a non-zero fraction
            if left is None:
                out = "0*[1-9][0-9]*"
            else:
                out = ("" if left == 1 else f"[0-9]{{0,{left - 1}}}") + "[1-9]0*"
        else:
            groups: dict = {}
            for d in range(10):
                after = step(state, d)
                if after is not None:
                    groups.setdefault(after, []).append(d)
            alternatives = []
            for after, digits in groups.items():
                rest = nonempty(after)
                if rest is None and not empty_ok(after):
                    continue
                if rest is None:
                    tail = ""
                elif not empty_ok(after):
                    tail = rest
                else:
                    tail = "[0-9]*" if rest == "[0-9]+" else f"(?:{rest})?"
                alternatives.append(_digit_class(digits) + tail)
            out = (
                None
                if not alternatives
                else (
                    alternatives[0]
                    if len(alternatives) == 1
                    else "(?:" + "|".join(alternatives) + ")"
                )
            )
        memo[state] = out
        return out

    @typing.no_type_check
    def step(state, d: int):
        lo, lo_in, hi, hi_in, left = state
        if lo is not None:
            first = int(lo[0]) if lo else 0
            if d < first:
                return None
            lo = None if d > first else lo[1:]
        if hi is not None:
            first = int(hi[0]) if hi else 0
            if d > first:
                return None
            hi = None if d < first else hi[1:]
        return normal((lo, lo_in, hi, hi_in, None if left is None else left - 1))

    start = normal((lower, lower_inclusive, upper, upper_inclusive, places))
    if start is None:
        return None, False
    return nonempty(start), empty_ok(start)


def _with_fraction(integer: str, fraction) -> str | None:
    """`integer` followed by the fractions of `_fraction_regex`'s result, `None` if none."""
    regex, empty = fraction
    if regex is None:
        return integer if empty else None
    return integer + (rf"(?:\.{regex})?" if empty else rf"\.{regex}")


def _decimal_magnitude_regex(
    lo: Decimal, lo_exclusive: bool, hi: Decimal | None, hi_exclusive: bool, places=None
) -> str | None:
    """Decimals `I(.F)?` with value in the interval from `lo >= 0` to `hi` (None: unbounded),
    for any decimal bounds, with at most `places` significant fraction digits (`None`: any):
    the integer part `I` strictly between the bounds' integer parts takes any such fraction,
    and at each bound's integer part the fraction is compared digit by digit
    (`_fraction_regex`)."""
    lo_int, lo_fraction = _split(lo)
    if hi is not None:
        hi_int, hi_fraction = _split(hi)
        if lo_int == hi_int:
            return _with_fraction(
                str(lo_int),
                _fraction_regex(
                    lo_fraction, not lo_exclusive, hi_fraction, not hi_exclusive, places
                ),
            )
    parts = [
        _with_fraction(
            str(lo_int), _fraction_regex(lo_fraction, not lo_exclusive, None, True, places)
        )
    ]
    last_full = None if hi is None else hi_int - 1
    if last_full is None or lo_int + 1 <= last_full:
        parts.append(natural_range_regex(lo_int + 1, last_full) + _fractions(places)[0])
    if hi is not None:
        parts.append(
            _with_fraction(
                str(hi_int), _fraction_regex(None, True, hi_fraction, not hi_exclusive, places)
            )
        )
    parts = [p for p in parts if p is not None]
    return "(?:" + "|".join(parts) + ")" if parts else None


def _magnitude(
    lo: Decimal, lo_exclusive: bool, hi: Decimal | None, hi_exclusive: bool, places=None
):
    """`_magnitude_regex` (the regexes of the integer-bound code, unchanged) when both bounds
    are integers, else `_decimal_magnitude_regex`."""
    if lo == lo.to_integral_value() and (hi is None or hi == hi.to_integral_value()):
        return _magnitude_regex(
            int(lo), lo_exclusive, None if hi is None else int(hi), hi_exclusive, places
        )
    return _decimal_magnitude_regex(lo, lo_exclusive, hi, hi_exclusive, places)


def number_range_regex(
    lo: int | float | Decimal | None,
    hi: int | float | Decimal | None,
    *,
    lo_exclusive: bool = False,
    hi_exclusive: bool = False,
    places: int | None = None,
) -> str:
    """Regex of the JSON numbers (decimal notation, no exponent) in the interval from `lo` to
    `hi` (`None`: unbounded), each bound inclusive unless said exclusive. Bounds may be any
    finite decimals (a float is read as its shortest `repr`, see `_as_decimal`); the comparison
    is exact on the decimal values (`0.50` and `0.5` are equal; `0.4999` is below `0.5`).
    `places`: at most this many significant fraction digits (the multiples of `10 ** -places`,
    JSON Schema's `multipleOf: 0.01` for `places=2`; trailing zeros allowed: `1.50`), with
    integer or decimal bounds (`0 <= x <= 99.99` in steps of 0.01).

    **Raises:** `ValueError` for an infinite or NaN bound, a bound with more than
    `MAX_FRACTION_DIGITS` fraction digits, or an empty interval (also one with no multiple of
    `10 ** -places` inside, such as 0.11 to 0.19 with `places=1`).
    """
    lo_d = None if lo is None else _as_decimal(lo, "lower")
    hi_d = None if hi is None else _as_decimal(hi, "upper")
    if (
        lo_d is not None
        and hi_d is not None
        and (hi_d < lo_d or (hi_d == lo_d and (lo_exclusive or hi_exclusive)))
    ):
        raise ValueError(f"empty number interval from {lo} to {hi}")
    parts = []
    # Negative numbers: x = -y with y > 0 and -hi <= y <= -lo.
    if lo_d is None or lo_d < 0:
        y_lo, y_lo_excl = (Decimal(0), True) if hi_d is None or hi_d >= 0 else (-hi_d, hi_exclusive)
        y_hi, y_hi_excl = (None, False) if lo_d is None else (-lo_d, lo_exclusive)
        magnitude = _magnitude(y_lo, y_lo_excl, y_hi, y_hi_excl, places)
        if magnitude is not None:
            parts.append("-" + magnitude)
    # Zero and positive numbers.
    if hi_d is None or hi_d > 0 or (hi_d == 0 and not hi_exclusive):
        p_lo, p_lo_excl = (Decimal(0), False) if lo_d is None or lo_d < 0 else (lo_d, lo_exclusive)
        magnitude = _magnitude(p_lo, p_lo_excl, hi_d, hi_exclusive, places)
        if magnitude is not None:
            parts.append(magnitude)
    if not parts:
        raise ValueError(f"empty number interval from {lo} to {hi}")
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def multiple_of_dfa(step, *, integer: bool):
    """The byte DFA of the JSON numbers in plain decimal notation (no exponent, as the range
    regexes here) whose value is a multiple of `step` (JSON Schema's `multipleOf`), for any
    positive step: `5`, `7`, `2.5`, `0.25`. With `integer`, integers only (`-?(0|[1-9][0-9]*)`);
    else a fraction may follow (`10.0` and `7.50` are multiples of 2.5).

    `step` is the exact decimal the schema writes (a float: its shortest `repr`), `p / 10**q` in
    lowest terms; a value `I.F` is a multiple exactly when `I * 10**q + F` (F read to `q`
    places) is divisible by `p` and `F` has no non-zero digit beyond `q` places. The states
    follow the remainder modulo `p` digit by digit (Horner's rule), as the textbook DFA of the
    numbers divisible by `p` does: `p * (q + 3) + 3` states before minimisation.

    **Raises:** `ValueError` for a step that is not a positive finite number.

    Source: the remainder automaton of divisibility (e.g. Hopcroft & Ullman 1979, exercise
    2.23: binary numbers divisible by a constant), read in base 10.
    """

    exact = Decimal(repr(step)) if isinstance(step, float) else Decimal(step)
    if not exact.is_finite() or exact <= 0:
        raise ValueError(f"`multipleOf` must be a positive number, got {step!r}")
    exponent = exact.normalize().as_tuple().exponent
    q = max(0, -int(exponent))
    p = int(exact * 10**q)
    # States: 0 start, 1 after '-', 2 the integer part "0"; then the integer part's remainder
    # r (3 + r), and the fraction's (r, j) for j = 0..q+1 digits read (j = q+1: beyond q places,
    # only zeros), 3 + p * (j + 1) + r.
    num = 3 + p * (q + 3)
    delta = np.full((num, 256), REJECT, np.int32)
    accepting = np.zeros(num, bool)

    @typing.no_type_check
    def integer_state(r):
        return 3 + r

    @typing.no_type_check
    def fraction_state(r, j):
        return 3 + p * (j + 1) + r

    zero = ord("0")
    for start in (0, 1):
        delta[start, zero] = 2
        delta[start, zero + 1 : zero + 10] = [integer_state(d % p) for d in range(1, 10)]
    delta[0, ord("-")] = 1
    accepting[2] = True
    for r in range(p):
        s = integer_state(r)
        delta[s, zero : zero + 10] = [integer_state((10 * r + d) % p) for d in range(10)]
        accepting[s] = (r * 10**q) % p == 0
    if not integer:
        for r, s in [(0, 2)] + [(r, integer_state(r)) for r in range(p)]:
            # the '.' itself reads no digit: its state is (r, 0), which is not accepting
            delta[s, ord(".")] = fraction_state(r, 0)
        for j in range(q + 2):
            for r in range(p):
                s = fraction_state(r, j)
                if j <= q:
                    accepting[s] = j > 0 and (r * 10 ** (q - j)) % p == 0
                    if j < q:
                        delta[s, zero : zero + 10] = [
                            fraction_state((10 * r + d) % p, j + 1) for d in range(10)
                        ]
                    else:
                        delta[s, zero] = fraction_state(r, q + 1)
                else:
                    accepting[s] = r == 0
                    delta[s, zero] = s
    return minimize(trim(ByteDFA(delta, accepting, 0)))
