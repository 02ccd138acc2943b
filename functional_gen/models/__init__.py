"""Decoder models in Equinox, the `AbstractCausalLM` interface generation relies on, and the `KVCache`."""

from .base import AbstractCausalLM as AbstractCausalLM

from .config import (
    SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES,
    SUPPORTED_ROPE_TYPES as SUPPORTED_ROPE_TYPES,
    LlamaConfig as LlamaConfig,
    UnsupportedConfigError as UnsupportedConfigError,
)
from .kv_cache import KVCache as KVCache
from .llama import LlamaForCausalLM as LlamaForCausalLM
