"""Benchmark of the pushdown automaton's token tables (`functional_gen.structured.pda.
_token_tables`): the shared walk against the per-origin walk it replaced (`_token_tables_old`
below, main at 98cf923, kept verbatim), interleaved in one process on the same inputs, tables
checked identical.

Inputs: the Lark JSON grammar at stack depth 32 (as `bench_pushdown.py` builds it) and the
grammar forms of MaskBench schemas from `/work/shared/data/maskbench-dev.jsonl.gz` (Github_hard
o32921, o41296, o21316, o21251; Kubernetes kb_972, kb_594), compiled with
`json_schema._MAX_GRAMMAR_POSITIONS` lifted so that every one builds. For each: the whole
compile once (`json_schema_compile`, new tables), then `--rounds` rounds of old and new tables
alternated; the best of each is reported, with their ratio.

With `--free-form`, also the compile time of `json_schema_compile(schema,
free_form_depth=None)` (free-form values as the pushdown `value` rule) on Github_easy o13687,
o21865, Github_hard o12281 and Kubernetes kb_688, kb_972: new tables vs `_token_tables_old`
patched in, interleaved.

Recorded on 2026-11-23 on the shared 2-core machine, `--rounds 2 --free-form` at 02:24 UTC (load
average 1.7-2.5, other jobs running; best of 2 each; tables identical in every round):

| input | positions | compile s (new tables) | tables new s | tables old s | old / new |
|---|---|---|---|---|---|
| Lark JSON, depth 32 | 47 | 0.65 | 0.09 | 0.08 | 0.85 |
| Github_hard o21251 | 6,148 | 6.99 | 1.82 | 10.83 | 5.94 |
| Github_hard o21316 | 8,219 | 7.04 | 2.19 | 11.03 | 5.03 |
| Github_hard o32921 | 1,081 | 1.16 | 0.48 | 1.45 | 3.02 |
| Github_hard o41296 | 1,947 | 1.59 | 0.56 | 1.72 | 3.07 |
| Kubernetes kb_594 | 2,392 | 2.82 | 0.98 | 11.08 | 11.25 |
| Kubernetes kb_972 | 2,051 | 2.68 | 0.88 | 7.10 | 8.09 |

Whole compile with `free_form_depth=None`, new / old tables (s): o13687 0.17 / 0.17, o21865
0.27 / 0.62, o12281 0.83 / 2.25, kb_688 0.36 / 0.74, kb_972 1.86 / 11.75.
What is left: per walker, the walk costs about 100 ns of numpy work (the trie's children, the
successor table, one argsort per depth to deduplicate); positions are still walked once more
per slot below the first bytes from which a token returns; the tiny Lark grammar pays a fixed
cost per depth (81 depths) that the old walk paid too.

Run: `python benchmarks/bench_pda_tables.py [--rounds 2] [--free-form]` (about 5 minutes).
"""

import argparse
import gc
import gzip
import json
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

from functional_gen.structured import json_schema as json_schema_module, pda as pda_module
from functional_gen.structured.byte_dfa import _ragged, token_trie
from functional_gen.structured.pda import _BOTTOM, MAX_LEVELS, POP
from functional_gen.structured.processor import _bucket
from functional_gen.structured.vocabulary import TokenVocabulary

DATA = "/work/shared/data/maskbench-dev.jsonl.gz"
SCHEMAS = (
    "Github_hard---o32921.json",
    "Github_hard---o41296.json",
    "Github_hard---o21316.json",
    "Github_hard---o21251.json",
    "Kubernetes---kb_972_Normalized.json",
    "Kubernetes---kb_594_Normalized.json",
)
FREE_FORM = (
    "Github_easy---o13687.json",
    "Github_easy---o21865.json",
    "Github_hard---o12281.json",
    "Kubernetes---kb_688_Normalized.json",
    "Kubernetes---kb_972_Normalized.json",
)


# The per-origin walk of main at 98cf923 (`pda._token_tables` before the shared walk), verbatim.
def _token_tables_old(
    nxt,
    push,
    byte_class,
    position_sites,
    position_slots,
    vocabulary: TokenVocabulary,
    stack_depth: int,
    distance,
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
                    if first == _BOTTOM:
                        death = True
                    else:
                        work.append((first, (), low - 1, None))
                else:
                    returned = True
                    for s in position_sites[p]:
                        if s == _BOTTOM or low - 1 < -stack_depth:
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

    info_peak: list = []  # the most slots in use above the start, per extended state
    info_arrays = [np.zeros(0, np.int64), np.zeros(0, np.int64)]  # the two lists, as arrays
    token_count = np.diff(trie.token_ptr)
    node_token = None  # the token ending at each node (-1: none), when no node has two
    if token_count.max(initial=0) <= 1:
        node_token = np.full(num_nodes, -1, np.int32)
        node_token[token_count > 0] = trie.token_ids

    def ends(origin, node, ext, inv2, poisoned, found):
        """Record the tokens ending at the reached `(origin, node)` pairs."""
        if len(info_cost) < len(ext_info):
            while len(info_cost) < len(ext_info):
                x = ext_info[len(info_cost)]
                info_cost.append(int(distance[x[0]]) + sum(int(distance[v]) for v in x[1]))
                info_peak.append(x[3])
            info_arrays[:] = [np.asarray(info_cost, np.int64), np.asarray(info_peak, np.int64)]
        cost, peak = info_arrays
        if inv2 is None:
            kpeak, kcost = peak[ext], cost[ext]
        else:
            kpeak = np.zeros(origin.size, np.int64)
            np.maximum.at(kpeak, inv2, peak[ext])
            kcost = np.zeros(origin.size, np.int64)
            np.maximum.at(kcost, inv2, cost[ext])
        if node_token is not None:
            tokens = node_token[node]
            holder = np.flatnonzero(tokens >= 0)
            tokens = tokens[holder]
        else:
            holder, tindex = _ragged(trie.token_ptr, node)
            tokens = trie.token_ids[tindex].astype(np.int32)
        found[0].append(origin[holder].astype(np.int32))
        found[1].append(tokens)
        found[2].append(~poisoned[holder])
        found[3].append(kpeak[holder].astype(np.int32))
        found[4].append(kcost[holder].astype(np.int32))

    def merge(owner, child, key, e, b, vals, poisoned):
        """The successors of entries whose origins branch (a successor set of several
        extended states) or hold several entries per node: merged per (origin, node).
        Returns `(origin, node, ext, poison, reached, first, inv2, duplicated origins)`."""
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
        died = deaths | poisoned
        ukey, kinv = np.unique(key, return_inverse=True)
        kinv = kinv.reshape(-1)
        kpoison = np.bincount(kinv, weights=died, minlength=ukey.size) > 0
        sel = np.repeat(np.arange(owner.size), counts)
        num_ext = len(ext_info)
        triples = np.unique(key[sel] * num_ext + flat_parts)
        new_key, ext = triples // num_ext, triples % num_ext
        origin, node = new_key // num_nodes, new_key % num_nodes
        poison = kpoison[np.searchsorted(ukey, new_key)]
        reached, first, inv2 = np.unique(new_key, return_index=True, return_inverse=True)
        inv2 = inv2.reshape(-1)
        repeated = np.zeros(new_key.size, bool)
        repeated[1:] = new_key[1:] == new_key[:-1]
        return origin, node, ext, poison, reached, first, inv2, origin[repeated]

    def walk(start_ext, prune: bool = False):
        """All tokens from each initial extended state: `(origin, token, sure, peak, cost)` per
        accepted (origin, token), and which origins returned below their start. With `prune`,
        an origin is no longer walked once it has returned (the caller drops its tokens).

        Per origin, the tokens come in the order of the walk (depth, then trie node): the
        candidates keep it. Origins whose entries all have one successor and one entry per
        node (almost all) take a fast path; the others are merged per (origin, node)."""
        num_origins = len(start_ext)
        origin = np.arange(num_origins, dtype=np.int64)
        ext = np.asarray(start_ext, np.int64)
        node = np.zeros(origin.size, np.int64)
        poison = np.zeros(origin.size, bool)
        returned = np.zeros(num_origins, bool)
        duplicated = np.zeros(num_origins, bool)  # several entries per (origin, node)
        found = ([], [], [], [], [])
        while origin.size:
            owner, child = _ragged(trie.child_ptr, node)
            if not owner.size:
                break
            e, b = ext[owner], trie.byte[child]
            vals, below = lookup(e, b)
            source = origin[owner]
            returned[source[below]] = True
            if prune:
                live = ~returned[source]
                if not live.all():
                    owner, child, e, b = owner[live], child[live], e[live], b[live]
                    vals, source = vals[live], source[live]
            messy = duplicated.copy()
            messy[source[vals == several]] = True
            slow = messy[source]
            parts = []
            if not slow.all():
                fast = ~slow if slow.any() else slice(None)
                f_owner, f_child, f_vals = owner[fast], child[fast], vals[fast]
                alive = f_vals >= 0
                f_ext, f_node = f_vals[alive], f_child[alive]
                f_origin = source[fast][alive]
                f_poison = poison[f_owner][alive]
                ends(f_origin, f_node, f_ext, None, f_poison, found)
                parts.append((f_origin, f_node, f_ext, f_poison))
            if slow.any():
                s_owner = owner[slow]
                s_origin, s_node, s_ext, s_poison, reached, first, inv2, dups = merge(
                    s_owner,
                    child[slow],
                    source[slow] * num_nodes + child[slow],
                    e[slow],
                    b[slow],
                    vals[slow],
                    poison[s_owner],
                )
                ends(reached // num_nodes, reached % num_nodes, s_ext, inv2, s_poison[first], found)
                duplicated[messy] = False
                duplicated[dups] = True
                parts.append((s_origin, s_node, s_ext, s_poison))
            if not parts:  # every origin left returned (pruned)
                break
            if len(parts) == 1:
                origin, node, ext, poison = parts[0]
            else:
                origin, node, ext, poison = (np.concatenate(x) for x in zip(*parts))
        out = tuple(
            np.concatenate(a) if a else np.zeros(0, dt)
            for a, dt in zip(found, (np.int32, np.int32, bool, np.int32, np.int32))
        )
        return out, returned

    # Pass 1: each position, whatever is on the stack. Tokens from a position that never
    # returns below its rule do not depend on the stack: their result holds for every slot.
    positions = np.arange(1, num_positions)
    (o1, t1, s1, k1, c1), returned = walk(
        [intern((int(p), (), 0, 0, None)) for p in positions], prune=True
    )
    # Pass 2: the positions that do return, once per slot (the top of the stack known).
    pairs = [
        (p, k, site) for p in range(1, num_positions) for k, site in enumerate(position_slots[p])
    ]
    origin_position = np.array([p for p, _, _ in pairs], np.int64)
    origin_slot = np.array([k for _, k, _ in pairs], np.int64)
    num_origins = len(pairs)
    again = [i for i, (p, _, _) in enumerate(pairs) if returned[p - 1]]
    (o2, t2, s2, k2, c2), _ = walk([intern((pairs[i][0], (), 0, 0, pairs[i][2])) for i in again])
    # Each origin's tokens come from one *source*: its position's pass-1 walk when that never
    # returned (shared by all its slots), else its own pass-2 walk. Tables are built per source
    # and spread over the origins at the end.
    kept = np.flatnonzero(~returned)  # pass-1 sources (index into `positions`)
    first_source = np.full(positions.size, -1, np.int64)
    first_source[kept] = np.arange(kept.size)
    num_sources = kept.size + len(again)
    source_of = np.empty(num_origins, np.int64)
    fixed = ~returned[origin_position - 1]
    source_of[fixed] = first_source[origin_position[fixed] - 1]
    source_of[np.asarray(again, np.int64)] = kept.size + np.arange(len(again))
    keep = ~returned[o1]
    f_origin = np.concatenate([first_source[o1[keep]], kept.size + o2])
    f_token = np.concatenate([t1[keep], t2])
    f_sure = np.concatenate([s1[keep], s2])
    f_peak = np.concatenate([k1[keep], k2])
    f_cost = np.concatenate([c1[keep], c2])
    sure = f_sure & (f_peak < MAX_LEVELS)
    costliest = np.zeros(num_sources, np.int32)  # the found arrays' dtype: ufunc.at's fast path
    np.maximum.at(costliest, f_origin[sure], f_cost[sure])
    budget_cost = np.zeros((num_positions, num_slots), np.int32)
    budget_cost[origin_position, origin_slot] = costliest[source_of]
    levels = int(f_peak[sure].max(initial=0)) + 1
    words = (vocab + 31) // 32
    # The level from which each (source, token) is in the bitmask (`levels`: never); a token
    # is reached once per source, so plain assignment is exact.
    level_of = np.full((num_sources, words * 32), levels, np.uint8)
    level_of[f_origin[sure], f_token[sure]] = f_peak[sure]
    changes = np.zeros((num_sources, levels), bool)  # a token joins the bitmask at this level
    changes[f_origin[sure], f_peak[sure]] = True
    changes[:, 0] = True
    distinct: dict = {}  # packed row bytes -> index among distinct rows
    distinct_rows = []
    source_rows = np.empty((num_sources, levels), np.int64)
    chunk = max(1, (1 << 26) // (words * 32))  # bounded temporaries
    for start in range(0, num_sources, chunk):
        block = level_of[start : start + chunk]
        for level in range(levels):
            if level:  # unchanged rows repeat the level below
                source_rows[start : start + block.shape[0], level] = source_rows[
                    start : start + block.shape[0], level - 1
                ]
            pick = np.flatnonzero(changes[start : start + block.shape[0], level])
            packed = np.packbits(block[pick] <= level, axis=1, bitorder="little").view(np.uint32)
            for i, row in zip(pick.tolist(), packed):
                key = row.tobytes()
                j = distinct.get(key)
                if j is None:
                    j = distinct[key] = len(distinct_rows)
                    distinct_rows.append(row)
                source_rows[start + i, level] = j
    masks, order_rows = np.unique(
        np.stack(distinct_rows).reshape(-1, words), axis=0, return_inverse=True
    )
    rows = order_rows.reshape(-1)[source_rows][source_of]
    empty = np.flatnonzero(~masks.any(axis=1))
    mask_row = np.full((num_positions, num_slots, levels), empty[0] if empty.size else 0, np.int64)
    if not empty.size:  # no all-zero row yet: add one for the dead position and unused slots
        masks = np.concatenate([masks, np.zeros((1, words), masks.dtype)])
        mask_row[:] = masks.shape[0] - 1
    mask_row[origin_position, origin_slot] = rows

    cand_source, cand_token = f_origin[~sure], f_token[~sure]
    per_source = np.bincount(cand_source, minlength=num_sources)
    width = _bucket(int(per_source.max(initial=0)), 8)
    source_candidates = np.full((num_sources, width), vocab, np.int32)
    order = np.argsort(cand_source, kind="stable")
    cand_source, cand_token = cand_source[order], cand_token[order]
    slot = np.arange(cand_source.size) - (np.cumsum(per_source) - per_source)[cand_source]
    source_candidates[cand_source, slot] = cand_token
    candidates = np.full((num_positions, num_slots, width), vocab, np.int32)
    candidates[origin_position, origin_slot] = source_candidates[source_of]
    lengths = vocabulary.token_length
    candidate_bytes = int(lengths[cand_token].max(initial=1))
    return (
        np.ascontiguousarray(masks.astype(np.uint32)),
        mask_row.astype(np.int32),
        candidates,
        candidate_bytes,
        budget_cost,
    )


def _vocabulary():
    from transformers import AutoTokenizer

    from functional_gen.loading.default_model import (
        converted_default_dir,
        ensure_default_checkpoint,
    )
    from functional_gen.structured import vocabulary_from_tokenizer

    ensure_default_checkpoint()
    return vocabulary_from_tokenizer(AutoTokenizer.from_pretrained(str(converted_default_dir())))


def _schemas(names):
    found = {}
    with gzip.open(DATA, "rt") as f:
        for line in f:
            record = json.loads(line)
            if record["file"] in names:
                found[record["file"]] = record["schema"]
    return found


def _equal(new, old):
    for a, b in zip(new, old, strict=True):
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
        else:
            assert a == b


def _timed(fn, *args, **kwargs):
    gc.collect()
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def _capture(build):
    """Run `build()` with the new tables; returns `(total seconds, table seconds, table args)`,
    the last two `None` when it built no pushdown tables."""
    real, seen = pda_module._token_tables, {}

    def spy(*args):
        seen["args"] = args
        out, seen["seconds"] = _timed(real, *args)
        return out

    pda_module._token_tables = spy
    try:
        _, total = _timed(build)
    finally:
        pda_module._token_tables = real
    return total, seen.get("seconds"), seen.get("args")


def tables(vocabulary, rounds: int):
    from functional_gen.structured import pushdown_automaton
    from tests.structured.cases import PUSHDOWN_GRAMMARS

    json_schema_module._MAX_GRAMMAR_POSITIONS = 10**9
    cases = [
        (
            "Lark JSON, depth 32",
            lambda: pushdown_automaton(
                PUSHDOWN_GRAMMARS["json"], vocabulary, stack_depth=32, cache=False
            ),
        )
    ]
    for name, schema in _schemas(SCHEMAS).items():
        cases.append(
            (
                name,
                lambda s=schema: json_schema_module.json_schema_compile(s, vocabulary, cache=False),
            )
        )
    print(
        "| input | positions | compile s (new tables) | tables new s | tables old s | old / new |"
    )
    print("|---|---|---|---|---|---|")
    for name, build in cases:
        total, _, args = _capture(build)
        if args is None:  # compiled without pushdown tables (a token automaton)
            print(f"| {name} | - | {total:.2f} | no pushdown tables | - | - |", flush=True)
            continue
        new_times, old_times = [], []
        for _ in range(rounds):
            old, seconds = _timed(_token_tables_old, *args)
            old_times.append(seconds)
            new, seconds = _timed(pda_module._token_tables, *args)
            new_times.append(seconds)
            _equal(new, old)
        print(
            f"| {name} | {args[0].shape[0]:,} | {total:.2f} | {min(new_times):.2f} | "
            f"{min(old_times):.2f} | {min(old_times) / min(new_times):.2f} |",
            flush=True,
        )


def free_form(vocabulary, rounds: int):
    json_schema_module._MAX_GRAMMAR_POSITIONS = 10**9
    real = pda_module._token_tables
    print("\n| schema (free_form_depth=None) | compile s new | compile s old | old / new |")
    print("|---|---|---|---|")
    for name, schema in _schemas(FREE_FORM).items():
        times = {"new": [], "old": []}
        for _ in range(rounds):
            for label, fn in (("old", _token_tables_old), ("new", real)):
                pda_module._token_tables = fn
                json_schema_module._PUSHDOWN_CACHE.clear()  # kept even with cache=False
                try:
                    _, seconds = _timed(
                        json_schema_module.json_schema_compile,
                        schema,
                        vocabulary,
                        cache=False,
                        free_form_depth=None,
                    )
                except Exception as error:
                    seconds = float("nan")
                    print(f"{name} {label}: {type(error).__name__}: {error}"[:200])
                finally:
                    pda_module._token_tables = real
                times[label].append(seconds)
        new, old = min(times["new"]), min(times["old"])
        print(f"| {name} | {new:.2f} | {old:.2f} | {old / new:.2f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--free-form", action="store_true")
    options = parser.parse_args()
    vocabulary = _vocabulary()
    tables(vocabulary, options.rounds)
    if options.free_form:
        free_form(vocabulary, options.rounds)


if __name__ == "__main__":
    main()
