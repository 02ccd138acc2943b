"""Planning a call: everything `generate` and `stream` decide on the host before compiling.

    prompts (or a SequenceState) -> the state to run from (`as_state`)
      -> classifier-free guidance (a `GuidedModel`, or a processor put first)
      -> `resolve_settings`: the call's `GenerationOptions` -> `Settings` (the `Step`)
      -> `prepare`: pending tokens, rows, steps and capacities padded to buckets -> `Prepared`
      -> on a sharded model, the per-row inputs placed on its mesh

The `Plan` (static shapes and modes) and the `Prepared` arrays are the compiled program's inputs
(`functional_gen.generation.program`).
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int, Key, PRNGKeyArray

from ..models.base import AbstractCausalLM
from ..models.kv_cache import resolve_kv_cache_dtype
from ..processors.classifier_free_guidance import ClassifierFreeGuidance
from ..sharding import mesh_of, place_rows, replicate, to_host
from ..tokenization import encode_prompt, is_chat, normalize_prompts
from .buckets import MIN_BUCKET, bucket_batch, bucket_length, grow_capacity
from .guidance import CFG_MODES, GuidedModel
from .options import GenerationOptions, with_overrides
from .samplers import AbstractSampler
from .search import AbstractSearch
from .sequence_state import ModelMismatchError, SequenceArrays, SequenceState
from .settings import Settings, check_prng_key, check_token_id_option, resolve_settings
from .speculative import Speculative
from .step import Step


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static shapes and modes of one compiled call (hashable)."""

    cache_len: int  # slots of the cache after growing
    token_len: int  # columns of token_ids after growing
    steps: int  # logprob columns (bucketed max_new_tokens)
    fresh: bool  # no cache yet: one-pass prefill into a new cache
    prefill_mode: str
    prefix_lm: bool
    carry: bool  # keep the processor (and stop-string) states
    repeat: int  # rows repeated after the prefill (num_return_sequences, or the beams)
    num_beams: int  # 0 unless beam search
    num_stops: int
    prompt_logprobs: bool


def rows_of_step(step: Step, prompts: int, fork: int, padded: int, finals: int) -> Step:
    """The step with every per-row processor value laid out like the loop's rows.

    A per-row value (see `per_row_field`) has one entry per prompt (`prompts`) or per returned
    row (`finals = prompts * num_return_sequences`); the loop has `padded * fork` rows (the
    prompts padded to a batch bucket, each forked `fork` times). Padding rows take row 0's.

    **Raises:** `ValueError` naming a per-row value of another length.
    """
    loop_rows = padded * fork
    prompt_of = np.minimum(np.arange(loop_rows) // fork, prompts - 1)
    prompt_of = np.where(np.arange(loop_rows) // fork < prompts, prompt_of, 0)
    per_final = finals // prompts if prompts else 1
    final_of = np.where(
        (np.arange(loop_rows) // fork < prompts) & (np.arange(loop_rows) % fork < per_final),
        (np.arange(loop_rows) // fork) * per_final + np.arange(loop_rows) % fork,
        0,
    )
    new = []
    for p in step.processors:
        for f in dataclasses.fields(p):
            value = getattr(p, f.name, None)
            row_ndim = f.metadata.get("row_ndim", 0)
            if not f.metadata.get("per_row") or getattr(value, "ndim", 0) <= row_ndim:
                continue
            n = value.shape[0]
            if n == prompts:
                value = value[jnp.asarray(prompt_of)]
            elif n == finals:
                value = value[jnp.asarray(final_of)]
            else:
                raise ValueError(
                    f"{type(p).__name__}.{f.name} has {n} per-row values for {prompts} prompts "
                    f"({finals} returned rows); pass a scalar or one value per prompt or per row"
                )
            p = eqx.tree_at(lambda m, name=f.name: getattr(m, name), p, value)
        new.append(p)
    return eqx.tree_at(lambda s: s.processors, step, tuple(new))


@dataclasses.dataclass
class Prepared:
    """The inputs of a call's compiled program (`functional_gen.generation.program`), padded to
    buckets, and what the result needs to undo the padding (`rows`, `prefill_tokens`)."""

    step: Step  # the settings' step, per-row processor values laid out like the loop's rows
    step_rows: int  # rows of the loop (padded, forked)
    plan: Plan
    arrays: SequenceArrays
    new_ids: Int[Array, "batch seq"]
    new_pos: Int[Array, "batch seq"]
    padding_rows: Bool[Array, " batch"]
    # `rows`: the loop's rows after the fork, batch * num_return_sequences
    budget: Int[Array, " rows"]
    keys: Key[Array, " rows"]
    rows: int  # real rows of the result (after repeat)
    prefill_tokens: list[int]


def prepare(
    seq: SequenceState,
    settings: Settings,
    key: PRNGKeyArray | None,
    *,
    bucket: bool,
    bucket_prompt: bool = True,
) -> Prepared:
    """Pad rows, pending tokens, steps and capacities to buckets; build the prefill inputs.

    **Arguments:** `seq`: the state to run from; `settings`: the resolved call; `key`: the call's
    PRNG key (`None`: the rows' own keys); `bucket=False` keeps the batch and `max_new_tokens`
    exact, `bucket_prompt=False` the pending length.

    **Raises:** `ValueError` for stop strings under beam search, or more returned sequences
    than beams.
    """
    a = seq.arrays
    if not settings.carry_processor_states:
        # A call with its own processors starts them (and the stop-string matchers) anew, so the
        # old states are no input of the program. Leaving them out gives one argument structure
        # whether the state still holds them or not (a loaded, appended or cropped state): no
        # recompilation between such continuations.
        a = eqx.tree_at(
            lambda x: (x.processor_states, x.stop_state),
            a,
            (None, None),
            is_leaf=lambda x: x is None,
        )
    rows = seq.batch_size
    num_beams = settings.step.search.num_beams
    n_return = num_beams or settings.num_return_sequences  # rows per prompt in the loop
    returned = settings.num_return_sequences  # rows per prompt in the result
    if num_beams and settings.stop_strings:
        raise ValueError(
            "stop strings are not supported with beam search yet; use eos_token_id, or "
            "stop_strings with Greedy()/Multinomial()"
        )
    if num_beams and returned > num_beams:
        raise ValueError(
            f"num_return_sequences={returned} is more than num_beams={num_beams}: beam search "
            "returns at most num_beams hypotheses per prompt"
        )
    fresh = a.cache is None
    ids, length, cached = (np.asarray(x) for x in to_host((a.token_ids, a.length, a.cached)))
    pending = length - cached
    most = int(pending.max())
    # a continuation's new tokens (a chat turn, an appended text) share buckets from 32 up
    minimum = MIN_BUCKET if fresh else 2 * MIN_BUCKET
    width = 0 if most == 0 else (bucket_length(most, minimum) if bucket_prompt else most)
    new_ids = np.full((rows, width), settings.pad_token_id, np.int32)
    new_pos = np.full((rows, width), -1, np.int32)
    for i in range(rows):
        p, c = int(pending[i]), int(cached[i])
        if p:
            new_ids[i, width - p :] = ids[i, c : c + p]
            new_pos[i, width - p :] = np.arange(c, c + p)
    steps = bucket_length(settings.max_new_tokens) if bucket else settings.max_new_tokens
    padded_rows = bucket_batch(rows) if bucket else rows
    if padded_rows != rows:
        extra = padded_rows - rows
        idx = np.concatenate([np.arange(rows), np.zeros(extra, np.int64)])
        a = jax.tree.map(lambda x: x[jnp.asarray(idx)], a)
        new_ids = np.concatenate([new_ids, np.repeat(new_ids[:1], extra, 0)])
        new_pos = np.concatenate([new_pos, np.repeat(new_pos[:1], extra, 0)])
    padding_rows = np.arange(padded_rows) >= rows
    # The keys of the rows after the fork: fold_in(key, r) for row r (as if each returned
    # sequence were its own prompt), else the state's own keys, copy j > 0 folded with j.
    if key is not None:
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(padded_rows * n_return))
    elif n_return > 1:
        copy = jnp.tile(jnp.arange(n_return), padded_rows)
        keys = jax.vmap(lambda k, j: jnp.where(j > 0, jax.random.fold_in(k, j), k))(
            jnp.repeat(a.key, n_return), copy
        )
    else:
        keys = a.key
    longest = int(length.max())
    if not bucket:
        token_len = max(int(ids.shape[1]), longest + steps)
    elif fresh:
        token_len = max(int(ids.shape[1]), bucket_length(longest + steps))
    else:
        token_len = grow_capacity(int(ids.shape[1]), longest + steps)
    if fresh:
        cache_len = width + steps
        write_index = 0
    else:
        write_index = int(to_host(a.cache.length)[0])
        needed = write_index + width + steps
        cache_len = (
            grow_capacity(a.cache.max_len, needed) if bucket else max(a.cache.max_len, needed)
        )
    step = settings.step
    if isinstance(step.search, Speculative):
        # verification writes k + 1 slots past the text; the proposer's carry is sized by it
        cache_len += step.search.cache_slots
        step = eqx.tree_at(lambda s: s.search, step, step.search.sized(token_len, step.model))
    plan = Plan(
        cache_len=cache_len,
        token_len=token_len,
        steps=steps,
        fresh=fresh,
        prefill_mode=settings.prefill_mode,
        prefix_lm=settings.prefix_lm,
        carry=settings.carry_processor_states,
        repeat=n_return,
        num_stops=len(settings.stop_strings),
        prompt_logprobs=settings.prompt_logprobs,
        num_beams=num_beams,
    )
    budget = np.full((padded_rows * n_return,), settings.max_new_tokens, np.int32)
    return Prepared(
        step=rows_of_step(step, rows, n_return, padded_rows, rows * returned),
        step_rows=padded_rows * n_return,
        plan=plan,
        arrays=a,
        new_ids=jnp.asarray(new_ids),
        new_pos=jnp.asarray(new_pos),
        budget=jnp.asarray(budget),
        padding_rows=jnp.asarray(padding_rows),
        keys=keys,
        rows=rows * returned,
        prefill_tokens=[int(p) for p in pending for _ in range(returned)],
    )


def as_state(
    model: AbstractCausalLM, tokenizer, prompts, *, chat_template, key
) -> tuple[SequenceState, bool]:
    """The `SequenceState` to run from: a given one (checked against the model), or a fresh one
    for prompts. Returns `(state, is_continuation)`."""
    if isinstance(prompts, SequenceState):
        state = prompts
        if (
            state.model_fingerprint is not None
            and state.model_fingerprint != model.config_fingerprint
        ):
            raise ModelMismatchError(
                "this SequenceState was made by another model (config fingerprint "
                f"{state.model_fingerprint}, this model's is {model.config_fingerprint}); a KV "
                "cache only continues with the model that wrote it"
            )
        if state.arrays.logits.shape[-1] != model.vocab_size:
            raise ModelMismatchError(
                f"this SequenceState has logits over {state.arrays.logits.shape[-1]} tokens, the "
                f"model's vocabulary has {model.vocab_size}"
            )
        state = state.continued_with(tokenizer)  # refuses another tokenizer, adopts a first one
        return state, True
    prompts = normalize_prompts(prompts)
    ids = [encode_prompt(tokenizer, p, chat_template=chat_template) for p in prompts]
    return SequenceState.from_token_ids(
        ids, vocab_size=model.vocab_size, key=key, tokenizer=tokenizer
    ), False


def plan_call(
    model: AbstractCausalLM,
    tokenizer,
    prompts,
    options: GenerationOptions | None = None,
    *,
    processors: Sequence[Any] | None = None,
    sampler: AbstractSampler | AbstractSearch | None = None,
    key: Key[Array, ""] | None = None,
    bucket: bool = True,
    **overrides: Any,
) -> tuple[AbstractCausalLM, Settings, Prepared]:
    """Everything `generate` and `stream` do before compiling: the model to run (wrapped in a
    `GuidedModel` for batched classifier-free guidance), the resolved `Settings`, and the
    padded inputs of the compiled program.

    **Arguments:** as `generate` (`overrides` are `GenerationOptions` fields, which win over
    `options`); `bucket=False` keeps exact shapes.

    **Raises:** as `generate`.
    """
    options = with_overrides(options, overrides)
    check_prng_key(key)
    if isinstance(model, AbstractCausalLM):  # (else resolve_settings names the wrong model)
        check_token_id_option("eos_token_id", options.eos_token_id, model.vocab_size)
        check_token_id_option("pad_token_id", options.pad_token_id, model.vocab_size)
        model = in_cache_dtype(model, options.kv_cache_dtype, prompts)
    else:
        resolve_kv_cache_dtype(options.kv_cache_dtype)
    rows = prompts.batch_size if isinstance(prompts, SequenceState) else None
    model, first = _guidance(model, tokenizer, options, rows or len(normalize_prompts(prompts)))
    batched_guidance = options.guidance_scale is not None and options.cfg == "batched"
    if batched_guidance and (options.prefix_lm or options.prompt_logprobs):
        raise ValueError(
            "batched classifier-free guidance scores the next token only, causally: no "
            "prefix_lm, no prompt_logprobs (use cfg='processor')"
        )
    state, continuing = as_state(
        model, tokenizer, prompts, chat_template=options.chat_template, key=key
    )
    if options.prefix_lm and state.arrays.cache is not None:
        raise ValueError(
            "prefix_lm=True applies to a prompt that is not cached yet; the new tokens of a "
            "continued SequenceState are causal"
        )
    longest = int(np.max(to_host(state.arrays.length)))
    settings = resolve_settings(
        model,
        tokenizer if tokenizer is not None else state.tokenizer,
        longest,
        options,
        processors=processors,
        sampler=sampler,
        key=key if key is not None or not continuing else state.arrays.key,
        previous=state.settings if continuing else None,
        first_processors=first,
    )
    prepared = _on_mesh(prepare(state, settings, key, bucket=bucket), model)
    return model, settings, prepared


def in_cache_dtype(model: AbstractCausalLM, requested: Any, prompts: Any) -> AbstractCausalLM:
    """The model of a call whose option `kv_cache_dtype` is `requested`: every cache the call
    makes (prefill, guidance, drafts) comes from it.

    `None` keeps the model's own dtype, except for a continued `SequenceState` that holds a
    cache: its dtype then (the continuation computes what an uninterrupted run would). A
    requested dtype other than such a cache's is refused rather than converted silently (a
    float32 cache rounded to bfloat16 changes every later token); `state.with_kv_cache_dtype`
    converts explicitly.

    **Raises:** `ValueError` for an unsupported `requested` value, a requested dtype other than
    the continued cache's, or a model that cannot make caches of it (see
    `AbstractCausalLM.with_kv_cache_dtype`).
    """
    cache = prompts.arrays.cache if isinstance(prompts, SequenceState) else None
    held = None if cache is None else cache.k[0].dtype.name if cache.k else None
    if requested is None:
        return model if held is None else model.with_kv_cache_dtype(held)
    name = resolve_kv_cache_dtype(requested)
    if held is not None and name != held:
        raise ValueError(
            f"kv_cache_dtype={requested!r} asks for a {name} cache, but the SequenceState "
            f"continued holds a {held} one; leave kv_cache_dtype unset to continue in {held}, "
            f"or convert the state first: state.with_kv_cache_dtype({name!r})"
        )
    return model.with_kv_cache_dtype(name)


def _on_mesh(prepared: Prepared, model) -> Prepared:
    """On a sharded model (`fg.shard`), put the per-row inputs on its mesh, split over `"data"`,
    and replicate the processors and the sampler; GSPMD partitions the compiled loop."""
    mesh = mesh_of(model)
    if mesh is None:
        return prepared
    step = prepared.step
    rest = replicate(eqx.tree_at(lambda s: s.model, step, None, is_leaf=lambda x: x is None), mesh)
    step = eqx.tree_at(lambda s: s.model, rest, step.model, is_leaf=lambda x: x is None)
    placed = place_rows(
        (
            prepared.arrays,
            prepared.new_ids,
            prepared.new_pos,
            prepared.budget,
            prepared.padding_rows,
            prepared.keys,
        ),
        mesh,
    )
    arrays, new_ids, new_pos, budget, padding_rows, keys = placed
    return dataclasses.replace(
        prepared,
        step=step,
        arrays=arrays,
        new_ids=new_ids,
        new_pos=new_pos,
        budget=budget,
        padding_rows=padding_rows,
        keys=keys,
    )


def _guidance(model, tokenizer, options: GenerationOptions, prompts: int):
    """Classifier-free guidance of the options for `prompts` prompts: `(model, processors to put
    first)`.

    **Raises:** `ValueError` for an unknown `cfg`, guidance options without `guidance_scale`, an
    empty `negative_prompt` or one with another number of rows than the prompts.
    """
    scale, negative_prompt, rescale, cfg = (
        options.guidance_scale,
        options.negative_prompt,
        options.guidance_rescale,
        options.cfg,
    )
    if cfg not in CFG_MODES:
        raise ValueError(f"`cfg` must be one of {CFG_MODES}, got {cfg!r}")
    if scale is None:
        if negative_prompt is not None or rescale is not None:
            raise ValueError("negative_prompt and guidance_rescale need a guidance_scale")
        return model, ()
    per_row = (
        isinstance(negative_prompt, (list, tuple))
        and not is_chat(negative_prompt)
        and not all(isinstance(t, (int, np.integer)) for t in negative_prompt)
    )
    if negative_prompt is None:
        ids = None
    elif isinstance(negative_prompt, (str, list, tuple)) and len(negative_prompt) == 0:
        raise ValueError(
            "`negative_prompt` is empty; pass None for the default (each row's last prompt token)"
        )
    elif per_row:  # one negative prompt per prompt: text, a chat, or token ids each
        if len(negative_prompt) != prompts:
            raise ValueError(
                f"`negative_prompt` has {len(negative_prompt)} rows for {prompts} prompts; pass "
                "one negative prompt for all, or one per prompt"
            )
        if cfg == "batched":
            raise ValueError(
                "batched guidance shares one `negative_prompt` across the rows; use "
                "cfg='processor' for one per prompt"
            )
        ids = [_negative_ids(tokenizer, p, options) for p in negative_prompt]
    else:
        ids = _negative_ids(tokenizer, negative_prompt, options)
    if cfg == "batched":
        if options.prefill_mode == "forced":
            raise ValueError("batched guidance prefills both branches in one pass; use one_pass")
        return GuidedModel(model, scale, ids, rescale), ()
    return model, (ClassifierFreeGuidance(model, scale, ids, rescale),)


def _negative_ids(tokenizer, negative_prompt, options: GenerationOptions) -> list[int]:
    """One negative prompt's token ids (given as ids, or text / a chat, tokenized like the
    prompts).

    **Raises:** `ValueError` for text without a tokenizer, or one that is empty.
    """
    if isinstance(negative_prompt, (list, tuple)) and all(
        isinstance(t, (int, np.integer)) for t in negative_prompt
    ):
        ids = [int(t) for t in negative_prompt]
    else:
        if tokenizer is None:
            raise ValueError("a text negative_prompt needs the tokenizer")
        ids = encode_prompt(tokenizer, negative_prompt, chat_template=options.chat_template)
    if not ids:
        raise ValueError(f"`negative_prompt` {negative_prompt!r} has no tokens")
    return ids
