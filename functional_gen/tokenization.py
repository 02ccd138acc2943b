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
