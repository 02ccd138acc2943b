"""The cache directory of functional_gen: a small neutral module, so that `structured/` (compiled
automata) and `loading/` (converted checkpoints) share it without importing each other."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where functional_gen caches files: `$FUNCTIONAL_GEN_CACHE`, else
    `$XDG_CACHE_HOME/functional_gen`, else `~/.cache/functional_gen`. Not created here."""
    if os.environ.get("FUNCTIONAL_GEN_CACHE"):
        return Path(os.environ["FUNCTIONAL_GEN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "functional_gen"
