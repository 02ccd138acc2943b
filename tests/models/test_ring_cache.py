"""Sliding-window layers keep their keys and values in rings (`functional_gen.models.kv_cache`).

Tiny random Gemma 3, Gemma 2 and Mistral models of transformers (window 8, so rings of
`8 + RING_RESERVE` = 40 slots) against transformers' PyTorch model and against the layout
without rings (`KVCache.init(..., rings=False)`, every layer `max_len` slots): generations that
go round the ring several times, prompts longer than the ring, `SequenceState` continuation,
forks, files and crops, and speculative decoding.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.models import attention, config_from_hf, decoder
from functional_gen.models.kv_cache import RING_RESERVE, KVCache

from ..helpers import save_checkpoint, speculative_generate
from .test_families import SMALL, VARIANTS, WINDOW, hf_model

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

RING = WINDOW + RING_RESERVE  # 40
LENGTH = 110  # tokens of the long sequences: the ring is written round almost 3 times


def tiny(name, tmp_path_factory):
    cls_name, overrides = VARIANTS[name]
    hf = hf_model(cls_name, **overrides)
    path = save_checkpoint(hf, tmp_path_factory.mktemp(name))
    model, tokenizer = fg.load_model(path)
    return hf, model, tokenizer


@pytest.fixture(scope="module", params=["gemma3_text", "gemma2", "mistral"])
def sliding(request, tmp_path_factory):
    """`(transformers model, our model, tokenizer)` of a tiny family with a window of 8."""
    return tiny(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """The tiny Gemma 3 (2 local layers, 1 global) for the generation-level tests: the ring
    code is shared by every family, so these run once."""
    return tiny("gemma3_text", tmp_path_factory)


def reference(hf, token_ids):
    with torch.no_grad():
        return hf(torch.as_tensor(np.array(token_ids))).logits.numpy()


def sequences(batch=2, length=LENGTH):
    token_ids = jax.random.randint(jax.random.key(3), (batch, length), 2, 100)
    return token_ids, jnp.broadcast_to(jnp.arange(length), (batch, length))


def test_a_local_layer_holds_a_ring_and_a_global_layer_max_len(sliding):
    _, model, _ = sliding
    cache = model.init_cache(2, 200)
    for i, w in enumerate(model.config.sliding_window):
        assert cache.k[i].shape[2] == (RING if w is not None else 200)
    assert cache.ring_positions.shape == (2, RING)
    assert model.init_cache(2, 20).k[cache.ring_layers[0]].shape[2] == 20  # short: max_len
    full = KVCache.init(model.config, 2, 200, rings=False)
    assert all(k.shape[2] == 200 for k in full.k) and full.ring_positions is None


@pytest.mark.parametrize("prompt", [5, 60])  # 60: a prefill longer than the ring
def test_decode_round_the_ring_equals_transformers_and_the_full_layout(sliding, prompt):
    """Prefill, then one token per call to 110 tokens: every logit within 1e-4 of transformers'
    uncached forward and equal to the same calls on a cache without rings."""
    hf, model, _ = sliding
    token_ids, positions = sequences()
    expected = reference(hf, token_ids)
    step = jax.jit(lambda ids, pos, cache: model(ids, pos, cache))

    def run(cache):
        logits, cache = model(token_ids[:, :prompt], positions[:, :prompt], cache)
        out = [logits]
        for i in range(prompt, LENGTH):
            logits, cache = step(token_ids[:, i : i + 1], positions[:, i : i + 1], cache)
            out.append(logits)
        return np.concatenate(out, axis=1), cache

    ringed, cache = run(model.init_cache(2, LENGTH))
    assert cache.ring_layers and cache.k[cache.ring_layers[0]].shape[2] == RING
    full, _ = run(KVCache.init(model.config, 2, LENGTH, rings=False))
    np.testing.assert_allclose(ringed, expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(ringed, full, atol=1e-5, rtol=0)
    logits, cache = model.prefill(token_ids[:, :prompt], positions[:, :prompt], max_len=LENGTH)
    np.testing.assert_allclose(logits[:, 0], expected[:, prompt - 1], atol=1e-4, rtol=0)


def test_calls_of_several_tokens_read_the_ring_and_their_own_keys(sliding):
    """Prefill of 30 tokens, then calls of 7 tokens (a continuation's new text, speculative
    verification) across the ring: the logits of transformers' forward."""
    hf, model, _ = sliding
    token_ids, positions = sequences()
    expected = reference(hf, token_ids)
    logits, cache = model.prefill(
        token_ids[:, :30], positions[:, :30], max_len=LENGTH, logits_to_keep=0
    )
    out = [logits]
    step = jax.jit(lambda ids, pos, cache: model(ids, pos, cache))  # 7 tokens, then the last 3
    for i in range(30, LENGTH, 7):
        logits, cache = step(token_ids[:, i : i + 7], positions[:, i : i + 7], cache)
        out.append(logits)
    np.testing.assert_allclose(np.concatenate(out, axis=1), expected, atol=1e-4, rtol=0)


def test_a_left_padded_row_round_the_ring_equals_it_alone(gemma3):
    hf, model, _ = gemma3
    token_ids, positions = sequences(1, 90)
    padded = jnp.concatenate([jnp.zeros((1, 13), token_ids.dtype), token_ids], axis=1)
    pad_pos = jnp.concatenate([jnp.full((1, 13), -1), positions], axis=1)
    batch_ids = jnp.concatenate([padded, jnp.concatenate([token_ids[:, :13], token_ids], 1)])
    batch_pos = jnp.concatenate([pad_pos, jnp.broadcast_to(jnp.arange(103), (1, 103))])
    logits, cache = model.prefill(batch_ids[:, :20], batch_pos[:, :20], max_len=103)
    out = [logits]
    step = jax.jit(lambda ids, pos, cache: model(ids, pos, cache))  # one compile, 83 calls
    for i in range(20, 103):
        logits, cache = step(batch_ids[:, i : i + 1], batch_pos[:, i : i + 1], cache)
        out.append(logits)
    out = np.concatenate(out, axis=1)
    expected = reference(hf, token_ids)
    np.testing.assert_allclose(out[0], expected[0, 19 - 13 :], atol=1e-4, rtol=0)


def prompt_text(ids):
    return " ".join(f"t{i}" for i in ids)


PROMPT = [5, 17, 42, 8, 99, 23]


def test_greedy_generation_round_the_ring_equals_transformers(gemma3):
    hf, model, tok = gemma3
    result = fg.generate(
        model,
        tok,
        prompt_text(PROMPT),
        max_new_tokens=100,
        sampler=fg.samplers.Greedy(),
        eos_token_id=[],
    )
    with torch.no_grad():
        out = hf.generate(
            torch.as_tensor([PROMPT]),
            attention_mask=torch.ones(1, 6, dtype=torch.long),
            max_new_tokens=100,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert np.asarray(result.token_ids)[0].tolist() == out[0, 6:].tolist()


def generate(model, tok, prompt, n, **kw):
    return fg.generate(
        model, tok, prompt, max_new_tokens=n, sampler=fg.samplers.Greedy(), eos_token_id=[], **kw
    )


def speculate(model, tok, prompt, n, spec):
    """`generate` with `spec`, asserting that guesses were verified and accepted."""
    result, _ = speculative_generate(
        model, tok, prompt, max_new_tokens=n, sampler=fg.samplers.Greedy(), eos_token_id=[],
        speculative=spec,
    )  # fmt: skip
    return result


def test_sequence_state_continue_fork_and_file_round_the_ring(gemma3, tmp_path):
    _, model, tok = gemma3
    prompts = [prompt_text(PROMPT), prompt_text(PROMPT[:3])]
    whole = np.asarray(generate(model, tok, prompts, 90).token_ids)
    first = generate(model, tok, prompts, 50)
    assert first.state.arrays.cache.ring_layers
    more = generate(model, tok, first.state, 40)
    np.testing.assert_array_equal(np.concatenate([first.token_ids, more.token_ids], 1), whole)
    forked = generate(model, tok, first.state.repeat(2), 40)
    np.testing.assert_array_equal(np.asarray(forked.token_ids)[::2], np.asarray(more.token_ids))
    np.testing.assert_array_equal(np.asarray(forked.token_ids)[1::2], np.asarray(more.token_ids))
    row = generate(model, tok, first.state[1], 40)
    np.testing.assert_array_equal(np.asarray(row.token_ids)[0], np.asarray(more.token_ids)[1])
    first.state.save(tmp_path / "s.safetensors")
    loaded = fg.SequenceState.load(tmp_path / "s.safetensors")
    assert loaded.arrays.cache.ring_layers == first.state.arrays.cache.ring_layers
    again = generate(model, tok, loaded, 40)
    np.testing.assert_array_equal(np.asarray(again.token_ids), np.asarray(more.token_ids))


def test_a_crop_behind_the_ring_prefills_again_and_equals_a_fresh_prompt(gemma3):
    _, model, tok = gemma3
    state = generate(model, tok, prompt_text(PROMPT), 80).state
    tokens = np.asarray(state.arrays.token_ids)[0]
    n = int(state.arrays.length[0])
    for keep in (n - 1, n - 30, n - 60):  # inside the ring, at its reach, far behind it
        cropped = state[:, :keep]
        cached = int(cropped.arrays.cached[0])
        if keep <= n - RING_RESERVE - 2:
            assert cached == 0  # the ring no longer holds the window before `keep`
        else:
            assert cached == keep - 1
        continued = np.asarray(generate(model, tok, cropped, 12).token_ids)
        fresh = np.asarray(generate(model, tok, prompt_text(tokens[:keep]), 12).token_ids)
        np.testing.assert_array_equal(continued, fresh)


def test_prompt_lookup_on_a_sliding_model_is_lossless(gemma3):
    """Prompt lookup with the most guesses a step may make on a sliding model (`RING_RESERVE`:
    its rejected guesses overwrite as many of the ring's oldest slots, the reserve's whole
    width) gives greedy decoding's tokens on two rows of different lengths going round the
    ring. (This is also the largest value the test below leaves accepted: one speculative
    program of 32 guesses, 10-17 s to compile here, serves both.)"""
    _, model, tok = gemma3
    prompt = prompt_text(PROMPT * 4)
    plain = np.asarray(generate(model, tok, [prompt, prompt_text(PROMPT)], 90).token_ids)
    spec = fg.speculative.PromptLookup(num_tokens=RING_RESERVE, max_ngram_size=3)
    fast = speculate(model, tok, [prompt, prompt_text(PROMPT)], 90, spec)
    np.testing.assert_array_equal(np.asarray(fast.token_ids), plain)


def test_more_guesses_than_the_ring_reserve_are_refused_before_compiling(gemma3):
    """A step's rejected guesses overwrite the ring's oldest slots: more than `RING_RESERVE` of
    them would overwrite keys still in the window, so such a proposer is refused by name. (The
    largest accepted value, `RING_RESERVE`, generates losslessly: the test above.)"""
    _, model, tok = gemma3
    spec = fg.speculative.PromptLookup(num_tokens=RING_RESERVE + 1, max_ngram_size=3)
    with pytest.raises(ValueError, match=rf"num_tokens={RING_RESERVE + 1}.*RING_RESERVE"):
        generate(model, tok, [prompt_text(PROMPT)], 4, speculative=spec)


def test_gemma3_270m_cache_at_8192_tokens_is_under_a_quarter_of_full_layers():
    """The layout of Gemma 3 270M (18 layers, 1 key-value head of 256, window 512 on 5 of every
    6 layers): at 8,192 slots the rings keep (3 * 8192 + 15 * 544) / (18 * 8192) = 22.2% of the
    keys and values of full layers; 1/6 is the limit for long sequences."""
    hf_config = transformers.Gemma3TextConfig(
        **{
            **SMALL,
            "num_hidden_layers": 18,
            "hidden_size": 640,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "sliding_window": 512,
            "max_position_embeddings": 32768,
        }
    )
    config = config_from_hf(hf_config)
    assert sum(w is None for w in config.sliding_window) == 3

    def nbytes(cache):
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))

    def kv_bytes(cache):
        return sum(x.size * x.dtype.itemsize for x in (*cache.k, *cache.v))

    ringed = jax.eval_shape(lambda: KVCache.init(config, 1, 8192))
    full = jax.eval_shape(lambda: KVCache.init(config, 1, 8192, rings=False))
    assert kv_bytes(full) == 18 * 2 * 8192 * 256 * 4
    assert kv_bytes(ringed) / kv_bytes(full) == pytest.approx((3 * 8192 + 15 * 544) / (18 * 8192))
    assert nbytes(ringed) / nbytes(full) < 0.23


def test_batched_guidance_round_the_ring_equals_the_processor(gemma3):
    """Classifier-free guidance with both branches in one batch (a branch axis on every cache
    leaf, the rings' positions included) equals the processor holding the negative cache."""
    _, model, tok = gemma3
    kw = dict(guidance_scale=1.5, negative_prompt=prompt_text([7, 7, 9]))
    batched = generate(model, tok, prompt_text(PROMPT), 60, cfg="batched", **kw)
    processor = generate(model, tok, prompt_text(PROMPT), 60, cfg="processor", **kw)
    np.testing.assert_array_equal(np.asarray(batched.token_ids), np.asarray(processor.token_ids))


def test_a_scanned_prefill_longer_than_the_ring_fills_it_as_the_unrolled_one(sliding, monkeypatch):
    """The layers run as a `lax.scan` (long prefills) write the same rings (Mistral: every
    layer alike; the tiny Gemmas' 3 layers have no shorter period to scan)."""
    hf, model, _ = sliding
    if decoder.layer_period(model.model.layers) is None:
        pytest.skip("no repeating layer group to scan")
    token_ids, positions = sequences(2, 100)
    unrolled, cache = model.prefill(token_ids[:, :90], positions[:, :90], max_len=100)
    monkeypatch.setattr(decoder, "SCAN_MIN_TOKENS", 64)
    scanned, scan_cache = model.prefill(token_ids[:, :90], positions[:, :90], max_len=100)
    np.testing.assert_allclose(scanned, unrolled, atol=1e-5, rtol=0)
    for a, b in zip(jax.tree.leaves(scan_cache), jax.tree.leaves(cache)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    logits, _ = model(token_ids[:, 90:], positions[:, 90:], scan_cache)
    np.testing.assert_allclose(logits, reference(hf, token_ids)[:, 90:], atol=1e-4, rtol=0)


@pytest.mark.parametrize("block", [8, 3])  # 3: blocks that do not divide the window of 8
def test_a_banded_prefill_equals_transformers_and_the_causal_blocks(sliding, block, monkeypatch):
    """A local layer's prefill reads only the band of keys its window lets each query block see
    (`attention.window_band`): a left-padded batch of 100-token prompts gives transformers'
    logits at every position, and the logits and cache of the causal blocks that read every
    earlier key (`PREFILL_WINDOW_BLOCK = None`), with rings and without."""
    hf, model, _ = sliding
    monkeypatch.setattr(attention, "PREFILL_WINDOW_BLOCK", block)
    assert attention.window_band(100, WINDOW) is not None
    token_ids, positions = sequences(2, 100)
    token_ids = token_ids.at[0, :9].set(0)
    positions = positions.at[0].set(jnp.arange(100) - 9).at[0, :9].set(-1)  # 9 padding columns
    banded, cache = model.prefill(token_ids, positions, max_len=100, logits_to_keep=0)
    expected_1 = reference(hf, token_ids[1:])[0]
    expected_0 = reference(hf, token_ids[:1, 9:])[0]
    np.testing.assert_allclose(banded[1], expected_1, atol=1e-4, rtol=0)
    np.testing.assert_allclose(banded[0, 9:], expected_0, atol=1e-4, rtol=0)

    def unringed():
        full = KVCache.init(model.config, 2, 100, rings=False)
        return model._forward(token_ids, positions, full, 0, attention.prefill_block(100), None)

    band_full, band_full_cache = unringed()
    monkeypatch.setattr(attention, "PREFILL_WINDOW_BLOCK", None)
    causal, causal_cache = model.prefill(token_ids, positions, max_len=100, logits_to_keep=0)
    valid = np.asarray(positions >= 0)  # a padding column's logits are not defined
    np.testing.assert_allclose(banded[valid], causal[valid], atol=1e-5, rtol=0)
    same_tokens(cache, causal_cache, valid)
    causal_full, causal_full_cache = unringed()
    np.testing.assert_allclose(band_full[valid], causal_full[valid], atol=1e-5, rtol=0)
    np.testing.assert_allclose(band_full[valid], banded[valid], atol=1e-5, rtol=0)
    same_tokens(band_full_cache, causal_full_cache, valid)


def same_tokens(cache, other, valid):
    """Equal positions, and equal keys and values in every slot of a token (a padding slot of a
    full layer holds whatever the padding's hidden state gave)."""
    np.testing.assert_array_equal(cache.positions, other.positions)
    np.testing.assert_array_equal(cache.ring_positions, other.ring_positions)
    for i, (k, v, k2, v2) in enumerate(zip(cache.k, cache.v, other.k, other.v)):
        if i not in cache.ring_layers:  # [batch, kv_heads, slots, head_dim] -> the valid slots
            k, v, k2, v2 = (np.moveaxis(np.asarray(t), 2, 1)[valid] for t in (k, v, k2, v2))
        np.testing.assert_allclose(k, k2, atol=1e-5, rtol=0)
        np.testing.assert_allclose(v, v2, atol=1e-5, rtol=0)


def test_window_band_covers_each_query_window():
    """Block `i` of `block` queries reads key blocks `i - lookback .. i`: the oldest key of its
    first query's window (column `i * block - window + 1`) is inside; short prompts (under two
    bands) keep the causal blocks."""
    assert attention.window_band(4096, 512) == (128, 4)  # Gemma 3: 640 keys per block
    assert attention.window_band(1279, 512) is None and attention.window_band(1280, 512)
    assert attention.window_band(512, 512) is None  # a prompt within the window: unchanged
    assert attention.window_band(100, 8) == (8, 1)
    for window in (1, 5, 8, 100, 512, 4096):
        block, lookback = attention.window_band(10**6, window)
        assert lookback * block >= window - 1 > (lookback - 1) * block
