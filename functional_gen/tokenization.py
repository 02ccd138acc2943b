"""Between text and token ids, with transformers' tokenizers: prompts in, text out.

A prompt is either raw text (`str`, encoded as is, with the tokenizer's usual special tokens such
as a BOS) or a chat (a list of `{"role", "content"}` messages, rendered with the tokenizer's
chat template and the generation prompt).
"""

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
        raise TypeError(f"prompts must be a str, a chat or a list of them, got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts given")
    for p in prompts:
        if not (isinstance(p, str) or is_chat(p)):
            raise TypeError(
                "each prompt must be a str or a list of {'role', 'content'} messages, "
                f"got {p!r}"
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


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars)))


def _decoder_types(tokenizer) -> set[str]:
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return set()
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    found = {decoder.get("type", "")}
    for d in decoder.get("decoders", []) or []:
        found.add(d.get("type", ""))
    return found


def token_bytes(tokenizer, vocab_size: int | None = None) -> list[bytes]:
    """The raw bytes each token id stands for, as text (not its decoded string).

    Byte-level BPE tokens map back through GPT-2's byte-to-character table; SentencePiece-style
    tokens turn `▁` into a space and byte-fallback tokens `<0xXX>` into that byte. A token that
    holds part of a UTF-8 character therefore gets its real bytes, not U+FFFD. Special tokens
    (which `decode(..., skip_special_tokens=True)` drops) and ids past the tokenizer's vocabulary
    get `b""`.

    **Arguments:** `tokenizer`, a transformers tokenizer; `vocab_size`: length of the result
    (the model's vocabulary, which may be padded past the tokenizer's); default `len(tokenizer)`.

    **Returns:** a list of `bytes`, one per token id.
    """
    import re

    size = len(tokenizer) if vocab_size is None else vocab_size
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(added, "special", False):
            special.add(int(i))
    byte_level = "ByteLevel" in _decoder_types(tokenizer)
    byte_decoder = {c: b for b, c in _bytes_to_unicode().items()}
    byte_token = re.compile(r"<0x([0-9A-Fa-f]{2})>")
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(size, len(tokenizer)))))
    out: list[bytes] = []
    for i, tok in enumerate(tokens):
        if i in special or tok is None:
            out.append(b"")
        elif byte_level:
            try:
                out.append(bytes(byte_decoder[c] for c in tok))
            except KeyError:  # an added (non-special) token stored as plain text
                out.append(tok.encode("utf-8"))
        else:
            m = byte_token.fullmatch(tok)
            out.append(bytes([int(m.group(1), 16)]) if m else tok.replace("▁", " ").encode("utf-8"))
    out.extend(b"" for _ in range(size - len(out)))
    return out
