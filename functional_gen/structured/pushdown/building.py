"""Building a `PushdownAutomaton` (`build_pushdown`): each (position, byte) gets one action
(steps 1 and 2 of `functional_gen.structured.pushdown`), the budget distances, then the token
tables (`token_tables`, step 3).
"""

import typing
from collections.abc import Sequence

import numpy as np
from jaxtyping import Int

from ..buckets import bucket
from ..byte_dfa import REJECT, ByteDFA, ragged_rows
from ..grammar_rules import RuleBuilder, cut_rules
from ..grammar_syntax import GrammarError, GrammarSpec
from ..vocabulary import TokenVocabulary
from .automaton import (
    BOTTOM,
    DEAD,
    DEFAULT_STACK_DEPTH,
    FORK,
    POP,
    UNREACHABLE,
    NotDeterministic,
    PushdownAutomaton,
)
from .budget import token_budget
from .exact_tokens import counter_tables, fork_tables, register_token_tables
from .register_budget import register_frames
from .token_tables import token_byte_matrix, token_tables, unique_rows

# Nested helpers that run per byte, state or schema node are `@typing.no_type_check`: the
# tests' jaxtyping import hook would wrap every call of them (30-40 us each, and a fresh
# wrapper per definition), which was most of the structured tests' time.


# ------------------------------------------------------------------------------ build


def build_pushdown(
    spec: GrammarSpec | None,
    vocabulary: TokenVocabulary,
    *,
    stack_depth: int = DEFAULT_STACK_DEPTH,
    description: str = "",
    top: tuple[ByteDFA, Int[np.ndarray, " states"], str] | None = None,
    rules: Sequence[tuple[str, ByteDFA, np.ndarray]] | None = None,
    forks: bool = False,
    registers: Sequence[tuple[np.ndarray, ...] | None] | None = None,
) -> PushdownAutomaton:
    """Compile a parsed grammar into a `PushdownAutomaton` (see the module docstring).

    **Arguments:** `spec`, `vocabulary`, `stack_depth`, `description`; `top`: instead of the
    start rule, a byte DFA for the bottom frame with call edges: `(dfa, call, rule)` where
    `call[q]` is the state reached after a call of the recursive rule `rule` from state `q`
    (`REJECT`: none). JSON Schemas use it: the schema's DFA calls a free-form JSON value.
    `rules`: the general form of `top`, rules given as byte DFAs: `(name, dfa, calls)` each,
    the first one the bottom frame; the *callable* rules are `rules[1:]` followed by the
    grammar's recursive rules (`grammar_rules.cut_rules(spec)`), and `calls[q, r]` (`states x
    callables`) is the state of `dfa` reached from `q` after a call of callable `r` (`REJECT`:
    none). `spec` may then be `None` (no grammar rules). JSON Schemas compiled to a grammar use
    it: one rule per large subschema (`json_schema.json_schema_grammar`). `forks`: instead of
    refusing a byte that can be read in several ways, give its (position, byte class) the
    action `FORK - f` and list the ways in `fork_next[f]` / `fork_push[f]` (run with parallel
    stacks, `pushdown.parallel`); every table walk treats such an entry as a rejection, so a
    grammar without such bytes gets exactly the tables it gets without `forks`.
    `registers`: per rule of `rules`, `None` or the member-set register actions of its
    transitions, `(reg_clear, reg_set, reg_require)`: `Bool`, `Int` and `UInt32[np.ndarray,
    "states 256"]` (`json_schema.register_objects.RegisterDFA`), and optionally a fourth,
    `reg_limit` (`Int`, a counter rule's: `json_schema.counter_strings`); they become the automaton's
    `reg_clear`, `reg_set`, `reg_require` (and `reg_limit`) per (position, byte class), applied to the frame
    that reads the byte (see `PushdownAutomaton.step`); the bitmask rows ignore the register (a
    superset of the tokens it allows), the tokens that may read a `}` it decides are walked
    exactly (`register_tokens`), and the budget counts the members missing
    (`register_budget`).

    **Raises:** `NotDeterministic` when a byte could be read in two ways (without `forks`), a recursive rule
    matches the empty string or is left-recursive; `GrammarError` for a language without a
    finite sentence (naming the rules that never end), or without one that fits within
    `stack_depth` open calls and can be spelled with the vocabulary's tokens;
    `TooManyCandidates` (a `ConstraintError`) when the stack-dependent tokens would fill a
    table over `MAX_CANDIDATE_TABLE` bytes; `ValueError` for `top` and `rules` together, a `calls` table of the wrong width, or
    `registers` without `rules`, of another length, or with `forks`.
    """
    if registers is not None and (rules is None or len(registers) != len(rules) or forks):
        raise ValueError(
            "build_pushdown: `registers` needs `rules` (one entry per rule) and no `forks`"
        )
    if registers is not None:  # a fourth table, `reg_limit` (a counter rule), zeros if absent
        registers = [
            r if r is None or len(r) == 4 else (*r, np.zeros(r[0].shape, np.int32))
            for r in registers
        ]
    if top is not None:
        if rules is not None:
            raise ValueError("build_pushdown: give `top` or `rules`, not both")
        dfa, call, rule = top
        cut = cut_rules(spec)
        if rule not in cut:
            raise GrammarError(
                f"the called rule {rule!r} is not a recursive rule of the grammar ({cut})"
            )
        calls = np.full((dfa.num_states, len(cut)), REJECT, np.int32)
        calls[:, cut.index(rule)] = call
        rules = [("schema", dfa, calls)]
    if rules is None:
        cut = cut_rules(spec)
        builder = RuleBuilder(spec, cut)
        called = [builder.rule_dfa(spec.rules[name], top=False) for name in cut]
        nc, byte_class = builder.num_classes, builder.byte_class
        automata = [builder.rule_dfa(spec.rules[spec.start], top=True), *called]
        names = (spec.start, *cut)
    else:
        automata, names, nc, byte_class, actions = _byte_rule_automata(spec, rules, registers)
    offsets = np.cumsum([1] + [a.num_states for a in automata])
    num_positions = int(offsets[-1])
    position_rule = np.zeros(num_positions, np.int32)
    final = np.zeros(num_positions, bool)
    for a, dfa in enumerate(automata):
        position_rule[offsets[a] : offsets[a + 1]] = a
        final[offsets[a] : offsets[a + 1]] = dfa.accepting
        if a and dfa.accepting[dfa.initial]:
            raise NotDeterministic(f"the recursive rule {names[a]!r} matches the empty string")

    @typing.no_type_check
    def tail(a: int, ret: int) -> bool:
        dfa = automata[a]
        return bool(dfa.accepting[ret]) and bool((dfa.delta[ret] == REJECT).all())

    memo: dict = {}
    busy: set = set()

    @typing.no_type_check
    def action(a: int, q: int, c: int):
        """The ways `(pushed, target)` to read class `c` at state `q` of automaton `a` (at most
        one unless `forks`)."""
        dfa = automata[a]
        options = []
        t = int(dfa.delta[q, c])
        if t != REJECT:
            options.append(((), int(offsets[a]) + t, None))
        for r in np.flatnonzero(dfa.delta[q, nc:] != REJECT):
            ret = int(dfa.delta[q, nc + r])
            pushed = () if tail(a, ret) else (int(offsets[a]) + ret,)
            for e in entry(int(r), c):
                options.append((pushed + e[0], e[1], names[1 + r]))
        if len(options) > 1 and not forks:
            byte = bytes([int(np.flatnonzero(byte_class == c)[0])])
            ways = ", ".join("itself" if o[2] is None else f"a call of {o[2]!r}" for o in options)
            raise NotDeterministic(
                f"in rule {names[a]!r} the byte {byte!r} can be read in {len(options)} ways ({ways})"
            )
        return list(dict.fromkeys(o[:2] for o in options))

    @typing.no_type_check
    def entry(r: int, c: int):
        key = (r, c)
        if key in memo:
            return memo[key]
        if key in busy:
            raise NotDeterministic(f"the rule {names[1 + r]!r} is left-recursive")
        busy.add(key)
        memo[key] = action(1 + r, automata[1 + r].initial, c)
        busy.discard(key)
        return memo[key]

    nxt = np.zeros((num_positions, nc), np.int32)
    pushes: dict = {}
    fork_ways: list = []  # per fork, its ways `(pushed, target)`
    for a, dfa in enumerate(automata):
        # A state without call edges reads its bytes itself or rejects them (one option at
        # most, no error possible): filled at once. The states with calls go through `action`
        # in the same order as before, so the same first conflict is reported.
        calling = (dfa.delta[:, nc:] != REJECT).any(axis=1)
        plain = np.flatnonzero(~calling)
        delta = dfa.delta[plain, :nc]
        fallback = POP if a else 0
        nxt[int(offsets[a]) + plain] = np.where(
            delta != REJECT,
            int(offsets[a]) + delta,
            np.where(dfa.accepting[plain], fallback, 0)[:, None],
        )
        for q in np.flatnonzero(calling).tolist():
            pos = int(offsets[a]) + q
            for c in range(nc):
                ways = action(a, q, c)
                if len(ways) > 1:  # only with `forks`
                    nxt[pos, c] = FORK - len(fork_ways)
                    fork_ways.append(ways)
                elif ways:
                    nxt[pos, c] = ways[0][1]
                    if ways[0][0]:
                        pushes[pos, c] = ways[0][0]
                elif a and dfa.accepting[q]:
                    nxt[pos, c] = POP
    width = max((len(p) for p in pushes.values()), default=0)
    push = np.zeros((num_positions, nc, max(width, 1)), np.int32)
    for (pos, c), p in pushes.items():
        push[pos, c, : len(p)] = p

    # Return sites of each recursive rule (tail calls inherit their caller's sites).
    callables = len(automata) - 1
    sites = [set() for _ in range(callables)]
    tails = [set() for _ in range(callables)]
    for a, dfa in enumerate(automata):
        for q in range(dfa.num_states):
            for r in np.flatnonzero(dfa.delta[q, nc:] != REJECT):
                ret = int(dfa.delta[q, nc + r])
                (tails[r].add(a) if tail(a, ret) else sites[r].add(int(offsets[a]) + ret))
    changed = True
    while changed:
        changed = False
        for r in range(callables):
            for a in tails[r]:
                extra = {BOTTOM} if a == 0 else sites[a - 1]
                if not extra <= sites[r]:
                    sites[r] |= extra
                    changed = True
    # Returning only when the rule cannot read the byte must not hide a text that returns and
    # reads it in the caller: refuse a rule that may end and also read a byte that one of its
    # return positions (after any further returns) reads.
    memo_after: dict = {}

    @typing.no_type_check
    def read_after_return(rule: int, c: int, busy: frozenset = frozenset()) -> bool:
        if (rule, c) in memo_after:
            return memo_after[rule, c]
        found = False
        for s in sites[rule - 1]:
            if s == BOTTOM:
                continue
            act = nxt[s, c]
            if (
                act > 0
                or act <= FORK
                or (
                    act == POP
                    and position_rule[s] not in busy
                    and read_after_return(int(position_rule[s]), c, busy | {rule})
                )
            ):
                found = True
                break
        memo_after[rule, c] = found
        return found

    for p in np.flatnonzero(final & (position_rule > 0)):
        for c in np.flatnonzero((nxt[p] > 0) | (nxt[p] <= FORK)):
            if read_after_return(int(position_rule[p]), int(c)):
                if forks:  # a fork: read the byte here, or return and read it below
                    act = int(nxt[p, c])
                    if act <= FORK:
                        ways = fork_ways[FORK - act]
                    else:
                        ways = [(tuple(int(v) for v in push[p, c] if v), act)]
                        push[p, c] = 0
                        nxt[p, c] = FORK - len(fork_ways)
                        fork_ways.append(ways)
                    ways.append(((), POP))
                    continue
                byte = bytes([int(np.flatnonzero(byte_class == c)[0])])
                raise NotDeterministic(
                    f"the rule {names[position_rule[p]]!r} may end before the byte {byte!r} or read "
                    "it itself (a one-byte lookahead cannot tell)"
                )

    # Slots: slot 0 is the empty stack; slot k >= 1 the k-th return site of the rule.
    rule_sites = [(BOTTOM,)] + [tuple(sorted(sites[r] - {BOTTOM})) for r in range(callables)]
    slot_of = np.zeros((len(automata), num_positions), np.int32)
    for rule, listed in enumerate(rule_sites):
        for k, site in enumerate(listed):
            if site != BOTTOM:
                slot_of[rule, site] = k + 1
    position_sites = [()] + [
        (BOTTOM,) if position_rule[p] == 0 else tuple(sorted(sites[position_rule[p] - 1]))
        for p in range(1, num_positions)
    ]
    position_slots = [()] + [
        (BOTTOM,) + (() if position_rule[p] == 0 else rule_sites[position_rule[p]])
        for p in range(1, num_positions)
    ]

    registered = {}
    if registers is not None and any(r is not None for r in registers):
        registered = _register_tables(automata, actions, offsets, nxt, push, position_rule)
        registered.update(
            register_token_tables(registered, nxt, byte_class, position_sites, vocabulary)
        )
        registered.update(
            counter_tables(registered, nxt, push, position_rule, byte_class, vocabulary)
        )

    initial = int(offsets[0]) + automata[0].initial
    distance = _distances(nxt, push, final, byte_class, vocabulary)
    ends = distance
    if distance[initial] >= UNREACHABLE:  # the one-byte tokens cannot end it: can any bytes?
        ends = _distances(nxt, push, final, byte_class, None)
    if ends[initial] >= UNREACHABLE:
        starts = offsets[:-1] + np.asarray([a.initial for a in automata])
        endless = [names[a] for a in range(len(automata)) if ends[starts[a]] >= UNREACHABLE]
        endless = list(dict.fromkeys(endless))  # the start rule may also be called
        many = len(endless) > 1
        raise GrammarError(
            f"the grammar's language has no finite sentence: the rule{'s' if many else ''} "
            f"{', '.join(map(repr, endless))} never end{'' if many else 's'} (every derivation "
            "calls a rule again)"
        )
    min_room = _min_rooms(nxt, push, final, byte_class, vocabulary, stack_depth)
    masks, mask_row, candidates, candidate_bytes, _, moves = token_tables(
        nxt,
        push,
        byte_class,
        position_sites,
        position_slots,
        vocabulary,
        stack_depth,
        distance,
        min_room,
    )
    frames = None
    if registered:
        frames = register_frames(
            nxt,
            push,
            final,
            _readable(byte_class, vocabulary),
            position_rule,
            registered["reg_set"],
            registered["reg_require"],
        )
    token_distance, best_token, token_cost, register_budget = token_budget(
        moves,
        final,
        mask_row.shape[1],
        stack_depth,
        vocabulary.vocab_size,
        num_positions,
        frames,
    )
    if register_budget is not None:
        registered.update(register_budget)
    if token_distance[initial, -1] >= UNREACHABLE:
        raise GrammarError(
            f"no sentence of the grammar fits within stack_depth={stack_depth} open calls "
            "(or can be spelled with the vocabulary's tokens): raise `stack_depth`"
        )
    best_bytes = int(
        vocabulary.token_length[best_token[best_token < vocabulary.vocab_size]].max(initial=1)
    )
    token_bytes, token_length = token_byte_matrix(vocabulary)
    byte_tokens = np.flatnonzero(vocabulary.token_length == 1)
    byte_tokens = np.concatenate(
        [
            byte_tokens,
            np.full(bucket(byte_tokens.size, 8) - byte_tokens.size, vocabulary.vocab_size),
        ]
    ).astype(np.int32)
    fork_next, fork_push, fork_tokens, fork_bytes, fork_reach = fork_tables(
        fork_ways, nxt, byte_class, position_sites, vocabulary
    )
    return PushdownAutomaton(
        byte_class=byte_class.astype(np.int32),
        next=nxt,
        push=push,
        final=final,
        initial=initial,
        mask_row=mask_row,
        slot_of=slot_of,
        masks=masks,
        candidates=candidates,
        token_bytes=token_bytes,
        token_length=token_length,
        candidate_bytes=candidate_bytes,
        stack_depth=stack_depth,
        eos_token_id=tuple(vocabulary.eos_token_id),
        position_rule=position_rule,
        rule_names=names,
        distance=distance,
        token_distance=token_distance,
        best_token=best_token,
        best_bytes=best_bytes,
        token_cost=token_cost,
        byte_tokens=byte_tokens,
        description=description,
        fork_next=fork_next,
        fork_push=fork_push,
        fork_tokens=fork_tokens,
        fork_bytes=fork_bytes,
        fork_reach=fork_reach,
        **registered,
    )


def _register_tables(automata, actions, offsets, nxt, push, position_rule) -> dict:
    """`reg_clear`, `reg_set`, `reg_require`, `reg_limit` of `PushdownAutomaton` (`positions x
    classes`):
    each (position, class) that reads its byte takes the register actions of the transition
    that reads it: its own rule's where it reads the byte itself, else (a call, or a tail call)
    those of the initial state of the rule whose position it moves to, the innermost callee
    (`actions[a]`: the class-level actions of automaton `a`, `None` for none)."""
    num_positions, nc = nxt.shape
    # every automaton's own byte moves and actions, by position
    own = np.full((num_positions, nc), REJECT, np.int64)
    dtypes = (bool, np.int32, np.uint32, np.int32)
    every = [np.zeros((num_positions, nc), dtype) for dtype in dtypes]
    for a, dfa in enumerate(automata):
        lo, hi = int(offsets[a]), int(offsets[a + 1])
        delta = dfa.delta[:, :nc]
        own[lo:hi] = np.where(delta != REJECT, delta + lo, REJECT)
        if actions[a] is not None:
            for table, values in zip(every, actions[a], strict=True):
                table[lo:hi] = values
    initial = np.asarray([int(offsets[a]) + dfa.initial for a, dfa in enumerate(automata)])
    pos, c = np.nonzero(nxt > 0)
    target = nxt[pos, c]
    itself = (push[pos, c, 0] == 0) & (own[pos, c] == target)
    reader = np.where(itself, pos, initial[position_rule[target]])
    names = ("reg_clear", "reg_set", "reg_require", "reg_limit")
    tables = {name: np.zeros_like(table) for name, table in zip(names, every)}
    for name, table in zip(names, every):
        tables[name][pos, c] = table[reader, c]
    return tables


_CALLED_RULES: dict = {}


def _byte_rule_automata(spec: GrammarSpec | None, rules, registers=None):
    """The automata of `build_pushdown(rules=...)`: the byte rules' DFAs and the grammar's
    recursive rules over common byte classes (bytes every DFA, register action and terminal
    treats alike), each with one call column per callable rule. Returns `(automata, names,
    classes, byte_class, actions)`, `actions[a]` the register actions of automaton `a` per
    (state, class) (`registers`' entry at the classes' representative bytes; `None` for the
    grammar's rules and where `registers` has none)."""
    cut = cut_rules(spec) if spec is not None else []
    if spec is not None:
        # The grammar's own rules do not depend on the byte rules: memoised per grammar (JSON
        # Schemas call the same JSON value grammar every time; its automaton costs ~3 ms).
        key = (repr(spec.rules), repr(spec.ignore), spec.start)
        hit = _CALLED_RULES.get(key)
        if hit is None:
            builder = RuleBuilder(spec, cut)
            called = [builder.rule_dfa(spec.rules[name], top=False) for name in cut]
            hit = (called, builder.byte_class, builder.num_classes)
            for array in [builder.byte_class, *(a for d in called for a in (d.delta, d.accepting))]:
                array.setflags(write=False)  # shared by every automaton built from `spec`
            if len(_CALLED_RULES) >= 8:
                _CALLED_RULES.pop(next(iter(_CALLED_RULES)))
            _CALLED_RULES[key] = hit
        called, grammar_class, grammar_nc = hit
    else:
        called, grammar_class, grammar_nc = [], np.zeros(256, np.int64), 1
    width = len(rules) - 1 + len(cut)
    for name, dfa, calls in rules:
        if calls.shape != (dfa.num_states, width):
            raise ValueError(
                f"build_pushdown: the calls of rule {name!r} have shape {calls.shape}, expected "
                f"{(dfa.num_states, width)} (states x callable rules)"
            )
    registers = list(registers) if registers is not None else [None] * len(rules)
    action_rows = [a.astype(np.int64) for r in registers if r is not None for a in r]
    _, byte_class = unique_rows(
        np.concatenate(
            [grammar_class[None, :], *[dfa.delta for _, dfa, _ in rules], *action_rows]
        ).T
    )
    representative = np.zeros(int(byte_class.max()) + 1, np.int64)
    representative[byte_class] = np.arange(256)
    old = grammar_class[representative]
    none = len(rules) - 1  # grammar rules call no byte rule
    called = [
        ByteDFA(
            np.concatenate(
                [
                    d.delta[:, old],
                    np.full((d.num_states, none), REJECT, d.delta.dtype),
                    d.delta[:, grammar_nc:],
                ],
                axis=1,
            ),
            d.accepting,
            d.initial,
        )
        for d in called
    ]
    automata = [
        ByteDFA(
            np.concatenate([dfa.delta[:, representative], calls.astype(dfa.delta.dtype)], axis=1),
            dfa.accepting,
            dfa.initial,
        )
        for _, dfa, calls in rules
    ] + called
    names = tuple(name for name, _, _ in rules) + tuple(cut)
    actions = [None if r is None else tuple(a[:, representative] for a in r) for r in registers] + [
        None
    ] * len(called)
    return automata, names, representative.size, byte_class, actions


def _readable(byte_class, vocabulary: TokenVocabulary | None):
    """Per byte class, whether one of its bytes is a token by itself (every class without a
    vocabulary)."""
    readable = np.zeros(int(byte_class.max()) + 1, bool)
    if vocabulary is None:
        readable[:] = True
    else:
        single = np.flatnonzero(vocabulary.token_length == 1)
        readable[byte_class[[vocabulary.token_bytes[t][0] for t in single]]] = True
    return readable


def _distances(nxt, push, final, byte_class, vocabulary: TokenVocabulary | None):
    """The fewest one-byte tokens from each position to one where its rule may end: 0 where
    it may, else `1 + distance[next] + sum(distance[pushed])` minimised over the bytes that are
    tokens by themselves (every byte with `vocabulary=None`: the fewest bytes, whatever the
    vocabulary; a shortest-path fixed point over the tables; the stack depth ignored). Summed
    over a configuration's position and stack they bound the tokens that end the text without
    a stack limit: the one-byte token of the first byte of that shortest completion exists and
    lowers the sum by one (a rule that may end never reads a byte that a return position below
    reads, so the byte returns as the sum assumes). The device budget uses the token-level
    `budget.token_budget` instead; these remain the byte-level reference (and, without a
    vocabulary, the test that the language has a sentence at all)."""

    def value(target, pushed, pushing):
        return np.minimum(1 + target + np.where(pushing, pushed, 0).sum(axis=-1), UNREACHABLE)

    readable = _readable(byte_class, vocabulary)
    return _fixed_point(nxt, push, final, readable, value)


def _min_rooms(nxt, push, final, byte_class, vocabulary: TokenVocabulary, stack_depth: int):
    """The fewest free stack slots with which each position's rule can end, over the bytes that
    are tokens by themselves: 0 where it may end, else `max(room[next] + k, room[pushed_i] + i)`
    (`k` pushes, `pushed_i` the `i`-th, bottom first) minimised; `UNREACHABLE` where that
    exceeds `stack_depth` or nothing ends. A token whose configuration after it needs no more
    slots than are free can be finished (`token_tables` uses it for the bitmask levels)."""
    lanes = np.arange(push.shape[-1])

    def value(target, pushed, pushing):
        count = pushing.sum(axis=-1)
        need = np.maximum(target + count, np.where(pushing, pushed + lanes, 0).max(axis=-1))
        return np.where(need > stack_depth, UNREACHABLE, need)

    readable = _readable(byte_class, vocabulary)
    return _fixed_point(nxt, push, final, readable, value)


def _fixed_point(nxt, push, final, readable, value):
    """The least fixed point of `out[p] = 0` where `p` is final, else the least `value(out[next],
    out[pushed], pushing)` over the readable byte classes that `p` reads (`UNREACHABLE` where
    none), `value` monotone and at least its target's (`_distances`, `_min_rooms`)."""
    # The edges as flat lists (positions in order, as `np.nonzero` gives them). A worklist:
    # each round re-evaluates only the edges whose target or pushed positions changed in the
    # last one (every edge every round took one round per step of the longest completion: 2 s
    # for a schema with strings of maxLength 256, MaskBench Github_ultra o34345).
    at, cls = np.nonzero((nxt > 0) & readable[None, : nxt.shape[1]])
    target = nxt[at, cls]
    pushes = push[at, cls]
    pushing = pushes > 0
    edge = np.arange(at.size)
    users = np.concatenate([target, pushes[pushing]])  # edge `by[i]` depends on `users[i]`
    by = np.concatenate([edge, np.broadcast_to(edge[:, None], pushes.shape)[pushing]])
    order = np.argsort(users, kind="stable")
    users_ptr = np.searchsorted(users[order], np.arange(nxt.shape[0] + 1))
    by = by[order]
    distance = np.where(final, 0, UNREACHABLE).astype(np.int64)
    distance[DEAD] = UNREACHABLE
    active = edge
    while active.size:
        values = value(distance[target[active]], distance[pushes[active]], pushing[active])
        source = at[active]  # sorted, as `active` is
        starts = np.flatnonzero(np.diff(source, prepend=-1))
        best = np.minimum.reduceat(values, starts)
        better = best < distance[source[starts]]
        changed = source[starts][better]
        distance[changed] = best[better]
        active = np.unique(by[ragged_rows(users_ptr, changed)[1]]) if changed.size else changed
    return distance.astype(np.int32)
