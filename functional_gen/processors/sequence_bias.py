"""`SequenceBias`: add a bias to the token that would complete a given token sequence."""

from collections.abc import Mapping, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._validation import check_token_ids_in_vocab, token_sequences_param
from .base import AbstractStatelessLogitsProcessor, Context


def sequence_bias(
    vocab: int,
    context: Context,
    sequences: tuple[tuple[int, ...], ...],
    biases: Float[Array, " sequences"],
) -> Float[Array, " vocab"]:
    """The additive bias over the vocabulary: `biases[i]` on the last token of `sequences[i]`
    when the row currently ends with the rest of that sequence (always, for one-token sequences).
    Biases landing on the same token add up."""
    bias = jnp.zeros((vocab,), jnp.float32)
    by_prefix_length: dict[int, list[int]] = {}
    for i, seq in enumerate(sequences):
        by_prefix_length.setdefault(len(seq) - 1, []).append(i)
    max_len = context.token_ids.shape[0]
    for prefix_length, members in by_prefix_length.items():
        last_tokens = jnp.asarray([sequences[i][-1] for i in members], jnp.int32)
        values = biases[jnp.asarray(members)]
        if prefix_length > 0:
            if prefix_length > max_len:  # can never match
                continue
            prefixes = jnp.asarray([sequences[i][:-1] for i in members], jnp.int32)
            start = context.length - prefix_length
            window = jax.lax.dynamic_slice(
                context.token_ids, (jnp.maximum(start, 0),), (prefix_length,)
            )
            matches = (start >= 0) & jnp.all(prefixes == window, axis=-1)
            values = jnp.where(matches, values, 0.0)
        bias = bias.at[last_tokens].add(values)
    return bias


class SequenceBias(AbstractStatelessLogitsProcessor):
    """Add a bias to the logit of the token that would complete a biased token sequence.

    A one-token sequence is biased at every step; a longer one only when the row ends with all
    but its last token (so the bias acts on the step that could complete it). Biases that land on
    the same token add up. Biases are in logit units: positive ones make the sequence more
    likely, `-inf` forbids it (see `BadWords`).

    Source: transformers' `SequenceBiasLogitsProcessor` (`GenerationConfig.sequence_bias`), same
    semantics; the prefix may lie in the prompt.

    **Attributes:**

    - `sequences`: the biased token-id sequences (static tuple of tuples).
    - `biases`: `Float[Array, " sequences"]`, one bias per sequence (shared by all rows).

    Construct with `SequenceBias(sequence_bias)`, where `sequence_bias` is transformers' format, a
    list of `[token_ids, bias]` pairs (e.g. `[[[10, 45], -2.0], [[64], -7.5]]`), or a dict
    `{tuple(token_ids): bias}`. A sequence given twice keeps its last bias.

    **Raises:** `ValueError` for an empty `sequence_bias`, empty or negative token-id sequences,
    or biases that are NaN or `+inf`; token ids outside the vocabulary raise when the processor
    first runs (the vocabulary size is known only then).
    """

    sequences: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    biases: Float[Array, " sequences"]

    def __init__(self, sequence_bias):
        if isinstance(sequence_bias, Mapping):
            pairs = list(sequence_bias.items())
        elif isinstance(sequence_bias, Sequence) and not isinstance(sequence_bias, (str, bytes)):
            pairs = []
            for item in sequence_bias:
                if (
                    not isinstance(item, Sequence)
                    or isinstance(item, (str, bytes))
                    or len(item) != 2
                ):
                    raise ValueError(
                        "`sequence_bias` must be a list of [token_ids, bias] pairs or a dict "
                        f"{{tuple(token_ids): bias}}, got {sequence_bias!r}"
                    )
                pairs.append((item[0], item[1]))
        else:
            raise ValueError(
                "`sequence_bias` must be a list of [token_ids, bias] pairs or a dict "
                f"{{tuple(token_ids): bias}}, got {sequence_bias!r}"
            )
        sequences = token_sequences_param("sequence_bias", [ids for ids, _ in pairs])
        merged = dict(zip(sequences, (bias for _, bias in pairs)))  # last one wins
        try:
            values = np.asarray(list(merged.values()), np.float64)
        except (TypeError, ValueError):
            raise ValueError(
                f"`sequence_bias` biases must be floats, got {list(merged.values())!r}"
            ) from None
        if values.ndim != 1 or np.any(np.isnan(values)) or np.any(values == np.inf):
            raise ValueError(
                f"`sequence_bias` biases must be floats in [-inf, inf), got {values.tolist()}"
            )
        self.sequences = tuple(merged)
        self.biases = jnp.asarray(values, jnp.float32)

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        vocab = logits.shape[-1]
        check_token_ids_in_vocab("sequence_bias", [t for s in self.sequences for t in s], vocab)
        return logits + sequence_bias(vocab, context, self.sequences, self.biases).astype(
            logits.dtype
        )
