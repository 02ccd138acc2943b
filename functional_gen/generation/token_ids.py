"""The token-id entry points: `init_state` and `generate_token_ids`, without a tokenizer; and
`generate_state`, `generate` up to the final `GenerationState`.

They take one list of token ids per row, apply no generation config, keep exact shapes (the
batch and `max_new_tokens` are not bucketed) and return `GenerationState`s, for teaching, tests
and callers that run their own loop around `Step`.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
from jaxtyping import Array, Key

from ..models.base import AbstractCausalLM
from ..processors.base import as_processors
from .options import GenerationOptions
from .planning import plan_call, prepare
from .program import run_prepared, start_prepared
from .samplers import AbstractSampler
from .search import AbstractSearch
from .sequence_state import SequenceState
from .settings import Settings, check_max_new_tokens, check_prng_key, resolve_settings
from .state import GenerationState
from .step import make_step
from .stop_strings import StopStrings


def init_state(
    model: AbstractCausalLM,
    prompt_token_ids: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    processors: Sequence[Any] | None = (),
    key: Key[Array, ""] | None = None,
    pad_token_id: int | None = None,
    stop_strings: StopStrings | None = None,
    bucket: bool = True,
) -> GenerationState:
    """Prefill: the `GenerationState` before the first generated token (exact shapes: the
    batch and `max_new_tokens` are not bucketed).

    The prompts are left-padded to a common length and run through the model in ONE call that
    writes the `KVCache` and returns each row's next-token logits; each processor's `init` runs
    on each row's prompt.

    **Arguments:**

    - `model`: an `AbstractCausalLM`.
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
    settings = _token_settings(
        model,
        prompt_token_ids,
        max_new_tokens,
        processors,
        None,
        None,
        pad_token_id,
        stop_strings,
        key=key if key is not None else jax.random.key(0),
    )
    seq = SequenceState.from_token_ids(prompt_token_ids, vocab_size=model.vocab_size, key=key)
    prepared = prepare(seq, settings, key, bucket=False, bucket_prompt=bucket)
    _, state = start_prepared(prepared)
    return state


def _token_settings(
    model,
    prompt_token_ids,
    max_new_tokens,
    processors,
    sampler,
    eos_token_id,
    pad_token_id,
    stop_strings,
    *,
    key,
) -> Settings:
    check_max_new_tokens(max_new_tokens)
    check_prng_key(key)
    rows = [list(ids) for ids in prompt_token_ids]
    longest = max((len(r) for r in rows), default=0)
    settings = resolve_settings(
        model,
        None,
        longest,
        GenerationOptions(
            max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, pad_token_id=pad_token_id
        ),
        processors=as_processors(processors),
        sampler=sampler,
        key=key,
        use_generation_config=False,
    )
    if stop_strings is not None:
        step = make_step(
            model,
            settings.step.processors,
            settings.step.search,
            eos_token_id=settings.eos_token_id,
            pad_token_id=settings.pad_token_id,
            stop_strings=stop_strings,
        )
        settings = dataclasses.replace(
            settings, stop_strings=tuple(stop_strings.stop_strings)
        ).with_step(step)
    return settings


def generate_token_ids(
    model: AbstractCausalLM,
    prompt_token_ids: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    processors: Sequence[Any] | None = (),
    sampler: AbstractSampler | AbstractSearch | None = None,
    key: Key[Array, ""] | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    stop_strings: StopStrings | None = None,
    bucket: bool = True,
) -> GenerationState:
    """`generate` on token ids, without a tokenizer: returns the final `GenerationState`
    (exact shapes: `batch` rows and `max_new_tokens` logprob columns).

    Prefill and the whole decode loop run as one compiled program (`jax.lax.while_loop` until
    every row is done). Arguments as in `generate` and `init_state` (`stop_strings` is a
    prebuilt `StopStrings`); no generation config is applied.

    **Raises:** as `init_state`, and `ValueError` for a random sampler without `key`.
    """
    settings = _token_settings(
        model,
        prompt_token_ids,
        max_new_tokens,
        processors,
        sampler,
        eos_token_id,
        pad_token_id,
        stop_strings,
        key=key,
    )
    seq = SequenceState.from_token_ids(prompt_token_ids, vocab_size=model.vocab_size, key=key)
    prepared = prepare(seq, settings, key, bucket=False, bucket_prompt=bucket)
    final, _, _ = run_prepared(prepared)
    return final


def generate_state(
    model: AbstractCausalLM,
    tokenizer,
    prompts,
    options: GenerationOptions | None = None,
    *,
    processors: Sequence[Any] | None = None,
    sampler: AbstractSampler | AbstractSearch | None = None,
    key: Key[Array, ""] | None = None,
    **overrides: Any,
) -> GenerationState:
    """`functional_gen.generate`, returning the final `GenerationState` of the compiled loop
    instead of a `GenerationResult`: every loop row (padding rows included, after the real
    ones), the search's carry (`search_state`, e.g. speculative decoding's acceptance counts),
    the cache. Prompts are tokenized, bucketed and padded exactly as `generate` does
    (`plan_call`).

    **Arguments** and **Raises:** as `functional_gen.generate`.
    """
    _, _, prepared = plan_call(
        model,
        tokenizer,
        prompts,
        options,
        processors=processors,
        sampler=sampler,
        key=key,
        **overrides,
    )
    final, _, _ = run_prepared(prepared)
    return final
