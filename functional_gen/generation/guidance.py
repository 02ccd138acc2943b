"""Classifier-free guidance in the 2x-batch form: conditional and unconditional rows in ONE model
call per step.

Source: Sanchez et al. 2023, "Stay on topic with Classifier-Free Guidance" (arXiv 2306.17806);
the 2x-batch layout is MusicGen's ("2x batch trick", transformers'
`ClassifierFreeGuidanceLogitsProcessor`), the formula and defaults are those of transformers'
`UnbatchedClassifierFreeGuidanceLogitsProcessor`, as in `fg.processors.ClassifierFreeGuidance`
(the two forms give the same tokens):

    cond   = log_softmax(model(prompt + generated))
    uncond = log_softmax(model(negative prompt + generated))   # default: the prompt's last token
    cfg    = uncond + guidance_scale * (cond - uncond)
    rescale r: log_softmax(r * log_softmax(cfg) + (1 - r) * cond)

`GuidedModel` wraps a model so that generation sees an ordinary `AbstractCausalLM` whose logits
are the guided log-probabilities: every model call runs `2 * batch` rows (the weights are read
once for both branches), and its `KVCache` holds both branches of a row side by side
(`k: [batch, 2, kv_heads, max_len, head_dim]`), so every leaf keeps the batch axis first and beam
search, forks and `SequenceState` move both branches of a row with one gather.
"""

import dataclasses
import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

from ..models.base import AbstractCausalLM, fingerprint
from ..models.kv_cache import KVCache

CFG_MODES = ("processor", "batched")
"""`cfg` values of `generate`: the processor form (a second forward pass per row, its cache in
the processor state) or the 2x-batch form (`GuidedModel`)."""


def guide(
    cond_logits: Float[Array, "*batch vocab"],
    uncond_logits: Float[Array, "*batch vocab"],
    guidance_scale: float | Float[ArrayLike, "*#batch"],
    rescale: float | Float[ArrayLike, "*#batch"] | None = None,
) -> Float[Array, "*batch vocab"]:
    """The guided log-probabilities from conditional and unconditional logits.

    **Arguments:** `cond_logits`, `uncond_logits` (unnormalised; both are `log_softmax`ed
    here), `guidance_scale` (any real: 1 returns `log_softmax(cond_logits)` exactly, 0 the
    unconditional distribution, < 0 pushes away from the prompt), `rescale` (in [0, 1] or `None`).

    **Returns:** natural-log scores over the vocabulary (normalised when `rescale` is given).

    Source: transformers' `UnbatchedClassifierFreeGuidanceLogitsProcessor` (mix) and the
    transformers issue "Add Classifier-Free Guidance sampling" (`rescale_factor` blend).
    """
    cond = jax.nn.log_softmax(cond_logits.astype(jnp.float32), axis=-1)
    uncond = jax.nn.log_softmax(uncond_logits.astype(jnp.float32), axis=-1)
    scale = jnp.asarray(guidance_scale, jnp.float32)[..., None]
    guided = scale * (cond - uncond) + uncond
    if rescale is not None:
        r = jnp.asarray(rescale, jnp.float32)[..., None]
        guided = jax.nn.log_softmax(r * jax.nn.log_softmax(guided, axis=-1) + (1 - r) * cond, -1)
    return jnp.where(scale == 1, cond, guided)


def _pairs_to_rows(cache: KVCache) -> KVCache:
    """`[batch, 2, ...]` leaves -> `[2 * batch, ...]` (cond, uncond interleaved; a reshape)."""
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    return dataclasses.replace(
        cache,
        k=tuple(map(flat, cache.k)),
        v=tuple(map(flat, cache.v)),
        positions=flat(cache.positions),
        length=jnp.repeat(cache.length, 2),
        ring_positions=None if cache.ring_positions is None else flat(cache.ring_positions),
    )


def _rows_to_pairs(cache: KVCache) -> KVCache:
    pair = lambda x: x.reshape((-1, 2) + x.shape[1:])  # noqa: E731
    return dataclasses.replace(
        cache,
        k=tuple(map(pair, cache.k)),
        v=tuple(map(pair, cache.v)),
        positions=pair(cache.positions),
        length=cache.length[::2],
        ring_positions=None if cache.ring_positions is None else pair(cache.ring_positions),
    )


class GuidedModel(AbstractCausalLM):
    """A model whose next-token scores are classifier-free guided, computed in 2x-batch form.

    **Attributes:**

    - `model`: the guided `AbstractCausalLM`.
    - `guidance_scale`: `Float[Array, ""]`, the scale (one for every row; per-row scales and
      negative prompts: use the processor form, `fg.processors.ClassifierFreeGuidance`).
    - `rescale`: `Float[Array, ""]` in [0, 1], or `None`.
    - `negative_prompt_ids`: `Int[Array, " n"]`, the unconditional branch's prompt shared by
      every row, or `None`: each row's last prompt token (transformers' default).

    **Raises:** `ValueError` for a non-finite scale, a `rescale` outside [0, 1], an empty
    negative prompt or ids outside the vocabulary; `TypeError` for a model that is not an
    `AbstractCausalLM`.
    """

    model: AbstractCausalLM
    guidance_scale: Float[Array, ""]
    rescale: Float[Array, ""] | None
    negative_prompt_ids: Int[Array, " n"] | None
    negative_key: tuple = eqx.field(static=True)

    def __init__(self, model, guidance_scale: float, negative_prompt_ids=None, rescale=None):
        if not isinstance(model, AbstractCausalLM):
            raise TypeError(
                f"classifier-free guidance needs an AbstractCausalLM, got {type(model).__name__}"
            )
        scale = float(guidance_scale)
        if not math.isfinite(scale):
            raise ValueError(f"`guidance_scale` must be a finite number, got {guidance_scale!r}")
        if rescale is not None and not 0.0 <= float(rescale) <= 1.0:
            raise ValueError(f"`rescale` must be in [0, 1], got {rescale!r}")
        if negative_prompt_ids is not None:
            ids = [int(t) for t in negative_prompt_ids]
            if not ids:
                raise ValueError("the negative prompt is empty: pass None for the default")
            bad = [t for t in ids if not 0 <= t < model.vocab_size]
            if bad:
                raise ValueError(
                    f"negative prompt ids outside the vocabulary [0, {model.vocab_size}): {bad[:8]}"
                )
            negative_prompt_ids = jnp.asarray(ids, jnp.int32)
        self.model = model
        self.guidance_scale = jnp.asarray(scale, jnp.float32)
        self.rescale = None if rescale is None else jnp.asarray(float(rescale), jnp.float32)
        self.negative_prompt_ids = negative_prompt_ids
        self.negative_key = () if negative_prompt_ids is None else tuple(ids)

    @property
    def generation_config(self) -> Any:
        """The guided model's generation config."""
        return self.model.generation_config

    @property
    def vocab_size(self) -> int:
        """The guided model's vocabulary size."""
        return self.model.vocab_size

    @property
    def compiler_options(self) -> tuple[tuple[str, str], ...]:
        """The guided model's per-program XLA options (its execution plan's)."""
        return self.model.compiler_options

    @property
    def eos_token_id(self) -> tuple[int, ...]:
        """The guided model's EOS ids."""
        return self.model.eos_token_id

    @property
    def pad_token_id(self) -> int | None:
        """The guided model's pad id."""
        return self.model.pad_token_id

    @property
    def max_position_embeddings(self) -> int | None:
        """The guided model's context length."""
        return self.model.max_position_embeddings

    @property
    def config_fingerprint(self) -> str:
        """The guided model's fingerprint, with the negative prompt (its branch is in the cache)."""
        return fingerprint("cfg-batched", self.model.config_fingerprint, self.negative_key)

    def init_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty cache with both branches of every row: leaves `[batch, 2, ...]`."""
        return _rows_to_pairs(self.model.init_cache(2 * batch_size, max_len))

    def _mix(self, logits):
        return guide(logits[0::2], logits[1::2], self.guidance_scale, self.rescale)

    def __call__(
        self,
        token_ids: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        cache: KVCache,
        *,
        logits_to_keep: int = 0,
        prefix_length: Int[Array, " batch"] | None = None,
    ) -> tuple[Float[Array, "batch keep vocab"], KVCache]:
        """Feed the same new tokens to both branches (the unconditional one at its own positions)
        in one call of `2 * batch` rows; returns the guided scores and the cache."""
        del prefix_length  # guidance is causal
        uncond_next = jnp.max(cache.positions[:, 1, :], axis=-1) + 1  # [batch]
        valid = positions >= 0
        first = jnp.min(jnp.where(valid, positions, jnp.iinfo(jnp.int32).max), axis=-1)
        uncond_pos = jnp.where(valid, uncond_next[:, None] + positions - first[:, None], -1)
        ids = jnp.stack([token_ids, token_ids], axis=1).reshape(-1, token_ids.shape[1])
        pos = jnp.stack([positions, uncond_pos], axis=1).reshape(-1, positions.shape[1])
        logits, flat = self.model(ids, pos, _pairs_to_rows(cache), logits_to_keep=logits_to_keep)
        return self._mix(logits), _rows_to_pairs(flat)

    def prefill(
        self,
        token_ids: Int[Array, "batch seq"],
        positions: Int[Array, "batch seq"],
        *,
        max_len: int,
        logits_to_keep: int = 1,
        prefix_length: Int[Array, " batch"] | None = None,
    ) -> tuple[Float[Array, "batch keep vocab"], KVCache]:
        """Prefill both branches in one call: the prompts (left-padded) and, per row, the
        negative prompt or the prompt's last token at position 0. The cache gets `max_len` slots
        plus the extra padding the longer of the two branches needs.

        **Raises:** `ValueError` for `logits_to_keep != 1` or a `prefix_length` (guidance scores
        only the next token, causally).
        """
        if logits_to_keep != 1 or prefix_length is not None:
            raise ValueError(
                "classifier-free guidance scores the next token only, causally "
                "(no prompt_logprobs, no prefix_lm)"
            )
        batch, seq = token_ids.shape
        if self.negative_prompt_ids is None:
            width = seq
            u_ids = jnp.zeros_like(token_ids).at[:, -1].set(token_ids[:, -1])
            u_pos = jnp.full_like(positions, -1).at[:, -1].set(0)
            c_ids, c_pos = token_ids, positions
        else:
            n = self.negative_prompt_ids.shape[0]
            width = max(seq, n)
            c_ids = jnp.pad(token_ids, ((0, 0), (width - seq, 0)))
            c_pos = jnp.pad(positions, ((0, 0), (width - seq, 0)), constant_values=-1)
            neg = jnp.pad(self.negative_prompt_ids, (width - n, 0))
            neg_pos = jnp.pad(jnp.arange(n, dtype=jnp.int32), (width - n, 0), constant_values=-1)
            u_ids = jnp.broadcast_to(neg, (batch, width))
            u_pos = jnp.broadcast_to(neg_pos, (batch, width))
        ids = jnp.stack([c_ids, u_ids], axis=1).reshape(2 * batch, width)
        pos = jnp.stack([c_pos, u_pos], axis=1).reshape(2 * batch, width)
        logits, flat = self.model.prefill(ids, pos, max_len=max_len + width - seq, logits_to_keep=1)
        return self._mix(logits), _rows_to_pairs(flat)
