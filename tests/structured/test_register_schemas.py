"""JSON Schema objects read in any order with a member-set register (issue 55, wired into
compilation): an object whose member sets are too many for `order_automata.any_order_dfa`
(more than `budgets.ORDER_AUTOMATON_MAX` members to track) compiles to a grammar form whose rule
for it carries register actions (`rule_automata._register_edges_of`), run on the device by
`RegisterPushdownConstraint`. Checked against `jsonschema` through SmolLM2's own tokens of
documents in random orders (`maskbench.refused_at`: the device's mask, computed on the host),
against the listed-order automaton it replaces, and in generation (`fg.generate` with a seeded
sampler, per-row constraints, beams, the resumable state)."""

import json
import random
import warnings

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.structured.byte_dfa import REJECT
from functional_gen.structured.json_schema import budgets, grammar_form, rule_automata
from functional_gen.structured.json_schema.compiling import json_schema_compile
from functional_gen.structured.json_schema.free_values import FREE_VALUE_CALL
from functional_gen.structured.json_schema.order_automata import any_order_text
from functional_gen.structured.json_schema.rule_plan import rule_call
from functional_gen.structured.pushdown import NotDeterministic
from functional_gen.structured.pushdown.register_walk import RegisterPushdownConstraint

from .helpers import context_for
from .maskbench import refused_at

ORDER_WARNING = "keep their members in the order"

INNER = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "boolean"}},
    "required": ["x"],
    "additionalProperties": False,
}


def _wide_schema(additional) -> dict:
    """14 properties, 9 required (over `ORDER_AUTOMATON_MAX`, as MaskBench o33696): keys that
    share prefixes (`id`, `idx`, `identifier`; `name`, `names`), an enum, a nested object, an
    array of them; `additionalProperties` as given."""
    properties = {
        "id": {"type": "integer"},
        "idx": {"type": "integer", "minimum": 0},
        "identifier": {"type": "string", "maxLength": 6},
        "name": {"type": "string", "maxLength": 8},
        "names": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "colour": {"enum": ["red", "green", "blue"]},
        "inner": INNER,
        "active": {"type": "boolean"},
        "kind": {"enum": ["a", "ab", "b"]},
        "size": {"type": "integer"},
        "tag": {"type": "string", "maxLength": 5},
        "title": {"type": "string", "maxLength": 5},
        "total": {"type": "integer"},
        "many": {"type": "array", "items": INNER, "maxItems": 2},
    }
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties)[:9],
        "additionalProperties": additional,
    }


def _value(rng: random.Random, schema: dict):
    """A random value valid under one of `_wide_schema`'s property schemas."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema["type"]
    if kind == "integer":
        return rng.randrange(schema.get("minimum", -50), 500)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "string":
        return "".join(rng.choice("ab ?") for _ in range(rng.randrange(schema["maxLength"] + 1)))
    if kind == "array":
        return [_value(rng, schema["items"]) for _ in range(rng.randrange(schema["maxItems"] + 1))]
    document = {"x": rng.randrange(-9, 99)}
    if rng.random() < 0.5:
        document["y"] = rng.random() < 0.5
    return dict(sorted(document.items(), key=lambda _: rng.random()))


def _documents(rng: random.Random, schema: dict, count: int) -> list[dict]:
    """`count` valid documents: every required member, some optional ones, in random orders."""
    properties, required = schema["properties"], schema["required"]
    out = []
    for _ in range(count):
        names = required + [n for n in properties if n not in required and rng.random() < 0.5]
        rng.shuffle(names)
        out.append({n: _value(rng, properties[n]) for n in names})
    return out


def _texts(document: dict) -> list[str]:
    return [json.dumps(document, separators=s) for s in ((",", ":"), (", ", ": "))]


def _compile(schema, vocabulary):
    """`json_schema_compile` (no cache) and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        automaton = json_schema_compile(schema, vocabulary, cache=False)
    return automaton, [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def closed(vocabulary):
    schema = _wide_schema(False)
    automaton, said = _compile(schema, vocabulary)
    return schema, automaton, said


@pytest.mark.parametrize("additional", [False, True])
def test_a_wide_object_compiles_with_a_register_and_takes_every_order(
    tokenizer, vocabulary, closed, additional
):
    schema, automaton, said = closed if additional is False else (None, None, None)
    if schema is None:
        schema = _wide_schema(additional)
        automaton, said = _compile(schema, vocabulary)
    assert len(schema["required"]) > budgets.ORDER_AUTOMATON_MAX - 2
    assert automaton.has_register and automaton.num_forks == 0
    assert not [m for m in said if ORDER_WARNING in m], said  # read in every order
    validator = jsonschema.Draft202012Validator(schema)
    eos = vocabulary.eos_token_id[0]
    rng = random.Random(3)
    checked = 0
    for document in _documents(rng, schema, 6):
        assert validator.is_valid(document)
        for text in _texts(document):
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert refused_at(automaton, ids, eos) is None, text
            checked += 1
    assert checked == 12
    # invalid documents are cut: a required member missing, a value of another type, an enum
    # value not listed, a nested object without its required member, a key not listed when
    # closed (with additional properties open, that one is valid and passes)
    base = _documents(rng, schema, 1)[0]
    broken = []
    for gone in schema["required"][:4]:
        broken.append({k: v for k, v in base.items() if k != gone})
    broken.append({**base, "id": "7"})
    broken.append({**base, "colour": "pink"})
    broken.append({**base, "active": 1})
    broken.append({**base, "inner": {"y": True}})
    broken.append({**base, "names": ["a", "b", "c", "d"]})
    for j, document in enumerate(broken):
        assert not validator.is_valid(document)
        text = _texts(document)[j % 2]
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert refused_at(automaton, ids, eos) is not None, text
    unknown = {"ide": 1, **base, "zzz": [1, {"q": None}]}
    for text in _texts(unknown):
        ids = tokenizer.encode(text, add_special_tokens=False)
        where = refused_at(automaton, ids, eos)
        assert (where is None) == validator.is_valid(unknown) == bool(additional), text


def test_the_register_replaces_the_listed_order(tokenizer, vocabulary, closed, monkeypatch):
    # Without the register (`_register_edges_of` refusing, as for more than `REGISTER_BITS`
    # required members) the object keeps the listed order, with the warning, and refuses the
    # same valid documents in other orders that the register's automaton accepts.
    schema, registered, _ = closed
    monkeypatch.setattr(rule_automata, "_register_edges_of", lambda regex, free: None)
    rule_automata._RULE_EDGES.clear()
    rule_automata._INLINED_RULE_EDGES.clear()
    try:
        listed, said = _compile(schema, vocabulary)
    finally:
        rule_automata._RULE_EDGES.clear()
        rule_automata._INLINED_RULE_EDGES.clear()
    assert not getattr(listed, "has_register", False)
    assert [m for m in said if ORDER_WARNING in m], said
    eos = vocabulary.eos_token_id[0]
    refused_before = 0
    for document in _documents(random.Random(5), schema, 6):
        ids = tokenizer.encode(_texts(document)[0], add_special_tokens=False)
        assert refused_at(registered, ids, eos) is None
        refused_before += refused_at(listed, ids, eos) is not None
    assert refused_before >= 4


def test_nested_wide_objects_keep_a_register_per_frame(tokenizer, vocabulary):
    # an object of 12 members (11 required) as a member of one of 12 (8 required) and as the
    # items of an array there: each object's register is its own frame's (a member written
    # inside counts for the inner object only; the outer one resumes its own at the return)
    inner = _wide_schema(False)
    inner["properties"] = dict(list(inner["properties"].items())[:12])
    inner["required"] = list(inner["properties"])[:11]
    outer = {
        "type": "object",
        "properties": {
            **{f"m{j}": {"type": "integer"} for j in range(10)},
            "child": inner,
            "children": {"type": "array", "items": inner, "maxItems": 2},
        },
        "required": [f"m{j}" for j in range(8)],
        "additionalProperties": False,
    }
    automaton, said = _compile(outer, vocabulary)
    assert automaton.has_register and not [m for m in said if ORDER_WARNING in m]
    assert len(automaton.rule_names) >= 3  # the outer and inner objects: rules of their own
    validator = jsonschema.Draft202012Validator(outer)
    eos = vocabulary.eos_token_id[0]
    rng = random.Random(11)
    for _ in range(2):
        document = _documents(rng, outer, 1)[0]
        document["child"] = _documents(rng, inner, 1)[0]
        document["children"] = _documents(rng, inner, rng.randrange(3))
        items = list(document.items())
        rng.shuffle(items)
        document = dict(items)
        assert validator.is_valid(document)
        for text in _texts(document):
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert refused_at(automaton, ids, eos) is None, text
        # the inner object missing a required member that the outer object also has the
        # key of... (`id` inner, `m0` outer: their bits are different frames')
        bad = dict(document)
        bad["child"] = {k: v for k, v in document["child"].items() if k != "id"}
        assert not validator.is_valid(bad)
        ids = tokenizer.encode(_texts(bad)[0], add_special_tokens=False)
        assert refused_at(automaton, ids, eos) is not None
        # the outer object missing one (its inner objects complete)
        bad = {k: v for k, v in document.items() if k != "m3"}
        ids = tokenizer.encode(_texts(bad)[0], add_special_tokens=False)
        assert refused_at(automaton, ids, eos) is not None


def test_a_recursive_wide_object_takes_every_order(tokenizer, vocabulary):
    # a recursive object (its rule called for `kid` and the items of `kids`: the recursive
    # grammar form, `compiling._recursive_grammar`) of 14 members, 11 required
    schema = {
        "type": "object",
        "properties": {
            **{f"m{j}": {"type": "integer"} for j in range(12)},
            "kid": {"$ref": "#"},
            "kids": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": [f"m{j}" for j in range(11)],
        "additionalProperties": False,
    }
    automaton, said = _compile(schema, vocabulary)
    assert automaton.has_register and not [m for m in said if ORDER_WARNING in m], said
    validator = jsonschema.Draft202012Validator(schema)
    eos = vocabulary.eos_token_id[0]
    rng = random.Random(0)

    def tree(depth: int) -> dict:
        node = {f"m{j}": rng.randrange(9) for j in range(12) if j < 11 or rng.random() < 0.5}
        if depth < 2 and rng.random() < 0.7:
            node["kid"] = tree(depth + 1)
        if depth < 2 and rng.random() < 0.5:
            node["kids"] = [tree(depth + 1) for _ in range(rng.randrange(3))]
        items = list(node.items())
        rng.shuffle(items)
        return dict(items)

    for _ in range(3):
        document = tree(0)
        assert validator.is_valid(document)
        text = json.dumps(document, separators=(",", ":"))
        assert refused_at(automaton, tokenizer.encode(text, add_special_tokens=False), eos) is None
        bad = json.loads(text)
        bad["kid"] = {k: v for k, v in tree(1).items() if k != "m3"}  # a nested one incomplete
        text = json.dumps(bad, separators=(",", ":"))
        where = refused_at(automaton, tokenizer.encode(text, add_special_tokens=False), eos)
        assert where is not None, text


def test_objects_within_the_set_automata_and_beyond_the_register_keep_their_forms(vocabulary):
    # up to `ORDER_AUTOMATON_MAX` members tracked: `any_order_dfa` (no register, cheaper
    # masks); more than `REGISTER_BITS` required members: the listed order, as before
    few = _wide_schema(False)
    few["properties"] = dict(list(few["properties"].items())[:8])
    few["required"] = few["required"][:5]
    automaton, said = _compile(few, vocabulary)
    assert not automaton.has_register and not [m for m in said if ORDER_WARNING in m]
    many = {
        "type": "object",
        "properties": {f"k{j}": {"type": "integer"} for j in range(34)},
        "required": [f"k{j}" for j in range(33)],
        "additionalProperties": False,
    }
    automaton, said = _compile(many, vocabulary)
    assert not getattr(automaton, "has_register", False)
    assert [m for m in said if ORDER_WARNING in m], said


# ------------------------------------------------------------- the register through the form


def _object_text(count: int, required: int, value: str = "[0-9]") -> str:
    """An any-order object's rule text of `count` members `"k<j>": <value>`."""
    items = [(f'"k{j}"[ ]?:[ ]?(?:{value})', j < required) for j in range(count)]
    return "(?:" + any_order_text(items, None, "[ ]?") + ")"


def test_rule_edges_carry_the_register_of_a_wide_object():
    wide = rule_automata.rule_edges(_object_text(14, 12), 0, False)
    assert wide[2] is not None
    dfa, calls, (clear, member, require) = wide
    assert clear.shape == member.shape == require.shape == (dfa.num_states, 256)
    assert calls.shape == (dfa.num_states, 0) and (member > 0).any() and (require > 0).any()
    narrow = rule_automata.rule_edges(_object_text(6, 4), 0, False)
    assert narrow[2] is None  # `any_order_dfa`
    # with the free-form value callable: its column, the register unchanged
    free = rule_automata.rule_edges(_object_text(14, 12), 3, True)
    assert free[1].shape == (dfa.num_states, 4) and (free[1] == REJECT).all()
    assert all(np.array_equal(f, w) for f, w in zip(free[2], wide[2]))


def test_a_register_rule_is_never_inlined_or_shared():
    # `inline_value_calls` would renumber the states (a free-form value beside `[` in a
    # member): the register's automaton is left as it is, and `check_value_calls` refuses it
    text = _object_text(14, 12, value=f"\\[\\]|{FREE_VALUE_CALL}")
    dfa, _, register = rule_automata.rule_edges(text, 0, True)
    inlined = rule_automata.inlined_rule_edges(text, 0, "[ ]?")
    assert inlined[0] is dfa and inlined[2] is register
    with pytest.raises(NotDeterministic):
        rule_automata.check_value_calls(*inlined[:2], "rule0")
    # two copies of one object, one with its register and one without: equal as bytes, so
    # without the registers their tails become one rule that both call (the register's
    # automaton cut and minimised: its tables no longer fit its states, and the copy would
    # share its register actions)
    root = rule_automata.rule_edges(f"(?:{rule_call(0)}|{rule_call(1)})", 2, False)
    obj = rule_automata.rule_edges(_object_text(14, 12), 2, False)
    automata = [root[:2], obj[:2], obj[:2]]
    shared, rules = grammar_form._shared_tails(automata, 2, False)
    assert rules == 3 and shared[1][0].num_states < obj[0].num_states
    for registers in ([None, obj[2], None], [None, None, obj[2]]):
        kept, _ = grammar_form._shared_tails(automata, 2, False, registers)
        at = registers.index(obj[2])
        assert kept[at][0] is obj[0]  # as built: its register tables still fit its states
        assert (kept[at][1] == REJECT).all()  # it calls no tail, and
        assert (kept[3 - at][1][:, at - 1] == REJECT).all()  # the copy does not call it


# ------------------------------------------------------------- on the device


def test_json_schema_runs_the_register_on_the_device(tokenizer, vocabulary, closed):
    # `JsonSchema` builds a `RegisterPushdownConstraint`; along SmolLM2's tokens of valid
    # documents the jitted `process` keeps the host walk's configuration (register and saved
    # registers included) and masks exactly the tokens `allowed` gives, with 400 tokens left
    # and with no budget (the first 60 and 30 tokens of two documents: the host's `allowed`
    # is slow under the tests' type checks); the state keeps its shapes and dtypes
    schema, automaton, _ = closed
    processor = fg.processors.JsonSchema(schema, tokenizer)
    pushdown = processor.tables.pushdown
    assert isinstance(pushdown, RegisterPushdownConstraint)
    step = jax.jit(lambda s, logits, c: processor.process(s, logits, c))
    rng = random.Random(2)
    prompt = [1, 2, 3]
    for document, max_new_tokens, spaced in zip(
        _documents(rng, schema, 2), (400, 2**31 - 1), (1, 0)
    ):
        ids = tokenizer.encode(_texts(document)[spaced], add_special_tokens=False)[
            : 60 if spaced else 30
        ]
        state = processor.init(context_for(prompt, 3, max_len=512))
        shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
        assert len(state) == 5 and state[3].dtype == jnp.uint32
        config = automaton.initial_config()
        for i in range(len(ids) + 1):
            context = context_for(prompt + ids[:i], 3, max_len=512, max_new_tokens=max_new_tokens)
            state, logits = step(state, jnp.zeros(vocabulary.vocab_size), context)
            assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
            pos, stack, sp, register, registers = (np.asarray(x) for x in state)
            assert (int(pos), tuple(stack[: int(sp)].tolist())) == config[:2]
            assert int(register) == config[2] and tuple(registers[: int(sp)].tolist()) == config[3]
            host = automaton.allowed(config, min(max_new_tokens - i, 2**30))
            np.testing.assert_array_equal(np.isfinite(np.asarray(logits)), host)
            if i < len(ids):
                assert host[ids[i]]
                config = automaton.walk(vocabulary.token_bytes[ids[i]], config)


def _valid_or_alive(automaton, schema, text: str, reason: str) -> bool:
    """A finished row's text is a valid document; one cut by the length or the constraint
    (the budget is not register-aware yet: a row may be left without a token) is a prefix the
    automaton reads."""
    if reason == "eos":
        jsonschema.validate(json.loads(text), schema)
        return True
    assert reason in ("length", "constraint"), reason
    assert automaton.walk(text.encode()) is not None, text
    return False


def test_generation_with_a_register_per_row_beams_and_the_state(
    random_model, tokenizer, closed, tmp_path
):
    # A random model (a random walk through the automaton): a constrained row beside an
    # unconstrained one (`constraint_id` per row), sampled with a seed; its outputs as the host
    # walk reads them; the 5-tuple state through `SequenceState` (rows, forks, save/load: the
    # processor states are not saved) and beam search (its rows reordered by one gather)
    schema, automaton, _ = closed
    constraint = fg.processors.JsonSchema([schema, None], tokenizer)
    assert isinstance(constraint.tables.pushdown, RegisterPushdownConstraint)
    assert constraint.tables.pushdown.constraint_id.tolist() == [0, -1]
    result = fg.generate(
        random_model,
        tokenizer,
        ["{", "{"],
        max_new_tokens=40,
        processors=[constraint],
        sampler=fg.samplers.Multinomial(),
        key=jax.random.key(4),
    )
    _valid_or_alive(automaton, schema, result.texts[0], result.finish_reasons[0])
    (states,) = result.state.processor_states
    assert [x.shape[0] for x in states] == [2] * 5 and states[4].dtype == jnp.uint32
    forked = result.state[0].repeat(2)
    assert all(x.shape[0] == 2 for x in forked.processor_states[0])
    forked.save(tmp_path / "state.safetensors")
    loaded = fg.SequenceState.load(tmp_path / "state.safetensors", tokenizer=tokenizer)
    assert loaded.processor_states is None
    beams = fg.generate(
        random_model,
        tokenizer,
        ["{"],
        max_new_tokens=32,
        processors=[fg.processors.JsonSchema(schema, tokenizer)],
        sampler=fg.samplers.BeamSearch(num_beams=2),
    )
    _valid_or_alive(automaton, schema, beams.texts[0], beams.finish_reasons[0])


@pytest.mark.slow
def test_the_default_model_writes_valid_wide_objects(default_model, closed):
    # SmolLM2 under the register's constraint, sampled with a seed: the register-aware budget
    # (`pushdown.register_budget`) ends every row inside the language within
    # `max_new_tokens` (with EOS, or a complete document at the last token), with a valid
    # document under the schema
    schema, automaton, _ = closed
    model, tokenizer = default_model
    prompt = [{"role": "user", "content": "Describe a product as a JSON object."}]
    result = fg.generate(
        model,
        tokenizer,
        [prompt, prompt],
        max_new_tokens=160,
        processors=[fg.processors.JsonSchema(schema, tokenizer)],
        sampler=fg.samplers.Multinomial(),
        key=jax.random.key(0),
    )
    assert automaton.need(automaton.initial_config()) <= 160  # the budget binds late
    for text, reason in zip(result.texts, result.finish_reasons):
        assert reason in ("eos", "length"), (reason, text)
        assert automaton.can_end(automaton.walk(text.encode())), (reason, text)
        jsonschema.validate(json.loads(text), schema)
