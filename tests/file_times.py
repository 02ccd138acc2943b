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
tables off); a second table lists the costliest single tests (`FUNCTIONAL_GEN_TEST_TIMES_TESTS`,
default 25). `FUNCTIONAL_GEN_TEST_TIMES_KEEP=path` also writes every test's line (file, wall,
CPU, children's CPU, test id) to `path`, for a closer look after the run.
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
        file = item.nodeid.split("::", 1)[0]
        log.write(f"{file}\t{wall:.3f}\t{cpu:.3f}\t{children:.3f}\t{item.nodeid}\n")


def _lines(directory: str) -> list[tuple[str, float, float, float, str]]:
    """Every test's `(file, wall, cpu, children_cpu, test id)` from every process's log."""
    lines = []
    for path in Path(directory).glob("*.tsv"):
        for line in path.read_text().splitlines():
            file, wall, cpu, children, *rest = line.split("\t")
            lines.append(
                (file, float(wall), float(cpu), float(children), rest[0] if rest else file)
            )
    return lines


def file_times(directory: str) -> dict[str, list[float]]:
    """`{file: [tests, wall, cpu, children_cpu]}` summed over every process's log."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for file, *numbers, _ in _lines(directory):
        row = totals[file]
        row[0] += 1
        for i, value in enumerate(numbers, start=1):
            row[i] += value
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
    lines = _lines(_OWN[0])
    tests = int(os.environ.get("FUNCTIONAL_GEN_TEST_TIMES_TESTS", "25"))
    if tests:
        terminalreporter.section("costliest tests (wall, process CPU, children's CPU)")
        for _, wall, cpu, children, test in sorted(lines, key=lambda line: -line[1])[:tests]:
            write(f"{wall:8.1f} {cpu:8.1f} {children:8.1f}  {test}")
    keep = os.environ.get("FUNCTIONAL_GEN_TEST_TIMES_KEEP")
    if keep:
        Path(keep).write_text("".join("\t".join(map(str, line)) + "\n" for line in lines))


def pytest_unconfigure(config):
    """Delete the directory that `pytest_configure` made."""
    while _OWN:
        shutil.rmtree(_OWN.pop(), ignore_errors=True)
