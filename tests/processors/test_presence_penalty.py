"""`PresencePenalty` (OpenAI / vLLM semantics, generated tokens only), hand-computed."""

import numpy as np
import pytest

import functional_gen.processors as P

PROMPT = [4, 4, 4]  # never penalised
GENERATED = [0, 1, 2, 0, 0]  # counts: 0 -> 3, 1 -> 1, 2 -> 1


def run(processors):
    logits = np.zeros((1, 5), np.float32)
    out = P.apply(processors, logits, np.asarray([PROMPT + GENERATED]), prompt_length=len(PROMPT))
    return np.asarray(out[0])


def test_presence_penalty_subtracts_once_per_generated_token():
    np.testing.assert_allclose(run([P.PresencePenalty(1.5)]), [-1.5, -1.5, -1.5, 0.0, 0.0])


def test_negative_values_encourage_repetition():
    np.testing.assert_allclose(run([P.PresencePenalty(-1.0)]), [1.0, 1.0, 1.0, 0.0, 0.0])


def test_prompt_tokens_do_not_count():
    logits = np.zeros((1, 5), np.float32)
    out = P.apply([P.PresencePenalty(1.0)], logits, np.asarray([PROMPT]), prompt_length=3)
    np.testing.assert_array_equal(np.asarray(out), logits)


def test_range():
    P.PresencePenalty(2.0), P.PresencePenalty(-2.0)
    with pytest.raises(ValueError, match="presence_penalty"):
        P.PresencePenalty(2.01)
