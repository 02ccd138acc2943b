"""`FrequencyPenalty` (OpenAI / vLLM semantics, generated tokens only), hand-computed."""

import jax
import numpy as np
import pytest

import functional_gen.processors as P

PROMPT = [4, 4, 4]  # never penalised
GENERATED = [0, 1, 2, 0, 0]  # counts: 0 -> 3, 1 -> 1, 2 -> 1


def run(processors):
    logits = np.zeros((1, 5), np.float32)
    out = P.apply(processors, logits, np.asarray([PROMPT + GENERATED]), prompt_length=len(PROMPT))
    return np.asarray(out[0])


def test_frequency_penalty_subtracts_per_occurrence():
    np.testing.assert_allclose(run([P.FrequencyPenalty(0.5)]), [-1.5, -0.5, -0.5, 0.0, 0.0])


def test_together_they_give_openais_formula():
    # logits -= presence * (count > 0) + frequency * count; llama.cpp's test_penalties with a
    # uniform distribution: softmax of the penalised logits.
    out = run([P.PresencePenalty(1.5), P.FrequencyPenalty(0.5)])
    np.testing.assert_allclose(out, [-3.0, -2.0, -2.0, 0.0, 0.0])
    expected = np.exp([-3.0, -2.0, -2.0, 0.0, 0.0])
    np.testing.assert_allclose(
        np.asarray(jax.nn.softmax(out)), expected / expected.sum(), rtol=1e-6
    )


def test_prompt_tokens_do_not_count():
    logits = np.zeros((1, 5), np.float32)
    out = P.apply([P.FrequencyPenalty(1.0)], logits, np.asarray([PROMPT]), prompt_length=3)
    np.testing.assert_array_equal(np.asarray(out), logits)


@pytest.mark.parametrize(
    "cls, name",
    [(P.PresencePenalty, "presence_penalty"), (P.FrequencyPenalty, "frequency_penalty")],
)
def test_range(cls, name):
    cls(2.0), cls(-2.0)
    for outside in (2.01, -2.01):
        with pytest.raises(ValueError, match=name):
            cls(outside)
