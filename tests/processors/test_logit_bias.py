"""`LogitBias` (OpenAI / vLLM `logit_bias`), hand-computed."""

import numpy as np
import pytest

import functional_gen.processors as P


def test_adds_bias_to_listed_tokens_at_every_step():
    logits = np.arange(12, dtype=np.float32).reshape(2, 6)
    out = np.asarray(P.apply([P.LogitBias({1: 2.5, "4": -100.0})], logits, np.zeros((2, 3), int)))
    expected = logits.copy()
    expected[:, 1] += 2.5
    expected[:, 4] -= 100.0
    np.testing.assert_array_equal(out, expected)


def test_out_of_vocabulary_ids_raise_when_first_run():
    processor = P.LogitBias({10: 1.0})
    with pytest.raises(ValueError, match="logit_bias"):
        P.apply([processor], np.zeros((1, 6), np.float32), np.zeros((1, 1), int))


@pytest.mark.parametrize(
    "bad", [{1: 101.0}, {1: float("nan")}, {-2: 1.0}, {1.5: 1.0}, {"x": 1.0}, [1, 2]]
)
def test_invalid(bad):
    with pytest.raises(ValueError, match="logit_bias"):
        P.LogitBias(bad)
