"""The generation loop: exact token sequences on a counting model, and parity with transformers'
`generate` on the real default model."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.processors import ForcedTokens, Stateless
from functional_gen.testing import CountingModel

from .conftest import ROMAN_GOLDEN_PREFIX


def counting_generate(prompts, max_new_tokens=4, **kwargs):
    model = kwargs.pop("model", CountingModel())
    return fg.generate_token_ids(model, prompts, max_new_tokens=max_new_tokens, **kwargs)


def generated(state, pad=0):
    return np.asarray(state.generated_token_ids(pad)).tolist()


# --- the loop, token for token, on the counting model ------------------------------------------


def test_counting_model_generates_the_next_integers():
    state = counting_generate([[3, 4]], max_new_tokens=4)
    assert generated(state) == [[5, 6, 7, 8]]
    assert np.asarray(state.finish_reason).tolist() == [fg.FINISH_REASONS.index("length")]
    assert np.asarray(state.length).tolist() == [6]


def test_eos_ends_a_row_and_the_rest_is_padding():
    model = CountingModel(eos_token_id=(7,), pad_token_id=0)
    state = counting_generate([[5], [1]], max_new_tokens=6, model=model)
    # row 0: 6, 7 (EOS) then padding; row 1 never meets 7 within 6 tokens... 2..7 does: EOS at 7
    assert generated(state) == [[6, 7, 0, 0, 0, 0], [2, 3, 4, 5, 6, 7]]
    reasons = [fg.FINISH_REASONS[i] for i in np.asarray(state.finish_reason)]
    assert reasons == ["eos", "eos"]
    assert np.asarray(state.num_generated).tolist() == [2, 6]
    assert (np.asarray(state.logprobs)[0, 2:] == 0).all()


def test_rows_of_different_lengths_equal_each_row_alone():
    prompts = [[1], [2, 3, 4, 5, 6, 7, 8], [9, 10, 11]]
    batch = generated(counting_generate(prompts, max_new_tokens=5))
    alone = [generated(counting_generate([p], max_new_tokens=5))[0] for p in prompts]
    assert batch == alone == [[2, 3, 4, 5, 6], [9, 10, 11, 12, 13], [12, 13, 14, 15, 16]]


def test_logprobs_are_those_of_the_processed_distribution():
    # CountingModel: logit 10 for the next integer, -10 for the 31 others.
    state = counting_generate([[3]], max_new_tokens=2)
    expected = -math.log1p(31 * math.exp(-20.0))
    np.testing.assert_allclose(np.asarray(state.logprobs), [[expected, expected]], atol=1e-6)
    # after Temperature(10): logits 1 / -1, so log p = -log(1 + 31 e^-2) = -1.6477...
    state = counting_generate([[3]], max_new_tokens=2, processors=[fg.processors.Temperature(10.0)])
    expected = -math.log1p(31 * math.exp(-2.0))
    np.testing.assert_allclose(np.asarray(state.logprobs), [[expected, expected]], rtol=1e-6)


def test_stateful_processor_forces_a_prefix_then_lets_go():
    state = counting_generate([[3]], max_new_tokens=5, processors=[ForcedTokens([20, 9])])
    assert generated(state) == [[20, 9, 10, 11, 12]]
    # its state counted every step
    assert np.asarray(state.processor_states[0]).tolist() == [5]


class StepCounter(fg.processors.AbstractLogitsProcessor):
    """Counts the steps it was applied to; leaves the logits alone."""

    def init(self, context):
        return jnp.zeros((), jnp.int32)

    def process(self, state, logits, context):
        return state + 1, logits


def test_finished_rows_keep_their_processor_state():
    model = CountingModel(eos_token_id=(7,))
    state = counting_generate([[5], [1]], max_new_tokens=6, model=model, processors=[StepCounter()])
    assert generated(state) == [[6, 7, 0, 0, 0, 0], [2, 3, 4, 5, 6, 7]]
    # row 0 finished after 2 steps; its state is not advanced by the 4 steps row 1 still took
    assert np.asarray(state.processor_states[0]).tolist() == [2, 6]


def test_bare_callable_is_wrapped_as_stateless():
    def ban_five(logits, context):
        return logits.at[5].set(-jnp.inf)

    a = counting_generate([[3]], max_new_tokens=3, processors=[ban_five])
    b = counting_generate([[3]], max_new_tokens=3, processors=[Stateless(ban_five)])
    assert generated(a) == generated(b)
    assert generated(a)[0][0] == 4 and 5 not in generated(a)[0]


def test_dead_end_ends_row_with_constraint_reason_and_no_nan():
    def nothing_after_two(logits, context):
        return jnp.where(context.num_generated >= 2, -jnp.inf, logits)

    state = counting_generate([[3], [10]], max_new_tokens=5, processors=[nothing_after_two])
    assert generated(state) == [[4, 5, 0, 0, 0], [11, 12, 0, 0, 0]]
    assert [fg.FINISH_REASONS[i] for i in np.asarray(state.finish_reason)] == ["constraint"] * 2
    assert np.isfinite(np.asarray(state.logprobs)).all()


def test_step_keeps_the_state_structure_and_jit_equals_eager():
    model = CountingModel()
    step = fg.make_step(model, [ForcedTokens([7])])
    state = fg.init_state(model, [[3], [4, 5]], max_new_tokens=3, processors=step.processors)
    eager = step(state)
    jitted = jax.jit(lambda s: step(s))(state)
    assert jax.tree.structure(eager) == jax.tree.structure(state)
    for a, b, c in zip(jax.tree.leaves(state), jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        assert a.shape == b.shape and a.dtype == b.dtype
        if not jnp.issubdtype(b.dtype, jax.dtypes.prng_key):
            np.testing.assert_array_equal(np.asarray(b), np.asarray(c))


def test_python_loop_of_steps_equals_generate():
    model = CountingModel(eos_token_id=(9,))
    step = fg.make_step(model)
    state = fg.init_state(model, [[3], [1, 2]], max_new_tokens=6)
    while not bool(state.done.all()):
        state = step(state)
    assert generated(state) == generated(
        counting_generate([[3], [1, 2]], max_new_tokens=6, model=model)
    )


def test_multinomial_rows_do_not_depend_on_batch_mates():
    model = CountingModel()

    def uniform(logits, context):  # flat distribution: the draw is all randomness
        return jnp.zeros_like(logits)

    kwargs = dict(processors=[uniform], sampler=fg.samplers.Multinomial(), key=jax.random.key(3))
    together = generated(
        counting_generate([[1], [2], [3]], max_new_tokens=8, model=model, **kwargs)
    )
    first_alone = generated(counting_generate([[1]], max_new_tokens=8, model=model, **kwargs))
    assert together[0] == first_alone[0]
    assert together[0] != together[1]  # rows draw independently
    again = generated(counting_generate([[1], [2], [3]], max_new_tokens=8, model=model, **kwargs))
    assert again == together


def test_new_prompt_in_the_same_bucket_does_not_recompile():
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        counting_generate([[1, 2, 3, 4, 5]], max_new_tokens=3)
        compiles.clear()
        counting_generate([[7, 8, 9, 10, 11, 12, 13]], max_new_tokens=3)  # 5 and 7 -> bucket 16
        counting_generate(
            [[4, 5, 6]], max_new_tokens=3, processors=[fg.processors.Temperature(0.5)]
        )
        compiles_before_new_temperature = len(compiles)
        counting_generate(
            [[4, 5, 6]], max_new_tokens=3, processors=[fg.processors.Temperature(0.9)]
        )
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles_before_new_temperature == 1  # only the new processor list compiled
    assert len(compiles) == 1  # a new temperature value reused it


@pytest.mark.parametrize(
    "n, bucket", [(1, 16), (16, 16), (17, 24), (25, 32), (33, 48), (100, 128), (513, 768)]
)
def test_bucket_length(n, bucket):
    assert fg.bucket_length(n) == bucket


def test_bad_inputs_raise_clear_errors_before_compiling():
    model = CountingModel()
    with pytest.raises(ValueError, match=r"max_new_tokens.*positive integer, got 0"):
        counting_generate([[1]], max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt 1 has no tokens"):
        counting_generate([[1], []])
    with pytest.raises(ValueError, match="needs a PRNG key"):
        counting_generate([[1]], sampler=fg.samplers.Multinomial())
    with pytest.raises(ValueError, match="max_position_embeddings=256"):
        counting_generate([[1] * 250], max_new_tokens=10)
    with pytest.raises(ValueError, match=r"token ids out of range \[0, 32\): \[40\]"):
        counting_generate([[1, 40]])
    with pytest.raises(TypeError, match="sampler"):
        fg.make_step(model, [], sampler="greedy")
    with pytest.raises(TypeError, match="processor must be"):
        fg.make_step(model, [3])


# --- the real default model against transformers ----------------------------------------------


@pytest.mark.slow
def test_greedy_generation_equals_transformers(
    default_model, torch_default_model, roman_prompt_ids
):
    """32 greedy tokens on SmolLM2-135M-Instruct, identical to transformers' `generate`."""
    import torch

    model, tokenizer = default_model
    hf = torch_default_model
    ids = torch.tensor([roman_prompt_ids])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=32,
            output_logits=True,
            return_dict_in_generate=True,
        )
    expected = out.sequences[0, 32:].tolist()
    state = fg.generate_token_ids(model, [roman_prompt_ids], max_new_tokens=32)
    ours = generated(state, pad=2)[0][: len(expected)]
    assert ours == expected
    assert tokenizer.decode(ours).startswith(ROMAN_GOLDEN_PREFIX)
    # logprobs of the chosen tokens equal transformers' raw logits, log-softmaxed
    hf_logprobs = [
        torch.log_softmax(step_logits[0].float(), -1)[t].item()
        for step_logits, t in zip(out.logits, expected)
    ]
    np.testing.assert_allclose(
        np.asarray(state.logprobs)[0, : len(expected)], hf_logprobs, atol=2e-3
    )


@pytest.mark.slow
def test_padded_batch_generates_what_each_prompt_generates_alone(two_layer_model):
    model, tokenizer = two_layer_model
    prompts = ["The capital of France is", "Here is a list of three fruits: apples, bananas and"]
    batch = fg.generate(model, tokenizer, prompts, max_new_tokens=12)
    for i, p in enumerate(prompts):
        alone = fg.generate(model, tokenizer, [p], max_new_tokens=12)
        assert alone.texts[0] == batch.texts[i]
        np.testing.assert_array_equal(
            np.asarray(alone.token_ids[0]), np.asarray(batch.token_ids[i])
        )


@pytest.mark.slow
def test_chat_prompt_uses_the_template_and_stops_at_eos(default_model):
    model, tokenizer = default_model
    messages = [
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
    ]
    result = fg.generate(model, tokenizer, [messages], max_new_tokens=12)
    assert result.texts == ["The capital of France is Paris."]
    assert result.finish_reasons == ["eos"]
    row = np.asarray(result.token_ids[0]).tolist()
    n = result.num_tokens[0]
    assert row[n - 1] in model.config.eos_token_id  # the EOS is kept in token_ids ...
    assert all(t == model.config.pad_token_id for t in row[n:])  # ... padding after it
    # both of SmolLM2's end-of-generation tokens end a row
    assert set(model.config.eos_token_id) == {
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    }


@pytest.mark.slow
def test_sampling_is_reproducible_and_per_row(two_layer_model):
    model, tokenizer = two_layer_model
    kwargs = dict(
        max_new_tokens=12,
        processors=[fg.processors.Temperature(1.0), fg.processors.TopK(50)],
        sampler=fg.samplers.Multinomial(),
        key=jax.random.key(42),
    )
    a = fg.generate(model, tokenizer, ["Once upon a time", "Once upon a time"], **kwargs)
    b = fg.generate(model, tokenizer, ["Once upon a time", "Once upon a time"], **kwargs)
    assert a.texts == b.texts
    assert a.texts[0] != a.texts[1]  # same prompt, independent draws per row
