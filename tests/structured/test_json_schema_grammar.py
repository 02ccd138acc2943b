"""The grammar form of JSON Schemas (`json_schema_grammar`): large subschemas become rules of a
pushdown automaton instead of being copied into one regex. Checked against `jsonschema`."""

import concurrent.futures
import dataclasses
import json
import threading
import warnings

import jsonschema
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured import json_schema as js
from functional_gen.structured.byte_dfa import REJECT
from functional_gen.structured.pushdown import NotDeterministic, PushdownAutomaton
from functional_gen.structured.regex import escape
from functional_gen.structured.vocabulary import TokenVocabulary

from .helpers import format_checker

BYTES = TokenVocabulary(tuple(bytes([b]) for b in range(256)) + (None,), (256,), "bytes-only")
"""A vocabulary of the 256 single bytes (and EOS 256): the grammar's byte-level language is what
these tests compare; its token tables are small."""

ADDRESS = {
    "type": "object",
    "properties": {
        "street": {"type": "string", "maxLength": 12},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "floor": {"type": "integer", "minimum": -2, "maximum": 40},
    },
    "required": ["street"],
    "additionalProperties": False,
}
PEOPLE = {
    "$defs": {"address": ADDRESS},
    "type": "object",
    "properties": {
        "home": {"$ref": "#/$defs/address"},
        "work": {"anyOf": [{"$ref": "#/$defs/address"}, {"type": "null"}]},
        "others": {"type": "array", "items": {"$ref": "#/$defs/address"}, "maxItems": 3},
        "kind": {"enum": ["a", "b"]},
    },
    "required": ["home"],
    "additionalProperties": False,
}
"""A definition used in three places (one of them inside `anyOf` with `null`)."""
TWO_OBJECTS = {
    "$defs": {
        "cat": {
            "type": "object",
            "properties": {"meow": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["meow"],
            "additionalProperties": False,
        },
        "dog": {
            "type": "object",
            "properties": {"woof": {"type": "string", "maxLength": 5}},
            "required": ["woof"],
            "additionalProperties": False,
        },
    },
    "type": "array",
    "items": {"anyOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}]},
}
"""`anyOf` of two objects: both start with `{`, so calls of two rules there could not be told
apart by one byte; they must be inlined at that site."""


def _explode(levels: int) -> dict:
    """Definitions that each use the one below twice: 2^levels copies of a date-time regex."""
    defs = {"a0": {"type": "string", "format": "date-time"}}
    for i in range(1, levels + 1):
        below = {"$ref": f"#/$defs/a{i - 1}"}
        defs[f"a{i}"] = {
            "type": "object",
            "properties": {"x": below, "y": below},
            "required": ["x", "y"],
            "additionalProperties": False,
        }
    return {"$defs": defs, "$ref": f"#/$defs/a{levels}"}


@pytest.fixture
def small_rules(monkeypatch):
    """Every schema compiles to the grammar form, and subschemas of 200 characters are rules."""
    monkeypatch.setattr(js.budgets, "GRAMMAR_REGEX", 0)
    monkeypatch.setattr(js.budgets, "RULE_REGEX", 200)
    monkeypatch.setattr(js.budgets, "SHARED_RULE_REGEX", 200)
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    yield
    js.pushdown_form.PUSHDOWN_CACHE.clear()


def _address(rng):
    out = {"street": ["Main", "", "a b é", "x" * 12, "x" * 13][int(rng.integers(5))]}
    if rng.random() < 0.5:
        out["zip"] = ["12345", "1234", "abcde"][int(rng.integers(3))]
    if rng.random() < 0.5:
        out["floor"] = int(rng.integers(-4, 43))
    if rng.random() < 0.1:
        out["extra"] = 1
    return out


def _person(rng):
    doc = {}
    if rng.random() < 0.9:
        doc["home"] = _address(rng)
    if rng.random() < 0.6:
        doc["work"] = None if rng.random() < 0.3 else _address(rng)
    if rng.random() < 0.6:
        doc["others"] = [_address(rng) for _ in range(int(rng.integers(5)))]
    if rng.random() < 0.4:
        doc["kind"] = ["a", "b", "c"][int(rng.integers(3))]
    return doc


def _check_against_jsonschema(automaton, schema, documents, rng):
    """Each document (compact and spaced) and a byte-mutated copy: accepted exactly when
    `jsonschema` validates it (formats checked). Returns how many were valid / invalid."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=format_checker())
    counts = {True: 0, False: 0}
    for document in documents:
        for separators in ((",", ":"), (", ", ": ")):
            text = json.dumps(document, separators=separators, ensure_ascii=False).encode()
            texts = [text]
            if rng.random() < 0.5:
                mutated = bytearray(text)
                mutated[int(rng.integers(len(text)))] = rng.choice(list(b'{}[],:"0a '))
                texts.append(bytes(mutated))
            for data in texts:
                try:
                    expected = validator.is_valid(json.loads(data))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    expected = False
                assert automaton.accepts(data) == expected, data
                counts[expected] += 1
    return counts


def test_definitions_become_rules_and_accept_what_jsonschema_accepts(small_rules):
    automaton = js.json_schema_compile(PEOPLE, BYTES)
    assert isinstance(automaton, PushdownAutomaton)
    assert len(automaton.rule_names) >= 2  # the bottom frame and at least the address rule
    rng = np.random.default_rng(0)
    counts = _check_against_jsonschema(automaton, PEOPLE, [_person(rng) for _ in range(300)], rng)
    assert counts[True] > 50 and counts[False] > 50, counts


def test_a_refused_grammar_form_falls_back_to_the_single_regex(small_rules, monkeypatch):
    """Above `GRAMMAR_REGEX` the grammar form comes first; when it is refused (here: too many
    positions) a regex within `SINGLE_REGEX` still compiles, to the single regex's automaton
    (MaskBench o21378); beyond `SINGLE_REGEX` the refusal stands."""
    monkeypatch.setattr(js.budgets, "MAX_GRAMMAR_POSITIONS", 10)
    monkeypatch.setattr(js.budgets, "MAX_POSITIONS_BEFORE_TAILS", 10)
    with pytest.raises(js.TooManyPositions):
        js.json_schema_grammar(PEOPLE, BYTES)
    automaton = js.json_schema_compile(PEOPLE, BYTES, cache=False)
    assert not isinstance(automaton, PushdownAutomaton)

    class Walk:  # a token automaton over the byte vocabulary: token ids are the bytes
        def accepts(self, data: bytes) -> bool:
            return bool(automaton.accepting[automaton.walk(list(data))])

    rng = np.random.default_rng(3)
    counts = _check_against_jsonschema(Walk(), PEOPLE, [_person(rng) for _ in range(100)], rng)
    assert counts[True] >= 10 and counts[False] >= 10, counts
    monkeypatch.setattr(js.budgets, "SINGLE_REGEX", 100)
    with (
        pytest.warns(UserWarning, match="no pushdown automaton"),  # then free-form depth 1
        pytest.raises(js.TooManyPositions),
    ):
        js.json_schema_compile(PEOPLE, BYTES, cache=False)


def test_in_place_of_a_single_regex_the_grammar_form_may_be_larger(small_rules, monkeypatch):
    """A grammar form standing in for a single regex (one over `GRAMMAR_REGEX` characters,
    which the fallback would compile) may have `OVER_REGEX_SCALE` times the positions: the
    single regex inlines every rule, so its automaton is no smaller (MaskBench o25423)."""
    positions = js.json_schema_grammar(PEOPLE, BYTES).num_positions
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    limit = positions * 2 // 3  # under the positions, over half of them
    monkeypatch.setattr(js.budgets, "MAX_GRAMMAR_POSITIONS", limit)
    monkeypatch.setattr(js.budgets, "MAX_POSITIONS_BEFORE_TAILS", 5 * limit // 4)
    with pytest.raises(js.TooManyPositions, match=f"the limit is {limit:,}"):
        js.json_schema_grammar(PEOPLE, BYTES)
    automaton = js.json_schema_compile(PEOPLE, BYTES, cache=False)
    assert isinstance(automaton, PushdownAutomaton)
    assert automaton.num_positions == positions
    rng = np.random.default_rng(5)
    counts = _check_against_jsonschema(automaton, PEOPLE, [_person(rng) for _ in range(60)], rng)
    assert counts[True] >= 10 and counts[False] >= 10, counts


def test_a_free_value_call_beside_its_first_byte_is_refused_at_once():
    # `"` both read (a string) and a call of the JSON value rule at one state: no plan of the
    # other rules changes that, so the rule is refused as soon as its automaton is built
    dfa, calls, _ = js.rule_automata.rule_edges(
        '(?:\\[(?:"a"|' + escape(js.FREE_VALUE_CALL) + ")\\])", 0, True
    )
    with pytest.raises(NotDeterministic, match="in rule 'rule3' the byte b'\"'"):
        js.rule_automata.check_value_calls(dfa, calls, "rule3")
    dfa, calls, _ = js.rule_automata.rule_edges(
        "(?:\\[" + escape(js.FREE_VALUE_CALL) + "\\])", 0, True
    )
    js.rule_automata.check_value_calls(dfa, calls, "rule3")  # the call alone: one byte chooses


def test_calls_one_byte_cannot_choose_are_inlined(small_rules):
    # Without the ban, build_pushdown would refuse: `{` starts both rules at the `anyOf`.
    automaton = js.json_schema_compile(TWO_OBJECTS, BYTES)
    assert isinstance(automaton, PushdownAutomaton)
    rng = np.random.default_rng(1)
    documents = [
        [
            {"meow": int(rng.integers(-3, 103))}
            if rng.random() < 0.5
            else {"woof": "abcdefg"[: int(rng.integers(8))]}
            for _ in range(int(rng.integers(4)))
        ]
        for _ in range(150)
    ]
    counts = _check_against_jsonschema(automaton, TWO_OBJECTS, documents, rng)
    assert counts[True] > 30 and counts[False] > 30, counts


def _threads(monkeypatch, pool):
    """`_compile_threads` gives `pool` (`None`: no threads) and the memos are empty."""
    monkeypatch.setattr(js.rule_automata, "_compile_threads", lambda: pool)
    js.rule_automata._RULE_EDGES.clear()
    js.rule_automata._INLINED_RULE_EDGES.clear()
    js.pushdown_form.PUSHDOWN_CACHE.clear()


def test_rule_automata_built_ahead_on_threads_equal_those_built_in_order(small_rules, monkeypatch):
    # `_build_ahead` builds a plan's rule automata on other threads; the caller still takes
    # and checks them in order, so the automaton is the one built without threads
    on_main = []
    real = js.rule_automata._rule_edges_of

    def recording(regex, free_value):
        on_main.append(threading.current_thread() is threading.main_thread())
        return real(regex, free_value)

    monkeypatch.setattr(js.rule_automata, "_rule_edges_of", recording)
    built = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for threads in (None, pool):
            _threads(monkeypatch, threads)
            on_main.clear()
            built[threads is not None] = js.json_schema_grammar(_explode(3), BYTES)
            assert len(on_main) >= 3
            assert all(on_main) == (threads is None), on_main
            assert not js.rule_automata._RULE_EDGES_AHEAD
    serial, threaded = built[False], built[True]
    for field in dataclasses.fields(PushdownAutomaton):
        a, b = getattr(serial, field.name), getattr(threaded, field.name)
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, field.name


def test_a_plan_refused_before_its_last_rule_leaves_no_rule_building(small_rules, monkeypatch):
    # the refusal names the positions counted in order up to the rule that crossed the limit,
    # as without threads, and the rules not taken yet are cancelled or finished, not kept
    monkeypatch.setattr(js.budgets, "MAX_POSITIONS_BEFORE_TAILS", 40)
    errors = []
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for threads in (None, pool):
            _threads(monkeypatch, threads)
            with pytest.raises(js.TooManyPositions) as caught:
                js.json_schema_grammar(_explode(4), BYTES)
            errors.append(str(caught.value))
            assert not js.rule_automata._RULE_EDGES_AHEAD
    assert errors[0] == errors[1], errors


def _metadata(i: int) -> dict:
    names = {f"k{i}_{j}": {"enum": [f"v{i}{j}{x}" for x in "abc"]} for j in range(2 + i)}
    return {"type": "object", "properties": names, "additionalProperties": False}


METADATA = {  # MaskBench o21378's `any_metadata`, smaller: an anyOf of objects, all `{...}`
    "type": "object",
    "properties": {"metadata": {"anyOf": [_metadata(i) for i in range(8)]}},
    "additionalProperties": False,
}


def test_alternatives_of_banned_calls_are_not_tried_as_calls_again(monkeypatch):
    # The anyOf is over `RULE_REGEX`, so it calls its 4 largest objects, which one byte (`{`)
    # cannot choose between: banned. The next plan must not call the next 4 (banned in their
    # turn, one plan later, after building their automata in vain): it inlines all 8.
    monkeypatch.setattr(js.budgets, "GRAMMAR_REGEX", 0)
    monkeypatch.setattr(js.budgets, "RULE_REGEX", 1_500)
    monkeypatch.setattr(js.budgets, "MIN_RULE_REGEX", 50)
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    plans = []
    plan_rules = js.rule_plan.plan_rules

    def recorded(*args):
        root, rules, texts = plan_rules(*args)
        plans.append(list(rules))
        return root, rules, texts

    monkeypatch.setattr(js.grammar_form, "plan_rules", recorded)  # where it is called
    # in schema order: the objects' regexes in any order (the default) have other sizes, so
    # other ones are over `RULE_REGEX` (6 of them are called first); the default's language
    # is checked below
    automaton = js.json_schema_compile(METADATA, BYTES, cache=False, property_order="schema")
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    assert isinstance(automaton, PushdownAutomaton)
    assert [len(rules) for rules in plans] == [4, 1], plans  # then the anyOf is one rule
    rng = np.random.default_rng(5)
    documents = []
    for _ in range(60):
        i = int(rng.integers(8))
        keys = [j for j in range(2 + i) if rng.random() < 0.5]
        other = int(rng.integers(8)) if rng.random() < 0.2 else i  # a key of another object
        documents.append(
            {
                "metadata": {
                    f"k{other}_{j}": f"v{other}{j}{'abcd'[int(rng.integers(4))]}" for j in keys
                }
            }
        )
    counts = _check_against_jsonschema(automaton, METADATA, documents, rng)
    assert counts[True] > 20 and counts[False] > 20, counts
    # the default, members in any order: the same documents with their members reversed
    default = js.json_schema_compile(METADATA, BYTES, cache=False)
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    assert isinstance(default, PushdownAutomaton)
    reversed_documents = [{"metadata": dict(reversed(d["metadata"].items()))} for d in documents]
    counts = _check_against_jsonschema(default, METADATA, reversed_documents, rng)
    assert counts[True] > 20 and counts[False] > 20, counts


def test_rule_planning_calls_shared_and_large_subschemas():
    rewriter, regex = js.rewriter.rewrite(_explode(12))
    root, rules, texts = js.rule_plan.plan_rules(rewriter, regex, banned=set())
    assert rules and max(map(len, [root, *texts])) <= js.budgets.RULE_REGEX
    # a call is three control characters, never JSON text
    assert any(js.rule_plan.rule_call(i) in root for i in range(len(rules)))
    assert js.rule_plan.rule_call(17) == "\\x02\\x11\\x11"
    # a banned subschema is expanded where it is used instead
    _, fewer, _ = js.rule_plan.plan_rules(rewriter, regex, banned={rules[0]})
    assert rules[0] not in fewer


def test_a_schema_whose_regex_is_over_the_limit_compiles_as_a_grammar():
    # 4,096 copies of a date-time regex in one regex: over `MAX_REGEX`, refused by
    # `json_schema_regex`; the grammar form has one rule per level and compiles.
    schema = _explode(12)
    with pytest.raises(fg.structured.ConstraintError, match="too large"):
        js.json_schema_regex(schema)
    automaton = js.json_schema_compile(schema, BYTES)
    assert isinstance(automaton, PushdownAutomaton)
    assert automaton.num_positions < 5_000

    def document(level, rng):
        if level == 0:
            return ["2024-02-29T12:00:00Z", "2024-01-01T00:00:00+01:00"][int(rng.integers(2))]
        return {"x": document(level - 1, rng), "y": document(level - 1, rng)}

    def spoiled(doc, rng):  # one leaf, at a random path, becomes a date that does not exist
        node = doc
        for _ in range(11):
            node = node["x" if rng.random() < 0.5 else "y"]
        node["x" if rng.random() < 0.5 else "y"] = "2023-02-29T12:00:00Z"
        return doc

    rng = np.random.default_rng(2)
    documents = [document(12, rng) for _ in range(3)] + [spoiled(document(12, rng), rng)]
    counts = _check_against_jsonschema(automaton, schema, documents, rng)
    assert counts[True] and counts[False], counts
    too_shallow = json.dumps(document(11, rng), separators=(",", ":")).encode()
    assert not automaton.accepts(too_shallow)


def test_json_schema_chooses_the_grammar_form_for_large_schemas(tokenizer, monkeypatch):
    # PEOPLE's regex has about 3,000 characters: a token automaton below `GRAMMAR_REGEX`, the
    # grammar form (a pushdown automaton) above it.
    small = fg.processors.JsonSchema(PEOPLE, tokenizer)
    assert small.pushdown is None
    monkeypatch.setattr(js.budgets, "GRAMMAR_REGEX", 1_000)
    monkeypatch.setattr(js.budgets, "RULE_REGEX", 200)
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    large = fg.processors.JsonSchema(PEOPLE, tokenizer)
    assert large.pushdown is not None
    js.pushdown_form.PUSHDOWN_CACHE.clear()


@pytest.mark.parametrize("name", ["people", "two_objects", "explode"])
def test_grammar_form_token_tables_equal_the_reference_walk(
    name, small_rules, vocabulary, checked_token_tables
):
    # The fast `pushdown.token_tables` gives exactly the old walk's tables on schema grammar forms
    # (rules with call edges and a free-form value rule), real and byte vocabularies.
    schema = {"people": PEOPLE, "two_objects": TWO_OBJECTS, "explode": _explode(3)}[name]
    for vocab in (vocabulary, BYTES):
        js.pushdown_form.PUSHDOWN_CACHE.clear()
        assert isinstance(js.json_schema_grammar(schema, vocab), PushdownAutomaton)
    assert len(checked_token_tables) == 2, checked_token_tables


TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 6},
                "child": {"$ref": "#/$defs/node"},
                "weight": {"type": "integer", "minimum": 0, "maximum": 999},
                "color": {"enum": ["red", "green", "blue", "yellow"]},
                "tag": {"type": "string", "pattern": "^[a-z]{2,4}$"},
            },
            "required": ["name"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}
"""A recursive definition: each unrolled copy is its own rule, and every copy's members after
`child` (`weight`, `color`, `tag`) are the same tail."""


def _tree(rng, depth):
    doc = {"name": ["a", "bcd", "toolong"][int(rng.integers(3))]}
    if depth and rng.random() < 0.7:
        doc["child"] = _tree(rng, depth - 1)
    if rng.random() < 0.5:
        doc["weight"] = int(rng.integers(-2, 1002))
    if rng.random() < 0.5:
        doc["color"] = ["red", "blue", "pink"][int(rng.integers(3))]
    if rng.random() < 0.5:
        doc["tag"] = ["ab", "abcd", "abcde", "A1"][int(rng.integers(4))]
    return doc


def test_shared_tails_become_one_rule_and_keep_the_language(small_rules, monkeypatch):
    # in schema order, where every copy ends with the same members; in any order (the
    # default) each copy's automaton tracks the set of members written, and its language is
    # checked below
    monkeypatch.setattr(js.budgets, "MIN_SHARED_TAIL", 4)
    shared = js.json_schema_grammar(TREE, BYTES, property_order="schema")
    monkeypatch.setattr(js.budgets, "MAX_SHARED_TAILS", 0)
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    plain = js.json_schema_grammar(TREE, BYTES, property_order="schema")
    assert len(shared.rule_names) > len(plain.rule_names)  # the tail is a rule
    assert shared.num_positions < plain.num_positions - 20, (
        shared.num_positions,
        plain.num_positions,
    )
    rng = np.random.default_rng(3)
    documents = [_tree(rng, 2) for _ in range(300)]  # within the recursion bound
    counts = _check_against_jsonschema(shared, TREE, documents, rng)
    assert counts[True] > 50 and counts[False] > 50, counts
    for document in documents + [_tree(rng, 5) for _ in range(100)]:  # deeper: both reject
        text = json.dumps(document, separators=(",", ":")).encode()
        assert shared.accepts(text) == plain.accepts(text), text
    for document in documents:  # both automata, byte for byte
        text = json.dumps(document, separators=(",", ":")).encode()
        assert shared.accepts(text) == plain.accepts(text), text
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    default = js.json_schema_grammar(TREE, BYTES)
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    counts = _check_against_jsonschema(default, TREE, [_reversed(d) for d in documents], rng)
    assert counts[True] > 50 and counts[False] > 50, counts


def _reversed(value):
    """`value` with the members of each of its objects in reverse order."""
    if isinstance(value, dict):
        return {k: _reversed(v) for k, v in reversed(value.items())}
    if isinstance(value, list):
        return [_reversed(v) for v in value]
    return value


def test_shared_tails_on_hand_built_automata(monkeypatch):
    # Two rules end with the same tail `xyzxyz` (then return): it becomes rule 2, called once
    # from each at the state before `x`; the root calls both rules. Languages compared on
    # texts around the boundaries (the walk below is the oracle).
    monkeypatch.setattr(js.budgets, "MIN_SHARED_TAIL", 2)

    def automaton(regex, rules):
        return js.rule_automata.rule_edges(regex, rules, False)[:2]

    root = automaton(f"(?:{js.rule_plan.rule_call(0)}|{js.rule_plan.rule_call(1)})!", 2)
    first = automaton("a+xyzxyz", 2)
    second = automaton("bxyzxyz", 2)
    automata, rules = js.grammar_form._shared_tails([root, first, second], 2, False)
    assert rules == 3
    before = root[0].num_states + first[0].num_states + second[0].num_states
    assert sum(dfa.num_states for dfa, _ in automata) < before
    texts = [
        (head + middle + end).encode()
        for head in ("", "a", "aa", "aaa", "b", "ab", "ba", "bb")
        for middle in ("xyzxyz", "xyz", "xyzxy", "xyzxyzxyz", "zyx", "", "xyzxyzx")
        for end in ("!", "", "!!", "x!")
    ]
    languages = [
        {text for text in texts if _walk_rules(parts, 0, text) == len(text)}
        for parts in ([root, first, second], automata)
    ]
    assert languages[0] == languages[1]
    assert {b"aaxyzxyz!", b"bxyzxyz!"} <= languages[0] and b"abxyzxyz!" not in languages[0]


def _walk_rules(automata, rule, data, start=0):
    """How far a (deterministic) rule set reads `data` from `start` as rule `rule` when it ends
    accepting: the end offset, or `None`. A test oracle by backtracking over calls."""

    def run(r, state, i):
        dfa, calls = automata[r]
        results = []
        if dfa.accepting[state]:
            results.append(i)
        if i < len(data) and dfa.delta[state, data[i]] != REJECT:
            results += run(r, int(dfa.delta[state, data[i]]), i + 1)
        for callee in np.flatnonzero(calls[state] != REJECT):
            for j in run(int(callee) + 1, automata[int(callee) + 1][0].initial, i):
                if j > i:
                    results += run(r, int(calls[state, callee]), j)
        return results

    ends = run(rule, automata[rule][0].initial, start)
    return max(ends) if ends else None


FREE_FORM = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "meta": {},
        "tags": {"type": "array"},
    },
    "required": ["id"],
    "additionalProperties": False,
}
"""Free-form values: `meta` is any JSON value, `tags` an array of any values. (Closed: a mutated
key would otherwise be an additional property out of the schema's order, which the automaton
rejects by design.)"""


def _nested(rng, depth: int):
    """A JSON value nested `depth` levels (arrays and objects alternate)."""
    if depth == 0:
        return [1, "x", None, True, -2.5][int(rng.integers(5))]
    inner = _nested(rng, depth - 1)
    return [inner, 0] if depth % 2 else {"k": inner}


def test_grammar_form_nests_free_form_values_as_deep_as_the_stack(small_rules):
    automaton = js.json_schema_compile(FREE_FORM, BYTES, free_form_depth=1)  # any depth but 0
    assert isinstance(automaton, PushdownAutomaton)
    assert "value" in automaton.rule_names  # free-form values call the JSON value rule
    rng = np.random.default_rng(2)
    documents = []
    for _ in range(120):
        doc = {"id": int(rng.integers(-5, 50))}
        depth = int(rng.integers(0, 7))  # up to 6 levels: deeper than the regex form's 1
        if rng.random() < 0.6:
            doc["meta"] = _nested(rng, depth)
        if rng.random() < 0.4:
            doc["tags"] = [_nested(rng, int(rng.integers(0, 4)))]
        if rng.random() < 0.1:
            doc["id"] = "not a number"
        documents.append(doc)
    counts = _check_against_jsonschema(automaton, FREE_FORM, documents, rng)
    assert counts[True] > 100 and counts[False] > 20, counts
    deep = json.dumps({"id": 1, "meta": _nested(rng, 6)}, separators=(",", ":")).encode()
    assert automaton.accepts(deep)
    # depth 0 keeps its meaning in the grammar form: free-form values are scalars only
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    scalars = js.json_schema_compile(FREE_FORM, BYTES, free_form_depth=0)
    assert not scalars.accepts(deep)
    assert scalars.accepts(b'{"id":1,"meta":"x"}')


# ------------------------------------------------------------------ recursion as rules

LINKED_LIST = {
    "type": "object",
    "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}},
    "required": ["value"],
    "additionalProperties": False,
}
EXPRESSION = {
    "$defs": {
        "expr": {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": 9},
                {"type": "boolean"},
                {
                    "type": "object",
                    "properties": {"not": {"$ref": "#/$defs/expr"}},
                    "required": ["not"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "pow": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/expr"},
                            "minItems": 2,
                            "maxItems": 2,
                        }
                    },
                    "required": ["pow"],
                    "additionalProperties": False,
                },
            ]
        }
    },
    "$ref": "#/$defs/expr",
}
"""An expression tree like MaskBench Github_trivial o47165's (`{"pow": [{"not": true}, 2]}`)."""
FOREST = {
    "$defs": {
        "tree": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 3},
                "children": {"$ref": "#/$defs/forest"},
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        "forest": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2},
    },
    "$ref": "#/$defs/tree",
}
"""Two mutually recursive definitions."""
LOGIC = {
    "oneOf": [
        {"type": "integer"},
        {
            "type": "object",
            "properties": {"not": {"$ref": "#"}, "and": {"type": "array", "items": {"$ref": "#"}}},
            "additionalProperties": False,
        },
    ]
}
"""Recursion under `oneOf` (its branches are proved disjoint by type)."""


def _linked(rng, depth):
    doc = {"value": int(rng.integers(-3, 4)) if rng.random() < 0.95 else "x"}
    if depth > 1:
        doc["next"] = _linked(rng, depth - 1)
    return doc


def _expression(rng, depth):
    if depth <= 1:
        if rng.random() < 0.02:
            return [10, None, -1][int(rng.integers(3))]
        return [int(rng.integers(0, 10)), True, False][int(rng.integers(3))]
    if rng.random() < 0.5:
        return {"not": _expression(rng, depth - 1)}
    pair = [_expression(rng, depth - 1), _expression(rng, int(rng.integers(1, depth)))]
    return {"pow": pair if rng.random() < 0.95 else pair[:1]}


def _forest(rng, depth):
    doc = {"name": ["", "ab", "abc"][int(rng.integers(3))] if rng.random() < 0.98 else "abcd"}
    if depth > 1:
        count = (2 if rng.random() < 0.3 else 1) if rng.random() < 0.98 else 3
        doc["children"] = [_forest(rng, depth - 1)] + [
            _forest(rng, int(rng.integers(1, depth))) for _ in range(count - 1)
        ]
    return doc


def _logic(rng, depth):
    if depth <= 1:
        return int(rng.integers(-5, 5)) if rng.random() < 0.97 else 1.5
    if rng.random() < 0.5:
        return {"not": _logic(rng, depth - 1)}
    rest = [_logic(rng, int(rng.integers(1, depth))) for _ in range(int(rng.integers(0, 2)))]
    return {"and": [_logic(rng, depth - 1), *rest]}


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _unrolled_accepts(schema, text: bytes) -> bool:
    """What today's unrolled path (`max_recursion_depth` levels, one token automaton) accepts."""
    automaton = js.json_schema_automaton(schema, BYTES, cache=False)
    return bool(automaton.accepting[automaton.walk(list(text))])


def _check_deep_documents(
    automaton, schema, make, *, seed: int, depths: int, per_depth: int, unrolled_order="any"
):
    """`make(rng, depth)`'s documents for each depth up to `depths` (and mutated copies) are
    accepted exactly when `jsonschema` validates them, and some valid ones nest deeper than
    the unrolled path (`max_recursion_depth` levels, members in `unrolled_order`) accepts.
    With `unrolled_order="schema"` (for `make`s that list members in the schema's order), a
    valid document within the unrolled levels is accepted there: the deep ones are cut for
    their depth, not their order."""
    rng = np.random.default_rng(seed)
    documents = [make(rng, depth) for depth in range(1, depths + 1) for _ in range(per_depth)]
    counts = _check_against_jsonschema(automaton, schema, documents, rng)
    assert counts[True] > 60 and counts[False] > 30, counts
    validator = jsonschema.validators.validator_for(schema)(schema)
    deep = [d for d in documents if validator.is_valid(d) and _depth(d) > 8]
    assert deep, "no valid document nested beyond max_recursion_depth"
    unrolled = js.json_schema_automaton(schema, BYTES, cache=False, property_order=unrolled_order)

    def unrolled_accepts(document) -> bool:
        text = json.dumps(document, separators=(",", ":")).encode()
        return bool(unrolled.accepting[unrolled.walk(list(text))])

    for document in deep[:3]:
        text = json.dumps(document, separators=(",", ":")).encode()
        assert automaton.accepts(text)
        assert not unrolled_accepts(document)  # 3 unrolled levels cut it
    if unrolled_order == "schema":
        shallow = [d for d in documents if validator.is_valid(d) and _depth(d) <= 3]
        assert shallow and all(unrolled_accepts(d) for d in shallow[:3])


def test_inline_references_recursive_leaves_placeholders():
    schema, expansions = js.inline_references(LINKED_LIST, 3, recursive=True)
    assert schema["properties"]["next"] == {"$fgRecursive": 0}
    assert expansions == [schema]  # the root is the expansion of `#`
    schema, expansions = js.inline_references(FOREST, 3, recursive=True)
    # tree -> forest -> tree: the second `tree` is the placeholder, expanded once above it
    assert schema["properties"]["children"]["items"] == {"$fgRecursive": 0}
    assert expansions == [schema]
    unrolled = js.inline_references(FOREST, 3)
    assert "$fgRecursive" not in json.dumps(unrolled, default=repr)


@pytest.mark.parametrize(
    ("name", "schema", "make"),
    [
        ("linked_list", LINKED_LIST, _linked),
        ("expression", EXPRESSION, _expression),
        ("forest", FOREST, _forest),
        ("logic", LOGIC, _logic),
    ],
)
def test_recursive_references_are_rules_as_deep_as_the_stack(name, schema, make):
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    assert isinstance(automaton, PushdownAutomaton)
    assert len(automaton.rule_names) <= 4  # one rule per recursive target, not per level
    _check_deep_documents(automaton, schema, make, seed=7, depths=10, per_depth=12)


def test_recursion_depth_is_the_stack_depth():
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    automaton = js.json_schema_compile(LINKED_LIST, BYTES, cache=False, stack_depth=6)
    rng = np.random.default_rng(0)
    depths = []
    for depth in range(1, 12):
        doc = _linked(rng, depth)
        while not jsonschema.Draft202012Validator(LINKED_LIST).is_valid(doc):
            doc = _linked(rng, depth)
        depths.append(automaton.accepts(json.dumps(doc).encode()))
    # accepted up to a depth the 6 stack slots allow, rejected beyond (never accepted again)
    assert depths[:5] == [True] * 5 and not depths[-1]
    assert depths == sorted(depths, reverse=True)


NOT_DETERMINISTIC = {
    "type": "object",
    "properties": {
        "c": {
            "anyOf": [
                {"$ref": "#"},
                {
                    "type": "object",
                    "properties": {"z": {"type": "integer"}},
                    "required": ["z"],
                    "additionalProperties": False,
                },
            ]
        }
    },
    "additionalProperties": False,
}
"""At `c`, `{` starts both the recursive call and the other object: no one-byte choice."""
MERGED = {
    "$defs": {
        "n": {
            "type": "object",
            "properties": {
                "k": {"$ref": "#/$defs/n", "required": ["v"]},
                "v": {"type": "integer"},
            },
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/n",
}
"""A recursive reference with a sibling keyword inside its own target: each level is the target
merged with `required`, which the rewrite would inline forever."""
ENDLESS = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}


SITE = {  # MaskBench Github_hard o15291's navigation tree, shortened
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "Node": {
            "type": "object",
            "properties": {
                "children": {"type": "array", "items": {"$ref": "#/definitions/Entry"}},
                "isExternal": {"type": "boolean"},
                "reference": {"type": "string", "maxLength": 2},
                "title": {"type": "string", "maxLength": 2},
            },
            "required": ["reference", "title"],
            "additionalProperties": False,
        },
        "Branch": {
            "type": "object",
            "properties": {
                "children": {"type": "array", "items": {"$ref": "#/definitions/Entry"}},
                "title": {"type": "string", "maxLength": 2},
            },
            "required": ["children", "title"],
            "additionalProperties": False,
        },
        "Entry": {"anyOf": [{"$ref": "#/definitions/Node"}, {"$ref": "#/definitions/Branch"}]},
    },
    "type": "object",
    "properties": {"structure": {"type": "array", "items": {"$ref": "#/definitions/Entry"}}},
    "required": ["structure"],
    "additionalProperties": False,
}
"""Items that are an `anyOf` of two recursive objects: `{` cannot choose which to call."""


def _entry(rng, depth):
    title = ["", "ab"][int(rng.integers(2))] if rng.random() < 0.995 else ["abc", 7][depth % 2]
    children = []
    if depth > 1:
        children = [_entry(rng, depth - 1)] + [
            _entry(rng, int(rng.integers(1, depth))) for _ in range(int(rng.integers(2)))
        ]
    if rng.random() < 0.5:  # members in the schema's order
        doc = {"children": children} if depth > 1 and rng.random() < 0.7 else {}
        if rng.random() < 0.3:
            doc["isExternal"] = bool(rng.random() < 0.5)
        doc |= {"reference": "r", "title": title}
        return doc if rng.random() < 0.995 else {**doc, "z": 1}
    return {"children": children, "title": title} if rng.random() < 0.99 else {"title": title}


def _site(rng, depth):
    return {"structure": [_entry(rng, depth) for _ in range(int(rng.integers(1, 3)))]}


def _node_or_other(rng, depth):
    if depth <= 1:
        return {} if rng.random() < 0.3 else {"z": int(rng.integers(5))}
    return {"c": _node_or_other(rng, depth - 1)} if rng.random() < 0.95 else {"c": 1}


@pytest.mark.parametrize(
    ("schema", "make"), [(SITE, _site), (NOT_DETERMINISTIC, _node_or_other)], ids=["site", "anyOf"]
)
def test_recursion_through_an_anyOf_of_objects_calls_the_anyOf(schema, make):
    # Neither recursive target can be called where `{` starts both (or another object): the
    # `anyOf` becomes the rule, its automaton holding both objects. Before, the recursion was
    # unrolled; o15291's unrolled form timed out (745,575-character rule regexes, 30 s).
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    automaton = js.compiling._recursive_grammar(schema, BYTES, 32, {})
    assert isinstance(automaton, PushdownAutomaton)
    # SITE unrolled in any order (the default) is a regex of 1.8 million characters, over
    # `MAX_REGEX`: refused; its documents list members in the schema's order, compared with
    # that order's unrolled form
    order = "schema" if schema is SITE else "any"
    _check_deep_documents(
        automaton, schema, make, seed=3, depths=11, per_depth=10, unrolled_order=order
    )


@pytest.mark.parametrize("schema", [MERGED], ids=["merged"])
def test_recursion_that_cannot_be_rules_is_unrolled_as_before(schema):
    assert js.compiling._recursive_grammar(schema, BYTES, 32, {}) is None
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    before = js.json_schema_automaton(schema, BYTES, cache=False)
    assert not isinstance(automaton, PushdownAutomaton)
    texts = [
        b"{}",
        b'{"c":{}}',
        b'{"c":{"z":1}}',
        b'{"c":{"c":{"c":{}}}}',
        b'{"c":{"c":{"c":{"c":{}}}}}',
        b'{"k":{"v":1}}',
        b'{"k":{"k":{"v":2},"v":1},"v":0}',
        b'{"k":{}}',
    ]
    for text in texts:
        assert bool(automaton.accepting[automaton.walk(list(text))]) == bool(
            before.accepting[before.walk(list(text))]
        ), text


def test_endless_recursion_is_refused_as_before():
    with pytest.raises(js.UnsupportedSchemaError, match="no JSON value satisfies"):
        js.json_schema_compile(ENDLESS, BYTES, cache=False)
    # one way out (`next` optional at the second level): a rule, with no cut
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    schema = {"anyOf": [{"type": "null"}, ENDLESS]}
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    assert isinstance(automaton, PushdownAutomaton)
    text = b'{"next":' * 7 + b"null" + b"}" * 7
    assert automaton.accepts(text) and not automaton.accepts(text[:-1])


def test_an_integer_max_recursion_depth_unrolls_as_before():
    # what `per_row` needs: a token automaton, recursion cut after 3 levels
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    automaton = js.json_schema_compile(LINKED_LIST, BYTES, cache=False, max_recursion_depth=3)
    assert not isinstance(automaton, PushdownAutomaton)
    for depth, accepted in ((3, True), (4, True), (5, False)):
        text = b'{"value":1,"next":' * (depth - 1) + b'{"value":1}' + b"}" * (depth - 1)
        assert bool(automaton.accepting[automaton.walk(list(text))]) == accepted, depth
        assert _unrolled_accepts(LINKED_LIST, text) == accepted


BATCH = {  # MaskBench Github_medium o9517 without its annotations
    "type": "object",
    "properties": {
        "batch": {
            "type": "object",
            "properties": {
                "download_hrefs": {"type": "array"},
                "href": {"type": "string", "pattern": "/api/v1/users/\\d+/batches/\\d+"},
                "id": {"type": "integer"},
                "template": {
                    "type": "object",
                    "properties": {
                        "href": {"type": "string", "pattern": "/api/v1/users/\\d+/templates/\\d+"},
                        "id": {"type": "integer"},
                        "name": {"type": "string"},
                    },
                    "required": ["id", "name", "href"],
                },
                "state": {"enum": ["queued", "in_progress", "failed"], "type": "string"},
                "updated_at": {
                    "type": "string",
                    "format": "date-time",
                    "pattern": "\\d\\d\\d\\d-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\dZ",
                },
            },
            "required": ["href", "id", "updated_at", "state", "download_hrefs", "template"],
        }
    },
}
"""A format beside a pattern (a string automaton: the grammar form) and objects whose shared
tail holds two states of one automaton: `_extract_tail` replaced the first by a call, renumbered
the automaton, then indexed the second by its old number (IndexError)."""


def test_a_tail_shared_by_two_states_of_one_automaton():
    automaton = js.json_schema_compile(BATCH, BYTES, cache=False)
    assert isinstance(automaton, PushdownAutomaton)
    batch = {
        "download_hrefs": ["/x", {"a": [1]}],
        "href": "/api/v1/users/1/batches/2",
        "id": 2,
        "template": {"href": "/api/v1/users/1/templates/3", "id": 1, "name": "n"},
        "state": "queued",
        "updated_at": "2016-01-05T16:51:00Z",
    }  # in the schema's order
    documents = [
        {"batch": batch},
        {"batch": {**batch, "id": "2"}},
        {"batch": {**batch, "updated_at": "2016-01-05 16:51:00Z"}},
        {"batch": {**batch, "template": {"id": 1, "name": "n"}}},  # no href
        {"batch": {**batch, "extra": None}, "other": [True]},
        {},
    ]
    counts = _check_against_jsonschema(automaton, BATCH, documents, np.random.default_rng(0))
    assert counts[True] >= 6 and counts[False] >= 6, counts


def test_counted_strings_used_in_many_places_are_one_rule():
    """Plain strings of the same length bounds are one marker (`SHARED_COUNT_MIN`), weighed by
    their counted repeats written out: 24 strings of maxLength 100 compile to the grammar form
    with one rule for the string (a few hundred positions) instead of a copy of the 100-step
    counter per property in one regex's automaton (MaskBench o61653: 40 strings of maxLength
    256, 98,812 states and 28 s before, 5 s after)."""
    names = [f"p{i:02d}" for i in range(24)]
    schema = {
        "type": "object",
        "properties": {n: {"type": "string", "minLength": 1, "maxLength": 100} for n in names},
        "required": names[:2],
        "additionalProperties": False,
    }
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    assert isinstance(automaton, PushdownAutomaton)
    assert len(automaton.rule_names) >= 2  # the bottom frame and the string's rule
    rng = np.random.default_rng(4)
    documents = []
    for _ in range(60):
        doc = {}
        for n in names:
            if n in names[:2] or rng.random() < 0.3:
                doc[n] = "é" * int(rng.choice([1, 2, 50, 99, 100]))
        if rng.random() < 0.5:  # one string out of bounds
            doc[str(rng.choice(list(doc)))] = "x" * int(rng.choice([0, 101]))
        documents.append(doc)
    counts = _check_against_jsonschema(automaton, schema, documents, rng)
    assert counts[True] >= 10 and counts[False] >= 10, counts


POINT = {"type": "array", "items": {"type": "number"}}
PATHS = {
    "type": "object",
    "additionalProperties": {
        "anyOf": [
            {"type": "object", "properties": {"origin": POINT, "type": {"type": "string"}}},
            {"type": "object", "properties": {"origin": POINT, "end": POINT}},
        ]
    },
}
"""Cut down from MaskBench Github_hard o10495 (maker.js models): `end` is an array of numbers
in one branch and an additional free-form value in the other."""
MODELS = {
    "$ref": "#/definitions/model",
    "definitions": {
        "model": {
            "type": "object",
            "properties": {
                "paths": PATHS,
                "models": {
                    "type": "object",
                    "additionalProperties": {"$ref": "#/definitions/model"},
                },
            },
        }
    },
}


def _free(rng, depth: int):
    """A random JSON value nested up to `depth` levels."""
    kind = int(rng.integers(5 if depth > 0 else 3))
    if kind == 0:
        return int(rng.integers(-9, 99))
    if kind == 1:
        return "ab"[: int(rng.integers(3))]
    if kind == 2:
        return [None, True, 1.5][int(rng.integers(3))]
    if kind == 3:
        return [_free(rng, depth - 1) for _ in range(int(rng.integers(3)))]
    return {k: _free(rng, depth - 1) for k in "xy"[: int(rng.integers(3))]}


def _paths(rng):
    """Paths in an order the schema's automaton reads when they are valid: `origin`, then the
    other branch's listed property, then the additional ones."""
    paths = {}
    for name in "pq"[: int(rng.integers(1, 3))]:
        path = {}
        if rng.random() < 0.6:
            path["origin"] = (
                _free(rng, 1) if rng.random() < 0.2 else [1, -2.5][: int(rng.integers(3))]
            )
        numbers = rng.random() < 0.5
        keys = ["end", "type"] if numbers else ["type", "end"]
        for key in keys:
            if rng.random() < 0.6:
                path[key] = (
                    [3, 4][: int(rng.integers(3))]
                    if key == "end" and numbers
                    else "line"
                    if key == "type" and rng.random() < 0.7
                    else _free(rng, 5)
                )
        paths[name] = path
    return paths


@pytest.mark.parametrize("form", ["pushdown", "grammar", "recursive"])
def test_a_free_form_value_beside_a_regular_one_is_read_before_its_call(form, monkeypatch):
    # `[` and then a digit start both the array of numbers and the free-form value, so one byte
    # cannot choose a call of the JSON value rule there: that refused the pushdown automaton,
    # free-form values fell back to one level, and o10495's valid instance was rejected. The
    # free-form value's first two levels are read in the rule instead (merged with the array);
    # only deeper values are calls, so they still nest as deep as the stack.
    if form == "grammar":
        monkeypatch.setattr(js.budgets, "GRAMMAR_REGEX", 0)
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    schema = MODELS if form == "recursive" else PATHS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        automaton = js.json_schema_compile(schema, BYTES, cache=False)
    assert not caught, [str(w.message) for w in caught]  # no fallback to one level
    assert isinstance(automaton, PushdownAutomaton)
    rng = np.random.default_rng(5)
    if form == "recursive":
        documents = [
            {"paths": _paths(rng), "m": {"paths": _paths(rng), "n": {"paths": _paths(rng)}}}
            for _ in range(60)
        ]
    else:
        documents = [_paths(rng) for _ in range(120)]
    deep = {"p": {"end": [[[[[[1]]]]], {"x": [{"y": [None]}]}]}}
    assert automaton.accepts(json.dumps(deep if form != "recursive" else {"paths": deep}).encode())
    validator = jsonschema.Draft202012Validator(schema)
    counts = {True: 0, False: 0}
    for document in documents:  # mutated bytes would reorder keys: invalid values instead
        expected = validator.is_valid(document)
        for separators in ((",", ":"), (", ", ": ")):
            text = json.dumps(document, separators=separators).encode()
            assert automaton.accepts(text) == expected, text
        counts[expected] += 1
    assert counts[True] >= 10 and counts[False] >= 10, counts
    js.pushdown_form.PUSHDOWN_CACHE.clear()


ROLES = {
    "type": "object",
    "properties": {
        "roles": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "pattern": "^[0-9a-f]{4}-[0-9a-f]{4}$"},
                    "role": {"enum": ["edit", "view"]},
                },
                "required": ["id", "role"],
                "additionalProperties": False,
            },
            "maxItems": 1000,
        }
    },
    "additionalProperties": False,
}
"""Cut down from MaskBench o9943 (two such arrays)."""


def test_a_large_item_count_calls_the_item_once_per_copy():
    # The counted repeat `(,item){0,999}` wrote 999 copies of the object into one regex, whose
    # automaton took minutes for o9943; the copies are now measured (`item_repeats`), so the
    # schema goes to the grammar form, where each copy calls the item's rule.
    rewriter, regex = js.rewriter.rewrite(
        ROLES, free_form_depth=js.free_values.CALL, counted_strings=True
    )
    assert rewriter.weight(regex) > js.budgets.GRAMMAR_REGEX > len(rewriter.substitute(regex))
    automaton = js.json_schema_compile(ROLES, BYTES, cache=False)
    assert isinstance(automaton, PushdownAutomaton)
    assert automaton.num_positions < 6_000  # a few positions per copy, not the object's 60
    validator = jsonschema.Draft202012Validator(ROLES)
    for n in (0, 1, 2, 999, 1000, 1001):
        document = {"roles": [{"id": f"{i:04x}-{i:04x}", "role": "view"} for i in range(n)]}
        for separators in ((",", ":"), (", ", ": ")):
            text = json.dumps(document, separators=separators).encode()
            assert automaton.accepts(text) == validator.is_valid(document), (n, separators)
    bad = {"roles": [{"id": "0000-00g0", "role": "view"}]}
    assert not automaton.accepts(json.dumps(bad).encode()) and not validator.is_valid(bad)


def test_equal_string_automata_are_quoted_once(monkeypatch):
    # o39210 has 398 strings of three length bounds; quoting each again took 8.6 s. A
    # `minLength` over `COUNTER_MIN_LENGTH` keeps them spliced automata, not counter rules.
    quoted, original = [], js.strings._quoted
    monkeypatch.setattr(js.strings, "_quoted", lambda body: quoted.append(body) or original(body))
    schema = {
        "type": "object",
        "properties": {
            name: {"type": "string", "minLength": 100, "maxLength": 512} for name in "abc"
        },
    }
    rewriter, _ = js.rewriter.rewrite(
        schema, free_form_depth=js.free_values.CALL, counted_strings=True
    )
    assert len(quoted) == 1 and len(rewriter.dfa_texts) == 1
    automaton = js.json_schema_compile(schema, BYTES, cache=False)
    validator = jsonschema.Draft202012Validator(schema)
    documents = (
        {"a": "x" * 100, "c": "y" * 512},
        {"b": "é" * 100},
        {"b": "é" * 99},
        {"a": "é" * 513},
        {"c": "é" * 512},
    )
    for document in documents:
        text = json.dumps(document, ensure_ascii=False).encode()
        assert automaton.accepts(text) == validator.is_valid(document), document


def test_counted_copies_fall_back_to_the_single_regex(monkeypatch):
    # When the grammar form of a schema with many counted copies is refused, its single regex
    # (short: the copies are a counted repeat) still compiles, to a chain of 1,000 objects
    # that `minimize` splits at once (MaskBench sp_408/409/410: refused after 13 s while a
    # rule withheld this fallback; o9943's 160,134 states minimised in 0.5 s, not minutes).
    monkeypatch.setattr(js.budgets, "MAX_GRAMMAR_POSITIONS", 100)
    monkeypatch.setattr(js.budgets, "MAX_POSITIONS_BEFORE_TAILS", 100)
    js.pushdown_form.PUSHDOWN_CACHE.clear()  # the grammar form another test built
    rewriter, regex = js.rewriter.rewrite(
        ROLES, free_form_depth=js.free_values.CALL, counted_strings=True
    )
    assert rewriter.weight(regex) > js.budgets.GRAMMAR_REGEX > len(rewriter.substitute(regex))
    with pytest.raises(js.TooManyPositions):
        js.json_schema_grammar(ROLES, BYTES)
    automaton = js.json_schema_compile(ROLES, BYTES, cache=False)
    assert not isinstance(automaton, PushdownAutomaton)
    validator = jsonschema.Draft202012Validator(ROLES)
    for n in (0, 1, 999, 1000, 1001):
        document = {"roles": [{"id": f"{i:04x}-{i:04x}", "role": "view"} for i in range(n)]}
        text = json.dumps(document, separators=(",", ":")).encode()
        walked = automaton.walk(list(text))  # over the byte vocabulary, token ids are bytes
        assert bool(automaton.accepting[walked]) == validator.is_valid(document), n


def test_no_single_regex_fallback_when_its_written_out_copies_weigh_too_much(monkeypatch):
    # MaskBench o9925/o9853/o9958: up to 100 objects of two 255-character strings and 1,000
    # ids, a 1,450-character regex that weighs 4.5 million written out: outlines-core took
    # over 30 s on it. Over `SINGLE_REGEX_WEIGHT` the refused grammar form is the answer.
    monkeypatch.setattr(js.budgets, "MAX_GRAMMAR_POSITIONS", 100)
    monkeypatch.setattr(js.budgets, "MAX_POSITIONS_BEFORE_TAILS", 100)
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    rewriter, regex = js.rewriter.rewrite(
        ROLES, free_form_depth=js.free_values.CALL, counted_strings=True
    )
    monkeypatch.setattr(js.budgets, "SINGLE_REGEX_WEIGHT", rewriter.weight(regex) - 1)
    built = []
    monkeypatch.setattr(js.compiling, "regex_automaton", lambda *args, **kwargs: built.append(args))
    with pytest.raises(js.TooManyPositions, match="automaton positions"):
        js.json_schema_compile(ROLES, BYTES, cache=False)
    assert not built
    js.pushdown_form.PUSHDOWN_CACHE.clear()


_STRINGS = {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}
REQUIREMENTS = {
    "type": "array",
    "items": {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "class": {"const": "Docker"},
                    "tags": {"type": "array", "items": {"type": "array", "items": _STRINGS}},
                    "if": {"type": "string"},
                },
                "required": ["class"],
                "if": {"required": ["tags"]},  # refused where it counts; absorbed here
                "then": {"required": ["if"]},
            },
            {"type": "object", "properties": {}, "title": "any requirement"},
            {"type": "string", "enum": ["x", "y"]},
            {"type": "string"},
        ]
    },
}
"""Cut down from MaskBench o69208 (CWL requirements: specific objects beside an open one)."""


def test_an_anyOf_branch_of_a_whole_type_absorbs_the_others_of_that_type():
    # Every object is valid under the open branch, so the specific object (whose `"class":`
    # is followed by a string where the open object calls a free value: no one-byte choice)
    # and its `if` are left out, as are the listed strings: the same union, deterministic
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        automaton = js.json_schema_compile(REQUIREMENTS, BYTES, cache=False)
    assert isinstance(automaton, PushdownAutomaton)
    validator = jsonschema.Draft202012Validator(REQUIREMENTS)
    deep = {"class": {"a": [[[[[1, {"b": None}]]]]]}, "tags": 3}
    for document in ([], [deep], ["x", "z", {}], [{"class": "Docker", "tags": ["t"]}], [1], [[]]):
        text = json.dumps(document).encode()
        assert automaton.accepts(text) == validator.is_valid(document), document
    for closed in (False, True):
        rewriter, regex = js.rewriter.rewrite(REQUIREMENTS, closed_objects=closed, strict=False)
        # a closed object allows only `{}`: nothing is absorbed
        assert ('"Docker"' in rewriter.substitute(regex)) == closed


BIO = {
    "type": "object",
    "properties": {"bio": {"type": "string", "minLength": 100, "maxLength": 300}, "extra": {}},
    "required": ["bio"],
    "additionalProperties": False,
}
"""A counted string given as an automaton (over `COUNTED_STRING_MIN` characters; its `minLength`
over `COUNTER_MIN_LENGTH`, so not a counter rule) beside a free-form value: the grammar form calls
both."""


def test_a_string_automaton_over_the_positions_limit_skips_every_grammar_form(monkeypatch):
    # MaskBench o1052: a 5,000-character string (60,003 states) alone exceeds the positions of
    # any grammar form; two forms were still built (a 7.5 s rule) before the refusal. Now no
    # rule is built, and depth 1's single regex (the string spliced in) compiles.
    monkeypatch.setattr(js.budgets, "MAX_POSITIONS_BEFORE_TAILS", 1000)
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    rewriter, regex = js.rewriter.rewrite(
        BIO, free_form_depth=js.free_values.CALL, counted_strings=True
    )
    refusal = js.compiling._strings_too_large(rewriter, regex, over_regex=False)
    assert refusal is not None
    assert "the string automaton of `maxLength` at #/properties/bio has" in str(refusal)
    states = max(dfa.num_states for dfa in rewriter.dfa_texts.values())
    assert states > 1000  # about 12 states a character: escapes and UTF-8 sequences
    over = js.compiling._strings_too_large(rewriter, regex, over_regex=True)
    assert (over is None) == (states <= js.budgets.OVER_REGEX_SCALE * 1000)
    built = []
    original = js.rule_automata.rule_automaton
    monkeypatch.setattr(
        js.grammar_form, "rule_automaton", lambda *a: built.append(a[1]) or original(*a)
    )
    with pytest.warns(UserWarning, match="the string automaton of `maxLength`"):
        automaton = js.json_schema_compile(BIO, BYTES, cache=False)
    assert not built
    assert not isinstance(automaton, PushdownAutomaton)
    validator = jsonschema.Draft202012Validator(BIO)
    for bio in ("", "a" * 99, "é" * 150 + "a" * 150, "\\n" * 300, "a" * 301, "é" * 301):
        for extra in ([], {"a": 1, "b": None}, "x"):  # depth 1: the fallback's nesting
            document = {"bio": json.loads(f'"{bio}"'), "extra": extra}
            text = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
            walked = automaton.walk(list(text))  # over the byte vocabulary, token ids are bytes
            assert bool(automaton.accepting[walked]) == validator.is_valid(document), text[-40:]
    monkeypatch.undo()
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    rewriter, regex = js.rewriter.rewrite(
        BIO, free_form_depth=js.free_values.CALL, counted_strings=True
    )
    assert (
        js.compiling._strings_too_large(rewriter, regex, over_regex=False) is None
    )  # 3,600 states


def test_rule_edges_are_memoised_by_text_whatever_the_number_of_rules():
    # The attempts of one compile number their rules differently; a text's automaton and call
    # columns do not depend on it: the memo serves them all, with the free-form value's column
    # last (after `rules` rule columns) as without it.
    regex = (
        "(?:\\[(?:" + js.rule_plan.rule_call(1) + "|" + escape(js.FREE_VALUE_CALL) + "|true)\\])"
    )
    js.rule_automata._RULE_EDGES.clear()
    fresh = {rules: js.rule_automata.rule_edges(regex, rules, True) for rules in (2, 5)}
    assert len(js.rule_automata._RULE_EDGES) == 1
    js.rule_automata._RULE_EDGES.clear()
    memo = {rules: js.rule_automata.rule_edges(regex, rules, True) for rules in (5, 2)}
    for rules in (2, 5):
        (dfa, calls, register), (again, calls_again, _) = fresh[rules], memo[rules]
        assert register is None
        np.testing.assert_array_equal(dfa.delta, again.delta)
        np.testing.assert_array_equal(calls, calls_again)
        assert calls.shape == (dfa.num_states, rules + 1)
        start = dfa.initial
        opened = dfa.delta[start, ord("[")]
        assert calls[opened, 1] != REJECT and calls[opened, rules] != REJECT
        assert (np.delete(calls, [1, rules], axis=1) == REJECT).all()
        assert calls[opened, 1] == calls[opened, rules]  # both are followed by `]`
        assert dfa.matches(b"[true]") and not dfa.matches(b"[]")
    with pytest.raises(RuntimeError, match="calls rule 1"):
        js.rule_automata.rule_edges(regex, 1, True)


def _record_free_form_depths(monkeypatch) -> list:
    """The `free_form_depth` of every `json_schema_compile` call from now on, in order."""
    depths = []
    original = js.json_schema_compile

    def compile_(*args, **kwargs):
        depths.append(kwargs.get("free_form_depth"))
        return original(*args, **kwargs)

    # called by the tests (the package's name), `JsonSchema` and `json_schema_compile` itself
    # (its fallbacks)
    monkeypatch.setattr(js, "json_schema_compile", compile_)
    monkeypatch.setattr(js.compiling, "json_schema_compile", compile_)
    monkeypatch.setattr(js.constraint, "json_schema_compile", compile_)
    return depths


def _nested_arrays(levels: int) -> dict:
    """Arrays nested `levels` deep around integers: regular text deeper than
    `_inline_value_calls` reads a free-form value in place beside it (`_VALUE_CALL_LEVELS`)
    when `levels` is larger."""
    node: dict = {"type": "integer"}
    for _ in range(levels):
        node = {"type": "array", "items": node}
    return node


DEEP_LEVELS = js.rule_automata._VALUE_CALL_LEVELS + 4


@pytest.mark.parametrize(
    "schema, documents",
    [
        (  # a free-form array item beside integers nested three deep
            {
                "type": "object",
                "properties": {
                    "v": {"anyOf": [_nested_arrays(3), {"type": "array", "minItems": 2}]}
                },
                "additionalProperties": False,
            },
            [
                {"v": [[[1]]]},
                {"v": [1, [[[[["x", {"k": [[[{}]]]}]]]]]]},
                {"v": [[[1]], [[2]]]},
                {"v": [1]},
                {"v": [[["a"]]]},
                {"v": {}},
            ],
        ),
        (  # MaskBench o24467's shape: a member constrained in one branch, free in another
            {
                "type": "array",
                "items": {
                    "anyOf": [
                        {
                            "required": ["q"],
                            "properties": {"q": {"maxItems": 1}, "n": {"enum": ["a"]}},
                        },
                        {"required": ["q"], "properties": {"n": {"enum": ["b"]}}},
                    ]
                },
            },
            [
                [{"n": "b", "q": [[[[1]]]]}],
                [{"q": {"x": [[[{"y": [1, 2]}]]]}, "n": "a"}],
                [{"q": [1], "n": "a"}, {"n": "b", "q": "s"}],
                [{"q": [1, 2], "n": "a"}],
                [{"n": "b"}],
                [1, "s", [[[{"q": 1}]]]],
            ],
        ),
    ],
)
def test_a_free_value_competing_with_regular_text_is_read_in_place(schema, documents):
    # Where a free-form value's call competes with regular text for its first byte, that call
    # alone is read a level in place (`_inline_value_calls`), deeper while the regular side
    # still competes: the schema keeps its pushdown automaton, so free values nest as deep as
    # the stack. Before, every attempt conflicted and free values nested 1 level.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        automaton = js.json_schema_compile(schema, BYTES, cache=False)
    assert not [w for w in caught if "no pushdown automaton" in str(w.message)]
    assert isinstance(automaton, PushdownAutomaton)
    validator = jsonschema.Draft202012Validator(schema)
    verdicts = []
    for document in documents:
        valid = validator.is_valid(document)
        verdicts.append(valid)
        for text in (json.dumps(document), json.dumps(document, separators=(",", ":"))):
            assert automaton.accepts(text.encode()) == valid, text
    assert True in verdicts and False in verdicts


def test_inline_value_calls_leaves_an_automaton_without_competing_calls_as_it_is():
    dfa, calls, _ = js.rule_automata.rule_edges(
        js.free_value(1, innermost=escape(js.FREE_VALUE_CALL)), 0, True
    )
    new_dfa, new_calls = js.rule_automata.inline_value_calls(
        dfa, calls, js.free_values.DEFAULT_WHITESPACE
    )
    assert new_dfa is dfa and new_calls is calls


def test_rules_with_competing_calls_read_in_place_are_memoised():
    # A rule whose free-form value's call competes with a `[` (arrays of integers beside any
    # value) is read in place once per (text, rules, whitespace): the attempts of a compile
    # that build it again get the same automaton, equal to building it afresh.
    regex = "(?:\\[(?:" + escape(js.FREE_VALUE_CALL) + "|\\[[0-9]\\])\\])"
    ws = js.free_values.DEFAULT_WHITESPACE
    js.rule_automata._INLINED_RULE_EDGES.clear()
    first = js.rule_automata.inlined_rule_edges(regex, 2, ws)
    assert js.rule_automata.inlined_rule_edges(regex, 2, ws) is first
    assert len(js.rule_automata._INLINED_RULE_EDGES) == 1
    fresh = js.rule_automata.inline_value_calls(
        *js.rule_automata.rule_edges(regex, 2, True)[:2], ws
    )
    assert (
        fresh[0].num_states != js.rule_automata.rule_edges(regex, 2, True)[0].num_states
    )  # read in place
    np.testing.assert_array_equal(first[0].delta, fresh[0].delta)
    np.testing.assert_array_equal(first[1], fresh[1])
    js.rule_automata._INLINED_RULE_EDGES.clear()


def test_the_depth_one_fallback_is_compiled_once(monkeypatch):
    # A free-form value beside arrays nested deeper than the levels read in place: its call
    # competes with a `[` too deep for `_inline_value_calls`. When depth 1 fails too (here: a
    # grammar form over a tiny positions limit), that refusal stands: depth 1 is compiled once
    # (MaskBench o48866 once compiled it three times, 12.4 s, through attempts that each fell
    # back on their own), after one attempt at depth 2 that stops before any automaton is
    # built (its single regex is over `GRAMMAR_REGEX`, here 0).
    monkeypatch.setattr(js.budgets, "GRAMMAR_REGEX", 0)  # the grammar form, as for a large schema
    monkeypatch.setattr(js.budgets, "SINGLE_REGEX", 10)  # ... with no single regex to fall back to
    monkeypatch.setattr(js.budgets, "MAX_GRAMMAR_POSITIONS", 5)
    monkeypatch.setattr(js.budgets, "MAX_POSITIONS_BEFORE_TAILS", 5)
    schema = {"anyOf": [_nested_arrays(DEEP_LEVELS), {}]}
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    depths = _record_free_form_depths(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(js.TooManyPositions):
            js.json_schema_compile(schema, BYTES, cache=False)
    assert depths == [None, *js.compiling._FALLBACK_DEPTHS] == [None, 2, js.NESTED_FREE_FORM_DEPTH]
    assert len([w for w in caught if "no pushdown automaton" in str(w.message)]) == 1
    js.pushdown_form.PUSHDOWN_CACHE.clear()


def test_a_free_value_competing_too_deep_falls_back_to_depth_two_or_one():
    # A node whose `v` is arrays nested deeper than the levels read in place or an array of
    # at least two free values: the free value's call competes with the arrays' `[` (or the
    # integers' digits) deeper than `_inline_value_calls` reads. The recursive form is refused
    # (`None`: the caller unrolls). Without recursion the schema compiles to a token automaton
    # with free values nested 2 levels; with recursion (whose fallback may still be a pushdown
    # automaton) `NESTED_FREE_FORM_DEPTH` level(s). Either way with a warning that names the
    # depth, accepting what `jsonschema` accepts within it (MaskBench Github_medium o9795 and
    # Snowplow sp_193: valid documents with values nested 2 levels, rejected at depth 1).
    value = {"anyOf": [_nested_arrays(DEEP_LEVELS), {"type": "array", "items": {}, "minItems": 2}]}
    node = {
        "type": "object",
        "properties": {"next": {"$ref": "#/$defs/node"}, "v": value},
        "additionalProperties": False,
    }
    recursive = {"$defs": {"node": node}, "$ref": "#/$defs/node"}
    assert js.compiling._recursive_grammar(recursive, BYTES, 32, {}) is None
    two_levels = {"v": [[1, [2]], {"a": [3]}]}  # free items that nest 2 levels: valid
    three_levels = {"v": [[1, [[2]]], {}]}  # ... 3 levels: valid, beyond both depths
    for schema, depth in ((recursive, 1), ({"type": "object", "properties": {"v": value}}, 2)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            automaton = js.json_schema_compile(schema, BYTES, cache=False)
        fallbacks = [str(w.message) for w in caught if "no pushdown automaton" in str(w.message)]
        assert len(fallbacks) == 1 and f"nest at most {depth} level(s)" in fallbacks[0]
        for document, valid, accepted in (
            ({"v": json.loads("[" * DEEP_LEVELS + "1" + "]" * DEEP_LEVELS)}, True, True),
            ({"v": [1, "a"]}, True, True),
            ({"v": [[1, 2], {}]}, True, True),
            (two_levels, True, depth >= 2),
            (three_levels, True, False),
            ({"v": [1]}, False, False),
            ({"v": [[["a"]]]}, False, False),
        ):
            if "$defs" in schema:
                document = {"next": document}
            assert jsonschema.Draft202012Validator(schema).is_valid(document) == valid
            text = json.dumps(document, separators=(",", ":")).encode()
            if isinstance(automaton, PushdownAutomaton):
                assert automaton.accepts(text) == accepted, text
            else:
                assert bool(automaton.accepting[automaton.walk(list(text))]) == accepted, text
