"""GGUF loading: the default model against transformers' own GGUF loader, and small GGUF files
of every tensor type against a PyTorch model built from independently decoded weights."""

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import functional_gen as fg
from functional_gen.loading.gguf_file import gguf_reader_class, open_gguf, read_gguf
from functional_gen.models import UnsupportedConfigError

torch = pytest.importorskip("torch")

HIDDEN, INTER, HEADS, KV_HEADS, VOCAB = 256, 256, 4, 2, 64


def convert_permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute` (HF rows -> GGUF rows)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def random_k_quant_blocks(rng, rows, cols, qtype):
    """Random but well-formed Q4_K / Q6_K bytes: random quants and scales, small fp16 `d`."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block_size, type_size), dtype=np.uint8)
    d = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if qtype == Q.Q4_K:  # d, dmin (fp16) lead the block
        raw[:, :, 0:2] = d
        raw[:, :, 2:4] = np.frombuffer(np.float16(0.005).tobytes(), np.uint8)
    else:  # Q6_K: d (fp16) ends the block
        raw[:, :, -2:] = np.frombuffer(np.float16(0.001).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def write_tiny_gguf(path, qtype, *, tied, seed=0):
    """A one-layer Llama GGUF whose 2-D tensors are stored as `qtype`; returns the HF-layout
    float32 weights the file decodes to (decoded with gguf-py, un-permuted independently)."""
    rng = np.random.default_rng(seed)
    shapes = {
        "token_embd.weight": (VOCAB, HIDDEN),
        "blk.0.attn_q.weight": (HEADS * 64, HIDDEN),
        "blk.0.attn_k.weight": (KV_HEADS * 64, HIDDEN),
        "blk.0.attn_v.weight": (KV_HEADS * 64, HIDDEN),
        "blk.0.attn_output.weight": (HIDDEN, HEADS * 64),
        "blk.0.ffn_gate.weight": (INTER, HIDDEN),
        "blk.0.ffn_up.weight": (INTER, HIDDEN),
        "blk.0.ffn_down.weight": (HIDDEN, INTER),
    }
    if not tied:
        shapes["output.weight"] = (VOCAB, HIDDEN)
    hf_names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output.weight": "lm_head.weight",
        "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
        "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight",
        "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
        "blk.0.attn_output.weight": "model.layers.0.self_attn.o_proj.weight",
        "blk.0.ffn_gate.weight": "model.layers.0.mlp.gate_proj.weight",
        "blk.0.ffn_up.weight": "model.layers.0.mlp.up_proj.weight",
        "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
    }
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_eos_token_id(VOCAB - 1)
    reference = {}
    for name, (rows, cols) in shapes.items():
        heads = {"blk.0.attn_q.weight": HEADS, "blk.0.attn_k.weight": KV_HEADS}.get(name)
        if qtype in (Q.Q4_K, Q.Q6_K):
            raw = random_k_quant_blocks(rng, rows, cols, qtype)
        else:
            w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
            if heads:
                w = convert_permute(w, heads)
            raw = w if qtype == Q.F32 else gguf.quants.quantize(w, qtype)
        writer.add_tensor(name, raw, raw_dtype=None if qtype == Q.F32 else qtype)
        stored = gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(rows, cols)
        if heads:  # the inverse of convert_permute, by index arithmetic
            order = convert_permute(np.arange(rows), heads)
            stored = stored[np.argsort(order)]
        reference[hf_names[name]] = stored
    for name, hf in [
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
        ("blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
        ("output_norm.weight", "model.norm.weight"),
    ]:
        w = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
        writer.add_tensor(name, w)
        reference[hf] = w
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return reference


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K])
@pytest.mark.parametrize("tied", [True, False])
def test_every_tensor_type_loads_and_runs_like_transformers(tmp_path, qtype, tied):
    import transformers

    path = tmp_path / f"tiny-{qtype.name}.gguf"
    reference = write_tiny_gguf(path, qtype, tied=tied)
    config, weights = read_gguf(path)
    assert config.tie_word_embeddings == tied and config.num_key_value_heads == KV_HEADS
    assert config.eos_token_id == (VOCAB - 1,)
    model = fg.LlamaForCausalLM.from_weights(config, weights)

    hf_config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
    )
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in reference.items()}, strict=False)
    if tied:
        hf.tie_weights()
    ids = np.random.default_rng(1).integers(0, VOCAB, (1, 9))
    with torch.no_grad():
        expected = hf(torch.from_numpy(ids)).logits.numpy()
    logits, _ = model(jnp.asarray(ids), jnp.arange(9)[None], model.init_cache(1, 9))
    scale = np.abs(expected).max()
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5 * max(scale, 1.0))


def test_unknown_architecture_is_refused(tmp_path):
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), arch="gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedConfigError, match=r"unknown GGUF architecture 'gpt2'.*llama"):
        fg.load_model(path)


def test_missing_gguf_file_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model"):
        fg.load_model(tmp_path / "missing.gguf")


def test_open_gguf_reads_what_the_stock_reader_reads():
    """`open_gguf`'s reader (plain ndarray views of the memory map, `gguf_reader_class`) on the
    default model's file (49,152-token vocabulary, 272 tensors): every metadata field's parts,
    types and value and every tensor's name, type, shape, offset and bytes equal those of
    gguf's own `GGUFReader`, and nothing of it is a `memmap` slice any more."""
    from functional_gen.loading import default_gguf_path

    path = default_gguf_path()
    ours, stock = open_gguf(path), gguf.GGUFReader(str(path))
    assert type(ours) is gguf_reader_class() and isinstance(ours, gguf.GGUFReader)
    assert list(ours.fields) == list(stock.fields) and len(ours.fields) > 20
    for name, field in stock.fields.items():
        mine = ours.fields[name]
        assert (mine.offset, mine.types, mine.data) == (field.offset, field.types, field.data)
        assert len(mine.parts) == len(field.parts), name
        for a, b in zip(mine.parts, field.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert len(ours.tensors) == len(stock.tensors) > 200
    for a, b in zip(ours.tensors, stock.tensors):
        assert (a.name, a.tensor_type, a.data_offset) == (b.name, b.tensor_type, b.data_offset)
        np.testing.assert_array_equal(a.shape, b.shape)
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name
        assert not isinstance(a.data, np.memmap) and not a.data.flags.writeable
    assert not isinstance(ours.fields["tokenizer.ggml.tokens"].parts[-1], np.memmap)


@pytest.mark.slow
def test_default_gguf_weights_equal_transformers_bit_for_bit(torch_default_model):
    """Our gguf-py dequantisation + Q/K un-permutation reproduces transformers' GGUF loading."""
    from functional_gen.loading import default_gguf_path

    hf = torch_default_model
    config, weights = read_gguf(default_gguf_path())
    expected = {k: v.numpy() for k, v in hf.state_dict().items()}
    assert set(weights) - {"lm_head.weight"} == set(expected) - {"lm_head.weight"}
    for name, w in weights.items():
        np.testing.assert_array_equal(w, expected[name], err_msg=name)
    hc = hf.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (
        hc.hidden_size,
        hc.num_hidden_layers,
        hc.num_attention_heads,
    )
    assert config.num_key_value_heads == hc.num_key_value_heads
    assert config.rope_theta == hc.rope_parameters["rope_theta"]
    assert config.rms_norm_eps == pytest.approx(hc.rms_norm_eps)
    assert config.tie_word_embeddings and config.eos_token_id == (2, 0)


TOKENIZER_TEXTS = [
    "Hello world",
    "  leading spaces, trailing tabs\t\t\nand\r\nnewlines  ",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🙂👍🏽 and a lone combining mark e\u0301",
    "<|im_start|>user\nliteral special tokens<|im_end|><|endoftext|> inside text",
    "def f(x):\n    return x ** 2  # code, 1234567890, 3.14159",
    "",
]


@pytest.mark.slow
def test_gguf_tokenizer_matches_transformers_gguf_tokenizer():
    """Our torch-free tokenizer encodes, decodes and renders chats exactly as transformers' own
    `AutoTokenizer.from_pretrained(dir, gguf_file=...)`, whose GGUF reader needs torch."""
    from transformers import AutoTokenizer

    from functional_gen.loading import default_gguf_path
    from functional_gen.loading.gguf_file import gguf_tokenizer

    path = default_gguf_path()
    ours = gguf_tokenizer(path)
    ref = AutoTokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name, local_files_only=True
    )
    assert type(ours) is type(ref)
    assert ours.get_vocab() == ref.get_vocab()
    assert ours.special_tokens_map == ref.special_tokens_map
    assert ours.all_special_ids == ref.all_special_ids
    assert ours.chat_template == ref.chat_template and ours.chat_template
    for text in TOKENIZER_TEXTS:
        ids = ref(text)["input_ids"]
        assert ours(text)["input_ids"] == ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
                ids, skip_special_tokens=skip
            )
    chat = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi! 🙂"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Capital of France?"},
    ]
    for generation_prompt in (True, False):
        kwargs = dict(add_generation_prompt=generation_prompt, tokenize=True, return_dict=False)
        assert ours.apply_chat_template(chat, **kwargs) == ref.apply_chat_template(chat, **kwargs)
    batch = ours(TOKENIZER_TEXTS[:3], padding=True)
    assert batch["input_ids"] == ref(TOKENIZER_TEXTS[:3], padding=True)["input_ids"]


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K, Q.F16])
def test_int8_requantization_is_within_half_a_step_of_ggufs_dequantization(
    tmp_path, qtype, monkeypatch
):
    """Each matrix requantized to int8 with a scale per block of 32 from its own blocks: the
    scale is the block's largest |value| / 127 of gguf's own dequantization, every value is within
    half a step of it (Q8_0: equal to it, its blocks are copied), and no more than the chunk's rows
    are ever decoded at once."""
    from functional_gen.loading import gguf_file

    path = tmp_path / f"tiny-{qtype.name}.gguf"
    reference = write_tiny_gguf(path, qtype, tied=False)
    monkeypatch.setattr(gguf_file, "_CHUNK_BYTES", 4 * HIDDEN * 10)  # 10 rows at a time
    decoded_rows = []
    real = gguf.quants.dequantize

    def recording(data, qt):
        decoded_rows.append(data.shape[0] if data.ndim == 2 else 1)
        return real(data, qt)

    monkeypatch.setattr(gguf.quants, "dequantize", recording)
    config, weights = read_gguf(path, quantization="int8")
    assert max(decoded_rows, default=0) <= 10
    for name, ref in reference.items():
        if ref.ndim == 1:
            np.testing.assert_array_equal(weights[name], ref)
            continue
        q, scale = weights[name], weights[name.removesuffix("weight") + "scale"]
        assert q.dtype == np.int8 and scale.dtype == np.float32, name
        rows, cols = ref.shape
        assert scale.shape == (rows, cols // 32), name
        blocks = ref.reshape(rows, cols // 32, 32)
        absmax = np.abs(blocks).max(axis=2)
        nonzero = absmax > 0  # an all-zero block decodes to zeros whatever its scale
        np.testing.assert_allclose(scale[nonzero], absmax[nonzero] / 127, rtol=1e-6, err_msg=name)
        decoded = q.reshape(rows, cols // 32, 32).astype(np.float32) * scale[..., None]
        if qtype == Q.Q8_0:  # lossless: the file's own int8 values and float16 scales
            np.testing.assert_array_equal(decoded, blocks, err_msg=name)
        err = np.abs(decoded - blocks)
        assert (err <= scale[..., None] * (0.5 + 1e-5)).all(), name

    model = fg.LlamaForCausalLM.from_weights(config, weights, quantization="int8")
    float_model = fg.LlamaForCausalLM.from_weights(config, read_gguf(path)[1])
    ids, pos = jnp.asarray([[1, 5, 9, 13]]), jnp.arange(4)[None]
    logits, _ = model(ids, pos, model.init_cache(1, 4))
    expected, _ = float_model(ids, pos, float_model.init_cache(1, 4))
    scale = np.abs(np.asarray(expected)).max()
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=0.05 * scale)


def test_gguf_dtype_auto(tmp_path):
    from functional_gen.loading.gguf_file import gguf_file_dtype

    for qtype, expected in [(Q.BF16, jnp.bfloat16), (Q.F32, jnp.float32), (Q.Q8_0, jnp.float32)]:
        path = tmp_path / f"tiny-{qtype.name}.gguf"
        write_tiny_gguf(path, qtype, tied=True)
        assert gguf_file_dtype(path) == expected, qtype
