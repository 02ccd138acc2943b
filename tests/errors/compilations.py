"""Count what JAX traces and compiles inside a block, to pin "refused before any compilation"."""

import contextlib

import jax

COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/backend_compile_duration",
)


@contextlib.contextmanager
def count_compilations():
    """Yield a list that receives the name of every trace / XLA compilation event in the block
    (from `jax.monitoring`, the events JAX itself records for each program)."""
    events: list[str] = []

    def listener(name, duration, **kwargs):
        if name in COMPILE_EVENTS:
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
