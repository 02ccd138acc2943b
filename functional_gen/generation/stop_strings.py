"""`StopStrings`: end a row when its generated text contains a stop string, matched on the device.

Each stop string is a byte-level Knuth-Morris-Pratt automaton (state = how many bytes of the
string the text currently ends with). Feeding a whole token to it is precomputed for every token
and every state, so one step is a table lookup per row and stop string: no host work, no decoding
inside the loop. A stop string is found even when it spans several tokens or ends inside a token
(the rest of that token is cut from the returned text, as vLLM does).

Tables: tokens that contain none of a stop string's bytes all reset it to state 0, so only the
others get rows: `token_class[stop, token]` is 0 for "resets" or the token's row in
`transitions[stop, class, state]`. Source: Knuth, Morris & Pratt 1977; the stopping rule is
vLLM's `stop` / transformers' `StopStringCriteria`.
"""

from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int

from ..tokenization import token_bytes


def _kmp_automaton(pattern: bytes) -> np.ndarray:
    """`delta[state, byte]` of the KMP automaton of `pattern`; state `len(pattern)` is absorbing."""
    n = len(pattern)
    delta = np.zeros((n + 1, 256), np.int32)
    delta[0, pattern[0]] = 1
    fallback = 0
    for state in range(1, n):
        delta[state] = delta[fallback]
        delta[state, pattern[state]] = state + 1
        fallback = delta[fallback, pattern[state]]
    delta[n] = n
    return delta


def _token_transitions(pattern: bytes, tokens: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """`(token_class [vocab], transitions [classes + 1, len(pattern) + 1])` for one stop string."""
    n = len(pattern)
    delta = _kmp_automaton(pattern)
    wanted = set(pattern)
    relevant = [i for i, b in enumerate(tokens) if b and not wanted.isdisjoint(b)]
    token_class = np.zeros(len(tokens), np.int32)
    if not relevant:
        return token_class, np.zeros((1, n + 1), np.int32)
    longest = max(len(tokens[i]) for i in relevant)
    data = np.full((len(relevant), longest), -1, np.int32)
    for row, i in enumerate(relevant):
        data[row, : len(tokens[i])] = np.frombuffer(tokens[i], np.uint8)
    # Run every relevant token from every start state at once, one byte position at a time.
    states = np.broadcast_to(np.arange(n + 1, dtype=np.int32), (len(relevant), n + 1)).copy()
    for col in range(longest):
        byte = data[:, col : col + 1]
        stepped = delta[states, np.maximum(byte, 0)]
        states = np.where(byte >= 0, stepped, states)
    # Identical rows share one class.
    rows, inverse = np.unique(states, axis=0, return_inverse=True)
    token_class[relevant] = inverse.reshape(-1) + 1
    transitions = np.concatenate([np.zeros((1, n + 1), np.int32), rows.astype(np.int32)])
    return token_class, transitions


class StopStrings(eqx.Module):
    """Device-side matcher for a set of stop strings (build it with `StopStrings.build`).

    **Attributes:**

    - `stop_strings`: the strings (static).
    - `lengths`: their lengths in UTF-8 bytes (static); state `lengths[i]` means "matched".
    - `token_class`: `Int[Array, "stops vocab"]`, per stop string the transition row of each token
      (0: the token resets the match).
    - `transitions`: `Int[Array, "stops classes states"]`, the next state after feeding a whole
      token of that class from each state (padded with zeros).
    """

    stop_strings: tuple[str, ...] = eqx.field(static=True)
    lengths: tuple[int, ...] = eqx.field(static=True)
    token_class: Int[Array, "stops vocab"]
    transitions: Int[Array, "stops classes states"]

    @classmethod
    def build(cls, stop_strings: str | Sequence[str], tokenizer, vocab_size: int) -> "StopStrings":
        """Precompute the tables for `stop_strings` over the tokenizer's vocabulary.

        **Arguments:** `stop_strings`: a string or a list; `tokenizer`: a transformers tokenizer;
        `vocab_size`: the model's vocabulary size.

        **Raises:** `ValueError` for an empty stop string or a non-string entry.
        """
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        stop_strings = tuple(stop_strings)
        for s in stop_strings:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        tokens = token_bytes(tokenizer, vocab_size)
        classes, tables = zip(
            *(_token_transitions(s.encode("utf-8"), tokens) for s in stop_strings)
        )
        n_classes = max(t.shape[0] for t in tables)
        n_states = max(t.shape[1] for t in tables)
        padded = np.zeros((len(tables), n_classes, n_states), np.int32)
        for i, t in enumerate(tables):
            padded[i, : t.shape[0], : t.shape[1]] = t
        return cls(
            stop_strings=stop_strings,
            lengths=tuple(len(s.encode("utf-8")) for s in stop_strings),
            token_class=jnp.asarray(np.stack(classes)),
            transitions=jnp.asarray(padded),
        )

    def init(self, batch_size: int) -> Int[Array, "batch stops"]:
        """The match state of every row before generation: nothing matched."""
        return jnp.zeros((batch_size, len(self.stop_strings)), jnp.int32)

    def advance(
        self, state: Int[Array, "batch stops"], token_ids: Int[Array, " batch"]
    ) -> tuple[Int[Array, "batch stops"], Bool[Array, " batch"]]:
        """Feed one token per row. **Returns:** `(state, matched)`, `matched[b]` when row `b`'s
        text now contains one of the stop strings."""
        stops = jnp.arange(len(self.stop_strings))
        cls = self.token_class[stops[None, :], token_ids[:, None]]  # [batch, stops]
        new = self.transitions[stops[None, :], cls, state]
        matched = jnp.any(new >= jnp.asarray(self.lengths)[None, :], axis=1)
        return new, matched


def truncate_at_stop(text: str, stop_strings: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` before the first occurrence of any stop string. **Returns:** `(text, found)`."""
    cut = min((i for i in (text.find(s) for s in stop_strings) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)
