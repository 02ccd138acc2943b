"""`EtaCutoff`: remove tokens below an entropy-dependent probability."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._common import entropy, keep_top
from ._validation import float_param, int_param
from .base import AbstractStatelessLogitsProcessor, Context, per_row_field


class EtaCutoff(AbstractStatelessLogitsProcessor):
    """Eta sampling: set to `-inf` every token whose probability is below
    `eta = min(eta_cutoff, sqrt(eta_cutoff) * exp(-entropy))` (entropy in nats of the current
    distribution), always keeping the `min_tokens_to_keep` most likely tokens.

    Source: Hewitt et al. 2022, "Truncation Sampling as Language Model Desmoothing";
    transformers' `EtaLogitsWarper` (same semantics). The paper suggests 3e-4 to 4e-3.

    **Attributes:**

    - `eta_cutoff`: in [0, 1) (or one value per row); 0 keeps every token.
    - `min_tokens_to_keep`: static, at least 1.

    **Raises:** `ValueError` for `eta_cutoff` outside [0, 1) or a non-positive `min_tokens_to_keep`.
    """

    eta_cutoff: Float[Array, "*rows"] = per_row_field()
    min_tokens_to_keep: int = eqx.field(static=True)

    def __init__(self, eta_cutoff, min_tokens_to_keep: int = 1):
        self.eta_cutoff = float_param(
            "eta_cutoff", eta_cutoff, low=0.0, high=1.0, high_inclusive=False
        )
        self.min_tokens_to_keep = int_param("min_tokens_to_keep", min_tokens_to_keep, low=1)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        epsilon = self.eta_cutoff
        eta = jnp.minimum(epsilon, jnp.sqrt(epsilon) * jnp.exp(-entropy(logits)))
        remove = jax.nn.softmax(logits) < eta
        remove = keep_top(remove, logits, self.min_tokens_to_keep)
        return jnp.where(remove, -jnp.inf, logits)
