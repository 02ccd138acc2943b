"""The pushdown automaton as data: `PushdownAutomaton` (the host tables, with a host-side
reference walk), its constants (`DEAD`, `POP`, `BOTTOM`, `MAX_LEVELS`, `UNREACHABLE`,
`DEFAULT_STACK_DEPTH`) and `NotDeterministic`. See `functional_gen.structured.pushdown` for the
construction.
"""

import dataclasses
import typing

import numpy as np
from jaxtyping import Bool, Int, UInt8, UInt32

from ..automaton import ConstraintError
from ..grammar_syntax import GrammarError

DEAD = 0
"""The dead position: nothing is read there."""
POP = -1
"""`next` entry: the current rule ends here; return and retry the byte."""
FORK = -2
"""`next` entries `FORK - f` (`f >= 0`): the byte can be read in several ways, listed in
`fork_next[f]` / `fork_push[f]` (grammars built with `forks=True`, run with parallel stacks by
`pushdown.parallel`; every deterministic walk treats them as a rejection)."""
DEFAULT_NUM_STACKS = 4
"""Default number of parallel stacks per row for a grammar with forks (`Grammar(num_stacks=)`)."""
DEFAULT_STACK_DEPTH = 32
"""Default number of stack slots (return positions) per row."""
MAX_LEVELS = 8
"""Tokens that push more than `MAX_LEVELS - 1` return positions are candidates, not bitmask
entries."""
UNREACHABLE = 1 << 20
"""`distance` of positions from which no end of the rule is reachable (small enough that a
stack's worth of them sums without overflow in int32)."""
BOTTOM = -1
"""A return site meaning: the rule may be the bottom frame (a return from it fails)."""
MAX_CANDIDATE_TABLE = 1 << 28
"""Most bytes of the `candidates` table (int32 per position, slot and candidate: 256 MiB),
checked before it is allocated (`TooManyCandidates`). MaskBench Github_hard o57110 needed
4,726 x 96 x 49,152 (83 GiB: a byte class with 48,786 stack-dependent tokens) and died with a
`MemoryError`; not measured further."""


class TooManyCandidates(ConstraintError):
    """A pushdown automaton whose stack-dependent tokens (candidates) would fill a table over
    `MAX_CANDIDATE_TABLE` bytes: refused before the table is allocated.

    **Attributes:** `positions`, `slots`, `width` (candidates per (position, slot), padded),
    `most` (the largest number of candidates of one (position, slot)), `limit` (bytes).
    """

    def __init__(self, positions: int, slots: int, width: int, most: int, limit: int):
        self.positions, self.slots, self.width = positions, slots, width
        self.most, self.limit = most, limit
        size = positions * slots * width * 4
        super().__init__(
            f"the pushdown automaton's candidate table would be {positions:,} positions x "
            f"{slots:,} slots x {width:,} candidates ({size / 2**20:,.0f} MiB; the limit is "
            f"{limit / 2**20:,.0f} MiB): {most:,} tokens depend on the stack at one position"
        )


class NotDeterministic(GrammarError):
    """The grammar cannot run as a deterministic pushdown automaton (the message says why)."""


@dataclasses.dataclass(frozen=True, eq=False)
class PushdownAutomaton:
    """The host tables of a grammar's pushdown automaton (see the module docstring).

    **Attributes:**

    - `byte_class`: `Int[np.ndarray, " 256"]`, the class of each byte.
    - `next`: `Int[np.ndarray, "positions classes"]`, the action per position and byte class:
      `> 0` the next position, `POP` (-1) return, `DEAD` (0) reject.
    - `push`: `Int[np.ndarray, "positions classes pushes"]`, return positions pushed (in order,
      0-padded) before moving to `next`.
    - `final`: `Bool[np.ndarray, " positions"]`, where the current rule may end.
    - `initial`: the start position.
    - `mask_row`: `Int[np.ndarray, "positions levels"]`, the row of `masks` per position and
      free stack slots (clamped to `levels - 1`).
    - `masks`: `UInt32[np.ndarray, "rows words"]`, packed bitmasks (token `t` is bit `t % 32` of
      word `t // 32`) of the context-independent tokens.
    - `candidates`: `Int[np.ndarray, "positions candidates"]`, the stack-dependent tokens,
      padded with `vocab_size`.
    - `token_bytes`: `UInt8[np.ndarray, "vocab max_bytes"]`, `token_length`:
      `Int[np.ndarray, " vocab"]`, each token's bytes (length 0: never text).
    - `candidate_bytes`: the longest candidate, in bytes.
    - `stack_depth`, `eos_token_id`, `description`.
    - `position_rule`: `Int[np.ndarray, " positions"]` and `rule_names`: which rule each
      position belongs to (for messages and drawings).
    - `distance`: `Int[np.ndarray, " positions"]`, the fewest single-byte tokens from each
      position to one where its rule may end (`UNREACHABLE` if none; the stack depth ignored).
    - `token_distance`: `Int[np.ndarray, "positions rooms"]`, the fewest tokens that finish
      each position's rule with `room` free stack slots (column `min(room, rooms - 1)`;
      `UNREACHABLE`: none fits), and `best_token` (same shape) the first token of such a
      completion (`vocab_size`: none, or the rule may end); `best_bytes` the longest best token.
      See `functional_gen.structured.pushdown.budget`; `need` sums them over a configuration.
    - `token_cost`: `Int[np.ndarray, "positions slots"]`, per (position, slot) the largest
      `need` a bitmask token leaves above the stack (at any room): the bitmask row holds within
      the budget when the stack's `need` plus this fits in it.
    - `byte_tokens`: `Int[np.ndarray, " byte_tokens"]`, the one-byte tokens (padded with
      `vocab_size`), checked exactly near the end of the budget.
    - `fork_next`: `Int[np.ndarray, "forks ways"]` and `fork_push`: `Int[np.ndarray, "forks ways
      pushes"]`: the ways of reading the byte at each fork (`next` entry `FORK - f`), as `next`
      and `push` give the one way elsewhere (target 0: no further way); `fork_tokens`:
      `Int[np.ndarray, " fork_tokens"]`, the tokens holding a byte of a class that forks
      somewhere (padded with `vocab_size`; checked exactly on the device, over every stack), and
      `fork_bytes` the longest of them; `fork_reach`: `UInt32[np.ndarray, "positions
      fork_words"]`, per position the fork tokens that may reach a fork from it (over any
      stack), packed (bit `j % 32` of word `j // 32`: `fork_tokens[j]`), so that the device
      walks over every stack only those of the positions it is at. Empty for a deterministic
      grammar (`num_forks == 0`).
    - `reg_clear`: `Bool[np.ndarray, "positions classes"]`, `reg_set`: `Int[np.ndarray,
      "positions classes"]`, `reg_require`: `UInt32[np.ndarray, "positions classes"]`: the
      member-set register actions of each byte read (`json_schema.register_objects`; clear the
      register, set bit `reg_set - 1`, require every bit of `reg_require`), applied to the
      frame that reads the byte. Empty (`0 x 0`) without a register (`has_register`). The
      host walk (`step` with a configuration `(position, stack, register, registers)`) and the
      device (`pushdown.register_walk`) follow them; the bitmask rows ignore them (a superset).
    - `reg_limit`: `Int[np.ndarray, "positions classes"]`, the character counter of a counter
      frame (`json_schema.counter_strings`, WIP): `N > 0` on a byte that starts a character of
      a string of at most `N`; it adds 1 to the frame's register and is refused past `N`.
      Empty (`0 x 0`) where the automaton was built without it; `pushdown.register_walk`
      follows it on the device.
    - `counter_row`: `Int[np.ndarray, " positions"]`, the row of each position of a counter
      rule (-1 elsewhere; empty without one), `counter_limit`: `Int[np.ndarray, " rows"]`, its
      rule's limit, `counted`: `Int16[np.ndarray, "rows vocab"]`, the characters each token
      writes from the position before it leaves the string: `allowed` keeps a bitmask token in
      a counter frame only where `counted <= counter_limit - register`.
    - `register_tokens`: `Int[np.ndarray, " register_tokens"]`, the tokens whose walk may meet
      the action that can refuse (a require) and be alive after their last byte
      (padded with `vocab_size`), `register_bytes` the longest of them, and `register_reach`:
      `UInt32[np.ndarray, "positions register_words"]`, per position those that may from it
      (packed as `fork_reach`): `allowed` walks them exactly with the register. Empty without a
      register.
    - the register budget (`pushdown.register_budget`; empty without a rule that has required
      members, `counts_registers`): `register_index` (`[positions]`, each position's row among
      the register frames' positions, -1 none), `register_object` (`[rows]`, its object),
      `register_required` (`[objects]`, the required bits), `register_distance` (`Z`: the
      tokens that end the frame once every required member is written), `value_distance`
      (`A`: to a complete member value without writing one), `member_distance` (`D`, `[rows,
      bits, rooms]`: the same through writing required member `j`), `member_cost` (`c`,
      `[objects, bits, rooms]`), `close_cost` (`E`, `[objects, rooms]`), all per room as
      `token_distance` (whose register rows hold the bound whatever the register), and per
      (position, slot, free slots `min(room, cost_rooms - 1)`) the gates of the bitmask row:
      `room_token_cost` (`token_cost` per room, register frames with nothing missing) and
      `register_cost` (a register frame with members missing, to which the gate adds their
      `member_cost` and `close_cost`). Per room because the rows' levels are register-blind: a
      token may be in a row at a room where what it enters cannot end, which must not close
      the row at the rooms where it can.
    """

    byte_class: Int[np.ndarray, " 256"]
    next: Int[np.ndarray, "positions classes"]
    push: Int[np.ndarray, "positions classes pushes"]
    final: Bool[np.ndarray, " positions"]
    initial: int
    mask_row: Int[np.ndarray, "positions slots levels"]
    slot_of: Int[np.ndarray, "rules positions"]
    masks: UInt32[np.ndarray, "rows words"]
    candidates: Int[np.ndarray, "positions slots candidates"]
    token_bytes: UInt8[np.ndarray, "vocab max_bytes"]
    token_length: Int[np.ndarray, " vocab"]
    candidate_bytes: int
    stack_depth: int
    eos_token_id: tuple[int, ...]
    position_rule: Int[np.ndarray, " positions"]
    rule_names: tuple[str, ...]
    distance: Int[np.ndarray, " positions"]
    token_distance: Int[np.ndarray, "positions rooms"]
    best_token: Int[np.ndarray, "positions rooms"]
    best_bytes: int
    token_cost: Int[np.ndarray, "positions slots"]
    byte_tokens: Int[np.ndarray, " byte_tokens"]
    description: str = ""
    fork_next: Int[np.ndarray, "forks ways"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 1), np.int32)
    )
    fork_push: Int[np.ndarray, "forks ways pushes"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 1, 1), np.int32)
    )
    fork_tokens: Int[np.ndarray, " fork_tokens"] = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int32)
    )
    fork_bytes: int = 0
    fork_reach: UInt32[np.ndarray, "positions fork_words"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 0), np.uint32)
    )
    reg_clear: Bool[np.ndarray, "register_positions register_classes"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 0), bool)
    )
    reg_set: Int[np.ndarray, "register_positions register_classes"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 0), np.int32)
    )
    reg_require: UInt32[np.ndarray, "register_positions register_classes"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 0), np.uint32)
    )
    reg_limit: Int[np.ndarray, "register_positions register_classes"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 0), np.int32)
    )
    counter_row: Int[np.ndarray, " counter_positions"] = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int32)
    )
    counter_limit: Int[np.ndarray, " counter_rows"] = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int32)
    )
    counted: Int[np.ndarray, "counter_rows counter_vocab"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 0), np.int16)
    )

    register_tokens: Int[np.ndarray, " register_tokens"] = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int32)
    )
    register_bytes: int = 0
    register_reach: UInt32[np.ndarray, "register_positions register_words"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 0), np.uint32)
    )
    register_index: Int[np.ndarray, " register_positions"] = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int32)
    )
    register_object: Int[np.ndarray, " register_rows"] = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.int32)
    )
    register_required: UInt32[np.ndarray, " objects"] = dataclasses.field(
        default_factory=lambda: np.zeros(0, np.uint32)
    )
    register_distance: Int[np.ndarray, "register_rows register_rooms"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 1), np.int32)
    )
    value_distance: Int[np.ndarray, "register_rows register_rooms"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 1), np.int32)
    )
    member_distance: Int[np.ndarray, "register_rows bits register_rooms"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 1, 1), np.int32)
    )
    member_cost: Int[np.ndarray, "objects bits register_rooms"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 1, 1), np.int32)
    )
    close_cost: Int[np.ndarray, "objects register_rooms"] = dataclasses.field(
        default_factory=lambda: np.zeros((0, 1), np.int32)
    )
    room_token_cost: Int[np.ndarray, "register_positions register_slots cost_rooms"] = (
        dataclasses.field(default_factory=lambda: np.zeros((0, 0, 1), np.int32))
    )
    register_cost: Int[np.ndarray, "register_positions register_slots cost_rooms"] = (
        dataclasses.field(default_factory=lambda: np.zeros((0, 0, 1), np.int32))
    )

    @property
    def has_register(self) -> bool:
        """Whether some byte acts on the member-set register (`reg_set`, `reg_require`)."""
        return self.reg_set.size > 0

    @property
    def counts_registers(self) -> bool:
        """Whether some frame's budget depends on its register (a rule with required members:
        the `register_budget` tables are filled)."""
        return self.register_index.size > 0

    @property
    def num_forks(self) -> int:
        """Bytes (position, class) that can be read in several ways (0: deterministic)."""
        return self.fork_next.shape[0]

    @property
    def num_positions(self) -> int:
        """Positions, the dead position 0 included."""
        return self.next.shape[0]

    @property
    def vocab_size(self) -> int:
        """Token ids covered."""
        return self.token_length.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the device tables."""
        return sum(
            a.nbytes
            for a in (
                self.next,
                self.push,
                self.final,
                self.mask_row,
                self.slot_of,
                self.masks,
                self.candidates,
                self.token_bytes,
                self.token_length,
                self.token_distance,
                self.best_token,
                self.token_cost,
                self.byte_tokens,
                self.fork_next,
                self.fork_push,
                self.fork_tokens,
                self.fork_reach,
                self.reg_clear,
                self.reg_set,
                self.reg_require,
                self.reg_limit,
                self.counter_row,
                self.counter_limit,
                self.counted,
                self.register_tokens,
                self.register_reach,
                self.register_index,
                self.register_object,
                self.register_required,
                self.register_distance,
                self.value_distance,
                self.member_distance,
                self.member_cost,
                self.close_cost,
                self.room_token_cost,
                self.register_cost,
            )
        )

    # ------------------------------------------------------------------ host reference
    # (`step`, `steps` and `_ways` run once per byte, the private helpers of `walk`, `need`,
    # `can_end` and `allowed` once per token or frame: `@typing.no_type_check`, as the per-byte
    # helpers of `functional_gen.structured`; the public methods keep jaxtyping's checks of
    # their arguments and results, once per call. A 145 kB walk spent most of its time in
    # jaxtyping's wrapper of `step`; tests/structured/test_register_schemas.py (MaskBench's rule,
    # `maskbench.refused_at`, on wide objects) took 113 s of CPU alone with the helpers checked,
    # 83 s without: six million wrapped calls, and a function nested in `allowed` (wrapped anew,
    # ~2.6 ms, at every call). Checked properties (`vocab_size`, `counts_registers`) are not
    # read in these loops either.)

    @typing.no_type_check
    def step(self, config, byte: int):
        """One byte from `config = (position, stack)` (stack a tuple, top last): the next
        configuration, or `None` when the byte is not allowed (or the stack overflows).

        With a register (`has_register`), `config = (position, stack, register, registers)`:
        the current frame's register (an int) and the saved register of each frame on the
        stack (a tuple beside `stack`). A return restores the frame's register; a push saves
        the current one and the frames it starts run from 0 (those between the caller and the
        innermost callee too); then the byte's register actions apply to the frame that reads
        it (set a bit; refuse the byte when a required bit is not set)."""
        pos, stack = config[:2]
        registers = config[2:]  # () without a register, else (register, saved registers)
        c = self.byte_class[byte]
        while self.next[pos, c] == POP and stack:
            pos, stack = stack[-1], stack[:-1]
            if registers:
                registers = (registers[1][-1], registers[1][:-1])
        target = int(self.next[pos, c])
        if target <= 0:
            return None
        pushed = tuple(int(p) for p in self.push[pos, c] if p)
        if len(stack) + len(pushed) > self.stack_depth:
            return None
        if not registers:
            return target, stack + pushed
        register, saved = registers
        if pushed:
            saved = saved + (register,) + (0,) * (len(pushed) - 1)
            register = 0
        if self.reg_clear[pos, c]:
            register = 0
        member = int(self.reg_set[pos, c])
        if member:
            register |= 1 << (member - 1)
        need = int(self.reg_require[pos, c])
        if register & need != need:
            return None
        if self.reg_limit.size:
            limit = int(self.reg_limit[pos, c])
            if limit:  # a counter frame: the byte starts a character
                register += 1
                if register > limit:
                    return None
        return target, stack + pushed, register, saved

    def initial_config(self):
        """The configuration before any byte: `(initial, ())`, with a register `(initial, (),
        0, ())` (see `step`)."""
        return (self.initial, (), 0, ()) if self.has_register else (self.initial, ())

    @typing.no_type_check
    def steps(self, config, byte: int) -> list:
        """Every configuration after one byte from `config` (several at a fork; none when the
        byte is not allowed or every way overflows the stack)."""
        pos, stack = config
        c = self.byte_class[byte]
        while self.next[pos, c] == POP and stack:
            pos, stack = stack[-1], stack[:-1]
        target = int(self.next[pos, c])
        if target > 0:
            ways = [(target, self.push[pos, c])]
        elif target <= FORK:
            f = FORK - target
            ways = [(int(t), p) for t, p in zip(self.fork_next[f], self.fork_push[f]) if t > 0]
            if POP in self.fork_next[f] and stack:  # return, then read the byte below
                return self._ways(ways, stack) + self.steps((stack[-1], stack[:-1]), byte)
        else:
            return []
        return self._ways(ways, stack)

    @typing.no_type_check
    def _ways(self, ways, stack) -> list:
        """The configurations `(target, stack + pushed)` of `ways` that fit in the stack."""
        out = []
        for target, pushes in ways:
            pushed = tuple(int(p) for p in pushes if p)
            if len(stack) + len(pushed) <= self.stack_depth:
                out.append((target, stack + pushed))
        return out

    def walk_all(self, data: bytes, configs=None) -> list:
        """Every configuration after `data` (from the initial one), following every way at a
        fork (no bound on their number: the host reference of parallel stacks)."""
        configs = [(self.initial, ())] if configs is None else configs
        for b in data:
            configs = list(dict.fromkeys(n for c in configs for n in self.steps(c, b)))
        return configs

    def walk(self, data: bytes, config=None):
        """The configuration after `data` (from the initial one, `initial_config`), or `None`."""
        return self._walk(data, self.initial_config() if config is None else config)

    @typing.no_type_check
    def _walk(self, data, config):
        """`walk` from `config`."""
        for b in data:
            config = self.step(config, b)
            if config is None:
                return None
        return config

    def can_end(self, config) -> bool:
        """Whether generation may end in `config` (the position and every return position final)."""
        return self._can_end(config)

    @typing.no_type_check
    def _can_end(self, config) -> bool:
        """`can_end`."""
        pos, stack = config[:2]
        return bool(self.final[pos]) and all(self.final[p] for p in stack)

    def accepts(self, data: bytes) -> bool:
        """Whether the automaton accepts `data` as a whole text."""
        config = self._walk(data, self.initial_config())
        return config is not None and self._can_end(config)

    @typing.no_type_check
    def _frames(self, config):
        """`(position, room)` of the current frame and of each frame on the stack, top first."""
        pos, stack = config[:2]
        rooms = self.token_distance.shape[1] - 1
        frames = [(pos, self.stack_depth - len(stack))]
        frames += [(p, self.stack_depth - j) for j, p in reversed(list(enumerate(stack)))]
        return [(int(p), min(r, rooms)) for p, r in frames]

    @typing.no_type_check
    def _registers(self, config) -> list[int]:
        """The register of each frame of `_frames(config)` (top first; zeros without one)."""
        if len(config) < 4:
            return [0] * (1 + len(config[1]))
        return [int(config[2]), *(int(r) for r in reversed(config[3]))]

    def frames(self, config) -> list[tuple[int, int, int]]:
        """`(position, room, register)` of the current frame and of each frame on the stack
        (its return position), top first: `room` the free stack slots it runs with (a column
        of `token_distance`), `register` its member-set register (0 without one)."""
        return [(p, r, g) for (p, r), g in zip(self._frames(config), self._registers(config))]

    @typing.no_type_check
    def _missing(self, pos: int, register: int) -> int:
        """The required members of `pos`'s register frame not in `register` (0 where the
        frame's rest does not depend on it: no register frame, or after its `}`)."""
        if not self.register_index.size or self.register_index[pos] < 0 or self.final[pos]:
            return 0
        row = self.register_index[pos]
        return int(self.register_required[self.register_object[row]]) & ~register

    @typing.no_type_check
    def frame_need(self, pos: int, room: int, register: int = 0) -> int:
        """The tokens that end the frame at `pos` with `room` free slots (a column of
        `token_distance`) and its `register`: `token_distance` outside the register frames,
        `register_budget`'s `F(pos, missing)` in them."""
        missing = self._missing(pos, register)
        if not self.register_index.size or self.register_index[pos] < 0:
            return int(self.token_distance[pos, room])
        row = int(self.register_index[pos])
        if not missing:
            return int(self.register_distance[row, room])
        obj = int(self.register_object[row])
        bits = [(missing >> j) & 1 for j in range(self.member_cost.shape[1])]
        costs = [int(c) for c in self.member_cost[obj, :, room]]
        through = min(
            (int(d) - b * c for d, b, c in zip(self.member_distance[row, :, room], bits, costs)),
            default=UNREACHABLE,
        )
        rest = min(int(self.value_distance[row, room]), through)
        total = sum(b * c for b, c in zip(bits, costs)) + int(self.close_cost[obj, room]) + rest
        return min(total, UNREACHABLE)

    def need(self, config) -> int:
        """An upper bound on the tokens that end the text from `config` within the stack depth:
        `frame_need` of the position and of each return position on the stack, each at the
        free slots it runs with and with its register (`UNREACHABLE` or more: none fits; see
        `pushdown.budget` and `pushdown.register_budget`)."""
        return self._need(config)

    @typing.no_type_check
    def _need(self, config) -> int:
        """`need`."""
        frames = self._frames(config)
        registers = self._registers(config)
        return sum(self.frame_need(p, r, g) for (p, r), g in zip(frames, registers))

    @typing.no_type_check
    def frame_cost(self, config, slot: int) -> int:
        """The most tokens a bitmask token of `config`'s row may leave to end the current frame
        and those it enters (`token_cost`; in a register frame with required members missing,
        the missing members' `member_cost`, `close_cost` and `register_cost`): the bitmask row
        is used whole when the stack's frames' `frame_need` (all but the current frame's) plus
        this fits in the tokens left after the next, as `allowed` and the device do.

        **Arguments:** `config` as `walk` returns it (with or without a register); `slot` the
        row's slot (`slot_of[position_rule[position], top return position or 0]`).

        **Returns:** tokens (`UNREACHABLE` or more: the row is never used whole)."""
        pos = config[0]
        if not self.register_index.size:  # `counts_registers` (a checked property: per token)
            return int(self.token_cost[pos, slot])
        free = min(self.stack_depth - len(config[1]), self.register_cost.shape[2] - 1)
        missing = self._missing(pos, self._registers(config)[0])
        if not missing:
            return int(self.room_token_cost[pos, slot, free])
        room = self._frames(config)[0][1]
        obj = int(self.register_object[self.register_index[pos]])
        members = sum(
            int(c) for j, c in enumerate(self.member_cost[obj, :, room]) if missing >> j & 1
        )
        return members + int(self.close_cost[obj, room]) + int(self.register_cost[pos, slot, free])

    def best_tokens(self, config) -> list[int]:
        """The tokens that the device checks exactly because they may be the only ones that keep
        `need` within the budget: the best token of the current frame and of the first frame
        from the top whose rule cannot end yet (`vocab_size` where none)."""
        return self._best_tokens(config)

    @typing.no_type_check
    def _best_tokens(self, config) -> list[int]:
        """`best_tokens`."""
        frames = self._frames(config)
        below = [f for f in frames[1:] if not self.final[f[0]]]
        tokens = [int(self.best_token[frames[0]])]
        tokens.append(int(self.best_token[below[0]]) if below else self.token_length.shape[0])
        return tokens

    def allowed(self, config, remaining: int | None = None) -> Bool[np.ndarray, " vocab"]:
        """The tokens the device allows in `config` with `remaining` tokens left to generate
        (this one included; `None`: no budget, only the stack depth), computed from the tables
        as the device does (bitmask row + one-byte, candidate and best tokens walked exactly),
        EOS included. With a register (`config` of four, see `step`), also the
        `register_tokens` in `register_reach` of the position walked exactly with it, and the
        budget's `need` follows the registers (`frame_need`)."""
        pos, stack = config[:2]
        budget = UNREACHABLE - 1 if remaining is None else min(remaining - 1, UNREACHABLE - 1)
        room = self.stack_depth - len(stack)
        slot = self.slot_of[self.position_rule[pos], stack[-1] if stack else 0]
        row = self.masks[self.mask_row[pos, slot, min(room, self.mask_row.shape[2] - 1)]]
        vocab = self.vocab_size
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab].astype(bool)
        top, top_room = self._frames(config)[0]
        below = self._need(config) - self.frame_need(top, top_room, self._registers(config)[0])
        if below + self.frame_cost(config, slot) > budget:
            bits[:] = False  # near the end of the budget: exact checks only
        if self.counter_row.size and self.counter_row[pos] >= 0:  # a counter frame
            counter = self.counter_row[pos]
            bits &= self.counted[counter] <= int(self.counter_limit[counter]) - int(config[2])
        tokens = (*self.byte_tokens, *self.candidates[pos, slot], *self._best_tokens(config))
        if len(config) == 4:
            reach = np.unpackbits(self.register_reach[pos].view(np.uint8), bitorder="little")
            tokens += tuple(self.register_tokens[reach[: self.register_tokens.size] > 0])
        for t in tokens:
            if t < vocab:
                bits[t] = self._exact(t, config, budget)
        bits[list(self.eos_token_id)] = self._can_end(config)
        return bits

    @typing.no_type_check
    def _exact(self, t, config, budget) -> bool:
        """Whether token `t` can be read from `config` and leave at most `budget` tokens to end
        the text (`need`): `allowed`'s exact check."""
        data = bytes(self.token_bytes[t, : self.token_length[t]])
        after = self._walk(data, config)
        return after is not None and self._need(after) <= budget

    def __repr__(self):
        return (
            f"PushdownAutomaton({self.description!r}, positions={self.num_positions}, "
            f"slots={self.candidates.shape[1]}, candidates={self.candidates.shape[2]}, stack_depth={self.stack_depth}, "
            f"{self.nbytes / 2**20:.2f} MiB)"
        )
