"""Per-file time of a test run, printed at its end: the files that cost the most, so that a CI log
(whose tail is all a later reader may see) says where the suite's minutes go.

Each process (every pytest-xdist worker, or the one process of `-n 0`) appends one line per test
to a file of the run's directory: the test's file, its wall-clock seconds (setup, call and
teardown, so a module fixture counts in its file's first test), the process's CPU seconds
(`time.process_time`: every thread, XLA's compiler threads included) and its waited-for
children's CPU seconds (`resource.getrusage(RUSAGE_CHILDREN)`: notebook kernels, CLI
subprocesses). CPU seconds do not grow when another process shares the cores, wall seconds
do: on a loaded machine compare files by CPU. The controller makes the directory in
`pytest_configure` (passed to the workers through `FUNCTIONAL_GEN_TEST_TIMES`), prints the table
in `pytest_terminal_summary` and deletes the directory.

`FUNCTIONAL_GEN_TEST_TIMES_TOP` sets how many files the table lists (default 30; 0 turns the
table off).
"""

import os
import resource
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

ENV = "FUNCTIONAL_GEN_TEST_TIMES"
_OWN: list[str] = []


def pytest_configure(config):
    """In the controller (or a run without workers): this run's directory of per-process logs."""
    if hasattr(config, "workerinput") or os.environ.get(ENV):
        return
    directory = tempfile.mkdtemp(prefix="functional_gen-test-times-")
    _OWN.append(directory)
    os.environ[ENV] = directory


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """One line per test: file, wall, CPU and children's CPU seconds."""
    directory = os.environ.get(ENV)
    start = (time.perf_counter(), time.process_time(), _children_cpu())
    yield
    if not directory:
        return
    end = (time.perf_counter(), time.process_time(), _children_cpu())
    wall, cpu, children = (b - a for a, b in zip(start, end))
    path = Path(directory) / f"{os.getpid()}.tsv"
    with path.open("a") as log:
        log.write(f"{item.nodeid.split('::', 1)[0]}\t{wall:.3f}\t{cpu:.3f}\t{children:.3f}\n")


def file_times(directory: str) -> dict[str, list[float]]:
    """`{file: [tests, wall, cpu, children_cpu]}` summed over every process's log."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for path in Path(directory).glob("*.tsv"):
        for line in path.read_text().splitlines():
            file, *numbers = line.split("\t")
            row = totals[file]
            row[0] += 1
            for i, value in enumerate(numbers, start=1):
                row[i] += float(value)
    return dict(totals)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The controller's table: the costliest files by wall-clock seconds, with totals."""
    if hasattr(config, "workerinput") or not _OWN:
        return
    top = int(os.environ.get("FUNCTIONAL_GEN_TEST_TIMES_TOP", "30"))
    totals = file_times(_OWN[0])
    if not top or not totals:
        return
    rows = sorted(totals.items(), key=lambda kv: -kv[1][1])
    write = terminalreporter.write_line
    terminalreporter.section("seconds per test file (wall, process CPU, children's CPU)")
    for file, (tests, wall, cpu, children) in rows[:top]:
        write(f"{wall:8.1f} {cpu:8.1f} {children:8.1f} {int(tests):5d}  {file}")
    wall, cpu, children = (sum(r[i] for r in totals.values()) for i in (1, 2, 3))
    write(f"{wall:8.1f} {cpu:8.1f} {children:8.1f} {len(totals):5d}  files in all")


def pytest_unconfigure(config):
    """Delete the directory that `pytest_configure` made."""
    while _OWN:
        shutil.rmtree(_OWN.pop(), ignore_errors=True)
