"""The batch widths of the serving engine's decode programs (`Engine(decode_widths=...)`): a
dispatch whose busy slots fit a narrower width runs that program on their rows."""

from collections.abc import Sequence


def default_decode_widths(max_slots: int) -> tuple[int, ...]:
    """The narrower decode widths an `Engine` compiles besides `max_slots` unless told otherwise:
    the powers of two below `max_slots` for 4 slots or more (8 slots: 1, 2, 4), none below 4 (as
    vLLM captures its CUDA graphs at batch sizes 1, 2, 4, 8, ...). A dispatch whose busy slots
    fit one of them runs a program of that width on their rows (gathered, then written back)
    instead of the `max_slots`-row program with the other rows idle.

    Why: on the 2-core CPU a step's cost grows with its rows (XLA's few-row matrix products), so
    idle rows are paid for: SmolLM2-135M, plain decode steps over a 512-slot cache, one process
    (`benchmarks/bench_decode_widths.py`, 2026-11-27): float32 1 / 2 / 4 / 8 rows 26.0 / 35.1 /
    38.6 / 50.0 ms, int8 9.4 / 21.4 / 24.3 / 33.7 ms. `benchmarks/bench_serving.py --quantization
    int8 --decode-widths ...` on the same machine, 32 requests (tokens/s, TTFT p99, ITL p50):
    at 1 request/s widths 8 only 61.7, 3.00 s, 61 ms; with 1 62.0, 3.29 s, 61 ms; with 1, 2, 4
    64.9, 2.24 s, 47 ms; saturated (all at t=0) 89.1 / 101.0 / 93.5 tokens/s (noise of +-6 %);
    `benchmarks/account_serving.py --compare-widths`: the saturated trace's 33 steps with one busy
    slot took 14.5 instead of 55.0 ms. Each width is one more compiled program (start-up,
    `precompile`), hence none for 2-3 slots. The gather and the write-back copy the rows' caches
    (SmolLM2 at 512 slots: 24 MB each way per row, ~1-2 ms). A row's tokens can differ between
    widths only by float rounding (the products' kernels change with the row count, as between
    `fg.generate` at batch 1 and 8), never by masking."""
    if max_slots < 4:
        return ()
    return tuple(1 << i for i in range(max_slots.bit_length()) if 1 << i < max_slots)


def checked_decode_widths(decode_widths: Sequence[int] | None, max_slots: int) -> tuple[int, ...]:
    """The decode widths an `Engine` of `max_slots` slots compiles: `decode_widths`
    (`None`: `default_decode_widths(max_slots)`) and `max_slots`, ascending, each once.

    **Raises:** `ValueError` naming `decode_widths` when it is not a sequence of integers, or an
    entry outside `[1, max_slots]`."""
    if decode_widths is None:
        decode_widths = default_decode_widths(max_slots)
    if isinstance(decode_widths, (str, bytes)) or not isinstance(decode_widths, Sequence):
        raise ValueError(f"`decode_widths` must be a sequence of integers, got {decode_widths!r}")
    for w in decode_widths:
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= max_slots:
            raise ValueError(
                f"`decode_widths` entries must be integers in [1, max_slots={max_slots}], got {w!r}"
            )
    return tuple(sorted({*decode_widths, max_slots}))
