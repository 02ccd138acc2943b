"""The serving engine's prefill-only bfloat16 copy of int8-block weights
(`serving.weights.with_prefill_copy`): used from 65 tokens up, bit for bit the product the int8
blocks gave there, and a served request's tokens equal `fg.generate` on the model without it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.models import LlamaForCausalLM
from functional_gen.models.quantization import Linear
from functional_gen.serving.weights import PREFILL_COPY_MIN_TOKENS, with_prefill_copy
from functional_gen.testing import tiny_config

from ..helpers import tiny_tokenizer

VOCAB = 101


@pytest.fixture(scope="module")
def int8_model():
    """A tiny random Llama with int8 weights in blocks of 32 inputs (hidden 64: two blocks)."""
    return LlamaForCausalLM(tiny_config(), key=jax.random.key(0), quantization="int8")


def prefill(model, seq):
    ids = (jnp.arange(seq)[None] * 7) % (VOCAB - 3) + 2
    logits, cache = model.prefill(ids, jnp.arange(seq)[None], max_len=seq)
    return np.asarray(logits), [np.asarray(x) for x in jax.tree.leaves(cache)]


def test_prefill_copy_is_used_from_65_tokens_and_changes_nothing(int8_model):
    assert PREFILL_COPY_MIN_TOKENS == 65  # quantization.FORMULATIONS: bf16 above 64 tokens
    copied = with_prefill_copy(int8_model)
    layer = copied.model.layers[0]
    leaves = jax.tree.leaves(layer, is_leaf=lambda x: isinstance(x, Linear))
    linears = [m for m in leaves if isinstance(m, Linear) and m.scale is not None]
    assert linears and all(m.batched.blocks[0].dtype == jnp.bfloat16 for m in linears)
    assert all(m.batched.min_tokens == 65 for m in linears)
    # the head (untied here) and the embedding table get none; the original is unchanged
    assert copied.lm_head.batched is None and copied.model.embed_tokens.batched is None
    assert int8_model.model.layers[0].mlp.down_proj.batched is None
    for seq in (8, 64, 65, 96):
        got, want = prefill(copied, seq), prefill(int8_model, seq)
        np.testing.assert_array_equal(got[0], want[0])
        for a, b in zip(got[1], want[1]):
            np.testing.assert_array_equal(a, b)
    # the copy is really what runs from 65 tokens (zeroed, it changes those results only)
    zeroed = jax.tree.map(lambda x: jnp.zeros_like(x) if x.dtype == jnp.bfloat16 else x, copied)
    np.testing.assert_array_equal(prefill(zeroed, 64)[0], prefill(int8_model, 64)[0])
    assert not np.array_equal(prefill(zeroed, 65)[0], prefill(int8_model, 65)[0])


def test_other_models_are_returned_as_they_are():
    model = LlamaForCausalLM(tiny_config(), key=jax.random.key(0))
    assert with_prefill_copy(model) is model


def test_int8_engine_serves_with_the_copy_and_matches_generate(int8_model):
    tokenizer = tiny_tokenizer(VOCAB)
    engine = fg.serving.Engine(int8_model, tokenizer, max_slots=2, max_len=160)
    assert engine.model.model.layers[0].mlp.down_proj.batched is not None
    plain = fg.serving.Engine(int8_model, tokenizer, max_slots=2, max_len=160, prefill_copy=False)
    assert plain.model is int8_model
    ids = np.random.default_rng(0).integers(2, VOCAB - 1, 80).tolist()  # bucket 96: the copy
    state = engine.init_decode_state()
    state = engine.insert(engine.prefill(engine.request(ids, 12)), state, 0)
    tokens = []
    while True:
        state, out = engine.generate(state)
        tokens += [t for t in out.token_ids[:, 0].tolist() if t >= 0]
        if bool(out.done[0]):
            break
    alone = fg.SequenceState.from_token_ids([ids], vocab_size=VOCAB, tokenizer=tokenizer)
    result = fg.generate(int8_model, tokenizer, alone, max_new_tokens=12)
    n = int(result.state.arrays.length[0]) - len(ids)
    assert tokens == [int(t) for t in result.token_ids[0, :n]]
