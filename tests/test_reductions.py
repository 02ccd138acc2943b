"""`functional_gen.reductions.argmax` against NumPy's `argmax` (first index of the maximum, NaN
the largest), and `Greedy` against NumPy's `argmax` (`Multinomial`'s draw, `reductions.categorical`,
is tested against exact distributions in `tests/generation/test_samplers.py`), and
`chosen_logprobs` against `jax.nn.log_softmax` and hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.reductions import BLOCK, argmax, chosen_logprobs


def _check(x, axis=-1):
    got = argmax(jnp.asarray(x), axis=axis)
    want = np.argmax(np.asarray(x, np.float32), axis=axis)  # NumPy: first occurrence, NaN first
    np.testing.assert_array_equal(np.asarray(got), want)
    assert got.dtype == jnp.argmax(jnp.asarray(x), axis=axis).dtype


@pytest.mark.parametrize("length", [5, 2 * BLOCK, 2 * BLOCK + 1, 49152, 262144 - 7])
def test_random_rows_match_numpy(length):
    x = np.random.default_rng(length).standard_normal((3, length)).astype(np.float32)
    _check(x)


def test_ties_first_index_wins_across_and_inside_blocks():
    n = 5 * BLOCK + 3
    x = np.zeros((4, n), np.float32)
    x[0, [7, 3 * BLOCK + 2]] = 9.0  # in two blocks: the first block's
    x[1, [2 * BLOCK + 5, 2 * BLOCK + 9]] = 9.0  # twice in one block: the first
    x[2, n - 1] = 9.0  # in the padded last block
    # row 3: all equal, index 0
    _check(x)
    np.testing.assert_array_equal(np.asarray(argmax(jnp.asarray(x))), [7, 2 * BLOCK + 5, n - 1, 0])


def test_minus_inf_and_nan_rows():
    n = 3 * BLOCK + 10  # not a multiple of BLOCK: the -inf padding must not win a tie
    x = np.full((3, n), -np.inf, np.float32)
    x[1, [BLOCK + 4, 2 * BLOCK]] = np.nan  # NaN counts as the largest; the first NaN
    x[2, 5] = np.inf
    x[2, 2 * BLOCK + 1] = np.nan
    _check(x)
    np.testing.assert_array_equal(np.asarray(argmax(jnp.asarray(x))), [0, BLOCK + 4, 2 * BLOCK + 1])


def test_other_axis_dtype_and_vmap():
    x = np.random.default_rng(0).standard_normal((3 * BLOCK, 2, 3)).astype(np.float32)
    _check(x, axis=0)
    xb = jnp.asarray(x[:, 0, 0]).astype(jnp.bfloat16)
    assert int(argmax(xb)) == int(jnp.argmax(xb))
    ints = jnp.asarray(np.random.default_rng(1).integers(0, 9, 4 * BLOCK))
    assert int(argmax(ints)) == int(np.argmax(np.asarray(ints)))  # not floating: jnp.argmax
    rows = jnp.asarray(np.random.default_rng(2).standard_normal((4, 3 * BLOCK)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(argmax))(rows)), np.argmax(rows, -1))


def test_axis_out_of_range():
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        argmax(jnp.zeros((2, 3)), axis=2)


def test_samplers_over_a_gemma_vocab():
    logits = jnp.asarray(np.random.default_rng(3).standard_normal((6, 262144)), jnp.float32)
    keys = jax.random.split(jax.random.key(7), 6)
    greedy = jax.vmap(lambda lg, k: fg.samplers.Greedy()(lg, key=k))(logits, keys)
    np.testing.assert_array_equal(np.asarray(greedy), np.argmax(np.asarray(logits), -1))
    # one finite logit per row (what TopK(1) leaves): Multinomial must draw it
    where = np.asarray([0, 1023, 1024, 131071, 262142, 262143])
    one = jnp.full_like(logits, -jnp.inf).at[jnp.arange(6), where].set(logits[:, 0])
    drawn = jax.jit(jax.vmap(lambda lg, k: fg.samplers.Multinomial()(lg, key=k)))(one, keys)
    np.testing.assert_array_equal(np.asarray(drawn), where)
    assert drawn.dtype == jnp.int32


def test_chosen_logprobs_hand_computed():
    # logits [0, ln 3, -inf]: probabilities 1/4, 3/4, 0
    logits = jnp.asarray([[0.0, np.log(3.0), -np.inf]] * 3, jnp.float32)
    got = chosen_logprobs(logits, jnp.asarray([0, 1, 2]))
    np.testing.assert_allclose(np.asarray(got)[:2], np.log([0.25, 0.75]), rtol=1e-6)
    assert np.asarray(got)[2] == -np.inf


@pytest.mark.parametrize("shape", [(4, 262144), (2, 3, 49152)])
def test_chosen_logprobs_equal_log_softmax(shape):
    rng = np.random.default_rng(len(shape))
    logits = jnp.asarray(rng.standard_normal(shape) * 4, jnp.float32)
    logits = logits.at[..., ::7].set(-jnp.inf)  # masked entries, as after TopK or a constraint
    tokens = jnp.asarray(rng.integers(0, shape[-1], shape[:-1]))
    want = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[..., None], -1)[..., 0]
    got = jax.jit(chosen_logprobs)(logits, tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)  # same ops; sum order
    best = jnp.max(logits, axis=-1)
    np.testing.assert_allclose(
        np.asarray(chosen_logprobs(logits, tokens, best)), np.asarray(got), rtol=1e-6
    )
