"""Random strings of a grammar, for comparing our automata with lark's parser.

`sample(spec, rng)` derives a random sentence from a parsed grammar: alternatives and repeat
counts are drawn at random (the first alternative without rule references once the derivation
is deep), terminals are random walks of their byte DFAs, and `%ignore` text is put between items
now and then. `mutate` edits a string (insert, delete or replace a character). Whether a string
is in the language is decided by lark, never by this module.
"""

import numpy as np

from functional_gen.structured.byte_dfa import REJECT, regex_byte_dfa
from functional_gen.structured.grammar_syntax import Alt, Ref, Repeat, Seq, Terminal


class _TooDeep(Exception):
    pass


def _terminal(regex: str, rng) -> bytes:
    dfa = regex_byte_dfa(regex)
    state, out = dfa.initial, []
    for _ in range(40):
        edges = np.flatnonzero(dfa.delta[state] != REJECT)
        # printable ASCII only, to keep the strings readable
        edges = edges[(edges >= 32) & (edges < 127)] if (edges < 127).any() else edges
        if dfa.accepting[state] and (not edges.size or rng.random() < 0.35):
            return bytes(out)
        if not edges.size:
            break
        b = int(rng.choice(edges))
        out.append(b)
        state = int(dfa.delta[state, b])
    raise _TooDeep


def _has_ref(node) -> bool:
    if isinstance(node, Ref):
        return True
    if isinstance(node, Seq):
        return any(_has_ref(i) for i in node.items)
    if isinstance(node, Alt):
        return any(_has_ref(o) for o in node.options)
    if isinstance(node, Repeat):
        return _has_ref(node.item)
    return False


def sample(spec, rng, *, max_depth: int = 6) -> bytes:
    """A random sentence of the grammar (retries derivations that nest deeper than `max_depth`)."""

    def ignore() -> bytes:
        if spec.ignore and rng.random() < 0.2:
            return _terminal(spec.ignore[int(rng.integers(len(spec.ignore)))], rng)
        return b""

    def gen(node, depth) -> bytes:
        if isinstance(node, Terminal):
            return _terminal(node.regex, rng)
        if isinstance(node, Ref):
            if depth > max_depth:
                raise _TooDeep
            return gen(spec.rules[node.name], depth + 1)
        if isinstance(node, Seq):
            return ignore().join(gen(i, depth) for i in node.items)
        if isinstance(node, Alt):
            options = node.options
            if depth >= max_depth - 1:
                flat = [o for o in options if not _has_ref(o)]
                options = flat or options
            return gen(options[int(rng.integers(len(options)))], depth)
        if isinstance(node, Repeat):
            high = node.high if node.high is not None else node.low + 3
            n = int(rng.integers(node.low, high + 1))
            return ignore().join(gen(node.item, depth) for _ in range(n))
        raise TypeError(node)

    for _ in range(100):
        try:
            return ignore() + gen(spec.rules[spec.start], 0) + ignore()
        except _TooDeep:
            continue
    raise RuntimeError("no sentence within the depth bound in 100 tries")


def mutate(text: bytes, alphabet: bytes, rng) -> bytes:
    """`text` with one random insertion, deletion or replacement (characters from `alphabet`)."""
    i = int(rng.integers(len(text) + 1))
    c = bytes([alphabet[int(rng.integers(len(alphabet)))]])
    kind = rng.integers(3) if text else 0
    if kind == 0:
        return text[:i] + c + text[i:]
    i = min(i, len(text) - 1)
    return text[:i] + (c if kind == 2 else b"") + text[i + 1 :]
