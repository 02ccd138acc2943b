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
