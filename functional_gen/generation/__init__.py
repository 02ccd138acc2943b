"""Generation: a call's options, planning, the compiled prefill and `lax.while_loop`, the
result, the step and its searches, streaming, samplers, stop strings, and the resumable
`SequenceState`.

Modules: `options` (`GenerationOptions`, every per-call choice), `settings` (ONE resolver
shared by `generate` and `stream`), `search` (`AbstractSearch`: how a step advances the rows;
`sampling.Sample`, `beam_search.BeamSearch`), `buckets` (padded sizes), `state`
(`GenerationState`, the loop carry), `sequence_state` (`SequenceState`, what a call returns and
the next one continues), `step` (`make_step`), `planning` (`plan_call`: options -> settings ->
padded inputs), `program` (the compiled prefill and `while_loop`), `result`
(`GenerationResult`), `loop` (`generate`: plan -> run -> result; `generate_with_final_state`,
the same with the final loop state), `token_ids` (`generate_token_ids`, `init_state`,
`generate_state`), `streaming` (`stream`), `samplers`, `stop_strings`, `generation_config`
(transformers' `GenerationConfig`).
"""

from . import samplers as samplers
from .result import (
    GenerationResult as GenerationResult,
)
from .buckets import (
    bucket_batch as bucket_batch,
)
from .buckets import (
    bucket_length as bucket_length,
)
from .loop import (
    generate as generate,
)
from .loop import (
    generate_with_final_state as generate_with_final_state,
)
from .token_ids import (
    generate_state as generate_state,
)
from .token_ids import (
    generate_token_ids as generate_token_ids,
)
from .token_ids import (
    init_state as init_state,
)
from .options import (
    GenerationOptions as GenerationOptions,
)
from .sequence_state import (
    BatchMismatchError as BatchMismatchError,
)
from .sequence_state import (
    ModelMismatchError as ModelMismatchError,
)
from .sequence_state import (
    SequenceArrays as SequenceArrays,
)
from .sequence_state import (
    SequenceState as SequenceState,
)
from .sequence_state import (
    TokenizerMismatchError as TokenizerMismatchError,
)
from .sequence_state import (
    SequenceStateFormatError as SequenceStateFormatError,
)
from .settings import (
    DEFAULT_MAX_NEW_TOKENS as DEFAULT_MAX_NEW_TOKENS,
)
from .settings import (
    Settings as Settings,
)
from .settings import (
    resolve_settings as resolve_settings,
)
from .state import FINISH_REASONS as FINISH_REASONS
from .state import GenerationState as GenerationState
from .step import Step as Step
from .step import make_step as make_step
from .stop_strings import StopStrings as StopStrings
from .streaming import Stream as Stream
from .streaming import stream as stream
