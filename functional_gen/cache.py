"""functional_gen's cache directory, and JAX's persistent compilation cache inside it.

A small neutral module: `loading/` (converted checkpoints), `structured/` (automata) and the
command line use it without importing each other.
"""

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where functional_gen keeps converted checkpoints, automata and compiled programs:
    `$FUNCTIONAL_GEN_CACHE`, else `$XDG_CACHE_HOME/functional_gen`, else
    `~/.cache/functional_gen`."""
    if os.environ.get("FUNCTIONAL_GEN_CACHE"):
        return Path(os.environ["FUNCTIONAL_GEN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "functional_gen"


def compilation_cache_dir() -> Path:
    """The folder of JAX's persistent compilation cache when `enable_compilation_cache` chose it:
    `cache_dir() / "jax"`."""
    return cache_dir() / "jax"


def enable_compilation_cache(
    directory: str | os.PathLike | None = None, *, min_compile_time_secs: float = 0.2
) -> Path | None:
    """Turn on JAX's persistent compilation cache, so that another process compiling the same
    program (same model structure, shapes, processors and JAX version) loads it from disk instead
    of compiling it again: a repeated `functional-gen` call starts generating in seconds.

    The command line calls this at start-up. From Python, call it before the first compilation
    (JAX decides once per process whether to use the cache):

    ```python
    import functional_gen as fg
    fg.enable_compilation_cache()          # cache_dir() / "jax"
    model, tokenizer = fg.load_model()
    ```

    A cache directory already configured for JAX (`JAX_COMPILATION_CACHE_DIR` or
    `jax.config.update("jax_compilation_cache_dir", ...)`) is kept. The environment variable
    `FUNCTIONAL_GEN_COMPILATION_CACHE=0` turns it off (the test suite does: one long-lived
    process compiling hundreds of programs gains nothing from writing them all to disk).

    **Arguments:** `directory`: where to keep compiled programs (default
    `compilation_cache_dir()`); `min_compile_time_secs`: programs that compile faster than this
    are not written (JAX's own default is 1 s; small programs add up at start-up).

    **Returns:** the directory in use, or `None` when turned off.

    Source: JAX's "Persistent compilation cache" (`jax_compilation_cache_dir`,
    `jax_persistent_cache_min_compile_time_secs`).
    """
    import jax

    if os.environ.get("FUNCTIONAL_GEN_COMPILATION_CACHE", "").strip().lower() in (
        "0",
        "false",
        "no",
        "off",
    ):
        return None
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return Path(configured)
    path = Path(directory) if directory is not None else compilation_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    return path
