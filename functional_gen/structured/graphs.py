"""Searches of the small directed graphs that building automata needs (reachability, reversed
edges, strongly connected components), without importing scipy for small graphs.

scipy's compressed sparse graphs are fast on large graphs, but importing `scipy.sparse.csgraph`
takes 0.3-0.5 s (it pulls in `scipy.sparse.linalg` and `scipy.linalg`), most of the first
compile of a typical JSON Schema in a fresh process (MaskBench kb_906: 0.95 s cold, 0.35 s
again). Most automata are small: below `SCIPY_MIN_EDGES` edges these functions search in plain
Python and numpy (a few milliseconds), above it they call scipy, whose import the graph's own
work then dwarfs. Both paths give identical results (`tests/structured/test_graphs.py`).

A graph is CSR: `indptr` (`Int[np.ndarray, " nodes_plus_one"]`) and `indices` (`Int[np.ndarray,
" edges"]`), the successors of node `v` being `indices[indptr[v]:indptr[v + 1]]` (a row may
repeat a successor).

Sources: scipy.sparse.csgraph (`breadth_first_order`, `connected_components`); R. Tarjan,
"Depth-first search and linear graph algorithms" (SIAM J. Comput., 1972).
"""

import typing

import numpy as np
from jaxtyping import Bool, Int

SCIPY_MIN_EDGES = 200_000
"""Graphs with at least this many edges are searched by scipy (`scipy.sparse.csgraph`), smaller
ones in Python and numpy. Python's search costs about 0.1 us per edge: 20 ms at this size,
against the 0.3-0.5 s of importing scipy's graph module in a fresh process."""


def _small(indices, small: bool | None) -> bool:
    return indices.size < SCIPY_MIN_EDGES if small is None else small


def reachable(
    indptr, indices, sources, num_nodes: int, *, small: bool | None = None
) -> Bool[np.ndarray, " nodes"]:
    """Which nodes are reachable from any of `sources` (the sources included).

    **Arguments:** `indptr`, `indices`: the CSR graph; `sources`: node ids in
    `[0, num_nodes)`; `small`: force the Python search (True) or scipy's (False); default by
    the number of edges (`SCIPY_MIN_EDGES`).

    **Returns:** `Bool[np.ndarray, " nodes"]`.
    """
    indptr, indices = np.asarray(indptr), np.asarray(indices)
    if _small(indices, small):
        return _reachable_python(indptr, indices, sources, num_nodes)
    # deferred on purpose: scipy.sparse is slow to import, needed only for large graphs
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import breadth_first_order

    # one breadth-first search from an extra node whose successors are the sources
    sources = np.asarray(sources, indices.dtype)
    indptr = np.concatenate([indptr, np.asarray([indptr[-1] + sources.size], indptr.dtype)])
    indices = np.concatenate([indices, sources])
    graph = csr_array(
        (np.ones(indices.size, np.int8), indices, indptr), shape=(num_nodes + 1, num_nodes + 1)
    )
    order = breadth_first_order(graph, num_nodes, directed=True, return_predecessors=False)
    reached = np.zeros(num_nodes + 1, bool)
    reached[order] = True
    return reached[:num_nodes]


@typing.no_type_check
def _reachable_python(indptr, indices, sources, num_nodes):
    starts, successors = indptr.tolist(), indices.tolist()
    reached = bytearray(num_nodes)
    stack = []
    for s in np.asarray(sources, np.int64).reshape(-1).tolist():
        if not reached[s]:
            reached[s] = 1
            stack.append(s)
    while stack:
        node = stack.pop()
        for successor in successors[starts[node] : starts[node + 1]]:
            if not reached[successor]:
                reached[successor] = 1
                stack.append(successor)
    return np.frombuffer(bytes(reached), np.uint8).astype(bool)


def reverse(
    indptr, indices, num_nodes: int, *, small: bool | None = None
) -> tuple[Int[np.ndarray, " nodes_plus_one"], Int[np.ndarray, " edges"]]:
    """The reversed graph in CSR (the CSC layout of the same matrix): for each node its
    predecessors, in increasing order of the source node (a repeated edge repeats), in the
    dtype of `indices`.

    **Arguments:** as `reachable` (`small`: a stable numpy sort, or scipy's `tocsc`).
    """
    indptr, indices = np.asarray(indptr), np.asarray(indices)
    if _small(indices, small):
        counts = np.bincount(indices, minlength=num_nodes)
        back_ptr = np.zeros(num_nodes + 1, indices.dtype)
        np.cumsum(counts, out=back_ptr[1:])
        rows = np.repeat(np.arange(num_nodes, dtype=indices.dtype), np.diff(indptr))
        return back_ptr, rows[np.argsort(indices, kind="stable")]
    # deferred on purpose: scipy.sparse is slow to import, needed only for large graphs
    from scipy.sparse import csr_array

    matrix = csr_array(
        (np.ones(indices.size, np.int8), indices, indptr), shape=(num_nodes, num_nodes)
    ).tocsc()
    return matrix.indptr, matrix.indices


def strong_components(
    indptr, indices, num_nodes: int, *, small: bool | None = None
) -> tuple[int, Int[np.ndarray, " nodes"]]:
    """`(count, labels)`: the strongly connected components, `labels[v]` in `[0, count)`.

    With the Python search (Tarjan's, iterative) the labels are in reverse topological order:
    every edge leads to an equal or lower label. scipy's labels (`connected_components(...,
    connection="strong")`) are too in practice; callers that rely on it check it.

    **Arguments:** as `reachable`.
    """
    indptr, indices = np.asarray(indptr), np.asarray(indices)
    if _small(indices, small):
        return _tarjan(indptr, indices, num_nodes)
    # deferred on purpose: scipy.sparse is slow to import, needed only for large graphs
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import connected_components

    graph = csr_array(
        (np.ones(indices.size, np.int8), indices, indptr), shape=(num_nodes, num_nodes)
    )
    count, labels = connected_components(graph, directed=True, connection="strong")
    return int(count), labels


@typing.no_type_check
def _tarjan(indptr, indices, num_nodes):
    starts, successors = indptr.tolist(), indices.tolist()
    index = [-1] * num_nodes
    low = [0] * num_nodes
    on_stack = bytearray(num_nodes)
    label = [0] * num_nodes
    stack = []
    counter = count = 0
    for root in range(num_nodes):
        if index[root] != -1:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = 1
        work = [[root, starts[root]]]
        while work:
            frame = work[-1]
            node, i = frame
            end = starts[node + 1]
            descended = False
            while i < end:
                successor = successors[i]
                i += 1
                if index[successor] == -1:
                    frame[1] = i
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack[successor] = 1
                    work.append([successor, starts[successor]])
                    descended = True
                    break
                if on_stack[successor] and index[successor] < low[node]:
                    low[node] = index[successor]
            if descended:
                continue
            work.pop()
            if low[node] == index[node]:  # `node` roots a component: it is complete
                while True:
                    member = stack.pop()
                    on_stack[member] = 0
                    label[member] = count
                    if member == node:
                        break
                count += 1
            if work:
                parent = work[-1][0]
                if low[node] < low[parent]:
                    low[parent] = low[node]
    return count, np.asarray(label, np.int64)
