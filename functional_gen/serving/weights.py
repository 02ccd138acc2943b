"""The serving engine's prefill-only weight copy for int8 models (`with_prefill_copy`).

An int8-block matrix (`fg.load_model(..., quantization="int8")`) multiplies more than 64 tokens
(a prefill) as `dot([bf16(deq(W))], bf16 x)->f32` (`models.quantization.FORMULATIONS`): every
call dequantizes the whole matrix and rounds it to bfloat16 before the dot. The serving engine
prefills one prompt per call, so it pays that dequantization for every prompt, every layer.
`with_prefill_copy` stores the rounded matrix once, as a bfloat16 `BatchedInt8` copy used only
from `PREFILL_COPY_MIN_TOKENS` tokens up: the same operands reach the same dot, so a prefill
computes exactly the logits and cache it computed before (a test pins it), and decode (one to
`max_slots` tokens per matrix) keeps reading the int8 blocks.
"""

import equinox as eqx
import jax

from ..models.quantization import FORMULATIONS, BatchedInt8, Embedding, Linear, dequantize_int8

_BF16_PREFILL = "dot([bf16(deq(W))], bf16 x)->f32"


def _prefill_min_tokens() -> int:
    """The smallest token count `FORMULATIONS` sends an int8-block matrix to `_BF16_PREFILL`."""
    smallest = 1
    for max_tokens, _, name in FORMULATIONS["int8-block"]:
        if name == _BF16_PREFILL:
            return smallest
        smallest = max_tokens + 1
    raise AssertionError(f"FORMULATIONS no longer has {_BF16_PREFILL!r} for int8 blocks")


PREFILL_COPY_MIN_TOKENS = _prefill_min_tokens()
"""Products of at least this many tokens use the prefill copy (65: above 64 tokens the int8
blocks are multiplied through a bfloat16 copy made per call, see the module docstring)."""


def has_int8_blocks(model) -> bool:
    """Whether any `Linear` of `model` holds an int8 weight with per-block scales."""
    return any(
        isinstance(m, Linear) and m.scale is not None and m.scale.shape[-1] > 1
        for m in jax.tree.leaves(model, is_leaf=lambda x: isinstance(x, (Linear, Embedding)))
    )


def with_prefill_copy(model):
    """`model` with a bfloat16 copy (`BatchedInt8(scale=None, min_tokens=PREFILL_COPY_MIN_TOKENS)`)
    beside every int8-block `Linear` that has no `batched` copy yet, so that a prefill reads the
    rounded weights instead of dequantizing them per call; results are unchanged (see the module
    docstring). The output head (`lm_head`, or the tied embedding) gets none: a prefill computes
    the logits of its last token only.

    Measured (`benchmarks/account_serving.py --quantization int8 --compare-prefill-copy`,
    SmolLM2-135M, the bench's saturated 32-request trace, the 2-core CPU loaded ~4x): admission
    9.99 -> 7.39 s, 1.06x the output tokens/s (`docs/serving.md`). Memory: two bytes per layer weight more (SmolLM2-135M:
    ~106 M weights, +212 MB beside the 151 MB of int8 weights and scales).

    **Arguments:** `model`: a `DecoderForCausalLM`, usually loaded with `quantization="int8"`.

    **Returns:** the new model (`model` is unchanged); `model` itself when it has no int8-block
    `Linear`.
    """

    def convert(path, module):
        if (
            not isinstance(module, Linear)
            or "lm_head" in jax.tree_util.keystr(path)
            or module.scale is None
            or module.scale.shape[-1] < 2
            or module.batched is not None
        ):
            return module
        copy = dequantize_int8(module.weight, module.scale).astype("bfloat16")
        batched = BatchedInt8((copy,), None, max_tokens=2**62, min_tokens=PREFILL_COPY_MIN_TOKENS)
        return eqx.tree_at(lambda m: m.batched, module, batched, is_leaf=lambda x: x is None)

    if not has_int8_blocks(model):
        return model
    return jax.tree_util.tree_map_with_path(
        convert, model, is_leaf=lambda x: isinstance(x, (Linear, Embedding))
    )
