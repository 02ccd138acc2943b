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

# Sampling filters
from .temperature import Temperature as Temperature
from .top_k import TopK as TopK
from .top_p import TopP as TopP
from .min_p import MinP as MinP

# Penalties and token rules
from .repetition_penalty import RepetitionPenalty as RepetitionPenalty
from .suppress_tokens import SuppressTokens as SuppressTokens
from .min_new_tokens import MinNewTokens as MinNewTokens

# Stateful
from .forced_tokens import ForcedTokens as ForcedTokens

# Structured generation
from ..structured.choice import Choice as Choice
from ..structured.grammar import Grammar as Grammar
from ..structured.json_schema import JsonSchema as JsonSchema
from ..structured.regex import Regex as Regex
