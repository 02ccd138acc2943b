"""The orchestrator: the host loop around an `Engine`'s three functions.

ONE background thread owns the device and the decode state. Each turn of its loop it

1. drops the requests whose caller went away (`Handle.cancel`; a slot they held is freed before
   this turn's dispatch),
2. admits queued requests into free slots: prefill chunks of up to `prefill_budget` prompt
   tokens per turn (`Engine.prefill_chunk` by default; several short prompts fill several
   free slots in one turn, so the next dispatch decodes them all; a prompt longer than
   `Engine.prefill_chunk` takes several turns, with decode dispatches between them, so the
   other streams keep going; with a paged cache such a prompt is an `Engine.block_prefill`,
   whose chunks run inside the decode dispatches while slots decode, on their own while none
   does), then `insert`,
3. with a paged cache that preempts (`Engine.preemption`), gives every busy slot the blocks of
   the coming dispatch (`Engine.make_room`): the requests it preempts (the most recently
   admitted) go back to the FRONT of the queue with the tokens they had generated, keeping
   their text, stop-string and streaming state (nothing delivered twice, nothing lost), to be
   readmitted and recomputed before any later request,
4. runs `generate` (`Engine.num_steps` steps in one dispatch, carrying the next chunk of a
   `BlockPrefill` in progress: `Engine.generate(prefill=...)`) when any slot is busy (while
   requests wait, the dispatch ends after the step in which a slot finishes, so that the next
   turn admits into it: `Engine.generate(until_finish=True)`), and
5. turns each slot's new tokens into text pieces (`IncrementalDecoder`: never half a UTF-8
   character), cuts them at stop strings (on the host: the text is held back by the length of
   the longest stop string minus one character, as `fg.stream` does), and hands them to the
   request's `asyncio` queue with `loop.call_soon_threadsafe`.

The asyncio side only queues: `submit` returns a `Handle` at once, whose `events()` yields
`Piece`s and then one `Finished` (or an `Error`).
"""

import asyncio
import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import jax

from ..generation.state import FINISH_REASONS
from ..generation.stop_strings import truncate_at_stop
from ..tokenization import IncrementalDecoder
from .paged import BlockPrefill
from .phases import PhaseTimer
from .pool import PoolEntry

if TYPE_CHECKING:  # (engine.py imports this module for `Engine.stream`)
    from .engine import Engine, Request

OPENAI_FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "length": "length"}
"""`FINISH_REASONS` names as OpenAI's `finish_reason` ("constraint" is kept as it is)."""


@dataclasses.dataclass
class Piece:
    """New text of a request: `text`, and the `token_ids` and raw `logprobs` behind it (the
    tokens may run ahead of the text by an incomplete character or a held-back stop string), and
    per token its `top_logprobs` alternatives as `(token id, logprob)` pairs (`Engine(top_logprobs=k)`)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]


@dataclasses.dataclass
class Finished:
    """The end of a request: `finish_reason` (OpenAI's: "stop", "length"), `prompt_tokens`,
    `completion_tokens` (tokens generated, an EOS included), `text` (all of it)."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    text: str


@dataclasses.dataclass
class Error:
    """A request that ended without finishing (`message`), e.g. the server shutting down."""

    message: str


class Handle:
    """One submitted request: iterate `events()` (async) for `Piece`, then `Finished` or `Error`;
    `cancel()` frees its slot at the next dispatch."""

    def __init__(
        self,
        request: "Request",
        stop_strings: tuple[str, ...],
        loop,
        constraint=None,
        entry: "PoolEntry | None" = None,
    ):
        self.request = request
        self.resumed: Request | None = None
        """After a preemption: what to admit instead of `request` (its prompt and the tokens
        generated so far, `Request.resume`)."""
        self.host_slot: _Slot | None = None  # a preempted request's text and stream state
        self.constraint = constraint
        self.entry = entry
        self.stop_strings = stop_strings
        self.cancelled = False
        self.submitted = time.perf_counter()
        self.first_token: float | None = None
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    def cancel(self) -> None:
        """Give the request up; its slot is freed before the next dispatch."""
        self.cancelled = True

    @property
    def pending_request(self) -> "Request":
        """The request to admit: `resumed` after a preemption, else `request`."""
        return self.request if self.resumed is None else self.resumed

    def _put(self, event) -> None:
        # a closed event loop raises RuntimeError: nobody is listening any more
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    async def events(self) -> AsyncIterator[Piece | Finished | Error]:
        """The request's events, ending with its `Finished` or `Error`."""
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, (Finished, Error)):
                return


class _Slot:
    """Host bookkeeping of a busy slot."""

    def __init__(self, handle: Handle, tokenizer, eos: set[int]):
        self.handle = handle
        self.decoder = IncrementalDecoder(tokenizer)
        self.stop_ids = set(handle.request.stop_token_ids) - eos
        self.eos = eos | self.stop_ids
        self.text = ""
        self.emitted = 0
        self.generated = 0
        self.token_ids: list[int] = []  # every token generated (across preemptions)
        self.pending_ids: list[int] = []
        self.pending_lps: list[float] = []
        self.pending_top: list[list[tuple[int, float]]] = []
        strings = handle.stop_strings
        self.hold = max((len(s) for s in strings), default=1) - 1

    def written(self) -> list[int]:
        """The request's tokens whose keys and values its blocks hold: the prompt and every
        generated token but the last (which no step has fed yet), for `Engine.release`."""
        return [*self.handle.request.token_ids, *self.token_ids[:-1]]

    def push(self, token: int, logprob: float, top: list[tuple[int, float]]) -> bool:
        """Take one token; `True` when the text now holds a stop string."""
        self.generated += 1
        self.token_ids.append(token)
        self.pending_ids.append(token)
        self.pending_lps.append(logprob)
        self.pending_top.append(top)
        if token in self.stop_ids:  # the request's own EOS: ends it like a stop string
            return True
        if token not in self.eos:
            self.text += self.decoder.push(token)
        if self.handle.stop_strings:
            return truncate_at_stop(self.text, self.handle.stop_strings)[1]
        return False

    def piece(self, final: bool) -> Piece | None:
        """The text that may be handed out now (all of it when `final`)."""
        if final:
            self.text += self.decoder.flush()
            if self.handle.stop_strings:
                self.text = truncate_at_stop(self.text, self.handle.stop_strings)[0]
            end = len(self.text)
        else:
            end = len(self.text) - self.hold
        if end <= self.emitted and not (final and self.pending_ids):
            return None
        text = self.text[self.emitted : max(end, self.emitted)]
        piece = Piece(text, self.pending_ids, self.pending_lps, self.pending_top)
        self.emitted = max(end, self.emitted)
        self.pending_ids, self.pending_lps, self.pending_top = [], [], []
        return piece


class Orchestrator:
    """Runs an `Engine` for many callers (see the module docstring).

    **Arguments:** `engine`; `max_queue`: requests waiting beyond the slots (more are refused
    with `QueueFull`); `prefill_budget`: prompt tokens (padded widths) prefilled per turn
    before the next decode dispatch, at least one chunk (default `engine.prefill_chunk`: the
    other streams pause for at most about one chunk's prefill per dispatch).

    **Attributes (read by the metrics):** `queue_length`, `busy_slots`, `generated_tokens`
    (total), `verified_tokens`, `accepted_tokens` (speculative guesses verified and accepted,
    totals; 0 without `Engine(speculative=...)`), `on_first_token` (a callable given the seconds from submission to the first
    token, or `None`), `timer` (the engine's `PhaseTimer`: wall seconds per phase of the loop,
    "cancel", "admit", "preempt", "layout", "compact", "dispatch", "transfer", "deliver",
    "idle"),
    `prefill_budget`.

    **Raises:** `ValueError` for a `prefill_budget` that is not a positive integer.
    """

    def __init__(
        self, engine: "Engine", *, max_queue: int = 256, prefill_budget: int | None = None
    ):
        if prefill_budget is not None and (
            isinstance(prefill_budget, bool)
            or not isinstance(prefill_budget, int)
            or prefill_budget < 1
        ):
            raise ValueError(f"`prefill_budget` must be a positive integer, got {prefill_budget!r}")
        self.engine = engine
        self.prefill_budget = engine.prefill_chunk if prefill_budget is None else prefill_budget
        self.max_queue = max_queue
        self.generated_tokens = 0
        self.verified_tokens = self.accepted_tokens = 0
        self.on_first_token = None
        self._queue: collections.deque[Handle] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._slots: list[_Slot | None] = [None] * engine.max_slots
        self._prefilling: tuple[Handle, object] | None = None
        self._paged_slot = 0  # paged cache: the slot the prefilling request was admitted into
        self._running = False
        self._thread: threading.Thread | None = None
        self._eos = set(engine.eos_token_id)
        self.timer: PhaseTimer = engine.timer
        self.error: BaseException | None = None

    @property
    def queue_length(self) -> int:
        """Requests submitted and not yet in a slot."""
        return len(self._queue) + (self._prefilling is not None)

    @property
    def busy_slots(self) -> int:
        """Slots holding a request."""
        return sum(s is not None for s in self._slots)

    def start(self) -> None:
        """Start the device thread (idempotent)."""
        if self._thread is not None:
            return
        self._running = True
        self._thread = threading.Thread(target=self._run, name="functional-gen-engine", daemon=True)
        self._thread.start()

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the device thread; every request not finished gets an `Error` event."""
        self._running = False
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def submit(
        self, request: "Request", stop_strings=(), loop=None, constraint=None, entry=None
    ) -> Handle:
        """Queue `request` (from the asyncio side; returns at once). A constrained request gives
        `constraint` (a structured-generation processor) and `entry` (its tables for the pool,
        `Engine.constraint_entry`), both built by the caller off this thread: with an `entry` it
        decodes in a slot like any other (`Engine.place` after `insert`); with `entry=None` (the
        tables do not fit the pool) it runs on its own (`Engine.generate_alone`) when its turn
        comes, and the slots wait meanwhile.

        **Raises:** `QueueFull` when `max_queue` requests wait; `RuntimeError` when closed.
        """
        if not self._running:
            raise RuntimeError("the serving engine is not running (closed, or not started)")
        handle = Handle(
            request, tuple(stop_strings), loop or asyncio.get_running_loop(), constraint, entry
        )
        with self._lock:
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are already waiting; retry later")
            self._queue.append(handle)
        self._wake.set()
        return handle

    # ---- the device thread -----------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        timer = self.timer
        clock = time.perf_counter
        state = engine.init_decode_state()
        try:
            while self._running:
                start = clock()
                state = timer.add("cancel", start, self._drop_cancelled(state))
                start = clock()
                state = timer.add("admit", start, self._admit(state))
                if self.busy_slots == 0:
                    if self._prefilling is None and not self._queue:
                        start = clock()
                        self._wake.wait(0.5)
                        self._wake.clear()
                        timer.add("idle", start)
                    continue
                if engine.preemption:  # blocks for this dispatch, preempting if must be
                    start = clock()
                    state = timer.add("preempt", start, self._make_room(state))
                    if self.busy_slots == 0:
                        continue
                # while requests wait, the dispatch ends as soon as a slot frees for them;
                # `generate` times "layout", "compact", "dispatch"
                waiting = bool(self._queue) or self._prefilling is not None
                chunks = self._prefilling[1] if self._prefilling is not None else None
                mixed = chunks if isinstance(chunks, BlockPrefill) and chunks.pending else None
                state, out = engine.generate(state, until_finish=waiting, prefill=mixed)
                start = clock()
                out = timer.add("transfer", start, jax.device_get(out))  # one per dispatch
                if out.verified is not None:  # speculative decoding's counts
                    self.verified_tokens += int(out.verified.sum())
                    self.accepted_tokens += int(out.accepted.sum())
                start = clock()
                state = timer.add("deliver", start, self._deliver(state, out))
        except BaseException as error:
            self.error = error
            message = f"the serving engine failed: {type(error).__name__}: {error}"
        else:
            message = "the server is shutting down"
        self._running = False
        with self._lock:
            waiting = list(self._queue) + [s.handle for s in self._slots if s is not None]
            if self._prefilling is not None:
                waiting.append(self._prefilling[0])
            self._queue.clear()
        for handle in waiting:
            handle._put(Error(message))

    def _drop_cancelled(self, state):
        for i, slot in enumerate(self._slots):
            if slot is not None and slot.handle.cancelled:
                state = self.engine.free(state, i)
                self._slots[i] = None
                if self.engine.paged is not None:
                    self.engine.release(i, slot.written())
        if self._prefilling is not None and self._prefilling[0].cancelled:
            self._prefilling = None
            if self.engine.paged is not None:
                self.engine.release(self._paged_slot)
        with self._lock:
            if any(h.cancelled for h in self._queue):
                self._queue = collections.deque(h for h in self._queue if not h.cancelled)
        return state

    def _make_room(self, state):
        """`Engine.make_room`, and each preempted request queued again at the front (the oldest
        first): a decoding one with its `_Slot` (text, stop-string and streaming state) kept in
        its handle, a prefilling one with its prefill abandoned."""
        state, preempted = self.engine.make_room(state)
        for p in preempted:  # newest first: the oldest ends up at the front
            if p.prefilling:
                handle, _ = self._prefilling
                assert self._paged_slot == p.slot, (self._paged_slot, p.slot)
                self._prefilling = None
            else:
                host = self._slots[p.slot]
                self._slots[p.slot] = None
                handle, handle.host_slot = host.handle, host
            handle.resumed = p.request
            with self._lock:
                self._queue.appendleft(handle)
        return state

    def _admit(self, state):
        """Prefill chunks of queued requests, inserted into free slots as they complete, while
        slots are free and this turn's prefill tokens stay within `prefill_budget` (the first
        chunk of a turn always runs: a prompt longer than the budget still gets one chunk;
        while no slot decodes, nobody waits for the prefills, and the budget does not apply).
        A `BlockPrefill` (paged cache, a prompt longer than a chunk) runs its chunks here only
        while no slot decodes; else each rides in a dispatch, and it is inserted in the turn
        after its last chunk."""
        spent, decoding = 0, self.busy_slots  # slots whose streams wait for this turn
        while None in self._slots:
            if self._prefilling is None:
                with self._lock:
                    if not self._queue:
                        return state
                    handle = self._queue.popleft()
                if handle.constraint is not None and handle.entry is None:
                    self._run_alone(handle)
                    return state
                request = handle.pending_request
                if self.engine.paged is not None:  # blocks first, or it waits at the head
                    slot = self._slots.index(None)
                    admission = self.engine.admit(request, slot)
                    if admission is None:
                        with self._lock:
                            self._queue.appendleft(handle)
                        return state
                    self._paged_slot = slot
                    chunks = self.engine.block_prefill(request, admission)
                    if chunks is None:
                        chunks = self.engine.prefill_chunks(request, admission, state)
                    self._prefilling = (handle, chunks)
                else:
                    self._prefilling = (handle, self.engine.prefill_chunks(request))
            handle, chunks = self._prefilling
            if isinstance(chunks, BlockPrefill):  # into its blocks; mixed while slots decode
                if chunks.pending:
                    if decoding:  # this turn's dispatch carries the next chunk
                        return state
                    state = self.engine.run_chunk(state, chunks)
                    continue
                self._prefilling = None
                slot = self._paged_slot
                state = self.engine.insert(self.engine.block_prefix(chunks), state, slot)
                state = self._started(handle, state, slot)
                continue
            width = self.engine.prefill_width(len(handle.pending_request.token_ids))
            cost = min(width, self.engine.prefill_chunk)  # this chunk's tokens
            if spent and spent + cost > self.prefill_budget and decoding:
                return state
            spent += cost
            try:
                prefix = next(chunks)
            except Exception as error:  # this request fails, the others go on
                self._prefilling = None
                if self.engine.paged is not None:
                    self.engine.release(self._paged_slot)
                handle._put(Error(f"prefill failed: {type(error).__name__}: {error}"))
                return state
            if prefix is None:  # more chunks to come, in later turns
                return state
            self._prefilling = None
            slot = self._slots.index(None) if self.engine.paged is None else self._paged_slot
            state = self.engine.insert(prefix, state, slot)
            state = self._started(handle, state, slot)
        return state

    def _started(self, handle: Handle, state, slot: int):
        """After `handle`'s `insert` into `slot`: its constraint placed, its slot busy (with the
        `_Slot` it had before a preemption, so its text and stream go on)."""
        if handle.entry is not None:
            state = self.engine.place(handle.entry, state, slot)
        host, handle.host_slot = handle.host_slot, None
        self._slots[slot] = host or _Slot(handle, self.engine.tokenizer, self._eos)
        return state

    def _run_alone(self, handle: Handle) -> None:
        """A constrained request, through `Engine.generate_alone`, delivered at once."""
        try:
            ids, lps, tops, why = self.engine.generate_alone(handle.request, handle.constraint)
        except Exception as error:  # this request fails, the others go on
            handle._put(Error(f"generation failed: {type(error).__name__}: {error}"))
            return
        slot = _Slot(handle, self.engine.tokenizer, self._eos)
        handle.first_token = time.perf_counter()
        if self.on_first_token is not None and ids:
            self.on_first_token(handle.first_token - handle.submitted)
        stopped = False
        for t, lp, top in zip(ids, lps, tops):
            self.generated_tokens += 1
            if slot.push(t, lp, top):
                stopped = True
                break
        piece = slot.piece(final=True)
        if piece is not None:
            handle._put(piece)
        why = "stop_string" if stopped else why
        handle._put(
            Finished(
                OPENAI_FINISH_REASONS.get(why, why),
                len(handle.request.token_ids),
                slot.generated,
                slot.text,
            )
        )

    def _deliver(self, state, out):
        done, reason = out.done, out.finish_reason
        for i, slot in enumerate(self._slots):
            if slot is None:
                continue
            stopped = False
            for j, (t, lp) in enumerate(
                zip(out.token_ids[:, i].tolist(), out.logprobs[:, i].tolist())
            ):
                if t < 0:
                    break
                top = list(zip(out.top_token_ids[j, i].tolist(), out.top_logprobs[j, i].tolist()))
                if slot.generated == 0:
                    slot.handle.first_token = time.perf_counter()
                    if self.on_first_token is not None:
                        self.on_first_token(slot.handle.first_token - slot.handle.submitted)
                self.generated_tokens += 1
                if slot.push(int(t), float(lp), top):
                    stopped = True
                    break
            finished = stopped or bool(done[i])
            piece = slot.piece(final=finished)
            if piece is not None:
                slot.handle._put(piece)
            if finished:
                if self.engine.paged is not None:  # its blocks are back before it is told
                    self.engine.release(i, slot.written())  # its blocks stay cached
                why = "stop_string" if stopped else FINISH_REASONS[int(reason[i])]
                slot.handle._put(
                    Finished(
                        finish_reason=OPENAI_FINISH_REASONS.get(why, why),
                        prompt_tokens=len(slot.handle.request.token_ids),
                        completion_tokens=slot.generated,
                        text=slot.text,
                    )
                )
                if not bool(done[i]):
                    state = self.engine.free(state, i)
                self._slots[i] = None
        return state


class QueueFull(RuntimeError):
    """Too many requests are waiting (`Orchestrator.max_queue`)."""
