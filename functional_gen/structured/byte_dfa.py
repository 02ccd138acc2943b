"""`ByteDFA`: a DFA over bytes, and its lifting to a `TokenAutomaton` over a vocabulary.

Grammars are compiled by our own construction (`functional_gen.structured.grammar`) into a DFA
over bytes; this module turns such a DFA into the token-level tables the device uses, the job
outlines-core's `Index` does for regexes. Tokens are walked through the DFA along a trie of the
vocabulary's byte strings, level by level and for all states at once with numpy: a (state,
trie node) pair that dies is never extended, so a token prefix shared by thousands of tokens is
walked once per state, and text that the state cannot continue costs nothing.

A regex becomes a `ByteDFA` through outlines-core too: an `Index` over a vocabulary of the 256
single bytes is exactly the byte-level DFA of the regex.
"""

import dataclasses
import functools

import numpy as np
from jaxtyping import Bool, Int

from .automaton import ConstraintError, TokenAutomaton, from_transitions
from .vocabulary import TokenVocabulary

REJECT = -1
"""`ByteDFA.delta` entry of a byte that is not allowed."""


@dataclasses.dataclass(frozen=True, eq=False)
class ByteDFA:
    """A deterministic automaton over bytes.

    **Attributes:** `delta`: `Int[np.ndarray, "states 256"]`, next state per byte (`REJECT` = -1
    for a rejected byte); `accepting`: `Bool[np.ndarray, " states"]`; `initial`: the start state.
    """

    delta: Int[np.ndarray, "states 256"]
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


@functools.cache
def _byte_vocabulary():
    from outlines_core import Vocabulary

    return Vocabulary(256, {bytes([b]): [b] for b in range(256)})


_SENTINEL = "\U0010ffff"
_SENTINEL_BYTES = _SENTINEL.encode("utf-8")


@functools.lru_cache(maxsize=512)
def regex_byte_dfa(regex: str) -> ByteDFA:
    """The byte-level DFA of a regex (Rust `regex` syntax, whole-text match), via outlines-core.

    outlines-core's `Index` drops every transition into a regex-automata "match state" whose
    end of input is not a match (the DFA reports matches one byte late): on single bytes that
    loses `1.5` from `[0-9]+(\\.[0-9]+)?` (the `.` after `1`) and `abc` from `a(bc)?`. We
    compile `(?:regex)` followed by a sentinel character (U+10FFFF) instead: no match can
    happen before the sentinel, so nothing is dropped, and a state accepts the regex exactly when
    the sentinel's bytes lead it to a match.

    **Raises:** `ConstraintError` naming the regex when it does not compile or matches nothing.
    """
    from outlines_core import Index

    try:
        index = Index(f"(?:{regex}){_SENTINEL}", _byte_vocabulary())
    except (ValueError, RuntimeError) as e:
        raise ConstraintError(f"invalid regex {regex!r}: {str(e).splitlines()[0]}") from None
    table = index.get_transitions()
    raw = sorted(set(table) | {s for d in table.values() for s in d.values()} | {index.get_initial_state()})
    number = {s: i for i, s in enumerate(raw)}
    delta = np.full((len(raw), 256), REJECT, np.int32)
    for s, row in table.items():  # at most 256 entries per state: a small loop
        for b, t in row.items():
            if b < 256:
                delta[number[s], b] = number[t]
    finals = np.zeros(len(raw), bool)
    finals[[number[s] for s in index.get_final_states()]] = True
    state = np.arange(len(raw))
    for b in _SENTINEL_BYTES:
        state = np.where(state != REJECT, delta[np.maximum(state, 0), b], REJECT)
    accepting = np.where(state != REJECT, finals[np.maximum(state, 0)], False)
    return trim(ByteDFA(delta, accepting, number[index.get_initial_state()]))


def trim(dfa: ByteDFA) -> ByteDFA:
    """Keep only the states reachable from the start that can reach an accepting state.

    **Raises:** `ConstraintError` when the language is empty.
    """
    n = dfa.num_states
    delta = dfa.delta
    reach = np.zeros(n, bool)
    reach[dfa.initial] = True
    while True:
        nxt = delta[reach]
        grown = reach.copy()
        grown[nxt[nxt != REJECT]] = True
        if np.array_equal(grown, reach):
            break
        reach = grown
    alive = dfa.accepting & reach
    while True:
        targets_alive = np.where(delta != REJECT, alive[np.maximum(delta, 0)], False)
        grown = alive | (reach & targets_alive.any(1))
        if np.array_equal(grown, alive):
            break
        alive = grown
    if not alive[dfa.initial]:
        raise ConstraintError("the language is empty: no text reaches an accepting state")
    keep = np.flatnonzero(alive)
    renumber = np.full(n, REJECT, np.int64)
    renumber[keep] = np.arange(keep.size)
    new_delta = np.where(delta[keep] != REJECT, renumber[np.maximum(delta[keep], 0)], REJECT).astype(np.int32)
    return ByteDFA(new_delta, dfa.accepting[keep], int(renumber[dfa.initial]))


def minimize(dfa: ByteDFA) -> ByteDFA:
    """The minimal DFA of the same language (trimmed, then Moore's partition refinement).

    Source: E. F. Moore, "Gedanken-experiments on sequential machines" (1956); the refinement
    step is one `numpy.unique` over the rows `(block, blocks of the successors)`.
    """
    dfa = trim(dfa)
    columns, byte_class = np.unique(dfa.delta, axis=1, return_inverse=True)
    byte_class = byte_class.reshape(-1)
    blocks = dfa.accepting.astype(np.int64)
    count = len(np.unique(blocks))
    while True:
        successor = np.where(columns != REJECT, blocks[np.maximum(columns, 0)], REJECT)
        signature = np.concatenate([blocks[:, None], successor], axis=1)
        _, blocks = np.unique(signature, axis=0, return_inverse=True)
        blocks = blocks.reshape(-1)
        new_count = int(blocks.max()) + 1
        if new_count == count:
            break
        count = new_count
    representative = np.zeros(count, np.int64)
    representative[blocks] = np.arange(dfa.num_states)
    rows = columns[representative]
    merged = np.where(rows != REJECT, blocks[np.maximum(rows, 0)], REJECT)[:, byte_class]
    accepting = dfa.accepting[representative]
    return ByteDFA(merged.astype(np.int32), accepting, int(blocks[dfa.initial]))


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
    per vocabulary fingerprint)."""
    if vocabulary.fingerprint in _TRIES:
        return _TRIES[vocabulary.fingerprint]
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
    trie = TokenTrie(
        byte=np.concatenate(bytes_).astype(np.int64),
        child_ptr=child_ptr.astype(np.int64),
        token_ptr=token_ptr.astype(np.int64),
        token_ids=ids[order],
    )
    _TRIES[vocabulary.fingerprint] = trie
    return trie


def _ragged(ptr, rows):
    starts, counts = ptr[rows], ptr[rows + 1] - ptr[rows]
    total = int(counts.sum())
    owner = np.repeat(np.arange(rows.size), counts)
    index = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(starts, counts)
    return owner, index


def lift(dfa: ByteDFA, vocabulary: TokenVocabulary, description: str = "") -> TokenAutomaton:
    """The `TokenAutomaton` of a byte DFA over a vocabulary: from each state, each token whose
    bytes the DFA can read leads to the state after them (see the module docstring).

    **Raises:** `ConstraintError` when no token sequence reaches an accepting state.
    """
    dfa = trim(dfa)
    trie = token_trie(vocabulary)
    delta = dfa.delta
    states = np.arange(dfa.num_states, dtype=np.int64)
    origin, current, node = states, states, np.zeros(states.size, np.int64)
    src, tok, dst = [], [], []
    while origin.size:
        owner, child = _ragged(trie.child_ptr, node)
        nxt = delta[current[owner], trie.byte[child]]
        alive = nxt != REJECT
        origin, current, node = origin[owner[alive]], nxt[alive].astype(np.int64), child[alive]
        holder, index = _ragged(trie.token_ptr, node)
        src.append(origin[holder])
        tok.append(trie.token_ids[index])
        dst.append(current[holder])
    src, tok, dst = (np.concatenate(a) if a else np.zeros(0, np.int64) for a in (src, tok, dst))
    return from_transitions(
        src,
        tok,
        dst,
        initial=dfa.initial,
        accepting=np.flatnonzero(dfa.accepting),
        vocab_size=vocabulary.vocab_size,
        eos_token_id=vocabulary.eos_token_id,
        description=description,
    )
