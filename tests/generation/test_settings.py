"""The settings resolver's precedence (written down in `functional_gen.generation.settings`):
the call wins key by key; the model's generation config fills in what the call leaves out."""

import pytest
import transformers

import functional_gen as fg
from functional_gen.generation import resolve_settings
from functional_gen.testing import CountingModel


def model_with(config):
    model = CountingModel(eos_token_id=(31,))
    object.__setattr__(model, "generation_config", config)
    return model


def resolve(model, **kwargs):
    base = dict(
        max_new_tokens=None,
        processors=None,
        sampler=None,
        key=None,
        eos_token_id=None,
        pad_token_id=None,
        stop_strings=None,
        generation_config=None,
    )
    base.update(kwargs)
    return resolve_settings(model, None, 4, **base)


def test_the_model_config_fills_in_what_the_call_leaves_out():
    model = model_with(
        transformers.GenerationConfig(
            max_new_tokens=9, eos_token_id=[30, 31], temperature=0.5, do_sample=True
        )
    )
    import jax

    s = resolve(model, key=jax.random.key(0))
    assert s.max_new_tokens == 9 and s.eos_token_id == (30, 31)
    assert [type(p).__name__ for p in s.step.processors] == ["Temperature"]
    assert isinstance(s.step.sampler, fg.samplers.Multinomial)
    # passing processors keeps the config's lengths and EOS ids, not its decoding
    s = resolve(model, processors=[fg.processors.TopK(3)])
    assert s.max_new_tokens == 9 and s.eos_token_id == (30, 31)
    assert [type(p).__name__ for p in s.step.processors] == ["TopK"]
    assert isinstance(s.step.sampler, fg.samplers.Greedy)
    # the call wins key by key
    s = resolve(model, processors=[], max_new_tokens=3, eos_token_id=5)
    assert s.max_new_tokens == 3 and s.eos_token_id == (5,)


def test_defaults_without_any_config():
    s = resolve(model_with(None))
    assert s.max_new_tokens == fg.generation.DEFAULT_MAX_NEW_TOKENS
    assert s.eos_token_id == (31,) and isinstance(s.step.sampler, fg.samplers.Greedy)


def test_bad_arguments_are_refused_before_compiling():
    model = model_with(None)
    with pytest.raises(ValueError, match="max_new_tokens"):
        resolve(model, max_new_tokens=0)
    with pytest.raises(ValueError, match="num_return_sequences"):
        resolve(model, num_return_sequences=0)
    with pytest.raises(ValueError, match="PRNG key"):
        resolve(model, sampler=fg.samplers.Multinomial())
    with pytest.raises(ValueError, match="max_position_embeddings"):
        resolve(model, max_new_tokens=10_000)
    with pytest.raises(TypeError, match="AbstractCausalLM"):
        resolve_settings(
            object(),
            None,
            4,
            max_new_tokens=2,
            processors=None,
            sampler=None,
            key=None,
            eos_token_id=None,
            pad_token_id=None,
            stop_strings=None,
            generation_config=None,
        )
