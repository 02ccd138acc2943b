"""`PhaseTimer`: where the serving loop's wall time goes, phase by phase (for profiling).

The orchestrator's device thread and the engine's `generate` add the wall seconds of each phase
of a turn (admission and prefill, cache layout read, compaction, the decode dispatch, the
device-to-host read, detokenization and delivery) to one `PhaseTimer`. JAX dispatches device
work asynchronously, so by default a phase's time is only its host work and the device time shows
up at the next synchronization (the layout read or the output transfer); with `sync=True` every
phase waits for its device work (`jax.block_until_ready`), which attributes device time exactly
at the cost of the overlap between host and device (`benchmarks/profile_serving_step.py
--orchestrator` runs both).
"""

import collections
import time

import jax


class PhaseTimer:
    """Wall seconds per phase name (`seconds`, a `collections.Counter`) and how many times each
    phase ran (`counts`).

    **Arguments:** `sync`: wait for a phase's device work before stopping its clock.
    """

    def __init__(self, *, sync: bool = False):
        self.sync = sync
        self.seconds: collections.Counter[str] = collections.Counter()
        self.counts: collections.Counter[str] = collections.Counter()

    def add(self, phase: str, start: float, result=None):
        """Add the seconds since `start` (a `time.perf_counter()` reading) to `phase`, after
        waiting for `result`'s arrays when `sync`. **Returns:** `result`."""
        if self.sync and result is not None:
            jax.block_until_ready(result)
        self.seconds[phase] += time.perf_counter() - start
        self.counts[phase] += 1
        return result

    def reset(self) -> None:
        """Forget every phase."""
        self.seconds.clear()
        self.counts.clear()
