"""The logits-processor protocol: immutable configs with pure `init` and `process`.

A processor is an `equinox.Module` (its fields are its configuration, never mutated) with two
pure methods, after Bumblebee's `Bumblebee.LogitsProcessor`:

- `init(context) -> state`: the processor's state before the first generated token;
- `process(state, logits, context) -> (state, logits)`: one step. The state comes first, as the
  carry does in `jax.lax.scan`.

Processors are written for ONE sequence (`logits: Float[Array, " vocab"]`, a `Context` of one
row) and vmapped over the batch by the generation loop, so per-row state gets its leading batch
axis from `vmap`. The states of a processor list form a tuple, one entry per processor; a
stateless processor's state is `()`.

Rules every processor keeps (the generation loop is a `jax.lax.while_loop` and relies on them):

1. `init` returns the final-shape state; `process` never changes its tree structure, shapes or
   dtypes.
2. Large shared arrays (tables, bias vectors) are fields of the processor, not of the state.
3. Float knobs are array fields, so new values do not recompile; only shape-deciding values
   (`top_k`, token-id tuples) are static.
4. No host callbacks: everything is array code that runs under `jit`.

Filtered-out tokens get logit `-inf` (exactly zero probability), as in transformers.
"""

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, Key, PRNGKeyArray, PyTree

State = PyTree
"""A processor's state: any pytree of arrays (`()` for stateless processors)."""


def per_row_field(*, row_ndim: int = 0, **kwargs):
    """Declare a processor field that holds either one value for all rows or one per row.

    A per-row value is an array whose leading axis is the batch; the generation loop vmaps it
    together with the rows, so `process` always sees the row's own value. One compiled batch can
    then mix temperatures, `top_p` values, penalties, ... (`eqx.field` keyword arguments pass
    through.)

    `row_ndim` is the number of dimensions of ONE row's value: 0 for scalar knobs, 1 for a
    token-id list (e.g. a negative prompt); a value with more dimensions is one per row.
    """
    metadata = dict(kwargs.pop("metadata", {}) or {}, per_row=True, row_ndim=row_ndim)
    return eqx.field(metadata=metadata, **kwargs)


def split_rows(processors: Sequence["AbstractLogitsProcessor"], batch_size: int):
    """Partition processors into their per-row values and everything else.

    **Returns:** `(rows, shared)` for `eqx.combine(rows_of_one_row, shared)`: `rows` keeps the
    per-row fields (see `per_row_field`) that hold one value per row, `shared` the rest.

    **Raises:** `ValueError` when a per-row value's leading axis is not `batch_size`.
    """
    specs = []
    for p in processors:
        spec = jax.tree.map(lambda _: False, p)
        for f in dataclasses.fields(p):
            value = getattr(p, f.name, None)
            row_ndim = f.metadata.get("row_ndim", 0)
            if not f.metadata.get("per_row") or getattr(value, "ndim", 0) <= row_ndim:
                continue
            if value.shape[0] != batch_size:
                raise ValueError(
                    f"{type(p).__name__}.{f.name} has {value.shape[0]} per-row values for a batch "
                    f"of {batch_size} rows; pass a scalar or one value per row"
                )
            spec = eqx.tree_at(lambda m, name=f.name: getattr(m, name), spec, True)
        specs.append(spec)
    return eqx.partition(tuple(processors), tuple(specs))


def vmap_rows(fn, processors: Sequence["AbstractLogitsProcessor"], batch_size: int):
    """`jax.vmap` of `fn(processors, *row_args)` over rows, with per-row processor values
    vmapped and the rest shared. Returns `f(*batched_args)`."""
    rows, shared = split_rows(processors, batch_size)

    def one_row(row_values, *args):
        return fn(eqx.combine(row_values, shared), *args)

    return lambda *args: jax.vmap(one_row)(rows, *args)


class Context(eqx.Module):
    """What a processor sees of ONE sequence at one step.

    **Attributes:**

    - `token_ids`: `Int[Array, " max_len"]`, the prompt followed by the tokens generated so far;
      only the first `length` entries are valid (no padding inside, padding after).
    - `length`: `Int[Array, ""]`, number of valid tokens, prompt included.
    - `prompt_length`: `Int[Array, ""]`, number of prompt tokens.
    - `max_new_tokens`: `Int[Array, ""]`, how many tokens this row may generate in all (so the
      last allowed step is the one where `num_generated == max_new_tokens - 1`).
    - `key`: a PRNG key for this row and this step (independent of the batch mates); processors
      that draw more than one random number should split or `fold_in` it.
    """

    # `*batch`: the generation loop builds the contexts of all rows at once and vmaps over them,
    # so a Context holds either one row (what processors see) or a leading batch axis.
    token_ids: Int[Array, "*batch max_len"]
    length: Int[Array, "*batch"]
    prompt_length: Int[Array, "*batch"]
    max_new_tokens: Int[Array, "*batch"]
    key: Key[Array, "*batch"]

    @property
    def num_generated(self) -> Int[Array, ""]:
        """Tokens generated so far (`length - prompt_length`)."""
        return self.length - self.prompt_length

    @property
    def valid_mask(self) -> Bool[Array, " max_len"]:
        """`True` at the valid positions `[0, length)` of `token_ids`."""
        return jnp.arange(self.token_ids.shape[0]) < self.length

    @property
    def generated_mask(self) -> Bool[Array, " max_len"]:
        """`True` at the generated positions `[prompt_length, length)` of `token_ids`."""
        i = jnp.arange(self.token_ids.shape[0])
        return (i >= self.prompt_length) & (i < self.length)

    @property
    def last_token_id(self) -> Int[Array, ""]:
        """The last valid token (the one sampled at the previous step, or the prompt's last)."""
        return self.token_ids[jnp.maximum(self.length - 1, 0)]


class AbstractLogitsProcessor(eqx.Module):
    """Base class of every logits processor (Equinox's abstract/final pattern).

    Subclasses implement `init` and `process`; see the module docstring for the rules.
    """

    @abc.abstractmethod
    def init(self, context: Context) -> State:
        """The state before the first step, for one sequence (its `context.token_ids` hold the prompt).

        **Returns:** a pytree of arrays with its final shapes (`()` when stateless).
        """

    @abc.abstractmethod
    def process(
        self, state: State, logits: Float[Array, " vocab"], context: Context
    ) -> tuple[State, Float[Array, " vocab"]]:
        """One step for one sequence.

        **Arguments:** `state` (from `init` or the previous `process`); `logits`: the next-token
        logits so far (after the processors before this one); `context`: the sequence.

        **Returns:** `(state, logits)`, the state with unchanged structure, shapes and dtypes.
        """


class AbstractGrowingStateProcessor(AbstractLogitsProcessor):
    """A processor whose state is sized by the text's capacity (`Context.token_ids`' columns),
    e.g. classifier-free guidance's cache: it implements `extend_state` as well.

    States of other processors do not depend on that length; `extend_state` (the function)
    returns them as they are.
    """

    @abc.abstractmethod
    def extend_state(self, state: State, max_len: int) -> State:
        """One row's state when a continued generation's `Context.token_ids` grows to `max_len`
        columns (a `SequenceState` continued with the same processors)."""


def extend_state(processor: AbstractLogitsProcessor, state: State, max_len: int) -> State:
    """One row's state of `processor` for a text capacity of `max_len` columns: grown by an
    `AbstractGrowingStateProcessor`, as it is for every other processor."""
    if isinstance(processor, AbstractGrowingStateProcessor):
        return processor.extend_state(state, max_len)
    return state


class AbstractStatelessLogitsProcessor(AbstractLogitsProcessor):
    """A processor without state: implement `__call__(logits, context) -> logits`.

    `init` returns `()` and `process(state, logits, context)` returns `(state, self(logits, context))`.
    """

    def init(self, context: Context) -> tuple[()]:
        return ()

    def process(
        self, state: tuple[()], logits: Float[Array, " vocab"], context: Context
    ) -> tuple[tuple[()], Float[Array, " vocab"]]:
        return state, self(logits, context)

    @abc.abstractmethod
    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        """The processed logits of one sequence."""


class Stateless(AbstractStatelessLogitsProcessor):
    """Wrap a plain function `fn(logits, context) -> logits` as a processor (state `()`).

    Bumblebee's `StatelessLogitsProcessor`, Optax's `stateless`. Bare callables in a processor
    list are wrapped automatically.

    `fn` is a static field: pass the same function object each time (not a fresh `lambda`), or
    every call of `generate` compiles again.

    **Attributes:** `fn`: the function, written for one sequence (`logits: Float[Array, " vocab"]`).
    """

    fn: Callable[[Float[Array, " vocab"], Context], Float[Array, " vocab"]] = eqx.field(static=True)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        return self.fn(logits, context)


def as_processors(processors: Sequence[Any] | None) -> tuple[AbstractLogitsProcessor, ...]:
    """Normalise a processor list: a tuple of processors, bare callables wrapped in `Stateless`.

    **Raises:** `TypeError` for an entry that is neither a processor nor callable.
    """
    if processors is None:
        return ()
    if isinstance(processors, AbstractLogitsProcessor) or callable(processors):
        processors = [processors]
    out = []
    for p in processors:
        if isinstance(p, AbstractLogitsProcessor):
            out.append(p)
        elif callable(p):
            out.append(Stateless(p))
        else:
            raise TypeError(
                f"a processor must be an AbstractLogitsProcessor or a callable "
                f"fn(logits, context) -> logits, got {type(p).__name__}: {p!r}"
            )
    return tuple(out)


def init_states(
    processors: Sequence[AbstractLogitsProcessor], context: Context
) -> tuple[State, ...]:
    """The tuple of initial states, one per processor, for one sequence."""
    return tuple(p.init(context) for p in processors)


def process_all(
    processors: Sequence[AbstractLogitsProcessor],
    states: tuple[State, ...],
    logits: Float[Array, " vocab"],
    context: Context,
) -> tuple[tuple[State, ...], Float[Array, " vocab"]]:
    """Run the processors in order on one sequence, threading each one's state.

    **Returns:** `(states, logits)`.

    **Raises:** `ValueError` if the number of states differs from the number of processors.
    """
    if len(states) != len(processors):
        raise ValueError(
            f"got {len(states)} processor states for {len(processors)} processors; "
            "build the states with init_states(processors, context) first"
        )
    new_states = []
    for p, s in zip(processors, states):
        s, logits = p.process(s, logits, context)
        new_states.append(s)
    return tuple(new_states), logits


def apply(
    processors: Sequence[Any],
    logits: Float[ArrayLike, "batch vocab"],
    token_ids: Int[ArrayLike, "batch seq"],
    *,
    prompt_length: int | Int[ArrayLike, " batch"] | None = None,
    max_new_tokens: int | None = None,
    key: PRNGKeyArray | None = None,
) -> Float[Array, "batch vocab"]:
    """Apply processors once, outside generation (for teaching and tests).

    Each processor is initialised on the row's context and then processes the logits once.

    **Arguments:**

    - `processors`: processors or plain functions `fn(logits, context) -> logits`.
    - `logits`: `Float[Array, "batch vocab"]`, next-token logits.
    - `token_ids`: `Int[Array, "batch seq"]`, each row's tokens so far (prompt + generated), all
      valid (no padding).
    - `prompt_length`: how many of `token_ids` are prompt (an int or one per row); defaults to
      `seq` (nothing generated yet).
    - `max_new_tokens`: the generation budget the processors see (`Context.max_new_tokens`);
      defaults to unlimited (2**31 - 1).
    - `key`: PRNG key (keyword-only) for processors that sample; row `i` gets `fold_in(key, i)`.
      Defaults to `jax.random.key(0)`.

    **Returns:** the processed logits, `Float[Array, "batch vocab"]`.

    **Raises:** `ValueError` when `logits` and `token_ids` disagree on the batch size or are not
    2-D; `TypeError` for an entry that is not a processor.
    """
    processors = as_processors(processors)
    logits = jnp.asarray(logits)
    token_ids = jnp.asarray(token_ids, jnp.int32)
    if logits.ndim != 2 or token_ids.ndim != 2 or logits.shape[0] != token_ids.shape[0]:
        raise ValueError(
            f"expected logits [batch, vocab] and token_ids [batch, seq] with the same batch; "
            f"got {logits.shape} and {token_ids.shape}"
        )
    batch, seq = token_ids.shape
    if prompt_length is None:
        prompt_length = seq
    prompt_length = jnp.broadcast_to(jnp.asarray(prompt_length, jnp.int32), (batch,))
    if np.any(np.asarray(prompt_length) > seq) or np.any(np.asarray(prompt_length) < 0):
        raise ValueError(f"prompt_length must be in [0, {seq}], got {np.asarray(prompt_length)}")
    if key is None:
        key = jax.random.key(0)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch))
    budget = 2**31 - 1 if max_new_tokens is None else max_new_tokens
    contexts = Context(
        token_ids=token_ids,
        length=jnp.full((batch,), seq, jnp.int32),
        prompt_length=prompt_length,
        max_new_tokens=jnp.full((batch,), budget, jnp.int32),
        key=keys,
    )

    return _apply_once(processors, logits, contexts)


def _init_and_process(processors, logits, context):
    states = init_states(processors, context)
    return process_all(processors, states, logits, context)[1]


@eqx.filter_jit
def _apply_once(processors, logits, contexts):
    # One compiled program per shape and static configuration (op-by-op dispatch of a vmapped
    # chain is slow); float knobs stay arguments, so new values do not recompile.
    return vmap_rows(_init_and_process, processors, logits.shape[0])(logits, contexts)
