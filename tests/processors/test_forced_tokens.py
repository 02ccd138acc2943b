"""`ForcedTokens`: the first generated tokens are forced, then the logits are left alone."""

import jax
import jax.numpy as jnp
import numpy as np

import functional_gen as fg
import functional_gen.processors as P
from functional_gen.processors.base import Context
from functional_gen.testing import CountingModel


def test_forces_each_token_in_turn_then_stops():
    processor = P.ForcedTokens([3, 1])
    context = Context(
        jnp.zeros((4,), jnp.int32),
        jnp.asarray(1),
        jnp.asarray(1),
        jnp.asarray(5),
        jax.random.key(0),
    )
    logits = jnp.arange(5, dtype=jnp.float32)
    state = processor.init(context)
    outs = []
    for _ in range(3):
        state, out = processor.process(state, logits, context)
        outs.append(np.asarray(out))
    np.testing.assert_array_equal(outs[0], [-np.inf, -np.inf, -np.inf, 0.0, -np.inf])
    np.testing.assert_array_equal(outs[1], [-np.inf, 0.0, -np.inf, -np.inf, -np.inf])
    np.testing.assert_array_equal(outs[2], np.asarray(logits))
    assert state.shape == () and state.dtype == jnp.int32 and int(state) == 3


def test_in_the_generation_loop():
    # CountingModel continues with last + 1: after the forced 7, 2 it counts on from 2.
    state = fg.generate_token_ids(
        CountingModel(vocab_size=16, eos_token_id=(15,)),
        [[1], [4, 5]],
        max_new_tokens=5,
        processors=[P.ForcedTokens([7, 2])],
    )
    generated = np.asarray(state.generated_token_ids(0))
    np.testing.assert_array_equal(generated, [[7, 2, 3, 4, 5], [7, 2, 3, 4, 5]])
