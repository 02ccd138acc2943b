"""`PushdownConstraint`: the logits processor that runs a `PushdownAutomaton` on the device
(see "On the device" in `functional_gen.structured.pushdown`), and `state_stack`.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, UInt8, UInt32

from ...processors.base import AbstractLogitsProcessor, Context, per_row_field
from .automaton import DEAD, POP, UNREACHABLE, PushdownAutomaton

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
    token_distance: Int[Array, "positions rooms"]
    best_token: Int[Array, "positions rooms"]
    token_cost: Int[Array, "positions slots"]
    byte_tokens: Int[Array, " byte_tokens"]
    constraint_id: Int[Array, "*rows"] = per_row_field()
    candidate_bytes: int = eqx.field(static=True)
    best_bytes: int = eqx.field(static=True)
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
        self.token_distance = jnp.asarray(a.token_distance)
        self.best_token = jnp.asarray(a.best_token)
        self.token_cost = jnp.asarray(a.token_cost)
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
        self.best_bytes = int(a.best_bytes)
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

    def _frames(self, config):
        """The free stack slots of the current frame (a scalar) and of each stack entry's frame
        (`[stack_depth]`), clamped to the columns of `token_distance`."""
        _, _, sp = config[:3]
        last = self.token_distance.shape[1] - 1
        below = self.stack_depth - jnp.arange(self.stack_depth)
        return jnp.minimum(self.stack_depth - sp, last), jnp.minimum(below, last)

    def _stack_need(self, config) -> Int[Array, ""]:
        """`PushdownAutomaton.need` less the current frame's: the stack's frames."""
        _, stack, sp = config[:3]
        on_stack = jnp.arange(self.stack_depth) < sp
        _, rooms = self._frames(config)
        return jnp.where(on_stack, self.token_distance[stack, rooms], 0).sum()

    def _need(self, config) -> Int[Array, ""]:
        """`PushdownAutomaton.need`: the token distances of the position and of the stack."""
        room, _ = self._frames(config)
        return self.token_distance[config[0], room] + self._stack_need(config)

    def _best_tokens(self, config) -> Int[Array, " 2"]:
        """`PushdownAutomaton.best_tokens`: the current frame's best token and that of the
        first frame from the top whose rule cannot end (`vocab` where none)."""
        pos, stack, sp = config[:3]
        room, rooms = self._frames(config)
        waiting = (jnp.arange(self.stack_depth) < sp) & ~self.final[stack]
        j = jnp.max(jnp.where(waiting, jnp.arange(self.stack_depth), -1))
        below = jnp.where(
            j >= 0,
            self.best_token[stack[jnp.maximum(j, 0)], rooms[jnp.maximum(j, 0)]],
            self.token_length.shape[0],
        )
        return jnp.stack([self.best_token[pos, room], below])

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
        allowed = self._allowed(state, context)
        return state, self._apply(allowed, self._can_end(state), logits)

    def _allowed(self, state, context: Context) -> Bool[Array, " vocab"]:
        """The tokens allowed from one configuration (the mask of step 2 and the budget of step
        3), the end-of-generation ids not yet set."""
        pos, _, sp = state[:3]
        vocab = self.token_length.shape[0]
        room = self.stack_depth - sp
        slot = self._slot(state)
        words = self.masks[self.mask_row[pos, slot, jnp.minimum(room, self.mask_row.shape[2] - 1)]]
        iota = jnp.arange(vocab)
        allowed = ((words[iota >> 5] >> (iota & 31).astype(jnp.uint32)) & 1).astype(bool)
        allowed = allowed & self._bitmask_fits(state, context) & self._counter_fits(state)
        budget = self._budget(context)

        def exact(allowed, tokens, num_bytes):
            safe = jnp.minimum(tokens, vocab - 1)
            after = jax.vmap(lambda t: self._token(state, t, num_bytes))(safe)
            ok = (after[0] != DEAD) & (jax.vmap(self._need)(after) <= budget)
            return allowed.at[tokens].set(ok, mode="drop")

        allowed = exact(allowed, self.byte_tokens, 1)
        allowed = exact(allowed, self.candidates[pos, slot], self.candidate_bytes)
        return exact(allowed, self._best_tokens(state), self.best_bytes)

    def _slot(self, state) -> Int[Array, ""]:
        """The slot of one configuration: its position's column for the return position on
        top of its stack (0: the stack is empty)."""
        _, stack, sp = state[:3]
        top = jnp.where(sp > 0, stack[jnp.maximum(sp - 1, 0)], 0)
        return self.slot_of[self.position_rule[state[0]], top]

    def _counter_fits(self, state) -> Bool[Array, "..."]:
        """The bitmask tokens that a counter frame's register keeps (`RegisterPushdownConstraint`:
        `counted <= limit - register`, a `[vocab]` array); here every one (a scalar)."""
        return jnp.ones((), bool)

    def _bitmask_fits(self, state, context: Context) -> Bool[Array, ""]:
        """Whether one configuration's bitmask row holds within the budget (step 3): a token
        may leave at most `remaining - 1` tokens to end the text, within the stack, and the
        row's costliest token does (its tokens can all be finished within the stack: their
        levels say so); otherwise `_allowed` keeps only its exact checks."""
        cost = self.token_cost[state[0], self._slot(state)]
        return self._stack_need(state) + cost <= self._budget(context)

    @staticmethod
    def _budget(context: Context) -> Int[Array, ""]:
        """The most tokens a token may leave to end the text: `remaining - 1`, `remaining` the
        tokens left to generate (this one included)."""
        remaining = context.max_new_tokens - context.num_generated  # this token included
        return jnp.minimum(remaining - 1, UNREACHABLE - 1)

    def _can_end(self, state) -> Bool[Array, ""]:
        """Whether generation may end in the configuration (its position and every return
        position on its stack may end)."""
        pos, stack, sp = state[:3]
        on_stack = jnp.arange(self.stack_depth) < sp
        return self.final[pos] & jnp.all(jnp.where(on_stack, self.final[stack], True))

    def _apply(self, allowed, can_end, logits: Float[Array, " vocab"]) -> Float[Array, " vocab"]:
        """The logits with every token not `allowed` at `-inf` (constrained rows only), the
        end-of-generation ids allowed where `can_end`."""
        allowed = allowed.at[jnp.asarray(self.eos_token_id, jnp.int32)].set(can_end)
        vocab = self.token_length.shape[0]
        width = logits.shape[-1]
        if vocab < width:
            allowed = jnp.pad(allowed, (0, width - vocab))
        allowed = allowed[:width]
        constrained = self.constraint_id >= 0
        return jnp.where(constrained & ~allowed, -jnp.inf, logits).astype(logits.dtype)


def state_stack(state) -> list[int]:
    """The return positions on a row's stack, bottom first (host helper for drawings)."""
    _, stack, sp = state[:3]
    return [int(v) for v in np.asarray(stack)[: int(sp)]]
