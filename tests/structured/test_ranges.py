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


DECIMAL_BOUNDS = [None, 0, 1, 2, 0.5, -0.5, 0.25, 1.5, 0.05, 0.001, 2.125, -1.75, 0.1]


def _decimal_candidates():
    out = set()
    for i in range(4):
        for f in ("", "0", "00", "5", "50", "49", "4999", "5000001", "05", "1", "25", "75", "9"):
            for frac in (f, f + "1", f + "9") if f else ("",):
                text = f"{i}.{frac}" if frac else str(i)
                out.update({text, "-" + text})
    return sorted(out)


@pytest.mark.parametrize("lo", DECIMAL_BOUNDS)
@pytest.mark.parametrize("hi", DECIMAL_BOUNDS)
def test_decimal_bounds_are_exact(lo, hi):
    # the bound is the decimal the float's repr writes: 0.1 is one tenth
    lo_q = None if lo is None else Fraction(repr(lo))
    hi_q = None if hi is None else Fraction(repr(hi))
    candidates = _decimal_candidates()
    for lo_exclusive in (False, True):
        for hi_exclusive in (False, True):
            if (
                lo_q is not None
                and hi_q is not None
                and (hi_q < lo_q or (hi_q == lo_q and (lo_exclusive or hi_exclusive)))
            ):
                with pytest.raises(ValueError, match="empty"):
                    number_range_regex(lo, hi, lo_exclusive=lo_exclusive, hi_exclusive=hi_exclusive)
                continue
            pattern = re.compile(
                number_range_regex(lo, hi, lo_exclusive=lo_exclusive, hi_exclusive=hi_exclusive)
            )
            for text in candidates:
                v = Fraction(text)
                inside = (lo_q is None or (v > lo_q if lo_exclusive else v >= lo_q)) and (
                    hi_q is None or (v < hi_q if hi_exclusive else v <= hi_q)
                )
                if text.startswith("-") and v == 0:
                    inside = False  # "-0", "-0.0": never generated
                assert bool(pattern.fullmatch(text)) == inside, (text, lo_exclusive, hi_exclusive)


@pytest.mark.parametrize("places", [0, 1, 2, 3])
@pytest.mark.parametrize(
    "lo,hi", [(0, 99.99), (0.5, 2.125), (-1.75, 0.25), (0.001, None), (None, -0.05), (1.5, 1.5)]
)
def test_decimal_bounds_with_fraction_digits_are_exact(lo, hi, places):
    # `multipleOf: 10 ** -places` beside decimal bounds (MaskBench o46322: 0 to 99.99 in 0.01s):
    # inside the bounds and a multiple, judged on exact fractions
    lo_q = None if lo is None else Fraction(repr(lo))
    hi_q = None if hi is None else Fraction(repr(hi))
    step = Fraction(1, 10**places)
    candidates = _decimal_candidates() + ["99.99", "99.990", "99.995", "100", "98.5", "2.13"]
    for lo_exclusive in (False, True):
        for hi_exclusive in (False, True):

            def inside(v, lo_exclusive=lo_exclusive, hi_exclusive=hi_exclusive):
                return (lo_q is None or (v > lo_q if lo_exclusive else v >= lo_q)) and (
                    hi_q is None or (v < hi_q if hi_exclusive else v <= hi_q)
                )

            texts = [t for t in candidates if not (t.startswith("-") and Fraction(t) == 0)]
            expected = {t: inside(Fraction(t)) and Fraction(t) % step == 0 for t in texts}
            try:
                regex = number_range_regex(
                    lo, hi, lo_exclusive=lo_exclusive, hi_exclusive=hi_exclusive, places=places
                )
            except ValueError as e:
                assert "empty" in str(e)
                assert not any(expected.values())  # nothing of the candidates is inside
                continue
            pattern = re.compile(regex)
            for text in texts:
                assert bool(pattern.fullmatch(text)) == expected[text], (
                    text,
                    lo_exclusive,
                    hi_exclusive,
                )


def test_minimum_one_half_by_hand():
    pattern = re.compile(number_range_regex(0.5, None))
    for text in ("0.5", "0.50", "0.5000001", "0.6", "1", "1.0", "7.25", "10"):
        assert pattern.fullmatch(text), text
    for text in ("0.49", "0.4999999", "0", "0.0", "-0.5", "-1", "0.05", "5e-1", "1e0", ".5"):
        assert not pattern.fullmatch(text), text  # exponents are never generated with bounds


def test_tiny_and_huge_decimal_bounds():
    tiny = re.compile(number_range_regex(1e-20, None, lo_exclusive=True))
    assert tiny.fullmatch("0." + "0" * 19 + "11")
    assert not tiny.fullmatch("0." + "0" * 19 + "1")  # equal, excluded
    assert not tiny.fullmatch("0." + "0" * 20 + "9")
    huge = re.compile(number_range_regex(None, 1.5e20))
    assert huge.fullmatch("15" + "0" * 19) and huge.fullmatch("15" + "0" * 19 + ".0")
    assert not huge.fullmatch("15" + "0" * 19 + ".01")


def test_bound_with_too_many_fraction_digits_is_refused():
    from functional_gen.structured.byte_dfa import regex_byte_dfa

    regex_byte_dfa(number_range_regex(1e-80, None))  # within outlines-core's nesting limit
    with pytest.raises(ValueError, match="300 fraction digits"):
        number_range_regex(1e-300, None)


@pytest.mark.parametrize("bound", [float("inf"), float("nan"), True])
def test_bad_bounds_are_refused(bound):
    with pytest.raises(ValueError, match="bound"):
        number_range_regex(bound, None)


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 10, 11, 12, 0.5, 0.25, 1.5, 2.5, 0.3, 0.01])
@pytest.mark.parametrize("integer", [True, False])
def test_multiple_of_dfa_accepts_exactly_the_multiples(step, integer):
    # every JSON number text of up to 3 integer and 3 fraction digits (and a few that are not
    # JSON numbers): accepted iff it is one in plain notation and an exact decimal multiple
    import itertools
    import json
    from decimal import Decimal

    from functional_gen.structured.byte_dfa import REJECT
    from functional_gen.structured.ranges import multiple_of_dfa

    dfa = multiple_of_dfa(step, integer=integer)
    plain = re.compile(r"-?(0|[1-9][0-9]*)" + ("" if integer else r"(\.[0-9]+)?"))
    texts = ["", "-", ".", "-0", "00", "01", "1.", ".5", "1e1", "+1", "1.0.0"]
    for n in range(1, 4):
        for digits in itertools.product("0123456789", repeat=n):
            number = "".join(digits)
            texts += [number, "-" + number, number[:1] + "." + number[1:], "3" + number[1:] + ".0"]
    verdicts = set()
    for text in texts:
        state = dfa.initial
        for byte in text.encode():
            state = dfa.delta[state, byte] if state != REJECT else REJECT
        accepted = state != REJECT and bool(dfa.accepting[state])
        expected = bool(plain.fullmatch(text)) and Decimal(text) % Decimal(repr(step)) == 0
        assert accepted == expected, text
        assert not expected or isinstance(json.loads(text), (int, float))
        verdicts.add(expected)
    assert verdicts == {True, False}
