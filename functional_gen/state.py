"""`GenerationState`: everything a generation carries from one step to the next, as one pytree."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from .models.kv_cache import KVCache

FINISH_REASONS = ("", "eos", "length", "stop_string", "constraint")
"""Names of the `GenerationState.finish_reason` codes: 0 = still running, 1 = an EOS token,
2 = `max_new_tokens` reached, 3 = a stop string, 4 = a constraint allowed no further token."""

RUNNING, EOS, LENGTH, STOP_STRING, CONSTRAINT = range(len(FINISH_REASONS))


class GenerationState(eqx.Module):
    """The carry of the generation loop: one pytree, every leaf with a leading batch axis.

    **Attributes:**

    - `token_ids`: `Int[Array, "batch max_len"]`, each row's prompt followed by its generated
      tokens, starting at column 0 (no left padding here); columns from `length` on hold the pad
      id. `max_len` = padded prompt length + `max_new_tokens`.
    - `length`: `Int[Array, " batch"]`, valid tokens per row, prompt included.
    - `prompt_length`: `Int[Array, " batch"]`, prompt tokens per row.
    - `done`: `Bool[Array, " batch"]`, rows that have finished.
    - `finish_reason`: `Int[Array, " batch"]`, a code into `FINISH_REASONS` (0 while running).
    - `logits`: `Float[Array, "batch vocab"]`, float32 next-token logits from the last model
      call, not yet processed.
    - `logprobs`: `Float[Array, "batch max_new_tokens"]`, natural-log probability of each chosen
      token under the processed distribution it was drawn from; 0 after a row ends.
    - `cache`: the model's `KVCache` (left-padded: row slots are aligned, see `KVCache`).
    - `processor_states`: tuple, one state per processor, each leaf with a batch axis.
    - `stop_state`: `Int[Array, "batch stops"]`, per row and stop string, how many bytes of it the
      generated text currently ends with (see `functional_gen.stop_strings`); `stops` may be 0.
    - `key`: `Key[Array, " batch"]`, one PRNG key per row; step `n` of a row uses
      `fold_in(key, n)`, so rows never share randomness.
    """

    token_ids: Int[Array, "batch max_len"]
    length: Int[Array, " batch"]
    prompt_length: Int[Array, " batch"]
    done: Bool[Array, " batch"]
    finish_reason: Int[Array, " batch"]
    logits: Float[Array, "batch vocab"]
    logprobs: Float[Array, "batch max_new_tokens"]
    cache: KVCache
    processor_states: tuple[PyTree, ...]
    stop_state: Int[Array, "batch stops"]
    key: PRNGKeyArray

    @property
    def max_new_tokens(self) -> int:
        """Tokens each row may generate (a static shape)."""
        return self.logprobs.shape[1]

    @property
    def num_generated(self) -> Int[Array, " batch"]:
        """Tokens generated so far per row."""
        return self.length - self.prompt_length

    @property
    def batch_size(self) -> int:
        """Rows (a static shape)."""
        return self.length.shape[0]

    def generated_token_ids(self, pad_token_id: int) -> Int[Array, "batch max_new_tokens"]:
        """The generated tokens of every row, left-aligned, `pad_token_id` after a row's end."""
        n = self.max_new_tokens
        cols = self.prompt_length[:, None] + jnp.arange(n)[None, :]
        ids = jnp.take_along_axis(self.token_ids, jnp.minimum(cols, self.token_ids.shape[1] - 1), 1)
        return jnp.where(cols < self.length[:, None], ids, pad_token_id)
