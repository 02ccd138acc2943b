"""Small models for tests, examples and notebooks that must run offline in seconds.

- `tiny_config(**overrides)`: a `LlamaConfig` of a 2-layer decoder with a 101-token vocabulary;
  `LlamaForCausalLM(tiny_config(), key=jax.random.key(0))` is a random model of that shape.
- `CountingModel`: a stand-in model whose next token is always `last + 1` (the Flax lm1b
  test's "counting" model), so generation loops can be checked token for token.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .models.base import AbstractCausalLM, fingerprint
from .models.config import LlamaConfig
from .models.kv_cache import KVCache


def tiny_config(**overrides) -> LlamaConfig:
    """A small `LlamaConfig` (2 layers, hidden 64, 4 query / 2 key-value heads, vocab 101).

    **Arguments:** any `LlamaConfig` field to override.
    """
    fields = dict(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=(100,),
        pad_token_id=0,
        bos_token_id=1,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


class CountingModel(AbstractCausalLM):
    """A model whose logits put all mass on `(last token + 1) % vocab_size`.

    It implements `AbstractCausalLM` (`__call__`, `prefill`, `init_cache` and the properties
    generation reads) with a real `KVCache` (one layer), so it exercises the cache bookkeeping
    too.

    **Attributes:** `config`: a `LlamaConfig` (only `vocab_size`, `eos_token_id`,
    `pad_token_id`, `max_position_embeddings` matter); `generation_config`: always `None`.
    """

    config: LlamaConfig = eqx.field(static=True)
    generation_config: None = eqx.field(static=True, default=None)

    def __init__(
        self, vocab_size: int = 32, eos_token_id: tuple[int, ...] = (31,), pad_token_id: int = 0
    ):
        self.config = dataclasses.replace(
            tiny_config(num_hidden_layers=1),
            vocab_size=vocab_size,
            eos_token_id=tuple(eos_token_id),
            pad_token_id=pad_token_id,
        )
        self.generation_config = None

    @property
    def vocab_size(self) -> int:
        """`config.vocab_size`."""
        return self.config.vocab_size

    @property
    def eos_token_id(self) -> tuple[int, ...]:
        """`config.eos_token_id`."""
        return self.config.eos_token_id

    @property
    def pad_token_id(self) -> int | None:
        """`config.pad_token_id`."""
        return self.config.pad_token_id

    @property
    def max_position_embeddings(self) -> int | None:
        """`config.max_position_embeddings`."""
        return self.config.max_position_embeddings

    @property
    def config_fingerprint(self) -> str:
        """Digest of the class and the config."""
        return fingerprint(type(self).__name__, self.config)

    def init_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty one-layer `KVCache` for `batch_size` rows of `max_len` slots."""
        return KVCache.init(self.config, batch_size, max_len)

    def __call__(
        self,
        token_ids: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        cache: KVCache,
        *,
        logits_to_keep: int = 0,
        prefix_length: Int[Array, " batch"] | None = None,
    ) -> tuple[Float[Array, "batch keep vocab"], KVCache]:
        """Logits (+10 on `(token + 1) % vocab_size`, -10 elsewhere) for the last `logits_to_keep`
        tokens (`0`: all), and the cache with this call's positions recorded (`prefix_length` has
        no effect: each logit depends on one token only)."""
        _, seq = token_ids.shape
        positions = jax.lax.dynamic_update_slice(
            cache.positions, positions.astype(jnp.int32), (0, cache.length[0])
        )
        cache = KVCache(k=cache.k, v=cache.v, positions=positions, length=cache.length + seq)
        keep = seq if logits_to_keep == 0 else min(logits_to_keep, seq)
        nxt = (token_ids[:, seq - keep :] + 1) % self.config.vocab_size
        logits = jnp.where(jax.nn.one_hot(nxt, self.config.vocab_size) > 0, 10.0, -10.0)
        return logits.astype(jnp.float32), cache

    def prefill(
        self,
        token_ids: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        *,
        max_len: int,
        logits_to_keep: int = 1,
        prefix_length: Int[Array, " batch"] | None = None,
    ) -> tuple[Float[Array, "batch keep vocab"], KVCache]:
        """`__call__` on a fresh cache of `max_len` slots, as `LlamaForCausalLM.prefill`."""
        cache = self.init_cache(token_ids.shape[0], max_len)
        return self(token_ids, positions, cache, logits_to_keep=logits_to_keep)
