"""`MirostatV2`: llama.cpp's truncation and `mu` update, hand-computed, and its lagged update
inside the generation loop."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
import functional_gen.processors as P
from functional_gen.processors.base import Context
from functional_gen.testing import CountingModel

# Surprises -log2 p: 1, 2, 3, 4, 4 bits.
PROBS = np.asarray([0.5, 0.25, 0.125, 0.0625, 0.0625], np.float32)
LOGITS = jnp.asarray(np.log(PROBS))


def context(token_ids, length):
    ids = jnp.zeros((8,), jnp.int32).at[: len(token_ids)].set(jnp.asarray(token_ids))
    return Context(ids, jnp.asarray(length), jnp.asarray(1), jnp.asarray(10), jax.random.key(0))


def test_truncation_and_lagged_update():
    processor = P.MirostatV2(mirostat_tau=1.5, mirostat_eta=0.5, vocab_size=5)
    state = processor.init(context([0], 1))
    assert float(state.mu) == 3.0  # 2 * tau

    # Step 1: keep surprises <= 3 bits -> probabilities 4/7, 2/7, 1/7 after renormalising.
    state, out = processor.process(state, LOGITS, context([0], 1))
    np.testing.assert_allclose(
        np.asarray(jax.nn.softmax(out)), [4 / 7, 2 / 7, 1 / 7, 0, 0], rtol=1e-6
    )
    assert float(state.mu) == 3.0  # nothing sampled yet

    # Token 2 was sampled (probability 1/7, surprise log2 7): mu -= eta * (log2 7 - tau).
    state, out = processor.process(state, LOGITS, context([0, 2], 2))
    mu = 3.0 - 0.5 * (math.log2(7) - 1.5)  # 2.346
    np.testing.assert_allclose(float(state.mu), mu, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(out)), [2 / 3, 1 / 3, 0, 0, 0], rtol=1e-6)

    # Token 0 sampled next (probability 2/3): mu rises again.
    state, _ = processor.process(state, LOGITS, context([0, 2, 0], 3))
    np.testing.assert_allclose(float(state.mu), mu - 0.5 * (math.log2(3 / 2) - 1.5), rtol=1e-6)


def test_keeps_the_most_likely_token_when_mu_is_below_every_surprise():
    processor = P.MirostatV2(mirostat_tau=0.1, mirostat_eta=0.1, vocab_size=5)  # mu = 0.2 bits
    _, out = processor.process(processor.init(context([0], 1)), LOGITS, context([0], 1))
    np.testing.assert_array_equal(np.isfinite(np.asarray(out)), [True, False, False, False, False])


def test_a_token_outside_its_output_leaves_mu_unchanged():
    processor = P.MirostatV2(mirostat_tau=1.5, mirostat_eta=0.5, vocab_size=5)
    state, _ = processor.process(processor.init(context([0], 1)), LOGITS, context([0], 1))
    state, _ = processor.process(state, LOGITS, context([0, 4], 2))  # token 4 had been removed
    assert float(state.mu) == 3.0


def test_mu_in_the_generation_loop():
    # CountingModel puts (almost) all mass on one token, so every sampled token has surprise
    # ~0 and each update adds eta * tau; 6 steps make 5 updates (the first has no sample yet).
    model = CountingModel(vocab_size=16, eos_token_id=(15,))
    processor = P.MirostatV2(mirostat_tau=2.0, mirostat_eta=0.25, vocab_size=16)
    state = fg.generate_token_ids(
        model,
        [[1, 2], [5]],
        max_new_tokens=6,
        processors=[processor],
        sampler=fg.samplers.Multinomial(),
        key=jax.random.key(0),
        eos_token_id=(),
    )
    np.testing.assert_array_equal(np.asarray(state.token_ids[0, 2:8]), [3, 4, 5, 6, 7, 8])
    mu = np.asarray(state.processor_states[0].mu)
    np.testing.assert_allclose(mu, 4.0 + 5 * 0.25 * 2.0, rtol=1e-5)


def test_vocab_size_must_match_the_logits():
    processor = P.MirostatV2(vocab_size=7)
    with pytest.raises(ValueError, match="vocab_size"):
        processor.process(processor.init(context([0], 1)), LOGITS, context([0], 1))
