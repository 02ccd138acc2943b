"""Between text and token ids, with transformers' tokenizers: prompts in, text out.

A prompt is either raw text (`str`, encoded as is, with the tokenizer's usual special tokens such
as a BOS) or a chat (a list of `{"role", "content"}` messages, rendered with the tokenizer's
chat template and the generation prompt).
"""

import contextlib
import functools
import hashlib
import json
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

Prompt = str | Sequence[Mapping[str, str]]
"""Raw text, or a list of chat messages."""


def is_chat(prompt: Any) -> bool:
    """Whether `prompt` is a list of chat messages (dicts with `role` and `content`)."""
    return (
        isinstance(prompt, Sequence)
        and not isinstance(prompt, str)
        and len(prompt) > 0
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)
    )


def normalize_prompts(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """A list of prompts from one prompt or several.

    **Raises:** `TypeError` for anything that is not text, a chat, or a list of those; `ValueError`
    for an empty list.
    """
    if isinstance(prompts, str) or is_chat(prompts):
        return [prompts]
    if not isinstance(prompts, Sequence):
        raise TypeError(
            f"prompts must be a str, a chat or a list of them, got {type(prompts).__name__}"
        )
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts given")
    for p in prompts:
        if not (isinstance(p, str) or is_chat(p)):
            raise TypeError(
                f"each prompt must be a str or a list of {{'role', 'content'}} messages, got {p!r}"
            )
    return prompts


def encode_prompt(tokenizer, prompt: Prompt, *, chat_template: bool | None = None) -> list[int]:
    """Token ids of one prompt.

    **Arguments:**

    - `tokenizer`: a transformers tokenizer.
    - `prompt`: raw text or a list of chat messages.
    - `chat_template`: `None` (default) applies the chat template to chats only; `True` also wraps
      raw text as one user message; `False` never applies it (a chat is then an error).

    **Returns:** the token ids (a list of ints).

    **Raises:** `ValueError` if a chat is given but the tokenizer has no chat template (or
    `chat_template=False`), or if the prompt encodes to no tokens.
    """
    chat = is_chat(prompt)
    if chat_template and not chat:
        prompt, chat = [{"role": "user", "content": prompt}], True
    if chat:
        if chat_template is False or not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "a chat prompt (list of messages) needs a tokenizer with a chat template; "
                "pass raw text instead"
            )
        ids = tokenizer.apply_chat_template(
            list(prompt), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, Mapping):  # some transformers versions return a BatchEncoding
            ids = ids["input_ids"]
    else:
        ids = tokenizer(prompt)["input_ids"]
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError(f"prompt {prompt!r} encodes to no tokens; give at least one token")
    return ids


def decode(tokenizer, token_ids: Sequence[int]) -> str:
    """Text of generated token ids, without special tokens (as vLLM returns it)."""
    return tokenizer.decode(list(token_ids), skip_special_tokens=True)


_FINGERPRINTS: "weakref.WeakKeyDictionary[Any, tuple[int | None, str]]" = (
    weakref.WeakKeyDictionary()
)


def tokenizer_fingerprint(tokenizer) -> str | None:
    """A digest that tells tokenizers apart: SHA-256 of the tokenizer's class name, its whole
    vocabulary (`get_vocab()`: token -> id, added tokens included) and its special tokens
    (`special_tokens_map`, `all_special_tokens`), as `"sha256:<32 hex digits>"`.

    Two tokenizers with the same fingerprint map text to the same ids and back; a
    `SequenceState` records the fingerprint of the tokenizer that made it, and refuses to be
    continued with another (`TokenizerMismatchError`). Loaded twice from the same files, a
    tokenizer has the same fingerprint; the same vocabulary loaded as another class (e.g. a slow
    and a fast tokenizer) has another, which errs on the side of refusing.

    Computed once per tokenizer object and kept in a `weakref.WeakKeyDictionary` (recomputed
    when `len(tokenizer)` changes, i.e. after `add_tokens`). Measured for SmolLM2's 49,152-token
    vocabulary on the project's 2-core CPU: 80-85 ms the first time per tokenizer object (35 ms
    of it transformers' `get_vocab()`), 0.7 microseconds afterwards.

    **Returns:** the fingerprint, or `None` for an object without `get_vocab` (then nothing can
    be checked against it).
    """
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return None
    try:
        size = len(tokenizer)
    except TypeError:
        size = None
    try:
        cached = _FINGERPRINTS.get(tokenizer)
    except TypeError:  # not weak-referenceable or not hashable: no cache
        cached = None
    if cached is not None and cached[0] == size:
        return cached[1]
    digest = hashlib.sha256()
    digest.update(type(tokenizer).__name__.encode())
    digest.update(b"\0vocab\0")
    digest.update(_vocabulary_text(get_vocab()).encode("utf-8", "surrogatepass"))
    special_map = getattr(tokenizer, "special_tokens_map", None) or {}
    special = {
        "map": {str(k): str(v) for k, v in dict(special_map).items()},
        "all": sorted(map(str, getattr(tokenizer, "all_special_tokens", None) or ())),
    }
    digest.update(b"\0special\0")
    digest.update(json.dumps(special, sort_keys=True).encode())
    fingerprint = "sha256:" + digest.hexdigest()[:32]
    with contextlib.suppress(TypeError):
        _FINGERPRINTS[tokenizer] = (size, fingerprint)
    return fingerprint


def _vocabulary_text(vocab: Mapping[str, int]) -> str:
    """The vocabulary as text, one token per line in id order: the tokens alone when the ids
    are exactly `0 .. n-1` (the usual case, 4x faster than sorting), else `id<TAB>token` lines
    sorted by id, then token."""
    tokens: list[str | None] = [None] * len(vocab)
    for token, i in vocab.items():
        if not (isinstance(i, int) and 0 <= i < len(tokens)) or tokens[i] is not None:
            break
        tokens[i] = token
    else:
        return "dense\n" + "\n".join(tokens)  # type: ignore[arg-type]
    pairs = sorted(vocab.items(), key=lambda item: (item[1], item[0]))
    return "sparse\n" + "\n".join(f"{i}\t{token}" for token, i in pairs)


class IncrementalDecoder:
    """Turns a stream of token ids into text pieces, correct across token boundaries.

    A byte-level BPE token may hold part of a UTF-8 character; decoding it alone gives U+FFFD.
    Each `push` decodes a short window of recent tokens and returns only the text that is
    complete; the held-back bytes come out with the token that completes them. The pieces
    concatenate to `decode(tokenizer, all_ids)`. Source: the incremental detokenizer of vLLM and
    Hugging Face text-generation-inference (`prefix_offset` / `read_offset`).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly `""`)."""
        self.token_ids.append(int(token_id))
        prefix = decode(self.tokenizer, self.token_ids[self.prefix_offset : self.read_offset])
        text = decode(self.tokenizer, self.token_ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.token_ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes to U+FFFD)."""
        prefix = decode(self.tokenizer, self.token_ids[self.prefix_offset : self.read_offset])
        text = decode(self.tokenizer, self.token_ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.token_ids)
        return text[len(prefix) :]


# llama.cpp's end-of-generation token texts (`llama_vocab::impl::load`, the `is_eog` list): tokens
# that end a turn in common chat formats, besides the tokenizer's own EOS.
END_OF_GENERATION_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<|end_of_text|>",
    "<|return|>",
    "<|call|>",
    "<end_of_utterance>",
)

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the others
    are shifted to U+0100 and up."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    shifted = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _tokenizer_json(tokenizer) -> dict | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    return json.loads(backend.to_str())


def _decoder_types(decoder: dict | None) -> set[str]:
    if not decoder:
        return set()
    if decoder.get("type") == "Sequence":
        return {t for d in decoder.get("decoders", []) for t in _decoder_types(d)}
    return {decoder.get("type")}


def token_bytes_table(
    tokenizer, vocab_size: int | None = None
) -> tuple[list[bytes | None], set[int]]:
    """The raw bytes each token id writes as text (not its decoded string), and the special ids.

    A byte-level BPE token may hold part of a UTF-8 character, which decodes to U+FFFD on its
    own; its bytes are exact here. Conventions, as `tokenizers`' decoders apply them:

    - byte-level BPE (GPT-2, Llama-3, SmolLM2, Qwen): each character of a token string stands for
      one byte through GPT-2's `bytes_to_unicode` table;
    - byte fallback (Llama-2, Mistral, Gemma SentencePiece models): `<0xXX>` is the byte `0xXX`,
      and `▁` (U+2581) is a space;
    - added tokens and anything else: the token string's UTF-8 bytes.

    **Arguments:** `tokenizer`: a transformers tokenizer (fast or slow); `vocab_size`: how many
    ids to cover (default: one past the largest id the tokenizer knows; the model's vocabulary
    may be padded past it).

    **Returns:** `(token_bytes, special_ids)`: `token_bytes[i]` is the bytes token `i` writes, or
    `None` for special tokens (BOS, EOS, chat markers) and unused ids.

    **Raises:** `ValueError` if `vocab_size` is smaller than the tokenizer's vocabulary.
    """
    spec = _tokenizer_json(tokenizer)
    if spec is not None:
        decoders = _decoder_types(spec.get("decoder"))
        byte_fallback = (
            bool(spec.get("model", {}).get("byte_fallback")) or "ByteFallback" in decoders
        )
        byte_level = "ByteLevel" in decoders
        added = {a["id"]: a for a in spec.get("added_tokens", [])}
    else:  # a slow (Python) tokenizer: SentencePiece conventions
        byte_level, byte_fallback, added = False, True, {}
    vocab = tokenizer.get_vocab()
    special = {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
    special |= {i for i, a in added.items() if a.get("special")}
    size = max(vocab.values(), default=-1) + 1
    if vocab_size is not None:
        if vocab_size < size:
            raise ValueError(
                f"`vocab_size` {vocab_size} is smaller than the tokenizer's vocabulary ({size} ids)"
            )
        size = vocab_size
    to_byte = _unicode_to_byte()
    table: list[bytes | None] = [None] * size
    for text, i in vocab.items():
        if i in special or i >= size:
            continue
        if i in added:  # added tokens are stored as plain text, not byte-encoded
            table[i] = text.encode("utf-8")
        elif byte_level and all(c in to_byte for c in text):
            table[i] = bytes(to_byte[c] for c in text)
        elif byte_fallback and (m := _BYTE_FALLBACK.fullmatch(text)):
            table[i] = bytes([int(m.group(1), 16)])
        else:
            table[i] = text.replace("\u2581", " ").encode("utf-8")
    return table, special


def token_bytes(tokenizer, vocab_size: int | None = None) -> list[bytes]:
    """The bytes each token id writes as text (`b""` for special tokens and unused ids), as
    `decode(..., skip_special_tokens=True)` writes them. See `token_bytes_table`."""
    return [b or b"" for b in token_bytes_table(tokenizer, vocab_size)[0]]
