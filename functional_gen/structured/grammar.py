"""`Grammar`: generated text in the language of a context-free grammar, up to a nesting depth.

A context-free language needs a stack, and a jitted loop needs fixed shapes. We bound the
stack: the grammar is compiled into the regular language of its derivations in which at most
`max_depth` recursive calls are open at once, built directly as a minimal DFA (no regex text,
which would grow exponentially with the depth), then lifted to tokens like a regex. On the
device it is the same one-int32-per-row automaton as `Regex`; text that would open a level
beyond `max_depth` is simply not offered, so every output parses. Deeper nesting is cut off,
never produced invalid.

The construction:

1. Terminals (strings, regexes) become byte DFAs (`byte_dfa.regex_byte_dfa`).
2. Rule references that can recurse are cut at a small set of rules (a feedback vertex set of
   the rule graph, chosen greedily: for JSON, `value`; for arithmetic, `expr`). Every other
   reference is inlined. Each cut rule, and the start rule, becomes a minimal DFA over bytes
   and "call" symbols.
3. The bounded-stack product: a state is a set of configurations `(rule, state, stack)`, the
   stack holding return states, at most `max_depth` deep. Calls push, accepting states of a
   called rule pop. Subset construction over bytes, then minimisation.

`max_depth` counts the calls of the cut rules open at once, the top level included: for JSON
(cut at `value`) it is the nesting depth of values, e.g. `{"a": [1]}` needs 3 (the object, the
array, the number), and with `max_depth=2` a container inside a container must be empty; for
the arithmetic grammar (cut at `factor`) a plain number needs 1, and every parenthesis or unary
minus around it one more. The number of DFA states grows with the number of distinct stacks:
linearly in the depth when one rule recurses through one kind of call site (parentheses), about
2^depth for JSON (objects and arrays nest in any order).

Source: the bounded-depth regular approximation of a CFG (cf. Pereira & Wright, "Finite-state
approximation of phrase structure grammars", 1991; Mohri & Nederhof, 2001). The grammar syntax
is Lark's (`grammar_syntax`); `%ignore` terminals may appear between any two items.
"""

import functools
import typing
import warnings
from collections.abc import Sequence
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from ..processors.base import per_row_field
from .automaton import ConstraintError, TokenAutomaton, cache_key, cached
from .byte_dfa import REJECT, ByteDFA, lift, minimize
from .grammar_rules import RuleBuilder, cut_rules
from .grammar_syntax import (
    GrammarError,
    GrammarSpec,
    gbnf_to_lark,
    parse_grammar,
)
from .processor import (
    AbstractConstraint,
    ConstraintTables,
    automata_tables,
    pushdown_tables,
    rows_of,
)
from .pushdown import (
    DEFAULT_NUM_STACKS,
    DEFAULT_STACK_DEPTH,
    NotDeterministic,
    PushdownAutomaton,
    build_pushdown,
)
from .vocabulary import TokenVocabulary, vocabulary_from_tokenizer

# Nested helpers that run per byte, state or schema node are `@typing.no_type_check`: the
# tests' jaxtyping import hook would wrap every call of them (30-40 us each, and a fresh
# wrapper per definition), which was most of the structured tests' time.

DEFAULT_MAX_DEPTH = 4
"""Default bound on open recursive calls (see the module docstring)."""
MAX_STATES = 200_000
"""The construction stops with an error beyond this many byte-DFA states."""


# --------------------------------------------------------------------------- bounded stack


def grammar_byte_dfa(spec: GrammarSpec, max_depth: int) -> ByteDFA:
    """The minimal byte DFA of the grammar's derivations with at most `max_depth` open
    recursive calls (see the module docstring).

    **Raises:** `GrammarError` when the construction exceeds `MAX_STATES` states (lower
    `max_depth`) or the language is empty.
    """
    cut = cut_rules(spec)
    builder = RuleBuilder(spec, cut)
    top = builder.rule_dfa(spec.rules[spec.start], top=True)
    called = [builder.rule_dfa(spec.rules[name], top=False) for name in cut]
    automata = [top, *called]  # automaton 0 is the top level, 1 + i the cut rule i
    num_classes = builder.num_classes

    @typing.no_type_check
    def closure(configs) -> frozenset:
        seen, work = set(configs), list(configs)
        while work:
            auto, q, stack = work.pop()
            dfa = automata[auto]
            new = []
            if len(stack) < max_depth:
                for r in range(len(cut)):
                    ret = int(dfa.delta[q, num_classes + r])
                    if ret != REJECT:
                        callee = automata[1 + r]
                        new.append((1 + r, callee.initial, stack + ((auto, ret),)))
            if stack and dfa.accepting[q]:
                caller, ret = stack[-1]
                new.append((caller, ret, stack[:-1]))
            for c in new:
                if c not in seen:
                    seen.add(c)
                    work.append(c)
        return frozenset(seen)

    first = closure([(0, top.initial, ())])
    ids, order, rows = {first: 0}, [first], []
    i = 0
    while i < len(order):
        current = order[i]
        row = np.full(num_classes, REJECT, np.int64)
        moves: dict[int, list] = {}
        for auto, q, stack in current:
            targets = automata[auto].delta[q, :num_classes]
            for c in np.flatnonzero(targets != REJECT):
                moves.setdefault(int(c), []).append((auto, int(targets[c]), stack))
        for c, configs in moves.items():
            nxt = closure(configs)
            if nxt not in ids:
                if len(order) >= MAX_STATES:
                    raise GrammarError(
                        f"the grammar's automaton exceeds {MAX_STATES} states at max_depth={max_depth}; "
                        "lower max_depth"
                    )
                ids[nxt] = len(order)
                order.append(nxt)
            row[c] = ids[nxt]
        rows.append(row)
        i += 1
    table = np.stack(rows)[:, builder.byte_class]
    accepting = np.array(
        [any(a == 0 and not s and top.accepting[q] for a, q, s in configs) for configs in order]
    )
    try:
        return minimize(ByteDFA(table.astype(np.int32), accepting, 0))
    except ConstraintError:
        raise GrammarError(
            f"no text of the grammar nests at most max_depth={max_depth} recursive calls "
            f"(of the rules {cut}); raise max_depth"
        ) from None


def grammar_automaton(
    grammar: str,
    vocabulary: TokenVocabulary,
    *,
    start: str = "start",
    max_depth: int = DEFAULT_MAX_DEPTH,
    cache: bool = True,
) -> TokenAutomaton:
    """Compile a Lark grammar into a `TokenAutomaton` (through the memory and disk caches).

    **Raises:** `GrammarError` (a `ValueError`) for grammar errors or too many states;
    `ValueError` for a `max_depth` below 0.
    """
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"`max_depth` must be an integer >= 0, got {max_depth!r}")
    spec = parse_grammar(grammar, start)  # errors before anything is built or cached

    def build():
        return lift(
            grammar_byte_dfa(spec, max_depth),
            vocabulary,
            f"grammar (start={start}, max_depth={max_depth})",
        )

    return cached("grammar", f"{start}\0{max_depth}\0{grammar}", vocabulary, build, cache=cache)


def pushdown_automaton(
    grammar: str,
    vocabulary: TokenVocabulary,
    *,
    start: str = "start",
    stack_depth: int = DEFAULT_STACK_DEPTH,
    cache: bool = True,
    forks: bool = False,
) -> PushdownAutomaton:
    """Compile a Lark grammar into a `PushdownAutomaton` (memoised in this process). `forks`:
    bytes that can be read in several ways become forks (`build_pushdown(forks=True)`, run by
    `ParallelPushdownConstraint`) instead of `NotDeterministic`.

    **Raises:** `GrammarError` for grammar errors; `NotDeterministic` (a `GrammarError`) when
    the grammar cannot run as a pushdown automaton (without `forks`: also a byte read in
    several ways); `ValueError` for a `stack_depth` below 1.
    """
    if isinstance(stack_depth, bool) or not isinstance(stack_depth, int) or stack_depth < 1:
        raise ValueError(f"`stack_depth` must be an integer >= 1, got {stack_depth!r}")
    spec = parse_grammar(grammar, start)
    key = cache_key("pda", f"{start}\0{stack_depth}\0{forks}\0{grammar}", vocabulary)
    if cache and key in _PUSHDOWN_CACHE:
        return _PUSHDOWN_CACHE[key]
    automaton = build_pushdown(
        spec,
        vocabulary,
        stack_depth=stack_depth,
        description=f"grammar (start={start}, stack_depth={stack_depth})",
        forks=forks,
    )
    if cache:
        if len(_PUSHDOWN_CACHE) >= 16:
            _PUSHDOWN_CACHE.pop(next(iter(_PUSHDOWN_CACHE)))
        _PUSHDOWN_CACHE[key] = automaton
    return automaton


_PUSHDOWN_CACHE: dict[str, PushdownAutomaton] = {}


class Grammar(AbstractConstraint):
    """Constrain the generated text to a context-free grammar (Lark syntax).

    Two compilations, chosen automatically:

    - **pushdown automaton** (the default for a recursive grammar): one automaton per recursive
      rule, a stack of `stack_depth` return positions per row (`functional_gen.structured.pushdown`).
      Exact up to `stack_depth` open calls (JSON: nesting depth ~`stack_depth`), compiled in
      well under a second, and its size does not grow with the depth.
    - **bounded-depth DFA** (a grammar without recursion, a list of grammars, an explicit
      `max_depth`, or a grammar the pushdown automaton cannot run deterministically, with a
      warning): a token automaton that follows derivations with at most `max_depth` open
      recursive calls (see the module docstring), one int32 state per row like `Regex`, and
      finishing inside the language within `max_new_tokens`.

    Either way every output that ends with an end-of-generation token parses with the grammar;
    deeper nesting is never offered.

    !!! Example
        ```python
        arithmetic = '''
        start: expr
        ?expr: term (("+" | "-") term)*
        ?term: factor (("*" | "/") factor)*
        ?factor: NUMBER | "(" expr ")"
        NUMBER: /[0-9]+/
        '''
        calc = fg.processors.Grammar(arithmetic, tokenizer)               # pushdown automaton
        calc3 = fg.processors.Grammar(arithmetic, tokenizer, max_depth=3)  # bounded-depth DFA
        ```

    **Arguments:**

    - `grammar`: the grammar text (Lark EBNF subset, see
      `functional_gen.structured.grammar_syntax`), a `pathlib.Path` to a grammar file, or a list
      with one per row (`None`: unconstrained row).
    - `tokenizer`, `eos_token_id`, `vocab_size`: as in `Regex`.
    - `start`: the start rule (default `"start"`).
    - `max_depth`: give it to force the bounded-depth DFA with this bound on open calls of the
      recursive rules (for JSON, the nesting depth of values). Default `None`: automatic (the
      DFA, when used, gets `DEFAULT_MAX_DEPTH` = 4).
    - `stack_depth`: stack slots per row of the pushdown automaton (default 32).
    - `num_stacks`: parallel stacks per row for a grammar in which a byte can be read in
      several ways that one byte of lookahead cannot tell apart (llama.cpp's `c.gbnf`: `(`
      after `return `), as llama.cpp keeps one stack per reading (default
      `DEFAULT_NUM_STACKS` = 4; `functional_gen.structured.pushdown.parallel`). Past that many
      readings at once the first ones are kept: the mask stays sound (no dead end), some texts
      are no longer offered. `num_stacks=1` refuses such a grammar as a pushdown automaton
      (the bounded-depth DFA then runs, with a warning). A grammar that one byte decides
      runs with one stack whatever `num_stacks` says.

    **Raises:** `GrammarError` (a `ValueError`) naming the line for syntax errors, unsupported
    directives, undefined rules or terminals; or when the DFA grows beyond `MAX_STATES`;
    `ValueError` for a negative `max_depth`, a `stack_depth` or `num_stacks` below 1.

    Source: recursive transition networks (Woods 1970) with XGrammar's split of
    context-independent and stack-dependent tokens (Dong et al. 2024); bounded-depth regular
    approximation of context-free grammars (Pereira & Wright 1991); Lark's grammar format.
    """

    tables: ConstraintTables
    constraint_id: Int[Array, "*rows"] = per_row_field()

    def __init__(
        self,
        grammar: str | Path | Sequence[str | Path | None],
        tokenizer,
        *,
        start: str = "start",
        max_depth: int | None = None,
        stack_depth: int = DEFAULT_STACK_DEPTH,
        num_stacks: int = DEFAULT_NUM_STACKS,
        eos_token_id: int | Sequence[int] | None = None,
        vocab_size: int | None = None,
    ):
        if isinstance(num_stacks, bool) or not isinstance(num_stacks, int) or num_stacks < 1:
            raise ValueError(f"`num_stacks` must be an integer >= 1, got {num_stacks!r}")
        grammars, ids = rows_of(
            grammar,
            lambda g: isinstance(g, (str, Path)),
            "grammar",
            "a grammar (text or a pathlib.Path)",
        )
        texts = [_read(g) for g in grammars]
        vocabulary = vocabulary_from_tokenizer(
            tokenizer, eos_token_id=eos_token_id, vocab_size=vocab_size
        )
        if max_depth is None and len(texts) == 1 and cut_rules(parse_grammar(texts[0], start)):
            try:
                automaton = pushdown_automaton(
                    texts[0],
                    vocabulary,
                    start=start,
                    stack_depth=stack_depth,
                    forks=num_stacks > 1,
                )
            except NotDeterministic as e:
                warnings.warn(
                    f"this grammar cannot run as a pushdown automaton ({e}); using the bounded-depth DFA "
                    f"with max_depth={DEFAULT_MAX_DEPTH} instead",
                    stacklevel=2,
                )
            else:
                self.tables = pushdown_tables(automaton, ids, num_stacks=num_stacks)
                self.constraint_id = jnp.asarray(ids, jnp.int32)
                return
        depth = DEFAULT_MAX_DEPTH if max_depth is None else max_depth
        self.tables = automata_tables(
            [grammar_automaton(t, vocabulary, start=start, max_depth=depth) for t in texts]
        )
        self.constraint_id = jnp.asarray(ids, jnp.int32)

    @classmethod
    def from_gbnf(
        cls, grammar: str | Path | Sequence[str | Path | None], tokenizer, **kwargs
    ) -> "Grammar":
        """A `Grammar` from llama.cpp's GBNF (text, a `pathlib.Path` to a `.gbnf` file, or a list
        with one per row), converted to Lark by llguidance (`grammar_syntax.gbnf_to_lark`): the
        start rule is GBNF's `root`. Keyword arguments as for `Grammar`.

        !!! Example
            ```python
            gbnf = 'root ::= "(" [a-z]+ ("," [a-z]+)* ")"'
            fg.processors.Grammar.from_gbnf(gbnf, tokenizer)
            ```

        **Raises:** `GrammarError` naming the line for GBNF syntax errors, and as `Grammar`.
        """
        if isinstance(grammar, (str, Path)):
            return cls(gbnf_to_lark(_read(grammar)), tokenizer, **kwargs)
        if isinstance(grammar, Sequence):
            return cls(
                [None if g is None else gbnf_to_lark(_read(g)) for g in grammar],
                tokenizer,
                **kwargs,
            )
        raise TypeError(
            f"`grammar` must be GBNF text, a pathlib.Path or a list of them, got {grammar!r}"
        )


@functools.singledispatch
def _read(grammar) -> str:
    return grammar


@_read.register
def _(grammar: Path) -> str:
    try:
        return grammar.read_text()
    except OSError as e:
        raise GrammarError(f"cannot read the grammar file {grammar}: {e}") from None
