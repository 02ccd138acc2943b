"""The file format of a saved `SequenceState`: what a file holds, its versions, and the checks
that name what a damaged file lacks.

A saved state is one safetensors file: the per-row tensors (`ROW_TENSORS`), the KV cache
(`cache.positions`, `cache.length`, `cache.k.{i}` / `cache.v.{i}` per layer, as float32) and a
JSON header under the metadata key `functional_gen` (`HEADER_FIELDS` of its version).
`functional_gen.generation.sequence_state.SequenceState.save` / `load` turn a state into these
tensors and back, and write the bytes durably (atomic rename, `fsync`).
"""

import json
import os

FORMAT_NAME = "functional_gen.SequenceState"
"""The `format` entry of a saved state's header."""
FORMAT_VERSION = 3
"""The newest version of the saved format this code writes (a state whose cache has no rings
is written as version 2, which older readers still read). Version 2 added the header field
`tokenizer_fingerprint`; version 3 the fields `ring_layers` and `sliding_window` and the tensor
`cache.ring_positions` (sliding-window layers keep their keys and values in rings of other
lengths than `max_len`, see `functional_gen.models.kv_cache`; a reader of version 2 would take
them for full buffers). Versions 1 and 2 files are still read (version 1 without a tokenizer
check)."""
READABLE_VERSIONS = (1, 2, 3)
"""The saved format versions `SequenceState.load` reads."""
HEADER_FIELDS = {
    1: ("format", "version", "model_fingerprint", "key_impl", "num_layers", "cache_dtype"),
    2: (
        "format",
        "version",
        "model_fingerprint",
        "tokenizer_fingerprint",
        "key_impl",
        "num_layers",
        "cache_dtype",
    ),
    3: (
        "format",
        "version",
        "model_fingerprint",
        "tokenizer_fingerprint",
        "key_impl",
        "num_layers",
        "cache_dtype",
        "ring_layers",
        "sliding_window",
    ),
}
"""The header fields of each format version (every one must be present; values may be null)."""
ROW_TENSORS = (
    "token_ids",
    "token_logprobs",
    "length",
    "cached",
    "prompt_length",
    "logits",
    "key",
    "key_step",
)
"""The tensors every saved state holds, each with a leading batch axis; a state with a cache
also holds `cache.positions`, `cache.length` and `cache.k.{i}` / `cache.v.{i}` per layer (and
`cache.ring_positions` when its header's `ring_layers` is not empty)."""


class SequenceStateFormatError(ValueError):
    """A file is not a saved `SequenceState`, has a format version this code does not read, or
    lacks a tensor or header field (the message names what is missing)."""


def encode_state(tensors: dict, header: dict) -> bytes:
    """The bytes of a saved state: `tensors` (name -> numpy array) and `header` (the fields of
    `HEADER_FIELDS` of its version other than `format`, which is added, and `version`, added as
    `FORMAT_VERSION` unless `header` names it)."""
    from safetensors.numpy import save as to_bytes  # deferred: only a save needs it

    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, **header}
    return to_bytes(tensors, metadata={"functional_gen": json.dumps(header)})


def decode_state(path: str) -> tuple[dict, dict]:
    """Read and check the saved state at `path`.

    **Returns:** `(header, arrays)`: the JSON header (every field of its version present) and the
    tensors by name (numpy arrays; every tensor of the header's version present, with one batch
    axis).

    **Raises:** `FileNotFoundError`; `SequenceStateFormatError` for a file that is not a saved
    `SequenceState` (truncated, another format), has a version not in `READABLE_VERSIONS`, lacks
    a header field or a tensor (naming each), or holds tensors of inconsistent shapes.
    """
    from safetensors import SafetensorError, safe_open  # deferred: only a load needs it

    if not os.path.exists(path):
        raise FileNotFoundError(f"no saved SequenceState at {path!r}")
    try:
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            arrays = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except (SafetensorError, OSError, ValueError) as e:
        cut = ("incomplete metadata", "invalid header length", "header too small")
        if any(words in str(e) for words in cut):
            raise SequenceStateFormatError(
                f"{path!r} is truncated ({os.path.getsize(path)} bytes, fewer than its "
                f"header describes): not a whole saved SequenceState ({e})"
            ) from e
        raise SequenceStateFormatError(f"{path!r} is not a saved SequenceState: {e}") from e
    try:
        header = json.loads(meta["functional_gen"])
        assert header["format"] == FORMAT_NAME
    except (KeyError, ValueError, AssertionError, TypeError):
        raise SequenceStateFormatError(
            f"{path!r} is a safetensors file but not a saved SequenceState"
        ) from None
    if "version" not in header:
        raise SequenceStateFormatError(
            f"{path!r} is a damaged SequenceState: its header lacks the field `version`"
        )
    version = header["version"]
    if version not in READABLE_VERSIONS:
        raise SequenceStateFormatError(
            f"{path!r} has SequenceState format version {version!r}; this functional_gen "
            f"reads versions {', '.join(map(str, READABLE_VERSIONS))}"
        )
    check_saved_fields(path, version, header, arrays)
    return header, arrays


def check_saved_fields(path: str, version: int, header: dict, arrays: dict) -> None:
    """Refuse a saved state that lacks a header field or a tensor of its version, naming every
    missing one, or whose tensors disagree on the batch size or width."""
    missing = [f"`{name}`" for name in HEADER_FIELDS[version] if name not in header]
    if missing:
        raise SequenceStateFormatError(
            f"{path!r} is a damaged SequenceState (version {version}): its header lacks the "
            f"field{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
        )
    num_layers = header["num_layers"]
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 0:
        raise SequenceStateFormatError(
            f"{path!r} is a damaged SequenceState: header field `num_layers` is {num_layers!r}, "
            "not a count"
        )
    if num_layers and not isinstance(header["cache_dtype"], str):
        raise SequenceStateFormatError(
            f"{path!r} is a damaged SequenceState: header field `cache_dtype` is "
            f"{header['cache_dtype']!r} for a cache of {num_layers} layers"
        )
    needed = list(ROW_TENSORS)
    if num_layers:
        needed += ["cache.positions", "cache.length"]
        needed += [f"cache.{kv}.{i}" for i in range(num_layers) for kv in ("k", "v")]
        if header.get("ring_layers"):
            needed.append("cache.ring_positions")
    missing = [f"`{name}`" for name in needed if name not in arrays]
    if missing:
        raise SequenceStateFormatError(
            f"{path!r} is a damaged SequenceState: it lacks the tensor"
            f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
        )
    batch = arrays["token_ids"].shape[0] if arrays["token_ids"].ndim == 2 else None
    for name in ROW_TENSORS:
        shape = arrays[name].shape
        if batch is None or not shape or shape[0] != batch:
            raise SequenceStateFormatError(
                f"{path!r} is a damaged SequenceState: tensor `{name}` has shape {shape}, "
                f"token_ids {arrays['token_ids'].shape}; every tensor needs the same batch axis"
            )
    if arrays["token_logprobs"].shape != arrays["token_ids"].shape:
        raise SequenceStateFormatError(
            f"{path!r} is a damaged SequenceState: tensor `token_logprobs` has shape "
            f"{arrays['token_logprobs'].shape}, token_ids {arrays['token_ids'].shape}"
        )
