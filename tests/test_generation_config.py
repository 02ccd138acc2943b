"""GenerationConfig interop: the same processors, in the same order, as transformers builds."""

import copy
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen import processors as P
from functional_gen.generation_config import load_generation_config, settings_from_generation_config
from functional_gen.testing import CountingModel

from .helpers import tiny_tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, EOS, PROMPT, NEW = 101, (100, 7), 6, 9

# transformers class -> ours
HF_TO_OURS = {
    "SequenceBiasLogitsProcessor": "SequenceBias",
    "RepetitionPenaltyLogitsProcessor": "RepetitionPenalty",
    "NoRepeatNGramLogitsProcessor": "NoRepeatNGram",
    "NoBadWordsLogitsProcessor": "BadWords",
    "MinLengthLogitsProcessor": "MinLength",
    "MinNewTokensLengthLogitsProcessor": "MinNewTokens",
    "ForcedBOSTokenLogitsProcessor": "ForcedBOS",
    "ForcedEOSTokenLogitsProcessor": "ForcedEOS",
    "InfNanRemoveLogitsProcessor": "RemoveInvalidValues",
    "ExponentialDecayLengthPenalty": "ExponentialDecayLengthPenalty",
    "SuppressTokensLogitsProcessor": "SuppressTokens",
    "SuppressTokensAtBeginLogitsProcessor": "SuppressTokensAtBegin",
    "TemperatureLogitsWarper": "Temperature",
    "TopKLogitsWarper": "TopK",
    "TopPLogitsWarper": "TopP",
    "MinPLogitsWarper": "MinP",
    "TypicalLogitsWarper": "TypicalP",
    "EpsilonLogitsWarper": "EpsilonCutoff",
    "EtaLogitsWarper": "EtaCutoff",
    "LogitNormalization": "LogSoftmax",
}

CONFIGS = {
    "greedy-with-penalties": dict(
        repetition_penalty=1.3,
        no_repeat_ngram_size=2,
        bad_words_ids=[[11, 12], [13]],
        sequence_bias={(3, 4): 2.0, (5,): -1.5},
        min_new_tokens=3,
        suppress_tokens=[20, 21],
    ),
    "sampling-filters": dict(
        do_sample=True,
        temperature=0.7,
        top_k=30,
        top_p=0.9,
        min_p=0.02,
        typical_p=0.95,
        epsilon_cutoff=3e-4,
        eta_cutoff=3e-4,
        renormalize_logits=True,
    ),
    "length-control": dict(
        min_length=PROMPT + 4,
        forced_eos_token_id=100,
        exponential_decay_length_penalty=(2, 1.5),
        remove_invalid_values=True,
        begin_suppress_tokens=[30, 31],
        do_sample=True,
        temperature=1.3,
    ),
}


def hf_processors(config: dict):
    """transformers' own processor list for a decoder-only model and this config."""
    hf_model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    gc = transformers.GenerationConfig(eos_token_id=list(EOS), max_length=PROMPT + NEW, **config)
    gc._eos_token_tensor = torch.tensor(list(EOS))
    return hf_model._get_logits_processor(
        generation_config=gc, input_ids_seq_length=PROMPT, device="cpu", model_kwargs={}
    )


@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_processors_in_the_same_order_and_the_same_logits(name):
    config = CONFIGS[name]
    hf = hf_processors(config)
    ours = settings_from_generation_config(
        transformers.GenerationConfig(eos_token_id=list(EOS), **config),
        eos_token_id=EOS,
        vocab_size=VOCAB,
    )
    assert [type(p).__name__ for p in ours.processors] == [HF_TO_OURS[type(p).__name__] for p in hf]
    assert type(ours.sampler).__name__ == ("Multinomial" if config.get("do_sample") else "Greedy")
    rng = np.random.default_rng(0)
    for generated in (0, 1, 4, NEW - 1):  # include the step where ForcedEOS fires
        ids = rng.integers(0, VOCAB, (3, PROMPT + generated))
        ids[:, -2:] = [3, 11]  # so that a biased / banned sequence is in play
        logits = rng.normal(size=(3, VOCAB)).astype(np.float32) * 3
        expected = hf(torch.tensor(ids), torch.tensor(logits)).numpy()
        got = np.asarray(
            P.apply(
                ours.processors,
                jnp.asarray(logits),
                jnp.asarray(ids),
                prompt_length=PROMPT,
                max_new_tokens=NEW,
            )
        )
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
        finite = np.isfinite(expected)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5), "'group_beam_search'"),
        (dict(penalty_alpha=0.6, top_k=4), r"mode 'contrastive_search' \(penalty_alpha=0.6\)"),
        (dict(assistant_early_exit=4), r"mode 'assisted_generation' \(assistant_early_exit=4\)"),
        (dict(prompt_lookup_num_tokens=3), "'assisted_generation'"),
        (dict(dola_layers="high"), "'dola_generation'"),
        (dict(force_words_ids=[[5]]), "'constrained_beam_search'"),
        (dict(watermarking_config={"greenlist_ratio": 0.25}), "watermarking_config="),
        (dict(mirostat=1), "mirostat=1"),
        (
            dict(do_sample=True, some_future_setting=3),
            r"unknown setting\(s\) some_future_setting=3",
        ),
    ],
)
def test_unsupported_decoding_methods_are_named(config, message):
    from transformers import GenerationConfig

    expected_mode = GenerationConfig(**config).get_generation_mode().value
    with pytest.raises(ValueError, match=message) as info:
        settings_from_generation_config(config, eos_token_id=EOS, vocab_size=VOCAB)
    if expected_mode not in ("greedy_search", "sample"):
        assert repr(expected_mode) in str(info.value)


@pytest.mark.parametrize(
    "config, sampler",
    [
        ({}, "Greedy"),
        (dict(do_sample=True, temperature=0.7), "Multinomial"),
        # beam-only settings are harmless when the mode is greedy or sample, as in transformers
        (
            dict(length_penalty=2.0, early_stopping=True, output_scores=True, use_cache=False),
            "Greedy",
        ),
        (dict(num_beams=4, length_penalty=0.5, early_stopping="never"), "BeamSearch"),
        (dict(num_beams=3, do_sample=True), "BeamSearch"),
    ],
)
def test_greedy_sample_and_beam_modes_are_accepted(config, sampler):
    settings = settings_from_generation_config(config, eos_token_id=EOS, vocab_size=VOCAB)
    assert type(settings.sampler).__name__ == sampler
    if sampler == "BeamSearch":
        beam = settings.sampler
        assert beam.num_beams == config["num_beams"] and beam.do_sample == config.get(
            "do_sample", False
        )
        assert float(beam.length_penalty) == config.get("length_penalty", 1.0)
        assert beam.early_stopping == config.get("early_stopping", False)


def test_guidance_scale_asks_for_classifier_free_guidance():
    assert (
        settings_from_generation_config(
            dict(guidance_scale=1.5), eos_token_id=EOS, vocab_size=VOCAB
        ).guidance_scale
        == 1.5
    )
    # a scale of 1 is no guidance, as in transformers
    assert (
        settings_from_generation_config(
            dict(guidance_scale=1.0), eos_token_id=EOS, vocab_size=VOCAB
        ).guidance_scale
        is None
    )


def test_every_generation_config_attribute_is_classified():
    """Each attribute transformers' GenerationConfig has is used, known-irrelevant or refused, so
    a transformers upgrade that adds one fails here first."""
    from transformers import GenerationConfig

    from functional_gen import generation_config as G

    known = (
        G.USED_GENERATION_KEYS | G.IGNORED_GENERATION_KEYS | G.UNSUPPORTED_GENERATION_KEYS.keys()
    )
    assert sorted(set(GenerationConfig().to_dict()) - known) == []


def test_llama_cpp_sampling_keys_add_xtc_and_mirostat():
    settings = settings_from_generation_config(
        dict(
            do_sample=True,
            temperature=0.8,
            min_p=0.05,
            xtc_probability=0.5,
            xtc_threshold=0.1,
            mirostat=2,
        ),
        eos_token_id=EOS,
        vocab_size=VOCAB,
    )
    assert [type(p).__name__ for p in settings.processors] == [
        "Temperature",
        "MinP",
        "XTC",
        "MirostatV2",
    ]


def test_load_generation_config_from_files_and_dicts(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_p": 0.8}))
    for source in (
        tmp_path,
        tmp_path / "generation_config.json",
        {"do_sample": True, "top_p": 0.8},
    ):
        gc = load_generation_config(source)
        assert gc.do_sample and gc.top_p == 0.8
    with pytest.raises(FileNotFoundError, match="no generation config"):
        load_generation_config(tmp_path / "missing")
    with pytest.raises(TypeError, match="generation_config must be"):
        load_generation_config(3)


def test_generation_config_sets_lengths_and_repeats_rows():
    model = CountingModel()
    from functional_gen.generation import resolve_settings

    settings = resolve_settings(
        model,
        tiny_tokenizer(model.vocab_size),
        5,
        max_new_tokens=None,
        processors=None,
        sampler=None,
        key=jax.random.key(0),
        eos_token_id=None,
        pad_token_id=None,
        stop_strings=None,
        generation_config={
            "max_length": 12,
            "num_return_sequences": 3,
            "do_sample": True,
            "stop_strings": "x",
        },
    )
    assert settings.max_new_tokens == 7 and settings.num_return_sequences == 3
    assert settings.stop_strings == ("x",)
    with pytest.raises(ValueError, match="max_length=5 leaves no room"):
        resolve_settings(
            model,
            None,
            5,
            max_new_tokens=None,
            processors=None,
            sampler=None,
            key=None,
            eos_token_id=None,
            pad_token_id=None,
            stop_strings=None,
            generation_config={"max_length": 5},
        )


@pytest.mark.slow
def test_the_models_own_generation_config_is_the_default(default_model):
    model, tokenizer = default_model
    sampling = transformers.GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=20,
        eos_token_id=list(model.config.eos_token_id),
        max_new_tokens=10,
    )
    sampling_model = copy.copy(model)  # the same weights, another generation_config
    object.__setattr__(sampling_model, "generation_config", sampling)
    with pytest.raises(ValueError, match=r"needs a PRNG key.*do_sample=True"):
        fg.generate(sampling_model, tokenizer, "Once upon a time")
    key = jax.random.key(1)
    by_default = fg.generate(sampling_model, tokenizer, ["Once upon a time"] * 2, key=key)
    explicit = fg.generate(
        model,
        tokenizer,
        ["Once upon a time"] * 2,
        processors=[P.Temperature(0.7), P.TopK(20)],
        sampler=fg.samplers.Multinomial(),
        key=key,
        max_new_tokens=10,
    )
    assert by_default.texts == explicit.texts and by_default.num_tokens[0] <= 10
    # SmolLM2's own generation config does not sample: greedy, like transformers
    assert (
        fg.generate(model, tokenizer, "The capital of France is", max_new_tokens=8).texts
        == fg.generate(
            model,
            tokenizer,
            "The capital of France is",
            max_new_tokens=8,
            sampler=fg.samplers.Greedy(),
        ).texts
    )
