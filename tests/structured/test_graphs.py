"""`functional_gen.structured.graphs`: the Python searches for small graphs give what scipy's
give (reachability, reversed edges; strong components as the same partition, in reverse
topological order), and the automata built without scipy are the same."""

import numpy as np
import pytest

from functional_gen.structured import graphs


def _random_graph(rng, n: int, edges: int):
    sources = rng.integers(0, n, edges)
    targets = rng.integers(0, n, edges)
    order = np.argsort(sources, kind="stable")
    indptr = np.searchsorted(sources[order], np.arange(n + 1)).astype(np.int32)
    return indptr, targets[order].astype(np.int32)


def _python_reachable(indptr, indices, sources, n):
    """A plain set-based search: the reference."""
    seen, todo = {int(s) for s in sources}, [int(s) for s in sources]
    while todo:
        v = todo.pop()
        for w in indices[indptr[v] : indptr[v + 1]].tolist():
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return np.isin(np.arange(n), list(seen))


def _partition(labels):
    """The components as a set of frozensets (labels renamed away)."""
    groups = {}
    for v, label in enumerate(labels.tolist()):
        groups.setdefault(label, set()).add(v)
    return {frozenset(g) for g in groups.values()}


@pytest.mark.parametrize("seed", range(6))
def test_small_searches_match_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 120))
    indptr, indices = _random_graph(rng, n, int(rng.integers(0, 3 * n)))
    sources = rng.integers(0, n, int(rng.integers(1, 4)))

    small = graphs.reachable(indptr, indices, sources, n, small=True)
    assert np.array_equal(small, graphs.reachable(indptr, indices, sources, n, small=False))
    assert np.array_equal(small, _python_reachable(indptr, indices, sources, n))

    back_small = graphs.reverse(indptr, indices, n, small=True)
    back_scipy = graphs.reverse(indptr, indices, n, small=False)
    for a, b in zip(back_small, back_scipy):
        assert np.array_equal(a, b)
    # the reversed graph holds exactly the reversed edges
    forward = {(v, int(w)) for v in range(n) for w in indices[indptr[v] : indptr[v + 1]]}
    ptr, pred = back_small
    backward = {(int(u), v) for v in range(n) for u in pred[ptr[v] : ptr[v + 1]]}
    assert forward == backward

    count, labels = graphs.strong_components(indptr, indices, n, small=True)
    scipy_count, scipy_labels = graphs.strong_components(indptr, indices, n, small=False)
    assert count == scipy_count and _partition(labels) == _partition(scipy_labels)
    # mutual reachability is what a component means; edges never lead to a higher label
    closure = np.array(
        [_python_reachable(indptr, indices, [v], n) for v in range(n)], bool
    ).reshape(n, n)
    assert np.array_equal(labels[:, None] == labels[None, :], closure & closure.T)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    assert (labels[rows] >= labels[indices]).all()


def test_deep_chain_does_not_recurse():
    """A 50,000-node cycle (one component) and a path: iterative searches, no recursion limit."""
    n = 50_000
    indptr = np.arange(n + 1, dtype=np.int32)
    cycle = ((np.arange(n) + 1) % n).astype(np.int32)
    count, labels = graphs.strong_components(indptr, cycle, n, small=True)
    assert count == 1
    path = np.minimum(np.arange(n) + 1, n - 1).astype(np.int32)
    count, labels = graphs.strong_components(indptr, path, n, small=True)
    assert count == n and labels[0] == n - 1 and labels[-1] == 0
    assert graphs.reachable(indptr, path, [n // 2], n, small=True).sum() == n - n // 2


def test_trim_and_minimize_equal_through_either_search(monkeypatch):
    """Automata trimmed and minimised with every graph searched by scipy are the ones the
    small-graph searches give (same arrays, not only the same language)."""
    from functional_gen.structured import byte_dfa

    patterns = [r"\[(?:\"[0-9a-f]{3}\",){0,40}\]", r"(?:[ab]{1,3};){0,30}(?:c[0-9]*)?", "x|y+z"]
    small = []
    for p in patterns:
        dfa = byte_dfa.regex_byte_dfa.__wrapped__(p)
        small.append(byte_dfa.minimize(dfa))
    monkeypatch.setattr(graphs, "SCIPY_MIN_EDGES", 0)
    for p, expected in zip(patterns, small):
        dfa = byte_dfa.regex_byte_dfa.__wrapped__(p)
        got = byte_dfa.minimize(dfa)
        assert np.array_equal(got.delta, expected.delta)
        assert np.array_equal(got.accepting, expected.accepting)
        assert got.initial == expected.initial
