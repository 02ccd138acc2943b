"""Parity with transformers' PyTorch logits processors on random logits and random sequences.

Every processor that transformers also has is run through `functional_gen.processors.apply`
(batch > 1, several seeds) and compared with transformers' processor on the same inputs:
identical `-inf` masks, finite values equal to 1e-5.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from transformers.generation import logits_process as tlp  # noqa: E402

import functional_gen.processors as P  # noqa: E402

SEEDS = (0, 1, 2)
BATCH = 4
VOCAB = 300
SEQ = 24
EOS = (VOCAB - 1, VOCAB - 2)


def random_inputs(seed, *, scale=3.0, seq=SEQ, id_range=VOCAB):
    """Random logits (several scales, so filters keep few or many tokens) and token ids drawn
    from a small range, so that repetitions and n-grams occur."""
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(BATCH, VOCAB)) * scale).astype(np.float32)
    token_ids = rng.integers(0, id_range, size=(BATCH, seq)).astype(np.int64)
    return logits, token_ids


def reference(processor, logits, token_ids):
    with torch.no_grad():
        out = processor(torch.tensor(token_ids), torch.tensor(logits).clone())
    return out.numpy()


def ours(processors, logits, token_ids, **kwargs):
    return np.asarray(P.apply(processors, logits, token_ids, **kwargs))


def assert_same(actual, expected):
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected), "-inf masks differ")
    np.testing.assert_array_equal(np.isposinf(actual), np.isposinf(expected))
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5, atol=1e-5)


def check(ours_processors, their_processor, seed, *, scale=3.0, seq=SEQ, id_range=VOCAB, **kwargs):
    logits, token_ids = random_inputs(seed, scale=scale, seq=seq, id_range=id_range)
    expected = reference(their_processor, logits, token_ids)
    actual = ours(ours_processors, logits, token_ids, **kwargs)
    assert_same(actual, expected)
    return actual, expected


# --- sampling filters -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature(seed, temperature):
    check([P.Temperature(temperature)], tlp.TemperatureLogitsWarper(temperature), seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("top_k, min_keep", [(1, 1), (10, 1), (10, 25), (VOCAB + 5, 1)])
def test_top_k(seed, top_k, min_keep):
    check(
        [P.TopK(top_k, min_tokens_to_keep=min_keep)],
        tlp.TopKLogitsWarper(top_k, min_tokens_to_keep=min_keep),
        seed,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [1.0, 3.0, 10.0])  # many tokens (full sort) ... few (top-k path)
@pytest.mark.parametrize("top_p, min_keep", [(0.05, 1), (0.5, 1), (0.9, 1), (0.9, 40), (1.0, 1)])
def test_top_p(seed, scale, top_p, min_keep):
    check(
        [P.TopP(top_p, min_tokens_to_keep=min_keep)],
        tlp.TopPLogitsWarper(top_p, min_tokens_to_keep=min_keep),
        seed,
        scale=scale,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("top_p", [0.5, 0.95, 1.0])
def test_top_p_after_top_k(seed, top_p):
    # After TopK every candidate outside the top 256 is -inf: the top-k path decides alone.
    logits, token_ids = random_inputs(seed, scale=1.0)
    expected = reference(
        tlp.LogitsProcessorList([tlp.TopKLogitsWarper(50), tlp.TopPLogitsWarper(top_p)]),
        logits,
        token_ids,
    )
    assert_same(ours([P.TopK(50), P.TopP(top_p)], logits, token_ids), expected)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("min_p, min_keep", [(0.0, 1), (0.05, 1), (0.3, 1), (0.3, 7), (1.0, 1)])
def test_min_p(seed, min_p, min_keep):
    check([P.MinP(min_p, min_keep)], tlp.MinPLogitsWarper(min_p, min_tokens_to_keep=min_keep), seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [1.0, 3.0])
@pytest.mark.parametrize("typical_p, min_keep", [(0.2, 1), (0.5, 1), (0.9, 1), (0.5, 30)])
def test_typical_p(seed, scale, typical_p, min_keep):
    check(
        [P.TypicalP(typical_p, min_keep)],
        tlp.TypicalLogitsWarper(typical_p, min_tokens_to_keep=min_keep),
        seed,
        scale=scale,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("epsilon, min_keep", [(3e-4, 1), (3e-3, 1), (0.05, 1), (0.5, 3)])
def test_epsilon_cutoff(seed, epsilon, min_keep):
    check(
        [P.EpsilonCutoff(epsilon, min_keep)],
        tlp.EpsilonLogitsWarper(epsilon, min_tokens_to_keep=min_keep),
        seed,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [1.0, 3.0])
@pytest.mark.parametrize("eta, min_keep", [(3e-4, 1), (4e-3, 1), (0.2, 1), (0.9, 5)])
def test_eta_cutoff(seed, scale, eta, min_keep):
    check(
        [P.EtaCutoff(eta, min_keep)],
        tlp.EtaLogitsWarper(eta, min_tokens_to_keep=min_keep),
        seed,
        scale=scale,
    )


# --- penalties --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("penalty", [0.7, 1.0, 1.3])
def test_repetition_penalty(seed, penalty):
    check(
        [P.RepetitionPenalty(penalty)],
        tlp.RepetitionPenaltyLogitsProcessor(penalty),
        seed,
        id_range=40,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_repeat_ngram(seed, n):
    # Token ids from a range of 4, so that n-grams repeat and some tokens get banned.
    actual, _ = check([P.NoRepeatNGram(n)], tlp.NoRepeatNGramLogitsProcessor(n), seed, id_range=4)
    if n <= 3:
        assert np.isneginf(actual).any()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("seq", [1, 2, 3])
def test_no_repeat_ngram_short_sequences(seed, seq):
    check([P.NoRepeatNGram(3)], tlp.NoRepeatNGramLogitsProcessor(3), seed, seq=seq, id_range=2)


# --- token rules and biases -------------------------------------------------------------------


def suffix_sequences(token_ids, seed):
    """Sequences that end some rows' suffixes (so they match) plus random ones (that mostly don't)."""
    rng = np.random.default_rng(seed + 100)
    sequences = {(int(token_ids[0, -1]), 7), (int(token_ids[1, -2]), int(token_ids[1, -1]), 9)}
    sequences |= {(int(token_ids[2, -1]), 7)}  # shares its last token 7 with the first one
    sequences |= {tuple(int(t) for t in rng.integers(0, 20, size=n)) for n in (1, 2, 3)}
    sequences |= {(5,), (11,), (EOS[0],)}
    return sorted(sequences)


@pytest.mark.parametrize("seed", SEEDS)
def test_bad_words(seed):
    logits, token_ids = random_inputs(seed, id_range=20)
    bad_words = [list(s) for s in suffix_sequences(token_ids, seed)]
    expected = reference(
        tlp.NoBadWordsLogitsProcessor(bad_words, eos_token_id=list(EOS)), logits, token_ids
    )
    actual = ours([P.BadWords(bad_words, eos_token_id=EOS)], logits, token_ids)
    assert_same(actual, expected)
    assert np.isneginf(actual[:, 7]).any() and not np.isneginf(actual[:, EOS[0]]).any()


@pytest.mark.parametrize("seed", SEEDS)
def test_sequence_bias(seed):
    logits, token_ids = random_inputs(seed, id_range=20)
    rng = np.random.default_rng(seed)
    sequence_bias = [[list(s), float(rng.normal() * 3)] for s in suffix_sequences(token_ids, seed)]
    expected = reference(tlp.SequenceBiasLogitsProcessor(sequence_bias), logits, token_ids)
    actual = ours([P.SequenceBias(sequence_bias)], logits, token_ids)
    assert_same(actual, expected)
    assert not np.allclose(actual, logits)


@pytest.mark.parametrize("seed", SEEDS)
def test_suppress_tokens(seed):
    tokens = [0, 3, 17, VOCAB - 1]
    check([P.SuppressTokens(tokens)], tlp.SuppressTokensLogitsProcessor(tokens), seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("prompt_length", [SEQ, SEQ - 1, SEQ - 2])
@pytest.mark.parametrize("begin_index", [0, 1])
def test_suppress_tokens_at_begin(seed, prompt_length, begin_index):
    tokens = [1, 4, 9]
    check(
        [P.SuppressTokensAtBegin(tokens, begin_index=begin_index)],
        tlp.SuppressTokensAtBeginLogitsProcessor(tokens, begin_index=prompt_length + begin_index),
        seed,
        prompt_length=prompt_length,
    )


# --- length control ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("prompt_length", [SEQ, SEQ - 3, SEQ - 5, SEQ - 9])
def test_min_new_tokens(seed, prompt_length):
    check(
        [P.MinNewTokens(5, EOS)],
        tlp.MinNewTokensLengthLogitsProcessor(prompt_length, 5, list(EOS)),
        seed,
        prompt_length=prompt_length,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("min_length", [0, SEQ - 1, SEQ, SEQ + 1, SEQ + 10])
def test_min_length(seed, min_length):
    check([P.MinLength(min_length, EOS)], tlp.MinLengthLogitsProcessor(min_length, list(EOS)), seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("seq, prompt_length", [(1, 1), (2, 1), (3, 2)])
def test_forced_bos(seed, seq, prompt_length):
    # transformers forces at length 1 (the decoder start token of an encoder-decoder model):
    # the first generated token in both conventions.
    check(
        [P.ForcedBOS(7)],
        tlp.ForcedBOSTokenLogitsProcessor(7),
        seed,
        seq=seq,
        prompt_length=prompt_length,
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("max_new_tokens", [SEQ - 10, 4, 5, 6])  # 4 generated: 5 is the last step
def test_forced_eos(seed, max_new_tokens):
    prompt_length = SEQ - 4
    actual, _ = check(
        [P.ForcedEOS(EOS)],
        tlp.ForcedEOSTokenLogitsProcessor(prompt_length + max_new_tokens, list(EOS)),
        seed,
        prompt_length=prompt_length,
        max_new_tokens=max_new_tokens,
    )
    forced = max_new_tokens == 5
    assert np.isneginf(actual).all(axis=1).sum() == 0
    assert (np.isneginf(actual).sum(axis=1) == VOCAB - 2).all() == forced


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("start_index, factor", [(0, 1.5), (3, 1.1), (10, 2.0), (2, 0.8)])
@pytest.mark.parametrize("prompt_length", [SEQ - 1, SEQ - 8])
def test_exponential_decay_length_penalty(seed, start_index, factor, prompt_length):
    logits, token_ids = random_inputs(seed)
    logits[0, EOS[1]] = -np.inf  # a masked EOS stays masked
    expected = reference(
        tlp.ExponentialDecayLengthPenalty((start_index, factor), list(EOS), prompt_length),
        logits,
        token_ids,
    )
    actual = ours(
        [P.ExponentialDecayLengthPenalty((start_index, factor), EOS)],
        logits,
        token_ids,
        prompt_length=prompt_length,
    )
    assert_same(actual, expected)


# --- numerics ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_remove_invalid_values(seed):
    logits, token_ids = random_inputs(seed)
    logits[0, :3] = [np.nan, np.inf, -np.inf]
    logits[2, 5:7] = [-np.inf, np.nan]
    expected = reference(tlp.InfNanRemoveLogitsProcessor(), logits, token_ids)
    actual = ours([P.RemoveInvalidValues()], logits, token_ids)
    assert np.isfinite(actual).all()
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_log_softmax(seed):
    logits, token_ids = random_inputs(seed)
    logits[1, :10] = -np.inf
    expected = reference(tlp.LogitNormalization(), logits, token_ids)
    assert_same(ours([P.LogSoftmax()], logits, token_ids), expected)


# --- a whole chain ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_chain(seed):
    logits, token_ids = random_inputs(seed, id_range=6)
    theirs = tlp.LogitsProcessorList(
        [
            tlp.RepetitionPenaltyLogitsProcessor(1.2),
            tlp.NoRepeatNGramLogitsProcessor(3),
            tlp.MinLengthLogitsProcessor(SEQ + 2, list(EOS)),
            tlp.TemperatureLogitsWarper(0.7),
            tlp.TopKLogitsWarper(40),
            tlp.TopPLogitsWarper(0.9),
            tlp.MinPLogitsWarper(0.02),
            tlp.LogitNormalization(),
        ]
    )
    chain = [
        P.RepetitionPenalty(1.2),
        P.NoRepeatNGram(3),
        P.MinLength(SEQ + 2, EOS),
        P.Temperature(0.7),
        P.TopK(40),
        P.TopP(0.9),
        P.MinP(0.02),
        P.LogSoftmax(),
    ]
    assert_same(ours(chain, logits, token_ids), reference(theirs, logits, token_ids))
