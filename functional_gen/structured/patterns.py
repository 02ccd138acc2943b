"""Translate a JSON Schema string `pattern` into a regex over the JSON text of the string.

A `pattern` constrains the DECODED string, but generation writes the JSON text between the
quotes, where `"` and `\\` must be escaped and control characters cannot appear raw. Copying
the pattern between quotes (as outlines-core does) lets `.` or `[^a]` write a raw `"`, which
ends the string early, or a raw newline, which is invalid JSON. This module parses the
pattern (with Python's own `re` parser, the engine `jsonschema` validates with) and writes an
equivalent regex in which every character is either a plain JSON-safe character or its JSON
escape (`\\"`, `\\\\`, `\\n`, `\\t`, `\\r`, `\\u00XX`).

What is generated is a subset of what the pattern accepts, never more:

- the pattern is SEARCHED for, as ECMA-262 and `jsonschema` do: a side without its anchor
  (`^` or `$`) may have any text beyond the match (`"pattern": "a"` allows `"xay"`), and
  `^...$` makes a whole-string match;
- `\\d`, `\\w`, `\\s` generate their ASCII members only, and a negated class that involves one
  of them (`\\D`, `[^\\w]`, ...) generates ASCII only, so that the Unicode meaning Python gives
  them can never be contradicted;
- `.` and other negated classes generate no control character (C0, DEL, C1), so no line
  break either.

Look-around, backreferences, conditionals, atomic groups, word boundaries and
case-insensitive flags are not regular or not supported: they raise `ValueError`.

Source: `re._parser` (CPython's regex parser) for the syntax tree; JSON escapes from RFC 8259 §7.
"""

import re
import re._constants as C
import re._parser as sre
import typing

import numpy as np

from .automaton import unique_columns
from .byte_dfa import REJECT, ByteDFA, minimize, regex_byte_dfa, trim
from .dfa_operations import codepoint_edges, intersect_dfas, merged_ranges

# Nested helpers that run per byte, state or schema node are `@typing.no_type_check`: the
# tests' jaxtyping import hook would wrap every call of them (30-40 us each, and a fresh
# wrapper per definition), which was most of the structured tests' time.

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = [(0xD800, 0xDFFF)]
_ASCII = [(0x00, 0x7F)]
_JSON_ESCAPES = {
    ord('"'): r"\\\"",
    ord("\\"): r"\\\\",
    ord("\n"): r"\\n",
    ord("\t"): r"\\t",
    ord("\r"): r"\\r",
    0x08: r"\\b",
    0x0C: r"\\f",
}
_CATEGORY_SETS = {
    C.CATEGORY_DIGIT: [(0x30, 0x39)],
    C.CATEGORY_WORD: [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    C.CATEGORY_SPACE: [(0x09, 0x0D), (0x20, 0x20)],
}
_NEGATED_CATEGORIES = {
    C.CATEGORY_NOT_DIGIT: C.CATEGORY_DIGIT,
    C.CATEGORY_NOT_WORD: C.CATEGORY_WORD,
    C.CATEGORY_NOT_SPACE: C.CATEGORY_SPACE,
}


def _complement(ranges, universe):
    out, ranges = [], merged_ranges(ranges)
    for ulo, uhi in merged_ranges(universe):
        cursor = ulo
        for lo, hi in ranges:
            if hi < cursor or lo > uhi:
                continue
            if lo > cursor:
                out.append((cursor, lo - 1))
            cursor = max(cursor, hi + 1)
        if cursor <= uhi:
            out.append((cursor, uhi))
    return out


def _intersect(a, b):
    out = []
    for alo, ahi in merged_ranges(a):
        for blo, bhi in merged_ranges(b):
            lo, hi = max(alo, blo), min(ahi, bhi)
            if lo <= hi:
                out.append((lo, hi))
    return merged_ranges(out)


def class_char(cp: int) -> str:
    """The code point `cp` written for inside a regex character class (`[...]`), escaped where
    it would be read as syntax or is a control character."""
    ch = chr(cp)
    if ch in "\\]^-[&~" or cp < 0x20 or cp == 0x7F:
        return f"\\x{{{cp:x}}}" if cp < 0x20 or cp == 0x7F else "\\" + ch
    return ch


def _literal(cp: int) -> str:
    if cp in _JSON_ESCAPES:
        return _JSON_ESCAPES[cp]
    if cp < 0x20:
        return rf"\\u{cp:04x}"
    ch = chr(cp)
    return "\\" + ch if ch in "\\.+*?()|[]{}^$#&-~" else ch


def _emit_set(ranges, *, broad: bool = False) -> str:
    """A regex for one character from `ranges`, JSON-escaped where JSON needs it. A `broad` set
    (from `.` or a negated class) leaves out the control characters (C0, DEL and C1)."""
    if broad:
        ranges = _complement([(0x00, 0x1F), (0x7F, 0x9F)], merged_ranges(ranges))
        ranges = _intersect(ranges, [(0, _MAX_CODE_POINT)])
    ranges = _complement(_SURROGATES, merged_ranges(ranges))  # no surrogates in UTF-8
    ranges = _intersect(ranges, [(0, _MAX_CODE_POINT)])
    special = [cp for cp in sorted(_JSON_ESCAPES) if any(lo <= cp <= hi for lo, hi in ranges)]
    controls = _intersect(ranges, [(0, 0x1F)])
    plain = _complement([(0, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\"))], ranges)
    plain = _intersect(plain, ranges)
    alternatives = []
    if plain:
        if len(plain) == 1 and plain[0][0] == plain[0][1]:
            alternatives.append(_literal(plain[0][0]))
        else:
            body = "".join(
                class_char(lo) if lo == hi else f"{class_char(lo)}-{class_char(hi)}"
                for lo, hi in plain
            )
            alternatives.append(f"[{body}]")
    for cp in special:
        alternatives.append(_JSON_ESCAPES[cp])
    for lo, hi in controls:
        for cp in range(lo, hi + 1):
            if cp not in _JSON_ESCAPES:
                alternatives.append(rf"\\u{cp:04x}")
    if not alternatives:
        raise ValueError("a character class of the pattern matches no character JSON can hold")
    return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"


class _Translator:
    def __init__(self, pattern: str):
        self.pattern = pattern

    def fail(self, what: str):
        raise ValueError(
            f"`pattern` {self.pattern!r}: {what} is not supported in generated strings"
        )

    def sequence(self, items, *, top: bool) -> str:
        items = list(items)
        if top:
            if (
                items
                and items[0][0] is C.AT
                and items[0][1] in (C.AT_BEGINNING, C.AT_BEGINNING_STRING)
            ):
                items = items[1:]
            if items and items[-1][0] is C.AT and items[-1][1] in (C.AT_END, C.AT_END_STRING):
                items = items[:-1]
        return "".join(self.item(op, av) for op, av in items)

    def item(self, op, av) -> str:
        if op is C.LITERAL:
            return _emit_set([(av, av)])
        if op is C.NOT_LITERAL:
            return _emit_set(_complement([(av, av)], [(0, _MAX_CODE_POINT)]), broad=True)
        if op is C.ANY:
            return _emit_set([(0, _MAX_CODE_POINT)], broad=True)
        if op is C.IN:
            ranges, broad = self.char_class(av)
            return _emit_set(ranges, broad=broad)
        if op is C.BRANCH:
            return "(?:" + "|".join(self.sequence(b, top=False) for b in av[1]) + ")"
        if op is C.SUBPATTERN:
            _, add_flags, _, body = av
            if add_flags & re.IGNORECASE:
                self.fail("a case-insensitive group")
            return "(?:" + self.sequence(body, top=False) + ")"
        if op in (C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", None)):
            if op is getattr(C, "POSSESSIVE_REPEAT", None):
                self.fail("a possessive repeat")
            lo, hi, body = av
            inner = "(?:" + self.sequence(body, top=False) + ")"
            if hi is C.MAXREPEAT:
                return inner + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
            if (lo, hi) == (0, 1):
                return inner + "?"
            return inner + (f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}")
        if op is C.AT:
            self.fail("an anchor or word boundary inside the pattern")
        if op in (C.GROUPREF, C.GROUPREF_EXISTS):
            self.fail("a backreference")
        if op in (C.ASSERT, C.ASSERT_NOT):
            self.fail("a look-around")
        self.fail(f"the construct {op}")

    def char_class(self, items) -> tuple[list[tuple[int, int]], bool]:
        """The code point ranges of a class, and whether it is "broad" (negated)."""
        negate = bool(items) and items[0][0] is C.NEGATE
        if negate:
            items = items[1:]
        ranges, has_category, negated_category = [], False, False
        for op, av in items:
            if op is C.LITERAL:
                ranges.append((av, av))
            elif op is C.RANGE:
                ranges.append(av)
            elif op is C.CATEGORY:
                has_category = True
                if av in _CATEGORY_SETS:
                    ranges += _CATEGORY_SETS[av]
                elif av in _NEGATED_CATEGORIES:
                    negated_category = True
                    ranges += _complement(_CATEGORY_SETS[_NEGATED_CATEGORIES[av]], _ASCII)
                else:
                    self.fail(f"the category {av}")
            else:
                self.fail(f"the class item {op}")
        if negated_category and negate:
            self.fail("a negated class containing a negated category")
        if negate:
            universe = _ASCII if has_category else [(0, _MAX_CODE_POINT)]
            return _complement(ranges, universe), True
        return merged_ranges(ranges), negated_category


def _starts(items) -> bool:
    return (
        bool(items)
        and items[0][0] is C.AT
        and items[0][1] in (C.AT_BEGINNING, C.AT_BEGINNING_STRING)
    )


def _ends(items) -> bool:
    return bool(items) and items[-1][0] is C.AT and items[-1][1] in (C.AT_END, C.AT_END_STRING)


def _strip_anchors(items):
    items = list(items)
    while _starts(items):
        items = items[1:]
    while _ends(items):
        items = items[:-1]
    return items


def _has_anchor(items) -> bool:
    for op, av in items:
        if op is C.AT:
            return True
        if op is C.BRANCH and any(_has_anchor(b) for b in av[1]):
            return True
        if op is C.SUBPATTERN and _has_anchor(av[3]):
            return True
        if op in (C.MAX_REPEAT, C.MIN_REPEAT) and _has_anchor(av[2]):
            return True
    return False


def _alternatives(items) -> list[list]:
    """`items` as alternatives whose anchors, where they can be, stand at their ends: a
    branch or a plain group that holds an anchor is distributed over its sequence
    (`^(a$|b)` is `^a$|^b`, `^$|(^a$)` is `^$|^a$`), as MaskBench's patterns write them."""
    items = list(items)
    for i, (op, av) in enumerate(items):
        if op is C.BRANCH and _has_anchor([(op, av)]):
            options = [list(b) for b in av[1]]
        elif op is C.SUBPATTERN and not av[1] and not av[2] and _has_anchor(av[3]):
            options = [list(av[3])]
        else:
            continue
        return [
            alternative
            for option in options
            for alternative in _alternatives(items[:i] + option + items[i + 1 :])
        ]
    return [items]


def _width(items) -> tuple[int, int]:
    lo, hi = sre.SubPattern(sre.State(), list(items)).getwidth()
    return lo, hi


class LengthBoundError(ValueError):
    """`minLength`/`maxLength` that cannot be written into the regex of a `pattern` (its
    variable-width parts are not one repeated character, even with its fixed-width alternations
    distributed): `length_bounded_dfa` intersects the automata instead."""


class NoStringError(ValueError):
    """No string matches a `pattern` within its length bounds: the schema there allows no
    value (not an error of the schema: an optional property or an `anyOf` branch is left out)."""


MAX_COUNTED_REPEAT = 10_000
"""The largest character count a length bound may make an automaton count to: a repeat written
into a regex (`[a-z]{0,N}`, whose DFA has N states: outlines-core builds it in about 0.15 s for
N = 1,000, 2.2 s for 5,000 and 51 s for 32,767 on the 2-core development machine) or the counter
of `length_bounded_dfa` (whose minimisation takes time quadratic in a counter's length: 0.8 s
for 5,000, 32 s for 32,767). Beyond, the schema is refused with the sizes."""
_MAX_EXPANSIONS = 16
"""Most sequences that distributing a pattern's fixed-width alternations may give."""


def _fixed_alternatives(op, av):
    """The branches of an alternation (bare, or in a plain or capturing group without flags)
    whose branches each have one width (`jpg|jpeg|png`), else `None`."""
    if op is C.SUBPATTERN and not av[1] and not av[2] and len(av[3]) == 1:
        op, av = av[3][0]
    if op is not C.BRANCH:
        return None
    branches = [list(b) for b in av[1]]
    if all(len(set(_width(b))) == 1 for b in branches):
        return branches
    return None


def _expansions(items) -> list[list]:
    """`items` with every variable-width alternation of fixed-width branches distributed, one
    sequence per combination of branches (the same language: `x(ab|c)y*` is `xaby*|xcy*`).

    **Raises:** `LengthBoundError` beyond `_MAX_EXPANSIONS` sequences."""
    out = [[]]
    for op, av in items:
        lo, hi = _width([(op, av)])
        branches = _fixed_alternatives(op, av) if lo != hi else None
        out = [o + b for o in out for b in branches] if branches else [o + [(op, av)] for o in out]
        if len(out) > _MAX_EXPANSIONS:
            raise LengthBoundError(f"more than {_MAX_EXPANSIONS} alternatives to distribute")
    return out


def _bound_lengths(items, min_length: int, max_length: int | None, pattern: str) -> list[list]:
    """`items` (one top-level sequence, anchors stripped) restricted to strings of
    `min_length..max_length` characters, as sequences whose union is that language: when its
    own lengths already lie within the bounds, `[items]`; else its variable-width
    alternations of fixed-width branches are distributed (`_expansions`) and in each sequence
    the bounds of its one variable-width part, a repeat of a single character, change
    (`[]`: the language is empty).

    **Raises:** `LengthBoundError` when a sequence has another shape (`length_bounded_dfa`
    then intersects the automata); `ValueError` naming the sizes when a repeat count would
    exceed `MAX_COUNTED_REPEAT`.
    """
    lo, hi = _width(items)
    if lo >= min_length and (max_length is None or hi <= max_length):
        return [items]
    out = []
    for sequence in _expansions(items):
        bounded = _bound_one(sequence, min_length, max_length, pattern)
        if bounded is not None:
            out.append(bounded)
    return out


def _bound_one(items, min_length: int, max_length: int | None, pattern: str):
    """`_bound_lengths` for one sequence without alternations to distribute; `None` when its
    language within the bounds is empty."""
    limit = C.MAXREPEAT if max_length is None else max_length
    lo, hi = _width(items)
    if lo >= min_length and (max_length is None or hi <= max_length):
        return items
    if (max_length is not None and lo > max_length) or hi < min_length:
        return None
    variable = [
        i for i, (op, av) in enumerate(items) if _width([(op, av)])[0] != _width([(op, av)])[1]
    ]
    if len(variable) == 1:
        i = variable[0]
        op, av = items[i]
        if op in (C.MAX_REPEAT, C.MIN_REPEAT) and _width(av[2]) == (1, 1):
            rest = lo - av[0]
            new_lo = max(av[0], min_length - rest)
            new_hi = (
                av[1]
                if limit is C.MAXREPEAT
                else (limit - rest if av[1] is C.MAXREPEAT else min(av[1], limit - rest))
            )
            if new_hi is not C.MAXREPEAT and new_hi < new_lo:
                return None
            largest = max(new_lo, 0 if new_hi is C.MAXREPEAT else new_hi)
            if largest > MAX_COUNTED_REPEAT:
                raise ValueError(
                    f"`pattern` {pattern!r} with minLength {min_length} / maxLength {max_length}: "
                    f"the bounded repeat would count to {largest:,} characters, an automaton of "
                    f"as many states (the limit is {MAX_COUNTED_REPEAT:,})"
                )
            return [*items[:i], (op, (new_lo, new_hi, av[2])), *items[i + 1 :]]
    raise LengthBoundError(
        f"`pattern` {pattern!r} together with minLength/maxLength: no regex bound (its "
        "variable-width parts are not one repeated character)"
    )


def json_string_pattern(pattern: str, *, min_length: int = 0, max_length: int | None = None) -> str:
    """A regex over the JSON text between the quotes of a string whose decoded value matches
    `pattern` as a whole (see the module docstring for what is kept out) and has between
    `min_length` and `max_length` characters (JSON Schema's `minLength`/`maxLength`, counted in
    decoded characters). The bounds are written into the regex where that is exact and
    compact (`_bound_lengths`): when the pattern's own lengths lie within them, or when, after
    distributing its fixed-width alternations, each alternative's one variable-width part is a
    repeated single character (`^(png|jpeg):[a-z]*$` with maxLength 10 is
    `png:[a-z]{0,6}|jpeg:[a-z]{0,5}`).

    **Raises:** `LengthBoundError` (a `ValueError`) when the bounds cannot be written into the
    regex that way (`length_bounded_dfa` intersects the automata instead); `ValueError` naming
    the pattern for invalid syntax, flags, anchors inside the pattern, look-around,
    backreferences, a class that matches no character, a bounded repeat over
    `MAX_COUNTED_REPEAT`, or an empty intersection.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"`pattern` must be a string, got {pattern!r}")
    try:
        parsed = sre.parse(pattern)
    except re.error as e:
        raise ValueError(f"`pattern` {pattern!r} is not a valid regex: {e}") from None
    if parsed.state.flags & (re.IGNORECASE | re.VERBOSE):
        _Translator(pattern).fail("an inline flag (?i) or (?x)")
    translator = _Translator(pattern)
    items = list(parsed)
    branches = (
        [list(b) for b in items[0][1][1]]
        if len(items) == 1 and items[0][0] is C.BRANCH
        else [items]
    )
    branches = [a for b in branches for a in _alternatives(b)]
    out = []
    anything = (C.MAX_REPEAT, (0, C.MAXREPEAT, sre.SubPattern(sre.State(), [(C.ANY, None)])))
    bounds = min_length > 0 or max_length is not None
    groups: dict[tuple[bool, bool], list[str]] = {}
    for branch in branches:
        starts, ends = _starts(branch), _ends(branch)
        branch = _strip_anchors(branch)
        if not bounds:
            groups.setdefault((starts, ends), []).append(translator.sequence(branch, top=False))
            continue
        # ECMA-262 / jsonschema semantics: the pattern is searched for, so an unanchored side
        # may have any text (no control characters, see the module docstring) before or after it.
        branch = ([] if starts else [anything]) + branch + ([] if ends else [anything])
        bounded = _bound_lengths(branch, min_length, max_length, pattern)
        out += [translator.sequence(b, top=False) for b in bounded]
    # Without bounds, the alternatives anchored alike share one `.*` on each open side:
    # `.*(?:a|b|c).*`, not `.*a.*|.*b.*|.*c.*`, whose DFA tracks which of the alternatives
    # have matched so far, doubling its states with each one (2^11 x the words, o47657).
    text = translator.sequence([anything], top=False) if groups else ""
    for (starts, ends), alternatives in groups.items():
        inner = "|".join(alternatives)
        if len(alternatives) > 1 or not (starts and ends):
            inner = f"(?:{inner})"
        out.append(("" if starts else text) + inner + ("" if ends else text))
    if not out:
        raise NoStringError(f"no string matches `pattern` {pattern!r} within the length bounds")
    return out[0] if len(out) == 1 else "(?:" + "|".join(out) + ")"


def bounded_length(regex: str, min_length: int, max_length: int | None) -> str | None:
    """`regex` (a Python-compatible regex of a string body) when all its matches already have
    `min_length..max_length` characters, else `None` (the bounds cannot be added)."""
    lo, hi = sre.parse(regex).getwidth()
    if lo >= min_length and (max_length is None or hi <= max_length):
        return regex
    return None


# ----------------------------------------------------------------------------- length x DFA

_LEXER_STATES = 7
"""States of the JSON string body lexer of `length_bounded_dfa`: 0 a character may start, 1
after a backslash, 2 after `\\u`, 3 after `\\ud` (a surrogate escape if the next digit is
8-f), 4-6 before the second, third, fourth hex digit."""


def _body_lexer():
    """`(next, counts)`, both `[_LEXER_STATES, 256]`: the lexer's next state per byte (-1: a
    byte a JSON string body cannot have there), and 1 where the byte starts a decoded character
    (a UTF-8 lead byte or an ASCII byte outside an escape, and the backslash of an escape), else
    0 (UTF-8 continuation bytes, the rest of an escape). Escapes of UTF-16 surrogates
    (`\\ud800`-`\\udfff`) are refused (-1): none of the regexes here writes them (a pair would
    be one character), so the intersection is unchanged."""
    nxt = np.full((_LEXER_STATES, 256), -1, np.int64)
    counts = np.zeros((_LEXER_STATES, 256), np.int64)
    nxt[0, :], counts[0, :] = 0, 1
    counts[0, 0x80:0xC0] = 0  # UTF-8 continuation bytes
    nxt[0, ord("\\")] = 1
    nxt[1, :] = 0  # `\\"`, `\\n`, ... (the body DFA allows only the valid ones)
    nxt[1, ord("u")] = 2
    for h in b"0123456789abcdefABCDEF":
        nxt[2, h] = 3 if h in b"dD" else 4
        nxt[4, h], nxt[5, h], nxt[6, h] = 5, 6, 0
    for h in b"01234567":
        nxt[3, h] = 5
    return nxt, counts


def _count_levels(dfa, lexer_next, lexer_counts, top: int, saturate: bool) -> list[np.ndarray]:
    """The reachable (body state, lexer state) pairs of `length_bounded_dfa`'s product at each
    character count `0..top`, coded `q * _LEXER_STATES + lex`, sorted: `levels[c]`. A count is
    entered by the bytes that start a character and closed under those that do not; with
    `saturate`, the count stops at `top` (no upper bound), so the last level is also closed under
    new characters. The pairs entering count `c + 1` depend only on those entering `c`: once two
    counts in a row are entered by the same pairs, every count up to `top - 1` repeats that level,
    so a counter of thousands costs a few levels, not one numpy pass per counted character."""

    pairs = dfa.num_states * _LEXER_STATES

    @typing.no_type_check
    def level(entry, saturated: bool, last: bool):
        inside = np.zeros(pairs, bool)
        inside[entry] = True
        frontier, following = entry, []
        while frontier.size:
            lex, q = frontier % _LEXER_STATES, frontier // _LEXER_STATES
            nq, nlex = dfa.delta[q], lexer_next[lex]
            ok = (nq != REJECT) & (nlex >= 0)
            target = np.maximum(nq, 0) * _LEXER_STATES + np.maximum(nlex, 0)
            starts = lexer_counts[lex] == 1
            stay = ok & (saturated | ~starts)
            fresh = np.unique(target[stay])
            fresh = fresh[~inside[fresh]]
            inside[fresh] = True
            if not (saturated or last):
                following.append(target[ok & starts])
            frontier = fresh
        nxt = np.unique(np.concatenate(following)) if following else np.zeros(0, np.int64)
        return np.flatnonzero(inside), nxt

    levels: list[np.ndarray] = []
    entry, previous = np.array([dfa.initial * _LEXER_STATES], np.int64), None
    count = 0
    while count <= top and entry.size:
        saturated, last = saturate and count == top, count == top
        if not last and previous is not None and np.array_equal(entry, previous):
            levels += [levels[-1]] * (top - count)  # a fixed point: the same pairs up to top - 1
            count = top
            continue
        members, following = level(entry, saturated, last)
        levels.append(members)
        previous, entry = entry, following
        count += 1
    return levels


def length_bounded_dfa(body, min_length: int, max_length: int | None, *, max_states: int):
    """A trimmed (not minimised) byte DFA of the JSON string bodies (the text between the
    quotes) that match the regex `body` (Rust `regex` syntax, a whole-text match, as `json_string_pattern` and
    `formats.FORMATS` write them; or a `ByteDFA` of such bodies) and decode to `min_length..max_length` characters
    (`max_length=None`: no upper bound): the product of `body`'s byte DFA with a lexer of the
    body (`_body_lexer`: a UTF-8 lead byte or a whole escape, `\\n` or `\\u00e9`, is one
    character, as `jsonschema` counts `len` of the decoded string) and a character counter that
    stops at `max_length + 1` (or, without an upper bound, saturates at `min_length`); only the
    reachable triples are built (by breadth-first layers in numpy), then trimmed.

    The language is exact; the DFA has about as many states as the bound times the body's
    states where the bound is not implied (e.g. 437 for `^[a-zA-Z0-9-]+(\\s[a-zA-Z0-9-]+)*$`
    with maxLength 64; 18,225 for `format: email` with maxLength 1,024).

    **Raises:** `ValueError` naming the sizes when the product has more than `4 * max_states`
    reachable states or its minimal DFA more than `max_states`; `ConstraintError` (from
    `byte_dfa`) when no body has the lengths (the language is empty) or `body` does not
    compile.

    Memoised for regex bodies (the last `_LENGTH_BOUNDED_MEMO` automata): a schema whose
    pushdown form is refused is rewritten again for the token automaton, with the same strings
    (MaskBench o82710: `maxLength` 5,000, 1.1 s a build).
    """
    key = (body, min_length, max_length, max_states) if isinstance(body, str) else None
    if key in _LENGTH_BOUNDED:
        return _LENGTH_BOUNDED[key]
    product = _length_bounded_dfa(body, min_length, max_length, max_states=max_states)
    if key is not None:
        if len(_LENGTH_BOUNDED) >= _LENGTH_BOUNDED_MEMO:
            _LENGTH_BOUNDED.pop(next(iter(_LENGTH_BOUNDED)))
        _LENGTH_BOUNDED[key] = product
    return product


_LENGTH_BOUNDED: dict = {}
_LENGTH_BOUNDED_MEMO = 16


def _length_bounded_dfa(body, min_length: int, max_length: int | None, *, max_states: int):
    """`length_bounded_dfa` without the memo."""

    if min_length < 0 or (max_length is not None and max_length < min_length):
        raise ValueError(f"bad string lengths: minLength {min_length}, maxLength {max_length}")
    top = min_length if max_length is None else max_length  # highest count kept
    if top > MAX_COUNTED_REPEAT:
        raise ValueError(
            f"the strings of {body[:60]!r} with minLength {min_length} / maxLength {max_length}: "
            f"an automaton counting to {top:,} characters (the limit is {MAX_COUNTED_REPEAT:,})"
        )
    if isinstance(body, ByteDFA):
        dfa, body = minimize(body), "(a string automaton)"
    else:
        dfa = minimize(regex_byte_dfa(body))
    lexer_next, lexer_counts = _body_lexer()
    # Bytes that the body DFA and the lexer treat alike are one column (about 20 of 256 for a
    # plain string body): the product is built over those classes and widened at the end
    # (maxLength 5,000: 1.7 -> 0.3 s).

    _, byte_class = unique_columns(np.concatenate([dfa.delta, lexer_next, lexer_counts]))
    first_byte = np.zeros(int(byte_class.max()) + 1, np.int64)
    first_byte[byte_class[::-1]] = np.arange(255, -1, -1)
    dfa = ByteDFA(dfa.delta[:, first_byte], dfa.accepting, dfa.initial)
    lexer_next, lexer_counts = lexer_next[:, first_byte], lexer_counts[:, first_byte]
    width = top + 1

    @typing.no_type_check
    def encode(q, lex, count):
        return (q * _LEXER_STATES + lex) * width + count

    @typing.no_type_check
    def successors(ids):
        count, rest = ids % width, ids // width
        lex, q = rest % _LEXER_STATES, rest // _LEXER_STATES
        nq, nlex = dfa.delta[q], lexer_next[lex]
        ncount = count[:, None] + lexer_counts[lex]
        if max_length is None:
            ncount = np.minimum(ncount, min_length)
        ok = (nq != REJECT) & (nlex >= 0) & (ncount <= top)
        target = encode(np.maximum(nq, 0), np.maximum(nlex, 0), ncount)
        return ok, target, q, lex, count

    start = encode(dfa.initial, 0, 0)
    budget = 4 * max_states
    levels = _count_levels(dfa, lexer_next, lexer_counts, top, max_length is None)
    sizes = np.array([level.size for level in levels], np.int64)
    if sizes.sum() > budget:
        raise ValueError(
            f"the strings of {body[:60]!r} with minLength {min_length} / maxLength "
            f"{max_length} need an automaton of over {budget:,} states before minimisation "
            f"(the body alone has {dfa.num_states}; the limit is {max_states:,})"
        )
    states = np.sort(np.concatenate(levels) * width + np.repeat(np.arange(len(levels)), sizes))
    ok, target, q, lex, count = successors(states)
    if dfa.num_states * _LEXER_STATES * width <= 2**24:  # ids are dense enough for a table
        index = np.zeros(dfa.num_states * _LEXER_STATES * width, np.int64)
        index[states] = np.arange(states.size)
        delta = np.where(ok, index[np.where(ok, target, start)], REJECT)
    else:
        delta = np.where(ok, np.searchsorted(states, np.where(ok, target, start)), REJECT)
    accepting = dfa.accepting[q] & (lex == 0) & (count >= min_length)
    # Trimmed, not minimised: the product of the minimal body DFA with the lexer and the counter
    # has few equivalent states (18,309 reachable against 18,225 minimal for `format: email`
    # with maxLength 1,024), and Moore's refinement takes one round per counted character.
    delta = delta.astype(np.int32)[:, byte_class]  # the classes' columns back to 256 bytes
    product = trim(ByteDFA(delta, accepting, int(np.searchsorted(states, start))))
    if product.num_states > max_states:
        raise ValueError(
            f"the strings of {body[:60]!r} with minLength {min_length} / maxLength {max_length} "
            f"need an automaton of {product.num_states:,} states (the body alone has "
            f"{dfa.num_states}; the limit is {max_states:,})"
        )
    return product


def difference_dfas(a, b, *, max_states: int):
    """The trimmed byte DFA of the texts that byte DFA `a` accepts and `b` does not: the product
    of `a` with `b`'s complement (`b` completed with a rejecting sink, its accepting states
    flipped; `intersect_dfas`).

    **Raises:** as `intersect_dfas`: `ValueError` beyond `max_states` reachable pairs,
    `ConstraintError` when every text of `a` is also in `b`.
    """

    sink = b.num_states
    delta = np.full((sink + 1, b.delta.shape[1]), sink, np.int32)
    delta[:sink] = np.where(b.delta != REJECT, b.delta, sink)
    accepting = np.append(~b.accepting, True)
    return intersect_dfas(a, ByteDFA(delta, accepting, b.initial), max_states=max_states)


class RegexTooLargeError(ValueError):
    """`dfa_regex` would write more characters than its limit."""


def dfa_regex(dfa, *, max_chars: int) -> str:
    """A regex (Rust `regex` syntax, as outlines-core reads it; Python's `re` reads it too) of
    the language of a trimmed byte DFA of UTF-8 text: state elimination (Brzozowski &
    McCluskey 1963) over the states between whole characters (`codepoint_edges`), the state
    with the fewest paths through it first, each edge a character class of code points
    (`\\xHH`, `\\uHHHH`, `\\UHHHHHHHH` escapes). The language is exact; the regex is not minimal.

    **Raises:** `ValueError` for a DFA that reads a byte where no UTF-8 character starts it;
    `RegexTooLargeError` (a `ValueError`) when the regex, or any edge during the elimination,
    would exceed `max_chars` characters (a DFA of a few dozen states can need an exponentially
    long regex).
    """

    edges = codepoint_edges(dfa)
    states = sorted(edges)
    index = {q: k for k, q in enumerate(states)}
    n = len(states)
    start, end = n, n + 1
    out: dict[int, dict[int, str]] = {q: {} for q in range(n + 2)}
    into: dict[int, set[int]] = {q: set() for q in range(n + 2)}

    @typing.no_type_check
    def escaped(c: int) -> str:
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"

    @typing.no_type_check
    def klass(ranges) -> str:
        runs = [escaped(lo) + ("" if hi == lo else "-" + escaped(hi)) for lo, hi in ranges]
        return runs[0] if len(runs) == 1 and ranges[0][0] == ranges[0][1] else f"[{''.join(runs)}]"

    @typing.no_type_check
    def add(p: int, q: int, regex: str) -> None:
        old = out[p].get(q)
        out[p][q] = regex if old is None else f"(?:{old}|{regex})"
        into[q].add(p)
        if len(out[p][q]) > max_chars:
            raise RegexTooLargeError(f"the regex would exceed {max_chars:,} characters")

    for q in states:
        for t, ranges in sorted(edges[q].items()):
            add(index[q], index[t], klass(ranges))
        if dfa.accepting[q]:
            add(index[q], end, "")
    add(start, index[dfa.initial], "")
    remaining = set(range(n))
    while remaining:
        k = min(
            remaining, key=lambda s: (len(into[s]) - (s in into[s])) * (len(out[s]) - (s in out[s]))
        )
        remaining.discard(k)
        loop = out[k].pop(k, None)
        into[k].discard(k)
        middle = "" if loop is None else f"(?:{loop})*"
        for p in into.pop(k):
            head = out[p].pop(k)
            for q, tail in out[k].items():
                add(p, q, head + middle + tail)
        for q in out.pop(k):
            into[q].discard(k)
    return out[start].get(end, "")
