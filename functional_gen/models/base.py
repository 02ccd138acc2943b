"""`AbstractCausalLM`: the interface that generation relies on.

Generation (`functional_gen.generation`) never reads a model through `getattr`: it calls the
methods and reads the properties declared here, and nothing else. Any decoder-only model that
implements them (the Equinox `LlamaForCausalLM`, the test `CountingModel`, a model of your own)
can be generated from, continued, forked and saved. Equinox's abstract/final pattern: this class
declares, subclasses implement, and nothing overrides a concrete method.
"""

import abc
import copy
import dataclasses
import hashlib
from typing import Any

import equinox as eqx
import jax
from jaxtyping import Array, Float, Int

from .kv_cache import KVCache, resolve_kv_cache_dtype
from .paged_cache import PagedKVCache


class AbstractCausalLM(eqx.Module):
    """A decoder-only language model as generation sees it.

    **Calls** (all pure; shapes static under `jit`):

    - `init_cache(batch_size, max_len) -> KVCache`: an empty cache.
    - `model(token_ids, positions, cache, *, logits_to_keep=0, prefix_length=None)`: decode or
      extend: run `seq` new tokens per row against `cache`, writing them to slots
      `[cache.length, cache.length + seq)`.
    - `model.prefill(token_ids, positions, *, max_len, logits_to_keep=1, prefix_length=None)`:
      one call over whole prompts that returns a fresh cache of `max_len` slots.

    `positions` are 0-based RoPE positions; `-1` marks padding (never attended to). With
    `prefix_length` (`Int[Array, " batch"]`), tokens at positions below it attend to each other
    bidirectionally (a prefix-LM), all other attention is causal.

    **What generation reads** (properties): `vocab_size`, `eos_token_id` (a tuple, every id that
    ends a row), `pad_token_id` (`int | None`), `max_position_embeddings`, `generation_config`
    (a `transformers.GenerationConfig` or `None`), and `config_fingerprint` (a string that
    changes when anything that shapes the cache or the logits changes; a `SequenceState` made
    by one model refuses to continue with another); `num_layers` and `kv_cache_dtype` are
    concrete (the layers and the key/value dtype of the cache `init_cache` makes), as are
    `compiler_options` (per-program XLA options of the `generate` program; none by default) and
    `with_kv_cache_dtype` (a model that stores its choice in a static `kv_cache_dtype` field,
    as `DecoderForCausalLM` does, can change it).
    """

    generation_config: eqx.AbstractVar[Any]

    @abc.abstractmethod
    def init_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty `KVCache` of `batch_size` rows and `max_len` slots (positions -1)."""

    @abc.abstractmethod
    def __call__(
        self,
        token_ids: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        cache: KVCache | PagedKVCache,
        *,
        logits_to_keep: int = 0,
        prefix_length: Int[Array, " batch"] | None = None,
    ) -> tuple[Float[Array, "batch keep vocab"], KVCache | PagedKVCache]:
        """Float32 next-token logits for the last `logits_to_keep` new tokens (`0`: all), and the
        cache with the new tokens written. A `PagedKVCache` (the serving engine's blocks) is taken
        for decode by models that support it (`DecoderForCausalLM`); others may raise."""

    @abc.abstractmethod
    def prefill(
        self,
        token_ids: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        *,
        max_len: int,
        logits_to_keep: int = 1,
        prefix_length: Int[Array, " batch"] | None = None,
    ) -> tuple[Float[Array, "batch keep vocab"], KVCache]:
        """`__call__` on a fresh cache of `max_len` slots (may be faster than that)."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids: the last axis of the logits."""

    @property
    @abc.abstractmethod
    def eos_token_id(self) -> tuple[int, ...]:
        """Every token id that ends a row by default (may be empty)."""

    @property
    @abc.abstractmethod
    def pad_token_id(self) -> int | None:
        """The model's padding id, or `None`."""

    @property
    @abc.abstractmethod
    def max_position_embeddings(self) -> int | None:
        """The longest sequence (prompt + generated) the model supports, or `None` for no limit."""

    @property
    @abc.abstractmethod
    def config_fingerprint(self) -> str:
        """A short string identifying the architecture, config and dtype (not the weights)."""

    @property
    def num_layers(self) -> int:
        """Decoder layers: the per-layer buffers of the model's `KVCache` (read from the shapes
        of `init_cache`, nothing allocated), e.g. to check an `EarlyExit` draft against it."""
        return len(jax.eval_shape(lambda: self.init_cache(1, 1)).k)

    @property
    def compiler_options(self) -> tuple[tuple[str, str], ...]:
        """Per-program XLA options, `((name, value), ...)`, that generation compiles its whole
        `generate` program (prefill and the `while_loop` of steps) with: none here;
        `DecoderForCausalLM` returns its `ExecutionPlan.compiler_options` (the GPU plan's command
        buffers for `while` and conditionals), and a wrapping model (classifier-free guidance's
        `GuidedModel`) returns its inner model's."""
        return ()

    @property
    def paged_decode(self) -> bool:
        """Whether the serving engine's paged decode hands this model a `PagedKVCache` (its
        blocks read in place through the tables, as the GPU plan's Pallas kernel does) instead
        of gathering every slot's blocks into a contiguous `KVCache` first: `False` here (a
        model must take a `PagedKVCache` in `__call__` to say `True`); `DecoderForCausalLM`:
        when its plan's `paged_attention` is not `"gather"`."""
        return False

    @property
    def kv_cache_dtype(self) -> str:
        """The dtype of the key/value buffers of `init_cache`'s caches, by name (`"float32"` or
        `"bfloat16"`; read from the shapes, nothing allocated). `DecoderForCausalLM` stores it
        in a static field of the same name."""
        k = jax.eval_shape(lambda: self.init_cache(1, 1)).k
        return k[0].dtype.name if k else "float32"

    def with_kv_cache_dtype(self, dtype) -> "AbstractCausalLM":
        """This model making its caches with `dtype` (`"float32"`, `"bfloat16"`, a jnp dtype, or
        `"auto"`: bfloat16 on a GPU, float32 elsewhere; see
        `functional_gen.models.kv_cache.resolve_kv_cache_dtype`). Weights are shared, not
        copied; `config_fingerprint` is unchanged (the cache dtype is a choice of precision,
        not of the model). Keys and values are rounded to `dtype` when written; attention reads
        them as they are stored.

        **Returns:** `self` when it already makes caches of `dtype`, else a copy whose static
        `kv_cache_dtype` field is `dtype` (a new compile of every program that uses it).

        **Raises:** `ValueError` for an unsupported `dtype`, or for a model without a
        `kv_cache_dtype` field asked for another dtype than its caches have.
        """
        name = resolve_kv_cache_dtype(dtype)
        if name == self.kv_cache_dtype:
            return self
        if "kv_cache_dtype" not in {f.name for f in dataclasses.fields(self)}:
            raise ValueError(
                f"{type(self).__name__} makes {self.kv_cache_dtype} caches and has no "
                f"`kv_cache_dtype` field to make {name} ones"
            )
        model = copy.copy(self)
        object.__setattr__(model, "kv_cache_dtype", name)  # a static field: not for tree_at
        return model


def fingerprint(*parts: Any) -> str:
    """A 16-hex-digit digest of the `repr`s of `parts` (for `config_fingerprint`)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
