"""Classifier-free guidance in the 2x-batch form (`cfg="batched"`) against transformers'
PyTorch `generate(guidance_scale=..., negative_prompt_ids=...)`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.generation.guidance import GuidedModel, guide

from ..helpers import tiny_hf_model, tiny_tokenizer

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_pair():
    hf = tiny_hf_model("llama", seed=2, std=0.15)
    model = fg.LlamaForCausalLM.from_weights(
        fg.LlamaConfig.from_hf(hf.config), {k: v.numpy() for k, v in hf.state_dict().items()}
    )
    return hf, model, tiny_tokenizer(101)


def hf_cfg(hf, prompt, n, scale, negative=None):
    ids = torch.as_tensor([prompt])
    kwargs = {}
    if negative is not None:
        kwargs = dict(
            negative_prompt_ids=torch.as_tensor([negative]),
            negative_prompt_attention_mask=torch.ones(1, len(negative), dtype=torch.long),
        )
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            guidance_scale=scale,
            eos_token_id=None,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    return out.sequences[0, len(prompt) :].tolist(), torch.stack(out.scores)[:, 0].numpy()


@pytest.mark.parametrize("scale", [0.0, 1.5, 3.0])
@pytest.mark.parametrize("negative", [None, [40, 41, 42]], ids=["default", "negative"])
def test_batched_guidance_equals_transformers(tiny_pair, scale, negative):
    hf, model, tok = tiny_pair
    prompt = [5, 6, 7, 8, 9]
    expected, scores = hf_cfg(hf, prompt, 8, scale, negative)
    result = fg.generate(
        model,
        tok,
        fg.SequenceState.from_token_ids([prompt], vocab_size=101),
        max_new_tokens=8,
        eos_token_id=(),
        guidance_scale=scale,
        negative_prompt=negative,
        cfg="batched",
        top_logprobs=5,
        logprobs_mode="raw",
    )
    assert np.asarray(result.token_ids)[0].tolist() == expected
    # the guided distribution, as transformers' output_scores (renormalised; top 5 per step)
    normalised = np.asarray(jax.nn.log_softmax(jnp.asarray(scores), axis=-1))
    top = np.sort(normalised, axis=-1)[:, ::-1][:, :5]
    np.testing.assert_allclose(np.asarray(result.top_logprobs)[0], top, atol=1e-4)


def test_batched_guidance_rows_are_independent_and_continue(tiny_pair):
    _, model, tok = tiny_pair
    prompts = [[5, 6, 7, 8, 9], [30, 31]]
    kw = dict(eos_token_id=(), guidance_scale=2.0, negative_prompt=[40, 41], cfg="batched")
    both = fg.generate(
        model, tok, fg.SequenceState.from_token_ids(prompts, vocab_size=101), max_new_tokens=8, **kw
    )
    for row, prompt in enumerate(prompts):
        alone = fg.generate(
            model,
            tok,
            fg.SequenceState.from_token_ids([prompt], vocab_size=101),
            max_new_tokens=8,
            **kw,
        )
        assert np.asarray(alone.token_ids)[0].tolist() == np.asarray(both.token_ids)[row].tolist()
    # continuing: the negative branch goes on from its cache (4 + 4 = 8 tokens)
    first = fg.generate(
        model, tok, fg.SequenceState.from_token_ids(prompts, vocab_size=101), max_new_tokens=4, **kw
    )
    second = fg.generate(model, tok, first.state, max_new_tokens=4, **kw)
    joined = np.concatenate([np.asarray(first.token_ids), np.asarray(second.token_ids)], 1)
    assert joined.tolist() == np.asarray(both.token_ids).tolist()
    # a guided state cannot be continued without guidance (its cache holds two branches)
    with pytest.raises(fg.ModelMismatchError, match="made with batched classifier-free"):
        fg.generate(model, tok, first.state, max_new_tokens=2)
    # ... nor under another negative prompt (its negative rows are another prompt's)
    with pytest.raises(fg.ModelMismatchError, match="another negative prompt"):
        fg.generate(model, tok, first.state, max_new_tokens=2, **{**kw, "negative_prompt": [7]})


def test_batched_guidance_refuses_a_plain_state_by_name(tiny_pair):
    # a state made without guidance has no negative-prompt rows in its cache: batched guidance
    # says so (not "made by another model": it was this one), before compiling
    _, model, tok = tiny_pair
    prompts = [[5, 6, 7, 8, 9], [30, 31]]
    plain = fg.generate(
        model,
        tok,
        fg.SequenceState.from_token_ids(prompts, vocab_size=101),
        max_new_tokens=3,
        eos_token_id=(),
    )
    kw = dict(eos_token_id=(), guidance_scale=2.0, negative_prompt=[40, 41])
    with pytest.raises(fg.ModelMismatchError) as caught:
        fg.generate(model, tok, plain.state, max_new_tokens=2, cfg="batched", **kw)
    message = str(caught.value)
    assert "without batched classifier-free guidance" in message
    assert "negative prompt" in message and "cfg='processor'" in message
    assert "another model" not in message
    # the form the message names continues it
    continued = fg.generate(model, tok, plain.state, max_new_tokens=2, cfg="processor", **kw)
    assert np.asarray(continued.token_ids).shape == (2, 2)


def test_batched_guidance_with_beams_and_a_regex(two_layer_model):
    """Batched guidance, beams and a regex together: every output matches the pattern (a check
    that holds for any weights, so on the 2-layer cut of the default model, with its real
    tokenizer and vocabulary)."""
    import re

    model, tokenizer = two_layer_model
    result = fg.generate(
        model,
        tokenizer,
        ["My phone number is"],
        max_new_tokens=14,
        guidance_scale=1.5,
        cfg="batched",
        sampler=fg.samplers.BeamSearch(2),
        processors=[fg.processors.Regex(r"[0-9]{3}-[0-9]{4}", tokenizer)],
    )
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", result.texts[0]), result.texts


def test_guide_rescale_against_a_hand_computed_blend():
    rng = np.random.default_rng(0)
    cond, uncond = rng.normal(size=(2, 3, 11)).astype(np.float32)
    s, r = 1.7, 0.7

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    c, u = log_softmax(cond), log_softmax(uncond)
    cfg = u + s * (c - u)
    expected = log_softmax(r * log_softmax(cfg) + (1 - r) * c)
    got = guide(jnp.asarray(cond), jnp.asarray(uncond), s, r)
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(guide(jnp.asarray(cond), jnp.asarray(uncond), 1.0)), c, atol=1e-6
    )


def test_bad_guidance_arguments(tiny_pair):
    _, model, tok = tiny_pair
    with pytest.raises(ValueError, match="cfg"):
        fg.generate(model, tok, ["t1"], max_new_tokens=2, guidance_scale=1.5, cfg="twice")
    with pytest.raises(ValueError, match="rescale"):
        GuidedModel(model, 1.5, rescale=1.5)
    with pytest.raises(ValueError, match="finite"):
        GuidedModel(model, float("nan"))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        GuidedModel(model, 1.5, [500])
    with pytest.raises(ValueError, match="need a guidance_scale"):
        fg.generate(model, tok, ["t1"], max_new_tokens=2, negative_prompt="t3")
    with pytest.raises(ValueError, match="causally"):
        fg.generate(
            model, tok, ["t1"], max_new_tokens=2, guidance_scale=2.0, cfg="batched", prefix_lm=True
        )


@pytest.mark.parametrize("negative", [None, [40, 41, 42]], ids=["default", "negative"])
def test_processor_and_batched_forms_give_the_same_tokens(tiny_pair, negative):
    _, model, tok = tiny_pair
    prompts = [[5, 6, 7, 8, 9], [30, 31]]
    runs = {}
    for cfg in ("processor", "batched"):
        runs[cfg] = fg.generate(
            model,
            tok,
            fg.SequenceState.from_token_ids(prompts, vocab_size=101),
            max_new_tokens=10,
            eos_token_id=(),
            guidance_scale=2.5,
            negative_prompt=negative,
            guidance_rescale=0.7,
            cfg=cfg,
            top_logprobs=4,
        )
    assert (
        np.asarray(runs["processor"].token_ids).tolist()
        == np.asarray(runs["batched"].token_ids).tolist()
    )
    np.testing.assert_allclose(
        np.asarray(runs["processor"].top_logprobs),
        np.asarray(runs["batched"].top_logprobs),
        atol=1e-4,
    )


def test_processor_form_continues_and_works_with_beams(tiny_pair):
    _, model, tok = tiny_pair
    prompts = [[5, 6, 7, 8, 9], [30, 31]]
    kw = dict(eos_token_id=(), guidance_scale=2.0, negative_prompt=[40, 41])
    whole = fg.generate(
        model, tok, fg.SequenceState.from_token_ids(prompts, vocab_size=101), max_new_tokens=8, **kw
    )
    first = fg.generate(
        model, tok, fg.SequenceState.from_token_ids(prompts, vocab_size=101), max_new_tokens=4, **kw
    )
    # no processors given: the guidance processor goes on with its negative branch's cache
    second = fg.generate(model, tok, first.state, max_new_tokens=4)
    joined = np.concatenate([np.asarray(first.token_ids), np.asarray(second.token_ids)], 1)
    assert joined.tolist() == np.asarray(whole.token_ids).tolist()
    # beams: the negative branch's cache (in the processor state) is gathered with the beams.
    # (transformers' unbatched CFG does not reorder its own cache with the beams, so it is no
    # reference here.) Reference: each returned hypothesis's score recomputed without any
    # cache, both branches run on the whole text, guided, summed, length-penalised.
    hf, _, _ = tiny_pair
    beams = {
        cfg: fg.generate(
            model,
            tok,
            fg.SequenceState.from_token_ids(prompts[:1], vocab_size=101),
            max_new_tokens=6,
            sampler=fg.samplers.BeamSearch(3),
            num_return_sequences=2,
            cfg=cfg,
            **kw,
        )
        for cfg in ("processor", "batched")
    }
    assert (
        np.asarray(beams["processor"].token_ids).tolist()
        == np.asarray(beams["batched"].token_ids).tolist()
    )
    for row, score in zip(
        np.asarray(beams["processor"].token_ids), beams["processor"].sequences_scores
    ):
        total = 0.0
        for t in range(len(row)):
            with torch.no_grad():
                cond = hf(torch.as_tensor([prompts[0] + row[:t].tolist()])).logits[0, -1]
                uncond = hf(torch.as_tensor([[40, 41] + row[:t].tolist()])).logits[0, -1]
            c, u = torch.log_softmax(cond, -1), torch.log_softmax(uncond, -1)
            total += float((2.0 * (c - u) + u)[row[t]])
        np.testing.assert_allclose(float(score), total / len(row), atol=1e-4)


def test_cfg_must_come_first_in_a_hand_built_chain(tiny_pair):
    _, model, tok = tiny_pair
    cfg = fg.processors.ClassifierFreeGuidance(model, 1.5)
    with pytest.raises(ValueError, match="first"):
        fg.generate(
            model,
            tok,
            ["t1 t2"],
            max_new_tokens=2,
            processors=[fg.processors.Temperature(0.5), cfg],
        )


def test_a_generation_config_guidance_scale_applies_guidance(tiny_pair):
    _, model, tok = tiny_pair
    state = fg.SequenceState.from_token_ids([[5, 6, 7]], vocab_size=101)
    by_config = fg.generate(
        model,
        tok,
        state,
        max_new_tokens=6,
        eos_token_id=(),
        generation_config={"guidance_scale": 3.0},
    )
    explicit = fg.generate(model, tok, state, max_new_tokens=6, eos_token_id=(), guidance_scale=3.0)
    plain = fg.generate(model, tok, state, max_new_tokens=6, eos_token_id=())
    assert np.asarray(by_config.token_ids).tolist() == np.asarray(explicit.token_ids).tolist()
    assert np.asarray(by_config.logprobs).tolist() != np.asarray(plain.logprobs).tolist()
