"""Plain JSON strings with a large `maxLength` by a per-frame *counter register* (issue 55).
A byte DFA needs about `budgets.PLAIN_STRING_STATES` (12) states per character of
`maxLength`, so a plain string over `budgets.MAX_STRING_STATES / 12` (about 5,333) characters
cannot be a counted automaton, and one of a few hundred is a spliced automaton of tens of
thousands of states. Instead (`strings.counter_terminal`), a plain string with a `maxLength`
over `budgets.COUNTED_STRING_MIN` (256) becomes its
own grammar-form rule, a *counter rule*: `"`, `formats.ANY_STRING`'s body looping, `"`, whose
frame's register counts the characters written, and a byte that starts a character past the
limit `N` is refused.

**Register actions** (`PushdownAutomaton.step`, beside the member-set register's `reg_clear`,
`reg_set`, `reg_require` of `register_objects`): one more table, `reg_limit[position, class]`,
`N` on a transition that starts a character (from the body's loop state: an ASCII byte other
than `"`, a UTF-8 lead byte, the `\\` of an escape), 0 elsewhere. Such a byte adds 1 to the
frame's register (after the `reg_clear` of the opening `"`, so a tail-called string starts at
0 too) and is refused when the register then exceeds `N`. The register is saved on push and
restored on pop as the member-set register is, so a counter frame inside an object read in any
order (or a string inside a string's caller) keeps each frame's count. A counter rule has no
`reg_require`: `register_budget.register_frames` does not see it, and the budget (`need`) is
`token_distance`'s: the string may close at any time, `maxLength` adds no token need.

JSON Schema counts code points (`len` of the decoded `str`): `é`, `中`, `😀` (one UTF-8 lead
byte each) and an escape `\\n` are one character each. `ANY_STRING` has no `\\u` escapes; if
they are ever added, the surrogate pair `\\ud83d\\ude00` is ONE code point (jsonschema: `len`
1) and its low half's `\\` must not count: the low half is then read from a state after a high
surrogate, not from the loop state, so counting "from the loop state only" stays right if the
regex spells the pair as one alternative.

**Plan** (what is done is marked DONE, tested in `tests/structured/test_counter_strings.py`):

1. DONE `counter_string_dfa(limit)` (this module): the rule's DFA and its four action tables.
2. DONE `pushdown.automaton.PushdownAutomaton`: field `reg_limit` (`Int[positions, classes]`,
   empty without a register), `step` counts and refuses past the limit, `nbytes` counts it.
3. DONE `pushdown.building.build_pushdown(registers=)`: an entry may have a fourth table
   (`reg_limit`); `_byte_rule_automata` splits byte classes on it; `_register_tables` maps it
   to positions as the other three (`reader`: a call's first byte takes the callee's action).
4. DONE (host) the mask: `counter_tables` in `pushdown.exact_tokens`: `counted[counter_row[pos], t]`
   (int16 `[counter positions, vocab]`, from each position of a counter rule the characters
   token `t` writes before it leaves the string; `counter_row[pos]` -1 outside), and
   `PushdownAutomaton.allowed` ANDs `counted[row, t] <= reg_limit_of_rule - register` into the
   register-blind bitmask row where the current frame is a counter frame (tokens that enter a
   string from outside write fewer characters than their bytes, fewer than N: no check needed).
   The candidate / best / one-byte tokens are walked exactly by `step`, so they already count.
   `build_pushdown` refuses a limit under the longest token (`ValueError`): a token entering
   the string from outside is then never checked (N is at least 257 - 64 = 193; SmolLM2's
   longest token is 81 bytes, Gemma 3's 48; a string whose N is under the vocabulary's longest
   token is no counter rule: `LONGEST_TOKEN`).
5. DONE (tested on CPU JAX, not on a GPU) the device: `RegisterWalk` reads `reg_limit` (`register + 1`, `DEAD` past it),
   `RegisterPushdownConstraint._counter_fits` (a hook of `PushdownConstraint._allowed`, ANDed
   into the bitmask row) is the `counted` compare (one gather of a `[vocab]` int16 row and one
   compare per step); tests: device walk == host walk, masks == `allowed`.
6. DONE the JSON Schema side: `strings.rewrite_string` calls `strings.counter_terminal` for
   a plain string with a `maxLength` over `COUNTED_STRING_MIN` (no `pattern` nor `format`:
   those are spliced automata, refused over `MAX_STRING_STATES`, as before) and a `minLength` of at most `budgets.COUNTER_MIN_LENGTH`:
   a `dfa_terminal` placeholder whose quoted DFA is `counter_string_dfa(limit, minimum).dfa`
   (`Rewriter.dfa_texts`) and whose `CounterDFA` is in
   `Rewriter.counter_texts`. `rule_plan._dfa_rule` makes it a rule (never inlined; its call
   banned where another string may start: refused, "the grammar form cannot choose it"),
   `rule_automata.rule_automaton` returns `(dfa, calls, counter.registers)`, and
   `processor.py` picks `RegisterPushdownConstraint` (`has_register`). The token-DFA form never
   splices it: `compiling.json_schema_compile` drops the single regex when it holds a counter
   placeholder (`regex_form.counter_placeholders`), and `spliced_dfa` / `spliced_too_large`
   refuse one; `strings.string_automaton` does not return its (limitless) DFA, so `not` /
   exact `oneOf` refuse it instead of losing the limit. Tests (thresholds lowered to a
   `maxLength` of 100): `tests/structured/test_counter_strings.py`, through SmolLM2's tokens.
   Not run on a GPU.

**Open problems** (found while building steps 1-6):

- FIXED MaskBench Github_medium o9784 (a `maxLength` 32,767 plain string beside 1,024-character
  ones and an array of 1,000 24-digit ids): refused in 1.5 s before step 6 (the 32,767 string),
  then past the benchmark's 120 s timeout: its grammar form is too large (the ids' array is
  28,003 positions), and `nest_instead`'s fallback compile tried the call form again from an
  uncounted rewrite (`compiling.json_schema_compile`), where the string is a `{0,32767}` regex
  repeat: 220 s in `minimize`. The fallback no longer retries the call form
  (`_call_form_failed`): refused in 2.5 s (`budgets.COUNTER_STRINGS` on since).
- FIXED Snowplow sp_2_Normalized was refused: its 4,096-character string was under
  `MAX_STRING_STATES` (a 49,155-state spliced automaton), so no counter rule, and over the
  grammar form's positions. Since 2026-12-04 every plain string with a `maxLength` over
  `COUNTED_STRING_MIN` is a counter rule: sp_2 and sp_7 compile (1,217 and 2,080 positions, 5-6
  s), MaskBench o69969 4.8 -> 2.6 s, o54613's valid documents in another member order accepted
  (the grammar form reads its object in any order; the spliced token automaton fixed one).

- `processor.py` needs no change: `has_register` is true for a counter rule (its `reg_set`
  table exists), so `RegisterPushdownConstraint` runs it; the state keeps its five leaves
  (the counter is the frame's `uint32` register), so `SequenceState` forks and reorders
  need nothing.
- `build_pushdown` refuses `registers` with `forks`: a schema that needs parallel stacks and
  has a long string cannot compile (as for register objects); `grammar_form` never asks for
  forks with registers.
- `grammar_form._shared_tails` and `inlined_rule_edges` already leave automata with a
  register alone (their tables are indexed by states): a counter rule is never a shared tail
  nor inlined. A counter rule starts with `"`: called where another string may start (an
  `anyOf` of it and an enum) the call is not deterministic (`_dfa_rule`'s "banned" error).
- `counted` is `counter positions x vocab` int16 per counter rule (12 positions: 3 MiB for
  128k tokens); its rows do not depend on the limit, so rules of different limits could share
  them (a per-position limit instead of per-row) - not done. `counter_tables` walks every
  token from every counter position with numpy (12 x longest token passes over the vocabulary;
  not timed on a real vocabulary).
- `PushdownAutomaton`'s jaxtyping dims: `register_index` is `register_positions`, as `reg_clear`
  is, but is empty where no rule has a required member while `reg_clear` is not, so
  `dataclasses.replace` of an automaton with a counter (or any register without required
  members) fails its type check (the tests copy it with `copy.copy` instead). Pre-existing;
  rename `register_index`'s dim.
- DONE `minLength` (up to `budgets.COUNTER_MIN_LENGTH`, 64; MaskBench has 0 in 45 schemas, 1 in
  18, 4 in 7, 50 in 9 beside a `maxLength` over 5,333): no register action, a chain of states
  in the DFA: `"`, then `minLength` characters the register does not count, then the loop
  that counts up to `maxLength - minLength` more, the closing `"` only from the loop. The
  token budget sees the chain as any DFA's (`token_distance`), and `counter_tables` gives
  rows only to the positions where the register may be over 0 (`_counted_positions`: the
  loop and its multi-byte states), not to the chain's.
"""

import contextlib
import contextvars
import dataclasses
import functools

import numpy as np
from jaxtyping import Bool, Int, UInt32

from ..byte_dfa import REJECT, ByteDFA, minimize, regex_byte_dfa
from ..formats import ANY_STRING
from ..vocabulary import TokenVocabulary

LONGEST_TOKEN: contextvars.ContextVar[int] = contextvars.ContextVar("longest_token", default=0)
"""Bytes of the longest token of the vocabulary a schema is being compiled for (set by
`counting_for`; 0 outside a compile, as `json_schema_regex` has no vocabulary). A plain string
is a counter rule only where `maxLength - minLength` is at least this: a token entering the
string from outside is never checked against the counter (`pushdown.exact_tokens.counter_tables`
refuses a shorter limit), so such a string keeps the counted byte automaton."""


@contextlib.contextmanager
def counting_for(vocabulary: TokenVocabulary):
    """`LONGEST_TOKEN` set to `vocabulary`'s longest token (bytes, `TokenVocabulary.token_length`)
    inside the `with` block, and reset after it (nested compiles restore the outer value).
    Raises nothing of its own."""
    reset = LONGEST_TOKEN.set(int(vocabulary.token_length.max(initial=0)))
    try:
        yield
    finally:
        LONGEST_TOKEN.reset(reset)


def compiles_for_vocabulary(compile_function):
    """`compile_function(schema, vocabulary, ...)` run inside `counting_for(vocabulary)`: the
    schema compilers that take a vocabulary (`json_schema_compile`, `json_schema_grammar`)."""

    @functools.wraps(compile_function)
    def compiling(schema, vocabulary, *args, **kwargs):
        with counting_for(vocabulary):
            return compile_function(schema, vocabulary, *args, **kwargs)

    return compiling


@dataclasses.dataclass(frozen=True, eq=False)
class CounterDFA:
    """A JSON string's byte DFA (`"`, `ANY_STRING`'s body, `"`) with a character counter (see
    the module docstring), and a host-side walk (the reference of the pushdown tables).

    **Attributes:** `dfa` (`ByteDFA`), `limit` (`N`, the most characters), `minimum` (`m`, the
    fewest: the first `m` characters are a chain of states, not counted), and per (state, byte)
    `reg_clear` (`Bool`, the opening `"`), `reg_set` (`Int`, zeros), `reg_require` (`UInt32`,
    zeros), `reg_limit` (`Int`, `N - m` where the byte starts a character after the first `m`,
    else 0).
    """

    dfa: ByteDFA
    limit: int
    minimum: int
    reg_clear: Bool[np.ndarray, "states 256"]
    reg_set: Int[np.ndarray, "states 256"]
    reg_require: UInt32[np.ndarray, "states 256"]
    reg_limit: Int[np.ndarray, "states 256"]

    @property
    def registers(self) -> tuple:
        """The entry of `build_pushdown(registers=)` for this rule."""
        return self.reg_clear, self.reg_set, self.reg_require, self.reg_limit

    def walk(self, data: bytes):
        """`(state, characters)` after `data`, or `None` when a byte is refused."""
        state, count = self.dfa.initial, 0
        for b in data:
            target = int(self.dfa.delta[state, b])
            if target == REJECT:
                return None
            if self.reg_clear[state, b]:
                count = 0
            if self.reg_limit[state, b]:
                count += 1
                if count > self.reg_limit[state, b]:
                    return None
            state = target
        return state, count

    def accepts(self, data: bytes) -> bool:
        """Whether `data` is a whole JSON string of `minimum` to `limit` characters."""
        end = self.walk(data)
        return end is not None and bool(self.dfa.accepting[end[0]])


def counter_string_dfa(limit: int, minimum: int = 0) -> CounterDFA:
    """The counter rule of a plain JSON string of `minimum` to `limit` characters (see the
    module docstring): its first `minimum` characters are a chain of states (the closing `"`
    only after them) that the register does not count, the loop after them counts up to
    `limit - minimum` more.

    **Raises:** `ValueError` for a `limit` under 1 (`maxLength` 0 is the DFA `""`), a negative
    `minimum`, or one not under `limit` (a string of one length needs no loop)."""
    if limit < 1:
        raise ValueError(f"counter_string_dfa: limit {limit} < 1")
    if not 0 <= minimum < limit:
        raise ValueError(f"counter_string_dfa: minimum {minimum} not in [0, limit {limit})")
    character = ANY_STRING.removesuffix("*")
    chain = f"{character}{{{minimum}}}" if minimum else ""
    dfa = minimize(regex_byte_dfa(f'"{chain}{ANY_STRING}"'))
    delta = dfa.delta
    quote = ord('"')
    if delta[dfa.initial, quote] == REJECT:
        raise RuntimeError("internal error: a JSON string's DFA does not start with '\"'")
    # the loop: the one state whose `"` closes the string
    closes = np.flatnonzero(
        (delta[:, quote] != REJECT) & dfa.accepting[np.maximum(delta[:, quote], 0)]
    )
    if closes.size != 1:
        raise RuntimeError(f"internal error: a counter string closes from {closes.size} states")
    body = int(closes[0])
    shape = delta.shape
    reg_clear = np.zeros(shape, bool)
    reg_clear[dfa.initial, quote] = True
    reg_limit = np.zeros(shape, np.int32)
    starts = delta[body] != REJECT
    starts[quote] = False  # the closing quote writes no character
    reg_limit[body, starts] = limit - minimum
    return CounterDFA(
        dfa=dfa,
        limit=int(limit),
        minimum=int(minimum),
        reg_clear=reg_clear,
        reg_set=np.zeros(shape, np.int32),
        reg_require=np.zeros(shape, np.uint32),
        reg_limit=reg_limit,
    )
