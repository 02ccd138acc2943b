"""`PushdownAutomaton`: a context-free grammar run on the device with a bounded stack.

The bounded-depth DFA of `functional_gen.structured.grammar` unrolls recursion, and its states
double with every level of JSON nesting. Here the grammar keeps its recursion: it becomes a
*recursive transition network*, one minimal automaton per recursive rule, whose "call" edges
push a return position on a stack. Each row's state is `(position, stack, stack_pointer)`:
int32 scalars and an `int32[stack_depth]` array, so the depth costs memory, not states.

**Compilation (host, numpy).**

1. The rules that break every cycle of the rule graph are cut (`grammar_rules.cut_rules`: `value` for
   JSON); every other reference is inlined. The start rule and each cut rule become minimal
   automata over byte classes and call symbols (`grammar_rules.RuleBuilder`). Their states, numbered in
   one space, are the *positions* (position 0 is dead).
2. Each (position, byte) gets ONE action: read the byte in the current rule (`next > 0`),
   possibly after calls into rules that start with it (the return positions to push, at most
   `pushes` of them, in `push`); or return (`next == POP`) when the rule may end here and cannot
   read the byte, so the byte is retried at the position popped from the stack; or reject. A
   grammar in which one byte could be read in two ways (the byte itself and a call, two calls,
   a rule that matches the empty string, left recursion) is refused with `NotDeterministic`
   (`Grammar` then falls back to the bounded-depth DFA). Returning only when the rule cannot
   continue is the longest-match rule of lexers; so that it never hides a text, a rule that may
   end before a byte and also read that byte itself, where one of its return positions reads it
   too, is refused as well (a one-byte lookahead cannot tell). A call whose return position
   can only end the rule is a tail call and pushes nothing. (JSON Schemas use a byte DFA with
   call edges to a JSON value rule as the bottom frame instead of a start rule: `top`.)
3. Token masks. A token either reads its bytes inside the rules it enters (whatever is below on
   the stack), or returns from the current rule and then depends on the return positions on the
   stack. We walk every token from every position along the vocabulary's byte trie (as
   `byte_dfa.lift` does). Positions from which no token returns are walked once; the others once
   per *slot*, the return position on top of the stack (slot 0: the stack is empty), since the
   first return goes there (the once-walk of a position stops at its first return, and a
   position's slots share one walk's tables). A further return below branches over every
   return position its rule has in the grammar (a superset of what the stack can hold). A
   token accepted on every branch is *context-independent*: it goes into a packed bitmask per
   (position, slot, free stack slots it needs), so a nearly full stack drops the tokens that
   would overflow it. A token accepted on some branches only is a *candidate*: the padded list
   `candidates[position, slot]` (at most `K` of them; 3-10 for the test grammars) is checked on
   the device. Tokens rejected on every branch are never allowed. (Cf. XGrammar's
   context-independent and context-dependent tokens, Dong et al. 2024, arXiv 2411.15100.)
   The walks share their work: all origins of a pass walk the trie together, each trie node
   holding the state of every origin after its bytes (one function per node, shared by the
   nodes with the same parent function and byte class, as `byte_dfa.lift` does), so the cost
   is per distinct function, not per (trie node, state).

**On the device, per step and row** (`PushdownConstraint.process`):

1. advance on the previous token: its bytes one by one (`token_bytes`, a `while_loop` over its
   length), each byte popping while the position says `POP`, then reading or pushing;
2. mask: the bitmask row `masks[mask_row[position, slot, min(room, levels - 1)]]` unpacked over
   the vocabulary (`slot` from the top of the stack, `room` the free stack slots), plus the `K`
   candidates walked from the row's real stack (vectorised, a
   fixed-length loop over their bytes); a token that would push beyond `stack_depth` is not
   allowed; the end-of-generation ids are allowed when the position and every return position
   on the stack may end;
3. the budget, as the DFA processors keep it: with `r` tokens left (this one included), a
   token is allowed only if the configuration after it can end within `r - 1` tokens. The
   bound is `need = distance[position] + sum(distance[stack])`, where `distance` is the fewest
   *one-byte tokens* that finish a rule (a fixed point over `next`/`push` at build time, over
   the bytes that are tokens by themselves): the vocabulary can always achieve it, so a row
   that keeps `need <= r` always has a token left and ends inside the language, and at
   `r = 1` only tokens that complete the text (or EOS) remain. The bitmask row is used whole
   while `sum(distance[stack]) + budget_cost[position, slot] <= r - 1` (`budget_cost`: the
   largest `need` a bitmask token leaves above the stack); closer to the end it is dropped and
   only the one-byte tokens and the candidates, walked exactly with their `need`, are allowed.
   (The bound ignores `stack_depth`: a completion that would overflow a full stack is not
   available, and such a row may end with `"constraint"`.)
4. every other logit becomes `-inf`; a row left with nothing ends with `"constraint"`.
"""

import dataclasses
import typing
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, UInt8, UInt32

from ..processors.base import AbstractLogitsProcessor, Context, per_row_field
from .buckets import bucket
from .byte_dfa import REJECT, ByteDFA, ragged_rows, token_trie, trie_levels
from .grammar_rules import RuleBuilder, cut_rules
from .grammar_syntax import GrammarError, GrammarSpec
from .vocabulary import TokenVocabulary

# Nested helpers that run per byte, state or schema node are `@typing.no_type_check`: the
# tests' jaxtyping import hook would wrap every call of them (30-40 us each, and a fresh
# wrapper per definition), which was most of the structured tests' time.

DEAD = 0
"""The dead position: nothing is read there."""
POP = -1
"""`next` entry: the current rule ends here; return and retry the byte."""
DEFAULT_STACK_DEPTH = 32
"""Default number of stack slots (return positions) per row."""
MAX_LEVELS = 8
"""Tokens that push more than `MAX_LEVELS - 1` return positions are candidates, not bitmask
entries."""
UNREACHABLE = 1 << 20
"""`distance` of positions from which no end of the rule is reachable (small enough that a
stack's worth of them sums without overflow in int32)."""
_BOTTOM = -1  # a "return site" meaning: the rule may be the bottom frame (a return fails)
_PENDING = -2  # a top of stack not known yet: a walk that returns to it stops (see pass 2)


class NotDeterministic(GrammarError):
    """The grammar cannot run as a deterministic pushdown automaton (the message says why)."""


@dataclasses.dataclass(frozen=True, eq=False)
class PushdownAutomaton:
    """The host tables of a grammar's pushdown automaton (see the module docstring).

    **Attributes:**

    - `byte_class`: `Int[np.ndarray, " 256"]`, the class of each byte.
    - `next`: `Int[np.ndarray, "positions classes"]`, the action per position and byte class:
      `> 0` the next position, `POP` (-1) return, `DEAD` (0) reject.
    - `push`: `Int[np.ndarray, "positions classes pushes"]`, return positions pushed (in order,
      0-padded) before moving to `next`.
    - `final`: `Bool[np.ndarray, " positions"]`, where the current rule may end.
    - `initial`: the start position.
    - `mask_row`: `Int[np.ndarray, "positions levels"]`, the row of `masks` per position and
      free stack slots (clamped to `levels - 1`).
    - `masks`: `UInt32[np.ndarray, "rows words"]`, packed bitmasks (token `t` is bit `t % 32` of
      word `t // 32`) of the context-independent tokens.
    - `candidates`: `Int[np.ndarray, "positions candidates"]`, the stack-dependent tokens,
      padded with `vocab_size`.
    - `token_bytes`: `UInt8[np.ndarray, "vocab max_bytes"]`, `token_length`:
      `Int[np.ndarray, " vocab"]`, each token's bytes (length 0: never text).
    - `candidate_bytes`: the longest candidate, in bytes.
    - `stack_depth`, `eos_token_id`, `description`.
    - `position_rule`: `Int[np.ndarray, " positions"]` and `rule_names`: which rule each
      position belongs to (for messages and drawings).
    - `distance`: `Int[np.ndarray, " positions"]`, the fewest single-byte tokens from each
      position to one where its rule may end (`UNREACHABLE` if none); a configuration needs at
      most `distance[position] + sum(distance[stack])` tokens to end (see `need`).
    - `budget_cost`: `Int[np.ndarray, "positions slots"]`, per (position, slot) the largest
      `distance[position'] + sum(distance[pushed])` after a bitmask token: the bitmask row
      holds within the budget when the stack's distances plus this fit in it.
    - `byte_tokens`: `Int[np.ndarray, " byte_tokens"]`, the one-byte tokens (padded with
      `vocab_size`), checked exactly near the end of the budget.
    """

    byte_class: Int[np.ndarray, " 256"]
    next: Int[np.ndarray, "positions classes"]
    push: Int[np.ndarray, "positions classes pushes"]
    final: Bool[np.ndarray, " positions"]
    initial: int
    mask_row: Int[np.ndarray, "positions slots levels"]
    slot_of: Int[np.ndarray, "rules positions"]
    masks: UInt32[np.ndarray, "rows words"]
    candidates: Int[np.ndarray, "positions slots candidates"]
    token_bytes: UInt8[np.ndarray, "vocab max_bytes"]
    token_length: Int[np.ndarray, " vocab"]
    candidate_bytes: int
    stack_depth: int
    eos_token_id: tuple[int, ...]
    position_rule: Int[np.ndarray, " positions"]
    rule_names: tuple[str, ...]
    distance: Int[np.ndarray, " positions"]
    budget_cost: Int[np.ndarray, "positions slots"]
    byte_tokens: Int[np.ndarray, " byte_tokens"]
    description: str = ""

    @property
    def num_positions(self) -> int:
        """Positions, the dead position 0 included."""
        return self.next.shape[0]

    @property
    def vocab_size(self) -> int:
        """Token ids covered."""
        return self.token_length.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the device tables."""
        return sum(
            a.nbytes
            for a in (
                self.next,
                self.push,
                self.final,
                self.mask_row,
                self.slot_of,
                self.masks,
                self.candidates,
                self.token_bytes,
                self.token_length,
                self.distance,
                self.budget_cost,
                self.byte_tokens,
            )
        )

    # ------------------------------------------------------------------ host reference

    def step(self, config, byte: int):
        """One byte from `config = (position, stack)` (stack a tuple, top last): the next
        configuration, or `None` when the byte is not allowed (or the stack overflows)."""
        pos, stack = config
        c = self.byte_class[byte]
        while self.next[pos, c] == POP and stack:
            pos, stack = stack[-1], stack[:-1]
        target = int(self.next[pos, c])
        if target <= 0:
            return None
        pushed = tuple(int(p) for p in self.push[pos, c] if p)
        if len(stack) + len(pushed) > self.stack_depth:
            return None
        return target, stack + pushed

    def walk(self, data: bytes, config=None):
        """The configuration after `data` (from the initial one), or `None`."""
        config = (self.initial, ()) if config is None else config
        for b in data:
            config = self.step(config, b)
            if config is None:
                return None
        return config

    def can_end(self, config) -> bool:
        """Whether generation may end in `config` (the position and every return position final)."""
        pos, stack = config
        return bool(self.final[pos]) and all(self.final[p] for p in stack)

    def accepts(self, data: bytes) -> bool:
        """Whether the automaton accepts `data` as a whole text."""
        config = self.walk(data)
        return config is not None and self.can_end(config)

    def need(self, config) -> int:
        """An upper bound on the tokens that end the text from `config`: the fewest one-byte
        tokens that finish the current rule and then each rule on the stack."""
        pos, stack = config
        return int(self.distance[pos]) + sum(int(self.distance[p]) for p in stack)

    def allowed(self, config, remaining: int | None = None) -> Bool[np.ndarray, " vocab"]:
        """The tokens the device allows in `config` with `remaining` tokens left to generate
        (this one included; `None`: no budget), computed from the tables as the device does
        (bitmask row + candidates and one-byte tokens walked exactly), EOS included."""
        pos, stack = config
        room = self.stack_depth - len(stack)
        slot = self.slot_of[self.position_rule[pos], stack[-1] if stack else 0]
        row = self.masks[self.mask_row[pos, slot, min(room, self.mask_row.shape[2] - 1)]]
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: self.vocab_size].astype(bool)
        below = self.need(config) - int(self.distance[pos])
        if remaining is not None and below + int(self.budget_cost[pos, slot]) > remaining - 1:
            bits[:] = False  # near the end of the budget: exact checks only

        def exact(t) -> bool:
            data = bytes(self.token_bytes[t, : self.token_length[t]])
            after = self.walk(data, config)
            return after is not None and (remaining is None or self.need(after) <= remaining - 1)

        for t in (*self.byte_tokens, *self.candidates[pos, slot]):
            if t < self.vocab_size:
                bits[t] = exact(t)
        bits[list(self.eos_token_id)] = self.can_end(config)
        return bits

    def __repr__(self):
        return (
            f"PushdownAutomaton({self.description!r}, positions={self.num_positions}, "
            f"slots={self.candidates.shape[1]}, candidates={self.candidates.shape[2]}, stack_depth={self.stack_depth}, "
            f"{self.nbytes / 2**20:.2f} MiB)"
        )


# ------------------------------------------------------------------------------ build


def build_pushdown(
    spec: GrammarSpec | None,
    vocabulary: TokenVocabulary,
    *,
    stack_depth: int = DEFAULT_STACK_DEPTH,
    description: str = "",
    top: tuple[ByteDFA, Int[np.ndarray, " states"], str] | None = None,
    rules: Sequence[tuple[str, ByteDFA, np.ndarray]] | None = None,
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
    it: one rule per large subschema (`json_schema.json_schema_grammar`).

    **Raises:** `NotDeterministic` when a byte could be read in two ways, a recursive rule
    matches the empty string or is left-recursive; `GrammarError` for an empty language;
    `ValueError` for `top` and `rules` together or a `calls` table of the wrong width.
    """
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
        automata, names, nc, byte_class = _byte_rule_automata(spec, rules)
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
        dfa = automata[a]
        options = []
        t = int(dfa.delta[q, c])
        if t != REJECT:
            options.append(((), int(offsets[a]) + t, None))
        for r in np.flatnonzero(dfa.delta[q, nc:] != REJECT):
            ret = int(dfa.delta[q, nc + r])
            e = entry(int(r), c)
            if e is not None:
                pushed = () if tail(a, ret) else (int(offsets[a]) + ret,)
                options.append((pushed + e[0], e[1], names[1 + r]))
        if len(options) > 1:
            byte = bytes([int(np.flatnonzero(byte_class == c)[0])])
            ways = ", ".join("itself" if o[2] is None else f"a call of {o[2]!r}" for o in options)
            raise NotDeterministic(
                f"in rule {names[a]!r} the byte {byte!r} can be read in {len(options)} ways ({ways})"
            )
        return options[0][:2] if options else None

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
                act = action(a, q, c)
                if act is not None:
                    nxt[pos, c] = act[1]
                    if act[0]:
                        pushes[pos, c] = act[0]
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
                extra = {_BOTTOM} if a == 0 else sites[a - 1]
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
            if s == _BOTTOM:
                continue
            act = nxt[s, c]
            if act > 0 or (
                act == POP
                and position_rule[s] not in busy
                and read_after_return(int(position_rule[s]), c, busy | {rule})
            ):
                found = True
                break
        memo_after[rule, c] = found
        return found

    for p in np.flatnonzero(final & (position_rule > 0)):
        for c in np.flatnonzero(nxt[p] > 0):
            if read_after_return(int(position_rule[p]), int(c)):
                byte = bytes([int(np.flatnonzero(byte_class == c)[0])])
                raise NotDeterministic(
                    f"the rule {names[position_rule[p]]!r} may end before the byte {byte!r} or read "
                    "it itself (a one-byte lookahead cannot tell)"
                )

    # Slots: slot 0 is the empty stack; slot k >= 1 the k-th return site of the rule.
    rule_sites = [(_BOTTOM,)] + [tuple(sorted(sites[r] - {_BOTTOM})) for r in range(callables)]
    slot_of = np.zeros((len(automata), num_positions), np.int32)
    for rule, listed in enumerate(rule_sites):
        for k, site in enumerate(listed):
            if site != _BOTTOM:
                slot_of[rule, site] = k + 1
    position_sites = [()] + [
        (_BOTTOM,) if position_rule[p] == 0 else tuple(sorted(sites[position_rule[p] - 1]))
        for p in range(1, num_positions)
    ]
    position_slots = [()] + [
        (_BOTTOM,) + (() if position_rule[p] == 0 else rule_sites[position_rule[p]])
        for p in range(1, num_positions)
    ]

    initial = int(offsets[0]) + automata[0].initial
    distance = _distances(nxt, push, final, byte_class, vocabulary)
    masks, mask_row, candidates, candidate_bytes, budget_cost = _token_tables(
        nxt, push, byte_class, position_sites, position_slots, vocabulary, stack_depth, distance
    )
    token_bytes, token_length = _token_byte_matrix(vocabulary)
    byte_tokens = np.flatnonzero(vocabulary.token_length == 1)
    byte_tokens = np.concatenate(
        [
            byte_tokens,
            np.full(bucket(byte_tokens.size, 8) - byte_tokens.size, vocabulary.vocab_size),
        ]
    ).astype(np.int32)
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
        budget_cost=budget_cost,
        byte_tokens=byte_tokens,
        description=description,
    )


_CALLED_RULES: dict = {}


def _byte_rule_automata(spec: GrammarSpec | None, rules):
    """The automata of `build_pushdown(rules=...)`: the byte rules' DFAs and the grammar's
    recursive rules over common byte classes (bytes every DFA and terminal treats alike), each
    with one call column per callable rule. Returns `(automata, names, classes, byte_class)`."""
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
    _, byte_class = _unique_rows(
        np.concatenate([grammar_class[None, :], *[dfa.delta for _, dfa, _ in rules]]).T
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
    return automata, names, representative.size, byte_class


def _distances(nxt, push, final, byte_class, vocabulary: TokenVocabulary):
    """The fewest one-byte tokens from each position to one where its rule may end: 0 where
    it may, else `1 + distance[next] + sum(distance[pushed])` minimised over the bytes that are
    tokens by themselves (a shortest-path fixed point over the tables). Summed over a
    configuration's position and stack it bounds the tokens that end the text: the one-byte
    token of the first byte of that shortest completion exists and lowers the sum by one (a
    rule that may end never reads a byte that a return position below reads, so the byte
    returns as the sum assumes)."""
    single = vocabulary.token_length == 1
    readable = np.zeros(int(byte_class.max()) + 1, bool)
    readable[byte_class[[vocabulary.token_bytes[t][0] for t in np.flatnonzero(single)]]] = True
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
        pushed = np.where(pushing[active], distance[pushes[active]], 0).sum(axis=-1)
        value = np.minimum(1 + distance[target[active]] + pushed, UNREACHABLE)
        source = at[active]  # sorted, as `active` is
        starts = np.flatnonzero(np.diff(source, prepend=-1))
        best = np.minimum.reduceat(value, starts)
        better = best < distance[source[starts]]
        changed = source[starts][better]
        distance[changed] = best[better]
        active = np.unique(by[ragged_rows(users_ptr, changed)[1]]) if changed.size else changed
    return distance.astype(np.int32)


_BYTE_MATRICES: dict = {}


def _token_byte_matrix(vocabulary: TokenVocabulary):
    """`(matrix, lengths)`: each token's bytes, `UInt8[np.ndarray, "vocab max_bytes"]` padded
    with 0, and `Int32[np.ndarray, " vocab"]` their lengths (0: not text). Memoised per
    vocabulary fingerprint (the last 4 vocabularies), read-only: every automaton of a
    vocabulary shares them (about 10 ms to build for SmolLM2's 49,152 tokens)."""
    hit = _BYTE_MATRICES.get(vocabulary.fingerprint)
    if hit is None:
        hit = _token_byte_matrix_uncached(vocabulary)
        for array in hit:
            array.setflags(write=False)
        if len(_BYTE_MATRICES) >= 4:
            _BYTE_MATRICES.pop(next(iter(_BYTE_MATRICES)))
        _BYTE_MATRICES[vocabulary.fingerprint] = hit
    return hit


def _token_byte_matrix_uncached(vocabulary: TokenVocabulary):
    lengths = vocabulary.token_length.astype(np.int32)
    width = int(lengths.max(initial=1))
    matrix = np.zeros((vocabulary.vocab_size, width), np.uint8)
    ids = np.flatnonzero(lengths)
    flat = np.frombuffer(b"".join(vocabulary.token_bytes[i] for i in ids), np.uint8)
    rows = np.repeat(ids, lengths[ids])
    cols = np.arange(flat.size) - np.repeat(np.cumsum(lengths[ids]) - lengths[ids], lengths[ids])
    matrix[rows, cols] = flat
    return matrix, lengths


def _unique(values):
    """`np.unique(values)` for an integer array, by sorting (numpy 2's hash-based `np.unique`
    is many times slower on the millions of keys of the token walk)."""
    values = np.sort(values)
    keep = np.ones(values.size, bool)
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


class _HashCollision(Exception):
    """Two distinct rows of `_token_tables`' walk hashed alike (`_row_hashes`): walk again
    comparing rows exactly."""


_WALK_CHUNK = 1024
"""Origins walked together by `_token_tables` (a pass with more is walked in chunks of this
many, then merged). A function is a row over the origins walked together; near the trie's root
almost every node's function is distinct, so one walk of every origin builds many wide rows:
MaskBench o48425's first pass, 14,916 origins, made 4,627 new rows at the third byte (39 million
entries, 2 s). A chunk's functions are those rows cut to its columns, of which fewer are
distinct: 13 slow pushdown schemas, each in a fresh process, best of two, 2026-11-25: 48.3 s
in one walk, 38.5 / 37.2 / 37.5 s in chunks of 512 / 1,024 / 2,048 (o48425 6.9 -> 3.9 s,
o48866 5.6 -> 4.6 s, o21378 6.3 -> 5.2 s); chunks cut at rule boundaries were no faster."""

_ROW_WEIGHTS = np.random.default_rng(0).integers(1, 2**63, 1 << 16, dtype=np.uint64) | 1
"""Random odd weights of `_row_hashes` (one per column; wider rows reuse them cyclically)."""


def _row_hashes(rows, weights) -> np.ndarray:
    """A 64-bit hash of each row of a 2-D int32 array: a linear combination of its entries
    with the random odd `weights` (`_ROW_WEIGHTS`, reused cyclically past their length) mod
    2**64 (equal rows hash alike; distinct rows collide with probability about 2**-63 per pair,
    which the callers check)."""
    weights = np.resize(weights, rows.shape[1])
    hashes = np.empty(rows.shape[0], np.uint64)
    # A matrix-vector product, not `(values * weights).sum(axis=1)`: no temporary array, and
    # 2-10x faster (0.06 against 0.58 s for 2,000 rows of 15,000 entries); a block of rows at a
    # time, so that their 64-bit copy stays small (the walk's rows reach hundreds of millions
    # of entries).
    block = max(1, (1 << 19) // max(rows.shape[1], 1))
    with np.errstate(over="ignore"):
        for start in range(0, rows.shape[0], block):
            values = rows[start : start + block].astype(np.int64).view(np.uint64)
            hashes[start : start + block] = values @ weights
    return hashes


def _hashed_rows(rows, weights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(first, inverse, hashes)` for a 2-D int32 array: the index of each distinct row's first
    occurrence (in order of their hashes), each row's number among them, and their hashes
    (`_row_hashes` with `weights`). Sorting the hashes instead of hashing each row's bytes in Python: the
    walk's functions come by the hundred thousand.

    **Raises:** `_HashCollision` when two distinct rows hash alike."""
    hashes = _row_hashes(rows, weights)
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    starts = np.ones(rows.shape[0], bool)
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    inverse = np.empty(rows.shape[0], np.int64)
    inverse[order] = np.cumsum(starts) - 1
    first = order[starts]
    # Only the rows that are not their group's first need a look (the walk's rows repeat
    # little): a gather of those, not of every row twice.
    later = order[~starts]
    if not np.array_equal(rows[later], rows[first[inverse[later]]]):
        raise _HashCollision
    return first, inverse, ordered[starts]


def _distinct_rows(rows) -> tuple[list[int], np.ndarray]:
    """`(first, inverse)` for a 2-D array: the index of each distinct row's first occurrence, in
    order of appearance, and each row's number among them (by hashing the rows' bytes)."""
    rows = np.ascontiguousarray(rows)
    ids: dict = {}
    first: list[int] = []
    inverse = np.empty(rows.shape[0], np.int64)
    for i, row in enumerate(rows):
        j = ids.setdefault(row.tobytes(), len(first))
        if j == len(first):
            first.append(i)
        inverse[i] = j
    return first, inverse


def _unique_rows(rows):
    """`np.unique(rows, axis=0, return_inverse=True)` for a 2-D integer array (the distinct rows
    in lexicographic order, and each row's index among them; the inverse 1-D), by hashing the
    rows' bytes and sorting only the distinct ones: numpy sorts every row as a structured
    record (50 ms for 2,757 rows of 256 int32, 2 ms this way)."""
    rows = np.ascontiguousarray(rows)
    first, inverse = _distinct_rows(rows)
    distinct = rows[first]
    order = np.lexsort(distinct.T[::-1]) if distinct.shape[1] else np.arange(len(first))
    rank = np.empty(len(first), np.int64)
    rank[order] = np.arange(len(first))
    return distinct[order], rank[inverse]


def _token_tables(
    nxt,
    push,
    byte_class,
    position_sites,
    position_slots,
    vocabulary: TokenVocabulary,
    stack_depth: int,
    distance,
):
    """Walk every token from every (position, top of stack) over the vocabulary's trie (see the
    module docstring, step 3). Returns `(masks, mask_row, candidates, candidate_bytes,
    budget_cost)`.

    The origins of a pass are walked together (in chunks of `_WALK_CHUNK`), as
    `byte_dfa._token_functions` walks a DFA: each trie node has a *function*, the state (an
    extended state, or a *set* of them where an origin's walk branched) and poison flag of
    every origin after the node's bytes, computed from its parent's function and its byte
    class; nodes with the same (parent function, byte class) share the step and equal
    functions get one id, so the work is per distinct function and origin, not per (trie node,
    state). Each token then has a *code* per origin (its bitmask level, candidate, or never)
    from its node's function; sources with the same codes are one *class*, and the bitmask rows
    and candidate lists are built per class. The result is identical to the per-origin walk
    (`tests/structured/pda_reference.py`, the oracle of the tests)."""
    num_positions = nxt.shape[0]
    vocab = vocabulary.vocab_size
    trie = token_trie(vocabulary)
    num_nodes = trie.num_nodes
    num_slots = max(len(s) for s in position_slots)

    # Extended states: (position, return positions pushed since the start or since the last
    # return below it, returns below the start (<= 0, minus their count), most slots above the
    # start in use, the return position on top of the stack below the start or None once used).
    ext_ids: dict = {}
    ext_info: list = []
    # Per extended state, as lists and (`columns`) arrays: its position; whether it pushed and
    # returned nothing yet (`simple`); its peak; `distance[position] + sum(distance[pushed])`
    # (its cost); the id of its *context* (pushed, below, peak, top) in `contexts`: a byte read
    # without a call keeps the context and changes only the position.
    ext_lists: tuple = ([], [], [], [], [])
    ext_arrays = [np.zeros(0, np.int64) for _ in ext_lists]
    context_ids: dict = {}
    contexts: list = []
    distance_list = distance.tolist()

    @typing.no_type_check
    def intern(key) -> int:
        i = ext_ids.get(key)
        if i is None:
            i = ext_ids[key] = len(ext_info)
            ext_info.append(key)
            pos, pushed, below, peak, _ = key
            context = key[1:]
            ct = context_ids.get(context)
            if ct is None:
                ct = context_ids[context] = len(contexts)
                contexts.append(context)
            ext_lists[0].append(pos)
            ext_lists[1].append(not pushed and below == 0)
            ext_lists[2].append(peak)
            ext_lists[3].append(distance_list[pos] + sum(distance_list[v] for v in pushed))
            ext_lists[4].append(ct)
        return i

    @typing.no_type_check
    def columns():
        """`(position, simple, peak, cost, context)` per extended state, as int64 arrays."""
        done, total = filled[0], len(ext_info)
        if done < total:
            if total > ext_arrays[0].size:
                size = max(total, 2 * ext_arrays[0].size)
                for k, old in enumerate(ext_arrays):
                    ext_arrays[k] = np.zeros(size, np.int64)
                    ext_arrays[k][:done] = old[:done]
            for k, values in enumerate(ext_lists):
                ext_arrays[k][done:total] = values[done:total]
            filled[0] = total
        return ext_arrays

    filled = [0]

    # Python copies of the tables for `successors` (numpy scalar indexing is slow there).
    nxt_list = nxt.tolist()
    class_list = byte_class.tolist()
    pushes_of: dict = {}  # (position, class) -> the return positions pushed, where any
    for p, c in zip(*np.nonzero(push[:, :, 0])):
        pushes_of[int(p), int(c)] = tuple(int(v) for v in push[p, c] if v)
    site_key: list = []  # per position, an id of its `position_sites`
    site_ids: dict = {}
    for sites in position_sites:
        site_key.append(site_ids.setdefault(sites, len(site_ids)))
    pop_memo: dict = {}

    @typing.no_type_check
    def successors(eid: int, byte: int):
        pos, pushed, below, peak, top = ext_info[eid]
        c = class_list[byte]
        if not pushed and below == 0 and nxt_list[pos][c] == POP:
            # A return from the start's own rule: the result depends on where it returns to
            # (the top of the stack, or the rule's return sites) and the peak, not on `pos`.
            key = (top, c, peak) if top is not None else (None, site_key[pos], c, peak)
            hit = pop_memo.get(key)
            if hit is None:
                hit = pop_memo[key] = _successors(pos, pushed, below, peak, top, c)
            return hit
        return _successors(pos, pushed, below, peak, top, c)

    @typing.no_type_check
    def _successors(pos, pushed, below, peak, top, c):
        out, death, returned = [], False, False
        work, seen = [(pos, pushed, below, top)], set()
        while work:
            p, stack, low, first = work.pop()
            act = nxt_list[p][c]
            if act > 0:
                more = pushes_of.get((p, c))
                if more:
                    stack = stack + more
                height = low + len(stack)
                if height > stack_depth:
                    death = True
                else:
                    out.append(intern((act, stack, low, max(peak, height), first)))
            elif act == POP:
                if stack:
                    work.append((stack[-1], stack[:-1], low, first))
                elif first is not None:
                    returned = True
                    if first == _BOTTOM:
                        death = True
                    elif first != _PENDING:
                        work.append((first, (), low - 1, None))
                else:
                    returned = True
                    for s in position_sites[p]:
                        if s == _BOTTOM or low - 1 < -stack_depth:
                            death = True
                        elif s not in seen:
                            seen.add(s)
                            work.append((s, (), low - 1, None))
            else:
                death = True
        return out, death, returned

    memo: dict = {}  # extended state * width + byte class -> `successors` (those not plain)

    unknown, dead, several = -3, -1, -2
    dense: dict = {}  # context id -> id of (position, *context) per position (-1: new)
    # (extended state, byte class) -> one successor, and whether it returned below the start:
    # per class, not per byte, and int32, grown by half (MaskBench sp_202 reaches 180,000
    # extended states: int64 per byte and doubled, the table reached 734 MB, and growing it
    # took most of the schema's 6.4 s compile, now 3.7 s).
    width = int(byte_class.max()) + 1
    table = np.full((64, width), unknown, np.int32)
    table_returned = np.zeros((64, width), bool)

    @typing.no_type_check
    def grow_table():
        nonlocal table, table_returned
        if len(ext_info) > table.shape[0]:
            grow = max(len(ext_info), table.shape[0] + table.shape[0] // 2) - table.shape[0]
            table = np.concatenate([table, np.full((grow, width), unknown, np.int32)])
            table_returned = np.concatenate([table_returned, np.zeros((grow, width), bool)])

    @typing.no_type_check
    def lookup(e, b):
        """Successor of each (extended state, byte): an id, `dead` or `several` (see `memo`)."""
        grow_table()
        bc = byte_class[b]
        vals = table[e, bc].astype(np.int64)
        missing = vals == unknown
        if missing.any():
            keys = _unique(e[missing] * 256 + b[missing])
            # Vectorised: a byte that is read without a call (the context is kept), or rejected
            # (most pairs).
            me, mb = keys // 256, keys % 256
            ext_pos, _, _, _, ext_context = columns()
            pos = ext_pos[me]
            c = byte_class[mb]
            act = nxt[pos, c]
            plain = ((act > 0) & (push[pos, c, 0] == 0)) | (act == 0)
            table[me[plain & (act == 0)], c[plain & (act == 0)]] = dead
            reads = np.flatnonzero(plain & (act > 0))
            if reads.size:
                # the target keeps the source's context: one dense id array per context
                cts = ext_context[me[reads]]
                by_ct = np.argsort(cts, kind="stable")
                cuts = np.flatnonzero(np.diff(cts[by_ct])) + 1
                for rows in np.split(reads[by_ct], cuts):
                    ct = int(ext_context[me[rows[0]]])
                    context = contexts[ct]
                    ids = dense.get(ct)
                    if ids is None:
                        ids = dense[ct] = np.full(num_positions, -1, np.int64)
                    targets = act[rows]
                    for t in _unique(targets[ids[targets] < 0]).tolist():
                        ids[t] = intern((t, *context))
                    table[me[rows], c[rows]] = ids[targets]
            keys = keys[~plain]
            found, found_returned = [], []
            for key in keys.tolist():
                out, death, returned = successors(key // 256, key % 256)
                memo[key // 256 * width + class_list[key % 256]] = out, death, returned
                found.append(
                    out[0] if len(out) == 1 and not death else dead if not out else several
                )
                found_returned.append(returned)
            grow_table()
            table[keys // 256, byte_class[keys % 256]] = found
            table_returned[keys // 256, byte_class[keys % 256]] = found_returned
            vals[missing] = table[e[missing], bc[missing]]
        return vals, table_returned[e, bc]

    set_ids: dict = {}
    sets: list = []  # member arrays (sorted extended state ids)

    @typing.no_type_check
    def intern_set(members) -> int:
        key = tuple(members)
        if len(key) == 1:
            return key[0]
        i = set_ids.get(key)
        if i is None:
            i = set_ids[key] = len(sets)
            sets.append(np.asarray(key, np.int64))
        return -1 - i

    @typing.no_type_check
    def state_tables():
        """`(peak, cost)` per state `s` at index `s + len(sets)` (a set's: its members' most)."""
        _, _, peak, cost, _ = columns()
        peak, cost = peak[: len(ext_info)], cost[: len(ext_info)]
        set_peak = [int(peak[m].max()) for m in reversed(sets)]
        set_cost = [int(cost[m].max()) for m in reversed(sets)]
        return (
            np.concatenate([np.asarray(set_peak, np.int64), peak]),
            np.concatenate([np.asarray(set_cost, np.int64), cost]),
        )

    @typing.no_type_check
    def advance(e, b):
        """The successor of each (state, byte) pair: `(state, gone, death, below)`, `state` an
        extended state or a set (`intern_set`), `gone` where every branch died, `death` where
        some branch died (the tokens below are not sure), `below` where the byte returned below
        the start."""
        single = e >= 0
        vals = np.full(e.size, dead, np.int64)
        below = np.zeros(e.size, bool)
        if single.all():
            vals, below = lookup(e, b)
        elif single.any():
            vals[single], below[single] = lookup(e[single], b[single])
        death = np.zeros(e.size, bool)
        gone = vals == dead
        odd = np.flatnonzero((vals == several) | ~single)
        if odd.size:
            # Sets, or states that branch: merged one by one (rare).
            for i in odd.tolist():
                members = [int(e[i])] if single[i] else sets[-1 - int(e[i])].tolist()
                out, die = set(), False
                mv, mb = lookup(np.asarray(members, np.int64), np.full(len(members), b[i]))
                below[i] = mb.any()
                for m, v in zip(members, mv.tolist()):
                    if v >= 0:
                        out.add(v)
                    elif v == dead:
                        die = True
                    else:
                        hit = memo[m * width + class_list[int(b[i])]]
                        out.update(hit[0])
                        die = die or hit[1]
                if out:
                    vals[i] = intern_set(sorted(out))
                    gone[i] = False
                    death[i] = die
                else:
                    gone[i] = True
        return vals, gone, death, below

    parent, level_ptr, token_node = trie_levels(trie)
    num_classes = int(byte_class.max()) + 1
    node_class = byte_class[trie.byte]
    class_byte = np.zeros(num_classes, np.int64)  # a byte of each class (`lookup` is per byte)
    class_byte[byte_class[::-1]] = np.arange(255, -1, -1)
    token_depth = np.searchsorted(level_ptr, token_node, side="right") - 1
    gone_entry = np.iinfo(np.int32).min  # a function's entry for an origin whose walk died
    steps = np.zeros((64, num_classes), np.int32)  # see `walk`
    never, candidate = 255, 254  # token codes beside the bitmask levels 0..MAX_LEVELS-1

    @typing.no_type_check
    def walk(start, prune: bool):
        """`walk_checked` over the origins `start` in chunks of `_WALK_CHUNK`, merged: a token's
        code row is the concatenation of its rows in the chunks (one row per distinct
        combination of the chunks' rows, numbered in the order of their keys; the codes
        transposed, as `walk_once` gives them). Same results as one walk of every origin (the
        tests check the tables against `tests/structured/pda_reference.py`)."""
        if start.size <= _WALK_CHUNK:
            return walk_checked(start, prune)
        parts = [
            walk_checked(start[i : i + _WALK_CHUNK], prune)
            for i in range(0, start.size, _WALK_CHUNK)
        ]
        combination = np.zeros(trie.token_ids.size, np.int64)
        for token_code, codes, _, _ in parts:
            key = combination * codes.shape[1] + token_code
            combination = np.unique(key, return_inverse=True)[1].reshape(-1)
        first = np.empty(int(combination.max(initial=-1)) + 1, np.int64)
        first[combination[::-1]] = np.arange(combination.size - 1, -1, -1)
        return (
            combination,
            np.concatenate([codes.take(code[first], 1) for code, codes, _, _ in parts]),
            np.concatenate([returned for _, _, returned, _ in parts]),
            np.concatenate([cost for _, _, _, cost in parts]),
        )

    @typing.no_type_check
    def walk_checked(start, prune: bool):
        """`walk_once` with `_ROW_WEIGHTS`, or, in the unlikely event of a hash collision,
        with other weights until none collides (the tables it filled stay valid)."""
        rng = None
        weights = _ROW_WEIGHTS
        while True:
            try:
                return walk_once(start, prune, weights)
            except _HashCollision:
                rng = rng or np.random.default_rng(1)
                weights = rng.integers(1, 2**63, _ROW_WEIGHTS.size, dtype=np.uint64) | 1

    @typing.no_type_check
    def walk_once(start, prune: bool, weights):
        """Walk all origins (extended states `start`) over the trie together, as
        `byte_dfa._token_functions` does for a DFA: each trie node has a *function*, the state
        (or set) and poison flag of every origin after the node's bytes (one int32 per origin:
        `2 * state + poisoned`, or `gone_entry` where the walk died). Equal functions get one
        id, and the function after a byte class is computed once per (function, class): the
        step of every later node with that pair is a table lookup (`moves`), so the deep,
        narrow levels of the trie (long tokens inside strings, where one or two functions
        repeat) cost a lookup each. The ids hold while the origins walked (`cols`) stay the
        same; when origins are dropped (every function lost them, or they returned with
        `prune`) the functions are renumbered. Returns, per token of `trie.token_ids`, the id of
        its function's *code* row (per origin, the bitmask level of the token, `candidate` or
        `never`), the codes (transposed: origins x code rows), which origins returned below
        their start, and per origin the costliest bitmask token's cost. With `prune`, an origin
        is dropped (its codes left unspecified) once it returned."""
        nonlocal steps
        m = start.size
        returned = np.zeros(m, bool)
        cost = np.zeros(m, np.int64)
        cols = np.arange(m)  # the origins of the functions' columns (the others are gone)
        # The functions of the current `cols`: `store[f]` the row of id `f`, `row_ids` its
        # bytes -> id, `moves[f, class]` the id after a byte of the class (-1: not yet), and
        # `coded[f]` the index of its code row (-1: not yet).
        store = (2 * start).astype(np.int32)[None, :]
        row_ids = {int(_row_hashes(store, weights)[0]): 0}
        moves = np.full((1, num_classes), -1, np.int64)
        coded = np.full(1, -1, np.int64)
        node_function = np.zeros(num_nodes, np.int64)
        token_code = np.full(trie.token_ids.size, -1, np.int64)
        code_rows = []
        num_codes = 0
        for depth in range(1, level_ptr.size - 1):
            a, b = int(level_ptr[depth]), int(level_ptr[depth + 1])
            if not cols.size:
                break
            key = node_function[parent[a:b]] * num_classes + node_class[a:b]
            result = moves.reshape(-1)[key]
            if (result < 0).any():
                pairs = _unique(key[result < 0])
                width = cols.size
                source = store[pairs // num_classes].reshape(-1)
                flat = np.flatnonzero(source != gone_entry)
                entry = source[flat]
                state = entry >> 1
                cls = (pairs % num_classes)[flat // width]  # no pairs x width temporary
                # `steps[state, class]`: 0 unknown, else `2 * (successor + 3) + returned`
                # (successor: an extended state, `dead` or `several`, as `lookup` gives)
                if len(ext_info) > steps.shape[0]:
                    grow = max(len(ext_info), 2 * steps.shape[0]) - steps.shape[0]
                    steps = np.concatenate([steps, np.zeros((grow, num_classes), np.int32)])
                single = state >= 0
                step_key = np.where(single, state, 0) * num_classes + cls
                step = steps.reshape(-1)[step_key]
                missing = single & (step == 0)
                if missing.any():
                    keys = _unique(step_key[missing])
                    vals, below = lookup(keys // num_classes, class_byte[keys % num_classes])
                    if len(ext_info) > steps.shape[0]:
                        grow = max(len(ext_info), 2 * steps.shape[0]) - steps.shape[0]
                        steps = np.concatenate([steps, np.zeros((grow, num_classes), np.int32)])
                    steps.reshape(-1)[keys] = 2 * (vals + 3) + below
                    step[missing] = steps.reshape(-1)[step_key[missing]]
                vals = (step >> 1) - 3
                below = single & ((step & 1) > 0)
                out = np.where(single & (vals >= 0), 2 * vals + (entry & 1), gone_entry)
                odd = np.flatnonzero((single & (vals == several)) | ~single)
                if odd.size:
                    # sets, or states that branch (rare)
                    o_vals, o_gone, o_death, o_below = advance(
                        state[odd].astype(np.int64), class_byte[cls[odd]]
                    )
                    below[odd] = o_below
                    o_poison = (entry[odd] & 1).astype(bool) | o_death
                    out[odd] = np.where(o_gone, gone_entry, 2 * o_vals + o_poison)
                if below.any():
                    returned[cols[flat[below] % width]] = True
                new = np.full((pairs.size, width), gone_entry, np.int32)
                new.reshape(-1)[flat] = out
                # one id per distinct row, by a hash of the row (checked exactly below)
                first, inverse, hashes = _hashed_rows(new, weights)
                distinct_ids = np.empty(first.size, np.int64)
                fresh = []
                for u, h in enumerate(hashes.tolist()):
                    j = row_ids.setdefault(h, len(row_ids))
                    if j == store.shape[0] + len(fresh):
                        fresh.append(int(first[u]))
                    distinct_ids[u] = j
                old = distinct_ids < store.shape[0]
                if not np.array_equal(store[distinct_ids[old]], new[first[old]]):
                    raise _HashCollision
                ids = distinct_ids[inverse]
                if fresh:
                    store = np.concatenate([store, new[fresh]])
                    moves = np.concatenate([moves, np.full((len(fresh), num_classes), -1)])
                    coded = np.concatenate([coded, np.full(len(fresh), -1)])
                moves.reshape(-1)[pairs] = ids
                result = moves.reshape(-1)[key]
            # origins gone in every function of this depth stay gone, and with `prune` those
            # that returned are done: their columns are dropped and the functions renumbered
            funcs = _unique(result)
            live_cols = (store[funcs] != gone_entry).any(axis=0)
            if prune:
                live_cols &= ~returned[cols]
            if live_cols.all():
                node_function[a:b] = result
            else:
                cols = cols[live_cols]
                kept = store[funcs][:, live_cols]
                # one id per distinct row, by their hashes (checked exactly), as above
                first, number, hashes = _hashed_rows(kept, weights)
                store = kept[first]
                row_ids = dict(zip(hashes.tolist(), range(store.shape[0])))
                moves = np.full((len(first), num_classes), -1, np.int64)
                coded = np.full(len(first), -1, np.int64)
                node_function[a:b] = number[np.searchsorted(funcs, result)]
            # codes of the functions of this depth's tokens (once per function)
            lo, hi = np.searchsorted(token_depth, [depth, depth + 1])
            if hi > lo:
                at = node_function[token_node[lo:hi]]
                need = _unique(at)
                need = need[coded[need] < 0]
                if need.size:
                    f = store[need]
                    live = f != gone_entry
                    state_peak, state_cost = state_tables()
                    index = np.where(live, f >> 1, 0) + len(sets)
                    peak, c = state_peak[index], state_cost[index]
                    sure = live & ((f & 1) == 0) & (peak < MAX_LEVELS)
                    code = np.full((need.size, m), never, np.uint8)
                    code[:, cols] = np.where(sure, peak, np.where(live, candidate, never))
                    if cols.size:
                        cost[cols] = np.maximum(cost[cols], np.where(sure, c, 0).max(axis=0))
                    code_rows.append(code)
                    coded[need] = num_codes + np.arange(need.size)
                    num_codes += need.size
                token_code[lo:hi] = coded[at]
        codes = np.concatenate(code_rows) if code_rows else np.zeros((0, m), np.uint8)
        # tokens never reached (their walk died above them): `never`
        codes = np.concatenate([codes, np.full((1, m), never, np.uint8)])
        token_code[token_code < 0] = codes.shape[0] - 1
        return token_code, np.ascontiguousarray(codes.T), returned, cost

    # Pass 1: each position, whatever is on the stack. Tokens from a position that never
    # returns below its rule do not depend on the stack: their result holds for every slot.
    positions = np.arange(1, num_positions)
    code1, codes1, returned, cost1 = walk(
        np.asarray([intern((int(p), (), 0, 0, None)) for p in positions], np.int64), prune=True
    )
    # Pass 2: the positions that do return, once per slot (the top of the stack known).
    pairs = [
        (p, k, site) for p in range(1, num_positions) for k, site in enumerate(position_slots[p])
    ]
    origin_position = np.array([p for p, _, _ in pairs], np.int64)
    origin_slot = np.array([k for _, k, _ in pairs], np.int64)
    again = [i for i, (p, _, _) in enumerate(pairs) if returned[p - 1]]
    code2, codes2, _, cost2 = walk(
        np.asarray([intern((pairs[i][0], (), 0, 0, pairs[i][2])) for i in again], np.int64),
        prune=False,
    )
    # Sources: the pass-1 positions that never returned (shared by their slots), then the
    # pass-2 origins. A token's code row is the pair of its rows in the two passes.
    kept = np.flatnonzero(~returned)
    first_source = np.full(positions.size, -1, np.int64)
    first_source[kept] = np.arange(kept.size)
    source_of = np.empty(len(pairs), np.int64)
    fixed = ~returned[origin_position - 1]
    source_of[fixed] = first_source[origin_position[fixed] - 1]
    source_of[np.asarray(again, np.int64)] = kept.size + np.arange(len(again))
    pair_key = code1 * codes2.shape[1] + code2
    if codes1.shape[1] * codes2.shape[1] <= 8 * pair_key.size:  # a presence table, no sort
        seen = np.zeros(codes1.shape[1] * codes2.shape[1], bool)
        seen[pair_key] = True
        used = np.flatnonzero(seen)
        token_row = (np.cumsum(seen) - 1)[pair_key]
    else:
        used, token_row = np.unique(pair_key, return_inverse=True)
        token_row = token_row.reshape(-1)
    row1, row2 = used // codes2.shape[1], used % codes2.shape[1]
    source_cost = np.concatenate([cost1[kept], cost2])
    # Classes: sources with the same codes for every token row. Within a pass, the sources
    # with equal columns of its codes (every code row of a pass is some token's, so equal
    # there is equal on the token rows); then the passes' classes, as columns over the token
    # rows, merged. Numbered by first source as a single pass over all sources would (without
    # the token rows x sources matrix: 5,193 x 14,772 bytes, 1.1 s, for MaskBench o48425).
    first1, of1 = _distinct_rows(codes1[kept])  # codes1, codes2: sources x code rows
    first2, of2 = _distinct_rows(codes2)
    class_columns = np.concatenate(
        [codes1[kept[first1]][:, row1], codes2[first2][:, row2]]
    )  # rows: the passes' classes; columns: token rows
    class_first, merged = _distinct_rows(class_columns)
    class_of = np.concatenate([merged[of1], merged[len(first1) + of2]])
    num_classes_t = len(class_first)
    class_codes = class_columns[class_first].T  # rows: token rows, columns: classes
    sure_levels = class_codes[class_codes < MAX_LEVELS]
    levels = max(1, int(sure_levels.max()) + 1 if sure_levels.size else 1)
    budget_cost = np.zeros((num_positions, num_slots), np.int32)
    budget_cost[origin_position, origin_slot] = source_cost[source_of]
    # The bitmask row of (class, level): the tokens whose code is <= level. Distinct rows are
    # found over the token rows, then each is spread over the vocabulary once.
    words = (vocab + 31) // 32
    row_ids: dict = {}
    row_spec = []  # (class, level) of each distinct row
    class_rows = np.empty((num_classes_t, levels), np.int64)
    for level in range(levels):
        packed_rows = np.packbits(np.less_equal(class_codes.T, level), axis=1)
        for c, r in enumerate(packed_rows):
            j = row_ids.setdefault(r.tobytes(), len(row_spec))
            if j == len(row_spec):
                row_spec.append((c, level))
            class_rows[c, level] = j
    vocab_row = np.full(words * 32, used.size, np.int64)  # non-trie tokens: never
    vocab_row[trie.token_ids] = token_row
    spec_class = np.array([c for c, _ in row_spec], np.int64)
    spec_level = np.array([lv for _, lv in row_spec], np.uint8)
    padded = np.concatenate([class_codes, np.full((1, num_classes_t), never, np.uint8)])
    row_bits = padded.T[spec_class] <= spec_level[:, None]  # per distinct row and token row
    # Bit k of byte j of a row is token 8j + k: eight gathers of whole token rows (one byte
    # per distinct row each), shifted into place; 1.4x faster than a gather of every bit.
    packed = np.zeros((len(row_spec), words * 4), np.uint8)
    token_bytes = vocab_row.reshape(-1, 8)
    chunk = max(1, (1 << 23) // (words * 4))
    for start in range(0, len(row_spec), chunk):
        by_token_row = np.ascontiguousarray(row_bits[start : start + chunk].T, np.uint8)
        acc = by_token_row[token_bytes[:, 0]]
        for k in range(1, 8):
            acc |= by_token_row[token_bytes[:, k]] << k
        packed[start : start + chunk] = acc.T
    packed = packed.view(np.uint32)
    masks, order_rows = _unique_rows(packed.reshape(-1, words))
    rows = order_rows.reshape(-1)[class_rows][class_of[source_of]]
    empty = np.flatnonzero(~masks.any(axis=1))
    mask_row = np.full((num_positions, num_slots, levels), empty[0] if empty.size else 0, np.int64)
    if not empty.size:  # no all-zero row yet: add one for the dead position and unused slots
        masks = np.concatenate([masks, np.zeros((1, words), masks.dtype)])
        mask_row[:] = masks.shape[0] - 1
    mask_row[origin_position, origin_slot] = rows

    # Candidates: per class in the walk's order (depth, trie node), i.e. of `trie.token_ids`.
    by_row = np.argsort(token_row, kind="stable")
    row_ptr = np.searchsorted(token_row[by_row], np.arange(used.size + 1))
    cand_row, cand_class = np.nonzero(class_codes == candidate)
    held, k = ragged_rows(row_ptr, cand_row)
    cand_class, cand_order = cand_class[held], by_row[k]
    order = np.lexsort((cand_order, cand_class))
    cand_class, cand_token = cand_class[order], trie.token_ids[cand_order[order]].astype(np.int32)
    per_class = np.bincount(cand_class, minlength=num_classes_t)
    width = bucket(int(per_class.max(initial=0)), 8)
    class_candidates = np.full((num_classes_t, width), vocab, np.int32)
    slot = np.arange(cand_class.size) - (np.cumsum(per_class) - per_class)[cand_class]
    class_candidates[cand_class, slot] = cand_token
    candidates = np.full((num_positions, num_slots, width), vocab, np.int32)
    candidates[origin_position, origin_slot] = class_candidates[class_of[source_of]]
    lengths = vocabulary.token_length
    candidate_bytes = int(lengths[cand_token].max(initial=1))
    return (
        np.ascontiguousarray(masks.astype(np.uint32)),
        mask_row.astype(np.int32),
        candidates,
        candidate_bytes,
        budget_cost,
    )


# ----------------------------------------------------------------------------- device


class PushdownConstraint(AbstractLogitsProcessor):
    """The logits processor that runs a `PushdownAutomaton` inside the jitted step.

    Per row the state is `(position, stack, stack_pointer)`: `Int[Array, ""]`,
    `Int[Array, " stack_depth"]`, `Int[Array, ""]` (see the module docstring for the step).
    The tables are fields, shared by all rows; `constraint_id` is 0 for constrained rows and -1
    for unconstrained ones (a scalar, or one per row).

    **Arguments:** `automaton`: a `PushdownAutomaton`; `constraint_id`: 0 (default) or -1, or
    one per row.
    """

    byte_class: Int[Array, " 256"]
    next: Int[Array, "positions classes"]
    push: Int[Array, "positions classes pushes"]
    final: Bool[Array, " positions"]
    initial: Int[Array, ""]
    position_rule: Int[Array, " positions"]
    slot_of: Int[Array, "rules positions"]
    mask_row: Int[Array, "positions slots levels"]
    masks: UInt32[Array, "rows words"]
    candidates: Int[Array, "positions slots candidates"]
    token_bytes: UInt8[Array, "vocab max_bytes"]
    token_length: Int[Array, " vocab"]
    distance: Int[Array, " positions"]
    budget_cost: Int[Array, "positions slots"]
    byte_tokens: Int[Array, " byte_tokens"]
    constraint_id: Int[Array, "*rows"] = per_row_field()
    candidate_bytes: int = eqx.field(static=True)
    stack_depth: int = eqx.field(static=True)
    eos_token_id: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, automaton: PushdownAutomaton, constraint_id=0):
        a = automaton
        self.byte_class = jnp.asarray(a.byte_class, jnp.int32)
        self.next = jnp.asarray(a.next)
        self.push = jnp.asarray(a.push)
        self.final = jnp.asarray(a.final)
        self.initial = jnp.asarray(a.initial, jnp.int32)
        self.position_rule = jnp.asarray(a.position_rule)
        self.slot_of = jnp.asarray(a.slot_of)
        self.mask_row = jnp.asarray(a.mask_row)
        self.masks = jnp.asarray(a.masks)
        self.candidates = jnp.asarray(a.candidates)
        self.token_bytes = jnp.asarray(a.token_bytes)
        self.token_length = jnp.asarray(a.token_length)
        self.distance = jnp.asarray(a.distance)
        self.budget_cost = jnp.asarray(a.budget_cost)
        self.byte_tokens = jnp.asarray(a.byte_tokens)
        ids = np.asarray(constraint_id)
        if (
            ids.ndim > 1
            or not np.issubdtype(ids.dtype, np.integer)
            or np.any((ids != 0) & (ids != -1))
        ):
            raise ValueError(
                f"`constraint_id` must be 0 or -1, or one of them per row, got {constraint_id!r}"
            )
        self.constraint_id = jnp.asarray(ids, jnp.int32)
        self.candidate_bytes = int(a.candidate_bytes)
        self.stack_depth = int(a.stack_depth)
        self.eos_token_id = tuple(a.eos_token_id)

    def init(self, context: Context):
        """`(initial position, empty stack, 0)`."""
        return (self.initial, jnp.zeros(self.stack_depth, jnp.int32), jnp.zeros((), jnp.int32))

    def _byte(self, config, byte):
        """One byte from `(position, stack, stack_pointer)`; position 0 when not allowed."""
        pos, stack, sp = config
        c = self.byte_class[byte]

        def pops(s):
            p, n = s
            return (self.next[p, c] == POP) & (n > 0)

        def pop(s):
            _, n = s
            return stack[n - 1], n - 1

        pos, sp = jax.lax.while_loop(pops, pop, (pos, sp))
        target = self.next[pos, c]
        alive = target > 0
        for i in range(self.push.shape[-1]):
            value = self.push[pos, c, i]
            do = alive & (value > 0)
            overflow = do & (sp >= self.stack_depth)
            stack = jnp.where(
                do & ~overflow, stack.at[jnp.minimum(sp, self.stack_depth - 1)].set(value), stack
            )
            sp = sp + (do & ~overflow).astype(jnp.int32)
            alive = alive & ~overflow
        return jnp.where(alive, target, DEAD).astype(jnp.int32), stack, sp

    def _token(self, config, token_id, num_bytes: int | None = None):
        """The configuration after all bytes of `token_id` (a `while_loop` over its length, or a
        fixed loop of `num_bytes` when given)."""
        length = self.token_length[token_id]
        row = self.token_bytes[token_id]

        def body(j, config):
            stepped = self._byte(config, row[j])
            return jax.tree.map(lambda new, old: jnp.where(j < length, new, old), stepped, config)

        if num_bytes is None:

            def cond(s):
                j, config = s
                return (j < length) & (config[0] != DEAD)

            return jax.lax.while_loop(
                cond, lambda s: (s[0] + 1, self._byte(s[1], row[s[0]])), (0, config)
            )[1]
        return jax.lax.fori_loop(0, num_bytes, body, config)

    def _need(self, config) -> Int[Array, ""]:
        """`PushdownAutomaton.need`: the distance of the position plus those on the stack."""
        pos, stack, sp = config
        on_stack = jnp.arange(self.stack_depth) < sp
        return self.distance[pos] + jnp.where(on_stack, self.distance[stack], 0).sum()

    def process(self, state, logits: Float[Array, " vocab"], context: Context):
        """Advance on the previous token, then mask (see the module docstring).

        **Returns:** `(state, logits)` with the state's shapes unchanged.
        """
        advanced = self._token(
            state, jnp.minimum(context.last_token_id, self.token_length.shape[0] - 1)
        )
        state = jax.tree.map(
            lambda new, old: jnp.where(context.num_generated > 0, new, old), advanced, state
        )
        pos, stack, sp = state
        vocab = self.token_length.shape[0]
        room = self.stack_depth - sp
        top = jnp.where(sp > 0, stack[jnp.maximum(sp - 1, 0)], 0)
        slot = self.slot_of[self.position_rule[pos], top]
        words = self.masks[self.mask_row[pos, slot, jnp.minimum(room, self.mask_row.shape[2] - 1)]]
        iota = jnp.arange(vocab)
        allowed = ((words[iota >> 5] >> (iota & 31).astype(jnp.uint32)) & 1).astype(bool)
        # The budget: a token may leave at most `remaining - 1` tokens to end the text. The
        # bitmask row holds when its costliest token does; otherwise only the exact checks below.
        remaining = context.max_new_tokens - context.num_generated  # this token included
        below = self._need(state) - self.distance[pos]
        allowed = allowed & (below + self.budget_cost[pos, slot] <= remaining - 1)

        def exact(allowed, tokens, num_bytes):
            safe = jnp.minimum(tokens, vocab - 1)
            after = jax.vmap(lambda t: self._token(state, t, num_bytes))(safe)
            ok = (after[0] != DEAD) & (jax.vmap(self._need)(after) <= remaining - 1)
            return allowed.at[tokens].set(ok, mode="drop")

        allowed = exact(allowed, self.byte_tokens, 1)
        allowed = exact(allowed, self.candidates[pos, slot], self.candidate_bytes)
        on_stack = jnp.arange(self.stack_depth) < sp
        can_end = self.final[pos] & jnp.all(jnp.where(on_stack, self.final[stack], True))
        allowed = allowed.at[jnp.asarray(self.eos_token_id, jnp.int32)].set(can_end)
        width = logits.shape[-1]
        if vocab < width:
            allowed = jnp.pad(allowed, (0, width - vocab))
        allowed = allowed[:width]
        constrained = self.constraint_id >= 0
        logits = jnp.where(constrained & ~allowed, -jnp.inf, logits).astype(logits.dtype)
        return state, logits


def state_stack(state) -> list[int]:
    """The return positions on a row's stack, bottom first (host helper for drawings)."""
    _, stack, sp = state
    return [int(v) for v in np.asarray(stack)[: int(sp)]]


__all__: Sequence[str] = (
    "NotDeterministic",
    "PushdownAutomaton",
    "PushdownConstraint",
    "build_pushdown",
)
