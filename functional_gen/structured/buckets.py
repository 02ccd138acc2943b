"""Table shapes in buckets, so that a new constraint of a similar size reuses the compiled
generation loop (as prompt lengths do). Used by the token-automaton tables (`processor`) and the
pushdown tables (`pda`)."""


def bucket(n: int, smallest: int = 8) -> int:
    """`n` rounded up to the next of 8, 12, 16, 24, 32, 48, ... (powers of two and 1.5 times
    powers of two), starting at `smallest` (a power of two).

    **Arguments:** `n`: a size (states, classes, tokens; a count, not bytes).

    **Returns:** the bucket, `>= max(n, smallest)`."""
    size = smallest
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size
