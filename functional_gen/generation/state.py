"""`GenerationState`: everything a generation carries from one step to the next, as one pytree."""

from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, Key, PyTree

from ..models.kv_cache import KVCache
from ..models.paged_cache import PagedKVCache

FINISH_REASONS = ("", "eos", "length", "stop_string", "constraint")
"""Names of the `GenerationState.finish_reason` codes: 0 = still running, 1 = an EOS token,
2 = `max_new_tokens` reached, 3 = a stop string, 4 = a constraint allowed no further token."""

RUNNING, EOS, LENGTH, STOP_STRING, CONSTRAINT = range(len(FINISH_REASONS))


class GenerationState(eqx.Module):
    """The carry of the generation loop: one pytree, every leaf with a leading batch axis.

    **Attributes:**

    - `token_ids`: `Int[Array, "batch max_len"]`, each row's tokens (earlier text, then this
      call's generated tokens) from column 0 (no left padding here); columns from `length` on
      hold the pad id. `max_len` is a bucketed capacity (at least the longest row plus
      `max_new_tokens`).
    - `length`: `Int[Array, " batch"]`, valid tokens per row, prompt included.
    - `prompt_length`: `Int[Array, " batch"]`, what the processors see as the prompt
      (`Context.prompt_length`): the tokens before the first token generated with these
      processors. For a fresh prompt, or a continuation with new processors, it is
      `start_length`; a continuation with the same processors keeps the earlier value.
    - `start_length`: `Int[Array, " batch"]`, tokens per row before this call's first generated
      token.
    - `max_new_tokens`: `Int[Array, " batch"]`, tokens each row may generate in this call (the
      budget, stored explicitly; the `logprobs` columns are a bucketed capacity `>=` it).
    - `done`: `Bool[Array, " batch"]`, rows that have finished.
    - `finish_reason`: `Int[Array, " batch"]`, a code into `FINISH_REASONS` (0 while running).
    - `logits`: `Float[Array, "batch vocab"]`, float32 next-token logits after each row's last
      token (the model's, not yet processed); a finished row keeps the ones after its last token.
    - `logprobs`: `Float[Array, "batch steps"]`, natural-log probability of each chosen token
      under the processed distribution it was drawn from; 0 after a row ends.
    - `top_token_ids`, `top_logprobs`: `Int/Float[Array, "batch steps k"]`, per generated token
      the `k` most likely tokens and their logprobs, most likely first (`k` is the step's
      `top_logprobs`, may be 0); same distribution as `logprobs`.
    - `cache`: the model's `KVCache` (rows written in lockstep, see `KVCache`), or inside the
      serving engine's paged dispatches a `PagedKVCache` (each row at its own length).
    - `processor_states`: tuple, one state per processor, each leaf with a batch axis.
    - `stop_state`: `Int[Array, "batch stops"]`, per row and stop string, how many bytes of it the
      generated text currently ends with (see `functional_gen.generation.stop_strings`).
    - `key`: `Key[Array, " batch"]`, one PRNG key per row; a row's `n`-th sampling step (counted
      over every call that continued it) uses `fold_in(key, n)`, so rows never share randomness.
    - `key_step`: `Int[Array, " batch"]`, sampling steps taken by earlier calls (the `n` of
      this call's first step).
    - `search_state`: the search's own carry (`AbstractSearch.init`): a
      `functional_gen.generation.beam_search.BeamState` under beam search (the rows are then
      `prompts * num_beams` beams), `None` when sampling.
    """

    token_ids: Int[Array, "batch max_len"]
    length: Int[Array, " batch"]
    prompt_length: Int[Array, " batch"]
    start_length: Int[Array, " batch"]
    max_new_tokens: Int[Array, " batch"]
    done: Bool[Array, " batch"]
    finish_reason: Int[Array, " batch"]
    logits: Float[Array, "batch vocab"]
    logprobs: Float[Array, "batch steps"]
    top_token_ids: Int[Array, "batch steps k"]
    top_logprobs: Float[Array, "batch steps k"]
    cache: KVCache | PagedKVCache
    processor_states: tuple[PyTree, ...]
    stop_state: Int[Array, "batch stops"]
    key: Key[Array, " batch"]
    key_step: Int[Array, " batch"]
    search_state: Any = None

    @property
    def num_generated(self) -> Int[Array, " batch"]:
        """Tokens generated so far in this call, per row."""
        return self.length - self.start_length

    @property
    def batch_size(self) -> int:
        """Rows (a static shape)."""
        return self.length.shape[0]

    def generated_token_ids(self, pad_token_id: int) -> Int[Array, "batch steps"]:
        """This call's generated tokens of every row, left-aligned, `pad_token_id` after a row's
        end; as many columns as `logprobs`."""
        n = self.logprobs.shape[1]
        cols = self.start_length[:, None] + jnp.arange(n)[None, :]
        ids = jnp.take_along_axis(self.token_ids, jnp.minimum(cols, self.token_ids.shape[1] - 1), 1)
        return jnp.where(cols < self.length[:, None], ids, pad_token_id)
