"""`DRY`: "Don't Repeat Yourself", a penalty on tokens that would extend a repeated sequence."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from ._validation import float_param, int_param, token_sequences_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field

_FLOAT_MAX_LOG = 88.7228391  # log(float32 max): llama.cpp clamps the exponent to stay finite


def _breakers(value) -> tuple[tuple[int, ...], ...]:
    """Sequence breakers as token-id tuples; a bare int is a one-token breaker."""
    if isinstance(value, (str, bytes)):
        raise ValueError(
            f"`dry_sequence_breakers` must be token-id sequences (tokenize the strings first), got {value!r}"
        )
    if len(value) == 0:
        return ()
    value = [[v] if isinstance(v, (int, np.integer)) else v for v in value]
    return tuple(dict.fromkeys(token_sequences_param("dry_sequence_breakers", value)))


class DRY(AbstractStatelessLogitsProcessor):
    """DRY ("Don't Repeat Yourself") penalty: a token that would extend a sequence of tokens
    already seen earlier in the context gets `dry_multiplier * dry_base ** (n - dry_allowed_length)`
    subtracted from its logit, where `n >= dry_allowed_length` is the length of the longest
    such repeated sequence it would extend.

    Semantics of llama.cpp's `llama_sampler_init_dry` (ported from koboldcpp, by pi6am):

    - The context is the last `dry_penalty_last_n` tokens of the row, prompt included (-1: the
      whole row; 0: disabled). Nothing happens while it has at most `dry_allowed_length` tokens.
    - Sequence breakers (e.g. the tokens of newline, `:`, `"`, `*`) bound repetitions: a match
      never reaches back across the most recent complete breaker, and single-token breakers are
      never penalised themselves. If fewer than `dry_allowed_length` tokens follow that breaker,
      nothing is penalised.
    - For each earlier position whose preceding tokens match the current end of the context
      (length `n`, capped by the breaker bound), the token that followed it gets `n`; each token
      takes its largest `n`. The exponent is clamped so that the penalty stays finite.

    llama.cpp takes breakers as strings and finds every token that contains them; here they are
    token-id sequences (llama.cpp's `llama_sampler_init_dry_testing`). Cost: `O(W**2)`
    comparisons per row for a window of `W` tokens, so prefer a finite `dry_penalty_last_n` for
    long contexts.

    Source: llama.cpp `src/llama-sampling.cpp` (DRY); koboldcpp PR #982; oobabooga
    text-generation-webui PR #5677.

    **Attributes:**

    - `dry_multiplier`: `>= 0` (or one per row), in logit units; 0 disables. Suggested: 0.8.
    - `dry_base`: `>= 1` (or one per row); growth per extra repeated token. Default 1.75.
    - `dry_allowed_length`: repetitions of up to this many tokens are free (static int `>= 0`,
      default 2).
    - `dry_sequence_breakers`: token-id sequences (static tuple of tuples, default none).
    - `dry_penalty_last_n`: how many of the last tokens to scan (static int; -1 = all, 0 = off).

    **Raises:** `ValueError` for a negative multiplier, a base below 1, a negative allowed
    length, a `dry_penalty_last_n` below -1, or malformed breakers.
    """

    dry_multiplier: Float[Array, "*rows"] = per_row_field()
    dry_base: Float[Array, "*rows"] = per_row_field()
    dry_allowed_length: int = eqx.field(static=True)
    dry_sequence_breakers: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    dry_penalty_last_n: int = eqx.field(static=True)

    def __init__(
        self,
        dry_multiplier,
        dry_base=1.75,
        dry_allowed_length: int = 2,
        dry_sequence_breakers=(),
        dry_penalty_last_n: int = -1,
    ):
        self.dry_multiplier = float_param("dry_multiplier", dry_multiplier, low=0.0)
        self.dry_base = float_param("dry_base", dry_base, low=1.0)
        self.dry_allowed_length = int_param("dry_allowed_length", dry_allowed_length, low=0)
        self.dry_sequence_breakers = _breakers(dry_sequence_breakers)
        self.dry_penalty_last_n = int_param("dry_penalty_last_n", dry_penalty_last_n, low=-1)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        if self.dry_penalty_last_n == 0:
            return logits
        vocab = logits.shape[-1]
        max_len = context.token_ids.shape[0]
        cap = max_len if self.dry_penalty_last_n < 0 else min(max_len, self.dry_penalty_last_n)
        window = jnp.minimum(context.length, cap)  # W, the tokens scanned
        allowed = self.dry_allowed_length

        # The window read backwards: back[i] is the token i places before the end.
        i = jnp.arange(cap)
        back = context.token_ids[jnp.clip(context.length - 1 - i, 0, max_len - 1)]
        back = jnp.where(i < window, back, -1)

        rep_limit = self._repetition_limit(back, window)

        # repeat[k]: how many tokens before the end equal those before position k from the end
        # (the Z-array of the reversed window), capped by the breaker bound.
        shifted = i[:, None] + i[None, :]  # [k, j] -> j + k
        back_padded = jnp.concatenate([back, jnp.full((cap,), -1, back.dtype)])
        equal = (back[None, :] == back_padded[shifted]) & (shifted < window)
        repeat = jnp.minimum(jnp.argmin(equal, axis=1), rep_limit)  # first mismatch
        # The token that followed such a match (position k - 1 from the end) would extend it.
        candidate = (i >= 1) & (i < window) & (repeat >= allowed)
        followers = jnp.where(candidate, back[jnp.maximum(i - 1, 0)], vocab)
        longest = jnp.full((vocab,), -1, jnp.int32).at[followers].max(repeat, mode="drop")
        penalised = longest >= 0
        single_breakers = [s[0] for s in self.dry_sequence_breakers if len(s) == 1]
        if single_breakers:
            penalised = penalised.at[jnp.asarray(single_breakers)].set(False, mode="drop")

        base = self.dry_base
        max_exponent = jnp.floor(_FLOAT_MAX_LOG / jnp.log(jnp.maximum(base, 1.000001)))
        exponent = (longest - allowed).astype(jnp.float32)
        exponent = jnp.where((base > 1.000001) & (exponent > max_exponent), max_exponent, exponent)
        penalty = self.dry_multiplier * base**exponent
        active = (self.dry_multiplier != 0) & (window > allowed) & (rep_limit >= allowed)
        return logits - jnp.where(active & penalised, penalty, 0.0).astype(logits.dtype)

    def _repetition_limit(self, back: Int[Array, " cap"], window: Int[Array, ""]) -> Int[Array, ""]:
        """Tokens after the most recent complete sequence breaker (the whole window if none)."""
        if not self.dry_sequence_breakers:
            return window
        cap = back.shape[0]
        i = jnp.arange(cap)
        longest = jnp.full((cap,), -1, jnp.int32)
        for head, *tail in self.dry_sequence_breakers:
            # A breaker [head, t0, t1, ...] reads forwards, so t0 is one place closer to the end.
            match = (back == head) & (i >= len(tail)) & (i < window)
            for offset, token in enumerate(tail):
                later = jnp.concatenate([jnp.full((offset + 1,), -1, back.dtype), back])[:cap]
                match = match & (later == token)
            longest = jnp.where(match, jnp.maximum(longest, len(tail)), longest)
        found = longest >= 0
        first = jnp.argmax(found)
        return jnp.where(jnp.any(found), first - longest[first], window)
