"""Prefill variants: prefix-LM (bidirectional prompt) against transformers with a custom 4-D
attention mask, and teacher-forced prefill against the one-pass prefill."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.testing import tiny_config

from ..helpers import tiny_hf_model, tiny_tokenizer


def prefix_lm_mask(prefix_lengths, seq):
    """[batch, 1, seq, seq] bool: causal, plus every prefix token sees the whole prefix."""
    q = np.arange(seq)[:, None]
    k = np.arange(seq)[None, :]
    return np.stack([(k <= q) | ((k < p) & (q < p)) for p in prefix_lengths])[:, None]


def hf_logits_with_mask(hf, ids, mask):
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        out = hf(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    return out.logits.float().numpy()


def test_prefix_lm_prefill_equals_transformers_4d_mask():
    hf = tiny_hf_model("llama")
    model = fg.LlamaForCausalLM.from_weights(
        fg.LlamaConfig.from_hf(hf.config), {k: v.numpy() for k, v in hf.state_dict().items()}
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 100, (2, 10))
    prefix = np.array([4, 7])
    expected = hf_logits_with_mask(hf, ids, prefix_lm_mask(prefix, 10))
    pos = jnp.broadcast_to(jnp.arange(10), (2, 10))
    logits, _ = model.prefill(
        jnp.asarray(ids), pos, max_len=12, logits_to_keep=0, prefix_length=jnp.asarray(prefix)
    )
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4)
    # and it differs from causal attention inside the prefix (the test can fail)
    causal = hf_logits_with_mask(hf, ids, prefix_lm_mask([0, 0], 10))
    assert np.abs(causal[:, :3] - expected[:, :3]).max() > 1e-3


def test_generate_with_prefix_lm_left_padded_rows_equal_transformers():
    hf = tiny_hf_model("llama", seed=3)
    model = fg.LlamaForCausalLM.from_weights(
        fg.LlamaConfig.from_hf(hf.config), {k: v.numpy() for k, v in hf.state_dict().items()}
    )
    tok = tiny_tokenizer(101)
    prompts = [[5, 6, 7, 8, 9, 10], [20, 21, 22]]
    result = fg.generate(
        model,
        tok,
        fg.SequenceState.from_token_ids(prompts, vocab_size=101),
        max_new_tokens=4,
        prefix_lm=True,
        eos_token_id=(),
    )
    for row, prompt in enumerate(prompts):
        seq = prompt + np.asarray(result.token_ids)[row].tolist()
        n = len(seq)
        logits = hf_logits_with_mask(hf, np.asarray([seq]), prefix_lm_mask([len(prompt)], n))[0]
        # greedy: each generated token is the argmax after the bidirectional prompt
        expected = logits[len(prompt) - 1 : n - 1].argmax(-1).tolist()
        assert expected == seq[len(prompt) :]
        lp = jax.nn.log_softmax(jnp.asarray(logits[len(prompt) - 1 : n - 1]), -1)
        chosen = np.asarray(lp)[np.arange(4), seq[len(prompt) :]]
        np.testing.assert_allclose(np.asarray(result.logprobs)[row], chosen, atol=1e-4)


def test_forced_prefill_equals_one_pass():
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(2), std=0.2)
    tok = tiny_tokenizer(101)
    prompts = ["t1 t2 t3 t4 t5 t6 t7", "t9 t8"]
    one = fg.generate(model, tok, prompts, max_new_tokens=8, eos_token_id=())
    forced = fg.generate(
        model, tok, prompts, max_new_tokens=8, eos_token_id=(), prefill_mode="forced"
    )
    assert np.asarray(one.token_ids).tolist() == np.asarray(forced.token_ids).tolist()
    np.testing.assert_allclose(np.asarray(one.logprobs), np.asarray(forced.logprobs), atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(one.state.arrays.logits), np.asarray(forced.state.arrays.logits), atol=1e-5
    )
    # forced prefill of appended tokens on a continuation too
    more = one.state + " t50 t51 t52"
    a = fg.generate(model, tok, more, max_new_tokens=4)
    b = fg.generate(model, tok, more, max_new_tokens=4, prefill_mode="forced")
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5)
    assert np.asarray(a.token_ids).tolist() == np.asarray(b.token_ids).tolist()
    with pytest.raises(ValueError, match="one-pass prefill"):
        fg.generate(model, tok, prompts, max_new_tokens=2, prefix_lm=True, prefill_mode="forced")


@pytest.mark.slow
def test_prefix_lm_on_the_default_model(default_model, torch_default_model, roman_prompt_ids):
    model, _ = default_model
    hf = torch_default_model
    ids = np.asarray([roman_prompt_ids[:20]])
    expected = hf_logits_with_mask(hf, ids, prefix_lm_mask([12], 20))
    logits, _ = model.prefill(
        jnp.asarray(ids),
        jnp.arange(20)[None],
        max_len=24,
        logits_to_keep=0,
        prefix_length=jnp.asarray([12]),
    )
    np.testing.assert_allclose(np.asarray(logits), expected, atol=2e-3)
    assert (np.asarray(logits).argmax(-1) == expected.argmax(-1)).mean() > 0.95


def test_top_logprobs_and_logprobs_mode_on_a_counting_model():
    from functional_gen.testing import CountingModel

    model, tok = CountingModel(), tiny_tokenizer(32)
    raw = fg.generate(model, tok, ["t3"], max_new_tokens=3, top_logprobs=2, logprobs_mode="raw")
    # the model's own distribution: logit 10 on the next integer, -10 on the 31 others
    z = np.log1p(31 * np.exp(-20.0))
    np.testing.assert_allclose(np.asarray(raw.logprobs), [[-z] * 3], atol=1e-6)
    assert np.asarray(raw.top_token_ids).tolist() == [[[4, 0], [5, 0], [6, 0]]]
    np.testing.assert_allclose(np.asarray(raw.top_logprobs)[0, :, 1], [-20 - z] * 3, atol=1e-4)
    processed = fg.generate(
        model,
        tok,
        ["t3"],
        max_new_tokens=3,
        top_logprobs=2,
        processors=[fg.processors.Temperature(10.0)],
    )
    z10 = np.log1p(31 * np.exp(-2.0))
    np.testing.assert_allclose(np.asarray(processed.top_logprobs)[0, :, 0], [-z10] * 3, rtol=1e-5)
    assert fg.generate(model, tok, ["t3"], max_new_tokens=2).top_token_ids is None
    with pytest.raises(ValueError, match="logprobs_mode"):
        fg.generate(model, tok, ["t3"], max_new_tokens=2, logprobs_mode="final")
    with pytest.raises(ValueError, match="top_logprobs"):
        fg.generate(model, tok, ["t3"], max_new_tokens=2, top_logprobs=-1)


def test_prompt_logprobs_equal_transformers():
    hf = tiny_hf_model("llama", seed=5)
    model = fg.LlamaForCausalLM.from_weights(
        fg.LlamaConfig.from_hf(hf.config), {k: v.numpy() for k, v in hf.state_dict().items()}
    )
    tok = tiny_tokenizer(101)
    prompts = [[5, 6, 7, 8, 9, 10], [20, 21, 22]]
    state = fg.SequenceState.from_token_ids(prompts, vocab_size=101)
    out = fg.generate(model, tok, state, max_new_tokens=3, prompt_logprobs=True, eos_token_id=())
    for row, prompt in enumerate(prompts):
        logits = hf_logits_with_mask(hf, np.asarray([prompt]), np.ones((1, len(prompt)), np.int64))[
            0
        ]
        lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), -1))
        expected = [None] + [float(lp[i - 1, prompt[i]]) for i in range(1, len(prompt))]
        got = out.prompt_logprobs[row]
        assert got[0] is None and len(got) == len(prompt)
        np.testing.assert_allclose(got[1:], expected[1:], atol=1e-4)
    # a continuation scores only its new tokens, the first one given the cached text
    more = fg.generate(model, tok, out.state + [40, 41], max_new_tokens=2, prompt_logprobs=True)
    seq = out.state.row_token_ids()[1] + [40, 41]
    logits = hf_logits_with_mask(hf, np.asarray([seq]), np.ones((1, len(seq)), np.int64))[0]
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), -1))
    np.testing.assert_allclose(
        more.prompt_logprobs[1], [lp[len(seq) - 3, 40], lp[len(seq) - 2, 41]], atol=1e-4
    )


@pytest.mark.slow
def test_top_logprobs_equal_transformers_output_scores(default_model, torch_default_model):
    torch = pytest.importorskip("torch")
    model, tokenizer = default_model
    hf = torch_default_model
    prompt = "The capital of France is"
    ours = fg.generate(model, tokenizer, prompt, max_new_tokens=6, top_logprobs=5, eos_token_id=())
    ids = torch.as_tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=6,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=2,
            eos_token_id=None,
        )
    for step, scores in enumerate(out.scores):
        lp = torch.log_softmax(scores[0].float(), -1)
        values, indices = torch.topk(lp, 5)
        assert np.asarray(ours.top_token_ids)[0, step].tolist() == indices.tolist()
        np.testing.assert_allclose(
            np.asarray(ours.top_logprobs)[0, step], values.numpy(), atol=2e-3
        )
