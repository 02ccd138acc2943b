"""`fg.GenerationOptions`: one frozen value for every per-call choice; keywords win over it, it
wins over the generation config (the precedence in `functional_gen.generation.settings`)."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import functional_gen as fg
from functional_gen.generation import resolve_settings
from functional_gen.generation.sampling import Sample
from functional_gen.generation.search import AbstractSearch
from functional_gen.testing import CountingModel

from ..helpers import tiny_tokenizer


def model_with(config):
    model = CountingModel(eos_token_id=(31,))
    object.__setattr__(model, "generation_config", config)
    return model


def test_options_and_keywords_give_identical_results():
    model = CountingModel(vocab_size=32, eos_token_id=(31,))
    tok = tiny_tokenizer(32)
    prompts = ["3 4", "7"]
    choice = dict(max_new_tokens=6, temperature=20.0, top_k=5, top_logprobs=2)
    key = jax.random.key(4)
    by_keywords = fg.generate(model, tok, prompts, key=key, **choice)
    by_options = fg.generate(model, tok, prompts, fg.GenerationOptions(**choice), key=key)
    np.testing.assert_array_equal(by_keywords.token_ids, by_options.token_ids)
    np.testing.assert_array_equal(by_keywords.logprobs, by_options.logprobs)
    np.testing.assert_array_equal(by_keywords.top_token_ids, by_options.top_token_ids)
    assert by_keywords.texts == by_options.texts
    # a temperature of 20 over logits +-10 with top_k=5 does leave the counting path somewhere
    counting = fg.generate(model, tok, prompts, max_new_tokens=6)
    assert not np.array_equal(by_options.token_ids, counting.token_ids)


def test_a_keyword_wins_over_the_options_and_the_options_over_the_config():
    config = transformers.GenerationConfig(
        max_new_tokens=9, eos_token_id=[30, 31], temperature=0.5, do_sample=True
    )
    model = model_with(config)
    key = jax.random.key(0)
    options = fg.GenerationOptions(max_new_tokens=4, eos_token_id=[5], temperature=0.9)
    s = resolve_settings(model, None, 4, options, key=key)
    assert s.max_new_tokens == 4 and s.eos_token_id == (5,)
    (temperature,) = s.step.processors
    assert float(temperature.temperature) == pytest.approx(0.9)  # not the config's 0.5
    assert isinstance(s.step.sampler, fg.samplers.Multinomial)
    s = resolve_settings(model, None, 4, options, key=key, max_new_tokens=2, temperature=0.7)
    assert s.max_new_tokens == 2 and s.eos_token_id == (5,)
    assert float(s.step.processors[0].temperature) == pytest.approx(0.7)
    # a keyword given as None leaves the options' field as it is
    s = resolve_settings(model, None, 4, options, key=key, max_new_tokens=None)
    assert s.max_new_tokens == 4
    # what neither sets comes from the config: its length
    s = resolve_settings(model, None, 4, fg.GenerationOptions(top_k=3), key=key)
    assert s.max_new_tokens == 9 and s.eos_token_id == (30, 31)
    assert [type(p).__name__ for p in s.step.processors] == ["Temperature", "TopK"]
    # decoding options run before the call's own processors, as an explicit config's do
    s = resolve_settings(
        model, None, 4, fg.GenerationOptions(top_k=3), processors=[fg.processors.TopP(0.9)], key=key
    )
    assert [type(p).__name__ for p in s.step.processors] == ["Temperature", "TopK", "TopP"]


def test_a_sampling_field_samples_and_num_beams_searches():
    model = model_with(None)
    s = resolve_settings(model, None, 4, fg.GenerationOptions(top_p=0.8), key=jax.random.key(0))
    assert isinstance(s.step.sampler, fg.samplers.Multinomial)
    with pytest.raises(ValueError, match="PRNG key"):
        resolve_settings(model, None, 4, fg.GenerationOptions(top_p=0.8))
    s = resolve_settings(model, None, 4, fg.GenerationOptions(top_p=0.8, do_sample=False))
    assert isinstance(s.step.sampler, fg.samplers.Greedy) and s.step.processors == ()
    s = resolve_settings(model, None, 4, num_beams=3, length_penalty=0.5)
    assert isinstance(s.step.search, fg.samplers.BeamSearch) and s.step.search.num_beams == 3
    assert float(s.step.search.length_penalty) == 0.5


def test_options_are_frozen_hashable_and_replaceable():
    a = fg.GenerationOptions(max_new_tokens=64, temperature=0.7, stop_strings=["\n\n"])
    b = fg.GenerationOptions(max_new_tokens=64, temperature=0.7, stop_strings=("\n\n",))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.temperature = 1.0
    c = dataclasses.replace(a, temperature=0.2)
    assert c.temperature == 0.2 and c.stop_strings == ("\n\n",) and a.temperature == 0.7
    assert a.replace(temperature=0.2) == c and hash(c) != hash(a)
    with pytest.raises(TypeError, match="'temprature'"):
        a.replace(temprature=0.2)
    # a dict generation config keeps the options hashable (by value)
    d = fg.GenerationOptions(generation_config={"top_k": 4, "do_sample": True})
    assert hash(d) == hash(fg.GenerationOptions(generation_config={"do_sample": True, "top_k": 4}))


def test_unknown_keywords_and_bad_options_are_refused_by_name():
    model, tok = CountingModel(), tiny_tokenizer(32)
    with pytest.raises(TypeError, match="'max_tokens'"):
        fg.generate(model, tok, "1 2", max_tokens=3)
    with pytest.raises(TypeError, match="'max_tokens'"):
        fg.stream(model, tok, "1 2", max_tokens=3)
    with pytest.raises(TypeError, match="GenerationOptions"):
        fg.generate(model, tok, "1 2", {"max_new_tokens": 3})


def test_a_sampler_becomes_the_sample_search_and_beam_search_is_a_search():
    model = CountingModel()
    step = fg.make_step(model, (), fg.samplers.Multinomial())
    assert isinstance(step.search, Sample) and isinstance(step.sampler, fg.samplers.Multinomial)
    beams = fg.samplers.BeamSearch(2)
    step = fg.make_step(model, (), beams)
    assert step.search is beams and isinstance(beams, AbstractSearch)
    assert not isinstance(beams, fg.samplers.AbstractSampler)

    class NoKey(fg.samplers.AbstractSampler):
        def __call__(self, logits, *, key):
            return jnp.argmax(logits)

    with pytest.raises(TypeError, match="needs_key"):
        NoKey()

    class Fixed(fg.samplers.AbstractSampler):
        needs_key: bool = eqx.field(static=True, default=False)

        def __call__(self, logits, *, key):
            return jnp.asarray(3, jnp.int32)

    result = fg.generate(
        model,
        None,
        fg.SequenceState.from_token_ids([[1]], vocab_size=32),
        max_new_tokens=3,
        sampler=Fixed(),
    )
    assert result.token_ids.tolist() == [[3, 3, 3]]
