"""`ClassifierFreeGuidance` (the processor form) against transformers' PyTorch
`generate(guidance_scale=s[, negative_prompt_ids=...])`: identical greedy tokens and processed
scores within 1e-4 of `output_scores`, on tiny random checkpoints and on the default model; the
rescale blend against a hand computation; state shapes, per-row values, constraints after it."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
import functional_gen.processors as P
from functional_gen.processors import ClassifierFreeGuidance, check_guidance_first
from functional_gen.processors.base import Context
from functional_gen.testing import CountingModel

from ..helpers import save_checkpoint, tiny_hf_model

torch = pytest.importorskip("torch")

MAX_NEW = 24
SCALES = (0.0, 1.5, 3.0)
EOS = 100  # the tiny checkpoints' EOS id


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """`(ours, transformers')`: one tiny random Llama (std 0.1: varied greedy continuations),
    loaded into functional_gen from its saved checkpoint."""
    hf = tiny_hf_model("llama", std=0.1, seed=0)
    model, _ = fg.load_model(save_checkpoint(hf, tmp_path_factory.mktemp("cfg") / "ckpt"))
    return model, hf


def hf_generate(hf, prompt, scale, negative=None, max_new_tokens=MAX_NEW, **kwargs):
    """transformers' greedy CFG generation of one prompt: `(new token ids, [step scores])`."""
    ids = torch.tensor([prompt])
    if negative is not None:
        kwargs["negative_prompt_ids"] = torch.tensor([negative])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            guidance_scale=scale,
            output_scores=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    return out.sequences[0, len(prompt) :].tolist(), [s[0].float().numpy() for s in out.scores]


def generated_rows(state, pad=-1):
    """Each row's generated tokens (up to its end), as lists."""
    ids = np.asarray(state.generated_token_ids(pad))
    return [[t for t in row if t != pad] for row in ids.tolist()]


@eqx.filter_jit
def _init(processor, context):
    return processor.init(context)


@eqx.filter_jit
def _process(processor, state, logits, context):
    return processor.process(state, logits, context)


@eqx.filter_jit
def _forward(model, token_ids):
    """The logits at every position of `token_ids` (`[1, seq]`), from a fresh cache."""
    seq = token_ids.shape[1]
    logits, _ = model(token_ids, jnp.arange(seq)[None], model.init_cache(1, seq))
    return logits


def replay(model, processor, prompt, generated, max_len=64):
    """The processor's output at every step along a fixed sequence, run unbatched (the model
    sees a batch of 1, as inside the vmapped loop). Conditional logits: ONE full forward of
    `model` over prompt + generated tokens, right-padded to `max_len` (the causal mask keeps
    the padding out of every earlier position's logits) so that every row and test shares one
    compiled forward; called eagerly instead, the forward compiled each of the default model's
    30 layers' `lax.cond` separately for every length (~20 s per row on 2 cores). `max_len`:
    the contexts' static length."""
    ids = list(prompt) + list(generated)
    padded = np.zeros((1, max_len), np.int32)
    padded[0, : len(ids)] = ids
    logits = _forward(model, jnp.asarray(padded))

    def context(length):
        row = np.zeros(max_len, np.int32)
        row[:length] = ids[:length]  # only the tokens so far: nothing from the future leaks in
        return Context(
            jnp.asarray(row),
            jnp.int32(length),
            jnp.int32(len(prompt)),
            jnp.int32(MAX_NEW),
            jax.random.key(0),
        )

    state = _init(processor, context(len(prompt)))
    outs = []
    for t in range(len(generated)):
        length = len(prompt) + t
        state, out = _process(processor, state, logits[0, length - 1], context(length))
        outs.append(np.asarray(out))
    return outs


def assert_scores_close(ours, theirs, scale):
    """Within 1.5e-4 per branch: the mix `s * cond + (1 - s) * uncond` carries each branch's
    float32 rounding times |s| and |1 - s|, so the bound is `(|s| + |1 - s|) * 1.5e-4` (1.5e-4
    for 0 <= s <= 1, 3e-4 at s = 1.5, 7.5e-4 at s = 3). Per branch: SmolLM2's logits reach
    |30|, where float32's spacing is 1.9e-6 and transformers' sums in another order differ by up
    to ~1.1e-4 (the CI machine of 2026-11-28: 2.04e-4 after the s = 1.5 mix, one logit of
    49,152, against the 2e-4 a 1e-4 per-branch bound gave)."""
    atol = 1.5e-4 * max(1.0, abs(scale) + abs(1 - scale))
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=f"step {step}")


# --- parity with transformers on a tiny random checkpoint ---------------------------------------

PROMPTS = ([5, 17, 42, 8, 63, 21, 9], [33, 2, 71], [12, 88, 45, 3, 27, 56, 90, 14, 61, 7, 38])
NEGATIVE = [44, 19, 72, 6, 50]


@pytest.mark.parametrize("negative", [None, NEGATIVE], ids=["no-negative", "negative"])
@pytest.mark.parametrize("scale", SCALES)
def test_tiny_greedy_tokens_and_scores_equal_transformers(tiny, scale, negative):
    """Three prompts of different lengths in one padded batch: every row's 24 greedy tokens are
    transformers' (each prompt alone), and the processed scores equal `output_scores` to 1e-4."""
    model, hf = tiny
    processor = ClassifierFreeGuidance(model, scale, negative_prompt_ids=negative)
    state = fg.generate_token_ids(model, PROMPTS, max_new_tokens=MAX_NEW, processors=[processor])
    distinct = set()
    for prompt, ours in zip(PROMPTS, generated_rows(state)):
        expected, scores = hf_generate(hf, prompt, scale, negative)
        assert ours == expected
        distinct.update(expected)
        assert_scores_close(replay(model, processor, prompt, expected), scores, scale)
        # the loop's chosen-token logprobs are those of transformers' processed distribution
        chosen = [
            torch.log_softmax(torch.tensor(s), -1)[t].item() for s, t in zip(scores, expected)
        ]
        row = PROMPTS.index(prompt)
        np.testing.assert_allclose(
            np.asarray(state.logprobs)[row, : len(expected)], chosen, atol=1e-4
        )
    assert len(distinct) > 8  # the continuations are not one repeated token


def test_tiny_per_row_negative_prompts_equal_transformers(tiny):
    """One negative prompt per row (a [batch, n] array, as transformers' `negative_prompt_ids`)."""
    model, hf = tiny
    prompts = [[5, 17, 42, 8], [60, 3, 91, 22]]
    negatives = [[44, 19, 72], [7, 7, 30]]
    processor = ClassifierFreeGuidance(model, 2.0, negative_prompt_ids=np.asarray(negatives))
    state = fg.generate_token_ids(model, prompts, max_new_tokens=MAX_NEW, processors=[processor])
    ids = torch.tensor(prompts)
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=MAX_NEW,
            guidance_scale=2.0,
            negative_prompt_ids=torch.tensor(negatives),
        )
    for ours, theirs in zip(generated_rows(state), out[:, 4:].tolist()):
        assert ours == theirs[: len(ours)]  # transformers pads a finished row after its EOS
        assert len(ours) == MAX_NEW or ours[-1] == EOS


def test_per_row_scales_and_ragged_negative_prompts_equal_each_row_alone(tiny):
    """Per-row guidance scales, rescale values and negative prompts of different lengths (padded
    with -1 inside the processor) give each row what it gets alone with scalar values."""
    model, _ = tiny
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1]]
    negatives = [[44, 19, 72, 6, 50], [9], [30]]
    scales, rescales = [0.5, 1.5, 3.0], [1.0, 0.7, 0.3]
    batched = fg.generate_token_ids(
        model,
        prompts,
        max_new_tokens=12,
        processors=[ClassifierFreeGuidance(model, scales, negatives, rescale=rescales)],
    )
    for i in (1, 2):  # the padded rows (one compiled program: same shapes, new float leaves)
        alone = fg.generate_token_ids(
            model,
            [prompts[i]],
            max_new_tokens=12,
            processors=[
                ClassifierFreeGuidance(model, scales[i], negatives[i], rescale=rescales[i])
            ],
        )
        assert generated_rows(batched)[i] == generated_rows(alone)[0]
        np.testing.assert_allclose(
            np.asarray(batched.logprobs)[i], np.asarray(alone.logprobs)[0], atol=1e-5
        )


def test_scale_one_returns_the_log_softmaxed_logits(tiny):
    model, _ = tiny
    logits = jax.random.normal(jax.random.key(0), (2, 101)) * 3
    token_ids = jnp.asarray([PROMPTS[0][:5], PROMPTS[2][:5]])
    out = P.apply([ClassifierFreeGuidance(model, 1.0, NEGATIVE, rescale=0.5)], logits, token_ids)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.nn.log_softmax(logits, -1)))


def test_multinomial_at_scale_one_samples_what_plain_decoding_samples(tiny):
    """At scale 1 CFG only log-softmaxes the logits: the same draws as without it."""
    model, _ = tiny
    kwargs = dict(max_new_tokens=12, sampler=fg.samplers.Multinomial(), key=jax.random.key(3))
    plain = fg.generate_token_ids(model, PROMPTS, **kwargs)
    guided = fg.generate_token_ids(
        model, PROMPTS, processors=[ClassifierFreeGuidance(model, 1.0)], **kwargs
    )
    assert generated_rows(guided) == generated_rows(plain)


# --- the rescale blend, hand-computed ------------------------------------------------------------


def test_rescale_blend_equals_hand_computation(tiny):
    """out = log_softmax(r * log_softmax(cfg) + (1 - r) * cond), cfg = s * (cond - uncond) +
    uncond, with the unconditional logits from transformers' model on the negative prompt;
    per-row scales and rescales, r = 0 (no guidance) and r = 1 (renormalised CFG) included."""
    model, hf = tiny
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=(4, 101)) * 4).astype(np.float32)
    token_ids = rng.integers(1, 100, (4, 6))
    scales = np.asarray([2.5, -1.0, 0.0, 4.0], np.float32)
    rescales = np.asarray([0.7, 0.0, 1.0, 0.25], np.float32)
    out = P.apply(
        [ClassifierFreeGuidance(model, scales, NEGATIVE, rescale=rescales)], logits, token_ids
    )
    with torch.no_grad():
        uncond_logits = hf(torch.tensor([NEGATIVE])).logits[0, -1].double().numpy()

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    cond = log_softmax(logits.astype(np.float64))
    uncond = log_softmax(uncond_logits)[None]
    s, r = scales[:, None].astype(np.float64), rescales[:, None].astype(np.float64)
    cfg = s * (cond - uncond) + uncond
    expected = log_softmax(r * log_softmax(cfg) + (1 - r) * cond)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-4)
    np.testing.assert_allclose(np.asarray(out)[1], cond[1], atol=1e-5)  # r = 0: conditional


# --- state, chains, validation ------------------------------------------------------------------


def _context(ids, length, max_len=16):
    row = jnp.zeros((max_len,), jnp.int32).at[: len(ids)].set(jnp.asarray(ids))
    return Context(row, jnp.int32(length), jnp.int32(3), jnp.int32(10), jax.random.key(0))


@pytest.mark.parametrize("negative", [None, [4], [4, 5, 6], [[-1, 4], [5, 6]]])
def test_state_keeps_its_shapes_and_counts_positions(negative):
    """`process` returns a state of the same structure, shapes and dtypes (a while_loop carry);
    each call writes one cache slot at the next position."""
    model = CountingModel(vocab_size=32)
    processor = ClassifierFreeGuidance(model, 2.0, negative)
    if isinstance(negative, list) and isinstance(negative[0], list):
        processor = eqx.tree_at(
            lambda p: p.negative_prompt_ids, processor, processor.negative_prompt_ids[0]
        )  # row 0: [-1, 4]
    ids = [1, 2, 3, 7, 8]
    state = _init(processor, _context(ids, 3))
    shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
    n_real = 1 if negative is None else (1 if isinstance(negative[0], list) else len(negative))
    assert int(state.position) == n_real - 1
    for length in (3, 4, 5):
        logits = jnp.zeros(32)
        state, out = _process(processor, state, logits, _context(ids, length))
        assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
        assert out.shape == (32,)
    assert int(state.position) == n_real - 1 + 3
    assert int(state.cache.length[0]) == state.cache.positions.shape[1] - 16 + 3  # n - 1 + 3
    # the counting model's unconditional branch saw the pending token, then tokens 7 and 8
    written = np.asarray(state.cache.positions[0])
    assert written[written >= 0].tolist()[-3:] == [n_real - 1, n_real, n_real + 1]


def test_extend_state_gives_the_shapes_of_a_longer_context_and_keeps_the_branch():
    """Continuing with a longer context: the grown state has `init`'s shapes for that length,
    and the next `process` sees the same unconditional logits as without growing."""
    model = CountingModel(vocab_size=32)
    processor = ClassifierFreeGuidance(model, 2.0, [4, 5, 6])
    ids = [1, 2, 3, 7, 8]
    state, _ = _process(
        processor, _init(processor, _context(ids, 3)), jnp.zeros(32), _context(ids, 3)
    )
    grown = processor.extend_state(state, 24)
    fresh = _init(processor, _context(ids, 3, max_len=24))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), grown) == jax.tree.map(
        lambda x: (x.shape, x.dtype), fresh
    )
    _, out = _process(processor, state, jnp.zeros(32), _context(ids, 4))
    _, out_grown = _process(processor, grown, jnp.zeros(32), _context(ids, 4, max_len=24))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(out_grown))
    with pytest.raises(ValueError, match="cannot shrink"):
        processor.extend_state(grown, 16)


def test_a_regex_after_guidance_gives_valid_outputs(two_layer_model):
    model, tokenizer = two_layer_model
    pattern = r"(19|20)[0-9]{2}"
    regex = P.Regex(pattern, tokenizer)
    result = fg.generate(
        model,
        tokenizer,
        ["The Berlin Wall fell in the year", "The first Moon landing happened in"],
        max_new_tokens=8,
        processors=[ClassifierFreeGuidance(model, 1.5), regex],
    )
    for text in result.texts:
        assert re.fullmatch(pattern, text), text


def test_guidance_must_come_first():
    model = CountingModel()
    cfg = ClassifierFreeGuidance(model, 1.5)
    check_guidance_first([cfg, P.Temperature(0.7)])
    check_guidance_first([P.Temperature(0.7)])
    with pytest.raises(
        ValueError, match=r"must be the first processor.*position 1, after Temperature"
    ):
        check_guidance_first([P.Temperature(0.7), cfg])
    with pytest.raises(ValueError, match="2 ClassifierFreeGuidance"):
        check_guidance_first([cfg, cfg])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(guidance_scale=float("nan")), r"`guidance_scale` must be in \(-inf, inf\), got nan"),
        (dict(guidance_scale=[1.5, float("inf")]), r"`guidance_scale`.*got \[inf\]"),
        (dict(guidance_scale=1.5, rescale=1.5), r"`rescale` must be in \[0.0, 1.0\], got 1.5"),
        (dict(guidance_scale=1.5, rescale=-0.1), r"`rescale` must be in \[0.0, 1.0\]"),
        (dict(guidance_scale=1.5, negative_prompt_ids=[]), "needs at least one token"),
        (dict(guidance_scale=1.5, negative_prompt_ids=[[1, 2], []]), "row 1 is empty"),
        (
            dict(guidance_scale=1.5, negative_prompt_ids=[3, 32]),
            r"outside the vocabulary \[0, 32\): \[32\]",
        ),
        (dict(guidance_scale=1.5, negative_prompt_ids=[-2, 3]), r"outside the vocabulary.*\[-2\]"),
        (dict(guidance_scale=1.5, negative_prompt_ids=[-1, -1]), "needs at least one token"),
        (dict(guidance_scale=1.5, negative_prompt_ids=np.asarray([[3, -1]])), "left-pad"),
        (dict(guidance_scale=1.5, negative_prompt_ids=[3, -1]), "left-pad"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClassifierFreeGuidance(CountingModel(vocab_size=32), **kwargs)


def test_bad_types_raise_clear_errors():
    with pytest.raises(TypeError, match="AbstractCausalLM"):
        ClassifierFreeGuidance(lambda x: x, 1.5)
    with pytest.raises(TypeError, match="tokenize a text negative prompt"):
        ClassifierFreeGuidance(CountingModel(vocab_size=32), 1.5, negative_prompt_ids="a text")


# --- parity with transformers on the default model ----------------------------------------------

DEFAULT_PROMPTS = (
    "Today, a dragon flew over Paris, France,",
    "The best way to learn a new language is",
    "In the middle of the ocean there is",
)


@pytest.mark.slow
def test_default_model_equals_transformers(default_model, torch_default_model):
    """SmolLM2-135M: scales 0, 1.5 and 3, with and without a negative prompt, in ONE batch with
    per-row scales and per-row negative prompts (a row's negative prompt equal to its prompt's
    last token is transformers' default): 24 identical greedy tokens and scores to 1e-4."""
    model, tokenizer = default_model
    hf = torch_default_model
    prompts = [tokenizer(p)["input_ids"] for p in DEFAULT_PROMPTS]
    negative = tokenizer("A very happy event happened,")["input_ids"]
    cases = [(prompts[0], 1.5, None), (prompts[1], 3.0, negative), (prompts[2], 0.0, negative)]
    processor = ClassifierFreeGuidance(
        model, [s for _, s, _ in cases], [n if n else p[-1:] for p, _, n in cases]
    )
    state = fg.generate_token_ids(
        model, [p for p, _, _ in cases], max_new_tokens=MAX_NEW, processors=[processor]
    )
    for row, ((prompt, scale, neg), ours) in enumerate(zip(cases, generated_rows(state))):
        expected, scores = hf_generate(hf, prompt, scale, neg)
        assert ours == expected, (tokenizer.decode(ours), tokenizer.decode(expected))
        # the row's own values (its negative prompt as padded in the batch: one compiled replay)
        one_row = ClassifierFreeGuidance(model, scale, processor.negative_prompt_ids[row])
        assert_scores_close(replay(model, one_row, prompt, expected), scores, scale)
