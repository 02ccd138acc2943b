"""Object keys as regexes: a listed key (`literal_key`), any key but the listed ones
(`key_not_in`, memoised), the keys a `propertyNames` or `patternProperties` pattern leaves
(`unmatched_keys`, `name_checker`), and whether key regexes overlap (`overlap`).
"""

import functools
import json
import re
import typing

import numpy as np

from ..automaton import ConstraintError
from ..byte_dfa import REJECT, ByteDFA, minimize, regex_byte_dfa, trim
from ..patterns import class_char, dfa_regex, difference_dfas, intersect_dfas
from ..regex_syntax import escape
from .budgets import MAX_KEY_REGEX, MAX_KEY_REGEX_STATES, MAX_KEY_STATES
from .errors import KeysTooComplex
from .references import NEVER

KEY_UNIT = r'(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\bfnrt])'
"""One character of a generated additional key: a plain character or one of the short JSON
escapes (no `\\/`, no `\\u`), so every key has exactly one spelling."""


def literal_key(name: str) -> str:
    """The regex of the JSON text of a literal key (quotes included)."""

    return escape(json.dumps(name, ensure_ascii=False))


def key_units(name: str) -> list[str]:
    """The JSON text of a key's body as spelled units (a character or a short escape)."""
    body = json.dumps(name, ensure_ascii=False)[1:-1]
    units, i = [], 0
    while i < len(body):
        if body[i] == "\\":
            step = 6 if body[i + 1] == "u" else 2
            units.append(body[i : i + step])
            i += step
        else:
            units.append(body[i])
            i += 1
    return units


def ascii_class(codes: list[int]) -> str:
    """A regex character class of printable ASCII `codes` (sorted), as ranges."""
    parts, i = [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        lo, hi = class_char(codes[i]), class_char(codes[j])
        parts.append(lo if i == j else f"{lo}{hi}" if j == i + 1 else f"{lo}-{hi}")
        i = j + 1
    return f"[{''.join(parts)}]"


PLAIN_KEY_CODES = [c for c in range(0x20, 0x7F) if c not in (ord('"'), ord("\\"))]
"""The printable ASCII characters a key spells as themselves (not `"` or `\\`)."""


PLAIN_KEY = ascii_class(PLAIN_KEY_CODES)


OTHER_KEY_UNIT = r'(?:[^\x00-\x9F]|\\["\\bfnrt])'
"""A unit of `KEY_UNIT` that is not a plain ASCII character: U+00A0 and above, or an escape."""


def key_not_in(names: list[str]) -> str:
    """The regex of a JSON string body that is none of `names`, in units of `KEY_UNIT`
    (memoised by the names in order: MaskBench kb_1161's `$ref` expansion writes 12,725 open
    objects from a few hundred distinct property lists, 5 s of this function without it).

    When every name is plain printable ASCII (almost all keys): a body that holds any other
    unit is none of them, and an ASCII one leaves the names' trie either by a character no
    name continues with (then any ASCII) or by ending at a node that is no name. Written as
    `diverged [ASCII]* | non-name prefix | [ASCII]* other-unit unit*`, the three tails are
    shared, so the automaton has about two states per trie node. (The general form below
    repeats a tail of any units at every node: for the 108 keys of MaskBench o61596 a
    141,000-character regex whose automaton has 37,000 states before minimisation, 2.5 s;
    this form takes about a tenth of that.)"""
    return key_not_in_memo(tuple(names))


@functools.lru_cache(maxsize=4096)
def key_not_in_memo(names: tuple[str, ...]) -> str:
    """`key_not_in`, memoised."""

    if all(c in PLAIN_KEY_CODES for name in names for c in map(ord, name)):
        trie: dict = {}
        for name in names:
            node = trie
            for ch in name:
                node = node.setdefault(ch, {})
            node[None] = {}

        @typing.no_type_check
        def diverged(node) -> str:  # a path of the trie, then a character that leaves it
            others = [c for c in PLAIN_KEY_CODES if chr(c) not in node]
            alternatives = [ascii_class(others)] if others else []
            alternatives += [escape(ch) + diverged(child) for ch, child in node.items() if ch]
            return "(?:" + "|".join(alternatives) + ")"  # never empty: a leaf has `others`

        @typing.no_type_check
        def prefix(node) -> str | None:  # a path of the trie that ends at no name
            alternatives = [] if None in node else [""]
            for ch, child in node.items():
                if ch is not None and (rest := prefix(child)) is not None:
                    alternatives.append(escape(ch) + rest)
            if not alternatives:
                return None
            if alternatives == [""]:
                return ""
            body = "|".join(a for a in alternatives if a)
            return f"(?:{body})" + ("?" if "" in alternatives else "")

        short = prefix(trie)
        parts = [f"{diverged(trie)}{PLAIN_KEY}*"]
        if short is not None:
            parts.append(short)
        parts.append(f"{PLAIN_KEY}*{OTHER_KEY_UNIT}{KEY_UNIT}*")
        return "(?:" + "|".join(parts) + ")"
    return key_not_in_units(list(names))


def key_not_in_units(names: list[str]) -> str:
    """`key_not_in` for any names: a trie of the names' units, leaving it at any point."""

    trie: dict = {}
    for name in names:
        node = trie
        for unit in key_units(name):
            node = node.setdefault(unit, {})
        node[None] = {}

    @typing.no_type_check
    def other_than(children) -> str:
        chars = [u for u in children if u is not None and len(u) == 1]
        escapes = [u[1] for u in children if u is not None and len(u) == 2]
        plain = "".join("\\" + c if c in "\\]^-[&~" else c for c in chars)
        parts = [rf'[^"\\\x00-\x1F\x7F-\x9F{plain}]']
        left = [e for e in '"\\bfnrt' if e not in escapes]
        if left:
            parts.append("\\\\[" + "".join("\\" + e if e in "\\]^-[" else e for e in left) + "]")
        return "(?:" + "|".join(parts) + ")"

    @typing.no_type_check
    def walk(node) -> str:
        alternatives = [other_than(node) + KEY_UNIT + "*"]
        for unit, child in node.items():
            if unit is not None:
                alternatives.append(escape(unit) + walk(child))
        body = "(?:" + "|".join(alternatives) + ")"
        return body if None in node else body + "?"

    return walk(trie)


KEY_ALPHABET = r"[\x20\x21\x23-\x5b\x5d-\x7e]"
"""The characters of a key that `patternProperties` leaves to `additionalProperties`
(`unmatched_keys`): printable ASCII but `"` and `\\`, on which `json_string_pattern` is exact
(its `\\w`, `.`, `[^...]` differ from Python's only on control and non-ASCII characters)."""


@functools.lru_cache(maxsize=256)
def unmatched_keys(
    bodies: tuple[str, ...], names: tuple[str, ...], within: str | None = None
) -> str | None:
    """The regex of the JSON text between the quotes of a key of `KEY_ALPHABET` characters
    (that the regex `within` matches, if given) that none of the regexes `bodies` (key bodies:
    `json_string_pattern` of each `patternProperties` pattern) matches and that is none of
    `names`: the byte DFA of `KEY_ALPHABET*` (times `within`'s, `patterns.intersect_dfas`)
    minus each (`patterns.difference_dfas`), minimised, written back as a regex
    (`patterns.dfa_regex`). `None` when there is no such key.

    **Raises:** `KeysTooComplex` when an automaton exceeds `MAX_KEY_STATES` states or the
    regex `MAX_KEY_REGEX` characters (MaskBench's BCP 47 language-tag patterns)."""
    plain = [n for n in names if re.fullmatch(f"{KEY_ALPHABET}*", n)]
    excluded = [regex_byte_dfa(body) for body in bodies]
    named = "|".join("".join(f"\\x{ord(c):02x}" for c in n) for n in plain)
    error = None
    for depth in (None, *KEY_PREFIX_DEPTHS):
        dfa = regex_byte_dfa(f"{KEY_ALPHABET}*")
        try:
            if within is not None:
                dfa = intersect_dfas(dfa, regex_byte_dfa(within), max_states=MAX_KEY_STATES)
            for body in excluded:
                wider = body if depth is None else prefix_closure(body, depth)
                dfa = difference_dfas(dfa, wider, max_states=MAX_KEY_STATES)
            if named:
                dfa = difference_dfas(dfa, regex_byte_dfa(named), max_states=MAX_KEY_STATES)
            dfa = minimize(dfa)
            if dfa.num_states > MAX_KEY_REGEX_STATES:  # elimination is quadratic in states
                raise ValueError(f"{dfa.num_states:,} states to write as a regex")
            return dfa_regex(dfa, max_chars=MAX_KEY_REGEX)
        except ConstraintError:  # the language is empty
            return None
        except ValueError as e:
            error = error or e
    raise KeysTooComplex(str(error))


KEY_PREFIX_DEPTHS = (16, 8, 4, 2, 1)
"""Prefix lengths `unmatched_keys` tries, longest first, when the exact set of keys no pattern
matches is too complex to write: each pattern is widened to the keys whose first `depth`
characters start one of its keys (`prefix_closure`), so fewer keys are left to
`additionalProperties` (never one a pattern matches). MaskBench's BCP 47 language-tag patterns
(`^(description_(...))$`) leave the keys that do not start with `description_`."""


def prefix_closure(dfa: ByteDFA, depth: int) -> ByteDFA:
    """A byte DFA of the texts `dfa` accepts and of every text whose first `depth` bytes some
    text of `dfa` starts with (a superset of `dfa`'s language; `dfa` trimmed): `dfa`'s states
    counted up to `depth` bytes, then one state that accepts everything."""
    n, width = dfa.num_states, dfa.delta.shape[1]
    everything = n * depth
    delta = np.full((everything + 1, width), everything, np.int32)
    level = np.arange(n * depth) // n
    state = np.arange(n * depth) % n
    target = dfa.delta[state]
    inner = np.where(level[:, None] + 1 < depth, (level[:, None] + 1) * n + target, everything)
    delta[:everything] = np.where(target != REJECT, inner, REJECT)
    accepting = np.append(dfa.accepting[state], True)
    return trim(ByteDFA(delta, accepting, dfa.initial))


def name_checker(schema, substitute):
    """A function telling whether a property name satisfies a (rewritten) `propertyNames` schema,
    or `None` when its regex cannot be built. `substitute` expands the rewriter's markers (a
    `pattern` or `format` of the names is a marker, whose placeholder alone matches no name)."""
    if schema is NEVER:
        return lambda name: False
    try:
        # deferred on purpose: the Rust extension loads only when a regex compiles
        from outlines_core.json_schema import build_regex_from_schema

        regex = re.compile(substitute(build_regex_from_schema(json.dumps(schema))))
    except (ValueError, RuntimeError, re.error, ConstraintError):
        return None
    return lambda name: bool(regex.fullmatch(json.dumps(name, ensure_ascii=False)))


def overlap(regexes: list[str]) -> bool:
    """Whether two of the regexes can match one text (product of their byte DFAs)."""

    dfas = [regex_byte_dfa(r) for r in regexes]
    for i in range(len(dfas)):
        for j in range(i + 1, len(dfas)):
            a, b = dfas[i], dfas[j]
            seen, frontier = {(a.initial, b.initial)}, [(a.initial, b.initial)]
            while frontier:
                x, y = frontier.pop()
                if a.accepting[x] and b.accepting[y]:
                    return True
                both = (a.delta[x] != REJECT) & (b.delta[y] != REJECT)
                for byte in map(int, both.nonzero()[0]):
                    pair = (int(a.delta[x, byte]), int(b.delta[y, byte]))
                    if pair not in seen:
                        seen.add(pair)
                        frontier.append(pair)
    return False
