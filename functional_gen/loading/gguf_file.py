"""Load a GGUF file (llama.cpp's format): tensors read and dequantized with the `gguf` package,
the tokenizer built from the same file's metadata by transformers' GGUF tokenizer conversion
(without torch: transformers' own GGUF reader imports it).

Architectures (`general.architecture`): `llama` (and Mistral), `qwen2`, `qwen3`, `gemma3`,
`phi3`. Each one's metadata becomes a Hugging Face `config.json` dict (`gguf_hf_config`, one
small function per architecture) and its tensor names Hugging Face weight names
(`gguf_weight_name`, one small table per architecture); `model_config_from_hf` is the one call
that turns the dict into the decoder's config. The metadata side (config, generation config,
tokenizer metadata) lives in `functional_gen.loading.gguf_metadata`; this module reads the
tensors, caches, and builds the model and the tokenizer.

Any tensor type `gguf.quants.dequantize` handles is accepted (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1, the K-quants Q2_K-Q6_K, ...); the weights become dense float arrays of the requested
dtype, or int8 per block of 32 (`requantize_int8`). The file's conventions are undone:
llama.cpp's converter permutes the rows of `attn_q`/`attn_k` of `llama` models for its
interleaved RoPE (permuted back to the Hugging Face layout, which reproduces transformers' own
GGUF loading bit for bit), and stores Gemma's `(1 + weight)` norms as `1 + weight` (returned as
`weight`, as transformers does).

What is slow to derive from a file is cached in `functional_gen.cache.cache_dir()`, keyed by the
file's identity (`gguf_cache_key`): the converted tokenizer and the int8 requantization. A
damaged file raises `CheckpointError` naming the file and what is wrong ("truncated", "missing
key `gemma3.block_count`").
"""

import functools
import json
import os
import re
import typing
from pathlib import Path

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from ..cache import cache_dir
from ..models.config import UnsupportedConfigError
from ..models.decoder import DecoderForCausalLM
from ..models.quantization import blocks_of, check_quantization, quantize_int8
from ..progress import progress_bar
from .errors import CheckpointError
from .gguf_metadata import (
    CONFIG_TENSORS,
    SUPPORTED_GGUF_ARCHITECTURES as SUPPORTED_GGUF_ARCHITECTURES,
    gguf_generation_config,
    gguf_hf_config as gguf_hf_config,
    gguf_sampling,
    gguf_tokenizer_metadata,
    metadata_field,
    model_config_from_hf as model_config_from_hf,
    read_gguf_config as read_gguf_config,
    read_gguf_generation_config as read_gguf_generation_config,
)

# Tensor names inside a block (`blk.N.<name>.weight`), common to every architecture.
_COMMON_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# Per architecture, what differs from `_COMMON_LAYER_TENSORS` (llama.cpp's
# gguf-py/gguf/tensor_mapping.py read backwards, as transformers' GGUF loader does).
_ARCH_LAYER_TENSORS = {
    "llama": {},
    "qwen2": {},
    # Qwen3: RMSNorm of each query/key head before RoPE.
    "qwen3": {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    # Gemma 3: norms before and after attention and MLP, q/k norms.
    "gemma3": {
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    # Phi-3: fused q/k/v rows and fused gate/up rows (HF's own fused names; the decoder splits).
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# llama.cpp's converter permutes the rows of attn_q/attn_k only for its `llama` architecture
# (`LlamaModel.permute`, for interleaved RoPE); Qwen2/3, Gemma 3 and Phi-3 use NeoX-style RoPE,
# stored as is.
_PERMUTED_ARCHITECTURES = ("llama",)

# Gemma's RMSNorm multiplies by (1 + weight); llama.cpp's converter (`Gemma2Model/Gemma3Model
# .modify_tensors`: `data_torch = data_torch + 1` for every tensor whose name ends in
# "norm.weight") stores 1 + weight, and transformers' GGUF loader (`Gemma2TensorProcessor`, used
# for gemma3 too) subtracts 1 again. We return the Hugging Face convention, weight.
_PLUS_ONE_NORM_ARCHITECTURES = ("gemma3",)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's `permute` of q/k rows (interleaved RoPE pairs -> rotate-half halves)."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


_CHUNK_BYTES = 16 * 2**20  # float32 bytes decoded at a time when requantizing a tensor to int8


def requantize_int8(tensor) -> tuple[np.ndarray, np.ndarray]:
    """A GGUF matrix (any type `gguf.quants.dequantize` reads: Q8_0, Q4_0, Q4_1, Q5_0, Q4_K,
    Q5_K, Q6_K, F16, ...) as int8 with one float32 scale per block of 32 inputs
    (`functional_gen.models.quantization.quantize_int8`), a few rows of blocks at a time.

    Q8_0 is that format already (32 int8 values and a float16 scale per block): its values and
    scales are copied, without rounding. Any other type is decoded from its own blocks by
    `gguf.quants.dequantize` (at most 16 MB of float32 at once, never the whole tensor) and each
    block of 32 is stored as `round(block / s)` with `s = max|block| / 127`, so
    `|decoded - q * s| <= s / 2` (a Q4_0 block's 16 levels land on int8 values exactly, up to
    float32 rounding; Q4_1's nearly).

    **Arguments:** `tensor`: a `gguf.GGUFReader` tensor with 2 dimensions.

    **Returns:** `(q, scale)`: int8 `[out, in]` and float32 `[out, blocks]` (GGUF row order).

    **Raises:** `UnsupportedConfigError` for a tensor type `gguf` cannot dequantize.
    """
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rows, cols = (int(n) for n in reversed(tensor.shape))
    data = tensor.data.reshape(rows, -1)
    if tensor.tensor_type == GGMLQuantizationType.Q8_0 and blocks_of(cols) == cols // 32:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(rows, cols // 32, 34)
        scale = raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
        q = raw[..., 2:].copy().view(np.int8).reshape(rows, cols)
        return q, scale
    step = max(1, _CHUNK_BYTES // (4 * cols))
    q = np.empty((rows, cols), np.int8)
    scale = np.empty((rows, blocks_of(cols)), np.float32)
    for r0 in range(0, rows, step):
        try:
            block = dequantize(data[r0 : r0 + step], tensor.tensor_type)
        except NotImplementedError as e:
            raise UnsupportedConfigError(
                f"GGUF tensor {tensor.name!r} has type {tensor.tensor_type.name}, which gguf "
                "cannot dequantize"
            ) from e
        q[r0 : r0 + step], scale[r0 : r0 + step] = quantize_int8(block.reshape(-1, cols))
    return q, scale


def _config_value(config, name: str):
    return config[name] if isinstance(config, dict) else getattr(config, name)


def gguf_weight_name(arch: str, gguf_name: str) -> str:
    """The Hugging Face weight name of a GGUF tensor of architecture `arch`
    (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; Gemma 3's `ffn_norm`
    -> `pre_feedforward_layernorm`; Phi-3's fused `attn_qkv` -> `self_attn.qkv_proj` and
    `ffn_up` -> `mlp.gate_up_proj`).

    **Raises:** `UnsupportedConfigError` for a tensor name the architecture does not have.
    """
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    table = {**_COMMON_LAYER_TENSORS, **_ARCH_LAYER_TENSORS.get(arch, {})}
    if m is None or m.group(2) not in table:
        raise UnsupportedConfigError(f"unexpected GGUF tensor {gguf_name!r} for a {arch!r} model")
    layer, kind, param = m.groups()
    return f"model.layers.{layer}.{table[kind]}.{param}"


def read_gguf_weights(
    reader, config, *, dtype=np.float32, quantization: str | None = None
) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file under Hugging Face names, one tensor at a time.

    Vectors (norms, biases) become float32. Matrices become `dtype` (float32 or bfloat16)
    arrays, or with `quantization="int8"` an int8 `....weight` plus its float32 `....scale`
    requantized from the file's own blocks (`requantize_int8`; no float32 copy of the model is
    ever built). A `rope_freqs.weight` tensor (llama.cpp's form of Llama 3.1 RoPE scaling) is
    returned under `rope_freqs`, the divisors of the RoPE inverse frequencies; Phi-3's
    `rope_factors_*` tensors are config (`gguf_hf_config`), not weights.

    The file's conventions are undone: `llama` q/k rows are un-permuted; Gemma 3's norms, stored
    by llama.cpp as `1 + weight`, are returned as `weight` (transformers' convention, applied as
    `1 + weight`), as transformers' GGUF loader does.

    **Arguments:** `reader`: a `gguf.GGUFReader`; `config`: the model config or its Hugging
    Face dict (`gguf_hf_config`), for the head counts.

    **Raises:** `UnsupportedConfigError` for a tensor name or a tensor type the loader does not
    know; `ValueError` for an unknown `quantization`.
    """
    from gguf.quants import dequantize

    check_quantization(quantization)
    arch = metadata_field(reader, "general.architecture")
    permute = arch in _PERMUTED_ARCHITECTURES
    plus_one_norms = arch in _PLUS_ONE_NORM_ARCHITECTURES
    heads = {
        "attn_q": _config_value(config, "num_attention_heads"),
        "attn_k": _config_value(config, "num_key_value_heads"),
    }
    weights: dict[str, np.ndarray] = {}
    action = (
        "Requantizing GGUF tensors to int8"
        if quantization == "int8"
        else "Dequantizing GGUF tensors"
    )
    for t in progress_bar(reader.tensors, desc=action, unit="tensor"):
        kind = None
        if t.name == "rope_freqs.weight":
            name = "rope_freqs"
        elif t.name in CONFIG_TENSORS:
            continue
        else:
            name = gguf_weight_name(arch, t.name)
            m = re.fullmatch(r"blk\.\d+\.(\w+)\.\w+", t.name)
            kind = m.group(1) if m else None
        n_head = heads.get(kind) if permute else None
        matrix = len(t.shape) == 2 and name != "rope_freqs"
        if matrix and quantization == "int8":
            q, scale = requantize_int8(t)
            if n_head is not None:
                q, scale = _unpermute(q, n_head), _unpermute(scale, n_head)
            weights[name] = q
            weights[name.removesuffix("weight") + "scale"] = scale
            continue
        try:
            data = dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise UnsupportedConfigError(
                f"GGUF tensor {t.name!r} has type {t.tensor_type.name}, which gguf cannot dequantize"
            ) from e
        array = np.asarray(data, dtype=np.float32).reshape([int(n) for n in reversed(t.shape)])
        if n_head is not None:
            array = _unpermute(array, n_head)
        if plus_one_norms and t.name.endswith("norm.weight"):
            array = array - np.float32(1)
        weights[name] = array.astype(dtype) if matrix else array
    return weights


def load_gguf(
    path: str | os.PathLike,
    *,
    dtype=jnp.float32,
    quantization: str | None = None,
    tokenizer=None,
    cache: str | None = "int8",
):
    """Load `(model, tokenizer)` from a GGUF file.

    **Arguments:**

    - `path`: the `.gguf` file.
    - `dtype`: dtype of the matrices (`jnp.float32` or `jnp.bfloat16`); activations are float32.
    - `quantization`: `None`, or `"int8"`: every matrix requantized to per-block (32) int8
      from the file's own blocks, one tensor at a time (see `read_gguf_weights`); the result is
      cached and later loads of the same file read it (see `read_gguf`).
    - `tokenizer`: a tokenizer to return instead of building one from the file.
    - `cache`: which weights to cache (`GGUF_CACHE_MODES`, see `read_gguf`).

    **Returns:** `(DecoderForCausalLM, transformers tokenizer)`; the tokenizer is built by
    transformers from the file's `tokenizer.ggml.*` metadata, once, then read from the cache
    (see `gguf_tokenizer`).

    **Raises:** `FileNotFoundError` if the file does not exist; `UnsupportedConfigError` for an
    unsupported architecture (or one the decoder does not run yet), RoPE scaling or tensor type;
    `CheckpointError` for a truncated or damaged file or a missing metadata key; `ValueError`
    for an unknown `quantization`.
    """
    check_quantization(quantization)
    if cache not in GGUF_CACHE_MODES:
        raise ValueError(f"unknown cache {cache!r}; expected one of {GGUF_CACHE_MODES}")
    reader = _LazyReader(path)
    config, weights, generation_config = read_gguf(
        path,
        with_generation_config=True,
        dtype=dtype,
        quantization=quantization,
        reader=reader,
        cache=cache,
    )
    rope_freqs = weights.pop("rope_freqs", None)
    model = DecoderForCausalLM.from_weights(
        config, weights, dtype=dtype, generation_config=generation_config, quantization=quantization
    )
    del weights
    if rope_freqs is not None:
        inv_freq = jnp.asarray(config.rope_inv_freq() / rope_freqs.reshape(-1))
        model = eqx.tree_at(lambda m: m.model.rotary_emb.inv_freq, model, inv_freq)
    return model, (gguf_tokenizer(path, reader=reader) if tokenizer is None else tokenizer)


@functools.cache
def gguf_reader_class() -> type:
    """`gguf.GGUFReader` over a plain `numpy.ndarray` view of its memory map: the same fields,
    tensors and bytes, read about 3x faster.

    `GGUFReader` slices its `numpy.memmap` once or more per metadata value, and every slice of a
    `memmap` runs two Python methods (`memmap.__getitem__`, `__array_finalize__`): for Gemma 3's
    262,144-token vocabulary that is ~4 million calls, 60% of the ~10 s the stock reader takes
    to open the 270M file on 2 cores (gguf 0.19, profiled with cProfile). The subclass stores
    `np.memmap(...).view(np.ndarray)` instead (still backed by the memory map, still read-only
    in mode `"r"`), so the slices are plain ndarray views: `fields`, `tensors` and every
    `tensor.data` are equal to the stock reader's.

    **Returns:** the subclass (one class per process), constructed as `GGUFReader(path)`.
    """
    from gguf import GGUFReader

    # `data` is read once or more per metadata value (247,312 times for SmolLM2's file): not
    # wrapped by jaxtyping's checks in the tests (`@typing.no_type_check`)
    @typing.no_type_check
    class PlainArrayGGUFReader(GGUFReader):
        @property
        def data(self):
            return self._plain_data

        @data.setter
        def data(self, value):
            # the memmap's file name stays readable for messages (`gguf_file_name`)
            self.filename = getattr(value, "filename", None)
            self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return PlainArrayGGUFReader


def open_gguf(path: str | os.PathLike):
    """A `gguf.GGUFReader` of the file (memory-mapped; reads the header, the metadata and the
    tensor table, and checks that every tensor's bytes are in the file).

    **Raises:** `FileNotFoundError` if the file does not exist; `CheckpointError` naming the file
    when it is not a GGUF file (no `GGUF` magic) or is truncated or damaged (the `gguf`
    package's exception, e.g. numpy's reshape/view error on a cut-off file, is its `__cause__`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise CheckpointError(f"{path} is not a GGUF file: it does not start with b'GGUF'")
    try:
        return gguf_reader_class()(str(path))
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{path} is truncated or damaged ({path.stat().st_size:,} bytes): gguf could not read "
            f"its header or tensor table ({type(e).__name__}: {e})"
        ) from e


_CACHE_VERSION = 1  # bump when a cached tokenizer's or int8 file's layout changes


def gguf_cache_key(path: str | os.PathLike) -> str:
    """A name for what is cached from a GGUF file: its stem, size and modification time, and a
    digest of its absolute path (a changed or replaced file gets a new key)."""
    import hashlib

    path = Path(path).resolve()
    st = path.stat()
    digest = hashlib.sha256(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{path.stem}-{st.st_size}-{digest}-v{_CACHE_VERSION}"


GGUF_CACHE_MODES = (None, "int8", "all")
"""`read_gguf`'s `cache`: nothing, the int8 requantization only, or also the dequantized float
weights."""


def _cached_weights(path: Path, reader: "_LazyReader", config, *, dtype, quantization):
    """`read_gguf_weights(...)`, cached as one safetensors file in `cache_dir() / "gguf-weights"`
    (written under a temporary name and renamed, like the default model's float32 conversion);
    a later call reads that file instead of decoding the blocks again."""
    from safetensors.numpy import load_file, save_file

    kind = quantization or np.dtype(dtype).name
    target = cache_dir() / "gguf-weights" / f"{gguf_cache_key(path)}-{kind}.safetensors"
    if target.is_file():
        return load_file(str(target))
    weights = read_gguf_weights(reader(), config, dtype=dtype, quantization=quantization)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        save_file(weights, str(tmp))
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return weights


class _LazyReader:
    """Opens the GGUF file on the first call only: a 262k-token vocabulary makes
    `gguf.GGUFReader` take ~5-20 s, which a load served from the caches never pays."""

    def __init__(self, path, reader=None):
        self.path, self.reader = path, reader

    def __call__(self):
        if self.reader is None:
            self.reader = open_gguf(self.path)
        return self.reader


def _as_reader(path, reader):
    return reader() if isinstance(reader, _LazyReader) else reader or open_gguf(path)


def _cached_metadata(path: Path, lazy: _LazyReader, cache) -> tuple[dict, dict]:
    """`(gguf_hf_config, general.sampling.* values)`, kept in a JSON file beside the cached
    weights when `cache` is set."""
    target = cache_dir() / "gguf-weights" / f"{gguf_cache_key(path)}-metadata.json"
    if cache is not None and target.is_file():
        saved = json.loads(target.read_text())
        return saved["config"], saved["sampling"]
    reader = lazy()
    d, sampling = gguf_hf_config(reader), gguf_sampling(reader)
    if cache is not None:
        try:
            text = json.dumps({"config": d, "sampling": sampling})
        except TypeError:
            return d, sampling
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(target)
    return d, sampling


def read_gguf(
    path: str | os.PathLike,
    *,
    with_generation_config: bool = False,
    dtype=np.float32,
    quantization: str | None = None,
    reader=None,
    cache: str | None = "int8",
):
    """`(config, weights by Hugging Face name)` of a GGUF file (see `read_gguf_weights`; float32
    by default), plus its `GenerationConfig` as a third element when `with_generation_config`.

    `reader`: an open `gguf.GGUFReader` of `path` (see `open_gguf`), to read the header once.
    `cache` (one of `GGUF_CACHE_MODES`): `"int8"` (default): with `quantization="int8"`, the
    requantized weights are kept in `cache_dir() / "gguf-weights"` (keyed by `gguf_cache_key`)
    and read from there by later calls (the default model's int8 load: ~7 s of requantization
    once, then ~3 s, on this loaded machine); `"all"`: the float (`dtype`) weights too (4 bytes
    a parameter in float32: for the named models, whose size is known; Gemma 3 270M: 1.1 GB);
    `None`: nothing cached. With a cache, the file's metadata (`gguf_hf_config`) is cached too,
    so that a load served from the caches does not open the file.

    **Raises:** `FileNotFoundError` if the file does not exist; `ValueError` for an unknown
    `cache`; see `read_gguf_config` and `read_gguf_weights`.
    """
    if cache not in GGUF_CACHE_MODES:
        raise ValueError(f"unknown cache {cache!r}; expected one of {GGUF_CACHE_MODES}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    lazy = reader if isinstance(reader, _LazyReader) else _LazyReader(path, reader)
    d, sampling = _cached_metadata(path, lazy, cache)
    config = model_config_from_hf(d)
    if cache == "all" or (cache == "int8" and quantization == "int8"):
        weights = _cached_weights(path, lazy, config, dtype=dtype, quantization=quantization)
    else:
        weights = read_gguf_weights(lazy(), config, dtype=dtype, quantization=quantization)
    if with_generation_config:
        return config, weights, gguf_generation_config(config, sampling)
    return config, weights


def gguf_file_dtype(path: str | os.PathLike):
    """The float dtype a GGUF file stores its matrices in, for `dtype="auto"`: `jnp.bfloat16`
    when every matrix is BF16, else `jnp.float32` (F32, F16 and quantized types decode
    exactly to float32)."""
    from gguf import GGMLQuantizationType

    reader = open_gguf(path)
    types = {t.tensor_type for t in reader.tensors if len(t.shape) == 2}
    return jnp.bfloat16 if types == {GGMLQuantizationType.BF16} else jnp.float32


def gguf_tokenizer(path: str | os.PathLike, *, reader=None, cache: bool = True):
    """The transformers tokenizer described by a GGUF file's metadata, built without torch.

    The vocabulary, merges, special tokens and chat template are read with `gguf.GGUFReader` and
    handed to transformers' `convert_gguf_tokenizer` (which picks the tokenizer family, e.g.
    byte-level BPE for `tokenizer.ggml.model = gpt2`); the result is a `TokenizersBackend`, the
    same class and the same encoding as `AutoTokenizer.from_pretrained(dir, gguf_file=name)`,
    whose GGUF reader needs torch.

    Converting a large vocabulary is slow (Gemma 3's 262,144 tokens: ~45 s here), so with
    `cache` the converted `tokenizers.Tokenizer` (its `tokenizer.json`) and the tokenizer's
    arguments are saved in `cache_dir() / "gguf-tokenizers" / gguf_cache_key(path)`, and later
    calls rebuild the same tokenizer from there (a few seconds).

    **Arguments:** `path`: the `.gguf` file; `reader`: an open `gguf.GGUFReader` of it, to avoid
    reading the header twice; `cache`: read and write the converted tokenizer's cache.

    **Raises:** `FileNotFoundError` if the file does not exist; `CheckpointError` for a damaged
    file; `ValueError` (from transformers) for a tokenizer family it cannot build.
    """
    from transformers import TokenizersBackend
    from transformers.integrations.gguf import convert_gguf_tokenizer

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    target = cache_dir() / "gguf-tokenizers" / gguf_cache_key(path) if cache else None
    if target is None or not (target / _TOKENIZER_KWARGS).is_file():
        architecture, tokenizer_dict, tokenizer_config = gguf_tokenizer_metadata(
            _as_reader(path, reader)
        )
        backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
        kwargs = {**tokenizer_config, **extra}
        if target is not None:
            _cache_tokenizer(target, backend, kwargs)
        if target is None or not (target / _TOKENIZER_KWARGS).is_file():
            return TokenizersBackend(
                tokenizer_object=backend, name_or_path=str(path.parent), **kwargs
            )
    # `tokenizer_file`, not `tokenizer_object`: TokenizersBackend deep-copies an object
    # (serializing and parsing the 262k vocabulary once more)
    return TokenizersBackend(
        tokenizer_file=str(target / _TOKENIZER_BACKEND),
        name_or_path=str(path.parent),
        **json.loads((target / _TOKENIZER_KWARGS).read_text()),
    )


_TOKENIZER_BACKEND = "tokenizer.json"
_TOKENIZER_KWARGS = "tokenizers_backend_kwargs.json"


def _cache_tokenizer(target: Path, backend, kwargs: dict) -> None:
    """Save the converted `tokenizers.Tokenizer` and the `TokenizersBackend` arguments, so that a
    later `gguf_tokenizer` rebuilds exactly the same tokenizer without converting (and without
    transformers' slower `from_pretrained`, which parses the 30 MB JSON in Python too). The
    directory is written under a temporary name and renamed; nothing is cached when the
    arguments are not JSON."""
    import shutil
    import tempfile

    try:
        text = json.dumps(kwargs)
    except TypeError:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        backend.save(str(tmp / _TOKENIZER_BACKEND))
        (tmp / _TOKENIZER_KWARGS).write_text(text)
        tmp.chmod(0o755)
        tmp.rename(target)
    except OSError:  # another process cached it first
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
