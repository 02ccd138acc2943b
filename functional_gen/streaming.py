"""`stream`: generate for one prompt and yield the text as it is produced.

The same prefill and the same `Step` as `generate`, but the loop runs in Python, one jitted step
per token (the state donated, so the `KVCache` is updated in place), so each new piece of text
can be handed out as soon as its token exists.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import equinox as eqx
import jax
from jaxtyping import PRNGKeyArray

from .generation import _prefill_jit, _prepare
from .samplers import AbstractSampler
from .step import make_step
from .tokenization import IncrementalDecoder, Prompt, encode_prompt, is_chat

_step_jit = eqx.filter_jit(lambda step, state: step(state), donate="all-except-first")


def stream(
    model,
    tokenizer,
    prompt: Prompt,
    *,
    max_new_tokens: int = 128,
    processors: Sequence[Any] | None = (),
    sampler: AbstractSampler | None = None,
    key: PRNGKeyArray | None = None,
    chat_template: bool | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
) -> Iterator[str]:
    """Generate for ONE prompt, yielding text pieces as tokens are produced.

    Pieces never split a UTF-8 character (see `IncrementalDecoder`); their concatenation equals
    `generate(...).texts[0]` for the same arguments (no EOS, no special tokens). Arguments are
    those of `functional_gen.generate`, with a single `prompt`.

    **Yields:** `str` pieces (non-empty).

    **Raises:** `TypeError` if `prompt` is a list of prompts (use `generate` for batches);
    otherwise as `generate`.
    """
    if not isinstance(prompt, str) and not is_chat(prompt):
        raise TypeError(
            "stream takes one prompt (a str or a list of chat messages); use generate for a batch"
        )
    step = make_step(model, processors, sampler, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    if key is None and step.sampler.needs_key:
        raise ValueError(
            f"{type(step.sampler).__name__} sampling needs a PRNG key: pass key=jax.random.key(seed)"
        )
    ids = encode_prompt(tokenizer, prompt, chat_template=chat_template)
    prompt_ids, token_ids, lengths, keys = _prepare(
        model, [ids], max_new_tokens, key, step.pad_token_id, True
    )
    state = _prefill_jit(model, step.processors, prompt_ids, token_ids, lengths, keys, max_new_tokens)
    decoder = IncrementalDecoder(tokenizer)
    eos = set(step.eos_token_id)
    while True:
        state = _step_jit(step, state)
        length, done = jax.device_get((state.length[0], state.done[0]))
        token = int(jax.device_get(state.token_ids[0, length - 1]))
        if not (done and token in eos):
            piece = decoder.push(token)
            if piece:
                yield piece
        if done:
            break
    rest = decoder.flush()
    if rest:
        yield rest
