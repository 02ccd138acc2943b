"""Operations on byte DFAs beside those of `patterns` (difference, lengths): the texts that
exactly one of several automata accepts (`exactly_one_dfa`, what exact `oneOf` needs), the
canonical spellings of JSON text (`canonical_json_dfa`), the spaced texts of compact ones
(`spaced_json_dfa`), the intersection of two (`intersect_dfas`, re-exported by `patterns`),
and a DFA's edges read as Unicode code points (`codepoint_edges`, so that
`patterns.dfa_regex` can write UTF-8 automata).
"""

import functools
import math
from collections.abc import Sequence

import numpy as np

from .automaton import ConstraintError
from .byte_dfa import REJECT, ByteDFA, minimize, regex_byte_dfa, trim


def exactly_one_dfa(dfas: Sequence[ByteDFA], *, max_states: int) -> ByteDFA:
    """The trimmed byte DFA of the texts that exactly one of `dfas` accepts: the union of the
    automata minus their pairwise intersections, as one product automaton whose states are
    tuples of the components' states (each component completed with a rejecting sink, so
    that a component that rejects a prefix goes on rejecting while the others read), built in
    breadth-first layers over the reachable tuples; a tuple accepts when exactly one of its
    components does.

    **Arguments:** `dfas`: two or more byte DFAs over the same symbols (256 bytes);
    `max_states`: the most reachable tuples built.

    **Raises:** `ValueError` naming the sizes when more than `max_states` tuples are
    reachable (or the tuple numbering would overflow 62 bits); `ConstraintError` when no text
    is accepted by exactly one of them.

    Source: the product construction of finite automata (Rabin & Scott 1959, "Finite automata
    and their decision problems"), with a counting acceptance condition.
    """
    if len(dfas) < 2:
        raise ValueError(f"exactly_one_dfa needs two or more automata, got {len(dfas)}")
    deltas, accepting = [], []
    for dfa in dfas:
        sink = dfa.num_states
        delta = np.full((sink + 1, dfa.delta.shape[1]), sink, np.int64)
        delta[:sink] = np.where(dfa.delta != REJECT, dfa.delta, sink)
        deltas.append(delta)
        accepting.append(np.append(dfa.accepting, False))
    radix = [d.shape[0] for d in deltas]
    if math.prod(radix) >= 2**62:
        raise ValueError(
            f"the product of {len(dfas)} automata of {[r - 1 for r in radix]} states is too large"
        )
    strides = [math.prod(radix[i + 1 :]) for i in range(len(radix))]
    sinks = [r - 1 for r in radix]

    def parts(codes):
        return [(codes // s) % r for s, r in zip(strides, radix)]

    def successors(codes):
        nexts = [d[p] for d, p in zip(deltas, parts(codes))]
        dead = np.logical_and.reduce([n == s for n, s in zip(nexts, sinks)])
        return dead, sum(n * s for n, s in zip(nexts, strides))

    start = sum(dfa.initial * s for dfa, s in zip(dfas, strides))
    product = product_dfa(
        start,
        successors,
        lambda states: sum(a[p].astype(np.int64) for a, p in zip(accepting, parts(states))) == 1,
        max_states=max_states,
        what=f"the texts that exactly one of {len(dfas)} automata "
        f"({', '.join(str(d.num_states) for d in dfas)} states) accepts",
    )
    if not product.accepting.any():
        raise ConstraintError("no text is accepted by exactly one of the automata")
    return trim(product)


def intersect_dfas(a, b, *, max_states: int):
    """The trimmed byte DFA of the texts both byte DFAs `a` and `b` accept (the product of their
    reachable state pairs, built in breadth-first layers).

    **Raises:** `ValueError` naming the size when the product has more than `max_states`
    reachable pairs; `ConstraintError` when no text is accepted by both.

    Source: the product construction of finite automata (Rabin & Scott 1959, "Finite automata
    and their decision problems").
    """

    width = b.num_states
    start = a.initial * width + b.initial

    def successors(codes):
        na, nb = a.delta[codes // width], b.delta[codes % width]
        ok = (na != REJECT) & (nb != REJECT)
        return ~ok, na * width + nb

    return trim(
        product_dfa(
            start,
            successors,
            lambda states: a.accepting[states // width] & b.accepting[states % width],
            max_states=max_states,
            what=f"the intersection of two string automata ({a.num_states} and {b.num_states} "
            "states)",
        )
    )


def product_dfa(start: int, successors, accepting, *, max_states: int, what: str) -> ByteDFA:
    """The byte DFA of a product automaton's states reachable from `start` (`reachable_codes`,
    with `successors` as there), numbered in sorted order; `accepting(codes)` says which codes
    accept. Not trimmed.

    **Raises:** `ValueError` saying that `what` needs over `max_states` states."""
    states = reachable_codes(start, successors, max_states=max_states, what=what)
    dead, target = successors(states)
    delta = np.where(dead, REJECT, np.searchsorted(states, np.where(dead, start, target)))
    return ByteDFA(delta.astype(np.int32), accepting(states), int(np.searchsorted(states, start)))


def reachable_codes(start: int, successors, *, max_states: int, what: str) -> np.ndarray:
    """The sorted numbers of the product states reachable from `start`, in breadth-first
    layers: `successors(codes)` gives, per code and symbol, `(dead, target)` (`dead`: no
    state there; `target`: the next code).

    **Raises:** `ValueError` saying that `what` needs over `max_states` states."""
    seen = {start}
    layers, frontier = [np.array([start], np.int64)], np.array([start], np.int64)
    while frontier.size:
        dead, target = successors(frontier)
        fresh = np.unique(target[~dead])
        fresh = fresh[[int(x) not in seen for x in fresh]] if fresh.size else fresh
        seen.update(map(int, fresh))
        if len(seen) > max_states:
            raise ValueError(f"{what} need(s) over {max_states:,} product states")
        layers.append(fresh)
        frontier = fresh
    return np.sort(np.concatenate(layers))


@functools.cache
def canonical_json_dfa() -> ByteDFA:
    """The byte DFA of the texts whose strings and numbers are spelled canonically, whatever
    else they hold (any byte outside strings and numbers is free): every JSON value then has
    one spelling up to whitespace and property order, so two automata that agree on a value's
    canonical text agree on the value. Canonical as `json.dumps(ensure_ascii=False)` writes:

    - in a string, an escape is `\\"`, `\\\\`, `\\b`, `\\f`, `\\n`, `\\r`, `\\t`, or `\\u00XX`
      (lowercase hex) for the other control characters only (not `\\/`, not a `\\u` of a
      printable character);
    - a number has no exponent, no fraction whose last digit is 0 (`5.0`, `5.10`), and is not
      `-0` (`-0.5` is): an integral value is then exactly a number without a fraction, as
      `jsonschema` judges `integer`.

    A number is a `-` or digit read outside a string; it ends at the first other byte. (JSON
    grammar is not checked: the automata it is intersected with do that.)
    """
    # states: 0 outside; 1 in a string; 2 after a backslash; 3, 4 after `\u`, `\u0`;
    # 5 after `\u00`; 6 after `\u000` (the last digit may not be a short escape's);
    # 7 after `\u001`; 8 after `-`; 9 after `-0` (needs a fraction); 10 in the integer
    # digits (or `0`); 11 after `.` or a fraction's 0 (may not end); 12 after a fraction's
    # non-zero digit (may end)
    delta = np.full((13, 256), REJECT, np.int32)
    digits, nonzero = np.arange(0x30, 0x3A), np.arange(0x31, 0x3A)
    hexes = [*range(0x30, 0x3A), *range(0x61, 0x67)]  # lowercase
    outside = np.zeros(256, np.int32)
    outside[ord('"')] = 1
    outside[ord("-")] = 8
    outside[digits] = 10
    delta[0] = outside
    delta[1] = 1
    delta[1, ord("\\")] = 2
    delta[1, ord('"')] = 0
    delta[1, :0x20] = REJECT  # raw control characters are not JSON
    for c in '"\\bfnrt':
        delta[2, ord(c)] = 1
    delta[2, ord("u")] = 3
    delta[3, ord("0")] = 4
    delta[4, ord("0")] = 5
    delta[5, ord("0")] = 6
    delta[5, ord("1")] = 7
    delta[6, [h for h in hexes if chr(h) not in "89acd"]] = 1  # \b \t \n \f \r are short
    delta[7, hexes] = 1
    delta[8, ord("0")] = 9
    delta[8, nonzero] = 10
    delta[9, ord(".")] = 11
    ends = outside.copy()  # the byte after a number is read as outside
    ends[digits] = REJECT
    ends[[ord("-"), ord("."), ord("e"), ord("E"), ord("+")]] = REJECT
    delta[10] = ends
    delta[10, digits] = 10
    delta[10, ord(".")] = 11
    delta[11, ord("0")] = 11
    delta[11, nonzero] = 12
    delta[12] = ends
    delta[12, ord("0")] = 11
    delta[12, nonzero] = 12
    accepting = np.zeros(13, bool)
    accepting[[0, 10, 12]] = True
    return ByteDFA(delta, accepting, 0)


@functools.cache
def compact_json_dfa() -> ByteDFA:
    """`canonical_json_dfa` without whitespace outside strings: every JSON value then has one
    spelling up to the order of an object's members (what exact `oneOf` compares objects and
    arrays on: `json.dumps(value, separators=(",", ":"), ensure_ascii=False)`).

    Source: JSON's whitespace (RFC 8259, section 2: space, tab, line feed, carriage return)."""
    canonical = canonical_json_dfa()
    delta = canonical.delta.copy()
    outside = [0, 10, 12]  # the states that read a byte outside strings (after a number too)
    delta[np.ix_(outside, [0x20, 0x09, 0x0A, 0x0D])] = REJECT
    return ByteDFA(delta, canonical.accepting.copy(), canonical.initial)


def numbered_mark(byte: int, i: int) -> str:
    """The regex of mark number `i` (0 <= i < 256) led by the control byte `byte`: three
    control characters, `byte`, `0x10 + i // 16`, `0x10 + i % 16`, which JSON text never holds
    raw (strings escape them). A rule call (`rule_plan.rule_call`) and a member's end in
    `order_automata` are such marks; `numbered_mark_edges` reads them back from a DFA."""
    return f"\\x{byte:02x}\\x{0x10 + i // 16:02x}\\x{0x10 + i % 16:02x}"


def numbered_mark_edges(delta, byte: int) -> list[tuple[int, int, int]]:
    """Each `(state, i, after)` where the DFA table `delta` (`Int[np.ndarray, "states
    symbols"]`, `REJECT` for none) reads mark `i` of `numbered_mark(byte, i)` from `state`,
    reaching `after`, in order of states."""
    edges = []
    for q in np.flatnonzero(delta[:, byte] != REJECT):
        first = delta[q, byte]
        for high in np.flatnonzero(delta[first, 0x10:0x20] != REJECT):
            second = delta[first, 0x10 + high]
            for low in np.flatnonzero(delta[second, 0x10:0x20] != REJECT):
                edges.append((int(q), 16 * int(high) + int(low), int(delta[second, 0x10 + low])))
    return edges


_WHITESPACE = [0x20, 0x09, 0x0A, 0x0D]
"""JSON's whitespace bytes (RFC 8259, section 2)."""


def spaced_json_dfa(dfa: ByteDFA, ws: str, *, max_states: int) -> ByteDFA:
    """The minimal byte DFA of the texts that `dfa` accepts once their whitespace outside strings
    is erased, where each run of whitespace stands between two tokens of which one is a
    structural character (`{ } [ ] , :`) and matches the regex `ws` (one run there at most): `dfa` over compact JSON text (as
    `compact_json_dfa` spells it) read with the spacing a schema's regex allows (`ws`, e.g.
    `[ ]?`), so `{"a": [1, 2]}` where `dfa` accepts `{"a":[1,2]}`. No whitespace before the
    first byte or after the last (the enclosing regex writes that), none inside a number or a
    literal (`1 2` is not `12`).

    The inverse image of whitespace erasure (the product of `dfa` with `canonical_json_dfa`'s
    lexer, a whitespace byte outside a string leaving `dfa`'s state as it is, except at its
    start and where it can read nothing more), intersected with the spacing (a regex of
    values and structural characters, one `ws` between two tokens).

    **Raises:** `ValueError` naming the sizes when a product has more than `max_states`
    reachable states; `ConstraintError` when `dfa` accepts nothing."""
    lexer = canonical_json_dfa()
    width = lexer.num_states
    outside = np.zeros(width, bool)
    outside[[0, 10, 12]] = True  # between tokens, or ending a number
    spaces = np.zeros(256, bool)
    spaces[_WHITESPACE] = True
    erasable = (dfa.delta != REJECT).any(axis=1)
    erasable[dfa.initial] = False
    start = dfa.initial * width + lexer.initial

    def successors(codes):
        q, c = codes // width, codes % width
        nq, nc = dfa.delta[q].astype(np.int64), lexer.delta[c].astype(np.int64)
        erase = (outside[c] & erasable[q])[:, None] & spaces[None, :]
        nq = np.where(erase, q[:, None], nq)
        dead = (nq == REJECT) | (nc == REJECT)
        return dead, nq * width + nc

    lifted = product_dfa(
        start,
        successors,
        lambda states: dfa.accepting[states // width] & lexer.accepting[states % width],
        max_states=max_states,
        what=f"the spaced texts of an automaton of {dfa.num_states} states",
    )
    value = r'(?:"(?:[^"\\]|\\(?s:.))*"|[^"{}\[\],: \t\n\r]+)'
    structural = r"[{}\[\],:]"
    # one whitespace slot between two tokens, one of them structural (values are never adjacent)
    spacing = regex_byte_dfa(
        f"(?:{value}{ws})?{structural}(?:{ws}(?:{value}{ws})?{structural})*(?:{ws}{value})?|{value}"
    )
    return minimize(intersect_dfas(trim(lifted), spacing, max_states=max_states))


_CONTINUATION = np.arange(0x80, 0xC0)


def codepoint_edges(dfa: ByteDFA) -> dict[int, dict[int, list[tuple[int, int]]]]:
    """The edges of a byte DFA of UTF-8 text between its character boundaries: per state
    reached from the initial one by whole characters, the code points (as sorted, merged
    inclusive ranges) that lead to each next such state, a multi-byte character's bytes
    followed through the states between them.

    **Raises:** `ValueError` when the DFA reads a byte that cannot start a character at a
    boundary (a continuation byte, `0xC0`, `0xC1`, `0xF5`-`0xFF`), or accepts inside a
    character.

    Source: the UTF-8 encoding (RFC 3629, section 3).
    """
    delta = dfa.delta

    @functools.cache
    def tails(state: int, remaining: int) -> tuple:
        """`(target, lo, hi)` of the values of `remaining` continuation bytes from `state`
        (6 bits each, big-endian), ranges merged."""
        if remaining == 0:
            return ((state, 0, 0),)
        if dfa.accepting[state]:
            raise ValueError("the automaton accepts inside a UTF-8 character")
        out: dict[int, list[tuple[int, int]]] = {}
        shift = 6 * (remaining - 1)
        targets = delta[state, _CONTINUATION]
        for c in np.flatnonzero(targets != REJECT):
            for target, lo, hi in tails(int(targets[c]), remaining - 1):
                out.setdefault(target, []).append(((int(c) << shift) + lo, (int(c) << shift) + hi))
        return tuple((t, lo, hi) for t, ranges in out.items() for lo, hi in merged_ranges(ranges))

    edges: dict[int, dict[int, list[tuple[int, int]]]] = {}
    todo = [dfa.initial]
    while todo:
        q = todo.pop()
        if q in edges:
            continue
        found: dict[int, list[tuple[int, int]]] = {}
        row = delta[q]
        if (row[0x80:0xC2] != REJECT).any() or (row[0xF5:] != REJECT).any():
            raise ValueError("dfa_regex writes only automata of valid UTF-8 text")
        for b in np.flatnonzero(row[:0x80] != REJECT):
            found.setdefault(int(row[b]), []).append((int(b), int(b)))
        for lead in np.flatnonzero(row[0xC2:0xF5] != REJECT) + 0xC2:
            length = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            base = (int(lead) & (0x7F >> length)) << (6 * (length - 1))
            for target, lo, hi in tails(int(row[lead]), length - 1):
                found.setdefault(target, []).append((base + lo, base + hi))
        edges[q] = {t: merged_ranges(ranges) for t, ranges in found.items()}
        todo.extend(t for t in edges[q] if t not in edges)
    return edges


def merged_ranges(ranges) -> list[tuple[int, int]]:
    """Inclusive integer ranges `(lo, hi)` sorted, touching or overlapping ones joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
