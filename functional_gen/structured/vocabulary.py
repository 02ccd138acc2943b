"""The vocabulary of a tokenizer as raw bytes: what each token id writes, byte for byte.

Constraints are automata over bytes, so they need the exact bytes of every token, not its
decoded string: a byte-level BPE token may hold half of a UTF-8 character, which decodes to
U+FFFD on its own (314 SmolLM2 tokens do). The bytes come from the token strings with the
tokenizer's own convention:

- byte-level BPE (GPT-2, Llama-3, SmolLM2, Qwen): each character of a token string stands for one
  byte through GPT-2's `bytes_to_unicode` table;
- byte fallback (Llama-2, Mistral, Gemma SentencePiece models): `<0xXX>` is the byte `0xXX`, and
  `▁` (U+2581) is a space;
- anything else: the token string's UTF-8 bytes.

Special tokens (BOS, EOS, chat markers, ...) have no bytes: a constraint never lets them be
written as text. End-of-generation tokens are handled apart (`TokenVocabulary.eos_token_id`).

Source: the byte tables of `tokenizers`' `ByteLevel` and `ByteFallback` decoders; outlines-core's
`Vocabulary` takes the same `{bytes: [token ids]}` map.
"""

import dataclasses
import functools
import hashlib
import weakref
from collections.abc import Sequence

import numpy as np

from ..tokenization import END_OF_GENERATION_TEXTS, token_bytes_table


@dataclasses.dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """Every token id's bytes, the end-of-generation ids and a fingerprint (host-side, numpy).

    Build it with `vocabulary_from_tokenizer`.

    **Attributes:**

    - `token_bytes`: one entry per token id, `0 <= id < vocab_size`: the bytes the token writes,
      or `None` for a token that is never text (special tokens, ids the tokenizer does not use,
      end-of-generation tokens).
    - `eos_token_id`: the ids that end generation; a constraint allows them exactly in its
      accepting states.
    - `fingerprint`: SHA-256 hex digest of the bytes and the EOS ids; automata compiled for one
      vocabulary are cached under it.
    """

    token_bytes: tuple[bytes | None, ...]
    eos_token_id: tuple[int, ...]
    fingerprint: str

    @property
    def vocab_size(self) -> int:
        """Number of token ids covered (`len(token_bytes)`)."""
        return len(self.token_bytes)

    @functools.cached_property
    def byte_map(self) -> dict[bytes, list[int]]:
        """`{bytes: [token ids]}` of the text tokens (ids sharing bytes share a list)."""
        out: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.token_bytes):
            if b is not None and b != b"":
                out.setdefault(b, []).append(i)
        return out

    @functools.cached_property
    def outlines_vocabulary(self):
        """The `outlines_core.Vocabulary` of the text tokens.

        outlines-core takes a single EOS id that must not be a text token; we give it the first
        end-of-generation id (or `vocab_size` when there is none) and export EOS transitions for
        all of `eos_token_id` ourselves (see `functional_gen.structured.automaton`).
        """
        # deferred on purpose: the Rust extension loads only when a regex compiles
        from outlines_core import Vocabulary

        return Vocabulary(self.outlines_eos_id, self.byte_map)

    @property
    def outlines_eos_id(self) -> int:
        """The EOS id handed to outlines-core (see `outlines_vocabulary`)."""
        return self.eos_token_id[0] if self.eos_token_id else self.vocab_size

    @functools.cached_property
    def token_length(self) -> np.ndarray:
        """`Int[np.ndarray, " vocab"]`: bytes per token (0 for tokens that are never text)."""
        return np.fromiter(
            (len(b) if b else 0 for b in self.token_bytes), np.int32, self.vocab_size
        )


def default_eos_token_ids(tokenizer) -> tuple[int, ...]:
    """End-of-generation ids of a tokenizer: its EOS token plus every token whose text is in
    llama.cpp's end-of-generation list (`END_OF_GENERATION_TEXTS`, e.g. `<|im_end|>`,
    `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`).

    For SmolLM2 this gives `(2, 0)`, the ids in its `generation_config.json`. The tokenizer's own
    EOS comes first.
    """
    ids = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    vocab = tokenizer.get_vocab()
    for text in END_OF_GENERATION_TEXTS:
        i = vocab.get(text)
        if i is not None and i not in ids:
            ids.append(int(i))
    return tuple(ids)


def _normalize_eos(eos_token_id, vocab_size: int) -> tuple[int, ...]:
    if isinstance(eos_token_id, (int, np.integer)):
        eos_token_id = (eos_token_id,)
    if not isinstance(eos_token_id, Sequence) and not isinstance(eos_token_id, np.ndarray):
        raise TypeError(
            f"`eos_token_id` must be a token id or a sequence of ids, got {eos_token_id!r}"
        )
    out = []
    for i in eos_token_id:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < vocab_size:
            raise ValueError(
                f"`eos_token_id` must hold token ids in [0, {vocab_size}), got {list(eos_token_id)}"
            )
        if int(i) not in out:
            out.append(int(i))
    return tuple(out)


_MEMO: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()
"""The one cache of tokenizer conversions (see `vocabulary_from_tokenizer`): per tokenizer
object, held by a weak reference (an entry goes with its tokenizer), a dict keyed by
`("bytes", len(tokenizer), vocab_size)` for the converted token bytes, `("eos",
len(tokenizer))` for the default EOS ids, and `(len(tokenizer), vocab_size, eos ids)` for the
`TokenVocabulary`."""


def _length(tokenizer) -> int | None:
    """`len(tokenizer)` (it grows when tokens are added), or None for an object without one."""
    try:
        return len(tokenizer)
    except TypeError:
        return None


def vocabulary_from_tokenizer(
    tokenizer, *, eos_token_id: int | Sequence[int] | None = None, vocab_size: int | None = None
) -> TokenVocabulary:
    """The `TokenVocabulary` of a transformers tokenizer, converted once per tokenizer.

    Every constraint (`Regex`, `JsonSchema`, `Choice`, `Grammar`) takes its vocabulary from
    here, so the tokenizer's tokens are converted to bytes (`token_bytes_table`) once per
    tokenizer object, its length (`len(tokenizer)`, which changes when tokens are added) and
    `vocab_size`, however many constraints are built; the `TokenVocabulary` itself once more per
    set of EOS ids. The cache holds the tokenizer by a weak reference (`_MEMO`); a tokenizer that
    cannot be weakly referenced is converted on every call.

    **Arguments:**

    - `tokenizer`: a transformers tokenizer.
    - `eos_token_id`: the ids that end generation; default `default_eos_token_ids(tokenizer)`
      (the tokenizer's EOS plus llama.cpp's end-of-generation tokens). Pass the model's
      `eos_token_id` when it differs: ids outside this tuple are never allowed by a constraint.
    - `vocab_size`: ids to cover, e.g. the model's `vocab_size` when its embedding has unused
      rows; default: the tokenizer's.

    **Returns:** a `TokenVocabulary`; end-of-generation ids never count as text. The same object
    for the same tokenizer, length, `vocab_size` and EOS ids.

    **Raises:** `ValueError` for EOS ids outside the vocabulary or a `vocab_size` smaller than the
    tokenizer's vocabulary.
    """
    try:
        memo = _MEMO.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: no memo
        memo = {}
    length = _length(tokenizer)
    bytes_key = ("bytes", length, vocab_size)
    if bytes_key not in memo:
        memo[bytes_key] = tuple(token_bytes_table(tokenizer, vocab_size)[0])
    table = memo[bytes_key]
    if eos_token_id is None:
        if ("eos", length) not in memo:
            memo["eos", length] = default_eos_token_ids(tokenizer)
        eos_token_id = memo["eos", length]
    eos = _normalize_eos(eos_token_id, len(table))
    key = (length, vocab_size, eos)
    if key in memo:
        return memo[key]
    token_bytes = list(table)
    for i in eos:
        token_bytes[i] = None
    digest = hashlib.sha256()
    digest.update(repr(eos).encode())
    for b in token_bytes:
        digest.update(b"\xff" if b is None else len(b).to_bytes(4, "little") + b)
    vocabulary = TokenVocabulary(tuple(token_bytes), eos, digest.hexdigest())
    memo[key] = vocabulary
    return vocabulary
