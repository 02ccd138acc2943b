"""`GenerationOptions`: every per-call choice of `generate` and `stream`, in one frozen value.

The names are transformers' `GenerationConfig` names (`max_new_tokens`, `do_sample`,
`temperature`, `top_p`, `eos_token_id`, `stop_strings`, `num_return_sequences`,
`guidance_scale`, ...) plus the few this library adds (`prefill_mode`, `top_logprobs`,
`prompt_logprobs`, `cfg`, ...). What is not a choice but a value stays an argument of its own:
the model, the tokenizer, the prompts, `processors`, `sampler` and the PRNG `key`.

Precedence, written once (`with_overrides` and `decoding_config`, used by
`functional_gen.generation.settings.resolve_settings`):

1. a keyword argument of the call (`generate(..., max_new_tokens=8)`) replaces the field of
   the same name (a keyword given as `None` leaves the field as it is);
2. the options' fields (`generate(model, tokenizer, prompts, options)`);
3. the generation config (`options.generation_config`, else the checkpoint's own) fills in every
   field left `None`; decoding fields set in the options (`DECODING_FIELDS`) override that
   config key by key, as transformers' `generate(**kwargs)` updates its `GenerationConfig`.
"""

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .generation_config import load_generation_config

SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "typical_p")
"""Fields that only mean something when sampling: setting one implies `do_sample=True` unless
`do_sample` is given (transformers would ignore them and warn; llama.cpp and vLLM sample)."""

DECODING_FIELDS = (
    "do_sample",
    *SAMPLING_FIELDS,
    "repetition_penalty",
    "no_repeat_ngram_size",
    "num_beams",
    "length_penalty",
    "early_stopping",
)
"""The fields that choose the processors and the search through the generation-config table
(`functional_gen.generation.generation_config.settings_from_generation_config`)."""


def _frozen(value: Any) -> Any:
    """A hashable stand-in for `value` (lists as tuples, mappings as sorted item tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))  # e.g. a transformers.GenerationConfig: compared by identity
    return value


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    """Every per-call choice of `functional_gen.generate` and `functional_gen.stream`.

    Frozen and hashable; derive a variant with `dataclasses.replace(options, temperature=0.5)`
    or `options.replace(temperature=0.5)`. `None` means "not set": the generation config (the
    call's `generation_config`, else the checkpoint's) fills it in, else the default below.

    **Lengths and ends of rows:**

    - `max_new_tokens`: tokens to generate per row at most (default the config's
      `max_new_tokens`, or its `max_length` minus the longest prompt, else 128).
    - `eos_token_id`: id(s) that end a row (default the config's, else all of the model's).
    - `pad_token_id`: id written after a row's end (default the config's, else the model's).
    - `stop_strings`: text that ends a row as soon as the generated text contains it.
    - `num_return_sequences`: sequences per prompt (prompt-major), each prompt prefilled once.

    **Decoding** (transformers' names; they build the processors and the search with the
    generation-config table, in transformers' order): `do_sample`, `temperature`, `top_k`,
    `top_p`, `min_p`, `typical_p`, `repetition_penalty`, `no_repeat_ngram_size`, `num_beams`,
    `length_penalty`, `early_stopping`. Setting a sampling field (`SAMPLING_FIELDS`) without
    `do_sample` samples. They run before the call's own `processors`; the call's `sampler`
    replaces the sampler they choose.

    **Prompts:** `chat_template` (`None`: chats only; `True`: also wrap raw text; `False`:
    never), `prefix_lm` (the prompt attends to itself bidirectionally), `prefill_mode`
    (`"one_pass"` or `"forced"`: teacher-forced token by token).

    **Outputs:** `top_logprobs` (`k` most likely alternatives per token), `logprobs_mode`
    (`"processed"` or `"raw"`), `prompt_logprobs` (the logprob of every prefilled token).

    **Classifier-free guidance:** `guidance_scale` (`None`: none), `negative_prompt` (text or
    token ids; default each row's last prompt token), `guidance_rescale` (in [0, 1]), `cfg`
    (`"processor"` or `"batched"`).

    **Speculative decoding:** `speculative`: a proposer of `functional_gen.speculative`
    (`PromptLookup`, `DraftModel`, `EarlyExit`) that guesses tokens for the model to verify,
    losslessly (`functional_gen.generation.speculative`); `None`: none, unless the generation
    config sets `prompt_lookup_num_tokens` or `assistant_early_exit` (`EarlyExit`).
    `assistant_model`: transformers' keyword of assisted generation, a draft
    `AbstractCausalLM` of the target's vocabulary: `DraftModel(assistant_model,
    num_tokens=num_assistant_tokens or 4)` (`num_assistant_tokens` from the generation config;
    transformers refuses `assistant_model` inside a `GenerationConfig`); not with `speculative`.

    **Config:** `generation_config`: a `transformers.GenerationConfig`, a dict, or a path to a
    `generation_config.json`, used instead of the checkpoint's own.

    **Cache:** `kv_cache_dtype`: the dtype of every `KVCache` the call makes (the prompt's, a
    classifier-free guidance branch's, a draft model's): `"float32"`, `"bfloat16"`, a jnp dtype,
    or `"auto"` (bfloat16 when `jax.default_backend()` is a GPU, float32 elsewhere); `None`
    (default): the model's own (`model.kv_cache_dtype`, set by `load_model`), or, continuing a
    `SequenceState` that holds a cache, that cache's dtype. A continuation that asks for another
    dtype than its state's cache has is refused (`ValueError`; convert the state first with
    `SequenceState.with_kv_cache_dtype`). An unsupported value raises `ValueError` before
    anything compiles.

    Values are checked where the call resolves them (`resolve_settings`), before compiling.
    Source: transformers' `GenerationConfig` (the names and the precedence of `generate`'s
    keyword arguments over it).
    """

    max_new_tokens: int | None = None
    eos_token_id: int | Sequence[int] | None = None
    pad_token_id: int | None = None
    stop_strings: str | Sequence[str] | None = None
    num_return_sequences: int | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    num_beams: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    chat_template: bool | None = None
    prefix_lm: bool = False
    prefill_mode: str = "one_pass"
    top_logprobs: int = 0
    logprobs_mode: str = "processed"
    prompt_logprobs: bool = False
    guidance_scale: float | None = None
    negative_prompt: Any = None
    guidance_rescale: float | None = None
    cfg: str = "processor"
    generation_config: Any = None
    speculative: Any = None
    assistant_model: Any = None
    kv_cache_dtype: Any = None

    def __post_init__(self):
        # sequences become tuples, so that options compare and hash by value
        for name in ("eos_token_id", "stop_strings"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def __hash__(self) -> int:
        return hash(tuple(_frozen(getattr(self, f.name)) for f in dataclasses.fields(self)))

    def replace(self, **changes: Any) -> "GenerationOptions":
        """A copy with `changes` (field names) applied, as `dataclasses.replace`.

        **Raises:** `TypeError` naming an unknown field.
        """
        check_fields(changes)
        return dataclasses.replace(self, **changes)


FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationOptions))
"""Every field name of `GenerationOptions` (every keyword `generate` passes on to it)."""


def check_fields(names: Mapping[str, Any] | Sequence[str]) -> None:
    """**Raises:** `TypeError` naming every name that is not a `GenerationOptions` field."""
    unknown = sorted(set(names) - FIELDS)
    if unknown:
        raise TypeError(
            f"unknown generation option(s) {', '.join(map(repr, unknown))}; the options are the "
            f"fields of functional_gen.GenerationOptions: {', '.join(sorted(FIELDS))}"
        )


def with_overrides(options: GenerationOptions | None, overrides: Mapping[str, Any]):
    """The options of a call: `options` (default `GenerationOptions()`) with the call's keyword
    arguments `overrides` applied (those given as `None` leave the field as it is).

    **Raises:** `TypeError` for `options` that are not `GenerationOptions`, or a keyword that is
    no field (named).
    """
    if options is None:
        options = GenerationOptions()
    elif not isinstance(options, GenerationOptions):
        raise TypeError(
            "`options` must be a functional_gen.GenerationOptions (pass choices such as "
            f"max_new_tokens as keywords or in one), got {type(options).__name__}"
        )
    check_fields(overrides)
    changes = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(options, **changes) if changes else options


def decoding_config(options: GenerationOptions, base: Any) -> Any:
    """The generation config of a call whose options set decoding fields: `base` (the call's
    `generation_config`, the checkpoint's, or `None`) with those fields written over it.

    **Returns:** `base` itself when the options set no decoding field; else a new
    `transformers.GenerationConfig` (`base` is not changed).
    """
    values = {name: getattr(options, name) for name in DECODING_FIELDS}
    values = {k: v for k, v in values.items() if v is not None}
    if not values:
        return base
    if values.get("do_sample") is None and any(k in values for k in SAMPLING_FIELDS):
        values["do_sample"] = True
    config = copy.deepcopy(load_generation_config(base if base is not None else {}))
    config.update(**values)
    return config
