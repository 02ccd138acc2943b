"""The grammar form's automata: each rule's byte automaton with its call edges
(`rule_edges`, cached, built ahead on threads), free-value calls inlined where one byte cannot
choose them, and the checks that every rule is productive and its calls deterministic.

An object read in any order whose member sets are too many for `order_automata.any_order_dfa`
(more than `ORDER_AUTOMATON_MAX` tracked, or over the positions budget) is built by
`register_objects.register_object_dfa` instead: one loop over its members and a member-set
register (issue 55). Its rule then carries the register actions `(reg_clear, reg_set,
reg_require)` per (state, byte) beside its automaton (the third element of `rule_edges`'
result), which `grammar_form` hands to `build_pushdown(registers=)`. Those tables are indexed by
the automaton's states, so such an automaton is never minimised, merged or renumbered after it
is built (`inline_value_calls` leaves it as it is; `grammar_form._shared_tails` takes no tail
from it and makes no other state a call of it).
"""

import collections
import concurrent.futures
import contextlib
import os
import typing

import numpy as np

from ..automaton import ConstraintError, unique_columns
from ..byte_dfa import (
    REJECT,
    ByteDFA,
    minimize,
    reachable_states,
    regex_byte_dfa,
    successor_graph,
)
from ..dfa_operations import numbered_mark_edges
from ..pushdown import NotDeterministic
from ..regex_syntax import escape
from . import budgets
from .errors import (
    RecursionRefused,
    TooManyPositions,
)
from .free_values import FREE_VALUE_CALL, free_value
from .order_automata import any_order_dfa, is_any_order_text
from .register_objects import register_object_dfa
from .rewriter import Rewriter
from .rule_plan import RULE_CALL

_VALUE_FIRST = np.zeros(256, bool)
_VALUE_FIRST[list(b'{["-0123456789tfn')] = True  # the first bytes of any JSON value


Register = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A rule's member-set register actions, `(reg_clear, reg_set, reg_require)`: `Bool`, `Int` and
`UInt32[np.ndarray, "states 256"]` (`register_objects.RegisterDFA`'s fields of those names),
row `q` the actions of state `q`'s transitions."""


def rule_automaton(rewriter: Rewriter, text: str, rules: int, free_value: bool):
    """`rule_edges(text, rules, free_value)`, or for a rule that is a string given as an
    automaton (its text the placeholder of `Rewriter.dfa_texts`) that automaton, without
    calls, with the four register tables of a counter rule (`Rewriter.counter_texts`,
    `CounterDFA.registers`), else no register: `(dfa, calls, register)`."""
    dfa = rewriter.dfa_texts.get(text[3:-1]) if text.startswith("(?:") else None
    if dfa is None:
        return rule_edges(text, rules, free_value)
    counter = rewriter.counter_texts.get(text[3:-1])  # a counter rule: its register actions
    registers = None if counter is None else counter.registers
    return dfa, np.full((dfa.num_states, rules + free_value), REJECT, np.int32), registers


def rule_edges(
    regex: str, rules: int, free_value: bool
) -> tuple[ByteDFA, np.ndarray, "Register | None"]:
    """The minimal byte DFA of a grammar-form regex with its calls as call columns: `(dfa,
    calls, register)`, `calls[q, r]` the state after a call of rule `r` from `q` (`REJECT`:
    none); the callables are the `rules` schema rules, then the free-form JSON value when
    `free_value`. `register`: `None`, or for an object read in any order with a member-set
    register (`_rule_edges_of`) its actions per (state, byte) (`Register`; then `dfa` is not
    minimal and must not be minimised: the actions are not part of its alphabet).
    Memoised by `(regex, free_value)` (`_RULE_EDGES`): the attempts of one compile (the call,
    then depth 1; each plan after a ban; the recursive form, then unrolled) rebuild most rules
    with the same text (MaskBench bamboo-spec: 321 rule automata, 115 distinct texts)."""
    hit = _RULE_EDGES.get((regex, free_value))
    if hit is None:
        future = _RULE_EDGES_AHEAD.pop((regex, free_value), None)
        if future is not None and not future.cancel():
            hit = future.result()  # its error, if any, is raised here, as it would be inline
        else:
            hit = _rule_edges_of(regex, free_value)
        _RULE_EDGES[regex, free_value] = hit
        _RULE_EDGES.move_to_end((regex, free_value))
        while (
            sum(entry[0].num_states for entry in _RULE_EDGES.values()) > budgets.RULE_EDGES_STATES
        ):
            _RULE_EDGES.popitem(last=False)
    else:
        _RULE_EDGES.move_to_end((regex, free_value))
    dfa, rule_calls, value_calls, register = hit
    if rule_calls.shape[1] > rules:
        raise RuntimeError(f"internal error: a rule regex calls rule {rule_calls.shape[1] - 1}")
    calls = np.full((dfa.num_states, rules + free_value), REJECT, np.int32)
    calls[:, : rule_calls.shape[1]] = rule_calls
    if free_value:
        calls[:, rules] = value_calls
    return dfa, calls, register


def inlined_rule_edges(
    regex: str, rules: int, ws: str
) -> tuple[ByteDFA, np.ndarray, "Register | None"]:
    """`rule_edges(regex, rules, True)` with the free-form value's calls that compete read in
    place (`inline_value_calls` with whitespace `ws`): `(dfa, calls, register)`. An automaton
    with a register is left as it is (its register tables are indexed by its states, which the
    subset construction would renumber): a call that competes there stays, and
    `check_value_calls` refuses it. Memoised by its arguments
    (`_INLINED_RULE_EDGES`, least recently used dropped past `RULE_EDGES_STATES` states): the
    attempts of one compile build many rules again with the same text (MaskBench o7573: each of
    9 rules twice, up to 10,900 sets of states each; its refusal 5.6 -> 4.5 s)."""
    key = (regex, rules, ws)
    hit = _INLINED_RULE_EDGES.get(key)
    if hit is None:
        dfa, calls, register = rule_edges(regex, rules, True)
        if register is None:
            dfa, calls = inline_value_calls(dfa, calls, ws)
        hit = _INLINED_RULE_EDGES[key] = (dfa, calls, register)
        while (
            sum(entry[0].num_states for entry in _INLINED_RULE_EDGES.values())
            > budgets.RULE_EDGES_STATES
        ):
            _INLINED_RULE_EDGES.popitem(last=False)
    _INLINED_RULE_EDGES.move_to_end(key)
    return hit


_INLINED_RULE_EDGES: "collections.OrderedDict[tuple[str, int, str], tuple]" = (
    collections.OrderedDict()
)
"""`inlined_rule_edges`' memo."""


_RULE_EDGES: "collections.OrderedDict[tuple[str, bool], tuple]" = collections.OrderedDict()


_RULE_EDGES_AHEAD: "dict[tuple[str, bool], concurrent.futures.Future]" = {}
"""`_rule_edges_of` results being built ahead by `build_ahead`'s threads, by `(regex,
free_value)`: `rule_edges` takes (or cancels and builds) them."""


def _compile_threads() -> "concurrent.futures.ThreadPoolExecutor | None":
    """The threads that build rule automata ahead (`build_ahead`): one per core this process may
    run on, at most `MAX_COMPILE_THREADS`; `None` with a single core. One pool per process: a
    child forked after the pool started has none of its threads, so it starts its own."""
    pid = os.getpid()
    if pid not in _POOLS:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        workers = min(cores or 1, budgets.MAX_COMPILE_THREADS)
        _POOLS.clear()
        _POOLS[pid] = (
            concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="functional_gen")
            if workers >= 2
            else None
        )
    return _POOLS[pid]


_POOLS: dict = {}


@contextlib.contextmanager
def build_ahead(regexes: list[str], free_value: bool):
    """Build the rule automata of `regexes` (`_rule_edges_of`) on `_compile_threads`, in that
    order, while the caller takes them one by one through `rule_edges`; those it has not taken
    when it leaves (a refused plan) are cancelled unless already running. outlines-core builds a
    regex's DFA without holding the GIL, so two cores build two rules at once: on 2 cores,
    MaskBench o48866 9.5-10.1 -> 7.8-8.0 s, o7573 7.6-8.4 -> 6.3-6.4 s, bamboo-spec 8.1-8.3 ->
    7.4-7.8 s; 180 sampled schemas 5% less in total, p50 unchanged. Results and errors are
    those of building in order, one at a time: the caller still takes and checks them in
    order."""
    pool = _compile_threads()
    keys = []
    if pool is not None:
        for regex in regexes:
            key = (regex, free_value)
            if key not in _RULE_EDGES and key not in _RULE_EDGES_AHEAD:
                _RULE_EDGES_AHEAD[key] = pool.submit(_rule_edges_of, regex, free_value)
                keys.append(key)
    try:
        yield
    finally:
        for key in keys:
            future = _RULE_EDGES_AHEAD.pop(key, None)
            if future is not None:
                future.cancel()


def _rule_edges_of(regex: str, free_value: bool):
    """`(dfa, rule_calls, value_calls, register)` for `rule_edges`: the call columns of the
    rules that `regex` calls (`rule_calls[:, r]`, up to its largest rule called) and, when
    `free_value`, of the free-form value (`value_calls`, else `None`). An object read in any
    order by its automaton (`order_automata.is_any_order_text`) is built by `any_order_dfa`
    (`register` `None`), or where that refuses it as too large (`TooManyPositions`: more
    members to track than `ORDER_AUTOMATON_MAX`, or too many states) by `_register_edges_of`;
    other regexes have no register.

    **Raises:** `TooManyPositions` (`any_order_dfa`'s) when the register cannot hold the object
    either (more than `REGISTER_BITS` required members); `ConstraintError` as `any_order_dfa`."""
    if is_any_order_text(regex):
        try:
            dfa = any_order_dfa(regex)
        except TooManyPositions as too_many:
            registered = _register_edges_of(regex, free_value)
            if registered is None:
                raise too_many from None
            return registered
    else:
        dfa = minimize(regex_byte_dfa(regex))
    delta = dfa.delta.copy()
    edges = numbered_mark_edges(delta, RULE_CALL)  # (state, rule, state after the call)
    delta[:, RULE_CALL] = REJECT
    calls = np.full((dfa.num_states, 1 + max((r for _, r, _ in edges), default=-1)), REJECT)
    for q, r, after in edges:
        calls[q, r] = after
    if free_value:
        byte = FREE_VALUE_CALL.encode("utf-8")[0]
        calls = np.concatenate([calls, delta[:, byte, None]], axis=1)
        delta[:, byte] = REJECT
    joined = minimize(
        ByteDFA(np.concatenate([delta, calls], axis=1).astype(np.int32), dfa.accepting, dfa.initial)
    )
    columns = joined.delta[:, 256:]
    return (
        ByteDFA(joined.delta[:, :256], joined.accepting, joined.initial),
        columns[:, : columns.shape[1] - free_value],
        columns[:, -1] if free_value else None,
        None,
    )


def _register_edges_of(regex: str, free_value: bool):
    """`_rule_edges_of`'s result for an object read in any order with a member-set register
    (`register_object_dfa`): its automaton and call columns as they are built (not minimised:
    the register actions are indexed by its states), its register actions the fourth element.
    `None` when the register cannot hold it (`ConstraintError`: more required members than
    `REGISTER_BITS`, or a member's end that could go on like what follows it)."""
    try:
        built = register_object_dfa(regex)
    except ConstraintError:
        return None
    if not free_value and (built.value_calls != REJECT).any():
        raise RuntimeError("internal error: an object calls a free-form value outside its grammar")
    return (
        built.dfa,
        built.calls,
        built.value_calls if free_value else None,
        (built.reg_clear, built.reg_set, built.reg_require),
    )


def check_productive(automata: list, rules: int) -> None:
    """Refuse a grammar form in which some rule or state cannot finish (a recursion with no
    way out, `{"required": ["next"], "properties": {"next": {"$ref": "#"}}}`): the pushdown
    automaton would offer text that can never end. A least fixed point: a state can finish when
    it accepts, or reads a byte or calls a rule that can finish into a state that can; a rule
    can finish when its initial state can. Computed in phases: the states that reach an
    accepting state of their automaton over bytes and calls of the rules known to finish (one
    backward breadth-first search of all automata at once, `byte_dfa.reachable_states`), then the
    rules that finish with them, until no rule is added (at most `rules + 1` phases).

    **Arguments:** as `nondeterministic_calls` (the free-form value, call column `rules`
    when present, always finishes).

    **Raises:** `RecursionRefused` naming the first rule that cannot finish."""

    offsets = np.cumsum([0] + [dfa.num_states for dfa, _ in automata])
    total = int(offsets[-1])
    byte_src, byte_dst, call_src, call_dst, call_rule = [], [], [], [], []
    for (dfa, calls), offset in zip(automata, offsets):
        indptr, successors = successor_graph(dfa.delta)  # each successor once
        byte_src.append(np.repeat(np.arange(dfa.num_states), np.diff(indptr)) + offset)
        byte_dst.append(successors.astype(np.int64) + offset)
        q, c = np.nonzero(calls != REJECT)
        call_src.append(q + offset)
        call_dst.append(calls[q, c].astype(np.int64) + offset)
        call_rule.append(c)
    byte_src, byte_dst = np.concatenate(byte_src), np.concatenate(byte_dst)
    call_src, call_dst = np.concatenate(call_src), np.concatenate(call_dst)
    call_rule = np.concatenate(call_rule)
    accepting = np.flatnonzero(np.concatenate([dfa.accepting for dfa, _ in automata]))
    initial = np.array(
        [offsets[1 + r] + automata[1 + r][0].initial for r in range(rules)], np.int64
    )
    productive = np.zeros(rules + 1, bool)
    productive[rules:] = True
    while True:
        usable = productive[np.minimum(call_rule, rules)]
        # reversed edges (target -> source) as a CSR graph
        src = np.concatenate([byte_dst, call_dst[usable]])
        dst = np.concatenate([byte_src, call_src[usable]])
        order = np.argsort(src, kind="stable")
        indptr = np.searchsorted(src[order], np.arange(total + 1))
        done = reachable_states(indptr, dst[order], accepting, total)
        now = np.append(done[initial], True)
        if np.array_equal(now, productive):
            break
        productive = now
    for a in range(len(automata)):
        if not done[offsets[a] : offsets[a + 1]].all():
            name = "the schema" if a == 0 else f"rule {a - 1}"
            raise RecursionRefused(f"{name} has text that can never end (endless recursion)")


_VALUE_CALL_LEVELS = 8
"""How many levels deep `inline_value_calls` reads free-form values in place (a level read in
place may hold calls that compete again, one level down) before it leaves a call competing
(for `check_value_calls` to refuse)."""


def inline_value_calls(
    dfa: ByteDFA, calls: np.ndarray, ws: str, levels: int = _VALUE_CALL_LEVELS
) -> tuple[ByteDFA, np.ndarray]:
    """`(dfa, calls)` (a rule automaton as `rule_edges` gives it, the free-form value's call in
    the last column of `calls`) with each call of the JSON value rule that competes with bytes
    read beside it (`{"anyOf": [{"maxItems": 1}, {}]}`: the first branch's strings, numbers and
    objects are written in place, the second is a call) replaced by one level of the value read
    in place (`free_value(1, ws, innermost=call)`: a scalar, or an array or object whose
    members are calls), merged with the bytes beside it. A call inside that level that competes
    again (the regular side nests deeper) is replaced the same way, at most `levels` levels
    down. Calls that compete with nothing stay calls, so where the regular text beside them
    ends, the calls meet again (the same call, from one state). The language is the same: a
    call reads any value, and so does the level read in place. (Replacing every call of the
    schema by one or two levels read in place, which `json_schema_compile` tried until
    2026-11-25, does not resolve a conflict whose regular side is an object or array of free
    values: both sides move down together.)

    Built as a subset construction over the automaton and copies of the level's automaton, one
    per state returned to, made as they are needed: in a set of states that reads one of a
    value's first bytes, each state that calls the value enters a copy instead (the state
    after its call is the copy's state returned to); a copy's accepting state also stands for
    its state returned to. Then minimised. MaskBench o24467 (an `anyOf` of 12 open objects
    whose untyped members are constrained in some branches and free in others): every attempt
    conflicted before, and the schema fell back to free values nested 1 level (6.2 s, both
    valid instances rejected); now its pushdown automaton in 0.75 s, both accepted.

    **Returns:** the new `(dfa, calls)`; the same objects when no call competes."""
    states = np.flatnonzero(calls[:, -1] != REJECT)
    if not ((dfa.delta[states] != REJECT) & _VALUE_FIRST).any():
        return dfa, calls

    level_dfa, _, level_value, _ = _rule_edges_of(
        free_value(1, ws, innermost=escape(FREE_VALUE_CALL)), True
    )
    n, width = dfa.num_states, 256 + calls.shape[1] - 1  # symbols: bytes, then rule calls
    level_table = np.full((level_dfa.num_states, width), REJECT, np.int64)
    level_table[:, :256] = level_dfa.delta
    table = np.concatenate([dfa.delta, calls[:, :-1]], axis=1).astype(np.int64)
    columns, column_class = unique_columns(np.concatenate([table, level_table]))
    rows, level_rows = columns[:n].tolist(), columns[n:].tolist()
    value_first = ((dfa.delta != REJECT) & _VALUE_FIRST).any(axis=1).tolist()
    level_first = ((level_dfa.delta != REJECT) & _VALUE_FIRST).any(axis=1).tolist()
    value, level_value = calls[:, -1].tolist(), level_value.tolist()
    level_accepting = level_dfa.accepting.tolist()
    # nondeterministic states: 0..n-1 the automaton's; then copies' states (returned to,
    # level state, depth), numbered as they are made
    copies: dict[tuple[int, int], int] = {}
    copy_of: list[tuple[int, int, int]] = []

    def copy(back: int, v: int) -> int:
        index = copies.get((back, v))
        if index is None:
            depth = 1 + (copy_of[back - n][2] if back >= n else 0)
            index = copies[back, v] = n + len(copy_of)
            copy_of.append((back, v, depth))
        return index

    def closure(members) -> tuple:
        """With every copy's accepting state, the state it returns to (transitively)."""
        seen = set(members)
        todo = [q for q in seen if q >= n]
        while todo:
            back, v, _ = copy_of[todo.pop() - n]
            if level_accepting[v] and back not in seen:
                seen.add(back)
                if back >= n:
                    todo.append(back)
        return tuple(sorted(seen))

    num_columns = columns.shape[1]
    level_edges = [[(c, t) for c, t in enumerate(r) if t != REJECT] for r in level_rows]
    state_edges: dict[int, list] = {}

    def edges(q: int) -> list:
        """The (column, target) pairs of state `q`'s row that are not `REJECT`."""
        found = state_edges.get(q)
        if found is None:
            found = state_edges[q] = [(c, t) for c, t in enumerate(rows[q]) if t != REJECT]
        return found

    # each state of the automaton alone is the set of its own number
    order: list[tuple] = [(q,) for q in range(n)]
    subsets = {members: q for q, members in enumerate(order)}
    out_rows, out_calls, out_accepting = [], [], []
    for members in order:  # grows while it is read
        if len(members) == 1 and members[0] < n:
            q = members[0]
            if value[q] == REJECT or not value_first[q]:  # as it was
                out_rows.append(rows[q])
                out_calls.append(value[q])
                out_accepting.append(bool(dfa.accepting[q]))
                continue
        callers = []
        reads_first = False
        for q in members:
            if q < n:
                reads_first = reads_first or value_first[q]
                if value[q] != REJECT:
                    callers.append(value[q])
            else:
                back, v, _ = copy_of[q - n]
                reads_first = reads_first or level_first[v]
                if level_value[v] != REJECT:
                    callers.append(copy(back, level_value[v]))
        everyone = list(members)
        returns = []
        for after in callers:
            deep = copy_of[after - n][2] if after >= n else 0
            if reads_first and deep < levels:
                everyone.append(copy(after, level_dfa.initial))
            else:
                returns.append(after)
        by_column: dict[int, set] = {}  # each member's edges, not every column of each
        for q in everyone:
            if q < n:
                for c, t in edges(q):
                    by_column.setdefault(c, set()).add(t)
            else:
                back, v, _ = copy_of[q - n]
                for c, t in level_edges[v]:
                    by_column.setdefault(c, set()).add(copy(back, t))
        row = [REJECT] * num_columns
        for c in sorted(by_column):  # in column order, as the sets were always numbered
            row[c] = _subset_index(closure(by_column[c]), subsets, order)
        out_rows.append(row)
        out_calls.append(_subset_index(closure(returns), subsets, order) if returns else REJECT)
        out_accepting.append(any(q < n and dfa.accepting[q] for q in members))
    merged = np.array(out_rows, np.int64)[:, column_class]
    joined = minimize(
        ByteDFA(
            np.concatenate([merged, np.array(out_calls, np.int64)[:, None]], axis=1).astype(
                np.int32
            ),
            np.array(out_accepting, bool),
            dfa.initial,
        )
    )
    return ByteDFA(joined.delta[:, :256], joined.accepting, joined.initial), joined.delta[:, 256:]


def _subset_index(members: tuple, subsets: dict, order: list) -> int:
    """The number of a set of states in `inline_value_calls`' construction (a new one
    appended to `order`)."""
    index = subsets.get(members)
    if index is None:
        index = subsets[members] = len(order)
        order.append(members)
    return index


def check_value_calls(dfa: ByteDFA, calls: np.ndarray, name: str) -> None:
    """Refuse at once a rule automaton (`rule_edges`, the free-form value's call in the last
    column) with a state that both calls the JSON value rule and reads one of a value's first
    bytes itself (what `inline_value_calls` left: text nested deeper beside the call than it
    reads in place): no plan of the other rules can change that, and `build_pushdown` would refuse
    it only after every rule's automaton and the shared tails (seconds on a large schema, for
    each free-form depth `json_schema_compile` tries).

    **Raises:** `NotDeterministic` naming the rule and the byte, as `build_pushdown` does."""
    states = np.flatnonzero(calls[:, -1] != REJECT)
    clash = (dfa.delta[states] != REJECT) & _VALUE_FIRST
    if clash.any():
        byte = bytes([int(np.flatnonzero(clash.any(axis=0))[0])])
        raise NotDeterministic(
            f"in rule {name!r} the byte {byte!r} can be read in 2 ways (itself, a call of 'value')"
        )


def nondeterministic_calls(automata: list, rules: int) -> set[int]:
    """The schema rules called where a one-byte lookahead cannot choose: a call whose first
    bytes another call or a byte edge of the same state also reads, or a rule that matches the
    empty string. `automata`: `(dfa, calls)` per regex (the root first, then rule `i` at
    `1 + i`)."""
    first: dict[int, np.ndarray] = {}

    @typing.no_type_check
    def first_bytes(r: int, busy: frozenset = frozenset()) -> np.ndarray:
        if r == rules:
            return _VALUE_FIRST
        if r not in first:
            dfa, calls = automata[1 + r]
            out = dfa.delta[dfa.initial] != REJECT
            for c in np.flatnonzero(calls[dfa.initial] != REJECT):
                if int(c) not in busy and int(c) != r:
                    out = out | first_bytes(int(c), busy | {r})
            first[r] = out
        return first[r]

    bad = {r for r in range(rules) if automata[1 + r][0].accepting[automata[1 + r][0].initial]}
    for dfa, calls in automata:
        for q in np.flatnonzero((calls != REJECT).any(axis=1)):
            called = [int(c) for c in np.flatnonzero(calls[q] != REJECT)]
            reads = dfa.delta[q] != REJECT
            for c in called:
                mine = first_bytes(c)
                others = reads.copy()
                for d in called:
                    if d != c:
                        others |= first_bytes(d)
                if (mine & others).any() and c < rules:
                    bad.add(c)
    return bad
