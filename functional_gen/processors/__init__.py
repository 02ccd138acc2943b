"""Logits processors: immutable configs with pure `init(context) -> state` and
`process(state, logits, context) -> (state, logits)`; see `functional_gen.processors.base`."""

# Protocol
from .base import (
    AbstractLogitsProcessor as AbstractLogitsProcessor,
    AbstractStatelessLogitsProcessor as AbstractStatelessLogitsProcessor,
    Context as Context,
    Stateless as Stateless,
    apply as apply,
    as_processors as as_processors,
    init_states as init_states,
    per_row_field as per_row_field,
    process_all as process_all,
)

# Sampling filters (truncate the distribution)
from .temperature import Temperature as Temperature
from .top_k import TopK as TopK
from .top_p import TopP as TopP
from .min_p import MinP as MinP
from .typical_p import TypicalP as TypicalP
from .epsilon_cutoff import EpsilonCutoff as EpsilonCutoff
from .eta_cutoff import EtaCutoff as EtaCutoff
from .top_n_sigma import TopNSigma as TopNSigma
from .xtc import XTC as XTC

# Penalties against repetition
from .repetition_penalty import RepetitionPenalty as RepetitionPenalty
from .presence_penalty import PresencePenalty as PresencePenalty
from .frequency_penalty import FrequencyPenalty as FrequencyPenalty
from .no_repeat_ngram import NoRepeatNGram as NoRepeatNGram
from .dry import DRY as DRY

# Token rules and biases
from .suppress_tokens import SuppressTokens as SuppressTokens
from .suppress_tokens_at_begin import SuppressTokensAtBegin as SuppressTokensAtBegin
from .bad_words import BadWords as BadWords
from .sequence_bias import SequenceBias as SequenceBias
from .logit_bias import LogitBias as LogitBias

# Length control
from .min_length import MinLength as MinLength
from .min_new_tokens import MinNewTokens as MinNewTokens
from .forced_bos import ForcedBOS as ForcedBOS
from .forced_eos import ForcedEOS as ForcedEOS
from .exponential_decay_length_penalty import (
    ExponentialDecayLengthPenalty as ExponentialDecayLengthPenalty,
)

# Numerics
from .remove_invalid_values import RemoveInvalidValues as RemoveInvalidValues
from .log_softmax import LogSoftmax as LogSoftmax

# Stateful
from .forced_tokens import ForcedTokens as ForcedTokens
from .mirostat_v2 import MirostatV2 as MirostatV2, MirostatV2State as MirostatV2State

# Guidance (holds a model; must come first in a chain)
from .classifier_free_guidance import (
    ClassifierFreeGuidance as ClassifierFreeGuidance,
    ClassifierFreeGuidanceState as ClassifierFreeGuidanceState,
    check_guidance_first as check_guidance_first,
)

# Structured generation lives in `functional_gen.structured`, which imports this package's
# `base`; its processors are reachable here by a lazy alias, so that nothing below imports it.
_STRUCTURED = {
    "Choice": "choice",
    "Grammar": "grammar",
    "JsonSchema": "json_schema",
    "Regex": "regex",
}


def __getattr__(name: str):
    if name in _STRUCTURED:
        import importlib

        return getattr(
            importlib.import_module(f"functional_gen.structured.{_STRUCTURED[name]}"), name
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_STRUCTURED])
