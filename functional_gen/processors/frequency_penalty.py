"""`FrequencyPenalty`: subtract a constant per earlier occurrence of a generated token."""

from jaxtyping import Array, Float

from ._common import token_counts
from ._validation import float_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class FrequencyPenalty(AbstractStatelessLogitsProcessor):
    """Subtract `frequency_penalty` times the number of times each token was generated (the
    prompt does not count): `logits -= frequency_penalty * count`.

    Source: OpenAI's `frequency_penalty` and vLLM's implementation (same semantics, generated
    tokens only). Combine with `PresencePenalty` for OpenAI's full formula
    `logits -= presence_penalty * (count > 0) + frequency_penalty * count`.

    **Attributes:** `frequency_penalty`: in [-2, 2] (OpenAI's range; or one value per row), in
    logit units per occurrence; positive values discourage repetition.

    **Raises:** `ValueError` for a value outside [-2, 2].
    """

    frequency_penalty: Float[Array, "*rows"] = per_row_field()

    def __init__(self, frequency_penalty):
        self.frequency_penalty = float_param(
            "frequency_penalty", frequency_penalty, low=-2.0, high=2.0
        )

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        counts = token_counts(context, logits.shape[-1], generated_only=True)
        return logits - self.frequency_penalty * counts.astype(logits.dtype)
