"""Structured generation: regexes, JSON Schemas, choices and grammars, evaluated on the device.

A constraint is compiled once on the host into a token automaton (`TokenAutomaton`: a class per
token, a `[states, classes]` transition table, each state's distance to acceptance), cached on
disk, and run inside the jitted generation loop by a logits processor whose per-row state is one
int32 (see `functional_gen.structured.processor`).

| processor | compiled by |
|---|---|
| `Regex(pattern, tokenizer)` | outlines-core: regex -> byte DFA; ours: DFA -> tokens |
| `JsonSchema(schema, tokenizer)` | schema checks and rewrites, outlines-core's schema -> regex, then as `Regex` |
| `Choice(options, tokenizer)` | a regex of the options, then as `Regex` |
| `Grammar(lark_text, tokenizer)` | a pushdown automaton (one automaton per recursive rule, a stack per row; `num_stacks` parallel stacks where one byte of lookahead cannot decide the grammar) when the grammar recurses; otherwise, or with `max_depth=`, the bounded-depth DFA -> tokens |
| `per_row([...])` | one constraint (or none) per row of a batch |
"""

from .automaton import (
    ConstraintError as ConstraintError,
)
from .automaton import (
    TokenAutomaton as TokenAutomaton,
)
from .automaton import (
    automaton_cache_dir as automaton_cache_dir,
)
from .byte_dfa import ByteDFA as ByteDFA
from .byte_dfa import lift as lift
from .byte_dfa import regex_automaton as regex_automaton
from .byte_dfa import regex_byte_dfa as regex_byte_dfa
from .choice import Choice as Choice
from .choice import choice_regex as choice_regex
from .grammar import DEFAULT_MAX_DEPTH as DEFAULT_MAX_DEPTH
from .grammar import Grammar as Grammar
from .grammar import grammar_automaton as grammar_automaton
from .grammar import pushdown_automaton as pushdown_automaton
from .grammar_syntax import GrammarError as GrammarError
from .grammar_syntax import gbnf_to_lark as gbnf_to_lark
from .grammar_syntax import parse_grammar as parse_grammar
from .json_schema import (
    InvalidSchemaError as InvalidSchemaError,
)
from .json_schema import (
    JsonSchema as JsonSchema,
)
from .json_schema import (
    SchemaTooLargeError as SchemaTooLargeError,
)
from .json_schema import (
    UnsatisfiableSchemaError as UnsatisfiableSchemaError,
)
from .json_schema import (
    UnsupportedSchemaError as UnsupportedSchemaError,
)
from .json_schema import (
    json_schema_regex as json_schema_regex,
)
from .options import constraint_from_options as constraint_from_options
from .pushdown import DEFAULT_NUM_STACKS as DEFAULT_NUM_STACKS
from .pushdown import DEFAULT_STACK_DEPTH as DEFAULT_STACK_DEPTH
from .pushdown import NotDeterministic as NotDeterministic
from .pushdown import ParallelPushdownConstraint as ParallelPushdownConstraint
from .pushdown import PushdownAutomaton as PushdownAutomaton
from .pushdown import PushdownConstraint as PushdownConstraint
from .processor import AbstractConstraint as AbstractConstraint
from .processor import TokenConstraint as TokenConstraint
from .processor import per_row as per_row
from .regex import Regex as Regex
from .vocabulary import (
    TokenVocabulary as TokenVocabulary,
)
from .vocabulary import (
    default_eos_token_ids as default_eos_token_ids,
)
from .vocabulary import (
    vocabulary_from_tokenizer as vocabulary_from_tokenizer,
)
