"""Speculative decoding (issue 41): lossless against plain decoding, the acceptance rule against a
hand-computed case and transformers' `_speculative_sampling`, the sampled distribution against
exact enumeration, and the refusals. Every lossless case also checks that guesses were verified
and accepted (`speculative_generate`): it would pass with speculation silently off otherwise.

References: plain `fg.generate` without `speculative` (greedy token for token; the sampled
distribution), the exact distribution of the first tokens enumerated from the model's own
logits, and transformers' `_speculative_sampling` (Leviathan et al.'s Algorithm 1).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.generation.token_ids import generate_state
from functional_gen.speculative import AbstractProposer
from functional_gen.testing import tiny_config

from ..helpers import speculative_generate, tiny_tokenizer

PROMPTS = [
    "t5 t6 t7 t8 t5 t6 t7 t8 t5 t6",
    "t1 t2 t3",
    "t9 t9 t9 t10 t11 t9 t9 t9 t10",
]


@pytest.fixture(scope="module")
def tiny():
    """A random 2-layer Llama (real attention and KV cache) and a word-level tokenizer."""
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(7), std=0.2)
    return model, tiny_tokenizer(101)


def _final(model, tokenizer, prompts, **kwargs):
    """The final `GenerationState` of a call (its `search_state` holds the acceptance counts)."""
    return generate_state(model, tokenizer, prompts, **kwargs)


def _assert_same(result, reference, top=False):
    """Same tokens, finish reasons, texts and logprobs (and `top_logprobs` when `top`)."""
    np.testing.assert_array_equal(np.asarray(result.token_ids), np.asarray(reference.token_ids))
    assert result.finish_reasons == reference.finish_reasons
    assert result.texts == reference.texts
    np.testing.assert_allclose(
        np.asarray(result.logprobs), np.asarray(reference.logprobs), atol=2e-4
    )
    if top:
        np.testing.assert_array_equal(
            np.asarray(result.top_token_ids), np.asarray(reference.top_token_ids)
        )
        np.testing.assert_allclose(
            np.asarray(result.top_logprobs), np.asarray(reference.top_logprobs), atol=2e-4
        )


PROPOSERS = {
    "prompt_lookup": lambda model: fg.speculative.PromptLookup(
        num_tokens=4, max_ngram_size=3, cost_model=False
    ),
    "draft_model": lambda model: fg.speculative.DraftModel(
        fg.LlamaForCausalLM(tiny_config(num_hidden_layers=1), key=jax.random.key(3), std=0.2), 3
    ),
    "early_exit": lambda model: fg.speculative.EarlyExit(num_layers=1, num_tokens=3),
}


@pytest.mark.parametrize("name", sorted(PROPOSERS))
def test_greedy_is_lossless_with_penalty_and_stop_strings(tiny, name):
    """Every proposer gives plain greedy decoding's tokens, logprobs and finish reasons, with a
    repetition penalty (a processor that reads the whole row) and a stop string."""
    model, tok = tiny
    kwargs = dict(
        max_new_tokens=24,
        eos_token_id=[],
        repetition_penalty=1.3,
        do_sample=False,
        stop_strings=["t42"],
        top_logprobs=2,
    )
    if name == "prompt_lookup":
        # at 1.3 the rows never repeat themselves, so no looked-up guess is ever accepted
        kwargs["repetition_penalty"] = 1.05
    reference = fg.generate(model, tok, PROMPTS, **kwargs)
    spec = PROPOSERS[name](model)
    result, counts = speculative_generate(model, tok, PROMPTS, speculative=spec, **kwargs)
    _assert_same(result, reference)
    if name == "draft_model":  # a random draft: some guesses rejected, so rejection is exercised
        assert counts.accepted.sum() < counts.proposed.sum(), counts
    np.testing.assert_allclose(
        np.asarray(result.top_logprobs), np.asarray(reference.top_logprobs), atol=2e-4
    )
    np.testing.assert_array_equal(
        np.asarray(result.top_token_ids), np.asarray(reference.top_token_ids)
    )


def test_rows_accept_different_counts(tiny):
    """Prompt lookup on rows that repeat themselves and on one that does not: the rows accept
    different numbers of guesses in the same batch, and the output is still greedy's."""
    model, tok = tiny
    spec = fg.speculative.PromptLookup(num_tokens=4, max_ngram_size=3, cost_model=False)
    final = _final(model, tok, PROMPTS, max_new_tokens=32, eos_token_id=[], speculative=spec)
    accepted = np.asarray(final.search_state.accepted)[: len(PROMPTS)]
    steps = np.asarray(final.search_state.steps)[: len(PROMPTS)]
    assert len(set(accepted.tolist())) > 1, accepted
    assert np.all(steps <= 32) and np.all(accepted + steps >= 32), (accepted, steps)
    reference = fg.generate(model, tok, PROMPTS, max_new_tokens=32, eos_token_id=[])
    generated = final.generated_token_ids(reference.state.settings.pad_token_id)
    np.testing.assert_array_equal(
        np.asarray(generated)[: len(PROMPTS), :32], np.asarray(reference.token_ids)
    )


def test_perfect_draft_accepts_everything(tiny):
    """The target as its own draft: every guess is accepted, k + 1 tokens per step."""
    model, tok = tiny
    spec = fg.speculative.DraftModel(model, num_tokens=3)
    final = _final(model, tok, PROMPTS[:1], max_new_tokens=16, eos_token_id=[], speculative=spec)
    assert int(final.search_state.accepted[0]) == int(final.search_state.proposed[0])
    assert int(final.search_state.steps[0]) == 4  # 16 tokens, 4 per step


def test_eos_inside_an_accepted_run(tiny):
    """An EOS in the middle of a run ends the row there (tokens after it are not emitted)."""
    model, tok = tiny
    reference = fg.generate(model, tok, PROMPTS, max_new_tokens=24, eos_token_id=[])
    # the 5th generated token of row 0 becomes the EOS
    eos = int(np.asarray(reference.token_ids)[0, 4])
    spec = fg.speculative.DraftModel(model, num_tokens=4)
    plain = fg.generate(model, tok, PROMPTS, max_new_tokens=24, eos_token_id=eos)
    result, _ = speculative_generate(
        model, tok, PROMPTS, max_new_tokens=24, eos_token_id=eos, speculative=spec
    )
    _assert_same(result, plain)
    assert result.finish_reasons[0] == "eos"


def test_continuation_from_sequence_state(tiny):
    """A state made with speculation continues exactly like one made without (the cache holds
    every token, dead slots masked), and speculation continues a plain state exactly."""
    model, tok = tiny
    spec = fg.speculative.PromptLookup(num_tokens=3, max_ngram_size=2, cost_model=False)
    plain = fg.generate(model, tok, PROMPTS, max_new_tokens=10, eos_token_id=[])
    fast, _ = speculative_generate(model, tok, PROMPTS, max_new_tokens=10, eos_token_id=[],
                                   speculative=spec)  # fmt: skip
    plain2 = fg.generate(model, tok, plain.state, max_new_tokens=12)
    fast2 = fg.generate(model, tok, fast.state, max_new_tokens=12)
    mixed, _ = speculative_generate(model, tok, plain.state, max_new_tokens=12, speculative=spec)
    _assert_same(fast2, plain2)
    _assert_same(mixed, plain2)


def test_regex_constraint_is_lossless(tiny):
    """A constraint stays exact: its state is selected at the accepted position."""
    model, tok = tiny
    regex = fg.processors.Regex(r"(t1|t2|t3){3,6}t4", tok)
    kwargs = dict(max_new_tokens=12, eos_token_id=[], processors=[regex])
    spec = fg.speculative.PromptLookup(num_tokens=4, max_ngram_size=2, cost_model=False)
    plain = fg.generate(model, tok, PROMPTS, **kwargs)
    fast, _ = speculative_generate(model, tok, PROMPTS, speculative=spec, **kwargs)
    _assert_same(fast, plain)


def test_generation_config_prompt_lookup(tiny):
    """transformers' `prompt_lookup_num_tokens` selects `PromptLookup`."""
    model, tok = tiny
    config = {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 2, "max_new_tokens": 12}
    # one row: at batch 1 the cost model verifies (at batch 3 it may find a plain step cheaper)
    one, _ = speculative_generate(model, tok, PROMPTS[:1], generation_config=config,
                                  eos_token_id=[])  # fmt: skip
    plain = fg.generate(model, tok, PROMPTS, max_new_tokens=12, eos_token_id=[])
    np.testing.assert_array_equal(np.asarray(one.token_ids), np.asarray(plain.token_ids)[:1])
    fast = fg.generate(model, tok, PROMPTS, generation_config=config, eos_token_id=[])
    _assert_same(fast, plain)


WIDTH = 40  # token columns of test_prompt_lookup_matches_transformers_candidates' rows (n < 30)


def test_prompt_lookup_matches_transformers_candidates():
    """The looked-up guesses equal transformers' `PromptLookupCandidateGenerator` (first match
    of the longest n-gram, continuation truncated at the row's end)."""
    torch = pytest.importorskip("torch")
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = np.random.default_rng(0)
    spec = fg.speculative.PromptLookup(num_tokens=5, max_ngram_size=3, adaptive=False)
    _, _, q = spec.propose(
        None,
        None,
        jnp.zeros((1, WIDTH), jnp.int32),
        jnp.asarray([2]),
        jnp.asarray([True]),
        key=jax.random.key(0)[None],
        sample=False,
    )
    assert q is None

    # every row in one buffer width (its length says where it ends; at least 10 free slots
    # after it), so one compiled program serves the 40 rows instead of op-by-op dispatch at
    # each row's own width
    @jax.jit
    def propose(row, length):
        _, guesses, _ = spec.propose(
            None, None, row, length, jnp.asarray([True]), key=jax.random.key(0)[None], sample=False
        )
        return guesses

    for _ in range(40):
        n = int(rng.integers(2, 30))
        ids = rng.integers(0, 6, n)
        gen = PromptLookupCandidateGenerator(
            num_output_tokens=5, max_matching_ngram_size=3, max_length=1000
        )
        out, _ = gen.get_candidates(torch.as_tensor(ids[None, :]))
        expected = out[0, n:].numpy()
        row = np.concatenate([ids, np.zeros(WIDTH - n, int)])[None, :]
        guesses = propose(jnp.asarray(row, jnp.int32), jnp.asarray([n]))
        got = np.asarray(guesses)[0]
        np.testing.assert_array_equal(got[: len(expected)], expected)
        assert np.all(got[len(expected) :] == -1)  # no guess past the match's continuation


# --- the acceptance rule ------------------------------------------------------------------------


def test_acceptance_rule_by_hand():
    """p, q given; the accepted count for chosen uniforms and the residual distribution."""
    p = jnp.asarray([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    q = jnp.asarray([[0.25, 0.5, 0.25], [0.5, 0.25, 0.25]])
    drafts = jnp.asarray([0, 0])
    # guess 1: token 0, p/q = 0.5/0.25 = 2 -> always accepted; guess 2: token 0, p/q = 0.2
    n = fg.speculative.accepted_count(p, q, drafts, jnp.asarray([0.99, 0.19]))
    assert int(n) == 2
    n = fg.speculative.accepted_count(p, q, drafts, jnp.asarray([0.99, 0.21]))
    assert int(n) == 1
    # after a rejection at position 1: max(p_1 - q_1, 0) = [0, 0.35, 0.05] / 0.4
    r = fg.speculative.residual(p[1], q[1], drafts[1])
    np.testing.assert_allclose(np.asarray(r), [0.0, 0.875, 0.125], atol=1e-6)
    # a one-hot guess (prompt lookup): accepted with probability p(d); residual p without d
    r = fg.speculative.residual(p[1], None, jnp.asarray(1))
    np.testing.assert_allclose(np.asarray(r), [0.25, 0.0, 0.75], atol=1e-6)
    assert int(fg.speculative.exact_match(jnp.asarray([2, 1, 0]), jnp.asarray([2, 1, 1, 0]))) == 2
    # fewer guesses than k: only the first num_guesses count
    assert int(fg.speculative.accepted_count(p, q, drafts, jnp.asarray([0.0, 0.0]), 1)) == 1
    short = fg.speculative.exact_match(jnp.asarray([2, 1, 0]), jnp.asarray([2, 1, 0, 0]), 1)
    assert int(short) == 1


def test_acceptance_rule_matches_transformers():
    """The same p, q, guesses and uniform draws give transformers' accepted count, and its next
    token lies in our residual's support."""
    torch = pytest.importorskip("torch")
    from transformers.generation.utils import _speculative_sampling

    rng = np.random.default_rng(1)
    for trial in range(30):
        k, vocab = 4, 7
        p_logits = rng.normal(size=(1, k + 1, vocab)).astype(np.float32) * 2
        q_logits = rng.normal(size=(1, k, vocab)).astype(np.float32) * 2
        drafts = rng.integers(0, vocab, k)
        ids = torch.as_tensor(np.concatenate([[3, 4], drafts])[None, :])
        torch.manual_seed(trial)
        uniforms = torch.rand(k).numpy()
        torch.manual_seed(trial)
        tokens, n_matches = _speculative_sampling(
            ids, torch.as_tensor(q_logits), k, torch.as_tensor(p_logits)
        )
        p = jax.nn.softmax(jnp.asarray(p_logits[0]), axis=-1)
        q = jax.nn.softmax(jnp.asarray(q_logits[0]), axis=-1)
        n = int(fg.speculative.accepted_count(p, q, jnp.asarray(drafts), jnp.asarray(uniforms)))
        assert n == int(n_matches), trial
        last = int(tokens[0, -1])
        dist = p[n] if n == k else fg.speculative.residual(p[n], q[n], jnp.asarray(drafts[n]))
        assert float(dist[last]) > 0


# --- the sampled distribution -------------------------------------------------------------------

VOCAB = 6
# Rows per sampled-distribution test. The target's distribution of the first three tokens is
# peaked (at temperature 0.8 the first token is id 3 with p = 0.98), so the chi-square's power is
# in a dozen cells: at 6,000 rows 13 cells expect 5 or more (17 at 24,000). The noncentrality of a
# wrong sampler, N * sum((q - p)^2 / p) over those cells, is at 6,000 rows 164 for temperature
# 0.9 instead of 0.8, 91 for 0.7, 173 for 1 draw in 100 taken from the draft's distribution and
# 9.8e3 for 1.3 (the sanity check below); against a critical value of 34.5 (13 degrees of
# freedom, p = 1e-3) each is rejected with probability above 0.99999 (the test's seed is fixed,
# so its outcome is too). 24,000 rows cost 4 times the sampling: 205 -> 97 s of CPU for the five.
DRAWS = 6_000


class SameToken(AbstractProposer):
    """A proposer that always guesses `token` (a bad, deterministic draft that ignores the
    guard: the search still cuts its guesses at the first one a constraint forbids)."""

    num_tokens: int = eqx.field(static=True, default=3)
    token: int = eqx.field(static=True, default=2)

    def init(self, target, rows, capacity):
        return None

    def propose(
        self, carry, target, token_ids, length, active, *, key, sample, guard=None, guard_state=None
    ):
        return carry, jnp.full((length.shape[0], self.num_tokens), self.token, jnp.int32), None

    def update(self, carry, token_ids, length):
        return carry


@pytest.fixture(scope="module")
def small_vocab():
    config = tiny_config(vocab_size=VOCAB, eos_token_id=(VOCAB - 1,), pad_token_id=0)
    model = fg.LlamaForCausalLM(config, key=jax.random.key(11), std=0.5)
    draft = fg.LlamaForCausalLM(
        tiny_config(vocab_size=VOCAB, num_hidden_layers=1, eos_token_id=(VOCAB - 1,)),
        key=jax.random.key(12),
        std=0.5,
    )
    return model, draft


PROMPT = [1, 2, 3, 1, 2]


@eqx.filter_jit
def next_logits(model, ids):
    """`model.prefill`'s next-token logits after `ids` (`[1, seq]`, no cache given), jitted: one
    compilation per length instead of op-by-op dispatch at each of the enumerated prefixes (43
    calls here, 11 s of CPU eagerly; the model is an argument, so its weights stay inputs)."""
    positions = jnp.arange(ids.shape[1])[None, :]
    return model.prefill(ids, positions, max_len=ids.shape[1])[0]


@pytest.fixture(scope="module")
def first_three_logits(small_vocab):
    """The target's logits after `PROMPT` and after every one- and two-token continuation of it
    (`[vocab]`, `[vocab, vocab]`, `[vocab, vocab, vocab]`), one uncached prefill each: computed
    once per module, since every sampled-distribution test (and both of its temperatures)
    enumerates the same 1 + 6 + 36 prefixes."""
    model, _ = small_vocab

    def logits_after(prefix):
        ids = jnp.asarray([PROMPT + list(prefix)])
        return np.asarray(next_logits(model, ids)[0, -1], np.float64)

    first = logits_after(())
    second = np.stack([logits_after((a,)) for a in range(VOCAB)])
    third = np.stack([[logits_after((a, b)) for b in range(VOCAB)] for a in range(VOCAB)])
    return first, second, third


def _exact_first_three(logits, temperature):
    """P(first three tokens) by enumeration from the model's own logits (no EOS: all ids):
    `p(a) p(b | a) p(c | a, b)` with each factor a softmax of the logits over `temperature`."""
    first, second, third = (
        np.asarray(jax.nn.softmax(jnp.asarray(x, jnp.float32) / temperature, axis=-1), np.float64)
        for x in logits
    )
    return first[:, None, None] * second[:, :, None] * third


def _chi_square_p(counts, expected):
    from scipy import stats

    counts, expected = counts.ravel(), expected.ravel()
    big = expected >= 5
    c = np.concatenate([counts[big], [counts[~big].sum()]])
    e = np.concatenate([expected[big], [expected[~big].sum()]])
    keep = e > 0
    return stats.chisquare(c[keep], e[keep] * c.sum() / e[keep].sum()).pvalue


def _draw_counts(model, speculative, seed):
    state = fg.SequenceState.from_token_ids([PROMPT] * DRAWS, vocab_size=VOCAB)
    kwargs = dict(
        max_new_tokens=3,
        eos_token_id=[],
        processors=[fg.processors.Temperature(0.8)],
        sampler=fg.samplers.Multinomial(),
        key=jax.random.key(seed),
    )
    if speculative is None:
        result = fg.generate(model, None, state, **kwargs)
    else:  # (and some guesses were accepted: the draws went through the rejection rule)
        result, _ = speculative_generate(model, None, state, speculative=speculative, **kwargs)
    ids = np.asarray(result.token_ids)[:, :3]
    counts = np.zeros((VOCAB,) * 3)
    np.add.at(counts, (ids[:, 0], ids[:, 1], ids[:, 2]), 1)
    return counts


@pytest.mark.parametrize("which", ["plain", "draft_model", "same_token", "perfect", "lookup"])
def test_sampled_distribution_equals_plain_sampling(small_vocab, first_three_logits, which):
    """Chi-square of the first three sampled tokens (`DRAWS` rows of one call) against the exact
    distribution by enumeration: speculation with a different draft, a draft that always guesses
    the same token, a perfect draft and prompt lookup all sample the target's distribution."""
    model, draft = small_vocab
    speculative = {
        "plain": None,
        "draft_model": fg.speculative.DraftModel(draft, num_tokens=2),
        "same_token": SameToken(),
        "perfect": fg.speculative.DraftModel(model, num_tokens=2),
        "lookup": fg.speculative.PromptLookup(num_tokens=3, max_ngram_size=2, cost_model=False),
    }[which]
    counts = _draw_counts(model, speculative, seed=5)
    expected = _exact_first_three(first_three_logits, 0.8) * DRAWS
    assert _chi_square_p(counts, expected) > 1e-3
    # a sanity check that the test can fail: another temperature's distribution is rejected
    wrong = _exact_first_three(first_three_logits, 1.3) * DRAWS
    assert _chi_square_p(counts, wrong) < 1e-6


# --- refusals -----------------------------------------------------------------------------------


def test_refusals(tiny):
    model, tok = tiny
    spec = fg.speculative.PromptLookup(num_tokens=3)
    with pytest.raises(ValueError, match="BeamSearch"):
        fg.generate(
            model,
            tok,
            PROMPTS,
            max_new_tokens=4,
            speculative=spec,
            sampler=fg.samplers.BeamSearch(num_beams=2),
        )
    other = fg.LlamaForCausalLM(tiny_config(vocab_size=50), key=jax.random.key(0))
    with pytest.raises(ValueError, match="vocabulary"):
        fg.generate(
            model, tok, PROMPTS, max_new_tokens=4, speculative=fg.speculative.DraftModel(other)
        )
    with pytest.raises(ValueError, match="fewer layers"):
        fg.generate(
            model,
            tok,
            PROMPTS,
            max_new_tokens=4,
            speculative=fg.speculative.EarlyExit(num_layers=2),
        )
    with pytest.raises(ValueError, match="cfg='batched'"):
        fg.generate(
            model,
            tok,
            PROMPTS,
            max_new_tokens=4,
            speculative=spec,
            guidance_scale=1.5,
            cfg="batched",
        )
    with pytest.raises(ValueError, match="num_tokens"):
        fg.speculative.PromptLookup(num_tokens=0)
    with pytest.raises(TypeError, match="AbstractCausalLM"):
        fg.speculative.DraftModel("not a model")


def test_stream_with_speculation(tiny):
    """`stream` yields every token of a speculative run; the joined pieces are generate's texts,
    and its result equals plain decoding's."""
    model, tok = tiny
    spec = fg.speculative.PromptLookup(num_tokens=4, max_ngram_size=3, cost_model=False)
    kwargs = dict(max_new_tokens=20, eos_token_id=[], stop_strings=["t42"])
    plain = fg.generate(model, tok, PROMPTS, **kwargs)
    s = fg.stream(model, tok, PROMPTS, speculative=spec, **kwargs)
    texts = [""] * len(PROMPTS)
    for row, piece in s:
        texts[row] += piece
    assert texts == plain.texts
    _assert_same(s.result, plain)
    # the per-step record: a row's counts sum to its tokens; a step adds the accepted guesses
    # plus one, and the final state's counts are the ones the compiled loop keeps
    final = _final(model, tok, PROMPTS, speculative=spec, **kwargs).search_state
    rows = len(PROMPTS)
    assert [sum(c) for c in s.tokens_per_step] == np.asarray(plain.num_tokens).tolist()
    assert max(max(c) for c in s.tokens_per_step) > 1  # some guesses were accepted
    assert (
        np.asarray(s.state.search_state.accepted)[:rows] == np.asarray(final.accepted)[:rows]
    ).all()
    for counts, accepted in zip(s.tokens_per_step, np.asarray(final.accepted)):
        # a step emits at most its accepted guesses plus the model's own token
        assert max(counts) <= spec.num_tokens + 1
        assert sum(max(c - 1, 0) for c in counts) <= accepted
    plain_stream = fg.stream(model, tok, PROMPTS, **kwargs)
    list(plain_stream)
    assert plain_stream.tokens_per_step == [[1] * int(n) for n in plain.num_tokens]


EDIT_PROMPTS = [
    "Rewrite with the names in capitals: alice met bob in paris. alice met bob in paris again.",
    "Fix the typo: def add(a, b):\n    retrun a + b\n\ndef sub(a, b):\n    retrun a - b\n",
    "Once upon a time",
]


# The two lossless tests below check an equality of outputs (speculative == plain greedy) that
# holds for any weights, so they run on the default model cut to 2 of its 30 layers
# (`two_layer_model`: the real tokenizer, vocabulary, chat template and matrix shapes): on the
# whole model they took 105 s of CPU, mostly compiling its 30 layers. `speculative_generate`
# still asserts that guesses were verified and accepted, so neither passes with speculation off.


def test_default_model_json_schema_is_lossless(two_layer_model):
    """The real model's shapes and tokenizer: prompt lookup under a JSON Schema constraint gives
    greedy's tokens."""
    model, tok = two_layer_model
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    kwargs = dict(max_new_tokens=24, processors=[fg.processors.JsonSchema(schema, tok)])
    plain = fg.generate(model, tok, EDIT_PROMPTS, **kwargs)
    spec = fg.speculative.PromptLookup(num_tokens=6, max_ngram_size=3, cost_model=False)
    fast, _ = speculative_generate(model, tok, EDIT_PROMPTS, speculative=spec, **kwargs)
    _assert_same(fast, plain)


def test_default_model_early_exit_is_lossless(two_layer_model):
    """The real model's first layer (of the 2-layer cut) as the draft: greedy's tokens."""
    model, tok = two_layer_model
    plain = fg.generate(model, tok, EDIT_PROMPTS, max_new_tokens=16)
    spec = fg.speculative.EarlyExit(num_layers=1, num_tokens=3)
    fast, _ = speculative_generate(model, tok, EDIT_PROMPTS, max_new_tokens=16, speculative=spec)
    _assert_same(fast, plain)
