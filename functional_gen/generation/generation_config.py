"""transformers' `GenerationConfig` -> functional_gen's processors, sampler and settings.

`settings_from_generation_config` builds the same processor list, in the same order, that
transformers' `GenerationMixin._get_logits_processor` (transformers 5.23) builds for a
decoder-only model, so a checkpoint's `generation_config.json` means the same thing here:

    sequence_bias, repetition_penalty, no_repeat_ngram_size, bad_words_ids, min_length,
    min_new_tokens, forced_bos_token_id, forced_eos_token_id, remove_invalid_values,
    exponential_decay_length_penalty, suppress_tokens, begin_suppress_tokens,
    then, when do_sample: temperature, top_k, top_p, min_p, typical_p, epsilon_cutoff,
    eta_cutoff, then renormalize_logits.

llama.cpp's own sampling settings, which GGUF files may carry (`general.sampling.*`), add
`XTC` (`xtc_threshold`, `xtc_probability`) and `MirostatV2` (`mirostat=2`, `mirostat_tau`,
`mirostat_eta`) after min-p, in llama.cpp's chain order, and `penalty_last_n` (the window of
`RepetitionPenalty`). The settings that only vLLM / OpenAI / llama.cpp have, which the command
line passes through the same table, add `PresencePenalty` and `FrequencyPenalty`
(`presence_penalty`, `frequency_penalty`) after the repetition penalty, `DRY` (`dry_multiplier`,
`dry_base`, `dry_allowed_length`, `dry_penalty_last_n`, `dry_sequence_breakers`) after the n-gram
rule, and `TopNSigma` (`top_n_sigma`) after the eta cutoff.

The checks are allow-lists. The decoding method comes from transformers' own
`GenerationConfig.get_generation_mode()`, and anything but `SUPPORTED_GENERATION_MODES` (greedy
search, multinomial sampling, beam search and beam sampling) is refused by name: group beam
search, contrastive search, assisted generation, DoLa, constrained beam search. `num_beams`,
`length_penalty` and `early_stopping` choose `fg.samplers.BeamSearch`; `guidance_scale` (other
than 1) puts classifier-free guidance first in the chain (`Settings.guidance_scale`). Every setting the config sets
to a non-default value is either read here (`USED_GENERATION_KEYS`), known not to change the generated tokens or read only by
a refused mode (`IGNORED_GENERATION_KEYS`), a feature not implemented yet
(`UNSUPPORTED_GENERATION_KEYS`: watermarking, ...), or an error that
names it, so a setting that a later transformers adds is never silently dropped.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import processors as P
from .beam_search import BeamSearch
from .call_settings import Settings
from .samplers import AbstractSampler, Greedy, Multinomial
from .search import AbstractSearch

SUPPORTED_GENERATION_MODES = ("greedy_search", "sample", "beam_search", "beam_sample")
"""`transformers.GenerationMode` values that `settings_from_generation_config` implements."""

USED_GENERATION_KEYS = frozenset(
    {
        "do_sample",
        "max_new_tokens",
        "max_length",
        "min_length",
        "min_new_tokens",
        "eos_token_id",
        "pad_token_id",
        "stop_strings",
        "num_return_sequences",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "typical_p",
        "epsilon_cutoff",
        "eta_cutoff",
        "repetition_penalty",
        "no_repeat_ngram_size",
        "bad_words_ids",
        "sequence_bias",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "renormalize_logits",
        # beam search (fg.samplers.BeamSearch) and classifier-free guidance
        "num_beams",
        "length_penalty",
        "early_stopping",
        "guidance_scale",
        # llama.cpp's sampling settings (a GGUF's general.sampling.*, the command line)
        "penalty_last_n",
        "presence_penalty",
        "frequency_penalty",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "top_n_sigma",
        "xtc_probability",
        "xtc_threshold",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
    }
)
"""`GenerationConfig` attributes that `settings_from_generation_config` reads."""

# Settings that get_generation_mode() reads to pick a mode other than greedy/sample.
_MODE_KEYS = frozenset(
    {
        "num_beams",
        "num_beam_groups",
        "penalty_alpha",
        "constraints",
        "force_words_ids",
        "dola_layers",
        "use_mtp",
        "assistant_early_exit",
        "prompt_lookup_num_tokens",
    }
)

IGNORED_GENERATION_KEYS = frozenset(
    {
        # bookkeeping
        "transformers_version",
        "_from_model_config",
        "bos_token_id",  # a prompt is always given
        "decoder_start_token_id",  # encoder-decoder models only
        # what is returned, and how the computation is organised: not which tokens come out
        "output_scores",
        "output_logits",
        "output_attentions",
        "output_hidden_states",
        "return_dict_in_generate",
        "use_cache",
        "cache_implementation",
        "cache_config",
        "max_cache_len",
        "compile_config",
        "disable_compile",
        "continuous_batching_config",
        "prefill_chunk_size",
        # read only by the modes get_generation_mode() reports and that are refused here (group
        # beam search, contrastive search, assisted generation, DoLa): harmless otherwise
        "num_beam_groups",
        "diversity_penalty",
        "penalty_alpha",
        "low_memory",
        "constraints",
        "force_words_ids",
        "dola_layers",
        "use_mtp",
        "is_assistant",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
        "assistant_early_exit",
        "assistant_lookbehind",
        "assistant_ensemble_weight",
        "target_lookbehind",
        "prompt_lookup_num_tokens",
        "max_matching_ngram_size",
        "speculation_type",
    }
)
"""`GenerationConfig` attributes that do not change the generated tokens of a greedy or sampled
decoder-only generation (or are read only by modes refused by name)."""

UNSUPPORTED_GENERATION_KEYS = {
    "watermarking_config": "watermarking",
    "top_h": "top-H sampling",
    "token_healing": "token healing",
    "max_time": "a time limit",
    "encoder_repetition_penalty": "an encoder repetition penalty (encoder-decoder models)",
    "encoder_no_repeat_ngram_size": "encoder n-gram blocking (encoder-decoder models)",
}
"""Settings of features not implemented (yet), refused when set to a non-default value."""

_SUPPORTED_MIROSTAT = (0, 2)

DRY_DEFAULTS = {"dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1}
"""llama.cpp's defaults of the DRY settings other than `dry_multiplier`."""

DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")
"""llama.cpp's default DRY sequence breakers (text; tokenized with the model's tokenizer)."""

XTC_DEFAULT_THRESHOLD = 0.1
MIROSTAT_DEFAULTS = {"mirostat_tau": 5.0, "mirostat_eta": 0.1}
"""llama.cpp's defaults of XTC's threshold and of Mirostat's target surprise and learning rate."""


GenerationSettings = Settings
"""The former name of what `settings_from_generation_config` returns: it is the one `Settings`
type (`functional_gen.generation.call_settings`), with `step` left `None`."""


def load_generation_config(generation_config: Any):
    """A `transformers.GenerationConfig` from one, from a dict, or from a path to a
    `generation_config.json` file or to the directory holding it.

    **Raises:** `FileNotFoundError` for a path without a generation config; `TypeError` for
    anything else.
    """
    from transformers import GenerationConfig  # deferred on purpose: transformers is heavy

    if isinstance(generation_config, GenerationConfig):
        return generation_config
    if isinstance(generation_config, Mapping):
        return GenerationConfig(**dict(generation_config))
    if isinstance(generation_config, (str, os.PathLike)):
        path = Path(generation_config)
        if path.is_dir():
            path = path / "generation_config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no generation config at {path}")
        return GenerationConfig.from_dict(json.loads(path.read_text()))
    raise TypeError(
        "generation_config must be a transformers.GenerationConfig, a dict, or a path to a "
        f"generation_config.json, got {type(generation_config).__name__}"
    )


def check_generation_config(gc) -> None:
    """Refuse a `transformers.GenerationConfig` that asks for anything not implemented.

    The decoding method is `gc.get_generation_mode()`; every non-default setting
    (`gc.to_diff_dict()`) must be known (see the module docstring).

    **Raises:** `ValueError` naming the generation mode and the settings that select it, the
    unsupported features, and any unknown setting.
    """
    mode = gc.get_generation_mode()
    explicit = gc.to_diff_dict()
    problems = []
    if mode.value not in SUPPORTED_GENERATION_MODES:
        chosen = ", ".join(
            f"{k}={v!r}" for k, v in sorted(explicit.items()) if k in _MODE_KEYS or k == "do_sample"
        )
        problems.append(
            f"the generation mode {mode.value!r} ({chosen}) is not implemented; implemented: "
            f"{', '.join(SUPPORTED_GENERATION_MODES)}"
        )
    for name, feature in UNSUPPORTED_GENERATION_KEYS.items():
        value = explicit.get(name)
        if value is not None and value is not False:
            problems.append(f"{name}={value!r} ({feature}) is not implemented")
    mirostat = getattr(gc, "mirostat", 0) or 0
    if mirostat not in _SUPPORTED_MIROSTAT:
        problems.append(f"mirostat={mirostat!r} is not implemented (only Mirostat v2 is)")
    known = USED_GENERATION_KEYS | IGNORED_GENERATION_KEYS | UNSUPPORTED_GENERATION_KEYS.keys()
    unknown = sorted(k for k in explicit if k not in known)
    if unknown:
        problems.append(
            "unknown setting(s) "
            + ", ".join(f"{k}={explicit[k]!r}" for k in unknown)
            + " (not a transformers GenerationConfig or llama.cpp sampling setting that "
            "functional_gen knows)"
        )
    if problems:
        raise ValueError(
            "the generation config asks for what functional_gen does not do: " + "; ".join(problems)
        )


def _with_defaults(gc, defaults: dict) -> dict:
    """The config's values of these settings, the defaults where it has none."""
    values = {k: getattr(gc, k, None) for k in defaults}
    return {k: defaults[k] if v is None else v for k, v in values.items()}


def _dry_breakers(value, tokenizer) -> tuple:
    """DRY's sequence breakers as token-id sequences: text is tokenized (llama.cpp takes text)."""
    if value is None:
        value = DRY_SEQUENCE_BREAKERS if tokenizer is not None else ()
    breakers = []
    for b in value:
        if isinstance(b, str):
            if tokenizer is None:
                raise ValueError(
                    f"dry_sequence_breakers {b!r} is text; pass a tokenizer, or token-id sequences"
                )
            breakers.append(tokenizer.encode(b, add_special_tokens=False))
        else:
            breakers.append(b)
    return tuple(tuple(int(i) for i in ([b] if isinstance(b, int) else b)) for b in breakers if b)


def settings_from_generation_config(
    generation_config: Any,
    *,
    eos_token_id: tuple[int, ...],
    vocab_size: int,
    tokenizer: Any = None,
) -> Settings:
    """Translate a generation config into processors, a sampler and length settings.

    **Arguments:**

    - `generation_config`: anything `load_generation_config` accepts.
    - `eos_token_id`: the model's EOS ids, used where the config has none (`MinLength`,
      `MinNewTokens`, `BadWords`, ...).
    - `vocab_size`: the model's vocabulary size (for `MirostatV2`).
    - `tokenizer`: tokenizes `dry_sequence_breakers` given as text (llama.cpp's form); with a
      tokenizer, DRY without breakers gets llama.cpp's defaults (`DRY_SEQUENCE_BREAKERS`).

    **Returns:** a `Settings` (`functional_gen.generation.call_settings`) without a `step`.

    **Raises:** `ValueError` naming a generation mode other than greedy search or sampling,
    unsupported or unknown settings (see `check_generation_config`), and any error of the
    processors for out-of-range values.
    """
    gc = load_generation_config(generation_config)
    check_generation_config(gc)
    mirostat = getattr(gc, "mirostat", 0) or 0

    config_eos = gc.eos_token_id
    if config_eos is not None:
        config_eos = (config_eos,) if isinstance(config_eos, int) else tuple(config_eos)
    eos = config_eos or eos_token_id

    procs: list = []
    if gc.sequence_bias is not None:
        procs.append(P.SequenceBias(gc.sequence_bias))
    if gc.repetition_penalty is not None and gc.repetition_penalty != 1.0:
        penalty_last_n = getattr(gc, "penalty_last_n", None)
        penalty_last_n = -1 if penalty_last_n is None else int(penalty_last_n)
        procs.append(P.RepetitionPenalty(gc.repetition_penalty, penalty_last_n))
    if getattr(gc, "presence_penalty", None):
        procs.append(P.PresencePenalty(gc.presence_penalty))
    if getattr(gc, "frequency_penalty", None):
        procs.append(P.FrequencyPenalty(gc.frequency_penalty))
    if gc.no_repeat_ngram_size is not None and gc.no_repeat_ngram_size > 0:
        procs.append(P.NoRepeatNGram(gc.no_repeat_ngram_size))
    if getattr(gc, "dry_multiplier", None):
        dry = _with_defaults(gc, DRY_DEFAULTS)
        breakers = _dry_breakers(getattr(gc, "dry_sequence_breakers", None), tokenizer)
        procs.append(
            P.DRY(
                gc.dry_multiplier,
                dry["dry_base"],
                dry["dry_allowed_length"],
                breakers,
                dry["dry_penalty_last_n"],
            )
        )
    if gc.bad_words_ids is not None:
        procs.append(P.BadWords(gc.bad_words_ids, eos))
    if gc.min_length is not None and gc.min_length > 0 and eos:
        procs.append(P.MinLength(gc.min_length, eos))
    if gc.min_new_tokens is not None and gc.min_new_tokens > 0 and eos:
        procs.append(P.MinNewTokens(gc.min_new_tokens, eos))
    if gc.forced_bos_token_id is not None:
        procs.append(P.ForcedBOS(gc.forced_bos_token_id))
    if gc.forced_eos_token_id is not None:
        procs.append(P.ForcedEOS(gc.forced_eos_token_id))
    if gc.remove_invalid_values:
        procs.append(P.RemoveInvalidValues())
    if gc.exponential_decay_length_penalty is not None:
        procs.append(P.ExponentialDecayLengthPenalty(gc.exponential_decay_length_penalty, eos))
    if gc.suppress_tokens is not None:
        procs.append(P.SuppressTokens(gc.suppress_tokens))
    if gc.begin_suppress_tokens is not None:
        # transformers starts one token later after a forced BOS on a one-token prompt; here
        # the index counts generated tokens, so a forced BOS moves it to 1.
        begin = 1 if gc.forced_bos_token_id is not None else 0
        procs.append(P.SuppressTokensAtBegin(gc.begin_suppress_tokens, begin))
    if gc.do_sample:
        if gc.temperature is not None and gc.temperature != 1.0:
            procs.append(P.Temperature(gc.temperature))
        if gc.top_k is not None and gc.top_k != 0:
            procs.append(P.TopK(gc.top_k))
        # values that switch a filter off are skipped; anything else, out of range included,
        # builds the processor (which raises naming an out-of-range value)
        if gc.top_p is not None and gc.top_p != 1.0:
            procs.append(P.TopP(gc.top_p))
        if gc.min_p is not None:
            procs.append(P.MinP(gc.min_p))
        if gc.typical_p is not None and gc.typical_p != 1.0:
            procs.append(P.TypicalP(gc.typical_p))
        if gc.epsilon_cutoff:
            procs.append(P.EpsilonCutoff(gc.epsilon_cutoff))
        if gc.eta_cutoff:
            procs.append(P.EtaCutoff(gc.eta_cutoff))
        if getattr(gc, "top_n_sigma", None) is not None:
            procs.append(P.TopNSigma(gc.top_n_sigma))
        xtc_probability = getattr(gc, "xtc_probability", None)
        if xtc_probability:
            threshold = getattr(gc, "xtc_threshold", None)
            procs.append(
                P.XTC(XTC_DEFAULT_THRESHOLD if threshold is None else threshold, xtc_probability)
            )
        if mirostat == 2:
            miro = _with_defaults(gc, MIROSTAT_DEFAULTS)
            procs.append(
                P.MirostatV2(miro["mirostat_tau"], miro["mirostat_eta"], vocab_size=vocab_size)
            )
    if gc.renormalize_logits:
        procs.append(P.LogSoftmax())

    explicit = gc.to_diff_dict()
    stop = gc.stop_strings
    stop = () if stop is None else ((stop,) if isinstance(stop, str) else tuple(stop))
    return Settings(
        processors=tuple(procs),
        sampler=_sampler(gc),
        max_new_tokens=gc.max_new_tokens,
        max_length=gc.max_length if "max_length" in explicit else None,
        eos_token_id=config_eos,
        pad_token_id=gc.pad_token_id,
        stop_strings=stop,
        num_return_sequences=gc.num_return_sequences or 1,
        guidance_scale=(
            float(gc.guidance_scale)
            if gc.guidance_scale is not None and gc.guidance_scale != 1
            else None
        ),
    )


def _sampler(gc) -> AbstractSampler | AbstractSearch:
    """The sampler of a config's generation mode: greedy, multinomial, or beam search (beam
    sampling with `do_sample`), with transformers' `length_penalty` and `early_stopping`."""
    if (gc.num_beams or 1) > 1:
        return BeamSearch(
            int(gc.num_beams),
            length_penalty=1.0 if gc.length_penalty is None else float(gc.length_penalty),
            early_stopping=False if gc.early_stopping is None else gc.early_stopping,
            do_sample=bool(gc.do_sample),
        )
    return Multinomial() if gc.do_sample else Greedy()
