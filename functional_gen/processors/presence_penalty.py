"""`PresencePenalty`: subtract a constant from every token already generated."""

from jaxtyping import Array, Float

from ._common import token_counts
from ._validation import float_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class PresencePenalty(AbstractStatelessLogitsProcessor):
    """Subtract `presence_penalty` from the logit of every token that occurs among the generated
    tokens (the prompt does not count): `logits -= presence_penalty * (count > 0)`.

    Source: OpenAI's `presence_penalty` and vLLM's implementation (same semantics, generated
    tokens only). Unlike `RepetitionPenalty`, it is additive in logit units and does not depend
    on the sign of the logit. Combine with `FrequencyPenalty` for OpenAI's full formula.

    **Attributes:** `presence_penalty`: in [-2, 2] (OpenAI's range; or one value per row), in
    logit units; positive values discourage repetition, negative ones encourage it.

    **Raises:** `ValueError` for a value outside [-2, 2].
    """

    presence_penalty: Float[Array, "*rows"] = per_row_field()

    def __init__(self, presence_penalty):
        self.presence_penalty = float_param(
            "presence_penalty", presence_penalty, low=-2.0, high=2.0
        )

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        counts = token_counts(context, logits.shape[-1], generated_only=True)
        return logits - self.presence_penalty * (counts > 0).astype(logits.dtype)
