"""The token-table walk of `functional_gen.structured.pushdown` as it was before it was made
faster (one walk per pass-1 position spread over its slots, every origin merged whenever one
branches): the reference that `test_pda.py` checks the fast `token_tables` against, table
for table."""

import numpy as np

from functional_gen.structured.buckets import bucket
from functional_gen.structured.byte_dfa import ragged_rows, token_trie
from functional_gen.structured.pushdown import BOTTOM, MAX_LEVELS, POP
from functional_gen.structured.vocabulary import TokenVocabulary


def token_tables_reference(
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
    budget_cost)`."""
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

    def intern(key) -> int:
        i = ext_ids.get(key)
        if i is None:
            i = ext_ids[key] = len(ext_info)
            ext_info.append(key)
        return i

    def successors(eid: int, byte: int):
        pos, pushed, below, peak, top = ext_info[eid]
        c = byte_class[byte]
        out, death, returned = [], False, False
        work, seen = [(pos, pushed, below, top)], set()
        while work:
            p, stack, low, first = work.pop()
            act = nxt[p, c]
            if act > 0:
                stack = stack + tuple(int(v) for v in push[p, c] if v)
                height = low + len(stack)
                if height > stack_depth:
                    death = True
                else:
                    out.append(intern((int(act), stack, low, max(peak, height), first)))
            elif act == POP:
                if stack:
                    work.append((stack[-1], stack[:-1], low, first))
                elif first is not None:
                    returned = True
                    if first == BOTTOM:
                        death = True
                    else:
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

    memo: dict = {}
    info_cost: list = []  # distance[position] + sum(distance[pushed]) per extended state

    unknown, dead, several = -3, -1, -2
    dense: dict = {}  # (peak, top) -> id of (position, (), 0, peak, top) per position, -1 if new
    table = np.full((64, 256), unknown, np.int64)  # (extended state, byte) -> one successor
    table_returned = np.zeros((64, 256), bool)

    def lookup(e, b):
        """Successor of each (extended state, byte): an id, `dead` or `several` (see `memo`)."""
        nonlocal table, table_returned
        if len(ext_info) > table.shape[0]:
            grow = max(len(ext_info), 2 * table.shape[0]) - table.shape[0]
            table = np.concatenate([table, np.full((grow, 256), unknown, np.int64)])
            table_returned = np.concatenate([table_returned, np.zeros((grow, 256), bool)])
        vals = table[e, b]
        missing = vals == unknown
        if missing.any():
            keys = np.unique(e[missing] * 256 + b[missing])
            # Vectorised: from a configuration that pushed and returned nothing yet, a byte
            # that is read without a call, or rejected (most pairs).
            info = ext_info
            me, mb = keys // 256, keys % 256
            simple = np.fromiter(
                (not x[1] and x[2] == 0 for x in (info[i] for i in me.tolist())), bool, me.size
            )
            pos = np.fromiter((info[i][0] for i in me.tolist()), np.int64, me.size)
            c = byte_class[mb]
            act = nxt[pos, c]
            plain = simple & (((act > 0) & (push[pos, c, 0] == 0)) | (act == 0))
            table[me[plain & (act == 0)], mb[plain & (act == 0)]] = dead
            reads = np.flatnonzero(plain & (act > 0))
            if reads.size:
                # the target keeps the source's (peak, top): one dense id array per such pair
                group = {}
                for i, src in zip(reads.tolist(), me[reads].tolist()):
                    x = info[src]
                    group.setdefault((x[3], x[4]), []).append(i)
                for (peak, top), rows in group.items():
                    ids = dense.get((peak, top))
                    if ids is None:
                        ids = dense[peak, top] = np.full(num_positions, -1, np.int64)
                    rows = np.asarray(rows)
                    targets = act[rows]
                    for t in np.unique(targets[ids[targets] < 0]).tolist():
                        ids[t] = intern((t, (), 0, peak, top))
                    table[me[rows], mb[rows]] = ids[targets]
            if len(ext_info) > table.shape[0]:
                grow = max(len(ext_info), 2 * table.shape[0]) - table.shape[0]
                table = np.concatenate([table, np.full((grow, 256), unknown, np.int64)])
                table_returned = np.concatenate([table_returned, np.zeros((grow, 256), bool)])
            keys = keys[~plain]
            for key in keys.tolist():
                out, death, returned = memo[key] = successors(key // 256, key % 256)
                if len(ext_info) > table.shape[0]:
                    grow = max(len(ext_info), 2 * table.shape[0]) - table.shape[0]
                    table = np.concatenate([table, np.full((grow, 256), unknown, np.int64)])
                    table_returned = np.concatenate([table_returned, np.zeros((grow, 256), bool)])
                table[key // 256, key % 256] = (
                    out[0] if len(out) == 1 and not death else dead if not out else several
                )
                table_returned[key // 256, key % 256] = returned
            vals = table[e, b]
        return vals, table_returned[e, b]

    def walk(start_ext):
        """All tokens from each initial extended state: `(origin, token, sure, peak)` per
        accepted (origin, token), and which origins returned below their start."""
        origin = np.arange(len(start_ext), dtype=np.int64)
        ext = np.asarray(start_ext, np.int64)
        node = np.zeros(origin.size, np.int64)
        poison = np.zeros(origin.size, bool)
        returned = np.zeros(origin.size, bool)
        unique_keys = True  # one extended state per (origin, node): no merging needed
        found = ([], [], [], [], [])
        while origin.size:
            owner, child = ragged_rows(trie.child_ptr, node)
            if not owner.size:
                break
            e, b = ext[owner], trie.byte[child]
            vals, below = lookup(e, b)
            returned[origin[owner][below]] = True
            key = origin[owner] * num_nodes + child
            if unique_keys and not (vals == several).any():
                # Fast path: at most one successor per entry and one entry per (origin, node).
                alive = vals >= 0
                origin, node, ext = origin[owner][alive], child[alive], vals[alive]
                poison = poison[owner][alive]
                reached, first, kext = key[alive], np.arange(int(alive.sum())), ext
                inv2 = None
            else:
                counts = np.zeros(vals.size, np.int64)
                deaths = vals == dead
                counts[vals >= 0] = 1
                multi = np.flatnonzero(vals == several)
                hits = [memo[int(k)] for k in (e[multi] * 256 + b[multi])]
                counts[multi] = [len(h[0]) for h in hits]
                deaths[multi] = [h[1] for h in hits]
                flat_parts = np.zeros(int(counts.sum()), np.int64)
                starts = np.cumsum(counts) - counts
                single = np.flatnonzero(vals >= 0)
                flat_parts[starts[single]] = vals[single]
                for i, h in zip(multi, hits):
                    flat_parts[starts[i] : starts[i] + len(h[0])] = h[0]
                died = deaths | poison[owner]
                ukey, kinv = np.unique(key, return_inverse=True)
                kinv = kinv.reshape(-1)
                kpoison = np.bincount(kinv, weights=died, minlength=ukey.size) > 0
                sel = np.repeat(np.arange(owner.size), counts)
                new_ext = flat_parts
                num_ext = len(ext_info)
                triples = np.unique(key[sel] * num_ext + new_ext)
                new_key, ext = triples // num_ext, triples % num_ext
                origin, node = new_key // num_nodes, new_key % num_nodes
                poison = kpoison[np.searchsorted(ukey, new_key)]
                reached, first, inv2 = np.unique(new_key, return_index=True, return_inverse=True)
                inv2 = inv2.reshape(-1)
                unique_keys = reached.size == new_key.size
                kext = ext
            # Tokens ending at the reached nodes.
            # a token's bitmask level: its peak, and the free slots that the text needs to end
            # after it (`min_room` of its position and pushes, at the heights they run with)
            info_peak = np.fromiter(
                (
                    max(
                        [x[3], int(min_room[x[0]]) + len(x[1]) + x[2]]
                        + [int(min_room[v]) + i + x[2] for i, v in enumerate(x[1])]
                    )
                    for x in ext_info
                ),
                np.int64,
                len(ext_info),
            )
            while len(info_cost) < len(ext_info):
                x = ext_info[len(info_cost)]
                info_cost.append(int(distance[x[0]]) + sum(int(distance[v]) for v in x[1]))
            cost = np.asarray(info_cost, np.int64)
            if inv2 is None:
                kpeak, kcost = info_peak[kext], cost[kext]
            else:
                kpeak = np.zeros(reached.size, np.int64)
                np.maximum.at(kpeak, inv2, info_peak[kext])
                kcost = np.zeros(reached.size, np.int64)
                np.maximum.at(kcost, inv2, cost[kext])
            holder, tindex = ragged_rows(trie.token_ptr, reached % num_nodes)
            found[0].append(reached[holder] // num_nodes)
            found[1].append(trie.token_ids[tindex])
            found[2].append(~poison[first][holder])
            found[3].append(kpeak[holder])
            found[4].append(kcost[holder])
        out = tuple(
            np.concatenate(a) if a else np.zeros(0, dt)
            for a, dt in zip(found, (np.int64, np.int64, bool, np.int64, np.int64))
        )
        return out, returned

    # Pass 1: each position, whatever is on the stack. Tokens from a position that never
    # returns below its rule do not depend on the stack: their result holds for every slot.
    positions = np.arange(1, num_positions)
    (o1, t1, s1, k1, c1), returned = walk([intern((int(p), (), 0, 0, None)) for p in positions])
    # Pass 2: the positions that do return, once per slot (the top of the stack known).
    pairs = [
        (p, k, site) for p in range(1, num_positions) for k, site in enumerate(position_slots[p])
    ]
    pair_index = {(p, k): i for i, (p, k, _) in enumerate(pairs)}
    origin_position = np.array([p for p, _, _ in pairs], np.int64)
    origin_slot = np.array([k for _, k, _ in pairs], np.int64)
    num_origins = len(pairs)
    again = [i for i, (p, _, _) in enumerate(pairs) if returned[p - 1]]
    (o2, t2, s2, k2, c2), _ = walk([intern((pairs[i][0], (), 0, 0, pairs[i][2])) for i in again])
    keep = ~returned[o1]
    o1, t1, s1, k1, c1 = o1[keep], t1[keep], s1[keep], k1[keep], c1[keep]
    slots_of = [
        np.array([pair_index[p, k] for k in range(len(position_slots[p]))], np.int64)
        for p in positions
    ]
    fan = np.array([len(position_slots[p]) for p in positions], np.int64)[o1]
    spread = np.concatenate([slots_of[o] for o in o1]) if o1.size else np.zeros(0, np.int64)
    f_origin = np.concatenate([spread, np.asarray(again, np.int64)[o2]])
    f_token = np.concatenate([np.repeat(t1, fan), t2])
    f_sure = np.concatenate([np.repeat(s1, fan), s2])
    f_peak = np.concatenate([np.repeat(k1, fan), k2])
    f_cost = np.concatenate([np.repeat(c1, fan), c2])
    sure = f_sure & (f_peak < MAX_LEVELS)
    costliest = np.zeros(num_origins, np.int64)
    np.maximum.at(costliest, f_origin[sure], f_cost[sure])
    budget_cost = np.zeros((num_positions, num_slots), np.int32)
    budget_cost[origin_position, origin_slot] = costliest
    levels = int(f_peak[sure].max(initial=0)) + 1
    words = (vocab + 31) // 32
    packed = np.zeros((num_origins, levels, words), np.uint32)
    for level in range(levels):
        bits = np.zeros((num_origins, words * 32), bool)
        chosen = sure & (f_peak <= level)
        bits[f_origin[chosen], f_token[chosen]] = True
        packed[:, level] = np.packbits(bits, axis=1, bitorder="little").view(np.uint32)
    masks, rows = np.unique(packed.reshape(-1, words), axis=0, return_inverse=True)
    rows = rows.reshape(num_origins, levels)
    empty = np.flatnonzero(~masks.any(axis=1))
    mask_row = np.full((num_positions, num_slots, levels), empty[0] if empty.size else 0, np.int64)
    if not empty.size:  # no all-zero row yet: add one for the dead position and unused slots
        masks = np.concatenate([masks, np.zeros((1, words), masks.dtype)])
        mask_row[:] = masks.shape[0] - 1
    mask_row[origin_position, origin_slot] = rows

    cand_origin, cand_token = f_origin[~sure], f_token[~sure]
    per_origin = np.bincount(cand_origin, minlength=num_origins)
    width = bucket(int(per_origin.max(initial=0)), 8)
    candidates = np.full((num_positions, num_slots, width), vocab, np.int32)
    order = np.argsort(cand_origin, kind="stable")
    cand_origin, cand_token = cand_origin[order], cand_token[order]
    slot = np.arange(cand_origin.size) - (np.cumsum(per_origin) - per_origin)[cand_origin]
    candidates[origin_position[cand_origin], origin_slot[cand_origin], slot] = cand_token
    lengths = vocabulary.token_length
    candidate_bytes = int(lengths[cand_token].max(initial=1))
    return (
        np.ascontiguousarray(masks.astype(np.uint32)),
        mask_row.astype(np.int32),
        candidates,
        candidate_bytes,
        budget_cost,
    )
