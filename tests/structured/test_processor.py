"""The constraint processor as a logits processor: protocol properties (state shape, jit, vmap,
row reordering), the lagged advance, EOS and special tokens, the budget, dead ends, per-row
constraints. Generation runs on a tiny random model with SmolLM2's vocabulary: it samples
near-uniformly among the allowed tokens, a random walk through each automaton."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.processors.base import init_states, process_all
from functional_gen.structured import per_row

from .cases import ARITHMETIC, SCHEMAS
from .helpers import context_for, generated_text, validate_document

DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"


@pytest.fixture(scope="module")
def processors(tokenizer):
    regex = fg.processors.Regex(DATE, tokenizer)
    # token automata here (an integer free_form_depth, as Grammar's max_depth); the pushdown
    # form's protocol is tested in test_pda.py
    schema = fg.processors.JsonSchema(SCHEMAS["sentiment"][1], tokenizer, free_form_depth=1)
    choice = fg.processors.Choice(["yes", "no", "maybe"], tokenizer)
    grammar = fg.processors.Grammar(ARITHMETIC, tokenizer, max_depth=2)
    return {
        "regex": regex,
        "schema": schema,
        "choice": choice,
        "grammar": grammar,
        "mixed": per_row([regex, None, schema, grammar]),
    }


def _contexts(batch, vocab, rng):
    rows = []
    for i in range(batch):
        n = 3 + i
        rows.append(context_for(list(rng.integers(17, vocab, n)), 2, max_len=16, max_new_tokens=40))
    return jax.tree.map(lambda *x: jnp.stack(x), *rows)


@pytest.mark.parametrize("kind", ["regex", "schema", "choice", "grammar", "mixed"])
def test_protocol(processors, kind, vocabulary):
    p = processors[kind]
    batch = 4
    rng = np.random.default_rng(0)
    contexts = _contexts(batch, vocabulary.vocab_size, rng)
    logits = jnp.asarray(rng.normal(size=(batch, vocabulary.vocab_size)), jnp.float32)
    rows, shared = fg.processors.base.split_rows([p], batch)

    def one(row, logits, context):
        (proc,) = eqx.combine(row, shared)
        states = init_states([proc], context)
        return process_all([proc], states, logits, context)

    def row(tree, i):
        return jax.tree.map(lambda x: x[i], tree)

    eager = [one(row(rows, i), logits[i], row(contexts, i)) for i in range(batch)]
    vmapped = jax.vmap(one)(rows, logits, contexts)
    jitted = jax.jit(jax.vmap(one))(rows, logits, contexts)
    for i, (state, out) in enumerate(eager):
        assert state[0].shape == () and state[0].dtype == jnp.int32
        np.testing.assert_array_equal(out, vmapped[1][i])
        np.testing.assert_array_equal(out, jitted[1][i])
        np.testing.assert_array_equal(state[0], jitted[0][0][i])
    # process keeps the state's structure, shapes and dtypes (a while_loop carry)
    init = jax.vmap(lambda r, c: init_states(eqx.combine(r, shared), c))(rows, contexts)
    assert jax.tree.structure(init) == jax.tree.structure(jitted[0])
    assert [(x.shape, x.dtype) for x in jax.tree.leaves(init)] == [
        (x.shape, x.dtype) for x in jax.tree.leaves(jitted[0])
    ]
    # every state leaf has the batch axis first: reordering rows is one gather
    order = jnp.asarray([2, 0, 3, 1])
    reordered = jax.vmap(one)(
        jax.tree.map(lambda x: x[order], rows),
        logits[order],
        jax.tree.map(lambda x: x[order], contexts),
    )
    np.testing.assert_array_equal(reordered[1], vmapped[1][order])
    np.testing.assert_array_equal(reordered[0][0], vmapped[0][0][order])


def test_first_step_does_not_advance_on_the_prompt(processors, vocabulary):
    # The prompt ends in "a", which the regex would reject: the first mask must still be the
    # initial one, and the state the initial state.
    p = processors["regex"]
    a = vocabulary.byte_map[b"a"][0]
    ctx = context_for([1, a], 2, max_len=8)
    state, logits = p.process(p.init(ctx), jnp.zeros(vocabulary.vocab_size), ctx)
    assert int(state) == int(p.initial_state[0])
    allowed = np.flatnonzero(np.asarray(logits) == 0)
    assert allowed.size and all(
        re.fullmatch(r"[0-9]{1,4}", vocabulary.token_bytes[t].decode()) for t in allowed
    )


def test_eos_only_when_accepting_and_special_tokens_never(processors, vocabulary, tokenizer):
    p = processors["grammar"]
    special = [i for i in tokenizer.all_special_ids if i not in vocabulary.eos_token_id] + list(
        range(3, 17)
    )
    transitions, distance = np.asarray(p.transitions), np.asarray(p.distance)
    cls = np.asarray(p.token_class[0])
    for state in range(1, transitions.shape[0]):
        allowed = distance[transitions[state]][cls] < 2**31 - 1
        assert not allowed[special].any()
        assert (allowed[list(vocabulary.eos_token_id)] == (distance[state] == 0)).all()


def test_logits_wider_than_the_tokenizer(tokenizer):
    p = fg.processors.Regex("[0-9]+", tokenizer, vocab_size=49_200)
    ctx = context_for([1], 1, max_len=4)
    _, logits = p.process(p.init(ctx), jnp.zeros(49_200), ctx)
    assert (
        np.isneginf(np.asarray(logits)[49_152:]).all() and (np.asarray(logits) == 0).sum() == 10
    )  # the ten digits


def _ids(tokenizer, prompts):
    return [tokenizer(p)["input_ids"] for p in prompts]


@pytest.mark.parametrize(
    "sampler", [fg.samplers.Greedy(), fg.samplers.Multinomial()], ids=["greedy", "multinomial"]
)
def test_outputs_match_on_a_random_model(random_model, tokenizer, vocabulary, processors, sampler):
    prompts = ["Date:", "Anything:", "JSON:", "Sum:"] * 2
    state = fg.generate_token_ids(
        random_model,
        _ids(tokenizer, prompts),
        max_new_tokens=24,
        processors=[
            per_row([processors["regex"], None, processors["schema"], processors["grammar"]] * 2)
        ],
        sampler=sampler,
        key=jax.random.key(3),
    )
    import lark

    parser = lark.Lark(ARITHMETIC, parser="earley", lexer="dynamic_complete")
    tokens = np.asarray(state.generated_token_ids(2))
    reasons = [fg.FINISH_REASONS[int(r)] for r in state.finish_reason]
    for row in range(len(prompts)):
        kind = row % 4
        if kind == 1:
            continue
        text = generated_text(vocabulary, tokens[row, : int(state.num_generated[row])])
        assert reasons[row] in ("eos", "length")
        if kind == 0:
            assert re.fullmatch(DATE, text), text
        elif kind == 2:
            validate_document(text, SCHEMAS["sentiment"][1])
        else:
            parser.parse(text)


def test_per_row_constraints_equal_each_alone(random_model, tokenizer, processors):
    # A batch mixing [regex, none, schema, grammar] gives each row what its constraint gives it
    # alone in a batch of one: the same tables with that row's constraint id (one compilation
    # for the four), and the original Regex processor itself.
    prompts = ["Date:", "Free:", "JSON:", "Sum:"]
    ids = _ids(tokenizer, prompts)
    mixed_processor = processors["mixed"]
    mixed = fg.generate_token_ids(
        random_model, ids, max_new_tokens=16, processors=[mixed_processor]
    )
    for row in range(4):
        alone = eqx.tree_at(
            lambda p: p.constraint_id, mixed_processor, mixed_processor.constraint_id[row]
        )
        single = fg.generate_token_ids(
            random_model, [ids[row]], max_new_tokens=16, processors=[alone]
        )
        _assert_same_row(mixed, row, single)
    _assert_same_row(
        mixed,
        0,
        fg.generate_token_ids(
            random_model, [ids[0]], max_new_tokens=16, processors=[processors["regex"]]
        ),
    )


def _assert_same_row(batch, row, single):
    n = int(single.num_generated[0])
    assert int(batch.num_generated[row]) == n and int(batch.finish_reason[row]) == int(
        single.finish_reason[0]
    )
    np.testing.assert_array_equal(
        batch.generated_token_ids(2)[row, :n], single.generated_token_ids(2)[0, :n]
    )


def test_budget_keeps_rows_inside_the_language(random_model, tokenizer, vocabulary):
    # "[a-z]+ [a-z]+ [0-9]": whatever the budget, a row ends on a complete match. "[0-9]{8}"
    # needs 8 tokens (SmolLM2 writes digits one by one): below that budget its row ends at once
    # with finish reason "constraint", without a token.
    pattern, digits = "[a-z]+ [a-z]+ [0-9]", "[0-9]{8}"
    p = fg.processors.Regex([pattern, pattern, digits], tokenizer)
    shortest = int(p.distance[int(p.initial_state[0])])  # fewest tokens of a match
    assert int(p.distance[int(p.initial_state[1])]) == 8 > shortest
    for budget in (shortest, shortest + 5):
        state = fg.generate_token_ids(
            random_model,
            _ids(tokenizer, ["x", "y", "z"]),
            max_new_tokens=budget,
            processors=[p],
            sampler=fg.samplers.Multinomial(),
            key=jax.random.key(budget),
        )
        tokens = np.asarray(state.generated_token_ids(2))
        for row, regex in enumerate([pattern, pattern, digits]):
            n = int(state.num_generated[row])
            if regex == digits and budget < 8:
                assert fg.FINISH_REASONS[int(state.finish_reason[row])] == "constraint" and n == 0
                continue
            assert n <= budget and re.fullmatch(regex, generated_text(vocabulary, tokens[row, :n]))


def test_dead_end_ends_with_constraint_and_no_nan(random_model, tokenizer, vocabulary):
    # ForcedTokens (after the constraint) forces "x", which the regex forbids: the next step's
    # mask is empty and the row ends with finish reason "constraint".
    x = vocabulary.byte_map[b"x"][0]
    procs = [fg.processors.Regex("[0-9]+", tokenizer), fg.processors.ForcedTokens([x])]
    state = fg.generate_token_ids(
        random_model, _ids(tokenizer, ["n"]), max_new_tokens=8, processors=procs
    )
    assert fg.FINISH_REASONS[int(state.finish_reason[0])] == "constraint"
    assert int(state.num_generated[0]) == 1
    assert np.isfinite(np.asarray(state.logprobs)).all()
