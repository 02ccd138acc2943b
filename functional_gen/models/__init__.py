"""Decoder models in Equinox, the `AbstractCausalLM` interface generation relies on, and the `KVCache`.

One decoder (`DecoderForCausalLM`, built from a `DecoderConfig`) runs every supported family;
`config_from_hf` reads a Hugging Face config of any of them (`SUPPORTED_MODEL_TYPES`) and
`DecoderForCausalLM.from_weights` builds the model from Hugging Face-named weights.
`LlamaConfig` and `LlamaForCausalLM` are the same classes under their older names.
"""

from .base import AbstractCausalLM as AbstractCausalLM

from .config import (
    SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES,
    SUPPORTED_ROPE_TYPES as SUPPORTED_ROPE_TYPES,
    DecoderConfig as DecoderConfig,
    LlamaConfig as LlamaConfig,
    UnsupportedConfigError as UnsupportedConfigError,
    config_from_hf as config_from_hf,
)
from .decoder import DecoderForCausalLM as DecoderForCausalLM
from .execution_plan import ExecutionPlan as ExecutionPlan
from .kv_cache import KVCache as KVCache
from .paged_cache import PagedKVCache as PagedKVCache
from .llama import LlamaForCausalLM as LlamaForCausalLM
