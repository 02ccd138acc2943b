"""Byte DFAs (regex -> DFA via outlines-core, minimisation) against Python's `re`, and our token
lifting against outlines-core's own token `Index` (exported with `from_outlines_index`) where
that `Index` has no gap: masks, next states and distances all equal."""

import contextlib
import itertools
import re

import numpy as np
import pytest
from outlines_core import Index

from functional_gen.structured import json_schema_regex, regex_automaton
from functional_gen.structured.automaton import from_outlines_index
from functional_gen.structured.byte_dfa import ByteDFA, minimize, regex_byte_dfa

from .cases import REGEXES, SCHEMAS


def _strings(alphabet, max_length):
    for n in range(max_length + 1):
        for chars in itertools.product(alphabet, repeat=n):
            yield "".join(chars)


@pytest.mark.parametrize(
    "pattern,alphabet",
    [
        (r"a(bc)?", "abc"),  # outlines-core's Index alone drops "abc" here
        (r"[0-9]+(\.[0-9]+)?", "1.x"),  # ... and "1.5" here
        (r"cat|category", "catego"),
        (r"(a|b)*abb", "ab"),
        (r"x[0-9]*y?", "xy1"),
        (r"(é|ü)+[a-c]{0,2}", "éüac"),
    ],
)
def test_regex_byte_dfa_is_the_regex(pattern, alphabet):
    dfa = regex_byte_dfa(pattern)
    small = minimize(dfa)
    python = re.compile(pattern)
    for text in _strings(alphabet, 7 if len(alphabet) <= 3 else 5):
        expected = bool(python.fullmatch(text))
        assert dfa.matches(text.encode()) == expected, text
        assert small.matches(text.encode()) == expected, text


def test_minimize_gives_the_minimal_automaton():
    assert minimize(regex_byte_dfa(r"(a|b)*abb")).num_states == 4  # the textbook example
    # Two writings of (ab)+ (start, after a, after ab) give the same three states.
    assert (
        minimize(regex_byte_dfa(r"(ab|ab)(ab)*")).num_states
        == minimize(regex_byte_dfa(r"(ab)+")).num_states
        == 3
    )
    with pytest.raises(ValueError, match="empty"):
        minimize(ByteDFA(np.full((2, 256), -1, np.int32), np.array([False, False]), 0))


# Constraints where no match can be continued into a longer one through a non-match, so that
# outlines-core's Index has no gap.
@pytest.mark.parametrize("name", ["date", "phone", "ipv4", "uuid4"])
def test_lift_equals_outlines_token_index(vocabulary, name):
    _check_lift(vocabulary, REGEXES[name][1])


def test_lift_equals_outlines_token_index_on_json(vocabulary):
    _check_lift(vocabulary, json_schema_regex(SCHEMAS["person"][1]))


def test_the_gaps_of_index_alone_are_closed(vocabulary):
    # "12" "." "5" and "cat" "e" "gory": outlines-core's Index drops the middle token.
    single = {c: vocabulary.byte_map[c.encode()][0] for c in "125.category"}  # one-character tokens
    for pattern, text in [(r"[0-9]+(\.[0-9]+)?", "12.5"), ("cat|category", "category")]:
        ours = regex_automaton(pattern, vocabulary)
        index = from_outlines_index(Index(pattern, vocabulary.outlines_vocabulary), vocabulary)
        ids = [single[c] for c in text]
        assert ours.accepting[ours.walk(ids)]
        assert index.walk(ids) == 0  # dead: the gap


def _check_lift(vocabulary, pattern):
    ours = regex_automaton(pattern, vocabulary)  # our lifting
    reference = from_outlines_index(Index(pattern, vocabulary.outlines_vocabulary), vocabulary)
    rng = np.random.default_rng(0)
    for _ in range(10):
        a = b = 1
        for _ in range(50):
            mask = ours.allowed(a)
            np.testing.assert_array_equal(mask, reference.allowed(b))
            assert ours.distance[a] == reference.distance[b]
            choices = np.flatnonzero(mask)
            choices = choices[~np.isin(choices, vocabulary.eos_token_id)]
            if not choices.size:
                break
            token = int(rng.choice(choices))
            a, b = ours.next_state(a, token), reference.next_state(b, token)


def _walk_lift(dfa, vocabulary):
    """The reference lifting: walk every (state, trie node) pair along the trie, level by level
    (what `lift` did before it composed per-node state maps)."""
    from functional_gen.structured.automaton import from_transitions
    from functional_gen.structured.byte_dfa import REJECT, ragged_rows, token_trie, trim

    dfa = trim(dfa)
    trie = token_trie(vocabulary)
    states = np.arange(dfa.num_states, dtype=np.int64)
    origin, current, node = states, states, np.zeros(states.size, np.int64)
    src, tok, dst = [], [], []
    while origin.size:
        owner, child = ragged_rows(trie.child_ptr, node)
        nxt = dfa.delta[current[owner], trie.byte[child]]
        alive = nxt != REJECT
        origin, current, node = origin[owner[alive]], nxt[alive].astype(np.int64), child[alive]
        holder, index = ragged_rows(trie.token_ptr, node)
        src.append(origin[holder])
        tok.append(trie.token_ids[index])
        dst.append(current[holder])
    return from_transitions(
        np.concatenate(src),
        np.concatenate(tok),
        np.concatenate(dst),
        initial=dfa.initial,
        accepting=np.flatnonzero(dfa.accepting),
        vocab_size=vocabulary.vocab_size,
        eos_token_id=vocabulary.eos_token_id,
    )


@pytest.mark.parametrize("name", ["date", "phone", "ipv4", "uuid4", "person", "order", "unicode"])
def test_lift_tables_equal_the_state_by_state_walk(vocabulary, name):
    from functional_gen.structured.byte_dfa import lift

    pattern = REGEXES[name][1] if name in REGEXES else json_schema_regex(SCHEMAS[name][1])
    dfa = minimize(regex_byte_dfa(pattern))
    ours, reference = lift(dfa, vocabulary), _walk_lift(dfa, vocabulary)
    for field in ("token_class", "transitions", "distance"):
        assert getattr(ours, field).dtype == getattr(reference, field).dtype
    # equal up to the numbering of the token classes (`lift` keeps its own column order)
    for a, b in zip(_by_class_order(ours), _by_class_order(reference), strict=True):
        np.testing.assert_array_equal(a, b)


def _by_class_order(automaton):
    """`(token_class, transitions, distance)` with the classes in `unique_columns`' order."""
    from functional_gen.structured.automaton import unique_columns

    transitions, inverse = unique_columns(automaton.transitions)
    return inverse[automaton.token_class], transitions, automaton.distance


def test_lift_tables_equal_the_state_by_state_walk_on_random_dfas(vocabulary):
    from functional_gen.structured.byte_dfa import lift

    rng = np.random.default_rng(0)
    for states in (5, 40):
        delta = rng.integers(0, states, (states, 256)).astype(np.int32)
        delta[rng.random((states, 256)) < 0.7] = -1
        dfa = ByteDFA(delta, rng.random(states) < 0.3, 0)
        ours, reference = lift(dfa, vocabulary), _walk_lift(dfa, vocabulary)
        for a, b in zip(_by_class_order(ours), _by_class_order(reference), strict=True):
            np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- compile speed-ups


def _canonical(dfa):
    """`(delta, accepting)` with states renumbered in breadth-first order from the start (bytes
    in order): equal for two DFAs exactly when they are the same automaton up to renaming."""
    order, queue = {dfa.initial: 0}, [dfa.initial]
    for state in queue:
        for target in map(int, dfa.delta[state]):
            if target >= 0 and target not in order:
                order[target] = len(queue)
                queue.append(target)
    lookup = np.full(dfa.num_states + 1, -1, np.int64)  # index -1 (REJECT) stays -1
    for old, new in order.items():
        lookup[old] = new
    rows = np.asarray(queue)
    return lookup[dfa.delta[rows]], dfa.accepting[rows]


def _unprefixed_regex_byte_dfa(pattern):
    """`regex_byte_dfa` as it was before the `\\x01` prefix: outlines-core's `Index` of
    `(?:pattern)` + sentinel, started at the `Index`'s own start state."""
    from functional_gen.structured.byte_dfa import _SENTINEL, _byte_vocabulary, _index_dfa

    index = Index(f"(?:{pattern}){_SENTINEL}", _byte_vocabulary())
    return _index_dfa(index.get_transitions(), index.get_initial_state(), index.get_final_states())


@pytest.mark.parametrize(
    "name", ["date", "phone", "ipv4", "uuid4", "person", "order", "unicode", "tree", "movie"]
)
def test_prefixed_regex_byte_dfa_has_the_minimal_dfa_of_the_unprefixed_one(name):
    from functional_gen.structured.byte_dfa import _anchored_at_start

    pattern = REGEXES[name][1] if name in REGEXES else json_schema_regex(SCHEMAS[name][1])
    assert not _anchored_at_start(pattern)  # so the prefix is used
    ours, before = minimize(regex_byte_dfa(pattern)), minimize(_unprefixed_regex_byte_dfa(pattern))
    for a, b in zip(_canonical(ours), _canonical(before)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "pattern,anchored",
    [
        (r"[^a]b", False),
        (r"a\^b", False),
        (r"[\^x]", False),
        (r"\x5e", False),
        (r"^ab", True),
        (r"(?:x|^y)", True),
        (r"\\^a", True),  # an escaped backslash, then the anchor
        (r"\Aab", True),
        (r"[a^]", True),  # a literal caret, counted (conservative)
    ],
)
def test_start_anchors_are_detected(pattern, anchored):
    from functional_gen.structured.byte_dfa import _anchored_at_start

    assert _anchored_at_start(pattern) == anchored


@pytest.mark.parametrize("pattern", [r"^ab|cd", r"(?:^x)?y", r"\Aa+", r"[a^]b"])
def test_regexes_asserting_the_start_are_compiled_without_the_prefix(pattern):
    # outlines-core refuses start assertions (no "universal" start state); the prefix must not
    # turn that refusal into a different language, and `[a^]b` still compiles.
    try:
        before = _unprefixed_regex_byte_dfa(pattern)
    except (ValueError, RuntimeError):
        with pytest.raises(ValueError, match="invalid regex"):
            regex_byte_dfa(pattern)
        return
    python = re.compile(pattern)
    dfa = regex_byte_dfa(pattern)
    for a, b in zip(_canonical(dfa), _canonical(before)):
        np.testing.assert_array_equal(a, b)
    for text in _strings("abcdxy^", 3):
        assert dfa.matches(text.encode()) == bool(python.fullmatch(text)), text


def _random_dfa(rng, states, density, accepting=0.2):
    delta = rng.integers(0, states, (states, 256)).astype(np.int32)
    delta[rng.random((states, 256)) > density] = -1
    return ByteDFA(delta, rng.random(states) < accepting, int(rng.integers(states)))


def test_trim_equals_a_python_reachability_search():
    from functional_gen.structured.byte_dfa import ConstraintError, trim

    rng = np.random.default_rng(1)
    checked = 0
    for states, density in [(1, 0.5), (6, 0.005), (30, 0.003), (200, 0.002), (50, 0.05)]:
        for _ in range(20):
            dfa = _random_dfa(rng, states, density)
            edges = {s: {int(t) for t in dfa.delta[s] if t >= 0} for s in range(states)}
            reach, todo = {dfa.initial}, [dfa.initial]
            while todo:
                for t in edges[todo.pop()] - reach:
                    reach.add(t)
                    todo.append(t)
            live = {s for s in range(states) if dfa.accepting[s]}
            grew = True
            while grew:
                grown = live | {s for s in range(states) if edges[s] & live}
                grew, live = grown != live, grown
            keep = sorted(reach & live)
            if dfa.initial not in keep:
                with pytest.raises(ConstraintError, match="empty"):
                    trim(dfa)
                continue
            out = trim(dfa)
            renumber = {s: i for i, s in enumerate(keep)}
            expected = np.array(
                [[renumber.get(int(t), -1) for t in dfa.delta[s]] for s in keep], np.int32
            ).reshape(len(keep), 256)
            np.testing.assert_array_equal(out.delta, expected)
            np.testing.assert_array_equal(out.accepting, dfa.accepting[keep])
            assert out.initial == renumber[dfa.initial]
            assert trim(out) is out  # marked as trimmed
            checked += 1
    assert checked >= 20


def test_hashed_refinement_equals_the_exact_one():
    # `refine_changed` (hashes, only the predecessors of moved states re-examined) against
    # Moore's rounds with exact row comparisons: schema automata, random trimmed DFAs, and
    # small random tables with unreachable and dead states and few symbols (long chains of
    # splits)
    from functional_gen.structured.automaton import unique_columns
    from functional_gen.structured.byte_dfa import refine_changed, refine_exact, trim

    rng = np.random.default_rng(2)
    dfas = [regex_byte_dfa(json_schema_regex(SCHEMAS[n][1])) for n in ("person", "order", "tree")]
    dfas += [regex_byte_dfa(r) for r in ('"[a-z]{0,300}"', "(?:ab|b)*[0-9]{1,40}x?")]
    dfas += [_random_dfa(rng, s, 0.02, 0.4) for s in (5, 50, 300)]
    tables = []
    for dfa in dfas:
        with contextlib.suppress(ValueError):  # a random DFA with an empty language
            dfa = trim(dfa)
            tables.append((unique_columns(dfa.delta)[0], dfa.accepting))
    for _ in range(200):
        n, c = int(rng.integers(1, 60)), int(rng.integers(1, 5))
        tables.append((rng.integers(-1, n, (n, c)), rng.random(n) < 0.3))
    for columns, accepting in tables:
        hashed, count = refine_changed(columns, accepting)
        exact, exact_count = refine_exact(columns, accepting)
        assert count == exact_count
        # the same partition (block ids may differ)
        pairs = np.unique(np.stack([hashed, exact]), axis=1)
        assert pairs.shape[1] == count


def _python_longest_word(columns, accepting, state, seen=()):
    """The longest word a trimmed automaton accepts from `state` (`None`: no longest), by
    depth-first search."""
    best = 0 if accepting[state] else -1
    for target in {int(t) for t in columns[state] if t >= 0}:
        if target in seen or target == state:
            return None
        length = _python_longest_word(columns, accepting, target, (*seen, state))
        if length is None:
            return None
        best = max(best, length + 1)
    return best


def test_longest_words_are_the_longest_accepted_words():
    from functional_gen.structured.automaton import unique_columns
    from functional_gen.structured.byte_dfa import _longest_words, trim

    rng = np.random.default_rng(3)
    dfas = [regex_byte_dfa(r) for r in ("(?:ab|c){0,12}d?", "[0-9]{2,9}(?:x[a-c]*)?", "abc")]
    for _ in range(300):  # random acyclic tables with a few back edges
        n = int(rng.integers(1, 40))
        delta = np.full((n, 256), -1, np.int32)
        for state in range(n - 1):
            delta[state, rng.integers(0, 4, 2)] = rng.integers(state + 1, n, 2)
        if rng.random() < 0.3:
            delta[rng.integers(n), 5] = rng.integers(n)
        accepting = rng.random(n) < 0.3
        accepting[-1] = True
        with contextlib.suppress(ValueError):
            dfas.append(trim(ByteDFA(delta, accepting, 0)))
    for dfa in dfas:
        columns = unique_columns(dfa.delta)[0]
        labels = _longest_words(columns, dfa.accepting)
        for state in range(dfa.num_states):
            length = _python_longest_word(columns, dfa.accepting, state)
            expected = (-1 if length is None else length) * 2 + dfa.accepting[state]
            assert labels[state] == expected, (state, length)


@pytest.mark.parametrize(
    "pattern",
    [
        r"\[(?:\"[0-9a-f]{6}\",){0,400}\]",  # a chain told apart by the items left: 3,600 rounds
        r"(?:[ab]{1,3};){0,90}(?:c[0-9]*)?",
        r"(?:x|yz){0,200}|(?:y|xz){0,150}",
    ],
)
def test_minimize_from_longest_words_equals_moores_rounds(pattern):
    # `minimize` starts large automata from their longest words; the partition must be the one
    # Moore's rounds reach from accepting / not accepting alone
    from functional_gen.structured.automaton import unique_columns
    from functional_gen.structured.byte_dfa import refine_exact, trim

    dfa = trim(regex_byte_dfa(pattern))
    assert dfa.num_states >= 256
    _, expected = refine_exact(unique_columns(dfa.delta)[0], dfa.accepting)
    small = minimize(dfa)
    assert small.num_states == expected
    python = re.compile(pattern)
    rng = np.random.default_rng(4)
    for text in ["[]", '["00aa11"]', "a;bb;c12", "xyzx", "yxz", "", "ab;" * 90 + "c"] + [
        "".join(rng.choice(list('[]"0af,;abcxyz'), int(rng.integers(0, 30)))) for _ in range(300)
    ]:
        assert small.matches(text.encode()) == bool(python.fullmatch(text)), text


_CLASS_PATTERNS = [
    r'"(?:[^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*"',  # a JSON string: cut inside U+0080 ..
    r"[a-f0-9]{8}-[A-Z]+\.[ -~]*",  # ranges cut at their endpoints only
    r"(é|ü)+[à-ɏ]{0,2}x",  # non-ASCII literals and a range over several UTF-8 lead bytes
    r"[\x{100}-\x{7FF}\x{E000}-\x{10FFFD}]+|.\t\n",  # braced escapes, `.` (not `\n`), controls
    r"[^\x01-\x08]\xA0\xFF\x7f",  # `\xHH` above 7F is the character U+00HH (two bytes)
    r"[0-9]+|[a-z--aeiou]+|[a-z&&[^x]]",  # class set operations
]


@pytest.mark.parametrize(
    "pattern",
    _CLASS_PATTERNS
    + [REGEXES[name][1] for name in sorted(REGEXES)]
    + [json_schema_regex(SCHEMAS[name][1]) for name in sorted(SCHEMAS)],
)
def test_byte_classes_give_the_dfa_of_all_256_bytes(monkeypatch, pattern):
    # outlines-core's Index walks only one byte per class; each byte's column is then its
    # class representative's, which must be exactly the automaton walked over all 256 bytes.
    from functional_gen.structured import byte_dfa

    classes = byte_dfa.byte_classes(pattern)
    if classes is None:  # this pattern hides its bytes (e.g. `\d`): nothing to compare
        assert re.search(r"\\[dDwWsSbBpPuU]|\(\?[^:]|\[:", pattern), pattern
        return
    assert classes.max() + 1 < 256
    with_classes = byte_dfa.regex_byte_dfa.__wrapped__(pattern)
    monkeypatch.setattr(byte_dfa, "byte_classes", lambda regex: None)
    every_byte = byte_dfa.regex_byte_dfa.__wrapped__(pattern)
    np.testing.assert_array_equal(with_classes.delta, every_byte.delta)
    np.testing.assert_array_equal(with_classes.accepting, every_byte.accepting)
    assert with_classes.initial == every_byte.initial


@pytest.mark.parametrize(
    "pattern", [r"\d+", r"\w", r"a\b", r"\pL", r"(?i)k", r"[[:alpha:]]", r"\u0041", r"(?s:.)"]
)
def test_byte_classes_refuse_patterns_that_hide_their_bytes(pattern):
    from functional_gen.structured.byte_dfa import byte_classes

    assert byte_classes(pattern) is None
