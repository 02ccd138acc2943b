"""The grammar form's plan: which markers become rules (`plan_rules`: large subschemas,
recursive targets, strings given as automata), equal markers merged, cycles broken.
"""

import re
import typing

from ..automaton import ConstraintError
from ..dfa_operations import numbered_mark
from ..pushdown import NotDeterministic
from . import budgets
from .errors import (
    RecursionRefused,
    RegexTooLarge,
    UnsupportedSchemaError,
)
from .rewriter import Rewriter

RULE_CALL = 0x02
"""The byte that starts a rule call in a grammar-form regex, followed by two digit bytes
`0x10 + i // 16`, `0x10 + i % 16` (rule `i`): control characters, which JSON text never holds
raw (strings escape them, whitespace is space, tab, CR and LF)."""


def rule_call(i: int) -> str:
    """The regex of the call of schema rule `i` (three control characters, `numbered_mark`)."""
    return numbered_mark(RULE_CALL, i)


def plan_rules(
    rewriter: Rewriter,
    regex: str,
    banned: set,
    promoted: dict[str, str] | None = None,
    frozen: dict[str, set] | None = None,
) -> tuple[str, list[str], list[str]]:
    """Which markers of `rewriter` become rules, and every regex with them called.

    Bottom-up over the markers (a DAG: one marker per distinct regex): a marker's size is its
    regex with its non-rule markers expanded and its rules called; it becomes a rule when that
    size exceeds `RULE_REGEX`, or `SHARED_RULE_REGEX` when it is used in more than one place,
    unless it is `banned` (a call that would not be deterministic). A marker over `RULE_REGEX`
    first calls its largest subschemas (down to `MIN_RULE_REGEX` characters) until it fits;
    `promoted` (filled when given) maps each subschema called that way to that marker. A marker
    in `frozen` calls only the subschemas listed for it there (those it called in the previous
    plan that were not banned): when some of its calls were not deterministic, the next largest
    are alternatives of the same kind (MaskBench o21378: an `anyOf` of 23 objects, 11 banned
    in one plan and the other 12 in the next, a 76,760-character rule built in vain, 2 s).
    Strings given as automata and objects read in any order by theirs
    (`Rewriter.order_automata`) are always rules (they have no regex to inline).
    The markers of recursive targets (`Rewriter.recursive`) are always rules, numbered first:
    every cycle of the marker graph passes through one of them, so the graph without their
    out-edges is a DAG and the bottom-up pass measures the others first.
    Returns `(root regex, rule
    names, rule regexes)`, the regexes with each rule's marker replaced by `rule_call`.

    **Raises:** `NotDeterministic` when a recursive target's rule is `banned` (it cannot be
    inlined); `RecursionRefused` beyond `MAX_RULES` recursive targets."""
    found = re.compile(f'"(FGSUB[0-9]+X{rewriter.tag})"')
    uses: dict[str, int] = {}
    order: list[str] = []
    seen: set = set()
    recursive = _cycle_breakers(rewriter, regex, banned)
    calls = set(recursive)
    if len(recursive) > budgets.MAX_RULES:
        raise RecursionRefused(f"more than {budgets.MAX_RULES} recursive targets")

    @typing.no_type_check
    def visit(text: str) -> None:
        for match in found.finditer(text):
            name = match.group(1)
            uses[name] = uses.get(name, 0) + 1
            if name not in seen:
                seen.add(name)
                if name not in calls:
                    visit(rewriter.substitutions[name])
                    order.append(name)  # after its children

    visit(regex)
    for name in recursive:  # after everything they call: their sizes are not needed
        seen.add(name)
        visit(rewriter.substitutions[name])
    repeated = {
        item for array, (item, _) in rewriter.item_repeats.items() if array in uses and item in uses
    }
    size: dict[str, int] = {}
    index: dict[str, int] = {name: i for i, name in enumerate(recursive)}
    call_size = len(rule_call(0))

    @typing.no_type_check
    def one(name: str) -> int:
        return call_size if name in index else size[name] + 4

    @typing.no_type_check
    def measured(text: str, name: str) -> int:
        total = len(text) + rewriter.repeat_weight.get(name, 0)
        for match in found.finditer(text):
            total += one(match.group(1)) - len(match.group(0))
        if name in rewriter.item_repeats:
            item, copies = rewriter.item_repeats[name]
            total += copies * one(item)
        return total

    for name in order:
        if _dfa_rule(rewriter, name, index, banned) or _order_rule(rewriter, name, index, banned):
            continue
        text = rewriter.substitutions[name]
        size[name] = measured(text, name)
        if size[name] > budgets.RULE_REGEX:
            # too large to be one regex: call its largest subschemas instead, until it fits
            children = sorted(
                {m.group(1) for m in found.finditer(text)} - index.keys() - banned,
                key=lambda child: -size[child],
            )
            if frozen is not None and name in frozen:
                children = [child for child in children if child in frozen[name]]
            for child in children:
                if size[name] <= budgets.RULE_REGEX or size[child] < budgets.MIN_RULE_REGEX:
                    break
                if len(index) < budgets.MAX_RULES:
                    index[child] = len(index)
                    size[name] = measured(text, name)
                    if promoted is not None:
                        promoted[child] = name
        limit = (
            budgets.REPEATED_RULE_REGEX
            if name in repeated  # one call per copy of a counted repeat instead of the item
            else budgets.ORDER_VALUE_RULE_REGEX
            if name in rewriter.order_values  # one call per member set instead of a copy
            else budgets.SHARED_RULE_REGEX
            if uses[name] > 1
            else budgets.RULE_REGEX
        )
        if size[name] > limit and name not in banned and len(index) < budgets.MAX_RULES:
            index[name] = len(index)
    expanded: dict[str, str] = {}

    @typing.no_type_check
    def expand(match) -> str:
        name = match.group(1)
        if name in index:
            return rule_call(index[name])
        if name not in expanded:
            expanded[name] = "(?:" + found.sub(expand, rewriter.substitutions[name]) + ")"
        return expanded[name]

    rules = list(index)
    texts = [found.sub(expand, regex)] + [
        "(?:" + found.sub(expand, rewriter.substitutions[name]) + ")" for name in rules
    ]
    for text in texts:
        if len(text) > budgets.MAX_REGEX:
            raise RegexTooLarge(len(text), budgets.MAX_REGEX)
    return texts[0], rules, texts[1:]


def merge_equal_markers(rewriter: Rewriter, regex: str) -> str:
    """For the grammar form of a recursive schema: one marker for markers of the same regex
    once their callees are merged, and none for a marker whose regex is another marker alone
    (a recursive target's rule is `(?:"X")` when its body was rewritten as marker X), until
    nothing changes; `regex` with the merged names. Each unrolled copy of a recursive definition
    names its own callees, so a tree of `anyOf` items of two definitions has several markers of
    the same `anyOf` whose rules, merged into one automaton, would call different rules at the
    same state; merged, they call one. Markers of string automata and counted items keep their
    names (their sizes are recorded by name). Updates `rewriter` in place."""
    found = re.compile(f'"(FGSUB[0-9]+X{rewriter.tag})"')
    alone = re.compile(f'\\(\\?:"(FGSUB[0-9]+X{rewriter.tag})"\\)')
    pinned = {*rewriter.dfa_terminals, *rewriter.item_repeats, *rewriter.repeat_weight}
    alias: dict[str, str] = {}

    def resolve(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    def renamed(text: str) -> str:
        return found.sub(lambda m: f'"{resolve(m.group(1))}"', text)

    changed = True
    while changed:
        changed, first = False, {}
        for name, text in list(rewriter.substitutions.items()):
            if name in alias:
                continue
            text = rewriter.substitutions[name] = renamed(text)
            if name not in pinned:
                single = alone.fullmatch(text)
                target = single.group(1) if single else first.get(text)
                if target is not None and resolve(target) != name:
                    alias[name] = resolve(target)
                    changed = True
                    continue
            first.setdefault(text, name)
    for name in alias:
        del rewriter.substitutions[name]
    rewriter.recursive = {k: resolve(name) for k, name in rewriter.recursive.items()}
    rewriter.item_repeats = {
        array: (resolve(item), copies) for array, (item, copies) in rewriter.item_repeats.items()
    }
    return renamed(regex)


def _cycle_breakers(rewriter: Rewriter, regex: str, banned: set) -> list[str]:
    """For `plan_rules`: the markers that must be rules so that every cycle of the marker graph
    (from `regex`) passes through one, none of them `banned`. These are the recursive targets
    (`Rewriter.recursive`) unless one is banned: a tree whose items are an `anyOf` of two
    recursive objects (`{"anyOf": [{"$ref": "#/definitions/Leaf"}, {"$ref":
    "#/definitions/Branch"}]}`, both starting with `{`) cannot call either, so each cycle
    through a banned target is broken at its nearest marker before it that is not banned (the
    `anyOf` itself: one rule whose automaton holds both objects, called where the items start).

    **Raises:** `NotDeterministic` when a cycle has only banned markers."""
    recursive = list(dict.fromkeys(rewriter.recursive.values()))
    if not banned & set(recursive):
        return recursive
    found = re.compile(f'"(FGSUB[0-9]+X{rewriter.tag})"')
    children: dict[str, list[str]] = {}
    pending = found.findall(regex)
    while pending:
        name = pending.pop()
        if name not in children:
            children[name] = list(dict.fromkeys(found.findall(rewriter.substitutions[name])))
            pending += children[name]
    breakers = [name for name in recursive if name not in banned]
    while (cycle := _marker_cycle(children, set(breakers))) is not None:
        at = next(i for i, name in enumerate(cycle) if name in banned)
        before = [cycle[at - j] for j in range(1, len(cycle)) if cycle[at - j] not in banned]
        if not before:
            raise NotDeterministic(
                "a recursive reference is called where one byte cannot choose it"
            )
        breakers.append(before[0])
    return breakers


def _marker_cycle(children: dict[str, list[str]], cut: set) -> list[str] | None:
    """A cycle of the marker graph `children` that passes through none of `cut` (its markers in
    order, each one's successor the next, the last one's the first), or `None`: an iterative
    depth-first search."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for start in children:
        if start in cut or start in state:
            continue
        path, iterators = [start], [iter(children[start])]
        state[start] = 1
        while path:
            child = next(iterators[-1], None)
            if child is None:
                state[path.pop()] = 2
                iterators.pop()
            elif child in cut or state.get(child) == 2:
                continue
            elif state.get(child) == 1:
                return path[path.index(child) :]
            else:
                state[child] = 1
                path.append(child)
                iterators.append(iter(children[child]))
    return None


def _order_rule(rewriter: Rewriter, name: str, index: dict, banned: set) -> bool:
    """For `plan_rules`: make marker `name` a rule (`index[name]`) if it is an object read in
    any order by its automaton (`Rewriter.order_automata`), which has no regex to inline;
    whether it is.

    **Raises:** `NotDeterministic` when it is `banned` (called where one byte cannot choose
    it, e.g. an `anyOf` of two objects); `ConstraintError` beyond `MAX_RULES` rules."""
    if name not in rewriter.order_automata:
        return False
    if name in banned:
        raise NotDeterministic(
            "an object read in any order is called where one byte cannot choose it"
        )
    _number_rule(index, name)
    return True


def _dfa_rule(rewriter: Rewriter, name: str, index: dict, banned: set) -> bool:
    """For `plan_rules`: make marker `name` a rule (`index[name]`) if it is a string given as
    an automaton (`Rewriter.dfa_terminals`), which cannot be inlined as a regex; whether it is.

    **Raises:** `UnsupportedSchemaError` when it is `banned` (called where one byte of
    lookahead cannot choose it, e.g. an `anyOf` of it and another string);
    `ConstraintError` beyond `MAX_RULES` rules."""
    if name not in rewriter.dfa_terminals:
        return False
    _, path, keyword = rewriter.dfa_terminals[name]
    if name in banned:
        raise UnsupportedSchemaError(
            keyword,
            path,
            "a length-bounded string automaton is called where another value may also start "
            "(e.g. `anyOf` with another string): the grammar form cannot choose it",
        )
    _number_rule(index, name)
    return True


def _number_rule(index: dict, name: str) -> None:
    """Give marker `name` the next rule number in `index` unless it has one.

    **Raises:** `ConstraintError` beyond `MAX_RULES` rules."""
    if name not in index:
        if len(index) >= budgets.MAX_RULES:
            raise ConstraintError(f"the schema needs more than {budgets.MAX_RULES} grammar rules")
        index[name] = len(index)
