"""XLA:CPU's fast-compile options for the small programs of the test suite (a pytest plugin,
loaded by tests/conftest.py).

Most tests run tiny random models (kilobytes of weights, a few rows), whose programs take
seconds to compile and microseconds to run: the suite is bound by XLA compiling them. For
such a program this plugin adds two compile options, per program, through JAX's
`env_option_overrides` (the per-compilation form of `XLA_FLAGS`):

- `xla_backend_optimization_level=0`: LLVM's -O0 instead of -O2 for the emitted loops;
- `xla_cpu_use_fusion_emitters=False`: XLA:CPU's older loop emitters instead of the MLIR
  fusion emitters, which take longer to compile each fusion.

Measured on the 2-core machine (a tiny Llama, two rows, 24 new tokens): the speculative
(draft-model) `generate` program took 4.5 s of XLA compile time instead of 15.2 s (3.4x; -O0
alone: 9.3 s, the older emitters alone: 12.5 s), the plain one 1.0 s instead of 3.2 s; the
tokens were the same. The options slow what the
program then runs (about 1.5x for the default model's decode), and the older emitters take
3.5x longer to compile the default model's programs, so a program whose arguments and
results together hold more than `FAST_COMPILE_MAX_BYTES` (the real models' weights, batches
of thousands of rows) keeps XLA's defaults. Neither option changes the arithmetic asked for (no fast-math is
involved), but a program may fuse and so round differently: two programs that should agree
(the serving engine's dispatch and `fg.generate` alone) can differ by float32 rounding, as
any two differently fused programs can (seen: 4.1e-5 in a logprob through a bfloat16 cache).
The persistent compilation cache keys on the options, so the two kinds never share an entry.

The suite's Python subprocesses (the notebooks' kernels, the multi-device workers, the
command-line runs) get the same wrapper through `subprocess_site/sitecustomize.py` on their
`PYTHONPATH` (a subprocess given a `PYTHONPATH` of its own goes without). Every program over
the real models compiles with XLA's defaults, as users' do. `FUNCTIONAL_GEN_TEST_FAST_COMPILE=0`
turns the plugin off.
"""

import os

import numpy as np

FAST_COMPILE_OPTIONS = {
    "xla_backend_optimization_level": 0,
    "xla_cpu_use_fusion_emitters": False,
}
# a program over more than this many bytes of arguments and results keeps XLA's defaults:
# SmolLM2-135M's float32 weights are 538 MB (and a generate program over 24,000 rows of a tiny
# model 0.8-1.4 GB: run-bound), the tiny test models' under 1 MB (26 MB over the real vocabulary),
# the default model cut to 2 layers (`two_layer_model`) ~142 MB plus its cache: with the options
# its 16-token generate compiled in 0.5 s of XLA time instead of 1.8 and ran in 0.15 s, not 0.10
FAST_COMPILE_MAX_BYTES = 256 * 2**20

_ELEMENT_BYTES = {
    "i1": 1,
    "i8": 1,
    "ui8": 1,
    "i16": 2,
    "ui16": 2,
    "bf16": 2,
    "f16": 2,
    "i64": 8,
    "ui64": 8,
    "f64": 8,
}


def _enabled() -> bool:
    value = os.environ.get("FUNCTIONAL_GEN_TEST_FAST_COMPILE", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def _tensor_bytes(type_) -> int:
    """Bytes of one `tensor<...>` MLIR type (4 per element unless the element type says else;
    tokens and other non-tensor types count 0)."""
    text = str(type_)
    if not text.startswith("tensor<"):
        return 0
    parts = text[len("tensor<") :].split(">")[0].split(",")[0].split("x")
    *dims, element = parts
    size = int(np.prod([int(d) for d in dims if d.isdigit()], dtype=np.int64)) if dims else 1
    return size * _ELEMENT_BYTES.get(element.strip(), 4)


def program_bytes(module) -> int:
    """Bytes of the arguments and results of `module`'s `main` function (an MLIR module as
    JAX hands it to XLA)."""
    for operation in module.body.operations:
        name = operation.attributes.get("sym_name", None)
        if name is not None and str(name).strip('"') == "main":
            function_type = operation.attributes["function_type"].value
            return sum(_tensor_bytes(t) for t in [*function_type.inputs, *function_type.results])
    return FAST_COMPILE_MAX_BYTES + 1  # not understood: keep the defaults


SUBPROCESS_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "subprocess_site")
"""A directory whose `sitecustomize.py` installs this plugin's wrapper in every Python
subprocess of the run (the notebooks' kernels, the multi-device workers, the command-line
runs) once JAX's compiler module is imported: `pytest_configure` puts it on `PYTHONPATH`."""


def install() -> bool:
    """Wrap `jax._src.compiler.compile_or_get_cached` so that small CPU programs get
    `FAST_COMPILE_OPTIONS` (once per process; nothing when `FUNCTIONAL_GEN_TEST_FAST_COMPILE=0`
    or in a JAX without that internal).

    **Returns:** whether the wrapper is installed now."""
    if not _enabled():
        return False
    try:
        from jax._src import compiler
    except ImportError:  # a JAX without this internal: compile with the defaults
        return False
    original = getattr(compiler, "compile_or_get_cached", None)
    if original is None:
        return False  # (tests/test_fast_compile.py then fails: the speed-up is gone)
    if getattr(original, "_functional_gen_fast_compile", False):
        return True

    def compile_or_get_cached(backend, computation, devices, compile_options, *args, **kwargs):
        if backend.platform == "cpu" and program_bytes(computation) <= FAST_COMPILE_MAX_BYTES:
            overrides = dict(compile_options.env_option_overrides)
            for name, value in FAST_COMPILE_OPTIONS.items():
                overrides.setdefault(name, value)
            compile_options.env_option_overrides = list(overrides.items())
        wrapped = compile_or_get_cached.__wrapped__
        return wrapped(backend, computation, devices, compile_options, *args, **kwargs)

    compile_or_get_cached.__wrapped__ = original
    compile_or_get_cached._functional_gen_fast_compile = True
    compiler.compile_or_get_cached = compile_or_get_cached
    return True


def pytest_configure(config):
    """Install the wrapper in every pytest process (the controller of `-n 0` and each worker),
    and put `SUBPROCESS_SITE` on the `PYTHONPATH` that the workers and every subprocess
    inherit."""
    if not _enabled():
        return
    install()
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if SUBPROCESS_SITE not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([SUBPROCESS_SITE, *paths])
