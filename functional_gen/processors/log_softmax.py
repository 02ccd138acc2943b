"""`LogSoftmax`: renormalise the logits into logprobs."""

import jax
from jaxtyping import Array, Float

from .base import AbstractStatelessLogitsProcessor, Context


class LogSoftmax(AbstractStatelessLogitsProcessor):
    """Replace the logits by `jax.nn.log_softmax(logits)`, the logprobs of the distribution the
    earlier processors left (sampling is unchanged; the values become normalised log-probabilities,
    e.g. for beam scores). `-inf` logits stay `-inf`.

    Source: transformers' `LogitNormalization` (`GenerationConfig.renormalize_logits=True`, which
    puts it last in the processor list), same semantics.
    """

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        return jax.nn.log_softmax(logits)
