"""The Llama family's names for the one decoder, kept so that code written against them works.

The decoder lives in `functional_gen.models.decoder`; `LlamaForCausalLM` and `LlamaModel` are
`DecoderForCausalLM` and `DecoderModel` (the Llama family is the decoder with every declared
difference of `DecoderConfig` at its default), and the building blocks are re-exported under
their names (`Linear` and `Embedding` live in `functional_gen.models.quantization`, next to the
matmul formulations they choose between).
"""

from .decoder import (
    ATTENTION_BLOCK as ATTENTION_BLOCK,
    MLP as MLP,
    Attention as Attention,
    DecoderLayer as DecoderLayer,
    LayerCache as LayerCache,
    LlamaForCausalLM as LlamaForCausalLM,
    LlamaModel as LlamaModel,
    RMSNorm as RMSNorm,
    RotaryEmbedding as RotaryEmbedding,
    attention_lengths as attention_lengths,
    num_parameters as num_parameters,
)
from .quantization import Embedding as Embedding, Linear as Linear
