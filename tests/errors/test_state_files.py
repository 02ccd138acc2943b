"""Saved `SequenceState` files: a file missing a tensor or a header field raises
`SequenceStateFormatError` naming what is missing; `save` is atomic (no temporary file left
behind when interrupted, stale ones cleaned up), `fsync`s the file before the rename and the
directory after (issue 43, item 7). Damaged files are written by the tests from real saves."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import functional_gen as fg
from functional_gen.generation import durable_write
from functional_gen.generation.sequence_state import PARTIAL_SUFFIX
from functional_gen.testing import tiny_config

from ..helpers import tiny_tokenizer


@pytest.fixture(scope="module")
def state():
    model = fg.LlamaForCausalLM(tiny_config(), key=jax.random.key(7), std=0.2)
    tok = tiny_tokenizer(101)
    return fg.generate(model, tok, ["t3 t4 t5", "t9"], max_new_tokens=3, eos_token_id=()).state


def read(path):
    with safe_open(str(path), framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
        header = json.loads(f.metadata()["functional_gen"])
    return tensors, header


def write(path, tensors, header):
    save_file(tensors, str(path), metadata={"functional_gen": json.dumps(header)})


@pytest.fixture
def saved(state, tmp_path):
    path = tmp_path / "state.safetensors"
    state.save(path)
    return path


@pytest.mark.parametrize("missing", [["key"], ["cache.k.1"], ["logits", "cache.positions"]])
def test_a_missing_tensor_is_named(saved, tmp_path, missing):
    tensors, header = read(saved)
    for name in missing:
        del tensors[name]
    damaged = tmp_path / "damaged.safetensors"
    write(damaged, tensors, header)
    with pytest.raises(fg.SequenceStateFormatError) as err:
        fg.SequenceState.load(damaged)
    assert str(damaged) in str(err.value)
    for name in missing:
        assert f"`{name}`" in str(err.value)
    assert "tensor" in str(err.value)


@pytest.mark.parametrize("missing", ["version", "key_impl", "num_layers", "model_fingerprint"])
def test_a_missing_header_field_is_named(saved, tmp_path, missing):
    tensors, header = read(saved)
    del header[missing]
    damaged = tmp_path / "damaged.safetensors"
    write(damaged, tensors, header)
    with pytest.raises(fg.SequenceStateFormatError, match=f"header lacks the field `{missing}`"):
        fg.SequenceState.load(damaged)


@pytest.mark.parametrize("keep", [5, 100, -1])
def test_a_truncated_file_says_truncated(saved, keep):
    data = saved.read_bytes()
    saved.write_bytes(data[:keep])
    with pytest.raises(fg.SequenceStateFormatError, match="is truncated") as err:
        fg.SequenceState.load(saved)
    assert str(saved) in str(err.value)
    assert f"({len(data[:keep])} bytes" in str(err.value)


def test_the_tokenizer_fingerprint_is_required_in_version_2_only(saved, tmp_path):
    tensors, header = read(saved)
    del header["tokenizer_fingerprint"]
    write(tmp_path / "v2.safetensors", tensors, header)
    with pytest.raises(fg.SequenceStateFormatError, match="`tokenizer_fingerprint`"):
        fg.SequenceState.load(tmp_path / "v2.safetensors")
    write(tmp_path / "v1.safetensors", tensors, {**header, "version": 1})
    assert fg.SequenceState.load(tmp_path / "v1.safetensors").tokenizer_fingerprint is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"num_layers": "two"}, r"`num_layers` is 'two'"),
        ({"num_layers": -1}, r"`num_layers` is -1"),
        ({"cache_dtype": None}, r"`cache_dtype` is None for a cache of 2 layers"),
    ],
)
def test_a_header_field_of_the_wrong_kind_is_named(saved, tmp_path, change, says):
    tensors, header = read(saved)
    write(tmp_path / "bad.safetensors", tensors, {**header, **change})
    with pytest.raises(fg.SequenceStateFormatError, match=says):
        fg.SequenceState.load(tmp_path / "bad.safetensors")


def test_tensors_of_another_batch_size_are_named(saved, tmp_path):
    tensors, header = read(saved)
    tensors["length"] = tensors["length"][:1]
    write(tmp_path / "bad.safetensors", tensors, header)
    with pytest.raises(fg.SequenceStateFormatError, match=r"tensor `length` has shape \(1,\)"):
        fg.SequenceState.load(tmp_path / "bad.safetensors")


def partials(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(PARTIAL_SUFFIX))


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
def test_an_interrupted_save_leaves_the_old_file_and_no_temporary_file(
    state, saved, monkeypatch, step
):
    before = saved.read_bytes()

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if step == "write":  # the process is interrupted halfway through writing the bytes

        class HalfWrite:
            def __init__(self, path, mode):
                self.file = open(path, mode)  # noqa: SIM115 (closed in __exit__)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.file.close()

            def write(self, data):
                self.file.write(data[: len(data) // 2])
                raise KeyboardInterrupt

        monkeypatch.setattr(durable_write, "open", HalfWrite, raising=False)
    else:
        monkeypatch.setattr(os, step, interrupt)
    with pytest.raises(KeyboardInterrupt):
        state[0].save(saved)
    monkeypatch.undo()
    assert saved.read_bytes() == before
    assert partials(saved.parent) == []


def test_save_fsyncs_the_file_before_the_rename_and_the_directory_after(
    state, tmp_path, monkeypatch
):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        kind = "directory" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"
        events.append(("fsync", kind, os.fstat(fd).st_size))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", os.path.basename(src), os.path.basename(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "state.safetensors"
    state.save(path)
    monkeypatch.undo()
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    assert events[0][1] == "file" and events[0][2] == path.stat().st_size
    assert events[1][1].endswith(PARTIAL_SUFFIX) and events[1][2] == path.name
    assert events[2][1] == "directory"
    assert fg.SequenceState.load(path).row_token_ids() == state.row_token_ids()


def test_the_next_save_removes_stale_temporary_files_of_dead_processes(state, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".state.safetensors.{dead.pid}.0badc0de{PARTIAL_SUFFIX}"
    stale.write_bytes(b"half a state")
    alive = tmp_path / f".other.safetensors.{os.getppid()}.12345678{PARTIAL_SUFFIX}"
    alive.write_bytes(b"another process is saving")
    mine = tmp_path / f".x.safetensors.{os.getpid()}.87654321{PARTIAL_SUFFIX}"
    mine.write_bytes(b"this process is saving in another thread")
    unrelated = tmp_path / f"notes.{dead.pid}.txt"
    unrelated.write_text("not ours")
    state.save(tmp_path / "state.safetensors")
    assert not stale.exists()
    assert alive.exists() and mine.exists() and unrelated.exists()
    assert partials(tmp_path) == sorted([alive.name, mine.name])


def test_a_save_into_a_missing_directory_raises_and_leaves_nothing(state, tmp_path):
    with pytest.raises(FileNotFoundError):
        state.save(tmp_path / "no" / "such" / "dir" / "state.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_a_saved_state_still_round_trips(state, saved):
    loaded = fg.SequenceState.load(saved)
    assert loaded.row_token_ids() == state.row_token_ids()
    np.testing.assert_array_equal(np.asarray(loaded.arrays.logits), np.asarray(state.arrays.logits))
    assert len(loaded.cache.k) == 2
