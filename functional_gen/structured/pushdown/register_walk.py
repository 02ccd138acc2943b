"""The device walk of a pushdown automaton with member-set registers (issue 55): `RegisterWalk`,
the byte and token steps of `PushdownConstraint` with a register per stack frame.

Not used by any processor yet (the masks, candidates and budget of a register grammar are
still to come): this is the layer that the host walk (`PushdownAutomaton.step` with a
configuration `(position, stack, register, registers)`) checks, byte for byte.

A configuration on the device is `(position, stack, stack_pointer, register, registers)`:
`Int[Array, ""]`, `Int[Array, " stack_depth"]`, `Int[Array, ""]`, `UInt32[Array, ""]` and
`UInt32[Array, " stack_depth"]` (the saved register of each stack entry's frame, beside its
return position). Per byte: the returns (`POP`) restore the popped frame's register; the pushes
save the current register beside the first return position pushed (0 beside the others) and
start the innermost callee at 0; then the byte's register actions (`reg_clear`, `reg_set`,
`reg_require` per position and byte class) apply to the frame that reads it, and a set bit
already set or a required bit not set kills the configuration (position `DEAD`).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int, Integer, UInt8, UInt32

from .automaton import DEAD, POP, PushdownAutomaton


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
        not allowed, the stack would overflow or the register refuses it."""
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
        repeated = (register & bit) != 0
        register = register | bit
        need = self.reg_require[pos, c]
        missing = (register & need) != need
        alive = alive & ~repeated & ~missing
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
