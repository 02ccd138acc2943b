"""`ClassifierFreeGuidance`: contrast the prompt's next-token distribution with an unconditional
(or negative-prompt) one, computed by a second forward pass whose `KVCache` lives in the state.

Sanchez et al. 2023, "Stay on topic with Classifier-Free Guidance" (arXiv 2306.17806); reference
implementation: transformers' `UnbatchedClassifierFreeGuidanceLogitsProcessor`, which
`generate(guidance_scale=s, negative_prompt_ids=...)` puts first in its processor list.
"""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from ..models.base import AbstractCausalLM
from ..models.kv_cache import KVCache
from ._validation import float_param
from .base import AbstractGrowingStateProcessor, Context, as_processors, per_row_field


class ClassifierFreeGuidanceState(eqx.Module):
    """The unconditional branch of ONE row (the generation loop adds the batch axis by `vmap`).

    **Attributes:**

    - `cache`: the unconditional branch's `KVCache` with a batch of 1: every unconditional token
      fed so far except `pending_token_id`.
    - `pending_token_id`: `Int[Array, ""]`, the token the first `process` feeds (the negative
      prompt's last token, or the prompt's last token without a negative prompt); later steps
      feed the token that was actually appended (`Context.last_token_id`).
    - `position`: `Int[Array, ""]`, the RoPE position of the next token fed to the branch.
    - `started`: `Bool[Array, ""]`, whether `process` has run (then `pending_token_id` is spent).
    """

    cache: KVCache
    pending_token_id: Int[Array, ""]
    position: Int[Array, ""]
    started: Bool[Array, ""]


def _negative_prompt_param(value, vocab_size: int | None):
    """A negative prompt as an int32 array: `[n]` (one for every row) or `[batch, n]` (one per
    row, left-padded with -1; a given array may carry -1 left padding in either form). **Raises:** `ValueError` for empty prompts, ids outside the
    vocabulary, or padding that is not on the left."""
    if value is None:
        return None
    if isinstance(value, jax.core.Tracer):
        return jnp.asarray(value, jnp.int32)
    name = "negative_prompt_ids"
    if isinstance(value, (np.ndarray, jax.Array)):
        array = np.asarray(value)
        if array.ndim not in (1, 2) or (array.size and array.dtype.kind not in "iu"):
            raise ValueError(
                f"`{name}` must be token ids: one list for every row, or one list per row "
                f"([batch, n], left-padded with -1); got an array of shape {array.shape} and "
                f"dtype {array.dtype}"
            )
        rows = None if array.ndim == 1 else [list(r) for r in array.tolist()]
        flat = array.tolist() if array.ndim == 1 else None
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if len(value) and all(isinstance(v, (Sequence, np.ndarray, jax.Array)) for v in value):
            rows = [list(np.asarray(r).tolist()) for r in value]
            flat = None
        else:
            rows, flat = None, list(value)
    else:
        raise TypeError(
            f"`{name}` must be token ids (a list of ints, or one list per row), got "
            f"{type(value).__name__}: {value!r}; tokenize a text negative prompt first"
        )

    def check_ids(ids, where, allow_padding):
        if any(
            isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) for t in ids
        ):
            raise ValueError(f"`{name}`{where} must hold integer token ids, got {ids!r}")
        real = [t for t in ids if not (allow_padding and t == -1)]
        if not real:
            raise ValueError(
                f"`{name}`{where} is empty: a negative prompt needs at least one token (pass "
                "negative_prompt_ids=None to use transformers' default, the prompt's last token)"
            )
        if vocab_size is not None:
            bad = [t for t in real if not 0 <= t < vocab_size]
        else:
            bad = [t for t in real if t < 0]
        if bad:
            raise ValueError(
                f"`{name}`{where} holds token ids outside the vocabulary [0, {vocab_size}): "
                f"{bad[:8]}"
            )
        if allow_padding:
            first = next(i for i, t in enumerate(ids) if t != -1)
            if -1 in ids[first:]:
                raise ValueError(
                    f"`{name}`{where} has padding (-1) after its first token: left-pad per-row "
                    f"negative prompts with -1, got {ids!r}"
                )

    if flat is not None:
        check_ids(flat, "", allow_padding=True)
        return jnp.asarray(np.asarray(flat, np.int32))
    if not rows:
        raise ValueError(f"`{name}` is empty: pass one list of token ids, or one list per row")
    for i, ids in enumerate(rows):
        check_ids(ids, f" row {i}", allow_padding=True)
    width = max(len(ids) for ids in rows)
    padded = np.full((len(rows), width), -1, np.int32)
    for i, ids in enumerate(rows):
        padded[i, width - len(ids) :] = ids  # left-padded: the last column is always a token
    return jnp.asarray(padded)


class ClassifierFreeGuidance(AbstractGrowingStateProcessor):
    """Classifier-free guidance (CFG) for language models, the two-forward-pass form.

    Each step mixes the conditional next-token log-probabilities (the logits this processor
    receives, i.e. the model given the prompt) with unconditional ones that this processor
    computes itself by running `model` on a second sequence: the negative prompt followed by the
    generated tokens (or, without a negative prompt, the prompt's last token followed by them):

        cond   = log_softmax(logits)
        uncond = log_softmax(model(negative prompt + generated so far))
        cfg    = guidance_scale * (cond - uncond) + uncond

    `guidance_scale == 1` returns `cond` (the log-softmaxed logits) exactly; `s > 1` pushes the
    text towards the prompt (away from the negative prompt); `0 <= s < 1` towards the negative
    prompt (`s = 0` decodes from the unconditional branch alone, so a negative prompt acts as a
    positive one, as transformers documents); any finite real is accepted, negatives included.

    With `rescale = r` (in [0, 1]) the guided distribution is blended back with the conditional
    one in log space and renormalised, as in the first implementation of the transformers issue
    "Add Classifier-Free Guidance sampling" (its `rescale_factor`, 0.7 there):

        out = log_softmax(r * log_softmax(cfg) + (1 - r) * cond)

    so `r = 1` is plain (renormalised) CFG and `r = 0` is no guidance. `rescale=None` (default)
    returns `cfg` as transformers does (not renormalised; samplers and later processors do not
    need it normalised).

    The unconditional branch keeps its own `KVCache` in this processor's state
    (`ClassifierFreeGuidanceState`): `init` prefills all of it but its last token in one call,
    and every `process` runs `model` on one token — the pending last token at the first step,
    then the token that was actually appended (`Context.last_token_id`). Positions are 0-based
    from the start of the negative prompt (or of the prompt's last token), as in transformers.
    The cache has `n - 1 + max_len` slots (`n` = the padded negative prompt length, 1 without
    one; `max_len` = `Context.token_ids.shape[0]`), a static size. Processors are vmapped per
    row, so `model` is called with a batch of 1 inside `init`/`process`.

    CFG must be the first processor (it needs the raw conditional logits; transformers puts it
    first): `check_guidance_first` enforces that for a chain. Each step costs one more decode
    call of `model` per row (about 2x plain decoding).

    Source: Sanchez et al. 2023, arXiv 2306.17806; transformers'
    `UnbatchedClassifierFreeGuidanceLogitsProcessor` (same formula and defaults).

    **Attributes:**

    - `model`: the model of the unconditional branch (normally the generating model itself),
      called as `model.prefill(token_ids, positions, *, max_len, logits_to_keep=1)` and
      `model(token_ids, positions, cache, *, logits_to_keep=0)`.
    - `guidance_scale`: `Float[Array, "*rows"]`, a finite float or one per row.
    - `negative_prompt_ids`: `None` (the prompt's last token is the unconditional input), token
      ids shared by every row (`Int[Array, " n"]`, from a list of ints), or one negative prompt
      per row (`Int[Array, "batch n"]`, from a list of lists of any lengths or a 2-D array
      left-padded with -1). -1 marks padding (transformers' `negative_prompt_attention_mask`
      zeros): it must come before the tokens, gets position -1 and is never attended to.
    - `rescale`: `None` or `Float[Array, "*rows"]` in [0, 1] (one value, or one per row).

    **Raises:** `ValueError` (at construction, before any compilation) for a non-finite
    `guidance_scale`, a `rescale` outside [0, 1], an empty negative prompt, negative-prompt ids
    outside `[0, model.config.vocab_size)` or padding that is not on the left; `TypeError` for a
    `model` without `prefill`/`init_cache`, or a `negative_prompt_ids` that is not token ids
    (e.g. a text: tokenize it first).
    """

    model: AbstractCausalLM
    guidance_scale: Float[Array, "*rows"] = per_row_field()
    negative_prompt_ids: Int[Array, "*rows n"] | None = per_row_field(row_ndim=1)
    rescale: Float[Array, "*rows"] | None = per_row_field()

    def __init__(self, model, guidance_scale, negative_prompt_ids=None, rescale=None):
        if not isinstance(model, AbstractCausalLM):
            raise TypeError(
                "`model` must implement functional_gen.models.AbstractCausalLM (e.g. "
                f"functional_gen.models.LlamaForCausalLM), got {type(model).__name__}"
            )
        vocab_size = model.vocab_size
        self.model = model
        self.guidance_scale = float_param("guidance_scale", guidance_scale)
        self.negative_prompt_ids = _negative_prompt_param(negative_prompt_ids, vocab_size)
        self.rescale = (
            None if rescale is None else float_param("rescale", rescale, low=0.0, high=1.0)
        )

    def init(self, context: Context) -> ClassifierFreeGuidanceState:
        """Prefill the unconditional branch of one row (all of it but its last token).

        **Returns:** a `ClassifierFreeGuidanceState` of final shapes (cache batch 1).
        """
        max_len = context.token_ids.shape[0]
        neg = self.negative_prompt_ids
        if neg is None:
            # transformers' default: the unconditional input is the prompt's last token.
            cache = self.model.init_cache(1, _slots(self, max_len))
            pending, position = context.last_token_id, jnp.int32(0)
        else:
            n = neg.shape[-1]
            is_token = neg >= 0
            positions = jnp.where(is_token, jnp.cumsum(is_token) - 1, -1).astype(jnp.int32)
            if n > 1:
                _, cache = self.model.prefill(
                    jnp.maximum(neg[None, :-1], 0),
                    positions[None, :-1],
                    max_len=_slots(self, max_len),
                    logits_to_keep=1,
                )
            else:
                cache = self.model.init_cache(1, _slots(self, max_len))
            pending, position = neg[-1], positions[-1]
        return ClassifierFreeGuidanceState(
            cache=cache,
            pending_token_id=jnp.asarray(pending, jnp.int32),
            position=jnp.asarray(position, jnp.int32),
            started=jnp.asarray(False),
        )

    def process(
        self, state: ClassifierFreeGuidanceState, logits: Float[Array, " vocab"], context: Context
    ) -> tuple[ClassifierFreeGuidanceState, Float[Array, " vocab"]]:
        """Run the unconditional branch on one token and mix (see the class docstring).

        **Arguments:** `state`; `logits`: `Float[Array, " vocab"]`, the conditional logits of one
        row; `context`: the row (its `last_token_id` is fed after the first step).

        **Returns:** `(state, logprobs)`: the state with one more token in its cache, and the
        guided scores `Float[Array, " vocab"]` (natural-log units).
        """
        token = jnp.where(state.started, context.last_token_id, state.pending_token_id)
        uncond_logits, cache = self.model(
            token.reshape(1, 1), state.position.reshape(1, 1), state.cache, logits_to_keep=1
        )
        cond = jax.nn.log_softmax(logits.astype(jnp.float32))
        uncond = jax.nn.log_softmax(uncond_logits[0, -1].astype(jnp.float32))
        scale = self.guidance_scale
        guided = scale * (cond - uncond) + uncond
        if self.rescale is not None:
            r = self.rescale
            guided = jax.nn.log_softmax(r * jax.nn.log_softmax(guided) + (1 - r) * cond)
        guided = jnp.where(scale == 1, cond, guided)
        state = ClassifierFreeGuidanceState(
            cache=cache,
            pending_token_id=state.pending_token_id,
            position=state.position + 1,
            started=jnp.asarray(True),
        )
        return state, guided

    def extend_state(
        self, state: ClassifierFreeGuidanceState, max_len: int
    ) -> ClassifierFreeGuidanceState:
        """The state of one row with room for a longer sequence (continuing a generation).

        **Arguments:** `state` (one row, unbatched: vmap it over rows); `max_len`: the new static
        length of `Context.token_ids`.

        **Returns:** the same state with its cache grown to the size `init` gives for `max_len`
        (new slots empty).

        **Raises:** `ValueError` if that is smaller than the cache already is.
        """
        return eqx.tree_at(lambda s: s.cache, state, state.cache.extend(_slots(self, max_len)))


def _slots(processor: "ClassifierFreeGuidance", max_len: int) -> int:
    n = 1 if processor.negative_prompt_ids is None else processor.negative_prompt_ids.shape[-1]
    return n - 1 + max_len


def check_guidance_first(processors: Sequence[Any]) -> None:
    """Check that a `ClassifierFreeGuidance` in a processor chain comes first, and only once.

    CFG mixes the model's raw conditional distribution with the unconditional one; a processor
    before it (a temperature, a filter, a constraint mask) would be applied to one branch only,
    which is not classifier-free guidance. transformers puts it first for the same reason.

    **Arguments:** `processors`: a processor list (bare callables allowed, as in `generate`).

    **Raises:** `ValueError` naming the positions and the processor before it.
    """
    chain = as_processors(processors)
    where = [i for i, p in enumerate(chain) if isinstance(p, ClassifierFreeGuidance)]
    if len(where) > 1:
        raise ValueError(
            f"the processor chain has {len(where)} ClassifierFreeGuidance processors (at "
            f"positions {where}); use one, first in the chain"
        )
    if where and where[0] != 0:
        raise ValueError(
            f"ClassifierFreeGuidance must be the first processor (it mixes the model's raw "
            f"conditional logits with the unconditional ones), but it is at position {where[0]}, "
            f"after {', '.join(type(p).__name__ for p in chain[: where[0]])}; move it to the front"
        )
