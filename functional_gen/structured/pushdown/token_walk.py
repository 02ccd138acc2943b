"""The token walk of a pushdown automaton (step 3 of `functional_gen.structured.pushdown`):
every token walked from every (position, top of stack) over the vocabulary's trie, as one
class, `TokenWalk` (its methods share the extended states and memo tables it holds), which
gives per token a *code* per origin (bitmask level, candidate or never) and the token moves;
`token_tables.token_tables` turns its codes into the bitmask rows and candidate lists. The
row-hashing helpers above the class serve only its walk.
"""

import typing

import numpy as np

from ..byte_dfa import token_trie, trie_levels
from ..vocabulary import TokenVocabulary
from .automaton import BOTTOM, MAX_LEVELS, POP

# Nested helpers that run per byte, state or schema node are `@typing.no_type_check`: the
# tests' jaxtyping import hook would wrap every call of them (30-40 us each, and a fresh
# wrapper per definition), which was most of the structured tests' time.


_PENDING = -2  # a top of stack not known yet: a walk that returns to it stops (see pass 2)


def _unique(values):
    """`np.unique(values)` for an integer array, by sorting (numpy 2's hash-based `np.unique`
    is many times slower on the millions of keys of the token walk)."""
    values = np.sort(values)
    keep = np.ones(values.size, bool)
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


class _HashCollision(Exception):
    """Two distinct rows of `token_tables`' walk hashed alike (`_row_hashes`): walk again
    comparing rows exactly."""


_WALK_CHUNK = 1024
"""Origins walked together by `token_tables` (a pass with more is walked in chunks of this
many, then merged). A function is a row over the origins walked together; near the trie's root
almost every node's function is distinct, so one walk of every origin builds many wide rows:
MaskBench o48425's first pass, 14,916 origins, made 4,627 new rows at the third byte (39 million
entries, 2 s). A chunk's functions are those rows cut to its columns, of which fewer are
distinct: 13 slow pushdown schemas, each in a fresh process, best of two, 2026-11-25: 48.3 s
in one walk, 38.5 / 37.2 / 37.5 s in chunks of 512 / 1,024 / 2,048 (o48425 6.9 -> 3.9 s,
o48866 5.6 -> 4.6 s, o21378 6.3 -> 5.2 s); chunks cut at rule boundaries were no faster."""

_ROW_WEIGHTS = np.random.default_rng(0).integers(1, 2**63, 1 << 16, dtype=np.uint64) | 1
"""Random odd weights of `_row_hashes` (one per column; wider rows reuse them cyclically)."""


def _row_hashes(rows, weights) -> np.ndarray:
    """A 64-bit hash of each row of a 2-D int32 array: a linear combination of its entries
    with the random odd `weights` (`_ROW_WEIGHTS`, reused cyclically past their length) mod
    2**64 (equal rows hash alike; distinct rows collide with probability about 2**-63 per pair,
    which the callers check)."""
    weights = np.resize(weights, rows.shape[1])
    hashes = np.empty(rows.shape[0], np.uint64)
    # A matrix-vector product, not `(values * weights).sum(axis=1)`: no temporary array, and
    # 2-10x faster (0.06 against 0.58 s for 2,000 rows of 15,000 entries); a block of rows at a
    # time, so that their 64-bit copy stays small (the walk's rows reach hundreds of millions
    # of entries).
    block = max(1, (1 << 19) // max(rows.shape[1], 1))
    with np.errstate(over="ignore"):
        for start in range(0, rows.shape[0], block):
            values = rows[start : start + block].astype(np.int64).view(np.uint64)
            hashes[start : start + block] = values @ weights
    return hashes


def _hashed_rows(rows, weights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(first, inverse, hashes)` for a 2-D int32 array: the index of each distinct row's first
    occurrence (in order of their hashes), each row's number among them, and their hashes
    (`_row_hashes` with `weights`). Sorting the hashes instead of hashing each row's bytes in Python: the
    walk's functions come by the hundred thousand.

    **Raises:** `_HashCollision` when two distinct rows hash alike."""
    hashes = _row_hashes(rows, weights)
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    starts = np.ones(rows.shape[0], bool)
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    inverse = np.empty(rows.shape[0], np.int64)
    inverse[order] = np.cumsum(starts) - 1
    first = order[starts]
    # Only the rows that are not their group's first need a look (the walk's rows repeat
    # little): a gather of those, not of every row twice.
    later = order[~starts]
    if not np.array_equal(rows[later], rows[first[inverse[later]]]):
        raise _HashCollision
    return first, inverse, ordered[starts]


_UNKNOWN, _DEAD_END, _SEVERAL = -3, -1, -2
"""`TokenWalk.table` entries: not computed yet, no successor, several successors (`memo`)."""
_GONE_ENTRY = int(np.iinfo(np.int32).min)
"""A function's entry for an origin whose walk died (`TokenWalk.walk_once`)."""
_NEVER, _CANDIDATE = 255, 254
"""Token codes beside the bitmask levels `0..MAX_LEVELS-1`."""


class TokenWalk:
    """The walk behind `token_tables`, as one object: the inputs, the extended states met so
    far and the memo tables that the walk's steps share. Build it and hand it to `token_tables._tables` once.

    Extended states: `(position, return positions pushed since the start or since the last
    return below it, returns below the start (<= 0, minus their count), most slots above the
    start in use, the return position on top of the stack below the start or None once used)`.

    **Fields** (host, numpy and Python):

    - the inputs: `nxt`, `push`, `byte_class`, `position_sites`, `position_slots`,
      `vocabulary`, `stack_depth`; their sizes `num_positions`, `vocab`, `num_slots`,
      `num_classes` (byte classes) and `width` (the same, for the successor table);
    - the vocabulary's trie: `trie`, `num_nodes`, `parent`, `level_ptr`, `token_node`,
      `token_depth`, `node_class`, `class_byte` (a byte of each class);
    - extended states (`intern`): `ext_ids` (key -> id), `ext_info` (id -> key), `ext_lists`
      and `ext_arrays` (position, simple, peak, cost, context per state; `columns`, with
      `filled` the arrays' filled length), `context_ids`/`contexts` (the states' contexts),
      `distance_list`;
    - Python copies for `successors`: `nxt_list`, `class_list`, `pushes_of`, `site_key`,
      `pop_memo`;
    - successor memos: `memo` (branching successors), `dense` (per context, the ids of its
      positions), `table`/`table_returned` (one successor per (state, class)), `steps` (per
      (state, class), for `walk_once`);
    - sets of extended states (`intern_set`): `set_ids`, `sets`.
    """

    def __init__(
        self,
        nxt,
        push,
        byte_class,
        position_sites,
        position_slots,
        vocabulary: TokenVocabulary,
        stack_depth: int,
        distance,
        min_room,
    ):
        num_positions = nxt.shape[0]
        vocab = vocabulary.vocab_size
        trie = token_trie(vocabulary)
        num_nodes = trie.num_nodes
        num_slots = max(len(s) for s in position_slots)

        # Extended states: (position, return positions pushed since the start or since the last
        # return below it, returns below the start (<= 0, minus their count), most slots above the
        # start in use, the return position on top of the stack below the start or None once used).
        ext_ids: dict = {}
        ext_info: list = []
        # Per extended state, as lists and (`columns`) arrays: its position; whether it pushed and
        # returned nothing yet (`simple`); its peak; `distance[position] + sum(distance[pushed])`
        # (its cost); the id of its *context* (pushed, below, peak, top) in `contexts`: a byte read
        # without a call keeps the context and changes only the position.
        ext_lists: tuple = ([], [], [], [], [])
        ext_arrays = [np.zeros(0, np.int64) for _ in ext_lists]
        context_ids: dict = {}
        contexts: list = []
        distance_list = distance.tolist()
        min_room_list = min_room.tolist()

        filled = [0]

        # Python copies of the tables for `successors` (numpy scalar indexing is slow there).
        nxt_list = nxt.tolist()
        class_list = byte_class.tolist()
        pushes_of: dict = {}  # (position, class) -> the return positions pushed, where any
        for p, c in zip(*np.nonzero(push[:, :, 0])):
            pushes_of[int(p), int(c)] = tuple(int(v) for v in push[p, c] if v)
        site_key: list = []  # per position, an id of its `position_sites`
        site_ids: dict = {}
        for sites in position_sites:
            site_key.append(site_ids.setdefault(sites, len(site_ids)))
        pop_memo: dict = {}

        memo: dict = {}  # extended state * width + byte class -> `successors` (those not plain)

        dense: dict = {}  # context id -> id of (position, *context) per position (-1: new)
        # (extended state, byte class) -> one successor, and whether it returned below the start:
        # per class, not per byte, and int32, grown by half (MaskBench sp_202 reaches 180,000
        # extended states: int64 per byte and doubled, the table reached 734 MB, and growing it
        # took most of the schema's 6.4 s compile, now 3.7 s).
        width = int(byte_class.max()) + 1
        table = np.full((64, width), _UNKNOWN, np.int32)
        table_returned = np.zeros((64, width), bool)

        set_ids: dict = {}
        sets: list = []  # member arrays (sorted extended state ids)

        parent, level_ptr, token_node = trie_levels(trie)
        num_classes = int(byte_class.max()) + 1
        node_class = byte_class[trie.byte]
        class_byte = np.zeros(num_classes, np.int64)  # a byte of each class (`lookup` is per byte)
        class_byte[byte_class[::-1]] = np.arange(255, -1, -1)
        token_depth = np.searchsorted(level_ptr, token_node, side="right") - 1
        steps = np.zeros((64, num_classes), np.int32)  # see `walk`

        self.nxt = nxt
        self.push = push
        self.byte_class = byte_class
        self.position_sites = position_sites
        self.position_slots = position_slots
        self.vocabulary = vocabulary
        self.stack_depth = stack_depth
        self.num_positions = num_positions
        self.vocab = vocab
        self.trie = trie
        self.num_nodes = num_nodes
        self.num_slots = num_slots
        self.ext_ids = ext_ids
        self.ext_info = ext_info
        self.ext_lists = ext_lists
        self.ext_arrays = ext_arrays
        self.context_ids = context_ids
        self.contexts = contexts
        self.distance_list = distance_list
        self.min_room_list = min_room_list
        self.filled = filled
        self.nxt_list = nxt_list
        self.class_list = class_list
        self.pushes_of = pushes_of
        self.site_key = site_key
        self.pop_memo = pop_memo
        self.memo = memo
        self.dense = dense
        self.width = width
        self.table = table
        self.table_returned = table_returned
        self.set_ids = set_ids
        self.sets = sets
        self.parent = parent
        self.level_ptr = level_ptr
        self.token_node = token_node
        self.num_classes = num_classes
        self.node_class = node_class
        self.class_byte = class_byte
        self.token_depth = token_depth
        self.steps = steps
        self.moves = []  # see `record_moves`

    @typing.no_type_check
    def intern(self, key) -> int:
        ext_ids, ext_info, ext_lists = self.ext_ids, self.ext_info, self.ext_lists
        context_ids, contexts, distance_list = self.context_ids, self.contexts, self.distance_list
        i = ext_ids.get(key)
        if i is None:
            i = ext_ids[key] = len(ext_info)
            ext_info.append(key)
            pos, pushed, below, _, _ = key
            context = key[1:]
            ct = context_ids.get(context)
            if ct is None:
                ct = context_ids[context] = len(contexts)
                contexts.append(context)
            ext_lists[0].append(pos)
            ext_lists[1].append(not pushed and below == 0)
            ext_lists[2].append(self.level(key))
            ext_lists[3].append(distance_list[pos] + sum(distance_list[v] for v in pushed))
            ext_lists[4].append(ct)
        return i

    @typing.no_type_check
    def level(self, key) -> int:
        """The free stack slots a token that ends in the extended state `key` needs: its peak,
        and enough that the text can still end after it (`min_room` of its position and of each
        position it pushed, at the height each runs with: `k` pushed after `-below` returns).
        `UNREACHABLE` or more where it never can."""
        pos, pushed, below, peak, _ = key
        rooms = self.min_room_list
        k = len(pushed)
        need = max(peak, rooms[pos] + k + below)
        for i, v in enumerate(pushed):
            need = max(need, rooms[v] + i + below)
        return need

    @typing.no_type_check
    def columns(self):
        """`(position, simple, peak, cost, context)` per extended state, as int64 arrays."""
        filled, ext_info = self.filled, self.ext_info
        ext_arrays, ext_lists = self.ext_arrays, self.ext_lists
        done, total = filled[0], len(ext_info)
        if done < total:
            if total > ext_arrays[0].size:
                size = max(total, 2 * ext_arrays[0].size)
                for k, old in enumerate(ext_arrays):
                    ext_arrays[k] = np.zeros(size, np.int64)
                    ext_arrays[k][:done] = old[:done]
            for k, values in enumerate(ext_lists):
                ext_arrays[k][done:total] = values[done:total]
            filled[0] = total
        return ext_arrays

    @typing.no_type_check
    def successors(self, eid: int, byte: int):
        ext_info, class_list, nxt_list = self.ext_info, self.class_list, self.nxt_list
        site_key, pop_memo, _successors = self.site_key, self.pop_memo, self._successors
        pos, pushed, below, peak, top = ext_info[eid]
        c = class_list[byte]
        if not pushed and below == 0 and nxt_list[pos][c] == POP:
            # A return from the start's own rule: the result depends on where it returns to
            # (the top of the stack, or the rule's return sites) and the peak, not on `pos`.
            key = (top, c, peak) if top is not None else (None, site_key[pos], c, peak)
            hit = pop_memo.get(key)
            if hit is None:
                hit = pop_memo[key] = _successors(pos, pushed, below, peak, top, c)
            return hit
        return _successors(pos, pushed, below, peak, top, c)

    @typing.no_type_check
    def _successors(self, pos, pushed, below, peak, top, c):
        nxt_list, pushes_of, intern = self.nxt_list, self.pushes_of, self.intern
        stack_depth, position_sites = self.stack_depth, self.position_sites
        out, death, returned = [], False, False
        work, seen = [(pos, pushed, below, top)], set()
        while work:
            p, stack, low, first = work.pop()
            act = nxt_list[p][c]
            if act > 0:
                more = pushes_of.get((p, c))
                if more:
                    stack = stack + more
                height = low + len(stack)
                if height > stack_depth:
                    death = True
                else:
                    out.append(intern((act, stack, low, max(peak, height), first)))
            elif act == POP:
                if stack:
                    work.append((stack[-1], stack[:-1], low, first))
                elif first is not None:
                    returned = True
                    if first == BOTTOM:
                        death = True
                    elif first != _PENDING:
                        work.append((first, (), low - 1, None))
                else:
                    returned = True
                    for s in position_sites[p]:
                        if s == BOTTOM or low - 1 < -stack_depth:
                            death = True
                        elif s not in seen:
                            seen.add(s)
                            work.append((s, (), low - 1, None))
            else:
                death = True
        return out, death, returned

    @typing.no_type_check
    def grow_table(self):
        if len(self.ext_info) > self.table.shape[0]:
            table, width = self.table, self.width
            grow = max(len(self.ext_info), table.shape[0] + table.shape[0] // 2) - table.shape[0]
            self.table = np.concatenate([table, np.full((grow, width), _UNKNOWN, np.int32)])
            self.table_returned = np.concatenate(
                [self.table_returned, np.zeros((grow, width), bool)]
            )

    @typing.no_type_check
    def lookup(self, e, b):
        """Successor of each (extended state, byte): an id, `dead` or `several` (see `memo`)."""
        unknown, dead, several = _UNKNOWN, _DEAD_END, _SEVERAL
        byte_class, nxt, push, columns = self.byte_class, self.nxt, self.push, self.columns
        dense, contexts, num_positions = self.dense, self.contexts, self.num_positions
        intern, successors, memo = self.intern, self.successors, self.memo
        width, class_list = self.width, self.class_list
        self.grow_table()
        table, table_returned = self.table, self.table_returned
        bc = byte_class[b]
        vals = table[e, bc].astype(np.int64)
        missing = vals == unknown
        if missing.any():
            keys = _unique(e[missing] * 256 + b[missing])
            # Vectorised: a byte that is read without a call (the context is kept), or rejected
            # (most pairs).
            me, mb = keys // 256, keys % 256
            ext_pos, _, _, _, ext_context = columns()
            pos = ext_pos[me]
            c = byte_class[mb]
            act = nxt[pos, c]
            plain = ((act > 0) & (push[pos, c, 0] == 0)) | (act == 0)
            table[me[plain & (act == 0)], c[plain & (act == 0)]] = dead
            reads = np.flatnonzero(plain & (act > 0))
            if reads.size:
                # the target keeps the source's context: one dense id array per context
                cts = ext_context[me[reads]]
                by_ct = np.argsort(cts, kind="stable")
                cuts = np.flatnonzero(np.diff(cts[by_ct])) + 1
                for rows in np.split(reads[by_ct], cuts):
                    ct = int(ext_context[me[rows[0]]])
                    context = contexts[ct]
                    ids = dense.get(ct)
                    if ids is None:
                        ids = dense[ct] = np.full(num_positions, -1, np.int64)
                    targets = act[rows]
                    for t in _unique(targets[ids[targets] < 0]).tolist():
                        ids[t] = intern((t, *context))
                    table[me[rows], c[rows]] = ids[targets]
            keys = keys[~plain]
            found, found_returned = [], []
            for key in keys.tolist():
                out, death, returned = successors(key // 256, key % 256)
                memo[key // 256 * width + class_list[key % 256]] = out, death, returned
                found.append(
                    out[0] if len(out) == 1 and not death else dead if not out else several
                )
                found_returned.append(returned)
            self.grow_table()
            table, table_returned = self.table, self.table_returned
            table[keys // 256, byte_class[keys % 256]] = found
            table_returned[keys // 256, byte_class[keys % 256]] = found_returned
            vals[missing] = table[e[missing], bc[missing]]
        return vals, table_returned[e, bc]

    @typing.no_type_check
    def intern_set(self, members) -> int:
        set_ids, sets = self.set_ids, self.sets
        key = tuple(members)
        if len(key) == 1:
            return key[0]
        i = set_ids.get(key)
        if i is None:
            i = set_ids[key] = len(sets)
            sets.append(np.asarray(key, np.int64))
        return -1 - i

    @typing.no_type_check
    def state_tables(self):
        """`(peak, cost)` per state `s` at index `s + len(sets)` (a set's: its members' most)."""
        columns, ext_info, sets = self.columns, self.ext_info, self.sets
        _, _, peak, cost, _ = columns()
        peak, cost = peak[: len(ext_info)], cost[: len(ext_info)]
        set_peak = [int(peak[m].max()) for m in reversed(sets)]
        set_cost = [int(cost[m].max()) for m in reversed(sets)]
        return (
            np.concatenate([np.asarray(set_peak, np.int64), peak]),
            np.concatenate([np.asarray(set_cost, np.int64), cost]),
        )

    @typing.no_type_check
    def advance(self, e, b):
        """The successor of each (state, byte) pair: `(state, gone, death, below)`, `state` an
        extended state or a set (`intern_set`), `gone` where every branch died, `death` where
        some branch died (the tokens below are not sure), `below` where the byte returned below
        the start."""
        dead, several = _DEAD_END, _SEVERAL
        lookup, intern_set, sets = self.lookup, self.intern_set, self.sets
        memo, width, class_list = self.memo, self.width, self.class_list
        single = e >= 0
        vals = np.full(e.size, dead, np.int64)
        below = np.zeros(e.size, bool)
        if single.all():
            vals, below = lookup(e, b)
        elif single.any():
            vals[single], below[single] = lookup(e[single], b[single])
        death = np.zeros(e.size, bool)
        gone = vals == dead
        odd = np.flatnonzero((vals == several) | ~single)
        if odd.size:
            # Sets, or states that branch: merged one by one (rare).
            for i in odd.tolist():
                members = [int(e[i])] if single[i] else sets[-1 - int(e[i])].tolist()
                out, die = set(), False
                mv, mb = lookup(np.asarray(members, np.int64), np.full(len(members), b[i]))
                below[i] = mb.any()
                for m, v in zip(members, mv.tolist()):
                    if v >= 0:
                        out.add(v)
                    elif v == dead:
                        die = True
                    else:
                        hit = memo[m * width + class_list[int(b[i])]]
                        out.update(hit[0])
                        die = die or hit[1]
                if out:
                    vals[i] = intern_set(sorted(out))
                    gone[i] = False
                    death[i] = die
                else:
                    gone[i] = True
        return vals, gone, death, below

    @typing.no_type_check
    def record_moves(self, origins, functions, peak, at, need, lo: int):
        """Keep, for `token_budget`, every (origin, state or set) that a token of the functions
        `need` reaches unpoisoned, with one such token and the state's peak (`moves`)."""
        ok = (functions != _GONE_ENTRY) & ((functions & 1) == 0)
        rows, columns = np.nonzero(ok)
        if not rows.size:
            return
        distinct, first_at = np.unique(at, return_index=True)
        token = self.trie.token_ids[lo + first_at[np.searchsorted(distinct, need)]]
        states = (functions[rows, columns] >> 1).astype(np.int64)
        origin = origins[columns].astype(np.int64)
        _, keep = np.unique((origin << 32) + (states + (1 << 31)), return_index=True)
        self.moves.append(
            (origin[keep], states[keep], token[rows[keep]], peak[rows, columns][keep])
        )

    @typing.no_type_check
    def walk(self, start, prune: bool):
        """`walk_checked` over the origins `start` in chunks of `_WALK_CHUNK`, merged: a token's
        code row is the concatenation of its rows in the chunks (one row per distinct
        combination of the chunks' rows, numbered in the order of their keys; the codes
        transposed, as `walk_once` gives them). Same results as one walk of every origin (the
        tests check the tables against `tests/structured/pda_reference.py`)."""
        walk_checked, trie = self.walk_checked, self.trie
        if start.size <= _WALK_CHUNK:
            return walk_checked(start, prune)
        parts = [
            walk_checked(start[i : i + _WALK_CHUNK], prune)
            for i in range(0, start.size, _WALK_CHUNK)
        ]
        combination = np.zeros(trie.token_ids.size, np.int64)
        for token_code, codes, _, _ in parts:
            key = combination * codes.shape[1] + token_code
            combination = np.unique(key, return_inverse=True)[1].reshape(-1)
        first = np.empty(int(combination.max(initial=-1)) + 1, np.int64)
        first[combination[::-1]] = np.arange(combination.size - 1, -1, -1)
        return (
            combination,
            np.concatenate([codes.take(code[first], 1) for code, codes, _, _ in parts]),
            np.concatenate([returned for _, _, returned, _ in parts]),
            np.concatenate([cost for _, _, _, cost in parts]),
        )

    @typing.no_type_check
    def walk_checked(self, start, prune: bool):
        """`walk_once` with `_ROW_WEIGHTS`, or, in the unlikely event of a hash collision,
        with other weights until none collides (the tables it filled stay valid)."""
        walk_once = self.walk_once
        rng = None
        weights = _ROW_WEIGHTS
        while True:
            try:
                return walk_once(start, prune, weights)
            except _HashCollision:
                rng = rng or np.random.default_rng(1)
                weights = rng.integers(1, 2**63, _ROW_WEIGHTS.size, dtype=np.uint64) | 1

    @typing.no_type_check
    def walk_once(self, start, prune: bool, weights):
        """Walk all origins (extended states `start`) over the trie together, as
        `byte_dfa._token_functions` does for a DFA: each trie node has a *function*, the state
        (or set) and poison flag of every origin after the node's bytes (one int32 per origin:
        `2 * state + poisoned`, or `gone_entry` where the walk died). Equal functions get one
        id, and the function after a byte class is computed once per (function, class): the
        step of every later node with that pair is a table lookup (`moves`), so the deep,
        narrow levels of the trie (long tokens inside strings, where one or two functions
        repeat) cost a lookup each. The ids hold while the origins walked (`cols`) stay the
        same; when origins are dropped (every function lost them, or they returned with
        `prune`) the functions are renumbered. Returns, per token of `trie.token_ids`, the id of
        its function's *code* row (per origin, the bitmask level of the token, `candidate` or
        `never`), the codes (transposed: origins x code rows), which origins returned below
        their start, and per origin the costliest bitmask token's cost. With `prune`, an origin
        is dropped (its codes left unspecified) once it returned."""
        gone_entry, never, candidate, several = _GONE_ENTRY, _NEVER, _CANDIDATE, _SEVERAL
        num_classes, num_nodes, trie = self.num_classes, self.num_nodes, self.trie
        level_ptr, parent, node_class = self.level_ptr, self.parent, self.node_class
        token_depth, token_node, class_byte = self.token_depth, self.token_node, self.class_byte
        ext_info, sets, steps = self.ext_info, self.sets, self.steps
        lookup, advance, state_tables = self.lookup, self.advance, self.state_tables
        m = start.size
        returned = np.zeros(m, bool)
        cost = np.zeros(m, np.int64)
        cols = np.arange(m)  # the origins of the functions' columns (the others are gone)
        # The functions of the current `cols`: `store[f]` the row of id `f`, `row_ids` its
        # bytes -> id, `moves[f, class]` the id after a byte of the class (-1: not yet), and
        # `coded[f]` the index of its code row (-1: not yet).
        store = (2 * start).astype(np.int32)[None, :]
        row_ids = {int(_row_hashes(store, weights)[0]): 0}
        moves = np.full((1, num_classes), -1, np.int64)
        coded = np.full(1, -1, np.int64)
        node_function = np.zeros(num_nodes, np.int64)
        token_code = np.full(trie.token_ids.size, -1, np.int64)
        code_rows = []
        num_codes = 0
        for depth in range(1, level_ptr.size - 1):
            a, b = int(level_ptr[depth]), int(level_ptr[depth + 1])
            if not cols.size:
                break
            key = node_function[parent[a:b]] * num_classes + node_class[a:b]
            result = moves.reshape(-1)[key]
            if (result < 0).any():
                pairs = _unique(key[result < 0])
                width = cols.size
                source = store[pairs // num_classes].reshape(-1)
                flat = np.flatnonzero(source != gone_entry)
                entry = source[flat]
                state = entry >> 1
                cls = (pairs % num_classes)[flat // width]  # no pairs x width temporary
                # `steps[state, class]`: 0 unknown, else `2 * (successor + 3) + returned`
                # (successor: an extended state, `dead` or `several`, as `lookup` gives)
                if len(ext_info) > steps.shape[0]:
                    grow = max(len(ext_info), 2 * steps.shape[0]) - steps.shape[0]
                    steps = np.concatenate([steps, np.zeros((grow, num_classes), np.int32)])
                    self.steps = steps
                single = state >= 0
                step_key = np.where(single, state, 0) * num_classes + cls
                step = steps.reshape(-1)[step_key]
                missing = single & (step == 0)
                if missing.any():
                    keys = _unique(step_key[missing])
                    vals, below = lookup(keys // num_classes, class_byte[keys % num_classes])
                    if len(ext_info) > steps.shape[0]:
                        grow = max(len(ext_info), 2 * steps.shape[0]) - steps.shape[0]
                        steps = np.concatenate([steps, np.zeros((grow, num_classes), np.int32)])
                        self.steps = steps
                    steps.reshape(-1)[keys] = 2 * (vals + 3) + below
                    step[missing] = steps.reshape(-1)[step_key[missing]]
                vals = (step >> 1) - 3
                below = single & ((step & 1) > 0)
                out = np.where(single & (vals >= 0), 2 * vals + (entry & 1), gone_entry)
                odd = np.flatnonzero((single & (vals == several)) | ~single)
                if odd.size:
                    # sets, or states that branch (rare)
                    o_vals, o_gone, o_death, o_below = advance(
                        state[odd].astype(np.int64), class_byte[cls[odd]]
                    )
                    below[odd] = o_below
                    o_poison = (entry[odd] & 1).astype(bool) | o_death
                    out[odd] = np.where(o_gone, gone_entry, 2 * o_vals + o_poison)
                if below.any():
                    returned[cols[flat[below] % width]] = True
                new = np.full((pairs.size, width), gone_entry, np.int32)
                new.reshape(-1)[flat] = out
                # one id per distinct row, by a hash of the row (checked exactly below)
                first, inverse, hashes = _hashed_rows(new, weights)
                distinct_ids = np.empty(first.size, np.int64)
                fresh = []
                for u, h in enumerate(hashes.tolist()):
                    j = row_ids.setdefault(h, len(row_ids))
                    if j == store.shape[0] + len(fresh):
                        fresh.append(int(first[u]))
                    distinct_ids[u] = j
                old = distinct_ids < store.shape[0]
                if not np.array_equal(store[distinct_ids[old]], new[first[old]]):
                    raise _HashCollision
                ids = distinct_ids[inverse]
                if fresh:
                    store = np.concatenate([store, new[fresh]])
                    moves = np.concatenate([moves, np.full((len(fresh), num_classes), -1)])
                    coded = np.concatenate([coded, np.full(len(fresh), -1)])
                moves.reshape(-1)[pairs] = ids
                result = moves.reshape(-1)[key]
            # origins gone in every function of this depth stay gone, and with `prune` those
            # that returned are done: their columns are dropped and the functions renumbered
            funcs = _unique(result)
            live_cols = (store[funcs] != gone_entry).any(axis=0)
            if prune:
                live_cols &= ~returned[cols]
            if live_cols.all():
                node_function[a:b] = result
            else:
                cols = cols[live_cols]
                kept = store[funcs][:, live_cols]
                # one id per distinct row, by their hashes (checked exactly), as above
                first, number, hashes = _hashed_rows(kept, weights)
                store = kept[first]
                row_ids = dict(zip(hashes.tolist(), range(store.shape[0])))
                moves = np.full((len(first), num_classes), -1, np.int64)
                coded = np.full(len(first), -1, np.int64)
                node_function[a:b] = number[np.searchsorted(funcs, result)]
            # codes of the functions of this depth's tokens (once per function)
            lo, hi = np.searchsorted(token_depth, [depth, depth + 1])
            if hi > lo:
                at = node_function[token_node[lo:hi]]
                need = _unique(at)
                need = need[coded[need] < 0]
                if need.size:
                    f = store[need]
                    live = f != gone_entry
                    state_peak, state_cost = state_tables()
                    index = np.where(live, f >> 1, 0) + len(sets)
                    peak, c = state_peak[index], state_cost[index]
                    sure = live & ((f & 1) == 0) & (peak < MAX_LEVELS)
                    code = np.full((need.size, m), never, np.uint8)
                    code[:, cols] = np.where(sure, peak, np.where(live, candidate, never))
                    if cols.size:
                        cost[cols] = np.maximum(cost[cols], np.where(sure, c, 0).max(axis=0))
                    code_rows.append(code)
                    self.record_moves(start[cols], f, peak, at, need, lo)
                    coded[need] = num_codes + np.arange(need.size)
                    num_codes += need.size
                token_code[lo:hi] = coded[at]
        codes = np.concatenate(code_rows) if code_rows else np.zeros((0, m), np.uint8)
        # tokens never reached (their walk died above them): `never`
        codes = np.concatenate([codes, np.full((1, m), never, np.uint8)])
        token_code[token_code < 0] = codes.shape[0] - 1
        return token_code, np.ascontiguousarray(codes.T), returned, cost
