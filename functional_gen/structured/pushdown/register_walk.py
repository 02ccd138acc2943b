"""The device walk of a pushdown automaton with member-set registers (issue 55): `RegisterWalk`,
the byte and token steps of `PushdownConstraint` with a register per stack frame, and
`RegisterPushdownConstraint`, the processor that masks with them.

The host walk (`PushdownAutomaton.step` with a configuration `(position, stack, register,
registers)`, and `PushdownAutomaton.allowed`, `need`) is its reference, byte for byte and mask
for mask; the budget's tables are `pushdown.register_budget`'s.

A configuration on the device is `(position, stack, stack_pointer, register, registers)`:
`Int[Array, ""]`, `Int[Array, " stack_depth"]`, `Int[Array, ""]`, `UInt32[Array, ""]` and
`UInt32[Array, " stack_depth"]` (the saved register of each stack entry's frame, beside its
return position). Per byte: the returns (`POP`) restore the popped frame's register; the pushes
save the current register beside the first return position pushed (0 beside the others) and
start the innermost callee at 0; then the byte's register actions (`reg_clear`, `reg_set`,
`reg_require` per position and byte class) apply to the frame that reads it, and a required
bit not set kills the configuration (position `DEAD`).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int, Integer, UInt8, UInt32

from ...processors.base import Context
from .automaton import DEAD, POP, UNREACHABLE, PushdownAutomaton
from .constraint import PushdownConstraint
from .register_budget import REGISTER_BUDGET_TABLES


class RegisterWalk(eqx.Module):
    """The tables of a `PushdownAutomaton` that the byte and token steps with registers read
    (see the module docstring), as device arrays.

    **Arguments:** `automaton`: a `PushdownAutomaton`; one without a register walks as
    `PushdownConstraint` does (its register stays 0).
    """

    byte_class: Int[Array, " 256"]
    next: Int[Array, "positions classes"]
    push: Int[Array, "positions classes pushes"]
    reg_clear: Bool[Array, "positions classes"]
    reg_set: Int[Array, "positions classes"]
    reg_require: UInt32[Array, "positions classes"]
    reg_limit: UInt32[Array, "positions classes"]
    token_bytes: UInt8[Array, "vocab max_bytes"]
    token_length: Int[Array, " vocab"]
    initial: Int[Array, ""]
    stack_depth: int = eqx.field(static=True)

    def __init__(self, automaton: PushdownAutomaton):
        a = automaton
        shape = a.next.shape
        has = a.has_register
        self.byte_class = jnp.asarray(a.byte_class, jnp.int32)
        self.next = jnp.asarray(a.next)
        self.push = jnp.asarray(a.push)
        self.reg_clear = jnp.asarray(a.reg_clear if has else jnp.zeros(shape, bool))
        self.reg_set = jnp.asarray(a.reg_set if has else jnp.zeros(shape, jnp.int32), jnp.int32)
        self.reg_require = jnp.asarray(
            a.reg_require if has else jnp.zeros(shape, jnp.uint32), jnp.uint32
        )
        limit = a.reg_limit if has and a.reg_limit.size else np.zeros(shape, np.uint32)
        self.reg_limit = jnp.asarray(limit, jnp.uint32)
        self.token_bytes = jnp.asarray(a.token_bytes)
        self.token_length = jnp.asarray(a.token_length)
        self.initial = jnp.asarray(a.initial, jnp.int32)
        self.stack_depth = int(a.stack_depth)

    def init(self):
        """The configuration before any byte: `(initial, zeros, 0, 0, zeros)`."""
        depth = self.stack_depth
        return (
            self.initial,
            jnp.zeros(depth, jnp.int32),
            jnp.zeros((), jnp.int32),
            jnp.zeros((), jnp.uint32),
            jnp.zeros(depth, jnp.uint32),
        )

    def byte(self, config, byte: Integer[Array, ""]):
        """One byte from `config` (see the module docstring); position `DEAD` when the byte is
        not allowed, the stack would overflow or the register refuses it (a `}` before every
        required member)."""
        pos, stack, sp, register, registers = config
        c = self.byte_class[byte]

        def pops(s):
            p, n, _ = s
            return (self.next[p, c] == POP) & (n > 0)

        def pop(s):
            _, n, _ = s
            return stack[n - 1], n - 1, registers[n - 1]

        pos, sp, register = jax.lax.while_loop(pops, pop, (pos, sp, register))
        target = self.next[pos, c]
        alive = target > 0
        pushes = alive & (self.push[pos, c, 0] > 0)
        for i in range(self.push.shape[-1]):
            value = self.push[pos, c, i]
            do = alive & (value > 0)
            overflow = do & (sp >= self.stack_depth)
            write = do & ~overflow
            at = jnp.minimum(sp, self.stack_depth - 1)
            stack = jnp.where(write, stack.at[at].set(value), stack)
            saved = register if i == 0 else jnp.zeros((), jnp.uint32)
            registers = jnp.where(write, registers.at[at].set(saved), registers)
            sp = sp + write.astype(jnp.int32)
            alive = alive & ~overflow
        register = jnp.where(pushes | self.reg_clear[pos, c], jnp.uint32(0), register)
        member = self.reg_set[pos, c]
        bit = jnp.where(
            member > 0,
            jnp.left_shift(jnp.uint32(1), jnp.maximum(member - 1, 0).astype(jnp.uint32)),
            jnp.uint32(0),
        )
        register = register | bit
        need = self.reg_require[pos, c]
        missing = (register & need) != need
        alive = alive & ~missing
        limit = self.reg_limit[pos, c]  # a counter frame: the byte starts a character
        register = register + (limit > 0).astype(jnp.uint32)
        alive = alive & ~((limit > 0) & (register > limit))
        return jnp.where(alive, target, DEAD).astype(jnp.int32), stack, sp, register, registers

    def token(self, config, token_id: Integer[Array, ""]):
        """The configuration after all bytes of `token_id` (a `while_loop` over its length that
        stops at `DEAD`)."""
        length = self.token_length[token_id]
        row = self.token_bytes[token_id]

        def cond(s):
            j, config = s
            return (j < length) & (config[0] != DEAD)

        return jax.lax.while_loop(
            cond, lambda s: (s[0] + 1, self.byte(s[1], row[s[0]])), (0, config)
        )[1]


class RegisterPushdownConstraint(PushdownConstraint):
    """`PushdownConstraint` for a `PushdownAutomaton` with a register (`has_register`): the
    state per row is `RegisterWalk`'s configuration, `(position, stack, stack_pointer,
    register, registers)`, the bytes walked by `RegisterWalk.byte`, and the mask is
    `PushdownConstraint`'s (register-blind bitmask row, exact one-byte, candidate and best
    tokens) with the `register_tokens` in `register_reach` of the position walked exactly with
    the register, as `PushdownAutomaton.allowed` does. The budget's `need` follows each frame's
    register (`PushdownAutomaton.frame_need`, `pushdown.register_budget`), and so does the
    bitmask row's gate (`PushdownAutomaton.frame_cost`).

    **Arguments:** as `PushdownConstraint`.

    **Raises:** `ValueError` for an automaton without a register (or a bad `constraint_id`).
    """

    walk: RegisterWalk
    register_tokens: Int[Array, " register_tokens"]
    register_reach: UInt32[Array, "positions register_words"]
    register_index: Int[Array, " positions"]
    register_object: Int[Array, " register_rows"]
    register_required: UInt32[Array, " objects"]
    register_distance: Int[Array, "register_rows rooms"]
    value_distance: Int[Array, "register_rows rooms"]
    member_distance: Int[Array, "register_rows bits rooms"]
    member_cost: Int[Array, "objects bits rooms"]
    close_cost: Int[Array, "objects rooms"]
    room_token_cost: Int[Array, "positions slots cost_rooms"]
    register_cost: Int[Array, "positions slots cost_rooms"]
    counter_row: Int[Array, " positions"]
    counter_limit: Int[Array, " counter_rows"]
    counted: Int[Array, "counter_rows counter_vocab"]
    register_bytes: int = eqx.field(static=True)

    def __init__(self, automaton: PushdownAutomaton, constraint_id=0):
        if not automaton.has_register:
            raise ValueError("RegisterPushdownConstraint: the automaton has no register")
        super().__init__(automaton, constraint_id)
        self.walk = RegisterWalk(automaton)
        self.register_tokens = jnp.asarray(automaton.register_tokens, jnp.int32)
        self.register_reach = jnp.asarray(automaton.register_reach)
        self.register_bytes = int(automaton.register_bytes)
        a = automaton
        names = REGISTER_BUDGET_TABLES + ("room_token_cost", "register_cost")
        if a.counts_registers:
            tables = tuple(getattr(a, name) for name in names)
        else:  # no required member anywhere: every frame reads `token_distance`
            rooms = a.token_distance.shape[1]
            tables = (
                np.full(a.num_positions, -1, np.int32),
                np.zeros(1, np.int32),
                np.zeros(1, np.uint32),
                np.zeros((1, rooms), np.int32),
                np.zeros((1, rooms), np.int32),
                np.zeros((1, 1, rooms), np.int32),
                np.zeros((1, 1, rooms), np.int32),
                np.zeros((1, rooms), np.int32),
                a.token_cost[:, :, None],
                np.zeros_like(a.token_cost)[:, :, None],
            )
        for name, table in zip(names, tables, strict=True):
            setattr(self, name, jnp.asarray(table))
        if a.counter_row.size:
            counter = (a.counter_row, a.counter_limit, a.counted)
        else:  # no counter frame: placeholders (`counted` broadcasts over the vocabulary)
            counter = (np.full(a.num_positions, -1, np.int32), np.zeros(1, np.int32))
            counter += (np.zeros((1, 1), np.int16),)
        for name, table in zip(("counter_row", "counter_limit", "counted"), counter):
            setattr(self, name, jnp.asarray(table))

    def _counter_fits(self, state) -> Bool[Array, "..."]:
        """In a counter frame, the bitmask tokens whose characters (`counted`) fit in what its
        limit leaves (`counter_limit - register`), as `PushdownAutomaton.allowed`; elsewhere
        every one."""
        row = self.counter_row[state[0]]
        safe = jnp.maximum(row, 0)
        left = self.counter_limit[safe] - state[3].astype(jnp.int32)
        return (row < 0) | (self.counted[safe].astype(jnp.int32) <= left)

    def _missing(self, pos, register):
        """The required members of `pos`'s register frame not in `register` (0 outside the
        register frames and after an object's `}`); any shape."""
        row = jnp.maximum(self.register_index[pos], 0)
        required = self.register_required[self.register_object[row]]
        inside = (self.register_index[pos] >= 0) & ~self.final[pos]
        return jnp.where(inside, required & ~register, jnp.uint32(0))

    def _frame_need(self, pos, room, register):
        """`PushdownAutomaton.frame_need` for scalars or arrays of one shape."""
        row = jnp.maximum(self.register_index[pos], 0)
        obj = self.register_object[row]
        missing = self._missing(pos, register)
        lanes = jnp.arange(self.member_cost.shape[1], dtype=jnp.uint32)
        bit = ((missing[..., None] >> lanes) & 1).astype(jnp.int32)
        costs = self.member_cost[obj, :, room]  # [..., bits]: the advanced indices first
        members = self.member_distance[row, :, room]
        through = jnp.min(members - bit * costs, axis=-1)
        rest = jnp.minimum(self.value_distance[row, room], through)
        total = (bit * costs).sum(axis=-1) + self.close_cost[obj, room] + rest
        inside = jnp.where(
            missing == 0, self.register_distance[row, room], jnp.minimum(total, UNREACHABLE)
        )
        return jnp.where(self.register_index[pos] >= 0, inside, self.token_distance[pos, room])

    def _stack_need(self, config) -> Int[Array, ""]:
        """`PushdownAutomaton.need` less the current frame's: the stack's frames, each with
        its saved register."""
        _, stack, sp, _, registers = config
        on_stack = jnp.arange(self.stack_depth) < sp
        _, rooms = self._frames(config)
        return jnp.where(on_stack, self._frame_need(stack, rooms, registers), 0).sum()

    def _need(self, config) -> Int[Array, ""]:
        """`PushdownAutomaton.need`: the frame needs of the position and of the stack."""
        room, _ = self._frames(config)
        return self._frame_need(config[0], room, config[3]) + self._stack_need(config)

    def _bitmask_fits(self, state, context: Context) -> Bool[Array, ""]:
        """`PushdownConstraint._bitmask_fits` with the register frame's gate
        (`PushdownAutomaton.frame_cost`)."""
        pos, register = state[0], state[3]
        slot = self._slot(state)
        room, _ = self._frames(state)
        missing = self._missing(pos, register)
        obj = self.register_object[jnp.maximum(self.register_index[pos], 0)]
        lanes = jnp.arange(self.member_cost.shape[1], dtype=jnp.uint32)
        bit = ((missing >> lanes) & 1).astype(jnp.int32)
        members = (bit * self.member_cost[obj, :, room]).sum()
        free = jnp.minimum(self.stack_depth - state[2], self.register_cost.shape[2] - 1)
        gated = members + self.close_cost[obj, room] + self.register_cost[pos, slot, free]
        cost = jnp.where(missing == 0, self.room_token_cost[pos, slot, free], gated)
        return self._stack_need(state) + cost <= self._budget(context)

    def init(self, context: Context):
        """`RegisterWalk.init()`: the initial position, empty stacks, register 0."""
        return self.walk.init()

    def _byte(self, config, byte):
        """`RegisterWalk.byte`."""
        return self.walk.byte(config, byte)

    def _allowed(self, state, context: Context) -> Bool[Array, " vocab"]:
        """`PushdownConstraint._allowed`, then the register tokens that may meet a register
        action from the position walked exactly (within the budget, as the others)."""
        allowed = super()._allowed(state, context)
        vocab = self.token_length.shape[0]
        iota = jnp.arange(self.register_tokens.shape[0])
        words = self.register_reach[state[0]]
        reached = ((words[iota >> 5] >> (iota & 31).astype(jnp.uint32)) & 1) > 0
        tokens = jnp.where(reached, self.register_tokens, vocab)
        safe = jnp.minimum(tokens, vocab - 1)
        after = jax.vmap(lambda t: self._token(state, t, self.register_bytes))(safe)
        ok = (after[0] != DEAD) & (jax.vmap(self._need)(after) <= self._budget(context))
        return allowed.at[tokens].set(ok, mode="drop")
