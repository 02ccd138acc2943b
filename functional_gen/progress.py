"""Progress on stderr for long first-time work: tqdm bars (converting the default model,
dequantizing a GGUF, loading checkpoint shards) and a one-line notice while JAX compiles.

Everything here is quiet when stderr is not a terminal (tqdm's own rule) or after
`set_quiet(True)` (the command line's `--quiet`).
"""

import contextlib
import sys
from collections.abc import Iterable, Iterator

_quiet = False

_TRACE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


def set_quiet(quiet: bool) -> None:
    """Silence (or not) every progress bar and notice of this module, in this process."""
    global _quiet
    _quiet = bool(quiet)


def is_quiet() -> bool:
    """Whether bars and notices are off: `set_quiet(True)`, or stderr is not a terminal."""
    return _quiet or not _isatty(sys.stderr)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def progress_bar(iterable: Iterable, *, desc: str, total: int | None = None, unit: str = "it"):
    """`iterable` wrapped in a tqdm bar on stderr, or unchanged when quiet (see `is_quiet`).

    The bar disappears when done (`leave=False`): it is for waiting, not for the record.
    """
    if is_quiet():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, file=sys.stderr)


def notice(message: str) -> None:
    """Print one line on stderr unless quiet."""
    if not is_quiet():
        print(message, file=sys.stderr, flush=True)


class CompileReport:
    """What JAX compiled inside `compile_notices`: `seconds` (tracing, lowering and XLA
    compilation, summed from `jax.monitoring` events), `programs` (compilations), `cache_hits`
    and `cache_misses` of the persistent compilation cache."""

    def __init__(self, label: str):
        self.label = label
        self.seconds = 0.0
        self.programs = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self._line_open = False

    def _on_duration(self, event: str, duration: float, **_) -> None:
        if event not in _TRACE_EVENTS:
            return
        self.seconds += max(float(duration), 0.0)
        if event == _TRACE_EVENTS[2]:
            self.programs += 1
        if not self._line_open and not is_quiet():
            sys.stderr.write(
                f"functional-gen: compiling {self.label} (first call of this shape)..."
            )
            sys.stderr.flush()
            self._line_open = True

    def _on_event(self, event: str, **_) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.cache_hits += 1
        elif event == "/jax/compilation_cache/cache_misses":
            self.cache_misses += 1

    def end_line(self) -> None:
        """Finish the notice with the compile time (call before writing anything else, e.g. the
        first streamed text)."""
        if self._line_open:
            cached = (
                " (from the compilation cache)" if self.cache_hits and not self.cache_misses else ""
            )
            sys.stderr.write(f" {self.seconds:.1f} s{cached}\n")
            sys.stderr.flush()
            self._line_open = False

    def summary(self) -> str:
        """E.g. `"3 programs; compilation cache: 2 hits, 1 miss"`."""
        return (
            f"{self.programs} programs; compilation cache: {self.cache_hits} hits, "
            f"{self.cache_misses} misses"
        )


@contextlib.contextmanager
def compile_notices(label: str) -> Iterator[CompileReport]:
    """Within this block, the first JAX compilation prints `functional-gen: compiling LABEL
    (first call of this shape)...` on stderr, finished with the total compile time when the
    block ends (or at `report.end_line()`); nothing is printed when nothing compiles (a shape
    seen before) or when quiet. Yields a `CompileReport`.

    ```python
    from functional_gen.progress import compile_notices
    with compile_notices("generate"):
        result = fg.generate(model, tokenizer, prompts)
    ```
    """
    from jax import monitoring

    report = CompileReport(label)
    monitoring.register_event_duration_secs_listener(report._on_duration)
    monitoring.register_event_listener(report._on_event)
    try:
        yield report
    finally:
        monitoring.unregister_event_duration_listener(report._on_duration)
        monitoring.unregister_event_listener(report._on_event)
        report.end_line()
