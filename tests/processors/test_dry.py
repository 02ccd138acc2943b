"""`DRY` against llama.cpp's documented behaviour: the cases of llama.cpp's
`tests/test-sampling.cpp` (`test_dry`) and hand-computed ones."""

import jax
import numpy as np
import pytest

import functional_gen.processors as P


def dry_probs(probs, last_tokens, multiplier, base, allowed_length, last_n, breakers=()):
    """llama.cpp's test harness: logits = log(probs); the prompt is `last_tokens`; returns the
    softmax of the processed logits (llama.cpp's `dist` sampler normalises them)."""
    logits = np.log(np.asarray(probs, np.float32))[None]
    processor = P.DRY(multiplier, base, allowed_length, breakers, last_n)
    out = P.apply([processor], logits, np.asarray([last_tokens]))
    return np.asarray(jax.nn.softmax(out[0]))


@pytest.mark.parametrize(
    "probs, last_tokens, expected, multiplier, base, allowed_length, last_n, breakers",
    [
        # Too short a context: nothing happens.
        ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, ()),
        # "0 1" repeats; 2 followed it, so 2 would extend a repeat of length 2: penalty 1 * 1.1**0.
        ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, ()),
        # The breaker 3 bounds the match; and 3 itself, a single-token breaker, is never penalised.
        ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, ((3,),)),
        (
            [0.2] * 5,
            [0, 1, 2, 0, 1],
            [0.241818, 0.241818, 0.032727, 0.241818, 0.241818],
            2.0,
            1.1,
            2,
            5,
            (),
        ),
        # A repeat of 2 tokens is allowed when dry_allowed_length is 4.
        ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, ()),
    ],
)
def test_llama_cpp_cases(
    probs, last_tokens, expected, multiplier, base, allowed_length, last_n, breakers
):
    actual = dry_probs(probs, last_tokens, multiplier, base, allowed_length, last_n, breakers)
    np.testing.assert_allclose(actual, expected, atol=1e-5)


def test_penalty_grows_with_the_repeat_length():
    # "5 6 7 8" appeared, then "5 6 7" again: 8 would extend a repeat of 3 -> 0.5 * 2 ** (3 - 2).
    # "6" also followed "5" ... but the longest repeat ending before each candidate counts:
    # candidates: 8 (after "5 6 7", n=3), and nothing else reaches allowed_length 2.
    logits = np.zeros((1, 10), np.float32)
    out = P.apply([P.DRY(0.5, 2.0, 2)], logits, np.asarray([[5, 6, 7, 8, 1, 5, 6, 7]]))
    expected = np.zeros(10, np.float32)
    expected[8] = -0.5 * 2.0 ** (3 - 2)
    np.testing.assert_allclose(np.asarray(out[0]), expected, atol=1e-6)


def test_each_token_takes_its_longest_repeat():
    # Context "1 2 3 9 2 3 4 1 2 3": suffix "1 2 3" repeats at the start (followed by 9, n=3) and
    # its tail "2 3" at positions 4-5 (followed by 4, n=2).
    logits = np.zeros((1, 12), np.float32)
    tokens = [[1, 2, 3, 9, 2, 3, 4, 1, 2, 3]]
    out = np.asarray(P.apply([P.DRY(1.0, 3.0, 2)], logits, np.asarray(tokens))[0])
    expected = np.zeros(12, np.float32)
    expected[9] = -(3.0 ** (3 - 2))
    expected[4] = -(3.0 ** (2 - 2))
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_multi_token_breaker_bounds_the_match():
    logits = np.zeros((1, 12), np.float32)
    # "4 5 2 3" repeats: 9 would extend a repeat of 4 tokens.
    tokens = np.asarray([[4, 5, 2, 3, 9, 8, 4, 5, 2, 3]])
    free = np.asarray(P.apply([P.DRY(1.0, 3.0, 2)], logits, tokens)[0])
    assert free[9] == pytest.approx(-(3.0 ** (4 - 2)))
    # With the breaker "4 5", a match cannot reach back across its latest occurrence: only the
    # 2 tokens after it count (n = 2), so the penalty is 3 ** 0.
    bounded = np.asarray(P.apply([P.DRY(1.0, 3.0, 2, [[4, 5]])], logits, tokens)[0])
    expected = np.zeros(12, np.float32)
    expected[9] = -1.0
    np.testing.assert_allclose(bounded, expected, atol=1e-6)
    # Fewer than dry_allowed_length tokens after the breaker: nothing is penalised at all.
    tokens = np.asarray([[4, 5, 2, 3, 9, 8, 4, 5, 2]])
    free = np.asarray(P.apply([P.DRY(1.0, 3.0, 2)], logits, tokens)[0])
    assert free[3] == pytest.approx(-(3.0 ** (3 - 2)))
    bounded = np.asarray(P.apply([P.DRY(1.0, 3.0, 2, [[4, 5]])], logits, tokens)[0])
    np.testing.assert_array_equal(bounded, 0.0)


def test_only_single_token_breakers_are_exempt():
    # 4 would extend the repeat "1 2" (n=2). As the head of a two-token breaker it is still
    # penalised; as a one-token breaker it is not.
    logits = np.zeros((1, 8), np.float32)
    tokens = np.asarray([[1, 2, 4, 6, 1, 2]])
    two = np.asarray(P.apply([P.DRY(1.0, 2.0, 2, [[4, 7]])], logits, tokens)[0])
    one = np.asarray(P.apply([P.DRY(1.0, 2.0, 2, [4])], logits, tokens)[0])
    assert two[4] == pytest.approx(-1.0)
    np.testing.assert_array_equal(one, 0.0)


def test_penalty_last_n_limits_the_window():
    logits = np.zeros((1, 10), np.float32)
    tokens = np.asarray([[5, 6, 7, 1, 2, 3, 4, 5, 6]])
    whole = np.asarray(P.apply([P.DRY(1.0, 2.0, 2)], logits, tokens)[0])
    assert whole[7] == pytest.approx(-1.0)
    recent = np.asarray(P.apply([P.DRY(1.0, 2.0, 2, (), 6)], logits, tokens)[0])
    np.testing.assert_array_equal(recent, 0.0)  # the first "5 6" is outside the last 6 tokens
    off = np.asarray(P.apply([P.DRY(1.0, 2.0, 2, (), 0)], logits, tokens)[0])
    np.testing.assert_array_equal(off, 0.0)


def test_exponent_is_clamped_to_stay_finite():
    logits = np.zeros((1, 4), np.float32)
    tokens = np.asarray([[0, 1, 2, 3] + [0, 1, 2, 3] * 30])  # repeats of ~120 tokens
    out = np.asarray(P.apply([P.DRY(1.0, 3.0, 2)], logits, tokens)[0])
    max_exponent = int(88.7228391 / np.log(3.0))  # 80, while the repeat is ~120 tokens
    assert np.isfinite(out).all()
    assert out[0] == pytest.approx(-(3.0**max_exponent), rel=1e-4)


def test_zero_multiplier_is_the_identity():
    logits = np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)
    tokens = np.asarray([[0, 1, 2, 0, 1, 2, 0, 1]] * 2)
    out = P.apply([P.DRY(0.0)], logits, tokens)
    np.testing.assert_array_equal(np.asarray(out), logits)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dry_multiplier=-0.1), "dry_multiplier"),
        (dict(dry_multiplier=1.0, dry_base=0.9), "dry_base"),
        (dict(dry_multiplier=1.0, dry_allowed_length=-1), "dry_allowed_length"),
        (dict(dry_multiplier=1.0, dry_penalty_last_n=-2), "dry_penalty_last_n"),
        (dict(dry_multiplier=1.0, dry_sequence_breakers=["\n"]), "dry_sequence_breakers"),
        (dict(dry_multiplier=1.0, dry_sequence_breakers="\n"), "dry_sequence_breakers"),
        (dict(dry_multiplier=1.0, dry_sequence_breakers=[[]]), "dry_sequence_breakers"),
    ],
)
def test_invalid_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        P.DRY(**kwargs)
