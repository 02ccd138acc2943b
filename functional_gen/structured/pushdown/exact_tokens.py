"""The tokens a pushdown automaton's device step walks exactly beside its bitmask rows (part of
step 3 of `functional_gen.structured.pushdown`, for `building.build_pushdown`): those that may
reach a fork (`fork_tables`: the parallel stacks), those that may meet a member-set register's
`reg_require` (`register_token_tables`), and the per-token character counts of counter rules
(`counter_tables`), each with the per-position reach that says from where.
"""

import typing

import numpy as np

from ..buckets import bucket
from ..byte_dfa import ragged_rows, token_trie, trie_levels
from ..vocabulary import TokenVocabulary
from .automaton import BOTTOM, FORK, POP, UNREACHABLE
from .token_tables import token_byte_matrix

# Nested helpers that run per byte, state or trie node are `@typing.no_type_check`, as in
# `building`: the tests' jaxtyping import hook would wrap every call of them.


def fork_tables(fork_ways: list, nxt, byte_class, position_sites, vocabulary: TokenVocabulary):
    """`(fork_next, fork_push, fork_tokens, fork_bytes, fork_reach)` of `PushdownAutomaton`
    from the ways of each fork (`(pushed, target)` each, target `POP` for "return and read the
    byte below"): targets and pushes 0-padded, the tokens whose bytes may reach a fork
    (`_fork_tokens`, padded with `vocab_size`), the longest of them in
    bytes, and per position the packed bits of the fork tokens that may reach a fork from it
    (bit `j % 32` of word `j // 32`: `fork_tokens[j]`). Empty (`(0, 1)`, `(0, 1, 1)`, `(0,)`,
    0, `(positions, 0)`) without forks."""
    ways = max((len(w) for w in fork_ways), default=1)
    width = max((len(p) for w in fork_ways for p, _ in w), default=1)
    fork_next = np.zeros((len(fork_ways), ways), np.int32)
    fork_push = np.zeros((len(fork_ways), ways, max(width, 1)), np.int32)
    for f, options in enumerate(fork_ways):
        for k, (pushed, target) in enumerate(options):
            fork_next[f, k] = target
            fork_push[f, k, : len(pushed)] = pushed
    if not fork_ways:
        no_reach = np.zeros((nxt.shape[0], 0), np.uint32)
        return fork_next, fork_push, np.zeros(0, np.int32), 0, no_reach
    tokens, reach = _fork_tokens(nxt, fork_next, byte_class, position_sites, vocabulary)
    return fork_next, fork_push, *_packed_reach(tokens, reach, vocabulary)


def _packed_reach(tokens, reach, vocabulary: TokenVocabulary):
    """`(padded, longest, packed)` of `_fork_tokens`' `(tokens, reach)`: the tokens padded with
    `vocab_size` to a bucket of 8, the longest in bytes, and per position the packed bits of
    those it reaches (bit `j % 32` of word `j // 32`: `padded[j]`)."""
    longest = int(vocabulary.token_length[tokens].max(initial=1))
    padded = np.full(bucket(tokens.size, 8), vocabulary.vocab_size, np.int32)
    padded[: tokens.size] = tokens
    bits = np.zeros((reach.shape[0], -(-padded.size // 32) * 32), bool)
    bits[:, : tokens.size] = reach
    packed = np.packbits(bits, axis=1, bitorder="little").view(np.uint32)
    return padded, longest, np.ascontiguousarray(packed)


def register_token_tables(
    tables: dict, nxt, byte_class, position_sites, vocabulary: TokenVocabulary
):
    """`register_tokens`, `register_bytes`, `register_reach` of `PushdownAutomaton`: the tokens
    whose walk may meet the register action that can refuse (`reg_require`) and still
    be alive after their last byte, from some configuration, and per position (packed, as
    `_packed_reach`) those that may from it. Over any stack (a return may go to any return site
    of the rule): a superset, checked exactly on the device with the register."""
    hits = tables["reg_require"] > 0
    tokens, reach = _fork_tokens(
        nxt, np.zeros((0, 1), np.int32), byte_class, position_sites, vocabulary, hits=hits
    )
    names = ("register_tokens", "register_bytes", "register_reach")
    return dict(zip(names, _packed_reach(tokens, reach, vocabulary)))


def counter_tables(tables: dict, nxt, push, position_rule, byte_class, vocabulary) -> dict:
    """`counter_row`, `counter_limit`, `counted` of `PushdownAutomaton` for the counter rules
    (rules with a `reg_limit`, `json_schema.counter_strings`; `{}` without one): per position of
    such a rule where the register may be over 0 (`_counted_positions`) its row (`-1`
    elsewhere), per row its rule's limit, and per row and token the
    characters the token writes from that position before it leaves the rule (its bytes read
    by the rule itself, no call nor return; `Int16`). A token that enters a counter rule from
    outside writes fewer characters than its bytes, so none exceeds the limit when no token is
    longer than it: refused otherwise (`ValueError`)."""
    limit = tables["reg_limit"]
    if not (limit > 0).any():
        return {}
    rules = np.unique(position_rule[np.flatnonzero((limit > 0).any(axis=1))])
    positions = _counted_positions(limit, nxt, push, position_rule)
    row_of = np.full(nxt.shape[0], -1, np.int32)
    row_of[positions] = np.arange(positions.size)
    rule_limit = {int(r): int(limit[position_rule == r].max()) for r in rules}
    counter_limit = np.asarray([rule_limit[int(r)] for r in position_rule[positions]], np.int32)
    token_bytes, token_length = token_byte_matrix(vocabulary)
    if int(token_length.max(initial=0)) > int(counter_limit.min()):
        raise ValueError(
            f"a counter string of at most {int(counter_limit.min())} characters with tokens of "
            f"up to {int(token_length.max())} bytes: a token entering it could pass the limit"
        )
    classes = byte_class[token_bytes]  # [vocab, max_bytes]
    counted = np.zeros((positions.size, token_length.size), np.int16)
    for row, start in enumerate(positions):
        pos = np.full(token_length.size, start, np.int64)
        alive = np.ones(token_length.size, bool)
        for j in range(classes.shape[1]):
            c = classes[:, j]
            target = nxt[pos, c]
            alive &= (j < token_length) & (target > 0) & (push[pos, c, 0] == 0)
            alive &= position_rule[np.maximum(target, 0)] == position_rule[start]
            counted[row] += alive & (limit[pos, c] > 0)
            pos = np.where(alive, target, pos)
    return {"counter_row": row_of, "counter_limit": counter_limit, "counted": counted}


def _counted_positions(limit, nxt, push, position_rule) -> np.ndarray:
    """The positions of counter rules where the register may be over 0 (ascending): those with
    a counting transition and every position their rule reaches after one (its bytes, no call
    nor return). Before the first counted character (the opening `"`, a `minLength` chain of
    `counter_string_dfa`) the register is 0, and a token writes fewer characters than the
    limit (`counter_tables` checks that), so those positions need no row."""
    seen = np.zeros(nxt.shape[0], bool)
    sources, classes = np.nonzero(limit > 0)
    frontier = np.unique(np.concatenate([sources, nxt[sources, classes]]))
    while frontier.size:
        frontier = frontier[(frontier > 0) & ~seen[frontier]]
        seen[frontier] = True
        rule = position_rule[frontier][:, None]
        after = nxt[frontier]
        inside = (after > 0) & (push[frontier, :, 0] == 0)
        inside &= position_rule[np.maximum(after, 0)] == rule
        frontier = np.unique(after[inside])
    return np.flatnonzero(seen)


_REACH_CHUNK = 1024
"""Positions walked together by `_fork_tokens` for `fork_reach`."""

_WIDE_STEP = 64
"""Sets of more positions than this are stepped by `_fork_tokens` with numpy (with `hits`)."""


def _fork_tokens(
    nxt, fork_next, byte_class, position_sites, vocabulary: TokenVocabulary, hits=None
):
    """`(tokens, reach)`: the tokens whose bytes may reach a fork from some configuration
    (`Int32[np.ndarray, " tokens"]`, ascending), and per position which of them may reach a
    fork from it (`Bool[np.ndarray, "positions tokens"]`, position 0 none).

    With `hits` (`Bool[np.ndarray, "positions classes"]`, a grammar without forks): the same
    for the bytes `hits` marks (`register_token_tables`: the register actions) instead of forks,
    and only tokens whose walk is still alive after their last byte; the trie is walked only
    where a hit may still come (`_hit_distances`, `_hit_depths`), the sets of more than
    `_WIDE_STEP` positions stepped with numpy, and `reach` only from the positions within the
    longest of `tokens` of a hit (the same result: MaskBench o6090's 0.7 s became 0.1 s).

    A walk of the vocabulary's trie over *sets* of positions, from every position at once for
    `tokens`, then from each position alone over the trie nodes of `tokens` for `reach`; a
    return may go to any return site of the rule (a superset of what a stack holds) and a fork
    follows all its ways. Every other token reads its bytes in one way from any configuration,
    and a token outside `reach[p]` in one way from any configuration at position `p`, so the
    deterministic tables give its mask there exactly."""
    trie = token_trie(vocabulary)
    nxt_list, class_list = nxt.tolist(), byte_class.tolist()
    fork_list = fork_next.tolist()
    set_ids: dict = {}
    sets: list = []

    @typing.no_type_check
    def intern(members) -> int:
        key = frozenset(members)
        i = set_ids.get(key)
        if i is None:
            i = set_ids[key] = len(sets)
            sets.append(key)
        return i

    memo: dict = {}

    hit_list = hits.tolist() if hits is not None else None

    @typing.no_type_check
    def step(sid: int, c: int):
        out, hit, seen = set(), False, set(sets[sid])
        work = list(seen)
        while work:
            p = work.pop()
            act = nxt_list[p][c]
            targets = [act]
            if hit_list is not None:
                hit = hit or (act > 0 and hit_list[p][c])
            elif act <= FORK:
                hit, targets = True, fork_list[FORK - act]
            for t in targets:
                if t > 0:
                    out.add(t)
                elif t == POP:
                    for site in position_sites[p]:
                        if site != BOTTOM and site not in seen:
                            seen.add(site)
                            work.append(site)
        return intern(out), hit

    if hits is not None:  # `step` over large sets, with numpy (the root's set is every position)
        by_class = np.ascontiguousarray(nxt.T)
        hit_by_class = np.ascontiguousarray(hits.T) & (by_class > 0)
        site_ids: dict = {}
        site_key = np.asarray([site_ids.setdefault(s, len(site_ids)) for s in position_sites])
        site_rows = [np.asarray([v for v in s if v != BOTTOM], np.int64) for s in site_ids]

    @typing.no_type_check
    def step_wide(sid: int, c: int):
        work = np.fromiter(sets[sid], np.int64, len(sets[sid]))
        seen = np.zeros(nxt.shape[0], bool)
        seen[work] = True
        reads, hit = [], False
        while work.size:
            act = by_class[c, work]
            hit = hit or bool(hit_by_class[c, work].any())
            reads.append(act[act > 0])
            popped = np.unique(site_key[work[act == POP]])
            sites = np.unique(np.concatenate([site_rows[k] for k in popped.tolist()] or [work[:0]]))
            work = sites[~seen[sites]]
            seen[work] = True
        return intern(np.unique(np.concatenate(reads)).tolist()), hit

    @typing.no_type_check
    def stepped(key):
        hit = memo.get(key)
        if hit is None:
            wide = hits is not None and len(sets[key[0]]) > _WIDE_STEP
            hit = memo[key] = step_wide(*key) if wide else step(*key)
        return hit

    parent, level_ptr, token_node = trie_levels(trie)
    node_byte = trie.byte.tolist()
    sets_of = [0] * trie.num_nodes
    forked_list = [False] * trie.num_nodes
    sets_of[0] = intern(range(1, nxt.shape[0]))
    parent_list = parent.tolist()
    # With `hits`, a node's children are walked only while a hit may still come below it: the
    # walk has hit already (its tokens' liveness is still needed), or a position of its set lies
    # within `below[n] - 1` bytes of a hit (`_hit_distances`, a lower bound), `below[n]` the
    # deepest node under `n` whose byte is of a hit class (`_hit_depths`). Every node left out
    # has no hit (`forked` false), so the tokens are those of the full walk.
    if hits is not None:
        cap = max(level_ptr.size - 3, 0)  # the deepest token, less one byte
        distance = _hit_distances(nxt, hits, position_sites, cap)
        distance_list = distance.tolist()
        below = _hit_depths(trie, parent, level_ptr, hits.any(axis=0)[byte_class]).tolist()
        nearest: dict = {}
        empty = intern(())
    opened = [True] * trie.num_nodes
    for n in range(1, trie.num_nodes):
        up = parent_list[n]
        if not opened[up]:
            opened[n] = False
            sets_of[n] = empty
            continue
        hit = stepped((sets_of[up], class_list[node_byte[n]]))
        sets_of[n] = hit[0]
        forked_list[n] = forked_list[up] or hit[1]
        if hits is not None and not forked_list[n]:
            near = nearest.get(hit[0])
            if near is None:
                near = nearest[hit[0]] = min(
                    (distance_list[p] for p in sets[hit[0]]), default=UNREACHABLE
                )
            opened[n] = near <= below[n] - 1
    forked = np.asarray(forked_list, bool)
    if hits is not None:  # alive after the last byte
        forked &= np.asarray([len(sets[i]) > 0 for i in sets_of], bool)
    order = np.argsort(trie.token_ids[forked[token_node]], kind="stable")
    tokens = trie.token_ids[forked[token_node]][order].astype(np.int32)
    nodes = token_node[forked[token_node]][order]

    # Per position: the same walk from {position} over the nodes of `tokens` and their
    # ancestors (a fork reached from one position is reached from all of them together, so no
    # other node matters): a row of origins per node, one depth at a time (nodes are numbered
    # depth by depth), one step per distinct (set, class) of the depth; origins in chunks of
    # `_REACH_CHUNK`, so that a depth's rows stay small.
    needed = np.zeros(trie.num_nodes, bool)
    frontier = np.unique(nodes)
    while frontier.size:
        frontier = frontier[~needed[frontier]]
        needed[frontier] = True
        frontier = np.unique(parent[frontier[frontier > 0]])
    kept = np.flatnonzero(needed)
    depth_of = np.searchsorted(level_ptr, kept, side="right") - 1
    levels = [kept[depth_of == d] for d in range(1, int(depth_of.max(initial=0)) + 1)]
    token_depth = np.searchsorted(level_ptr, nodes, side="right") - 1
    num_classes = int(byte_class.max()) + 1
    # With `hits`, only the positions within the longest token's length (less one) of a hit can
    # meet one: every other row stays false.
    starts = np.arange(1, nxt.shape[0])
    if hits is not None:
        longest = int(vocabulary.token_length[tokens].max(initial=0))
        starts = starts[distance[starts] <= longest - 1]
    origins = np.asarray([intern((p,)) for p in starts.tolist()], np.int64)
    reach = np.zeros((nxt.shape[0], tokens.size), bool)
    for lo in range(0, origins.size, _REACH_CHUNK):
        walked = origins[None, lo : lo + _REACH_CHUNK]  # the root's row
        rows_of = starts[lo : lo + _REACH_CHUNK]
        hit_rows = np.zeros(walked.shape, bool)
        above = np.zeros(1, np.int64)
        for depth, level in enumerate(levels, 1):
            up = np.searchsorted(above, parent[level])
            keys = walked[up] * num_classes + byte_class[trie.byte[level]][:, None]
            distinct, inverse = np.unique(keys, return_inverse=True)
            results = [stepped(divmod(k, num_classes)) for k in distinct.tolist()]
            inverse = inverse.reshape(keys.shape)
            walked = np.asarray([r[0] for r in results], np.int64)[inverse]
            hit_rows = hit_rows[up] | np.asarray([r[1] for r in results], bool)[inverse]
            above = level
            here = np.flatnonzero(token_depth == depth)
            rows = np.searchsorted(level, nodes[here])
            reached = hit_rows[rows]
            if hits is not None:  # alive after the last byte
                reached = reached & (np.asarray([len(m) for m in sets])[walked[rows]] > 0)
            reach[np.ix_(rows_of, here)] = reached.T
    return tokens, reach


def _hit_distances(nxt, hits, position_sites, cap: int) -> np.ndarray:
    """Per position, a lower bound on the bytes read before one meets a `hits` (position, class)
    from it (`_fork_tokens`' walk: 0 where the position itself may read a hit byte): the
    fewest byte moves over every byte class to a position with a hit, a return (`POP`) moving
    at no cost to any return site of the rule. `Int32[np.ndarray, " positions"]`, `cap + 1`
    where more than `cap` (or none); `hits`: `Bool[np.ndarray, "positions classes"]`,
    `position_sites` as `build_pushdown`'s."""
    num_positions = nxt.shape[0]
    far = cap + 1
    source, cls = np.nonzero(nxt > 0)
    target = nxt[source, cls]
    order = np.argsort(target, kind="stable")
    before = source[order]  # the positions that move to each target, CSR by target
    before_ptr = np.searchsorted(target[order], np.arange(num_positions + 1))
    groups: dict = {}  # return sites -> the positions that may return to them
    for p in np.flatnonzero((nxt == POP).any(axis=1)).tolist():
        groups.setdefault(position_sites[p], []).append(p)
    returns = [
        (np.asarray([s for s in sites if s != BOTTOM], np.int64), np.asarray(members, np.int64))
        for sites, members in groups.items()
        if any(s != BOTTOM for s in sites)
    ]
    distance = np.full(num_positions, far, np.int32)
    level = np.flatnonzero((hits & (nxt > 0)).any(axis=1))
    for d in range(far):
        if not level.size:
            break
        distance[level] = d
        grown = True
        while grown:  # returns cost nothing: their positions join this level
            grown = False
            for sites, members in returns:
                if (distance[sites] <= d).any():
                    new = members[distance[members] > d]
                    if new.size:
                        distance[new] = d
                        level = np.concatenate([level, new])
                        grown = True
        previous = before[ragged_rows(before_ptr, level)[1]]
        level = np.unique(previous[distance[previous] == far])
    return distance


def _hit_depths(trie, parent, level_ptr, hit_byte) -> np.ndarray:
    """Per trie node, the depth below it of its deepest descendant whose byte `hit_byte` marks
    (`Bool[np.ndarray, " 256"]`); 0 where none. `Int64[np.ndarray, " nodes"]`."""
    below = np.zeros(trie.num_nodes, np.int64)
    marked = hit_byte[trie.byte]
    for d in range(len(level_ptr) - 2, 0, -1):  # deepest level first
        level = np.arange(level_ptr[d], level_ptr[d + 1])
        value = np.where(below[level] > 0, below[level] + 1, np.where(marked[level], 1, 0))
        np.maximum.at(below, parent[level], value)
    return below
