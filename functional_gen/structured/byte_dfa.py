"""`ByteDFA`: a DFA over bytes, and its lifting to a `TokenAutomaton` over a vocabulary.

Every constraint ends as a DFA over bytes (a regex through outlines-core, a grammar through our
bounded-depth construction in `functional_gen.structured.grammar`); this module turns such a
DFA into the token-level tables the device uses, the job outlines-core's `Index` does. A token's
column is the state-to-state map its bytes induce; we compute these maps along a trie of the
vocabulary's byte strings, one depth at a time with numpy, as compositions of a parent's map
with the DFA's byte class of the next byte. Real vocabularies and DFAs give few distinct maps (a
few hundred for a JSON Schema, against 49,152 tokens), so each distinct (map, byte class) pair
is composed once, over all states at once: the work is the trie's size plus distinct maps times
states, not (state, token) pairs.

A regex becomes a `ByteDFA` through outlines-core too: an `Index` over a vocabulary of single
bytes is exactly the byte-level DFA of the regex (one byte per class of bytes the regex cannot
tell apart, `byte_classes`, each byte's column then copied from its class's).
"""

import dataclasses
import functools
import itertools
import re
import typing
import weakref

import numpy as np
from jaxtyping import Bool, Int

from . import graphs
from .automaton import (
    INITIAL,
    ConstraintError,
    TokenAutomaton,
    cached,
    from_table,
    shorten,
    unique_columns,
)
from .vocabulary import TokenVocabulary
from .vocabulary_tables import cached_tables

# Nested helpers that run per byte, state or schema node are `@typing.no_type_check`: the
# tests' jaxtyping import hook would wrap every call of them (30-40 us each, and a fresh
# wrapper per definition), which was most of the structured tests' time.

REJECT = -1
"""`ByteDFA.delta` entry of a byte that is not allowed."""


@dataclasses.dataclass(frozen=True, eq=False)
class ByteDFA:
    """A deterministic automaton over bytes.

    **Attributes:** `delta`: `Int[np.ndarray, "states symbols"]`, next state per byte (`REJECT` =
    -1 for a rejected byte; 256 symbols for bytes, the grammar compiler also minimises automata
    over its own alphabets); `accepting`: `Bool[np.ndarray, " states"]`; `initial`: the start
    state.
    """

    delta: Int[np.ndarray, "states symbols"]
    accepting: Bool[np.ndarray, " states"]
    initial: int = 0

    @property
    def num_states(self) -> int:
        """Number of states."""
        return self.delta.shape[0]

    def matches(self, data: bytes) -> bool:
        """Whether the DFA accepts `data` (a host-side check, for tests)."""
        state = self.initial
        for b in data:
            state = int(self.delta[state, b])
            if state == REJECT:
                return False
        return bool(self.accepting[state])


@functools.lru_cache(maxsize=64)
def _byte_vocabulary(representatives: tuple[int, ...] = tuple(range(256))):
    """An outlines-core `Vocabulary` of the single bytes `representatives` (token id = byte)."""
    # deferred on purpose: the Rust extension loads only when a regex compiles
    from outlines_core import Vocabulary

    return Vocabulary(256, {bytes([b]): [b] for b in representatives})


_UTF8_BOUNDARIES = (0x80, 0x8F, 0x90, 0xA0, 0xBF, 0xC0, 0xC2, 0xE0, 0xE1, 0xED, 0xEE, 0xF0, 0xF1)
_UTF8_BOUNDARIES += (0xF4, 0xF5)
"""Where the byte classes of the UTF-8 encoding of "any character" (`.`, a negated class) change
(lead bytes of 2/3/4-byte sequences, the restricted second bytes after E0, ED, F0 and F4),
together with those of the sentinel U+10FFFF (`F4 8F BF BF`)."""
_REGEX_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|x\{[0-9a-fA-F]{1,6}\}|.)", re.DOTALL)
_REGEX_UNSHOWN = re.compile(r"\(\?(?!:)|\[:")
_CONTROL_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}


def byte_classes(regex: str) -> Int[np.ndarray, " 256"] | None:
    """A partition of the 256 bytes that the regex (Rust `regex` syntax) cannot tell apart: the
    class id of each byte, or `None` where the regex's text does not show its bytes.

    Conservative: the classes are cut on both sides of every byte of the text's UTF-8 (also the
    letters and digits of escapes and repetition counts: finer than needed, never coarser), of
    the characters that `\\xHH`, `\\x{H..}` and control escapes write, and where the UTF-8
    encoding of "any character" (`.`, a negated class) changes byte ranges
    (`_UTF8_BOUNDARIES`). A class or a range of characters compiles to byte ranges that start
    and end at its endpoints' bytes, the byte after them or before them (cut too), or the ends
    of the continuation bytes `80`/`BF` (regex-automata's `Utf8Sequences`), so it never splits
    a class. `None` (all 256 bytes apart) for what hides its bytes: a class escape or word
    boundary (`\\d`, `\\w`, `\\s`, `\\p`, `\\b` and their negations: Unicode in Rust), `\\u`, a
    flag group (`(?i)`: case folding reaches other letters) or a POSIX class (`[:alpha:]`).
    Exactness against all 256 bytes on the development data's regexes:
    `tests/structured/test_byte_dfa.py`.

    Source: the byte classes regex-automata computes for its own DFAs
    (`regex_automata::util::alphabet::ByteClasses`), which outlines-core does not expose.
    """
    if _REGEX_UNSHOWN.search(regex):
        return None
    cuts = np.zeros(257, bool)
    cuts[[0, 1, 2, 10, 11, *_UTF8_BOUNDARIES]] = True  # the `\x01` prefix; `.` excludes `\n`
    written = []
    for escape in set(_REGEX_ESCAPE.findall(regex)):
        if escape[0] == "x" and len(escape) > 1:
            written.append(chr(int(escape.strip("x{}"), 16)))
        elif escape in _CONTROL_ESCAPES:
            written.append(_CONTROL_ESCAPES[escape])
        elif escape.isalnum() and escape not in ("A", "z"):  # \d, \w, \b, \p, \u, ...
            return None
    try:
        shown = np.unique(np.frombuffer((regex + "".join(written)).encode(), np.uint8))
    except UnicodeEncodeError:  # a surrogate
        return None
    cuts[shown] = cuts[shown + 1] = True
    return np.cumsum(cuts[:256]) - 1


_SENTINEL = "\U0010ffff"
_SENTINEL_BYTES = _SENTINEL.encode("utf-8")
_PREFIX = "\x01"
_PREFIX_BYTE = 1


def _anchored_at_start(regex: str) -> bool:
    """Whether `regex` may hold a start-of-text assertion (`^` outside a class negation `[^`,
    or `\\A`), whose meaning a character in front of it would change. Conservative: escapes
    other than `\\A` are dropped, then any `^` left counts (a literal `[a^]` too)."""
    bare = _ESCAPES_AND_NEGATIONS.sub("", regex)
    return "^" in bare or "\\A" in bare


_ESCAPES_AND_NEGATIONS = re.compile(r"\\[^A]|\[\^", re.DOTALL)


@functools.lru_cache(maxsize=512)
def regex_byte_dfa(regex: str) -> ByteDFA:
    """The byte-level DFA of a regex (Rust `regex` syntax, whole-text match), via outlines-core.

    outlines-core's `Index` drops every transition into a regex-automata "match state" whose
    end of input is not a match (the DFA reports matches one byte late): on single bytes that
    loses `1.5` from `[0-9]+(\\.[0-9]+)?` (the `.` after `1`) and `abc` from `a(bc)?`. We
    compile `(?:regex)` followed by a sentinel character (U+10FFFF) instead: no match can
    happen before the sentinel, so nothing is dropped, and a state accepts the regex exactly when
    the sentinel's bytes lead it to a match.

    We also put a `\\x01` in front (unless the regex asserts the start of the text, `^` or
    `\\A`) and start after it. outlines-core builds regex-automata's dense DFA with its default
    configuration, which determinises the UNANCHORED search too (`(?s:.)*?` in front of the
    regex), a part the `Index` never uses: there every position of the text may start a match,
    and a JSON regex (whose `{`, `"` and digits recur inside it) gives sets of overlapping
    partial matches, up to 100 times the anchored DFA's build time (2.5 s against 18 ms for one
    Github_easy schema). JSON text never holds a raw `\\x01`, so the unanchored search of the
    prefixed regex has one partial match at a time. The anchored DFA after the prefix is the
    regex's own, so the language is the same (the state numbering may differ; tested against
    the unprefixed build up to renaming in `tests/structured/test_byte_dfa.py`).

    The `Index` walks one byte of each of the regex's `byte_classes` (about 85 for a median
    MaskBench schema), not all 256: the transitions table, and our reading of it, shrink
    about 3x, 13% of a median schema's compile time.

    **Raises:** `ConstraintError` naming the regex when it does not compile or matches nothing.
    """
    # deferred on purpose: the Rust extension loads only when a regex compiles
    from outlines_core import Index

    prefixed = not _anchored_at_start(regex)
    source = f"{_PREFIX if prefixed else ''}(?:{regex}){_SENTINEL}"
    classes = byte_classes(regex)
    if classes is None:
        representatives, columns = np.arange(256), None
    else:
        representatives = np.flatnonzero(np.diff(classes, prepend=-1))
        columns = representatives[classes]
    try:
        index = Index(source, _byte_vocabulary(tuple(representatives.tolist())))
    except (ValueError, RuntimeError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConstraintError(
            f"invalid regex {shorten(regex)}: outlines-core (Rust `regex` syntax, no look-around "
            f"or backreferences) cannot compile it: {message}{_regex_hint(regex)}"
        ) from None
    table = index.get_transitions()
    initial = index.get_initial_state()
    if prefixed:
        initial = table.get(initial, {}).get(_PREFIX_BYTE)
        if initial is None:  # nothing follows the prefix
            raise ConstraintError(f"the language of the regex {shorten(regex)} is empty")
    return _index_dfa(table, initial, index.get_final_states(), columns)


def _index_dfa(table, initial: int, final_states, columns=None) -> ByteDFA:
    """The trimmed `ByteDFA` of an outlines-core byte `Index` of `(?:regex)` + sentinel, read
    from its transitions `table` (`{state: {byte: next}}`), the start state `initial` and its
    final states (see `regex_byte_dfa`); `columns[b]`: the byte whose transitions byte `b`
    shares (its class's representative, the only one the `Index` walked; `None`: itself)."""
    counts = np.fromiter(map(len, table.values()), np.int64, len(table))
    keys = np.fromiter(table.keys(), np.int64, len(table))
    src = np.repeat(keys, counts)
    byte = np.fromiter(itertools.chain.from_iterable(table.values()), np.int64, int(counts.sum()))
    dst = np.fromiter(
        itertools.chain.from_iterable(map(dict.values, table.values())), np.int64, int(counts.sum())
    )
    finals = np.fromiter(final_states, np.int64)
    # Dense numbering in the order of outlines-core's ids. The ids are regex-automata's
    # premultiplied state ids (index times a power-of-two stride): divided by their common
    # divisor they index a lookup table about as long as the DFA, so no sort of the edges.
    ids = np.concatenate([keys, dst, finals, [initial]])
    unit = max(int(np.gcd.reduce(ids)), 1)
    top = int(ids.max()) // unit + 1
    if top > 64 * (len(table) + 16):  # not as expected: sort instead
        raw = np.unique(ids)
        unit, top = 1, 0
    if top:
        present = np.zeros(top, bool)
        present[src // unit] = present[dst // unit] = present[finals // unit] = True
        present[initial // unit] = True
        lookup = np.cumsum(present) - 1
        num_states = int(lookup[-1]) + 1
    else:
        lookup, num_states = None, raw.size

    @typing.no_type_check
    def number(x):
        return lookup[x // unit] if lookup is not None else np.searchsorted(raw, x)

    keep = byte < 256  # drop outlines-core's EOS self-loops
    delta = np.full((num_states, 256), REJECT, np.int32)
    delta[number(src[keep]), byte[keep]] = number(dst[keep])
    if columns is not None:  # each byte's column is its class representative's
        delta = delta[:, columns]
    final = np.zeros(num_states, bool)
    final[number(finals)] = True
    state = np.arange(num_states)
    for b in _SENTINEL_BYTES:
        state = np.where(state != REJECT, delta[np.maximum(state, 0), b], REJECT)
    accepting = np.where(state != REJECT, final[np.maximum(state, 0)], False)
    return trim(ByteDFA(delta, accepting, int(number(np.int64(initial)))))


_TRIMMED: "weakref.WeakSet[ByteDFA]" = weakref.WeakSet()
"""DFAs that `trim` returned or `minimize` built (already trimmed: `trim` returns them as they
are instead of searching them again)."""


def reachable_states(indptr, indices, sources, num_states: int) -> Bool[np.ndarray, " states"]:
    """The states reachable from any of `sources` over the CSR graph `(indptr, indices)` (rows
    may repeat a successor): `graphs.reachable` (a Python search for small graphs, scipy's
    breadth-first search for large ones)."""
    return graphs.reachable(indptr, indices, sources, num_states)


_DISTINCT_SUCCESSORS_MAX = 1 << 22
"""`successor_graph` sorts each row of a transition table of at most this many entries to drop
repeated successors (a 16,000-state DFA over bytes); larger tables keep every live entry."""


def successor_graph(delta) -> tuple[Int[np.ndarray, " states_plus_one"], Int[np.ndarray, " edges"]]:
    """The CSR graph `(indptr, indices)` of a transition table `Int[np.ndarray, "states
    symbols"]` (`REJECT` for none): each state's successors, each once where the table has at
    most `_DISTINCT_SUCCESSORS_MAX` entries (a state's 200 bytes of `[^"\\]` are one edge,
    so that the graph is small enough for `graphs`' Python search), in int32 where it fits."""
    if delta.size <= _DISTINCT_SUCCESSORS_MAX:
        successors = np.sort(delta, axis=1)
        live = successors != REJECT
        np.logical_and(live[:, 1:], successors[:, 1:] != successors[:, :-1], out=live[:, 1:])
    else:
        successors, live = delta, delta != REJECT
    index = np.int32 if int(live.sum()) < 2**31 - 256 else np.int64
    indptr = np.concatenate([[0], np.cumsum(live.sum(axis=1))]).astype(index)
    return indptr, successors[live].astype(index)


def relabel_states(table, labels, dtype=np.int32):
    """`labels[table]` with `REJECT` entries kept `REJECT`: one gather through `labels` with
    `REJECT` appended (a `REJECT` entry, -1, reads that last slot), into `dtype`. Instead of
    `np.where(table != REJECT, labels[np.maximum(table, 0)], REJECT)`, whose int64 temporaries
    took 1 s for a 124,000-state DFA (MaskBench slack-app-manifest's spliced automaton)."""
    lookup = np.empty(len(labels) + 1, dtype)
    lookup[:-1] = labels
    lookup[-1] = REJECT
    return lookup[table]


def trim(dfa: ByteDFA) -> ByteDFA:
    """Keep only the states reachable from the start that can reach an accepting state (state
    order kept). A DFA that `trim` or `minimize` returned is returned as it is.

    **Raises:** `ConstraintError` when the language is empty.
    """
    if dfa in _TRIMMED:
        return dfa
    n = dfa.num_states
    indptr, successors = successor_graph(dfa.delta)
    reach = reachable_states(indptr, successors, [dfa.initial], n)
    # The reversed edges, grouped by their target: the CSC layout of the same matrix.
    back_ptr, back = graphs.reverse(indptr, successors, n)
    alive = reach & reachable_states(back_ptr, back, np.flatnonzero(dfa.accepting & reach), n)
    if not alive[dfa.initial]:
        raise ConstraintError("the language is empty: no text reaches an accepting state")
    if alive.all():
        _TRIMMED.add(dfa)
        return dfa
    keep = np.flatnonzero(alive)
    renumber = np.full(n, REJECT, np.int64)
    renumber[keep] = np.arange(keep.size)
    trimmed = ByteDFA(
        relabel_states(dfa.delta[keep], renumber), dfa.accepting[keep], int(renumber[dfa.initial])
    )
    _TRIMMED.add(trimmed)
    return trimmed


def refine_changed(columns, accepting):
    """Moore's refinement that re-examines only what can change: the coarsest partition stable
    under every column that refines `accepting` (a bool per state, or any int label that
    equivalent states share, `_longest_words`), as `refine_exact`, but after the first round
    only the predecessors of the states that moved to a new block are hashed again (their
    successors' blocks, a random linear hash mod 2**64; the caller checks the result exactly).
    Within a block, the states not re-examined share one hash (the block was uniform when it was
    last split), so an examined state keeps the block when its hash equals theirs and the others
    form new blocks by hash.
    The rounds are as many as Moore's, but each costs the states it touches: for a schema
    automaton of 106,701 states (MaskBench o9852) 1.5 s instead of 8.5 s.

    Source: the "process only what changed" idea of Hopcroft's algorithm (J. Hopcroft, "An
    n log n algorithm for minimizing states in a finite automaton", 1971) applied to Moore's
    rounds.
    """
    n, c = columns.shape
    _, blocks = np.unique(accepting, return_inverse=True)
    blocks = blocks.reshape(-1).astype(np.int64)
    count = int(blocks.max()) + 1
    size = np.bincount(blocks, minlength=count).astype(np.int64)
    weights = np.random.default_rng(0).integers(1, 2**62, c, dtype=np.uint64)
    index = np.where(columns != REJECT, columns, n).astype(np.intp)
    live = columns != REJECT
    targets = columns[live].astype(np.int64)
    sources = np.broadcast_to(np.arange(n)[:, None], columns.shape)[live]
    order = np.argsort(targets, kind="stable")
    pred_ptr = np.searchsorted(targets[order], np.arange(n + 1))
    preds = sources[order]
    shifted = np.empty(n + 1, np.uint64)
    shifted[n] = np.uint64(REJECT + 2)
    block_key = np.zeros(count, np.uint64)
    affected = np.arange(n)
    while True:
        shifted[:n] = blocks.astype(np.uint64) + np.uint64(2)
        keys = shifted[index[affected]] @ weights  # the successors' blocks, hashed
        own = blocks[affected]
        order = np.lexsort((keys, own))
        a, k, b = affected[order], keys[order], own[order]
        first_of_block = np.empty(a.size, bool)
        first_of_block[0] = True
        first_of_block[1:] = b[1:] != b[:-1]
        # the key that keeps the block's id: its unaffected states' (all equal), or else the
        # key of its first affected group
        counted = np.bincount(b, minlength=count)
        whole = counted[b] == size[b]  # every state of the block is affected
        first_key = k[np.maximum.accumulate(np.where(first_of_block, np.arange(a.size), 0))]
        keep_key = np.where(whole, first_key, block_key[b])
        moves = k != keep_key
        if not moves.any():
            return blocks, count
        # (block, key) groups are contiguous and move or stay whole: one new id per group
        boundary = first_of_block.copy()
        boundary[1:] |= k[1:] != k[:-1]
        starts_new = boundary & moves
        group_id = np.cumsum(starts_new) - 1 + count
        ids = group_id[moves]
        kept_blocks = b[first_of_block & whole]
        block_key[kept_blocks] = first_key[first_of_block & whole]
        added = int(starts_new.sum())
        block_key = np.concatenate([block_key, k[starts_new]])
        moved = a[moves]
        np.subtract.at(size, blocks[moved], 1)
        blocks[moved] = ids
        size = np.concatenate([size, np.bincount(ids - count, minlength=added)])
        count += added
        starts, ends = pred_ptr[moved], pred_ptr[moved + 1]
        lengths = ends - starts
        total = int(lengths.sum())
        if total == 0:
            return blocks, count
        offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        mark = np.zeros(n, bool)
        mark[preds[np.arange(total) + offsets]] = True
        affected = np.flatnonzero(mark)


def refine_exact(columns, accepting):
    """Moore's refinement with exact comparisons: the coarsest partition stable under every
    column, each round's signatures (a state's block and its successors' blocks, `REJECT` for
    none) compared as rows. The fallback of `minimize` after a hash collision."""
    blocks = accepting.astype(np.int64)
    count = len(np.unique(blocks))
    while True:
        successor = np.where(columns != REJECT, blocks[np.maximum(columns, 0)], REJECT)
        signature = np.concatenate([blocks[:, None], successor], axis=1)
        blocks = np.unique(signature, axis=0, return_inverse=True)[1].reshape(-1)
        new_count = int(blocks.max()) + 1
        if new_count == count:
            return blocks, count
        count = new_count


_LONGEST_WORDS_MIN = 256
"""`minimize` starts from `_longest_words` for automata of at least this many states."""


def _longest_words(columns, accepting) -> np.ndarray | None:
    """A label per state of a trimmed automaton (`columns`: its transitions, `REJECT` for none)
    that equivalent states share: twice the length of the longest word it accepts (-2 when
    there is no longest: the state lies on or reaches a cycle), plus one if it accepts.

    Why: Moore's refinement needs as many rounds as the longest word that tells two states
    apart. A counted repeat (`maxItems: 1000` of 24-character strings, MaskBench o9953) is a
    chain of states told apart only by how many items remain: 56,150 rounds. Starting from
    these labels the chain is told apart at once (o9953: 8.6 s -> 0.05 s; o9943's 160,134
    states: 30 s -> 0.15 s).

    The strongly connected components come from `graphs.strong_components` (Tarjan's search,
    or scipy's for large automata), whose labels are in reverse topological order (each edge
    leads to an equal or lower label; checked, `None` if not); the longest words are then one
    pass in that order.
    """
    n = columns.shape[0]
    indptr, indices = successor_graph(columns)
    count, component = graphs.strong_components(indptr, indices, n)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    if not (component[rows] >= component[indices]).all():
        return None
    cyclic = np.bincount(component, minlength=count)[component] > 1
    cyclic[rows[rows == indices]] = True
    longest = [0] * n
    starts, successors = indptr.tolist(), indices.tolist()
    cycles = cyclic.tolist()
    for state in np.argsort(component, kind="stable").tolist():
        best = -1 if cycles[state] else 0  # a trimmed state accepts or has a successor
        for successor in successors[starts[state] : starts[state + 1]] if best == 0 else ():
            length = longest[successor]
            if length < 0:
                best = -1
                break
            best = max(best, length + 1)
        longest[state] = best
    return np.asarray(longest, np.int64) * 2 + accepting


def minimize(dfa: ByteDFA) -> ByteDFA:
    """The minimal DFA of the same language (trimmed, then Moore's partition refinement).

    The refinement starts from the states' longest accepted words (`_longest_words`, which
    equivalent states share) instead of accepting or not, and compares states by a hash of
    their successor blocks, then checks the final partition exactly (and redoes it with exact
    row comparisons in the unlikely event of a collision).

    Source: E. F. Moore, "Gedanken-experiments on sequential machines" (1956).
    """
    dfa = trim(dfa)
    columns, byte_class = unique_columns(dfa.delta)
    labels = None
    if dfa.num_states >= _LONGEST_WORDS_MIN:
        labels = _longest_words(columns, dfa.accepting)
    blocks, count = refine_changed(columns, dfa.accepting if labels is None else labels)
    representative = np.zeros(count, np.int64)
    representative[blocks] = np.arange(dfa.num_states)
    successor = relabel_states(columns, blocks, np.int64)
    consistent = np.array_equal(successor, successor[representative[blocks]]) and np.array_equal(
        dfa.accepting, dfa.accepting[representative[blocks]]
    )
    if not consistent:  # a hash collision merged different states
        blocks, count = refine_exact(columns, dfa.accepting)
        representative = np.zeros(count, np.int64)
        representative[blocks] = np.arange(dfa.num_states)
    rows = columns[representative]
    merged = relabel_states(rows, blocks)[:, byte_class]
    minimal = ByteDFA(merged, dfa.accepting[representative], int(blocks[dfa.initial]))
    _TRIMMED.add(minimal)  # the blocks of a trimmed DFA's states are reachable and live
    return minimal


# --------------------------------------------------------------------------- token trie


@dataclasses.dataclass(frozen=True, eq=False)
class TokenTrie:
    """The vocabulary's byte strings as a trie, in arrays (node 0 is the root).

    **Attributes:** `byte`: the byte on the edge into each node; `child_ptr`: CSR offsets of each
    node's children (children of node `n` are `child_ptr[n]:child_ptr[n + 1]`, nodes are numbered
    so that they are contiguous); `token_ptr`, `token_ids`: CSR of the tokens ending at each node.
    """

    byte: Int[np.ndarray, " nodes"]
    child_ptr: Int[np.ndarray, " nodes_plus_one"]
    token_ptr: Int[np.ndarray, " nodes_plus_one"]
    token_ids: Int[np.ndarray, " tokens"]

    @property
    def num_nodes(self) -> int:
        """Nodes, the root included."""
        return self.byte.shape[0]


_TRIES: dict[str, TokenTrie] = {}


def token_trie(vocabulary: TokenVocabulary) -> TokenTrie:
    """The `TokenTrie` of a vocabulary's text tokens (built level by level with numpy; memoised
    per vocabulary fingerprint, and on disk by `vocabulary_tables.cached_tables`: 0.12 s to
    build for SmolLM2, a few ms to read)."""
    if vocabulary.fingerprint in _TRIES:
        return _TRIES[vocabulary.fingerprint]
    arrays = cached_tables("trie", vocabulary, _TRIE_ARRAYS, lambda: _build_trie(vocabulary))
    trie = TokenTrie(**arrays)
    _TRIES[vocabulary.fingerprint] = trie
    return trie


_TRIE_ARRAYS = ("byte", "child_ptr", "token_ptr", "token_ids")


def _build_trie(vocabulary: TokenVocabulary) -> dict[str, np.ndarray]:
    ids = np.array([i for i, b in enumerate(vocabulary.token_bytes) if b], np.int64)
    lengths = np.array([len(vocabulary.token_bytes[i]) for i in ids], np.int64)
    width = int(lengths.max(initial=1))
    matrix = np.zeros((ids.size, width), np.uint8)
    flat = b"".join(vocabulary.token_bytes[i] for i in ids)
    rows = np.repeat(np.arange(ids.size), lengths)
    cols = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    matrix[rows, cols] = np.frombuffer(flat, np.uint8)

    node_of = np.zeros(ids.size, np.int64)  # each token's node at the current depth
    parents, bytes_ = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    next_id = 1
    for depth in range(width):
        active = np.flatnonzero(lengths > depth)
        keys = node_of[active] * 256 + matrix[active, depth]
        unique, inverse = np.unique(keys, return_inverse=True)
        node_of[active] = next_id + inverse.reshape(-1)
        parents.append(unique // 256)
        bytes_.append(unique % 256)
        next_id += unique.size
    parent = np.concatenate(parents)
    parent[0] = -1
    num_nodes = next_id
    child_ptr = np.searchsorted(parent[1:], np.arange(num_nodes + 1)) + 1
    order = np.argsort(node_of, kind="stable")
    token_ptr = np.searchsorted(node_of[order], np.arange(num_nodes + 1))
    return {
        "byte": np.concatenate(bytes_).astype(np.int64),
        "child_ptr": child_ptr.astype(np.int64),
        "token_ptr": token_ptr.astype(np.int64),
        "token_ids": ids[order],
    }


def ragged_rows(ptr, rows):
    """`(owner, index)`: for each row `r`, the indices `ptr[r]:ptr[r + 1]`, and which row."""
    starts, counts = ptr[rows], ptr[rows + 1] - ptr[rows]
    owner = np.repeat(np.arange(rows.size), counts)
    index = np.arange(owner.size) + (starts - (np.cumsum(counts) - counts))[owner]
    return owner, index


def trie_levels(trie: TokenTrie):
    """`(parent, level_ptr, token_node)`: each node's parent (-1 for the root), the node range of
    each depth (nodes are numbered depth by depth: depth `d` is `level_ptr[d]:level_ptr[d + 1]`),
    and the node each token of `trie.token_ids` ends at. Memoised per trie."""
    hit = _LEVELS.get(id(trie))
    if hit is not None and hit[0] is trie:
        return hit[1]
    n = trie.num_nodes
    parent = np.concatenate([[-1], np.repeat(np.arange(n), np.diff(trie.child_ptr))])
    level_ptr = [0, 1]
    while level_ptr[-1] < n:  # the children of a range of nodes are a range
        level_ptr.append(int(trie.child_ptr[level_ptr[-1]]))
    token_node = np.repeat(np.arange(n), np.diff(trie.token_ptr))
    levels = (parent, np.asarray(level_ptr, np.int64), token_node)
    _LEVELS[id(trie)] = (trie, levels)
    return levels


_LEVELS: dict[int, tuple] = {}


def _token_functions(delta, trie: TokenTrie):
    """`(domains, images, node_function)`: the state-to-state map of every trie node's byte
    string, kept sparse.

    Map `f` is defined on the states `domains[f]` (`int32`, ascending: those from which the walk
    over the node's bytes lives) and leads them to `images[f]`; `node_function[n]` is the map of
    node `n`. Nodes are handled one depth at a time: a node's map is its parent's map followed by
    the byte class of its byte, so nodes with the same (parent map, byte class) share one
    composition, and equal maps get one id. Work: the trie's nodes (a few numpy passes) plus,
    for each distinct (map, byte class) pair, the states where the map lives -- not (state,
    token) pairs, nor every state per pair (most maps live on a few states: a key's letters;
    MaskBench slack-app-manifest: 12 million live entries against 123 million dense, its lift
    6.1 -> 3.5 s).
    """
    num_states = delta.shape[0]
    columns, byte_class = unique_columns(delta)
    num_classes = columns.shape[1]
    step = np.full((num_states + 1, num_classes), num_states, np.int32)  # row `states`: dead
    step[:num_states] = np.where(columns == REJECT, num_states, columns)
    parent, level_ptr, _ = trie_levels(trie)
    node_class = byte_class[trie.byte]
    step_by_class = np.ascontiguousarray(step.T)  # one row per class: a cache-sized `take` table
    identity = np.arange(num_states, dtype=np.int32)  # the empty string's map
    domains, images = [identity], [identity]
    ids = {identity.tobytes() * 2: 0}  # domain and image bytes: equal lengths, so unambiguous
    node_function = np.zeros(trie.num_nodes, np.int64)
    for depth in range(1, level_ptr.size - 1):
        a, b = int(level_ptr[depth]), int(level_ptr[depth + 1])
        count = len(domains)
        key = node_function[parent[a:b]] * num_classes + node_class[a:b]
        seen = np.zeros(count * num_classes, bool)  # small: no sort needed
        seen[key] = True
        unique = np.flatnonzero(seen)
        inverse = np.cumsum(seen)[key] - 1
        number = np.empty(unique.size, np.int64)
        for i, (f, c) in enumerate(zip(*np.divmod(unique, num_classes), strict=True)):
            image = step_by_class[c].take(images[f])
            live = image != num_states
            domain, image = domains[f][live], image[live]
            number[i] = ids.setdefault(domain.tobytes() + image.tobytes(), len(domains))
            if number[i] == len(domains):  # a new map
                domains.append(domain)
                images.append(image)
        node_function[a:b] = number[inverse]
    return domains, images, node_function


def lift(dfa: ByteDFA, vocabulary: TokenVocabulary, description: str = "") -> TokenAutomaton:
    """The `TokenAutomaton` of a byte DFA over a vocabulary: from each state, each token whose
    bytes the DFA can read leads to the state after them (see the module docstring).

    Tokens whose byte strings induce the same state-to-state map (`_token_functions`) have the
    same column: the dense table handed to `automaton.from_table` has one column per distinct
    map instead of one per token, and each token's class is its map's column.

    **Raises:** `ConstraintError` when no token sequence reaches an accepting state.
    """
    dfa = trim(dfa)
    trie = token_trie(vocabulary)
    domains, images, node_function = _token_functions(dfa.delta, trie)
    _, _, token_node = trie_levels(trie)
    num_states = dfa.num_states
    token_function = np.full(vocabulary.vocab_size, -1, np.int64)
    token_function[trie.token_ids] = node_function[token_node]
    used, token_map = np.unique(token_function, return_inverse=True)  # -1 (no bytes) first
    token_map = token_map.reshape(-1)
    # The dense class table, states numbered as `from_table` wants them: 0 dead, 1 the
    # initial state, then the others in order; column 0 the tokens that are never allowed, then
    # one column per map that lives somewhere (`column[g]` for the tokens of `used[g]`), then
    # the column `from_table` reserves for the end-of-generation tokens.
    number = np.zeros(num_states + 1, np.int32)  # index `num_states`: the walk died
    others = np.flatnonzero(np.arange(num_states) != dfa.initial)
    number[dfa.initial] = INITIAL
    number[others] = np.arange(2, others.size + 2)
    # Maps that die everywhere (and tokens without bytes) are column 0, so that the columns
    # are distinct (pruning aside) and `unique_columns` can skip its gather.
    sizes = np.fromiter((d.size for d in domains), np.int64, len(domains))
    alive = (sizes[np.maximum(used, 0)] > 0) & (used >= 0)
    column = np.where(alive, np.cumsum(alive), 0)
    table = np.zeros((num_states + 1, int(alive.sum()) + 2), np.int32)  # + the EOS column
    for g in np.flatnonzero(alive):
        table[number[domains[used[g]]], column[g]] = number[images[used[g]]]
    return from_table(
        table,
        column[token_map],
        number[np.flatnonzero(dfa.accepting)],
        vocabulary.eos_token_id,
        description,
        distinct=True,
    )


# ----------------------------------------------------------------------------- regex


def _regex_hint(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as e:
        return f" ({e})"
    return ""


def build_regex_automaton(
    pattern: str, vocabulary: TokenVocabulary, description: str | None = None
) -> TokenAutomaton:
    """Compile a regex into a `TokenAutomaton`, without any cache: outlines-core compiles the
    regex into a byte-level DFA (`byte_dfa.regex_byte_dfa`), we minimise it and lift it to the
    vocabulary's tokens (`byte_dfa.lift`).

    We do not lift with outlines-core's token `Index`: it drops every token that ends one byte
    after a complete match without being a match itself (regex-automata reports matches one
    byte late), so that `1` `.` `5` cannot be written for `[0-9]+(\\.[0-9]+)?`, nor `cat` `e`
    `gory` for `cat|category`; and exporting its `{state: {token: state}}` dictionaries to
    arrays costs as much as building it. Where its `Index` has no such gap, both give the same
    tables (tested).

    **Raises:** `ConstraintError` naming the pattern when it does not compile (bad syntax,
    look-around, Unicode word boundaries), matches nothing, or cannot be written with the
    vocabulary.
    """
    description = pattern if description is None else description
    return lift(minimize(regex_byte_dfa(pattern)), vocabulary, description)


def regex_automaton(
    pattern: str, vocabulary: TokenVocabulary, *, cache: bool = True, description: str | None = None
) -> TokenAutomaton:
    """Compile a regex (Rust `regex` syntax, matched against the WHOLE generated text) into a
    `TokenAutomaton`, through the memory and disk caches.

    **Arguments:** `pattern`: the regex; `vocabulary`: from `vocabulary_from_tokenizer`;
    `cache`: use the caches; `description`: a label for messages (default: the pattern).

    **Raises:** `ConstraintError` (a `ValueError`) for a pattern that does not compile or that the
    vocabulary cannot write.

    Source: Willard & Louf, "Efficient Guided Generation for Large Language Models" (2023), the
    token-level automaton of a regex; outlines-core compiles the regex itself.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"a regex must be a str, got {type(pattern).__name__}: {pattern!r}")
    return cached(
        "regex",
        pattern,
        vocabulary,
        lambda: build_regex_automaton(pattern, vocabulary, description),
        cache=cache,
    )
