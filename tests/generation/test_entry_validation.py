"""Bad call options are refused by name where they enter, before anything compiles (issue 43,
items 1 and 2, for `generate`'s options)."""

import logging

import jax
import pytest

import functional_gen as fg
from functional_gen.testing import CountingModel

from ..helpers import tiny_tokenizer

VOCAB = 32


@pytest.fixture
def call(caplog):
    """`call(**kwargs)`: `fg.generate` on a tiny model; asserts that nothing was compiled
    (`strict=False`: that the generation program was not; the prompts' arrays may be built)."""
    model, tok = CountingModel(vocab_size=VOCAB), tiny_tokenizer(VOCAB)

    def run(prompts=("1 2", "3"), strict=True, **kwargs):
        kwargs.setdefault("max_new_tokens", 2)
        with jax.log_compiles(), caplog.at_level(logging.WARNING):
            caplog.clear()
            try:
                return fg.generate(model, tok, list(prompts), **kwargs)
            finally:
                words = "Compiling" if strict else "_generate_jit"
                compiled = [r.getMessage() for r in caplog.records if words in r.getMessage()]
                assert compiled == [], "the call compiled before refusing"

    return run


KEYS = [3, "seed", jax.random.split(jax.random.key(0), 2), jax.random.key_data(jax.random.key(0))]


@pytest.mark.parametrize("key", KEYS)
def test_a_key_that_is_not_one_typed_key_is_refused(call, key):
    # (under the tests' runtime type checker the annotation refuses it first, also by name)
    with pytest.raises((TypeError, ValueError), match="key"):
        call(sampler=fg.samplers.Multinomial(), key=key)


@pytest.mark.parametrize(
    "key, error, words",
    [
        (3, TypeError, "`key` must be one typed JAX PRNG key.*int 3"),
        ("seed", TypeError, "`key` must be one typed JAX PRNG key"),
        (KEYS[2], ValueError, r"`key` must be a single PRNG key.*shape \(2,\)"),
        (KEYS[3], TypeError, "`key` must be one typed JAX PRNG key.*uint32"),
    ],
)
def test_the_key_check_says_what_is_expected(key, error, words):
    with pytest.raises(error, match=words):
        fg.generation.settings.check_prng_key(key)
    fg.generation.settings.check_prng_key(jax.random.key(0))  # one typed key passes


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(eos_token_id=VOCAB), ValueError, r"`eos_token_id`=32 is outside.*\[0, 32\)"),
        (dict(eos_token_id=[3, -1]), ValueError, "`eos_token_id`"),
        (dict(pad_token_id=40), ValueError, "`pad_token_id`=40 is outside"),
        (dict(eos_token_id="</s>"), TypeError, "eos_token_id"),
        (dict(pad_token_id="<pad>"), TypeError, "pad_token_id"),
    ],
)
def test_eos_and_pad_ids_outside_the_vocabulary_or_as_text_are_refused(call, kwargs, error, words):
    with pytest.raises(error, match=words):
        call(**kwargs)


def test_the_checks_name_the_option_in_their_own_words():
    check = fg.generation.settings.check_token_id_option
    with pytest.raises(TypeError, match=r"`eos_token_id` must be token ids.*'</s>'"):
        check("eos_token_id", "</s>", VOCAB)
    with pytest.raises(TypeError, match="`pad_token_id` must be a token id"):
        check("pad_token_id", 1.0, VOCAB)
    check("eos_token_id", (0, VOCAB - 1), VOCAB)  # the ends of the vocabulary are ids


@pytest.mark.parametrize(
    "negative_prompt, words",
    [
        ("", "`negative_prompt` is empty"),
        ([], "`negative_prompt` is empty"),
        (["1", "2", "3"], "`negative_prompt` has 3 rows for 2 prompts"),
    ],
)
def test_a_negative_prompt_that_is_empty_or_of_another_batch_size_is_refused(
    call, negative_prompt, words
):
    with pytest.raises(ValueError, match=words):
        call(guidance_scale=1.5, negative_prompt=negative_prompt)


def test_one_negative_prompt_per_prompt_guides_each_row():
    model, tok = CountingModel(vocab_size=VOCAB), tiny_tokenizer(VOCAB)
    result = fg.generate(
        model, tok, ["1 2", "3"], max_new_tokens=2, guidance_scale=1.5, negative_prompt=["4", "5"]
    )
    assert len(result.texts) == 2
    (cfg,) = result.state.settings.step.processors
    assert cfg.negative_prompt_ids.shape[0] == 2  # one negative prompt per row


@pytest.mark.parametrize("penalty", [float("nan"), float("inf"), -float("inf")])
def test_a_length_penalty_that_is_not_finite_is_refused(penalty):
    with pytest.raises(ValueError, match="`length_penalty` must be a finite number"):
        fg.samplers.BeamSearch(2, length_penalty=penalty)
