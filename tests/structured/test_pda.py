"""The pushdown automaton of a grammar: accepts what lark's parser accepts (up to the stack
depth), its precomputed token tables equal a brute-force walk of every token, the device step
equals the host tables, and it generates parseable text inside `generate`."""

import time

import jax
import jax.numpy as jnp
import lark
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured import (
    GrammarError,
    NotDeterministic,
    json_schema as js,
    parse_grammar,
    pushdown_automaton,
)
from functional_gen.structured.json_schema import json_schema_compile
from functional_gen.structured.pushdown import PushdownAutomaton, build_pushdown, state_stack

from .cases import JSON_GBNF, JSON_GRAMMAR, PUSHDOWN_GRAMMARS, SPACED_FUNCTION_CALLS
from .grammar_strings import mutate, sample
from .helpers import context_for


def _lark_accepts(parser, text: bytes, fast=None) -> bool:
    """Whether lark's `parser` (Earley) parses `text`. `fast`: an LALR parser of the same
    grammar, tried first: what it parses is in the language; what it refuses (its contextual
    lexer may split differently) is judged by Earley, 10-100x slower on long texts."""
    try:
        text = text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    for p in (fast, parser) if fast is not None else (parser,):
        try:
            p.parse(text)
        except lark.exceptions.LarkError:
            continue
        return True
    return False


def _lalr_or_none(grammar: str):
    try:
        return lark.Lark(grammar, parser="lalr")
    except lark.exceptions.GrammarError:
        return None


@pytest.mark.parametrize("name", sorted(PUSHDOWN_GRAMMARS))
def test_acceptance_equals_lark(name, vocabulary):
    # 500 random sentences and 500 single-character mutations of them (most rejected), each
    # judged by lark's parser and by the pushdown automaton.
    grammar = PUSHDOWN_GRAMMARS[name]
    spec = parse_grammar(grammar)
    pda = pushdown_automaton(grammar, vocabulary)
    parser, fast = lark.Lark(grammar, parser="earley"), _lalr_or_none(grammar)
    alphabet = bytes(
        sorted(
            set(b"".join(sample(spec, np.random.default_rng(i)) for i in range(50)))
            | set(b" (),1a")
        )
    )
    rng = np.random.default_rng(0)
    counts = {True: 0, False: 0}
    for i in range(1000):
        text = sample(spec, rng, max_depth=10)
        if i % 2:
            text = mutate(text, alphabet, rng)
        expected = _lark_accepts(parser, text, fast)
        assert pda.accepts(text) == expected, (name, text, expected)
        counts[expected] += 1
    assert counts[True] >= 375 and counts[False] >= 125, counts


def _completable(pda):
    """`ok(config)`: whether some byte string ends the text from `config` within the stack
    depth. `ends[p][R]`: the rule of `p` can end with at most `R` more stack slots (a fixed point
    over single bytes, independent of the token tables and the budget)."""
    depth = pda.stack_depth
    ends = [[bool(pda.final[p])] * (depth + 1) for p in range(pda.num_positions)]
    changed = True
    while changed:
        changed = False
        for p in range(1, pda.num_positions):
            for room in range(depth + 1):
                if ends[p][room]:
                    continue
                for c in range(pda.next.shape[1]):
                    target = int(pda.next[p, c])
                    pushed = [int(q) for q in pda.push[p, c] if q]
                    if target <= 0 or len(pushed) > room:
                        continue
                    if ends[target][room - len(pushed)] and all(
                        ends[q][room - i] for i, q in enumerate(pushed)
                    ):
                        ends[p][room], changed = True, True
                        break

    def ok(config) -> bool:
        pos, stack = config
        return ends[pos][depth - len(stack)] and all(
            ends[q][depth - j] for j, q in enumerate(stack)
        )

    return ok


def _brute_force(pda, vocabulary, config, ok=None):
    """Every token whose bytes the automaton reads from `config` (and, with `ok`, after which
    the text can still end within the stack depth), EOS where the text may end."""
    allowed = np.zeros(vocabulary.vocab_size, bool)
    for t, data in enumerate(vocabulary.token_bytes):
        if data:
            after = pda.walk(data, config)
            allowed[t] = after is not None and (ok is None or ok(after))
    allowed[list(vocabulary.eos_token_id)] = pda.can_end(config)
    return allowed


@pytest.mark.parametrize(
    "name, text, stack_depth",
    [
        ("json", b'{"a": [1, {"b": [[null]]}], "c": "x"}', 32),
        ("json", b"[[[[[[[1]]]]]]]", 6),  # the stack fills up: deeper tokens are masked
        ("arithmetic", b"1 + (2 * -(3)) - ((4))", 32),
        ("lisp", b"(a (b '(c d)) 12)", 32),
    ],
)
def test_token_tables_equal_a_brute_force_walk(name, text, stack_depth, vocabulary):
    # At every other prefix: the bitmask row + candidates give exactly the tokens whose bytes
    # the automaton reads from the configuration and after which the text can still end within
    # the stack depth (every token of the vocabulary walked).
    pda = build_pushdown(
        parse_grammar(PUSHDOWN_GRAMMARS[name]), vocabulary, stack_depth=stack_depth
    )
    ok = _completable(pda)
    checked = 0
    for i in range(0, len(text) + 1, 3):
        config = pda.walk(text[:i])
        if config is None:
            assert stack_depth < 32  # only the small stack runs out
            break
        np.testing.assert_array_equal(
            pda.allowed(config), _brute_force(pda, vocabulary, config, ok), err_msg=repr(text[:i])
        )
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("budget", [None, 14])
def test_device_step_equals_the_host_tables(budget, vocabulary):
    # A random token walk: at each step the jitted `process` keeps the same position and stack
    # as the host walk and masks exactly the tokens `allowed` gives (with a budget of
    # `max_new_tokens`, too: the walk then ends inside the language).
    pda = build_pushdown(parse_grammar(JSON_GRAMMAR), vocabulary, stack_depth=5)
    processor = fg.structured.PushdownConstraint(pda)
    step = jax.jit(lambda s, logits, c: processor.process(s, logits, c))
    rng = np.random.default_rng(1)
    ids = [1, 2, 3]
    limit = {} if budget is None else {"max_new_tokens": budget}
    state = processor.init(context_for(ids, 3, max_len=64, **limit))
    shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
    config = (pda.initial, ())
    brackets = [
        t
        for t in range(vocabulary.vocab_size)
        if vocabulary.token_bytes[t] in (b"[", b"{", b' {"', b"[[")
    ]
    for k in range(30 if budget is None else budget):
        state, logits = step(
            state, jnp.zeros(vocabulary.vocab_size), context_for(ids, 3, max_len=64, **limit)
        )
        assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
        assert int(state[0]) == config[0] and state_stack(state) == list(config[1])
        host = pda.allowed(config, None if budget is None else budget - k)
        np.testing.assert_array_equal(np.isfinite(np.asarray(logits)), host)
        open_ = [t for t in brackets if host[t]]
        token = (
            int(rng.choice(open_))
            if open_ and rng.random() < 0.5
            else int(rng.choice(np.flatnonzero(host)))
        )
        if token in vocabulary.eos_token_id:
            break
        ids.append(token)
        config = pda.walk(vocabulary.token_bytes[token], config)
    assert max(len(s) for s in [config[1]]) >= 0
    if budget is not None:
        assert pda.can_end(config), config  # the budget ran out inside the language


def test_json_with_stack_depth_32_builds_fast(vocabulary):
    start = time.perf_counter()
    pda = pushdown_automaton(JSON_GRAMMAR, vocabulary, stack_depth=32, cache=False)
    elapsed = time.perf_counter() - start
    assert elapsed < 3.0, elapsed  # ~0.5 s alone; generous on a shared machine
    deep = b"[" * 30 + b"1" + b"]" * 30
    assert pda.accepts(deep) and not pda.accepts(b"[" * 40 + b"1" + b"]" * 40)


def test_grammar_chooses_the_pushdown_automaton(tokenizer):
    assert fg.processors.Grammar(JSON_GRAMMAR, tokenizer).pushdown is not None
    assert (
        fg.processors.Grammar(JSON_GRAMMAR, tokenizer, max_depth=2).pushdown is None
    )  # explicit bound
    assert fg.processors.Grammar('start: "a"+ "b"', tokenizer).pushdown is None  # not recursive
    with pytest.raises(ValueError, match="stack_depth"):
        fg.processors.Grammar(JSON_GRAMMAR, tokenizer, stack_depth=0)
    vocabulary = fg.structured.vocabulary_from_tokenizer(tokenizer)
    # After `(`, `q` is both a call of `item` and the text `"(" "q" "!"`: not deterministic.
    with pytest.raises(NotDeterministic, match="2 ways"):
        pushdown_automaton('start: item\nitem: "(" item ")" | "(" "q" "!" | "q"\n', vocabulary)
    with pytest.raises(NotDeterministic, match="one-byte lookahead"):
        pushdown_automaton(SPACED_FUNCTION_CALLS, vocabulary)
    # such a grammar runs on parallel stacks; with one stack, as the bounded-depth DFA
    parallel = fg.processors.Grammar(SPACED_FUNCTION_CALLS, tokenizer)
    assert isinstance(parallel.pushdown, fg.structured.ParallelPushdownConstraint)
    with pytest.warns(UserWarning, match="bounded-depth DFA"):
        fallback = fg.processors.Grammar(SPACED_FUNCTION_CALLS, tokenizer, num_stacks=1)
    assert fallback.pushdown is None
    with pytest.raises(ValueError, match="pushdown"):
        fg.structured.per_row([fg.processors.Grammar(JSON_GRAMMAR, tokenizer), None])
    with pytest.raises(GrammarError):
        fg.processors.Grammar("start: undefined_rule", tokenizer)


def test_generated_json_parses(random_model, tokenizer):
    # A random model samples near-uniformly among the allowed tokens; every row that ends with
    # EOS is parsed by lark, and the stack lets the rows nest deeper than the DFA's 4 levels.
    grammar = fg.processors.Grammar(JSON_GRAMMAR, tokenizer, stack_depth=8)
    result = fg.generate(
        random_model,
        tokenizer,
        ["a", "b", "c", "d"],
        max_new_tokens=48,
        processors=[grammar],
        sampler=fg.samplers.Multinomial(),
        key=jax.random.key(3),
    )
    parser = lark.Lark(JSON_GRAMMAR, parser="earley")
    for text, reason in zip(result.texts, result.finish_reasons):
        assert reason in ("eos", "length", "constraint"), reason
        if reason == "eos":
            parser.parse(text)
        else:
            assert reason != "constraint"  # the mask never leaves a row without a token


@pytest.mark.parametrize("name", ["json", "arithmetic", "lisp"])
def test_rows_end_inside_the_language_within_max_new_tokens(name, random_model, tokenizer):
    # A budget too small for what a random walk opens: the mask steers every row to close its
    # brackets in time, so each text (EOS or "length") is a whole sentence that lark parses.
    grammar = PUSHDOWN_GRAMMARS[name]
    processor = fg.processors.Grammar(grammar, tokenizer)
    assert processor.pushdown is not None
    parser = lark.Lark(grammar, parser="earley")
    for max_new_tokens, text, reason in _sampled_texts(random_model, tokenizer, processor, (6, 12)):
        assert _lark_accepts(parser, text.encode()), (max_new_tokens, text, reason)


def _sampled_texts(model, tokenizer, processor, budgets):
    """`(max_new_tokens, text, finish_reason)` of six sampled rows per budget (seeds 0, 1, ...),
    each row checked to have ended by EOS or its budget."""
    for seed, max_new_tokens in enumerate(budgets):
        result = fg.generate(
            model,
            tokenizer,
            ["a", "b", "c", "d", "e", "f"],
            max_new_tokens=max_new_tokens,
            processors=[processor],
            sampler=fg.samplers.Multinomial(),
            key=jax.random.key(seed),
        )
        for text, reason in zip(result.texts, result.finish_reasons):
            assert reason in ("eos", "length"), (text, reason)
            yield max_new_tokens, text, reason


def test_gbnf_grammars_run_as_pushdown_automata(tokenizer, vocabulary):
    grammar = fg.processors.Grammar.from_gbnf(JSON_GBNF, tokenizer)
    assert grammar.pushdown is not None
    pda = pushdown_automaton(fg.structured.gbnf_to_lark(JSON_GBNF), vocabulary)
    for text in [
        '{"a": [1, {"b": "c\\n"}], "d": -2.5e3}',
        "{}",
        '{"x":[[[[true]]]]}',
        '{"u": "\\u00e9"}',
    ]:
        assert pda.accepts(text.encode()), text
    for text in ["[1]", '{"a": 01x}', '{"a" 1}', '{"a": [1,]}', '{"u": "\\u00g9"}', "{'a': 1}"]:
        assert not pda.accepts(text.encode()), text
    with pytest.raises(GrammarError, match="line 1"):
        fg.processors.Grammar.from_gbnf('root ::= ("a"', tokenizer)


OPEN_SCHEMAS = {
    "open object": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {}},
        "required": ["a"],
    },
    "untyped items": {
        "type": "array",
        "items": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
    },
    "free-form members": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "meta": {"type": "object"},
            "tags": {"type": "array"},
        },
        "required": ["name"],
    },
}


def _random_value(rng, depth: int):
    kind = int(rng.integers(6 if depth > 0 else 4))
    if kind == 0:
        return int(rng.integers(-50, 50))
    if kind == 1:
        return ["x", "", "a b", "é"][int(rng.integers(4))]
    if kind == 2:
        return [True, False, None][int(rng.integers(3))]
    if kind == 3:
        return (
            float(rng.integers(-9, 9)) + 0.25
        )  # never integral: "2.0" is an integer to JSON Schema, not to our regex
    if kind == 4:
        return [_random_value(rng, depth - 1) for _ in range(int(rng.integers(3)))]
    return {f"k{i}": _random_value(rng, depth - 1) for i in range(int(rng.integers(3)))}


@pytest.mark.parametrize("name", sorted(OPEN_SCHEMAS))
def test_json_schema_free_form_values_nest_as_deep_as_the_stack(name, vocabulary):
    # Documents built around random values nested up to 6 levels, and mutations of their text:
    # the pushdown automaton accepts exactly what `jsonschema` validates (compact and spaced).
    import json

    import jsonschema

    from functional_gen.structured.json_schema import json_schema_pushdown

    schema = OPEN_SCHEMAS[name]
    pda = json_schema_pushdown(schema, vocabulary)
    assert pda is not None
    rng = np.random.default_rng(0)
    counts = {True: 0, False: 0}
    for i in range(120):
        if name == "untyped items":
            doc = [
                {"id": int(rng.integers(9)), "more": _random_value(rng, 6)}
                if rng.random() < 0.8
                else _random_value(rng, 5)
                for _ in range(int(rng.integers(3)))
            ]
        else:
            # listed properties in the schema's order, then additional ones (as the grammar does)
            keys = [*schema["properties"], "extra", "z"]
            doc = {k: _random_value(rng, 6) for k in keys if rng.random() < 0.6}
            for required in schema.get("required", []):
                if rng.random() < 0.7:
                    doc[required] = int(rng.integers(9)) if required == "a" else "n"
            doc = {k: doc[k] for k in keys if k in doc}
        for text in (
            json.dumps(doc, ensure_ascii=False),
            json.dumps(doc, ensure_ascii=False, separators=(",", ":")),
        ):
            if i % 3 == 2:  # a mutated text: often not JSON at all
                text = mutate(text.encode(), b'{}[],:"0a ', rng).decode("utf-8", "replace")
            try:
                expected = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
            except json.JSONDecodeError:
                expected = False
            if expected and text not in (
                json.dumps(json.loads(text), ensure_ascii=False),
                json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":")),
            ):
                continue  # a mutation that changed only whitespace or key order: not comparable
            assert pda.accepts(text.encode()) == expected, (name, text, expected)
            counts[expected] += 1
    assert counts[True] >= 20 and counts[False] >= 20, counts


def test_json_schema_pushdown_rows_end_valid_within_max_new_tokens(random_model, tokenizer):
    # The pushdown form keeps the budget as the token automaton does: with budgets too small
    # for what a random walk opens in the free-form `tags`, every text (EOS or "length") is a
    # whole document that `jsonschema` validates.
    import json

    import jsonschema

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array"}},
        "required": ["name"],
    }
    processor = fg.processors.JsonSchema(schema, tokenizer, free_form_depth=None)
    assert processor.pushdown is not None
    for _, text, _ in _sampled_texts(random_model, tokenizer, processor, (16, 28)):
        jsonschema.validate(json.loads(text), schema)


def test_a_pushdown_constraint_beside_an_unconstrained_row(random_model, tokenizer):
    # `[constraint, None]` compiles one pushdown automaton with a `constraint_id` per row: each
    # row masks with its own id (the processor's per-row field, vmapped with the rows; the
    # pushdown's copy inside the tables holds them all: a broadcasting error before), so the
    # constrained row is valid and the free row is the same as generated without any processor
    import json

    import jsonschema

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array"}},
        "required": ["name"],
    }
    kwargs = dict(max_new_tokens=16, sampler=fg.samplers.Multinomial(), key=jax.random.key(1))
    free = fg.generate(random_model, tokenizer, ["a", "b"], **kwargs)
    for processor in (
        fg.processors.JsonSchema([schema, None], tokenizer, free_form_depth=None),
        fg.processors.Grammar([JSON_GRAMMAR, None], tokenizer),
    ):
        assert processor.pushdown is not None
        assert processor.constraint_id.tolist() == [0, -1]
        result = fg.generate(random_model, tokenizer, ["a", "b"], processors=[processor], **kwargs)
        assert result.texts[1] == free.texts[1]
        assert result.finish_reasons[0] in ("eos", "length")
        if isinstance(processor, fg.processors.JsonSchema):
            jsonschema.validate(json.loads(result.texts[0]), schema)
        else:
            lark.Lark(JSON_GRAMMAR, parser="earley").parse(result.texts[0])


def test_json_schema_compile_without_cache_builds_the_pushdown_afresh(vocabulary):
    # `cache=False` promises a fresh build: the in-process memo of pushdown automata is neither
    # read nor filled (it used to return the memoised automaton in ~2 ms).
    from functional_gen.structured import json_schema as js

    schema = {"type": "object", "properties": {"tags": {"type": "array"}}}
    js.pushdown_form.PUSHDOWN_CACHE.clear()
    first = js.json_schema_compile(schema, vocabulary, cache=False, free_form_depth=None)
    assert isinstance(first, PushdownAutomaton) and not js.pushdown_form.PUSHDOWN_CACHE
    second = js.json_schema_compile(schema, vocabulary, cache=False, free_form_depth=None)
    assert second is not first
    np.testing.assert_array_equal(second.masks, first.masks)  # the same tables, rebuilt
    cached = js.json_schema_compile(schema, vocabulary, free_form_depth=None)
    assert cached is not first and js.pushdown_form.PUSHDOWN_CACHE
    assert js.json_schema_compile(schema, vocabulary, free_form_depth=None) is cached


def test_json_schema_processor_runs_the_pushdown_automaton(tokenizer):
    schema = OPEN_SCHEMAS["open object"]
    processor = fg.processors.JsonSchema(schema, tokenizer)  # the default: free_form_depth=None
    assert processor.pushdown is not None
    assert (
        fg.processors.JsonSchema(schema, tokenizer, free_form_depth=1).pushdown is None
    )  # an integer depth: a token automaton
    closed = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert (
        fg.processors.JsonSchema(closed, tokenizer, free_form_depth=None).pushdown is None
    )  # nothing free-form
    # `"` starts both a string and a free value: the free value's strings are read in place
    shared_start = {"anyOf": [{"type": "string"}, {}]}
    assert fg.processors.JsonSchema(shared_start, tokenizer).pushdown is not None
    # three levels of arrays beside a free value: its call competes with each `[`, so it is
    # read in place three levels deep (`_inline_value_calls`)
    deep: dict = {"type": "integer"}
    for _ in range(3):
        deep = {"type": "array", "items": deep}
    assert fg.processors.JsonSchema({"anyOf": [deep, {}]}, tokenizer).pushdown is not None
    # deeper than `_VALUE_CALL_LEVELS`: a token automaton
    for _ in range(js.rule_automata._VALUE_CALL_LEVELS):
        deep = {"type": "array", "items": deep}
    ambiguous = {"anyOf": [deep, {}]}
    with pytest.warns(UserWarning, match="no pushdown automaton"):
        assert fg.processors.JsonSchema(ambiguous, tokenizer, free_form_depth=None).pushdown is None


def test_pushdown_too_large_falls_back_to_the_nested_free_value(vocabulary):
    # A 1,000-character string is a spliced automaton of about 12,000 states (its `minLength`
    # over `COUNTER_MIN_LENGTH`: not a counter rule): beside a free-form value that needs the
    # grammar form, whose positions are limited to 10,000. The schema then compiles with free
    # values nested 2 levels, as `free_form_depth=2` does (MaskBench o82710 and o6237 failed
    # instead; until 2026-11-25 the fallback nested them 1 level).
    schema = {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 100, "maxLength": 1000}},
        "additionalProperties": True,
    }
    with pytest.warns(
        UserWarning, match=r"no pushdown automaton.*automaton positions.*at most 2 level\(s\)"
    ):
        automaton = json_schema_compile(schema, vocabulary, cache=False, free_form_depth=None)
    assert not isinstance(automaton, PushdownAutomaton)
    nested = json_schema_compile(schema, vocabulary, free_form_depth=2)
    assert automaton.num_states == nested.num_states
    one_level = json_schema_compile(schema, vocabulary, free_form_depth=1)
    assert automaton.num_states != one_level.num_states


BYTES_ONLY = fg.structured.TokenVocabulary(
    tuple(bytes([b]) for b in range(256)) + (b'{"', b'":', b"null", b"]]", b"((", None),
    (262,),
    "bytes-and-a-few",
)


@pytest.mark.parametrize("stack_depth", [3, 32])
@pytest.mark.parametrize("name", sorted(PUSHDOWN_GRAMMARS))
def test_token_tables_equal_the_reference_walk(name, stack_depth, vocabulary, checked_token_tables):
    # The fast walk (pass-1 origins pruned once they return, per-origin merging, tables built
    # per source) gives exactly the old tables, with the real vocabulary and a small one; depth
    # 3 makes tokens overflow the stack.
    for vocab in (vocabulary, BYTES_ONLY):
        build_pushdown(parse_grammar(PUSHDOWN_GRAMMARS[name]), vocab, stack_depth=stack_depth)
    assert len(checked_token_tables) == 2


@pytest.mark.parametrize("chunk", [1, 5])
def test_token_tables_walked_in_chunks_equal_the_reference_walk(
    chunk, monkeypatch, vocabulary, checked_token_tables
):
    # A pass with more origins than `_WALK_CHUNK` is walked in chunks and merged (a token's
    # code row the concatenation of its chunks' rows): the tables are exactly the reference's,
    # for each pass and both vocabularies, whether a chunk is one origin or several.
    from functional_gen.structured.pushdown import token_walk as pda_module

    monkeypatch.setattr(pda_module, "_WALK_CHUNK", chunk)
    for vocab in (vocabulary, BYTES_ONLY):
        build_pushdown(parse_grammar(PUSHDOWN_GRAMMARS["json"]), vocab, stack_depth=3)
    assert len(checked_token_tables) == 2
    assert min(checked_token_tables) > 2 * chunk  # positions: several chunks per pass


def test_token_tables_survive_row_hash_collisions(monkeypatch, checked_token_tables):
    # With every weight 1 a row's hash is the sum of its entries: distinct rows collide at
    # once (`(1, 2)` and `(2, 1)`), the walk notices and walks again with random weights.
    from functional_gen.structured.pushdown import token_walk as pda_module

    calls = []
    hashed = pda_module._hashed_rows

    def counted(rows, weights):
        calls.append(bool((weights == 1).all()))
        return hashed(rows, weights)

    monkeypatch.setattr(pda_module, "_ROW_WEIGHTS", np.ones(64, np.uint64))
    monkeypatch.setattr(pda_module, "_hashed_rows", counted)
    build_pushdown(parse_grammar(PUSHDOWN_GRAMMARS["json"]), BYTES_ONLY, stack_depth=4)
    assert checked_token_tables  # equal to the reference walk
    assert calls[0] and not calls[-1]  # the ones collided; the random weights did not


def test_per_row_uses_the_token_automaton_of_a_pushdown_json_schema(tokenizer):
    # free_form_depth=None makes an open object a pushdown automaton (free-form values as deep
    # as the stack), which cannot share tables: per_row rebuilds its token form, and says so
    schema = OPEN_SCHEMAS["open object"]
    deep = fg.processors.JsonSchema(schema, tokenizer, free_form_depth=None)
    assert deep.pushdown is not None
    with pytest.warns(UserWarning, match="free-form values nest 1 level"):
        mixed = fg.structured.per_row([deep, None])
    alone = fg.processors.JsonSchema(schema, tokenizer, free_form_depth=1, max_recursion_depth=3)
    assert alone.pushdown is None
    np.testing.assert_array_equal(mixed.transitions, alone.transitions)
    np.testing.assert_array_equal(mixed.token_class, alone.token_class)
    np.testing.assert_array_equal(np.asarray(mixed.constraint_id), [0, -1])
    with pytest.raises(ValueError, match="max_depth"):  # a Grammar has no token form to fall to
        fg.structured.per_row([fg.processors.Grammar(JSON_GRAMMAR, tokenizer), None])


def test_pushdown_json_schemas_share_one_tree_structure(tokenizer):
    # the per_row recipe key is an array leaf, not a static field: a new schema of the same
    # table sizes does not change the processor's tree structure (no recompilation)
    a, b = (
        fg.processors.JsonSchema(
            {"type": "object", "properties": {name: {"type": "integer"}}},
            tokenizer,
            free_form_depth=None,
        )
        for name in ("a", "b")
    )
    assert a.pushdown is not None and b.pushdown is not None
    assert jax.tree.structure(a) == jax.tree.structure(b)


def _plain_distances(pda, vocabulary):
    """The fixed point of `distance` the slow way: every (position, one-byte token) edge
    relaxed in Python until nothing changes (0 where the rule may end; else 1 + the next
    position's distance + the pushed positions' distances, over the one-byte tokens)."""
    from functional_gen.structured.pushdown import UNREACHABLE

    single = [t for t in range(vocabulary.vocab_size) if vocabulary.token_length[t] == 1]
    classes = sorted({int(pda.byte_class[vocabulary.token_bytes[t][0]]) for t in single})
    positions = pda.next.shape[0]
    distance = [0 if pda.final[p] else UNREACHABLE for p in range(positions)]
    distance[0] = UNREACHABLE
    changed = True
    while changed:
        changed = False
        for p in range(1, positions):
            for c in classes:
                target = int(pda.next[p, c])
                if target <= 0:
                    continue
                pushed = sum(distance[int(q)] for q in pda.push[p, c] if q > 0)
                value = min(1 + distance[target] + pushed, UNREACHABLE)
                if value < distance[p]:
                    distance[p], changed = value, True
    return distance


@pytest.mark.parametrize("source", ["json", "calc", "schema"])
def test_distances_equal_a_plain_fixed_point(source, vocabulary):
    # the worklist of `_distances` (only edges whose inputs changed are re-evaluated) against
    # relaxing every edge until nothing changes
    if source == "schema":
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "tags": {"type": "array", "items": {"$ref": "#"}},
                "extra": {},
            },
        }
        pda = json_schema_compile(schema, vocabulary, cache=False, free_form_depth=None)
    else:
        grammar = JSON_GRAMMAR if source == "json" else PUSHDOWN_GRAMMARS["arithmetic"]
        pda = build_pushdown(parse_grammar(grammar), vocabulary)
    assert isinstance(pda, PushdownAutomaton)
    np.testing.assert_array_equal(pda.distance, _plain_distances(pda, vocabulary))


def test_a_candidate_table_over_the_limit_is_refused_before_it_is_allocated(monkeypatch):
    # MaskBench o57110 needed a 4,726 x 96 x 49,152 int32 candidate table (83 GiB: one byte
    # class had 48,786 stack-dependent tokens) and died with a MemoryError; now the table's size
    # is checked first and refused with its numbers (a ConstraintError, which the JSON Schema
    # compiler catches to try its next form).
    from functional_gen.structured.pushdown import TooManyCandidates, token_tables

    grammar = parse_grammar(PUSHDOWN_GRAMMARS["json"])
    pda = build_pushdown(grammar, BYTES_ONLY, stack_depth=4)
    positions, slots, width = pda.candidates.shape
    size = positions * slots * width * 4
    monkeypatch.setattr(token_tables, "MAX_CANDIDATE_TABLE", size)
    build_pushdown(grammar, BYTES_ONLY, stack_depth=4)  # at the limit: built
    monkeypatch.setattr(token_tables, "MAX_CANDIDATE_TABLE", size - 1)
    allocated = []
    full = np.full

    def watched(shape, *args, **kwargs):
        if tuple(np.atleast_1d(shape)) == (positions, slots, width):
            allocated.append(shape)
        return full(shape, *args, **kwargs)

    monkeypatch.setattr(token_tables.np, "full", watched)
    with pytest.raises(TooManyCandidates, match=f"{positions} positions x {slots} slots x 8 "):
        build_pushdown(grammar, BYTES_ONLY, stack_depth=4)
    assert not allocated
    assert isinstance(TooManyCandidates(1, 1, 8, 3, 0), fg.structured.ConstraintError)
