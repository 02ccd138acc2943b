"""The token budget of a pushdown automaton, counted in tokens and within the stack depth
(`token_budget`), from the moves the token walk saw (`token_tables.TokenMoves`).

**The bound.** For a position `p` with `R` free stack slots, `token_distance[p, R]` is the fewest
tokens that finish `p`'s rule using at most `R` more slots at any moment, where each token is
read inside the rule's frame (it may call rules and return from them, never return below it):
`0` where the rule may end, else the least `1 + token_distance[p', R - k] + sum_i
token_distance[q_i, R - i]` over the tokens that lead from `p` to `p'` pushing `q_0..q_{k-1}`
(bottom first) and never hold more than `R` slots above the start (their peak). It is a
shortest-path fixed point over these token-level moves, one room column after the other
(column `R` reads columns `R - i`); the columns stop changing once the room exceeds what any
shortest completion needs, and only the columns up to there are kept (`min(room, columns - 1)`
indexes them). A configuration `(p, stack)` with `sp` entries then needs at most

    need = token_distance[p, D - sp] + sum_j token_distance[stack[j], D - j]

tokens to end, `D` the stack depth: finish the current rule, return, finish the rule below, and
so on (the entry `stack[j]` runs with `j` entries under it). The bound is *sound*: the first
token of the current frame's shortest completion (`best_token`; when the position may end, that
of the first entry below that cannot) is a real token from the configuration (a rule that may
end never reads a byte that a return position below reads, so its first byte returns there), it
fits in the stack and lowers `need` by exactly one. So a row that keeps `need <= r` (`r` the
tokens left) always has a token and ends inside the language within `max_new_tokens`, and never
runs out of stack. It is an upper bound on the true fewest tokens (a token that ends one frame and
goes on in the frame below, like `"}]"`, is not counted as one move), exact where no
shortest completion needs such a token.

**The bitmask rows.** A token is in the bitmask row of a room only from its *level* on: its
peak, and the free slots that the text needs to end after it (`building._min_rooms`, over the
one-byte tokens, at the heights its frames run with), so the row never offers a bracket that
cannot be closed within the stack. Per (position, slot), `token_cost` is the largest
`token_distance[p', room + m - k] + sum_i token_distance[q_i, room + m - i]` after a bitmask token
(`m` returns below the start, then `k` pushes; a set of states after a return below the start:
its costliest member; the stack below counted whole, an upper bound since a return only removes
entries) over the rooms where it is in the row: the row is used whole when the stack's `need`
plus `token_cost` is at most `r - 1`; otherwise only the tokens checked exactly on the device
(one-byte tokens, candidates and the best tokens) are offered.
"""

import numpy as np

from ..byte_dfa import ragged_rows
from .automaton import MAX_LEVELS, UNREACHABLE
from .register_budget import RegisterFrames, register_room, register_tables
from .token_tables import TokenMoves


def token_budget(
    moves: TokenMoves,
    final,
    num_slots: int,
    stack_depth: int,
    vocab_size: int,
    num_positions: int,
    registers: RegisterFrames | None = None,
):
    """The token-level budget tables of a pushdown automaton (see the module docstring).

    **Arguments:** `moves` from `token_tables`; `final`: `Bool[np.ndarray, " positions"]`;
    `num_slots`, `stack_depth`, `vocab_size`, `num_positions`; `registers`: the register
    frames (`register_budget.register_frames`), whose positions get `register_budget`'s tables
    instead: their `token_distance` is the bound `U` whatever the register, computed room by
    room before the other positions' (their best token: none, the one-byte tokens are).

    **Returns:** `(token_distance, best_token, token_cost, register)`: `Int[np.ndarray,
    "positions rooms"]` twice (`UNREACHABLE` where no completion fits; `vocab_size` where there
    is no best token: the rule may end, or cannot), `Int[np.ndarray, "positions slots"]`, all
    int32, and without `registers` `None`, else a dict of the register tables (`RegisterTables`'
    fields, see `register_tables`).
    """
    ext_info, sets = moves.ext_info, moves.sets
    # Ids of the states and set members that matter, with their positions, pushes and peaks.
    members = [sets[-1 - s] for s in np.unique(moves.state[moves.state < 0]).tolist()]
    ids = np.unique(np.concatenate([moves.state[moves.state >= 0], moves.origin, *members]))
    info = [ext_info[e] for e in ids.tolist()]
    width = max((len(x[1]) for x in info), default=0)
    pos = np.asarray([x[0] for x in info], np.int64)
    below = np.asarray([x[2] for x in info], np.int64)
    peak = np.asarray([x[3] for x in info], np.int64)
    count = np.asarray([len(x[1]) for x in info], np.int64)
    pushed = np.zeros((ids.size, max(width, 1)), np.int64)
    for i, x in enumerate(info):
        pushed[i, : len(x[1])] = x[1]
    canon: dict = {}
    canon_of = np.asarray(
        [canon.setdefault((x[0], x[1], x[3]), len(canon)) for x in info], np.int64
    )

    def index(e):
        return np.searchsorted(ids, e)

    # The moves inside the start's frame: one edge per (source position, result).
    inside = moves.state >= 0
    inside[inside] = below[index(moves.state[inside])] == 0
    state_at = index(moves.state[inside])
    source = pos[index(moves.origin[inside])]
    _, keep = np.unique(source * max(len(canon), 1) + canon_of[state_at], return_index=True)
    edge_state = state_at[keep]
    order = np.argsort(source[keep], kind="stable")
    edge_source = source[keep][order]
    edge_state = edge_state[order]
    edge_token = moves.token[inside][keep][order]
    if registers is not None:  # the register positions' distances are `register_room`'s
        mine = registers.index[edge_source] < 0
        edge_source, edge_state, edge_token = edge_source[mine], edge_state[mine], edge_token[mine]
    rooms: list = []
    distance, best = _token_distances(
        edge_source,
        pos[edge_state],
        pushed[edge_state],
        count[edge_state],
        peak[edge_state],
        edge_token,
        final,
        stack_depth,
        vocab_size,
        registers,
        rooms,
    )
    rows = _cost_rows(moves, ids, pos)
    token_cost = _bitmask_costs(
        moves, rows, pos, pushed, count, below, distance, num_slots, num_positions
    )
    if registers is None:
        return distance, best, token_cost, None
    tables = register_tables(registers, rooms[: distance.shape[1]])
    frame = distance.copy()
    frame[registers.positions] = tables["register_distance"]
    tables["room_token_cost"] = _bitmask_costs(
        moves, rows, pos, pushed, count, below, distance, num_slots, num_positions, frame, registers
    )
    value, member = tables["value_distance"], tables["member_distance"]
    through = np.minimum(value, member.min(axis=1, initial=UNREACHABLE))
    done = registers.final[:, None]  # after the `}`: nothing is missing
    frame[registers.positions] = np.where(done, tables["register_distance"], through)
    tables["register_cost"] = _bitmask_costs(
        moves, rows, pos, pushed, count, below, distance, num_slots, num_positions, frame, registers
    )
    return distance, best, token_cost, tables


def _token_distances(
    source,
    target,
    pushed,
    count,
    peak,
    token,
    final,
    stack_depth,
    vocab_size,
    registers=None,
    rooms=None,
):
    """`(token_distance, best_token)` from the edges (sorted by `source`): the fixed point of
    the module docstring, a worklist per room column as `building._distances` (only the edges
    whose target or pushed positions changed are evaluated again). With `registers`, each
    room's register positions are pinned first to `register_budget.register_room`'s bound `U`
    (its tables appended to `rooms`), from the rooms below."""
    n = final.size
    e = source.size
    start = np.where(final, 0, UNREACHABLE).astype(np.int64)
    start[0] = UNREACHABLE
    pushing = np.arange(pushed.shape[1])[None, :] < count[:, None]
    edge = np.arange(e)
    users = np.concatenate([target, pushed[pushing]])  # edge `by[i]` depends on `users[i]`
    by = np.concatenate([edge, np.broadcast_to(edge[:, None], pushed.shape)[pushing]])
    order = np.argsort(users, kind="stable")
    users_ptr = np.searchsorted(users[order], np.arange(n + 1))
    by = by[order]
    most = int(peak.max(initial=0))
    if registers is not None:  # the register frames' moves read the rooms below too
        most = max(most, int(registers.pushes.max(initial=0)))
    grid = np.zeros((min(stack_depth, 8) + 1, n), np.int64)
    lanes = np.arange(pushed.shape[1])

    def value(edges, room):
        k = count[edges]
        v = grid[room - k, target[edges]]
        rooms = np.maximum(room - lanes[None, :], 0)
        v = v + np.where(pushing[edges], grid[rooms, pushed[edges]], 0).sum(axis=1)
        return np.minimum(1 + v, UNREACHABLE)

    bests = []
    room = 0
    while True:
        if room >= grid.shape[0]:
            grid = np.concatenate([grid, np.zeros_like(grid)])
        grid[room] = start if room == 0 else grid[room - 1]
        if registers is not None:
            tables = register_room(registers, grid, room)
            rooms.append(tables)
            grid[room, registers.positions] = tables.upper
        usable = peak <= room
        active = np.flatnonzero(usable)
        while active.size:
            v = value(active, room)
            src = source[active]
            starts = np.flatnonzero(np.diff(src, prepend=-1))
            least = np.minimum.reduceat(v, starts)
            better = least < grid[room, src[starts]]
            changed = src[starts][better]
            grid[room, changed] = least[better]
            if not changed.size:
                break
            active = np.unique(by[ragged_rows(users_ptr, changed)[1]])
            active = active[usable[active]]
        # one edge per source that achieves its distance: the best token
        best = np.full(n, vocab_size, np.int64)
        edges = np.flatnonzero(usable)
        hit = edges[
            (value(edges, room) == grid[room, source[edges]])
            & (grid[room, source[edges]] < UNREACHABLE)
            & ~final[source[edges]]
        ]
        src, first = np.unique(source[hit], return_index=True)
        best[src] = token[hit[first]]
        bests.append(best)
        steady = room >= most and all(
            np.array_equal(grid[room], grid[r])
            and (registers is None or rooms[room].same(rooms[r]))
            for r in range(room - most, room)
        )
        if steady or room == stack_depth:
            columns = room - most + 1 if steady else room + 1
            break
        room += 1
    distance = np.ascontiguousarray(grid[:columns].T).astype(np.int32)
    return distance, np.stack(bests[:columns], axis=1).astype(np.int32)


def _cost_rows(moves, ids, pos) -> dict:
    """The (move, member) rows that `_bitmask_costs` reduces, computed once per `token_budget`:
    for each bitmask move (peak below `MAX_LEVELS`) and each member of its state (itself, or
    its set's members), sorted by origin: `member` (an index into `ids`) and `level` per row,
    `starts` (the first row of each origin), `origins` (their ids, ascending) and `start` (their
    positions)."""
    sure = moves.peak < MAX_LEVELS  # `peak`: the state's bitmask level
    origin, state, level = moves.origin[sure], moves.state[sure], moves.peak[sure]
    set_sizes = np.asarray([len(m) for m in moves.sets] + [1], np.int64)
    set_ptr = np.concatenate([[0], np.cumsum(set_sizes)])
    set_flat = np.concatenate([*moves.sets, np.zeros(1, np.int64)]).astype(np.int64)
    which = np.where(state < 0, -1 - state, len(moves.sets))
    rows, index = ragged_rows(set_ptr, which)
    member = np.searchsorted(ids, np.where(state[rows] < 0, set_flat[index], state[rows]))
    origin_of = origin[rows]
    order = np.argsort(origin_of, kind="stable")
    origin_of = origin_of[order]
    starts = np.flatnonzero(np.diff(origin_of, prepend=-1))
    origins = origin_of[starts]
    return {
        "member": member[order],
        "level": level[rows][order],
        "starts": starts,
        "origins": origins,
        "start": pos[np.searchsorted(ids, origins)],
    }


def _bitmask_costs(
    moves,
    rows: dict,
    pos,
    pushed,
    count,
    below,
    distance,
    num_slots,
    num_positions,
    frame=None,
    registers=None,
):
    """`token_cost` per (position, slot) (see the module docstring), over `rows`
    (`_cost_rows`). With `frame` (a table as `distance`) and `registers`: a token from a
    register position that stays in its frame (no return below it) reads `frame` where the frame
    goes on (its end position, or the first return position it pushes), `distance` elsewhere;
    and the costs are per room too (`[positions, slots, rooms]`, room `min(free slots, columns +
    MAX_LEVELS - 2)`). A member's cost at each room depends only on the member (and, with
    `frame`, whether the token stays in a register frame): tabled per member (`ids`), then
    gathered per row."""
    columns = distance.shape[1]
    top = columns + MAX_LEVELS - 2  # the costs stop changing beyond
    rooms = np.arange(top + 1)
    # each member's cost at each room: its frames at the rooms they run with (`-below` returns
    # first, then `k` pushes); with `frame`, a second table for the tokens in a register frame
    k, m = count, -below
    at_room = np.clip(rooms[None, :] + (m - k)[:, None], 0, columns - 1)
    cost = distance[pos[:, None], at_room].astype(np.int64)
    own = None
    if frame is not None:  # the member's frame goes on at its end or at its first push
        own = np.where((k == 0)[:, None], frame[pos[:, None], at_room], cost)
    for i in range(pushed.shape[1]):
        r = np.clip(rooms[None, :] + (m - i)[:, None], 0, columns - 1)
        at = pushed[:, i][:, None]
        pushing = (i < k)[:, None]
        term = np.where(pushing, distance[at, r], 0)
        if own is not None:
            own = own + (np.where(pushing, frame[at, r], 0) if i == 0 else term)
        cost = cost + term
    member, level = rows["member"], rows["level"]
    if own is not None:  # rows in a register frame: no return below the start
        origin_in = registers.index[rows["start"]] >= 0
        in_frame = np.repeat(origin_in, np.diff(rows["starts"], append=member.size))
        in_frame &= m[member] == 0
        picked = np.where(in_frame[:, None], own[member], cost[member])
    else:
        picked = cost[member]
    picked = np.minimum(picked, UNREACHABLE)
    picked = np.where(rooms[None, :] >= level[:, None], picked, 0)  # not in the row there
    # the costliest per origin, over every room (per room with `frame`: a register frame's
    # costs may be out of reach at a room where its token is in the row, the levels being
    # register-blind, and must not close the row at the rooms where they are not)
    costliest = picked if frame is not None else picked.max(axis=1, initial=0)
    origins = rows["origins"]
    token_cost = np.zeros((num_positions, num_slots, *costliest.shape[1:]), np.int32)
    if origins.size:
        per_origin = np.maximum(np.maximum.reduceat(costliest, rows["starts"], axis=0), 0)
        at = np.minimum(np.searchsorted(origins, moves.pair_origin), origins.size - 1)
        hit = origins[at] == moves.pair_origin
        token_cost[moves.pair_position[hit], moves.pair_slot[hit]] = per_origin[at[hit]]
    return token_cost
