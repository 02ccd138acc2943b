"""Long prefills run the decoder layers as a `jax.lax.scan` over groups of the layer pattern
(`DecoderModel._scan_layers`); the result must be transformers' and the unrolled path's.

The reference is transformers' eager PyTorch model of a tiny random config (as in
`test_families.py`), here with more layers than one pattern period so that the scan has several
groups: a 4-layer Llama (period 1) and a 6-layer Gemma 3 with the 2 local + 1 global pattern
twice (period 3). `SCAN_MIN_TOKENS` and the prefill chunk are lowered so that a short left-padded
batch takes the scanned path with several query chunks.
"""

import copy

import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.models import attention, decoder
from functional_gen.models.decoder import layer_period

from ..helpers import save_checkpoint
from .test_families import LOCAL_GLOBAL, VARIANTS, WINDOW, hf_model, left_padded

torch = pytest.importorskip("torch")

CASES = {
    "llama-4-layers": ("LlamaConfig", dict(num_hidden_layers=4), 1),
    "gemma3-6-layers": (
        "Gemma3TextConfig",
        {**VARIANTS["gemma3_text"][1], "num_hidden_layers": 6, "layer_types": LOCAL_GLOBAL * 2},
        3,
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """`(transformers model, our model, expected layer period)`."""
    cls_name, overrides, period = CASES[request.param]
    hf = hf_model(cls_name, **overrides)
    model, _ = fg.load_model(save_checkpoint(hf, tmp_path_factory.mktemp(request.param)))
    return hf, model, period


def test_layer_period_finds_the_pattern(case):
    _, model, period = case
    assert layer_period(model.model.layers) == period
    # Gemma's first 5 layers (local, local, global, local, local) repeat no shorter pattern
    assert layer_period(model.model.layers[:5]) == (1 if period == 1 else None)


def test_scanned_prefill_matches_transformers_and_the_unrolled_prefill(case, monkeypatch):
    """Every valid position's logits within 1e-4 of transformers' over a left-padded batch that
    crosses the sliding window and three prefill chunks; the cache equals the unrolled path's,
    and decoding on from it gives transformers' next-token logits."""
    hf, model, _ = case
    seq = 3 * WINDOW + 5
    token_ids, mask, positions = left_padded(np.random.default_rng(1), [seq, seq - 7], seq)
    monkeypatch.setattr(attention, "_PREFILL_CHUNK", WINDOW + 3)
    ids, pos = jnp.asarray(token_ids), jnp.asarray(positions)

    monkeypatch.setattr(decoder, "SCAN_MIN_TOKENS", 10**9)
    unrolled, unrolled_cache = model.prefill(ids, pos, max_len=seq + 1, logits_to_keep=0)
    monkeypatch.setattr(decoder, "SCAN_MIN_TOKENS", 1)
    scanned, cache = model.prefill(ids, pos, max_len=seq + 1, logits_to_keep=0)

    with torch.no_grad():
        expected = hf(
            torch.as_tensor(token_ids),
            attention_mask=torch.as_tensor(mask),
            position_ids=torch.as_tensor(np.maximum(positions, 0)),
        ).logits.numpy()
    valid = mask == 1
    np.testing.assert_allclose(np.asarray(scanned)[valid], expected[valid], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(scanned), np.asarray(unrolled), atol=1e-5, rtol=0)
    assert len(cache.k) == len(model.model.layers)
    for ours, theirs in zip(cache.k + cache.v, unrolled_cache.k + unrolled_cache.v):
        assert ours.shape == theirs.shape
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5, rtol=0)

    next_ids = np.array([[7], [11]])
    next_pos = positions[:, -1:] + 1
    logits, _ = model(jnp.asarray(next_ids), jnp.asarray(next_pos), cache)
    with torch.no_grad():
        full = hf(
            torch.as_tensor(np.concatenate([token_ids, next_ids], axis=1)),
            attention_mask=torch.as_tensor(np.concatenate([mask, np.ones((2, 1), int)], axis=1)),
            position_ids=torch.as_tensor(np.maximum(np.concatenate([positions, next_pos], 1), 0)),
        ).logits.numpy()
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, -1], atol=1e-4, rtol=0)


def test_first_layers_is_transformers_model_truncated(case):
    """`first_layers(2)`: the logits of transformers' model with only its first 2 layers (same
    final norm and head), weights shared with the full model; bad counts are refused."""
    hf, model, _ = case
    draft = model.first_layers(2)
    assert draft.config.num_hidden_layers == 2 and len(draft.init_cache(1, 4).k) == 2
    assert (
        draft.model.layers[1].mlp.gate_up_proj.weight
        is model.model.layers[1].mlp.gate_up_proj.weight
    )
    truncated = copy.deepcopy(hf)
    truncated.model.layers = truncated.model.layers[:2]
    truncated.config.num_hidden_layers = 2
    if getattr(truncated.config, "layer_types", None) is not None:
        truncated.config.layer_types = truncated.config.layer_types[:2]
    token_ids, mask, positions = left_padded(np.random.default_rng(2), [10, 6], 10)
    with torch.no_grad():
        expected = truncated(
            torch.as_tensor(token_ids),
            attention_mask=torch.as_tensor(mask),
            position_ids=torch.as_tensor(np.maximum(positions, 0)),
        ).logits.numpy()
    logits, _ = draft(jnp.asarray(token_ids), jnp.asarray(positions), draft.init_cache(2, 10))
    valid = mask == 1
    np.testing.assert_allclose(np.asarray(logits)[valid], expected[valid], atol=1e-4, rtol=0)
    for bad in (0, model.config.num_hidden_layers + 1):
        with pytest.raises(ValueError, match="num_layers"):
            model.first_layers(bad)
