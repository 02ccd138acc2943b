"""`LogitBias`: add a fixed bias to chosen tokens."""

from collections.abc import Mapping

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._validation import check_token_ids_in_vocab
from .base import AbstractStatelessLogitsProcessor, Context


class LogitBias(AbstractStatelessLogitsProcessor):
    """Add `logit_bias[token_id]` to the logit of each listed token, at every step.

    Source: OpenAI's and vLLM's `logit_bias` (same semantics: an additive bias in logit units,
    in [-100, 100]; -100 practically bans a token, 100 practically forces it). For multi-token
    sequences see `SequenceBias`; to ban tokens outright see `SuppressTokens`.

    **Attributes:**

    - `token_ids`: the biased token ids (static tuple).
    - `biases`: `Float[Array, " tokens"]`, their biases (shared by all rows).

    Construct with `LogitBias(logit_bias)`, a dict `{token_id: bias}` (keys may be ints or
    strings of digits, as in OpenAI's JSON).

    **Raises:** `ValueError` for a non-dict, negative or non-integer token ids, or biases outside
    [-100, 100]; token ids outside the vocabulary raise when the processor first runs.
    """

    token_ids: tuple[int, ...] = eqx.field(static=True)
    biases: Float[Array, " tokens"]

    def __init__(self, logit_bias):
        if not isinstance(logit_bias, Mapping):
            raise ValueError(f"`logit_bias` must be a dict {{token_id: bias}}, got {logit_bias!r}")
        ids = []
        for key in logit_bias:
            try:
                token = int(key)
            except (TypeError, ValueError):
                token = -1
            if isinstance(key, (bool, float)) or token < 0:
                raise ValueError(f"`logit_bias` keys must be token ids >= 0, got {key!r}")
            ids.append(token)
        if len(set(ids)) != len(ids):
            raise ValueError(f"`logit_bias` lists a token id twice: {sorted(ids)}")
        try:
            values = np.asarray(list(logit_bias.values()), np.float64).reshape(len(ids))
        except (TypeError, ValueError):
            raise ValueError(
                f"`logit_bias` values must be floats, got {list(logit_bias.values())!r}"
            ) from None
        bad = ~np.isfinite(values) | (np.abs(values) > 100)
        if np.any(bad):
            raise ValueError(
                f"`logit_bias` values must be in [-100, 100], got {values[bad].tolist()}"
            )
        self.token_ids = tuple(ids)
        self.biases = jnp.asarray(values, jnp.float32)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        if not self.token_ids:
            return logits
        check_token_ids_in_vocab("logit_bias", self.token_ids, logits.shape[-1])
        ids = jnp.asarray(self.token_ids, jnp.int32)
        return logits.at[ids].add(self.biases.astype(logits.dtype))
