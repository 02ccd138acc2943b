"""`TopNSigma` against llama.cpp's documented behaviour (`tests/test-sampling.cpp`,
`test_top_n_sigma`) and the paper's definition."""

import jax
import numpy as np
import pytest

import functional_gen.processors as P


@pytest.mark.parametrize(
    "n, expected",
    [
        (1.0, [0.0, 0.0, 0.428571, 0.571429]),
        (0.0, [0.1, 0.2, 0.3, 0.4]),  # 0 is a no-op (llama.cpp PR #13345)
        (3.0, [0.1, 0.2, 0.3, 0.4]),
    ],
)
def test_llama_cpp_cases(n, expected):
    logits = np.log(np.asarray([[0.1, 0.2, 0.3, 0.4]], np.float32))
    out = P.apply([P.TopNSigma(n)], logits, np.zeros((1, 1), int))
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(out[0])), expected, atol=1e-5)


def test_threshold_is_max_minus_n_sigma_over_finite_logits():
    logits = np.asarray([[4.0, 3.0, 1.0, -1.0, -np.inf, -np.inf]], np.float32)
    finite = logits[0, :4]
    threshold = finite.max() - 0.5 * finite.std()  # population std, -inf left out
    out = np.asarray(P.apply([P.TopNSigma(0.5)], logits, np.zeros((1, 1), int))[0])
    np.testing.assert_array_equal(np.isfinite(out), np.r_[finite >= threshold, [False, False]])
    np.testing.assert_array_equal(out[np.isfinite(out)], finite[finite >= threshold])


def test_invariant_to_temperature():
    logits = np.random.default_rng(0).normal(size=(3, 50)).astype(np.float32)
    ids = np.zeros((3, 1), int)
    plain = np.asarray(P.apply([P.TopNSigma(1.5)], logits, ids))
    hot = np.asarray(P.apply([P.Temperature(2.0), P.TopNSigma(1.5)], logits, ids))
    np.testing.assert_array_equal(np.isfinite(plain), np.isfinite(hot))
