"""`BadWords`: never complete a forbidden token sequence."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float

from ._validation import check_token_ids_in_vocab, token_ids_param, token_sequences_param
from .base import AbstractStatelessLogitsProcessor, Context
from .sequence_bias import sequence_bias


class BadWords(AbstractStatelessLogitsProcessor):
    """Forbid token sequences: a one-token bad word is `-inf` at every step; for a longer one,
    its last token is `-inf` whenever the row ends with the rest of it.

    Source: transformers' `NoBadWordsLogitsProcessor` (`GenerationConfig.bad_words_ids`), same
    semantics: a `SequenceBias` of `-inf`, with one-token bad words equal to an EOS id dropped
    (so a row can still end). The prefix may lie in the prompt.

    Tokenize words with a leading space where they occur mid-sentence, e.g.
    `tokenizer([" cake"], add_special_tokens=False).input_ids`.

    **Attributes:**

    - `bad_words_ids`: the forbidden sequences (static tuple of tuples), EOS-only ones removed.
    - `eos_token_id`: the EOS ids that are never forbidden alone (static tuple; may be empty).

    **Raises:** `ValueError` for an empty list, empty sequences or negative ids; token ids outside
    the vocabulary raise when the processor first runs.
    """

    bad_words_ids: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    eos_token_id: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, bad_words_ids, eos_token_id=None):
        sequences = token_sequences_param("bad_words_ids", bad_words_ids)
        eos = () if eos_token_id is None else token_ids_param("eos_token_id", eos_token_id)
        self.eos_token_id = eos
        self.bad_words_ids = tuple(
            dict.fromkeys(s for s in sequences if not (len(s) == 1 and s[0] in eos))
        )

    def __call__(self, logits: Float[Array, " vocab"], context: Context) -> Float[Array, " vocab"]:
        if not self.bad_words_ids:
            return logits
        vocab = logits.shape[-1]
        check_token_ids_in_vocab("bad_words_ids", [t for s in self.bad_words_ids for t in s], vocab)
        biases = jnp.full((len(self.bad_words_ids),), -jnp.inf, jnp.float32)
        return logits + sequence_bias(vocab, context, self.bad_words_ids, biases).astype(
            logits.dtype
        )
