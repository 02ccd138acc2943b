"""The `functional-gen` command line (entry point `functional_gen.cli:console_main`).

Modules: `parser` (the argument parser and its option tables), `arguments` (options -> the
keyword arguments of `generate` / `stream`, the prompts, the checks made before the model
loads), `generate`, `chat` and `serve` (the subcommands), `output` (text and jsonl printing, the timing
summary), `interrupt` (Ctrl-C at any moment: the work runs in a worker thread).

Every error of the project (`ValueError` and its subclasses such as `UnsupportedConfigError`,
`ConstraintError`, `GrammarError`, `SequenceStateFormatError`, `CheckpointError`; `OSError` such
as `FileNotFoundError` for a model path) becomes one line on stderr and exit status 2; Ctrl-C
prints one line and exits with 130; neither prints a traceback.
"""

import contextlib
import os
import sys
from collections.abc import Sequence

from .. import program_start
from .arguments import (
    UNTIL_CONTEXT_ENDS as UNTIL_CONTEXT_ENDS,
)
from .arguments import (
    build_processors as build_processors,
)
from .arguments import (
    check_before_loading as check_before_loading,
)
from .arguments import (
    generate_call_arguments as generate_call_arguments,
)
from .arguments import (
    generation_options as generation_options,
)
from .arguments import (
    guidance_arguments as guidance_arguments,
)
from .arguments import (
    max_new_tokens_until_context_ends as max_new_tokens_until_context_ends,
)
from .arguments import (
    merged_generation_config as merged_generation_config,
)
from .arguments import (
    read_prompts as read_prompts,
)
from .arguments import (
    sampling_requested as sampling_requested,
)
from .chat import run_chat as run_chat
from .generate import run_generate as run_generate
from .serve import run_serve as run_serve
from .interrupt import INTERRUPTED as INTERRUPTED
from .parser import PENALTY_OPTIONS as PENALTY_OPTIONS
from .parser import SAMPLING_DEFAULTS as SAMPLING_DEFAULTS
from .parser import SAMPLING_OPTIONS as SAMPLING_OPTIONS
from .parser import build_parser as build_parser
from .parser import decoding_options as decoding_options
from .parser import model_options as model_options
from .parser import output_options as output_options

COMMANDS = {"generate": run_generate, "chat": run_chat, "serve": run_serve}
"""The function that runs each subcommand."""


def error_line(error: BaseException) -> str:
    """An error's message as one line: its lines joined with "; " (a grammar error quotes its
    source over several lines)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "; ".join(lines) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `functional-gen` (`argv`: the arguments after the program's name; default
    `sys.argv[1:]`).

    **Returns:** the exit status: 0, or `INTERRUPTED` (130) after Ctrl-C, with one line on stderr.

    **Raises:** `SystemExit(2)` for bad arguments and for every project error (`ValueError`,
    `OSError`), after one line on stderr (`functional-gen: error: ...`); `SystemExit(0)` for
    `--help` and `--version`.
    """
    # transformers advises installing PyTorch when it is absent: functional_gen never needs it
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    parser = build_parser()
    try:
        program_start.release()  # from here on, Ctrl-C is a KeyboardInterrupt caught below
        args = parser.parse_args(argv)
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        # on a terminal, the line after the echoed ^C (and after an open "compiling..." notice)
        start = "\n" if sys.stderr.isatty() else ""
        print(f"{start}functional-gen: interrupted", file=sys.stderr, flush=True)
        return INTERRUPTED
    except (ValueError, OSError) as e:
        parser.exit(2, f"functional-gen: error: {error_line(e)}\n")


def console_main() -> int:
    """The `functional-gen` program (`main` in a process of its own).

    Hides PyTorch from transformers first: functional_gen never uses it, but where it is
    installed, transformers' config and generation-config modules import it (2-6 s of a repeated
    call that otherwise finds its compiled programs in the cache). `main` alone, as the tests call
    it in a process that uses torch, leaves it alone.

    After Ctrl-C the process leaves at once (`os._exit`): a worker thread may still be inside a
    compiled XLA program, which JAX cannot cancel and the interpreter's shutdown would wait for."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # import torch fails; importlib.util.find_spec says absent
    status = main()
    if status == INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to say
                stream.flush()
        os._exit(status)
    return status
