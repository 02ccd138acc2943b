"""`stream`: generate for one prompt and yield the text as it is produced.

The same prefill and the same `Step` as `generate`, but the loop runs in Python, one jitted step
per token (the state donated, so the `KVCache` is updated in place), so each new piece of text
can be handed out as soon as its token exists.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from .generation import _prefill_jit, _prepare, build_stop_strings, check_key, resolve_settings
from .state import FINISH_REASONS
from .stop_strings import truncate_at_stop
from .samplers import AbstractSampler
from .step import make_step
from .tokenization import IncrementalDecoder, Prompt, encode_prompt, is_chat

_step_jit = eqx.filter_jit(lambda step, state: step(state), donate="all-except-first")


def stream(
    model,
    tokenizer,
    prompt: Prompt,
    *,
    max_new_tokens: int | None = None,
    processors: Sequence[Any] | None = None,
    sampler: AbstractSampler | None = None,
    key: PRNGKeyArray | None = None,
    chat_template: bool | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    stop_strings: str | Sequence[str] | None = None,
    generation_config: Any = None,
) -> Iterator[str]:
    """Generate for ONE prompt, yielding text pieces as tokens are produced.

    Pieces never split a UTF-8 character (see `IncrementalDecoder`); their concatenation equals
    `generate(...).texts[0]` for the same arguments (no EOS, no special tokens, nothing from a
    stop string on: with stop strings, the last few characters are held back until they cannot
    start one). Arguments are those of `functional_gen.generate`, with a single `prompt`.

    **Yields:** `str` pieces (non-empty).

    **Raises:** `TypeError` if `prompt` is a list of prompts (use `generate` for batches);
    `ValueError` for a generation config with `num_return_sequences > 1`; otherwise as
    `generate`.
    """
    if not isinstance(prompt, str) and not is_chat(prompt):
        raise TypeError(
            "stream takes one prompt (a str or a list of chat messages); use generate for a batch"
        )
    ids = encode_prompt(tokenizer, prompt, chat_template=chat_template)
    settings = resolve_settings(
        model,
        len(ids),
        max_new_tokens=max_new_tokens,
        processors=processors,
        sampler=sampler,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        stop_strings=stop_strings,
        generation_config=generation_config,
    )
    if settings.num_return_sequences != 1:
        raise ValueError("stream generates one sequence; use generate for num_return_sequences > 1")
    max_new_tokens = settings.max_new_tokens
    stops = build_stop_strings(settings.stop_strings, tokenizer, model)
    step = make_step(
        model,
        settings.processors,
        settings.sampler,
        eos_token_id=settings.eos_token_id,
        pad_token_id=settings.pad_token_id,
        stop_strings=stops,
    )
    check_key(step.sampler, key, sampler_given=sampler is not None)
    prompt_ids, token_ids, lengths, keys = _prepare(
        model, [ids], max_new_tokens, key, step.pad_token_id, True
    )
    strings = () if stops is None else stops.stop_strings
    state = _prefill_jit(
        model, step.processors, prompt_ids, token_ids, lengths, keys, max_new_tokens, len(strings)
    )
    decoder = IncrementalDecoder(tokenizer)
    eos = set(step.eos_token_id)
    hold = max((len(x) for x in strings), default=1) - 1  # chars that may start a stop string
    text, emitted = "", 0
    while True:
        state = _step_jit(step, state)
        last = state.token_ids[0, jnp.maximum(state.length[0] - 1, 0)]
        done, reason, token = jax.device_get((state.done[0], state.finish_reason[0], last))
        token = int(token)
        new_token = not (done and FINISH_REASONS[int(reason)] == "constraint")
        if new_token and not (done and token in eos):
            text += decoder.push(token)
        if done:
            break
        if len(text) - hold > emitted:
            yield text[emitted : len(text) - hold]
            emitted = len(text) - hold
    text += decoder.flush()
    if strings:
        text = truncate_at_stop(text, strings)[0]
    if len(text) > emitted:
        yield text[emitted:]
