"""Load a Hugging Face checkpoint directory: `config.json`, `*.safetensors`, tokenizer files.

The config is read with transformers' `AutoConfig`, the tokenizer with `AutoTokenizer`, the
weights with `safetensors` (single file or sharded with `model.safetensors.index.json`).
"""

import json
import os
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers numpy's bfloat16, which safetensors' numpy reader needs)
import numpy as np

from ..models.config import (
    SUPPORTED_MODEL_TYPES,
    DecoderConfig,
    UnsupportedConfigError,
    config_from_hf,
)
from ..models.decoder import DecoderForCausalLM
from ..progress import progress_bar
from .errors import CheckpointError


def read_config(path: Path) -> DecoderConfig:
    """The `DecoderConfig` of a checkpoint directory, for any supported `model_type` (the family
    is chosen by `config.json`'s `model_type`, see `functional_gen.models.families`).

    EOS ids are the union of `config.json`'s and `generation_config.json`'s `eos_token_id` (as
    transformers' `generate` uses the latter).

    **Raises:** `FileNotFoundError` if `config.json` is missing; `CheckpointError` when it or
    `generation_config.json` is not a JSON object (see `_read_json`); `UnsupportedConfigError`
    for an architecture or config value the decoder does not implement.
    """
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{path} is not a Hugging Face checkpoint directory: no config.json "
            f"(found: {sorted(p.name for p in path.iterdir())[:12]})"
        )
    raw = _read_json(config_file)
    if raw.get("model_type") not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedConfigError(
            f"unknown architecture in {config_file}: model_type={raw.get('model_type')!r} "
            f"(architectures={raw.get('architectures')!r}); supported model types: "
            f"{SUPPORTED_MODEL_TYPES}"
        )
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    extra_eos: list[int] = []
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = _read_json(gen_file).get("eos_token_id")
        if eos is not None:
            extra_eos = [eos] if isinstance(eos, int) else list(eos)
    return config_from_hf(hf_config, extra_eos_token_ids=extra_eos)


def checkpoint_dtype(path: Path):
    """The float dtype a checkpoint directory's `config.json` declares (`dtype`, or the older
    `torch_dtype`), for `dtype="auto"`: `jnp.bfloat16` for bfloat16 checkpoints, else
    `jnp.float32` (float16 and float32 weights are exact in float32).

    **Raises:** `CheckpointError` when `config.json` is not a JSON object."""
    raw = _read_json(path / "config.json")
    declared = raw.get("dtype") or raw.get("torch_dtype")
    return jnp.bfloat16 if declared == "bfloat16" else jnp.float32


def safetensors_files(path: Path) -> list[Path]:
    """The weight files of a checkpoint directory (following a sharded index when there is one).

    **Raises:** `FileNotFoundError` when there are no `.safetensors` files (naming any
    `pytorch_model.bin` found, which is not supported) or when the index names a missing shard;
    `CheckpointError` when `model.safetensors.index.json` is not JSON or has no `weight_map`
    object.
    """
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(
                f"{index} is damaged: missing key `weight_map` (an object of weight name -> "
                f"shard file), found {type(weight_map).__name__}"
            )
        shards = sorted(set(map(str, weight_map.values())))
        files = [path / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are missing: {missing}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in path.glob("*.bin")) + sorted(
            p.name for p in path.glob("*.pt")
        )
        hint = f"; found {others}, but only safetensors weights are supported" if others else ""
        raise FileNotFoundError(f"no *.safetensors weights in {path}{hint}")
    return files


def read_weights(files: list[Path]) -> dict[str, np.ndarray]:
    """All tensors of the given safetensors files, by name, as numpy arrays (memory-mapped).

    **Raises:** `CheckpointError` naming the file when it is truncated or not a safetensors
    file (see `_safetensors_error`).
    """
    from safetensors import SafetensorError, safe_open

    weights: dict[str, np.ndarray] = {}
    if len(files) > 1:
        files = progress_bar(files, desc="Loading checkpoint shards", unit="shard")
    for f in files:
        try:
            with safe_open(str(f), framework="numpy") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open is not iterable)
                    weights[name] = st.get_tensor(name)
        except SafetensorError as e:
            raise _safetensors_error(f, e) from e
    if weights and not any(k.startswith("model.") for k in weights):
        # saved from the bare `LlamaModel`: put the names under `model.`
        weights = {k if k.startswith("lm_head.") else f"model.{k}": v for k, v in weights.items()}
    return weights


def _read_json(path: Path) -> dict:
    """The JSON object in `path` (a `config.json`, `generation_config.json` or
    `model.safetensors.index.json`).

    **Raises:** `CheckpointError` naming the file: "empty", "truncated" (the text ends inside a
    value), "not JSON" (with the line and column), "not UTF-8 text", or "not a JSON object"; the
    decoder's exception is kept as `__cause__`.
    """
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path} is not JSON: not UTF-8 text ({e})") from e
    if not text.strip():
        raise CheckpointError(f"{path} is empty (truncated?): expected a JSON object")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        truncated = e.pos >= len(text.rstrip()) or _ends_inside_a_value(text)
        what = "truncated: the JSON text ends early" if truncated else "not JSON"
        raise CheckpointError(
            f"{path} is {what} ({e.msg} at line {e.lineno}, column {e.colno})"
        ) from e
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} is not a JSON object (found a JSON {type(value).__name__})")
    return value


def _ends_inside_a_value(text: str) -> bool:
    """Whether JSON `text` ends inside a string or with brackets left open (what a file cut
    short looks like), as opposed to a syntax error in the middle."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return in_string or depth > 0


def _safetensors_error(path: Path, error: Exception) -> CheckpointError:
    """`CheckpointError` for safetensors' error about `path`, in words: "truncated" for a file
    shorter than its header says ("incomplete metadata", "invalid header length", "header too
    small"), "not a safetensors file" for a header that cannot be one."""
    message = str(error)
    size = path.stat().st_size if path.exists() else 0
    if any(s in message for s in ("incomplete metadata", "invalid header length", "too small")):
        what = f"truncated: {size} bytes, fewer than its header describes"
    elif "too large" in message or "invalid header" in message.lower():
        what = "not a safetensors file (its header is damaged)"
    else:
        what = "damaged"
    return CheckpointError(f"{path} is {what} (safetensors: {message})")


def load_checkpoint(path: str | os.PathLike, *, dtype=jnp.float32, quantization: str | None = None):
    """Load `(model, tokenizer)` from a Hugging Face checkpoint directory.

    **Arguments:**

    - `path`: directory with `config.json`, `*.safetensors` (or a sharded index) and tokenizer
      files (`tokenizer.json` or `tokenizer.model` + `tokenizer_config.json`).
    - `dtype`: dtype of the matrices (`jnp.float32` or `jnp.bfloat16`); activations and logits
      are float32, the `KVCache` the model's `kv_cache_dtype` (`"auto"`: bfloat16 on a GPU,
      else float32; `load_model(..., kv_cache_dtype=...)` chooses it).
    - `quantization`: `None` or `"int8"` (int8 matrices with a scale per block of 32 inputs, quantized one
      memory-mapped tensor at a time).

    **Returns:** `(DecoderForCausalLM, transformers tokenizer)`.

    **Raises:** `FileNotFoundError` for missing files; `CheckpointError` for a damaged file (a
    JSON file that is not JSON or truncated, a truncated safetensors file), naming it;
    `UnsupportedConfigError` for unsupported architectures or config values; `ValueError` when
    the weights do not match the config.
    """
    path = Path(path)
    config = read_config(path)
    # the tokenizer first: a damaged tokenizer file is refused before the weights are read
    tokenizer = load_tokenizer(path)
    weights = read_weights(safetensors_files(path))
    model = DecoderForCausalLM.from_weights(
        config,
        weights,
        dtype=dtype,
        generation_config=read_generation_config(path),
        quantization=quantization,
    )
    return model, tokenizer


def read_generation_config(path: Path):
    """The checkpoint's `transformers.GenerationConfig` from `generation_config.json`, or `None`."""
    if not (path / "generation_config.json").is_file():
        return None
    from transformers import GenerationConfig

    return GenerationConfig.from_pretrained(str(path), local_files_only=True)


def load_tokenizer(path: Path):
    """transformers' tokenizer of a checkpoint directory.

    **Raises:** `FileNotFoundError` when the directory has no tokenizer files; `CheckpointError`
    naming the file when transformers fails on a tokenizer JSON file that is truncated or not
    JSON (`TOKENIZER_JSON_FILES`; only checked after a failure, so a good load pays nothing).
    """
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise FileNotFoundError(
            f"no tokenizer in {path}: expected tokenizer.json (or tokenizer.model / vocab.json)"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception:
        for name in TOKENIZER_JSON_FILES:
            if (path / name).is_file():
                _read_json(path / name)  # raises CheckpointError naming a damaged file
        raise


TOKENIZER_JSON_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
)
"""The tokenizer files of a checkpoint directory that are JSON objects."""
