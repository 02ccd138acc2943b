"""`functional_gen.generation_config`: where transformers' `GenerationConfig` interop was first
published. It lives in `functional_gen.generation.generation_config` (beside the resolver that
uses it); this module keeps the public path of the command line, the docs and user code.
"""

from .generation.generation_config import (
    DRY_DEFAULTS as DRY_DEFAULTS,
    DRY_SEQUENCE_BREAKERS as DRY_SEQUENCE_BREAKERS,
    IGNORED_GENERATION_KEYS as IGNORED_GENERATION_KEYS,
    MIROSTAT_DEFAULTS as MIROSTAT_DEFAULTS,
    SUPPORTED_GENERATION_MODES as SUPPORTED_GENERATION_MODES,
    UNSUPPORTED_GENERATION_KEYS as UNSUPPORTED_GENERATION_KEYS,
    USED_GENERATION_KEYS as USED_GENERATION_KEYS,
    XTC_DEFAULT_THRESHOLD as XTC_DEFAULT_THRESHOLD,
    GenerationSettings as GenerationSettings,
    check_generation_config as check_generation_config,
    load_generation_config as load_generation_config,
    settings_from_generation_config as settings_from_generation_config,
)
