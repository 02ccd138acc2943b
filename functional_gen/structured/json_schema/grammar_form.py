"""The grammar form (`json_schema_grammar`): a schema as a pushdown automaton of rules, the
tails that several rules share made one more rule (`_shared_tails`).
"""

import numpy as np

from ..automaton import cache_key, unique_columns
from ..byte_dfa import (
    REJECT,
    ByteDFA,
    minimize,
    refine_changed,
    refine_exact,
)
from ..pushdown import DEFAULT_STACK_DEPTH, NotDeterministic, PushdownAutomaton, build_pushdown
from ..regex_syntax import escape
from ..vocabulary import TokenVocabulary
from . import budgets
from .counter_strings import compiles_for_vocabulary
from .errors import (
    TooManyPositions,
    describe,
)
from .free_values import CALL, DEFAULT_FREE_FORM_DEPTH, FREE_VALUE_CALL, free_value_grammar
from .pushdown_form import PUSHDOWN_CACHE
from .rewriter import rewrite, warn_dropped, warn_order_fixed
from .rule_automata import (
    build_ahead,
    check_productive,
    check_value_calls,
    inlined_rule_edges,
    nondeterministic_calls,
    rule_automaton,
)
from .rule_plan import merge_equal_markers, plan_rules


def _joint_blocks(automata: list) -> np.ndarray:
    """The states of every automaton (`(dfa, calls)` each), numbered one after another, grouped
    by their residual language: Moore's refinement of the union, a call edge labelled by its
    callee (hashed signatures, checked exactly as `byte_dfa.minimize` does). Returns each joint
    state's block."""

    offsets = np.cumsum([0] + [dfa.num_states for dfa, _ in automata])
    rows, accepting = [], []
    for (dfa, calls), offset in zip(automata, offsets):
        table = np.concatenate([dfa.delta, calls], axis=1)
        rows.append(np.where(table != REJECT, table + offset, REJECT))
        accepting.append(dfa.accepting)
    columns, _ = unique_columns(np.concatenate(rows))
    accepting = np.concatenate(accepting)
    blocks, count = refine_changed(columns, accepting)
    representative = np.zeros(count, np.int64)
    representative[blocks] = np.arange(blocks.size)
    successor = np.where(columns != REJECT, blocks[np.maximum(columns, 0)], REJECT)
    if not (
        np.array_equal(successor, successor[representative[blocks]])
        and np.array_equal(accepting, accepting[representative[blocks]])
    ):  # a hash collision merged different states
        blocks, _ = refine_exact(columns, accepting)
    return blocks


def _reach(dfa: ByteDFA, calls: np.ndarray, start: int) -> np.ndarray:
    """The states of one automaton reachable from `start` over bytes and calls (a mask)."""
    seen = np.zeros(dfa.num_states, bool)
    seen[start] = True
    frontier = np.array([start])
    while frontier.size:
        nxt = np.concatenate([dfa.delta[frontier].ravel(), calls[frontier].ravel()])
        nxt = np.unique(nxt[nxt != REJECT])
        frontier = nxt[~seen[nxt]]
        seen[frontier] = True
    return seen


def _shared_tails(
    automata: list, rules: int, free_value: bool, registers: list | None = None
) -> tuple[list, int]:
    """Fewer positions for a grammar form: a tail that several automata share (states whose
    residual languages, up to the end of their rule, are equal: the properties after a
    recursive one in each unrolled copy of a recursive definition, an object's last members in
    two similar definitions) becomes a rule of its own, and each copy's first state a tail call
    of it (a call whose return position is a final state with no edges: it pushes nothing).

    Greedy: the joint partition of every state (`_joint_blocks`), then the shared block with
    the most positions to save (its states reachable from the block, once per automaton beyond
    the first) becomes a rule (its states copied from one automaton; an existing rule when the
    block holds a rule's initial state), each automaton is minimised again, and so on while a
    tail saves `MIN_SHARED_TAIL` positions, at most `MAX_SHARED_TAILS` times. Equal residual
    languages make the language the same; an accepting block is never a tail (a rule may not
    match the empty string).

    An automaton with a member-set register (`registers`) takes no part: its register tables
    are indexed by its states, and its residual languages are not those of its bytes alone (the
    register refuses some), so none of its states is a tail, nor the rule another tail calls;
    it is kept as it is (only its call columns grow with the new rules).

    **Arguments:** `automata`: `(dfa, calls)` per regex of the grammar form, the root first,
    rule `i` at `1 + i` (as `rule_edges` gives them); `rules`: the schema rules; `free_value`:
    whether the last call column is the free-form JSON value; `registers`: per automaton, its
    register actions or `None` (`rule_edges`' third element; `None`: no automaton has any).

    **Returns:** `(automata, rules)`, the new rules after the old ones (their call columns
    inserted before the free-form value's).
    """
    automata = list(automata)
    for _ in range(budgets.MAX_SHARED_TAILS):
        if rules >= budgets.MAX_RULES:
            break
        blocks = _joint_blocks(automata)
        offsets = np.cumsum([0] + [dfa.num_states for dfa, _ in automata])
        owner = np.repeat(np.arange(len(automata)), np.diff(offsets))
        accepting = np.concatenate([dfa.accepting for dfa, _ in automata])
        candidate = ~accepting
        for a, register in enumerate(registers or []):
            if register is not None:
                candidate[offsets[a] : offsets[a + 1]] = False
        members: dict[int, list[int]] = {}
        for state in np.flatnonzero(candidate):
            members.setdefault(int(blocks[state]), []).append(int(state))
        # Only entries are candidates: the blocks below a shared block are shared too (as
        # often or more), so a block is looked at when it is a state's first shared one, where
        # an edge comes from a block shared fewer or more times (or it holds an initial state)
        count = np.bincount(blocks, minlength=int(blocks.max()) + 1)
        rows = []
        for (dfa, calls), offset in zip(automata, offsets):
            row = np.concatenate([dfa.delta, calls], axis=1)
            rows.append(np.where(row != REJECT, row + offset, REJECT))
        table = np.concatenate(rows)
        source, _ = np.nonzero(table != REJECT)
        target = table[table != REJECT]
        entry = np.zeros(count.size, bool)
        entry[blocks[target[count[blocks[source]] != count[blocks[target]]]]] = True
        for a, (dfa, _) in enumerate(automata):
            entry[blocks[offsets[a] + dfa.initial]] = True
        candidates = []
        for block, states in members.items():
            if len(states) < 2 or not entry[block]:
                continue
            a = int(owner[states[0]])
            dfa, calls = automata[a]
            size = int(_reach(dfa, calls, states[0] - int(offsets[a])).sum())
            saving = (len(states) - 1) * size - len(states) - 1
            if saving >= budgets.MIN_SHARED_TAIL:
                candidates.append((-saving, block))
        total = int(offsets[-1])
        for _, block in sorted(candidates)[: budgets.SHARED_TAIL_TRIES]:
            new, grew = _extract_tail(automata, rules, free_value, members[block], owner, offsets)
            if sum(dfa.num_states for dfa, _ in new) <= total - budgets.MIN_SHARED_TAIL:
                break  # the estimate counted states that other paths still reach: check
        else:
            break
        rules += grew
        automata = new
    return automata, rules


def _extract_tail(automata: list, rules: int, free_value: bool, states, owner, offsets):
    """`_shared_tails`' step: the joint `states` (one shared block) become tail calls of one rule.
    Returns the new automata and how many rules were added (0 or 1)."""
    initial = [
        int(owner[x]) - 1
        for x in states
        if owner[x] > 0 and x - offsets[owner[x]] == automata[owner[x]][0].initial
    ]
    if initial:  # an existing rule is the tail: call it
        callee, source = initial[0], None
    else:
        callee, source = rules, states[0]
    new = []
    for dfa, calls in automata:
        if callee == rules:  # one more call column, before the free-form value's
            calls = np.insert(calls, rules, REJECT, axis=1)
        new.append((dfa, calls))
    if source is not None:
        a = int(owner[source])
        dfa, calls = new[a]
        keep = _reach(dfa, calls, source - int(offsets[a]))
        renumber = np.cumsum(keep) - 1
        delta = dfa.delta[keep]
        sub_calls = calls[keep]
        delta = np.where(delta != REJECT, renumber[np.maximum(delta, 0)], REJECT)
        sub_calls = np.where(sub_calls != REJECT, renumber[np.maximum(sub_calls, 0)], REJECT)
        tail = ByteDFA(
            delta.astype(np.int32),
            dfa.accepting[keep],
            int(renumber[source - int(offsets[a])]),
        )
        new.append((tail, sub_calls.astype(np.int32)))
    by_automaton: dict[int, list[int]] = {}
    for x in states:
        if int(owner[x]) != 1 + callee:
            by_automaton.setdefault(int(owner[x]), []).append(int(x - offsets[owner[x]]))
    for a, qs in by_automaton.items():  # all of one automaton's states before it is renumbered
        dfa, calls = new[a]
        sink = dfa.num_states
        delta = np.concatenate([dfa.delta, np.full((1, 256), REJECT, np.int32)])
        calls = np.concatenate([calls, np.full((1, calls.shape[1]), REJECT, np.int32)])
        delta[qs] = REJECT
        calls[qs] = REJECT
        calls[qs, callee] = sink
        joined = minimize(
            ByteDFA(
                np.concatenate([delta, calls], axis=1),
                np.concatenate([dfa.accepting, [True]]),
                dfa.initial,
            )
        )
        new[a] = (
            ByteDFA(joined.delta[:, :256], joined.accepting, joined.initial),
            joined.delta[:, 256:],
        )
    return new, int(callee == rules)


@compiles_for_vocabulary
def json_schema_grammar(
    schema,
    vocabulary: TokenVocabulary,
    *,
    stack_depth: int = DEFAULT_STACK_DEPTH,
    _rewritten: tuple | None = None,
    _over_regex: bool = False,
    **options,
) -> PushdownAutomaton:
    """The grammar form of a JSON Schema: a `PushdownAutomaton` whose rules are its large
    subschemas, so that a definition used in many places, or the values of an object with many
    optional properties, are compiled once instead of copied into one regex.

    The schema is rewritten as for `json_schema_regex` (one marker per distinct subschema
    regex); a marker whose regex (its own rules called) exceeds `RULE_REGEX` characters, or
    `SHARED_RULE_REGEX` when it is used more than once, becomes a rule: in its callers' regexes
    it is a call (three control characters, `rule_call`), and its own regex becomes a byte DFA
    with call edges (`rule_edges`), as the free-form value's call does in
    `json_schema_pushdown`. Only terminals stay regexes: strings with patterns and formats,
    number ranges, keys. A call that a one-byte lookahead cannot choose (an `anyOf` of two
    objects, both starting with `{`) is inlined instead (the rule is banned and the rules are
    planned again). Then a tail several automata share becomes a rule they tail-call
    (`_shared_tails`: fewer positions, the same language). This is how llguidance and XGrammar
    scale to large schemas (a lexer of regex terminals under a grammar of rules). Memoised in
    this process.

    **Arguments:** `schema`, `vocabulary`; `stack_depth`: stack slots (nested rule calls,
    free-form values included); `options`: those of `json_schema_regex` (`free_form_depth=None`
    calls a free-form JSON value rule, as `json_schema_pushdown`); `_over_regex` (internal):
    the form stands in for a single regex over `GRAMMAR_REGEX` characters, so its positions
    limit is `OVER_REGEX_SCALE` times larger.

    **Raises:** as `json_schema_regex`; `ConstraintError` (`RegexTooLarge`) when a single rule
    would still exceed `MAX_REGEX` characters, or when the rules' automata have more than
    `MAX_GRAMMAR_POSITIONS` states in all (too slow to build the token tables); `NotDeterministic` when the rules cannot run
    deterministically even with the conflicting calls inlined.

    Source: the rule/terminal split of llguidance (github.com/guidance-ai/llguidance,
    `docs/json_schema.md`) and XGrammar (Dong et al. 2024, arXiv 2411.15100).
    """
    free = options.get("free_form_depth", DEFAULT_FREE_FORM_DEPTH)
    if free is None:
        options["free_form_depth"] = CALL
    scale = budgets.OVER_REGEX_SCALE if _over_regex else 1
    max_positions, max_before_tails = (
        scale * budgets.MAX_GRAMMAR_POSITIONS,
        scale * budgets.MAX_POSITIONS_BEFORE_TAILS,
    )
    rewriter, regex = _rewritten if _rewritten is not None else rewrite(schema, **options)
    warn_dropped(rewriter)
    if rewriter.recursive:
        regex = merge_equal_markers(rewriter, regex)
    ws = rewriter.ws
    banned: set = set()
    dfas: dict[tuple[str, int, bool], tuple] = {}

    frozen: dict[str, set] = {}
    for _ in range(8):
        promoted: dict[str, str] = {}
        root, rules, texts = plan_rules(rewriter, regex, banned, promoted, frozen)
        every = [root, *texts]
        call = escape(FREE_VALUE_CALL)
        value = any(call in text for text in every)
        key = cache_key("json-grammar", f"{stack_depth}\0" + "\0".join(every), vocabulary)
        if key in PUSHDOWN_CACHE:
            warn_order_fixed(rewriter)
            return PUSHDOWN_CACHE[key]
        built: dict[int, tuple] = {}
        # Strings given as automata first (built already: their positions alone may refuse the
        # form, MaskBench o1052's 60,003 states before a 9 s rule), then the regexes that call a
        # free-form value: their check may refuse the plan.
        given = [text.startswith("(?:") and text[3:-1] in rewriter.dfa_texts for text in every]
        order = sorted(range(len(every)), key=lambda a: (not given[a], call not in every[a]))
        # the rules not built by an earlier plan (kept in `dfas`; maybe gone from the memo)
        ahead = [
            every[a] for a in order if not given[a] and (every[a], len(rules), value) not in dfas
        ]
        with build_ahead(ahead, value):
            for a in order:
                text = every[a]
                if (text, len(rules), value) not in dfas:
                    dfas[text, len(rules), value] = (
                        inlined_rule_edges(text, len(rules), ws)
                        if value and call in text
                        else rule_automaton(rewriter, text, len(rules), value)
                    )
                built[a] = dfas[text, len(rules), value]
                if call in text:
                    check_value_calls(*built[a][:2], "schema" if a == 0 else f"rule{a - 1}")
                positions = sum(entry[0].num_states for entry in built.values())
                if positions > max_before_tails:  # refused before the other rules
                    raise TooManyPositions(positions, len(rules), max_positions)
        automata = [built[a][:2] for a in range(len(every))]
        registers = [built[a][2] for a in range(len(every))]
        bad = nondeterministic_calls(automata, len(rules))
        if not bad:
            if rewriter.recursive:
                check_productive(automata, len(rules))
            break
        banned |= {rules[r] for r in bad}
        for r in bad:
            if rules[r] in promoted:
                parent = promoted[rules[r]]
                frozen[parent] = {c for c, p in promoted.items() if p == parent} - banned
    else:
        raise NotDeterministic("the schema's rules cannot be called deterministically")
    plain = automata
    # Sharing tails keeps every state of the largest automaton (its head stays, its tail
    # becomes a rule): over the limit already, the form is refused before that search, which
    # takes minutes on 60,000 states (MaskBench o82710's 5,000-character string).
    largest = max(dfa.num_states for dfa, _ in automata)
    if largest > max_positions:
        raise TooManyPositions(
            sum(dfa.num_states for dfa, _ in automata), len(automata) - 1, max_positions
        )
    automata, _ = _shared_tails(automata, len(rules), value, registers)
    positions = sum(dfa.num_states for dfa, _ in automata)
    if positions > max_positions:
        raise TooManyPositions(positions, len(automata) - 1, max_positions)

    def build(automata: list):
        names = ["schema"] + [f"rule{i}" for i in range(len(automata) - 1)]
        # the rules `_shared_tails` added (after the others) have no register
        every_register = registers + [None] * (len(automata) - len(registers))
        return build_pushdown(
            free_value_grammar(ws) if value else None,
            vocabulary,
            stack_depth=stack_depth,
            rules=[(name, dfa, calls) for name, (dfa, calls) in zip(names, automata)],
            registers=every_register if any(r is not None for r in registers) else None,
            description=f"json schema {describe(schema)} (grammar, {len(automata) - 1} rules)",
        )

    try:
        automaton = build(automata)
    except NotDeterministic:
        # a shared tail returns to the return positions of all its callers together, where a
        # one-byte lookahead may no longer decide when to return: the rules without them
        if automata is plain:
            raise
        automaton = build(plain)
    if len(PUSHDOWN_CACHE) >= 16:
        PUSHDOWN_CACHE.pop(next(iter(PUSHDOWN_CACHE)))
    PUSHDOWN_CACHE[key] = automaton
    warn_order_fixed(rewriter)
    return automaton
