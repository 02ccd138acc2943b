"""Per-tokenizer arrays that no schema changes (the vocabulary's token trie, its byte matrix),
kept on disk so that a fresh process does not rebuild them for its first constraint.

Building them takes 0.15-0.2 s for SmolLM2's 49,152 tokens (`byte_dfa.token_trie`,
`pushdown.token_tables.token_byte_matrix`), a third of the first JSON Schema compile of a
typical schema in a fresh process once scipy is out of the way (`graphs`); reading them back
takes a few milliseconds. Each set is one `.npz` file under `vocabulary_cache_dir()`, named by
its kind, `TABLES_FORMAT` and the vocabulary's fingerprint (SHA-256 of every token's bytes and
the EOS ids), written atomically (a temporary file, then `os.replace`). The file also holds
the fingerprint, the format and a BLAKE2b checksum of every array (names, dtypes, shapes,
bytes): a file that is truncated, corrupted, of another format or of another vocabulary is
ignored and rebuilt, never used. `FUNCTIONAL_GEN_VOCABULARY_CACHE=0` turns the disk cache off
(the arrays are still memoised in the process by their callers).
"""

import contextlib
import hashlib
import os
import re
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..cache import cache_dir
from .vocabulary import TokenVocabulary

TABLES_FORMAT = 1
"""Version of the arrays' layout; bump it when a builder's output changes."""

_OFF = ("0", "false", "no", "off")


def vocabulary_cache_dir() -> Path:
    """Where per-tokenizer arrays are kept: `<functional_gen cache>/vocabulary`
    (`functional_gen.cache.cache_dir`)."""
    return cache_dir() / "vocabulary"


def vocabulary_cache_enabled() -> bool:
    """False when `$FUNCTIONAL_GEN_VOCABULARY_CACHE` is `0`/`false`/`no`/`off`."""
    return os.environ.get("FUNCTIONAL_GEN_VOCABULARY_CACHE", "").strip().lower() not in _OFF


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def tables_path(kind: str, vocabulary: TokenVocabulary) -> Path | None:
    """The file of the `kind` arrays of `vocabulary`, or None (no disk cache) when its
    fingerprint is not a SHA-256 hex digest as `vocabulary_from_tokenizer` makes them (a
    hand-made `TokenVocabulary("...", fingerprint="bytes-only")` is not trusted to name its
    bytes across processes) or the disk cache is off."""
    if not vocabulary_cache_enabled() or not _SHA256_HEX.fullmatch(vocabulary.fingerprint):
        return None
    return vocabulary_cache_dir() / f"{kind}-v{TABLES_FORMAT}-{vocabulary.fingerprint}.npz"


def _checksum(kind: str, fingerprint: str, arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.blake2b(f"{TABLES_FORMAT}\0{kind}\0{fingerprint}".encode(), digest_size=32)
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.data)
    return digest.hexdigest()


def _load(path: Path, kind: str, fingerprint: str, names) -> dict[str, np.ndarray] | None:
    """The arrays of `path` when it is a complete file of this kind, format and fingerprint
    whose checksum matches; else None."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = {k: str(data[k]) for k in ("_kind", "_format", "_fingerprint", "_checksum")}
            arrays = {name: data[name] for name in names}
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    if (meta["_kind"], meta["_format"], meta["_fingerprint"]) != (
        kind,
        str(TABLES_FORMAT),
        fingerprint,
    ) or meta["_checksum"] != _checksum(kind, fingerprint, arrays):
        return None
    return arrays


def _save(path: Path, kind: str, fingerprint: str, arrays: dict[str, np.ndarray]) -> None:
    meta = {
        "_kind": np.asarray(kind),
        "_format": np.asarray(str(TABLES_FORMAT)),
        "_fingerprint": np.asarray(fingerprint),
        "_checksum": np.asarray(_checksum(kind, fingerprint, arrays)),
    }
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".tmp.npz", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays, **meta)
        os.replace(tmp, path)
        tmp = None
    except OSError:  # a read-only cache is not an error
        pass
    finally:
        if tmp is not None:  # drop our own temporary file after a failed write
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def cached_tables(
    kind: str,
    vocabulary: TokenVocabulary,
    names: tuple[str, ...],
    build: Callable[[], dict[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """The arrays `names` of `kind` for `vocabulary`: read from `tables_path(kind, vocabulary)`
    when a valid file is there, else `build()` (a dict with exactly `names`), written there
    atomically and returned (no file for a vocabulary that `tables_path` does not trust).

    **Raises:** `ValueError` when `build()` does not return exactly the arrays `names`.
    """
    path = tables_path(kind, vocabulary)
    if path is not None and path.is_file():
        arrays = _load(path, kind, vocabulary.fingerprint, names)
        if arrays is not None:
            return arrays
    arrays = build()
    if set(arrays) != set(names):
        raise ValueError(f"the {kind!r} builder gave the arrays {sorted(arrays)}, expected {names}")
    if path is not None:
        _save(path, kind, vocabulary.fingerprint, arrays)
    return arrays
