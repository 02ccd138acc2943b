"""The token tables of a pushdown automaton (step 3 of `functional_gen.structured.pushdown`):
every token walked from every (position, top of stack) over the vocabulary's trie
(`token_walk.TokenWalk`), into bitmask rows, candidate lists and budget costs
(`token_tables`), with the move records of the walk (`TokenMoves`) for the budget.
"""

import dataclasses

import numpy as np

from ..buckets import bucket
from ..byte_dfa import ragged_rows
from ..vocabulary import TokenVocabulary
from ..vocabulary_tables import cached_tables
from .automaton import MAX_CANDIDATE_TABLE, MAX_LEVELS, TooManyCandidates
from .token_walk import _CANDIDATE, _NEVER, TokenWalk

_BYTE_MATRICES: dict = {}


def token_byte_matrix(vocabulary: TokenVocabulary):
    """`(matrix, lengths)`: each token's bytes, `UInt8[np.ndarray, "vocab max_bytes"]` padded
    with 0, and `Int32[np.ndarray, " vocab"]` their lengths (0: not text). Memoised per
    vocabulary fingerprint (the last 4 vocabularies) and on disk
    (`vocabulary_tables.cached_tables`), read-only: every automaton of a vocabulary shares them
    (20-60 ms to build for SmolLM2's 49,152 tokens in a fresh process)."""
    hit = _BYTE_MATRICES.get(vocabulary.fingerprint)
    if hit is None:
        arrays = cached_tables(
            "bytes",
            vocabulary,
            ("matrix", "lengths"),
            lambda: _token_byte_matrix_uncached(vocabulary),
        )
        hit = (arrays["matrix"], arrays["lengths"])
        for array in hit:
            array.setflags(write=False)
        if len(_BYTE_MATRICES) >= 4:
            _BYTE_MATRICES.pop(next(iter(_BYTE_MATRICES)))
        _BYTE_MATRICES[vocabulary.fingerprint] = hit
    return hit


def _token_byte_matrix_uncached(vocabulary: TokenVocabulary):
    lengths = vocabulary.token_length.astype(np.int32)
    width = int(lengths.max(initial=1))
    matrix = np.zeros((vocabulary.vocab_size, width), np.uint8)
    ids = np.flatnonzero(lengths)
    flat = np.frombuffer(b"".join(vocabulary.token_bytes[i] for i in ids), np.uint8)
    rows = np.repeat(ids, lengths[ids])
    cols = np.arange(flat.size) - np.repeat(np.cumsum(lengths[ids]) - lengths[ids], lengths[ids])
    matrix[rows, cols] = flat
    return {"matrix": matrix, "lengths": lengths}


def _distinct_rows(rows) -> tuple[list[int], np.ndarray]:
    """`(first, inverse)` for a 2-D array: the index of each distinct row's first occurrence, in
    order of appearance, and each row's number among them (by hashing the rows' bytes)."""
    rows = np.ascontiguousarray(rows)
    ids: dict = {}
    first: list[int] = []
    inverse = np.empty(rows.shape[0], np.int64)
    for i, row in enumerate(rows):
        j = ids.setdefault(row.tobytes(), len(first))
        if j == len(first):
            first.append(i)
        inverse[i] = j
    return first, inverse


def unique_rows(rows):
    """`np.unique(rows, axis=0, return_inverse=True)` for a 2-D integer array (the distinct rows
    in lexicographic order, and each row's index among them; the inverse 1-D), by hashing the
    rows' bytes and sorting only the distinct ones: numpy sorts every row as a structured
    record (50 ms for 2,757 rows of 256 int32, 2 ms this way)."""
    rows = np.ascontiguousarray(rows)
    first, inverse = _distinct_rows(rows)
    distinct = rows[first]
    order = np.lexsort(distinct.T[::-1]) if distinct.shape[1] else np.arange(len(first))
    rank = np.empty(len(first), np.int64)
    rank[order] = np.arange(len(first))
    return distinct[order], rank[inverse]


@dataclasses.dataclass(frozen=True, eq=False)
class TokenMoves:
    """What the token walk of `token_walk.TokenWalk` saw, for `budget.token_budget`: every (origin,
    state) pair that some token reaches from the origin without a branch dying (`origin`,
    `state`, `token` (one such token) and `peak` (the state's, or a set's most), `Int[np.ndarray,
    " moves"]` each); the extended states `ext_info` (`(position, pushed, below, peak, top)`
    per id) and the sets `sets` (a state `s < 0` is the set `sets[-1 - s]`); and per (position,
    slot) pair with a walk, its `pair_position`, `pair_slot` and walk origin `pair_origin`."""

    origin: np.ndarray
    state: np.ndarray
    token: np.ndarray
    peak: np.ndarray
    ext_info: list
    sets: list
    pair_position: np.ndarray
    pair_slot: np.ndarray
    pair_origin: np.ndarray


def _tables(walker: TokenWalk):
    """Walk the tokens with `walker` (pass 1 per position, pass 2 per slot of the positions that
    return) and build the tables. **Returns:** `(masks, mask_row, candidates, candidate_bytes,
    budget_cost, moves)`, as `token_tables`."""
    num_positions, num_slots, vocab = walker.num_positions, walker.num_slots, walker.vocab
    trie, position_slots, vocabulary = walker.trie, walker.position_slots, walker.vocabulary
    walk, intern = walker.walk, walker.intern
    never, candidate = _NEVER, _CANDIDATE
    # Pass 1: each position, whatever is on the stack. Tokens from a position that never
    # returns below its rule do not depend on the stack: their result holds for every slot.
    positions = np.arange(1, num_positions)
    first_ids = np.asarray([intern((p, (), 0, 0, None)) for p in positions.tolist()], np.int64)
    code1, codes1, returned, cost1 = walk(first_ids, prune=True)
    # Pass 2: the positions that do return, once per slot (the top of the stack known). The
    # (position, slot) pairs as arrays, position by position (a list of tuples took 0.7 s for
    # 500,000 pairs: MaskBench o65002, 6,802 positions x 73 slots).
    counts = np.asarray([len(position_slots[p]) for p in range(num_positions)], np.int64)
    counts[0] = 0
    origin_position = np.repeat(np.arange(num_positions, dtype=np.int64), counts)
    origin_slot = np.arange(origin_position.size) - np.repeat(np.cumsum(counts) - counts, counts)
    again = np.flatnonzero(returned[origin_position - 1])
    again_ids = np.asarray(
        [
            intern((p, (), 0, 0, site))
            for p in (1 + np.flatnonzero(returned)).tolist()
            for site in position_slots[p]
        ],
        np.int64,
    )
    code2, codes2, _, cost2 = walk(again_ids, prune=False)
    # Sources: the pass-1 positions that never returned (shared by their slots), then the
    # pass-2 origins. A token's code row is the pair of its rows in the two passes.
    kept = np.flatnonzero(~returned)
    first_source = np.full(positions.size, -1, np.int64)
    first_source[kept] = np.arange(kept.size)
    source_of = np.empty(origin_position.size, np.int64)
    fixed = ~returned[origin_position - 1]
    source_of[fixed] = first_source[origin_position[fixed] - 1]
    source_of[again] = kept.size + np.arange(again.size)
    pair_key = code1 * codes2.shape[1] + code2
    if codes1.shape[1] * codes2.shape[1] <= 8 * pair_key.size:  # a presence table, no sort
        seen = np.zeros(codes1.shape[1] * codes2.shape[1], bool)
        seen[pair_key] = True
        used = np.flatnonzero(seen)
        token_row = (np.cumsum(seen) - 1)[pair_key]
    else:
        used, token_row = np.unique(pair_key, return_inverse=True)
        token_row = token_row.reshape(-1)
    row1, row2 = used // codes2.shape[1], used % codes2.shape[1]
    source_cost = np.concatenate([cost1[kept], cost2])
    # Classes: sources with the same codes for every token row. Within a pass, the sources
    # with equal columns of its codes (every code row of a pass is some token's, so equal
    # there is equal on the token rows); then the passes' classes, as columns over the token
    # rows, merged. Numbered by first source as a single pass over all sources would (without
    # the token rows x sources matrix: 5,193 x 14,772 bytes, 1.1 s, for MaskBench o48425).
    first1, of1 = _distinct_rows(codes1[kept])  # codes1, codes2: sources x code rows
    first2, of2 = _distinct_rows(codes2)
    class_columns = np.concatenate(
        [codes1[kept[first1]][:, row1], codes2[first2][:, row2]]
    )  # rows: the passes' classes; columns: token rows
    class_first, merged = _distinct_rows(class_columns)
    class_of = np.concatenate([merged[of1], merged[len(first1) + of2]])
    num_classes_t = len(class_first)
    class_codes = class_columns[class_first].T  # rows: token rows, columns: classes
    sure_levels = class_codes[class_codes < MAX_LEVELS]
    levels = max(1, int(sure_levels.max()) + 1 if sure_levels.size else 1)
    budget_cost = np.zeros((num_positions, num_slots), np.int32)
    budget_cost[origin_position, origin_slot] = source_cost[source_of]
    # The bitmask row of (class, level): the tokens whose code is <= level. Distinct rows are
    # found over the token rows, then each is spread over the vocabulary once.
    words = (vocab + 31) // 32
    row_ids: dict = {}
    row_spec = []  # (class, level) of each distinct row
    class_rows = np.empty((num_classes_t, levels), np.int64)
    for level in range(levels):
        packed_rows = np.packbits(np.less_equal(class_codes.T, level), axis=1)
        for c, r in enumerate(packed_rows):
            j = row_ids.setdefault(r.tobytes(), len(row_spec))
            if j == len(row_spec):
                row_spec.append((c, level))
            class_rows[c, level] = j
    vocab_row = np.full(words * 32, used.size, np.int64)  # non-trie tokens: never
    vocab_row[trie.token_ids] = token_row
    spec_class = np.array([c for c, _ in row_spec], np.int64)
    spec_level = np.array([lv for _, lv in row_spec], np.uint8)
    padded = np.concatenate([class_codes, np.full((1, num_classes_t), never, np.uint8)])
    row_bits = padded.T[spec_class] <= spec_level[:, None]  # per distinct row and token row
    # Bit k of byte j of a row is token 8j + k: eight gathers of whole token rows (one byte
    # per distinct row each), shifted into place; 1.4x faster than a gather of every bit.
    packed = np.zeros((len(row_spec), words * 4), np.uint8)
    token_bytes = vocab_row.reshape(-1, 8)
    chunk = max(1, (1 << 23) // (words * 4))
    for start in range(0, len(row_spec), chunk):
        by_token_row = np.ascontiguousarray(row_bits[start : start + chunk].T, np.uint8)
        acc = by_token_row[token_bytes[:, 0]]
        for k in range(1, 8):
            acc |= by_token_row[token_bytes[:, k]] << k
        packed[start : start + chunk] = acc.T
    packed = packed.view(np.uint32)
    masks, order_rows = unique_rows(packed.reshape(-1, words))
    rows = order_rows.reshape(-1)[class_rows][class_of[source_of]]
    empty = np.flatnonzero(~masks.any(axis=1))
    mask_row = np.full((num_positions, num_slots, levels), empty[0] if empty.size else 0, np.int64)
    if not empty.size:  # no all-zero row yet: add one for the dead position and unused slots
        masks = np.concatenate([masks, np.zeros((1, words), masks.dtype)])
        mask_row[:] = masks.shape[0] - 1
    mask_row[origin_position, origin_slot] = rows

    # Candidates: per class in the walk's order (depth, trie node), i.e. of `trie.token_ids`.
    by_row = np.argsort(token_row, kind="stable")
    row_ptr = np.searchsorted(token_row[by_row], np.arange(used.size + 1))
    cand_row, cand_class = np.nonzero(class_codes == candidate)
    held, k = ragged_rows(row_ptr, cand_row)
    cand_class, cand_order = cand_class[held], by_row[k]
    order = np.lexsort((cand_order, cand_class))
    cand_class, cand_token = (
        cand_class[order],
        trie.token_ids[cand_order[order]].astype(np.int32),
    )
    per_class = np.bincount(cand_class, minlength=num_classes_t)
    width = bucket(int(per_class.max(initial=0)), 8)
    if num_positions * num_slots * width * 4 > MAX_CANDIDATE_TABLE:
        most = int(per_class.max(initial=0))
        raise TooManyCandidates(num_positions, num_slots, width, most, MAX_CANDIDATE_TABLE)
    class_candidates = np.full((num_classes_t, width), vocab, np.int32)
    slot = np.arange(cand_class.size) - (np.cumsum(per_class) - per_class)[cand_class]
    class_candidates[cand_class, slot] = cand_token
    candidates = np.full((num_positions, num_slots, width), vocab, np.int32)
    candidates[origin_position, origin_slot] = class_candidates[class_of[source_of]]
    lengths = vocabulary.token_length
    candidate_bytes = int(lengths[cand_token].max(initial=1))
    # The walk's origin of each (position, slot): pass 2's where the position returns.
    pair_origin = first_ids[origin_position - 1]
    pair_origin[again] = again_ids
    found = [np.concatenate(part) for part in zip(*walker.moves)] if walker.moves else None
    found = found or [np.zeros(0, np.int64)] * 4
    moves = TokenMoves(
        origin=found[0],
        state=found[1],
        token=found[2],
        peak=found[3],
        ext_info=walker.ext_info,
        sets=walker.sets,
        pair_position=origin_position,
        pair_slot=origin_slot,
        pair_origin=pair_origin,
    )
    return (
        np.ascontiguousarray(masks.astype(np.uint32)),
        mask_row.astype(np.int32),
        candidates,
        candidate_bytes,
        budget_cost,
        moves,
    )


def token_tables(
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
    """Walk every token from every (position, top of stack) over the vocabulary's trie (see the
    module docstring, step 3). Returns `(masks, mask_row, candidates, candidate_bytes,
    budget_cost, moves)`, `moves` a `TokenMoves` (the token-level moves for the budget).

    The origins of a pass are walked together (in chunks of `token_walk._WALK_CHUNK`), as
    `byte_dfa._token_functions` walks a DFA: each trie node has a *function*, the state (an
    extended state, or a *set* of them where an origin's walk branched) and poison flag of
    every origin after the node's bytes, computed from its parent's function and its byte
    class; nodes with the same (parent function, byte class) share the step and equal
    functions get one id, so the work is per distinct function and origin, not per (trie node,
    state). Each token then has a *code* per origin (its bitmask level, candidate, or never)
    from its node's function; sources with the same codes are one *class*, and the bitmask rows
    and candidate lists are built per class. The result is identical to the per-origin walk
    (`tests/structured/pda_reference.py`, the oracle of the tests).

    **Raises:** `TooManyCandidates` when the `candidates` table (positions x slots x the most
    candidates of a (position, slot), padded, int32) would exceed `MAX_CANDIDATE_TABLE` bytes,
    before it is allocated."""
    walker = TokenWalk(
        nxt,
        push,
        byte_class,
        position_sites,
        position_slots,
        vocabulary,
        stack_depth,
        distance,
        min_room,
    )
    return _tables(walker)
