"""The engine step's batch-wide switches (`serving.slots.SlotSampler`,
`serving.pool.SlotConstraint.any_constrained`): each skipped path gives what the full path gives
for the rows that can be affected, checked against `jnp.argmax`, `reductions.categorical` (`Multinomial`'s draw) and
hand-built automaton tables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from functional_gen.processors.base import Context
from functional_gen.reductions import categorical
from functional_gen.serving.pool import SlotConstraint
from functional_gen.serving.slots import SlotSampler
from functional_gen.structured.automaton import INFINITE_DISTANCE, INITIAL


def test_slot_sampler_switches_between_argmax_and_the_multinomial_draw():
    logits = jax.random.normal(jax.random.key(1), (4, 50)) * 3
    keys = jax.random.split(jax.random.key(2), 4)
    draw = jax.vmap(lambda lg, k: SlotSampler(sampled=jnp.asarray(True))(lg, key=k))
    best = jax.vmap(lambda lg, k: SlotSampler(sampled=jnp.asarray(False))(lg, key=k))
    expected = jax.vmap(categorical)(keys, logits)
    assert draw(logits, keys).tolist() == expected.tolist()
    assert best(logits, keys).tolist() == jnp.argmax(logits, axis=-1).tolist()
    assert draw(logits, keys).tolist() != best(logits, keys).tolist()  # the draw is random
    # a greedy row (SlotDecoding left it one finite logit) gets that token either way
    one = jnp.full((4, 50), -jnp.inf).at[jnp.arange(4), jnp.asarray([3, 9, 0, 49])].set(1.0)
    assert draw(one, keys).tolist() == best(one, keys).tolist() == [3, 9, 0, 49]


def _context(last_token: int, generated: int) -> Context:
    ids = jnp.asarray([5, 2, last_token, 0, 0, 0], jnp.int32)
    return Context(
        token_ids=ids,
        length=jnp.asarray(2 + generated, jnp.int32),
        prompt_length=jnp.asarray(2, jnp.int32),
        max_new_tokens=jnp.asarray(4, jnp.int32),
        key=jax.random.key(0),
    )


@pytest.mark.parametrize("constrained", [True, False])
def test_slot_constraint_skips_its_tables_only_when_no_row_is_constrained(constrained):
    # vocab 6 in 3 classes; from INITIAL (1) class 1 leads to the accepting state 2 (distance 0),
    # class 2 to the dead state 0; from state 2 nothing leads on (every class to 0)
    token_class = jnp.asarray([0, 1, 1, 2, 2, 2], jnp.int32)
    transitions = jnp.asarray([[0, 0, 0], [0, 2, 0], [0, 0, 0]], jnp.int32)
    distance = jnp.asarray([INFINITE_DISTANCE, 1, 0], jnp.int32)
    logits = jnp.arange(6, dtype=jnp.float32)
    fields = dict(token_class=token_class, transitions=transitions, distance=distance,
                  constrained=jnp.asarray(constrained))  # fmt: skip
    state = jnp.asarray(INITIAL, jnp.int32)
    full = SlotConstraint(**fields)
    switched_on = SlotConstraint(**fields, any_constrained=jnp.asarray(True))
    switched_off = SlotConstraint(**fields, any_constrained=jnp.asarray(False))
    context = _context(last_token=0, generated=0)
    s, masked = full.process(state, logits, context)
    if constrained:  # only class 1 (tokens 1, 2) reaches an accepting state
        assert np.isneginf(np.asarray(masked)).tolist() == [True, False, False, True, True, True]
    else:
        assert masked.tolist() == logits.tolist()
    s_on, on = switched_on.process(state, logits, context)
    assert on.tolist() == masked.tolist() and int(s_on) == int(s) == INITIAL
    s_off, off = switched_off.process(state, logits, context)
    assert off.tolist() == logits.tolist() and int(s_off) == INITIAL
    # after token 1 (class 1) the automaton is in state 2, when its tables are read
    s_on, _ = switched_on.process(state, logits, _context(last_token=1, generated=1))
    assert int(s_on) == 2
