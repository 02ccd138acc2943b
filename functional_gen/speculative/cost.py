"""The cost model of speculative decoding: verify guesses only where they pay for their call.

A step that verifies `w` guesses calls the target over `w + 1` positions per row. On this 2-core
CPU that costs more than a one-position decode step, and much more with many rows (the call
turns from reading the weights once to computing `batch * (w + 1)` tokens' worth): the default
model in float32 at batch 1 pays 1.24x a decode step for 4 positions, at batch 8 2.86x
(`VERIFY_COST`). A verification pays only when the tokens it is expected to yield exceed its
cost in decode steps; otherwise the step is a plain decode step.

`choose_width` makes that choice per step from the measured cost table and a per-row acceptance
estimate: a row whose guesses are each accepted with probability `a` (a geometric model: the
first rejection ends the run) yields `1 + a + ... + a**g` tokens from `g` guesses (the guesses it
keeps plus the target's own token). The step takes the width of the highest expected tokens per
unit of cost, width 0 (cost 1, one token per row) included.

Source: Leviathan, Kalman & Matias 2023, section 3.4 (the expected walltime improvement
`(1 - a**(g + 1)) / ((1 - a) * (g * c + 1))`; here the cost of the call over `g + 1` positions is
measured instead of modelled as `g * c + 1`).
"""

import bisect

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

VERIFY_COST: dict[tuple[str, int], tuple[tuple[int, float], ...]] = {
    ("float32", 1): ((1, 1.0), (2, 1.37), (4, 1.37), (8, 1.76), (11, 2.13), (16, 2.14)),
    ("float32", 8): ((1, 1.0), (2, 1.22), (4, 1.64), (8, 2.56), (11, 3.91), (16, 4.58)),
    ("int8", 1): ((1, 1.0), (2, 5.2), (4, 5.2), (8, 6.3), (11, 8.9), (16, 8.9)),
    ("int8", 8): ((1, 1.0), (2, 1.79), (4, 1.78), (8, 2.49), (11, 4.40), (16, 5.64)),
}
"""The cost of a target call over `positions` positions per row, as a multiple of a one-position
call, by `(precision, batch)`: `((positions, ratio), ...)`. Measured with
`benchmarks/bench_verify_width.py` on the default model (SmolLM2-135M) on this 2-core CPU;
`verify_cost` interpolates between positions and batches. Float32, 2026-11-26 16:44-16:48 UTC,
a quiet machine, as whole verifying steps inside the loop against the plain step
(`benchmarks/profile_speculative_step.py --batch B --guess G --only plain guess-G`, 16 steps,
median of 5-7; plain 16 ms at batch 1, 31 ms at batch 8), after verification took its argmax
blockwise (`reductions.argmax`: XLA's CPU `jnp.argmax` had cost 7 ms of a batch-8 4-position
step) and only the chosen tokens' logprobs: the bare-call ratios that the table held before
(`bench_verify_width.py`: batch 1 1.23 / 1.24 / 1.47 at 2 / 4 / 8 positions, batch 8 1.44 /
2.86 / 4.26) understated batch 1 (a bare one-position call is not the plain step) and
overstated batch 8. Int8 batch 1: the bare ratios below times 2.68, because the quiet
`bench_speculative.py --limit 6` of 2026-11-26 17:33 UTC, where exploration let int8 batch 1
verify at the bare ratios, ran grounded prompts at 0.72x plain (118.5 -> 85.1 tok/s, 1.29
tokens per step at acceptance 0.69): about 19 % of steps verified 3 guesses, so a verifying step
cost ~5.2 plain steps inside the loop, not 1.94 (inferred from that run, not timed directly: the
profile script has no int8 mode yet). Int8, 2026-11-26, a quiet machine, `--calls 10`, after int8 weights at 2 to 64
tokens per call were given their row-block product (`quantization.matmul_row_blocks`: before
it, any call over more than one token at batch 1 cost about 6x a decode step, and the table
held 5.77-6.41x there): batch 1, 8.3 ms at one position, 1.94x at 2 and 4, 2.35x at 8, 3.3x
at 11 and 16; batch 8, 55.0 ms, 1.10x at 2, 1.09x at 4, 1.53x at 8, 2.70x at 11, 3.46x at
16 as bare calls, but a bare one-position call at batch 8 (55 ms) is slower than a plain
decode step inside `generate` (30 ms: 264.6 tok/s), so against the step the bench compares
with, a 4-position verification costs more: `bench_speculative.py --limit 6` the same day
(quiet) with the bare ratios verified 3 guesses at 1.78x a plain step (grounded: 1.76 tokens
per step at 0.99x plain's tokens/s) and fell to 0.79x on open prompts. The table's batch-8 row
is therefore the bare ratios times 1.63 (1.78 / 1.09), i.e. in units of the plain step. Bfloat16 is not
measured yet: it gets float32's ratios (`bench_verify_width.py --precision bfloat16` measures
them). A table rather than a measurement at warm-up: a warm-up measurement on a machine
shared with other jobs moves by 2x between runs (and would make the output's speed, not its
tokens, depend on the moment), and the ratios, unlike the milliseconds, stay put.

Re-measured 2026-11-26 23:12-23:17 UTC inside the loop, batch 1 (`profile_speculative_step.py
--batch 1 --guess 2 4 8 --only plain guess-2 guess-4 guess-8 --steps 16`, medians of 7-9),
the machine loaded by two other jobs (load 3.5-4.9): float32, 4 / 8 / 16 positions cost 1.68 /
2.12 / 2.66 and 1.79 / 2.28 / 2.89 plain steps in two runs (plain 18.6 and 23.2 ms); int8
(`--quantization int8`, the first direct measurement of that row) 2.45 / 2.95 / 4.18 (plain
9.7 ms). The float32 row keeps its quiet figures: load inflates the many-row (YNNPACK) dots most.
The int8 batch-1 row was tried at the measured 2.45 / 2.95 / 4.18: `bench_speculative.py
--limit 3 --batches 1 --precisions int8 --no-transformers --rounds 2`, main's table then
this one in consecutive processes, gave grounded lookup 0.98x plain before and 0.91x after
(open 0.99x / 0.98x), 1.00 tokens per step in both (the adaptive lookup never verified; with the
cheaper table it ran every step instead of being skipped), so the inferred row stays. Why a
verifying call cannot cost about one plain step on this CPU: `benchmarks/bench_verify_dots.py`
(a 4-row product of the model's dots costs 1.4-1.6x a one-row product in every formulation and
YNNPACK option tried)."""


def verify_cost(precision: str, batch: int, positions: int) -> float:
    """The cost of a target call over `positions` positions per row against a one-position
    call, from `VERIFY_COST`: linear between the measured positions and between batch 1 and 8
    (more than 8 rows: batch 8's ratios; a precision not in the table: float32's).

    **Arguments:** `precision` (`"float32"`, `"int8"`, `"bfloat16"`), `batch` and `positions`
    (static Python ints, at least 1).

    **Raises:** `ValueError` for a `batch` or `positions` below 1.
    """
    if batch < 1 or positions < 1:
        raise ValueError(f"`batch` and `positions` must be at least 1, got {batch}, {positions}")
    precision = precision if (precision, 1) in VERIFY_COST else "float32"

    def at(rows: int) -> float:
        table = VERIFY_COST[(precision, rows)]
        xs = [p for p, _ in table]
        i = bisect.bisect_left(xs, positions)
        if i < len(xs) and xs[i] == positions:
            return table[i][1]
        if i == len(xs):  # past the last measured width: grow in proportion to the positions
            return table[-1][1] * positions / xs[-1]
        (x0, y0), (x1, y1) = table[i - 1], table[i]
        return y0 + (y1 - y0) * (positions - x0) / (x1 - x0)

    if batch >= 8:
        return at(8)
    return at(1) + (at(8) - at(1)) * (batch - 1) / 7


def model_precision(model: eqx.Module) -> str:
    """`"int8"` when any array of `model` is int8 (weight-only quantization), else `"bfloat16"`
    when any floating array is bfloat16, else `"float32"` (read from dtypes: static)."""
    dtypes = {leaf.dtype for leaf in jax.tree.leaves(eqx.filter(model, eqx.is_array))}
    if jnp.dtype(jnp.int8) in dtypes:
        return "int8"
    if jnp.dtype(jnp.bfloat16) in dtypes:
        return "bfloat16"
    return "float32"


def expected_tokens(
    acceptance: Float[Array, " batch"], guesses: Int[Array, " batch"]
) -> Float[Array, " batch"]:
    """The expected tokens a row emits from verifying `guesses` guesses that are each accepted
    with probability `acceptance` until the first rejection: `1 + a + a**2 + ... + a**g` (the
    kept guesses and the target's own token)."""
    a = jnp.clip(acceptance, 0.0, 0.999)
    return (1 - a ** (guesses + 1).astype(a.dtype)) / (1 - a)


def choose_width(
    widths: tuple[int, ...],
    costs: tuple[float, ...],
    acceptance: Float[Array, " batch"],
    num_guesses: Int[Array, " batch"],
    active: Bool[Array, " batch"],
) -> Int[Array, ""]:
    """The index into `widths` of the verification that yields the most expected tokens per unit
    of cost (ties: the narrowest).

    **Arguments:** `widths` (static guess slots per row, ascending, `widths[0] == 0`); `costs`
    (static, each width's cost in one-position calls, `costs[0] == 1`); per row `acceptance`
    (the estimated probability a guess is accepted), `num_guesses` (guesses it offers) and
    `active` (rows still generating; the others yield nothing whatever the width).

    **Returns:** `Int[Array, ""]`, the chosen width's index (0: a plain decode step).
    """
    rates = []
    for width, cost in zip(widths, costs):
        tokens = expected_tokens(acceptance, jnp.minimum(num_guesses, width))
        rates.append(jnp.sum(jnp.where(active, tokens, 0.0)) / cost)
    rates = jnp.stack(rates)
    return jnp.argmax(rates >= jnp.max(rates) * (1 - 1e-6)).astype(jnp.int32)
