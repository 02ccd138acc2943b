"""Ctrl-C at any moment of a `functional-gen` run: the work runs in a thread, the main thread
waits for it, so the interrupt (Python delivers signals to the main thread only, and only between
bytecodes) arrives at once even while the worker sits in a compiled XLA program or a compile.

JAX cannot cancel a running XLA program: `functional-gen generate` therefore leaves the process
(`os._exit`, in `console_main`) after printing its one line, and `chat` lets the interrupted
answer's step finish in the background while it waits for the next message.
"""

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..program_start import INTERRUPTED as INTERRUPTED

_POLL_SECONDS = 0.1


def run_in_thread(function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` in a daemon thread, waited for in a way that Ctrl-C interrupts.

    **Returns:** what `function` returns.

    **Raises:** what `function` raises (re-raised here); `KeyboardInterrupt` when interrupted
    (the thread then keeps running until its current XLA call returns; nothing waits for it)."""
    box: dict = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = function(*args)
        except BaseException as e:  # handed to the waiting thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name="functional-gen-worker", daemon=True).start()
    while not done.wait(_POLL_SECONDS):
        pass
    if "error" in box:
        raise box["error"]
    return box["value"]


class Producer:
    """Iterates an iterable (an `fg.stream`) in a daemon thread and hands its items to the
    caller's thread through a queue, so that the caller can stop waiting on Ctrl-C; `stop()`
    makes the thread leave the iterable after its current item."""

    _END = object()

    def __init__(self, items: Iterable):
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._items = items
        self._thread = threading.Thread(target=self._run, name="functional-gen-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._items:
                if self._stop.is_set():
                    break
                self._queue.put(("item", item))
            self._queue.put(("end", None))
        except BaseException as e:  # handed to the consuming thread
            self._queue.put(("error", e))
        finally:
            self._done.set()

    def __iter__(self) -> Iterator:
        """The items, in order. **Raises:** what the iteration raised; `KeyboardInterrupt`."""
        while True:
            try:
                kind, value = self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value

    def stop(self) -> None:
        """Ask the thread to leave the iterable after its current item (does not wait)."""
        self._stop.set()

    def wait(self) -> None:
        """Wait, interruptibly, until the thread has left the iterable."""
        while not self._done.wait(_POLL_SECONDS):
            pass
