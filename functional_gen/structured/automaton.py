"""`TokenAutomaton`: a constraint as a deterministic automaton over TOKENS, stored as small arrays.

A regular constraint (a regex, a JSON Schema, a list of choices, a depth-bounded grammar) is a
DFA over bytes. Lifted to the tokenizer's vocabulary it becomes a DFA over token ids: from state
`s`, token `t` either leads to one next state or is not allowed. Stored densely that is an
`int32[states, vocab]` table (62 MiB for a 333-state JSON Schema at 49,152 tokens); we store it
in three small arrays instead:

- `token_class: int32[vocab]`: tokens with identical columns (the same next state from every
  state) share a class. A JSON Schema over 49,152 tokens has about 50-250 classes; class 0 holds
  the tokens that are never allowed (special tokens, text the constraint cannot contain).
- `transitions: int32[states, classes]`: the next state, `0` for "not allowed". State 0 is the
  dead state (a row of zeros), state 1 the initial state.
- `distance: int32[states]`: the fewest tokens that lead from the state to an accepting state
  (0 when accepting, `INFINITE_DISTANCE` when none do). It marks the accepting states (where
  the end-of-generation tokens are allowed and loop back to the same state), and it lets the
  device mask keep only tokens after which the row can still finish within its remaining
  `max_new_tokens` (see `functional_gen.structured.processor`).

The allowed set of state `s` with `r` tokens left is
`distance[transitions[s, token_class]] <= r - 1`: two gathers on the device, no per-state
bitmask. States from which no accepting state can be reached are pruned at build time.

`from_table` builds the tables from a dense (state, token class) table: our lifting of a byte
DFA (`byte_dfa.lift`, what regexes, JSON Schemas, choices and grammars use) makes one, with a
column per distinct state-to-state map of the tokens' bytes. `from_transitions` builds them from
any token-level transition list, such as outlines-core's `Index` (`from_outlines_index`, read
with `numpy.fromiter`, no Python loop over transitions; a reference in tests and benchmarks):
classes come from a hash of each token's column, checked exactly afterwards. Both prune and
merge columns the same way, and columns come out in one canonical order (`unique_columns`).
"""

import dataclasses
import hashlib
import itertools
import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from jaxtyping import Bool, Int

from ..cache import cache_dir
from . import graphs
from .vocabulary import TokenVocabulary

DEAD = 0
"""The dead state: nothing is allowed, every transition stays there."""
INITIAL = 1
"""The initial state of every `TokenAutomaton`."""
INFINITE_DISTANCE = int(np.iinfo(np.int32).max)
"""`distance` of states that cannot reach an accepting state (and of the dead state)."""

_FORMAT_VERSION = 3  # bump when the cached layout or the compilation changes (3: register objects)


class ConstraintError(ValueError):
    """A constraint that cannot be compiled (a bad regex, a vocabulary that cannot write it, ...)."""


@dataclasses.dataclass(frozen=True, eq=False)
class TokenAutomaton:
    """A deterministic automaton over token ids, in the compact layout of the module docstring.

    **Attributes:**

    - `token_class`: `Int[np.ndarray, " vocab"]`, int32, the class of each token id.
    - `transitions`: `Int[np.ndarray, "states classes"]`, int32, next state per (state, class);
      0 = not allowed. Row 0 is the dead state, row 1 the initial state.
    - `distance`: `Int[np.ndarray, " states"]`, int32, fewest tokens from each state to an
      accepting one (0: accepting; `INFINITE_DISTANCE`: never).
    - `eos_token_id`: the end-of-generation ids, allowed exactly in accepting states.
    - `description`: what was compiled (for messages and `repr`).
    """

    token_class: Int[np.ndarray, " vocab"]
    transitions: Int[np.ndarray, "states classes"]
    distance: Int[np.ndarray, " states"]
    eos_token_id: tuple[int, ...]
    description: str = ""

    @property
    def num_states(self) -> int:
        """States, the dead state 0 included."""
        return self.transitions.shape[0]

    @property
    def num_classes(self) -> int:
        """Token classes, class 0 ("never allowed") included."""
        return self.transitions.shape[1]

    @property
    def vocab_size(self) -> int:
        """Token ids covered."""
        return self.token_class.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of the three tables."""
        return self.token_class.nbytes + self.transitions.nbytes + self.distance.nbytes

    @property
    def accepting(self) -> Bool[np.ndarray, " states"]:
        """`True` for the states where generation may end."""
        return self.distance == 0

    def next_state(self, state: int, token_id: int) -> int:
        """The state after `token_id` (0 when the token is not allowed)."""
        return int(self.transitions[state, self.token_class[token_id]])

    def allowed(self, state: int, remaining: int | None = None) -> Bool[np.ndarray, " vocab"]:
        """The tokens allowed in `state`, as a boolean row over the vocabulary.

        With `remaining` (tokens the row may still generate, this one included), only tokens after
        which an accepting state is at most `remaining - 1` tokens away.
        """
        after = self.distance[self.transitions[state]]
        limit = INFINITE_DISTANCE - 1 if remaining is None else remaining - 1
        return (after <= limit)[self.token_class]

    def walk(self, token_ids: Iterable[int], state: int = INITIAL) -> int:
        """The state after a sequence of tokens (0 if one was not allowed)."""
        # `next_state`'s lookup inline: jaxtyping's wrapper of `next_state` in the tests cost
        # ~20 us per token (149,053 calls in test_json_schema_grammar.py and two other files)
        transitions, token_class = self.transitions, self.token_class
        for t in token_ids:
            state = int(transitions[state, token_class[int(t)]])
        return state

    def __repr__(self):
        return (
            f"TokenAutomaton({self.description!r}, states={self.num_states}, "
            f"classes={self.num_classes}, vocab={self.vocab_size}, {self.nbytes / 2**20:.2f} MiB)"
        )


def unique_columns(matrix: Int[np.ndarray, "rows cols"]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct columns of an integer matrix and each column's index among them (like
    `np.unique(matrix, axis=1, return_inverse=True)`, inverse flattened), in a canonical order:
    by a fixed random hash of the column (the all-zero column, whose hash is 0, first).

    Columns are grouped by the hash (computed a block of rows at a time, no full uint64 copy)
    and the grouping is checked exactly (`np.unique` itself, in lexicographic order, on a
    collision); no check is needed when every hash differs, since equal columns hash equally.
    Work: a few passes over the matrix, however tall (`np.unique(axis=1)` sorts the columns as
    records, and a lexicographic sort of tall distinct columns takes a pass per row).
    """
    rows, cols = matrix.shape
    if rows == 0 or cols == 0:
        distinct, inverse = np.unique(matrix, axis=1, return_inverse=True)
        return distinct, inverse.reshape(-1)
    weights = np.random.default_rng(0).integers(1, 2**63, rows, dtype=np.uint64)
    keys = np.zeros(cols, np.uint64)
    for start in range(0, rows, _HASH_BLOCK):  # wraps mod 2**64
        block = slice(start, start + _HASH_BLOCK)
        keys += weights[block] @ matrix[block].astype(np.uint64)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if first.size == cols and np.array_equal(first, np.arange(cols)):
        return matrix, inverse  # distinct, already in order
    distinct = np.take(matrix, first, axis=1)
    if first.size < cols and not np.array_equal(np.take(distinct, inverse, axis=1), matrix):
        distinct, inverse = np.unique(matrix, axis=1, return_inverse=True)  # a hash collision
        return distinct, inverse.reshape(-1)
    return distinct, inverse


_HASH_BLOCK = 4096


def _ragged_gather(indptr, rows):
    """Concatenated `range(indptr[r], indptr[r + 1])` for `r` in `rows` (vectorised)."""
    starts, lengths = indptr[rows], indptr[rows + 1] - indptr[rows]
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(total) + offsets


def _bfs_distance(graph, sources, num_states: int) -> Int[np.ndarray, " states"]:
    """Breadth-first distance (in edges) from any of `sources`; unreached states get
    `INFINITE_DISTANCE`. `graph` is a dense successor table `int[states, k]` (every entry an
    edge) or a CSR `(indptr, indices)` (rows may repeat a successor). One vectorised pass per
    layer over the frontier's edges only: work linear in the edges."""
    distance = np.full(num_states, INFINITE_DISTANCE, np.int64)
    frontier = np.unique(np.asarray(sources, np.int64))
    depth = 0
    while frontier.size:
        distance[frontier] = depth
        if isinstance(graph, np.ndarray):
            successors = graph[frontier].reshape(-1)
        else:
            indptr, indices = graph
            successors = indices[_ragged_gather(indptr, frontier)]
        successors = successors[distance[successors] == INFINITE_DISTANCE]
        frontier = np.unique(successors)
        depth += 1
    return distance


def _token_classes(
    src, tok, dst, vocab_size: int, num_states: int
) -> tuple[Int[np.ndarray, " vocab"], Int[np.ndarray, "states classes"]]:
    """`(token_class, table)`: the class of each token, and the next state per (state, class)
    (0: none). Tokens whose (state -> next state) columns are equal share a class;
    class 0 holds exactly the tokens without any transition. Exact: a random hash of each
    column, then a check that the class table reproduces every transition and no more."""
    per_token = np.bincount(tok, minlength=vocab_size)
    has_transitions = per_token > 0
    rng = np.random.default_rng(0)
    for _ in range(4):
        weights = rng.integers(1, 2**63, num_states, dtype=np.uint64)
        salt = np.uint64(rng.integers(1, 2**63))
        h = np.zeros(vocab_size, np.uint64)
        np.add.at(h, tok, weights[src] * (dst.astype(np.uint64) + salt))
        cls = np.zeros(vocab_size, np.int64)
        cls[has_transitions] = np.unique(h[has_transitions], return_inverse=True)[1] + 1
        table = np.zeros((num_states, int(cls.max()) + 1), np.int32)
        table[src, cls[tok]] = dst
        per_class = (table != 0).sum(0)
        if np.array_equal(table[src, cls[tok]], dst) and np.array_equal(per_class[cls], per_token):
            return cls, table
    raise RuntimeError("token classes: hash collisions in 4 attempts (should not happen)")


def from_transitions(
    src: Int[np.ndarray, " n"],
    tok: Int[np.ndarray, " n"],
    dst: Int[np.ndarray, " n"],
    *,
    initial: int,
    accepting: Iterable[int] | Int[np.ndarray, " k"],
    vocab_size: int,
    eos_token_id: tuple[int, ...],
    description: str = "",
    token_map: Int[np.ndarray, " vocab"] | None = None,
) -> TokenAutomaton:
    """Build a `TokenAutomaton` from a token-level transition list (any state numbering).

    **Arguments:** `src`, `tok`, `dst`: one entry per allowed (state, token) pair, without the
    end-of-generation tokens; `initial`, `accepting`: state ids in the same numbering (non-
    negative ints); `vocab_size`; `eos_token_id` (allowed exactly in accepting states);
    `description`; `token_map`: when given, `tok` numbers representatives of groups of tokens
    with equal transitions and `token_map[t]` is token `t`'s representative (the tables are the
    same as with every token listed).

    **Returns:** the automaton with states renumbered (0 dead, 1 initial), states that cannot
    reach an accepting state (or cannot be reached) pruned, and token classes computed.

    **Raises:** `ConstraintError` when no token sequence leads from the initial state to an
    accepting state.
    """
    src, tok, dst = (np.asarray(a, np.int64) for a in (src, tok, dst))
    accepting = np.fromiter(accepting, np.int64)
    # Dense renumbering: 1 = initial, then the others; 0 = dead.
    top = int(max(src.max(initial=0), dst.max(initial=0), accepting.max(initial=0), initial)) + 1
    present = np.zeros(top, bool)
    present[src] = present[dst] = present[accepting] = True
    present[initial] = False
    others = np.flatnonzero(present)
    lookup = np.zeros(top, np.int64)
    lookup[initial] = INITIAL
    lookup[others] = np.arange(2, others.size + 2)
    src, dst, accepting = lookup[src], lookup[dst], lookup[accepting]
    num_states = others.size + 2

    if token_map is None:
        token_class, table = _token_classes(src, tok, dst, vocab_size, num_states)
    else:
        token_map = np.asarray(token_map, np.int64)
        num_groups = int(max(token_map.max(initial=-1), tok.max(initial=-1))) + 1
        group_class, table = _token_classes(src, tok, dst, num_groups, num_states)
        token_class = group_class[token_map]

    table = np.concatenate([table, np.zeros((table.shape[0], 1), table.dtype)], axis=1)
    return from_table(table, token_class, accepting, eos_token_id, description)


def from_table(
    table: Int[np.ndarray, "states classes"],
    token_class: Int[np.ndarray, " vocab"],
    accepting: Int[np.ndarray, " k"],
    eos_token_id: tuple[int, ...],
    description: str = "",
    *,
    distinct: bool = False,
) -> TokenAutomaton:
    """Build a `TokenAutomaton` from a dense class table already numbered as the result is:
    `table[s, c]` the next state (0: none; row 0 the dead state, state 1 the initial state),
    `token_class[t]` the column of token `t`, and the `accepting` states. The LAST column is
    reserved for the end-of-generation tokens (its entries and their `token_class` entries are
    overwritten). Columns may repeat (they are merged); `table` is modified.

    States that cannot reach an accepting state, or cannot be reached, are pruned; the
    end-of-generation tokens get a column of their own that loops on accepting states.
    `distinct=True` says that the columns other than the last are distinct already (as `lift`
    builds them): they are then merged only when pruning changed the table (the merge hashes
    the whole table: 0.5-1 s for 100,000 states and 700 columns).

    **Raises:** `ConstraintError` when no token sequence leads from the initial state to an
    accepting state.
    """
    num_states = table.shape[0]
    # Distances to acceptance: a search over the reversed edges, grouped by their target
    # (`graphs.reverse`: a stable sort, or scipy's counting sort for large tables). Dead
    # entries lead to state 0, which has no successor and accepts nothing: they are left out
    # (most of a large table: 12 of 90 million entries live for MaskBench slack-app-manifest).
    table = np.ascontiguousarray(table, np.int32)
    live = table != DEAD
    index = np.int32 if table.size < 2**31 - num_states else np.int64  # scipy keeps int32 as is
    indptr = np.zeros(num_states + 1, index)
    np.cumsum(live.sum(axis=1), out=indptr[1:])
    targets = table[live]
    backward = graphs.reverse(indptr, targets.astype(index, copy=False), num_states)
    distance = _bfs_distance(backward, accepting, num_states)
    if distance[INITIAL] >= INFINITE_DISTANCE:
        raise ConstraintError(
            f"the vocabulary cannot write any text that satisfies the constraint {shorten(description)}"
        )
    hopeless = distance >= INFINITE_DISTANCE
    hopeless[DEAD] = False
    if hopeless.any():
        table[hopeless[table]] = DEAD
    reach = _bfs_distance(table, [INITIAL], num_states)
    keep = reach < INFINITE_DISTANCE
    keep[DEAD] = True
    pruned = bool(hopeless.any()) or not keep.all()
    if not keep.all():
        renumber = (np.cumsum(keep) - 1).astype(np.int32)
        table = renumber[table[keep]]
        distance = distance[keep]

    # End-of-generation tokens: a class of their own that loops on accepting states.
    table[:, -1] = np.where(distance == 0, np.arange(table.shape[0]), DEAD)
    token_class = np.array(token_class, np.int64)
    token_class[list(eos_token_id)] = table.shape[1] - 1

    # Columns may be equal (given so, or made so by pruning): merge them (the all-zero column,
    # when there is one, is class 0).
    if pruned or not distinct:
        table, inverse = unique_columns(table)
        token_class = inverse[token_class]
    return TokenAutomaton(
        token_class=token_class.astype(np.int32),
        transitions=np.ascontiguousarray(table, np.int32),
        distance=distance.astype(np.int32),
        eos_token_id=tuple(eos_token_id),
        description=description,
    )


def from_outlines_index(
    index, vocabulary: TokenVocabulary, description: str = ""
) -> TokenAutomaton:
    """Export an `outlines_core.Index` built on `vocabulary.outlines_vocabulary`.

    The `{state: {token: next}}` dictionaries are read with `numpy.fromiter` (C-level iteration,
    no Python loop over transitions); outlines-core's single EOS transition is replaced by all of
    `vocabulary.eos_token_id`.
    """
    table = index.get_transitions()
    counts = np.fromiter(map(len, table.values()), np.int64, len(table))
    total = int(counts.sum())
    src = np.repeat(np.fromiter(table.keys(), np.int64, len(table)), counts)
    tok = np.fromiter(itertools.chain.from_iterable(table.values()), np.int64, total)
    dst = np.fromiter(
        itertools.chain.from_iterable(map(dict.values, table.values())), np.int64, total
    )
    text = tok != vocabulary.outlines_eos_id
    return from_transitions(
        src[text],
        tok[text],
        dst[text],
        initial=index.get_initial_state(),
        accepting=index.get_final_states(),
        vocab_size=vocabulary.vocab_size,
        eos_token_id=vocabulary.eos_token_id,
        description=description,
    )


# ----------------------------------------------------------------------------- cache


def automaton_cache_dir() -> Path:
    """Where compiled automata are cached: `<functional_gen cache>/automata`
    (see `functional_gen.cache.cache_dir`)."""
    return cache_dir() / "automata"


_memory_cache: dict[str, TokenAutomaton] = {}
_memory_lock = threading.Lock()
_MEMORY_CACHE_SIZE = 64


def cache_key(kind: str, source: str, vocabulary: TokenVocabulary) -> str:
    """The cache key of a constraint: SHA-256 of its kind, its source text and the vocabulary's
    fingerprint (and the cache format version)."""
    digest = hashlib.sha256(f"{_FORMAT_VERSION}\0{kind}\0{vocabulary.fingerprint}\0".encode())
    digest.update(source.encode("utf-8"))
    return digest.hexdigest()[:40]


def _load(path: Path, eos_token_id) -> TokenAutomaton | None:
    try:
        with np.load(path, allow_pickle=False) as data:
            return TokenAutomaton(
                token_class=data["token_class"],
                transitions=data["transitions"],
                distance=data["distance"],
                eos_token_id=tuple(eos_token_id),
                description=str(data["description"]),
            )
    except (OSError, KeyError, ValueError):
        return None


def _save(path: Path, automaton: TokenAutomaton) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".tmp.npz", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            np.savez(
                f,
                token_class=automaton.token_class,
                transitions=automaton.transitions,
                distance=automaton.distance,
                description=np.asarray(automaton.description),
            )
        os.replace(tmp, path)
    except OSError:  # a read-only cache is not an error
        pass


def cached(
    kind: str, source: str, vocabulary: TokenVocabulary, build, *, cache: bool = True
) -> TokenAutomaton:
    """`build()` through the memory and disk caches, keyed by `cache_key(kind, source, vocabulary)`."""
    if not cache:
        return build()
    key = cache_key(kind, source, vocabulary)
    with _memory_lock:
        hit = _memory_cache.get(key)
    if hit is not None:
        return hit
    path = automaton_cache_dir() / f"{kind}-{key}.npz"
    automaton = _load(path, vocabulary.eos_token_id) if path.is_file() else None
    if automaton is None:
        automaton = build()
        _save(path, automaton)
    with _memory_lock:
        if len(_memory_cache) >= _MEMORY_CACHE_SIZE:
            _memory_cache.pop(next(iter(_memory_cache)))
        _memory_cache[key] = automaton
    return automaton


def clear_memory_cache() -> None:
    """Forget the automata cached in this process (the disk cache stays)."""
    with _memory_lock:
        _memory_cache.clear()


def shorten(text: str, limit: int = 120) -> str:
    """`repr(text)` for error messages, cut after `limit` characters (then saying how long
    `text` was)."""
    return (
        repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"
    )
