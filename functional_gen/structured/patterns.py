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


def _normalize(ranges):
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges, universe):
    out, ranges = [], _normalize(ranges)
    for ulo, uhi in _normalize(universe):
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
    for alo, ahi in _normalize(a):
        for blo, bhi in _normalize(b):
            lo, hi = max(alo, blo), min(ahi, bhi)
            if lo <= hi:
                out.append((lo, hi))
    return _normalize(out)


def _class_char(cp: int) -> str:
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
        ranges = _complement([(0x00, 0x1F), (0x7F, 0x9F)], _normalize(ranges))
        ranges = _intersect(ranges, [(0, _MAX_CODE_POINT)])
    ranges = _complement(_SURROGATES, _normalize(ranges))  # no surrogates in UTF-8
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
                _class_char(lo) if lo == hi else f"{_class_char(lo)}-{_class_char(hi)}"
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
        return _normalize(ranges), negated_category


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


def _bound_lengths(items, min_length: int, max_length: int | None, pattern: str):
    """`items` (one top-level sequence, anchors stripped) restricted to strings of
    `min_length..max_length` characters, by changing the bounds of its one variable-width
    repeat of a single character; `None` when the language is empty.

    **Raises:** `ValueError` when the sequence has another shape.
    """
    limit = C.MAXREPEAT if max_length is None else max_length
    lo, hi = _width(items)
    if lo >= min_length and (max_length is None or hi <= max_length):
        return items
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
            return [*items[:i], (op, (new_lo, new_hi, av[2])), *items[i + 1 :]]
    raise ValueError(
        f"`pattern` {pattern!r} together with minLength/maxLength: only a pattern with one repeated "
        "character class (e.g. `^[a-z]+$`) can be bounded"
    )


def json_string_pattern(pattern: str, *, min_length: int = 0, max_length: int | None = None) -> str:
    """A regex over the JSON text between the quotes of a string whose decoded value matches
    `pattern` as a whole (see the module docstring for what is kept out) and has between
    `min_length` and `max_length` characters (JSON Schema's `minLength`/`maxLength`; the
    intersection is exact when the pattern's own lengths lie within the bounds or when its one
    variable-width part is a repeated single character).

    **Raises:** `ValueError` naming the pattern for invalid syntax, flags, anchors inside the
    pattern, look-around, backreferences, a class that matches no character, length bounds
    that cannot be intersected with it, or an empty intersection.
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
    anything = (C.MAX_REPEAT, (0, C.MAXREPEAT, [(C.ANY, None)]))
    for branch in branches:
        starts, ends = _starts(branch), _ends(branch)
        branch = _strip_anchors(branch)
        # ECMA-262 / jsonschema semantics: the pattern is searched for, so an unanchored side
        # may have any text (no control characters, see the module docstring) before or after it.
        branch = ([] if starts else [anything]) + branch + ([] if ends else [anything])
        if min_length or max_length is not None:
            branch = _bound_lengths(branch, min_length, max_length, pattern)
            if branch is None:
                continue
        out.append(translator.sequence(branch, top=False))
    if not out:
        raise ValueError(f"no string matches `pattern` {pattern!r} within the length bounds")
    return out[0] if len(out) == 1 else "(?:" + "|".join(out) + ")"


def bounded_length(regex: str, min_length: int, max_length: int | None) -> str | None:
    """`regex` (a Python-compatible regex of a string body) when all its matches already have
    `min_length..max_length` characters, else `None` (the bounds cannot be added)."""
    lo, hi = sre.parse(regex).getwidth()
    if lo >= min_length and (max_length is None or hi <= max_length):
        return regex
    return None
