"""Regexes for numeric ranges: the JSON integers and numbers between two bounds.

JSON Schema's `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum` are not regular
in general, but for integer bounds they are: the integers in `[lo, hi]` are a finite union of
digit patterns (split by length, then by leading digits, as in the `to-regex-range` algorithm),
and a decimal `I.F` lies in `[lo, hi]` when its integer part `I` does, with the one end case
`I = hi` (only a zero fraction) and, for exclusive bounds, `I = lo` (a non-zero fraction).

All regexes here match JSON's number grammar (no leading zeros, no `+`, no exponent) and use
the syntax common to Rust's `regex` and Python's `re`.
"""

import math


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


def _magnitude_regex(lo: int, lo_exclusive: bool, hi: int | None, hi_exclusive: bool) -> str | None:
    """Decimals `I(.F)?` with value in the interval from `lo >= 0` to `hi` (None: unbounded)."""
    parts = []
    if hi is not None and lo == hi:
        return None if lo_exclusive or hi_exclusive else str(lo) + _ZERO_FRACTION
    if lo_exclusive:
        parts.append(str(lo) + _NONZERO_FRACTION)  # lo < I.F < lo + 1
        first_full = lo + 1
    else:
        first_full = lo
    last_full = None if hi is None else hi - 1
    if last_full is None or first_full <= last_full:
        parts.append(natural_range_regex(first_full, last_full) + _FRACTION)
    if hi is not None and not hi_exclusive:
        parts.append(str(hi) + _ZERO_FRACTION)
    return "(?:" + "|".join(parts) + ")" if parts else None


def number_range_regex(
    lo: int | float | None,
    hi: int | float | None,
    *,
    lo_exclusive: bool = False,
    hi_exclusive: bool = False,
) -> str:
    """Regex of the JSON numbers (decimal notation, no exponent) in the interval from `lo` to
    `hi` (`None`: unbounded), each bound inclusive unless said exclusive.

    **Raises:** `ValueError` for a bound that is not an integer value (only integer bounds make
    a regular language with a compact regex), or an empty interval.
    """
    for name, bound in (("lower", lo), ("upper", hi)):
        if bound is not None and (not math.isfinite(bound) or bound != math.floor(bound)):
            raise ValueError(f"the {name} bound {bound!r} of a number is not an integer value")
    lo = None if lo is None else int(lo)
    hi = None if hi is None else int(hi)
    if (
        lo is not None
        and hi is not None
        and (hi < lo or (hi == lo and (lo_exclusive or hi_exclusive)))
    ):
        raise ValueError(f"empty number interval from {lo} to {hi}")
    parts = []
    # Negative numbers: x = -y with y > 0 and -hi <= y <= -lo.
    if lo is None or lo < 0:
        y_lo, y_lo_excl = (0, True) if hi is None or hi >= 0 else (-hi, hi_exclusive)
        y_hi, y_hi_excl = (None, False) if lo is None else (-lo, lo_exclusive)
        magnitude = _magnitude_regex(y_lo, y_lo_excl, y_hi, y_hi_excl)
        if magnitude is not None:
            parts.append("-" + magnitude)
    # Zero and positive numbers.
    if hi is None or hi > 0 or (hi == 0 and not hi_exclusive):
        p_lo, p_lo_excl = (0, False) if lo is None or lo < 0 else (lo, lo_exclusive)
        magnitude = _magnitude_regex(p_lo, p_lo_excl, hi, hi_exclusive)
        if magnitude is not None:
            parts.append(magnitude)
    if not parts:
        raise ValueError(f"empty number interval from {lo} to {hi}")
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
