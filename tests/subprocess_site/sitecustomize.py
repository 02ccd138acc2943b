"""Loaded by every Python subprocess of a test run (`tests/fast_compile.py` puts this directory
on `PYTHONPATH`): once JAX's compiler module has been imported, install the fast-compile wrapper
of `tests/fast_compile.py` (small CPU programs compile with XLA's fast options, as in the pytest
processes). Nothing is imported until then, so a subprocess that never imports JAX pays nothing."""

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "jax._src.compiler"
_PLUGIN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fast_compile.py"
)


def _install_fast_compile():
    spec = importlib.util.spec_from_file_location("_functional_gen_fast_compile", _PLUGIN)
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    plugin.install()


class _AfterCompilerImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `jax._src.compiler` is about to load, wraps its loader so that
    the wrapper is installed right after the module has run."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            try:
                _install_fast_compile()
            except Exception as error:  # never break the subprocess: it compiles with defaults
                print(f"fast-compile plugin not installed: {error!r}", file=sys.stderr)

        spec.loader.exec_module = exec_then_install
        return spec


if os.environ.get("FUNCTIONAL_GEN_TEST_FAST_COMPILE", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
):
    sys.meta_path.insert(0, _AfterCompilerImport())
