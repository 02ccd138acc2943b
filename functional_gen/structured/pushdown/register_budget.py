"""The token budget of the frames that hold a member-set register (issue 55;
`json_schema.register_objects`): how many tokens finish an object read in any order, given
which of its required members are written.

A register frame's rest depends on its register: `}` is refused until every required member
is written, so a register-blind distance (`budget.token_distance`) is not an upper bound there,
and "distance + the cost of each member missing" is not *consistent* (after the `,` that starts
a missing member the need would jump by that member's cost: the `,` and the `}` would both be
refused and the row left with nothing). This module's bound is consistent: in every
configuration whose need fits, a token lowers it by one.

**The tables** (per register position `p` and free stack slots `R`, over *one-byte* moves: the
one-byte tokens are always checked exactly on the device, so each move of these paths is a
token; a move that calls a rule pays the callee's `token_distance` and goes on at its return
position):

- `Z[p]` (`register_distance`): the fewest tokens that end the frame once every required member
  is written (the register then refuses nothing; `0` after the object's `}`);
- `A[p]` (`value_distance`): the fewest tokens to an *after-value* position (one that may read
  the `}`: a member's value is complete) without writing a required member;
- `D_j[p]` (`member_distance`): the same, through writing required member `j` and no other;
- per object, `c_j = max over after-value q of D_j[q]` (`member_cost`: the most tokens one more
  member `j` takes) and `E = max over after-value q of Z[q]` (`close_cost`).

With `M` the required members not yet written, the frame needs

    F(p, M) = Z[p]                                                   if M is empty
            = sum_{j in M} c_j + E + min(A[p], min_j (D_j[p] - [j in M] c_j))   otherwise

tokens: finish the value (`A`) or the member being written (`D_j`, which takes `j` off the sum),
then one member per missing one, then the `}`. It is consistent: the first move of the path
that achieves the `min` exists and lowers `F` by one (a move that writes `j` lands where `A`
is at most `D_j - 1`, and `j` leaves `M`; at an after-value position `D_j - c_j <= 0 = A` for
every `j` in `M`, so the `min` is taken by a member missing). `F` grows with `M`, so
`U[p] = F(p, every required member)` (`max(Z, ...)`) is an upper bound whatever the register:
the frames that only meet a register frame as a callee or below them read `U` as its
`token_distance`.

**Rooms.** A move that pushes `k` return positions runs the callee with `R - k` free slots, so
the tables of room `R` read other frames only at lower rooms: `budget.token_budget` computes
them room by room (`register_room`), before the token-level distances of that room, whose
register positions it pins to `U`.
"""

import dataclasses

import numpy as np
from jaxtyping import Bool, Int, UInt32

from ..byte_dfa import ragged_rows
from .automaton import UNREACHABLE


@dataclasses.dataclass(frozen=True, eq=False)
class RegisterFrames:
    """The one-byte moves of the register frames, for `register_room`.

    **Attributes:** `index`: `Int[np.ndarray, " positions"]`, each position's row among the
    register positions (-1: none); `positions`: `Int[np.ndarray, " rows"]`, the rows'
    positions; `object`: `Int[np.ndarray, " rows"]`, each row's object (its rule's number among
    the register rules); `required`: `UInt32[np.ndarray, " objects"]`, each object's required
    bits; `bits`: the most required members of an object; `after_value`, `final`:
    `Bool[np.ndarray, " rows"]`; the edges, `Int[np.ndarray, " edges"]` each, sorted by
    `source` (a row): `cont` (the row where the frame goes on: the target, or the first return
    position pushed), `member` (`reg_set`: `j + 1` when the move writes required member `j`,
    else 0), `callee` (the position the move enters, -1 for none) and `pushes` (`k`, the return
    positions it pushes: the callee runs with `k` fewer free slots), and `extra`
    (`Int[np.ndarray, "edges extras"]`: the pushed return positions after the first, -1 for
    none; the `i`-th runs with `i + 1` fewer).
    """

    index: Int[np.ndarray, " positions"]
    positions: Int[np.ndarray, " rows"]
    object: Int[np.ndarray, " rows"]
    required: UInt32[np.ndarray, " objects"]
    bits: int
    after_value: Bool[np.ndarray, " rows"]
    final: Bool[np.ndarray, " rows"]
    source: Int[np.ndarray, " edges"]
    cont: Int[np.ndarray, " edges"]
    member: Int[np.ndarray, " edges"]
    callee: Int[np.ndarray, " edges"]
    pushes: Int[np.ndarray, " edges"]
    extra: Int[np.ndarray, "edges extras"]

    @property
    def num_rows(self) -> int:
        """Register positions."""
        return self.positions.size


def register_frames(
    nxt, push, final, readable, position_rule, reg_set, reg_require
) -> RegisterFrames | None:
    """The `RegisterFrames` of an automaton's tables (`None` when no rule has a required
    member: no byte depends on the register). `readable`: `Bool[np.ndarray, " classes"]`, the
    byte classes that are tokens by themselves (`building._readable`)."""
    rules_with = np.unique(position_rule[np.flatnonzero((reg_require > 0).any(axis=1))])
    if not rules_with.size:
        return None
    is_reg = np.isin(position_rule, rules_with)
    is_reg[0] = False
    positions = np.flatnonzero(is_reg)
    index = np.full(nxt.shape[0], -1, np.int64)
    index[positions] = np.arange(positions.size)
    obj_of_rule = {int(r): k for k, r in enumerate(rules_with.tolist())}
    obj = np.asarray([obj_of_rule[int(r)] for r in position_rule[positions]], np.int64)
    required = np.zeros(rules_with.size, np.uint32)
    np.bitwise_or.at(required, obj, reg_require[positions].max(axis=1).astype(np.uint32))
    bits = max(int(r).bit_length() for r in required.tolist())
    at, cls = np.nonzero((nxt[positions] > 0) & readable[None, : nxt.shape[1]])
    p = positions[at]
    target = nxt[p, cls]
    pushed = push[p, cls]
    k = (pushed > 0).sum(axis=1)
    same = (k == 0) & is_reg[target] & (position_rule[target] == position_rule[p])
    keep = same | (k > 0)  # a tail call out of the frame (none in an object) is left out
    at, cls, p, target, pushed, k = (
        at[keep],
        cls[keep],
        p[keep],
        target[keep],
        pushed[keep],
        k[keep],
    )
    cont = np.where(k == 0, index[target], index[pushed[:, 0]])
    if (cont < 0).any():
        raise RuntimeError("internal error: a register frame returns outside its rule")
    extra = np.where(pushed[:, 1:] > 0, pushed[:, 1:], -1) if pushed.shape[1] > 1 else None
    return RegisterFrames(
        index=index,
        positions=positions,
        object=obj,
        required=required,
        bits=bits,
        after_value=(reg_require[positions] > 0).any(axis=1),
        final=final[positions].astype(bool),
        source=at.astype(np.int64),
        cont=cont.astype(np.int64),
        member=reg_set[p, cls].astype(np.int64),
        callee=np.where(k > 0, target, -1).astype(np.int64),
        pushes=k.astype(np.int64),
        extra=np.full((at.size, 0), -1, np.int64) if extra is None else extra.astype(np.int64),
    )


@dataclasses.dataclass(frozen=True, eq=False)
class RoomTables:
    """`register_room`'s tables of one room: `zero` (`Z`), `value` (`A`), `member` (`D`,
    `[rows, bits]`), `member_cost` (`c`, `[objects, bits]`), `close_cost` (`E`, `[objects]`)
    and `upper` (`U`, `[rows]`), int64, capped at `UNREACHABLE` (see the module docstring)."""

    zero: np.ndarray
    value: np.ndarray
    member: np.ndarray
    member_cost: np.ndarray
    close_cost: np.ndarray
    upper: np.ndarray

    def same(self, other: "RoomTables") -> bool:
        """Whether every table equals `other`'s."""
        return all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name))
            for f in dataclasses.fields(self)
        )


def register_room(frames: RegisterFrames, grid, room: int) -> RoomTables:
    """The tables of room `room` (see the module docstring): a shortest-path fixed point over
    the one-byte moves of the register frames (a worklist, as `building._fixed_point`), where a
    move that pushes `k` return positions pays the callee's `grid[room - k, callee]` and the
    other pushed positions' `grid[room - i, ...]` (`grid`: `token_distance` per room and
    position, the register positions' `U` included, filled for the rooms below `room`)."""
    f = frames
    n, bits = f.num_rows, f.bits
    # what a move costs besides its own token and the frame's rest at `cont`
    base = np.zeros(f.source.size, np.int64)
    pushing = f.pushes > 0
    ok = f.pushes <= room
    rows = np.flatnonzero(pushing & ok)
    base[rows] = grid[room - f.pushes[rows], f.callee[rows]]
    for i in range(f.extra.shape[1]):
        has = pushing & ok & (f.extra[:, i] >= 0)
        r = np.flatnonzero(has)
        base[r] += grid[room - 1 - i, f.extra[r, i]]
    base = np.where(ok, np.minimum(base, UNREACHABLE), UNREACHABLE)
    # columns: Z, A, D_0..D_{bits-1}
    width = 2 + bits
    table = np.full((n, width), UNREACHABLE, np.int64)
    table[f.final, 0] = 0
    table[f.after_value, 1] = 0
    lanes = np.arange(bits)
    member = f.member
    writes = member[:, None] == lanes[None, :] + 1  # the move writes required member j
    plain = member == 0

    def value(edges):
        rest = table[f.cont[edges]]
        out = np.full((edges.size, width), UNREACHABLE, np.int64)
        step = 1 + base[edges]
        out[:, 0] = step + rest[:, 0]
        out[:, 1] = np.where(plain[edges], step + rest[:, 1], UNREACHABLE)
        d = np.where(plain[edges, None], rest[:, 2:], UNREACHABLE)
        d = np.where(writes[edges], rest[:, 1:2], d)
        out[:, 2:] = step[:, None] + d
        return np.minimum(out, UNREACHABLE)

    order = np.argsort(f.cont, kind="stable")
    users_ptr = np.searchsorted(f.cont[order], np.arange(n + 1))
    active = np.arange(f.source.size)
    while active.size:
        values = value(active)
        src = f.source[active]  # sorted, as `active` is
        starts = np.flatnonzero(np.diff(src, prepend=-1))
        least = np.minimum.reduceat(values, starts, axis=0)
        better = least < table[src[starts]]
        changed_rows = better.any(axis=1)
        changed = src[starts][changed_rows]
        table[changed] = np.minimum(table[changed], least[changed_rows])
        if not changed.size:
            break
        active = np.unique(order[ragged_rows(users_ptr, changed)[1]])
    zero, val, mem = table[:, 0], table[:, 1], table[:, 2:]
    objects = f.required.size
    member_cost = np.zeros((objects, bits), np.int64)
    close_cost = np.zeros(objects, np.int64)
    for o in range(objects):
        at = f.after_value & (f.object == o)
        req = (int(f.required[o]) >> lanes) & 1 > 0
        if at.any():
            member_cost[o] = np.where(req, mem[at].max(axis=0), 0)
            close_cost[o] = zero[at].max()
        else:
            member_cost[o] = np.where(req, UNREACHABLE, 0)
            close_cost[o] = UNREACHABLE
    every = np.asarray([int(r) for r in f.required], np.int64)
    upper = frame_need(
        frames, member_cost, close_cost, zero, val, mem, np.arange(n), every[f.object]
    )
    upper = np.maximum(upper, zero)
    return RoomTables(zero, val, mem, member_cost, close_cost, np.minimum(upper, UNREACHABLE))


def frame_need(frames: RegisterFrames, member_cost, close_cost, zero, value, member, rows, missing):
    """`F(p, M)` of the module docstring for register rows `rows` (numpy, any shape) with the
    required members `missing` not written (int bit masks, the same shape), from one room's
    tables (`zero`, `value` `[rows]`, `member` `[rows, bits]`; `member_cost` `[objects, bits]`,
    `close_cost` `[objects]`); `UNREACHABLE` or more where nothing fits."""
    rows = np.asarray(rows)
    missing = np.asarray(missing, np.int64)
    lanes = np.arange(frames.bits)
    obj = frames.object[rows]
    bit = (missing[..., None] >> lanes) & 1
    c = member_cost[obj]
    through = np.min(member[rows] - bit * c, axis=-1, initial=UNREACHABLE)
    rest = np.minimum(value[rows], through)
    total = (bit * c).sum(axis=-1) + close_cost[obj] + rest
    done = (missing == 0) | frames.final[rows]
    return np.where(done, zero[rows], np.minimum(total, UNREACHABLE))


REGISTER_BUDGET_TABLES = (
    "register_index",
    "register_object",
    "register_required",
    "register_distance",
    "value_distance",
    "member_distance",
    "member_cost",
    "close_cost",
)
"""The names of `register_tables`' tables, the `PushdownAutomaton` fields (and
`RegisterPushdownConstraint` fields) they fill, in this order."""


def register_tables(frames: RegisterFrames, rooms: list) -> dict:
    """The register tables of `PushdownAutomaton` from `register_room`'s tables of each room
    column kept (`rooms`, room 0 first), int32 (uint32 for the bit masks):
    `register_index` (`[positions]`, -1 none), `register_object` (`[rows]`),
    `register_required` (`[objects]`), `register_distance` (`Z`), `value_distance` (`A`),
    `member_distance` (`D`, `[rows, bits, rooms]`), `member_cost` (`c`, `[objects, bits,
    rooms]`), `close_cost` (`E`, `[objects, rooms]`); `[rows, rooms]` where not said."""

    def stack(name, axis=-1):
        return np.stack([getattr(t, name) for t in rooms], axis=axis).astype(np.int32)

    tables = (
        frames.index.astype(np.int32),
        frames.object.astype(np.int32),
        frames.required.astype(np.uint32),
        stack("zero"),
        stack("value"),
        stack("member"),
        stack("member_cost"),
        stack("close_cost"),
    )
    return dict(zip(REGISTER_BUDGET_TABLES, tables, strict=True))
