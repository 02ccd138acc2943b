"""Progress bars and the compiling notice (quiet off a terminal and with set_quiet), and JAX's
persistent compilation cache in functional_gen's cache directory."""

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from functional_gen import progress
from functional_gen.cache import cache_dir, compilation_cache_dir

REPO = Path(__file__).resolve().parents[1]


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def terminal(monkeypatch):
    """A fake terminal as stderr. pytest's capture sets sys.stderr back after fixtures run, so the
    fixture swaps it on first use, from inside the test."""
    stream = FakeTerminal()
    progress.set_quiet(False)

    class Terminal:
        def __getattr__(self, name):
            if sys.stderr is not stream:
                monkeypatch.setattr(sys, "stderr", stream)
            return getattr(stream, name)

    yield Terminal()
    progress.set_quiet(False)


def test_bars_and_notices_only_on_a_terminal(terminal, monkeypatch):
    terminal.getvalue()  # now stderr is the fake terminal
    assert list(progress.progress_bar(range(3), desc="Dequantizing", unit="tensor")) == [0, 1, 2]
    assert "Dequantizing:   0%|" in terminal.getvalue() and "0/3 [" in terminal.getvalue()
    progress.notice("converting")
    assert terminal.getvalue().endswith("converting\n")

    progress.set_quiet(True)
    before = terminal.getvalue()
    assert list(progress.progress_bar(range(3), desc="Quiet", unit="tensor")) == [0, 1, 2]
    progress.notice("not shown")
    assert terminal.getvalue() == before

    progress.set_quiet(False)
    not_a_terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", not_a_terminal)
    bar = progress.progress_bar([1, 2], desc="Piped")
    assert bar == [1, 2] and not_a_terminal.getvalue() == ""


def test_compiling_notice_on_the_first_call_of_a_shape_only(terminal):
    f = jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * 3.0))
    terminal.getvalue()  # now stderr is the fake terminal
    with progress.compile_notices("a test program") as report:
        f(jnp.ones(37)).block_until_ready()
    line = terminal.getvalue()
    assert line.startswith("functional-gen: compiling a test program (first call of this shape)...")
    assert line.endswith(" s\n") and line.count("\n") == 1
    assert report.programs >= 1 and report.seconds > 0
    seconds = float(line.rsplit(" ", 2)[-2])
    assert seconds == pytest.approx(report.seconds, abs=0.051)

    terminal.truncate(0)
    terminal.seek(0)
    with progress.compile_notices("a test program") as again:
        f(jnp.zeros(37)).block_until_ready()  # same shape: no compilation, no notice
    assert terminal.getvalue() == "" and again.programs == 0 and again.seconds == 0.0

    progress.set_quiet(True)
    with progress.compile_notices("quiet") as quiet:
        f(jnp.ones(38)).block_until_ready()  # a new shape compiles, silently
    assert terminal.getvalue() == "" and quiet.programs >= 1


CACHE_SCRIPT = textwrap.dedent(
    """
    import json, jax, jax.numpy as jnp
    from functional_gen.cache import enable_compilation_cache
    from functional_gen.progress import compile_notices
    path = enable_compilation_cache(min_compile_time_secs=0.0)
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0) * 2.0)
    with compile_notices("cached") as report:
        f(jnp.ones((64, 64))).block_until_ready()
    print(json.dumps({"dir": str(path), "hits": report.cache_hits, "misses": report.cache_misses}))
    """
)


def test_compiled_programs_persist_across_processes_in_our_cache_dir():
    """A second process loads the program from `cache_dir() / "jax"` instead of compiling it.
    (The session's cache directory is temporary, see conftest.py.)"""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("FUNCTIONAL_GEN_COMPILATION_CACHE", None)
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", CACHE_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert (
        runs[0]["dir"] == str(compilation_cache_dir())
        and compilation_cache_dir().parent == cache_dir()
    )
    assert runs[0]["misses"] >= 1 and runs[0]["hits"] == 0
    assert runs[1]["hits"] >= 1 and runs[1]["misses"] == 0
    assert any(compilation_cache_dir().iterdir())
