"""transformers' PyTorch oracles built from GGUF files, kept for the rest of the test run.

`torch_model_from_gguf` builds transformers' model of a GGUF file (the oracle of the tests that
compare our decoder with transformers on the default model and on Gemma 3 270M). Building one
dequantizes every tensor in transformers' GGUF reader: 11-15 s of CPU for SmolLM2-135M or
Gemma 3 270M on the 2-core machine, and each pytest-xdist worker (and each module whose fixture
needs one) used to do it again. The first process of a run to build a file's model saves it
with `save_pretrained` (transformers' own safetensors of those dequantized tensors) in the run's
directory `TORCH_GGUF_CACHE`, under a file lock so that two workers never build it at once;
later ones read it back (0.1 s, memory-mapped). tests/test_oracle_cache.py checks that a
read-back model equals a freshly built one (every tensor bit for bit, the config, the logits).

This module imports nothing heavy at import time: tests/conftest.py imports it before JAX is
configured (JAX reads its cache settings from the environment when it is imported).
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

# A directory of this test run (made by tests/conftest.py's `pytest_configure` in the controller,
# passed to the pytest-xdist workers through the environment, deleted at the run's end).
TORCH_GGUF_CACHE = "FUNCTIONAL_GEN_TEST_TORCH_GGUF_CACHE"


def cache_entry(path: Path, dtype) -> Path | None:
    """Where `torch_model_from_gguf` keeps transformers' model of the GGUF file `path` in this
    run's cache (None when the run has none): named by the file's contents (SHA-256, under a
    second for the 253 MB Gemma file: each worker assembles that file into a cache directory of
    its own, so its path says nothing), the dtype and the versions of transformers and torch
    that build the model."""
    import torch
    import transformers

    root = os.environ.get(TORCH_GGUF_CACHE)
    if not root:
        return None
    with open(path, "rb") as f:
        contents = hashlib.file_digest(f, "sha256").hexdigest()
    key = (contents, str(dtype), transformers.__version__, torch.__version__)
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    return Path(root) / f"{Path(path).stem}-{digest}"


def torch_model_from_gguf(path, *, dtype):
    """transformers' PyTorch model of the GGUF file `path`, in eval mode: every tensor
    dequantized by transformers' own GGUF reader (`from_pretrained(dir, gguf_file=name,
    dtype=dtype)`, the file parsed with `helpers.transformers_reads_gguf_with_plain_arrays`),
    built once per test run and read back from `cache_entry` after that.

    Either way the model has no GGUF quantizer attached (transformers'
    `remove_quantization_config`, which `save_pretrained` needs; the quantizer only records
    that the weights came dequantized from a GGUF file), and its config is the one built from
    the file (`_name_or_path` the file's directory, `architectures` as the file gave it). Outside a test run (no cache directory) the model is built every time.
    Nothing is downloaded (`local_files_only`)."""
    from filelock import FileLock
    from transformers import AutoModelForCausalLM

    from .helpers import transformers_reads_gguf_with_plain_arrays

    path = Path(path).resolve()

    def build():
        with transformers_reads_gguf_with_plain_arrays():
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=dtype, local_files_only=True
            )
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        return model.eval()

    entry = cache_entry(path, dtype)
    if entry is None:
        return build()
    with FileLock(f"{entry}.lock"):
        if entry.is_dir():  # complete: renamed into place only once written
            model = AutoModelForCausalLM.from_pretrained(
                str(entry), dtype=dtype, local_files_only=True
            )
            model.config._name_or_path = str(path.parent)
            return model.eval()
        model = build()
        partial = entry.with_name(entry.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        # `save_pretrained` writes the class name into `config.architectures` (None in a model
        # built from a GGUF file): the built model and the saved config keep the file's value
        architectures = model.config.architectures
        model.save_pretrained(str(partial))
        model.config.architectures = architectures
        saved = json.loads((partial / "config.json").read_text())
        saved["architectures"] = architectures
        (partial / "config.json").write_text(json.dumps(saved, indent=2))
        partial.rename(entry)
        return model
