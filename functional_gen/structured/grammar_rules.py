"""The rules of a grammar as automata: which rules are cut into calls (`cut_rules`) and each
rule body as a minimal DFA over byte classes and call symbols (`RuleBuilder`).

Shared by the bounded-depth construction (`grammar`) and the pushdown automaton (`pda`), which
both import it; it imports neither.
"""

import typing

import numpy as np

from .byte_dfa import REJECT, ByteDFA, minimize, regex_byte_dfa
from .grammar_syntax import Alt, GrammarError, GrammarSpec, Ref, Repeat, Seq, Terminal

# --------------------------------------------------------------------------- rule graph


def _references(node, out: set) -> set:
    if isinstance(node, Ref):
        out.add(node.name)
    elif isinstance(node, Seq):
        for i in node.items:
            _references(i, out)
    elif isinstance(node, Alt):
        for o in node.options:
            _references(o, out)
    elif isinstance(node, Repeat):
        _references(node.item, out)
    return out


def _strongly_connected(graph: dict[str, set]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                out.append(component)
    return out


def cut_rules(spec: GrammarSpec) -> list[str]:
    """Rules whose references become calls: every cycle of the rule graph goes through one.

    Greedy: while a cycle remains, cut the rule of each cyclic component with the most
    (incoming x outgoing) references inside it, ties to the first defined.
    """
    order = {name: i for i, name in enumerate(spec.rules)}
    graph = {name: _references(body, set()) for name, body in spec.rules.items()}
    cut: list[str] = []
    while True:
        live = {n: {m for m in refs if m not in cut} for n, refs in graph.items() if n not in cut}
        cyclic = [c for c in _strongly_connected(live) if len(c) > 1 or c[0] in live[c[0]]]
        if not cyclic:
            return cut
        for component in cyclic:
            members = set(component)

            @typing.no_type_check
            def score(n, live=live, members=members):
                inside_out = len(live[n] & members)
                inside_in = sum(n in live[m] for m in members)
                return (-inside_in * inside_out, order[n])

            cut.append(min(component, key=score))


# --------------------------------------------------------------------------- rule automata


class _NFA:
    """Thompson-style NFA over integer symbols (byte classes, then call symbols)."""

    def __init__(self):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int]]] = []

    def state(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1


class RuleBuilder:
    """The rules of a grammar as minimal DFAs over byte classes and call symbols: every
    reference to a cut rule (`cut_rules`) is a call symbol, every other one is inlined; the
    `%ignore` terminals may appear between any two items. `byte_class` maps a byte to its class
    (bytes every terminal treats alike); `rule_dfa(body, top=...)` builds one rule's DFA."""

    def __init__(self, spec: GrammarSpec, cut: list[str]):
        self.spec = spec
        self.cut = {name: i for i, name in enumerate(cut)}
        # The ignored terminals, any number of them, form one terminal of their own.
        self.ignore = (
            Terminal("(?:" + "|".join(f"(?:{r})" for r in spec.ignore) + ")*")
            if spec.ignore
            else None
        )
        regexes = sorted(
            {r for body in spec.rules.values() for r in _terminals(body, set())}
            | ({self.ignore.regex} if self.ignore else set())
        )
        self.terminals = {r: regex_byte_dfa(r) for r in regexes}
        # Byte classes: bytes that every terminal DFA treats alike.
        stacked = (
            np.concatenate([d.delta for d in self.terminals.values()], axis=0)
            if regexes
            else np.zeros((1, 256), np.int32)
        )
        _, self.byte_class = np.unique(stacked, axis=1, return_inverse=True)
        self.byte_class = self.byte_class.reshape(-1)
        self.num_classes = int(self.byte_class.max()) + 1
        self.class_byte = np.zeros(self.num_classes, np.int64)
        self.class_byte[self.byte_class] = np.arange(256)

    @property
    def num_symbols(self) -> int:
        return self.num_classes + len(self.cut)

    def fragment(self, nfa: _NFA, node, inlining: tuple) -> tuple[int, int]:
        if isinstance(node, Terminal):
            dfa = self.terminals[node.regex]
            base = len(nfa.eps)
            for _ in range(dfa.num_states):
                nfa.state()
            end = nfa.state()
            table = dfa.delta[:, self.class_byte]
            for q in range(dfa.num_states):
                for c in np.flatnonzero(table[q] != REJECT):
                    nfa.edges[base + q].append((int(c), base + int(table[q, c])))
                if dfa.accepting[q]:
                    nfa.eps[base + q].append(end)
            return base + dfa.initial, end
        if isinstance(node, Ref):
            if node.name in self.cut:
                start, end = nfa.state(), nfa.state()
                nfa.edges[start].append((self.num_classes + self.cut[node.name], end))
                return start, end
            if node.name in inlining:  # cannot happen: cycles go through cut rules
                raise GrammarError(f"internal: rule {node.name} inlined into itself")
            return self.fragment(nfa, self.spec.rules[node.name], inlining + (node.name,))
        if isinstance(node, Seq):
            start = end = nfa.state()
            for i, item in enumerate(node.items):
                if i:
                    end = self.append_ignore(nfa, end, inlining)
                end = self.append(nfa, end, item, inlining)
            return start, end
        if isinstance(node, Alt):
            start, end = nfa.state(), nfa.state()
            for option in node.options:
                s, e = self.fragment(nfa, option, inlining)
                nfa.eps[start].append(s)
                nfa.eps[e].append(end)
            return start, end
        if isinstance(node, Repeat):
            # Copies separated by the ignored terminals: item (ignore item){low-1} ...
            start = end = nfa.state()
            for k in range(node.low):
                if k:
                    end = self.append_ignore(nfa, end, inlining)
                end = self.append(nfa, end, node.item, inlining)
            if node.high is None:
                hub = nfa.state()
                nfa.eps[end].append(hub)
                body_start = nfa.state()
                body_end = self.append_ignore(nfa, body_start, inlining) if node.low else body_start
                body_end = self.append(nfa, body_end, node.item, inlining)
                if not node.low:  # between the optional copies
                    body_end = self.append_ignore(nfa, body_end, inlining)
                nfa.eps[hub].append(body_start)
                nfa.eps[body_end].append(hub)
                return start, hub
            finish = nfa.state()
            nfa.eps[end].append(finish)
            for k in range(node.high - node.low):
                if node.low or k:
                    end = self.append_ignore(nfa, end, inlining)
                end = self.append(nfa, end, node.item, inlining)
                nfa.eps[end].append(finish)
            return start, finish
        raise TypeError(node)

    def append(self, nfa: _NFA, end: int, node, inlining: tuple) -> int:
        s, e = self.fragment(nfa, node, inlining)
        nfa.eps[end].append(s)
        return e

    def append_ignore(self, nfa: _NFA, end: int, inlining: tuple) -> int:
        return end if self.ignore is None else self.append(nfa, end, self.ignore, inlining)

    def rule_dfa(self, body, *, top: bool):
        """Minimal DFA (table over symbols, accepting, initial) of one rule body."""
        nfa = _NFA()
        if top and self.ignore is not None:
            body = Seq((self.ignore, body, self.ignore))
        start, end = self.fragment(nfa, body, ())
        return _determinize(nfa, start, end, self.num_symbols)


def _terminals(node, out: set) -> set:
    if isinstance(node, Terminal):
        out.add(node.regex)
    elif isinstance(node, Seq):
        for i in node.items:
            _terminals(i, out)
    elif isinstance(node, Alt):
        for o in node.options:
            _terminals(o, out)
    elif isinstance(node, Repeat):
        _terminals(node.item, out)
    return out


def _closure(nfa: _NFA, states) -> frozenset:
    seen, work = set(states), list(states)
    while work:
        for t in nfa.eps[work.pop()]:
            if t not in seen:
                seen.add(t)
                work.append(t)
    return frozenset(seen)


def _determinize(nfa: _NFA, start: int, end: int, num_symbols: int):
    first = _closure(nfa, [start])
    ids, order = {first: 0}, [first]
    rows = []
    i = 0
    while i < len(order):
        current = order[i]
        moves: dict[int, set] = {}
        for q in current:
            for sym, t in nfa.edges[q]:
                moves.setdefault(sym, set()).add(t)
        row = np.full(num_symbols, REJECT, np.int64)
        for sym, targets in moves.items():
            nxt = _closure(nfa, targets)
            if nxt not in ids:
                ids[nxt] = len(order)
                order.append(nxt)
            row[sym] = ids[nxt]
        rows.append(row)
        i += 1
    table = np.stack(rows)
    accepting = np.array([end in s for s in order])
    dfa = minimize(ByteDFA(table, accepting, 0))  # minimisation works on any alphabet width
    return dfa
