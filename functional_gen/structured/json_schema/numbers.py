"""Rewriting `type: integer` and `type: number`: exact range regexes for `minimum`/`maximum`
(`exclusive*` too) and `multipleOf` (digits or a remainder automaton, `multiple_terminal`).
"""

import decimal
import math
import typing

from ..automaton import ConstraintError
from ..byte_dfa import (
    minimize,
    regex_byte_dfa,
)
from ..patterns import (
    dfa_regex,
    intersect_dfas,
)
from ..ranges import integer_range_regex, multiple_of_dfa, number_range_regex
from . import budgets
from .errors import (
    UnsupportedSchemaError,
)
from .scalars import (
    INTEGER,
)

if typing.TYPE_CHECKING:  # annotations only: the rewriter imports this module
    from .rewriter import Rewriter


def multiple_of(rewriter: "Rewriter", node: dict, path: str, integer: bool = False):
    """How `multipleOf` is written: `(places, step)`. `places` is `d` for a power of ten
    `10 ** -d` (`0.01`: 2; `1`: 0), a count of fraction digits; `step` is any other value
    (`5`, `2.5`; `0.25` for a number), a remainder automaton (`multiple_terminal`). Both
    `None` without `multipleOf`, or for an `integer` when every integer is a multiple
    (`1 / multipleOf` an integer: `0.25`).

    **Raises:** `UnsupportedSchemaError` for a `multipleOf` that is not a positive number."""
    if "multipleOf" not in node:
        return None, None
    m = node["multipleOf"]
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0:
        raise UnsupportedSchemaError("multipleOf", path, f"must be a positive number, got {m!r}")
    exact = decimal.Decimal(repr(m)) if isinstance(m, float) else decimal.Decimal(m)
    if integer and (1 / exact) == (1 / exact).to_integral_value():
        return None, None
    digits = exact.normalize().as_tuple()
    if digits.digits == (1,) and digits.exponent <= 0:
        return -digits.exponent, None
    return None, m


def multiple_terminal(rewriter: "Rewriter", regex: str, step, integer: bool, path: str):
    """The numbers of `regex` (a range, or any number) that are multiples of `step`: the
    intersection of its automaton with the remainder automaton `multiple_of_dfa`, written
    back as a regex (`dfa_regex`). `NEVER` when no multiple lies in the range. Steps whose
    regex would exceed `MAX_MULTIPLE_REGEX` characters (7, 9, 11, 12, 13, 16 and most
    larger ones: the remainders form a cycle that state elimination writes out) are refused
    (with `strict=False`: dropped, `None`: the caller writes the node without it)."""
    try:
        dfa = intersect_dfas(
            regex_byte_dfa(regex),
            multiple_of_dfa(step, integer=integer),
            max_states=budgets.MAX_STRING_STATES,
        )
        return rewriter.marker(dfa_regex(minimize(dfa), max_chars=budgets.MAX_MULTIPLE_REGEX))
    except ConstraintError:
        return rewriter.admits_none(
            "multipleOf", path, f"no multiple of {step!r} lies within the node's bounds"
        )
    except ValueError as e:
        rewriter.refuse(
            "multipleOf",
            path,
            f"{step!r}: the remainders modulo the step need a longer regex than "
            f"{budgets.MAX_MULTIPLE_REGEX:,} characters ({e})",
        )
        return None


def empty_interval(node: dict, lo, lo_excl: bool, hi, hi_excl: bool) -> tuple[str, str] | None:
    """`(keyword, reason)` when no number lies within the bounds `number_bounds` read from
    `node` (`("maximum", "minimum 3 > maximum 1")`, `exclusiveMinimum 1 >= maximum 1`), else
    `None`. The keywords named are those that set each bound."""
    if lo is None or hi is None or lo < hi or (lo == hi and not (lo_excl or hi_excl)):
        return None
    lo_keyword = (
        "exclusiveMinimum"
        if lo_excl and not isinstance(node.get("exclusiveMinimum"), bool)
        else "minimum"
    )
    hi_keyword = (
        "exclusiveMaximum"
        if hi_excl and not isinstance(node.get("exclusiveMaximum"), bool)
        else "maximum"
    )
    relation = ">" if lo > hi else ">="
    return hi_keyword, f"{lo_keyword} {lo!r} {relation} {hi_keyword} {hi!r}"


def rewrite_integer(rewriter: "Rewriter", node: dict, path: str):
    """`type: integer` (`BY_TYPE`): its bounds as an exact range regex, `multipleOf` as digits
    or a remainder automaton. `NEVER` (`admits_none`) when no integer lies within the bounds."""
    _, step = multiple_of(rewriter, node, path, integer=True)
    bounds = number_bounds(rewriter, node, path)
    if (empty := empty_interval(node, *bounds)) is not None:
        return rewriter.admits_none(empty[0], path, empty[1])
    lo, hi = integer_bounds(rewriter, node, path)
    if lo is not None and hi is not None and hi < lo:
        return rewriter.admits_none(
            "maximum",
            path,
            "no integer lies within "
            + ", ".join(
                f"{k} {node[k]!r}"
                for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
                if k in node
            ),
        )
    if lo is None and hi is None and step is None:
        return {"type": "integer"}
    try:
        regex = integer_range_regex(lo, hi) if (lo, hi) != (None, None) else None
    except ValueError as e:
        raise UnsupportedSchemaError("minimum", path, str(e)) from None
    if step is not None:
        multiples = multiple_terminal(rewriter, regex or INTEGER, step, True, path)
        if multiples is not None:
            return multiples
    return {"type": "integer"} if regex is None else rewriter.marker(regex)


def rewrite_number(rewriter: "Rewriter", node: dict, path: str):
    """`type: number` (`BY_TYPE`): bounds (decimal ones too) as an exact range regex,
    `multipleOf` as fraction digits or a remainder automaton. `NEVER` (`admits_none`) for an
    empty interval."""
    places, step = multiple_of(rewriter, node, path)
    if (empty := empty_interval(node, *number_bounds(rewriter, node, path))) is not None:
        return rewriter.admits_none(empty[0], path, empty[1])
    if step is not None:
        lo, lo_excl, hi, hi_excl = number_bounds(rewriter, node, path)
        try:
            regex = number_range_regex(lo, hi, lo_exclusive=lo_excl, hi_exclusive=hi_excl)
        except ValueError as e:
            keyword = "minimum" if "lower" in str(e) or hi is None else "maximum"
            raise UnsupportedSchemaError(keyword, path, str(e)) from None
        multiples = multiple_terminal(rewriter, regex, step, False, path)
        if multiples is not None:
            return multiples
    if not {k for k in node if k != "multipleOf"} and places is None:
        return {"type": "number"}
    lo, lo_excl, hi, hi_excl = number_bounds(rewriter, node, path)
    try:
        return rewriter.marker(
            number_range_regex(lo, hi, lo_exclusive=lo_excl, hi_exclusive=hi_excl, places=places)
        )
    except ValueError as e:
        keyword = "minimum" if "lower" in str(e) or hi is None else "maximum"
        raise UnsupportedSchemaError(keyword, path, str(e)) from None


def integer_bounds(rewriter: "Rewriter", node: dict, path: str):
    """`(lo, hi)`: the smallest and largest integers the node's bounds allow (`None`: open;
    `hi < lo` when none lies between them)."""
    lo, lo_excl, hi, hi_excl = number_bounds(rewriter, node, path)
    if lo is not None:
        lo = math.floor(lo) + 1 if lo_excl else math.ceil(lo)
    if hi is not None:
        hi = math.ceil(hi) - 1 if hi_excl else math.floor(hi)
    return lo, hi


def number_bounds(rewriter: "Rewriter", node: dict, path: str):
    """`(lo, lo_exclusive, hi, hi_exclusive)` from `minimum`/`maximum` and `exclusive*`
    (draft 4's flags too), the tighter of each pair; `None` where open.

    **Raises:** `UnsupportedSchemaError` for a bound that is not a finite number."""

    @typing.no_type_check
    def number(key):
        value = node.get(key)
        if value is None or isinstance(value, bool):
            return value
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UnsupportedSchemaError(key, path, f"must be a finite number, got {value!r}")
        return value

    lo, hi = number("minimum"), number("maximum")
    lo_excl = hi_excl = False
    emin, emax = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if isinstance(emin, bool):  # draft 4: a flag on `minimum`
        lo_excl = emin and lo is not None
    elif emin is not None:
        emin = number("exclusiveMinimum")
        if lo is None or emin >= lo:
            lo, lo_excl = emin, True
    if isinstance(emax, bool):
        hi_excl = emax and hi is not None
    elif emax is not None:
        emax = number("exclusiveMaximum")
        if hi is None or emax <= hi:
            hi, hi_excl = emax, True
    return lo, lo_excl, hi, hi_excl
