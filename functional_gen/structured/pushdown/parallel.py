"""`ParallelPushdownConstraint`: a pushdown automaton with forks, run with a fixed number of
parallel stacks per row.

A grammar in which a byte can be read in several ways that a one-byte lookahead cannot tell
apart (llama.cpp's `c.gbnf`: after `return `, the byte `(` opens a call's argument list or a
parenthesised expression; after an `if` block, `e` begins `else` or the next statement's
identifier) is built with `build_pushdown(forks=True)`: such a (position, byte class) gets the
action `FORK - f` and its ways (`fork_next[f]`, `fork_push[f]`: read the byte with these
pushes, or return and read it below). Every table walk treats a fork as a rejection, so the
bitmask rows, candidates and budget distances are those of the deterministic automaton that
never forks, exact for every token that cannot reach a fork; the tokens that may
(`fork_tokens`, found by a walk over sets of positions) are checked exactly on the device, at
each step only those that may reach a fork from the positions the row is at (`fork_reach`:
per position, a bitset over `fork_tokens`, from the same walk started at that position alone;
for llama.cpp's `c.gbnf` on SmolLM2, 3 of 152 positions reach a fork, with 873, 95 and 24 of
its 968 fork tokens).

**On the device, per row:** `num_stacks` configurations `(position[K], stack[K, depth],
stack_pointer[K])`, a configuration alive where its position is not 0 (as llama.cpp's sampler
keeps one stack per way of reading the text so far).

1. advance: each byte of the previous token steps every configuration along every way (a way
   that returns then reads the byte in the frame below, in its one way there: a second fork
   there ends it); identical configurations are merged, and past `num_stacks`
   the first ones in order are kept; after the token, the configurations are sorted by their
   `need` (the fewest tokens to end, `pushdown.budget`), so the one with the least need is
   kept first;
2. mask: the union over the alive configurations of the deterministic mask (bitmask row,
   candidates, best tokens, within the budget), then the fork tokens in `fork_reach` of an
   alive configuration's position (every fork token where the budget cuts a configuration's
   bitmask row) set by walking them from all configurations with step 1 (allowed when a
   configuration after it has `need <= r - 1`), `FORK_CHUNK` at a time in a `while_loop`
   whose trip count is their number, then the end-of-generation ids where some configuration
   may end. A fork token outside `fork_reach` of every alive position reads in one way from
   each configuration, so the deterministic mask is its walk's answer: the mask is the one of
   walking every fork token every step (`every_fork_token=True`, the tests' reference), at
   the cost of those that matter (none at most positions).

Sound: a token is allowed only when step 1 keeps a configuration after it that can end within
the budget and the stack (for a token that cannot fork, the configuration it came from gives
at most one successor, so nothing is dropped; for a fork token the check is step 1 itself), so
a row never reaches a dead end and every text that ends with EOS is in the language. What is
lost past `num_stacks` is completeness: a reading dropped at a merge cannot be taken later.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int, UInt32

from ...processors.base import Context
from .automaton import DEAD, DEFAULT_NUM_STACKS, FORK, POP, UNREACHABLE, PushdownAutomaton
from .constraint import PushdownConstraint

FORK_CHUNK = 32
"""Fork tokens walked together by `ParallelPushdownConstraint` (one `while_loop` iteration
per this many of those that may reach a fork from the row's positions)."""


class ParallelPushdownConstraint(PushdownConstraint):
    """A `PushdownConstraint` for an automaton with forks (`PushdownAutomaton.num_forks > 0`):
    `num_stacks` configurations per row (see the module docstring).

    Per row the state is `(position, stack, stack_pointer)`: `Int[Array, " num_stacks"]`,
    `Int[Array, "num_stacks stack_depth"]`, `Int[Array, " num_stacks"]` (position 0: the
    configuration is not in use).

    **Arguments:** `automaton`: a `PushdownAutomaton` (with or without forks); `constraint_id`
    as `PushdownConstraint`; `num_stacks`: configurations per row (default
    `DEFAULT_NUM_STACKS` = 4); `every_fork_token`: walk every fork token over every stack at
    every step instead of those in `fork_reach` of the row's positions (the same masks, many
    times slower on `c.gbnf`: the reference of the tests and the benchmark's baseline).

    **Raises:** `ValueError` for `num_stacks` below 1 or a non-bool `every_fork_token` (and as
    `PushdownConstraint`).
    """

    fork_next: Int[Array, "forks ways"]
    fork_push: Int[Array, "forks ways pushes"]
    fork_tokens: Int[Array, " fork_tokens"]
    fork_reach: UInt32[Array, "positions fork_words"]
    fork_bytes: int = eqx.field(static=True)
    num_stacks: int = eqx.field(static=True)
    every_fork_token: bool = eqx.field(static=True)

    def __init__(
        self,
        automaton: PushdownAutomaton,
        constraint_id=0,
        num_stacks: int = DEFAULT_NUM_STACKS,
        every_fork_token: bool = False,
    ):
        if isinstance(num_stacks, bool) or not isinstance(num_stacks, int) or num_stacks < 1:
            raise ValueError(f"`num_stacks` must be an integer >= 1, got {num_stacks!r}")
        if not isinstance(every_fork_token, bool):
            raise ValueError(f"`every_fork_token` must be a bool, got {every_fork_token!r}")
        super().__init__(automaton, constraint_id)
        a = automaton
        ways = max(a.fork_next.shape[1], 1)
        width = max(a.fork_push.shape[2], a.push.shape[2])
        fork_next = jnp.zeros((max(a.num_forks, 1), ways), jnp.int32)
        fork_push = jnp.zeros((max(a.num_forks, 1), ways, width), jnp.int32)
        self.fork_next = fork_next.at[: a.num_forks].set(a.fork_next)
        self.fork_push = fork_push.at[: a.num_forks, :, : a.fork_push.shape[2]].set(a.fork_push)
        self.fork_tokens = jnp.asarray(a.fork_tokens, jnp.int32)
        words = max(-(-a.fork_tokens.size // 32), 1)
        reach = np.zeros((a.num_positions, words), np.uint32)
        reach[: a.fork_reach.shape[0], : a.fork_reach.shape[1]] = a.fork_reach
        self.fork_reach = jnp.asarray(reach)
        self.fork_bytes = max(int(a.fork_bytes), 1)
        self.num_stacks = num_stacks
        self.every_fork_token = every_fork_token

    def init(self, context: Context):
        """The initial position in the first configuration, the others unused."""
        k = self.num_stacks
        pos = jnp.zeros(k, jnp.int32).at[0].set(self.initial)
        return pos, jnp.zeros((k, self.stack_depth), jnp.int32), jnp.zeros(k, jnp.int32)

    # ------------------------------------------------------------------ one configuration

    def _ways(self, config, pending, c):
        """Every way of reading class `c` from one configuration: `(pos, stack, sp, pending)`
        with a leading axis of ways. A configuration that is not pending is way 0 unchanged;
        a pending one returns while its position says `POP`, then takes every way of its
        action (a way that returns stays pending: it reads the byte in the frame below)."""
        pos, stack, sp = config
        num_ways = self.fork_next.shape[1]
        width = self.fork_push.shape[2]

        def pops(s):
            p, n = s
            return (self.next[p, c] == POP) & (n > 0)

        p, n = jax.lax.while_loop(pops, lambda s: (stack[s[1] - 1], s[1] - 1), (pos, sp))
        action = self.next[p, c]
        fork = action <= FORK
        f = jnp.clip(FORK - action, 0, self.fork_next.shape[0] - 1)
        plain_push = jnp.zeros(width, jnp.int32).at[: self.push.shape[-1]].set(self.push[p, c])
        targets = jnp.where(
            fork, self.fork_next[f], jnp.zeros(num_ways, jnp.int32).at[0].set(action)
        )
        pushes = jnp.where(
            fork, self.fork_push[f], jnp.zeros_like(self.fork_push[0]).at[0].set(plain_push)
        )

        def way(target, pushed):
            returns = (target == POP) & (n > 0)
            new_stack, new_sp, alive = stack, n, target > 0
            for i in range(width):
                value = pushed[i]
                do = alive & (value > 0)
                overflow = do & (new_sp >= self.stack_depth)
                at = jnp.minimum(new_sp, self.stack_depth - 1)
                new_stack = jnp.where(do & ~overflow, new_stack.at[at].set(value), new_stack)
                new_sp = new_sp + (do & ~overflow).astype(jnp.int32)
                alive = alive & ~overflow
            below = stack[jnp.maximum(n - 1, 0)]
            out_pos = jnp.where(alive, target, jnp.where(returns, below, DEAD))
            out_sp = jnp.where(returns, n - 1, new_sp)
            return out_pos.astype(jnp.int32), new_stack, out_sp, returns

        stepped = jax.vmap(way)(targets, pushes)
        keep = (jnp.arange(num_ways) == 0) & (pos != DEAD)
        unchanged = (
            jnp.where(keep, pos, DEAD),
            jnp.broadcast_to(stack, (num_ways, self.stack_depth)),
            jnp.broadcast_to(sp, (num_ways,)),
            jnp.zeros(num_ways, bool),
        )
        live = pending & (pos != DEAD)
        return jax.tree.map(lambda new, old: jnp.where(live, new, old), stepped, unchanged)

    # ------------------------------------------------------------------ sets of them

    def _compact(self, configs, pending, key=None):
        """`num_stacks` of the configurations (leading axis): identical ones merged, the dead
        last, then in the order of `key` (default: their order)."""
        pos, stack, sp = configs
        n = pos.shape[0]
        alive = pos != DEAD
        masked = jnp.where(jnp.arange(self.stack_depth)[None, :] < sp[:, None], stack, 0)
        same = (
            (pos[:, None] == pos[None, :])
            & (sp[:, None] == sp[None, :])
            & (pending[:, None] == pending[None, :])
            & jnp.all(masked[:, None, :] == masked[None, :, :], axis=-1)
        )
        earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]
        alive = alive & ~jnp.any(same & earlier & alive[None, :], axis=1)
        score = jnp.where(alive, 0 if key is None else key, UNREACHABLE * 64)
        order = jnp.argsort(score, stable=True)[: self.num_stacks]
        pos = jnp.where(alive, pos, DEAD)[order]
        return (pos, masked[order], sp[order]), pending[order] & (pos != DEAD)

    def _set_byte(self, configs, byte):
        """Every configuration after one byte, `num_stacks` kept: every way of each
        configuration (`_ways`), then the ways that returned read the byte in the frame below
        in the one way that `PushdownConstraint._byte` knows (a fork there ends them)."""
        c = self.byte_class[byte]
        pending = configs[0] != DEAD
        pos, stack, sp, pending = jax.vmap(lambda cfg, p: self._ways(cfg, p, c))(configs, pending)
        flat = (pos.reshape(-1), stack.reshape(-1, self.stack_depth), sp.reshape(-1))
        configs, pending = self._compact(flat, pending.reshape(-1))
        below = jax.vmap(lambda cfg: self._byte(cfg, byte))(configs)
        configs = jax.tree.map(
            lambda new, old: jnp.where(pending.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
            below,
            configs,
        )
        return self._compact(configs, jnp.zeros(self.num_stacks, bool))[0]

    def _set_token(self, configs, token_id, num_bytes: int | None = None):
        """The configurations after all bytes of `token_id` (a `while_loop` over its length, or
        a fixed loop of `num_bytes`), sorted by their `need` (least first)."""
        length = self.token_length[token_id]
        row = self.token_bytes[token_id]
        if num_bytes is None:

            def cond(s):
                j, configs = s
                return (j < length) & jnp.any(configs[0] != DEAD)

            configs = jax.lax.while_loop(
                cond, lambda s: (s[0] + 1, self._set_byte(s[1], row[s[0]])), (0, configs)
            )[1]
        else:

            def body(j, configs):
                stepped = self._set_byte(configs, row[j])
                return jax.tree.map(lambda n, o: jnp.where(j < length, n, o), stepped, configs)

            configs = jax.lax.fori_loop(0, num_bytes, body, configs)
        need = jax.vmap(self._need)(configs)
        configs, _ = self._compact(configs, jnp.zeros(self.num_stacks, bool), need)
        return configs

    def process(self, state, logits: Float[Array, " vocab"], context: Context):
        """Advance every configuration on the previous token, then mask (see the module
        docstring).

        **Returns:** `(state, logits)` with the state's shapes unchanged.
        """
        vocab = self.token_length.shape[0]
        advanced = self._set_token(state, jnp.minimum(context.last_token_id, vocab - 1))
        state = jax.tree.map(
            lambda new, old: jnp.where(context.num_generated > 0, new, old), advanced, state
        )
        alive = state[0] != DEAD
        each = jax.vmap(lambda cfg: self._allowed(cfg, context))(state)
        allowed = jnp.any(each & alive[:, None], axis=0)
        if self.every_fork_token:
            allowed = allowed.at[self.fork_tokens].set(
                jax.vmap(lambda t: self._fork_allowed(state, t, context, self.fork_bytes))(
                    self.fork_tokens
                ),
                mode="drop",
            )
        else:
            allowed = self._reached_forks_allowed(state, allowed, context)
        can_end = jnp.any(alive & jax.vmap(self._can_end)(state))
        return state, self._apply(allowed, can_end, logits)

    def _fork_allowed(self, state, t, context: Context, num_bytes=None) -> Bool[Array, ""]:
        """Whether a configuration after token `t` (`_set_token`, over `num_bytes` or the
        token's length) can end within the budget."""
        vocab = self.token_length.shape[0]
        after = self._set_token(state, jnp.minimum(t, vocab - 1), num_bytes)
        need = jax.vmap(self._need)(after)
        return jnp.any((after[0] != DEAD) & (need <= self._budget(context)))

    def _reached_forks_allowed(
        self, state, allowed: Bool[Array, " vocab"], context: Context
    ) -> Bool[Array, " vocab"]:
        """`allowed` (the union of the configurations' deterministic masks) with the fork
        tokens that may reach a fork from an alive configuration's position (`fork_reach`)
        set by walking them from every configuration (`_fork_allowed`), `FORK_CHUNK` at a time
        in a `while_loop` whose trip count is their number: a row at positions that reach no
        fork walks none. Where the budget cuts an alive configuration's bitmask row, every fork
        token is walked (the deterministic mask then holds only its exact checks). Every other
        fork token reads its bytes in one way from each configuration, so the deterministic
        mask is already its walk's answer: the result equals walking every fork token
        (`every_fork_token=True`)."""
        num = self.fork_tokens.shape[0]
        alive = state[0] != DEAD
        iota = jnp.arange(num)
        words = self.fork_reach[state[0]][:, iota >> 5]  # [num_stacks, fork_tokens]
        bits = ((words >> (iota & 31).astype(jnp.uint32)) & 1).astype(bool)
        reached = jnp.any(bits & alive[:, None], 0)
        cut = jnp.any(alive & ~jax.vmap(lambda c: self._bitmask_fits(c, context))(state))
        check = (reached | cut) & (self.fork_tokens < self.token_length.shape[0])
        chunk = min(FORK_CHUNK, num)
        width = -(-num // chunk) * chunk
        order = jnp.nonzero(check, size=width, fill_value=num)[0]
        tokens = jnp.append(self.fork_tokens, self.token_length.shape[0])[order]
        count = jnp.sum(check)

        def body(s):
            i, allowed = s
            some = jax.lax.dynamic_slice(tokens, (i * chunk,), (chunk,))
            ok = jax.vmap(lambda t: self._fork_allowed(state, t, context))(some)
            return i + 1, allowed.at[some].set(ok, mode="drop")

        return jax.lax.while_loop(lambda s: s[0] * chunk < count, body, (0, allowed))[1]


def state_configurations(state) -> list[tuple[int, list[int]]]:
    """The alive configurations of a row's `ParallelPushdownConstraint` state: `(position,
    stack bottom first)` each (host helper for tests and drawings)."""
    pos, stack, sp = (np.asarray(x) for x in state)
    return [
        (int(p), [int(v) for v in stack[k, : int(sp[k])]]) for k, p in enumerate(pos) if p != DEAD
    ]
