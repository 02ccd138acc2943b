"""The suite's fast-compile plugin (tests/fast_compile.py): it measures a program's arguments and
results as XLA sees them, and only small CPU programs get the fast-compile options."""

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import compiler

from tests import fast_compile


def _lowered_module(f, *args):
    return jax.jit(f).lower(*args).compiler_ir("stablehlo")


def test_program_bytes_counts_arguments_and_results_by_dtype():
    x = jnp.ones((100, 200), jnp.float32)  # 80,000 bytes
    y = jnp.ones((200, 3), jnp.bfloat16)  # 1,200
    k = jnp.ones((7,), jnp.int8)  # 7
    module = _lowered_module(
        lambda x, y, k: ((x @ y.astype(jnp.float32)).astype(jnp.bfloat16), k), x, y, k
    )
    # results: [100, 3] bfloat16 (600) and the int8 [7] again
    assert fast_compile.program_bytes(module) == 80_000 + 1_200 + 7 + 600 + 7


def test_small_cpu_programs_get_the_options_and_large_ones_the_defaults(monkeypatch):
    seen = []

    def record(backend, computation, devices, compile_options, *args, **kwargs):
        size = fast_compile.program_bytes(computation)
        seen.append((size, dict(compile_options.env_option_overrides)))
        return original(backend, computation, devices, compile_options, *args, **kwargs)

    wrapped = compiler.compile_or_get_cached
    assert getattr(wrapped, "_functional_gen_fast_compile", False)  # installed by the plugin
    # the wrapper calls what it wrapped: record the options it passes on
    original = wrapped.__wrapped__
    monkeypatch.setattr(wrapped, "__wrapped__", record)
    small = jax.jit(lambda x: x * 2.0 + 1.0)
    np.testing.assert_array_equal(small(jnp.arange(4.0)), [1.0, 3.0, 5.0, 7.0])
    rows = fast_compile.FAST_COMPILE_MAX_BYTES // 4 + 1  # one float32 row over the limit
    large = jax.jit(lambda x: x[:1] - 1.0)
    assert float(large(jnp.ones((rows,), jnp.float32))[0]) == 0.0
    limit = fast_compile.FAST_COMPILE_MAX_BYTES
    assert any(size <= limit for size, _ in seen) and any(size > limit for size, _ in seen)
    for size, options in seen:
        assert options == (fast_compile.FAST_COMPILE_OPTIONS if size <= limit else {}), size


def test_python_subprocesses_get_the_wrapper_too():
    """A Python subprocess of the run (as a notebook's kernel or a multi-device worker is) finds
    `subprocess_site` on its `PYTHONPATH` and installs the wrapper once it imports JAX."""
    import os
    import subprocess
    import sys

    assert fast_compile.SUBPROCESS_SITE in os.environ["PYTHONPATH"].split(os.pathsep)
    code = (
        "import jax, jax.numpy as jnp\n"
        "from jax._src import compiler\n"
        "assert float(jax.jit(lambda x: x * 2.0)(jnp.float32(3.0))) == 6.0\n"
        "print(getattr(compiler.compile_or_get_cached, '_functional_gen_fast_compile', False))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True"]
