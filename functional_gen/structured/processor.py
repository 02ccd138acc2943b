"""`AbstractConstraint`: the logits processor that runs token automata inside the jitted step.

One processor holds `K` compiled constraints (`TokenAutomaton`s) in one set of device arrays,
and each row says which one it follows (`constraint_id`, `-1` for an unconstrained row). The
automata share ONE state space: constraint `k` owns a block of rows of `transitions` and
`distance` (row 0 is the shared dead state), so memory is the sum of the constraints' sizes, not
`K` times the largest. Per row, the state is ONE int32: the current state in that space.
Everything else (the tables) is a field of the processor, shared by all rows and never copied
into the state. Table shapes are padded to buckets (8, 12, 16, 24, 32, ... states and classes; a
power of two of constraints) and nothing else about a constraint is static, so a new constraint
of a similar size reuses the compiled generation loop.

At each step, for one row of constraint `k` in state `s`, with `r` tokens left to generate (this
one included):

1. advance (lagged): `s = transitions[s, token_class[k, last_token]]`, but only once a token has
   been generated (`num_generated > 0`): at the first step the last token is the prompt's, and
   `init` already returned the initial state. A row therefore never needs the sampled token at
   the end of the step; it reads it back from `context.token_ids` at the next one.
2. mask: token `t` is allowed iff `distance[transitions[s, token_class[k, t]]] <= r - 1`: the
   token is a transition of the automaton AND an accepting state is still reachable within the
   budget. Since the accepting states have distance 0 and the end-of-generation ids loop on
   them, EOS is allowed exactly in accepting states, and a row always ends inside the language:
   at `r = 1` only tokens that complete it (or EOS) remain.
3. every other logit becomes `-inf`. A row with no allowed token (a dead state, reached only if a
   later processor forced a disallowed token, or a budget too small for the shortest text) gets
   all `-inf`, which the step turns into finish reason `"constraint"` without sampling.

The cost per row and step is a gather of the `[vocab]` class row, one row of `transitions`
(`[classes]`), a `[classes]` gather of distances, one `[vocab]` gather from it, and a `where`;
no host work. Reordering rows (beam search) is one gather of the int32 state like any other
state leaf.
"""

import warnings
from collections.abc import Callable, Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, UInt32

from ..processors.base import AbstractLogitsProcessor, Context, per_row_field
from .automaton import DEAD, INFINITE_DISTANCE, INITIAL, TokenAutomaton
from .buckets import bucket
from .pushdown import DEFAULT_NUM_STACKS, ParallelPushdownConstraint, PushdownConstraint
from .pushdown.register_walk import RegisterPushdownConstraint

ConstraintState = (
    Int[Array, ""]
    | tuple[Int[Array, ""], Int[Array, " depth"], Int[Array, ""]]
    | tuple[Int[Array, " stacks"], Int[Array, "stacks depth"], Int[Array, " stacks"]]
    | tuple[
        Int[Array, ""],
        Int[Array, " depth"],
        Int[Array, ""],
        UInt32[Array, ""],
        UInt32[Array, " depth"],
    ]
)
"""A row's constraint state: a token automaton's state (an int32 scalar); a pushdown
automaton's `(position, stack[depth], stack_pointer)`; with forks (parallel stacks) one of each
per stack (`[stacks]`, `[stacks, depth]`, `[stacks]`); with a member-set register,
`(position, stack[depth], stack_pointer, register, registers[depth])`."""


def _concatenate(automata: Sequence[TokenAutomaton]):
    """One state space for several automata: automaton `k`'s state `s >= 1` becomes
    `s + offset[k]`; the dead state 0 is shared. Class ids stay per automaton. Shapes are padded
    to buckets: states and classes with "not allowed", constraints (to a power of two) with
    automata that allow nothing."""
    vocab = {a.vocab_size for a in automata}
    if len(vocab) != 1:
        raise ValueError(
            f"constraints built for different vocabularies cannot share a batch: vocab sizes {sorted(vocab)}"
        )
    eos = {a.eos_token_id for a in automata}
    if len(eos) != 1:
        raise ValueError(
            f"constraints with different end-of-generation ids cannot share a batch: {sorted(eos)}"
        )
    num_classes = bucket(max(a.num_classes for a in automata))
    offsets = np.cumsum([0] + [a.num_states - 1 for a in automata[:-1]])
    total = bucket(1 + sum(a.num_states - 1 for a in automata), 16)
    transitions = np.zeros((total, num_classes), np.int32)
    distance = np.full(total, INFINITE_DISTANCE, np.int32)
    for a, offset in zip(automata, offsets):
        rows = slice(1 + offset, a.num_states + offset)
        local = a.transitions[1:]
        transitions[rows, : a.num_classes] = np.where(local != DEAD, local + offset, DEAD)
        distance[rows] = a.distance[1:]
    num_constraints = 1 << (len(automata) - 1).bit_length()
    token_class = np.zeros((num_constraints, automata[0].vocab_size), np.int32)
    token_class[: len(automata)] = np.stack([a.token_class for a in automata])
    initial = np.zeros(num_constraints, np.int32)
    initial[: len(automata)] = INITIAL + offsets
    return token_class, transitions, distance, initial, next(iter(eos))


class ConstraintTables(eqx.Module):
    """The device tables of a constraint processor, shared by all its rows: token automata in
    one state space (see the module docstring), or a pushdown automaton.

    Build it with `automata_tables` or `pushdown_tables`.

    **Attributes:**

    - `token_class`: `Int[Array, "constraints vocab"]`, each token's class per constraint.
    - `transitions`: `Int[Array, "states classes"]`, next state (0 = not allowed) in ONE state
      space for all constraints (constraint `k` owns a block of rows; row 0 is the shared dead
      state); classes are padded to the widest constraint.
    - `distance`: `Int[Array, " states"]`, fewest tokens to an accepting state.
    - `initial_state`: `Int[Array, " constraints"]`, each constraint's initial state.
    - `eos_token_id`: static tuple of the end-of-generation ids the tables allow in accepting
      states. Generation must stop on these ids (the default of `generate` for the model's EOS
      ids; pass the model's ids to the constructor if they differ).
    - `pushdown`: the `PushdownConstraint` that runs instead of the token automata (which then
      hold one constraint that allows nothing and are not used), or `None`.
    - `token_recipe`: for a pushdown automaton that also has a token-automaton form (a
      `JsonSchema`): the key of the function that builds it (`register_token_recipe`), which
      `per_row` calls. An int32 array, not a static field: processors of different schemas keep
      one tree structure, so `generate` does not recompile for a new schema of the same table
      sizes.
    """

    token_class: Int[Array, "constraints vocab"]
    transitions: Int[Array, "states classes"]
    distance: Int[Array, " states"]
    initial_state: Int[Array, " constraints"]
    eos_token_id: tuple[int, ...] = eqx.field(static=True)
    pushdown: PushdownConstraint | None = None
    token_recipe: Int[Array, ""] | None = None


def automata_tables(automata: Sequence[TokenAutomaton]) -> ConstraintTables:
    """The tables of token automata in one state space, padded to buckets (`_concatenate`).

    **Raises:** `ValueError` for automata of different vocabularies or EOS ids."""
    token_class, transitions, distance, initial, eos = _concatenate(automata)
    return ConstraintTables(
        token_class=jnp.asarray(token_class),
        transitions=jnp.asarray(transitions),
        distance=jnp.asarray(distance),
        initial_state=jnp.asarray(initial),
        eos_token_id=tuple(eos),
    )


def pushdown_tables(
    automaton,
    constraint_id,
    token_recipe: Int[Array, ""] | None = None,
    num_stacks: int = DEFAULT_NUM_STACKS,
) -> ConstraintTables:
    """The tables that run a `PushdownAutomaton` (`structured.pushdown`) for the rows of
    `constraint_id`; the token-automaton tables then hold one constraint that allows nothing
    and are not used. `token_recipe`: see `ConstraintTables`. An automaton with forks runs as a
    `ParallelPushdownConstraint` with `num_stacks` configurations per row; one with a
    member-set register (`has_register`: a JSON Schema object read in any order, issue 55) as a
    `RegisterPushdownConstraint` (its state per row `(position, stack, stack_pointer, register,
    registers)`); any other as a `PushdownConstraint` (`num_stacks` unused)."""
    if automaton.num_forks:
        pushdown = ParallelPushdownConstraint(automaton, constraint_id, num_stacks)
    elif automaton.has_register:
        pushdown = RegisterPushdownConstraint(automaton, constraint_id)
    else:
        pushdown = PushdownConstraint(automaton, constraint_id)
    return ConstraintTables(
        token_class=jnp.zeros((1, 1), jnp.int32),
        transitions=jnp.zeros((2, 1), jnp.int32),
        distance=jnp.zeros(2, jnp.int32),
        initial_state=jnp.ones(1, jnp.int32),
        eos_token_id=tuple(automaton.eos_token_id),
        pushdown=pushdown,
        token_recipe=token_recipe,
    )


class AbstractConstraint(AbstractLogitsProcessor):
    """Base of the structured-generation processors (`Regex`, `JsonSchema`, `Choice`,
    `Grammar`, `TokenConstraint`): a stack of token automata evaluated on the device.

    A subclass only compiles its inputs to `TokenAutomaton`s (or a `PushdownAutomaton`) and
    declares two fields: `tables` (`automata_tables(...)` or `pushdown_tables(...)`) and
    `constraint_id` (a `per_row_field`); the state, the mask and the advance live here (see the
    module docstring). The tables' fields read as the processor's own (`token_class`,
    `transitions`, `distance`, `initial_state`, `eos_token_id`, `pushdown`, `token_recipe`).

    **Attributes:**

    - `tables`: the `ConstraintTables`, shared by all rows.
    - `constraint_id`: `Int[Array, "*rows"]`, which constraint a row follows: a scalar for all
      rows, or one value per row; `-1` leaves a row unconstrained.
    """

    tables: eqx.AbstractVar[ConstraintTables]
    constraint_id: eqx.AbstractVar[Int[Array, "*rows"]]

    @property
    def token_class(self) -> Int[Array, "constraints vocab"]:
        """Each token's class per constraint (`ConstraintTables.token_class`)."""
        return self.tables.token_class

    @property
    def transitions(self) -> Int[Array, "states classes"]:
        """Next state per state and class (`ConstraintTables.transitions`)."""
        return self.tables.transitions

    @property
    def distance(self) -> Int[Array, " states"]:
        """Fewest tokens to an accepting state (`ConstraintTables.distance`)."""
        return self.tables.distance

    @property
    def initial_state(self) -> Int[Array, " constraints"]:
        """Each constraint's initial state (`ConstraintTables.initial_state`)."""
        return self.tables.initial_state

    @property
    def eos_token_id(self) -> tuple[int, ...]:
        """The end-of-generation ids the tables allow (`ConstraintTables.eos_token_id`)."""
        return self.tables.eos_token_id

    @property
    def pushdown(self) -> PushdownConstraint | None:
        """The pushdown automaton that runs instead of the token automata, or `None`."""
        return self.tables.pushdown

    @property
    def token_recipe(self) -> Int[Array, ""] | None:
        """The key of a pushdown constraint's token-automaton form (`register_token_recipe`)."""
        return self.tables.token_recipe

    @property
    def num_constraints(self) -> int:
        """How many constraints the tables hold (not counting the padding; 1 for a pushdown
        automaton)."""
        if self.pushdown is not None:
            return 1
        return int(np.count_nonzero(np.asarray(self.token_class).max(axis=1)))

    def init(self, context: Context):
        """The initial automaton state of the row's constraint (an int32 scalar per row), or
        the pushdown automaton's `(position, stack, stack_pointer)` (with a register, also
        `register, registers`)."""
        if self.pushdown is not None:
            return self.pushdown.init(context)
        return self.initial_state[jnp.maximum(self.constraint_id, 0)].astype(jnp.int32)

    def process(
        self,
        state: ConstraintState,
        logits: Float[Array, " vocab"],
        context: Context,
    ) -> tuple[ConstraintState, Float[Array, " vocab"]]:
        """Advance on the previous token, then mask every token that leaves the language or the
        budget (`-inf`). Unconstrained rows (`constraint_id < 0`) pass through unchanged.

        **Returns:** `(state, logits)`, the state like the one given: an int32 scalar, or for a
        pushdown automaton `(position, stack[depth], stack_pointer)` (with forks, one of each
        per parallel stack: `[stacks]`, `[stacks, depth]`, `[stacks]`; with a member-set
        register, `(position, stack[depth], stack_pointer, register, registers[depth])`).
        """
        if self.pushdown is not None:
            # the row's own id: this processor's `constraint_id` is a per-row field (vmapped
            # with the rows); the pushdown's copy inside `tables` is not, and holds every row's
            pushdown = eqx.tree_at(lambda p: p.constraint_id, self.pushdown, self.constraint_id)
            return pushdown.process(state, logits, context)
        token_class = self.token_class[jnp.maximum(self.constraint_id, 0)]  # [vocab of the tables]
        return automaton_step(
            token_class,
            self.transitions,
            self.distance,
            self.constraint_id >= 0,
            state,
            logits,
            context,
        )


def automaton_step(
    token_class: Int[Array, " vocab"],
    transitions: Int[Array, "states classes"],
    distance: Int[Array, " states"],
    constrained: Bool[Array, ""],
    state: Int[Array, ""],
    logits: Float[Array, " vocab"],
    context: Context,
) -> tuple[Int[Array, ""], Float[Array, " vocab"]]:
    """One row's advance and mask (steps 1-3 of the module docstring) with the tables of the
    row's automaton: `token_class` (the row's class of each token), `transitions`, `distance`.
    Shared by `AbstractConstraint.process` and the serving engine's per-slot table pool, so both
    compute the same mask. `constrained=False` passes the logits through unchanged.

    **Returns:** `(state, logits)`: the automaton state after the previous token, and the logits
    with every token outside the language or the budget at `-inf`."""
    advanced = transitions[state, token_class[context.last_token_id]]
    state = jnp.where(context.num_generated > 0, advanced, state).astype(jnp.int32)

    remaining = context.max_new_tokens - context.num_generated  # this token included
    after = distance[transitions[state]]  # [classes]: distance after each class
    allowed = (after <= remaining - 1)[token_class]  # [vocab of the tables]
    vocab = logits.shape[-1]
    if allowed.shape[0] < vocab:  # logits wider than the tokenizer: extra ids never allowed
        allowed = jnp.pad(allowed, (0, vocab - allowed.shape[0]))
    allowed = allowed[:vocab]
    logits = jnp.where(constrained & ~allowed, -jnp.inf, logits).astype(logits.dtype)
    return state, logits


class TokenConstraint(AbstractConstraint):
    """A processor from already compiled `TokenAutomaton`s (the general form of `Regex`,
    `JsonSchema`, `Choice` and `Grammar`).

    **Arguments:**

    - `automata`: one `TokenAutomaton` or a sequence of them (same vocabulary and EOS ids).
    - `constraint_id`: which automaton each row follows: an int for every row, or one per row
      (`-1`: unconstrained). Default: 0 for a single automaton.

    **Raises:** `ValueError` for automata of different vocabularies, or ids out of range.
    """

    tables: ConstraintTables
    constraint_id: Int[Array, "*rows"] = per_row_field()

    def __init__(self, automata: TokenAutomaton | Sequence[TokenAutomaton], constraint_id=None):
        if isinstance(automata, TokenAutomaton):
            automata = [automata]
        automata = list(automata)
        if not automata:
            raise ValueError("no automata given")
        if constraint_id is None:
            if len(automata) != 1:
                raise ValueError(
                    f"{len(automata)} automata given: pass `constraint_id` (one automaton index per row)"
                )
            constraint_id = 0
        ids = np.asarray(constraint_id)
        if (
            ids.ndim > 1
            or not np.issubdtype(ids.dtype, np.integer)
            or np.any(ids < -1)
            or np.any(ids >= len(automata))
        ):
            raise ValueError(
                f"`constraint_id` must be an int or one int per row in [-1, {len(automata)}), got {constraint_id!r}"
            )
        self.tables = automata_tables(automata)
        self.constraint_id = jnp.asarray(ids, jnp.int32)


_TOKEN_RECIPES: dict[int, tuple[Callable[[], TokenAutomaton], str]] = {}


def register_token_recipe(build: Callable[[], TokenAutomaton], what: str) -> Int[Array, ""]:
    """Remember how to build the token-automaton form of a constraint compiled as a pushdown
    automaton (`build()`, called by `per_row` only when needed; `what` says what the token form
    gives up, for its warning). **Returns:** the key for `AbstractConstraint.token_recipe`
    (an int32 scalar array)."""
    key = len(_TOKEN_RECIPES)
    _TOKEN_RECIPES[key] = (build, what)
    return jnp.asarray(key, jnp.int32)


def per_row(constraints: Sequence[AbstractConstraint | None]) -> TokenConstraint:
    """One processor that applies a different constraint to each row of a batch.

    **Arguments:** `constraints`: one entry per row: a constraint processor that holds a single
    constraint (e.g. `Regex("[0-9]+", tokenizer)`, `JsonSchema(schema, tokenizer)`), or `None`
    for an unconstrained row. Equal processors share their tables.

    **Returns:** a `TokenConstraint` whose tables stack the distinct constraints and whose
    `constraint_id` holds one value per row; use it with a batch of `len(constraints)` prompts.

    A constraint compiled as a pushdown automaton cannot share the tables: a `JsonSchema` is
    then rebuilt as its token automaton (free-form values nested `NESTED_FREE_FORM_DEPTH`
    level, recursive references unrolled `DEFAULT_MAX_RECURSION_DEPTH` times), with a
    `UserWarning` saying so; a `Grammar` is refused (build it with `max_depth`).

    **Raises:** `ValueError` for an empty list, an entry that holds several constraints, a
    pushdown `Grammar`, or constraints built for different vocabularies; `TypeError` for an
    entry that is not a constraint.
    """
    constraints = list(constraints)
    if not constraints:
        raise ValueError("`per_row` needs one entry per row, got an empty list")
    automata: list[TokenAutomaton] = []
    index: dict[int, int] = {}
    ids = []
    for row, c in enumerate(constraints):
        if c is None:
            ids.append(-1)
            continue
        if not isinstance(c, AbstractConstraint):
            raise TypeError(
                f"row {row}: expected a constraint processor or None, got {type(c).__name__}"
            )
        rebuilt = None
        if c.pushdown is not None and c.token_recipe is not None:
            build, what = _TOKEN_RECIPES[int(c.token_recipe)]
            warnings.warn(
                f"per_row: row {row}'s {type(c).__name__} is a pushdown automaton; its token "
                f"automaton is used instead ({what})",
                UserWarning,
                stacklevel=2,
            )
            rebuilt = build()
        elif c.pushdown is not None:
            raise ValueError(
                f"row {row}: a {type(c).__name__} compiled as a pushdown automaton cannot share tables with "
                "other constraints; build it as a token automaton (Grammar: max_depth=...) to use "
                "it in `per_row`"
            )
        if c.num_constraints != 1 or np.ndim(c.constraint_id) != 0:
            raise ValueError(
                f"row {row}: {type(c).__name__} holds several constraints; give one per row"
            )
        if id(c) not in index:
            index[id(c)] = len(automata)
            automata.append(_automaton_of(c) if rebuilt is None else rebuilt)
        ids.append(index[id(c)] if int(c.constraint_id) >= 0 else -1)
    if not automata:
        raise ValueError("`per_row` got no constraint at all (every row is None)")
    return TokenConstraint(automata, np.asarray(ids, np.int32))


def _automaton_of(c: AbstractConstraint) -> TokenAutomaton:
    """The host tables of a single-constraint processor, without the padding."""
    token_class = np.asarray(c.token_class[0])
    distance = np.asarray(c.distance)
    num_states = (
        int(np.flatnonzero(distance < INFINITE_DISTANCE).max()) + 1
    )  # live states come first
    return TokenAutomaton(
        token_class=token_class,
        transitions=np.asarray(c.transitions)[:num_states, : int(token_class.max()) + 1],
        distance=distance[:num_states],
        eos_token_id=c.eos_token_id,
    )


def rows_of(value, is_single, name: str, expected: str = "a constraint"):
    """Split a processor input into distinct constraints and per-row ids.

    `value` is one constraint (`is_single(value)`) or a sequence with one entry per row (`None`:
    unconstrained row). Equal entries (by `repr`) are compiled once.

    **Returns:** `(distinct, constraint_id)`: the distinct constraints and an int (single) or one
    int per row.

    **Raises:** `ValueError` for an empty sequence or one without any constraint.
    """
    if is_single(value):
        return [value], 0
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"`{name}` must be {expected}, or a list with one per row, got {value!r}")
    if not value:
        raise ValueError(f"`{name}` is an empty list; give one constraint, or one per row")
    distinct, seen, ids = [], {}, []
    for v in value:
        if v is None:
            ids.append(-1)
            continue
        if not is_single(v):
            raise TypeError(f"each entry of `{name}` must be {expected} or None, got {v!r}")
        key = repr(v)
        if key not in seen:
            seen[key] = len(distinct)
            distinct.append(v)
        ids.append(seen[key])
    if not distinct:
        raise ValueError(f"`{name}` has no constraint at all (every row is None)")
    return distinct, np.asarray(ids, np.int32)
