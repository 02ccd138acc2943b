"""Speculative decoding in the serving engine (`Engine(..., speculative=proposer)`), on a tiny
random Llama: every request's tokens equal `fg.generate` of its prompt alone (greedy: plain
greedy decoding; seeded sampling: `fg.generate` with the same proposer and seed), with requests
of different lengths inserted and finishing at different dispatches, and the dispatches'
counts show that guesses were verified AND accepted (a lossless test passes with speculation
silently off)."""

import asyncio

import jax
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.testing import tiny_config

from ..helpers import speculative_generate, tiny_tokenizer

VOCAB = 101


@pytest.fixture(scope="module")
def tiny():
    """A random 2-layer Llama and a word-level tokenizer (as tests/generation/test_speculative)."""
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(7), std=0.2)
    return model, tiny_tokenizer(VOCAB)


def repetitive(length, seed):
    """A prompt that repeats a short random phrase (prompt lookup finds guesses in it)."""
    phrase = np.random.default_rng(seed).integers(2, VOCAB - 1, 4).tolist()
    return (phrase * length)[:length]


def serve(engine, schedule):
    """Run `schedule` (`(dispatch, slot, request)`: insert `request` into `slot` before dispatch
    number `dispatch`, or as soon as the slot is free after it) until every request is done.

    **Returns:** per request its tokens, and the guesses verified and accepted over the run."""
    state = engine.init_decode_state()
    got = {i: [] for i in range(len(schedule))}
    waiting = list(enumerate(schedule))
    running: dict[int, int] = {}  # slot -> request index
    verified = accepted = 0
    dispatch = 0
    while waiting or running:
        for i, (d, slot, request) in list(waiting):
            if d <= dispatch and slot not in running:
                state = engine.insert(engine.prefill(request), state, slot)
                running[slot] = i
                waiting.remove((i, (d, slot, request)))
        state, out = engine.generate(state)
        verified += int(np.sum(out.verified))
        accepted += int(np.sum(out.accepted))
        for slot, i in list(running.items()):
            got[i].extend(t for t in out.token_ids[:, slot].tolist() if t >= 0)
            if bool(out.done[slot]):
                del running[slot]
        dispatch += 1
    return [got[i] for i in range(len(schedule))], verified, accepted


def alone(model, tokenizer, request, **kwargs):
    """`fg.generate` of `request`'s prompt alone (its tokens, an EOS included)."""
    ids = list(request.token_ids)
    state = fg.SequenceState.from_token_ids([ids], vocab_size=VOCAB, tokenizer=tokenizer)
    if "speculative" in kwargs:
        out, _ = speculative_generate(
            model, tokenizer, state, max_new_tokens=request.max_new_tokens, **kwargs
        )
    else:
        out = fg.generate(model, tokenizer, state, max_new_tokens=request.max_new_tokens, **kwargs)
    n = int(out.state.arrays.length[0]) - len(ids)
    return [int(t) for t in out.token_ids[0, :n]]


PROPOSERS = {
    "prompt_lookup": lambda model: fg.speculative.PromptLookup(
        num_tokens=4, max_ngram_size=2, cost_model=False
    ),
    # the target with its weights perturbed: a draft that agrees often, not always
    "draft_model": lambda model: fg.speculative.DraftModel(
        jax.tree.map(
            lambda x: (
                x + 0.05 * jax.random.normal(jax.random.key(5), x.shape, x.dtype)
                if isinstance(x, jax.Array) and jax.numpy.issubdtype(x.dtype, jax.numpy.floating)
                else x
            ),
            model,
        ),
        num_tokens=3,
    ),
}

# (dispatch, slot, prompt length): requests start at different dispatches, one of them in the
# slot another one frees, and end at different ones (every prompt in one bucket and one
# `max_new_tokens`, so that each reference compiles once)
SPECS = [(0, 0, 9), (1, 1, 5), (2, 2, 14), (3, 1, 7)]
MAX_NEW = 16


def test_prompt_lookup_greedy_slots_get_plain_greedy_tokens(tiny):
    """Prompt lookup: each greedy request gets `fg.generate`'s plain greedy tokens alone, and
    guesses were verified and accepted; through the orchestrator too."""
    model, tok = tiny
    spec = PROPOSERS["prompt_lookup"](model)
    engine = fg.serving.Engine(model, tok, max_slots=3, max_len=48, speculative=spec)
    schedule = [
        (d, s, engine.request(repetitive(n, i), MAX_NEW)) for i, (d, s, n) in enumerate(SPECS)
    ]
    results, verified, accepted = serve(engine, schedule)
    assert verified > 0 and accepted > 0, (verified, accepted)
    for (_, _, request), tokens in zip(schedule, results):
        assert tokens == alone(model, tok, request)

    # the same engine through its orchestrator (`Engine.stream`), two streams at once: each
    # text is `fg.generate`'s, and the orchestrator counted verified and accepted guesses
    prompts = [" ".join(f"t{t}" for t in repetitive(n, 10 + n)) for n in (6, 11)]
    options = fg.GenerationOptions(max_new_tokens=MAX_NEW)

    async def collect(prompt):
        return "".join([piece async for piece in engine.stream(prompt, options)])

    async def both():
        return await asyncio.gather(*(collect(p) for p in prompts))

    try:
        texts = asyncio.run(both())
        orchestrator = engine.orchestrator
        assert orchestrator.verified_tokens > 0 and orchestrator.accepted_tokens > 0
    finally:
        engine.close()
    for prompt, text in zip(prompts, texts):
        assert text == fg.generate(model, tok, prompt, options).texts[0]


def test_draft_model_greedy_and_seeded_sampled_slots(tiny):
    """A draft model, greedy and seeded sampled requests in one batch: each greedy request gets
    plain greedy decoding's tokens, each sampled one the tokens of `fg.generate(...,
    speculative=proposer, key=jax.random.key(seed))` alone; guesses were verified and accepted
    (in the engine and in each sampled reference)."""
    model, tok = tiny
    spec = PROPOSERS["draft_model"](model)
    engine = fg.serving.Engine(model, tok, max_slots=3, max_len=48, speculative=spec)
    sampled = {0, 2}
    schedule = [
        (
            d,
            s,
            engine.request(
                repetitive(n, i), MAX_NEW, temperature=0.7 if i in sampled else 0.0, seed=i
            ),
        )
        for i, (d, s, n) in enumerate(SPECS)
    ]
    results, verified, accepted = serve(engine, schedule)
    assert verified > 0 and accepted > 0, (verified, accepted)
    for i, ((_, _, request), tokens) in enumerate(zip(schedule, results)):
        if i in sampled:
            want = alone(
                model,
                tok,
                request,
                speculative=spec,
                do_sample=True,
                temperature=0.7,
                key=jax.random.key(i),
            )
        else:
            want = alone(model, tok, request)
        assert tokens == want, i


def test_refusals(tiny):
    """A proposer must be one, and a draft must share the target's vocabulary: refused at
    construction, naming the value. (A paged engine speculates: test_paged_speculative.)"""
    model, tok = tiny
    with pytest.raises(TypeError, match="proposer"):
        fg.serving.Engine(model, tok, max_slots=2, max_len=64, speculative="prompt-lookup")
    other = fg.LlamaForCausalLM(tiny_config(vocab_size=50), key=jax.random.key(0))
    with pytest.raises(ValueError, match="vocabulary"):
        fg.serving.Engine(
            model, tok, max_slots=2, max_len=64, speculative=fg.speculative.DraftModel(other)
        )
