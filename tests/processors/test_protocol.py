"""Properties every processor must have, parametrised over ALL processors.

`REGISTRY` lists every processor class exported by `functional_gen.processors`, with a factory
and invalid constructions; `test_registry_is_complete` fails when a new processor is exported
without an entry here.
"""

import dataclasses
import functools
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen.processors as P
from functional_gen.processors.base import (
    AbstractLogitsProcessor,
    AbstractStatelessLogitsProcessor,
    Context,
    Stateless,
    as_processors,
    init_states,
    process_all,
    vmap_rows,
)

from ..helpers import without_runtime_type_checks

VOCAB = 64
MAX_LEN = 16
BATCH = 3
EOS = (VOCAB - 1,)
STEPS = 4


def scalar(a, b):
    """Picks one value for all rows."""
    return a


def per_row(a, b):
    """One value per row, from `a` to `b` (ints stay ints)."""
    values = np.linspace(a, b, BATCH)
    return values.round().astype(np.int32) if isinstance(a, int) else values.astype(np.float32)


def row_of(i):
    """Picks row `i`'s value as a scalar."""
    return lambda a, b: per_row(a, b)[i].item()


@functools.cache
def char_tokenizer():
    """A character-level tokenizer of VOCAB ids (EOS `</s>` last), for the structured processors,
    which need the bytes of every token."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys('0123456789abcdefghijklmnopqrstuvwxyz{}[]:," -.ABCDEFGHIJKLMNOP'))
    vocab = {c: i for i, c in enumerate(chars[: VOCAB - 2])}
    vocab["<unk>"], vocab["</s>"] = VOCAB - 2, VOCAB - 1
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="</s>")


@functools.cache
def tiny_model():
    """A random 2-layer Llama over VOCAB ids, for ClassifierFreeGuidance's unconditional branch."""
    from functional_gen.models import LlamaForCausalLM
    from functional_gen.testing import tiny_config

    return LlamaForCausalLM(tiny_config(vocab_size=VOCAB, eos_token_id=EOS), key=jax.random.key(0))


# name -> (factory(v), [(invalid construction, parameter name in the message), ...])
REGISTRY = {
    "Temperature": (
        lambda v: P.Temperature(v(0.7, 1.5)),
        [
            (lambda: P.Temperature(0.0), "temperature"),
            (lambda: P.Temperature(float("nan")), "temperature"),
        ],
    ),
    "TopK": (lambda v: P.TopK(5), [(lambda: P.TopK(0), "top_k"), (lambda: P.TopK(2.5), "top_k")]),
    "TopP": (
        lambda v: P.TopP(v(0.5, 0.95)),
        [
            (lambda: P.TopP(0.0), "top_p"),
            (lambda: P.TopP(1.5), "top_p"),
            (lambda: P.TopP(0.9, 0), "min_tokens_to_keep"),
        ],
    ),
    "MinP": (
        lambda v: P.MinP(v(0.05, 0.2)),
        [(lambda: P.MinP(-0.1), "min_p"), (lambda: P.MinP([0.1, 2.0]), "min_p")],
    ),
    "TypicalP": (
        lambda v: P.TypicalP(v(0.5, 0.95)),
        [(lambda: P.TypicalP(0.0), "typical_p"), (lambda: P.TypicalP(1.1), "typical_p")],
    ),
    "EpsilonCutoff": (
        lambda v: P.EpsilonCutoff(v(0.005, 0.02)),
        [
            (lambda: P.EpsilonCutoff(1.0), "epsilon_cutoff"),
            (lambda: P.EpsilonCutoff(-1e-3), "epsilon_cutoff"),
        ],
    ),
    "EtaCutoff": (
        lambda v: P.EtaCutoff(v(0.005, 0.02)),
        [(lambda: P.EtaCutoff(1.0), "eta_cutoff")],
    ),
    "TopNSigma": (lambda v: P.TopNSigma(v(0.5, 2.0)), [(lambda: P.TopNSigma(-1.0), "top_n_sigma")]),
    "XTC": (
        lambda v: P.XTC(v(0.02, 0.1), v(0.5, 1.0)),
        [(lambda: P.XTC(1.5, 0.5), "xtc_threshold"), (lambda: P.XTC(0.1, -0.5), "xtc_probability")],
    ),
    "RepetitionPenalty": (
        lambda v: P.RepetitionPenalty(v(1.1, 1.5)),
        [
            (lambda: P.RepetitionPenalty(0.0), "repetition_penalty"),
            (lambda: P.RepetitionPenalty(1.2, -2), "penalty_last_n"),
        ],
    ),
    "PresencePenalty": (
        lambda v: P.PresencePenalty(v(0.5, 1.5)),
        [(lambda: P.PresencePenalty(2.5), "presence_penalty")],
    ),
    "FrequencyPenalty": (
        lambda v: P.FrequencyPenalty(v(0.2, 1.0)),
        [(lambda: P.FrequencyPenalty(-3.0), "frequency_penalty")],
    ),
    "NoRepeatNGram": (
        lambda v: P.NoRepeatNGram(2),
        [
            (lambda: P.NoRepeatNGram(0), "no_repeat_ngram_size"),
            (lambda: P.NoRepeatNGram(2.0), "no_repeat_ngram_size"),
        ],
    ),
    "DRY": (
        lambda v: P.DRY(v(0.5, 1.0), v(1.5, 2.0), 1, [[5]]),
        [(lambda: P.DRY(-1.0), "dry_multiplier"), (lambda: P.DRY(1.0, 0.5), "dry_base")],
    ),
    "SuppressTokens": (
        lambda v: P.SuppressTokens([1, 2]),
        [(lambda: P.SuppressTokens([-1]), "suppress_tokens")],
    ),
    "SuppressTokensAtBegin": (
        lambda v: P.SuppressTokensAtBegin([3, 4], begin_index=1),
        [
            (lambda: P.SuppressTokensAtBegin([-3]), "begin_suppress_tokens"),
            (lambda: P.SuppressTokensAtBegin([3], -1), "begin_index"),
        ],
    ),
    "BadWords": (
        lambda v: P.BadWords([[6], [7, 8], list(EOS)], EOS),
        [
            (lambda: P.BadWords([]), "bad_words_ids"),
            (lambda: P.BadWords([[1, -2]]), "bad_words_ids"),
            (lambda: P.BadWords([5]), "bad_words_ids"),
        ],
    ),
    "SequenceBias": (
        lambda v: P.SequenceBias([[[9], 1.5], [[10, 11], -2.0]]),
        [
            (lambda: P.SequenceBias([]), "sequence_bias"),
            (lambda: P.SequenceBias([[[9], float("nan")]]), "sequence_bias"),
            (lambda: P.SequenceBias({(): 1.0}), "sequence_bias"),
        ],
    ),
    "LogitBias": (
        lambda v: P.LogitBias({12: 3.0, "13": -4.0}),
        [
            (lambda: P.LogitBias({1: 200.0}), "logit_bias"),
            (lambda: P.LogitBias({-1: 1.0}), "logit_bias"),
            (lambda: P.LogitBias([1.0]), "logit_bias"),
        ],
    ),
    "MinLength": (
        lambda v: P.MinLength(v(10, 14), EOS),
        [
            (lambda: P.MinLength(-1, EOS), "min_length"),
            (lambda: P.MinLength(1.5, EOS), "min_length"),
            (lambda: P.MinLength(3, []), "eos_token_id"),
        ],
    ),
    "MinNewTokens": (
        lambda v: P.MinNewTokens(v(2, 4), EOS),
        [(lambda: P.MinNewTokens(-1, EOS), "min_new_tokens")],
    ),
    "ForcedBOS": (lambda v: P.ForcedBOS(5), [(lambda: P.ForcedBOS(-5), "forced_bos_token_id")]),
    "ForcedEOS": (lambda v: P.ForcedEOS(EOS), [(lambda: P.ForcedEOS([]), "forced_eos_token_id")]),
    "ExponentialDecayLengthPenalty": (
        lambda v: P.ExponentialDecayLengthPenalty((v(1, 3), v(1.2, 2.0)), EOS),
        [
            (lambda: P.ExponentialDecayLengthPenalty((1, 0.0), EOS), "decay_factor"),
            (lambda: P.ExponentialDecayLengthPenalty((-1, 1.5), EOS), "start_index"),
            (lambda: P.ExponentialDecayLengthPenalty(1.5, EOS), "exponential_decay_length_penalty"),
        ],
    ),
    "RemoveInvalidValues": (lambda v: P.RemoveInvalidValues(), []),
    "LogSoftmax": (lambda v: P.LogSoftmax(), []),
    "ForcedTokens": (
        lambda v: P.ForcedTokens([1, 2, 3]),
        [(lambda: P.ForcedTokens([]), "token_ids")],
    ),
    # Structured generation (one constraint for all rows here; per-row constraints and the
    # automata themselves are tested in tests/structured).
    "Regex": (
        lambda v: P.Regex("(ab|c)+d?", char_tokenizer()),
        [(lambda: P.Regex("(", char_tokenizer()), "(")],
    ),
    "Choice": (lambda v: P.Choice(["abc", "abd", "x"], char_tokenizer()), []),
    "JsonSchema": (
        lambda v: P.JsonSchema(
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            char_tokenizer(),
        ),
        [],
    ),
    "Grammar": (lambda v: P.Grammar('start: "a" "b"* | "c"', char_tokenizer()), []),
    "ClassifierFreeGuidance": (
        lambda v: P.ClassifierFreeGuidance(
            tiny_model(), v(0.5, 3.0), [3, 4, 5], rescale=v(0.3, 0.9)
        ),
        [
            (lambda: P.ClassifierFreeGuidance(tiny_model(), float("nan")), "guidance_scale"),
            (lambda: P.ClassifierFreeGuidance(tiny_model(), 1.5, rescale=1.5), "rescale"),
            (lambda: P.ClassifierFreeGuidance(tiny_model(), 1.5, []), "negative_prompt_ids"),
            (lambda: P.ClassifierFreeGuidance(tiny_model(), 1.5, [VOCAB]), "negative_prompt_ids"),
        ],
    ),
    "MirostatV2": (
        lambda v: P.MirostatV2(v(2.0, 5.0), v(0.1, 0.5), vocab_size=VOCAB),
        [
            (lambda: P.MirostatV2(-1.0, vocab_size=VOCAB), "mirostat_tau"),
            (lambda: P.MirostatV2(5.0, 0.1, vocab_size=0), "vocab_size"),
        ],
    ),
}
NAMES = sorted(REGISTRY)


def build(name, pick=scalar):
    return REGISTRY[name][0](pick)


def exported_processor_classes():
    # dir() lists the lazily aliased structured processors too (see processors/__init__.py)
    exported = {name: getattr(P, name) for name in dir(P) if not name.startswith("_")}
    return {
        name: obj
        for name, obj in exported.items()
        if isinstance(obj, type)
        and issubclass(obj, AbstractLogitsProcessor)
        and obj not in (AbstractLogitsProcessor, AbstractStatelessLogitsProcessor, Stateless)
    }


def random_contexts(seed, batch=BATCH):
    """Contexts with repeated tokens (ids from a range of 12), various lengths and prompts."""
    rng = np.random.default_rng(seed)
    length = rng.integers(MAX_LEN - STEPS - 6, MAX_LEN - STEPS, size=batch)
    return Context(
        token_ids=jnp.asarray(rng.integers(0, 12, size=(batch, MAX_LEN)), jnp.int32),
        length=jnp.asarray(length, jnp.int32),
        prompt_length=jnp.asarray(length - rng.integers(0, 3, size=batch), jnp.int32),
        max_new_tokens=jnp.full((batch,), 4, jnp.int32),
        key=jax.random.split(jax.random.key(seed), batch),
    )


def random_logits(seed, batch=BATCH, steps=None):
    shape = (batch, VOCAB) if steps is None else (steps, VOCAB)
    return jnp.asarray(np.random.default_rng(seed + 50).normal(size=shape) * 2, jnp.float32)


def row(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def one_step(processor, logits, context):
    return processor.process(processor.init(context), logits, context)


# Compiled once per processor configuration and shared by the tests below (compilation is most
# of their time): float knobs are traced, so a scalar and a row's scalar share a program.
process_jit = eqx.filter_jit(lambda p, state, logits, context: p.process(state, logits, context))
one_step_jit = eqx.filter_jit(one_step)
rows_jit = eqx.filter_jit(
    lambda p, logits, contexts: vmap_rows(
        lambda q, x, c: one_step(q[0], x, c), [p], logits.shape[0]
    )(logits, contexts)
)


def assert_same(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5, atol=1e-5)


def assert_same_tree(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert a.dtype == e.dtype
        assert_same(a, e)


def signature(tree):
    return jax.tree.structure(tree), [
        (jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(tree)
    ]


# --- the registry -----------------------------------------------------------------------------


def test_registry_is_complete():
    assert set(REGISTRY) == set(exported_processor_classes())


@pytest.mark.parametrize("name", NAMES)
def test_docstring_cites_source_and_documents_fields(name):
    cls = exported_processor_classes()[name]
    doc = cls.__doc__ or ""
    assert "Source" in doc, f"{name} must cite its source"
    if dataclasses.fields(cls):
        assert ("**Attributes:**" in doc or "**Arguments:**" in doc) and "**Raises:**" in doc


# --- state and compilation --------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_state_keeps_its_shape_under_scan(name):
    """Generation-like steps under `lax.scan` (which requires a fixed carry), compared with the
    same steps run eagerly in a Python loop."""
    processor = build(name)
    context = row(random_contexts(0), 0)
    logits_steps = random_logits(0, steps=STEPS)

    def step(carry, logits):
        state, token_ids, length = carry
        ctx = Context(
            token_ids,
            length,
            context.prompt_length,
            context.max_new_tokens,
            jax.random.fold_in(context.key, length),
        )
        new_state, out = processor.process(state, logits, ctx)
        token = jnp.argmax(out).astype(jnp.int32)
        return (new_state, token_ids.at[length].set(token), length + 1), out

    init = (processor.init(context), context.token_ids, context.length)
    (final_state, _, _), scanned = jax.lax.scan(step, init, logits_steps)
    assert signature(final_state) == signature(init[0])

    # The same steps one by one, each `process` compiled alone.
    state, token_ids, length = init
    for t, logits in enumerate(logits_steps):
        ctx = Context(
            token_ids,
            length,
            context.prompt_length,
            context.max_new_tokens,
            jax.random.fold_in(context.key, length),
        )
        new_state, out = process_jit(processor, state, logits, ctx)
        assert signature(new_state) == signature(state)
        assert_same(out, scanned[t])
        state, token_ids, length = new_state, token_ids.at[length].set(jnp.argmax(out)), length + 1
    assert_same_tree(final_state, state)


@pytest.mark.parametrize("name", NAMES)
def test_jit_equals_eager(name):
    processor = build(name)
    context = row(random_contexts(1), 1)
    logits = random_logits(1)[1]
    state = processor.init(context)
    eager_state, eager = processor.process(state, logits, context)
    jit_state, jitted = process_jit(processor, state, logits, context)
    assert_same(jitted, eager)
    assert_same_tree(jit_state, eager_state)


@pytest.mark.parametrize("name", NAMES)
def test_vmap_over_rows_equals_a_loop_over_rows(name):
    """`vmap` over a batch equals a Python loop over its rows; with per-row parameters (one value
    per row, where the processor has float or int knobs) each row equals that row run alone with
    its own scalar. Compares the states too."""
    processor = build(name, per_row)
    contexts, logits = random_contexts(2), random_logits(2)
    states, batched = rows_jit(processor, logits, contexts)
    for i in range(BATCH):
        state, expected = one_step_jit(build(name, row_of(i)), logits[i], row(contexts, i))
        assert_same(batched[i], expected)
        assert_same_tree(row(states, i), state)


@pytest.mark.parametrize("name", NAMES)
def test_invalid_parameters_raise_at_construction(name):
    for construct, parameter in REGISTRY[name][1]:
        with pytest.raises(ValueError, match=re.escape(parameter)), without_runtime_type_checks():
            construct()


def has_per_row_values(name):
    processor = build(name, per_row)
    return any(
        f.metadata.get("per_row") and jnp.ndim(getattr(processor, f.name)) > 0
        for f in dataclasses.fields(processor)
    )


@pytest.mark.parametrize("name", [n for n in NAMES if has_per_row_values(n)])
def test_per_row_values_must_match_the_batch(name):
    processor = build(name, per_row)
    contexts, logits = random_contexts(4, batch=BATCH + 1), random_logits(4, batch=BATCH + 1)
    with pytest.raises(ValueError, match="per-row values"):
        vmap_rows(lambda p, x, c: one_step(p[0], x, c)[1], [processor], BATCH + 1)(logits, contexts)


# --- the stateless adapter and lists ----------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in NAMES
        if issubclass(exported_processor_classes()[n], AbstractStatelessLogitsProcessor)
    ],
)
def test_stateless_wrapper_equals_function(name):
    processor = build(name)
    fn = lambda logits, context: processor(logits, context)  # noqa: E731
    wrapped = Stateless(fn)
    context, logits = row(random_contexts(5), 0), random_logits(5)[0]
    assert wrapped.init(context) == () and processor.init(context) == ()
    state, out = wrapped.process((), logits, context)
    assert state == ()
    assert_same(out, fn(logits, context))
    assert_same(out, processor.process((), logits, context)[1])


def halve(logits, context):
    return logits / 2


def test_process_all_with_no_processors_is_the_identity():
    context, logits = row(random_contexts(6), 0), random_logits(6)[0]
    states, out = process_all((), init_states((), context), logits, context)
    assert states == ()
    np.testing.assert_array_equal(np.asarray(out), np.asarray(logits))
    np.testing.assert_array_equal(
        np.asarray(P.apply([], random_logits(6), random_contexts(6).token_ids)),
        np.asarray(random_logits(6)),
    )


def test_process_all_needs_one_state_per_processor():
    context, logits = row(random_contexts(6), 0), random_logits(6)[0]
    with pytest.raises(ValueError, match="states"):
        process_all([P.Temperature(2.0)], (), logits, context)


def test_bare_callables_in_a_list_are_wrapped():
    processors = as_processors([halve, P.Temperature(0.5)])
    assert isinstance(processors[0], Stateless) and processors[0].fn is halve
    assert isinstance(processors[1], P.Temperature)
    logits, token_ids = random_logits(7), random_contexts(7).token_ids
    np.testing.assert_allclose(
        np.asarray(P.apply([halve, P.Temperature(0.5)], logits, token_ids)),
        np.asarray(logits),
        rtol=1e-6,
    )
    with pytest.raises(TypeError, match="processor"):
        as_processors([3])
