"""Numeric range regexes against exact arithmetic (Python ints and `fractions.Fraction`)."""

import random
import re
from fractions import Fraction

import pytest

from functional_gen.structured.ranges import (
    integer_range_regex,
    natural_range_regex,
    number_range_regex,
)

INTEGER_RANGES = [
    (0, 120),
    (1, 5),
    (-5, 5),
    (-100, -3),
    (None, 10),
    (10, None),
    (None, None),
    (0, None),
    (None, 0),
    (-1, None),
    (7, 7),
    (0, 0),
    (13, 2017),
    (99, 1001),
    (None, -7),
    (-1000, 999),
    (1, 65535),
]


@pytest.mark.parametrize("lo,hi", INTEGER_RANGES)
def test_integer_range_is_exact(lo, hi):
    pattern = re.compile(integer_range_regex(lo, hi))
    rng = random.Random(0)
    lo_t = -2000 if lo is None else lo - 100
    hi_t = 2000 if hi is None else hi + 100
    for x in [*range(lo_t, hi_t + 1), *(rng.randint(-(10**9), 10**9) for _ in range(300))]:
        assert bool(pattern.fullmatch(str(x))) == (
            (lo is None or x >= lo) and (hi is None or x <= hi)
        ), x
    for not_json in ("-0", "01", "+1", "00", "", "1.0", "1e3"):
        assert not pattern.fullmatch(not_json)


def test_natural_range_errors():
    with pytest.raises(ValueError):
        natural_range_regex(-1, 5)
    with pytest.raises(ValueError):
        integer_range_regex(5, 4)


def _candidates():
    out = set()
    for i in range(61):
        for frac in ("", ".0", ".00", ".5", ".05", ".001", ".9", ".99"):
            out.update({f"{i}{frac}", f"-{i}{frac}"})
    return out


@pytest.mark.parametrize(
    "lo,hi",
    [
        (0, None),
        (None, 0),
        (0, 1),
        (-5, 5),
        (1, 10),
        (-10, -2),
        (None, None),
        (3, 3),
        (-3, None),
        (0, 50),
    ],
)
@pytest.mark.parametrize(
    "lo_exclusive,hi_exclusive", [(False, False), (True, False), (False, True), (True, True)]
)
def test_number_range_is_exact(lo, hi, lo_exclusive, hi_exclusive):
    if lo == hi is not None and (lo_exclusive or hi_exclusive):
        with pytest.raises(ValueError, match="empty"):
            number_range_regex(lo, hi, lo_exclusive=lo_exclusive, hi_exclusive=hi_exclusive)
        return
    pattern = re.compile(
        number_range_regex(lo, hi, lo_exclusive=lo_exclusive, hi_exclusive=hi_exclusive)
    )
    for text in _candidates():
        v = Fraction(text)
        inside = (lo is None or (v > lo if lo_exclusive else v >= lo)) and (
            hi is None or (v < hi if hi_exclusive else v <= hi)
        )
        if text.startswith("-") and v == 0:
            inside = False  # "-0", "-0.0": never generated
        assert bool(pattern.fullmatch(text)) == inside, text


def test_fractional_bounds_are_refused():
    with pytest.raises(ValueError, match="not an integer"):
        number_range_regex(0.5, None)
