"""ONE settings resolver, shared by `generate` and `stream`: `GenerationOptions` -> `Settings`.

`Settings` (`functional_gen.generation.call_settings`) is the one type for what a call decided;
a generation config alone fills the same type (`settings_from_generation_config`).

It validates every argument where it enters (before anything compiles), merges the call's
options with a generation config, settles the EOS and pad ids once, builds the stop-string
matcher and the `Step` once.

Precedence (transformers merges its generation config with `generate`'s keyword arguments key
by key; so do we):

1. The call's own choices win, key by key: its keyword arguments over its `GenerationOptions`
   (`functional_gen.generation.options.with_overrides`), then those over the config:
   `max_new_tokens`, `eos_token_id`, `pad_token_id`, `stop_strings`, `processors`, `sampler`.
   Decoding options (`temperature`, `top_p`, `num_beams`, ...) are written over the config
   (`decoding_config`), which then counts as passed explicitly.
2. A `generation_config` given to the call, else the model's own (`model.generation_config`),
   supplies what the call leaves out: its lengths (`max_new_tokens`, or `max_length` minus the
   longest prompt), EOS and pad ids, stop strings and `num_return_sequences` always; its
   processors and sampler (`do_sample`, `temperature`, `top_p`, ...) only when the call passes
   neither `processors` nor `sampler` (a call that chooses its own decoding gets exactly that),
   or when the config was passed explicitly (then the call's processors run after the
   config's, as transformers runs a custom `logits_processor` list).
3. A continued `SequenceState` given neither `processors` nor `sampler` continues with the
   settings of the call that produced it (the same processors, their states carried on, the same
   sampler, stop strings and EOS ids).
4. Defaults: `max_new_tokens` = `DEFAULT_MAX_NEW_TOKENS`, greedy decoding, the model's EOS ids.
"""

import copy
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..models.base import AbstractCausalLM
from ..processors.base import as_processors
from ..processors.classifier_free_guidance import ClassifierFreeGuidance, check_guidance_first
from ..speculative.proposers import DraftModel, EarlyExit, PromptLookup
from .call_settings import Settings
from .generation_config import load_generation_config, settings_from_generation_config
from .options import GenerationOptions, decoding_config, with_overrides
from .samplers import AbstractSampler
from .search import AbstractSearch
from .speculative import Speculative, speculative_search
from .step import make_step
from .stop_strings import StopStrings

DEFAULT_MAX_NEW_TOKENS = 128
"""`max_new_tokens` when neither the call nor the generation config sets a length."""

PREFILL_MODES = ("one_pass", "forced")
"""`prefill_mode` values: one model call over the whole prompt, or the prompt teacher-forced
token by token through the decode path (for teaching and as a test oracle)."""


def check_max_new_tokens(max_new_tokens: Any, name: str = "max_new_tokens") -> None:
    """**Raises:** `ValueError` unless `max_new_tokens` (or the argument `name`) is a positive
    integer."""
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, (int, np.integer))
        or max_new_tokens < 1
    ):
        raise ValueError(f"`{name}` must be a positive integer, got {max_new_tokens!r}")


def check_key(
    sampler: AbstractSampler | AbstractSearch | None, key, *, sampler_given: bool
) -> None:
    """Raise a clear error when a random sampler has no PRNG key (before any compilation)."""
    if key is not None or sampler is None or not sampler.needs_key:
        return
    hint = (
        ""
        if sampler_given
        else (
            " (the generation config asks for sampling, do_sample=True; pass "
            "sampler=functional_gen.samplers.Greedy() to decode greedily instead)"
        )
    )
    raise ValueError(
        f"{type(sampler).__name__} sampling needs a PRNG key: pass key=jax.random.key(seed){hint}"
    )


def check_prng_key(key: Any) -> None:
    """Refuse a `key` that is not ONE typed JAX PRNG key (before anything compiles).

    **Raises:** `TypeError` for anything but a `jax.random.key(...)` (an int seed, a raw uint32
    key, a list); `ValueError` for a batch of keys (the rows' keys are derived from one).
    """
    if key is None:
        return
    if not isinstance(key, jax.Array) or not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        what = f"{type(key).__name__} {key!r}" if not isinstance(key, jax.Array) else key.dtype
        raise TypeError(
            f"`key` must be one typed JAX PRNG key, e.g. key=jax.random.key(0), got {what}"
        )
    if key.shape != ():
        raise ValueError(
            f"`key` must be a single PRNG key, got a batch of shape {key.shape}; pass one key "
            "(row r uses fold_in(key, r))"
        )


def check_token_id_option(name: str, value: Any, vocab_size: int) -> None:
    """Refuse an `eos_token_id` / `pad_token_id` (`name`) that is not token ids of the model's
    vocabulary (text, a float, an id outside `[0, vocab_size)`); `None` is not set.

    **Raises:** `TypeError` for a value that is not integer ids; `ValueError` for an id outside
    the vocabulary.
    """
    if value is None:
        return
    many = name == "eos_token_id"
    listed = many and isinstance(value, Sequence) and not isinstance(value, (str, bytes))
    ids = list(value) if listed else [value]
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            kind = "token ids (an int or a list of ints)" if many else "a token id (an int)"
            raise TypeError(
                f"`{name}` must be {kind}, got {value!r}; convert text with "
                "tokenizer.convert_tokens_to_ids"
            )
        if not 0 <= int(i) < vocab_size:
            raise ValueError(
                f"`{name}`={value!r} is outside the model's vocabulary [0, {vocab_size})"
            )


_STOP_STRING_CACHE: dict = {}


def build_stop_strings(
    stop_strings: str | Sequence[str] | None, tokenizer, model: AbstractCausalLM
) -> StopStrings | None:
    """A `StopStrings` for the model's vocabulary (cached per tokenizer), or `None` for none.

    **Raises:** `ValueError` for stop strings without a tokenizer (they are matched on token
    bytes) or an empty stop string.
    """
    if stop_strings is None or (not isinstance(stop_strings, str) and len(stop_strings) == 0):
        return None
    if tokenizer is None:
        raise ValueError("stop strings need the tokenizer (pass it to generate)")
    strings = (stop_strings,) if isinstance(stop_strings, str) else tuple(stop_strings)
    vocab = model.vocab_size
    key = (strings, id(tokenizer), vocab)
    if key not in _STOP_STRING_CACHE:
        if len(_STOP_STRING_CACHE) > 32:
            _STOP_STRING_CACHE.clear()
        _STOP_STRING_CACHE[key] = (tokenizer, StopStrings.build(strings, tokenizer, vocab))
    return _STOP_STRING_CACHE[key][1]


DEFAULT_ASSISTANT_TOKENS = 4
"""Guesses per step of a draft given as `assistant_model=` or a config's `assistant_early_exit`
when the config sets no `num_assistant_tokens`."""


def _speculative_of(config, options: GenerationOptions):
    """`(config, speculative)`: the call's proposer, and the config without the settings that
    chose it (they are then no decoding mode of its own).

    In order: the call's `speculative`; the call's `assistant_model` (transformers' keyword of
    assisted generation) as `DraftModel(assistant_model, num_tokens=num_assistant_tokens or 4)`;
    the config's `prompt_lookup_num_tokens` as `PromptLookup` (`max_matching_ngram_size`, default
    2); the config's `assistant_early_exit` (LayerSkip) as `EarlyExit(num_layers=...)` — the
    config's two, in transformers' order (`_get_candidate_generator`). `num_assistant_tokens`
    comes from the config (the call's, else the model's).

    **Raises:** `ValueError` when the call gives both `speculative` and `assistant_model`;
    `TypeError` for an `assistant_model` that is not an `AbstractCausalLM`.
    """
    speculative, assistant = options.speculative, options.assistant_model
    if speculative is not None and assistant is not None:
        raise ValueError(
            f"give either `speculative` ({type(speculative).__name__}) or `assistant_model`, "
            "not both: `assistant_model=draft` is `speculative=DraftModel(draft, num_tokens=...)`"
        )
    gc = None if config is None else load_generation_config(config)
    lookup = getattr(gc, "prompt_lookup_num_tokens", None)
    early_exit = getattr(gc, "assistant_early_exit", None)
    num_tokens = getattr(gc, "num_assistant_tokens", None) or DEFAULT_ASSISTANT_TOKENS
    if assistant is not None:
        speculative = DraftModel(assistant, num_tokens=int(num_tokens))
    if not lookup and not early_exit:
        return config, speculative
    gc = copy.deepcopy(gc)
    gc.prompt_lookup_num_tokens = None
    gc.assistant_early_exit = None
    if speculative is None and lookup:
        ngram = getattr(gc, "max_matching_ngram_size", None) or 2
        speculative = PromptLookup(num_tokens=int(lookup), max_ngram_size=int(ngram))
    elif speculative is None:
        speculative = EarlyExit(num_layers=int(early_exit), num_tokens=int(num_tokens))
    return gc, speculative


def resolve_settings(
    model: AbstractCausalLM,
    tokenizer,
    longest_prompt: int,
    options: GenerationOptions | None = None,
    *,
    processors: Sequence[Any] | None = None,
    sampler: AbstractSampler | AbstractSearch | None = None,
    key=None,
    previous: "Settings | None" = None,
    use_generation_config: bool = True,
    first_processors: tuple = (),
    **overrides: Any,
) -> Settings:
    """Merge a call's options with a generation config (see the module docstring for the
    precedence) and validate them.

    **Arguments:** `options` (a `GenerationOptions`) and `overrides` (keyword arguments named
    like its fields, which win over it), `processors`, `sampler` and `key` as in
    `functional_gen.generate`; `longest_prompt` is the longest row in tokens (prompt, or
    everything a continued state holds), used with a config's `max_length` and to check the
    model's context; `previous` is the `Settings` of the call that produced a continued
    `SequenceState` (or `None`); `use_generation_config=False` ignores the model's generation
    config (the token-id functions `generate_token_ids` and `init_state`); `first_processors` go
    before every other processor (classifier-free guidance).

    **Returns:** the `Settings`.

    **Raises:** `ValueError` for a non-positive `max_new_tokens` or `num_return_sequences`, a
    random sampler without `key`, rows plus `max_new_tokens` longer than the model's
    `max_position_embeddings`, an unknown `prefill_mode`, `prefix_lm` with forced prefill, or a
    generation config that asks for an unsupported method; `TypeError` for an unknown option,
    bad processors, sampler or model.
    """
    options = with_overrides(options, overrides)
    max_new_tokens, num_return_sequences = options.max_new_tokens, options.num_return_sequences
    eos_token_id, pad_token_id = options.eos_token_id, options.pad_token_id
    stop_strings, prefill_mode = options.stop_strings, options.prefill_mode
    if not isinstance(model, AbstractCausalLM):
        raise TypeError(
            "`model` must implement functional_gen.models.AbstractCausalLM (e.g. a model from "
            f"functional_gen.load_model), got {type(model).__name__}"
        )
    check_token_id_option("eos_token_id", eos_token_id, model.vocab_size)
    check_token_id_option("pad_token_id", pad_token_id, model.vocab_size)
    if prefill_mode not in PREFILL_MODES:
        raise ValueError(f"`prefill_mode` must be one of {PREFILL_MODES}, got {prefill_mode!r}")
    if options.prefix_lm and prefill_mode == "forced":
        raise ValueError(
            "prefix_lm=True needs the one-pass prefill (a prompt fed token by token cannot "
            "attend to later prompt tokens); use prefill_mode='one_pass'"
        )
    if max_new_tokens is not None:
        check_max_new_tokens(max_new_tokens)
    if num_return_sequences is not None:
        check_max_new_tokens(num_return_sequences, "num_return_sequences")
    explicit_config = options.generation_config
    if explicit_config is None and use_generation_config:
        config = model.generation_config
    else:
        config = explicit_config if use_generation_config else None
    config, speculative = _speculative_of(config, options)
    if speculative is not None and options.guidance_scale is not None and options.cfg == "batched":
        raise ValueError(
            "speculative decoding is not supported with cfg='batched' (its cache holds two "
            "branches per row); use cfg='processor' for classifier-free guidance with it"
        )
    with_decoding = decoding_config(options, config)
    if with_decoding is not config:  # the options set decoding fields: the call's own choice
        config = explicit_config = with_decoding
    own_decoding = processors is not None or sampler is not None
    carry = previous is not None and not own_decoding and explicit_config is None
    if carry:
        processors_, sampler_ = previous.step.processors, previous.step.search
        eos_token_id = previous.eos_token_id if eos_token_id is None else eos_token_id
        pad_token_id = previous.pad_token_id if pad_token_id is None else pad_token_id
        stop_strings = previous.stop_strings if stop_strings is None else stop_strings
    else:
        processors_, sampler_ = as_processors(processors), sampler

    n_return = 1
    if config is not None and not carry:
        from_config = settings_from_generation_config(
            config, eos_token_id=model.eos_token_id, vocab_size=model.vocab_size
        )
        if explicit_config is not None or not own_decoding:
            processors_ = from_config.processors + processors_
            sampler_ = sampler if sampler is not None else from_config.sampler
        if eos_token_id is None:
            eos_token_id = from_config.eos_token_id
        if pad_token_id is None:
            pad_token_id = from_config.pad_token_id
        if stop_strings is None:
            stop_strings = from_config.stop_strings
        if max_new_tokens is None:
            if from_config.max_new_tokens is not None:
                max_new_tokens = from_config.max_new_tokens
            elif from_config.max_length is not None:
                max_new_tokens = from_config.max_length - longest_prompt
                if max_new_tokens < 1:
                    raise ValueError(
                        f"the generation config's max_length={from_config.max_length} leaves no room "
                        f"after {longest_prompt} tokens; pass max_new_tokens"
                    )
        n_return = from_config.num_return_sequences
        if (
            from_config.guidance_scale is not None
            and not first_processors
            and (explicit_config is not None or not own_decoding)
        ):
            first_processors = (ClassifierFreeGuidance(model, from_config.guidance_scale),)
    if num_return_sequences is not None:
        n_return = num_return_sequences
    if max_new_tokens is None:
        max_new_tokens = DEFAULT_MAX_NEW_TOKENS
    limit = model.max_position_embeddings
    if limit is not None and longest_prompt + max_new_tokens > limit:
        raise ValueError(
            f"{longest_prompt} tokens plus max_new_tokens={max_new_tokens} is longer than the "
            f"model's context (max_position_embeddings={limit}); shorten the prompt or lower "
            "max_new_tokens"
        )
    check_key(sampler_, key, sampler_given=sampler is not None or carry)
    if stop_strings is None:
        stop_strings = ()
    elif isinstance(stop_strings, str):
        stop_strings = (stop_strings,)
    stop_strings = tuple(stop_strings)
    if any(not isinstance(s, str) or not s for s in stop_strings):
        raise ValueError(f"stop strings must be non-empty strings, got {stop_strings!r}")
    if speculative is not None:
        sampler_ = speculative_search(speculative, sampler_, model)
    elif isinstance(sampler_, Speculative) and not carry:
        sampler_ = sampler_.sampler
    if first_processors and not carry:
        processors_ = tuple(first_processors) + tuple(processors_)
    check_guidance_first(processors_)
    step = make_step(
        model,
        processors_,
        sampler_,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop_strings=build_stop_strings(stop_strings, tokenizer, model),
        top_logprobs=options.top_logprobs,
        logprobs_mode=options.logprobs_mode,
    )
    return Settings(
        max_new_tokens=int(max_new_tokens),
        stop_strings=stop_strings,
        num_return_sequences=int(n_return),
        prefix_lm=bool(options.prefix_lm),
        prefill_mode=prefill_mode,
        prompt_logprobs=bool(options.prompt_logprobs),
        carry_processor_states=carry,
    ).with_step(step)
