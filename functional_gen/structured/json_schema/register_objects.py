"""Objects read in any order with a member-set *register* (issue 55): one loop automaton over
the members, whatever their number, and a 32-bit register of the required members written,
instead of `order_automata`'s one copy of the members per set written (`2 ** n` sets).

`rule_automata` builds an object with it where `order_automata.any_order_dfa` cannot (more
members than `budgets.ORDER_AUTOMATON_MAX` to track); `pushdown.build_pushdown(registers=)`
turns its actions into the automaton's tables, `pushdown.register_walk` walks them on the
device, and `pushdown.register_budget` counts its tokens.

The object `{ ws member (ws , ws member)* ws }` becomes ONE regex in which each required
member's key is followed by a *set mark* (`numbered_mark(SET_MARK, t)` for required member
`t`; after the whole member where its regex does not start with a literal key,
`keys.literal_key`) and the `}` is preceded by a *require mark* (`numbered_mark(REQUIRE_MARK,
0)`). Compiled as any rule's regex (`regex_byte_dfa`, minimised with the marks as bytes), the
marks are then folded into the transitions of the next real byte, as `order_automata` joins its
sets: a state that reads a mark takes the byte row of the state after it, and those
transitions carry the mark's action. Each transition `(state, byte)` then has three register
actions, applied in this order before the byte moves the automaton on:

1. `reg_clear`: the register is set to 0 (the object's `{`: an object inlined twice in one rule
   starts afresh);
2. `reg_set` (`t + 1`, 0 for none): bit `t` is set (a member written again sets it again);
3. `reg_require` (a mask, 0 for none): the byte is refused unless every bit of the mask is set
   (the `}` before a required member was written).

**The language** is JSON Schema's, but for one thing: a listed member may be written more than
once (the last one is the one a JSON parser keeps: RFC 8259 says the names of an object SHOULD
be unique, not MUST; every value written is valid for its key). Refusing a repeat would need a
test on the register at every key byte (a key whose every completion was written is a dead
end), which no bitmask row can hold: every token that spells a key would have to be walked
exactly on the device. Only `}` depends on the register, so the tokens the device checks
exactly are the few that read a `}` of such an object (`pushdown.exact_tokens.register_token_tables`).
`order_automata.any_order_dfa`'s `"exact"` form (up to `ORDER_AUTOMATON_MAX` listed members)
refuses repeats; its `"required"` form, as this one, lets optional members repeat.
"""

import dataclasses
import json
import typing

import numpy as np
from jaxtyping import Bool, Int, UInt32

from ..automaton import ConstraintError
from ..byte_dfa import REJECT, ByteDFA, minimize, reachable_states, regex_byte_dfa, successor_graph
from ..dfa_operations import numbered_mark, numbered_mark_edges
from .free_values import FREE_VALUE_CALL
from .keys import literal_key
from .order_automata import _parse
from .rule_plan import RULE_CALL

REGISTER_BITS = 32
"""Members a register tracks at most (one `uint32` per stack frame on the device)."""

SET_MARK = 0x04
"""The byte that leads a tracked member's set mark (`numbered_mark(SET_MARK, t)`): a control
character that neither `byte_dfa`'s prefix (0x01), `rule_plan.RULE_CALL` (0x02) nor
`order_automata.MARK` (0x03) uses."""

REQUIRE_MARK = 0x05
"""The byte that leads the require mark before an object's `}` (`numbered_mark(REQUIRE_MARK,
0)`)."""


@dataclasses.dataclass(frozen=True, eq=False)
class RegisterDFA:
    """A byte DFA whose transitions also act on a member-set register (see the module
    docstring), with a host-side walk (the reference of the device tables built from it).

    **Attributes:**

    - `dfa`: the `ByteDFA` (`delta`: `Int[np.ndarray, "states 256"]`), without mark bytes.
    - `calls`: `Int[np.ndarray, "states rules"]`, the state after a call of schema rule `r`
      (`rule_plan.rule_call(r)` in a member's regex) from each state (`REJECT`: none), up to
      the largest rule called, as `rule_automata.rule_edges` gives them.
    - `value_calls`: `Int[np.ndarray, " states"]`, the state after a call of the free-form JSON
      value (`free_values.FREE_VALUE_CALL` in a member's regex; `REJECT`: none), the column
      that `rule_automata.rule_edges(free_value=True)` appends.
    - `reg_clear`: `Bool[np.ndarray, "states 256"]`, per transition: the register is cleared.
    - `reg_set`: `Int[np.ndarray, "states 256"]`, per transition: `t + 1` to set bit `t`, 0
      for none.
    - `reg_require`: `UInt32[np.ndarray, "states 256"]`, per transition: the bits that must be
      set (0: none).
    - `tracked`: the member indices (of the object text's members) tracked, the required ones:
      bit `t` is the member `tracked[t]`; `required`: the mask of their bits.
    """

    dfa: ByteDFA
    calls: Int[np.ndarray, "states rules"]
    value_calls: Int[np.ndarray, " states"]
    reg_clear: Bool[np.ndarray, "states 256"]
    reg_set: Int[np.ndarray, "states 256"]
    reg_require: UInt32[np.ndarray, "states 256"]
    tracked: tuple[int, ...]
    required: int

    @typing.no_type_check
    def step(self, config, byte: int):
        """One byte from `config = (state, register)`: the next configuration, or `None` when
        the byte is refused (by the DFA or by the register). Calls are not followed (a member
        value that is a call refuses its bytes here: the pushdown automaton runs them)."""
        state, register = config
        target = int(self.dfa.delta[state, byte])
        if target == REJECT:
            return None
        if self.reg_clear[state, byte]:
            register = 0
        member = int(self.reg_set[state, byte])
        if member:
            register |= 1 << (member - 1)
        need = int(self.reg_require[state, byte])
        if register & need != need:
            return None
        return target, register

    def walk(self, data: bytes, config=None):
        """The configuration `(state, register)` after `data` (from `(initial, 0)`), or
        `None` when some byte is refused."""
        config = (self.dfa.initial, 0) if config is None else config
        for b in data:
            config = self.step(config, b)
            if config is None:
                return None
        return config

    def accepts(self, data: bytes) -> bool:
        """Whether `data` is a whole object of the language (the register's checks included)."""
        config = self.walk(data)
        return config is not None and bool(self.dfa.accepting[config[0]])


def _key_length(part: str) -> int | None:
    """The length of the literal key that starts the member regex `part` (`keys.literal_key`:
    `regex_syntax.escape` of the key's JSON text), or `None` when it does not start with one."""
    if not part.startswith('"'):
        return None
    i, escaped = 1, False
    while i < len(part):
        c = part[i]
        width = 1
        if c == "\\":  # a regex escape: one literal character
            width = 4 if part[i + 1 : i + 2] == "x" else 2
            c = {"n": "\n", "t": "\t", "r": "\r"}.get(part[i + 1 : i + 2], part[i + 1 : i + 2])
        elif c in "()[]{}|?*+.^$":
            return None  # not a literal
        i += width
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == '"':
            try:
                name = json.loads(_unescape(part[:i]))
            except ValueError:
                return None
            return i if isinstance(name, str) and literal_key(name) == part[:i] else None
    return None


def _unescape(regex: str) -> str:
    """The text of a regex of `regex_syntax.escape`'s form."""
    out, i = [], 0
    while i < len(regex):
        if regex[i] == "\\":
            n = regex[i + 1]
            if n == "x":
                out.append(chr(int(regex[i + 2 : i + 4], 16)))
                i += 4
                continue
            out.append({"n": "\n", "t": "\t", "r": "\r"}.get(n, n))
            i += 2
        else:
            out.append(regex[i])
            i += 1
    return "".join(out)


def register_object_dfa(regex: str) -> RegisterDFA:
    """The automaton of an object read in any order (`regex`: `order_automata.any_order_text`
    as a rule, `(?:...)`, its markers expanded), with a member-set register (see the module
    docstring): `{`, whitespace, the members separated by `,` (whitespace around it), each
    required member at least once, any listed member any number of times (see the module
    docstring), additional members anywhere, then `}`.

    **Raises:** `ConstraintError` when more than `REGISTER_BITS` members are required, or when a
    member's end could go on like what follows it (its mark's row would clash: a complete JSON
    value never goes on with whitespace, `,` or `}`)."""
    flags, ws, parts = _parse(regex)
    required = [j for j, f in enumerate(flags) if f == "r"]
    tracked = required
    if len(tracked) > REGISTER_BITS:
        raise ConstraintError(
            f"an object of {len(required)} required members: a register tracks at most "
            f"{REGISTER_BITS}"
        )
    bit = {j: t for t, j in enumerate(tracked)}
    need = sum(1 << bit[j] for j in required)

    def marked(j: int, part: str) -> str:
        if j not in bit:
            return f"(?:{part})"
        mark = numbered_mark(SET_MARK, bit[j])
        cut = _key_length(part)
        if cut is None:  # not a literal key first: the mark after the whole member
            return f"(?:{part}){mark}"
        return f"(?:{part[:cut]}{mark}{part[cut:]})"

    alternatives = "|".join(marked(j, part) for j, part in enumerate(parts))
    members = f"(?:{alternatives})(?:{ws},{ws}(?:{alternatives}))*"
    close = f"{numbered_mark(REQUIRE_MARK, 0)}\\}}"
    empty = "|\\}" if not need else ""
    dfa = minimize(regex_byte_dfa(f"\\{{{ws}(?:{members}{ws}{close}{empty})"))
    delta = dfa.delta.astype(np.int32).copy()
    accepting = dfa.accepting.copy()
    reg_clear = np.zeros(delta.shape, bool)
    reg_set = np.zeros(delta.shape, np.int32)
    reg_require = np.zeros(delta.shape, np.uint32)
    reg_clear[dfa.initial, ord("{")] = True
    # Fold the require marks, then the set marks (a set mark's row may hold a folded `}`): a
    # state that reads a mark takes the row of the state after it, with the mark's action.
    for lead in (REQUIRE_MARK, SET_MARK):
        edges = numbered_mark_edges(delta, lead)
        rows = {after: (delta[after].copy(), reg_require[after].copy()) for _, _, after in edges}
        for q, t, after in edges:
            delta[q, lead] = REJECT
            row, row_require = rows[after]
            live = row != REJECT
            clash = live & (delta[q] != REJECT)
            if clash.any():
                raise ConstraintError(
                    "an object read in any order: a member's end may go on with "
                    f"{bytes([int(np.flatnonzero(clash)[0])])!r}, as what follows it does"
                )
            delta[q] = np.where(live, row, delta[q])
            reg_require[q] = np.where(live, row_require, reg_require[q])
            if lead == REQUIRE_MARK:
                reg_require[q, live] = need
            else:
                reg_set[q, live] = t + 1
            accepting[q] |= accepting[after]
    # Calls: their bytes become call columns, as `rule_automata._rule_edges_of` makes them.
    edges = numbered_mark_edges(delta, RULE_CALL)  # (state, rule, state after the call)
    delta[:, RULE_CALL] = REJECT
    calls = np.full((delta.shape[0], 1 + max((r for _, r, _ in edges), default=-1)), REJECT)
    for q, r, after in edges:
        calls[q, r] = after
    free = FREE_VALUE_CALL.encode("utf-8")[0]
    calls = np.concatenate([calls, delta[:, free, None]], axis=1)  # the free value: last
    delta[:, free] = REJECT
    # The mark states are no longer reachable: keep the reachable ones, in order (not
    # minimised again: the register actions would have to be part of the alphabet).
    both = np.concatenate([delta, calls], axis=1)
    indptr, successors = successor_graph(both)
    keep = np.flatnonzero(reachable_states(indptr, successors, [dfa.initial], delta.shape[0]))
    number = np.full(delta.shape[0], REJECT, np.int32)
    number[keep] = np.arange(keep.size)
    both = np.where(both[keep] != REJECT, number[both[keep]], REJECT).astype(np.int32)
    return RegisterDFA(
        dfa=ByteDFA(both[:, :256], accepting[keep], int(number[dfa.initial])),
        calls=both[:, 256:-1],
        value_calls=both[:, -1],
        reg_clear=reg_clear[keep],
        reg_set=reg_set[keep],
        reg_require=reg_require[keep],
        tracked=tuple(tracked),
        required=need,
    )
