"""The per-tokenizer disk cache (`structured.vocabulary_tables`): a later call (a fresh process's
memo) reads the arrays from disk, equal to a fresh build; a corrupted, truncated, foreign or
other-format file is ignored and rebuilt; untrusted fingerprints and `..._CACHE=0` write
nothing."""

import hashlib
import itertools

import numpy as np
import pytest

from functional_gen.structured import byte_dfa, vocabulary_tables
from functional_gen.structured.pushdown import token_tables
from functional_gen.structured.vocabulary import TokenVocabulary


def _vocabulary(alphabet: bytes = b'ab{}":,', eos: int = 0) -> TokenVocabulary:
    """A small vocabulary with an honest SHA-256 fingerprint of its bytes (as
    `vocabulary_from_tokenizer` makes them)."""
    tokens = [None] + [bytes(t) for n in (1, 2, 3) for t in itertools.product(alphabet, repeat=n)]
    digest = hashlib.sha256(repr((eos,)).encode())
    for b in tokens:
        digest.update(b"\xff" if b is None else len(b).to_bytes(4, "little") + b)
    return TokenVocabulary(tuple(tokens), (eos,), digest.hexdigest())


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCTIONAL_GEN_CACHE", str(tmp_path))
    monkeypatch.delenv("FUNCTIONAL_GEN_VOCABULARY_CACHE", raising=False)
    return tmp_path


def _forget(vocabulary):
    """Drop the process's memos, as a fresh process starts."""
    byte_dfa._TRIES.pop(vocabulary.fingerprint, None)
    token_tables._BYTE_MATRICES.pop(vocabulary.fingerprint, None)


def _trie_arrays(trie):
    return [trie.byte, trie.child_ptr, trie.token_ptr, trie.token_ids]


def _reference_trie(vocabulary):
    """Every (byte string -> token ids) pair the trie spells, by walking it: an independent
    reading of the arrays."""
    trie, out = byte_dfa.token_trie(vocabulary), {}

    def walk(node, prefix):
        ids = trie.token_ids[trie.token_ptr[node] : trie.token_ptr[node + 1]].tolist()
        if ids:
            out[prefix] = sorted(ids)
        for child in range(trie.child_ptr[node], trie.child_ptr[node + 1]):
            walk(child, prefix + bytes([int(trie.byte[child])]))

    walk(0, b"")
    return out


def test_second_call_reads_the_disk_and_gives_identical_tables(cache, monkeypatch):
    vocabulary = _vocabulary()
    _forget(vocabulary)
    built_trie = _trie_arrays(byte_dfa.token_trie(vocabulary))
    built_bytes = token_tables.token_byte_matrix(vocabulary)
    # the trie spells exactly the vocabulary
    expected = {}
    for i, b in enumerate(vocabulary.token_bytes):
        if b:
            expected.setdefault(b, []).append(i)
    assert _reference_trie(vocabulary) == expected
    assert vocabulary_tables.tables_path("trie", vocabulary).is_file()
    assert vocabulary_tables.tables_path("bytes", vocabulary).is_file()

    _forget(vocabulary)

    def no_build(*_):
        raise AssertionError("rebuilt although the disk cache holds the arrays")

    monkeypatch.setattr(byte_dfa, "_build_trie", no_build)
    monkeypatch.setattr(token_tables, "_token_byte_matrix_uncached", no_build)
    for a, b in zip(built_trie, _trie_arrays(byte_dfa.token_trie(vocabulary))):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    for a, b in zip(built_bytes, token_tables.token_byte_matrix(vocabulary)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    _forget(vocabulary)


def _corrupt_flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _corrupt_truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _foreign(path):
    """Another vocabulary's valid file put under this one's name."""
    other = _vocabulary(b"xyz")
    vocabulary_tables.cached_tables(
        "trie", other, byte_dfa._TRIE_ARRAYS, lambda: byte_dfa._build_trie(other)
    )
    path.write_bytes(vocabulary_tables.tables_path("trie", other).read_bytes())


def _other_format(path):
    """This vocabulary's arrays, valid but written by another format version."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["_format"] = np.asarray(str(vocabulary_tables.TABLES_FORMAT + 1))
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _same_checksum_other_arrays(path):
    """The arrays changed (a token id), the metadata kept: the checksum no longer matches."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["token_ids"] = arrays["token_ids"][::-1].copy()
    with open(path, "wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize(
    "damage",
    [_corrupt_flip, _corrupt_truncate, _foreign, _other_format, _same_checksum_other_arrays],
)
def test_a_damaged_or_foreign_file_is_rebuilt(cache, damage):
    vocabulary = _vocabulary()
    _forget(vocabulary)
    expected = _trie_arrays(byte_dfa.token_trie(vocabulary))
    path = vocabulary_tables.tables_path("trie", vocabulary)
    damage(path)
    _forget(vocabulary)
    for a, b in zip(expected, _trie_arrays(byte_dfa.token_trie(vocabulary))):
        assert np.array_equal(a, b)
    # and the file is whole again: read back as it is
    arrays = vocabulary_tables._load(path, "trie", vocabulary.fingerprint, byte_dfa._TRIE_ARRAYS)
    assert arrays is not None and np.array_equal(arrays["token_ids"], expected[3])
    _forget(vocabulary)


def test_untrusted_fingerprint_or_cache_off_writes_nothing(cache, monkeypatch):
    vocabulary = _vocabulary()
    hand_made = TokenVocabulary(vocabulary.token_bytes, vocabulary.eos_token_id, "bytes-only")
    _forget(hand_made)
    byte_dfa.token_trie(hand_made)
    _forget(hand_made)
    monkeypatch.setenv("FUNCTIONAL_GEN_VOCABULARY_CACHE", "0")
    _forget(vocabulary)
    byte_dfa.token_trie(vocabulary)
    _forget(vocabulary)
    assert not list(cache.rglob("*.npz"))
