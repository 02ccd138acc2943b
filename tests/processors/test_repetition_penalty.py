"""`RepetitionPenalty`'s llama.cpp-style window (`penalty_last_n`), hand-computed; the unwindowed
processor is compared with transformers in `test_transformers_parity.py`."""

import numpy as np
import pytest

import functional_gen.processors as P

TOKENS = [0, 1, 2, 3, 3]  # prompt [0, 1], generated [2, 3, 3]
LOGITS = np.asarray([[2.0, -2.0, 4.0, 1.0, 1.0, -1.0]], np.float32)


def run(processor):
    out = P.apply([processor], LOGITS, np.asarray([TOKENS]), prompt_length=2)
    return np.asarray(out[0])


def test_whole_sequence_by_default():
    # positive logits divided by 2, negative ones multiplied, for tokens 0..3 (prompt included)
    np.testing.assert_allclose(run(P.RepetitionPenalty(2.0)), [1.0, -4.0, 2.0, 0.5, 1.0, -1.0])


@pytest.mark.parametrize(
    "last_n, expected",
    [
        (1, [2.0, -2.0, 4.0, 0.5, 1.0, -1.0]),  # only the last token (3)
        (3, [2.0, -2.0, 2.0, 0.5, 1.0, -1.0]),  # 2, 3, 3
        (4, [2.0, -4.0, 2.0, 0.5, 1.0, -1.0]),  # 1, 2, 3, 3: the window reaches into the prompt
        (50, [1.0, -4.0, 2.0, 0.5, 1.0, -1.0]),  # longer than the sequence = all of it
        (0, LOGITS[0].tolist()),  # off
    ],
)
def test_penalty_last_n_window(last_n, expected):
    np.testing.assert_allclose(run(P.RepetitionPenalty(2.0, penalty_last_n=last_n)), expected)


def test_generation_config_penalty_last_n_is_the_window():
    from transformers import GenerationConfig

    from functional_gen.generation_config import settings_from_generation_config

    gc = GenerationConfig(repetition_penalty=2.0)
    gc.penalty_last_n = 3  # as read from a GGUF's general.sampling.penalty_last_n
    (processor,) = settings_from_generation_config(gc, eos_token_id=(5,), vocab_size=6).processors
    np.testing.assert_allclose(run(processor), [2.0, -2.0, 2.0, 0.5, 1.0, -1.0])
