"""Eager checks of processor parameters, run at construction (before any compilation)."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def float_param(
    name: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    hint: str = "",
) -> jax.Array:
    """`value` as a float32 array leaf (a scalar or one value per row), checked against a range.

    Traced values (a processor built inside `jit`) are not checked.

    **Raises:** `ValueError` naming `name`, the allowed range and the bad value.
    """
    if isinstance(value, jax.core.Tracer):
        return jnp.asarray(value, jnp.float32)
    array = np.asarray(value, dtype=np.float64)
    if array.ndim > 1:
        raise ValueError(f"`{name}` must be a scalar or one value per row, got shape {array.shape}")
    bad = ~np.isfinite(array)
    if low is not None:
        bad |= (array < low) if low_inclusive else (array <= low)
    if high is not None:
        bad |= (array > high) if high_inclusive else (array >= high)
    if np.any(bad):
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        interval = f"{'[' if low_inclusive and low is not None else '('}{lo}, {hi}{']' if high_inclusive and high is not None else ')'}"
        shown = array.item() if array.ndim == 0 else array[bad].tolist()
        raise ValueError(f"`{name}` must be in {interval}, got {shown}{hint}")
    return jnp.asarray(array, jnp.float32)


def int_param(name: str, value, *, low: int) -> int:
    """A Python int >= `low` (for static, shape-deciding fields). **Raises:** `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"`{name}` must be an integer >= {low}, got {value!r}")
    return int(value)


def token_ids_param(name: str, value, *, allow_empty: bool = False) -> tuple[int, ...]:
    """A tuple of non-negative token ids (a static field). **Raises:** `ValueError`."""
    if isinstance(value, (int, np.integer)):
        value = [value]
    if not isinstance(value, (Sequence, np.ndarray)):
        raise ValueError(f"`{name}` must be a token id or a sequence of token ids, got {value!r}")
    ids = tuple(int(v) for v in value)
    if any(i < 0 for i in ids) or (not ids and not allow_empty):
        raise ValueError(f"`{name}` must be non-negative token ids, got {list(ids)}")
    return ids


def int_array_param(name: str, value, *, low: int) -> jax.Array:
    """`value` as an int32 array leaf (a scalar or one value per row), each `>= low`.

    For integer knobs that decide no shape (e.g. `min_length`), so new values do not recompile.

    **Raises:** `ValueError` naming `name`, the bound and the bad value.
    """
    if isinstance(value, jax.core.Tracer):
        return jnp.asarray(value, jnp.int32)
    if isinstance(value, (bool, float, np.floating)):
        raise ValueError(f"`{name}` must be an integer >= {low} (or one per row), got {value!r}")
    array = np.asarray(value)
    if array.ndim > 1 or array.dtype.kind not in "iu" or np.any(array < low):
        raise ValueError(f"`{name}` must be an integer >= {low} (or one per row), got {value!r}")
    return jnp.asarray(array, jnp.int32)


def token_sequences_param(name: str, value) -> tuple[tuple[int, ...], ...]:
    """A non-empty sequence of non-empty token-id sequences, as a tuple of tuples (static).

    **Raises:** `ValueError` naming `name` and the bad value.
    """
    message = (
        f"`{name}` must be a non-empty list of non-empty lists of token ids >= 0, got {value!r}"
    )
    if (
        isinstance(value, (str, bytes))
        or not isinstance(value, (Sequence, np.ndarray))
        or len(value) == 0
    ):
        raise ValueError(message)
    out = []
    for seq in value:
        if (
            isinstance(seq, (int, np.integer))
            or not isinstance(seq, (Sequence, np.ndarray))
            or len(seq) == 0
        ):
            raise ValueError(message)
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0 for t in seq):
            raise ValueError(message)
        out.append(tuple(int(t) for t in seq))
    return tuple(out)


def check_token_ids_in_vocab(name: str, token_ids, vocab: int) -> None:
    """Called while tracing `process` (the vocabulary size is known only then).

    **Raises:** `ValueError` for token ids `>= vocab`.
    """
    bad = sorted({int(t) for t in token_ids if int(t) >= vocab})
    if bad:
        raise ValueError(
            f"`{name}` has token ids outside the vocabulary of {vocab} tokens: {bad[:8]}"
        )
