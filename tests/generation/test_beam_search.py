"""Beam search against transformers' PyTorch `generate(num_beams=...)`: the same returned token
ids and `sequences_scores`; processors (stateful ones too) move with their beams."""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.samplers import BeamSearch

from ..helpers import tiny_hf_model, tiny_tokenizer

torch = pytest.importorskip("torch")


def hf_beam(hf, prompts, *, pad_id, eos, n, **kwargs):
    """transformers' beam search on left-padded prompts: generated ids per returned row, scores."""
    width = max(map(len, prompts))
    ids = torch.as_tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.as_tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad_id,
            return_dict_in_generate=True,
            output_scores=True,
            **kwargs,
        )
    rows = []
    for seq in out.sequences[:, width:].tolist():
        # transformers pads after the end with pad_id; the hypotheses' own length is in beam_indices
        rows.append(seq)
    lengths = (out.beam_indices >= 0).sum(-1).tolist()
    return [r[:k] for r, k in zip(rows, lengths)], out.sequences_scores.numpy()


@pytest.fixture(scope="module")
def tiny_pair():
    hf = tiny_hf_model("llama", seed=1, std=0.15)
    model = fg.LlamaForCausalLM.from_weights(
        fg.LlamaConfig.from_hf(hf.config), {k: v.numpy() for k, v in hf.state_dict().items()}
    )
    return hf, model, tiny_tokenizer(101)


@pytest.fixture(scope="module")
def eos_id(tiny_pair):
    """A token that the best beams of both prompts produce early, so EOS ends beams mid-search."""
    hf, _, _ = tiny_pair
    rows, _ = hf_beam(hf, PROMPTS, pad_id=0, eos=None, n=6, num_beams=4, num_return_sequences=4)
    counts = {}
    for row in rows:
        for t in row[1:4]:
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=counts.get)


def ours(model, tok, prompts, **kwargs):
    state = fg.SequenceState.from_token_ids(prompts, vocab_size=101)
    return fg.generate(model, tok, state, **kwargs)


PROMPTS = [[5, 6, 7, 8, 9], [20, 21]]
CASES = [
    (nb, nrs, lp, es)
    for nb, es in itertools.product((2, 4), (True, False, "never"))
    for nrs, lp in [(1, 1.0), (2, 0.5), (2, 2.0)]
]


@pytest.mark.parametrize("num_beams,num_return,length_penalty,early_stopping", CASES)
def test_beam_search_equals_transformers_on_a_tiny_model(
    tiny_pair, eos_id, num_beams, num_return, length_penalty, early_stopping
):
    hf, model, tok = tiny_pair
    expected, scores = hf_beam(
        hf,
        PROMPTS,
        pad_id=0,
        eos=eos_id,
        n=7,
        num_beams=num_beams,
        num_return_sequences=num_return,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )
    result = ours(
        model,
        tok,
        PROMPTS,
        max_new_tokens=7,
        eos_token_id=eos_id,
        num_return_sequences=num_return,
        sampler=BeamSearch(num_beams, length_penalty=length_penalty, early_stopping=early_stopping),
    )
    got = [row[:k] for row, k in zip(np.asarray(result.token_ids).tolist(), result.num_tokens)]
    assert got == expected
    np.testing.assert_allclose(np.asarray(result.sequences_scores), scores, atol=1e-4)


def test_beam_indices_and_eos_finish(tiny_pair, eos_id):
    hf, model, tok = tiny_pair
    result = ours(
        model,
        tok,
        PROMPTS,
        max_new_tokens=7,
        eos_token_id=eos_id,
        sampler=BeamSearch(4),
        num_return_sequences=4,
    )
    width = max(map(len, PROMPTS))
    ids = torch.as_tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = (ids != 0).long()
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=7,
            num_beams=4,
            num_return_sequences=4,
            eos_token_id=eos_id,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_scores=True,
            do_sample=False,
        )
    ref = out.beam_indices.numpy()
    got = np.asarray(result.beam_indices)
    assert got[:, : ref.shape[1]].tolist() == ref.tolist()
    assert "eos" in result.finish_reasons  # the EOS case is exercised


def test_beam_search_returns_each_sequences_alternatives_and_the_prompt_logprobs(tiny_pair, eos_id):
    """Issue 43 item 2: `top_logprobs` and `prompt_logprobs` under beam search. For every returned
    sequence and generated position, the alternatives are those of the beam that produced the
    token: checked against transformers' PyTorch model run on the sequence's own prefix (its
    `log_softmax`, no processors), and against the chosen token's logprob that the result
    reports. The prompt's logprobs are those of plain generation (one prefill per prompt)."""
    hf, model, tok = tiny_pair
    k = 5  # >= 2 * num_beams: every chosen token is among its beam's alternatives
    result = ours(
        model,
        tok,
        PROMPTS,
        max_new_tokens=6,
        eos_token_id=eos_id,
        num_return_sequences=2,
        sampler=BeamSearch(2),
        top_logprobs=k,
        prompt_logprobs=True,
    )
    assert result.top_token_ids.shape == (4, 6, k) and result.top_logprobs.shape == (4, 6, k)
    top_ids, top_lps = np.asarray(result.top_token_ids), np.asarray(result.top_logprobs)
    chosen_lps = np.asarray(result.logprobs)
    for r, (row, n) in enumerate(zip(np.asarray(result.token_ids).tolist(), result.num_tokens)):
        prompt = PROMPTS[r // 2]
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + row[: n - 1]])).logits[0, len(prompt) - 1 :]
        reference = torch.log_softmax(logits.double(), -1).numpy()  # [n, vocab]
        for t in range(n):
            order = np.argsort(-reference[t], kind="stable")[:k]
            np.testing.assert_allclose(top_lps[r, t], reference[t, order], atol=1e-4)
            assert set(top_ids[r, t].tolist()) == set(order.tolist())  # ties aside, same ids
            (where,) = np.nonzero(top_ids[r, t] == row[t])
            assert where.size == 1, (r, t)  # the chosen token is among its beam's alternatives
            np.testing.assert_allclose(top_lps[r, t, where[0]], chosen_lps[r, t], atol=1e-5)
            assert top_lps[r, t, 0] >= chosen_lps[r, t]
        assert not top_ids[r, n:].any() and not top_lps[r, n:].any()  # zeros after the end
    plain = ours(model, tok, PROMPTS, max_new_tokens=1, prompt_logprobs=True)
    expected = [plain.prompt_logprobs[r // 2] for r in range(4)]
    assert [v[0] for v in result.prompt_logprobs] == [None] * 4
    np.testing.assert_allclose(
        np.concatenate([v[1:] for v in result.prompt_logprobs]),
        np.concatenate([v[1:] for v in expected]),
        atol=1e-6,
    )


def test_processor_states_move_with_their_beams(tiny_pair):
    """A processor that records, in its state, the tokens it has seen: after the search every
    returned hypothesis's state equals its own tokens (no reorder code in the processor)."""
    _, model, tok = tiny_pair

    class History(fg.processors.AbstractLogitsProcessor):
        def init(self, context):
            return jnp.full((8,), -1, jnp.int32)

        def process(self, state, logits, context):
            n = context.num_generated
            seen = jnp.where(n > 0, context.last_token_id, -1)
            state = state.at[jnp.maximum(n - 1, 0)].set(jnp.where(n > 0, seen, state[0]))
            return state, logits

    result = ours(
        model,
        tok,
        PROMPTS,
        max_new_tokens=6,
        eos_token_id=(),
        sampler=BeamSearch(3),
        processors=[History()],
        num_return_sequences=1,
    )
    # the running beams' states: their recorded history equals their own tokens
    del result  # the returned hypotheses are rebuilt without processor states; check the loop
    from functional_gen.generation.planning import plan_call
    from functional_gen.generation.program import run_generation

    _, settings, prepared = plan_call(
        model,
        tok,
        fg.SequenceState.from_token_ids(PROMPTS, vocab_size=101),
        max_new_tokens=6,
        processors=[History()],
        sampler=BeamSearch(3),
        key=None,
        chat_template=None,
        eos_token_id=(),
        pad_token_id=None,
        stop_strings=None,
        generation_config=None,
        num_return_sequences=None,
        prefix_lm=False,
        prefill_mode="one_pass",
    )
    final, _, _ = run_generation(
        settings.step,
        prepared.plan,
        prepared.arrays,
        prepared.new_ids,
        prepared.new_pos,
        prepared.budget,
        prepared.padding_rows,
        prepared.keys,
    )
    history = np.asarray(final.processor_states[0])
    gen = np.asarray(final.generated_token_ids(0))
    for row in range(6):
        n = int(final.num_generated[row])
        # the state saw every token but the last (appended after its last process call)
        assert history[row, : n - 1].tolist() == gen[row, : n - 1].tolist()


def test_beam_sampling_is_deterministic_and_batch_invariant(tiny_pair):
    _, model, tok = tiny_pair
    kw = dict(
        max_new_tokens=6,
        eos_token_id=(),
        sampler=BeamSearch(2, do_sample=True),
        key=jax.random.key(3),
    )
    a = ours(model, tok, PROMPTS, **kw)
    b = ours(model, tok, PROMPTS, **kw)
    assert np.asarray(a.token_ids).tolist() == np.asarray(b.token_ids).tolist()
    # row 0 alone equals row 0 in the batch (its key is fold_in(key, 0) either way)
    alone = ours(model, tok, PROMPTS[:1], **kw)
    assert np.asarray(alone.token_ids)[0].tolist() == np.asarray(a.token_ids)[0].tolist()
    with pytest.raises(ValueError, match="PRNG key"):
        fg.generate(model, tok, ["t5 t6"], max_new_tokens=2, sampler=BeamSearch(2, do_sample=True))


@pytest.mark.slow
def test_regex_constraint_with_beams_gives_valid_outputs(two_layer_model):
    model, tokenizer = two_layer_model
    pattern = r"[0-9]{3}-[0-9]{4}"
    result = fg.generate(
        model,
        tokenizer,
        ["My phone number is", "Call me at"],
        max_new_tokens=12,
        processors=[fg.processors.Regex(pattern, tokenizer)],
        sampler=BeamSearch(3),
        num_return_sequences=2,
    )
    for text, reason in zip(result.texts, result.finish_reasons):
        assert reason == "eos" and re.fullmatch(pattern, text), (text, reason)


def test_bad_beam_arguments():
    with pytest.raises(ValueError, match="num_beams"):
        BeamSearch(0)
    with pytest.raises(ValueError, match="early_stopping"):
        BeamSearch(2, early_stopping="sometimes")


@pytest.mark.slow
@pytest.mark.parametrize("num_beams,num_return", [(2, 1), (4, 2)])
def test_beam_search_equals_transformers_on_the_default_model(
    default_model, torch_default_model, num_beams, num_return
):
    model, tokenizer = default_model
    hf = torch_default_model
    prompts = [
        tokenizer(t)["input_ids"]
        for t in ["The capital of France is", "Once upon a time, in a land far"]
    ]
    expected, scores = hf_beam(
        hf,
        prompts,
        pad_id=2,
        eos=[2],
        n=12,
        num_beams=num_beams,
        num_return_sequences=num_return,
    )
    result = fg.generate(
        model,
        tokenizer,
        fg.SequenceState.from_token_ids(prompts, vocab_size=model.vocab_size),
        max_new_tokens=12,
        eos_token_id=[2],
        sampler=BeamSearch(num_beams),
        num_return_sequences=num_return,
    )
    got = [row[:k] for row, k in zip(np.asarray(result.token_ids).tolist(), result.num_tokens)]
    assert got == expected
    np.testing.assert_allclose(np.asarray(result.sequences_scores), scores, atol=1e-4)


# --- outlines PR #998's matrix: {Regex, none} x {batch, single} x {samplers} x {stream, generate}

PHONE = r"\(?[0-9]{3}\)?-[0-9]{3}-[0-9]{4}"


@pytest.fixture(scope="module")
def tiny_real_vocab(default_model):
    """A random 2-layer model over the default tokenizer's vocabulary (fast to compile)."""
    from functional_gen.testing import tiny_config

    _, tokenizer = default_model
    # both of SmolLM2's end-of-generation ids (its generation_config.json), the ones `Regex`
    # allows in an accepting state: with only 2 here, a sampled row could draw 0 there forever
    config = tiny_config(vocab_size=49152, eos_token_id=(2, 0), pad_token_id=2)
    return fg.LlamaForCausalLM(config, key=jax.random.key(4), std=0.3), tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("constrained", [True, False], ids=["regex", "free"])
@pytest.mark.parametrize("batch", [True, False], ids=["batch", "single"])
@pytest.mark.parametrize("sampler_name", ["greedy", "multinomial", "beam"])
def test_outlines_998_matrix(tiny_real_vocab, constrained, batch, sampler_name):
    model, tokenizer = tiny_real_vocab
    prompts = ["Call", "My number:", "Phone"] if batch else "Call"
    sampler = {
        "greedy": fg.samplers.Greedy(),
        "multinomial": fg.samplers.Multinomial(),
        "beam": BeamSearch(3),
    }[sampler_name]
    kw = dict(
        max_new_tokens=20,
        sampler=sampler,
        key=jax.random.key(0),
        processors=[fg.processors.Regex(PHONE, tokenizer)] if constrained else [],
    )
    result = fg.generate(model, tokenizer, prompts, **kw)
    stream = fg.stream(model, tokenizer, prompts, **kw)
    rows = len(result.texts)
    texts = [""] * rows
    for item in stream:
        row, piece = (0, item) if not batch else item
        texts[row] += piece
    assert texts == result.texts
    if constrained:
        for text, reason in zip(result.texts, result.finish_reasons):
            assert reason == "eos" and re.fullmatch(PHONE, text), (text, reason)
