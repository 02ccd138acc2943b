"""Ctrl-C while the `functional-gen` program starts (issue 43, item 8): one line, exit 130.

Importing `functional_gen` imports JAX, transformers and the package itself (seconds); a Ctrl-C
then would end in a `KeyboardInterrupt` traceback, before `functional_gen.cli.main` can catch
anything. This module is imported first by `functional_gen/__init__.py` and imports only the
standard library. When (and only when) the process is the program (`functional-gen ...` or
`python -m functional_gen.cli ...`, read from `sys.orig_argv`), it installs a SIGINT handler at
import time that prints `functional-gen: interrupted` and leaves with status 130 at once;
`functional_gen.cli.main` hands SIGINT back to Python's default (`release`) once it can catch
`KeyboardInterrupt` itself. A library user's process is left alone.
"""

import contextlib
import os
import signal
import sys

INTERRUPTED = 130
"""The exit status after Ctrl-C (128 + SIGINT), as shells and llama.cpp report it."""

PROGRAM = "functional-gen"
MODULES = ("functional_gen.cli", "functional_gen.cli.__main__")
"""The console script's name, and the modules `python -m` runs as the program."""


def is_program(orig_argv: list[str] | None = None, argv0: str | None = None) -> bool:
    """Whether this process runs the `functional-gen` program: `python -m functional_gen.cli`
    (the module after the interpreter's first `-m` in `orig_argv`, default `sys.orig_argv`) or
    the console script (`argv0`, default `sys.argv[0]`, named `functional-gen`)."""
    orig_argv = list(getattr(sys, "orig_argv", ())) if orig_argv is None else orig_argv
    argv0 = (sys.argv[0] if sys.argv else "") if argv0 is None else argv0
    if "-m" in orig_argv[1:]:
        i = orig_argv.index("-m", 1)
        return i + 1 < len(orig_argv) and orig_argv[i + 1] in MODULES
    return os.path.basename(argv0) == PROGRAM


def _leave(signum, frame) -> None:
    """Ctrl-C before the program can catch it: one line on stderr, exit 130, no traceback."""
    start = "\n" if sys.stderr is not None and sys.stderr.isatty() else ""
    with contextlib.suppress(OSError):  # a closed stderr: nothing to say
        os.write(2, f"{start}{PROGRAM}: interrupted\n".encode())
    os._exit(INTERRUPTED)


_installed = False


def install() -> bool:
    """Install the start-up SIGINT handler when this process is the program (and SIGINT has
    Python's default handler, so that nothing set up by someone else is replaced).

    **Returns:** whether it was installed."""
    global _installed
    if is_program() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _leave)
        _installed = True
    return _installed


def release() -> None:
    """Give SIGINT back to Python's default (`KeyboardInterrupt`) if `install` took it."""
    global _installed
    if _installed and signal.getsignal(signal.SIGINT) is _leave:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _installed = False


install()
