"""The seeded request trace of `bench_serving_gpu.py` (issue 56): prompts, output lengths, a shared
system prompt for half of the requests, and arrival times. numpy only, so that a test can check
its shape without loading anything else."""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: `arrival` (seconds from the start), the prompt's `token_ids`,
    `max_new_tokens`, and whether the prompt starts with the shared system prompt."""

    arrival: float
    token_ids: tuple[int, ...]
    max_new_tokens: int
    shared: bool


def make_trace(
    n: int,
    *,
    seed: int = 0,
    prompt_lengths: tuple[int, int] = (64, 2048),
    output_lengths: tuple[int, int] = (32, 512),
    system_length: int = 1024,
    vocab: tuple[int, int] = (100, 49000),
) -> list[TraceRequest]:
    """`n` requests arriving at t=0 (saturating; `with_poisson_arrivals` for a rate), half of
    them (`n // 2`, a seeded random half) starting with one shared `system_length`-token prompt.

    Cold prompts have `prompt_lengths` (inclusive) random tokens; shared ones the system prompt
    plus `prompt_lengths[0]` to `prompt_lengths[1] - system_length` tokens of their own; outputs
    `output_lengths` (inclusive), uniform. Token ids are drawn from `vocab` (`[low, high)`).

    **Raises:** `ValueError` when the system prompt leaves no room for a shared prompt's own
    tokens within `prompt_lengths`.
    """
    (p_lo, p_hi), (o_lo, o_hi), (v_lo, v_hi) = prompt_lengths, output_lengths, vocab
    if system_length + p_lo > p_hi:
        raise ValueError(
            f"a {system_length}-token system prompt plus {p_lo} tokens is longer than {p_hi}"
        )
    rng = np.random.default_rng(seed)
    system = rng.integers(v_lo, v_hi, system_length).tolist()
    shared = rng.permutation(n) < n // 2
    trace = []
    for is_shared in shared.tolist():
        out = int(rng.integers(o_lo, o_hi + 1))
        if is_shared:
            own = int(rng.integers(p_lo, p_hi - system_length + 1))
            ids = system + rng.integers(v_lo, v_hi, own).tolist()
        else:
            ids = rng.integers(v_lo, v_hi, int(rng.integers(p_lo, p_hi + 1))).tolist()
        trace.append(TraceRequest(0.0, tuple(ids), out, is_shared))
    return trace


def with_poisson_arrivals(trace: list[TraceRequest], rate: float, seed: int = 0):
    """`trace` with Poisson arrivals at `rate` requests/s (the first at t=0), in trace order."""
    gaps = np.random.default_rng(seed + 1).exponential(1 / rate, len(trace))
    arrivals = np.cumsum(gaps) - gaps[0]
    return [dataclasses.replace(r, arrival=float(a)) for r, a in zip(trace, arrivals)]
