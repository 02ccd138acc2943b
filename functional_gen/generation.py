"""`generate`: prefill the prompts, then run the step in one jitted `lax.while_loop`.

Data flow:

    prompts --tokenizer--> token ids, left-padded to a length bucket
      -> init_state: prefill, ONE model call over the whole prompt writes the KVCache
      -> step (see `functional_gen.step`), repeated inside jax.lax.while_loop
         until every row has finished (EOS or max_new_tokens)
      -> GenerationResult: texts, token_ids, logprobs, finish_reasons

Shapes decide compilation: the batch size, the padded prompt length and `max_new_tokens`.
Prompt lengths are padded up to buckets (`bucket_length`), so a new prompt of a similar length
reuses the compiled program.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .processors.base import Context, as_processors, init_states, vmap_rows
from .samplers import AbstractSampler
from .state import FINISH_REASONS, RUNNING, GenerationState
from .step import Step, make_step
from .stop_strings import StopStrings, truncate_at_stop
from .tokenization import Prompt, decode, encode_prompt, normalize_prompts

_MIN_BUCKET = 16
_INIT_KEY_SALT = 0x7FFFFFFF  # processors' init gets fold_in(row_key, salt); steps use 0, 1, ...


def bucket_length(n: int) -> int:
    """The padded length for a prompt of `n` tokens: the next of 16, 24, 32, 48, 64, 96, 128,
    192, 256, 384, 512, ... (powers of two and 1.5 times powers of two): at most a third of the
    padded prompt is padding, and lengths between two buckets share one compiled program."""
    bucket = _MIN_BUCKET
    while bucket < n:
        half_step = bucket // 2
        bucket = bucket + half_step if (bucket & (bucket - 1)) == 0 else bucket + bucket // 3
    return bucket


@dataclasses.dataclass
class GenerationResult:
    """What `generate` returns.

    **Attributes:**

    - `texts`: per row, the generated text only: no prompt, no EOS, no special tokens.
    - `token_ids`: `Int[Array, "batch max_new_tokens"]`, the generated tokens (the EOS token
      included when a row ended on one), `pad_token_id` after a row's end.
    - `logprobs`: `Float[Array, "batch max_new_tokens"]`, natural-log probability of each chosen
      token under the processed distribution it was drawn from; 0 after a row's end.
    - `finish_reasons`: per row, `"eos"`, `"stop_string"`, `"length"` or `"constraint"` (see
      `functional_gen.state.FINISH_REASONS`).
    - `num_tokens`: per row, how many tokens were generated (EOS included).
    - `state`: the final `GenerationState` (cache, processor states, keys), for inspection.
    """

    texts: list[str]
    token_ids: Int[Array, "batch max_new_tokens"]
    logprobs: Float[Array, "batch max_new_tokens"]
    finish_reasons: list[str]
    num_tokens: list[int]
    state: GenerationState


def _prefill(
    model,
    processors,
    prompt_ids: Int[Array, "batch padded"],
    token_ids: Int[Array, "batch max_len"],
    prompt_length: Int[Array, " batch"],
    keys: PRNGKeyArray,
    max_new_tokens: int,
    num_stop_strings: int = 0,
) -> GenerationState:
    batch, padded = prompt_ids.shape
    pad = padded - prompt_length
    positions = jnp.arange(padded)[None, :] - pad[:, None]
    positions = jnp.where(positions >= 0, positions, -1)
    logits, cache = model.prefill(
        prompt_ids, positions, max_len=padded + max_new_tokens, logits_to_keep=1
    )
    init_keys = jax.vmap(lambda k: jax.random.fold_in(k, _INIT_KEY_SALT))(keys)
    contexts = Context(
        token_ids=token_ids,
        length=prompt_length,
        prompt_length=prompt_length,
        max_new_tokens=jnp.full((batch,), max_new_tokens, jnp.int32),
        key=init_keys,
    )
    processor_states = vmap_rows(init_states, processors, batch)(contexts)
    return GenerationState(
        token_ids=token_ids,
        length=prompt_length,
        prompt_length=prompt_length,
        done=jnp.zeros((batch,), bool),
        finish_reason=jnp.full((batch,), RUNNING, jnp.int32),
        logits=logits[:, -1, :],
        logprobs=jnp.zeros((batch, max_new_tokens), jnp.float32),
        cache=cache,
        processor_states=processor_states,
        stop_state=jnp.zeros((batch, num_stop_strings), jnp.int32),
        key=keys,
    )


_prefill_jit = eqx.filter_jit(_prefill)


def _num_stops(step: Step) -> int:
    return 0 if step.stop_strings is None else len(step.stop_strings.stop_strings)


@eqx.filter_jit
def _generate_loop(step: Step, prompt_ids, token_ids, prompt_length, keys, max_new_tokens: int):
    state = _prefill(
        step.model,
        step.processors,
        prompt_ids,
        token_ids,
        prompt_length,
        keys,
        max_new_tokens,
        _num_stops(step),
    )
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), lambda s: step(s), state)


def _prepare(
    model,
    prompt_token_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    key: PRNGKeyArray | None,
    pad_token_id: int,
    bucket: bool,
):
    """Host-side padding of the prompts; checks lengths against the model."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"`max_new_tokens` must be a positive integer, got {max_new_tokens!r}")
    rows = [list(map(int, ids)) for ids in prompt_token_ids]
    if not rows:
        raise ValueError("no prompts given")
    for i, ids in enumerate(rows):
        if not ids:
            raise ValueError(f"prompt {i} has no tokens")
    lengths = [len(ids) for ids in rows]
    longest = max(lengths)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if limit is not None and longest + max_new_tokens > limit:
        raise ValueError(
            f"prompt of {longest} tokens plus max_new_tokens={max_new_tokens} is longer than the "
            f"model's context (max_position_embeddings={limit}); shorten the prompt or lower "
            "max_new_tokens"
        )
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is not None:
        bad = [t for ids in rows for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids out of range [0, {vocab}): {bad[:8]}")
    padded = bucket_length(longest) if bucket else longest
    batch = len(rows)
    prompt_ids = np.full((batch, padded), pad_token_id, np.int32)
    token_ids = np.full((batch, padded + max_new_tokens), pad_token_id, np.int32)
    for i, ids in enumerate(rows):
        prompt_ids[i, padded - len(ids) :] = ids  # left-padded for the model
        token_ids[i, : len(ids)] = ids  # left-aligned for the processors
    if key is None:
        key = jax.random.key(0)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch))
    return (
        jnp.asarray(prompt_ids),
        jnp.asarray(token_ids),
        jnp.asarray(lengths, jnp.int32),
        keys,
    )


def init_state(
    model,
    prompt_token_ids: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    processors: Sequence[Any] | None = (),
    key: PRNGKeyArray | None = None,
    pad_token_id: int | None = None,
    stop_strings: StopStrings | None = None,
    bucket: bool = True,
) -> GenerationState:
    """Prefill: the `GenerationState` before the first generated token.

    The prompts are left-padded to a common (bucketed) length and run through the model in ONE
    call that writes the `KVCache` and returns each row's next-token logits; each processor's
    `init` runs on each row's prompt.

    **Arguments:**

    - `model`: e.g. `LlamaForCausalLM`.
    - `prompt_token_ids`: one list of token ids per row (any lengths, each non-empty).
    - `max_new_tokens`: tokens each row may generate (excluding the prompt); sizes the cache.
    - `processors`: the processors whose states to initialise (the same list the step uses).
    - `key`: PRNG key (keyword-only); row `i` uses `fold_in(key, i)`. Default `jax.random.key(0)`.
    - `pad_token_id`: the padding id; default as in `make_step`.
    - `stop_strings`: the `StopStrings` the step will use (sizes `GenerationState.stop_state`).
    - `bucket`: pad the prompt length up to `bucket_length` (fewer compilations).

    **Returns:** a `GenerationState`.

    **Raises:** `ValueError` for no prompts, an empty prompt, token ids outside the vocabulary, a
    non-positive `max_new_tokens`, or a prompt plus `max_new_tokens` longer than the model's
    `max_position_embeddings`.
    """
    processors = as_processors(processors)
    if pad_token_id is None:
        pad_token_id = make_step(model).pad_token_id
    prompt_ids, token_ids, lengths, keys = _prepare(
        model, prompt_token_ids, max_new_tokens, key, pad_token_id, bucket
    )
    stops = 0 if stop_strings is None else len(stop_strings.stop_strings)
    return _prefill_jit(
        model, processors, prompt_ids, token_ids, lengths, keys, max_new_tokens, stops
    )


def generate_token_ids(
    model,
    prompt_token_ids: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    processors: Sequence[Any] | None = (),
    sampler: AbstractSampler | None = None,
    key: PRNGKeyArray | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    stop_strings: StopStrings | None = None,
    bucket: bool = True,
) -> GenerationState:
    """`generate` on token ids, without a tokenizer: returns the final `GenerationState`.

    Prefill and the whole decode loop run as one compiled program (`jax.lax.while_loop` until
    every row is done). Arguments as in `generate` and `init_state` (`stop_strings` is a
    prebuilt `StopStrings`).
    """
    step = make_step(
        model,
        processors,
        sampler,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop_strings=stop_strings,
    )
    if key is None and step.sampler.needs_key:
        raise ValueError(
            f"{type(step.sampler).__name__} sampling needs a PRNG key: pass key=jax.random.key(seed)"
        )
    prompt_ids, token_ids, lengths, keys = _prepare(
        model, prompt_token_ids, max_new_tokens, key, step.pad_token_id, bucket
    )
    return _generate_loop(step, prompt_ids, token_ids, lengths, keys, max_new_tokens)


DEFAULT_MAX_NEW_TOKENS = 128
"""`max_new_tokens` when neither the call nor the generation config sets a length."""


@dataclasses.dataclass(frozen=True)
class _Resolved:
    processors: tuple
    sampler: AbstractSampler | None
    max_new_tokens: int
    eos_token_id: tuple[int, ...] | None
    pad_token_id: int | None
    stop_strings: tuple[str, ...]
    num_return_sequences: int


def resolve_settings(
    model,
    longest_prompt: int,
    *,
    max_new_tokens: int | None,
    processors: Sequence[Any] | None,
    sampler: AbstractSampler | None,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int | None,
    stop_strings: str | Sequence[str] | None,
    generation_config: Any,
) -> _Resolved:
    """Merge a call's arguments with a generation config (given, or the model's own when the call
    names no processors and no sampler). Arguments of the call win; the call's processors run
    after the config's, as transformers runs a custom `logits_processor` list."""
    from .generation_config import settings_from_generation_config

    if generation_config is None and processors is None and sampler is None:
        generation_config = getattr(model, "generation_config", None)
    base: tuple = ()
    n_return = 1
    if generation_config is not None:
        config = model.config
        settings = settings_from_generation_config(
            generation_config, eos_token_id=config.eos_token_id, vocab_size=config.vocab_size
        )
        base = settings.processors
        sampler = sampler if sampler is not None else settings.sampler
        if eos_token_id is None:
            eos_token_id = settings.eos_token_id
        if pad_token_id is None:
            pad_token_id = settings.pad_token_id
        if stop_strings is None:
            stop_strings = settings.stop_strings
        if max_new_tokens is None:
            if settings.max_new_tokens is not None:
                max_new_tokens = settings.max_new_tokens
            elif settings.max_length is not None:
                max_new_tokens = settings.max_length - longest_prompt
                if max_new_tokens < 1:
                    raise ValueError(
                        f"the generation config's max_length={settings.max_length} leaves no room "
                        f"after a prompt of {longest_prompt} tokens; pass max_new_tokens"
                    )
        n_return = settings.num_return_sequences
    if stop_strings is None:
        stop_strings = ()
    elif isinstance(stop_strings, str):
        stop_strings = (stop_strings,)
    return _Resolved(
        processors=base + as_processors(processors),
        sampler=sampler,
        max_new_tokens=DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens,
        eos_token_id=None if eos_token_id is None else tuple(
            (eos_token_id,) if isinstance(eos_token_id, int) else eos_token_id
        ),
        pad_token_id=pad_token_id,
        stop_strings=tuple(stop_strings),
        num_return_sequences=n_return,
    )


def check_key(sampler: AbstractSampler | None, key, *, sampler_given: bool) -> None:
    """Raise a clear error when a random sampler has no PRNG key (before any compilation)."""
    if key is not None or sampler is None or not sampler.needs_key:
        return
    hint = "" if sampler_given else (
        " (the generation config asks for sampling, do_sample=True; pass "
        "sampler=functional_gen.samplers.Greedy() to decode greedily instead)"
    )
    raise ValueError(
        f"{type(sampler).__name__} sampling needs a PRNG key: pass key=jax.random.key(seed){hint}"
    )


def generate(
    model,
    tokenizer,
    prompts: Prompt | Sequence[Prompt],
    *,
    max_new_tokens: int | None = None,
    processors: Sequence[Any] | None = None,
    sampler: AbstractSampler | None = None,
    key: PRNGKeyArray | None = None,
    chat_template: bool | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    stop_strings: str | Sequence[str] | None = None,
    generation_config: Any = None,
) -> GenerationResult:
    """Generate text for a batch of prompts.

    **Arguments:**

    - `model`: e.g. from `functional_gen.load_model`.
    - `tokenizer`: its transformers tokenizer.
    - `prompts`: a prompt or a list of prompts; a prompt is raw text (`str`) or a chat (a list of
      `{"role", "content"}` messages, rendered with the tokenizer's chat template).
    - `max_new_tokens`: tokens to generate per row at most, excluding the prompt; default the
      generation config's `max_new_tokens` (or `max_length` minus the longest prompt), else 128.
    - `processors`: logits processors (`functional_gen.processors`) or plain functions
      `fn(logits, context) -> logits`, applied in order (after the generation config's).
    - `sampler`: `functional_gen.samplers.Greedy()` or `Multinomial()`; default from the
      generation config (`do_sample`), else greedy.
    - `key`: PRNG key (keyword-only), required by random samplers.
    - `chat_template`: `None` applies the chat template to chat prompts only; `True` also wraps
      raw text as a user message; `False` never.
    - `eos_token_id`: ids that end a row; default all of the model's EOS ids (e.g. SmolLM2's
      `<|im_end|>` and `<|endoftext|>`).
    - `pad_token_id`: id after a row's end; default the model's pad id.
    - `stop_strings`: text that ends a row as soon as the generated text contains it (even across
      token boundaries; matched on the device). It is left out of `texts`, with anything after
      it; the tokens stay in `token_ids`, as vLLM does.
    - `generation_config`: a `transformers.GenerationConfig`, a dict, or a path to a
      `generation_config.json`: its processors (in transformers' order), sampler, lengths, EOS
      ids, stop strings and `num_return_sequences` (rows repeated, prompt-major, as in
      transformers). When the call gives no `processors` and no `sampler`, the model's own
      generation config (`model.generation_config`) is used.

    **Returns:** a `GenerationResult` (with `num_return_sequences` rows per prompt).

    **Raises:** `ValueError` for a random sampler without `key`, bad prompts, a non-positive
    `max_new_tokens`, prompts too long for the model, or a generation config that asks for an
    unsupported decoding method; `TypeError` for bad processors.
    """
    prompts = normalize_prompts(prompts)
    ids = [encode_prompt(tokenizer, p, chat_template=chat_template) for p in prompts]
    settings = resolve_settings(
        model,
        max(len(x) for x in ids),
        max_new_tokens=max_new_tokens,
        processors=processors,
        sampler=sampler,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop_strings=stop_strings,
        generation_config=generation_config,
    )
    check_key(settings.sampler, key, sampler_given=sampler is not None)
    ids = [x for x in ids for _ in range(settings.num_return_sequences)]
    stops = build_stop_strings(settings.stop_strings, tokenizer, model)
    state = generate_token_ids(
        model,
        ids,
        max_new_tokens=settings.max_new_tokens,
        processors=settings.processors,
        sampler=settings.sampler,
        key=key,
        eos_token_id=settings.eos_token_id,
        pad_token_id=settings.pad_token_id,
        stop_strings=stops,
    )
    step = make_step(model, eos_token_id=settings.eos_token_id, pad_token_id=settings.pad_token_id)
    return result_from_state(
        state,
        tokenizer,
        eos_token_id=step.eos_token_id,
        pad_token_id=step.pad_token_id,
        stop_strings=settings.stop_strings,
    )


_STOP_STRING_CACHE: dict = {}


def build_stop_strings(
    stop_strings: str | Sequence[str] | None, tokenizer, model
) -> StopStrings | None:
    """A `StopStrings` for the model's vocabulary (cached per tokenizer), or `None` for none."""
    if stop_strings is None or (not isinstance(stop_strings, str) and len(stop_strings) == 0):
        return None
    strings = (stop_strings,) if isinstance(stop_strings, str) else tuple(stop_strings)
    vocab = model.config.vocab_size
    key = (strings, id(tokenizer), vocab)
    if key not in _STOP_STRING_CACHE:
        if len(_STOP_STRING_CACHE) > 32:
            _STOP_STRING_CACHE.clear()
        _STOP_STRING_CACHE[key] = (tokenizer, StopStrings.build(strings, tokenizer, vocab))
    return _STOP_STRING_CACHE[key][1]


def result_from_state(
    state: GenerationState,
    tokenizer,
    *,
    eos_token_id: Sequence[int],
    pad_token_id: int,
    stop_strings: Sequence[str] = (),
) -> GenerationResult:
    """Decode a final `GenerationState` into a `GenerationResult` (one host transfer); texts
    are cut before the first stop string."""
    token_ids = state.generated_token_ids(pad_token_id)
    host_ids, num, reasons = jax.device_get((token_ids, state.num_generated, state.finish_reason))
    eos = set(eos_token_id)
    texts = []
    for row, n, reason in zip(host_ids, num, reasons):
        row = row[: int(n)].tolist()
        if row and row[-1] in eos:
            row = row[:-1]
        text = decode(tokenizer, row)
        if FINISH_REASONS[int(reason)] == "stop_string":
            text = truncate_at_stop(text, stop_strings)[0]
        texts.append(text)
    return GenerationResult(
        texts=texts,
        token_ids=token_ids,
        logprobs=state.logprobs,
        finish_reasons=[FINISH_REASONS[int(r)] for r in reasons],
        num_tokens=[int(n) for n in num],
        state=state,
    )
