"""The counter register of long plain strings (issue 55: `json_schema.counter_strings`,
`PushdownAutomaton.step`'s `reg_limit`, the device walk and mask, and a schema's long plain
string compiled as a counter rule), on a small limit, against `jsonschema`'s `maxLength`
(code points)."""

import copy
import itertools
import json
import warnings

import jsonschema
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured.byte_dfa import REJECT, ByteDFA, minimize, regex_byte_dfa
from functional_gen.structured.dfa_operations import numbered_mark_edges
from functional_gen.structured.json_schema import budgets
from functional_gen.structured.json_schema.compiling import json_schema_compile
from functional_gen.structured.json_schema.counter_strings import counter_string_dfa
from functional_gen.structured.json_schema.errors import UnsupportedSchemaError
from functional_gen.structured.json_schema.pushdown_form import PUSHDOWN_CACHE
from functional_gen.structured.json_schema.regex_form import (
    counter_placeholders,
    spliced_dfa,
)
from functional_gen.structured.json_schema.rewriter import rewrite
from functional_gen.structured.json_schema.rule_plan import RULE_CALL, rule_call
from functional_gen.structured.pushdown import PushdownAutomaton, build_pushdown
from functional_gen.structured.pushdown.register_walk import RegisterPushdownConstraint
from functional_gen.structured.vocabulary import TokenVocabulary

from .maskbench import refused_at, tokens_pass
from .test_pda import BYTES_ONLY, _completable

LIMIT = 5
SINGLE_BYTES = TokenVocabulary(tuple(bytes([b]) for b in range(256)) + (None,), (256,), "bytes")
LONG_TOKENS = TokenVocabulary(
    tuple(bytes([b]) for b in range(256))
    + (b"aaa", b"aaaaaa", "é中".encode(), b"\\n\\t", b'a"', b'a","b', b'","', b'"ab', b'"]')
    + (b'["', "😀".encode(), None),
    (267,),
    "bytes-and-strings",
)
"""Tokens that write several characters inside a string, or leave it (6 bytes at most)."""
CHARACTERS = ["a", " ", "é", "中", "😀", "\n", '"', "\\", "/", "\t"]
"""Characters of the strings written (multi-byte UTF-8 and escaped ones among them)."""


def _rule(regex: str, callables: int):
    """`(dfa, calls)` of a grammar-form regex calling rules `0 .. callables - 1`."""
    dfa = minimize(regex_byte_dfa(regex))
    calls = np.full((dfa.num_states, callables), REJECT, np.int32)
    for q, r, after in numbered_mark_edges(dfa.delta, RULE_CALL):
        calls[q, r] = after
    delta = dfa.delta.copy()
    delta[:, RULE_CALL] = REJECT
    return ByteDFA(delta, dfa.accepting, dfa.initial), calls


def _strings(limit: int):
    """Strings of 0 to `limit + 2` characters of `CHARACTERS`, a few of each length."""
    for n in range(limit + 3):
        for k, chars in enumerate(itertools.product(CHARACTERS, repeat=n)):
            if k % 997 == 0 or n <= 2:
                yield "".join(chars)


@pytest.mark.parametrize("minimum", [0, 1, 3])
def test_counter_dfa_counts_code_points_as_jsonschema_does(minimum):
    counter = counter_string_dfa(LIMIT, minimum)
    validator = jsonschema.Draft202012Validator(
        {"type": "string", "minLength": minimum, "maxLength": LIMIT}
    )
    seen = {True: 0, False: 0}
    for s in _strings(LIMIT):
        for text in {json.dumps(s), json.dumps(s, ensure_ascii=False)}:
            if "\\u" in text:  # ANY_STRING has no \u escapes
                continue
            want = validator.is_valid(json.loads(text))
            assert counter.accepts(text.encode("utf-8")) == want, text
            seen[want] += 1
    assert seen[True] > 50 and seen[False] > 50
    # exactly the limit, and one more, of each kind of character; the minimum, and one less
    for c in CHARACTERS:
        text = json.dumps(c * LIMIT, ensure_ascii=False).encode("utf-8")
        assert counter.accepts(text)
        assert not counter.accepts(json.dumps(c * (LIMIT + 1), ensure_ascii=False).encode())
        assert counter.accepts(json.dumps(c * minimum, ensure_ascii=False).encode())
        if minimum:
            assert not counter.accepts(json.dumps(c * (minimum - 1), ensure_ascii=False).encode())
    # the chain's characters are not counted: the loop counts the rest
    assert counter.reg_limit.max() == LIMIT - minimum


def test_counter_dfa_refuses_bounds_it_cannot_count():
    for limit, minimum in ((0, 0), (5, 5), (5, 7), (5, -1)):
        with pytest.raises(ValueError, match="counter_string_dfa"):
            counter_string_dfa(limit, minimum)


def test_a_surrogate_pair_escape_is_one_code_point_in_jsonschema():
    # Not in ANY_STRING (no \u escapes), but if they are added the pair must count once.
    value = json.loads('"\\ud83d\\ude00"')
    assert len(value) == 1
    assert jsonschema.Draft202012Validator({"maxLength": 1}).is_valid(value)
    assert not counter_string_dfa(LIMIT).accepts(b'"\\ud83d\\ude00"')


def _array_pushdown(limit: int, vocabulary=BYTES_ONLY, minimum: int = 0):
    """A bottom frame `[ s (, s)* ]` of calls of a counter rule of `minimum` to `limit`
    characters."""
    call = rule_call(0)
    top = _rule(f"\\[(?:{call}(?:,{call})*)?\\]", 1)
    counter = counter_string_dfa(limit, minimum)
    rules = [("top", *top), ("string", counter.dfa, np.zeros((counter.dfa.num_states, 1), int) - 1)]
    return build_pushdown(
        None, vocabulary, stack_depth=4, rules=rules, registers=[None, counter.registers]
    )


@pytest.mark.parametrize("minimum", [0, 2])
def test_pushdown_step_counts_each_frame_as_jsonschema_does(minimum):
    automaton = _array_pushdown(LIMIT, SINGLE_BYTES, minimum)
    assert automaton.has_register and automaton.reg_limit.max() == LIMIT - minimum
    assert not automaton.counts_registers  # no token need from maxLength
    string = {"type": "string", "minLength": minimum, "maxLength": LIMIT}
    schema = {"type": "array", "items": string}
    validator = jsonschema.Draft202012Validator(schema)
    strings = [s for s in _strings(LIMIT) if "\\u" not in json.dumps(s, ensure_ascii=False)]
    strings = strings[::7] + ["a" * LIMIT, "a" * (LIMIT + 1), "😀" * LIMIT, "\\" * (LIMIT + 1)]
    for k in range(len(strings)):
        items = [strings[k], strings[(k * 5 + 3) % len(strings)]][: 1 + k % 2]
        text = json.dumps(items, ensure_ascii=False, separators=(",", ":"))
        want = validator.is_valid(items)
        assert automaton.accepts(text.encode("utf-8")) == want, text
    # a long first string does not count against the second (each call starts at 0)
    full = json.dumps(["é" * LIMIT, "中" * LIMIT], ensure_ascii=False, separators=(",", ":"))
    assert automaton.accepts(full.encode("utf-8"))
    config = automaton.walk(b'["abc')
    assert config is not None and config[2] == 3 - minimum and config[3] == (0,)


@pytest.mark.parametrize("limit", [1, 3])
def test_counter_refuses_the_byte_past_the_limit(limit):
    automaton = _array_pushdown(limit, SINGLE_BYTES)
    config = automaton.walk(b'["' + b"x" * limit)
    assert config is not None
    assert automaton.step(config, ord("x")) is None
    assert automaton.step(config, ord("\\")) is None  # an escape starts a character
    assert automaton.step(config, 0xC3) is None  # so does a UTF-8 lead byte
    assert automaton.step(config, ord('"')) is not None  # closing writes none


def test_a_token_longer_than_the_limit_is_refused_at_build_time():
    with pytest.raises(ValueError, match="could pass the limit"):
        _array_pushdown(3)  # BYTES_ONLY has `null`, 4 bytes


@pytest.mark.parametrize("minimum", [0, 2])
def test_masks_with_a_counter_equal_a_brute_force_walk(minimum):
    # In a counter frame the register-blind bitmask row keeps only the tokens whose characters
    # (`counted`) fit in what is left of the limit; the result is exactly the tokens whose
    # bytes the host walk reads (with the counter), after which the text can still end. With
    # a minimum, the chain before the counted loop has no `counted` row (the register is 0
    # there): the masks from it are still exact.
    limit = 6 + minimum
    automaton = _array_pushdown(limit, LONG_TOKENS, minimum)
    assert automaton.counted.shape == (automaton.counter_row.max() + 1, automaton.vocab_size)
    opened = automaton.walk(b'["')[0]  # the loop's position, or the chain's first
    assert (automaton.counter_row[opened] >= 0) == (minimum == 0)
    completable = _completable(automaton)
    prefixes = [b"[", b'["', b'["a', b'["aaa', b'["aaaaa', b'["aaaaaa', b'["\\', b'["\\n']
    prefixes += [b'["\xc3', b'["\xc3\xa9\xc3\xa9', b'["aaaaaa","', b'["aaaaaa","a', b'["a"']
    prefixes += ['["é中😀a'.encode(), '["é中😀aa'.encode(), b'["\\n\\t\\n\\t"]']
    refused = 0
    prefixes += [b'["aaaaaaaa', b'["aaaaaaaa","a']
    for prefix in prefixes:
        config = automaton.walk(prefix)
        if config is None:  # a string shorter than the minimum closed, or one past the limit
            assert minimum or prefix.count(b"a") > limit, prefix
            continue
        want = np.zeros(automaton.vocab_size, bool)
        for t, data in enumerate(LONG_TOKENS.token_bytes):
            if data:
                after = automaton.walk(data, config)
                want[t] = after is not None and completable(after[:2])
        want[list(LONG_TOKENS.eos_token_id)] = automaton.can_end(config)
        got = automaton.allowed(config)
        np.testing.assert_array_equal(got, want, err_msg=repr(prefix))
        no_counter = copy.copy(automaton)  # not `dataclasses.replace` (its type check)
        object.__setattr__(no_counter, "counter_row", np.full(automaton.num_positions, -1))
        refused += int((no_counter.allowed(config) & ~got).sum())
    assert refused >= 10  # the counter's compare refuses bitmask tokens


def _documents(limit: int) -> list[bytes]:
    """Arrays of strings around the limit (each kind of character), valid or not."""
    strings = [c * n for c in ("a", "é", "中", "😀", "\n", '"') for n in (0, limit, limit + 1)]
    documents = [[s] for s in strings] + [[strings[k], strings[-k]] for k in range(1, 9)]
    return [json.dumps(d, ensure_ascii=False, separators=(",", ":")).encode() for d in documents]


def test_device_walk_with_a_counter_equals_the_host_walk():
    # byte for byte, the device's configuration (the counter in the register) is the host's,
    # until the host refuses a byte (the device's position is then DEAD)
    from functional_gen.structured.pushdown.register_walk import RegisterWalk

    from .test_register_objects import _device_configs

    automaton = _array_pushdown(LIMIT)
    documents = _documents(LIMIT)
    pos, stack, sp, register, registers = _device_configs(RegisterWalk(automaton), documents)
    refused = 0
    for i, document in enumerate(documents):
        config = automaton.initial_config()
        for j, byte in enumerate(document):
            config = automaton.step(config, byte)
            if config is None:
                assert (pos[i, j:] == 0).all(), (document, j)
                refused += 1
                break
            depth = int(sp[i, j])
            assert int(pos[i, j]) == config[0], (document, j)
            assert tuple(stack[i, j, :depth].tolist()) == config[1]
            assert int(register[i, j]) == config[2], (document, j)
            assert tuple(registers[i, j, :depth].tolist()) == config[3]
    assert refused >= 8


def test_device_mask_with_a_counter_equals_the_host_mask():
    # A token walk into long strings (preferring the tokens that write most characters): at
    # each step the jitted `process` keeps the host walk's configuration and masks exactly the
    # tokens `allowed` gives (the counter's compare on the bitmask row included).
    import jax
    import jax.numpy as jnp

    from functional_gen.structured.pushdown.register_walk import RegisterPushdownConstraint

    from .helpers import context_for

    automaton = _array_pushdown(6, LONG_TOKENS)
    processor = RegisterPushdownConstraint(automaton)
    step = jax.jit(lambda s, logits, c: processor.process(s, logits, c))
    rng = np.random.default_rng(3)
    ids = [1, 2, 3]
    state = processor.init(context_for(ids, 3, max_len=96))
    shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
    config = automaton.initial_config()
    long = [t for t, b in enumerate(LONG_TOKENS.token_bytes) if b and len(b) >= 3]
    refused = 0
    for _ in range(40):
        state, logits = step(
            state, jnp.zeros(automaton.vocab_size), context_for(ids, 3, max_len=96)
        )
        assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
        pos, stack, sp, register, registers = (np.asarray(x) for x in state)
        assert (int(pos), tuple(stack[: int(sp)].tolist()), int(register)) == config[:3]
        assert tuple(registers[: int(sp)].tolist()) == config[3]
        host = automaton.allowed(config)
        np.testing.assert_array_equal(np.isfinite(np.asarray(logits)), host)
        refused += sum(1 for t in long if not host[t])
        preferred = [t for t in long if host[t]]
        token = int(
            rng.choice(preferred)
            if preferred and rng.random() < 0.7
            else rng.choice(np.flatnonzero(host))
        )
        if token in LONG_TOKENS.eos_token_id or len(ids) >= 95:
            break
        ids.append(token)
        config = automaton.walk(LONG_TOKENS.token_bytes[token], config)
    assert refused > 0


# ------------------------------------------------ from a JSON Schema (`json_schema_compile`)

COUNTED = 100
"""A `maxLength` made a counter rule by lowering the thresholds (`_counter_budgets`): the
counter needs a limit no shorter than the longest token (SmolLM2's: 81 bytes)."""


@pytest.fixture
def _counter_budgets(monkeypatch):
    """`MAX_STRING_STATES` and `COUNTED_STRING_MIN` lowered so that a plain string of
    `COUNTED` characters takes the counter path, as one of over ~5,333 does."""
    monkeypatch.setattr(budgets, "COUNTER_STRINGS", True)
    monkeypatch.setattr(budgets, "COUNTED_STRING_MIN", COUNTED // 2)
    monkeypatch.setattr(budgets, "MAX_STRING_STATES", budgets.PLAIN_STRING_STATES * COUNTED - 1)
    PUSHDOWN_CACHE.clear()
    yield
    PUSHDOWN_CACHE.clear()


def _compiled(schema, vocabulary):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        automaton = json_schema_compile(schema, vocabulary, cache=False)
    return automaton, [str(w.message) for w in caught]


def _values(n: int):
    """Strings of `n` characters: ASCII, multi-byte UTF-8 and escaped characters."""
    return ["a" * n, ("é中 x\n" * n)[:n], "😀" * n, ('"\\/\t' * n)[:n]]


@pytest.mark.usefixtures("_counter_budgets")
def test_a_long_plain_string_compiles_as_a_counter_rule(tokenizer, vocabulary):
    string = {"type": "string", "maxLength": COUNTED}
    wide = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "text": string,
            "tag": {"type": "string", "maxLength": 3},
            "more": {"type": "array", "items": string, "maxItems": 2},
        },
        "required": ["id", "text"],
        "additionalProperties": False,
    }
    eos = vocabulary.eos_token_id[0]
    for schema in (string, wide):
        automaton, said = _compiled(schema, vocabulary)
        assert isinstance(automaton, PushdownAutomaton) and automaton.has_register, said
        assert not said
        # (few documents: the host's `allowed` over SmolLM2's vocabulary is slow)
        documents = [
            value
            if schema is string
            else {"id": 7, "text": value, "tag": "ab", "more": ["x", value]}
            for n in ((0, COUNTED, COUNTED + 1) if schema is string else (COUNTED, COUNTED + 1))
            for value in _values(n)[:: 1 if schema is string else 2]
        ]
        _tokens_decide_as_jsonschema(automaton, schema, documents, tokenizer, eos)


def _tokens_decide_as_jsonschema(automaton, schema, documents, tokenizer, eos: int):
    """Each document's own tokens, then EOS, pass `automaton`'s masks exactly when `jsonschema`
    says it is valid; both kinds among them."""
    validator = jsonschema.Draft202012Validator(schema)
    seen = {True: 0, False: 0}
    for document in documents:
        valid = validator.is_valid(document)
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert (refused_at(automaton, ids, eos) is None) == valid, text[:40]
        seen[valid] += 1
    assert seen[True] and seen[False]


@pytest.mark.usefixtures("_counter_budgets")
def test_a_counter_rule_runs_on_the_register_constraint(tokenizer):
    processor = fg.processors.JsonSchema({"type": "string", "maxLength": COUNTED}, tokenizer)
    assert isinstance(processor.tables.pushdown, RegisterPushdownConstraint)


@pytest.mark.usefixtures("_counter_budgets")
def test_a_counter_rule_is_never_spliced(vocabulary):
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": COUNTED}}}
    rewriter, regex = rewrite(schema, counted_strings=True)
    full = rewriter.substitute(regex)
    assert rewriter.counter_texts and counter_placeholders(rewriter, full)
    with pytest.raises(UnsupportedSchemaError, match="counted by a register"):
        spliced_dfa(rewriter, full)
    # called where another string may start: the grammar form cannot choose it, refused
    either = {"anyOf": [{"type": "string", "maxLength": COUNTED}, {"enum": ["x", 1]}]}
    with pytest.raises(UnsupportedSchemaError, match="maxLength"):
        json_schema_compile(either, vocabulary, cache=False)


@pytest.mark.usefixtures("_counter_budgets")
def test_a_long_string_with_a_min_length_is_a_counter_rule_after_a_chain(tokenizer, vocabulary):
    # `minLength` up to `COUNTER_MIN_LENGTH`: the first characters are a chain of states,
    # then the counted loop; tokens of the string's own tokenization pass exactly when
    # jsonschema says the document is valid
    schema = {"type": "string", "minLength": 2, "maxLength": COUNTED}
    automaton, said = _compiled(schema, vocabulary)
    assert isinstance(automaton, PushdownAutomaton) and automaton.has_register, said
    assert int(automaton.reg_limit.max()) == COUNTED - 2
    documents = [value for n in (0, 1, 2, COUNTED, COUNTED + 1) for value in _values(n)[::2]]
    eos = vocabulary.eos_token_id[0]
    _tokens_decide_as_jsonschema(automaton, schema, documents, tokenizer, eos)


@pytest.mark.usefixtures("_counter_budgets")
def test_a_long_string_with_a_larger_min_length_is_still_refused(vocabulary):
    minimum = budgets.COUNTER_MIN_LENGTH + 1
    schema = {"type": "string", "minLength": minimum, "maxLength": COUNTED}
    with pytest.raises(UnsupportedSchemaError, match="a `minLength` of at most") as info:
        json_schema_compile(schema, vocabulary, cache=False)
    assert info.value.keyword == "maxLength"


@pytest.mark.usefixtures("_counter_budgets")
def test_the_fallback_never_writes_a_counter_rule_as_a_repeat(monkeypatch):
    # MaskBench o9784's shape: a counter string beside an array of 1,000 24-digit ids, whose
    # 28,003 states make the grammar form too large; `nest_instead`'s fallback must not try
    # the call form again from an uncounted rewrite, where the counter string is a regex
    # repeat (`{0,32767}` there: 220 s in `minimize` before the same refusal)
    from functional_gen.structured.json_schema import rule_automata
    from functional_gen.structured.json_schema.errors import TooManyPositions

    ids = {"type": "string", "pattern": "^[a-f0-9]{24}$"}
    schema = {
        "type": "object",
        "properties": {
            "ids": {"type": "array", "items": ids, "maxItems": 1000},
            "description": {"type": "string", "maxLength": COUNTED},
        },
        "additionalProperties": False,
    }
    built: list[str] = []
    real = rule_automata._rule_edges_of

    def recorded(regex, free_value):
        built.append(regex)
        return real(regex, free_value)

    monkeypatch.setattr(rule_automata, "_rule_edges_of", recorded)
    with (
        pytest.warns(UserWarning, match="free-form values nest at most"),
        pytest.raises(TooManyPositions),
    ):
        json_schema_compile(schema, BYTES_ONLY, cache=False)
    assert built and not [regex for regex in built if f",{COUNTED}}}" in regex]


@pytest.mark.usefixtures("_counter_budgets")
def test_a_token_longer_than_the_count_keeps_the_counted_byte_automaton(monkeypatch):
    # A counter never checks a token that enters the string from outside, so where the
    # vocabulary has a token longer than `maxLength - minLength` bytes the string is the
    # counted byte automaton instead (before: `build_pushdown`'s ValueError)
    long_token = b"a" * (COUNTED + 20)
    vocabulary = TokenVocabulary(
        tuple(bytes([b]) for b in range(256)) + (long_token, b'"' + long_token, None),
        (258,),
        "bytes-and-a-long-token",
    )
    schema = {"type": "string", "maxLength": COUNTED}
    with pytest.raises(UnsupportedSchemaError, match=rf"longest token \({COUNTED + 21} bytes\)"):
        json_schema_compile(schema, vocabulary, cache=False)  # over the lowered state limit
    monkeypatch.setattr(budgets, "MAX_STRING_STATES", 64_000)
    automaton, said = _compiled(schema, vocabulary)
    assert not getattr(automaton, "has_register", False), said
    validator = jsonschema.Draft202012Validator(schema)
    for n in (0, COUNTED, COUNTED + 1, COUNTED + 21):
        text = json.dumps("a" * n).encode()
        assert tokens_pass(automaton, list(text), 258) == validator.is_valid("a" * n), n
    # the long tokens: one that fits is not refused for entering the string, then too long
    assert tokens_pass(automaton, [ord('"'), 256, ord('"')], 258) is False  # 120 characters
    assert refused_at(automaton, [257], 258) == 0
    # with tokens no longer than the count, the same string is a counter rule
    assert _compiled(schema, BYTES_ONLY)[0].has_register
