"""Shared fixtures: a temporary cache directory, the real default model (ours and transformers' PyTorch one as the oracle),
tiny random Hugging Face checkpoints, and a PyTorch import guard."""

import importlib.util
import os
import shutil
import sys
import tempfile
from collections import Counter

import pytest

try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pytest-xdist is a test dependency (pyproject's addopts pass `-n 2`)
    LoadFileScheduling = None

from .oracle_cache import TORCH_GGUF_CACHE

# seconds per test file, printed at the end of every run (tests/file_times.py)
pytest_plugins = ("tests.file_times", "tests.fast_compile")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# JAX's strict dtype promotion (as in Equinox's tests): mixing dtypes without an explicit cast,
# e.g. int32 + float32 or float32 + bfloat16, raises instead of promoting silently. Set in the
# environment so that the tests' subprocesses inherit it too.
os.environ["JAX_NUMPY_DTYPE_PROMOTION"] = "strict"

# JAX's persistent compilation cache, shared by every process of one test run: the pytest-xdist
# workers, the notebooks' kernels and the CLI / README subprocesses compile many identical
# programs (the default model's prefill and decode loops at the same shapes), and each worker
# compiles them again after `fresh_compilation_caches` drops its in-memory ones. The directory
# is the run's own (a fresh checkout or CI run starts cold), made by the controller in
# `pytest_configure` before the workers start and passed on through the environment, which JAX
# reads when it is imported: `JAX_COMPILATION_CACHE_DIR` and the settings below. JAX records
# `/jax/core/compile/backend_compile_duration` and logs "Compiling ..." for a program loaded
# from the cache too, so the tests that count compilations (tests/errors/compilations.py and
# its users, test_generation.py, test_constrained_slots.py) see the same counts either way.
# `FUNCTIONAL_GEN_TEST_COMPILATION_CACHE=0` turns it off; a `JAX_COMPILATION_CACHE_DIR` already
# in the environment is used as it is (and kept).
TEST_COMPILATION_CACHE_SETTINGS = {
    # programs that compile faster than this are not written (JAX's default: 1 s)
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.5",
    # a size limit turns on JAX's file lock around reads and writes: without it, a process can
    # read another's half-written entry (JAX then warns and compiles)
    "JAX_COMPILATION_CACHE_MAX_SIZE": str(16 * 2**30),
}
_OWN_COMPILATION_CACHE: list[str] = []

# PyTorch's threads in each pytest-xdist worker (the README's command runs 2 on 2 cores): with 2,
# torch's OpenMP threads share the cores with the other worker and wait for each other at every
# operation. transformers' greedy CFG generation of 24 tokens on the default model (the oracle of
# test_classifier_free_guidance.py), shared machine under load, interleaved 2-1-2-1: 60.6 and
# 94.2 s on 2 threads, 16.1 and 36.4 s on 1; plain greedy 39.2 and 34.4 s against 11.1 and 7.4 s
# (tests/ has no quiet 2-worker measurement of its own yet). The oracle fixtures keep
# `min(2, torch.get_num_threads())`, so a run without workers (`-n 0`) still uses 2.
TORCH_THREADS_IN_A_WORKER = "1"


def pytest_configure(config):
    """In the controller (or a run without workers): create this run's compilation cache
    directory and its cache of transformers' GGUF oracles (`oracle_cache.TORCH_GGUF_CACHE`) and put
    them in the environment that the workers and subprocesses inherit. In a pytest-xdist worker:
    PyTorch on one thread (`TORCH_THREADS_IN_A_WORKER`)."""
    if hasattr(config, "workerinput"):
        # before anything imports torch (nothing has yet): torch sizes its thread pool from it
        os.environ.setdefault("OMP_NUM_THREADS", TORCH_THREADS_IN_A_WORKER)
        return
    if not os.environ.get(TORCH_GGUF_CACHE):
        # the transformers oracles built from GGUF files, shared by the workers
        # (`oracle_cache.torch_model_from_gguf`)
        directory = tempfile.mkdtemp(prefix="functional_gen-test-torch-gguf-")
        _OWN_COMPILATION_CACHE.append(directory)
        os.environ[TORCH_GGUF_CACHE] = directory
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    if os.environ.get("FUNCTIONAL_GEN_TEST_COMPILATION_CACHE", "").strip().lower() in (
        "0",
        "false",
        "no",
        "off",
    ):
        return
    directory = tempfile.mkdtemp(prefix="functional_gen-test-jax-cache-")
    _OWN_COMPILATION_CACHE.append(directory)
    settings = {"JAX_COMPILATION_CACHE_DIR": directory, **TEST_COMPILATION_CACHE_SETTINGS}
    for name, value in settings.items():
        os.environ.setdefault(name, value)
    if "jax" in sys.modules:  # imported before this hook (e.g. by a plugin): configure it too
        import jax

        jax.config.update("jax_compilation_cache_dir", directory)
        jax.config.update(
            "jax_persistent_cache_min_compile_time_secs",
            float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
        )
        jax.config.update(
            "jax_compilation_cache_max_size", int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"])
        )


def pytest_unconfigure(config):
    """Delete the cache directories that `pytest_configure` made."""
    while _OWN_COMPILATION_CACHE:
        shutil.rmtree(_OWN_COMPILATION_CACHE.pop(), ignore_errors=True)


ROMAN_TEXT = (
    "The history of the Roman Empire spans many centuries, from the founding of the city of Rome "
    "to the fall of Constantinople. Historians often divide it into periods, and each "
) * 40
# transformers' greedy continuation of the first 32 tokens of ROMAN_TEXT on SmolLM2-135M-Instruct
# (float32), also produced by llama.cpp on the f32/f16/bf16 GGUFs (research/environment.md §2).
ROMAN_GOLDEN_PREFIX = (
    " the Roman Empire is divided into four eras: the Early Roman Empire, the Middle Roman Empire,"
    " the Late Roman Empire,"
)


@pytest.fixture(scope="session", autouse=True)
def temporary_cache(tmp_path_factory):
    """`$FUNCTIONAL_GEN_CACHE` is a directory of this session, never the user's cache: automata,
    compiled programs and the default model's converted checkpoint go there. The default model
    is converted once per session (~17 s; each pytest-xdist worker is a session with its own
    directory) by the first test that loads it and shared after that; subprocesses inherit the
    variable."""
    cache = tmp_path_factory.mktemp("functional_gen_cache")
    patch = pytest.MonkeyPatch()
    patch.setenv("FUNCTIONAL_GEN_CACHE", str(cache))
    # the CLI tests run in this process: keep the CLI's `enable_compilation_cache` from
    # pointing JAX at this directory (the run's shared cache of `pytest_configure`, if any,
    # stays; test_progress.py's subprocess test of our cache directory turns it back on)
    patch.setenv("FUNCTIONAL_GEN_COMPILATION_CACHE", "0")
    yield cache
    patch.undo()


@pytest.fixture(scope="module", autouse=True)
def fresh_compilation_caches():
    """Drop JAX's in-memory compiled programs after each test module. One long pytest process
    otherwise keeps every program it ever compiled (hundreds), and XLA:CPU's JIT memory maps
    add up to the kernel's limit (`vm.max_map_count`, 65530 here): the full suite then crashed
    inside an XLA compile after ~1,000 tests, at the same test each time, never in isolation."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def default_model():
    """`(model, tokenizer)` of the embedded default model, float32."""
    import functional_gen as fg

    return fg.load_model()


@pytest.fixture(scope="session")
def torch_default_model():
    """transformers' PyTorch model built from the same GGUF file (the oracle; built once per run:
    tests/oracle_cache.py). Its tests feed it our token ids, so no transformers tokenizer is
    loaded (3.5 s of CPU per worker to read the GGUF's vocabulary)."""
    torch = pytest.importorskip("torch")

    from functional_gen.loading import default_gguf_path

    from .oracle_cache import torch_model_from_gguf

    torch.set_num_threads(min(2, torch.get_num_threads()))
    return torch_model_from_gguf(default_gguf_path(), dtype=torch.float32)


@pytest.fixture(scope="session")
def two_layer_default_model(default_model, tmp_path_factory):
    """A checkpoint directory of the default model cut to its first 2 of 30 decoder layers (real
    weights, vocabulary, tokenizer and matrix shapes), for the multi-device subprocess tests:
    what they check is per layer, and 2 layers compile many times faster than 30."""
    from functional_gen.loading.default_model import converted_default_dir

    from .helpers import first_layers_checkpoint

    return first_layers_checkpoint(
        converted_default_dir(), tmp_path_factory.mktemp("checkpoints") / "two-layers", 2
    )


@pytest.fixture(scope="session")
def two_layer_model(two_layer_default_model):
    """`(model, tokenizer)` of `two_layer_default_model`: for tests whose checks do not depend on
    the weights (the serving engine equal to `fg.generate`, constraints obeyed, what a command
    prints), with the real tokenizer, chat template, vocabulary and shapes. Its programs compile
    several times faster than the 30-layer model's (the README's test: 167 s of CPU instead of
    387); the tests that check the model's own logits or answers use `default_model`."""
    import functional_gen as fg

    return fg.load_model(two_layer_default_model)


@pytest.fixture(scope="session")
def roman_prompt_ids(default_model):
    """The first 32 token ids of ROMAN_TEXT."""
    _, tokenizer = default_model
    return tokenizer(ROMAN_TEXT)["input_ids"][:32]


def has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


# --- the order in which pytest-xdist hands out test files ---------------------------------------

# Seconds that each test file took (setup + calls + teardown, summed over its tests) in a full run
# of the README's test command on the 2-core machine, quiet, session 29 (`--durations=0`: 2,209
# tests in 24 min 9 s; files of 17 s and more). Only their order matters: a file missing here
# goes after them, by test count.
HEAVY_FILES = {
    "tests/test_notebooks.py": 401,
    # estimates for the files added on 2026-11-28 (single-file runs on a loaded box, scaled by the
    # load; not yet from a quiet full run): placed so that they are not handed out last
    "tests/structured/test_maskbench_dev.py": 150,
    "tests/generation/test_kv_cache_dtype_real.py": 120,
    "tests/models/test_execution_plan.py": 120,
    "tests/structured/test_parallel_stacks.py": 100,
    "tests/structured/test_one_of_exact.py": 80,
    "tests/generation/test_speculative.py": 250,
    "tests/models/test_ring_cache.py": 132,
    "tests/models/test_gemma3_270m_capabilities.py": 125,
    "tests/generation/test_beam_search.py": 123,
    "tests/generation/test_speculative_features.py": 123,
    "tests/models/test_families.py": 89,
    "tests/test_readme.py": 86,
    "tests/test_cli.py": 84,
    "tests/models/test_gemma3_270m.py": 81,
    "tests/generation/test_sequence_state.py": 77,
    "tests/test_sharding.py": 75,
    "tests/serving/test_engine_mesh.py": 120,  # 165 s wall at load ~8, 80 s CPU in its subprocess
    "tests/structured/test_pda.py": 74,
    "tests/models/test_quantization.py": 73,
    "tests/models/test_llama.py": 62,
    "tests/serving/test_constrained_slots.py": 60,
    "tests/processors/test_classifier_free_guidance.py": 60,
    "tests/serving/test_server.py": 57,
    "tests/processors/test_protocol.py": 47,
    "tests/test_cli_new_user.py": 45,
    "tests/serving/test_paged.py": 45,  # estimated: 53 s of CPU in one loaded process
    "tests/generation/test_guidance.py": 42,
    "tests/structured/test_generation.py": 40,
    "tests/generation/test_speculative_paths.py": 40,
    "tests/loading/test_gguf_families.py": 40,
    "tests/generation/test_prefill.py": 38,
    "tests/test_generation.py": 37,
    "tests/structured/test_json_schema_grammar.py": 37,
    "tests/serving/test_lockstep.py": 34,
    "tests/test_stop_strings.py": 33,
    "tests/loading/test_gguf.py": 28,
    "tests/structured/test_processor.py": 26,
    "tests/test_distributed.py": 25,
    "tests/test_no_torch.py": 24,
    "tests/models/test_scan_layers.py": 22,
    "tests/test_streaming.py": 21,
    "tests/errors/test_pushdown_soundness.py": 21,
    "tests/test_cli_quantization.py": 21,
    # missing from the table until session 43's full run (`tests/file_times.py`'s table, process
    # CPU seconds): at their test count they were handed out near the end
    "tests/structured/test_byte_dfa.py": 109,
    "tests/structured/test_register_schemas.py": 84,
    "tests/structured/test_automaton.py": 79,
    "tests/serving/test_paged_window.py": 71,
    "tests/serving/test_precompile.py": 58,
    "tests/serving/test_paged_speculative.py": 48,
}


# Files that one worker runs one after the other (one pytest-xdist work unit): the Gemma 3 270M
# modules share tests/models/conftest.py's package-scoped `gemma` and `torch_gemma` (two 270M
# models, about 30 s each to load on the CI machine), which two workers would each load again.
SAME_WORKER = {
    "tests/models/test_gemma3_270m.py": "gemma-3-270m",
    "tests/models/test_gemma3_270m_capabilities.py": "gemma-3-270m",
}


def heaviest_files_first(nodeids: list[str]) -> list[str]:
    """Test ids grouped by file, the files in `HEAVY_FILES` first (slowest first), then the
    others by number of tests (most first, as pytest-xdist's own `--loadscope-reorder`), each
    file's tests in collection order. Longest-first is the classic greedy for sharing jobs
    between machines (Graham's LPT): a slow file handed out last keeps one worker busy alone
    while the other has finished, as the notebooks (8 minutes, 10 tests, so queued in the middle
    by test count) and the README (2 minutes, 3 tests, near the end) did."""
    files = [nodeid.split("::", 1)[0] for nodeid in nodeids]
    count = Counter(files)
    first = {}
    for i, f in enumerate(files):
        first.setdefault(f, i)
    order = {f: (-HEAVY_FILES.get(f, 0), -count[f], first[f]) for f in count}
    return [n for _, n in sorted(zip(files, nodeids), key=lambda pair: order[pair[0]])]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """In each pytest-xdist worker, the tests in `heaviest_files_first` order: the controller
    hands out whole files (`--dist loadfile`) in the order of the workers' collection, since
    `--no-loadscope-reorder` (pyproject's addopts) keeps it. A run without workers (`-n 0`)
    keeps pytest's order."""
    if not hasattr(config, "workerinput"):
        return
    by_id = {item.nodeid: item for item in items}
    items[:] = [by_id[n] for n in heaviest_files_first([item.nodeid for item in items])]


# Tests that are work units of their own: each notebook runs in a kernel of its own and shares no
# fixture with the others, so the two workers share the notebooks (about 30 minutes of one worker
# in one unit on the CI machine of 2026-11-28) instead of one worker running them all.
OWN_UNIT_PREFIXES = ("tests/test_notebooks.py::test_notebook_runs[",)


if LoadFileScheduling is not None:

    class LoadFileGroups(LoadFileScheduling):
        """`--dist loadfile` (each file's tests on one worker, so module fixtures are built once),
        with the files of one `SAME_WORKER` group as one work unit, and each test whose id starts
        with one of `OWN_UNIT_PREFIXES` a unit of its own."""

        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            if nodeid.startswith(OWN_UNIT_PREFIXES):
                return nodeid
            return SAME_WORKER.get(file, file)

    @pytest.hookimpl(tryfirst=True, optionalhook=True)
    def pytest_xdist_make_scheduler(config, log):
        """pytest-xdist's scheduler for `--dist loadfile`: `LoadFileGroups`."""
        if config.getvalue("dist") != "loadfile":
            return None
        return LoadFileGroups(config, log)
