"""Speculative decoding's features (issue 41): constraints mask the guesses before verification,
transformers' `assistant_model` / `assistant_early_exit`, classifier-free guidance, the target's
`top_logprobs`.

References: plain `fg.generate` without `speculative` (greedy token for token), a regex's
language walked by hand (which guesses it allows), and the counter of verified guesses that the
target's own processed logits forbid.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.generation import generate_with_final_state
from functional_gen.generation.planning import plan_call
from functional_gen.generation.program import run_prepared
from functional_gen.processors.base import Context
from functional_gen.speculative.guard import ProposalGuard
from functional_gen.structured.automaton import INFINITE_DISTANCE, TokenAutomaton
from functional_gen.structured.processor import TokenConstraint
from functional_gen.testing import tiny_config

from ..helpers import speculative_generate, tiny_tokenizer
from . import test_speculative as reference
from .test_speculative import VOCAB, SameToken, _assert_same, _chi_square_p, next_logits

PROMPTS = [
    "t5 t6 t7 t8 t5 t6 t7 t8 t5 t6",
    "t1 t2 t3 t1 t2 t3 t1 t2",
    "t9 t9 t9 t10 t11 t9 t9 t9 t10",
]
REGEX = r"(t1|t2|t3){3,6}t4"
small_vocab = reference.small_vocab  # the 6-token target and draft of the distribution tests
tiny = reference.tiny  # a random 2-layer Llama and a word-level tokenizer


@pytest.fixture(scope="module")
def draft():
    """A 1-layer draft of the same vocabulary."""
    return fg.LlamaForCausalLM(tiny_config(num_hidden_layers=1), key=jax.random.key(3), std=0.2)


def _final(model, tokenizer, prompts, options=None, **kwargs):
    """The final `GenerationState` of a call and its `Settings`."""
    _, settings, prepared = plan_call(model, tokenizer, prompts, options, **kwargs)
    final, _, _ = run_prepared(prepared)
    return final, settings


# --- a constraint masks the guesses ----------------------------------------------------------


def _guard(processors, tok, rows, max_new_tokens, vocab):
    """A guard at the start of generation for `rows` one-token prompts (`t0`)."""
    ids = jnp.zeros((rows, 16), jnp.int32)
    length = jnp.ones((rows,), jnp.int32)
    budget = jnp.full((rows,), max_new_tokens, jnp.int32)
    keys = jax.random.split(jax.random.key(0), rows)
    contexts = Context(
        token_ids=ids, length=length, prompt_length=length, max_new_tokens=budget, key=keys
    )
    states = tuple(jax.vmap(p.init)(contexts) for p in processors)
    return ProposalGuard.of(processors, states, ids, length, length, budget, keys, vocab)


def test_guard_cuts_guesses_at_the_first_forbidden_one():
    """`(t1|t2|t3){3,6}t4` walked by hand: the admissible prefix of each row's guesses, the
    budget included (4 tokens: a fourth `t1` can no longer reach `t4`)."""
    tok = tiny_tokenizer(101)
    regex = fg.processors.Regex(REGEX, tok)
    guesses = jnp.asarray(
        [
            [1, 2, 5, 1],  # t5 is outside the language: 2
            [1, 2, 3, 4],  # a whole word: 4
            [4, 1, 1, 1],  # t4 needs three tokens before it: 0
            [1, 1, 1, 1],  # within 4 tokens, the 4th must be t4: 3
            [2, 3, -1, 1],  # no guess after the -1: 2
        ]
    )
    guard, carry = _guard((regex,), tok, 5, 4, 101)
    n = guard.admissible(carry, guesses, jnp.full((5,), 4))
    np.testing.assert_array_equal(np.asarray(n), [2, 4, 0, 3, 2])
    n = guard.admissible(carry, guesses, jnp.asarray([1, 4, 4, 2, 4]))  # capped by num_guesses
    np.testing.assert_array_equal(np.asarray(n), [1, 4, 0, 2, 2])
    # no constraint among the processors: no guard
    assert ProposalGuard.of(
        (fg.processors.Temperature(0.5),), ((),), None, None, None, None, None, 101
    ) == (None, None)


PROPOSERS = {
    "prompt_lookup": lambda draft: fg.speculative.PromptLookup(
        num_tokens=4, max_ngram_size=2, cost_model=False
    ),
    "draft_model": lambda draft: fg.speculative.DraftModel(draft, num_tokens=3),
    "early_exit": lambda draft: fg.speculative.EarlyExit(num_layers=1, num_tokens=3),
}


@pytest.mark.parametrize("name", sorted(PROPOSERS))
def test_constraint_wastes_no_verification(tiny, draft, name):
    """Under a `Regex`, no verified guess is one the constraint forbids (the counter of guesses
    whose processed target logit is -inf stays 0, while guesses are made), and the output,
    `top_logprobs` of the target included, is plain greedy's."""
    model, tok = tiny
    kwargs = dict(
        max_new_tokens=10,
        eos_token_id=[],
        processors=[fg.processors.Regex(REGEX, tok)],
        top_logprobs=3,
    )
    spec = PROPOSERS[name](draft)
    fast, counts = speculative_generate(model, tok, PROMPTS, speculative=spec, **kwargs)
    assert counts.forbidden.tolist() == [0] * len(PROMPTS)
    plain = fg.generate(model, tok, PROMPTS, **kwargs)
    _assert_same(fast, plain, top=True)


ALWAYS_FIVE = SameToken(token=5)  # always guesses `t5`, ignoring the guard


def test_guesses_of_any_proposer_are_cut(tiny):
    """A proposer that ignores the guard still has its guesses cut: `t5` is outside the regex's
    language, so nothing is verified (0 proposed, 0 forbidden) and the output is greedy's."""
    model, tok = tiny
    kwargs = dict(max_new_tokens=8, eos_token_id=[], processors=[fg.processors.Regex(REGEX, tok)])
    final, _ = _final(model, tok, PROMPTS, speculative=ALWAYS_FIVE, **kwargs)
    rows = len(PROMPTS)
    assert np.asarray(final.search_state.proposed)[:rows].tolist() == [0] * rows
    assert np.asarray(final.search_state.forbidden)[:rows].tolist() == [0] * rows
    _assert_same(
        fg.generate(model, tok, PROMPTS, speculative=ALWAYS_FIVE, **kwargs),
        fg.generate(model, tok, PROMPTS, **kwargs),
    )


def test_forbidden_counts_wasted_verification(tiny):
    """The counter is not always 0: a token suppressed by a processor that is no constraint is
    not masked before verification, and prompt lookup guesses it (row 0 repeats `t7`)."""
    model, tok = tiny
    kwargs = dict(max_new_tokens=8, eos_token_id=[], processors=[fg.processors.SuppressTokens([7])])
    spec = fg.speculative.PromptLookup(num_tokens=4, max_ngram_size=2, cost_model=False)
    # (no acceptance asked: the row's lookups continue with the suppressed `t7`)
    fast, final = generate_with_final_state(model, tok, PROMPTS[:1], speculative=spec, **kwargs)
    assert int(final.search_state.forbidden[0]) > 0
    _assert_same(fast, fg.generate(model, tok, PROMPTS[:1], **kwargs))


# a constraint over 6 tokens (EOS 5): tokens 1, 2, 3, never the same one twice in a row; every
# state accepting, EOS looping on it; tokens 0 and 4 never allowed
NO_REPEAT = dict(
    token_class=np.asarray([0, 1, 2, 3, 0, 4], np.int32),
    transitions=np.asarray(
        [[0, 0, 0, 0, 0], [0, 2, 3, 4, 1], [0, 0, 3, 4, 2], [0, 2, 0, 4, 3], [0, 2, 3, 0, 4]],
        np.int32,
    ),
    distance=np.asarray([INFINITE_DISTANCE, 0, 0, 0, 0], np.int32),
    eos_token_id=(VOCAB - 1,),
)


def _exact_constrained(model, prompt, temperature):
    """P(first three tokens) by enumeration: the model's tempered distribution restricted to the
    tokens `NO_REPEAT` allows after each prefix, renormalised."""
    probs = np.zeros((VOCAB,) * 3)

    def dist(prefix):
        logits = next_logits(model, jnp.asarray([list(prompt) + list(prefix)]))
        p = np.asarray(jax.nn.softmax(logits[0, -1] / temperature), np.float64)
        last = [t for t in prefix if t != VOCAB - 1][-1:]  # EOS leaves the state as it is
        allowed = np.isin(np.arange(VOCAB), [1, 2, 3, VOCAB - 1]) & ~np.isin(np.arange(VOCAB), last)
        p = np.where(allowed, p, 0.0)
        return p / p.sum()

    p1 = dist(())
    for a in range(VOCAB):
        if p1[a] == 0:
            continue
        p2 = dist((a,))
        for b in range(VOCAB):
            if p2[b] > 0:
                probs[a, b] = p1[a] * p2[b] * dist((a, b))
    return probs


def test_sampled_distribution_under_a_constraint(small_vocab):
    """Sampling with a draft model under a stateful constraint: the draft draws from its
    distribution masked by the constraint along its own guesses (q renormalised), and the first
    three tokens of 12,000 rows have the exact constrained distribution (chi-square against
    enumeration), with no verified guess forbidden."""
    model, draft = small_vocab
    prompt = [1, 2, 3, 1, 2]
    draws = 12_000  # as the docstring says (test_speculative.py's DRAWS has its own power argument)
    state = fg.SequenceState.from_token_ids([prompt] * draws, vocab_size=VOCAB)
    kwargs = dict(
        max_new_tokens=3,
        eos_token_id=[],
        processors=[fg.processors.Temperature(0.8), TokenConstraint(TokenAutomaton(**NO_REPEAT))],
        sampler=fg.samplers.Multinomial(),
        key=jax.random.key(5),
        speculative=fg.speculative.DraftModel(draft, num_tokens=2),
    )
    final, _ = _final(model, None, state, **kwargs)
    assert int(np.sum(np.asarray(final.search_state.forbidden))) == 0
    assert int(np.sum(np.asarray(final.search_state.accepted))) > draws // 4
    ids = np.asarray(final.token_ids)[:draws, len(prompt) : len(prompt) + 3]
    counts = np.zeros((VOCAB,) * 3)
    np.add.at(counts, (ids[:, 0], ids[:, 1], ids[:, 2]), 1)
    expected = _exact_constrained(model, prompt, 0.8) * draws
    assert counts[expected == 0].sum() == 0
    assert _chi_square_p(counts, expected) > 1e-3
    # a sanity check that the test can fail: another temperature's distribution is rejected
    assert _chi_square_p(counts, _exact_constrained(model, prompt, 1.3) * draws) < 1e-6


# --- transformers' names: assistant_model, assistant_early_exit ---------------------------------


def test_assistant_model_is_a_draft_model(tiny, draft):
    """`assistant_model=draft` speculates with `DraftModel(draft, num_tokens=4)` (or the
    config's `num_assistant_tokens`) and gives plain greedy's tokens."""
    model, tok = tiny
    kwargs = dict(max_new_tokens=12, eos_token_id=[])
    options = fg.GenerationOptions(assistant_model=draft, **kwargs)
    _, settings = _final(model, tok, PROMPTS, options)
    proposer = settings.step.search.proposer
    assert isinstance(proposer, fg.speculative.DraftModel) and proposer.num_tokens == 4
    assert proposer.draft is draft
    config = {"num_assistant_tokens": 2}  # (planned only, not run)
    _, settings, _ = plan_call(
        model, tok, PROMPTS, assistant_model=draft, generation_config=config, **kwargs
    )
    assert settings.step.search.proposer.num_tokens == 2
    plain = fg.generate(model, tok, PROMPTS, **kwargs)
    # this random draft agrees with the target on no guess (verified 48 per row, accepted 0):
    # lossless when everything is rejected ...
    _assert_same(fg.generate(model, tok, PROMPTS, assistant_model=draft, **kwargs), plain)
    # ... and, with the target as its own assistant, when everything is accepted (the keyword's
    # path speculates: `speculative_generate` asserts verified and accepted guesses)
    fast, counts = speculative_generate(model, tok, PROMPTS, assistant_model=model, **kwargs)
    # every guess agrees; only those past `max_new_tokens` in the last step are not taken
    assert np.all(counts.accepted >= counts.proposed - 4), (counts.accepted, counts.proposed)
    _assert_same(fast, plain)


def test_assistant_early_exit_is_early_exit(tiny):
    """A generation config's `assistant_early_exit` (LayerSkip) selects `EarlyExit`."""
    model, tok = tiny
    config = {"assistant_early_exit": 1, "num_assistant_tokens": 3, "max_new_tokens": 12}
    _, settings, _ = plan_call(model, tok, PROMPTS, generation_config=config, eos_token_id=[])
    proposer = settings.step.search.proposer
    assert isinstance(proposer, fg.speculative.EarlyExit)
    assert (proposer.num_layers, proposer.num_tokens) == (1, 3)
    plain = fg.generate(model, tok, PROMPTS, max_new_tokens=12, eos_token_id=[])
    fast, _ = speculative_generate(model, tok, PROMPTS, generation_config=config, eos_token_id=[])
    _assert_same(fast, plain)


def test_assistant_model_refusals(tiny, draft):
    model, tok = tiny
    spec = fg.speculative.PromptLookup(num_tokens=3)
    with pytest.raises(ValueError, match=r"either `speculative`.*or `assistant_model`"):
        fg.generate(model, tok, PROMPTS, max_new_tokens=4, speculative=spec, assistant_model=draft)
    other = fg.LlamaForCausalLM(tiny_config(vocab_size=50), key=jax.random.key(0))
    with pytest.raises(ValueError, match="vocabulary has 50 tokens, the target's 101"):
        fg.generate(model, tok, PROMPTS, max_new_tokens=4, assistant_model=other)
    with pytest.raises(TypeError, match="AbstractCausalLM"):
        fg.generate(model, tok, PROMPTS, max_new_tokens=4, assistant_model="a draft")
    with pytest.raises(ValueError, match="cfg='batched'"):
        fg.generate(
            model,
            tok,
            PROMPTS,
            max_new_tokens=4,
            assistant_model=draft,
            guidance_scale=1.5,
            cfg="batched",
        )


# --- classifier-free guidance -------------------------------------------------------------------


def test_guidance_processor_is_lossless(tiny):
    """Classifier-free guidance in its processor form (the negative branch's cache in the
    processor state, one state per verified position): speculation gives plain greedy's tokens
    and `top_logprobs`. (`cfg='batched'` is refused: `test_speculative.py::test_refusals`.)"""
    model, tok = tiny
    kwargs = dict(
        max_new_tokens=12,
        eos_token_id=[],
        guidance_scale=1.5,
        negative_prompt="t3 t4",
        cfg="processor",
        top_logprobs=2,
    )
    plain = fg.generate(model, tok, PROMPTS, **kwargs)
    spec = fg.speculative.PromptLookup(num_tokens=4, max_ngram_size=2, cost_model=False)
    # (no acceptance asserted: on these prompts the guided rows accept no looked-up guess,
    # verified [5, 3, 7], accepted 0; a soft spot left open, issue 56)
    _assert_same(fg.generate(model, tok, PROMPTS, speculative=spec, **kwargs), plain, top=True)


# --- sharding -------------------------------------------------------------------------------------

MESH_WORKER = textwrap.dedent(
    """
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    sys.path.insert(0, os.getcwd())
    import jax, numpy as np
    import functional_gen as fg
    from functional_gen.testing import tiny_config
    from tests.helpers import tiny_tokenizer

    def llama(layers, seed):  # a vocabulary of 128 splits over 2 devices
        config = tiny_config(vocab_size=128, num_hidden_layers=layers, eos_token_id=(127,))
        return fg.LlamaForCausalLM(config, key=jax.random.key(seed), std=0.2)

    model, draft, tok = llama(2, 7), llama(1, 3), tiny_tokenizer(128)
    prompts = ["t5 t6 t7 t8 t5 t6 t7 t8 t5 t6", "t1 t2 t3 t1 t2 t3 t1 t2"]
    regex = fg.processors.Regex("(t1|t2|t3){3,6}t4", tok)
    calls = {"plain": dict(), "regex": dict(processors=[regex])}
    refs = {
        c: np.asarray(fg.generate(model, tok, prompts, max_new_tokens=8, eos_token_id=[],
                                  **kw).token_ids).tolist()
        for c, kw in calls.items()
    }
    out = {}
    for shape in [(1, 2), (2, 1)]:
        mesh = fg.make_mesh(*shape)
        sharded = fg.shard(model, mesh)
        specs = {
            "draft": ("regex", fg.speculative.DraftModel(fg.shard(draft, mesh), num_tokens=3)),
        }
        if shape == (1, 2):  # (rows split over "data" is the simpler case: one proposer)
            specs["lookup"] = ("plain", fg.speculative.PromptLookup(num_tokens=4, max_ngram_size=2, cost_model=False))
            specs["early_exit"] = ("plain", fg.speculative.EarlyExit(num_layers=1, num_tokens=3))
        for name, (c, spec) in specs.items():
            got = fg.generate(sharded, tok, prompts, max_new_tokens=8, eos_token_id=[],
                              speculative=spec, **calls[c])
            out[f"{shape} {name}"] = np.asarray(got.token_ids).tolist() == refs[c]
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_speculation_on_meshes_of_2_devices():
    """Speculative generation on (1, 2) (weights split: every proposer) and (2, 1) (rows split:
    a sharded draft model under a `Regex`) meshes of forced CPU devices gives the one-device
    tokens. A subprocess: the device count is fixed when JAX starts."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run(
        [sys.executable, "-c", MESH_WORKER],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=root,
        env={
            **os.environ,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(out) == 4 and all(out.values()), out
