"""Buckets: the padded sizes that decide which compiled program a call reuses.

Shapes decide compilation (DESIGN constraint 8). The prompt (or appended) length,
`max_new_tokens`, the batch and the cache capacity are padded up to the sizes below, so a new
prompt of a similar length, another `max_new_tokens` in the same bucket, a batch of 3 instead of
4, or a continuation reuse the compiled program; the loop still stops each row at its requested
count, through its done flag.

This module imports nothing of the package: `sequence_state` (padding a state's token columns)
and the planning of a call both use it.
"""

MIN_BUCKET = 16
"""The smallest bucket of a prompt length, `max_new_tokens` or capacity."""


def bucket_length(n: int, minimum: int = MIN_BUCKET) -> int:
    """The padded size for `n`: the next of 16, 24, 32, 48, 64, 96, 128, 192, 256, ... (powers
    of two and 1.5 times powers of two, from `minimum`): at most a third of a bucket is
    padding, and sizes between two buckets share one compiled program. Used for prompt
    lengths, `max_new_tokens` and cache capacities.

    **Arguments:** `n`: a count of tokens (or slots); `minimum`: the first bucket, a power of two
    (or 1.5 times one).

    **Returns:** an `int >= max(n, minimum)`.
    """
    bucket = minimum
    while bucket < n:
        bucket = bucket + bucket // 2 if (bucket & (bucket - 1)) == 0 else bucket + bucket // 3
    return bucket


def bucket_batch(n: int) -> int:
    """The padded batch size for `n` rows: 1, 2, 4, 6, 8, 12, 16, 24, ... (padding rows are
    marked finished before the first step and dropped from the result)."""
    return n if n <= 2 else bucket_length(n, minimum=4)


def grow_capacity(current: int, needed: int) -> int:
    """A continued state's capacity (cache slots, token columns): kept while it suffices, else the
    bucket (`bucket_length`) of one and a half times what is needed, so the turns of a chat share
    few compiled shapes (a new capacity serves until the text grows by half) while the cache
    stays within 2x of the text: decode attention reads the cache in place when it is at most
    half empty (`attention_lengths`), so a cache 4x the text made each step ~10% slower."""
    if needed <= current:
        return current
    return bucket_length(needed + needed // 2)
