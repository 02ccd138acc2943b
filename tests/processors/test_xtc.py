"""`XTC` against llama.cpp's documented behaviour (`tests/test-sampling.cpp`, `test_xtc`)."""

import jax
import numpy as np
import pytest

import functional_gen.processors as P

PROBS = [0.4, 0.3, 0.2, 0.1]


def kept(probs, threshold, probability=1.0, key=0, min_tokens_to_keep=1):
    with np.errstate(divide="ignore"):
        logits = np.log(np.asarray([probs], np.float32))
    out = P.apply(
        [P.XTC(threshold, probability, min_tokens_to_keep)],
        logits,
        np.zeros((1, 1), int),
        key=jax.random.key(key),
    )
    return np.flatnonzero(np.isfinite(np.asarray(out[0]))).tolist()


@pytest.mark.parametrize(
    "threshold, expected",
    [
        (0.09, [3]),  # all four reach 0.09: remove all but the least likely of them (0.1)
        (0.19, [2, 3]),  # 0.4, 0.3, 0.2 reach it: keep 0.2 and everything below
        (0.29, [1, 2, 3]),
        (0.39, [0, 1, 2, 3]),  # only one token reaches it: nothing happens
        (0.6, [0, 1, 2, 3]),  # a threshold above 0.5 never applies
    ],
)
def test_llama_cpp_cases(threshold, expected):
    assert kept(PROBS, threshold) == expected


def test_kept_values_are_unchanged():
    logits = np.log(np.asarray([PROBS], np.float32))
    out = np.asarray(P.apply([P.XTC(0.19, 1.0)], logits, np.zeros((1, 1), int))[0])
    np.testing.assert_array_equal(out[2:], logits[0, 2:])
    assert np.isneginf(out[:2]).all()


def test_min_tokens_to_keep():
    # Removing 0.4, 0.3, 0.2 would leave 1 token: not allowed with min_tokens_to_keep=2.
    assert kept(PROBS, 0.09, min_tokens_to_keep=2) == [0, 1, 2, 3]
    assert kept(PROBS, 0.19, min_tokens_to_keep=2) == [2, 3]


def test_filtered_tokens_are_not_candidates():
    # -inf tokens have probability 0: with threshold 0 only the finite ones are "top choices".
    probs = [0.5, 0.3, 0.2, 0.0]
    assert kept(probs, 0.0) == [2]


def test_applies_with_the_given_probability():
    # One uniform draw per row and step from the row's key: over many keys the share of steps
    # where XTC applies approaches xtc_probability; probability 0 never applies.
    logits = np.log(np.asarray([PROBS] * 400, np.float32))
    ids = np.zeros((400, 1), int)
    for probability in (0.0, 0.3, 1.0):
        out = np.asarray(P.apply([P.XTC(0.19, probability)], logits, ids, key=jax.random.key(1)))
        applied = np.isneginf(out[:, 0]).mean()
        assert abs(applied - probability) < 0.07
    # Per-row probabilities: each row keeps its own chance.
    out = np.asarray(
        P.apply([P.XTC(0.19, np.repeat([0.0, 1.0], 200))], logits, ids, key=jax.random.key(1))
    )
    assert not np.isneginf(out[:200]).any() and np.isneginf(out[200:, 0]).all()
