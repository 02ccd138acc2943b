"""One small module per model family: each maps its `config.json` onto the keyword arguments
of `functional_gen.models.config.DecoderConfig` (allow-listed keys) and its Hugging Face weight
names onto the decoder's module tree, and nothing else. The decoder itself is
`functional_gen.models.decoder`; what the families differ in is declared as `DecoderConfig`
fields.

To add a family: copy the closest module (`qwen3.py` for a Llama variant), list its
`config.json` keys in `USED_KEYS`, map them in `config_fields`, rename weights in
`hf_weights`, and add it to `FAMILIES`.
"""

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from . import gemma, llama, phi3, qwen3, smollm3
from .common import UnsupportedConfigError
from .fused import fuse_projections, split_projections as split_projections

FAMILIES: dict[str, ModuleType] = {
    model_type: module
    for module in (llama, qwen3, gemma, phi3, smollm3)
    for model_type in module.MODEL_TYPES
}
"""`model_type` -> the family module that maps it."""

SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
"""`model_type` values of `config.json` that the decoder runs."""


def family(model_type: Any, architectures: Any = None) -> ModuleType:
    """The family module of `model_type`.

    **Raises:** `UnsupportedConfigError` naming `model_type` and the supported ones.
    """
    if model_type not in FAMILIES:
        raise UnsupportedConfigError(
            f"unknown architecture: model_type={model_type!r} (architectures={architectures!r}); "
            f"supported model types: {SUPPORTED_MODEL_TYPES}"
        )
    return FAMILIES[model_type]


def config_fields(d: Mapping[str, Any], extra_eos_token_ids: Sequence[int] = ()) -> dict[str, Any]:
    """`DecoderConfig` keyword arguments for the `config.json` dict `d`, by its `model_type`.

    **Raises:** `UnsupportedConfigError` for an unsupported `model_type` or config value.
    """
    module = family(d.get("model_type"), d.get("architectures"))
    return module.config_fields(d, extra_eos_token_ids, SUPPORTED_MODEL_TYPES)


def hf_weights(
    model_type: str, weights: Mapping[str, Any], num_hidden_layers: int
) -> Mapping[str, Any]:
    """The Hugging Face-named `weights` of a `model_type` checkpoint under the decoder's names:
    the family's renames, then every layer's q/k/v and gate/up projections fused
    (`fuse_projections`; Phi-3's come fused already).

    **Raises:** `ValueError` from `fuse_projections` (parts missing or of mismatched shapes)."""
    renamed = family(model_type).hf_weights(weights, num_hidden_layers)
    return fuse_projections(renamed, num_hidden_layers)
