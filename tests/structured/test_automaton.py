"""Token automata: the device mask against outlines-core's `Guide`, the disk cache, the sizes.

Our tables come from our own lifting of the regex's byte DFA (see `build_regex_automaton`).
The reference is outlines-core's token `Index` of the regex followed by a sentinel character:
with nothing able to match before the sentinel, its `Guide` has none of the gaps of a plain
`Index` (tokens ending one byte after a match), so on every text token it must allow exactly
what we allow; acceptance (EOS) is checked against `re.fullmatch` of the text so far.
"""

import re

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from outlines_core import Guide, Index

import functional_gen as fg
from functional_gen.structured import (
    ConstraintError,
    byte_dfa as byte_dfa_module,
    json_schema_regex,
    regex_automaton,
)
from functional_gen.structured.automaton import INFINITE_DISTANCE, INITIAL, clear_memory_cache

from .cases import CHOICES, REGEXES, SCHEMAS
from .helpers import context_for

_process = eqx.filter_jit(lambda p, s, logits, c: p.process(s, logits, c))
SENTINEL = "\U0010ffff"

CASES = [
    ("regex", REGEXES["date"][1]),
    ("regex", REGEXES["email"][1]),  # "a@b.co" then "." (a longer domain): a gap of Index alone
    ("regex", REGEXES["unicode"][1]),
    ("regex", REGEXES["qa"][1]),
    ("regex", REGEXES["temperature"][1]),  # "12" then "." then "5": a gap of Index alone
    ("choice", CHOICES["capital"][1]),  # "Paris" then ", France": a gap of Index alone
    ("schema", SCHEMAS["person"][1]),
    ("schema", SCHEMAS["unicode"][1]),
    ("schema", SCHEMAS["order"][1]),
    ("schema", SCHEMAS["weather"][1]),  # decimals
]


def _processor_and_pattern(kind, source, tokenizer):
    if kind == "regex":
        return fg.processors.Regex(source, tokenizer), source
    if kind == "choice":
        return fg.processors.Choice(source, tokenizer), fg.structured.choice_regex(source)
    return fg.processors.JsonSchema(source, tokenizer), json_schema_regex(source)


def _text(vocabulary, path):
    try:
        return b"".join(vocabulary.token_bytes[t] for t in path).decode("utf-8")
    except UnicodeDecodeError:  # in the middle of a character: never a complete match
        return None


@pytest.mark.parametrize("kind,source", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_device_mask_equals_outlines_guide_along_sampled_paths(tokenizer, vocabulary, kind, source):
    processor, pattern = _processor_and_pattern(kind, source, tokenizer)
    index = Index(f"(?:{pattern}){SENTINEL}", vocabulary.outlines_vocabulary)
    python = re.compile(pattern)
    eos = list(vocabulary.eos_token_id)
    # Tokens holding the sentinel's lead byte 0xF4 (code points from U+100000, unassigned) are
    # where the two automata may differ; they are left out of the comparison.
    comparable = np.array([b is not None and 0xF4 not in b for b in vocabulary.token_bytes])
    rng = np.random.default_rng(0)
    zeros = jnp.zeros(vocabulary.vocab_size, jnp.float32)
    prompt = [1]
    for _ in range(3):
        guide, path = Guide(index), []
        state = processor.init(context_for(prompt, 1, max_len=128))
        for _step in range(60):
            state, logits = _process(
                processor, state, zeros, context_for(prompt + path, 1, max_len=128)
            )
            mask = np.asarray(logits) == 0
            expected = np.zeros(vocabulary.vocab_size, bool)
            expected[guide.get_tokens()] = True
            np.testing.assert_array_equal(mask[comparable], expected[comparable])
            text = _text(vocabulary, path)
            accepting = text is not None and python.fullmatch(text) is not None
            assert (mask[eos] == accepting).all(), (text, mask[eos])
            choices = np.flatnonzero(expected & comparable)
            if choices.size == 0:
                break
            token = int(rng.choice(choices))
            guide.advance(token)
            path.append(token)


def _order_copies(schema, root=None) -> int:
    """The most copies of one member's states in the DFA of `schema` with members in any order
    (the default): an object of n members needs to know which of them were written (it decides
    which keys may follow and whether `}` may), so each member's states appear once per set of
    the other n - 1 written before it, `2 ** (n - 1)` times, and that again within each copy of
    the objects around it. (Local `$ref`s to `$defs` followed; no recursion.)"""
    root = schema if root is None else root
    if not isinstance(schema, dict):
        return 1
    if "$ref" in schema:
        return _order_copies(root["$defs"][schema["$ref"].split("/")[-1]], root)
    properties = schema.get("properties", {})
    inner = [_order_copies(s, root) for s in [*properties.values(), schema.get("items")]]
    return (2 ** (len(properties) - 1) if properties else 1) * max(inner)


def test_tables_are_small_and_never_dense(vocabulary):
    for name in ("product", "book", "team", "recipe"):
        # closed objects: an open one adds a free-form value per object (team: 2,210 states, 2.2 MiB)
        schema = SCHEMAS[name][1]
        ordered = regex_automaton(
            json_schema_regex(schema, closed_objects=True, property_order="schema"), vocabulary
        )
        default = regex_automaton(json_schema_regex(schema, closed_objects=True), vocabulary)
        assert ordered.nbytes < 2 * 2**20, (name, ordered)
        # in any order (the default), at most `_order_copies` times the states: no DFA that
        # accepts every order is smaller (a pushdown form calling the values would be);
        # measured: 'product' 13,965 states, 11.96 MiB (five members: 16 copies), 'book' 9,690
        # states, 7.58 MiB (16), 'team' 3,988 states, 2.85 MiB (4): over the schema order's
        # 2 MiB, the price of accepting every order
        copies = _order_copies(schema)
        assert default.num_states <= copies * ordered.num_states, (name, copies, default, ordered)
        for a in (ordered, default):
            # never dense: classes of tokens, not the vocabulary, index the table (a dense
            # int32 [states, vocab] table would be 35 MiB to 2.7 GiB here)
            assert a.transitions.shape[1] < 300 and a.token_class.shape == (vocabulary.vocab_size,)
            assert a.nbytes < a.num_states * vocabulary.vocab_size * 4 / 100
            assert (
                a.distance[INITIAL] < INFINITE_DISTANCE
                and (a.distance[1:] < INFINITE_DISTANCE).all()
            )


def test_disk_cache_round_trip(vocabulary, tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCTIONAL_GEN_CACHE", str(tmp_path))
    clear_memory_cache()
    first = regex_automaton(r"[a-f]{2}-[0-9]+", vocabulary)
    files = list((tmp_path / "automata").glob("regex-*.npz"))
    assert len(files) == 1
    clear_memory_cache()

    def fail(*args, **kwargs):
        raise AssertionError("compiled again instead of loading the cache")

    monkeypatch.setattr(byte_dfa_module, "build_regex_automaton", fail)
    second = regex_automaton(r"[a-f]{2}-[0-9]+", vocabulary)
    for field in ("token_class", "transitions", "distance"):
        np.testing.assert_array_equal(getattr(first, field), getattr(second, field))
    assert second.eos_token_id == vocabulary.eos_token_id
    # Another vocabulary (other EOS ids) is another cache entry.
    from functional_gen.structured.vocabulary import TokenVocabulary

    other = TokenVocabulary(vocabulary.token_bytes, (2,), "other-fingerprint")
    monkeypatch.undo()
    monkeypatch.setenv("FUNCTIONAL_GEN_CACHE", str(tmp_path))
    regex_automaton(r"[a-f]{2}-[0-9]+", other)
    assert len(list((tmp_path / "automata").glob("regex-*.npz"))) == 2
    clear_memory_cache()


@pytest.mark.parametrize("pattern", ["(", "a{3", "[z-a]", "(?=a)b", r"\bword\b"])
def test_invalid_regex_names_the_pattern(tokenizer, pattern):
    with pytest.raises(ConstraintError, match="invalid regex") as info:
        fg.processors.Regex(pattern, tokenizer)
    assert repr(pattern) in str(info.value)


def test_unwritable_regex():
    # A word-level vocabulary of "t0" ... "t99" cannot write an "x".
    from tests.helpers import tiny_tokenizer

    with pytest.raises(ConstraintError, match="cannot write"):
        fg.processors.Regex("x+", tiny_tokenizer(100))
    assert fg.processors.Regex("(t[0-9])+", tiny_tokenizer(100)).num_constraints == 1


# ----------------------------------------------------------------------------- table helpers


def _plain_bfs(successors, sources):
    """Breadth-first distance with a queue: `successors[s]` lists the successors of `s`."""
    distance = {int(s): 0 for s in sources}
    queue = list(distance)
    for state in queue:
        for target in successors[state]:
            if int(target) not in distance:
                distance[int(target)] = distance[state] + 1
                queue.append(int(target))
    return distance


def test_unique_columns_groups_exactly_like_numpy():
    from functional_gen.structured.automaton import unique_columns

    rng = np.random.default_rng(0)
    for rows, cols, values in [(1, 5, 2), (7, 40, 3), (300, 60, 2), (5000, 30, 4), (9000, 3, 1)]:
        base = rng.integers(-1, values, (rows, cols))
        base[:, 0] = 0  # an all-zero column...
        matrix = base[:, rng.integers(0, cols, 2 * cols)]  # ...and repeats, in any order
        distinct, inverse = unique_columns(matrix)
        reference = np.unique(matrix, axis=1)
        np.testing.assert_array_equal(distinct[:, inverse], matrix)
        assert distinct.shape == reference.shape  # as many groups: each column once
        assert {c.tobytes() for c in distinct.T} == {c.tobytes() for c in reference.T}
        if not matrix.any(axis=0).all():
            assert not distinct[:, 0].any()  # the all-zero column first


@pytest.mark.parametrize("dense", [True, False])
def test_bfs_distance_equals_a_plain_breadth_first_search(dense):
    from functional_gen.structured.automaton import _bfs_distance

    rng = np.random.default_rng(1)
    for states, degree in [(1, 1), (30, 2), (400, 3), (2000, 1)]:
        table = rng.integers(0, states, (states, degree))
        table[rng.random(table.shape) < 0.3] = 0  # edges to state 0 (the dead state's place)
        sources = rng.integers(0, states, 3)
        expected = _plain_bfs(table, sources)
        graph = table
        if not dense:  # the same edges as a CSR, rows shuffled and repeated
            rows = [np.concatenate([r, r[:1]])[rng.permutation(degree + 1)] for r in table]
            indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])])
            graph = (indptr, np.concatenate(rows))
        distance = _bfs_distance(graph, sources, states)
        for state in range(states):
            assert distance[state] == expected.get(state, INFINITE_DISTANCE)


def test_from_table_keeps_exactly_the_useful_states_with_their_distances():
    # states reachable from the initial state that can reach an accepting one are kept, in
    # order, with the fewest tokens to acceptance; the rest are pruned and entries into them
    # are dropped (plain searches on the host as the reference)
    from functional_gen.structured.automaton import from_table

    rng = np.random.default_rng(2)
    for trial in range(40):
        states, classes = int(rng.integers(3, 40)), int(rng.integers(1, 6))
        table = rng.integers(0, states, (states, classes + 1)).astype(np.int32)
        table[rng.random(table.shape) < 0.5] = 0
        table[0] = 0  # the dead state
        table[:, -1] = 0  # the end-of-generation column, reserved
        accepting = np.flatnonzero(rng.random(states) < 0.2)
        accepting = accepting[accepting > 0]
        backward = [[] for _ in range(states)]
        for s in range(1, states):
            for target in table[s, :-1]:
                if target:
                    backward[target].append(s)
        to_accept = _plain_bfs(backward, accepting)
        if INITIAL not in to_accept:
            with pytest.raises(ConstraintError):
                from_table(table.copy(), np.arange(classes + 1), accepting, (classes,))
            continue
        useful = [[t for t in table[s, :-1] if t and int(t) in to_accept] for s in range(states)]
        reached = _plain_bfs(useful, [INITIAL])
        kept = [0] + sorted(s for s in reached if s in to_accept)
        token_class = np.arange(classes + 1)  # token t: column t; token `classes`: EOS
        automaton = from_table(table.copy(), token_class, accepting, (classes,))
        assert automaton.num_states == len(kept), trial
        new = {old: i for i, old in enumerate(kept)}
        for old in kept[1:]:
            assert automaton.distance[new[old]] == to_accept[old]
            for token in range(classes):
                expected = new.get(int(table[old, token]), 0)
                assert automaton.next_state(new[old], token) == expected
            eos = automaton.next_state(new[old], classes)
            assert eos == (new[old] if old in accepting else 0)
