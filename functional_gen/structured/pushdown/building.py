"""Building a `PushdownAutomaton` (`build_pushdown`): each (position, byte) gets one action
(steps 1 and 2 of `functional_gen.structured.pushdown`), the budget distances, then the token
tables (`token_tables`, step 3).
"""

import typing
from collections.abc import Sequence

import numpy as np
from jaxtyping import Int

from ..buckets import bucket
from ..byte_dfa import REJECT, ByteDFA, ragged_rows, token_trie, trie_levels
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
        registered.update(_register_tokens(registered, nxt, byte_class, position_sites, vocabulary))
        registered.update(
            _counter_tables(registered, nxt, push, position_rule, byte_class, vocabulary)
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
    fork_next, fork_push, fork_tokens, fork_bytes, fork_reach = _fork_tables(
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


def _fork_tables(fork_ways: list, nxt, byte_class, position_sites, vocabulary: TokenVocabulary):
    """`(fork_next, fork_push, fork_tokens, fork_bytes, fork_reach)` of `PushdownAutomaton`
    from the ways of each fork (`(pushed, target)` each, target `POP` for "return and read the
    byte below"): targets and pushes 0-padded, the tokens whose bytes may reach a fork
    (`_fork_tokens`, padded with `vocab_size`), the longest of them in
    bytes, and per position the packed bits of the fork tokens that may reach a fork from it
    (bit `j % 32` of word `j // 32`: `fork_tokens[j]`). Empty (`(0, 1)`, `(0, 1, 1)`, `(0,)`,
    0, `(positions, 0)`) without forks."""
    ways = max((len(w) for w in fork_ways), default=1)
    width = max((len(p) for w in fork_ways for p, _ in w), default=1)
    fork_next = np.zeros((len(fork_ways), ways), np.int32)
    fork_push = np.zeros((len(fork_ways), ways, max(width, 1)), np.int32)
    for f, options in enumerate(fork_ways):
        for k, (pushed, target) in enumerate(options):
            fork_next[f, k] = target
            fork_push[f, k, : len(pushed)] = pushed
    if not fork_ways:
        no_reach = np.zeros((nxt.shape[0], 0), np.uint32)
        return fork_next, fork_push, np.zeros(0, np.int32), 0, no_reach
    tokens, reach = _fork_tokens(nxt, fork_next, byte_class, position_sites, vocabulary)
    return fork_next, fork_push, *_packed_reach(tokens, reach, vocabulary)


def _packed_reach(tokens, reach, vocabulary: TokenVocabulary):
    """`(padded, longest, packed)` of `_fork_tokens`' `(tokens, reach)`: the tokens padded with
    `vocab_size` to a bucket of 8, the longest in bytes, and per position the packed bits of
    those it reaches (bit `j % 32` of word `j // 32`: `padded[j]`)."""
    longest = int(vocabulary.token_length[tokens].max(initial=1))
    padded = np.full(bucket(tokens.size, 8), vocabulary.vocab_size, np.int32)
    padded[: tokens.size] = tokens
    bits = np.zeros((reach.shape[0], -(-padded.size // 32) * 32), bool)
    bits[:, : tokens.size] = reach
    packed = np.packbits(bits, axis=1, bitorder="little").view(np.uint32)
    return padded, longest, np.ascontiguousarray(packed)


def _register_tokens(tables: dict, nxt, byte_class, position_sites, vocabulary: TokenVocabulary):
    """`register_tokens`, `register_bytes`, `register_reach` of `PushdownAutomaton`: the tokens
    whose walk may meet the register action that can refuse (`reg_require`) and still
    be alive after their last byte, from some configuration, and per position (packed, as
    `_packed_reach`) those that may from it. Over any stack (a return may go to any return site
    of the rule): a superset, checked exactly on the device with the register."""
    hits = tables["reg_require"] > 0
    tokens, reach = _fork_tokens(
        nxt, np.zeros((0, 1), np.int32), byte_class, position_sites, vocabulary, hits=hits
    )
    names = ("register_tokens", "register_bytes", "register_reach")
    return dict(zip(names, _packed_reach(tokens, reach, vocabulary)))


def _counter_tables(tables: dict, nxt, push, position_rule, byte_class, vocabulary) -> dict:
    """`counter_row`, `counter_limit`, `counted` of `PushdownAutomaton` for the counter rules
    (rules with a `reg_limit`, `json_schema.counter_strings`; `{}` without one): per position of
    such a rule its row (`-1` elsewhere), per row its rule's limit, and per row and token the
    characters the token writes from that position before it leaves the rule (its bytes read
    by the rule itself, no call nor return; `Int16`). A token that enters a counter rule from
    outside writes fewer characters than its bytes, so none exceeds the limit when no token is
    longer than it: refused otherwise (`ValueError`)."""
    limit = tables["reg_limit"]
    if not (limit > 0).any():
        return {}
    rules = np.unique(position_rule[np.flatnonzero((limit > 0).any(axis=1))])
    positions = np.flatnonzero(np.isin(position_rule, rules))
    positions = positions[positions > 0]
    row_of = np.full(nxt.shape[0], -1, np.int32)
    row_of[positions] = np.arange(positions.size)
    rule_limit = {int(r): int(limit[position_rule == r].max()) for r in rules}
    counter_limit = np.asarray([rule_limit[int(r)] for r in position_rule[positions]], np.int32)
    token_bytes, token_length = token_byte_matrix(vocabulary)
    if int(token_length.max(initial=0)) > int(counter_limit.min()):
        raise ValueError(
            f"a counter string of at most {int(counter_limit.min())} characters with tokens of "
            f"up to {int(token_length.max())} bytes: a token entering it could pass the limit"
        )
    classes = byte_class[token_bytes]  # [vocab, max_bytes]
    counted = np.zeros((positions.size, token_length.size), np.int16)
    for row, start in enumerate(positions):
        pos = np.full(token_length.size, start, np.int64)
        alive = np.ones(token_length.size, bool)
        for j in range(classes.shape[1]):
            c = classes[:, j]
            target = nxt[pos, c]
            alive &= (j < token_length) & (target > 0) & (push[pos, c, 0] == 0)
            alive &= position_rule[np.maximum(target, 0)] == position_rule[start]
            counted[row] += alive & (limit[pos, c] > 0)
            pos = np.where(alive, target, pos)
    return {"counter_row": row_of, "counter_limit": counter_limit, "counted": counted}


_REACH_CHUNK = 1024
"""Positions walked together by `_fork_tokens` for `fork_reach`."""

_WIDE_STEP = 64
"""Sets of more positions than this are stepped by `_fork_tokens` with numpy (with `hits`)."""


def _fork_tokens(
    nxt, fork_next, byte_class, position_sites, vocabulary: TokenVocabulary, hits=None
):
    """`(tokens, reach)`: the tokens whose bytes may reach a fork from some configuration
    (`Int32[np.ndarray, " tokens"]`, ascending), and per position which of them may reach a
    fork from it (`Bool[np.ndarray, "positions tokens"]`, position 0 none).

    With `hits` (`Bool[np.ndarray, "positions classes"]`, a grammar without forks): the same
    for the bytes `hits` marks (`_register_tokens`: the register actions) instead of forks,
    and only tokens whose walk is still alive after their last byte; the trie is walked only
    where a hit may still come (`_hit_distances`, `_hit_depths`), the sets of more than
    `_WIDE_STEP` positions stepped with numpy, and `reach` only from the positions within the
    longest of `tokens` of a hit (the same result: MaskBench o6090's 0.7 s became 0.1 s).

    A walk of the vocabulary's trie over *sets* of positions, from every position at once for
    `tokens`, then from each position alone over the trie nodes of `tokens` for `reach`; a
    return may go to any return site of the rule (a superset of what a stack holds) and a fork
    follows all its ways. Every other token reads its bytes in one way from any configuration,
    and a token outside `reach[p]` in one way from any configuration at position `p`, so the
    deterministic tables give its mask there exactly."""
    trie = token_trie(vocabulary)
    nxt_list, class_list = nxt.tolist(), byte_class.tolist()
    fork_list = fork_next.tolist()
    set_ids: dict = {}
    sets: list = []

    @typing.no_type_check
    def intern(members) -> int:
        key = frozenset(members)
        i = set_ids.get(key)
        if i is None:
            i = set_ids[key] = len(sets)
            sets.append(key)
        return i

    memo: dict = {}

    hit_list = hits.tolist() if hits is not None else None

    @typing.no_type_check
    def step(sid: int, c: int):
        out, hit, seen = set(), False, set(sets[sid])
        work = list(seen)
        while work:
            p = work.pop()
            act = nxt_list[p][c]
            targets = [act]
            if hit_list is not None:
                hit = hit or (act > 0 and hit_list[p][c])
            elif act <= FORK:
                hit, targets = True, fork_list[FORK - act]
            for t in targets:
                if t > 0:
                    out.add(t)
                elif t == POP:
                    for site in position_sites[p]:
                        if site != BOTTOM and site not in seen:
                            seen.add(site)
                            work.append(site)
        return intern(out), hit

    if hits is not None:  # `step` over large sets, with numpy (the root's set is every position)
        by_class = np.ascontiguousarray(nxt.T)
        hit_by_class = np.ascontiguousarray(hits.T) & (by_class > 0)
        site_ids: dict = {}
        site_key = np.asarray([site_ids.setdefault(s, len(site_ids)) for s in position_sites])
        site_rows = [np.asarray([v for v in s if v != BOTTOM], np.int64) for s in site_ids]

    @typing.no_type_check
    def step_wide(sid: int, c: int):
        work = np.fromiter(sets[sid], np.int64, len(sets[sid]))
        seen = np.zeros(nxt.shape[0], bool)
        seen[work] = True
        reads, hit = [], False
        while work.size:
            act = by_class[c, work]
            hit = hit or bool(hit_by_class[c, work].any())
            reads.append(act[act > 0])
            popped = np.unique(site_key[work[act == POP]])
            sites = np.unique(np.concatenate([site_rows[k] for k in popped.tolist()] or [work[:0]]))
            work = sites[~seen[sites]]
            seen[work] = True
        return intern(np.unique(np.concatenate(reads)).tolist()), hit

    @typing.no_type_check
    def stepped(key):
        hit = memo.get(key)
        if hit is None:
            wide = hits is not None and len(sets[key[0]]) > _WIDE_STEP
            hit = memo[key] = step_wide(*key) if wide else step(*key)
        return hit

    parent, level_ptr, token_node = trie_levels(trie)
    node_byte = trie.byte.tolist()
    sets_of = [0] * trie.num_nodes
    forked_list = [False] * trie.num_nodes
    sets_of[0] = intern(range(1, nxt.shape[0]))
    parent_list = parent.tolist()
    # With `hits`, a node's children are walked only while a hit may still come below it: the
    # walk has hit already (its tokens' liveness is still needed), or a position of its set lies
    # within `below[n] - 1` bytes of a hit (`_hit_distances`, a lower bound), `below[n]` the
    # deepest node under `n` whose byte is of a hit class (`_hit_depths`). Every node left out
    # has no hit (`forked` false), so the tokens are those of the full walk.
    if hits is not None:
        cap = max(level_ptr.size - 3, 0)  # the deepest token, less one byte
        distance = _hit_distances(nxt, hits, position_sites, cap)
        distance_list = distance.tolist()
        below = _hit_depths(trie, parent, level_ptr, hits.any(axis=0)[byte_class]).tolist()
        nearest: dict = {}
        empty = intern(())
    opened = [True] * trie.num_nodes
    for n in range(1, trie.num_nodes):
        up = parent_list[n]
        if not opened[up]:
            opened[n] = False
            sets_of[n] = empty
            continue
        hit = stepped((sets_of[up], class_list[node_byte[n]]))
        sets_of[n] = hit[0]
        forked_list[n] = forked_list[up] or hit[1]
        if hits is not None and not forked_list[n]:
            near = nearest.get(hit[0])
            if near is None:
                near = nearest[hit[0]] = min(
                    (distance_list[p] for p in sets[hit[0]]), default=UNREACHABLE
                )
            opened[n] = near <= below[n] - 1
    forked = np.asarray(forked_list, bool)
    if hits is not None:  # alive after the last byte
        forked &= np.asarray([len(sets[i]) > 0 for i in sets_of], bool)
    order = np.argsort(trie.token_ids[forked[token_node]], kind="stable")
    tokens = trie.token_ids[forked[token_node]][order].astype(np.int32)
    nodes = token_node[forked[token_node]][order]

    # Per position: the same walk from {position} over the nodes of `tokens` and their
    # ancestors (a fork reached from one position is reached from all of them together, so no
    # other node matters): a row of origins per node, one depth at a time (nodes are numbered
    # depth by depth), one step per distinct (set, class) of the depth; origins in chunks of
    # `_REACH_CHUNK`, so that a depth's rows stay small.
    needed = np.zeros(trie.num_nodes, bool)
    frontier = np.unique(nodes)
    while frontier.size:
        frontier = frontier[~needed[frontier]]
        needed[frontier] = True
        frontier = np.unique(parent[frontier[frontier > 0]])
    kept = np.flatnonzero(needed)
    depth_of = np.searchsorted(level_ptr, kept, side="right") - 1
    levels = [kept[depth_of == d] for d in range(1, int(depth_of.max(initial=0)) + 1)]
    token_depth = np.searchsorted(level_ptr, nodes, side="right") - 1
    num_classes = int(byte_class.max()) + 1
    # With `hits`, only the positions within the longest token's length (less one) of a hit can
    # meet one: every other row stays false.
    starts = np.arange(1, nxt.shape[0])
    if hits is not None:
        longest = int(vocabulary.token_length[tokens].max(initial=0))
        starts = starts[distance[starts] <= longest - 1]
    origins = np.asarray([intern((p,)) for p in starts.tolist()], np.int64)
    reach = np.zeros((nxt.shape[0], tokens.size), bool)
    for lo in range(0, origins.size, _REACH_CHUNK):
        walked = origins[None, lo : lo + _REACH_CHUNK]  # the root's row
        rows_of = starts[lo : lo + _REACH_CHUNK]
        hit_rows = np.zeros(walked.shape, bool)
        above = np.zeros(1, np.int64)
        for depth, level in enumerate(levels, 1):
            up = np.searchsorted(above, parent[level])
            keys = walked[up] * num_classes + byte_class[trie.byte[level]][:, None]
            distinct, inverse = np.unique(keys, return_inverse=True)
            results = [stepped(divmod(k, num_classes)) for k in distinct.tolist()]
            inverse = inverse.reshape(keys.shape)
            walked = np.asarray([r[0] for r in results], np.int64)[inverse]
            hit_rows = hit_rows[up] | np.asarray([r[1] for r in results], bool)[inverse]
            above = level
            here = np.flatnonzero(token_depth == depth)
            rows = np.searchsorted(level, nodes[here])
            reached = hit_rows[rows]
            if hits is not None:  # alive after the last byte
                reached = reached & (np.asarray([len(m) for m in sets])[walked[rows]] > 0)
            reach[np.ix_(rows_of, here)] = reached.T
    return tokens, reach


def _hit_distances(nxt, hits, position_sites, cap: int) -> np.ndarray:
    """Per position, a lower bound on the bytes read before one meets a `hits` (position, class)
    from it (`_fork_tokens`' walk: 0 where the position itself may read a hit byte): the
    fewest byte moves over every byte class to a position with a hit, a return (`POP`) moving
    at no cost to any return site of the rule. `Int32[np.ndarray, " positions"]`, `cap + 1`
    where more than `cap` (or none); `hits`: `Bool[np.ndarray, "positions classes"]`,
    `position_sites` as `build_pushdown`'s."""
    num_positions = nxt.shape[0]
    far = cap + 1
    source, cls = np.nonzero(nxt > 0)
    target = nxt[source, cls]
    order = np.argsort(target, kind="stable")
    before = source[order]  # the positions that move to each target, CSR by target
    before_ptr = np.searchsorted(target[order], np.arange(num_positions + 1))
    groups: dict = {}  # return sites -> the positions that may return to them
    for p in np.flatnonzero((nxt == POP).any(axis=1)).tolist():
        groups.setdefault(position_sites[p], []).append(p)
    returns = [
        (np.asarray([s for s in sites if s != BOTTOM], np.int64), np.asarray(members, np.int64))
        for sites, members in groups.items()
        if any(s != BOTTOM for s in sites)
    ]
    distance = np.full(num_positions, far, np.int32)
    level = np.flatnonzero((hits & (nxt > 0)).any(axis=1))
    for d in range(far):
        if not level.size:
            break
        distance[level] = d
        grown = True
        while grown:  # returns cost nothing: their positions join this level
            grown = False
            for sites, members in returns:
                if (distance[sites] <= d).any():
                    new = members[distance[members] > d]
                    if new.size:
                        distance[new] = d
                        level = np.concatenate([level, new])
                        grown = True
        previous = before[ragged_rows(before_ptr, level)[1]]
        level = np.unique(previous[distance[previous] == far])
    return distance


def _hit_depths(trie, parent, level_ptr, hit_byte) -> np.ndarray:
    """Per trie node, the depth below it of its deepest descendant whose byte `hit_byte` marks
    (`Bool[np.ndarray, " 256"]`); 0 where none. `Int64[np.ndarray, " nodes"]`."""
    below = np.zeros(trie.num_nodes, np.int64)
    marked = hit_byte[trie.byte]
    for d in range(len(level_ptr) - 2, 0, -1):  # deepest level first
        level = np.arange(level_ptr[d], level_ptr[d + 1])
        value = np.where(below[level] > 0, below[level] + 1, np.where(marked[level], 1, 0))
        np.maximum.at(below, parent[level], value)
    return below


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
