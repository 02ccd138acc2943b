"""`load_model`: Hugging Face checkpoint directories, GGUF files and the embedded default model."""

import os
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp

from .checkpoint import load_checkpoint as load_checkpoint
from .default_model import (
    DEFAULT_MODEL_NAME as DEFAULT_MODEL_NAME,
    default_gguf_path as default_gguf_path,
    ensure_default_checkpoint as ensure_default_checkpoint,
)
from .gguf_file import load_gguf as load_gguf

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def load_model(
    path: str | os.PathLike | None = None,
    *,
    dtype=jnp.float32,
    progress: Callable[[str], None] | None = None,
):
    """Load a decoder-only language model and its tokenizer.

    **Arguments:**

    - `path`: a Hugging Face checkpoint directory (`config.json`, `*.safetensors` or a sharded
      index, tokenizer files), a `.gguf` file, or `None` for the embedded default model,
      SmolLM2-135M-Instruct (converted once to a cached checkpoint; see
      `functional_gen.loading.default_model`).
    - `dtype`: `jnp.float32` (default) or `jnp.bfloat16` (also accepted as a string): the dtype of
      the weights, the activations and the `KVCache`. Logits are always float32.
    - `progress`: called with a message before slow first-time work (converting the default model).

    **Returns:** `(model, tokenizer)`: a `functional_gen.models.LlamaForCausalLM` and a
    transformers tokenizer.

    **Raises:** `FileNotFoundError` for a missing path, missing files, or the default model's
    package not being installed; `functional_gen.models.UnsupportedConfigError` for an unknown
    architecture or an unsupported config value; `ValueError` for an unsupported `dtype`.
    """
    dtype = _resolve_dtype(dtype)
    if path is None:
        return load_checkpoint(ensure_default_checkpoint(progress), dtype=dtype)
    p = Path(path)
    if p.is_dir():
        return load_checkpoint(p, dtype=dtype)
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(
                f"{p} is a file but not a .gguf file; pass a GGUF file or a checkpoint directory"
            )
        return load_gguf(p, dtype=dtype)
    raise FileNotFoundError(f"no such model file or directory: {p}")


def _resolve_dtype(dtype):
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; expected one of {sorted(_DTYPES)}")
        return _DTYPES[dtype]
    for d in _DTYPES.values():
        if jnp.dtype(dtype) == jnp.dtype(d):
            return d
    raise ValueError(f"unsupported dtype {dtype!r}; expected float32 or bfloat16")
