"""Per-slot constraint tables of the `Engine`: a table pool of one fixed shape in the decode state.

A constrained request (a regex, a choice, a JSON Schema compiled as a token automaton) decodes in
its slot beside the others, without pausing them and without compiling anything new:

- the decode state holds a `ConstraintPool`: for every slot, the tables of ONE token automaton
  (`structured.automaton`), padded to `[states, classes]` (`Engine(constraint_states=...,
  constraint_classes=...)`), its `[vocab]` token-class map, and whether the slot is constrained;
- the automaton of a new request is compiled off the device loop (the HTTP app builds it in a
  worker thread) and padded to the pool's shape on the host (`pool_entry`): padded states are
  dead (`distance` infinite, every transition to the dead state 0) and padded classes lead
  nowhere, so the padding changes no mask;
- `Engine.place` writes the entry into the slot's row of the pool (jitted, donating), and the
  step's first processor, `SlotConstraint`, masks each row with its own tables
  (`structured.processor.automaton_step`, the code `fg.generate`'s constraints run), so a
  constrained row computes exactly what `generate` with that constraint computes.

The pool's shape is the one bucket: the step compiles once, whatever the schema. A table larger
than the pool (more states or classes), and a constraint compiled as a pushdown automaton (a
grammar, a JSON Schema with free-form values such as `{"type": "object"}` or recursion), does
not fit: `pool_entry` returns `None` and the orchestrator runs that request alone
(`Engine.generate_alone`), as before.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..processors.base import AbstractLogitsProcessor, Context, per_row_field
from ..structured.automaton import INFINITE_DISTANCE, INITIAL
from ..structured.processor import AbstractConstraint, automaton_step

DEFAULT_POOL_STATES = 512
"""States per slot in the table pool (`Engine(constraint_states=...)`). A date regex takes 12, a
yes/no choice 6, a closed JSON Schema of a few typed properties a few hundred."""

DEFAULT_POOL_CLASSES = 256
"""Token classes per slot in the table pool (`Engine(constraint_classes=...)`)."""


class PoolEntry(eqx.Module):
    """One constraint's tables padded to the pool's shape (host arrays, built by `pool_entry`).

    **Attributes:** `token_class: Int[np.ndarray, " vocab"]`, `transitions: Int[np.ndarray,
    "states classes"]`, `distance: Int[np.ndarray, " states"]` (see `TokenAutomaton`)."""

    token_class: Int[np.ndarray, " vocab"]
    transitions: Int[np.ndarray, "states classes"]
    distance: Int[np.ndarray, " states"]


class ConstraintPool(eqx.Module):
    """The constraint tables of every slot (leading axis: the slots, `batch`).

    **Attributes:** `token_class: Int[Array, "batch vocab"]`, `transitions: Int[Array, "batch
    states classes"]`, `distance: Int[Array, "batch states"]`, `constrained: Bool[Array,
    " batch"]` (an unconstrained slot's tables are not read)."""

    token_class: Int[Array, "batch vocab"]
    transitions: Int[Array, "batch states classes"]
    distance: Int[Array, "batch states"]
    constrained: Bool[Array, " batch"]

    @classmethod
    def empty(cls, slots: int, vocab: int, states: int, classes: int) -> "ConstraintPool":
        """A pool of `slots` unconstrained entries of shape `[states, classes]`."""
        return cls(
            token_class=jnp.zeros((slots, vocab), jnp.int32),
            transitions=jnp.zeros((slots, states, classes), jnp.int32),
            distance=jnp.full((slots, states), INFINITE_DISTANCE, jnp.int32),
            constrained=jnp.zeros((slots,), bool),
        )


def pool_entry(constraint, vocab: int, states: int, classes: int) -> PoolEntry | None:
    """The tables of `constraint` (a `structured` processor holding ONE constraint) padded to
    `[states, classes]` with a token-class map of `vocab` tokens, or `None` when it does not fit
    the pool: a pushdown automaton, or more live states or classes than the pool holds.

    **Raises:** `ValueError` for a processor holding several constraints; `TypeError` for one
    that is not a constraint."""
    if not isinstance(constraint, AbstractConstraint):
        raise TypeError(f"expected a constraint processor, got {type(constraint).__name__}")
    if constraint.pushdown is not None:
        return None
    if constraint.num_constraints != 1 or np.ndim(constraint.constraint_id) != 0:
        raise ValueError(f"{type(constraint).__name__} holds several constraints; give one")
    token_class = np.asarray(constraint.token_class)[0]
    distance = np.asarray(constraint.distance)
    num_states = int(np.flatnonzero(distance < INFINITE_DISTANCE).max()) + 1  # live states first
    num_classes = int(token_class.max()) + 1
    transitions = np.asarray(constraint.transitions)[:num_states, :num_classes]
    # tokens beyond the tables' vocabulary (logits wider than the tokenizer) are never allowed:
    # give them a class of their own with no transition
    never = num_classes
    if num_states > states or never + 1 > classes:
        return None
    table = np.zeros((states, classes), np.int32)
    table[:num_states, :num_classes] = transitions
    dist = np.full((states,), INFINITE_DISTANCE, np.int32)
    dist[:num_states] = distance[:num_states]
    cls = np.full((vocab,), never, np.int32)
    n = min(vocab, token_class.shape[0])
    cls[:n] = token_class[:n]
    return PoolEntry(token_class=cls, transitions=table, distance=dist)


class SlotConstraint(AbstractLogitsProcessor):
    """Each slot's constraint from the `ConstraintPool`: the row's automaton advances on its
    previous token and masks the logits (`automaton_step`); an unconstrained row passes through.

    **Attributes:** the fields of `ConstraintPool`, one entry per row; `any_constrained:
    Bool[Array, ""]`, shared by all rows, or `None` (true): whether some busy row is constrained.
    When none is, the step skips the tables (a `lax.cond` for the whole batch): the gathers of
    every row's `[vocab]` classes and masks cost ~3% of a SmolLM2 decode step at 8 slots. An
    unconstrained row's automaton state is then not advanced; it is never read (`Engine.insert`
    resets it, `Engine.place` constrains only a freshly inserted slot). The state is the row's
    automaton state, `Int[Array, ""]` (`INITIAL` after `init` and after `Engine.insert`).

    Source: the same mask as `fg.processors.Regex` / `JsonSchema` / `Choice` (`structured`).
    """

    token_class: Int[Array, "*rows vocab"] = per_row_field(row_ndim=1)
    transitions: Int[Array, "*rows states classes"] = per_row_field(row_ndim=2)
    distance: Int[Array, "*rows states"] = per_row_field(row_ndim=1)
    constrained: Bool[Array, "*rows"] = per_row_field()
    any_constrained: Bool[Array, ""] | None = None

    def init(self, context: Context) -> Int[Array, ""]:
        """The initial automaton state."""
        return jnp.asarray(INITIAL, jnp.int32)

    def process(
        self, state: Int[Array, ""], logits: Float[Array, " vocab"], context: Context
    ) -> tuple[Int[Array, ""], Float[Array, " vocab"]]:
        """`automaton_step` with the row's tables, or (`any_constrained` false) the state and
        logits as they are. **Returns:** `(state, logits)`."""

        def step(state, logits):
            return automaton_step(
                self.token_class,
                self.transitions,
                self.distance,
                self.constrained,
                state,
                logits,
                context,
            )

        if self.any_constrained is None:
            return step(state, logits)
        return jax.lax.cond(self.any_constrained, step, lambda *x: x, state, logits)
