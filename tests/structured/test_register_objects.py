"""Objects read in any order with a member-set register (`json_schema.register_objects`, issue
55): the byte-level automaton and its host walk against a brute-force enumeration of member
sequences (`test_order_automata`'s oracle), against `jsonschema` on an object far above
`budgets.ORDER_AUTOMATON_MAX`, and the refusals."""

import itertools
import json
import random

import jsonschema
import numpy as np
import pytest

from functional_gen.structured.automaton import ConstraintError
from functional_gen.structured.byte_dfa import ByteDFA, minimize, regex_byte_dfa
from functional_gen.structured.dfa_operations import numbered_mark_edges
from functional_gen.structured.grammar_syntax import parse_grammar
from functional_gen.structured.json_schema import budgets
from functional_gen.structured.json_schema.keys import literal_key
from functional_gen.structured.json_schema.order_automata import any_order_dfa, any_order_text
from functional_gen.structured.json_schema.register_objects import (
    REGISTER_BITS,
    register_object_dfa,
)
from functional_gen.structured.json_schema.rule_plan import RULE_CALL, rule_call
from functional_gen.structured.pushdown import UNREACHABLE, build_pushdown

from .cases import PUSHDOWN_GRAMMARS
from .test_order_automata import _expected, _render, _sequences, _text
from .test_pda import BYTES_ONLY


@pytest.mark.parametrize(
    "required, extra",
    [
        ([True, False, True, False], False),
        ([True, True, False, False], True),
        ([False, False, False, False], True),
        ([True, True, True, True], False),
        ([True, False, True, True], True),
    ],
)
def test_register_dfa_is_the_language_of_member_sequences(required, extra):
    # the same oracle as `any_order_dfa`'s (every order of every subset, a member twice, the
    # additional member anywhere, random sequences; spaced and compact), in the register's
    # language: every required member at least once, a listed one any number of times
    text = _text(required, extra)
    automaton = register_object_dfa(text)
    reference = any_order_dfa(text, form="exact")
    checked = {True: 0, False: 0}
    repeats = 0
    for sequence in _sequences(random.Random(0)):
        want = _expected(sequence, required, extra, "repeat")
        for spaced in (False, True):
            document = _render(sequence, spaced).encode()
            assert automaton.accepts(document) == want, (document, want)
        repeats += want and not _expected(sequence, required, extra, "exact")
        checked[want] += 1
    assert min(checked.values()) > 20 and repeats > 20  # both verdicts, and repeats, many times
    for bad in ('{"y":"a",}', '{,"y":"a"}', '{"y":"a""n":1}', '{"y":"a"', ' {"y":"a"}'):
        assert not automaton.accepts(bad.encode()), bad
    # one copy of the members, not one per set written
    assert automaton.dfa.num_states < reference.num_states or sum(required) <= 1


def test_register_sets_a_member_at_the_byte_after_its_key():
    # keys with escapes and regex metacharacters are still read as literal keys: a member's
    # bit is set at the byte after its key (whitespace or `:`), and `}` waits for every bit
    names = ["a", 'q"uote', "back\\slash", "dot.star*", "tab\t", "colon:"]
    items = [(f"{literal_key(n)}[ ]?:[ ]?(?:[0-9])", True) for n in names]
    automaton = register_object_dfa("(?:" + any_order_text(items, None, "[ ]?") + ")")
    members = [f"{json.dumps(n)}: {j}" for j, n in enumerate(names)]
    assert automaton.accepts(("{" + ", ".join(reversed(members)) + "}").encode())
    key = ("{" + members[0] + ", " + json.dumps(names[3])).encode()
    assert automaton.walk(key)[1] == 1
    assert automaton.walk(key + b":")[1] == 1 | 1 << 3 == automaton.walk(key + b" ")[1]
    assert not automaton.accepts(("{" + ", ".join(members[1:]) + "}").encode())
    assert automaton.accepts(("{" + ", ".join(members + members[2:4]) + "}").encode())


def test_register_holds_the_members_written():
    text = _text([True, False, True, False], True)
    automaton = register_object_dfa(text)
    assert automaton.tracked == (0, 2) and automaton.required == 0b11  # the required members
    for sequence in [[(2, "12")], [(0, '"a"'), (4, '"x1"'), (3, "[]"), (1, "true")]]:
        _, register = automaton.walk(_render(sequence, True)[:-1].encode())
        assert register == sum(1 << automaton.tracked.index(j) for j, _ in sequence if j in (0, 2))
    # an object inlined twice in one rule starts afresh at its `{`
    config = automaton.walk(b'{"n":12,"y":"a"}')
    assert config[1] == 0b11
    assert automaton.step((automaton.dfa.initial, config[1]), ord("{"))[1] == 0


def _large_schema(n: int, required: int):
    properties = {f"k{j}": {"type": "integer"} if j % 2 else {"enum": ["a", "b"]} for j in range(n)}
    return {
        "type": "object",
        "properties": properties,
        "required": [f"k{j}" for j in range(required)],
        "additionalProperties": False,
    }


def _large_items(n: int, required: int) -> list[tuple[str, bool]]:
    values = ['"[ab]"', "-?(?:0|[1-9][0-9]*)"]
    return [(f'"k{j}"[ ]?:[ ]?(?:{values[j % 2]})', j < required) for j in range(n)]


def test_register_dfa_of_an_object_far_above_the_set_automata_agrees_with_jsonschema():
    # 20 members, 15 required (as MaskBench o78043): 2**20 sets for `any_order_dfa`; one copy
    # of the members here. Random orders of random subsets, valid or not, against jsonschema.
    n, required = 20, 15
    assert n > budgets.ORDER_AUTOMATON_MAX
    schema = _large_schema(n, required)
    items = _large_items(n, required)
    automaton = register_object_dfa("(?:" + any_order_text(items, None, "[ ]?") + ")")
    one_copy = sum(minimize(regex_byte_dfa(regex)).num_states for regex, _ in items)
    assert automaton.dfa.num_states < 2 * one_copy
    rng = random.Random(1)
    verdicts = {True: 0, False: 0}
    for _ in range(400):
        keys = rng.sample(range(n), rng.randrange(required - 2, n + 1))
        if rng.random() < 0.2:
            keys.append(rng.choice(keys))  # a member twice
        members = [(f'"k{j}"', str(rng.randrange(-9, 99)) if j % 2 else '"a"') for j in keys]
        document = "{" + ", ".join(f"{k}: {v}" for k, v in members) + "}"
        # json.loads keeps the last of a repeated key (valid for the key: the register's
        # language lets a listed member repeat)
        want = jsonschema.Draft202012Validator(schema).is_valid(json.loads(document))
        assert automaton.accepts(document.encode()) == want, document
        verdicts[want] += 1
    assert min(verdicts.values()) > 50
    # every order of a valid document's members (a sample of the 15! orders of 15 members)
    members = [f'"k{j}":{j if j % 2 else chr(34) + "b" + chr(34)}' for j in range(required)]
    for order in itertools.islice(itertools.permutations(members), 0, 2000, 97):
        assert automaton.accepts(("{" + ",".join(order) + "}").encode())
    shuffled = members[:]
    for _ in range(200):
        rng.shuffle(shuffled)
        assert automaton.accepts(("{" + ",".join(shuffled) + "}").encode())
        assert not automaton.accepts(("{" + ",".join(shuffled[1:]) + "}").encode())


def test_register_dfa_refusals():
    # more required members than a register holds
    items = [(f'"k{j}":1', True) for j in range(REGISTER_BITS + 1)]
    with pytest.raises(ConstraintError, match="at most 32"):
        register_object_dfa("(?:" + any_order_text(items, None, "") + ")")
    # a member without a literal key first (its mark at its end) whose end could go on like
    # the separator after it
    items = [('(?:"a"):(?:1|1,)', True), ('"b":2', True)]
    with pytest.raises(ConstraintError, match="may go on with"):
        register_object_dfa("(?:" + any_order_text(items, None, "") + ")")


# ---------------------------------------------------------------- the pushdown automaton's walk

_TREE_VALUES = {"a": "-?(?:0|[1-9][0-9]*)", "b": '"[ab]"', "c": "true|false"}
_TREE_SCHEMA = {
    "type": "object",
    "properties": {
        **{f"m{j}": {"type": "integer"} for j in range(9)},
        "a": {"type": "integer"},
        "b": {"enum": ["a", "b"]},
        "c": {"type": "boolean"},
        "kid": {"$ref": "#"},
        "kids": {"type": "array", "items": {"$ref": "#"}},
    },
    "required": ["a", "b", "m0", "m5"],
    "additionalProperties": False,
}


def _top_rule(callables: int):
    """`(dfa, calls)` of a bottom frame that only (tail-)calls rule 0, with `callables` call
    columns."""
    top = regex_byte_dfa(rule_call(0))
    calls = np.full((top.num_states, callables), -1, np.int32)
    (q, _, after), *_ = numbered_mark_edges(top.delta, RULE_CALL)
    calls[q, 0] = after
    delta = top.delta.copy()
    delta[:, RULE_CALL] = -1
    return ByteDFA(delta, top.accepting, top.initial), calls


def _tree_pushdown(vocabulary=None):
    """A recursive object of 14 members, 4 required (above `ORDER_AUTOMATON_MAX`): `kid` an
    object of the same schema, `kids` an array of them (calls of rule 0, the object), read by
    a `build_pushdown` whose bottom frame is the object's tail call."""
    call = rule_call(0)
    integer = "-?(?:0|[1-9][0-9]*)"
    items = [(f'"m{j}"[ ]?:[ ]?(?:{integer})', j in (0, 5)) for j in range(9)]
    items += [(f'"{k}"[ ]?:[ ]?(?:{v})', k in "ab") for k, v in _TREE_VALUES.items()]
    items += [('"kid"[ ]?:[ ]?' + call, False)]
    items += [(f'"kids"[ ]?:[ ]?\\[(?:{call}(?:[ ]?,[ ]?{call})*)?\\]', False)]
    tree = register_object_dfa("(?:" + any_order_text(items, None, "[ ]?") + ")")
    rules = [("top", *_top_rule(1)), ("tree", tree.dfa, tree.calls)]
    registers = [None, (tree.reg_clear, tree.reg_set, tree.reg_require)]
    return build_pushdown(
        None, vocabulary or BYTES_ONLY, stack_depth=8, rules=rules, registers=registers
    )


def _random_tree(rng, depth: int) -> list:
    """A random object as `(key, value)` pairs: mostly valid members in a random order, at
    times a required one left out, a member twice, or a bad value."""
    keys = ["a", "b", "m0", "m5"] + rng.sample(
        [f"m{j}" for j in (1, 2, 3, 4, 6, 7, 8)] + ["c", "kid", "kids"], rng.randrange(6)
    )
    if depth >= 2:
        keys = [k for k in keys if not k.startswith("kid")]
    rng.shuffle(keys)
    roll = rng.random()
    if roll < 0.1:
        keys.pop(rng.randrange(len(keys)))
    elif roll < 0.2:
        keys.append(rng.choice(keys))
    pairs = []
    for k in keys:
        if k == "kid":
            value = _random_tree(rng, depth + 1)
        elif k == "kids":
            value = [_random_tree(rng, depth + 1) for _ in range(rng.randrange(3))]
        elif k == "b":
            value = rng.choice(["a", "b", "c"] if rng.random() < 0.1 else ["a", "b"])
        elif k == "c":
            value = rng.random() < 0.5
        else:
            value = rng.randrange(-20, 100)
        pairs.append((k, value))
    return pairs


def _render_tree(value, spaced: bool) -> str:
    """JSON text of `_random_tree`'s objects (lists of pairs) and arrays of them."""
    sep, colon = (", ", ": ") if spaced else (",", ":")
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return "{" + sep.join(f'"{k}"{colon}{_render_tree(v, spaced)}' for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + sep.join(_render_tree(v, spaced) for v in value) + "]"
    return json.dumps(value)


def test_pushdown_walk_with_registers_accepts_exactly_the_valid_nested_objects():
    # Every frame has its own register: an object inside a member of another (`kid`, `kids`)
    # starts from none written and gives its caller's register back when it ends.
    automaton = _tree_pushdown()
    assert automaton.has_register and automaton.initial_config()[2:] == (0, ())
    validator = jsonschema.Draft202012Validator(_TREE_SCHEMA)
    rng = random.Random(3)
    verdicts = {True: 0, False: 0}
    for _ in range(300):
        tree = _random_tree(rng, 0)
        spaced = rng.random() < 0.5
        document = _render_tree(tree, spaced)
        want = validator.is_valid(json.loads(document))
        assert automaton.accepts(document.encode()) == want, document
        verdicts[want] += 1
    assert min(verdicts.values()) > 30
    # the inner frame's register must not leak into the outer one, nor the outer one into the
    # inner: members written inside `kid` do not count for the outer object
    inner = '{"a":1,"b":"a","m0":0,"m5":5}'
    assert automaton.accepts(f'{{"a":1,"kid":{inner},"b":"b","m0":1,"m5":2}}'.encode())
    assert not automaton.accepts(f'{{"kid":{inner},"b":"b","m0":1,"m5":2}}'.encode())
    assert not automaton.accepts(b'{"a":1,"b":"b","m0":1,"m5":2,"kid":{"a":1}}')
    assert automaton.accepts(f'{{"kids":[{inner},{inner}],"a":1,"b":"b","m0":1,"m5":2}}'.encode())
    config = automaton.walk(f'{{"m5":2,"kid":{inner[:-1]}'.encode())
    # bits: the required m0, m5, a, b; a member's bit is set at the byte after its key
    assert config[2] == 0b1111 and config[3] == (0b10,)


def test_pushdown_without_registers_is_unchanged():
    # no `registers`: no register tables, the configurations of before
    automaton = build_pushdown(parse_grammar(PUSHDOWN_GRAMMARS["json"]), BYTES_ONLY)
    assert not automaton.has_register and automaton.initial_config() == (automaton.initial, ())
    assert automaton.reg_set.shape == (0, 0)
    with pytest.raises(ValueError, match="registers"):
        build_pushdown(parse_grammar(PUSHDOWN_GRAMMARS["json"]), BYTES_ONLY, registers=[None])


def _device_configs(walk, documents: list[bytes]):
    """Every document's configuration after each of its bytes, on the device (a scan over the
    bytes, padded with a `}` that a dead configuration keeps dead; vmapped over documents)."""
    import jax
    import jax.numpy as jnp

    width = max(map(len, documents))
    data = jnp.asarray([list(d) + [0] * (width - len(d)) for d in documents], jnp.int32)

    def run(row):
        def body(config, byte):
            config = walk.byte(config, byte)
            return config, config

        return jax.lax.scan(body, walk.init(), row)[1]

    return jax.tree.map(np.asarray, jax.jit(jax.vmap(run))(data))


def test_device_walk_with_registers_equals_the_host_walk():
    # byte for byte, the device's (position, stack, register, registers) is the host walk's,
    # until the host refuses a byte (the device's position is then DEAD, and stays so)
    from functional_gen.structured.pushdown.register_walk import RegisterWalk

    automaton = _tree_pushdown()
    walk = RegisterWalk(automaton)
    rng = random.Random(5)
    documents = [_render_tree(_random_tree(rng, 0), rng.random() < 0.5) for _ in range(60)]
    documents += ['{"a":1,"a":2}', '{"kid":{"a":1,"b":"a","m0":0,"m5":5},"kid":{}}', "{}"]
    documents = [d.encode() for d in documents]
    pos, stack, sp, register, registers = _device_configs(walk, documents)
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
            assert int(register[i, j]) == config[2]
            assert tuple(registers[i, j, :depth].tolist()) == config[3]
    assert refused > 10


def test_device_token_walk_with_registers_equals_the_host_walk():
    # whole tokens (the vocabulary's multi-byte ones too) from configurations along documents
    import jax

    from functional_gen.structured.pushdown.register_walk import RegisterWalk

    automaton = _tree_pushdown()
    walk = RegisterWalk(automaton)
    rng = random.Random(6)
    starts = []
    for _ in range(20):
        document = _render_tree(_random_tree(rng, 0), False).encode()
        for cut in rng.sample(range(len(document)), 5):
            config = automaton.walk(document[:cut])
            if config is not None:
                starts.append(config)
    tokens = [t for t in range(automaton.vocab_size) if automaton.token_length[t]]
    token = jax.jit(jax.vmap(jax.vmap(walk.token, (None, 0)), (0, None)))
    depth = automaton.stack_depth

    def device(config):
        pos, stack, register, registers = config
        pad = (0,) * (depth - len(stack))
        return (
            np.int32(pos),
            np.asarray(stack + pad, np.int32),
            np.int32(len(stack)),
            np.uint32(register),
            np.asarray(registers + pad, np.uint32),
        )

    batch = jax.tree.map(lambda *xs: np.stack(xs), *map(device, starts))
    after = jax.tree.map(np.asarray, token(batch, np.asarray(tokens, np.int32)))
    alive = 0
    for i, config in enumerate(starts):
        for k, t in enumerate(tokens):
            data = bytes(automaton.token_bytes[t, : automaton.token_length[t]])
            want = automaton.walk(data, config)
            got_pos = int(after[0][i, k])
            if want is None:
                assert got_pos == 0
                continue
            alive += 1
            n = int(after[2][i, k])
            got = (got_pos, tuple(after[1][i, k, :n].tolist()), int(after[3][i, k]))
            assert got == want[:3] and tuple(after[4][i, k, :n].tolist()) == want[3]
    assert alive > 100


def test_masks_with_registers_equal_a_brute_force_walk(vocabulary):
    # At prefixes of valid and invalid documents: the bitmask row (register-blind) with the
    # one-byte, candidate, best and register tokens walked exactly gives exactly the tokens
    # whose bytes the host walk reads with the register, after which the text can still end
    # within the stack (`test_pda`'s brute force; the budget aside: it is not register-aware)
    from .test_pda import _completable

    automaton = _tree_pushdown(vocabulary)  # SmolLM2's
    assert automaton.register_tokens.size and automaton.register_bytes >= 1
    completable = _completable(automaton)
    rng = random.Random(7)
    prefixes = [  # where the register refuses tokens that the bitmask row holds
        b'{"a":1,"b":"a',  # `"}` (m0, m5 missing) and `",` are register tokens
        b'{"a":1,"b":"b","m0":0,"m5":5,"a"',  # `a` again: `:` `":` ... refused
        b'{"b":"a","m0":0,"m5":5,"kid":{"a":1,"b":"a","m0":0,"m5":5},"b":"a',
        b'{"kids":[{"a":1,"b":"a","m0":0,"m5":5',  # `}]`, `},` inside the array
    ]
    for _ in range(2):
        document = _render_tree(_random_tree(rng, 0), rng.random() < 0.5).encode()
        prefixes += [document[:cut] for cut in sorted(rng.sample(range(len(document) + 1), 8))]
    checked = 0
    for prefix in prefixes:
        config = automaton.walk(prefix)
        if config is not None:
            want = np.zeros(automaton.vocab_size, bool)
            for t, data in enumerate(vocabulary.token_bytes):
                if data:
                    after = automaton.walk(data, config)
                    want[t] = after is not None and completable(after[:2])
            want[list(vocabulary.eos_token_id)] = automaton.can_end(config)
            np.testing.assert_array_equal(automaton.allowed(config), want, err_msg=repr(prefix))
            checked += 1
    assert checked >= 14


@pytest.mark.parametrize("slack", [None, 6])
def test_device_mask_with_registers_equals_the_host_tables(vocabulary, slack):
    # A token walk through the recursive object (SmolLM2's tokens, drawn among the allowed
    # ones, preferring those the register decides): at each step the jitted `process` keeps
    # the host walk's configuration (register and saved registers too) and masks exactly the
    # tokens `allowed` gives, without a budget and with `max_new_tokens` the start's need plus
    # `slack` (the register-aware need and gate, then); the state keeps its shapes and dtypes.
    import jax
    import jax.numpy as jnp

    from functional_gen.structured.pushdown.register_walk import RegisterPushdownConstraint

    from .helpers import context_for

    automaton = _tree_pushdown(vocabulary)
    processor = RegisterPushdownConstraint(automaton)
    step = jax.jit(lambda s, logits, c: processor.process(s, logits, c))
    rng = np.random.default_rng(2)
    ids = [1, 2, 3]
    budget = None if slack is None else automaton.need(automaton.initial_config()) + slack
    limit = {} if budget is None else {"max_new_tokens": budget}
    state = processor.init(context_for(ids, 3, max_len=128))
    shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
    config = automaton.initial_config()
    register_tokens = set(automaton.register_tokens.tolist())
    # keys and their first bytes, so that the walk writes members (and repeats some)
    keys = [t for t, b in enumerate(vocabulary.token_bytes) if b in (b'"a', b'"b', b'"m', b'"k')]
    refused = 0
    for _ in range(60):
        state, logits = step(
            state, jnp.zeros(vocabulary.vocab_size), context_for(ids, 3, max_len=128, **limit)
        )
        assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
        pos, stack, sp, register, registers = (np.asarray(x) for x in state)
        assert (int(pos), tuple(stack[: int(sp)].tolist())) == config[:2]
        assert int(register) == config[2] and tuple(registers[: int(sp)].tolist()) == config[3]
        host = automaton.allowed(config, None if budget is None else budget - (len(ids) - 3))
        np.testing.assert_array_equal(np.isfinite(np.asarray(logits)), host)
        refused += sum(1 for t in register_tokens if t < automaton.vocab_size and not host[t])
        assert host.any(), b"".join(vocabulary.token_bytes[t] for t in ids[3:])  # no dead end
        preferred = [t for t in keys + sorted(register_tokens) if t < host.size and host[t]]
        token = (
            int(rng.choice(preferred))
            if preferred and rng.random() < 0.6
            else int(rng.choice(np.flatnonzero(host)))
        )
        if token in vocabulary.eos_token_id or len(ids) >= 127:
            break
        ids.append(token)
        config = automaton.walk(vocabulary.token_bytes[token], config)
    assert refused > 0


def _budget_configs(automaton, rng, documents: int = 3):
    """Configurations along documents of the tree schema: where the register decides (a
    member's key again, `}` with required members missing, inside a member of an array of
    objects), and random prefixes of random documents."""
    prefixes = [
        b'{"a":1,"b":"b","m0":0,"m5":5,"a"',  # a member's key again
        b'{"a":1,"b":"a"',  # m0 and m5 missing: `"}` is the register-blind best
        b'{"kid":{"a":1,"b":"a","m0":0,"m5":5,"a"',
        b'{"kids":[{"a":1,"b":"a","m0":0,"m5":5',
        b'{"m0":1,"kids":[{"a":1,"b":"a","m0":0,"m5":5}],"b":"a',
    ]
    for _ in range(documents):
        document = _render_tree(_random_tree(rng, 0), rng.random() < 0.5).encode()
        prefixes += [document[:cut] for cut in sorted(rng.sample(range(len(document) + 1), 4))]
    configs = [automaton.walk(p) for p in prefixes]
    return [(p, c) for p, c in zip(prefixes, configs) if c is not None]


def test_budget_with_registers_keeps_its_promise(vocabulary):
    # The budget's promise (`pushdown.budget`, `pushdown.register_budget`): in a configuration
    # whose `need` fits in the tokens left, some token (or EOS) is allowed, and every token
    # allowed (the bitmask row's too, behind its gate) leaves a configuration whose `need` fits
    # in the tokens left after it; where the register decides above all.
    automaton = _tree_pushdown(vocabulary)
    assert automaton.counts_registers
    configs = _budget_configs(automaton, random.Random(11))
    eos = list(vocabulary.eos_token_id)
    checked = 0
    for prefix, config in configs:
        need = automaton.need(config)
        assert need < UNREACHABLE, prefix
        # the fewest tokens left with which the bitmask row is used whole (its gate)
        pos, stack = config[:2]
        slot = automaton.slot_of[automaton.position_rule[pos], stack[-1] if stack else 0]
        top, room, register = automaton.frames(config)[0]
        gate = need - automaton.frame_need(top, room, register) + 1
        gate += automaton.frame_cost(config, slot)
        for remaining in (need, need + 1, need + 4, max(gate, need)):
            allowed = automaton.allowed(config, remaining)
            assert allowed.any(), (prefix, remaining)
            allowed[eos] = False
            for t in np.flatnonzero(allowed):
                after = automaton.walk(vocabulary.token_bytes[t], config)
                assert after is not None and automaton.need(after) <= remaining - 1, (
                    prefix,
                    remaining,
                    vocabulary.token_bytes[t],
                )
                checked += 1
    assert checked > 250


def test_register_budget_counts_the_members_missing(vocabulary):
    # hand-checked: one more required member missing costs at least one token more, and the
    # need of an object with all its required members written is the register-blind one
    automaton = _tree_pushdown(vocabulary)
    start = automaton.walk(b"{")
    some = automaton.walk(b'{"a":1')
    most = automaton.walk(b'{"a":1,"b":"a","m0":0')
    every = automaton.walk(b'{"a":1,"b":"a","m0":0,"m5":5')
    needs = [automaton.need(c) for c in (start, some, most, every)]
    assert needs[0] > needs[1] > needs[2] > needs[3] >= 1, needs
    row = automaton.register_index[every[0]]
    assert needs[3] == automaton.register_distance[row, -1]
    # `}` closes it: a token that reads it is allowed at once, even at one token left
    allowed = automaton.allowed(every, 2)
    closing = [t for t in np.flatnonzero(allowed) if vocabulary.token_bytes[t].endswith(b"}")]
    assert closing and not automaton.allowed(most, needs[2] - 1)[closing].any()


@pytest.mark.parametrize("slack", [0, 3, 30])
def test_random_generation_within_the_budget_with_registers(vocabulary, slack):
    # Walks of random allowed tokens from the start with `max_new_tokens = need + slack`: none
    # is ever left without a token, each ends (EOS allowed) within its tokens, and its text is
    # a valid object of the schema (jsonschema), the register-sensitive tokens preferred.
    automaton = _tree_pushdown(vocabulary)
    validator = jsonschema.Draft202012Validator(_TREE_SCHEMA)
    rng = np.random.default_rng(slack)
    eos = set(vocabulary.eos_token_id)
    register_tokens = set(automaton.register_tokens.tolist())
    for _ in range(3):
        config = automaton.initial_config()
        budget = automaton.need(config) + slack
        text = b""
        for used in range(budget + 1):
            allowed = automaton.allowed(config, budget - used)
            assert allowed.any(), (text, budget - used)
            choices = np.flatnonzero(allowed)
            preferred = [t for t in choices if t in register_tokens]
            if any(t in eos for t in choices) and rng.random() < 0.2:
                break
            pool = [t for t in choices if t not in eos] or list(choices)
            token = int(rng.choice(preferred if preferred and rng.random() < 0.5 else pool))
            if token in eos:
                break
            text += vocabulary.token_bytes[token]
            config = automaton.walk(vocabulary.token_bytes[token], config)
        assert automaton.can_end(config) and used <= budget, text
        assert validator.is_valid(json.loads(text)), text


def test_register_object_with_a_free_form_member_calls_the_json_value_rule():
    # a member whose value is free-form (`FREE_VALUE_CALL`) becomes a call of the grammar's
    # `value` rule (`value_calls`, the column `rule_automata.rule_edges(free_value=True)`
    # appends): 12 members, "any" free-form, read in any order through `build_pushdown`
    from functional_gen.structured.json_schema.free_values import (
        FREE_VALUE_CALL,
        free_value_grammar,
    )

    names = [f"n{j}" for j in range(11)]
    items = [(f'"{n}"[ ]?:[ ]?(?:[0-9])', j < 3) for j, n in enumerate(names)]
    items.append(('"any"[ ]?:[ ]?' + FREE_VALUE_CALL, True))
    obj = register_object_dfa("(?:" + any_order_text(items, None, "[ ]?") + ")")
    assert obj.calls.shape[1] == 0 and (obj.value_calls >= 0).sum() == 2  # `:` and `: `
    top, top_calls = _top_rule(2)
    obj_calls = np.stack([np.full(obj.dfa.num_states, -1, np.int32), obj.value_calls], axis=1)
    automaton = build_pushdown(
        free_value_grammar("[ ]?"),
        BYTES_ONLY,
        stack_depth=6,
        rules=[("top", top, top_calls), ("object", obj.dfa, obj_calls)],
        registers=[None, (obj.reg_clear, obj.reg_set, obj.reg_require)],
    )
    schema = {
        "type": "object",
        "properties": {**{n: {"enum": list(range(10))} for n in names}, "any": {}},
        "required": [*names[:3], "any"],
        "additionalProperties": False,
    }
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(8)
    free = [{"x": [1, {"y": None}]}, [], "s", 1.5, {"n0": 1, "n0x": True}, [[{}]]]
    verdicts = {True: 0, False: 0}
    for _ in range(200):
        keys = rng.sample([*names, "any"], rng.randrange(3, 13))
        if rng.random() < 0.2:
            keys.append(rng.choice(keys))
        rng.shuffle(keys)
        members = [
            f'"{k}": {json.dumps(rng.choice(free)) if k == "any" else rng.randrange(10)}'
            for k in keys
        ]
        document = "{" + ", ".join(members) + "}"
        want = validator.is_valid(json.loads(document))  # the last of a repeated key kept
        assert automaton.accepts(document.encode()) == want, document
        verdicts[want] += 1
    assert min(verdicts.values()) > 30
