"""`Temperature`: divide the logits by a temperature."""

from jaxtyping import Array, Float

from ._validation import float_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class Temperature(AbstractStatelessLogitsProcessor):
    """Scale logits by `1 / temperature`: below 1 sharpens the distribution, above 1 flattens it.

    Source: transformers' `TemperatureLogitsWarper` (same name and semantics).

    **Attributes:** `temperature`: a positive float (or one per row). For greedy decoding use
    `functional_gen.samplers.Greedy()` rather than a temperature near 0.

    **Raises:** `ValueError` for a temperature that is not strictly positive and finite.
    """

    temperature: Float[Array, "*rows"] = per_row_field()

    def __init__(self, temperature):
        self.temperature = float_param(
            "temperature",
            temperature,
            low=0.0,
            low_inclusive=False,
            hint="; for greedy decoding use functional_gen.samplers.Greedy()",
        )

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        return logits / self.temperature
